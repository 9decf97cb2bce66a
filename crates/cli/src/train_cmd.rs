//! `steadfast train`: arguments, progress display and the final summary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::choice;
use crate::join_args::JoinArgs;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use train::CheckpointConfig;
use train::data::DataKind;
use train::model::ModelKind;
use train::optim::OptimKind;
use train::{Progress, TrainConfig};

const EXAMPLES: &str = "\
Examples:
  # The MLP on Fashion-MNIST with its defaults (about 88% test accuracy)
  steadfast train --model mlp --data fashion-mnist

  # LeNet-5, 4 micro-batches of 32 per global batch of 128, SGD with momentum
  steadfast train --model cnn --batch 128 --micro-batch 32 --optimizer sgd --lr 0.05

  # The character-level GPT on fortunes, metrics in runs/gpt/metrics.jsonl
  steadfast train --model gpt --data fortunes --out runs/gpt

  # A quick run on generated data (no data set needed)
  steadfast train --model mlp --data synthetic --steps 50

  # Checkpoint every 100 steps, keep the 3 newest; after a crash, resume exactly
  steadfast train --model mlp --checkpoint-every 100 --checkpoint-dir runs/ckpt --keep-last 3
  steadfast train --model mlp --checkpoint-every 100 --checkpoint-dir runs/ckpt --keep-last 3 --resume latest
  # A checkpoint at every step the disk can keep up with; training never waits for a persist
  steadfast train --model mlp --checkpoint-every 1 --checkpoint-dir runs/ckpt --keep-last 2 --checkpoint-when-busy defer

  # Flip one exponent bit of a first-layer weight before step 300, and one of Adam's state at step 500
  steadfast train --model mlp --inject 'step=300,state=param,target=model.fc1.*,bits=exponent,count=1,seed=7' \\
                              --inject 'step=500,state=optim,bits=30,count=1'

  # Flip a bit in the output of the first layer (a fault in the arithmetic, not in stored state)
  steadfast train --model mlp --inject 'step=300,state=activation,target=act.fc1,bits=exponent,seed=3'

  # In a 3-worker job, crash rank 1 during the commit vote of step 40
  steadfast launch --nproc 3 -- train --model mlp --fault 'crash:rank=1,step=40,phase=vote'

  # 2 replicas of a 3-stage pipeline of the GPT (1F1B): the bits of the single-process run
  steadfast launch --nproc 6 -- train --model gpt --pipeline-stages 3 --reduce reproducible --micro-batch 8

  # 4 ranks on the system's MPI library; reproducible sums give single-process train's bits
  mpirun -n 4 steadfast train --model mlp --engine mpi --reduce reproducible --micro-batch 32";

