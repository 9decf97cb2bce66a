//! The parts of a training step: the state it changes, the engine that computes
//! micro-batches, and the hook points where faults and detectors attach. The order in
//! which a step uses them is data, a [`schedule`](crate::schedule), executed by the one
//! [`driver`](crate::driver) of every runner: `steadfast train` in one process, each rank
//! of a static job, each worker of an elastic job, each simulated replica of a campaign,
//! each stage of a pipeline.
//!
//! Step `s` turns the state after `s` updates into the state after `s + 1`. Its parts:
//!
//! 1. **load**: the runner holds a [`TrainState`]; [`Hooks::after_load`] sees it before
//!    anything reads it (memory faults strike here; a campaign checks its stored-state
//!    checksums at this point);
//! 2. **compute gradients**: each micro-batch runs forward and backward on the run's
//!    [`Kernels`] ([`Engine::compute`]; a pipeline stage's passes are
//!    [`Engine::forward`] and [`Engine::backward`]); its gradient goes straight into a
//!    reused flat [`GradBuffer`] laid out by the [`GradLayout`]. [`Hooks::layer_taps`]
//!    may corrupt a layer's output;
//! 3. **reduce**: the micro-batch buffers are summed, in place, in the run's reduce mode:
//!    locally ([`Engine::reduce_local`]) or across a job (the runner's all-reduce);
//!    [`Hooks::after_reduce`] sees the sum;
//! 4. **vote**: a job votes on the sum's [`SumCheck`] (digest, finite?) with
//!    [`comm::commit`]; a single process refuses a non-finite sum by itself;
//! 5. **update**: [`Hooks::before_update`] sees the state again, then
//!    [`TrainState::apply`] runs the optimizer on flat views of the sum and counts the step;
//! 6. **check and checkpoint**: the runner compares replicas and writes checkpoints.
//!
//! Invariants: nothing here reads a clock, a thread id or an unordered container to decide
//! what to compute, so the state after a step is a function of the state before it, the
//! configuration and the faults; and once warm, the reduce, vote and update phases
//! allocate nothing (`tests/no_alloc.rs`). The compute phase allocates the micro-batches'
//! inputs and the activations of the forward and backward passes.

use std::sync::Arc;

use burn::prelude::Device;
use comm::ReduceMode;
use fault::crash::Phase;
use fault::live::{LiveFault, LiveFlip, StateKind};

use crate::data::sampler::Sampler;
use crate::data::{Batch, Dataset, Split};
use crate::error::{ConfigError, TrainError};
pub use crate::failpoint::At;
use crate::failpoint::ProcessFaults;
pub use crate::grad::{GradBuffer, GradLayout, SumCheck};
use crate::model::stage::Profile;
use crate::model::{Kept, Kernels, Loaded, Model, Stage, Taps};
use crate::optim::Optimizer;
use crate::state::{self, NamedTensor, Role};

/// Everything a step changes: the parameters, the optimizer's slots and update count, and
/// the number of steps taken (from which the sampler's position follows).
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    /// Parameters, in registry order.
    pub params: Vec<NamedTensor>,
    /// The optimizer, with its slots (`optim.*`) and update count.
    pub optimizer: Optimizer,
    /// Steps applied.
    pub step: u64,
}

impl TrainState {
    /// The state before the first step.
    pub fn new(params: Vec<NamedTensor>, optimizer: Optimizer) -> Self {
        TrainState { params, optimizer, step: 0 }
    }

    /// Parameters then optimizer slots, in registry order.
    pub fn tensors(&self) -> impl Iterator<Item = &NamedTensor> {
        self.params.iter().chain(self.optimizer.slots())
    }

    /// The fingerprint of the state (see [`state::fingerprint`]).
    pub fn fingerprint(&self) -> u64 {
        state::fingerprint(self.step, self.tensors())
    }

    /// Number of model parameters.
    pub fn parameters(&self) -> usize {
        self.params.iter().map(|p| p.data.len()).sum()
    }

    /// The update phase: the optimizer applies `sum`'s gradient to the parameters, and the
    /// step counts.
    pub fn apply(&mut self, sum: &GradBuffer) {
        self.optimizer.step(&mut self.params, sum.grads());
        self.step += 1;
    }

    /// SWIFT's undo of [`TrainState::apply`] with the same `sum`: the optimizer's update
    /// solved backwards. Not bit-exact (see [`Optimizer::undo`]).
    pub fn undo(&mut self, sum: &GradBuffer) {
        self.optimizer.undo(&mut self.params, sum.grads());
        self.step -= 1;
    }
}

