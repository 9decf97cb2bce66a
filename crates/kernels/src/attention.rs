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
//!
//! # Causal blocks
//!
//! Half of `S` and `P` lies above the diagonal, and nothing there reaches a result. The
//! rows go by blocks of [`BLOCK_ROWS`] queries, and a block's products stop at the keys up to
//! its last row: block `[i0, i1)` computes `S` and `P` for keys `0..i1` only, and its rows of
//! `Y` are `P[i0..i1, 0..i1] · V[0..i1]`. Each element's chain is the one above with the terms
//! past `i1` left out, and those terms are exact zeros (`P[i][j] = 0` for `j > i`), which
//! leave a finite sum unchanged: the blocks change no bit of a finite result. (A chain
//! whose every term is `-0` would end `+0` had the zeros been added; and a NaN or infinite
//! value of a later token no longer reaches the rows of an earlier block through a zero
//! weight.) In the backward pass `dV` and `dK` gather the blocks' terms in row order, each
//! block going on from the sum of the blocks before it ([`crate::gemm::matmul_add`]), with
//! only leading zeros left out. `probs` holds each head's blocks one after the other, block
//! `[i0, i1)` as `(i1 - i0) x i1` values ([`Heads::probs_per_head`]).

use rayon::prelude::*;

use crate::Isa;
use crate::gemm::{MatRef, matmul, matmul_add};
use crate::lanes::per_isa;
use crate::math::exp_lanes;
use crate::rows::{dot8, sum8};

/// Queries per causal block (see the module documentation): a multiple of every path's
/// tile height, so that a block's products fill whole tiles.
pub const BLOCK_ROWS: usize = 24;

/// The causal blocks of `t` tokens: `(i0, i1, offset)` with `offset` where the block's
/// probabilities start within the head's.
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..t).step_by(BLOCK_ROWS).scan(0, move |offset, i0| {
        let i1 = (i0 + BLOCK_ROWS).min(t);
        let at = *offset;
        *offset += (i1 - i0) * i1;
        Some((i0, i1, at))
    })
}

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

    /// The probabilities one sequence's head keeps: its causal blocks' `(i1 - i0) x i1`
    /// values each (about half of `tokens²`).
    pub fn probs_per_head(&self) -> usize {
        blocks(self.tokens).map(|(i0, i1, _)| (i1 - i0) * i1).sum()
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
        let kept = n * self.heads * self.probs_per_head();
        assert_eq!(probs, kept, "{n} sequences keep {kept} probabilities");
        n
    }
}

per_isa! {
    /// Turns each row of the scores of a causal block, rows `i0..` of `t` keys, into the
    /// causal softmax of `scores / scale`.
    fn causal_softmax(p: &mut [f32], i0: usize, t: usize, scale: f32) {
        for (i, row) in p.chunks_exact_mut(t).enumerate().map(|(r, row)| (i0 + r, row)) {
            let (kept, masked) = row.split_at_mut(i + 1);
            masked.fill(0.0);
            for v in kept.iter_mut() {
                *v /= scale;
            }
            let m = largest(kept);
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
    /// Turns `dp`, the gradient of a causal block's probabilities `p` (rows `i0..` of `t`
    /// keys), into the gradient of the raw scores.
    fn causal_softmax_backward(p: &[f32], dp: &mut [f32], i0: usize, t: usize, scale: f32) {
        for (i, (p, dp)) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)).enumerate().map(|(r, pair)| (i0 + r, pair)) {
            let c = dot8(&p[..=i], &dp[..=i]);
            for (g, &q) in dp[..=i].iter_mut().zip(p) {
                *g = q * (*g - c) / scale;
            }
            dp[i + 1..].fill(0.0);
        }
    }
}

