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

use comm::group::Group;
use comm::protocol::{ReplayFailure, ReplayGroup, WorkerId};
use comm::transport::Transport;

use crate::checkpointing::Restored;
use crate::config::{ElasticWorker, TrainConfig};
use crate::error::{ConfigError, TrainError};
use crate::pipeline::{Grid, Staged};
use crate::replay::{Live, LoggedInputs, Replay, Task};
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

    /// Whether worker `id` can take its place in `group`'s replay to step `to`: the sums
    /// give the same bits whoever computes which micro-batches, and the neighbours' logs
    /// hold every tensor it reads at the group's edges. Reads every one of them first, so
    /// that a replay that cannot finish is known before anyone waits for it.
    pub fn check_replay(
        &self,
        config: &TrainConfig,
        (group, id): (&ReplayGroup, WorkerId),
        to: u64,
        micro_batches: usize,
    ) -> Result<(), ReplayFailure> {
        let (stage, _) = group.place_of(id).ok_or(ReplayFailure::Impossible)?;
        let sharers = group.workers[stage - group.first].len();
        if (self.start.replicas > 1 || sharers > 1) && !config.reduce.is_reproducible() {
            tracing::error!(
                "a replay sums stage {stage}'s micro-batches in another order than its {} replicas did: the bits are \
                 kept only with --reduce reproducible, not {}",
                self.start.replicas,
                config.reduce
            );
            return Err(ReplayFailure::Impossible);
        }
        let stages = self.start.stages;
        // Boundary `b` lies between stages `b` and `b + 1`: the group reads its edges.
        let edges = [
            (stage == group.first && stage > 0).then(|| (stage - 1, Boundary::Activation)),
            (stage + 1 == group.stages().end && stage + 1 < stages).then_some((stage, Boundary::Gradient)),
        ];
        let logged = config.log.as_ref().map(|l| l.boundaries.clone()).unwrap_or_default();
        let mut unlogged = 0u64;
        for (b, kind) in edges.into_iter().flatten() {
            if !logged.contains(&b) {
                unlogged |= 1 << b.min(63);
                continue;
            }
            let dir = &config.log.as_ref().expect("a logged boundary has a log").dir;
            let mut inputs = LoggedInputs::new(dir, stage, self.start.replicas);
            // The neighbours write their logs in the background, and one that rolls
            // forward in this very epoch writes its last step's after: the newest files
            // may come moments after the replay was asked for.
            let settle = std::time::Instant::now() + LOGS_SETTLE;
            while let Err(e) = inputs.check(group.from..to, micro_batches, &[kind]) {
                if std::time::Instant::now() >= settle {
                    tracing::error!("stage {stage} cannot be replayed from boundary {b}'s logs: {e}");
                    unlogged |= 1 << b.min(63);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        if unlogged != 0 {
            return Err(ReplayFailure::Unlogged(unlogged));
        }
        Ok(())
    }

    /// Replays worker `id`'s place of `group` to step `to` (see [`Action::Replay`]) from
    /// its stage's checkpoint: its share of the stage's micro-batches, summed with the
    /// stage's other workers over `mesh` (ranked as `group.participants()`), the tensors
    /// inside the group exchanged there too and those at its edges read from the logs.
    /// Returns the stage's state replayed.
    ///
    /// [`Action::Replay`]: comm::protocol::Action::Replay
    pub fn replay(
        &self,
        (config, prepared): (&TrainConfig, &Prepared),
        (group, id): (&ReplayGroup, WorkerId),
        to: u64,
        mesh: &dyn Transport,
    ) -> Result<TrainState, TrainError> {
        let (stage, helper) =
            group.place_of(id).ok_or_else(|| ConfigError::Invalid("no place in the replay".into()))?;
        let everyone = group.participants();
        let rank_of = |w: &WorkerId| everyone.iter().position(|x| x == w).expect("a participant");
        let ranks: Vec<Vec<usize>> = (0..self.start.stages)
            .map(|s| match s.checked_sub(group.first).and_then(|i| group.workers.get(i)) {
                Some(workers) => workers.iter().map(rank_of).collect(),
                None => Vec::new(),
            })
            .collect();
        let sharers = ranks[stage].clone();
        let (mut state, mut engine) = self.stage_at(config, prepared, stage, group.from)?;
        let timeout = config.collective_timeout();
        let sum = Group::new(mesh, sharers.clone())?;
        let live = (group.workers.len() > 1).then(|| Live { transport: mesh, ranks, timeout, bytes: Vec::new() });
        let log = config.log.as_ref();
        let mut inputs = log.map(|l| LoggedInputs::new(&l.dir, stage, self.start.replicas));
        let mut get = |step, micro, tensor| match inputs.as_mut() {
            Some(i) => i.get(step, micro, tensor),
            None => Err(ConfigError::Invalid("the job logs no boundary".into()).into()),
        };
        let helpers = (sharers.len() > 1).then_some((&sum as &dyn Transport, timeout));
        let mut runner = Replay { inputs: &mut get, helpers, live, reducer: Default::default() };
        let task = Task { stages: self.start.stages, stage, helper, helpers: sharers.len() };
        crate::replay::replay(&mut engine, &mut state, task, to, &mut runner)?;
        Ok(state)
    }

    /// An engine of stage `stage`, and the stage's state at `step`: its checkpoint of that
    /// step under the stage's root (or its initial state at step 0).
    fn stage_at<'p>(
        &self,
        config: &TrainConfig,
        prepared: &'p Prepared,
        stage: usize,
        step: u64,
    ) -> Result<(TrainState, Engine<'p>), TrainError> {
        let (whole, engine) = prepared.start(config);
        let cut = engine.stage(self.start.stages, stage)?;
        let mut state = crate::pipeline::fresh_stage(config, &cut, &whole);
        if step > 0 {
            let c = config
                .checkpoint
                .as_ref()
                .ok_or_else(|| ConfigError::Invalid("the job keeps no checkpoints".into()))?;
            // `stage_config` put this worker's stage root under the job's.
            let root = c.dir.parent().unwrap_or(&c.dir);
            let dir = root
                .join(ckpt::reader::stage_dir_name(stage, self.start.stages))
                .join(ckpt::store::step_dir_name(step));
            crate::checkpointing::restore(&dir, config, &mut state)?;
        }
        Ok((state, engine.for_stage(cut)))
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

    /// The stage's state at `step`: its checkpoint of that step under its root, or its
    /// initial state at step 0.
    pub fn load(&self, config: &TrainConfig, prepared: &Prepared, step: u64) -> Result<TrainState, TrainError> {
        Ok(self.stage_at(config, prepared, self.stage(), step)?.0)
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
