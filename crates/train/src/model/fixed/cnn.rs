//! LeNet-5 on the fixed-order kernels: two convolutions lowered to matrix products
//! (`kernels::conv`), 2x2 max pooling, and the MLP's three linear layers.
//!
//! The parameters are the registry's `model.conv1.{weight,bias}`, `model.conv2.*` and
//! `model.fc{1,2,3}.*`, in that order, with the burn module's layouts (a convolution's
//! weight is `[out, in, k, k]`). Activations are NCHW, image after image, so an
//! activation fault's element index means what it means on the framework's path.
//!
//! # Order of operations
//!
//! - A convolution's output is, per image, `W · im2col(x)` (each element one fma chain
//!   over the patch, in the weight's layout order) plus the bias, added once.
//! - Its weight gradient sums over the batch in fixed groups of [`GROUP`] images: within
//!   a group, one fma chain over the images and their output positions in order, reading
//!   the patches as rows (`im2row`; [`matmul_add`] continues the chain from one image to
//!   the next); the groups' sums are then added in order, the first from zero. The bias
//!   gradient is grouped the same way, each group a plain chain of additions. The groups
//!   depend on the batch size alone, so the threads that compute them change no bit.
//! - The input gradient is, per image, `col2im(Wᵀ · dy)`.

use kernels::Isa;
use kernels::conv::{ConvShape, col2im, im2col, im2row};
use kernels::gemm::{MatRef, matmul, matmul_add};
use kernels::pool::{max_pool2, max_pool2_backward};
use kernels::rows::relu;
use rayon::prelude::*;

use super::{loss_gradient, mlp, score};
use crate::grad::GradBuffer;
use crate::model::{EvalSums, Taps};
use crate::state::NamedTensor;

const CONV1: ConvShape = ConvShape { channels: 1, height: 28, width: 28, kernel: 5, padding: 2 };
const CONV2: ConvShape = ConvShape { channels: 6, height: 14, width: 14, kernel: 5, padding: 0 };

/// Images per partial sum of a convolution's weight and bias gradients.
const GROUP: usize = 8;

/// One convolution's output after its rectifier, the pooled output, and where each pooled
/// value came from.
#[derive(Default)]
struct Stage {
    rectified: Vec<f32>,
    pooled: Vec<f32>,
    argmax: Vec<u32>,
    flipped: Vec<usize>,
}

struct Forward {
    conv1: Stage,
    conv2: Stage,
    dense: mlp::Forward,
}

/// Convolution, tap, rectifier and pooling of the `n` images `x` with the filters
/// `params[0]` and bias `params[1]`.
fn stage(
    isa: Isa,
    shape: ConvShape,
    params: &[NamedTensor],
    name: &str,
    x: &[f32],
    n: usize,
    taps: &mut Taps,
) -> Stage {
    let mut s = Stage::default();
    conv_forward(isa, shape, &params[0], &params[1], x, n, &mut s.rectified);
    s.flipped = taps.tap_slice(name, &mut s.rectified);
    relu(&mut s.rectified);
    let (h, w) = (shape.out_height(), shape.out_width());
    s.pooled.resize(s.rectified.len() / 4, 0.0);
    s.argmax.resize(s.pooled.len(), 0);
    max_pool2(&s.rectified, h, w, &mut s.pooled, &mut s.argmax);
    s
}

fn forward(isa: Isa, params: &[NamedTensor], x: &[f32], n: usize, taps: &mut Taps) -> Forward {
    let conv1 = stage(isa, CONV1, &params[0..2], "conv1", x, n, taps);
    let conv2 = stage(isa, CONV2, &params[2..4], "conv2", &conv1.pooled, n, taps);
    let dense = mlp::forward(isa, &params[4..], &conv2.pooled, n, taps);
    Forward { conv1, conv2, dense }
}

