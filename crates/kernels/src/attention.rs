//! Causal multi-head self-attention, forward and backward, in a fixed order.
//!
//! The input is the query-key-value projection of `n` sequences of `t` tokens: row `r`
//! of `qkv` holds `3 * w` values, the queries of every head, then the keys, then the
//! values (`w = heads * head_dim`, head `h` at columns `h * head_dim..`). The output row
//! holds each head's result at the same columns, as a transformer's output projection
//! expects.
//!
//! # Order of operations
//!
//! For one sequence and head, with `Q`, `K`, `V` its `t x head_dim` blocks and
//! `s = sqrt(head_dim)`:
//!
//! ```text
//! S = Q · Kᵀ                         (crate::gemm: one fma chain per element)
//! P[i][j] = softmax_j(S[i][j] / s)   for j <= i, 0 above the diagonal
//! Y = P · V
//! ```
//!
//! where a row's softmax takes its maximum `m`, `e[j] = exp(S[i][j] / s - m)`
//! ([`crate::math`]'s exponential), their sum in [`sum8`]'s order, and `e[j] / sum`. The
//! backward pass, for the gradient `dY`:
//!
//! ```text
//! dP = dY · Vᵀ     dV = Pᵀ · dY
//! dS[i][j] = P[i][j] * (dP[i][j] - dot8(P[i], dP[i])) / s     (0 above the diagonal)
//! dQ = dS · K      dK = dSᵀ · Q
//! ```
//!
//! Sequences are independent tasks of the thread pool and heads run in order within one,
//! so neither the thread count nor the instruction set changes a bit.

use rayon::prelude::*;

use crate::Isa;
use crate::gemm::{MatRef, matmul};
use crate::lanes::per_isa;
use crate::math::exp_lanes;
use crate::rows::{dot8, sum8};

/// The shape of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Tokens per sequence.
    pub tokens: usize,
    /// Heads.
    pub heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl Heads {
    /// Width of the output rows: `heads * head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    fn scale(&self) -> f32 {
        (self.head_dim as f32).sqrt()
    }

    /// The sequences in `qkv`, checking the lengths of `qkv` and the other buffers.
    fn sequences(&self, qkv: usize, out: usize, probs: usize) -> usize {
        let (t, w) = (self.tokens, self.width());
        assert!(t > 0 && w > 0, "{self:?} is empty");
        assert!(qkv.is_multiple_of(t * 3 * w), "{qkv} values are not sequences of {t} rows of {}", 3 * w);
        let n = qkv / (t * 3 * w);
        assert_eq!(out, n * t * w, "{n} sequences have {} output values", n * t * w);
        assert_eq!(probs, n * self.heads * t * t, "{n} sequences have {} probabilities", n * self.heads * t * t);
        n
    }
}

per_isa! {
    /// Turns each row `i` of the `t x t` scores into the causal softmax of `scores / scale`.
    fn causal_softmax(p: &mut [f32], t: usize, scale: f32) {
        for (i, row) in p.chunks_exact_mut(t).enumerate() {
            let (kept, masked) = row.split_at_mut(i + 1);
            masked.fill(0.0);
            let mut m = f32::NEG_INFINITY;
            for v in kept.iter_mut() {
                *v /= scale;
                m = m.max(*v);
            }
            for v in kept.iter_mut() {
                *v = exp_lanes(*v - m);
            }
            let sum = sum8(kept);
            for v in kept.iter_mut() {
                *v /= sum;
            }
        }
    }
}

per_isa! {
    /// Turns `dp`, the gradient of the probabilities `p`, into the gradient of the raw
    /// scores.
    fn causal_softmax_backward(p: &[f32], dp: &mut [f32], t: usize, scale: f32) {
        for (i, (p, dp)) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)).enumerate() {
            let c = dot8(&p[..=i], &dp[..=i]);
            for (g, &q) in dp[..=i].iter_mut().zip(p) {
                *g = q * (*g - c) / scale;
            }
            dp[i + 1..].fill(0.0);
        }
    }
}

