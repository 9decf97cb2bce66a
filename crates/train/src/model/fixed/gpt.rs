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

use kernels::Isa;
use kernels::attention::{self, Heads};
use kernels::{gelu, norm};
use rayon::prelude::*;

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
/// Elements per task of GELU's parallel loop.
const GELU_CHUNK: usize = 1 << 14;

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

    /// Index of the first tensor of block `b`.
    fn block(&self, b: usize) -> usize {
        2 + BLOCK.len() * b
    }

    /// Index of `ln_f.gamma`; `ln_f.beta`, `head.weight` and `head.bias` follow.
    fn last(&self) -> usize {
        self.block(self.layers)
    }
}

/// Checks the parameters' names and reads the sizes from their shapes.
fn dims(params: &[NamedTensor], heads: usize, n: usize, tokens: usize) -> Dims {
    let layers = params.len().saturating_sub(6) / BLOCK.len();
    let mut expected = vec!["model.tok.weight".to_owned(), "model.pos.weight".to_owned()];
    for b in 0..layers {
        expected.extend(BLOCK.iter().map(|p| format!("model.blocks.{b}.{p}")));
    }
    expected.extend(["ln_f.gamma", "ln_f.beta", "head.weight", "head.bias"].map(|p| format!("model.{p}")));
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, expected, "the GPT's parameters are not in the expected order");
    let w = params[0].shape[1];
    assert!(n > 0 && tokens.is_multiple_of(n), "{tokens} tokens are not {n} sequences");
    let t = tokens / n;
    assert!(t <= params[1].shape[0], "{t} tokens per sequence exceed the context of {}", params[1].shape[0]);
    Dims { n, t, w, layers, heads: Heads { tokens: t, heads, head_dim: w / heads } }
}

/// A layer norm's output and what its backward pass needs.
struct Normed {
    out: Vec<f32>,
    xhat: Vec<f32>,
    rstd: Vec<f32>,
}

fn normed(isa: Isa, x: &[f32], gamma: &NamedTensor, beta: &NamedTensor) -> Normed {
    let rows = x.len() / gamma.data.len();
    let mut n = Normed { out: vec![0.0; x.len()], xhat: vec![0.0; x.len()], rstd: vec![0.0; rows] };
    norm::forward(isa, x, &gamma.data, &beta.data, &mut n.out, &mut n.xhat, &mut n.rstd);
    n
}

/// What a block's backward pass needs from its forward pass.
struct BlockCache {
    ln1: Normed,
    qkv: Vec<f32>,
    probs: Vec<f32>,
    attended: Vec<f32>,
    ln2: Normed,
    activated: Vec<f32>,
    slope: Vec<f32>,
}

