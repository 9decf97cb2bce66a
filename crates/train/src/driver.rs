//! The one step driver: executes a [`schedule`](crate::schedule)'s actions on one rank.
//!
//! The driver does what every runner does the same way: it fires the [`Hooks`] at their
//! points, computes micro-batches on the [`Engine`], keeps each micro-batch's gradient
//! in its own buffer, and applies the update. At the actions that leave the rank (the
//! reduction, the vote, the replica check, a checkpoint, a send or receive) it asks the
//! runner, through [`Runner`]. A runner answers each with a [`Flow`]: go on, pause (the
//! runner takes the action from outside and resumes the step later, as an elastic
//! worker does with its vote), or end the step here (a failed all-reduce, corrupted
//! state).
//!
//! The hook points, for every runner alike:
//!
//! | action | hooks |
//! |---|---|
//! | `Load` | [`Hooks::after_load`] |
//! | first `Compute` or `Forward` | the `forward` phase before |
//! | first `Compute` or `Backward` done | the `backward` phase |
//! | `Reduce` | the `allreduce` phase before, [`Hooks::after_reduce`] after a reduction that went on |
//! | `Vote` | the `vote` phase before |
//! | `Update` | [`Hooks::before_update`], then the `update` phase |
//! | `Checkpoint` (when due) | the `checkpoint` phase before |
//!
//! The bit flips the hooks make are handed to [`Runner::injected`] after the load, after a
//! reduction that went on (with those of the layer taps) and before the update. Every hook
//! is told the step the call of [`Driver::run`] began at.

use std::time::{Duration, Instant};

use fault::crash::Phase;

use crate::error::TrainError;
use crate::model::Kept;
use crate::schedule::{self, Boundary, Op};
use crate::step::{At, Engine, GradBuffer, Hooks, Injected, TrainState};

/// What the step does after a runner's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on with the next action.
    Go,
    /// Stop here; the runner resumes the step at the next action ([`Driver::run`] with
    /// `from` the index it returned).
    Pause,
    /// The step ends here, without an update.
    End,
}

/// Where a call of [`Driver::run`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every action ran.
    Done,
    /// The runner paused after the action before `next`.
    Paused {
        /// Where to resume.
        next: usize,
    },
    /// The runner ended the step at the action `at`.
    Ended {
        /// The action that ended it.
        at: Op,
    },
}

/// What a runner does at the operations that leave the rank. Every method has a default:
/// that of one process that holds every replica and no pipeline stage ([`Alone`]).
pub trait Runner {
    /// The state at rest, after the hooks struck it (the `Load` action).
    fn loaded(&mut self, _at: At, _state: &mut TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Go)
    }

    /// Sums this rank's micro-batch gradients and the other replicas' into the sum. By
    /// default the rank holds every replica and sums locally.
    fn reduce(&mut self, _at: At, r: Reduction<'_, '_>) -> Result<Flow, TrainError> {
        r.local();
        Ok(Flow::Go)
    }

    /// The vote on `sum`: whether every replica may apply it. By default the rank votes
    /// alone ([`vote_alone`]).
    fn vote(&mut self, at: At, sum: &GradBuffer) -> Result<Flow, TrainError> {
        vote_alone(at.step, sum)?;
        Ok(Flow::Go)
    }

    /// Just before the update, after [`Hooks::before_update`]. [`Flow::Pause`] stops the
    /// step before the optimizer runs (a runner that checks every replica before any
    /// applies); resuming at the same operation runs it without calling the hooks again.
    fn updating(&mut self, _at: At, _state: &mut TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Go)
    }

    /// The update was applied with `sum`; `state` counts the step.
    fn updated(&mut self, _at: At, _state: &TrainState, _sum: &GradBuffer) -> Result<(), TrainError> {
        Ok(())
    }

    /// The replicas compare their states, if a check is due after the update of `at`.
    fn check_replicas(&mut self, _at: At, _state: &TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Go)
    }

    /// Whether a checkpoint of `state` is due after the update of `at`.
    fn checkpoint_due(&mut self, _at: At, _state: &TrainState) -> Result<bool, TrainError> {
        Ok(false)
    }

    /// Takes the checkpoint of `state` that [`Runner::checkpoint_due`] said is due.
    fn checkpoint(&mut self, _at: At, _state: &TrainState, _engine: &Engine<'_>) -> Result<(), TrainError> {
        Ok(())
    }

    /// Bit flips that the hooks made.
    fn injected(&mut self, _flips: Vec<Injected>) -> Result<(), TrainError> {
        Ok(())
    }

    /// Sends micro-batch `micro`'s boundary `tensor` to stage `peer`.
    fn send(
        &mut self,
        _at: At,
        _peer: usize,
        _micro: usize,
        _tensor: Boundary,
        _data: &[f32],
    ) -> Result<(), TrainError> {
        Err(no_pipeline())
    }

    /// Receives micro-batch `micro`'s boundary `tensor` from stage `peer` into `data`.
    fn recv(
        &mut self,
        _at: At,
        _peer: usize,
        _micro: usize,
        _tensor: Boundary,
        _data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        Err(no_pipeline())
    }
}

