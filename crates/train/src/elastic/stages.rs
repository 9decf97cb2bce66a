//! An elastic worker that holds a pipeline stage (`train --pipeline-stages S` under
//! `steadfast launch --max-restarts K`).
//!
//! Worker `id` holds stage `id mod S` of replica `id / S`, as in a static pipeline job
//! ([`crate::pipeline::Grid`]); the step protocol synchronises each stage's replicas apart
//! (see [`comm::protocol`]'s pipelines). Each epoch's layout is the start's, cut to the
//! epoch's members: a worker lost for good (`--on-failure shrink`) leaves its micro-batches
//! to the next replica's worker of its stage ([`Grid::rank`]), and a replacement takes its
//! slot's place again. The stage's checkpoints go to its own root under the job's
//! (`stage-S-of-N`), written in parts by the stage's members; a job that starts again
//! after a total loss resumes from the newest step of which every stage has one.

use std::path::Path;

use comm::protocol::WorkerId;

use crate::checkpointing::Restored;
use crate::config::{ElasticWorker, TrainConfig};
use crate::error::{ConfigError, TrainError};
use crate::pipeline::{Grid, Staged};
use crate::replay::{LoggedInputs, Replay, Task};
use crate::schedule::{Boundary, Op};
use crate::step::{Engine, TrainState};
use crate::trainer::Prepared;

/// How long a replay waits for its neighbours' newest log files before it gives up.
const LOGS_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The stage an elastic worker holds, and where the job's workers sit.
pub(super) struct Stages {
    /// The layout at the start: every slot.
    start: Grid,
    /// The stage, its neighbours' places in the current epoch, and the whole model's
    /// state for evaluations.
    pub staged: Staged,
}

/// `config` for worker `d` of a pipeline job: its checkpoints under its stage's root.
pub(super) fn stage_config(config: &TrainConfig, d: &ElasticWorker) -> Option<TrainConfig> {
    let stages = config.pipeline.stages;
    if stages < 2 {
        return None;
    }
    let mut own = config.clone();
    if let Some(c) = own.checkpoint.as_mut() {
        c.dir = c.dir.join(ckpt::reader::stage_dir_name(d.slot % stages, stages));
    }
    Some(own)
}

