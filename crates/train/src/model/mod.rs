//! The models (plain burn modules with a constructor and `forward`), the kernels that
//! compute them, and the bridge between burn's parameters and the state registry's flat
//! buffers.
//!
//! The registry is the source of truth for parameter values. The burn modules define each
//! model: its parameters' names, shapes and initial values. Parameters are enumerated by
//! burn's module visitor, which walks fields in declaration order, so names
//! (`model.fc1.weight`) and order are fixed by the model's source code.
//!
//! Two kernel sets compute a step ([`Kernels`], through [`Loaded`]). The fixed-order
//! kernels (`fixed`, our own, on `steadfast-kernels`) read the registry's parameters in
//! place and give the same bits on every CPU kind; they compute every model. The
//! framework's (burn's autodiff): [`Model::load`] copies the flat parameters into the
//! module and [`Model::loss_and_grads_into`] runs forward and backward. Either way each
//! parameter's gradient lands in its range of one flat buffer, and the optimizer (ours,
//! not burn's) updates the flat buffers.

mod cnn;
mod fixed;
mod gpt;
pub mod init;
mod mlp;
pub mod stage;

use burn::module::{ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Gradients;
use burn::tensor::activation::log_softmax;

pub use cnn::LeNet;
pub use gpt::{Gpt, GptConfig};
pub use init::Init;
pub use mlp::Mlp;
pub use stage::{Kept, Stage};

use crate::data::Batch;
use crate::grad::{GradBuffer, GradLayout};
use crate::state::{NamedTensor, Role};

/// Which kernels compute a model's forward and backward passes (`--kernels`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelSet {
    /// Steadfast's fixed-order kernels ([`fixed`]): the same bits on every CPU kind. The
    /// default for every model.
    #[default]
    Fixed,
    /// The framework's (burn's): the bits depend on the CPU's instruction set.
    Framework,
}

/// The kernels of a run: the set, and for the fixed-order set the instruction set it runs
/// on (which changes its speed, never its bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// [`KernelSet::Fixed`] on this instruction set.
    Fixed(kernels::Isa),
    /// [`KernelSet::Framework`].
    Framework,
}

/// `fixed/avx512` or `framework`: what a report records beside a fingerprint.
impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernels::Fixed(isa) => write!(f, "fixed/{isa}"),
            Kernels::Framework => f.write_str("framework"),
        }
    }
}

/// Which architecture to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// 784-W-W/2-10 perceptron (W = 256 unless `--width` says otherwise).
    Mlp,
    /// LeNet-5.
    Cnn,
    /// Character-level transformer.
    Gpt,
}

/// A model of one of the supported architectures.
#[derive(Debug)]
pub enum Model {
    /// See [`Mlp`].
    Mlp(Mlp),
    /// See [`LeNet`].
    Cnn(Box<LeNet>),
    /// See [`Gpt`].
    Gpt(Gpt),
}

/// Sum of the loss over a batch and, for classifiers, the number of correct predictions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// Sum of per-example (per-token for text) cross-entropy, in nats.
    pub loss_sum: f64,
    /// Number of predictions scored (examples, or tokens for text).
    pub count: usize,
    /// Number of correct arg-max predictions.
    pub correct: usize,
}

/// A model with the parameters it computes with and the kernels that compute it.
///
/// With [`Kernels::Framework`] the burn module itself must hold `params` (see
/// [`Model::load`]); the fixed-order kernels read `params` directly and leave the module
/// untouched.
#[derive(Clone, Copy)]
pub struct Loaded<'a> {
    /// The model (its definition; its values only for the framework's kernels).
    pub model: &'a Model,
    /// The parameters, in registry order.
    pub params: &'a [NamedTensor],
    /// The kernels.
    pub kernels: Kernels,
    /// The framework's device (autodiff for training).
    pub device: &'a Device,
}