/// Copies a `t x head_dim` block into columns `column..` of rows of `stride` values.
fn scatter(block: &[f32], head_dim: usize, rows: &mut [f32], stride: usize, column: usize) {
    for (src, dst) in block.chunks_exact(head_dim).zip(rows.chunks_exact_mut(stride)) {
        dst[column..column + head_dim].copy_from_slice(src);
    }
}

/// The attention of every sequence in `qkv`: the output rows in `y` (`t` rows of `w` per
/// sequence) and the probabilities in `probs` (`heads` blocks of `t x t` per sequence,
/// kept for [`backward`]).
///
/// # Panics
/// If the lengths disagree with `shape` or `isa` is not available.
pub fn forward(isa: Isa, shape: Heads, qkv: &[f32], y: &mut [f32], probs: &mut [f32]) {
    shape.sequences(qkv.len(), y.len(), probs.len());
    let (t, w, dh) = (shape.tokens, shape.width(), shape.head_dim);
    (qkv.par_chunks(t * 3 * w), y.par_chunks_mut(t * w), probs.par_chunks_mut(shape.heads * t * t))
        .into_par_iter()
        .for_each(|(qkv, y, probs)| {
            let mut block = vec![0.0f32; t * dh];
            for (h, p) in probs.chunks_exact_mut(t * t).enumerate() {
                let part = |s: usize| MatRef::strided(&qkv[s * w + h * dh..], t, dh, 3 * w, 1);
                matmul(isa, part(0), part(1).t(), p);
                causal_softmax(isa, p, t, shape.scale());
                matmul(isa, MatRef::row_major(p, t, t), part(2), &mut block);
                scatter(&block, dh, y, w, h * dh);
            }
        });
}