/// The hook points of a step, where faults and detectors attach. Every method does
/// nothing by default.
pub trait Hooks {
    /// Before the step reads the state.
    fn after_load(&mut self, _at: At, _state: &mut TrainState) -> Result<(), TrainError> {
        Ok(())
    }

    /// The taps on the layer outputs of micro-batch `index` (`examples` examples) of
    /// `model`. What they flip is handed back through [`Hooks::tapped`].
    fn layer_taps(&mut self, _at: At, _index: usize, _model: &Model, _examples: usize) -> Result<Taps, TrainError> {
        Ok(Taps::none())
    }

    /// What the taps of [`Hooks::layer_taps`] flipped during the forward pass.
    fn tapped(&mut self, _at: At, _flips: Vec<LiveFlip>) {}

    /// After the reduction, before the vote: the sum this rank is about to apply.
    fn after_reduce(&mut self, _at: At, _sum: &mut GradBuffer) -> Result<(), TrainError> {
        Ok(())
    }

    /// After the vote, before the update.
    fn before_update(&mut self, _at: At, _state: &mut TrainState) -> Result<(), TrainError> {
        Ok(())
    }

    /// The step reached a named phase, where a process fault may strike.
    fn reached(&mut self, _at: At, _phase: Phase) {}

    /// The bit flips made since the last call, for the runner to report.
    fn take_flips(&mut self) -> Vec<Injected> {
        Vec::new()
    }
}

/// No hooks.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// A bit flip that a [`LiveFaults`] made.
#[derive(Clone, Debug, PartialEq)]
pub struct Injected {
    /// Where in the step.
    pub at: At,
    /// Which kind of state.
    pub state: StateKind,
    /// The flip.
    pub flip: LiveFlip,
}

/// Bit flips in live state ([`LiveFault`]s) as hooks: each fault fires once, at its step,
/// on its rank, at the hook point of its kind of state (parameters after load, a layer's
/// output in the first micro-batch the rank computes, the summed gradient after the
/// reduction, optimizer slots before the update). A fault that fired is spent, so a step
/// that is rolled back and redone runs without it (the faults modelled are transient).
#[derive(Clone, Debug, Default)]
pub struct LiveFaults {
    faults: Vec<(LiveFault, bool)>,
    flips: Vec<Injected>,
    process: ProcessFaults,
}

impl LiveFaults {
    /// The faults, none fired yet.
    pub fn new(faults: impl IntoIterator<Item = LiveFault>) -> Self {
        LiveFaults { faults: faults.into_iter().map(|f| (f, false)).collect(), ..LiveFaults::default() }
    }

    /// With process faults (crash, hang, cut) at the named phases as well.
    pub fn with_process(mut self, process: ProcessFaults) -> Self {
        self.process = process;
        self
    }

    /// The process faults, to give them a way to cut the links.
    pub fn process_mut(&mut self) -> &mut ProcessFaults {
        &mut self.process
    }

    /// The process faults.
    pub fn process(&self) -> &ProcessFaults {
        &self.process
    }

    /// Whether a fault of `kind` is still to fire at `at`.
    pub fn due(&self, at: At, kind: StateKind) -> bool {
        self.faults.iter().any(|(f, fired)| strikes(f, *fired, at, kind))
    }

    /// Whether every fault has fired.
    pub fn all_fired(&self) -> bool {
        self.faults.iter().all(|(_, fired)| *fired)
    }

    /// Fires the due faults of `kind` on `views`.
    fn fire(&mut self, at: At, kind: StateKind, views: &mut [(&str, Role, &mut [f32])]) -> Result<(), TrainError> {
        for (f, fired) in self.faults.iter_mut() {
            if strikes(f, *fired, at, kind) {
                *fired = true;
                let flips = f.apply(views)?;
                self.flips.extend(flips.into_iter().map(|flip| Injected { at, state: kind, flip }));
            }
        }
        Ok(())
    }
}

/// Whether fault `f`, not yet `fired`, strikes state of `kind` at `at`.
fn strikes(f: &LiveFault, fired: bool, at: At, kind: StateKind) -> bool {
    !fired && f.step == at.step && f.rank == at.rank && f.state == kind
}

impl Hooks for LiveFaults {
    fn reached(&mut self, at: At, phase: Phase) {
        self.process.reach(at, phase);
    }

    fn take_flips(&mut self) -> Vec<Injected> {
        std::mem::take(&mut self.flips)
    }

    fn after_load(&mut self, at: At, state: &mut TrainState) -> Result<(), TrainError> {
        if self.due(at, StateKind::Param) {
            self.fire(at, StateKind::Param, &mut state::views(&mut state.params))?;
        }
        Ok(())
    }

