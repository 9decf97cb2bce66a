//! Recovery by replay: a pipeline stage that was lost is rebuilt from its own checkpoint
//! by computing its steps again on the inputs its neighbours logged, with no other
//! stage rolling back.
//!
//! A stage's step is a function of its state and of what it receives: the previous
//! stage's activations and the next stage's gradients, micro-batch by micro-batch. Its
//! neighbours logged both as they sent them ([`ckpt::log`]). So the stage's checkpoint
//! at step `c`, replayed through the steps `c..t` on the logged tensors, is the state
//! the stage held at step `t`, bit for bit: the replay runs the stage's own schedule on
//! the one step [`driver`](crate::driver), with a runner ([`Replay`]) whose receives read
//! the logs, whose sends go nowhere (the neighbours have what they sent), and whose vote
//! is the stage's own.
//!
//! **Parallel replay.** `r` helpers can share the work: helper `k` computes the
//! micro-batches `i` with `i mod r == k`, and the helpers sum their gradients together
//! on a [`Group`](comm::group::Group) of the job (or any transport of `r` ranks). In a
//! reproducible reduce mode that sum does not depend on how the micro-batches were
//! shared out, so every helper ends with the same bits, and they are the bits of the
//! stage that was lost, for every `r`. (In the other modes a parallel replay sums in
//! another order: it is refused.)
//!
//! **Groups.** Where a boundary is not logged ([selective logging](crate::pipeline::groups)),
//! the stages on both sides replay together: each runs its own stage, the tensors between
//! them go live ([`Live`]), and only the group's outer edges are read from the logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use comm::transport::Transport;

use crate::config::PipeSchedule;
use crate::driver::{Driver, Flow, Reduction, Runner};
use crate::error::{ConfigError, TrainError};
use crate::schedule::{self, Boundary, Op};
use crate::step::{At, Engine, NoHooks, TrainState};

/// The runner of a replay: receives come from `inputs` (or from a live peer), sends are
/// dropped (or go to a live peer), and the sum is this helper's alone or its helpers'
/// together.
pub struct Replay<'a> {
    /// The tensor that micro-batch `micro` of step `step` received, by kind.
    pub inputs: &'a mut dyn FnMut(u64, usize, Boundary) -> Result<Vec<f32>, TrainError>,
    /// The other helpers of a parallel replay, and the bound on each collective step.
    pub helpers: Option<(&'a dyn Transport, Duration)>,
    /// The stages that replay alongside, if any.
    pub live: Option<Live<'a>>,
    /// The collectives' working space.
    pub reducer: comm::collective::Reducer,
}

/// The stages of a group that replay together, and how to reach them.
pub struct Live<'a> {
    /// The transport of the group's ranks.
    pub transport: &'a dyn Transport,
    /// The ranks that replay each stage of the pipeline: none for a stage outside the
    /// group (its tensors are in the logs). Of a stage's `r` ranks, the `k`-th computes
    /// the micro-batches `i` with `i mod r == k`.
    pub ranks: Vec<Vec<usize>>,
    /// The bound on a tensor's wait.
    pub timeout: Duration,
    /// A tensor's wire form.
    pub bytes: Vec<u8>,
}

impl Live<'_> {
    /// The rank that replays micro-batch `micro` of `stage`, if the stage is in the group.
    fn peer(&self, stage: usize, micro: usize) -> Option<usize> {
        let ranks = self.ranks.get(stage).filter(|r| !r.is_empty())?;
        Some(ranks[micro % ranks.len()])
    }
}