/// The gradient `dqkv` of [`forward`]'s input for the gradient `dy` of its output, from
/// the same `qkv` and the `probs` that [`forward`] kept.
///
/// # Panics
/// If the lengths disagree with `shape` or `isa` is not available.
pub fn backward(isa: Isa, shape: Heads, qkv: &[f32], probs: &[f32], dy: &[f32], dqkv: &mut [f32]) {
    shape.sequences(qkv.len(), dy.len(), probs.len());
    assert_eq!(dqkv.len(), qkv.len(), "the gradient has the input's shape");
    let (t, w, dh) = (shape.tokens, shape.width(), shape.head_dim);
    (
        qkv.par_chunks(t * 3 * w),
        probs.par_chunks(shape.heads * t * t),
        dy.par_chunks(t * w),
        dqkv.par_chunks_mut(t * 3 * w),
    )
        .into_par_iter()
        .for_each(|(qkv, probs, dy, dqkv)| {
            let (mut ds, mut block) = (vec![0.0f32; t * t], vec![0.0f32; t * dh]);
            for (h, p) in probs.chunks_exact(t * t).enumerate() {
                let part = |s: usize| MatRef::strided(&qkv[s * w + h * dh..], t, dh, 3 * w, 1);
                let (dy, p_m) = (MatRef::strided(&dy[h * dh..], t, dh, w, 1), MatRef::row_major(p, t, t));
                matmul(isa, dy, part(2).t(), &mut ds);
                matmul(isa, p_m.t(), dy, &mut block);
                scatter(&block, dh, dqkv, 3 * w, 2 * w + h * dh);
                causal_softmax_backward(isa, p, &mut ds, t, shape.scale());
                let ds_m = MatRef::row_major(&ds, t, t);
                matmul(isa, ds_m, part(1), &mut block);
                scatter(&block, dh, dqkv, 3 * w, h * dh);
                matmul(isa, ds_m.t(), part(0), &mut block);
                scatter(&block, dh, dqkv, 3 * w, w + h * dh);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::testing::uniform(len, seed, 3.0)
    }

    /// `sum(w * attention(qkv))` in f64, by the definition.
    fn objective(shape: Heads, qkv: &[f64], wts: &[f32]) -> f64 {
        let (t, w, dh) = (shape.tokens, shape.width(), shape.head_dim);
        let n = qkv.len() / (t * 3 * w);
        let mut total = 0.0;
        for b in 0..n {
            for h in 0..shape.heads {
                let at = |i: usize, s: usize, c: usize| qkv[(b * t + i) * 3 * w + s * w + h * dh + c];
                for i in 0..t {
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| (0..dh).map(|c| at(i, 0, c) * at(j, 1, c)).sum::<f64>() / (dh as f64).sqrt())
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for c in 0..dh {
                        let yv: f64 = (0..=i).map(|j| e[j] / sum * at(j, 2, c)).sum();
                        total += f64::from(wts[(b * t + i) * w + h * dh + c]) * yv;
                    }
                }
            }
        }
        total
    }

    #[test]
    fn forward_and_backward_match_the_definition_in_f64() {
        let shape = Heads { tokens: 5, heads: 2, head_dim: 3 };
        let (n, t, w) = (2, shape.tokens, shape.width());
        let qkv = values(n * t * 3 * w, 1);
        let wts = values(n * t * w, 2);
        let (mut y, mut probs) = (vec![0.0; n * t * w], vec![0.0; n * shape.heads * t * t]);
        forward(Isa::Scalar, shape, &qkv, &mut y, &mut probs);
        let mut dqkv = vec![f32::NAN; qkv.len()];
        backward(Isa::Scalar, shape, &qkv, &probs, &wts, &mut dqkv);
        let base: Vec<f64> = qkv.iter().map(|&v| f64::from(v)).collect();
        for (e, &got) in y.iter().enumerate() {
            let mut unit = vec![0.0f32; y.len()];
            unit[e] = 1.0;
            let want = objective(shape, &base, &unit);
            assert!((f64::from(got) - want).abs() < 1e-5, "y[{e}] = {got}, expected {want}");
        }
        for (e, &got) in dqkv.iter().enumerate() {
            let h = 1e-5;
            let (mut up, mut down) = (base.clone(), base.clone());
            up[e] += h;
            down[e] -= h;
            let numeric = (objective(shape, &up, &wts) - objective(shape, &down, &wts)) / (2.0 * h);
            assert!(
                (f64::from(got) - numeric).abs() < 1e-4 * numeric.abs().max(1.0),
                "dqkv[{e}] = {got}, expected {numeric}"
            );
        }
        // Probabilities above the diagonal are exactly zero, and each row sums to one.
        for row in probs.chunks_exact(t).enumerate().map(|(i, r)| (i % t, r)) {
            assert!(row.1[row.0 + 1..].iter().all(|&p| p == 0.0));
            assert!((row.1.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn paths_and_thread_counts_give_the_same_bits() {
        // 17 tokens and a head of 5 values: below and across every vector width.
        let shape = Heads { tokens: 17, heads: 3, head_dim: 5 };
        let n = 4;
        let (t, w) = (shape.tokens, shape.width());
        let (qkv, dy) = (values(n * t * 3 * w, 3), values(n * t * w, 4));
        let run = |isa: Isa| {
            let (mut y, mut probs) = (vec![0.0; n * t * w], vec![0.0; n * shape.heads * t * t]);
            forward(isa, shape, &qkv, &mut y, &mut probs);
            let mut dqkv = vec![0.0; qkv.len()];
            backward(isa, shape, &qkv, &probs, &dy, &mut dqkv);
            [y, probs, dqkv].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
        };
        let want = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| run(Isa::Scalar));
        for isa in Isa::all_available() {
            let got = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap().install(|| run(isa));
            assert_eq!(got, want, "{isa}");
        }
    }

    #[test]
    fn a_nan_query_poisons_its_own_row_only() {
        let shape = Heads { tokens: 3, heads: 1, head_dim: 2 };
        let mut qkv = values(3 * 3 * 2, 5);
        qkv[3 * 2] = f32::NAN; // the query of token 1
        let (mut y, mut probs) = (vec![0.0; 3 * 2], vec![0.0; 9]);
        forward(Isa::Scalar, shape, &qkv, &mut y, &mut probs);
        assert!(y[..2].iter().all(|v| v.is_finite()));
        assert!(y[2..4].iter().all(|v| v.is_nan()));
        assert!(y[4..].iter().all(|v| v.is_finite()), "token 2 does not read token 1's query");
    }
}