impl Loaded<'_> {
    /// Forward and backward on one micro-batch; see [`Model::loss_and_grads_into`].
    pub fn loss_and_grads_into(&self, batch: &Batch, denominator: usize, taps: &mut Taps, out: &mut GradBuffer) {
        on_pool(|| self.loss_and_grads_here(batch, denominator, taps, out))
    }

    fn loss_and_grads_here(&self, batch: &Batch, denominator: usize, taps: &mut Taps, out: &mut GradBuffer) {
        match (self.kernels, self.model, batch) {
            (Kernels::Fixed(isa), Model::Mlp(_), Batch::Images { n, x, y }) => {
                fixed::mlp::loss_and_grads(isa, self.params, (*n, x, y), denominator, taps, out)
            }
            (Kernels::Fixed(isa), Model::Cnn(_), Batch::Images { n, x, y }) => {
                fixed::cnn::loss_and_grads(isa, self.params, (*n, x, y), denominator, taps, out)
            }
            (Kernels::Fixed(isa), Model::Gpt(gpt), Batch::Tokens { n, x, y }) => {
                fixed::gpt::loss_and_grads(isa, self.params, gpt.heads(), (*n, x, y), denominator, out)
            }
            (Kernels::Fixed(_), _, _) => panic!("a model was given a batch of another kind"),
            (Kernels::Framework, model, _) => model.loss_and_grads_into(batch, denominator, self.device, taps, out),
        }
    }

    /// Loss sum and correct predictions on a batch; see [`Model::evaluate`].
    pub fn evaluate(&self, batch: &Batch) -> EvalSums {
        on_pool(|| self.evaluate_here(batch))
    }

    fn evaluate_here(&self, batch: &Batch) -> EvalSums {
        match (self.kernels, self.model, batch) {
            (Kernels::Fixed(isa), Model::Mlp(_), Batch::Images { n, x, y }) => {
                fixed::mlp::evaluate(isa, self.params, (*n, x, y))
            }
            (Kernels::Fixed(isa), Model::Cnn(_), Batch::Images { n, x, y }) => {
                fixed::cnn::evaluate(isa, self.params, (*n, x, y))
            }
            (Kernels::Fixed(isa), Model::Gpt(gpt), Batch::Tokens { n, x, y }) => {
                fixed::gpt::evaluate(isa, self.params, gpt.heads(), (*n, x, y))
            }
            (Kernels::Fixed(_), _, _) => panic!("a model was given a batch of another kind"),
            (Kernels::Framework, model, _) => model.evaluate(batch, self.device),
        }
    }
}

/// Runs `f` on a thread of rayon's pool (directly when called on one). A pass's
/// sequential parts then run on a pool thread, and between its parallel parts the pool's
/// other threads wait for work without competing with the caller for a core: with the
/// caller outside the pool, a two-thread pool on a two-core machine had three threads
/// wanting two cores, and each handoff cost a wake-up.
fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// The parameters an image model (the MLP, `width` wide, or LeNet-5) starts from with
/// `seed`: exactly what `train` starts from. Exported by `steadfast bench init` so that
/// other systems can start from the same weights. `None` for the GPT, whose shape
/// follows its text's vocabulary.
pub fn initial_params(kind: ModelKind, seed: u64, width: usize) -> Option<Vec<NamedTensor>> {
    if kind == ModelKind::Gpt {
        return None;
    }
    let device = Device::flex().autodiff();
    Some(Model::new(kind, seed, GptConfig::small(0), width, &device).params())
}

impl Model {
    /// A freshly initialised model. `gpt` gives the GPT's shape and `mlp_width` the MLP's
    /// first hidden width; each is ignored by the other models.
    pub fn new(kind: ModelKind, seed: u64, gpt: GptConfig, mlp_width: usize, device: &Device) -> Self {
        let init = Init::new(device, seed);
        match kind {
            ModelKind::Mlp => Model::Mlp(Mlp::new(&init, mlp_width)),
            ModelKind::Cnn => Model::Cnn(Box::new(LeNet::new(&init))),
            ModelKind::Gpt => Model::Gpt(Gpt::new(&init, gpt)),
        }
    }

