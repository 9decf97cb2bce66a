//! Max pooling over 2x2 windows with stride 2, and its backward pass.
//!
//! Only comparisons and copies: the bits never depend on the CPU. Each window is read in
//! the order top-left, top-right, bottom-left, bottom-right; the first largest value wins
//! a tie, and a NaN wins over any number (the first NaN), so a corrupted value stays
//! visible downstream instead of vanishing in a comparison.

/// Pools `x`, planes of `height x width` (both even) one after another, into `out`
/// (planes of `height/2 x width/2`), writing in `argmax` the index in `x` of each output's
/// value.
///
/// # Panics
/// If a side is odd or a length does not match.
pub fn max_pool2(x: &[f32], height: usize, width: usize, out: &mut [f32], argmax: &mut [u32]) {
    assert!(height.is_multiple_of(2) && width.is_multiple_of(2), "a {height}x{width} plane has no whole 2x2 windows");
    assert!(x.len() <= u32::MAX as usize, "indices are 32-bit");
    let (oh, ow) = (height / 2, width / 2);
    let planes = x.len().checked_div(height * width).unwrap_or(0);
    assert_eq!(x.len(), planes * height * width, "{} values are not planes of {height}x{width}", x.len());
    assert_eq!(out.len(), planes * oh * ow, "the pooled output has the wrong length");
    assert_eq!(argmax.len(), out.len(), "one index per output");
    if planes == 0 {
        return;
    }
    let rows = x.chunks_exact(2 * width).zip(out.chunks_exact_mut(ow).zip(argmax.chunks_exact_mut(ow)));
    for (r, (pair, (out, argmax))) in rows.enumerate() {
        let (top, bottom) = pair.split_at(width);
        let base = r * 2 * width;
        for (c, (o, a)) in out.iter_mut().zip(argmax.iter_mut()).enumerate() {
            // The first largest of each pair, then of the two winners: the first largest
            // of the four in reading order, as a scan would find it, without branches.
            let (t, tb) = first_largest((top[2 * c], 0), (top[2 * c + 1], 1));
            let (b, bb) = first_largest((bottom[2 * c], width), (bottom[2 * c + 1], width + 1));
            let (v, best) = first_largest((t, tb), (b, bb));
            *o = v;
            *a = (base + 2 * c + best) as u32;
        }
    }
}

/// Of two values (each with its offset), the later one only if it is larger, or NaN when
/// the earlier is not.
#[inline(always)]
fn first_largest(earlier: (f32, usize), later: (f32, usize)) -> (f32, usize) {
    // `|` and `&` rather than `||` and `&&`: no branch to mispredict on noisy data.
    let take = (later.0 > earlier.0) | (later.0.is_nan() & !earlier.0.is_nan());
    if take { later } else { earlier }
}

/// The backward pass of [`max_pool2`]: `dx` (overwritten) is zero but at each window's
/// chosen index, which receives its output's gradient.
///
/// # Panics
/// If `dy` and `argmax` differ in length or an index lies beyond `dx`.
pub fn max_pool2_backward(dy: &[f32], argmax: &[u32], dx: &mut [f32]) {
    assert_eq!(dy.len(), argmax.len(), "one index per output");
    dx.fill(0.0);
    for (&g, &i) in dy.iter().zip(argmax) {
        dx[i as usize] = g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_keep_their_largest_value_and_where_it_was() {
        // Two 2x4 planes: windows [1 5; 2 0], [3 3; 3 -1] and [-1 -2; -3 -4], [7 NaN; 9 8].
        let x = [1.0, 5.0, 3.0, 3.0, 2.0, 0.0, 3.0, -1.0, -1.0, -2.0, 7.0, f32::NAN, -3.0, -4.0, 9.0, 8.0];
        let (mut out, mut idx) = ([0.0f32; 4], [0u32; 4]);
        max_pool2(&x, 2, 4, &mut out, &mut idx);
        assert_eq!(out[..3], [5.0, 3.0, -1.0]);
        assert!(out[3].is_nan(), "a NaN wins its window");
        assert_eq!(idx, [1, 2, 8, 11], "ties go to the first");
        let mut dx = [f32::NAN; 16];
        max_pool2_backward(&[0.5, 0.25, -1.0, 2.0], &idx, &mut dx);
        let mut want = [0.0f32; 16];
        want[1] = 0.5;
        want[2] = 0.25;
        want[8] = -1.0;
        want[11] = 2.0;
        assert_eq!(dx, want);
    }

    #[test]
    #[should_panic(expected = "no whole 2x2 windows")]
    fn odd_planes_are_refused() {
        max_pool2(&[0.0; 9], 3, 3, &mut [0.0; 1], &mut [0; 1]);
    }
}
