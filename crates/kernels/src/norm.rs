//! Layer normalisation over rows, forward and backward, in a fixed order.
//!
//! For each row `x` of `d` values, with [`sum8`] and [`dot8`]'s order for every sum along
//! the row (eight chains, one fixed tree):
//!
//! ```text
//! mean    = sum8(x) / d
//! c[j]    = x[j] - mean
//! var     = dot8(c, c) / d
//! rstd    = 1 / sqrt(var + 1e-5)
//! xhat[j] = c[j] * rstd
//! y[j]    = xhat[j] * gamma[j] + beta[j]
//! ```
//!
//! and for the gradient `dy` of `y`:
//!
//! ```text
//! g[j]    = dy[j] * gamma[j]
//! a       = sum8(g) / d
//! b       = dot8(g, xhat) / d
//! dx[j]   = ((g[j] - a) - xhat[j] * b) * rstd
//! dgamma  = column sums over the rows, in row order from zero, of dy * xhat
//! dbeta   = column sums of dy, likewise
//! ```
//!
//! Every operation is correctly rounded (no fused multiply-add; `sqrt` is exact by IEEE
//! 754), so the bits do not depend on the CPU; rows are independent, so threads split
//! them freely.

use rayon::prelude::*;

use crate::Isa;
use crate::lanes::per_isa;
use crate::rows::{dot8, sum8};

/// Added to the variance before its square root.
pub const EPSILON: f32 = 1e-5;
/// Rows per task of the thread pool.
const ROWS_PER_TASK: usize = 64;

per_isa! {
    fn forward_rows(x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]) {
        let d = gamma.len();
        let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(xhat.chunks_exact_mut(d)).zip(rstd.iter_mut());
        for (((x, y), xhat), r) in rows {
            let mean = sum8(x) / d as f32;
            for (c, &v) in xhat.iter_mut().zip(x) {
                *c = v - mean;
            }
            *r = 1.0 / (dot8(xhat, xhat) / d as f32 + EPSILON).sqrt();
            for (((out, c), &g), &b) in y.iter_mut().zip(xhat.iter_mut()).zip(gamma).zip(beta) {
                *c *= *r;
                *out = *c * g + b;
            }
        }
    }
}

per_isa! {
    fn backward_rows(dy: &[f32], gamma: &[f32], xhat: &[f32], rstd: &[f32], dx: &mut [f32]) {
        let d = gamma.len();
        let rows = dy.chunks_exact(d).zip(xhat.chunks_exact(d)).zip(rstd).zip(dx.chunks_exact_mut(d));
        for (((dy, xhat), &r), dx) in rows {
            for ((g, &v), &w) in dx.iter_mut().zip(dy).zip(gamma) {
                *g = v * w;
            }
            let a = sum8(dx) / d as f32;
            let b = dot8(dx, xhat) / d as f32;
            for (g, &h) in dx.iter_mut().zip(xhat) {
                *g = ((*g - a) - h * b) * r;
            }
        }
    }
}