    /// The parameters as registry tensors (`model.<path>`), in declaration order.
    pub fn params(&self) -> Vec<NamedTensor> {
        let mut v = Collect { path: Vec::new(), out: Vec::new() };
        self.visit(&mut v);
        v.out
    }

    /// The model with every parameter overwritten by the registry's values (same order
    /// as [`params`](Model::params)).
    pub fn load(self, params: &[NamedTensor]) -> Self {
        let mut m = Assign { path: Vec::new(), params, next: 0 };
        let model = match self {
            Model::Mlp(x) => Model::Mlp(x.map(&mut m)),
            Model::Cnn(x) => Model::Cnn(Box::new(x.map(&mut m))),
            Model::Gpt(x) => Model::Gpt(x.map(&mut m)),
        };
        assert_eq!(m.next, params.len(), "the model has fewer parameters than the registry");
        model
    }

    /// Forward and backward on one micro-batch. The loss is the sum of per-example
    /// cross-entropy divided by `denominator` (the global batch's example or token count),
    /// so that summing the micro-batches' gradients gives the global batch's mean-loss
    /// gradient. Returns the loss value and one flat gradient per parameter (a convenience
    /// for tests and tools; the training step uses [`loss_and_grads_into`](Model::loss_and_grads_into)).
    pub fn loss_and_grads(&self, batch: &Batch, denominator: usize, device: &Device) -> (f32, Vec<Vec<f32>>) {
        let mut out = GradBuffer::zeros(std::sync::Arc::new(GradLayout::of(&self.params())));
        self.loss_and_grads_into(batch, denominator, device, &mut Taps::none(), &mut out);
        let grads = out.layout().tensors().iter().map(|(_, r)| out.grads()[r.clone()].to_vec()).collect();
        (out.loss(), grads)
    }

    /// Forward and backward on one micro-batch (see [`loss_and_grads`](Model::loss_and_grads)),
    /// with activation faults: `taps` flips bits in layer outputs during the forward pass
    /// (and records what it flipped). Each parameter's gradient is written straight into
    /// its range of `out`, and the loss into its loss field.
    pub fn loss_and_grads_into(
        &self,
        batch: &Batch,
        denominator: usize,
        device: &Device,
        taps: &mut Taps,
        out: &mut GradBuffer,
    ) {
        let (logits, labels) = self.logits(batch, device, taps);
        let [n, _] = logits.dims();
        let nll = -log_softmax(logits, 1).gather(1, labels.reshape([n, 1]));
        let loss = nll.sum().div_scalar(denominator as f32);
        let value = loss.clone().into_scalar::<f32>();
        let grads = loss.backward();
        let mut w = WriteGrads { grads: &grads, out, next: 0 };
        self.visit(&mut w);
        assert_eq!(w.next, w.out.layout().tensors().len(), "the buffer's layout has more tensors than the model");
        out.set_loss(value);
    }

    /// Loss sum and correct predictions on a batch, without building a gradient graph.
    pub fn evaluate(&self, batch: &Batch, device: &Device) -> EvalSums {
        let plain = device.clone().inner();
        let (logits, labels) = match self {
            Model::Mlp(m) => m.valid().logits_of(batch, &plain),
            Model::Cnn(m) => m.valid().logits_of(batch, &plain),
            Model::Gpt(m) => m.valid().logits_of(batch, &plain),
        };
        let [n, _] = logits.dims();
        let lp = log_softmax(logits, 1);
        let nll: f64 = lp.clone().gather(1, labels.clone().reshape([n, 1])).sum().into_scalar::<f32>().into();
        let pred = lp.argmax(1).reshape([n]);
        let correct = pred.equal(labels).int().sum().into_scalar::<i64>();
        EvalSums { loss_sum: -nll, count: n, correct: correct as usize }
    }

