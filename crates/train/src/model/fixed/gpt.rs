//! The character-level GPT on the fixed-order kernels: embeddings, pre-norm blocks of
//! causal self-attention and a GELU MLP, a final layer norm and the linear head.
//!
//! The parameters are the registry's, in the burn module's order: `model.tok.weight`,
//! `model.pos.weight`, then per block `ln1.{gamma,beta}`, `qkv`, `proj`,
//! `ln2.{gamma,beta}`, `fc`, `out` (each linear layer's `weight` `[d_in, d_out]` then
//! `bias`), then `model.ln_f.*` and `model.head.*`. The passes check the names.
//!
//! # Order of operations
//!
//! Each kernel documents its own order: the linear layers are `kernels::gemm` products
//! plus the bias, the layer norms `kernels::norm`, attention `kernels::attention`, GELU
//! `kernels::gelu`. What this file adds:
//!
//! - an embedding is `tok[token] + pos[position]`, one addition; a residual connection is
//!   `x + branch(x)`, one addition per element;
//! - the embeddings' gradients add each token's gradient row into its table row, rows in
//!   order (sequence after sequence, token after token), from zero;
//! - a residual stream's gradient is the gradient from above plus the branch's, one
//!   addition per element.

use std::ops::Range;

use kernels::Isa;
use kernels::attention::{self, Heads};
use kernels::{gelu, norm};
use rayon::prelude::*;

use super::scratch::Scratch;
use super::{linear, linear_backward, loss_gradient, score};
use crate::grad::GradBuffer;
use crate::model::EvalSums;
use crate::state::NamedTensor;

/// A block's tensors, in registry order.
const BLOCK: [&str; 12] = [
    "ln1.gamma",
    "ln1.beta",
    "qkv.weight",
    "qkv.bias",
    "proj.weight",
    "proj.bias",
    "ln2.gamma",
    "ln2.beta",
    "fc.weight",
    "fc.bias",
    "out.weight",
    "out.bias",
];
/// Positions in [`BLOCK`].
const LN1: usize = 0;
const QKV: usize = 2;
const PROJ: usize = 4;
const LN2: usize = 6;
const FC: usize = 8;
const OUT: usize = 10;
/// Elements per task of the element-wise loops on the thread pool.
const ELEMENTWISE_CHUNK: usize = 1 << 14;

/// The sizes of a pass, read from the parameters and the batch.
#[derive(Clone, Copy)]
struct Dims {
    /// Sequences.
    n: usize,
    /// Tokens per sequence.
    t: usize,
    /// Width of the residual stream.
    w: usize,
    layers: usize,
    heads: Heads,
}

impl Dims {
    fn rows(&self) -> usize {
        self.n * self.t
    }
}

/// The GPT's units, the places where it can be cut into pipeline stages: the
/// embeddings (unit 0), each block (units 1 to `layers`), and the final layer norm with
/// the head and the loss (unit `layers + 1`).
pub(in crate::model) fn unit_count(layers: usize) -> usize {
    layers + 2
}

/// The index of unit `u`'s first tensor in the whole model's registry order.
pub(in crate::model) fn unit_tensor(layers: usize, u: usize) -> usize {
    match u {
        0 => 0,
        u if u <= layers + 1 => 2 + BLOCK.len() * (u - 1),
        _ => 2 + BLOCK.len() * layers + 4,
    }
}

/// The names the tensors of `units` have, in order.
fn unit_names(layers: usize, units: Range<usize>) -> Vec<String> {
    let mut names = Vec::new();
    for u in units {
        match u {
            0 => names.extend(["model.tok.weight".to_owned(), "model.pos.weight".to_owned()]),
            u if u <= layers => names.extend(BLOCK.iter().map(|p| format!("model.blocks.{}.{p}", u - 1))),
            _ => names.extend(["ln_f.gamma", "ln_f.beta", "head.weight", "head.bias"].map(|p| format!("model.{p}"))),
        }
    }
    names
}

/// Checks the names of the tensors of `units` of a GPT of `layers` blocks, and reads the
/// sizes from their shapes and the batch's (`n` sequences of `tokens` tokens in all).
fn dims(params: &[NamedTensor], layers: usize, units: &Range<usize>, heads: usize, n: usize, tokens: usize) -> Dims {
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, unit_names(layers, units.clone()), "the GPT's parameters are not in the expected order");
    // The embedding table is [vocab, width]; every other unit starts with a norm's [width].
    let w = if units.start == 0 { params[0].shape[1] } else { params[0].shape[0] };
    assert!(n > 0 && tokens.is_multiple_of(n), "{tokens} tokens are not {n} sequences");
    let t = tokens / n;
    if units.start == 0 {
        assert!(t <= params[1].shape[0], "{t} tokens per sequence exceed the context of {}", params[1].shape[0]);
    }
    Dims { n, t, w, layers, heads: Heads { tokens: t, heads, head_dim: w / heads } }
}

