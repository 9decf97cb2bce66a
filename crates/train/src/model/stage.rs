//! A model cut into pipeline stages: which layers (and so which parameters) a stage
//! holds, and its forward and backward passes on its own.
//!
//! A stage's passes are the whole model's passes restricted to its layers, operation for
//! operation: the last stage starts its backward pass from the loss, every other stage
//! from the gradient of its output that the next stage sends back, taken through its own
//! rectifier. So a model run as stages computes the bits it computes whole.
//!
//! Today the MLP on the fixed-order kernels can be cut (at any of its layer
//! boundaries); other models and the framework's kernels are refused with a clear error.

use std::ops::Range;

use super::fixed::mlp;
use super::{Kernels, ModelKind, Taps};
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
    /// The model's layers this stage holds.
    pub layers: Range<usize>,
}

/// What a stage's forward pass of one micro-batch keeps for its backward pass.
pub struct Kept {
    batch: Batch,
    /// The input the first layer saw (empty on the first stage, which reads the batch).
    input: Vec<f32>,
    forward: mlp::Forward,
}

impl Kept {
    /// The stage's output: the next stage's input.
    pub fn output(&self) -> &[f32] {
        self.forward.last()
    }
}

impl Stage {
    /// Stage `index` of `model` cut into `count` stages of consecutive layers, the
    /// earlier stages holding one layer more when they cannot be equal.
    pub fn of(model: ModelKind, kernels: Kernels, count: usize, index: usize) -> Result<Stage, ConfigError> {
        if model != ModelKind::Mlp || !matches!(kernels, Kernels::Fixed(_)) {
            return Err(ConfigError::Invalid(
                "pipeline stages are written for the MLP on the fixed-order kernels".into(),
            ));
        }
        let layers = mlp::LAYER_COUNT;
        if count == 0 || count > layers || index >= count {
            return Err(ConfigError::Invalid(format!(
                "stage {index} of {count}: the MLP's {layers} layers make 1 to {layers} stages"
            )));
        }
        let (base, extra) = (layers / count, layers % count);
        let start = index * base + index.min(extra);
        let end = start + base + usize::from(index < extra);
        Ok(Stage { index, count, layers: start..end })
    }

    /// Whether the stage reads the micro-batch's examples.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// Whether the stage computes the loss.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The stage's parameters out of the whole model's (two tensors a layer).
    pub fn params(&self, all: &[NamedTensor]) -> Vec<NamedTensor> {
        all[2 * self.layers.start..2 * self.layers.end].to_vec()
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
        let isa = self.isa(kernels)?;
        let Batch::Images { n, x, .. } = &batch else {
            return Err(ConfigError::Invalid("the MLP's stages take images".into()));
        };
        let (n, input) = (*n, if self.is_first() { Vec::new() } else { input });
        let x = if self.is_first() { x.as_slice() } else { &input };
        let forward = mlp::forward_layers(isa, params, self.layers.clone(), x, n, taps);
        Ok(Kept { batch, input, forward })
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
        let isa = self.isa(kernels)?;
        let Batch::Images { n, x, y } = &kept.batch else {
            return Err(ConfigError::Invalid("the MLP's stages take images".into()));
        };
        let dy = if self.is_last() {
            let (total, dy) = super::fixed::loss_gradient(kept.forward.last(), *n, y, denominator);
            grads.set_loss(total / denominator as f32);
            dy
        } else {
            mlp::through_rectifier(&kept.forward, upstream.to_vec())
        };
        let x = if self.is_first() { x.as_slice() } else { &kept.input };
        Ok(mlp::backward_layers(isa, params, (*n, x), &kept.forward, dy, (grads, 0), !self.is_first()))
    }

    fn isa(&self, kernels: Kernels) -> Result<kernels::Isa, ConfigError> {
        match kernels {
            Kernels::Fixed(isa) => Ok(isa),
            Kernels::Framework => Err(ConfigError::Invalid("pipeline stages run on the fixed-order kernels".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layers_are_shared_out_in_order() {
        let fixed = Kernels::Fixed(kernels::Isa::Scalar);
        let layers = |count| -> Vec<Range<usize>> {
            (0..count).map(|i| Stage::of(ModelKind::Mlp, fixed, count, i).unwrap().layers).collect()
        };
        assert_eq!(layers(1), vec![0..3]);
        assert_eq!(layers(2), [0..2, 2..3]);
        assert_eq!(layers(3), [0..1, 1..2, 2..3]);
        assert!(Stage::of(ModelKind::Mlp, fixed, 4, 0).is_err());
        assert!(Stage::of(ModelKind::Cnn, fixed, 2, 0).is_err());
        assert!(Stage::of(ModelKind::Mlp, Kernels::Framework, 2, 0).is_err());
    }
}
