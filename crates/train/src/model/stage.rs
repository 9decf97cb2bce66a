//! A model cut into pipeline stages: which of its units (and so which parameters) a
//! stage holds, and its forward and backward passes on its own.
//!
//! Each model is a chain of units, the places where it can be cut:
//!
//! | model | units |
//! |---|---|
//! | MLP | `fc1`, `fc2`, `fc3` |
//! | LeNet-5 | `conv1`, `conv2` (each with its rectifier and pooling), `fc1`, `fc2`, `fc3` |
//! | GPT | the embeddings, each block, the final norm with the head |
//!
//! A stage's passes are the whole model's passes restricted to its units, operation for
//! operation (the whole model's passes are these same functions over every unit): the
//! last stage starts its backward pass from the loss, every other stage from the
//! gradient of its output that the next stage sends back. So a model run as stages
//! computes the bits it computes whole, for every cut.
//!
//! Stages run on the fixed-order kernels; the framework's kernels are refused with a
//! clear error.

use std::ops::Range;

use super::fixed::{cnn, gpt, mlp};
use super::{Kernels, Model, Taps};
use crate::data::Batch;
use crate::error::ConfigError;
use crate::grad::GradBuffer;
use crate::state::NamedTensor;

/// One stage of a model cut into `count` stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// Which stage, from the input side.
    pub index: usize,
    /// How many stages the model is cut into.
    pub count: usize,
    /// The model's units this stage holds.
    pub units: Range<usize>,
    arch: Arch,
}

/// The model's architecture, as far as cutting it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Mlp,
    Cnn,
    Gpt { layers: usize, heads: usize },
}

impl Arch {
    fn units(self) -> usize {
        match self {
            Arch::Mlp => mlp::LAYER_COUNT,
            Arch::Cnn => cnn::UNITS,
            Arch::Gpt { layers, .. } => gpt::unit_count(layers),
        }
    }

    /// The index of unit `u`'s first tensor in the registry (`units()` for the end).
    fn tensor(self, u: usize) -> usize {
        match self {
            Arch::Mlp | Arch::Cnn => 2 * u,
            Arch::Gpt { layers, .. } => gpt::unit_tensor(layers, u),
        }
    }
}

/// What a stage's forward pass of one micro-batch keeps for its backward pass.
pub struct Kept {
    batch: Batch,
    /// The input the first unit saw (empty on the first stage, which reads the batch, and
    /// on a GPT's stages, which keep what they need in the pass).
    input: Vec<f32>,
    pass: Pass,
}

enum Pass {
    Mlp(mlp::Forward),
    Cnn(cnn::Units),
    Gpt(gpt::Units),
}

impl Kept {
    /// The stage's output: the next stage's input (the logits on the last stage).
    pub fn output(&self) -> &[f32] {
        match &self.pass {
            Pass::Mlp(f) => f.last(),
            Pass::Cnn(u) => u.output(),
            Pass::Gpt(u) => u.output(),
        }
    }
}

impl Stage {
    /// Stage `index` of `model` cut into `count` stages of consecutive units, the
    /// earlier stages holding one unit more when they cannot be equal.
    pub fn of(model: &Model, kernels: Kernels, count: usize, index: usize) -> Result<Stage, ConfigError> {
        if !matches!(kernels, Kernels::Fixed(_)) {
            return Err(ConfigError::Invalid(
                "pipeline stages run on the fixed-order kernels (--kernels fixed)".into(),
            ));
        }
        let (arch, name) = match model {
            Model::Mlp(_) => (Arch::Mlp, "MLP"),
            Model::Cnn(_) => (Arch::Cnn, "LeNet-5"),
            Model::Gpt(g) => (Arch::Gpt { layers: g.layers(), heads: g.heads() }, "GPT"),
        };
        let units = arch.units();
        if count == 0 || count > units || index >= count {
            return Err(ConfigError::Invalid(format!(
                "stage {index} of {count}: the {name}'s {units} units make 1 to {units} stages"
            )));
        }
        let (base, extra) = (units / count, units % count);
        let start = index * base + index.min(extra);
        let end = start + base + usize::from(index < extra);
        Ok(Stage { index, count, units: start..end, arch })
    }

    /// Whether the stage reads the micro-batch's examples.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// Whether the stage computes the loss.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The indices of the stage's tensors in the whole model's registry order.
    pub fn tensors(&self) -> Range<usize> {
        self.arch.tensor(self.units.start)..self.arch.tensor(self.units.end)
    }

    /// The stage's parameters out of the whole model's.
    pub fn params(&self, all: &[NamedTensor]) -> Vec<NamedTensor> {
        all[self.tensors()].to_vec()
    }