/// The number of blocks of the whole model whose tensors are `params`.
fn layers_of(params: &[NamedTensor]) -> usize {
    params.len().saturating_sub(6) / BLOCK.len()
}

/// A layer norm's output and what its backward pass needs.
struct Normed {
    out: Scratch,
    xhat: Scratch,
    rstd: Scratch,
}

impl Normed {
    /// Buffers for `rows` rows of `w` values, to be written.
    fn output(rows: usize, w: usize) -> Normed {
        Normed { out: Scratch::output(rows * w), xhat: Scratch::output(rows * w), rstd: Scratch::output(rows) }
    }
}

fn normed(isa: Isa, x: &[f32], gamma: &NamedTensor, beta: &NamedTensor) -> Normed {
    let mut n = Normed::output(x.len() / gamma.data.len(), gamma.data.len());
    norm::forward(isa, x, &gamma.data, &beta.data, &mut n.out, &mut n.xhat, &mut n.rstd);
    n
}

/// What a block's backward pass needs from its forward pass.
struct BlockCache {
    ln1: Normed,
    qkv: Scratch,
    probs: Scratch,
    attended: Scratch,
    ln2: Normed,
    activated: Scratch,
    slope: Scratch,
}

/// What a forward pass through consecutive units keeps for the backward pass.
pub(in crate::model) struct Units {
    units: Range<usize>,
    d: Dims,
    /// The token ids as table rows (the embedding unit's input).
    tokens: Vec<usize>,
    blocks: Vec<BlockCache>,
    /// The final unit's layer norm, if it ran.
    ln_f: Option<Normed>,
    /// The residual stream after the last unit, or the logits after the final unit.
    out: Scratch,
}

impl Units {
    /// The last unit's output: the residual stream, or the logits.
    pub(in crate::model) fn output(&self) -> &[f32] {
        &self.out
    }
}

/// `x += y`, element by element.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// [`add`] on the thread pool.
fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(ELEMENTWISE_CHUNK).zip(y.par_chunks(ELEMENTWISE_CHUNK)).for_each(|(x, y)| add(x, y));
}

/// The token ids as table rows.
fn token_rows(tokens: &[i64], vocab: usize) -> Vec<usize> {
    tokens
        .iter()
        .map(|&v| {
            usize::try_from(v).ok().filter(|&v| v < vocab).expect("token ids are checked when the data set is read")
        })
        .collect()
}

/// The units `units` of a GPT of `layers` blocks with `heads` heads, on `n` sequences of
/// `tokens` (the embedding unit's input) or on `input` (the residual stream of the unit
/// before them), with `params` their tensors in order.
#[allow(clippy::too_many_arguments)]
pub(in crate::model) fn forward_units(
    isa: Isa,
    params: &[NamedTensor],
    (layers, heads): (usize, usize),
    units: Range<usize>,
    (n, tokens): (usize, &[i64]),
    input: Vec<f32>,
) -> Units {
    let d = dims(params, layers, &units, heads, n, tokens.len());
    let at = |u: usize| unit_tensor(layers, u) - unit_tensor(layers, units.start);
    let (rows, w) = (d.rows(), d.w);
    let token_ids = if units.start == 0 { token_rows(tokens, params[0].shape[0]) } else { Vec::new() };
    let mut x = Scratch::adopt(input);
    if units.start == 0 {
        let (tok, pos) = (&params[0].data, &params[1].data);
        x = Scratch::output(rows * w);
        for (r, (row, &id)) in x.chunks_exact_mut(w).zip(&token_ids).enumerate() {
            let p = r % d.t;
            for ((v, &a), &b) in row.iter_mut().zip(&tok[id * w..(id + 1) * w]).zip(&pos[p * w..(p + 1) * w]) {
                *v = a + b;
            }
        }
    }
    let mut blocks = Vec::with_capacity(layers);
    for u in units.start.max(1)..units.end.min(layers + 1) {
        blocks.push(block_forward(isa, &params[at(u)..at(u + 1)], d, &mut x));
    }
    let mut ln_f = None;
    if units.end == unit_count(layers) {
        let last = at(layers + 1);
        let normed = normed(isa, &x, &params[last], &params[last + 1]);
        let mut logits = Scratch::output(rows * params[last + 2].shape[1]);
        linear(isa, &normed.out, rows, &params[last + 2], &params[last + 3], &mut logits);
        (x, ln_f) = (logits, Some(normed));
    }
    Units { units, d, tokens: token_ids, blocks, ln_f, out: x }
}

