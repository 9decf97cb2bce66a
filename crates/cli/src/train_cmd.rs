//! `steadfast train`: arguments, progress display and the final summary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::choice;
use crate::join_args::{JoinArgs, Meet, env_first};
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
    #[arg(long, value_parser = choice::of::<comm::ReduceMode>(), default_value = "deterministic")]
    reduce: comm::ReduceMode,
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
    #[arg(long, default_value = "runs/train")]
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

/// The environment variable `name` as a number, when set.
fn env_u64(name: &str) -> anyhow::Result<Option<u64>> {
    env_first(&[name]).map(|v| v.parse::<u64>().map_err(|e| anyhow::anyhow!("bad {name} {v:?}: {e}"))).transpose()
}

/// Which process of its slot this is (`--incarnation`, or the launcher's environment).
fn incarnation(args: &TrainArgs) -> anyhow::Result<u64> {
    Ok(match args.incarnation {
        Some(n) => n,
        None => env_u64("STEADFAST_INCARNATION")?.unwrap_or(0),
    })
}

/// The data-parallel settings from flags, then the environment (ours, torchrun's, Slurm's).
fn dist_config(args: &TrainArgs) -> anyhow::Result<Option<train::DistConfig>> {
    let elastic = args.elastic || env_first(&["STEADFAST_ELASTIC"]).is_some_and(|v| v == "1");
    let Some(place) = args.join.place(elastic)? else { return Ok(None) };
    let incarnation = incarnation(args)?;
    let copy_every = match args.copy_every {
        Some(k) => Some(k),
        None => env_u64("STEADFAST_COPY_EVERY")?,
    };
    if copy_every == Some(0) {
        anyhow::bail!("--copy-every must be at least 1");
    }
    if copy_every.is_some() && !elastic {
        anyhow::bail!("--copy-every goes with --elastic (the rollback baseline of an elastic job)");
    }
    let job = train::JobSettings { timeout: place.timeout, fingerprint_every: args.fingerprint_every, incarnation };
    Ok(Some(match place.meet {
        Meet::Mpi => train::DistConfig::Mpi(job),
        Meet::Mesh { rendezvous: train::Rendezvous::Coordinator(coordinator), secret, bind } if elastic => {
            train::DistConfig::Elastic(train::ElasticWorker {
                slot: place.rank,
                world: place.world,
                coordinator,
                secret,
                bind,
                job,
                copy_every,
                on_divergence: args.on_divergence,
            })
        }
        Meet::Mesh { .. } if elastic => {
            anyhow::bail!("an elastic job's membership is kept by its coordinator (--coordinator), not in etcd")
        }
        Meet::Mesh { rendezvous, secret, bind } => train::DistConfig::Mesh(train::MeshRank {
            rank: place.rank,
            world: place.world,
            rendezvous,
            secret,
            bind,
            job,
        }),
    }))
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
        c.out_dir = Some(self.out);
        if let Some(dir) = &self.checkpoint_dir {
            c.checkpoint = Some(CheckpointConfig {
                dir: dir.clone(),
                every: self.checkpoint_every.unwrap_or(u64::MAX),
                retention: ckpt::Retention { keep_last: self.keep_last, keep_every: self.keep_every },
                shards: self.checkpoint_shards.max(1),
                when_busy: self.checkpoint_when_busy,
                persist_nice: self.checkpoint_nice,
            });
        }
        c.resume = match self.resume {
            Some(p) if p.as_os_str() == "latest" => match &self.checkpoint_dir {
                Some(dir) => Some(dir.clone()),
                None => anyhow::bail!("--resume latest needs --checkpoint-dir"),
            },
            // A job that a scheduler restarts or requeues runs one command every time.
            Some(p) if p.as_os_str() == "auto" => match &self.checkpoint_dir {
                Some(dir) if dir.is_dir() => {
                    let any =
                        !ckpt::store::list(dir).with_context(|| format!("cannot list {}", dir.display()))?.is_empty();
                    any.then(|| dir.clone())
                }
                Some(_) => None,
                None => anyhow::bail!("--resume auto needs --checkpoint-dir"),
            },
            other => other,
        };
        c.dist = dist;
        c.inject = self.inject;
        c.faults = self.fault;
        if self.checkpoint_every == Some(0) {
            anyhow::bail!("--checkpoint-every must be at least 1");
        }
        if self.on_divergence == train::OnDivergence::Repair && !matches!(c.dist, Some(train::DistConfig::Elastic(_))) {
            anyhow::bail!(
                "--on-divergence repair needs an elastic job, whose replicas can fetch the state from one another: \
                 add --max-restarts K to its `launch` (or run `train --elastic` workers); a static job can only stop"
            );
        }
        if self.keep_last == Some(0) {
            anyhow::bail!("--keep-last must be at least 1: the newest checkpoint is always kept");
        }
        check_faults_fire(&c)?;
        if !(c.optim.lr.is_finite() && c.optim.lr > 0.0) {
            anyhow::bail!("--lr must be a positive number, not {}", c.optim.lr);
        }
        Ok(c)
    }
}