/// Normalises each row of `x` (rows of `gamma.len()` values): `y` the output, `xhat` the
/// normalised values and `rstd` each row's `1 / sqrt(var + eps)` (both kept for
/// [`backward`]).
///
/// # Panics
/// If the lengths disagree or `isa` is not available.
pub fn forward(isa: Isa, x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]) {
    let d = gamma.len();
    assert!(d > 0 && beta.len() == d, "gamma and beta have {d} and {} values", beta.len());
    assert!(x.len() == rstd.len() * d, "{} values are not {} rows of {d}", x.len(), rstd.len());
    assert!(y.len() == x.len() && xhat.len() == x.len(), "the outputs have the input's shape");
    let chunk = ROWS_PER_TASK * d;
    (x.par_chunks(chunk), y.par_chunks_mut(chunk), xhat.par_chunks_mut(chunk), rstd.par_chunks_mut(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|(x, y, xhat, rstd)| forward_rows(isa, x, gamma, beta, y, xhat, rstd));
}

/// The gradient `dx` of [`forward`]'s input for the gradient `dy` of its output, and the
/// gradients of `gamma` and `beta` (overwritten).
///
/// # Panics
/// If the lengths disagree or `isa` is not available.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    isa: Isa,
    dy: &[f32],
    gamma: &[f32],
    xhat: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let d = gamma.len();
    assert!(d > 0 && dgamma.len() == d && dbeta.len() == d, "gamma's gradients have {d} values");
    assert!(dy.len() == rstd.len() * d, "{} values are not {} rows of {d}", dy.len(), rstd.len());
    assert!(xhat.len() == dy.len() && dx.len() == dy.len(), "the gradients have the input's shape");
    let chunk = ROWS_PER_TASK * d;
    (dy.par_chunks(chunk), xhat.par_chunks(chunk), rstd.par_chunks(ROWS_PER_TASK), dx.par_chunks_mut(chunk))
        .into_par_iter()
        .for_each(|(dy, xhat, rstd, dx)| backward_rows(isa, dy, gamma, xhat, rstd, dx));
    // Both are sums down the columns, from zero, rows in order: dbeta is dy's column sum.
    dgamma.fill(0.0);
    crate::rows::by_columns(d, dy.len(), dgamma, |cols, dgamma| {
        for (dy, xhat) in dy.chunks_exact(d).zip(xhat.chunks_exact(d)) {
            for ((g, &v), &h) in dgamma.iter_mut().zip(&dy[cols.clone()]).zip(&xhat[cols.clone()]) {
                *g += v * h;
            }
        }
    });
    crate::rows::sum_rows(dy, dbeta);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::testing::uniform(len, seed, 4.0)
    }

    /// `sum(w * layer_norm(x))` for one row, in f64.
    fn objective(x: &[f64], gamma: &[f32], beta: &[f32], w: &[f32]) -> f64 {
        let d = x.len() as f64;
        let mean = x.iter().sum::<f64>() / d;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d;
        let r = 1.0 / (var + f64::from(EPSILON)).sqrt();
        x.iter()
            .enumerate()
            .map(|(j, v)| f64::from(w[j]) * ((v - mean) * r * f64::from(gamma[j]) + f64::from(beta[j])))
            .sum()
    }

    #[test]
    fn forward_and_backward_match_the_definition_in_f64() {
        let (rows, d) = (5, 37);
        let x = values(rows * d, 1);
        let (gamma, beta, w) = (values(d, 2), values(d, 3), values(rows * d, 4));
        let (mut y, mut xhat, mut rstd) = (vec![0.0; rows * d], vec![0.0; rows * d], vec![0.0; rows]);
        forward(Isa::Scalar, &x, &gamma, &beta, &mut y, &mut xhat, &mut rstd);
        let (mut dx, mut dgamma, mut dbeta) = (vec![0.0; rows * d], vec![0.0; d], vec![0.0; d]);
        backward(Isa::Scalar, &w, &gamma, &xhat, &rstd, &mut dx, &mut dgamma, &mut dbeta);
        for r in 0..rows {
            let row: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|&v| f64::from(v)).collect();
            let wr = &w[r * d..(r + 1) * d];
            for j in 0..d {
                // The output against the definition, and each input's gradient against a
                // central difference of the objective.
                let mut unit = vec![0.0f32; d];
                unit[j] = 1.0;
                let want = objective(&row, &gamma, &beta, &unit);
                assert!((f64::from(y[r * d + j]) - want).abs() < 1e-5, "y[{r}][{j}]");
                let h = 1e-4;
                let (mut up, mut down) = (row.clone(), row.clone());
                up[j] += h;
                down[j] -= h;
                let numeric = (objective(&up, &gamma, &beta, wr) - objective(&down, &gamma, &beta, wr)) / (2.0 * h);
                assert!((f64::from(dx[r * d + j]) - numeric).abs() < 1e-3 * numeric.abs().max(1.0), "dx[{r}][{j}]");
            }
        }
        for j in 0..d {
            let (mut g, mut b) = (0.0f64, 0.0f64);
            for r in 0..rows {
                g += f64::from(w[r * d + j]) * f64::from(xhat[r * d + j]);
                b += f64::from(w[r * d + j]);
            }
            assert!((f64::from(dgamma[j]) - g).abs() < 1e-4 && (f64::from(dbeta[j]) - b).abs() < 1e-4, "column {j}");
        }
    }

    #[test]
    fn paths_and_thread_counts_give_the_same_bits() {
        // 150 rows: three tasks, the last one short; rows of 13 leave a remainder of 5.
        let (rows, d) = (150, 13);
        let x = values(rows * d, 5);
        let (gamma, beta, dy) = (values(d, 6), values(d, 7), values(rows * d, 8));
        let run = |isa: Isa| {
            let (mut y, mut xhat, mut rstd) = (vec![0.0; rows * d], vec![0.0; rows * d], vec![0.0; rows]);
            forward(isa, &x, &gamma, &beta, &mut y, &mut xhat, &mut rstd);
            let (mut dx, mut dg, mut db) = (vec![0.0; rows * d], vec![0.0; d], vec![0.0; d]);
            backward(isa, &dy, &gamma, &xhat, &rstd, &mut dx, &mut dg, &mut db);
            [y, xhat, rstd, dx, dg, db].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
        };
        let want = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| run(Isa::Scalar));
        for isa in Isa::all_available() {
            assert_eq!(run(isa), want, "{isa}");
        }
    }

    #[test]
    fn a_constant_row_normalises_to_beta() {
        let (gamma, beta) = ([2.0f32; 3], [0.5f32, -1.0, 0.0]);
        let (mut y, mut xhat, mut rstd) = ([9.0f32; 3], [9.0f32; 3], [0.0f32]);
        forward(Isa::Scalar, &[7.0; 3], &gamma, &beta, &mut y, &mut xhat, &mut rstd);
        assert_eq!(y, beta);
        assert_eq!(xhat, [0.0; 3]);
    }
}
