//! The MLP (`784-W-W/2-10`, ReLU) on the fixed-order kernels: forward, softmax
//! cross-entropy, and backward.
//!
//! The parameters are the registry's `model.fc{1,2,3}.{weight,bias}` in that order, with
//! the burn module's layout (`weight` is `[d_in, d_out]`). Activation faults strike each
//! layer's output before its rectifier, as in the framework's forward: downstream
//! operations see the corrupted value, and the corrupted element's own gradient is zero.

use kernels::Isa;
use kernels::rows::{relu, relu_backward};
use kernels::softmax::softmax_cross_entropy;

use super::{linear, linear_backward};
use crate::model::{EvalSums, Taps};
use crate::state::NamedTensor;
use crate::step::GradBuffer;

const LAYERS: [&str; 3] = ["fc1", "fc2", "fc3"];

/// The outputs of a forward pass: each layer's output after its rectifier (the last one's
/// are the logits), and the elements that faults replaced in each.
struct Forward {
    outputs: [Vec<f32>; 3],
    flipped: [Vec<usize>; 3],
}

fn forward(isa: Isa, params: &[NamedTensor], x: &[f32], n: usize, taps: &mut Taps) -> Forward {
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
    let logits = &fwd.outputs[2];
    let mut dy = vec![0.0f32; logits.len()];
    let scale = 1.0 / denominator as f32;
    let total = softmax_cross_entropy(logits, logits.len() / n.max(1), y, scale, &mut dy)
        .expect("labels are checked when the data set is read");
    let mut dx = Vec::new();
    for l in (0..LAYERS.len()).rev() {
        for &e in &fwd.flipped[l] {
            dy[e] = 0.0;
        }
        let input = if l == 0 { x } else { &fwd.outputs[l - 1] };
        let (dw, db) = grads.grad_pair_mut(2 * l);
        linear_backward(isa, input, n, &params[2 * l], &dy, dw, db, (l > 0).then_some(&mut dx));
        if l > 0 {
            relu_backward(&fwd.outputs[l - 1], &mut dx);
            std::mem::swap(&mut dy, &mut dx);
        }
    }
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions on `n` images (no gradient).
pub(in crate::model) fn evaluate(isa: Isa, params: &[NamedTensor], (n, x, y): (usize, &[f32], &[i64])) -> EvalSums {
    let fwd = forward(isa, params, x, n, &mut Taps::none());
    let logits = &fwd.outputs[2];
    let classes = logits.len() / n.max(1);
    let mut scratch = vec![0.0f32; logits.len()];
    let total = softmax_cross_entropy(logits, classes, y, 0.0, &mut scratch)
        .expect("labels are checked when the data set is read");
    let correct = logits.chunks_exact(classes).zip(y).filter(|(row, label)| argmax(row) == **label as usize).count();
    EvalSums { loss_sum: f64::from(total), count: n, correct }
}

/// The index of the first largest value (NaN never wins).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] || row[best].is_nan() && !v.is_nan() {
            best = j;
        }
    }
    best
}
