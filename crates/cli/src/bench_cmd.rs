//! `steadfast bench`: measurements that the scripts under `bench/` drive and compare with
//! peers. Each prints JSON lines, one per configuration.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use train::model::ModelKind;

use crate::choice;
use crate::join_args::JoinArgs;
use launch::place::Meet;

const EXAMPLES: &str = "\
Examples:
  # Save, snapshot-stall and load times of 100 MB and 1 GB of state, 1 and 4 shards
  steadfast bench ckpt --dir /tmp/bench --mb 100,1000 --shards 1,4

  # State transfer of 10 MB to 1 GB from one and from two replicas
  steadfast bench transfer --mb 10,100,1000 --sources 1,2

  # The training step's all-reduce, one process per rank, on Steadfast's mesh and on MPI
  steadfast launch --nproc 4 -- bench collective --mb 1,16,256
  mpirun -n 4 steadfast bench collective --engine mpi --mb 1,16,256

  # The MLP's initial weights and the first two epochs' data order, for other systems
  steadfast bench init --model mlp --width 256 --to init.safetensors
  steadfast bench order --epochs 2 --to order.safetensors";

/// Arguments of `steadfast bench`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Checkpoint persist bandwidth, training stall and load time.
    Ckpt(CkptArgs),
    /// All-reduce bus bandwidth over loopback TCP against the loopback's own bandwidth.
    Allreduce(AllreduceArgs),
    /// State transfer throughput from 1..N live replicas against the loopback's bandwidth.
    Transfer(TransferArgs),
    /// The training step's all-reduce in a job of one process per rank (started by
    /// `steadfast launch`, `mpirun` or `srun`), on the engine that a `train` of the same
    /// flags would use. Rank 0 prints one row per size and mode, with a fingerprint of the
    /// sum (each rank's input is fixed by its rank and the size alone).
    Collective(CollectiveArgs),
    /// The initial weights of `train --model M --width W --seed S` as a safetensors file,
    /// for other systems to start from.
    Init(InitArgs),
    /// The data order of `train --seed S` (one permutation per epoch) as a safetensors
    /// file, for other systems to train on.
    Order(OrderArgs),
}

#[derive(Args, Debug)]
struct CollectiveArgs {
    /// Message sizes in MB (10^6 bytes of f32), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    mb: Vec<u64>,
    /// Summation modes, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = choice::of::<train::ReduceMode>(), default_value = "fast,reproducible")]
    reduce: Vec<train::ReduceMode>,
    /// Repetitions per size and mode, the modes in turn (the median is reported), after a warm-up.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    #[command(flatten)]
    join: JoinArgs,
}

#[derive(Args, Debug)]
struct TransferArgs {
    /// State sizes in MB (10^6 bytes of f32), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    mb: Vec<u64>,
    /// Numbers of sources fetched from at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    sources: Vec<usize>,
    /// Repetitions per configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(Args, Debug)]
struct AllreduceArgs {
    /// Ranks (threads of this process, each with its own TCP mesh).
    #[arg(long, default_value_t = 2)]
    world: usize,
    /// Message sizes in MB (10^6 bytes of f32), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    mb: Vec<u64>,
    /// Repetitions per size (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Reduce modes to time, taking turns repetition by repetition (one mode alone, under
    /// `perf stat`, gives that mode's CPU time).
    #[arg(long, value_delimiter = ',', value_parser = choice::of::<train::ReduceMode>(), default_value = "fast,reproducible,reproducible32")]
    modes: Vec<train::ReduceMode>,
}

#[derive(Args, Debug)]
struct CkptArgs {
    /// Scratch directory (on the disk to measure); the last checkpoint of each size is
    /// left in `<dir>/<mb>mb` for peers to read.
    #[arg(long)]
    dir: PathBuf,
    /// State sizes in MB (10^6 bytes), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    mb: Vec<u64>,
    /// Shard counts to try, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    shards: Vec<usize>,
    /// Tensors the state is split into.
    #[arg(long, default_value_t = 24)]
    tensors: usize,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Drop the page cache before each load, so loads read from the disk (needs root).
    #[arg(long)]
    drop_caches: bool,
}

/// Runs `steadfast bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Ckpt(b) => {
            let bench = lab::bench::CkptBench {
                dir: b.dir,
                mb: b.mb,
                shards: b.shards,
                tensors: b.tensors,
                repeats: b.repeats,
                drop_caches: b.drop_caches,
            };
            Ok(lab::bench::ckpt(&bench, &mut |row| println!("{row}"))?)
        }
        BenchCommand::Transfer(b) => {
            let bench = lab::bench::TransferBench { mb: b.mb, sources: b.sources, repeats: b.repeats };
            for row in lab::bench::transfer(&bench)? {
                println!("{row}");
            }
            Ok(())
        }
        BenchCommand::Collective(b) => collective(&b),
        BenchCommand::Init(b) => {
            println!("{}", lab::export::init(b.model, b.width, b.seed, &b.to)?);
            Ok(())
        }
        BenchCommand::Order(b) => {
            println!("{}", lab::export::order(b.examples, b.epochs, b.seed, &b.to)?);
            Ok(())
        }
        BenchCommand::Allreduce(b) => {
            let bench = lab::bench::AllreduceBench { world: b.world, mb: b.mb, repeats: b.repeats, modes: b.modes };
            for row in lab::bench::allreduce(&bench)? {
                println!("{row}");
            }
            Ok(())
        }
    }
}

/// The job of `bench collective`, on the engine its flags name.
fn collective(b: &CollectiveArgs) -> anyhow::Result<()> {
    let place = launch::place::place(&b.join.flags(), false)?
        .context("bench collective runs one process per rank: start it with `steadfast launch`, `mpirun` or `srun`")?;
    let settings = train::JobSettings { timeout: place.timeout, fingerprint_every: 0, incarnation: 0 };
    let (job, engine) = match place.meet {
        Meet::Mpi => (train::job::Job::start_mpi(&settings)?, "mpi"),
        Meet::Mesh { rendezvous, secret, bind, .. } => {
            let rank =
                train::MeshRank { rank: place.rank, world: place.world, rendezvous, secret, bind, job: settings };
            (train::job::Job::connect(&rank)?, "steadfast")
        }
    };
    let bench =
        lab::bench::collective::CollectiveBench { mb: b.mb.clone(), modes: b.reduce.clone(), repeats: b.repeats };
    Ok(lab::bench::collective::collective(job, engine, &bench, &mut |row| println!("{row}"))?)
}

#[derive(Args, Debug)]
struct InitArgs {
    /// The model (the MLP or LeNet-5: `cnn`).
    #[arg(long, value_parser = choice::of::<ModelKind>(), default_value = "mlp")]
    model: ModelKind,
    /// The MLP's first hidden width, as `train --width`.
    #[arg(long, default_value_t = train::model::Mlp::DEFAULT_WIDTH)]
    width: usize,
    /// The seed, as `train --seed`.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The safetensors file to write (tensors named as in a checkpoint: `model.fc1.weight`).
    #[arg(long)]
    to: PathBuf,
}

#[derive(Args, Debug)]
struct OrderArgs {
    /// Training examples in the data set (Fashion-MNIST: 60000).
    #[arg(long, default_value_t = 60_000)]
    examples: usize,
    /// Epochs to write.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// The seed, as `train --seed`.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The safetensors file to write: one U32 tensor `order` of shape [epochs, examples];
    /// row `e` is epoch `e`'s permutation, and step `s` of the epoch takes its elements
    /// `s*B .. (s+1)*B` for a batch of `B`.
    #[arg(long)]
    to: PathBuf,
}
