//! `steadfast bench`: measurements that the scripts under `bench/` drive and compare with
//! peers. Each prints JSON lines, one per configuration.

use std::path::PathBuf;

use clap::{Args, Subcommand};

const EXAMPLES: &str = "\
Examples:
  # Save, snapshot-stall and load times of 100 MB and 1 GB of state, 1 and 4 shards
  steadfast bench ckpt --dir /tmp/bench --mb 100,1000 --shards 1,4

  # State transfer of 10 MB to 1 GB from one and from two replicas
  steadfast bench transfer --mb 10,100,1000 --sources 1,2";

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
        BenchCommand::Allreduce(b) => {
            let bench = lab::bench::AllreduceBench { world: b.world, mb: b.mb, repeats: b.repeats };
            for row in lab::bench::allreduce(&bench)? {
                println!("{row}");
            }
            Ok(())
        }
    }
}