/// Arguments of `steadfast train`. Unset values take the model's defaults.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct TrainArgs {
    /// Architecture.
    #[arg(long, value_parser = choice::of::<ModelKind>(), default_value = "mlp")]
    model: ModelKind,
    /// The MLP's first hidden width (the second is half): 256 makes 0.24 M parameters,
    /// 12000 about 83 M (a 1 GB state with AdamW's two slots).
    #[arg(long, value_name = "W")]
    width: Option<usize>,
    /// The GPT's tokens per sequence [default: 64].
    #[arg(long, value_name = "T")]
    context: Option<usize>,
    /// The GPT's residual width [default: 128].
    #[arg(long, value_name = "D")]
    gpt_width: Option<usize>,
    /// The GPT's transformer blocks [default: 4].
    #[arg(long, value_name = "N")]
    gpt_blocks: Option<usize>,
    /// The GPT's attention heads per block; they divide --gpt-width [default: 4].
    #[arg(long, value_name = "H")]
    gpt_heads: Option<usize>,
    /// Data set [default: fashion-mnist for mlp and cnn, fortunes for gpt].
    #[arg(long, value_parser = choice::of::<DataKind>())]
    data: Option<DataKind>,
    /// Directory of the data set's files (overrides the Debian package's location).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Optimizer steps [default: mlp 2000, cnn 3000, gpt 1000].
    #[arg(long)]
    steps: Option<u64>,
    /// Global batch size [default: 128, gpt 32].
    #[arg(long)]
    batch: Option<usize>,
    /// Examples per forward/backward pass; must divide the batch [default: the batch].
    #[arg(long)]
    micro_batch: Option<usize>,
    /// Learning rate [default: mlp 1e-3, cnn 2e-3, gpt 2e-3].
    #[arg(long)]
    lr: Option<f32>,
    /// Optimizer.
    #[arg(long, value_parser = choice::of::<OptimKind>(), default_value = "adamw")]
    optimizer: OptimKind,
    /// SGD momentum.
    #[arg(long)]
    momentum: Option<f32>,
    /// Weight decay (L2 for SGD, decoupled for AdamW).
    #[arg(long)]
    weight_decay: Option<f32>,
    /// Seed of initialisation, data order and synthetic data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How micro-batch gradients are summed.
    #[arg(long, value_parser = choice::of::<train::ReduceMode>(), default_value = "deterministic")]
    reduce: train::ReduceMode,
    /// Which kernels compute the model [default: fixed where the model has them]. The
    /// fixed-order kernels give the same bits on every CPU; STEADFAST_ISA=scalar|avx2|avx512
    /// picks their instruction set (speed only).
    #[arg(long, value_parser = choice::of::<train::model::KernelSet>())]
    kernels: Option<train::model::KernelSet>,
    /// Evaluate on the held-out split every this many steps (0: only at the end).
    #[arg(long)]
    eval_every: Option<u64>,
    /// Score at most N held-out examples per evaluation [default: every test image, the
    /// first 1024 text sequences].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    eval_limit: Option<u64>,
    /// Output directory for metrics.jsonl.
    #[arg(long, default_value = train::config::DEFAULT_OUT)]
    out: PathBuf,
    /// Checkpoint after every N steps (and after the last step).
    #[arg(long, value_name = "N", requires = "checkpoint_dir")]
    checkpoint_every: Option<u64>,
    /// Root directory of the checkpoints.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Resume from a checkpoint directory, a checkpoint root, `latest` (the newest
    /// committed checkpoint under --checkpoint-dir) or `auto` (as `latest` when
    /// --checkpoint-dir holds a checkpoint, else from the start: one command for a job
    /// that a scheduler restarts or requeues).
    #[arg(long, value_name = "DIR|latest|auto")]
    resume: Option<PathBuf>,
    /// Keep only the K newest checkpoints.
    #[arg(long, value_name = "K")]
    keep_last: Option<usize>,
    /// Also keep every checkpoint whose step is a multiple of N.
    #[arg(long, value_name = "N")]
    keep_every: Option<u64>,
    /// Shard files per checkpoint, written in parallel.
    #[arg(long, default_value_t = 2)]
    checkpoint_shards: usize,
    /// What a checkpoint does when it falls due while the previous one is still being
    /// written.
    #[arg(long, value_name = "POLICY", value_parser = choice::of::<train::WhenBusy>(), default_value = "wait")]
    checkpoint_when_busy: train::WhenBusy,
    /// How much lower than training's the checkpoint writer thread's priority is (its nice
    /// value raised by N; 0: the same), so that it takes the cycles training leaves idle.
    #[arg(long, value_name = "N", default_value_t = ckpt::AsyncWriter::DEFAULT_PERSIST_NICE,
          value_parser = clap::value_parser!(u8).range(0..=19))]
    checkpoint_nice: u8,
    #[command(flatten)]
    join: JoinArgs,
    /// Join an elastic job, one that survives the loss of workers (`launch --max-restarts`
    /// starts its workers so) [env: STEADFAST_ELASTIC=1]. The rank is then the worker's
    /// slot; a rank at or beyond the world size joins a running job.
    #[arg(long)]
    elastic: bool,
    /// Which process of its slot this worker is (the launcher counts them) [env:
    /// STEADFAST_INCARNATION].
    #[arg(long, value_name = "N")]
    incarnation: Option<u64>,
    /// The rollback baseline of an elastic job, for comparison: copy the state in memory
    /// every K steps, and when a worker is lost, every survivor goes back to its copy
    /// (as Elastic Horovod's commits do) [env: STEADFAST_COPY_EVERY].
    #[arg(long, value_name = "K")]
    copy_every: Option<u64>,
    /// What an elastic job does when its replicas disagree. `repair` also checks, before
    /// every step, that each replica's state is the one it committed (it hashes the state
    /// after every update and again before the next step).
    #[arg(long, value_parser = choice::of::<train::OnDivergence>(), default_value = "stop")]
    on_divergence: train::OnDivergence,
    /// Cut the model into S pipeline stages (by layers; the GPT by blocks): a job of D x S
    /// ranks runs D replicas of an S-stage pipeline.
    #[arg(long, value_name = "S", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pipeline_stages: u64,
    /// The order of a pipeline stage's passes.
    #[arg(long, value_parser = choice::of::<train::PipeSchedule>(), default_value = "1f1b")]
    schedule: train::PipeSchedule,
    /// Log what crosses these stage boundaries (`all`, `none`, or numbers such as `0,2`;
    /// boundary 0 lies between stages 0 and 1), for recovery by replay.
    #[arg(long, value_name = "all|none|LIST", default_value = "none")]
    log_boundaries: String,
    /// Log the boundaries that fit BYTES a step (such as 4MB), chosen to keep recovery
    /// short: stages between unlogged boundaries recover together.
    #[arg(long, value_name = "BYTES", value_parser = crate::choice::bytes, conflicts_with = "log_boundaries")]
    log_budget: Option<u64>,
    /// Where the boundary logs go (local storage) [default: OUT/boundary-logs].
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Compare the replicas' fingerprints every K steps (and always at the end).
    #[arg(long, value_name = "K", default_value_t = 0)]
    fingerprint_every: u64,
    /// Flip bits in live state: `step=S[,rank=R][,state=param|grad|optim|activation][,target=GLOB]
    /// [,bits=sign|exponent|mantissa|any|N|N-M][,count=K|rate=P][,burst=B][,seed=N]`.
    /// Repeatable.
    #[arg(long, value_name = "FAULT")]
    inject: Vec<fault::live::LiveFault>,
    /// Crash, hang or cut this process: `KIND:rank=R,step=S[,phase=P]` with KIND one of
    /// crash|hang|cut and P one of forward|backward|allreduce|vote|update|checkpoint|transfer,
    /// or `KIND:mtbf=SECONDS[,seed=N]` at random moments. Repeatable.
    #[arg(long, value_name = "FAULT")]
    fault: Vec<fault::crash::ProcessFault>,
}