    /// The forward pass of `batch` (the first stage) or of `input` (the previous stage's
    /// output, kept for the backward pass) with the stage's `params`.
    pub(crate) fn forward(
        &self,
        kernels: Kernels,
        params: &[NamedTensor],
        batch: Batch,
        input: Vec<f32>,
        taps: &mut Taps,
    ) -> Result<Kept, ConfigError> {
        let isa = isa(kernels)?;
        let units = self.units.clone();
        let input = if self.is_first() { Vec::new() } else { input };
        let pass = match (self.arch, &batch) {
            (Arch::Mlp | Arch::Cnn, Batch::Images { n, x, .. }) => {
                let x = if self.is_first() { x.as_slice() } else { &input };
                check_input(x.len(), *n, "images")?;
                if self.arch == Arch::Mlp {
                    Pass::Mlp(mlp::forward_layers(isa, params, units, x, *n, taps))
                } else {
                    Pass::Cnn(cnn::forward_units(isa, params, units, x, *n, taps))
                }
            }
            (Arch::Gpt { layers, heads }, Batch::Tokens { n, x, .. }) => {
                let gpt = gpt::forward_units(isa, params, (layers, heads), units, (*n, x), input);
                return Ok(Kept { batch, input: Vec::new(), pass: Pass::Gpt(gpt) });
            }
            _ => return Err(ConfigError::Invalid("a stage was given a batch of another kind".into())),
        };
        Ok(Kept { batch, input, pass })
    }

    /// The backward pass of what `kept` kept, from the gradient of the stage's output
    /// (`upstream`; ignored on the last stage, which starts from the loss divided by
    /// `denominator`): the gradients go into `grads` (the loss too, on the last stage),
    /// and the gradient of the stage's input is returned (empty on the first stage).
    pub(crate) fn backward(
        &self,
        kernels: Kernels,
        params: &[NamedTensor],
        kept: &Kept,
        upstream: &[f32],
        denominator: usize,
        grads: &mut GradBuffer,
    ) -> Result<Vec<f32>, ConfigError> {
        let isa = isa(kernels)?;
        let dy = if self.is_last() {
            let y = match &kept.batch {
                Batch::Images { y, .. } | Batch::Tokens { y, .. } => y,
            };
            let (total, dy) = super::fixed::loss_gradient(kept.output(), y.len(), y, denominator);
            grads.set_loss(total / denominator as f32);
            dy
        } else {
            if upstream.len() != kept.output().len() {
                return Err(ConfigError::Invalid(format!(
                    "the gradient received for stage {}'s output has {} values, the output {}",
                    self.index,
                    upstream.len(),
                    kept.output().len()
                )));
            }
            upstream.to_vec()
        };
        let wants_input = !self.is_first();
        let units = self.units.clone();
        Ok(match (&kept.pass, &kept.batch) {
            (Pass::Mlp(f), Batch::Images { n, x, .. }) => {
                let x = if self.is_first() { x.as_slice() } else { &kept.input };
                let dy = if self.is_last() { dy } else { mlp::through_rectifier(f, dy) };
                mlp::backward_layers(isa, params, (*n, x), f, dy, (grads, 0), wants_input)
            }
            (Pass::Cnn(u), Batch::Images { n, x, .. }) => {
                let x = if self.is_first() { x.as_slice() } else { &kept.input };
                cnn::backward_units(isa, params, units, (*n, x), u, dy, grads, wants_input)
            }
            (Pass::Gpt(u), _) => gpt::backward_units(isa, params, u, &dy, grads),
            _ => return Err(ConfigError::Invalid("a stage's pass does not match its batch".into())),
        })
    }
}

/// What one example costs a stage and what it sends on: the measure by which selective
/// logging chooses its boundaries (`pipeline::groups`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// Multiply-adds of the forward pass (the backward pass costs about twice as much).
    pub work: f64,
    /// Values of the stage's output: what crosses the boundary after it, each way.
    pub output: usize,
}

/// The profile of each stage of `model` cut into `count` stages, from the shapes of its
/// parameters `params` (the whole model's, in registry order).
pub fn profiles(model: &Model, params: &[NamedTensor], count: usize) -> Result<Vec<Profile>, ConfigError> {
    let units = unit_profiles(model, params);
    let fixed = Kernels::Fixed(kernels::Isa::Scalar);
    (0..count)
        .map(|i| {
            let stage = Stage::of(model, fixed, count, i)?;
            let work = units[stage.units.clone()].iter().map(|u| u.work).sum();
            Ok(Profile { work, output: units[stage.units.end - 1].output })
        })
        .collect()
}

/// The profile of each unit of `model` (see [`profiles`]).
fn unit_profiles(model: &Model, params: &[NamedTensor]) -> Vec<Profile> {
    let len = |i: usize| params[i].data.len();
    // A layer applied at `positions` places: its weight's size in work, its bias's size
    // in output (the MLP's, and LeNet's three last units).
    let layer = |u: usize, positions: usize| Profile { work: (len(2 * u) * positions) as f64, output: len(2 * u + 1) };
    match model {
        Model::Mlp(_) => (0..mlp::LAYER_COUNT).map(|u| layer(u, 1)).collect(),
        Model::Cnn(_) => (0..cnn::UNITS)
            .map(|u| match cnn::conv_positions(u) {
                // A convolution's output is pooled 2 by 2.
                Some(positions) => {
                    Profile { output: layer(u, positions).output * positions / 4, ..layer(u, positions) }
                }
                None => layer(u, 1),
            })
            .collect(),
        Model::Gpt(g) => {
            let (layers, [context, width]) = (g.layers(), [params[1].shape[0], params[1].shape[1]]);
            let stream = context * width;
            (0..gpt::unit_count(layers))
                .map(|u| {
                    let tensors = gpt::unit_tensor(layers, u)..gpt::unit_tensor(layers, u + 1);
                    let matrices: usize = tensors.filter(|&i| params[i].shape.len() == 2).map(len).sum();
                    let work = match u {
                        0 => stream,
                        // Attention's scores and weighted sums besides the blocks' layers.
                        u if u <= layers => context * matrices + 2 * context * stream,
                        _ => context * len(params.len() - 2),
                    };
                    let output = if u <= layers { stream } else { context * len(params.len() - 1) };
                    Profile { work: work as f64, output }
                })
                .collect()
        }
    }
}

