//! The configuration of a training run: what defines its trajectory, and where it runs.

use std::path::PathBuf;
use std::time::Duration;

use ckpt::Retention;
use comm::ReduceMode;

pub use comm::job::{CoordinatorAt, DistConfig, ElasticWorker, JobSettings, MeshRank, OnDivergence, Rendezvous};

use crate::data::DataKind;
use crate::model::{GptConfig, KernelSet, ModelKind};
use crate::optim::{OptimConfig, OptimKind};

// Where `steadfast train` writes its metrics (and, under it, its boundary logs and a
// launcher's pipeline checkpoints) when `--out` is not given.
pub use comm::job::DEFAULT_OUT;

/// Everything that defines a training run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Architecture.
    pub model: ModelKind,
    /// The MLP's first hidden width (its second is half that).
    pub mlp_width: usize,
    /// The GPT's shape (`--context`, `--gpt-width`, `--gpt-blocks`, `--gpt-heads`); its
    /// vocabulary here is 0, the text's once it is loaded.
    pub gpt: GptConfig,
    /// Data set.
    pub data: DataKind,
    /// Overrides the data set's directory.
    pub data_dir: Option<PathBuf>,
    /// Number of optimizer steps.
    pub steps: u64,
    /// Global batch size (examples per step).
    pub batch: usize,
    /// Examples per forward/backward pass; divides `batch`.
    pub micro_batch: usize,
    /// Optimizer.
    pub optimizer: OptimKind,
    /// Optimizer hyper-parameters.
    pub optim: OptimConfig,
    /// Seed of initialisation, data order and synthetic data.
    pub seed: u64,
    /// Which kernels compute the model; `None` takes the default (the fixed-order ones).
    pub kernels: Option<KernelSet>,
    /// How micro-batch gradients are summed, in this process and across a job (see
    /// `docs/determinism.md`).
    pub reduce: ReduceMode,
    /// Evaluate every this many steps (and always at the end); 0 evaluates only at the end.
    pub eval_every: u64,
    /// Score at most this many held-out examples per evaluation; `None`: every test image,
    /// or the trainer's first `TEXT_EVAL_SEQUENCES` text sequences.
    pub eval_limit: Option<usize>,
    /// Where to write `metrics.jsonl`; nothing is written without it.
    pub out_dir: Option<PathBuf>,
    /// Periodic checkpoints; none without it.
    pub checkpoint: Option<CheckpointConfig>,
    /// Resume from this checkpoint (a checkpoint directory, or a root whose newest
    /// committed checkpoint is used).
    pub resume: Option<PathBuf>,
    /// Data-parallel training across processes; `None` trains in this process alone.
    pub dist: Option<DistConfig>,
    /// The model cut into pipeline stages across a job's ranks (one stage: not cut).
    pub pipeline: Pipeline,
    /// Which stage boundaries of a pipeline job log what crosses them, and where.
    pub log: Option<BoundaryLog>,
    /// Bit flips to inject into live state (`--inject`).
    pub inject: Vec<fault::live::LiveFault>,
    /// Crashes, hangs and cut links at named phases of a step (`--fault`).
    pub faults: Vec<fault::crash::ProcessFault>,
}

/// A model cut into pipeline stages (`--pipeline-stages`, `--schedule`): a job of `D * S`
/// ranks runs `D` data-parallel replicas of an `S`-stage pipeline, rank `d * S + s`
/// holding stage `s` of replica `d` (see [`crate::pipeline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    /// Stages (1: the model is not cut).
    pub stages: usize,
    /// The order of each stage's forward and backward passes.
    pub schedule: PipeSchedule,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline { stages: 1, schedule: PipeSchedule::OneFOneB }
    }
}

/// The boundary logs of a pipeline job (`--log-boundaries`, `--log-dir`; see
/// `ckpt::log`): on each logged boundary `b` (between stages `b` and `b + 1`), stage `b`
/// logs the activations it sends and stage `b + 1` the gradients it sends back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundaryLog {
    /// The local directory of the logs.
    pub dir: PathBuf,
    /// The logged boundaries, in order.
    pub boundaries: Vec<usize>,
    /// Bytes of logged values that may wait in memory for the disk.
    pub memory: u64,
    /// The most bytes a step may log (`--log-budget`): when set, the run chooses
    /// `boundaries` itself from the model's shape (`pipeline::groups`).
    pub budget: Option<u64>,
}

impl BoundaryLog {
    /// Bytes of logged values that may wait for the disk, unless told otherwise.
    pub const DEFAULT_MEMORY: u64 = 64 << 20;