/// One block on the residual stream `x` (changed in place), with `p` its tensors.
///
/// Every step of a block works row by row except attention, which works sequence by
/// sequence, so a task of the thread pool takes a group of whole sequences through the
/// whole block: one hand-off per block rather than one per step, and the group's values
/// stay in the core's caches between the steps. Two groups per thread balance the load
/// while each product still has rows enough to pay for packing its weight. A row's values
/// are those of a pass over all rows at once (no kernel's order depends on how many rows
/// it is given).
fn block_forward(isa: Isa, p: &[NamedTensor], d: Dims, x: &mut [f32]) -> BlockCache {
    let (rows, w, hidden) = (d.rows(), d.w, p[FC].shape[1]);
    let mut c = BlockCache {
        ln1: Normed::output(rows, w),
        qkv: Scratch::output(rows * 3 * w),
        probs: Scratch::output(d.n * d.heads.heads * d.heads.probs_per_head()),
        attended: Scratch::output(rows * w),
        ln2: Normed::output(rows, w),
        activated: Scratch::output(rows * hidden),
        slope: Scratch::output(rows * hidden),
    };
    let per_group = d.n.div_ceil(2 * rayon::current_num_threads());
    groups(&mut c, x, d.n, per_group).into_par_iter().for_each(|g| group_forward(isa, p, d, g));
    c
}