    fn layer_taps(&mut self, at: At, _index: usize, model: &Model, examples: usize) -> Result<Taps, TrainError> {
        let mut taps = Taps::none();
        // Activation faults hit the first micro-batch the rank computes: the first call
        // at this step spends them.
        for (f, fired) in self.faults.iter_mut() {
            if strikes(f, *fired, at, StateKind::Activation) {
                *fired = true;
                taps.add(model, examples, &f.flips)?;
            }
        }
        Ok(taps)
    }

    fn tapped(&mut self, at: At, flips: Vec<LiveFlip>) {
        self.flips.extend(flips.into_iter().map(|flip| Injected { at, state: StateKind::Activation, flip }));
    }

    fn after_reduce(&mut self, at: At, sum: &mut GradBuffer) -> Result<(), TrainError> {
        if self.due(at, StateKind::Grad) {
            self.fire(at, StateKind::Grad, &mut sum.views_mut())?;
        }
        Ok(())
    }

    fn before_update(&mut self, at: At, state: &mut TrainState) -> Result<(), TrainError> {
        if self.due(at, StateKind::Optim) {
            self.fire(at, StateKind::Optim, &mut state::views(state.optimizer.slots_mut()))?;
        }
        Ok(())
    }
}

/// What a runner keeps between steps besides the state: the data, the model (whose
/// parameters are overwritten from the state every step), the sampler, the layout of the
/// gradient, and the buffers of the local reduction.
pub struct Engine<'a> {
    data: &'a Dataset,
    device: Device,
    model: Option<Model>,
    sampler: Sampler,
    reduce: ReduceMode,
    micro_batch: usize,
    denominator: usize,
    layout: Arc<GradLayout>,
    scratch: repro::batched::Scratch,
    kernels: Kernels,
    /// The pipeline stage this engine computes (`None`: the whole model).
    stage: Option<Stage>,
}

impl<'a> Engine<'a> {
    /// An engine for `model` (its parameters are ignored: every step computes with the
    /// state's) on `kernels`. `denominator` is the global batch's example (or token)
    /// count, by which each micro-batch's summed loss is divided.
    pub fn new(
        data: &'a Dataset,
        model: Model,
        device: Device,
        sampler: Sampler,
        reduce: ReduceMode,
        denominator: usize,
        kernels: Kernels,
    ) -> Self {
        let layout = Arc::new(GradLayout::of(&model.params()));
        Engine {
            data,
            device,
            micro_batch: sampler.global_batch() / sampler.micro_batches(),
            model: Some(model),
            sampler,
            reduce,
            denominator,
            layout,
            scratch: repro::batched::Scratch::default(),
            kernels,
            stage: None,
        }
    }

    /// This engine for `stage` of the model: its gradients are laid out for the stage's
    /// parameters (see [`Stage::params`]), which the states it steps hold.
    pub fn for_stage(mut self, stage: Stage) -> Self {
        let all = self.model.as_ref().map(Model::params).unwrap_or_default();
        self.layout = Arc::new(GradLayout::of(&stage.params(&all)));
        self.stage = Some(stage);
        self
    }

    /// Stage `index` of this engine's model cut into `count` stages (see [`Stage::of`]).
    pub fn stage(&self, count: usize, index: usize) -> Result<Stage, ConfigError> {
        let model = self.model.as_ref().expect("the model is put back after every use");
        Stage::of(model, self.kernels, count, index)
    }

    /// The profile of each stage of the model cut into `count` stages, from the shapes of
    /// the whole model's parameters `params`.
    pub fn profiles(&self, params: &[NamedTensor], count: usize) -> Result<Vec<Profile>, ConfigError> {
        let model = self.model.as_ref().expect("the model is put back after every use");
        crate::model::stage::profiles(model, params, count)
    }

    /// The pipeline stage this engine computes, if it computes one.
    pub fn stage_computed(&self) -> Option<&Stage> {
        self.stage.as_ref()
    }

    /// The kernels that compute the model.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The model, with `params` copied into it when the framework's kernels compute it
    /// (the fixed-order kernels read them from the registry).
    fn take_model(&mut self, params: &[NamedTensor]) -> Model {
        let model = self.model.take().expect("the model is put back after every use");
        match self.kernels {
            Kernels::Framework => model.load(params),
            Kernels::Fixed(_) => model,
        }
    }

    /// A zero-filled buffer of this engine's layout.
    pub fn buffer(&self) -> GradBuffer {
        GradBuffer::zeros(Arc::clone(&self.layout))
    }