/// The largest value of `x` that is not NaN (`-inf` when there is none). The maximum is
/// exact, so the order in which lanes meet changes nothing but possibly the sign of a zero
/// maximum, and `v - m` is the same for either zero; sixteen running maxima let the
/// compiler vectorise the loop, which a single running `f32::max` does not.
#[inline(always)]
fn largest(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut m = [f32::NEG_INFINITY; LANES];
    let (blocks, rest) = x.as_chunks::<LANES>();
    for block in blocks {
        for (m, &v) in m.iter_mut().zip(block) {
            *m = if v > *m { v } else { *m };
        }
    }
    for (m, &v) in m.iter_mut().zip(rest) {
        *m = if v > *m { v } else { *m };
    }
    m.into_iter().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

/// Copies a `t x head_dim` block into columns `column..` of rows of `stride` values.
fn scatter(block: &[f32], head_dim: usize, rows: &mut [f32], stride: usize, column: usize) {
    for (src, dst) in block.chunks_exact(head_dim).zip(rows.chunks_exact_mut(stride)) {
        dst[column..column + head_dim].copy_from_slice(src);
    }
}

/// The attention of every sequence in `qkv`: the output rows in `y` (`t` rows of `w` per
/// sequence) and the probabilities in `probs` (`heads` times [`Heads::probs_per_head`]
/// per sequence, kept for [`backward`]).
///
/// # Panics
/// If the lengths disagree with `shape` or `isa` is not available.
pub fn forward(isa: Isa, shape: Heads, qkv: &[f32], y: &mut [f32], probs: &mut [f32]) {
    shape.sequences(qkv.len(), y.len(), probs.len());
    let (t, w, dh) = (shape.tokens, shape.width(), shape.head_dim);
    let per_head = shape.probs_per_head();
    (qkv.par_chunks(t * 3 * w), y.par_chunks_mut(t * w), probs.par_chunks_mut(shape.heads * per_head))
        .into_par_iter()
        .for_each(|(qkv, y, probs)| {
            let mut block = vec![0.0f32; BLOCK_ROWS.min(t) * dh];
            for (h, probs) in probs.chunks_exact_mut(per_head).enumerate() {
                // Head h's queries, keys and values: rows `rows` of its columns.
                let part = |s: usize, rows: std::ops::Range<usize>| {
                    MatRef::strided(&qkv[rows.start * 3 * w + s * w + h * dh..], rows.len(), dh, 3 * w, 1)
                };
                for (i0, i1, at) in blocks(t) {
                    let (p, out) = (&mut probs[at..at + (i1 - i0) * i1], &mut block[..(i1 - i0) * dh]);
                    matmul(isa, part(0, i0..i1), part(1, 0..i1).t(), p);
                    causal_softmax(isa, p, i0, i1, shape.scale());
                    matmul(isa, MatRef::row_major(p, i1 - i0, i1), part(2, 0..i1), out);
                    scatter(out, dh, &mut y[i0 * w..], w, h * dh);
                }
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
    let per_head = shape.probs_per_head();
    (
        qkv.par_chunks(t * 3 * w),
        probs.par_chunks(shape.heads * per_head),
        dy.par_chunks(t * w),
        dqkv.par_chunks_mut(t * 3 * w),
    )
        .into_par_iter()
        .for_each(|(qkv, probs, dy, dqkv)| {
            let rows = BLOCK_ROWS.min(t);
            let (mut ds, mut block) = (vec![0.0f32; rows * t], vec![0.0f32; rows * dh]);
            let (mut dk, mut dv) = (vec![0.0f32; t * dh], vec![0.0f32; t * dh]);
            for (h, probs) in probs.chunks_exact(per_head).enumerate() {
                let part = |s: usize, rows: std::ops::Range<usize>| {
                    MatRef::strided(&qkv[rows.start * 3 * w + s * w + h * dh..], rows.len(), dh, 3 * w, 1)
                };
                dk.fill(0.0);
                dv.fill(0.0);
                for (i0, i1, at) in blocks(t) {
                    let (r, p) = (i1 - i0, &probs[at..at + (i1 - i0) * i1]);
                    let (dy, p_m) = (MatRef::strided(&dy[i0 * w + h * dh..], r, dh, w, 1), MatRef::row_major(p, r, i1));
                    let ds = &mut ds[..r * i1];
                    matmul(isa, dy, part(2, 0..i1).t(), ds);
                    matmul_add(isa, p_m.t(), dy, &mut dv[..i1 * dh]);
                    causal_softmax_backward(isa, p, ds, i0, i1, shape.scale());
                    let ds_m = MatRef::row_major(ds, r, i1);
                    let out = &mut block[..r * dh];
                    matmul(isa, ds_m, part(1, 0..i1), out);
                    scatter(out, dh, &mut dqkv[i0 * 3 * w..], 3 * w, h * dh);
                    matmul_add(isa, ds_m.t(), part(0, i0..i1), &mut dk[..i1 * dh]);
                }
                scatter(&dk, dh, dqkv, 3 * w, w + h * dh);
                scatter(&dv, dh, dqkv, 3 * w, 2 * w + h * dh);
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
        let (mut y, mut probs) = (vec![0.0; n * t * w], vec![0.0; n * shape.heads * shape.probs_per_head()]);
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
        // One block of 5 rows of 5 keys: above the diagonal exactly zero, each row sums to one.
        for row in probs.chunks_exact(t).enumerate().map(|(i, r)| (i % t, r)) {
            assert!(row.1[row.0 + 1..].iter().all(|&p| p == 0.0));
            assert!((row.1.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }

    /// Forward and backward over the whole `t x t` square of every head, the order of the
    /// module documentation without the causal blocks: `y`, `dqkv` and the kept part of
    /// each row of `P` (one row of `t` per query, zeros above the diagonal).
    fn unblocked(shape: Heads, qkv: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
        use crate::gemm::reference;
        let (t, w, dh) = (shape.tokens, shape.width(), shape.head_dim);
        let n = qkv.len() / (t * 3 * w);
        let (mut y, mut dqkv, mut rows) = (vec![0.0; n * t * w], vec![0.0; qkv.len()], Vec::new());
        let mut block = vec![0.0f32; t * dh];
        for b in 0..n {
            let (qkv, dy) = (&qkv[b * t * 3 * w..(b + 1) * t * 3 * w], &dy[b * t * w..(b + 1) * t * w]);
            for h in 0..shape.heads {
                let part = |s: usize| MatRef::strided(&qkv[s * w + h * dh..], t, dh, 3 * w, 1);
                let mut p = vec![0.0f32; t * t];
                reference(part(0), part(1).t(), &mut p);
                causal_softmax(Isa::Scalar, &mut p, 0, t, shape.scale());
                rows.extend_from_slice(&p);
                reference(MatRef::row_major(&p, t, t), part(2), &mut block);
                scatter(&block, dh, &mut y[b * t * w..], w, h * dh);
                let dy_h = MatRef::strided(&dy[h * dh..], t, dh, w, 1);
                let mut ds = vec![0.0f32; t * t];
                reference(dy_h, part(2).t(), &mut ds);
                reference(MatRef::row_major(&p, t, t).t(), dy_h, &mut block);
                let dqkv = &mut dqkv[b * t * 3 * w..];
                scatter(&block, dh, dqkv, 3 * w, 2 * w + h * dh);
                causal_softmax_backward(Isa::Scalar, &p, &mut ds, 0, t, shape.scale());
                reference(MatRef::row_major(&ds, t, t), part(1), &mut block);
                scatter(&block, dh, dqkv, 3 * w, h * dh);
                reference(MatRef::row_major(&ds, t, t).t(), part(0), &mut block);
                scatter(&block, dh, dqkv, 3 * w, w + h * dh);
            }
        }
        [y, dqkv, rows]
    }

    #[test]
    fn the_causal_blocks_change_no_bit_of_the_whole_square() {
        // Three blocks, the last cut short; a head of 7 values.
        let shape = Heads { tokens: 2 * BLOCK_ROWS + 5, heads: 2, head_dim: 7 };
        let (n, t, w) = (2, shape.tokens, shape.width());
        let (qkv, dy) = (values(n * t * 3 * w, 6), values(n * t * w, 7));
        let [want_y, want_dqkv, want_rows] = unblocked(shape, &qkv, &dy);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for isa in Isa::all_available() {
            let (mut y, mut probs) = (vec![0.0; n * t * w], vec![0.0; n * shape.heads * shape.probs_per_head()]);
            forward(isa, shape, &qkv, &mut y, &mut probs);
            let mut dqkv = vec![0.0; qkv.len()];
            backward(isa, shape, &qkv, &probs, &dy, &mut dqkv);
            assert_eq!(bits(&y), bits(&want_y), "{isa}");
            assert_eq!(bits(&dqkv), bits(&want_dqkv), "{isa}");
            // Each kept block row is the square's row up to the block's end.
            let mut kept = probs.iter();
            for square in want_rows.chunks_exact(t * t) {
                for (i0, i1, _) in blocks(t) {
                    for row in square[i0 * t..i1 * t].chunks_exact(t) {
                        let got: Vec<f32> = kept.by_ref().take(i1).copied().collect();
                        assert_eq!(bits(&got), bits(&row[..i1]), "{isa}");
                        assert!(row[i1..].iter().all(|&p| p == 0.0));
                    }
                }
            }
            assert!(kept.next().is_none());
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
            let (mut y, mut probs) = (vec![0.0; n * t * w], vec![0.0; n * shape.heads * shape.probs_per_head()]);
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
        let (mut y, mut probs) = (vec![0.0; 3 * 2], vec![0.0; shape.probs_per_head()]);
        forward(Isa::Scalar, shape, &qkv, &mut y, &mut probs);
        assert!(y[..2].iter().all(|v| v.is_finite()));
        assert!(y[2..4].iter().all(|v| v.is_nan()));
        assert!(y[4..].iter().all(|v| v.is_finite()), "token 2 does not read token 1's query");
    }
}