/// The fixed-order kernels' instruction set.
fn isa(kernels: Kernels) -> Result<kernels::Isa, ConfigError> {
    match kernels {
        Kernels::Fixed(isa) => Ok(isa),
        Kernels::Framework => Err(ConfigError::Invalid("pipeline stages run on the fixed-order kernels".into())),
    }
}

/// A stage's input must hold whole examples.
fn check_input(len: usize, n: usize, what: &str) -> Result<(), ConfigError> {
    if n == 0 || !len.is_multiple_of(n) {
        return Err(ConfigError::Invalid(format!("a stage's input of {len} values is not {n} {what}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use burn::prelude::Device;

    use super::*;
    use crate::model::{GptConfig, ModelKind};

    fn cuts(kind: ModelKind, count: usize) -> Vec<Range<usize>> {
        let gpt = GptConfig { layers: 2, ..GptConfig::small(10) };
        let model = Model::new(kind, 1, gpt, 16, &Device::flex().autodiff());
        let fixed = Kernels::Fixed(kernels::Isa::Scalar);
        (0..count).map(|i| Stage::of(&model, fixed, count, i).unwrap().tensors()).collect()
    }

    #[test]
    fn the_units_are_shared_out_in_order() {
        assert_eq!(cuts(ModelKind::Mlp, 1), vec![0..6]);
        assert_eq!(cuts(ModelKind::Mlp, 2), [0..4, 4..6]);
        assert_eq!(cuts(ModelKind::Mlp, 3), [0..2, 2..4, 4..6]);
        assert_eq!(cuts(ModelKind::Cnn, 2), [0..6, 6..10]);
        // Embeddings and block 0 | block 1 and the head.
        assert_eq!(cuts(ModelKind::Gpt, 2), [0..14, 14..30]);
        assert_eq!(cuts(ModelKind::Gpt, 4), [0..2, 2..14, 14..26, 26..30]);
    }

    #[test]
    fn a_stage_s_profile_counts_its_work_and_its_output() {
        let gpt = GptConfig { layers: 2, ..GptConfig::small(10) };
        let device = Device::flex().autodiff();
        let profile = |kind, count| {
            let model = Model::new(kind, 1, gpt, 16, &device);
            profiles(&model, &model.params(), count).unwrap()
        };
        // 784-16-8-10.
        let mlp = profile(ModelKind::Mlp, 3);
        assert_eq!(mlp.iter().map(|p| (p.work, p.output)).collect::<Vec<_>>(), [(12544.0, 16), (128.0, 8), (80.0, 10)]);
        // conv1: 6 filters of 5x5 at 28x28 places, pooled to 6x14x14; conv2: 16 of 6x5x5
        // at 10x10, pooled to 16x5x5; then 400-120-84-10.
        let cnn = profile(ModelKind::Cnn, 5);
        let expected = [(117600.0, 1176), (240000.0, 400), (48000.0, 120), (10080.0, 84), (840.0, 10)];
        assert_eq!(cnn.iter().map(|p| (p.work, p.output)).collect::<Vec<_>>(), expected);
        // Two stages: the convolutions and fc1, then fc2 and fc3.
        assert_eq!(profile(ModelKind::Cnn, 2)[0], Profile { work: 405600.0, output: 120 });
        // The stream between blocks is 64 places of 128.
        let g = profile(ModelKind::Gpt, 4);
        assert!(g[..3].iter().all(|p| p.output == 64 * 128) && g[3].output == 64 * 10, "{g:?}");
        assert!(g[1].work > 64.0 * 12.0 * 128.0 * 128.0 && g[1].work == g[2].work, "{g:?}");
    }

    #[test]
    fn impossible_cuts_are_refused() {
        let model = Model::new(ModelKind::Mlp, 1, GptConfig::small(10), 16, &Device::flex().autodiff());
        let fixed = Kernels::Fixed(kernels::Isa::Scalar);
        assert!(Stage::of(&model, fixed, 4, 0).unwrap_err().to_string().contains("1 to 3 stages"));
        assert!(Stage::of(&model, fixed, 2, 2).is_err());
        assert!(Stage::of(&model, Kernels::Framework, 2, 0).unwrap_err().to_string().contains("fixed-order"));
    }
}
