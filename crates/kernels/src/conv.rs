//! Convolution lowered to the matrix product: the patches of an image as the columns of a
//! matrix (`im2col`), and the way back (`col2im`) for the input's gradient.
//!
//! A stride-1 convolution of one image `x` (`C x H x W`) with `O` filters of `C x k x k`
//! is `y = W · cols`, where `W` is the filters as an `O x (C·k·k)` matrix (the usual
//! `[O, C, k, k]` layout, flattened) and `cols` holds one column per output position:
//!
//! ```text
//! cols[(c·k + i)·k + j][oh·OW + ow] = x[c][oh + i - pad][ow + j - pad]   (0 outside x)
//! ```
//!
//! Both functions only move values (`col2im` adds them in a fixed order), so their bits
//! do not depend on the CPU; the products around them are [`gemm`](crate::gemm)'s.

/// The geometry of a stride-1, square-kernel convolution of one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    /// Input channels `C`.
    pub channels: usize,
    /// Input height `H`.
    pub height: usize,
    /// Input width `W`.
    pub width: usize,
    /// Kernel side `k`.
    pub kernel: usize,
    /// Zeros added on every side.
    pub padding: usize,
}

impl ConvShape {
    /// Output height `H + 2·pad - k + 1`.
    ///
    /// # Panics
    /// If the kernel is larger than the padded input.
    pub const fn out_height(&self) -> usize {
        out_side(self.height, self.padding, self.kernel)
    }

    /// Output width `W + 2·pad - k + 1`.
    ///
    /// # Panics
    /// If the kernel is larger than the padded input.
    pub const fn out_width(&self) -> usize {
        out_side(self.width, self.padding, self.kernel)
    }

    /// Values in one image: `C·H·W`.
    pub const fn input_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Values in one patch, the rows of `cols`: `C·k·k`.
    pub const fn patch_len(&self) -> usize {
        self.channels * self.kernel * self.kernel
    }

    /// Output positions, the columns of `cols`: `OH·OW`.
    pub const fn positions(&self) -> usize {
        self.out_height() * self.out_width()
    }

    /// Calls `f(row, oh, ih, lo, hi, from)` for every row of `cols` and output row `oh`:
    /// `ih` is the input row it reads (None in the padding), and output columns `lo..hi`
    /// read the input row from column `from` on; the others lie in the padding.
    fn for_each_segment(&self, mut f: impl FnMut(usize, usize, Option<usize>, usize, usize, usize)) {
        let (k, pad, ow) = (self.kernel, self.padding, self.out_width());
        for c in 0..self.channels {
            for i in 0..k {
                for j in 0..k {
                    let row = (c * k + i) * k + j;
                    // Output column `o` reads input column `o + j - pad`.
                    let lo = pad.saturating_sub(j).min(ow);
                    let hi = (self.width + pad).saturating_sub(j).clamp(lo, ow);
                    // (No column reads the input when `lo == hi`; `from` is then 0.)
                    let from = if lo < hi { lo + j - pad } else { 0 };
                    for oh in 0..self.out_height() {
                        let ih = (oh + i).checked_sub(pad).filter(|&r| r < self.height);
                        f(row, oh, ih.map(|r| c * self.height + r), lo, hi, from);
                    }
                }
            }
        }
    }

    fn check(&self, x: usize, cols: usize) {
        assert_eq!(x, self.input_len(), "the image has the wrong length for {self:?}");
        assert_eq!(cols, self.patch_len() * self.positions(), "the patch matrix has the wrong length for {self:?}");
    }
}

/// `side + 2·pad - k + 1`, the output positions along one side.
const fn out_side(side: usize, padding: usize, kernel: usize) -> usize {
    assert!(kernel <= side + 2 * padding, "the kernel is larger than the padded input");
    side + 2 * padding + 1 - kernel
}

/// Writes the patches of image `x` as the columns of `cols` (`patch_len x positions`,
/// row-major; see the module's documentation).
///
/// # Panics
/// If a length does not match `shape`.
pub fn im2col(shape: ConvShape, x: &[f32], cols: &mut [f32]) {
    shape.check(x.len(), cols.len());
    let (w, ow, p) = (shape.width, shape.out_width(), shape.positions());
    shape.for_each_segment(|row, oh, ih, lo, hi, from| {
        let out = &mut cols[row * p + oh * ow..row * p + (oh + 1) * ow];
        match ih {
            Some(r) => {
                out[..lo].fill(0.0);
                out[lo..hi].copy_from_slice(&x[r * w + from..r * w + from + (hi - lo)]);
                out[hi..].fill(0.0);
            }
            None => out.fill(0.0),
        }
    });
}

