//! The models' forward and backward passes written by hand on `steadfast-kernels`: every
//! operation has an order fixed by the shapes alone, so a step gives the same bits on
//! every CPU kind, instruction set and thread count (see `docs/determinism.md`).
//!
//! These passes read the parameters straight from the state registry and write each
//! gradient straight into its range of the step's flat buffer: no framework tensor is
//! built, and nothing is copied into a module first. The burn modules of the parent
//! module remain the models' definition (names, shapes, initial values) and the
//! `framework` kernel set that these are compared against.
//!
//! What it must not do: call the platform's maths library (`f32::exp` and friends), use
//! an accumulation whose order depends on a vector width or a thread count, or let a
//! multiply-add be fused on one path and not on another.

pub(super) mod cnn;
pub(super) mod gpt;
pub(super) mod mlp;
mod scratch;

use kernels::Isa;
use kernels::gemm::{MatRef, matmul};
use rayon::prelude::*;

use crate::model::EvalSums;
use crate::state::NamedTensor;

/// `y = x · w + b` for `x` of `n` rows: `w` is `[d_in, d_out]`, `b` is `[d_out]`; each
/// output is the product's fma chain, then one addition of the bias. `y` (`n * d_out`
/// values) is overwritten.
fn linear(isa: Isa, x: &[f32], n: usize, w: &NamedTensor, b: &NamedTensor, y: &mut [f32]) {
    let (d_in, d_out) = (w.shape[0], w.shape[1]);
    matmul(isa, MatRef::row_major(x, n, d_in), MatRef::row_major(&w.data, d_in, d_out), y);
    let rows_per_task = (1usize << 14).div_ceil(d_out.max(1));
    y.par_chunks_mut(rows_per_task * d_out).for_each(|rows| {
        for row in rows.chunks_exact_mut(d_out) {
            for (v, &bias) in row.iter_mut().zip(&b.data) {
                *v += bias;
            }
        }
    });
}

/// The backward pass of [`linear`] for the gradient `dy` of its output: `dw = xᵀ · dy`,
/// `db` the column sums of `dy`, and, when asked, `dx = dy · wᵀ` (`n * d_in` values,
/// overwritten).
#[allow(clippy::too_many_arguments)]
fn linear_backward(
    isa: Isa,
    x: &[f32],
    n: usize,
    w: &NamedTensor,
    dy: &[f32],
    dw: &mut [f32],
    db: &mut [f32],
    dx: Option<&mut [f32]>,
) {
    let (d_in, d_out) = (w.shape[0], w.shape[1]);
    let dy_m = MatRef::row_major(dy, n, d_out);
    // The weights' gradient and the input's are independent products. Side by side, each
    // still split its own way (so their bits are the same as one after the other), the
    // threads take up one product's last pieces of work while the other's finish.
    rayon::join(
        || {
            matmul(isa, MatRef::row_major(x, n, d_in).t(), dy_m, dw);
            kernels::rows::sum_rows(dy, db);
        },
        || {
            if let Some(dx) = dx {
                matmul(isa, dy_m, MatRef::row_major(&w.data, d_in, d_out).t(), dx);
            }
        },
    );
}

/// Softmax cross-entropy of `n` rows of `logits` against labels `y`: the sum of the
/// per-example losses, and the gradient of that sum divided by `denominator`.
pub(in crate::model) fn loss_gradient(logits: &[f32], n: usize, y: &[i64], denominator: usize) -> (f32, Vec<f32>) {
    let mut dy = vec![0.0f32; logits.len()];
    let total =
        kernels::softmax::softmax_cross_entropy(logits, logits.len() / n.max(1), y, 1.0 / denominator as f32, &mut dy)
            .expect("labels are checked when the data set is read");
    (total, dy)
}

/// The loss sum and the correct arg-max predictions of `n` rows of `logits`.
fn score(logits: &[f32], n: usize, y: &[i64]) -> EvalSums {
    let classes = logits.len() / n.max(1);
    let mut scratch = vec![0.0f32; logits.len()];
    let total = kernels::softmax::softmax_cross_entropy(logits, classes, y, 0.0, &mut scratch)
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