/// A group of sequences' rows of a block's cache and of the residual stream.
struct GroupRows<'a> {
    x: &'a mut [f32],
    /// The first layer norm's output, normalised values and reciprocal deviations.
    ln1: [&'a mut [f32]; 3],
    qkv: &'a mut [f32],
    probs: &'a mut [f32],
    attended: &'a mut [f32],
    ln2: [&'a mut [f32]; 3],
    activated: &'a mut [f32],
    slope: &'a mut [f32],
}

/// The rows in `c` and `x` of `n` sequences, by groups of `per_group` (the last one may
/// be shorter).
fn groups<'a>(c: &'a mut BlockCache, x: &'a mut [f32], n: usize, per_group: usize) -> Vec<GroupRows<'a>> {
    let split = |buf: &'a mut [f32]| buf.chunks_mut(buf.len() / n * per_group);
    let [mut xs, mut qkv, mut probs, mut attended, mut activated, mut slope] =
        [x, &mut c.qkv, &mut c.probs, &mut c.attended, &mut c.activated, &mut c.slope].map(split);
    let mut ln1 = [&mut c.ln1.out, &mut c.ln1.xhat, &mut c.ln1.rstd].map(|b| split(b));
    let mut ln2 = [&mut c.ln2.out, &mut c.ln2.xhat, &mut c.ln2.rstd].map(|b| split(b));
    let mut next = |parts: &mut std::slice::ChunksMut<'a, f32>| parts.next().expect("a part per group");
    (0..n.div_ceil(per_group))
        .map(|_| GroupRows {
            x: next(&mut xs),
            ln1: ln1.each_mut().map(&mut next),
            qkv: next(&mut qkv),
            probs: next(&mut probs),
            attended: next(&mut attended),
            ln2: ln2.each_mut().map(&mut next),
            activated: next(&mut activated),
            slope: next(&mut slope),
        })
        .collect()
}

/// The block's steps on a group of sequences (`d` is the whole batch's).
fn group_forward(isa: Isa, p: &[NamedTensor], d: Dims, s: GroupRows<'_>) {
    let (w, heads) = (d.w, d.heads);
    let rows = s.x.len() / w;
    let [out1, xhat1, rstd1] = s.ln1;
    norm::forward(isa, s.x, &p[LN1].data, &p[LN1 + 1].data, out1, xhat1, rstd1);
    linear(isa, out1, rows, &p[QKV], &p[QKV + 1], s.qkv);
    attention::forward(isa, heads, s.qkv, s.attended, s.probs);
    let mut branch = Scratch::output(rows * w);
    linear(isa, s.attended, rows, &p[PROJ], &p[PROJ + 1], &mut branch);
    add(s.x, &branch);
    let [out2, xhat2, rstd2] = s.ln2;
    norm::forward(isa, s.x, &p[LN2].data, &p[LN2 + 1].data, out2, xhat2, rstd2);
    let mut hidden = Scratch::output(s.activated.len());
    linear(isa, out2, rows, &p[FC], &p[FC + 1], &mut hidden);
    gelu::gelu_with_slope(isa, &hidden, s.activated, s.slope);
    linear(isa, s.activated, rows, &p[OUT], &p[OUT + 1], &mut branch);
    add(s.x, &branch);
}

/// The backward pass of a layer norm whose gamma is tensor `index`: its input's gradient
/// added into `dx`.
fn norm_backward(
    isa: Isa,
    params: &[NamedTensor],
    index: usize,
    n: &Normed,
    dy: &[f32],
    grads: &mut GradBuffer,
    dx: &mut [f32],
) {
    let mut d_in = Scratch::output(dy.len());
    let (dgamma, dbeta) = grads.grad_pair_mut(index);
    norm::backward(isa, dy, &params[index].data, &n.xhat, &n.rstd, &mut d_in, dgamma, dbeta);
    add_into(dx, &d_in);
}

/// The backward pass of the linear layer whose weight is tensor `index`, on input `x`:
/// its input's gradient.
fn dense_backward(
    isa: Isa,
    params: &[NamedTensor],
    index: usize,
    x: &[f32],
    dy: &[f32],
    grads: &mut GradBuffer,
) -> Scratch {
    let (n, d_in) = (x.len() / params[index].shape[0], params[index].shape[0]);
    let mut dx = Scratch::output(n * d_in);
    let (dw, db) = grads.grad_pair_mut(index);
    linear_backward(isa, x, n, &params[index], dy, dw, db, Some(&mut dx));
    dx
}

/// The backward pass of [`forward_units`] for `dy`, the gradient of the logits when the
/// final unit ran, otherwise of the residual stream it left: the units' gradients go into
/// `grads` (their tensors in order), and the residual stream's gradient at the units'
/// input is returned (empty when the embedding unit ran).
pub(in crate::model) fn backward_units(
    isa: Isa,
    params: &[NamedTensor],
    fwd: &Units,
    dy: &[f32],
    grads: &mut GradBuffer,
) -> Vec<f32> {
    let (d, units) = (fwd.d, &fwd.units);
    let at = |u: usize| unit_tensor(d.layers, u) - unit_tensor(d.layers, units.start);
    // The residual stream's gradient, from the top down.
    let mut dx;
    if let Some(ln_f) = &fwd.ln_f {
        let last = at(d.layers + 1);
        let d_final = dense_backward(isa, params, last + 2, &ln_f.out, dy, grads);
        dx = Scratch::zeros(d.rows() * d.w);
        norm_backward(isa, params, last, ln_f, &d_final, grads, &mut dx);
    } else {
        dx = Scratch::output(dy.len());
        dx.copy_from_slice(dy);
    }
    let first_block = units.start.max(1);
    for (j, c) in fwd.blocks.iter().enumerate().rev() {
        block_backward(isa, params, at(first_block + j), d, c, grads, &mut dx);
    }
    if units.start > 0 {
        return dx.into_vec();
    }
    // Each table row gathers its rows of dx in order; threads split the table's rows.
    let w = d.w;
    scatter_rows(&dx, w, |r| fwd.tokens[r], grads.grad_mut(0));
    scatter_rows(&dx, w, |r| r % d.t, grads.grad_mut(1));
    Vec::new()
}

/// `table = 0`, then `table[row_of(r)] += dx[r]` for the rows `r` of `dx` (of `w` values)
/// in order: a task owns a band of the table's rows and adds the rows of `dx` that fall in it.
fn scatter_rows(dx: &[f32], w: usize, row_of: impl Fn(usize) -> usize + Sync, table: &mut [f32]) {
    let band = (table.len() / w).div_ceil(rayon::current_num_threads()).max(1);
    let sources: Vec<usize> = (0..dx.len() / w).map(row_of).collect();
    table.par_chunks_mut(band * w).enumerate().for_each(|(b, rows)| {
        rows.fill(0.0);
        let owned = b * band..b * band + rows.len() / w;
        for (row, &to) in dx.chunks_exact(w).zip(&sources) {
            if owned.contains(&to) {
                let at = (to - owned.start) * w;
                for (t, &v) in rows[at..at + w].iter_mut().zip(row) {
                    *t += v;
                }
            }
        }
    });
}

/// The backward pass of the block whose first tensor is `first`, with `dx` the residual
/// stream's gradient above it (changed in place to the gradient below it).
fn block_backward(
    isa: Isa,
    params: &[NamedTensor],
    first: usize,
    d: Dims,
    c: &BlockCache,
    grads: &mut GradBuffer,
    dx: &mut [f32],
) {
    let mut dhidden = dense_backward(isa, params, first + OUT, &c.activated, dx, grads);
    dhidden.par_chunks_mut(ELEMENTWISE_CHUNK).zip(c.slope.par_chunks(ELEMENTWISE_CHUNK)).for_each(|(g, s)| {
        for (g, &s) in g.iter_mut().zip(s) {
            *g *= s;
        }
    });
    let dln2 = dense_backward(isa, params, first + FC, &c.ln2.out, &dhidden, grads);
    norm_backward(isa, params, first + LN2, &c.ln2, &dln2, grads, dx);
    let dattended = dense_backward(isa, params, first + PROJ, &c.attended, dx, grads);
    let mut dqkv = Scratch::output(c.qkv.len());
    attention::backward(isa, d.heads, &c.qkv, &c.probs, &dattended, &mut dqkv);
    let dln1 = dense_backward(isa, params, first + QKV, &c.ln1.out, &dqkv, grads);
    norm_backward(isa, params, first + LN1, &c.ln1, &dln1, grads, dx);
}

/// Forward and backward on `n` sequences of tokens `x` with targets `y`: the loss (sum of
/// per-token cross-entropy divided by `denominator`) and the gradients into `grads`.
pub(in crate::model) fn loss_and_grads(
    isa: Isa,
    params: &[NamedTensor],
    heads: usize,
    (n, x, y): (usize, &[i64], &[i64]),
    denominator: usize,
    grads: &mut GradBuffer,
) {
    let layers = layers_of(params);
    let fwd = forward_units(isa, params, (layers, heads), 0..unit_count(layers), (n, x), Vec::new());
    let (total, dlogits) = loss_gradient(fwd.output(), fwd.d.rows(), y, denominator);
    backward_units(isa, params, &fwd, &dlogits, grads);
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions over the tokens of `n` sequences.
pub(in crate::model) fn evaluate(
    isa: Isa,
    params: &[NamedTensor],
    heads: usize,
    (n, x, y): (usize, &[i64], &[i64]),
) -> EvalSums {
    let layers = layers_of(params);
    let fwd = forward_units(isa, params, (layers, heads), 0..unit_count(layers), (n, x), Vec::new());
    score(fwd.output(), fwd.d.rows(), y)
}

#[cfg(test)]
mod tests {
    use burn::prelude::Device;

    use super::*;
    use crate::grad::GradLayout;
    use crate::model::{GptConfig, Model, ModelKind};

    /// The loss and gradients of one step on a small GPT, as bits.
    fn step(params: &[NamedTensor], heads: usize, x: &[i64], y: &[i64]) -> Vec<u32> {
        let mut grads = GradBuffer::zeros(std::sync::Arc::new(GradLayout::of(params)));
        loss_and_grads(Isa::detect(), params, heads, (5, x, y), 5 * 40, &mut grads);
        std::iter::once(grads.loss()).chain(grads.grads().iter().copied()).map(f32::to_bits).collect()
    }

    #[test]
    fn reused_buffers_never_reach_a_result() {
        // Five sequences of 40 tokens: groups of unequal size, two causal blocks, the
        // second cut short.
        let config = GptConfig { layers: 2, context: 40, ..GptConfig::small(10) };
        let model = Model::new(ModelKind::Gpt, 3, config, 16, &Device::flex().autodiff());
        let params = model.params();
        let x: Vec<i64> = (0..200).map(|i| (i * 7 % 10) as i64).collect();
        let y: Vec<i64> = (0..200).map(|i| (i * 3 % 10) as i64).collect();
        let first = step(&params, config.heads, &x, &y);
        // Every buffer the step handed back now holds NaN; a value read before it is
        // written would make the second step differ.
        super::super::scratch::poison();
        assert_eq!(step(&params, config.heads, &x, &y), first);
        assert!(first.iter().all(|&b| f32::from_bits(b).is_finite()));
        // And the groups a thread count makes change nothing either.
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            assert_eq!(pool.install(|| step(&params, config.heads, &x, &y)), first, "{threads} threads");
        }
    }
}
