//! Softmax cross-entropy over rows, in a fixed order.
//!
//! For each row `z` of `c` logits and its label `y`:
//!
//! ```text
//! m     = max_j z[j]
//! e[j]  = exp(z[j] - m)                       (crate::math::exp)
//! s     = ((e[0] + e[1]) + e[2]) + ...        (in column order, from zero)
//! nll   = (m + ln s) - z[y]                   (crate::math::ln)
//! dz[j] = (e[j] / s) * scale,  then  dz[y] = dz[y] - scale
//! ```
//!
//! and the loss is the sum of the rows' `nll` in row order, from zero. Rows are tasks of the
//! thread pool; only that last sum waits for them all. Every step is a
//! correctly rounded operation or one of this crate's elementary functions, so the bits do
//! not depend on the CPU. A NaN logit makes its row's loss and gradient NaN (the maximum
//! skips it, the exponential does not), as corruption should.

use rayon::prelude::*;

use crate::math;

/// Rows per task of the thread pool.
const ROWS_PER_TASK: usize = 64;

/// Why a cross-entropy cannot be computed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LossError {
    /// A label outside `0..classes`.
    #[error("row {row} has label {label}, outside the {classes} classes")]
    Label {
        /// The row.
        row: usize,
        /// Its label.
        label: i64,
        /// Number of classes.
        classes: usize,
    },
}

/// The sum over rows of the softmax cross-entropy of `logits` (`labels.len()` rows of
/// `classes` values) against `labels`, and its gradient times `scale` in `grad` (same
/// shape as `logits`).
///
/// # Panics
/// If `logits` or `grad` do not hold `labels.len() * classes` values.
pub fn softmax_cross_entropy(
    logits: &[f32],
    classes: usize,
    labels: &[i64],
    scale: f32,
    grad: &mut [f32],
) -> Result<f32, LossError> {
    let n = labels.len();
    assert_eq!(logits.len(), n * classes, "{n} rows of {classes} logits");
    assert_eq!(grad.len(), logits.len(), "the gradient has the logits' shape");
    // The labels are checked first, so that a bad one is reported by its first row.
    if let Some((row, &label)) = labels.iter().enumerate().find(|(_, l)| !(0..classes as i64).contains(l)) {
        return Err(LossError::Label { row, label, classes });
    }
    let mut losses = vec![0.0f32; n];
    let chunk = ROWS_PER_TASK * classes.max(1);
    (
        logits.par_chunks(chunk),
        grad.par_chunks_mut(chunk),
        labels.par_chunks(ROWS_PER_TASK),
        losses.par_chunks_mut(ROWS_PER_TASK),
    )
        .into_par_iter()
        .for_each(|(logits, grad, labels, losses)| {
            let rows = logits.chunks_exact(classes).zip(grad.chunks_exact_mut(classes)).zip(labels).zip(losses);
            for (((z, dz), &label), loss) in rows {
                *loss = row_loss(z, dz, label as usize, scale);
            }
        });
    Ok(losses.iter().fold(0.0f32, |total, &l| total + l))
}

/// One row's `nll`, its gradient times `scale` in `dz`.
fn row_loss(z: &[f32], dz: &mut [f32], y: usize, scale: f32) -> f32 {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0f32;
    for (d, &v) in dz.iter_mut().zip(z) {
        *d = math::exp(v - m);
        s += *d;
    }
    let nll = (m + math::ln(s)) - z[y];
    for d in dz.iter_mut() {
        *d = (*d / s) * scale;
    }
    dz[y] -= scale;
    nll
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition_in_f64() {
        let logits = [1.0f32, -2.0, 0.5, 3.0, 3.0, -1.0, 0.0, 0.0, 0.0];
        let labels = [2i64, 0, 1];
        let mut grad = [0.0f32; 9];
        let loss = softmax_cross_entropy(&logits, 3, &labels, 0.5, &mut grad).unwrap();
        let mut expected = 0.0f64;
        for (row, &y) in labels.iter().enumerate() {
            let z: Vec<f64> = logits[row * 3..row * 3 + 3].iter().map(|&v| f64::from(v)).collect();
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            expected += lse - z[y as usize];
            for j in 0..3 {
                let p = (z[j] - lse).exp() - if j == y as usize { 1.0 } else { 0.0 };
                assert!((f64::from(grad[row * 3 + j]) - 0.5 * p).abs() < 1e-6, "row {row} column {j}");
            }
        }
        assert!((f64::from(loss) - expected).abs() < 1e-5, "{loss} vs {expected}");
    }

    #[test]
    fn a_nan_logit_poisons_its_row_only() {
        let logits = [f32::NAN, 1.0, 0.0, 1.0];
        let mut grad = [0.0f32; 4];
        let loss = softmax_cross_entropy(&logits, 2, &[1, 0], 1.0, &mut grad).unwrap();
        assert!(loss.is_nan());
        assert!(grad[0].is_nan() && grad[1].is_nan());
        assert!(grad[2].is_finite() && grad[3].is_finite());
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let mut grad = [0.0f32; 2];
        let loss = softmax_cross_entropy(&[1e30, 0.0], 2, &[0], 1.0, &mut grad).unwrap();
        assert_eq!((loss, grad), (0.0, [0.0, 0.0]));
    }

    #[test]
    fn a_label_out_of_range_is_refused() {
        let mut grad = [0.0f32; 2];
        let err = softmax_cross_entropy(&[0.0, 0.0], 2, &[2], 1.0, &mut grad).unwrap_err();
        assert_eq!(err, LossError::Label { row: 0, label: 2, classes: 2 });
        assert!(softmax_cross_entropy(&[0.0, 0.0], 2, &[-1], 1.0, &mut grad).is_err());
    }
}
