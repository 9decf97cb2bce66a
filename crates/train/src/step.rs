//! The training step: one state, one sequence of phases, and the hook points where faults
//! and detectors attach. Every runner takes its steps through this module: `steadfast
//! train` in one process, each worker of a data-parallel job, and each simulated replica
//! of a campaign.
//!
//! Step `s` turns the state after `s` updates into the state after `s + 1`. Its phases, in
//! order, with the hook points between them ([`Hooks`]):
//!
//! 1. **load**: the runner holds a [`TrainState`]; [`Hooks::after_load`] sees it before
//!    anything reads it (memory faults strike here; a campaign checks its stored-state
//!    checksums at this point);
//! 2. **compute gradients** ([`Engine::compute`]): each micro-batch `i` that this rank
//!    owns (`i mod world == rank`) runs forward and backward on the run's [`Kernels`] (the
//!    fixed-order kernels read the state's parameters in place; the framework's need them
//!    copied into the model first); its gradient goes straight into a reused flat
//!    [`GradBuffer`] laid out by the [`GradLayout`]. [`Hooks::layer_taps`] may corrupt a
//!    layer's output;
//! 3. **reduce**: the micro-batch buffers are summed, in place, in the run's reduce mode:
//!    locally ([`Engine::reduce_local`]) or across a job (the runner's all-reduce);
//!    [`Hooks::after_reduce`] sees the sum;
//! 4. **vote**: a job votes on the sum's [`SumCheck`] (digest, finite?) with
//!    [`comm::commit`]; a single process refuses a non-finite sum by itself
//!    ([`GradBuffer::all_finite`]);
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
use crate::data::{Dataset, Split};
use crate::error::TrainError;
pub use crate::failpoint::At;
use crate::failpoint::ProcessFaults;
pub use crate::grad::{GradBuffer, GradLayout, SumCheck};
use crate::model::{Kernels, Loaded, Model, Taps};
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

    /// The flips made since the last call.
    pub fn take_flips(&mut self) -> Vec<Injected> {
        std::mem::take(&mut self.flips)
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

    fn after_load(&mut self, at: At, state: &mut TrainState) -> Result<(), TrainError> {
        if self.due(at, StateKind::Param) {
            self.fire(at, StateKind::Param, &mut state::views(&mut state.params))?;
        }
        Ok(())
    }

    fn layer_taps(&mut self, at: At, index: usize, model: &Model, examples: usize) -> Result<Taps, TrainError> {
        let mut taps = Taps::none();
        // Activation faults hit the first micro-batch the rank computes, whose index is
        // the rank's.
        if index == at.rank {
            for (f, fired) in self.faults.iter_mut() {
                if strikes(f, *fired, at, StateKind::Activation) {
                    *fired = true;
                    taps.add(model, examples, &f.flips)?;
                }
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
        }
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

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The micro-batches that `rank` of `world` computes, in order.
    fn owned(&self, rank: usize, world: usize) -> impl Iterator<Item = usize> + use<> {
        (rank..self.sampler.micro_batches()).step_by(world.max(1))
    }

    /// The compute phase: runs forward and backward with `state`'s parameters on each
    /// micro-batch that `rank` of `world` owns, writing the k-th one's gradient and loss
    /// into `out[k]` (grown on the first step, reused after).
    pub fn compute(
        &mut self,
        state: &TrainState,
        rank: usize,
        world: usize,
        hooks: &mut dyn Hooks,
        out: &mut Vec<GradBuffer>,
    ) -> Result<(), TrainError> {
        let at = At { step: state.step, rank };
        let model = self.take_model(&state.params);
        let loaded = Loaded { model: &model, params: &state.params, kernels: self.kernels, device: &self.device };
        // One buffer per owned micro-batch: a caller that reuses `out` for another rank
        // never sums a stale buffer.
        let owned = self.owned(rank, world).count();
        out.truncate(owned);
        while out.len() < owned {
            out.push(self.buffer());
        }
        let mut result = Ok(());
        hooks.reached(at, Phase::Forward);
        for (k, i) in self.owned(rank, world).enumerate() {
            let indices = self.sampler.micro_batch(state.step, i);
            let batch = self.data.batch(Split::Train, &indices);
            let mut taps = match hooks.layer_taps(at, i, &model, self.micro_batch) {
                Ok(t) => t,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            loaded.loss_and_grads_into(&batch, self.denominator, &mut taps, &mut out[k]);
            if !taps.log.is_empty() {
                hooks.tapped(at, std::mem::take(&mut taps.log));
            }
            if k == 0 {
                hooks.reached(at, Phase::Backward);
            }
        }
        self.model = Some(model);
        result
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