    fn logits(&self, batch: &Batch, device: &Device, taps: &mut Taps) -> (Tensor<2>, Tensor<1, Int>) {
        match self {
            Model::Mlp(m) => {
                let (x, y) = image_inputs(batch, device);
                (m.forward_tapped(x, taps), y)
            }
            Model::Cnn(m) => {
                let (x, y) = image_inputs(batch, device);
                (m.forward_tapped(x, taps), y)
            }
            Model::Gpt(m) => m.logits_of(batch, device),
        }
    }

    /// The layer outputs that activation faults can hit (`act.<layer>`) and their element
    /// counts for a micro-batch of `n` examples, in forward order. Empty for the GPT, whose
    /// layers are not tapped.
    pub fn activations(&self, n: usize) -> Vec<(String, u64)> {
        let mlp;
        let layers: &[(&str, usize)] = match self {
            Model::Mlp(m) => {
                mlp = m.activations();
                &mlp
            }
            Model::Cnn(_) => &cnn::ACTIVATIONS,
            Model::Gpt(_) => &[],
        };
        layers.iter().map(|(name, per_example)| (format!("act.{name}"), (n * per_example) as u64)).collect()
    }

    fn visit<V: ModuleVisitor>(&self, v: &mut V) {
        match self {
            Model::Mlp(m) => m.visit(v),
            Model::Cnn(m) => m.visit(v),
            Model::Gpt(m) => m.visit(v),
        }
    }
}

/// Bit flips planned in layer outputs, applied as the forward pass produces them.
///
/// The corrupted output replaces the layer's through `mask_where`, so every downstream
/// operation, forward and backward, sees the corrupted value exactly; the gradient of the
/// corrupted element itself is zero, as for any value that no longer depends on its inputs.
#[derive(Debug, Default)]
pub struct Taps {
    layers: Vec<(String, u64)>,
    flips: Vec<fault::plan::ElementFlip>,
    /// What was flipped, in forward order.
    pub log: Vec<fault::live::LiveFlip>,
}

impl Taps {
    /// No faults.
    pub fn none() -> Self {
        Taps::default()
    }

    /// Adds the flips of `spec`, planned over the layer outputs of `model` for a
    /// micro-batch of `n` examples.
    pub fn add(&mut self, model: &Model, n: usize, spec: &fault::plan::FlipSpec) -> Result<(), fault::plan::PlanError> {
        let layers = model.activations(n);
        if layers.is_empty() {
            return Err(fault::plan::PlanError::Invalid(
                "activation faults are available for the mlp and the cnn, not the gpt".into(),
            ));
        }
        let candidates: Vec<fault::plan::Candidate<'_>> = layers
            .iter()
            .map(|(name, n)| fault::plan::Candidate { name, role: Role::Model, dtype: ckpt::DType::F32, elements: *n })
            .collect();
        self.flips.extend(fault::plan::plan(&candidates, spec)?);
        self.layers = layers;
        Ok(())
    }

    /// The index of layer `name` (without the `act.` prefix) if flips are planned in it.
    fn planned(&self, name: &str) -> Option<usize> {
        let index = self.layers.iter().position(|(l, _)| l.strip_prefix("act.") == Some(name))?;
        self.flips.iter().any(|f| f.tensor == index).then_some(index)
    }

    /// Applies the planned flips of layer `name` (without the `act.` prefix) to its
    /// output `values`, in place, and returns the elements it replaced.
    pub(crate) fn tap_slice(&mut self, name: &str, values: &mut [f32]) -> Vec<usize> {
        let Some(index) = self.planned(name) else {
            return Vec::new();
        };
        assert_eq!(values.len() as u64, self.layers[index].1, "layer {name}: planned size differs from the output");
        let mut replaced = Vec::new();
        for f in self.flips.iter().filter(|f| f.tensor == index) {
            let e = f.element as usize;
            let old = values[e];
            let new = fault::flip_f32(old, &f.bits);
            values[e] = new;
            replaced.push(e);
            self.log.push(fault::live::LiveFlip {
                tensor: self.layers[index].0.clone(),
                element: f.element,
                bits: f.bits.clone(),
                old,
                new,
            });
        }
        replaced
    }

