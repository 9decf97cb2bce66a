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
            let (t, tb) = first_largest((order(top[2 * c]), 0), (order(top[2 * c + 1]), 1));
            let (b, bb) = first_largest((order(bottom[2 * c]), width), (order(bottom[2 * c + 1]), width + 1));
            let (_, best) = first_largest((t, tb), (b, bb));
            *o = x[base + 2 * c + best];
            *a = (base + 2 * c + best) as u32;
        }
    }
}

/// A key whose unsigned order is the order of the values: numbers as IEEE 754 compares
/// them (so -0 and +0 tie), and every NaN above every number. Comparing keys rather than
/// floats keeps the selection below in integer registers, where it needs no branch
/// (activations after a rectifier are half zeros, and a branch on them is mispredicted
/// half the time).
#[inline(always)]
fn order(v: f32) -> u32 {
    let bits = v.to_bits() & !(u32::from(v == 0.0) << 31);
    let key = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
    std::hint::select_unpredictable(v.is_nan(), u32::MAX, key)
}

/// Of two keys (each with its offset), the later one only if it is larger.
#[inline(always)]
fn first_largest(earlier: (u32, usize), later: (u32, usize)) -> (u32, usize) {
    std::hint::select_unpredictable(later.0 > earlier.0, later, earlier)
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
    fn order_keys_sort_like_the_values_with_nan_on_top() {
        let sorted = [f32::NEG_INFINITY, -3.5, -1e-45, 0.0, 1e-45, 2.0, f32::INFINITY];
        for pair in sorted.windows(2) {
            assert!(order(pair[0]) < order(pair[1]), "{pair:?}");
        }
        assert_eq!(order(-0.0), order(0.0));
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
            assert!(order(nan) > order(f32::INFINITY));
        }
    }

    #[test]
    #[should_panic(expected = "no whole 2x2 windows")]
    fn odd_planes_are_refused() {
        max_pool2(&[0.0; 9], 3, 3, &mut [0.0; 1], &mut [0; 1]);
    }
}