    /// The boundaries that `--log-boundaries` names, for a pipeline of `stages` stages:
    /// `all`, `none`, or a comma-separated list of boundary indices (`0` is the one
    /// between stages 0 and 1).
    pub fn parse_boundaries(text: &str, stages: usize) -> Result<Vec<usize>, crate::ConfigError> {
        let count = stages.saturating_sub(1);
        match text.trim() {
            "all" => Ok((0..count).collect()),
            "none" => Ok(Vec::new()),
            list => {
                let mut out = Vec::new();
                for word in list.split(',') {
                    let b: usize = word.trim().parse().map_err(|_| {
                        crate::ConfigError::Invalid(format!(
                            "--log-boundaries takes all, none or boundary numbers such as 0,2; not {word:?}"
                        ))
                    })?;
                    if count == 0 {
                        return Err(crate::ConfigError::Invalid(
                            "a model that is not cut has no boundary to log: give --pipeline-stages".into(),
                        ));
                    }
                    if b >= count {
                        return Err(crate::ConfigError::Invalid(format!(
                            "boundary {b} does not exist: {stages} stages have boundaries 0 to {}",
                            count - 1
                        )));
                    }
                    out.push(b);
                }
                out.sort_unstable();
                out.dedup();
                Ok(out)
            }
        }
    }
}

/// The order of a pipeline stage's passes in a step (see [`crate::schedule`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipeSchedule {
    /// Every forward pass, then every backward pass.
    GPipe,
    /// One forward, one backward, once the pipeline is full (less memory).
    #[default]
    OneFOneB,
}

/// Refuses a directory flag that names an existing file (or a path below one): the
/// run would fail at its first write with the system's "File exists" or "Not a directory".
fn not_a_file(flag: &str, dir: &std::path::Path) -> Result<(), crate::ConfigError> {
    let mut at = Some(dir);
    while let Some(p) = at {
        if p.exists() && !p.is_dir() {
            let what = if p == dir { "is".to_owned() } else { format!("is below {}, which is", p.display()) };
            return Err(crate::ConfigError::Invalid(format!(
                "{flag} {} {what} a file, not a directory: name a directory (it is created if missing)",
                dir.display()
            )));
        }
        at = p.parent();
    }
    Ok(())
}

impl TrainConfig {
    /// The kernel set of this run: the one it names, or the default.
    pub fn kernel_set(&self) -> KernelSet {
        self.kernels.unwrap_or_default()
    }

    /// Refuses settings that cannot work or could never take effect (each message names
    /// the `train` flag that sets the value): a checkpoint interval or `keep_last` of 0, a
    /// learning rate that is not a positive number, and an injection or fault at a step
    /// past the run's last or on a rank outside its world (the world of an MPI job is
    /// known only once it runs, so its ranks are not checked here).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let invalid = |text: String| Err(crate::ConfigError::Invalid(text));
        if let Some(c) = &self.checkpoint {
            if c.every == 0 {
                return invalid("--checkpoint-every must be at least 1".into());
            }
            if c.retention.keep_last == Some(0) {
                return invalid("--keep-last must be at least 1: the newest checkpoint is always kept".into());
            }
            if c.shards == 0 {
                return invalid("--checkpoint-shards must be at least 1".into());
            }
            not_a_file("--checkpoint-dir", &c.dir)?;
        }
        if let Some(out) = &self.out_dir {
            not_a_file("--out", out)?;
        }
        self.check_faults_fire()?;
        self.check_pipeline()?;
        check_gpt(&self.gpt)?;
        if !(self.optim.lr.is_finite() && self.optim.lr > 0.0) {
            return invalid(format!("--lr must be a positive number, not {}", self.optim.lr));
        }
        Ok(())
    }

    /// The bound on every collective step of this run's job (a minute for a process alone,
    /// which has none).
    pub fn collective_timeout(&self) -> std::time::Duration {
        self.dist.as_ref().map_or(Duration::from_secs(60), |d| d.settings().timeout)
    }

    /// What a pipeline job needs: a job on the mesh (static or elastic) whose ranks are
    /// whole pipelines, and no feature that pipeline stages do not have yet.
    fn check_pipeline(&self) -> Result<(), crate::ConfigError> {
        let stages = self.pipeline.stages;
        let invalid = |text: String| Err(crate::ConfigError::Invalid(text));
        if stages == 0 {
            return invalid("--pipeline-stages must be at least 1".into());
        }
        if stages == 1 {
            return match &self.log {
                Some(_) => invalid(
                    "--log-boundaries and --log-budget log the boundaries of a pipeline: give --pipeline-stages".into(),
                ),
                None => Ok(()),
            };
        }
        let world = match &self.dist {
            Some(DistConfig::Mesh(m)) => m.world,
            Some(DistConfig::Mpi(_)) => return invalid("pipeline stages run on Steadfast's mesh, not MPI's".into()),
            Some(DistConfig::Elastic(e)) => e.world,
            None => {
                return invalid(format!(
                    "--pipeline-stages {stages} needs a job of D x {stages} ranks: \
                     steadfast launch --nproc {stages} -- train --pipeline-stages {stages} ..."
                ));
            }
        };
        if !world.is_multiple_of(stages) {
            return invalid(format!("a job of {world} ranks is not whole pipelines of {stages} stages"));
        }
        let replicas = world / stages;
        if self.micro_batch == 0 || self.batch / self.micro_batch.max(1) < replicas {
            return invalid(format!(
                "{replicas} replicas of the pipeline need at least {replicas} micro-batches a step (--micro-batch)"
            ));
        }
        Ok(())
    }

    fn check_faults_fire(&self) -> Result<(), crate::ConfigError> {
        let world = match &self.dist {
            None => Some(1),
            Some(d) => d.world(),
        };
        let mut at: Vec<(String, u64, usize)> =
            self.inject.iter().map(|f| ("--inject".to_owned(), f.step, f.rank)).collect();
        for f in &self.faults {
            if let fault::crash::When::At { rank, step, .. } = f.when {
                at.push((format!("--fault {}", f.kind.name()), step, rank));
            }
        }
        for (flag, step, rank) in at {
            if step >= self.steps {
                return Err(crate::ConfigError::Invalid(format!(
                    "{flag} at step {step} would never fire: the run's steps are 0 to {} (--steps {})",
                    self.steps.saturating_sub(1),
                    self.steps
                )));
            }
            if let Some(world) = world.filter(|&w| rank >= w) {
                return Err(crate::ConfigError::Invalid(format!(
                    "{flag} on rank {rank} would never fire: the job's ranks are 0 to {}",
                    world - 1
                )));
            }
        }
        Ok(())
    }

    /// The defaults for a model: sizes and schedules that reach the documented quality
    /// within a few minutes on two cores.
    pub fn defaults(model: ModelKind) -> Self {
        let adamw = OptimConfig { lr: 1e-3, momentum: 0.9, weight_decay: 0.0, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let (data, steps, batch, micro_batch, lr) = match model {
            ModelKind::Mlp => (DataKind::FashionMnist, 2000, 128, 128, 1e-3),
            ModelKind::Cnn => (DataKind::FashionMnist, 3000, 128, 128, 2e-3),
            ModelKind::Gpt => (DataKind::Fortunes, 1000, 32, 32, 2e-3),
        };
        TrainConfig {
            model,
            mlp_width: crate::model::Mlp::DEFAULT_WIDTH,
            gpt: GptConfig::small(0),
            data,
            data_dir: None,
            steps,
            batch,
            micro_batch,
            optimizer: OptimKind::AdamW,
            optim: OptimConfig { lr, ..adamw },
            seed: 0,
            kernels: None,
            reduce: ReduceMode::Deterministic,
            eval_every: 500,
            eval_limit: None,
            out_dir: None,
            checkpoint: None,
            resume: None,
            dist: None,
            pipeline: Pipeline::default(),
            log: None,
            inject: Vec::new(),
            faults: Vec::new(),
        }
    }
}