struct Forward {
    blocks: Vec<BlockCache>,
    ln_f: Normed,
    logits: Vec<f32>,
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
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

fn forward(isa: Isa, params: &[NamedTensor], d: Dims, tokens: &[usize]) -> Forward {
    let (rows, w) = (d.rows(), d.w);
    let (tok, pos) = (&params[0].data, &params[1].data);
    let mut x = vec![0.0f32; rows * w];
    for (r, (row, &id)) in x.chunks_exact_mut(w).zip(tokens).enumerate() {
        let p = r % d.t;
        for ((v, &a), &b) in row.iter_mut().zip(&tok[id * w..(id + 1) * w]).zip(&pos[p * w..(p + 1) * w]) {
            *v = a + b;
        }
    }
    let mut blocks = Vec::with_capacity(d.layers);
    for b in 0..d.layers {
        let p = &params[d.block(b)..d.block(b + 1)];
        let ln1 = normed(isa, &x, &p[LN1], &p[LN1 + 1]);
        let mut qkv = Vec::new();
        linear(isa, &ln1.out, rows, &p[QKV], &p[QKV + 1], &mut qkv);
        let (mut attended, mut probs) = (vec![0.0; rows * w], vec![0.0; d.n * d.heads.heads * d.t * d.t]);
        attention::forward(isa, d.heads, &qkv, &mut attended, &mut probs);
        let mut branch = Vec::new();
        linear(isa, &attended, rows, &p[PROJ], &p[PROJ + 1], &mut branch);
        add_into(&mut x, &branch);
        let ln2 = normed(isa, &x, &p[LN2], &p[LN2 + 1]);
        let mut hidden = Vec::new();
        linear(isa, &ln2.out, rows, &p[FC], &p[FC + 1], &mut hidden);
        let (mut activated, mut slope) = (vec![0.0; hidden.len()], vec![0.0; hidden.len()]);
        (hidden.par_chunks(GELU_CHUNK), activated.par_chunks_mut(GELU_CHUNK), slope.par_chunks_mut(GELU_CHUNK))
            .into_par_iter()
            .for_each(|(h, a, s)| gelu::gelu_with_slope(isa, h, a, s));
        linear(isa, &activated, rows, &p[OUT], &p[OUT + 1], &mut branch);
        add_into(&mut x, &branch);
        blocks.push(BlockCache { ln1, qkv, probs, attended, ln2, activated, slope });
    }
    let last = d.last();
    let ln_f = normed(isa, &x, &params[last], &params[last + 1]);
    let mut logits = Vec::new();
    linear(isa, &ln_f.out, rows, &params[last + 2], &params[last + 3], &mut logits);
    Forward { blocks, ln_f, logits }
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
    let mut d_in = vec![0.0; dy.len()];
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
) -> Vec<f32> {
    let mut dx = Vec::new();
    let (dw, db) = grads.grad_pair_mut(index);
    linear_backward(isa, x, x.len() / params[index].shape[0], &params[index], dy, dw, db, Some(&mut dx));
    dx
}

fn backward(
    isa: Isa,
    params: &[NamedTensor],
    d: Dims,
    tokens: &[usize],
    fwd: &Forward,
    dlogits: &[f32],
    grads: &mut GradBuffer,
) {
    let (rows, w) = (d.rows(), d.w);
    let last = d.last();
    let d_final = dense_backward(isa, params, last + 2, &fwd.ln_f.out, dlogits, grads);
    // The residual stream's gradient, from the top block down.
    let mut dx = vec![0.0; rows * w];
    norm_backward(isa, params, last, &fwd.ln_f, &d_final, grads, &mut dx);
    for (b, c) in fwd.blocks.iter().enumerate().rev() {
        let first = d.block(b);
        let mut dhidden = dense_backward(isa, params, first + OUT, &c.activated, &dx, grads);
        for (g, &s) in dhidden.iter_mut().zip(&c.slope) {
            *g *= s;
        }
        let dln2 = dense_backward(isa, params, first + FC, &c.ln2.out, &dhidden, grads);
        norm_backward(isa, params, first + LN2, &c.ln2, &dln2, grads, &mut dx);
        let dattended = dense_backward(isa, params, first + PROJ, &c.attended, &dx, grads);
        let mut dqkv = vec![0.0; c.qkv.len()];
        attention::backward(isa, d.heads, &c.qkv, &c.probs, &dattended, &mut dqkv);
        let dln1 = dense_backward(isa, params, first + QKV, &c.ln1.out, &dqkv, grads);
        norm_backward(isa, params, first + LN1, &c.ln1, &dln1, grads, &mut dx);
    }
    let dtok = grads.grad_mut(0);
    dtok.fill(0.0);
    for (row, &id) in dx.chunks_exact(w).zip(tokens) {
        add_into(&mut dtok[id * w..(id + 1) * w], row);
    }
    let dpos = grads.grad_mut(1);
    dpos.fill(0.0);
    for (r, row) in dx.chunks_exact(w).enumerate() {
        let p = r % d.t;
        add_into(&mut dpos[p * w..(p + 1) * w], row);
    }
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
    let d = dims(params, heads, n, x.len());
    let tokens = token_rows(x, params[0].shape[0]);
    let fwd = forward(isa, params, d, &tokens);
    let (total, dlogits) = loss_gradient(&fwd.logits, d.rows(), y, denominator);
    backward(isa, params, d, &tokens, &fwd, &dlogits, grads);
    grads.set_loss(total / denominator as f32);
}

/// Loss sum and correct arg-max predictions over the tokens of `n` sequences.
pub(in crate::model) fn evaluate(
    isa: Isa,
    params: &[NamedTensor],
    heads: usize,
    (n, x, y): (usize, &[i64], &[i64]),
) -> EvalSums {
    let d = dims(params, heads, n, x.len());
    let fwd = forward(isa, params, d, &token_rows(x, params[0].shape[0]));
    score(&fwd.logits, d.rows(), y)
}
