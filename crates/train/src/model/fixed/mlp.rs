//! The MLP (`784-W-W/2-10`, ReLU) on the fixed-order kernels: forward, softmax
//! cross-entropy, and backward. LeNet-5's three linear layers are this network too.
//!
//! The parameters are the registry's `model.fc{1,2,3}.{weight,bias}` in that order, with
//! the burn module's layout (`weight` is `[d_in, d_out]`). Activation faults strike each
//! layer's output before its rectifier, as in the framework's forward: downstream
//! operations see the corrupted value, and the corrupted element's own gradient is zero.

use kernels::Isa;
use kernels::rows::{relu, relu_backward};

use super::{linear, linear_backward, loss_gradient, score};
use crate::model::{EvalSums, Taps};
use crate::state::NamedTensor;
use crate::step::GradBuffer;

const LAYERS: [&str; 3] = ["fc1", "fc2", "fc3"];

/// The outputs of a forward pass: each layer's output after its rectifier (the last one's
/// are the logits), and the elements that faults replaced in each.
pub(super) struct Forward {
    outputs: [Vec<f32>; 3],
    flipped: [Vec<usize>; 3],
}

impl Forward {
    /// The last layer's outputs.
    pub(super) fn logits(&self) -> &[f32] {
        &self.outputs[2]
    }
}

/// The three layers on `n` inputs `x`, with `params` the six tensors `fc1.weight` to
/// `fc3.bias`.
pub(super) fn forward(isa: Isa, params: &[NamedTensor], x: &[f32], n: usize, taps: &mut Taps) -> Forward {
    let mut out = Forward { outputs: Default::default(), flipped: Default::default() };
    for (l, name) in LAYERS.into_iter().enumerate() {
        let (done, rest) = out.outputs.split_at_mut(l);
        let input = done.last().map_or(x, |v| v.as_slice());
        let y = &mut rest[0];
        linear(isa, input, n, &params[2 * l], &params[2 * l + 1], y);
        out.flipped[l] = taps.tap_slice(name, y);
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
    mut dy: Vec<f32>,
    grads: &mut GradBuffer,
    first: usize,
    input_grad: bool,
) -> Vec<f32> {
    let mut dx = Vec::new();
    for l in (0..LAYERS.len()).rev() {
        for &e in &fwd.flipped[l] {
            dy[e] = 0.0;
        }
        let input = if l == 0 { x } else { &fwd.outputs[l - 1] };
        let (dw, db) = grads.grad_pair_mut(first + 2 * l);
        let want_dx = l > 0 || input_grad;
        linear_backward(isa, input, n, &params[2 * l], &dy, dw, db, want_dx.then_some(&mut dx));
        if l > 0 {
            relu_backward(&fwd.outputs[l - 1], &mut dx);
            std::mem::swap(&mut dy, &mut dx);
        }
    }
    dx
}

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