/// The data-parallel settings from flags, then the environment (ours, torchrun's, Slurm's).
fn dist_config(args: &TrainArgs) -> anyhow::Result<Option<train::DistConfig>> {
    Ok(launch::place::dist_config(&launch::place::WorkerFlags {
        join: args.join.flags(),
        elastic: args.elastic,
        incarnation: args.incarnation,
        copy_every: args.copy_every,
        fingerprint_every: args.fingerprint_every,
        on_divergence: args.on_divergence,
    })?)
}

impl TrainArgs {
    fn into_config(self) -> anyhow::Result<TrainConfig> {
        let dist = dist_config(&self)?;
        let mut c = TrainConfig::defaults(self.model);
        if let Some(w) = self.width {
            if self.model != ModelKind::Mlp {
                anyhow::bail!("--width is the MLP's; the {} has its own shape", self.model);
            }
            if w < 2 {
                anyhow::bail!("--width must be at least 2");
            }
            c.mlp_width = w;
        }
        let shape = [self.context, self.gpt_width, self.gpt_blocks, self.gpt_heads];
        if shape.iter().any(Option::is_some) && self.model != ModelKind::Gpt {
            anyhow::bail!("--context, --gpt-width, --gpt-blocks and --gpt-heads shape the GPT, not the {}", self.model);
        }
        c.gpt.context = self.context.unwrap_or(c.gpt.context);
        c.gpt.width = self.gpt_width.unwrap_or(c.gpt.width);
        c.gpt.layers = self.gpt_blocks.unwrap_or(c.gpt.layers);
        c.gpt.heads = self.gpt_heads.unwrap_or(c.gpt.heads);
        if let Some(d) = self.data {
            c.data = d;
        }
        c.data_dir = self.data_dir;
        c.steps = self.steps.unwrap_or(c.steps);
        c.batch = self.batch.unwrap_or(c.batch);
        c.micro_batch = self.micro_batch.unwrap_or(c.batch);
        c.optimizer = self.optimizer;
        c.optim.lr = self.lr.unwrap_or(c.optim.lr);
        c.optim.momentum = self.momentum.unwrap_or(c.optim.momentum);
        c.optim.weight_decay = self.weight_decay.unwrap_or(c.optim.weight_decay);
        c.seed = self.seed;
        c.reduce = self.reduce;
        c.kernels = self.kernels;
        c.eval_every = self.eval_every.unwrap_or(c.eval_every);
        c.eval_limit = self.eval_limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        c.out_dir = Some(self.out.clone());
        if let Some(dir) = &self.checkpoint_dir {
            c.checkpoint = Some(CheckpointConfig {
                dir: dir.clone(),
                every: self.checkpoint_every.unwrap_or(u64::MAX),
                retention: ckpt::Retention { keep_last: self.keep_last, keep_every: self.keep_every },
                shards: self.checkpoint_shards,
                when_busy: self.checkpoint_when_busy,
                persist_nice: self.checkpoint_nice,
            });
        }
        c.resume = train::checkpointing::resume_from(self.resume, self.checkpoint_dir.as_deref())?;
        let stages = self.pipeline_stages as usize;
        let logged = train::BoundaryLog::parse_boundaries(&self.log_boundaries, stages)?;
        let dir = self.log_dir.unwrap_or_else(|| self.out.join("boundary-logs"));
        let memory = train::BoundaryLog::DEFAULT_MEMORY;
        let budget = self.log_budget;
        c.log = (!logged.is_empty() || budget.is_some()).then_some(train::BoundaryLog {
            dir,
            boundaries: logged,
            memory,
            budget,
        });
        c.pipeline = train::Pipeline { stages, schedule: self.schedule };
        c.dist = dist;
        c.inject = self.inject;
        c.faults = self.fault;
        if self.checkpoint_every == Some(0) {
            anyhow::bail!("--checkpoint-every must be at least 1");
        }
        c.validate()?;
        Ok(c)
    }
}