/// Refuses an `--inject` or `--fault` that could never fire: at a step past the run's
/// last, or on a rank outside its world (the world of an MPI job is known only once it
/// runs, so its ranks are not checked here).
fn check_faults_fire(c: &TrainConfig) -> anyhow::Result<()> {
    let world = match &c.dist {
        None => Some(1),
        Some(d) => d.world(),
    };
    let mut at: Vec<(String, u64, usize)> = c.inject.iter().map(|f| ("--inject".to_owned(), f.step, f.rank)).collect();
    for f in &c.faults {
        if let fault::crash::When::At { rank, step, .. } = f.when {
            at.push((format!("--fault {}", f.kind.name()), step, rank));
        }
    }
    for (flag, step, rank) in at {
        if step >= c.steps {
            anyhow::bail!(
                "{flag} at step {step} would never fire: the run's steps are 0 to {} (--steps {})",
                c.steps.saturating_sub(1),
                c.steps
            );
        }
        if let Some(world) = world.filter(|&w| rank >= w) {
            anyhow::bail!("{flag} on rank {rank} would never fire: the job's ranks are 0 to {}", world - 1);
        }
    }
    Ok(())
}

/// A worker started by `launch` ends when its launcher is gone (killed with `kill -9`, it
/// could not take its workers along): it checks four times a second whether it has been
/// handed to another parent. A stopped launcher is still its parent: the job waits for it.
fn exit_with_launcher() {
    let Some(launcher) = std::env::var(launch::LAUNCHER_PID).ok().and_then(|v| v.parse::<u32>().ok()) else { return };
    if std::os::unix::process::parent_id() != launcher {
        // Started by something else with the variable set by hand: nothing to watch.
        return;
    }
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(250));
            if std::os::unix::process::parent_id() != launcher {
                // Not `eprintln!`: stderr was a pipe to the launcher, and writing to it now
                // fails, which would panic this thread instead of ending the process.
                let text = format!("error: the launcher (pid {launcher}) is gone: this worker ends\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
                std::process::exit(3);
            }
        }
    });
}

/// Runs `steadfast train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    exit_with_launcher();
    let config = args.into_config()?;
    let bar = ProgressBar::new(config.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {per_sec}  eta {eta}  {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(250));
    let mut on_event = |event: Progress| match event {
        Progress::Started { parameters, .. } => {
            tracing::info!(parameters, "training started");
        }
        Progress::Step { step, loss } => {
            bar.set_position(step);
            bar.set_message(format!("loss {loss:.4}"));
        }
        Progress::Eval(r) => {
            let ppl = r.perplexity.map(|p| format!(", perplexity {p:.3}")).unwrap_or_default();
            let line = format!("step {:>6}  test loss {:.4}, accuracy {:.2}%{ppl}", r.step, r.loss, 100.0 * r.accuracy);
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    };
    let (summary, _) = train::train(&config, &mut on_event).context("training failed")?;
    bar.finish_and_clear();
    let out = config.out_dir.as_ref().expect("set by into_config");
    println!("model:        {:?} on {:?}, {} parameters", config.model, config.data, summary.parameters);
    if summary.resumed_from >= summary.steps {
        // A resume from the last step: nothing was trained, so there is no loss or speed.
        println!("steps:        0 (the checkpoint is at step {}: no step left to train)", config.steps);
    } else {
        let steps_per_s = summary.steps as f64 / summary.train_time.as_secs_f64();
        println!(
            "steps:        {} at {steps_per_s:.1} steps/s (optimizer {:.1}% of step time)",
            summary.steps,
            100.0 * summary.optimizer_time.as_secs_f64() / summary.train_time.as_secs_f64()
        );
        println!("final loss:   {:.4}", summary.final_loss);
    }
    println!("test loss:    {:.4}", summary.eval.loss);
    println!("test accuracy: {:.2}%", 100.0 * summary.eval.accuracy);
    if let (Some(p), Some(u)) = (summary.eval.perplexity, summary.unigram_perplexity) {
        println!("perplexity:   {p:.3} (unigram baseline {u:.3})");
    }
    if summary.resumed_from > 0 {
        println!("resumed from: step {}", summary.resumed_from);
    }
    let ck = &summary.checkpoints;
    if ck.committed > 0 {
        println!(
            "checkpoints:  {} committed ({} due steps passed over while the writer was busy), {} MB, training stalled {:.1} ms in all \
             (max {:.1} ms), persist {:.1} ms in all",
            ck.committed,
            summary.checkpoints_deferred,
            ck.bytes / 1_000_000,
            ck.stall.as_secs_f64() * 1e3,
            ck.max_stall.as_secs_f64() * 1e3,
            ck.persist.as_secs_f64() * 1e3
        );
    }
    println!("metrics:      {}", out.join("metrics.jsonl").display());
    // The kernels follow the fingerprint on its line: bits computed by another kernel set
    // differ, and this says so where the fingerprints are compared.
    println!("fingerprint: {} ({})", repro::fingerprint::hex(summary.fingerprint), summary.kernels);
    Ok(())
}
