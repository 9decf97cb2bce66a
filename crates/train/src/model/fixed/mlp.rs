//! The MLP (`784-W-W/2-10`, ReLU) on the fixed-order kernels: forward, softmax
//! cross-entropy, and backward. LeNet-5's three linear layers are this network too.
//!
//! The parameters are the registry's `model.fc{1,2,3}.{weight,bias}` in that order, with
//! the burn module's layout (`weight` is `[d_in, d_out]`). Activation faults strike each
//! layer's output before its rectifier, as in the framework's forward: downstream
//! operations see the corrupted value, and the corrupted element's own gradient is zero.

use std::ops::Range;

use kernels::Isa;
use kernels::rows::{relu, relu_backward};

use super::{linear, linear_backward, loss_gradient, score};
use crate::grad::GradBuffer;
use crate::model::{EvalSums, Taps};
use crate::state::NamedTensor;

const LAYERS: [&str; 3] = ["fc1", "fc2", "fc3"];

/// The outputs of a forward pass through consecutive layers: each layer's output after
/// its rectifier (the last layer of the network has none: its outputs are the logits), and
/// the elements that faults replaced in each.
pub(in crate::model) struct Forward {
    outputs: Vec<Vec<f32>>,
    flipped: Vec<Vec<usize>>,
}

impl Forward {
    /// The last layer's outputs.
    pub(super) fn logits(&self) -> &[f32] {
        self.last()
    }

    /// The outputs of the last layer run.
    pub(in crate::model) fn last(&self) -> &[f32] {
        self.outputs.last().map_or(&[], |v| v.as_slice())
    }
}

/// The three layers on `n` inputs `x`, with `params` the six tensors `fc1.weight` to
/// `fc3.bias`.
pub(super) fn forward(isa: Isa, params: &[NamedTensor], x: &[f32], n: usize, taps: &mut Taps) -> Forward {
    forward_layers(isa, params, 0..LAYERS.len(), x, n, taps)
}

/// The layers `layers` on `n` inputs `x` (the output of the layer before them, after its
/// rectifier), with `params` their tensors (two a layer, in order).
pub(in crate::model) fn forward_layers(
    isa: Isa,
    params: &[NamedTensor],
    layers: Range<usize>,
    x: &[f32],
    n: usize,
    taps: &mut Taps,
) -> Forward {
    let count = layers.len();
    let mut out = Forward { outputs: vec![Vec::new(); count], flipped: vec![Vec::new(); count] };
    for (j, l) in layers.enumerate() {
        let (done, rest) = out.outputs.split_at_mut(j);
        let input = done.last().map_or(x, |v| v.as_slice());
        let y = &mut rest[0];
        y.resize(n * params[2 * j].shape[1], 0.0);
        linear(isa, input, n, &params[2 * j], &params[2 * j + 1], y);
        out.flipped[j] = taps.tap_slice(LAYERS[l], y);
        if l + 1 < LAYERS.len() {
            relu(y);
        }
    }
    out
}

/// The backward pass of [`forward`] for the gradient `dy` of the logits: the gradients go
/// into `grads` from tensor `first` on, and the gradient of the input `x` is returned when
/// `input_grad` asks for it (an empty vector otherwise).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    isa: Isa,
    params: &[NamedTensor],
    (n, x): (usize, &[f32]),
    fwd: &Forward,
    dy: Vec<f32>,
    grads: &mut GradBuffer,
    first: usize,
    input_grad: bool,
) -> Vec<f32> {
    backward_layers(isa, params, (n, x), fwd, dy, (grads, first), input_grad)
}

/// The backward pass of [`forward_layers`] for the gradient `dy` of the last layer's
/// output before its rectifier: the layers' gradients go into the buffer from tensor
/// `first` on, and the gradient of the input `x` is returned when `input_grad` asks for
/// it (an empty vector otherwise). The input's gradient is taken before the rectifier of
/// the layer that made `x`: applying that is the earlier layers' part.
pub(in crate::model) fn backward_layers(
    isa: Isa,
    params: &[NamedTensor],
    (n, x): (usize, &[f32]),
    fwd: &Forward,
    mut dy: Vec<f32>,
    (grads, first): (&mut GradBuffer, usize),
    input_grad: bool,
) -> Vec<f32> {
    let mut dx = Vec::new();
    for j in (0..fwd.outputs.len()).rev() {
        for &e in &fwd.flipped[j] {
            dy[e] = 0.0;
        }
        let input = if j == 0 { x } else { &fwd.outputs[j - 1] };
        let (dw, db) = grads.grad_pair_mut(first + 2 * j);
        let want_dx = j > 0 || input_grad;
        if want_dx {
            dx.resize(n * params[2 * j].shape[0], 0.0);
        }
        linear_backward(isa, input, n, &params[2 * j], &dy, dw, db, want_dx.then_some(dx.as_mut_slice()));
        if j > 0 {
            relu_backward(&fwd.outputs[j - 1], &mut dx);
            std::mem::swap(&mut dy, &mut dx);
        }
    }
    dx
}

/// The gradient of the loss with respect to the last layer of `fwd`'s output before its
/// rectifier, from the gradient `d_out` of its output after it (a stage whose last layer
/// is not the network's receives the latter from the next stage).
pub(in crate::model) fn through_rectifier(fwd: &Forward, mut d_out: Vec<f32>) -> Vec<f32> {
    relu_backward(fwd.last(), &mut d_out);
    d_out
}

/// The MLP's layer count.
pub(in crate::model) const LAYER_COUNT: usize = LAYERS.len();

/// Forward and backward on `n` images `x` with labels `y`: the loss (sum of per-example
/// cross-entropy divided by `denominator`) and the gradients into `grads`.
pub(in crate::model) fn loss_and_grads(
    isa: Isa,
    params: &[NamedTensor],
    (n, x, y): (usize, &[f32], &[i64]),
    denominator: usize,
    taps: &mut Taps,
    grads: &mut GradBuffer,
) {
    let fwd = forward(isa, params, x, n, taps);
    let (total, dy) = loss_gradient(fwd.logits(), n, y, denominator);
    backward(isa, params, (n, x), &fwd, dy, grads, 0, false);
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions on `n` images (no gradient).
pub(in crate::model) fn evaluate(isa: Isa, params: &[NamedTensor], (n, x, y): (usize, &[f32], &[i64])) -> EvalSums {
    score(forward(isa, params, x, n, &mut Taps::none()).logits(), n, y)
}