/// Runs `steadfast train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    launch::launcher_gone::exit_with_launcher();
    let config = args.into_config()?;
    let bar = ProgressBar::new(config.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {per_sec}  eta {eta}  {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(250));
    // Under a launcher, the first worker of each node says the notes (membership, resume).
    let quiet = std::env::var("LOCAL_RANK").is_ok_and(|r| r != "0");
    let mut on_event = |event: Progress| {
        let line = match event {
            Progress::Started { parameters, .. } => return tracing::info!(parameters, "training started"),
            Progress::Step { step, loss } => {
                bar.set_position(step);
                return bar.set_message(format!("loss {loss:.4}"));
            }
            Progress::Note(_) if quiet => return,
            Progress::Note(text) => text,
            Progress::Eval(r) => {
                let ppl = r.perplexity.map(|p| format!(", perplexity {p:.3}")).unwrap_or_default();
                format!("step {:>6}  test loss {:.4}, accuracy {:.2}%{ppl}", r.step, r.loss, 100.0 * r.accuracy)
            }
        };
        if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) }
    };
    let (summary, _) = match train::train(&config, &mut on_event) {
        // A replacement that joined after the end: nothing to do, nothing to print.
        Err(e @ train::TrainError::JoinedAfterTheEnd) => {
            bar.finish_and_clear();
            eprintln!("{e}");
            return Ok(());
        }
        outcome => outcome.context("training failed")?,
    };
    bar.finish_and_clear();
    print!("{}", train::summary::text(&config, &summary));
    Ok(())
}