/// Writes the patches of image `x` as the rows of `rows` (`positions x patch_len`,
/// row-major): the transpose of [`im2col`]'s matrix, for products that read the patches
/// along their rows (a weight gradient, `dy · colsᵀ`).
///
/// # Panics
/// If a length does not match `shape`.
pub fn im2row(shape: ConvShape, x: &[f32], rows: &mut [f32]) {
    shape.check(x.len(), rows.len());
    // Pad the image once, so that every patch segment is a plain slice of a padded line.
    let (pad, h, w) = (shape.padding, shape.height, shape.width);
    let (ph, pw) = (h + 2 * pad, w + 2 * pad);
    let mut padded = vec![0.0f32; shape.channels * ph * pw];
    for (c, plane) in padded.chunks_exact_mut(ph * pw).enumerate() {
        for (r, line) in plane.chunks_exact_mut(pw).skip(pad).take(h).enumerate() {
            line[pad..pad + w].copy_from_slice(&x[(c * h + r) * w..(c * h + r + 1) * w]);
        }
    }
    // A kernel side known when compiling lets each segment's copy stay in registers.
    match shape.kernel {
        3 => rows_from_padded::<3>(shape, &padded, rows),
        5 => rows_from_padded::<5>(shape, &padded, rows),
        _ => rows_from_padded::<0>(shape, &padded, rows),
    }
}

/// [`im2row`] from the padded image: each segment (one channel, one kernel row) is a
/// slice of a padded line. `K` is the kernel side, or 0 to read it from `shape`.
fn rows_from_padded<const K: usize>(shape: ConvShape, padded: &[f32], rows: &mut [f32]) {
    let k = if K == 0 { shape.kernel } else { K };
    let (ph, pw, ow_len) = (shape.height + 2 * shape.padding, shape.width + 2 * shape.padding, shape.out_width());
    for (position, row) in rows.chunks_exact_mut(shape.patch_len()).enumerate() {
        let (oh, ow) = (position / ow_len, position % ow_len);
        for (ci, segment) in row.chunks_exact_mut(k).enumerate() {
            let (c, i) = (ci / k, ci % k);
            let src = &padded[(c * ph + oh + i) * pw + ow..][..k];
            if K == 0 {
                segment.copy_from_slice(src);
            } else {
                let values: [f32; K] = src.try_into().expect("a segment has K values");
                segment.copy_from_slice(&values);
            }
        }
    }
}