impl Stages {
    /// Cuts `state` (the whole model's initial state) and `engine` to worker `d.slot`'s
    /// stage of a job of `d.world` workers; `None` for a job that is not a pipeline.
    pub fn cut<'a>(
        config: &TrainConfig,
        d: &ElasticWorker,
        state: &mut TrainState,
        engine: Engine<'a>,
    ) -> Result<(Option<Stages>, Engine<'a>), TrainError> {
        if config.pipeline.stages < 2 {
            return Ok((None, engine));
        }
        let start = Grid::of(config.pipeline.stages, d.world)?;
        let (staged, engine) = Staged::cut(config, start.clone(), d.slot, state, engine)?;
        Ok((Some(Stages { start, staged }), engine))
    }

    /// The stage's index.
    pub fn stage(&self) -> usize {
        self.staged.stage.index
    }

    /// Replays the stage from its checkpoint of `from` to step `to` on the inputs its
    /// neighbours logged (every replica's: this worker computes all of the stage's
    /// micro-batches), on `engine`; returns the state replayed. Fails, touching nothing,
    /// when the logs lack an input or the job's sums would not give the same bits.
    pub fn replay(
        &self,
        (config, prepared): (&TrainConfig, &Prepared),
        engine: &mut Engine<'_>,
        (from, to): (u64, u64),
    ) -> Result<TrainState, TrainError> {
        let log = config.log.as_ref().ok_or_else(|| ConfigError::Invalid("the job logs no boundary".into()))?;
        let (stages, stage, replicas) = (self.start.stages, self.stage(), self.start.replicas);
        if replicas > 1 && !config.reduce.is_reproducible() {
            return Err(ConfigError::Invalid(format!(
                "a replay sums the stage's micro-batches in another order than its {replicas} replicas did: the bits \
                 are kept only with --reduce reproducible, not {}",
                config.reduce
            ))
            .into());
        }
        // Boundary `b` lies between stages `b` and `b + 1`.
        let needed = [stage.checked_sub(1), (stage + 1 < stages).then_some(stage)];
        if let Some(b) = needed.into_iter().flatten().find(|b| !log.boundaries.contains(b)) {
            return Err(ConfigError::Invalid(format!(
                "boundary {b} is not logged: the stages on both sides of it would replay together, which an \
                 elastic job does not do"
            ))
            .into());
        }
        let mut inputs = LoggedInputs::new(&log.dir, stage, replicas);
        let kinds: Vec<Boundary> =
            [(stage > 0).then_some(Boundary::Activation), (stage + 1 < stages).then_some(Boundary::Gradient)]
                .into_iter()
                .flatten()
                .collect();
        // The neighbours write their logs in the background, and one that rolls forward
        // in this very epoch writes its last step's after: the newest files may come
        // moments after the replay was asked for.
        let settle = std::time::Instant::now() + LOGS_SETTLE;
        while let Err(e) = inputs.check(from..to, engine.sampler().micro_batches(), &kinds) {
            if std::time::Instant::now() >= settle {
                return Err(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let mut state = self.load(config, prepared, from)?;
        let task = Task { stages, stage, helper: 0, helpers: 1 };
        let mut get = |step, micro, tensor| inputs.get(step, micro, tensor);
        let mut runner = Replay { inputs: &mut get, helpers: None, live: None, reducer: Default::default() };
        crate::replay::replay(engine, &mut state, task, to, &mut runner)?;
        Ok(state)
    }

    /// Enters the epoch of `members` (ids, in rank order): the layout is the start's, cut
    /// to them.
    pub fn enter(&mut self, members: &[WorkerId]) -> Result<(), TrainError> {
        let slots: Vec<usize> = members.iter().map(|&m| m as usize).collect();
        self.staged.layout = self.start.with_slots(slots)?;
        Ok(())
    }

    /// The step of the member ranked `rank` in the current epoch.
    pub fn ops(&self, config: &TrainConfig, rank: usize, micro_batches: usize) -> Vec<Op> {
        self.staged.layout.ops(config.pipeline.schedule, rank, micro_batches)
    }

    /// The stage's state at `step`: its checkpoint of that step under `config`'s root (the
    /// stage's), or its initial state at step 0.
    pub fn load(&self, config: &TrainConfig, prepared: &Prepared, step: u64) -> Result<TrainState, TrainError> {
        let (whole, _) = prepared.start(config);
        let mut state = crate::pipeline::fresh_stage(config, &self.staged.stage, &whole);
        if step > 0 {
            let c = config
                .checkpoint
                .as_ref()
                .ok_or_else(|| ConfigError::Invalid("the job keeps no checkpoints".into()))?;
            let dir = c.dir.join(ckpt::store::step_dir_name(step));
            crate::checkpointing::restore(&dir, config, &mut state)?;
        }
        Ok(state)
    }
}

/// The steps of the committed checkpoints under the stage's root of `config`, newest
/// first (at most eight): what the worker can load.
pub(super) fn saved_steps(config: &TrainConfig) -> Vec<u64> {
    let Some(c) = &config.checkpoint else { return Vec::new() };
    let mut steps: Vec<u64> =
        ckpt::store::list(&c.dir).map(|l| l.into_iter().map(|(s, _)| s).collect()).unwrap_or_default();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    steps.truncate(8);
    steps
}

/// The checkpoint a pipeline worker resumes from (`--resume ROOT`, the job's root of
/// stage roots): its stage's checkpoint of the newest step of which every stage has one.
pub(super) fn restore(
    config: &TrainConfig,
    stages: usize,
    stage: usize,
    state: &mut TrainState,
) -> Result<Option<Restored>, TrainError> {
    let Some(root) = config.resume.as_deref() else { return Ok(None) };
    let step = ckpt::reader::common_step(root, stages)?.ok_or_else(|| {
        ConfigError::Invalid(format!(
            "--resume {}: no step of which every one of the {stages} stages has a checkpoint there",
            root.display()
        ))
    })?;
    let dir = root.join(ckpt::reader::stage_dir_name(stage, stages)).join(ckpt::store::step_dir_name(step));
    crate::trainer::restore(config, Some(Path::new(&dir)), state)
}