/// Refuses a GPT shape that cannot be built, naming the flags that set it.
fn check_gpt(gpt: &GptConfig) -> Result<(), crate::ConfigError> {
    let GptConfig { context, width, layers, heads, .. } = *gpt;
    if context < 2 || width == 0 || layers == 0 || heads == 0 {
        return Err(crate::ConfigError::Invalid(format!(
            "the GPT needs --context of at least 2 and a --gpt-width, --gpt-blocks and --gpt-heads of at least 1 \
             (got {context}, {width}, {layers}, {heads})"
        )));
    }
    if !width.is_multiple_of(heads) {
        return Err(crate::ConfigError::Invalid(format!(
            "--gpt-heads {heads} must divide --gpt-width {width} (each head takes an equal share of the width)"
        )));
    }
    Ok(())
}

/// Where and how often to checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// Root directory of the checkpoints.
    pub dir: PathBuf,
    /// Checkpoint after every this many steps (the last step is always checkpointed).
    pub every: u64,
    /// Which checkpoints to keep.
    pub retention: Retention,
    /// Shard files written in parallel.
    pub shards: usize,
    /// What a checkpoint that falls due while the previous one is still being persisted does.
    pub when_busy: WhenBusy,
    /// How much the persist thread's nice value is raised above training's (0..=19).
    pub persist_nice: u8,
}

impl CheckpointConfig {
    /// Checkpoints into `dir` after every `every` steps, with the default retention (keep
    /// all), two shards, waiting for a busy writer, and the writer's default priority.
    pub fn every(dir: impl Into<PathBuf>, every: u64) -> Self {
        CheckpointConfig {
            dir: dir.into(),
            every,
            retention: Retention::default(),
            shards: 2,
            when_busy: WhenBusy::Wait,
            persist_nice: ckpt::AsyncWriter::DEFAULT_PERSIST_NICE,
        }
    }
}

/// What a checkpoint that falls due while the previous one is still being persisted does.
///
/// Either way every checkpoint resumes bit for bit; the choice is between checkpoints at
/// the steps asked for and a loop that never waits for the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenBusy {
    /// Wait for the persist, then take the snapshot: a checkpoint after exactly every N
    /// steps, at the disk's pace when the disk is slower than N steps.
    #[default]
    Wait,
    /// Put the checkpoint off to the first step after the persist has ended (in a
    /// data-parallel job, after every rank's has, as their commit votes tell). Training
    /// then waits for the copy (and, on rank 0 of a job, for the previous commit's rename
    /// to finish), and checkpoints come at most as often as the disk takes them
    /// (CheckFreq's adaptive interval). The last step, and a due step that
    /// `--keep-every` keeps, are never put off.
    Defer,
}