    /// The output of layer `name` (without the `act.` prefix), with its planned flips.
    fn tap<const D: usize>(&mut self, name: &str, x: Tensor<D>) -> Tensor<D> {
        if self.planned(name).is_none() {
            return x;
        }
        let shape = x.shape();
        let mut values = x.clone().into_data().try_into_vec::<f32>().expect("activations are f32");
        let replaced = self.tap_slice(name, &mut values);
        let mut mask = vec![false; values.len()];
        for e in replaced {
            mask[e] = true;
        }
        let device = x.device();
        let mask = Tensor::<D, Bool>::from_data(TensorData::new(mask, shape.clone()), &device);
        let replaced = Tensor::<D>::from_data(TensorData::new(values, shape), &device);
        x.mask_where(mask, replaced)
    }
}

/// Turns a [`Batch`] into logits and flat labels for one architecture.
trait Logits {
    fn logits_of(&self, batch: &Batch, device: &Device) -> (Tensor<2>, Tensor<1, Int>);
}

fn image_inputs(batch: &Batch, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
    let Batch::Images { n, x, y } = batch else { panic!("an image model was given a text batch") };
    let d = x.len() / n;
    (
        Tensor::from_data(TensorData::new(x.clone(), [*n, d]), device),
        Tensor::from_data(TensorData::new(y.clone(), [*n]), device),
    )
}

impl Logits for Mlp {
    fn logits_of(&self, batch: &Batch, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
        let (x, y) = image_inputs(batch, device);
        (self.forward(x), y)
    }
}

impl Logits for LeNet {
    fn logits_of(&self, batch: &Batch, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
        let (x, y) = image_inputs(batch, device);
        (self.forward(x), y)
    }
}

impl Logits for Gpt {
    fn logits_of(&self, batch: &Batch, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
        let Batch::Tokens { n, x, y } = batch else { panic!("a text model was given an image batch") };
        let t = x.len() / n;
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(x.clone(), [*n, t]), device);
        (self.forward(tokens), Tensor::from_data(TensorData::new(y.clone(), [n * t]), device))
    }
}

/// Collects parameter values in visiting order.
struct Collect {
    path: Vec<String>,
    out: Vec<NamedTensor>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        let shape = value.dims().to_vec();
        let data = value.into_data().try_into_vec::<f32>().expect("parameters are f32");
        self.out.push(NamedTensor::new(format!("model.{}", self.path.join(".")), Role::Model, shape, data));
    }
}

/// Writes each parameter's gradient into its range of a flat buffer, in visiting order.
struct WriteGrads<'a> {
    grads: &'a Gradients,
    out: &'a mut GradBuffer,
    next: usize,
}

impl ModuleVisitor for WriteGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let dst = self.out.grad_mut(self.next);
        self.next += 1;
        match param.val().grad(self.grads) {
            Some(g) => {
                let data = g.into_data();
                dst.copy_from_slice(data.as_slice::<f32>().expect("gradients are f32"));
            }
            // A parameter that did not take part in the loss has a zero gradient.
            None => dst.fill(0.0),
        }
    }
}

/// Assigns registry values to parameters in visiting order.
struct Assign<'a> {
    path: Vec<String>,
    params: &'a [NamedTensor],
    next: usize,
}

impl ModuleMapper for Assign<'_> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let src = &self.params[self.next];
        self.next += 1;
        debug_assert_eq!(src.name, format!("model.{}", self.path.join(".")));
        let (id, old, mapper) = param.consume();
        let device = old.device();
        let mut t = Tensor::<D>::from_data(TensorData::new(src.data.clone(), old.shape()), &device);
        if device.is_autodiff() {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}
