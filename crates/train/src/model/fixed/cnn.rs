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

use std::ops::Range;

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

/// LeNet's units, the places where it can be cut into pipeline stages: the two
/// convolutions (each with its rectifier and pooling), then the MLP's three layers.
pub(in crate::model) const UNITS: usize = 2 + mlp::LAYER_COUNT;
const CONVS: [(ConvShape, &str); 2] = [(CONV1, "conv1"), (CONV2, "conv2")];

/// The places at which unit `u` applies its filters, if it is a convolution.
pub(in crate::model) fn conv_positions(u: usize) -> Option<usize> {
    CONVS.get(u).map(|(shape, _)| shape.out_height() * shape.out_width())
}

/// What a forward pass through consecutive units keeps for the backward pass.
pub(in crate::model) struct Units {
    /// The convolution units run, in order.
    convs: Vec<Stage>,
    /// The linear layers run, if any.
    dense: Option<mlp::Forward>,
}

impl Units {
    /// The last unit's output: the logits, a linear layer's output after its rectifier,
    /// or a convolution's pooled output.
    pub(in crate::model) fn output(&self) -> &[f32] {
        match (&self.dense, self.convs.last()) {
            (Some(d), _) => d.last(),
            (None, Some(c)) => &c.pooled,
            (None, None) => &[],
        }
    }
}

/// The units `units` on `n` inputs `x` (the images, or the output of the unit before
/// them), with `params` their tensors (two a unit, in order).
pub(in crate::model) fn forward_units(
    isa: Isa,
    params: &[NamedTensor],
    units: Range<usize>,
    x: &[f32],
    n: usize,
    taps: &mut Taps,
) -> Units {
    let mut out = Units { convs: Vec::new(), dense: None };
    let convs = units.start.min(CONVS.len())..units.end.min(CONVS.len());
    for (j, &(shape, name)) in CONVS[convs].iter().enumerate() {
        let input = out.convs.last().map_or(x, |s| s.pooled.as_slice());
        let s = stage(isa, shape, &params[2 * j..2 * j + 2], name, input, n, taps);
        out.convs.push(s);
    }
    if units.end > CONVS.len() {
        let first = units.start.max(CONVS.len());
        let input = out.convs.last().map_or(x, |s| s.pooled.as_slice());
        let layers = first - CONVS.len()..units.end - CONVS.len();
        out.dense = Some(mlp::forward_layers(isa, &params[2 * (first - units.start)..], layers, input, n, taps));
    }
    out
}

/// The backward pass of [`forward_units`] for `dy`, the gradient of the logits when the
/// last unit is the network's, otherwise of the last unit's output (after its rectifier
/// and pooling): the units' gradients go into `grads` (two a unit, in order), and the
/// gradient of the input `x` is returned when `input_grad` asks for it.
#[allow(clippy::too_many_arguments)]
pub(in crate::model) fn backward_units(
    isa: Isa,
    params: &[NamedTensor],
    units: Range<usize>,
    (n, x): (usize, &[f32]),
    fwd: &Units,
    dy: Vec<f32>,
    grads: &mut GradBuffer,
    input_grad: bool,
) -> Vec<f32> {
    let mut d = dy;
    if let Some(dense) = &fwd.dense {
        let first = 2 * (units.start.max(CONVS.len()) - units.start);
        let dy = if units.end == UNITS { d } else { mlp::through_rectifier(dense, d) };
        let input = fwd.convs.last().map_or(x, |s| s.pooled.as_slice());
        let want = !fwd.convs.is_empty() || input_grad;
        d = mlp::backward_layers(isa, &params[first..], (n, input), dense, dy, (grads, first), want);
    }
    for (j, s) in fwd.convs.iter().enumerate().rev() {
        let dconv = unpool(s, &d);
        let input = if j == 0 { x } else { fwd.convs[j - 1].pooled.as_slice() };
        let want = j > 0 || input_grad;
        let mut dx = if want { vec![0.0f32; input.len()] } else { Vec::new() };
        let (dw, db) = grads.grad_pair_mut(2 * j);
        let shape = CONVS[units.start + j].0;
        conv_backward(isa, shape, &params[2 * j], (n, input), &dconv, dw, db, want.then_some(dx.as_mut_slice()));
        d = dx;
    }
    d
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
    let fwd = forward_units(isa, params, 0..UNITS, x, n, taps);
    let (total, dy) = loss_gradient(fwd.output(), n, y, denominator);
    backward_units(isa, params, 0..UNITS, (n, x), &fwd, dy, grads, false);
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions on `n` images (no gradient).
pub(in crate::model) fn evaluate(isa: Isa, params: &[NamedTensor], (n, x, y): (usize, &[f32], &[i64])) -> EvalSums {
    score(forward_units(isa, params, 0..UNITS, x, n, &mut Taps::none()).output(), n, y)
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
