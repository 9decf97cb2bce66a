//! Row-wise helpers of the layers: column sums (a bias's gradient), sums and dot products
//! along a row, and the rectifier.
//!
//! The column sum adds the rows in order, from zero, each column on its own: a vector
//! unit may add many columns at once (the compiler vectorises the loop across them), but
//! every column's chain of additions is the same, so the bits do not depend on the CPU.
//! Threads split the columns, never a column's rows ([`by_columns`]).
//!
//! A sum along one row ([`sum8`], [`dot8`]) keeps [`CHAINS`] partial sums, element `j`
//! going to chain `j % 8`, and combines them in one fixed tree. Eight is part of the
//! order, not a vector width: a 4-lane unit runs the chains in two halves, a 16-lane one
//! runs them in half a register, and a scalar CPU runs them one by one, all with the same
//! additions.

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
    by_columns(cols, x.len(), out, |range, out| {
        for row in x.chunks_exact(cols) {
            for (o, &v) in out.iter_mut().zip(&row[range.clone()]) {
                *o += v;
            }
        }
    });
}

/// Below this many values read, a column-wise loop stays on one thread.
const PARALLEL_VALUES: usize = 1 << 16;
/// The fewest columns a thread takes (a cache line's worth, so that threads write apart).
const MIN_COLUMNS: usize = 16;

/// Runs `work(columns, out[columns])` over ranges of the `cols` columns that together
/// cover them once, on the thread pool when the loop reads `values` values or more: for
/// loops whose outputs are per column and whose order runs down the rows, so that the
/// split changes who adds a column, never in which order.
pub fn by_columns<F>(cols: usize, values: usize, out: &mut [f32], work: F)
where
    F: Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
{
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    if threads == 1 || values < PARALLEL_VALUES || cols < 2 * MIN_COLUMNS {
        work(0..cols, out);
        return;
    }
    let width = cols.div_ceil(threads).next_multiple_of(MIN_COLUMNS);
    out.par_chunks_mut(width).enumerate().for_each(|(i, out)| work(i * width..i * width + out.len(), out));
}

/// Partial sums of [`sum8`] and [`dot8`].
pub const CHAINS: usize = 8;

/// `sum x[j]`: chain `c` adds the elements `j` with `j % 8 == c` in order, from zero; the
/// chains are combined as `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
#[inline(always)]
pub fn sum8(x: &[f32]) -> f32 {
    let mut s = [0.0f32; CHAINS];
    let mut blocks = x.chunks_exact(CHAINS);
    for block in &mut blocks {
        for (acc, &v) in s.iter_mut().zip(block) {
            *acc += v;
        }
    }
    for (acc, &v) in s.iter_mut().zip(blocks.remainder()) {
        *acc += v;
    }
    combine(s)
}

/// `sum a[j] * b[j]` in [`sum8`]'s order, each product rounded before it is added (no
/// fused multiply-add).
///
/// # Panics
/// If the lengths differ.
#[inline(always)]
pub fn dot8(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "a dot product of unequal lengths");
    let mut s = [0.0f32; CHAINS];
    let (mut ab, mut bb) = (a.chunks_exact(CHAINS), b.chunks_exact(CHAINS));
    for (x, y) in (&mut ab).zip(&mut bb) {
        for ((acc, &u), &v) in s.iter_mut().zip(x).zip(y) {
            *acc += u * v;
        }
    }
    for ((acc, &u), &v) in s.iter_mut().zip(ab.remainder()).zip(bb.remainder()) {
        *acc += u * v;
    }
    combine(s)
}

#[inline(always)]
fn combine(s: [f32; CHAINS]) -> f32 {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
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
    fn row_sums_keep_eight_chains_combined_in_a_tree() {
        // Chain 0 gets 1e8, 1 (element 8) and -1e8 (element 16): (1e8 + 1) - 1e8 = 0 in
        // f32, and chain 1 gets the ones at 1 and 17: 2 in all. One chain in order would
        // lose the ones at 1 and 8 and give 1.
        let mut x = [0.0f32; 18];
        (x[0], x[8], x[16]) = (1e8, 1.0, -1e8);
        (x[1], x[17]) = (1.0, 1.0);
        assert_eq!(sum8(&x), 2.0);
        x[1] = 0.0;
        assert_eq!(sum8(&x), 1.0, "chain 0 lost its 1");
        let ones = [1.0f32; 11];
        assert_eq!(sum8(&ones[..0]), 0.0);
        assert_eq!(sum8(&ones), 11.0);
        assert_eq!(dot8(&ones, &[2.0; 11]), 22.0);
        // The tree: (s0 + s1) is added before s2, so 1e8 + 1 - 1e8 vanishes in s0 + s1.
        let t = [1e8f32, 1.0, -1e8, 0.0];
        assert_eq!(sum8(&t), (1e8f32 + 1.0) + -1e8);
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