    /// The layer outputs that activation faults can hit, for a micro-batch of `n`
    /// examples (see [`Model::activations`]).
    pub fn activations(&self, n: usize) -> Vec<(String, u64)> {
        self.model.as_ref().map(|m| m.activations(n)).unwrap_or_default()
    }

    /// How this engine sums micro-batch gradients.
    pub fn reduce_mode(&self) -> ReduceMode {
        self.reduce
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Readies the model for the step's micro-batches with `params` (the framework's
    /// kernels need them copied into the module; the fixed-order kernels read them in
    /// place).
    pub fn prepare(&mut self, params: &[NamedTensor]) {
        let model = self.take_model(params);
        self.model = Some(model);
    }

    /// The examples of micro-batch `micro` of the step `state` is at.
    fn batch(&mut self, state: &TrainState, micro: usize) -> Batch {
        self.data.batch(Split::Train, &self.sampler.micro_batch(state.step, micro))
    }

    /// Forward and backward of micro-batch `micro` through the whole model with the
    /// parameters of `state` (readied by [`Engine::prepare`]): its gradient and loss go
    /// into `out`. [`Hooks::layer_taps`] may corrupt a layer's output.
    pub fn compute(
        &mut self,
        state: &TrainState,
        at: At,
        micro: usize,
        hooks: &mut dyn Hooks,
        out: &mut GradBuffer,
    ) -> Result<(), TrainError> {
        let batch = self.batch(state, micro);
        let model = self.model.as_ref().expect("the model is put back after every use");
        let mut taps = hooks.layer_taps(at, micro, model, self.micro_batch)?;
        let loaded = Loaded { model, params: &state.params, kernels: self.kernels, device: &self.device };
        loaded.loss_and_grads_into(&batch, self.denominator, &mut taps, out);
        if !taps.log.is_empty() {
            hooks.tapped(at, std::mem::take(&mut taps.log));
        }
        Ok(())
    }

    /// The forward pass of micro-batch `micro` through this engine's pipeline stage, on
    /// the micro-batch's examples (the first stage) or on `input`, the previous stage's
    /// output: what the backward pass needs is returned.
    pub fn forward(
        &mut self,
        state: &TrainState,
        at: At,
        micro: usize,
        input: Vec<f32>,
        hooks: &mut dyn Hooks,
    ) -> Result<Kept, TrainError> {
        let batch = self.batch(state, micro);
        let stage = self.stage.as_ref().ok_or_else(|| whole_model("forward"))?;
        let model = self.model.as_ref().expect("the model is put back after every use");
        let mut taps = hooks.layer_taps(at, micro, model, self.micro_batch)?;
        let kept = stage.forward(self.kernels, &state.params, batch, input, &mut taps)?;
        if !taps.log.is_empty() {
            hooks.tapped(at, std::mem::take(&mut taps.log));
        }
        Ok(kept)
    }

    /// The backward pass of a micro-batch through this engine's stage, from what its
    /// forward pass `kept` and the gradient of its output (`upstream`, from the next
    /// stage; the last stage starts from the loss): its gradient goes into `out`, and the
    /// gradient of its input (for the previous stage) is returned.
    pub fn backward(
        &mut self,
        state: &TrainState,
        kept: &Kept,
        upstream: &[f32],
        out: &mut GradBuffer,
    ) -> Result<Vec<f32>, TrainError> {
        let stage = self.stage.as_ref().ok_or_else(|| whole_model("backward"))?;
        Ok(stage.backward(self.kernels, &state.params, kept, upstream, self.denominator, out)?)
    }

    /// The local reduction: sums `parts` (equal layouts) into `out`, in this engine's
    /// reduce mode, reusing its buffers.
    pub fn reduce_local<P: AsRef<[f32]> + Sync>(&mut self, parts: &[P], out: &mut GradBuffer) {
        comm::sum_parts_into(self.reduce, parts, out.as_mut_slice(), &mut self.scratch);
    }

    /// The model with `params` loaded, lent to `f` (to evaluate).
    pub fn with_model<T>(&mut self, params: &[NamedTensor], f: impl FnOnce(&Loaded<'_>) -> T) -> T {
        let model = self.take_model(params);
        let out = f(&Loaded { model: &model, params, kernels: self.kernels, device: &self.device });
        self.model = Some(model);
        out
    }
}

/// The error of a stage's pass asked of an engine that computes the whole model.
fn whole_model(pass: &str) -> TrainError {
    ConfigError::Invalid(format!("a {pass} pass of one stage was asked of an engine that holds the whole model")).into()
}