/// The reduction's inputs and output, lent to [`Runner::reduce`].
pub struct Reduction<'r, 'a> {
    /// The engine: its reduce mode and scratch buffers.
    pub engine: &'r mut Engine<'a>,
    /// This rank's micro-batch gradients, in slot order.
    pub parts: &'r [GradBuffer],
    /// Where the sum goes.
    pub sum: &'r mut GradBuffer,
}

impl Reduction<'_, '_> {
    /// Sums the parts here, in the engine's reduce mode.
    pub fn local(self) {
        self.engine.reduce_local(self.parts, self.sum);
    }
}

fn no_pipeline() -> TrainError {
    TrainError::Config(crate::ConfigError::Invalid(
        "this runner has no pipeline stages to exchange tensors with".into(),
    ))
}

/// One micro-batch's pipeline tensors on this rank.
#[derive(Default)]
struct Slot {
    /// The previous stage's output, this stage's input.
    activation: Vec<f32>,
    /// The next stage's gradient of this stage's output.
    gradient: Vec<f32>,
    /// What the forward pass kept for the backward pass.
    kept: Option<Kept>,
    /// The gradient of this stage's input, for the previous stage.
    input_gradient: Vec<f32>,
}

/// One rank's step buffers, reused from step to step: each micro-batch's gradient, their
/// sum, and a pipeline stage's boundary tensors.
pub struct Driver {
    /// The rank, as the hooks know it.
    rank: usize,
    micro: Vec<GradBuffer>,
    sum: GradBuffer,
    slots: Vec<Slot>,
    /// Time spent in the optimizer's update.
    update_time: Duration,
    /// The step whose update the runner paused just before the optimizer (see
    /// [`Runner::updating`]): its hooks have run, and resuming there runs the optimizer.
    update_hooked: Option<u64>,
}

impl Driver {
    /// The buffers of `engine`'s layout, for the rank the hooks know as `rank`.
    pub fn new(engine: &Engine<'_>, rank: usize) -> Driver {
        Driver {
            rank,
            micro: Vec::new(),
            sum: engine.buffer(),
            slots: Vec::new(),
            update_time: Duration::ZERO,
            update_hooked: None,
        }
    }

    /// The micro-batch gradients of the current step, in slot order.
    pub fn micro(&self) -> &[GradBuffer] {
        &self.micro
    }

    /// The sum the update applies.
    pub fn sum(&self) -> &GradBuffer {
        &self.sum
    }

    /// The sum, for a runner that reduces outside the step (see [`Flow::Pause`]).
    pub fn sum_mut(&mut self) -> &mut GradBuffer {
        &mut self.sum
    }

    /// Time spent in the optimizer's update so far.
    pub fn update_time(&self) -> Duration {
        self.update_time
    }