impl Runner for Replay<'_> {
    fn reduce(&mut self, _at: At, r: Reduction<'_, '_>) -> Result<Flow, TrainError> {
        match self.helpers {
            Some((t, timeout)) if t.world() > 1 => {
                self.reducer.sum_parts(t, r.parts, r.sum.as_mut_slice(), r.engine.reduce_mode(), timeout)?;
            }
            _ => r.local(),
        }
        Ok(Flow::Go)
    }

    fn send(&mut self, _: At, peer: usize, micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        match &mut self.live {
            Some(live) => match live.peer(peer, micro) {
                Some(rank) => crate::pipeline::send_tensor(live.transport, rank, tensor, data, &mut live.bytes),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn recv(
        &mut self,
        at: At,
        peer: usize,
        micro: usize,
        tensor: Boundary,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        if let Some(live) = &mut self.live
            && let Some(rank) = live.peer(peer, micro)
        {
            let (t, timeout) = (live.transport, live.timeout);
            return crate::pipeline::recv_tensor(t, (rank, micro, tensor), timeout, &mut live.bytes, data);
        }
        *data = (self.inputs)(at.step, micro, tensor)?;
        Ok(())
    }
}

/// Which stage is replayed, and how the work is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Stages of the pipeline.
    pub stages: usize,
    /// The stage replayed.
    pub stage: usize,
    /// This helper.
    pub helper: usize,
    /// Helpers in all.
    pub helpers: usize,
}

/// Steps `state`, the stage's state at its checkpoint, forward to step `to` on the
/// engine of that stage, as helper `task.helper` of `task.helpers` (see the module's
/// documentation). Every helper calls it, each with its own copy of the state.
pub fn replay(
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    task: Task,
    to: u64,
    runner: &mut Replay<'_>,
) -> Result<(), TrainError> {
    if task.helpers > 1 && !engine.reduce_mode().is_reproducible() {
        return Err(ConfigError::Invalid(format!(
            "a replay shared by {} helpers sums in another order: it needs a reproducible reduce mode, not {}",
            task.helpers,
            engine.reduce_mode()
        ))
        .into());
    }
    let micro_batches = engine.sampler().micro_batches();
    // GPipe's order: the order of a stage's passes changes no bit, and GPipe's is the
    // simplest (every stage of a group replays in it, so their exchanges match).
    let ops: Vec<Op> =
        schedule::pipeline(PipeSchedule::GPipe, task.stages, task.stage, micro_batches, task.helper, task.helpers);
    let mut driver = Driver::new(engine, task.helper);
    while state.step < to {
        driver.run(&ops, 0, engine, state, &mut NoHooks, runner)?;
    }
    Ok(())
}

/// A lost stage's inputs read from its neighbours' boundary logs under `root`, step file
/// by step file: micro-batch `i` was sent within replica `i mod replicas`.
pub struct LoggedInputs {
    root: PathBuf,
    stage: u32,
    replicas: usize,
    /// The records of the step files read, by (step, sender): the last step's only.
    read: BTreeMap<(u64, u32, u32), Vec<ckpt::log::Record>>,
}

impl LoggedInputs {
    /// The inputs of `stage` of a job of `replicas` pipelines, logged under `root`.
    pub fn new(root: &Path, stage: usize, replicas: usize) -> Self {
        LoggedInputs { root: root.to_owned(), stage: stage as u32, replicas: replicas.max(1), read: BTreeMap::new() }
    }

    /// Reads and checks every input of the kinds `kinds` that a replay of steps `steps`
    /// (`micro_batches` each) of this stage needs, before any is used: a replay that
    /// cannot finish is known at once, not after the others waited for it.
    pub fn check(
        &mut self,
        steps: std::ops::Range<u64>,
        micro_batches: usize,
        kinds: &[Boundary],
    ) -> Result<(), TrainError> {
        for step in steps {
            for micro in 0..micro_batches {
                for &tensor in kinds {
                    self.get(step, micro, tensor)?;
                }
            }
        }
        self.read.clear();
        Ok(())
    }

    /// The tensor that micro-batch `micro` of `step` received: the activations from the
    /// stage before, or the gradients from the stage after.
    pub fn get(&mut self, step: u64, micro: usize, tensor: Boundary) -> Result<Vec<f32>, TrainError> {
        let from = match tensor {
            Boundary::Activation => self.stage.checked_sub(1),
            Boundary::Gradient => Some(self.stage + 1),
        }
        .ok_or_else(|| ConfigError::Invalid("the first stage receives no activations".into()))?;
        let replica = (micro % self.replicas) as u32;
        let key = (step, replica, from);
        if !self.read.contains_key(&key) {
            // Steps are replayed in order: the files of earlier steps are done with.
            self.read.retain(|k, _| k.0 >= step);
            let boundary = ckpt::log::Edge { replica, from, to: self.stage };
            let records = ckpt::log::read_step(&self.root, boundary, step)?;
            self.read.insert(key, records);
        }
        let records = &self.read[&key];
        let found = records.iter().find(|r| r.micro as usize == micro).ok_or_else(|| {
            TrainError::from(ckpt::log::LogError::Corrupt {
                path: ckpt::log::step_path(&ckpt::log::Edge { replica, from, to: self.stage }.dir(&self.root), step),
                reason: format!("no tensor of micro-batch {micro}"),
            })
        })?;
        Ok(found.values.clone())
    }
}