/// The gradient of a stage's convolution output from the gradient `dpooled` of its
/// pooled output: through the pooling, the rectifier and the faults' replaced elements.
fn unpool(s: &Stage, dpooled: &[f32]) -> Vec<f32> {
    let mut d = vec![0.0f32; s.rectified.len()];
    max_pool2_backward(dpooled, &s.argmax, &mut d);
    // The rectifier's backward pass, at the only places with a gradient.
    for &i in &s.argmax {
        let (r, g) = (s.rectified[i as usize], d[i as usize]);
        d[i as usize] = if r <= 0.0 { 0.0 } else { g };
    }
    for &e in &s.flipped {
        d[e] = 0.0;
    }
    d
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
    let (total, dy) = loss_gradient(fwd.dense.logits(), n, y, denominator);
    let dpooled2 = mlp::backward(isa, &params[4..], (n, &fwd.conv2.pooled), &fwd.dense, dy, grads, 4, true);
    let d2 = unpool(&fwd.conv2, &dpooled2);
    let mut dpooled1 = vec![0.0f32; fwd.conv1.pooled.len()];
    let (dw, db) = grads.grad_pair_mut(2);
    conv_backward(isa, CONV2, &params[2], (n, &fwd.conv1.pooled), &d2, dw, db, Some(&mut dpooled1));
    let d1 = unpool(&fwd.conv1, &dpooled1);
    let (dw, db) = grads.grad_pair_mut(0);
    conv_backward(isa, CONV1, &params[0], (n, x), &d1, dw, db, None);
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions on `n` images (no gradient).
pub(in crate::model) fn evaluate(isa: Isa, params: &[NamedTensor], (n, x, y): (usize, &[f32], &[i64])) -> EvalSums {
    score(forward(isa, params, x, n, &mut Taps::none()).dense.logits(), n, y)
}

/// `y[i] = w · im2col(x[i]) + b` for each of the `n` images of `x`, into `y` (NCHW).
fn conv_forward(isa: Isa, shape: ConvShape, w: &NamedTensor, b: &NamedTensor, x: &[f32], n: usize, y: &mut Vec<f32>) {
    let (out, k, p) = (w.shape[0], shape.patch_len(), shape.positions());
    y.resize(n * out * p, 0.0);
    let filters = MatRef::row_major(&w.data, out, k);
    x.par_chunks(shape.input_len()).zip(y.par_chunks_mut(out * p)).with_min_len(GROUP).for_each_init(
        || vec![0.0f32; k * p],
        |cols, (xi, yi)| {
            im2col(shape, xi, cols);
            matmul(isa, filters, MatRef::row_major(cols, k, p), yi);
            for (row, &bias) in yi.chunks_exact_mut(p).zip(&b.data) {
                for v in row {
                    *v += bias;
                }
            }
        },
    );
}

/// The backward pass of [`conv_forward`] for the gradient `dy` of its output: `dw` and
/// `db` (overwritten; see the module's documentation for their order), and the input's
/// gradient into `dx` when asked.
#[allow(clippy::too_many_arguments)]
fn conv_backward(
    isa: Isa,
    shape: ConvShape,
    w: &NamedTensor,
    (n, x): (usize, &[f32]),
    dy: &[f32],
    dw: &mut [f32],
    db: &mut [f32],
    dx: Option<&mut [f32]>,
) {
    let (out, k, p, len) = (w.shape[0], shape.patch_len(), shape.positions(), shape.input_len());
    let groups = n.div_ceil(GROUP);
    let mut partials = vec![0.0f32; groups * (out * k + out)];
    let mut dx_groups: Vec<Option<&mut [f32]>> = match dx {
        Some(dx) => dx.chunks_mut(GROUP * len).map(Some).collect(),
        None => (0..groups).map(|_| None).collect(),
    };
    let filters_t = MatRef::row_major(&w.data, out, k).t();
    partials.par_chunks_mut(out * k + out).zip(dx_groups.par_iter_mut()).enumerate().for_each_init(
        || (vec![0.0f32; k * p], vec![0.0f32; k * p]),
        |(rows, dcols), (g, (partial, dx))| {
            let (pw, pb) = partial.split_at_mut(out * k);
            for (j, i) in (g * GROUP..n.min((g + 1) * GROUP)).enumerate() {
                let dyi = &dy[i * out * p..(i + 1) * out * p];
                im2row(shape, &x[i * len..(i + 1) * len], rows);
                let (a, rows) = (MatRef::row_major(dyi, out, p), MatRef::row_major(rows, p, k));
                if j == 0 {
                    matmul(isa, a, rows, pw);
                } else {
                    matmul_add(isa, a, rows, pw);
                }
                for (sum, row) in pb.iter_mut().zip(dyi.chunks_exact(p)) {
                    for &v in row {
                        *sum += v;
                    }
                }
                if let Some(dx) = dx {
                    matmul(isa, filters_t, a, dcols);
                    col2im(shape, dcols, &mut dx[j * len..(j + 1) * len]);
                }
            }
        },
    );
    // The sum of no groups (an empty batch) is zero; otherwise the first group's values.
    dw.fill(0.0);
    db.fill(0.0);
    let mut groups = partials.chunks_exact(out * k + out);
    if let Some(first) = groups.next() {
        dw.copy_from_slice(&first[..out * k]);
        db.copy_from_slice(&first[out * k..]);
    }
    for g in groups {
        for (s, &v) in dw.iter_mut().zip(&g[..out * k]) {
            *s += v;
        }
        for (s, &v) in db.iter_mut().zip(&g[out * k..]) {
            *s += v;
        }
    }
}