    /// Runs `actions[from..]` of the step `state` is at.
    pub fn run(
        &mut self,
        actions: &[Op],
        from: usize,
        engine: &mut Engine<'_>,
        state: &mut TrainState,
        hooks: &mut dyn Hooks,
        runner: &mut dyn Runner,
    ) -> Result<Stop, TrainError> {
        let at = At { step: state.step, rank: self.rank };
        if from == 0 {
            // Tests that act on a job mid-run pace its steps with `step_begin=sleep:MS`, so
            // that a fast machine does not finish the job before they act.
            ckpt::failpoint::hit("step_begin")?;
            // One buffer per slot: a driver reused for another rank never sums a stale one.
            let slots = schedule::slots(actions);
            self.micro.truncate(slots);
            while self.micro.len() < slots {
                self.micro.push(engine.buffer());
            }
            self.slots.resize_with(slots, Slot::default);
            // A step begun again (after a roll-back) runs its update's hooks again.
            self.update_hooked = None;
        }
        let (mut first_forward, mut first_backward) = (true, true);
        for (i, &action) in actions.iter().enumerate().skip(from) {
            let flow = match action {
                Op::Load => {
                    hooks.after_load(at, state)?;
                    report(hooks, runner)?;
                    runner.loaded(at, state)?
                }
                Op::Compute { micro, slot } => {
                    begin_compute(engine, state, at, hooks, &mut first_forward);
                    engine.compute(state, at, micro, hooks, &mut self.micro[slot])?;
                    self.backward_done(at, hooks, &mut first_backward);
                    Flow::Go
                }
                Op::Forward { micro, slot } => {
                    begin_compute(engine, state, at, hooks, &mut first_forward);
                    let s = &mut self.slots[slot];
                    let input = std::mem::take(&mut s.activation);
                    s.kept = Some(engine.forward(state, at, micro, input, hooks)?);
                    Flow::Go
                }
                Op::Backward { slot, .. } => {
                    let s = &mut self.slots[slot];
                    let kept = s.kept.take().ok_or_else(|| out_of_order(action))?;
                    s.input_gradient = engine.backward(state, &kept, &s.gradient, &mut self.micro[slot])?;
                    self.backward_done(at, hooks, &mut first_backward);
                    Flow::Go
                }
                Op::Send { micro, slot, tensor, peer } => {
                    let s = &self.slots[slot];
                    let data = match tensor {
                        Boundary::Activation => s.kept.as_ref().ok_or_else(|| out_of_order(action))?.output(),
                        Boundary::Gradient => &s.input_gradient,
                    };
                    runner.send(at, peer, micro, tensor, data)?;
                    Flow::Go
                }
                Op::Recv { micro, slot, tensor, peer } => {
                    let s = &mut self.slots[slot];
                    let into = match tensor {
                        Boundary::Activation => &mut s.activation,
                        Boundary::Gradient => &mut s.gradient,
                    };
                    runner.recv(at, peer, micro, tensor, into)?;
                    Flow::Go
                }
                Op::Reduce => {
                    if self.micro.is_empty() {
                        // A rank that owns no micro-batch still passes its forward phase.
                        begin_compute(engine, state, at, hooks, &mut first_forward);
                    }
                    hooks.reached(at, Phase::Allreduce);
                    let flow = runner.reduce(at, Reduction { engine, parts: &self.micro, sum: &mut self.sum })?;
                    if flow == Flow::Go {
                        hooks.after_reduce(at, &mut self.sum)?;
                        report(hooks, runner)?;
                    }
                    flow
                }
                Op::Vote => {
                    hooks.reached(at, Phase::Vote);
                    runner.vote(at, &self.sum)?
                }
                Op::Update => match self.update(at, state, hooks, runner)? {
                    // Paused before the optimizer: resumed at this same operation.
                    Flow::Pause => return Ok(Stop::Paused { next: i }),
                    flow => flow,
                },
                Op::CheckReplicas => runner.check_replicas(at, state)?,
                Op::Checkpoint => {
                    if runner.checkpoint_due(at, state)? {
                        hooks.reached(at, Phase::Checkpoint);
                        runner.checkpoint(at, state, engine)?;
                    }
                    Flow::Go
                }
            };
            match flow {
                Flow::Go => {}
                Flow::Pause => return Ok(Stop::Paused { next: i + 1 }),
                Flow::End => return Ok(Stop::Ended { at: action }),
            }
        }
        Ok(Stop::Done)
    }

    /// The `Update` action: the hooks, the runner's last word, the optimizer.
    fn update(
        &mut self,
        at: At,
        state: &mut TrainState,
        hooks: &mut dyn Hooks,
        runner: &mut dyn Runner,
    ) -> Result<Flow, TrainError> {
        if self.update_hooked != Some(at.step) {
            hooks.before_update(at, state)?;
            report(hooks, runner)?;
            match runner.updating(at, state)? {
                Flow::Go => {}
                Flow::Pause => {
                    self.update_hooked = Some(at.step);
                    return Ok(Flow::Pause);
                }
                Flow::End => return Ok(Flow::End),
            }
        }
        self.update_hooked = None;
        hooks.reached(at, Phase::Update);
        let started = Instant::now();
        state.apply(&self.sum);
        self.update_time += started.elapsed();
        runner.updated(at, state, &self.sum)?;
        Ok(Flow::Go)
    }

    /// A micro-batch's gradient is written: the first of the step reaches `backward`.
    fn backward_done(&self, at: At, hooks: &mut dyn Hooks, first: &mut bool) {
        if std::mem::take(first) {
            hooks.reached(at, Phase::Backward);
        }
    }
}

/// Before a step's first micro-batch: the engine is readied with the state's parameters,
/// and the step reaches its `forward` phase.
fn begin_compute(engine: &mut Engine<'_>, state: &TrainState, at: At, hooks: &mut dyn Hooks, first: &mut bool) {
    if std::mem::take(first) {
        engine.prepare(&state.params);
        hooks.reached(at, Phase::Forward);
    }
}

/// Hands the hooks' flips, if any, to the runner.
fn report(hooks: &mut dyn Hooks, runner: &mut dyn Runner) -> Result<(), TrainError> {
    let flips = hooks.take_flips();
    if flips.is_empty() { Ok(()) } else { runner.injected(flips) }
}

fn out_of_order(action: Op) -> TrainError {
    TrainError::Config(crate::ConfigError::Invalid(format!(
        "the schedule runs {action:?} before the forward pass of its micro-batch"
    )))
}

/// The runner of one process that holds every replica: the reduction is local, and the
/// vote refuses a non-finite sum.
pub struct Alone;

impl Runner for Alone {}

/// A single process's vote: a non-finite loss or gradient stops the run.
pub fn vote_alone(step: u64, sum: &GradBuffer) -> Result<(), TrainError> {
    let loss = sum.loss();
    if !loss.is_finite() {
        return Err(TrainError::Diverged { step, loss });
    }
    if !sum.all_finite() {
        return Err(TrainError::GradientNotFinite { step, loss });
    }
    Ok(())
}
