//! Row-wise helpers of the layers: column sums (a bias's gradient), and the rectifier.
//!
//! The column sum adds the rows in order, from zero, each column on its own: a vector
//! unit may add many columns at once (the compiler vectorises the loop across them), but
//! every column's chain of additions is the same, so the bits do not depend on the CPU.

/// `out[j] = ((0 + x[0][j]) + x[1][j]) + ...` for `x` of `out.len()` columns.
///
/// # Panics
/// If `x`'s length is not a multiple of `out.len()`.
pub fn sum_rows(x: &[f32], out: &mut [f32]) {
    let cols = out.len();
    out.fill(0.0);
    if cols == 0 {
        return;
    }
    assert!(x.len().is_multiple_of(cols), "{} values are not rows of {cols}", x.len());
    for row in x.chunks_exact(cols) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// `x = max(x, 0)` in place, keeping NaN (a corrupted value stays visible downstream).
pub fn relu(x: &mut [f32]) {
    // A store on every element (not only the negative ones) lets the compiler select with
    // a mask instead of branching on the data.
    for v in x {
        *v = if *v <= 0.0 { 0.0 } else { *v };
    }
}

/// The rectifier's backward pass: zeroes `grad` where the forward output `out` was zero
/// (`out <= 0`), keeping it where the output was positive or NaN.
///
/// # Panics
/// If the lengths differ.
pub fn relu_backward(out: &[f32], grad: &mut [f32]) {
    assert_eq!(out.len(), grad.len(), "the gradient has the output's shape");
    for (g, &o) in grad.iter_mut().zip(out) {
        *g = if o <= 0.0 { 0.0 } else { *g };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_sums_add_rows_in_order() {
        let mut out = [9.0f32; 2];
        sum_rows(&[1e8, 1.0, 1.0, 2.0, -1e8, 3.0], &mut out);
        // (0 + 1e8 + 1) - 1e8 = 0 in f32: the order is visible, and it is row order.
        assert_eq!(out, [0.0, 6.0]);
    }

    #[test]
    fn relu_keeps_positive_and_nan_and_zeroes_the_rest() {
        let mut x = [1.5f32, -2.0, -0.0, f32::NAN, 0.0];
        relu(&mut x);
        assert_eq!(x[..3], [1.5, 0.0, 0.0]);
        assert!(x[3].is_nan() && x[2].is_sign_positive());
        let mut g = [1.0f32; 5];
        relu_backward(&x, &mut g);
        assert_eq!(g[..3], [1.0, 0.0, 0.0]);
        assert_eq!(g[3..], [1.0, 0.0]);
    }
}