/// The adjoint of [`im2col`]: `dx` (overwritten) receives the sum of the entries of
/// `dcols` that read each input value. Each input's terms are added from zero in the
/// order of the rows of `dcols` (channel, then kernel row, then kernel column).
///
/// # Panics
/// If a length does not match `shape`.
pub fn col2im(shape: ConvShape, dcols: &[f32], dx: &mut [f32]) {
    shape.check(dx.len(), dcols.len());
    let (w, ow, p) = (shape.width, shape.out_width(), shape.positions());
    dx.fill(0.0);
    shape.for_each_segment(|row, oh, ih, lo, hi, from| {
        if let Some(r) = ih {
            let src = &dcols[row * p + oh * ow + lo..row * p + oh * ow + hi];
            for (d, &v) in dx[r * w + from..r * w + from + (hi - lo)].iter_mut().zip(src) {
                *d += v;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x[c][h][w]` read directly, for comparison.
    fn patch_value(s: ConvShape, x: &[f32], row: usize, col: usize) -> f32 {
        let (c, i, j) = (row / (s.kernel * s.kernel), row / s.kernel % s.kernel, row % s.kernel);
        let (oh, ow) = (col / s.out_width(), col % s.out_width());
        let (h, w) = ((oh + i).wrapping_sub(s.padding), (ow + j).wrapping_sub(s.padding));
        if h < s.height && w < s.width { x[(c * s.height + h) * s.width + w] } else { 0.0 }
    }

    const SHAPES: [ConvShape; 6] = [
        ConvShape { channels: 1, height: 28, width: 28, kernel: 5, padding: 2 },
        ConvShape { channels: 6, height: 14, width: 14, kernel: 5, padding: 0 },
        ConvShape { channels: 2, height: 3, width: 7, kernel: 3, padding: 1 },
        // A kernel wider than the image: padding alone makes room for it.
        ConvShape { channels: 3, height: 2, width: 1, kernel: 5, padding: 2 },
        ConvShape { channels: 1, height: 1, width: 1, kernel: 1, padding: 0 },
        ConvShape { channels: 2, height: 6, width: 5, kernel: 4, padding: 3 },
    ];

    #[test]
    fn patches_are_the_padded_windows() {
        for s in SHAPES {
            let x: Vec<f32> = (0..s.input_len()).map(|v| v as f32 + 1.0).collect();
            let mut cols = vec![f32::NAN; s.patch_len() * s.positions()];
            im2col(s, &x, &mut cols);
            for row in 0..s.patch_len() {
                for col in 0..s.positions() {
                    assert_eq!(cols[row * s.positions() + col], patch_value(s, &x, row, col), "{s:?} ({row}, {col})");
                }
            }
        }
    }

    #[test]
    fn im2row_is_the_transpose_of_im2col() {
        for s in SHAPES {
            let x: Vec<f32> = (0..s.input_len()).map(|v| v as f32 - 4.5).collect();
            let (k, p) = (s.patch_len(), s.positions());
            let mut cols = vec![0.0; k * p];
            im2col(s, &x, &mut cols);
            let mut rows = vec![f32::NAN; k * p];
            im2row(s, &x, &mut rows);
            for r in 0..k {
                for c in 0..p {
                    assert_eq!(rows[c * k + r].to_bits(), cols[r * p + c].to_bits(), "{s:?} ({r}, {c})");
                }
            }
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), d> = <x, col2im(d)> exactly, with small integers (sums are exact).
        for s in SHAPES {
            let x: Vec<f32> = (0..s.input_len()).map(|v| (v % 7) as f32 - 3.0).collect();
            let d: Vec<f32> = (0..s.patch_len() * s.positions()).map(|v| (v % 5) as f32 - 2.0).collect();
            let mut cols = vec![0.0; d.len()];
            im2col(s, &x, &mut cols);
            let mut dx = vec![f32::NAN; x.len()];
            col2im(s, &d, &mut dx);
            let left: f32 = cols.iter().zip(&d).map(|(a, b)| a * b).sum();
            let right: f32 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
            assert_eq!(left, right, "{s:?}");
        }
    }

    #[test]
    fn col2im_adds_each_inputs_terms_in_row_order() {
        // One input, a 1x1 image with a 3x3 kernel and padding 1: every row of the patch
        // matrix has one entry, and only the centre (row 4) reads the input.
        let s = ConvShape { channels: 1, height: 1, width: 1, kernel: 3, padding: 1 };
        let mut dx = [0.0f32];
        col2im(s, &[9.0, 9.0, 9.0, 9.0, 2.5, 9.0, 9.0, 9.0, 9.0], &mut dx);
        assert_eq!(dx, [2.5]);
        // A 1x3 image, a 3x3 kernel, padding 1: the middle input is read by output column
        // 2 through kernel column 0, column 1 through 1, and column 0 through 2 (all kernel
        // row 1, rows 3..6 of the patch matrix). Added in row order, (0 + 1) + 1e8 - 1e8
        // is 0; in the order of the output columns it would be 1.
        let s = ConvShape { channels: 1, height: 1, width: 3, kernel: 3, padding: 1 };
        let mut d = [0.0f32; 27];
        d[3 * 3 + 2] = 1.0;
        d[4 * 3 + 1] = 1e8;
        d[5 * 3] = -1e8;
        let mut dx = [f32::NAN; 3];
        col2im(s, &d, &mut dx);
        assert_eq!(dx[1], 0.0);
    }

    #[test]
    #[should_panic(expected = "larger than the padded input")]
    fn a_kernel_larger_than_the_padded_image_is_refused() {
        ConvShape { channels: 1, height: 2, width: 2, kernel: 5, padding: 1 }.positions();
    }

    #[test]
    #[should_panic(expected = "wrong length")]
    fn a_short_image_is_refused() {
        let s = SHAPES[0];
        im2col(s, &[0.0; 10], &mut vec![0.0; s.patch_len() * s.positions()]);
    }
}
