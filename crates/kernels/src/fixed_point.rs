//! The conversions of a reproducible sum between `f32` and fixed point, per instruction set.
//!
//! A reproducible sum (the `repro` crate's `batched` module, and the reproducible
//! all-reduce built on it) scales every term of element `i` by one power of two fixed by
//! the largest exponent field `e[i]` among the terms, turns it into an integer, and adds
//! integers. These are its three loops over memory: the exponent maximum, the conversion of
//! finite values into an accumulator (64-bit or 32-bit), and the conversion of a finished
//! integer back to `f32`. They use integer operations and single conversions only, so every
//! instruction set gives the same bits; the vector paths exist because on a baseline x86-64
//! build these loops run two lanes at a time with emulated variable shifts.
//!
//! A sum of few terms also has fused forms that take a block of [`SCALE_BLOCK`] elements
//! of every term at a time and keep its sums in registers: the three steps with no
//! accumulator in memory ([`sum_fixed64_blocks`], [`sum_fixed32_blocks`]), and, for blocks
//! whose exponents spread narrowly enough, the exact sum in `f64` rounded once ([`sum_exact`],
//! which finds each block's spread in the same pass: additions that are exact there, so
//! every instruction set gives the same bits too).
//!
//! Conventions shared by the loops:
//!
//! - The exponent field of `x` is `(bits >> 23) & 0xFF`, raised to at least 1 (zeros and
//!   subnormals share field 1's scale). A scale `e` is the maximum of these over the terms.
//! - With a left shift `s`, a finite term with significand `m` (the implicit bit included)
//!   and field `f` becomes `m · 2^(f - e + s)`: an integer whose unit is `2^(e - 150 - s)`.
//! - The loops here handle finite terms at finite scales (`e < 255`); the caller routes a
//!   block that holds a scale of 255 (an infinity or NaN among its terms) elsewhere.

use crate::lanes::per_isa;

/// The exponent field used for scaling.
#[inline(always)]
fn field(bits: u32) -> u32 {
    ((bits >> 23) & 0xFF).max(1)
}

/// The significand with its implicit bit (none for zeros and subnormals).
#[inline(always)]
fn significand(bits: u32) -> u32 {
    (bits & 0x7F_FFFF) | (u32::from(bits & 0x7F80_0000 != 0) << 23)
}

per_isa! {
    /// `exps[i] = max(exps[i], field(values[i]))`, the first phase of a reproducible sum.
    /// Panics if the lengths differ.
    pub fn max_exponents(exps: &mut [u8], values: &[f32]) {
        assert_eq!(exps.len(), values.len(), "exponent and value lengths differ");
        for (e, &x) in exps.iter_mut().zip(values) {
            *e = (*e).max(field(x.to_bits()) as u8);
        }
    }
}

/// Elements that share one scale in the block forms of the loops below.
pub const SCALE_BLOCK: usize = 64;

/// The largest exponent field among `values`, raised to at least 1.
#[inline(always)]
fn top_field(values: &[f32]) -> u8 {
    // The largest exponent field is that of the largest magnitude's bits.
    let top = values.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7F80_0000));
    field(top) as u8
}

per_isa! {
    /// `exps[b] = max(exps[b], field)` over the values of block `b` (`values[b *
    /// SCALE_BLOCK ..]`, the last block possibly shorter): the first phase of a sum whose
    /// scale is shared by a block of elements. Panics unless `exps` has one byte per
    /// block of `values`.
    pub fn max_block_exponents(exps: &mut [u8], values: &[f32]) {
        assert_eq!(exps.len(), values.len().div_ceil(SCALE_BLOCK), "block exponent and value lengths differ");
        let whole = values.chunks_exact(SCALE_BLOCK);
        let rest = whole.remainder();
        for (e, chunk) in exps.iter_mut().zip(whole) {
            *e = (*e).max(top_field(chunk));
        }
        if !rest.is_empty() {
            let e = exps.last_mut().expect("a block for the rest");
            *e = (*e).max(top_field(rest));
        }
    }
}

/// The magnitude's bits of `x` less one: a zero's wraps to all ones, so that the minimum
/// over values is that of the smallest nonzero magnitude.
#[inline(always)]
fn magnitude_less_one(x: f32) -> u32 {
    (x.to_bits() & 0x7FFF_FFFF).wrapping_sub(1)
}

/// Whether every term of a block whose nonzero terms' exponent fields run from `low` (255
/// when all are zeros) to its scale `top` sits on the grid of the scale's unit
/// `2^(top - 150 - s)` at shift `s`: a field at least `top - s` places a 24-bit significand
/// at or above the unit, so that its conversion to fixed point drops no bit. A block with
/// an infinity or NaN (`top` 255) is on no grid.
pub fn on_grid(top: u8, low: u8, s: i32) -> bool {
    top != 255 && i32::from(low) + s >= i32::from(top)
}

per_isa! {
    /// In one pass over the terms, per block of [`SCALE_BLOCK`] elements of `out` (the last
    /// possibly shorter):
    ///
    /// - the block's exponent span: `tops[b]` is the largest exponent field among its terms'
    ///   values (as [`max_block_exponents`]; 1 when there are no terms) and `lows[b]` the
    ///   smallest among their nonzero values (255 for a block of zeros);
    /// - where that span puts every term on the grid of its scale at shift `s` ([`on_grid`]),
    ///   `out[i] = Σ_k terms[k][start + i]`, added in `f64` from `+0.0` and rounded once to
    ///   `f32`: the correctly rounded sum when the `f64` additions are exact, which holds
    ///   when every term is a multiple of one power of two `u` and the terms' magnitudes
    ///   add up to less than `2^53 · u` (see `repro::batched`). A zero sum is `+0.0`.
    ///
    /// The other blocks of `out` are not written, and a block is written only after every
    /// term's values in it are read: the caller sums those blocks by another way, from
    /// terms that are intact even where `out` is one of them. Panics unless `tops` and
    /// `lows` have one byte per block of `out` and every term reaches `start + out.len()`.
    pub fn sum_exact(out: &mut [f32], tops: &mut [u8], lows: &mut [u8], terms: &[&[f32]], start: usize, s: i32) {
        assert!(tops.len() == out.len().div_ceil(SCALE_BLOCK) && lows.len() == tops.len(), "one span per block");
        for (c, ((o, t), l)) in out.chunks_mut(SCALE_BLOCK).zip(tops.iter_mut()).zip(lows.iter_mut()).enumerate() {
            let at = start + c * SCALE_BLOCK;
            let mut acc = [0.0f64; SCALE_BLOCK];
            let (mut high, mut low) = ([0u32; SCALE_BLOCK], [u32::MAX; SCALE_BLOCK]);
            for term in terms {
                let term = &term[at..at + o.len()];
                // Whole blocks as fixed-length loops, the lanes held in registers.
                if let Ok(term) = <&[f32; SCALE_BLOCK]>::try_from(term) {
                    for i in 0..SCALE_BLOCK {
                        acc[i] += f64::from(term[i]);
                        high[i] = high[i].max(term[i].to_bits() & 0x7F80_0000);
                        low[i] = low[i].min(magnitude_less_one(term[i]));
                    }
                } else {
                    for (i, &x) in term.iter().enumerate() {
                        acc[i] += f64::from(x);
                        high[i] = high[i].max(x.to_bits() & 0x7F80_0000);
                        low[i] = low[i].min(magnitude_less_one(x));
                    }
                }
            }
            let (high, low) = (high.iter().fold(0, |m, &x| m.max(x)), low.iter().fold(u32::MAX, |m, &x| m.min(x)));
            *t = field(high) as u8;
            *l = if low == u32::MAX { 255 } else { field(low + 1) as u8 };
            if on_grid(*t, *l, s) {
                for (o, &a) in o.iter_mut().zip(&acc) {
                    *o = a as f32;
                }
            }
        }
    }
}

/// The blocks of `len` values whose first is element `offset` of its block: each block's
/// scale (from `exps`, the first that of the first value) and its range of the values.
#[inline(always)]
fn blocks(len: usize, exps: &[u8], offset: usize) -> impl Iterator<Item = (u8, std::ops::Range<usize>)> + '_ {
    let mut start = 0;
    exps.iter().map_while(move |&e| {
        if start >= len {
            return None;
        }
        let end = if start == 0 { (SCALE_BLOCK - offset).min(len) } else { (start + SCALE_BLOCK).min(len) };
        let r = start..end;
        start = end;
        Some((e, r))
    })
}

/// `sign · ⌊m · 2^(f - e + s)⌋` of a finite `x` at scale `e` (see [`add_fixed64`]).
#[inline(always)]
fn fixed64(x: f32, e: u32, s: i32) -> i64 {
    let bits = x.to_bits();
    let k = field(bits) as i32 - e as i32 + s;
    let magnitude = (i64::from(significand(bits)) << k.max(0)) >> (-k).clamp(0, 63);
    // Conditional negation: (m ^ -1) + 1 for negatives, m for positives.
    let neg = -i64::from(bits >> 31);
    (magnitude ^ neg) - neg
}

/// `x` at scale `e` rounded to the nearest integer, halves away from zero (see
/// [`add_fixed32`]).
#[inline(always)]
fn fixed32(x: f32, e: u32, s: i32) -> i32 {
    let bits = x.to_bits();
    let k = field(bits) as i32 - e as i32 + s;
    let j = (-k).clamp(0, 31) as u32;
    let half = (1u32 << j) >> 1;
    let magnitude = ((significand(bits) << k.max(0)) + half) >> j;
    let neg = -((bits >> 31) as i32);
    (magnitude as i32 ^ neg) - neg
}

/// The loop of the block forms below: `acc[i] += term(values[i], scale)` (or `=`, with
/// `overwrite`), the scale `exps[b]` held for each block, whole blocks as fixed-length loops.
#[inline(always)]
fn add_blocks<T: Copy + Default + std::ops::Add<Output = T>>(
    acc: &mut [T],
    values: &[f32],
    (exps, offset): (&[u8], usize),
    overwrite: bool,
    term: impl Fn(f32, u32) -> T,
) {
    assert!(acc.len() == values.len() && offset < SCALE_BLOCK, "lengths differ");
    assert!(exps.len() >= (offset + values.len()).div_ceil(SCALE_BLOCK), "too few block scales");
    for (e, r) in blocks(values.len(), exps, offset) {
        let e = u32::from(e);
        let (acc, values) = (&mut acc[r.clone()], &values[r]);
        if acc.len() == SCALE_BLOCK {
            let a: &mut [T; SCALE_BLOCK] = acc.try_into().expect("a whole block");
            let v: &[f32; SCALE_BLOCK] = values.try_into().expect("a whole block");
            if overwrite {
                for i in 0..SCALE_BLOCK {
                    a[i] = term(v[i], e);
                }
            } else {
                for i in 0..SCALE_BLOCK {
                    a[i] = a[i] + term(v[i], e);
                }
            }
        } else {
            for (a, &x) in acc.iter_mut().zip(values) {
                *a = if overwrite { T::default() } else { *a } + term(x, e);
            }
        }
    }
}

/// The loop of the block forms of `finish`: `out[i] = back(acc[i], unit of its block)`.
#[inline(always)]
fn finish_blocks<T: Copy>(
    out: &mut [f32],
    acc: &[T],
    (exps, offset): (&[u8], usize),
    s: i32,
    back: impl Fn(T, f64) -> f32,
) {
    assert!(acc.len() == out.len() && offset < SCALE_BLOCK, "lengths differ");
    assert!(exps.len() >= (offset + out.len()).div_ceil(SCALE_BLOCK), "too few block scales");
    for (e, r) in blocks(out.len(), exps, offset) {
        let u = unit(e, s);
        for (o, &a) in out[r.clone()].iter_mut().zip(&acc[r]) {
            *o = back(a, u);
        }
    }
}

per_isa! {
    /// [`add_fixed64`] with one scale per block of [`SCALE_BLOCK`] elements: `values[0]` is
    /// element `offset` of its block, whose scale is `exps[0]` (the same bits as
    /// [`add_fixed64`] at each element's block's scale). Whole blocks run as fixed-length
    /// loops with their scale held in a register. With `overwrite` the terms replace what
    /// `acc` held (a sum's first term, with no pass to zero it first). Every scale must be
    /// below 255. Panics unless `acc` and `values` have the same length and `exps` covers
    /// them.
    pub fn add_fixed64_blocks(acc: &mut [i64], values: &[f32], exps: &[u8], offset: usize, s: i32, overwrite: bool) {
        add_blocks(acc, values, (exps, offset), overwrite, |x, e| fixed64(x, e, s));
    }
}

per_isa! {
    /// [`add_fixed32`] with one scale per block of [`SCALE_BLOCK`] elements (see
    /// [`add_fixed64_blocks`]). Every scale must be below 255, and `s` at most 7.
    pub fn add_fixed32_blocks(acc: &mut [i32], values: &[f32], exps: &[u8], offset: usize, s: i32, overwrite: bool) {
        add_blocks(acc, values, (exps, offset), overwrite, |x, e| fixed32(x, e, s));
    }
}

per_isa! {
    /// [`finish64`] with one scale per block of [`SCALE_BLOCK`] elements (`out[0]` is element
    /// `offset` of its block, whose scale is `exps[0]`). Every scale must be below 255.
    pub fn finish64_blocks(out: &mut [f32], acc: &[i64], exps: &[u8], offset: usize, s: i32) {
        finish_blocks(out, acc, (exps, offset), s, back64);
    }
}

per_isa! {
    /// [`finish32`] with one scale per block of [`SCALE_BLOCK`] elements (see
    /// [`finish64_blocks`]).
    pub fn finish32_blocks(out: &mut [f32], acc: &[i32], exps: &[u8], offset: usize, s: i32) {
        finish_blocks(out, acc, (exps, offset), s, back32);
    }
}

/// The loop of the fused block sums below: for each block of `out` (element `start` of
/// every term on), its scale over every term into `tops`, and where the scale is finite
/// the terms converted at it, added in registers and converted back, with no accumulator
/// in memory. A block whose scale is 255 (an infinity or NaN among its terms) is left for
/// the caller.
#[inline(always)]
fn sum_fixed_blocks<T: Copy + Default + std::ops::Add<Output = T>>(
    out: &mut [f32],
    tops: &mut [u8],
    terms: &[&[f32]],
    start: usize,
    (term, back): (impl Fn(f32, u32) -> T, impl Fn(T, f64) -> f32),
    s: i32,
) {
    assert_eq!(tops.len(), out.len().div_ceil(SCALE_BLOCK), "one scale per block");
    for (c, (o, top)) in out.chunks_mut(SCALE_BLOCK).zip(tops.iter_mut()).enumerate() {
        let at = start + c * SCALE_BLOCK..start + c * SCALE_BLOCK + o.len();
        let e = terms.iter().map(|t| top_field(&t[at.clone()])).max().unwrap_or(1);
        *top = e;
        if e == 255 {
            continue;
        }
        let mut acc = [T::default(); SCALE_BLOCK];
        for t in terms {
            let t = &t[at.clone()];
            if let Ok(t) = <&[f32; SCALE_BLOCK]>::try_from(t) {
                for i in 0..SCALE_BLOCK {
                    acc[i] = acc[i] + term(t[i], u32::from(e));
                }
            } else {
                for (a, &x) in acc.iter_mut().zip(t) {
                    *a = *a + term(x, u32::from(e));
                }
            }
        }
        let u = unit(e, s);
        for (o, &a) in o.iter_mut().zip(&acc) {
            *o = back(a, u);
        }
    }
}

per_isa! {
    /// The reproducible sum of `terms` (elements `start ..` of each) into `out` in 64-bit
    /// integers, block by block in registers: for each block its scale into `tops` (the
    /// largest field over every term, at least 1), and where it is finite
    /// `finish64(Σ add_fixed64)` of the block, the bits of [`add_fixed64_blocks`] and
    /// [`finish64_blocks`]. Blocks whose scale is 255 are not written. Panics unless
    /// `tops` has one byte per block of `out` and every term reaches `start + out.len()`.
    pub fn sum_fixed64_blocks(out: &mut [f32], tops: &mut [u8], terms: &[&[f32]], start: usize, s: i32) {
        sum_fixed_blocks(out, tops, terms, start, (|x, e| fixed64(x, e, s), back64), s);
    }
}

per_isa! {
    /// [`sum_fixed64_blocks`] in 32-bit integers (`s` at most 7).
    pub fn sum_fixed32_blocks(out: &mut [f32], tops: &mut [u8], terms: &[&[f32]], start: usize, s: i32) {
        sum_fixed_blocks(out, tops, terms, start, (|x, e| fixed32(x, e, s), back32), s);
    }
}

per_isa! {
    /// Adds each finite `values[i]` at scale `exps[i]` into the 64-bit `acc[i]`, truncated
    /// toward zero: `acc[i] += sign · ⌊m · 2^(f - e + s)⌋`. The scale is the maximum field,
    /// so the shift `f - e + s` is at most `s`; right shifts of 63 or more give zero.
    /// Every scale must be below 255. Panics if the lengths differ.
    pub fn add_fixed64(acc: &mut [i64], values: &[f32], exps: &[u8], s: i32) {
        assert!(acc.len() == values.len() && exps.len() == values.len(), "lengths differ");
        for ((a, &x), &e) in acc.iter_mut().zip(values).zip(exps) {
            *a += fixed64(x, u32::from(e), s);
        }
    }
}

per_isa! {
    /// Adds each finite `values[i]` at scale `exps[i]` into the 32-bit `acc[i]`, rounded to
    /// the nearest integer (halves away from zero): with `j = e - f - s > 0`, the magnitude
    /// is `(m + 2^(j-1)) >> j`. Right shifts of 31 or more give zero (a significand below
    /// `2^24` rounds to zero long before). Every scale must be below 255, and `s` at most 7.
    /// Panics if the lengths differ.
    pub fn add_fixed32(acc: &mut [i32], values: &[f32], exps: &[u8], s: i32) {
        assert!(acc.len() == values.len() && exps.len() == values.len(), "lengths differ");
        for ((a, &x), &e) in acc.iter_mut().zip(values).zip(exps) {
            *a += fixed32(x, u32::from(e), s);
        }
    }
}

/// A finished 64-bit sum `a` in units of `u` as `f32`: the integer rounded once to `f32`,
/// scaled exactly in `f64` (a second rounding only where the result is subnormal).
#[inline(always)]
fn back64(a: i64, u: f64) -> f32 {
    ((a as f32) as f64 * u) as f32
}

/// [`back64`] for 32-bit sums.
#[inline(always)]
fn back32(a: i32, u: f64) -> f32 {
    ((a as f32) as f64 * u) as f32
}

/// `2^(e - 150 - s)`, the unit of an integer at scale `e`, built from its bits (exact: the
/// exponent is always within `f64`'s normal range).
#[inline(always)]
fn unit(e: u8, s: i32) -> f64 {
    f64::from_bits(((i64::from(e) - 150 - i64::from(s) + 1023) as u64) << 52)
}

per_isa! {
    /// `out[i] = acc[i] · 2^(exps[i] - 150 - s)`, rounded once to `f32` (and a second time
    /// only where the result is subnormal): the integer rounds to `f32`, the power of two
    /// scales it exactly in `f64`. Every scale must be below 255. Panics if the lengths
    /// differ.
    pub fn finish64(out: &mut [f32], acc: &[i64], exps: &[u8], s: i32) {
        assert!(acc.len() == exps.len() && out.len() == acc.len(), "lengths differ");
        for ((o, &a), &e) in out.iter_mut().zip(acc).zip(exps) {
            *o = back64(a, unit(e, s));
        }
    }
}

per_isa! {
    /// [`finish64`] for 32-bit accumulators.
    pub fn finish32(out: &mut [f32], acc: &[i32], exps: &[u8], s: i32) {
        assert!(acc.len() == exps.len() && out.len() == acc.len(), "lengths differ");
        for ((o, &a), &e) in out.iter_mut().zip(acc).zip(exps) {
            *o = back32(a, unit(e, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;
    use proptest::prelude::*;

    /// Finite floats of every kind: zeros, subnormals, normals over the whole range.
    fn finite() -> impl Strategy<Value = f32> {
        any::<u32>().prop_map(|b| {
            let x = f32::from_bits(b);
            if x.is_finite() { x } else { f32::from_bits(b & 0xBF7F_FFFF) }
        })
    }

    proptest! {
        #[test]
        fn every_instruction_set_gives_the_scalar_bits(
            values in proptest::collection::vec(finite(), 0..300),
            others in proptest::collection::vec(finite(), 300),
        ) {
            let n = values.len();
            let mut exps = vec![0u8; n];
            max_exponents(Isa::Scalar, &mut exps, &values);
            max_exponents(Isa::Scalar, &mut exps, &others[..n]);
            for isa in Isa::all_available() {
                let mut e2 = vec![0u8; n];
                max_exponents(isa, &mut e2, &values);
                max_exponents(isa, &mut e2, &others[..n]);
                prop_assert_eq!(&e2, &exps);
                let (mut a64, mut b64) = (vec![0i64; n], vec![0i64; n]);
                let (mut a32, mut b32) = (vec![0i32; n], vec![0i32; n]);
                let (mut c32, mut d32) = (vec![0i32; n], vec![0i32; n]);
                for part in [&values[..], &others[..n]] {
                    add_fixed64(Isa::Scalar, &mut a64, part, &exps, 23);
                    add_fixed64(isa, &mut b64, part, &exps, 23);
                    // Shift 0 (headroom 7) and 3 (headroom 4): rounding and left shifts.
                    add_fixed32(Isa::Scalar, &mut a32, part, &exps, 0);
                    add_fixed32(isa, &mut b32, part, &exps, 0);
                    add_fixed32(Isa::Scalar, &mut c32, part, &exps, 3);
                    add_fixed32(isa, &mut d32, part, &exps, 3);
                }
                prop_assert_eq!(&a64, &b64);
                prop_assert_eq!(&a32, &b32);
                prop_assert_eq!(&c32, &d32);
                let (mut f1, mut f2) = (vec![0f32; n], vec![0f32; n]);
                finish64(Isa::Scalar, &mut f1, &a64, &exps, 23);
                finish64(isa, &mut f2, &b64, &exps, 23);
                prop_assert_eq!(f1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                finish32(Isa::Scalar, &mut f1, &a32, &exps, 0);
                finish32(isa, &mut f2, &b32, &exps, 0);
                prop_assert_eq!(f1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
        }
    }

    proptest! {
        #[test]
        fn a_block_s_exponent_is_the_largest_of_its_elements_on_every_instruction_set(
            values in proptest::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..400),
        ) {
            let mut per_element = vec![0u8; values.len()];
            max_exponents(Isa::Scalar, &mut per_element, &values);
            let expected: Vec<u8> =
                per_element.chunks(SCALE_BLOCK).map(|c| c.iter().copied().max().unwrap_or(0)).collect();
            for isa in Isa::all_available() {
                let mut exps = vec![0u8; values.len().div_ceil(SCALE_BLOCK)];
                max_block_exponents(isa, &mut exps, &values);
                prop_assert_eq!(&exps, &expected);
            }
        }

        /// The block forms give the per-element loops' bits at each element's block scale,
        /// on every instruction set, from any offset into the first block.
        #[test]
        fn block_scaled_loops_give_the_per_element_loops_bits(
            parts in proptest::collection::vec(proptest::collection::vec(finite(), 300), 1..4),
            len in 0usize..300,
            offset in 0usize..SCALE_BLOCK,
        ) {
            let blocks = (offset + len).div_ceil(SCALE_BLOCK).max(1);
            // Scales as the first phase makes them: over the parts, per block.
            let mut exps = vec![1u8; blocks];
            for p in &parts {
                let mut padded = vec![0f32; offset];
                padded.extend_from_slice(&p[..len]);
                padded.resize(blocks * SCALE_BLOCK, 0.0);
                max_block_exponents(Isa::Scalar, &mut exps, &padded);
            }
            let per_element: Vec<u8> = (0..len).map(|i| exps[(offset + i) / SCALE_BLOCK]).collect();
            for isa in Isa::all_available() {
                let (mut a64, mut b64) = (vec![0i64; len], vec![0i64; len]);
                let (mut a32, mut b32) = (vec![0i32; len], vec![0i32; len]);
                let (mut c32, mut d32) = (vec![0i32; len], vec![0i32; len]);
                for p in &parts {
                    add_fixed64(Isa::Scalar, &mut a64, &p[..len], &per_element, 23);
                    add_fixed64_blocks(isa, &mut b64, &p[..len], &exps, offset, 23, false);
                    add_fixed32(Isa::Scalar, &mut a32, &p[..len], &per_element, 0);
                    add_fixed32_blocks(isa, &mut b32, &p[..len], &exps, offset, 0, false);
                    add_fixed32(Isa::Scalar, &mut c32, &p[..len], &per_element, 4);
                    add_fixed32_blocks(isa, &mut d32, &p[..len], &exps, offset, 4, false);
                }
                prop_assert_eq!(&a64, &b64);
                prop_assert_eq!(&a32, &b32);
                prop_assert_eq!(&c32, &d32);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let (mut f1, mut f2) = (vec![0f32; len], vec![0f32; len]);
                finish64(Isa::Scalar, &mut f1, &a64, &per_element, 23);
                finish64_blocks(isa, &mut f2, &b64, &exps, offset, 23);
                prop_assert_eq!(bits(&f1), bits(&f2));
                finish32(Isa::Scalar, &mut f1, &a32, &per_element, 0);
                finish32_blocks(isa, &mut f2, &b32, &exps, offset, 0);
                prop_assert_eq!(bits(&f1), bits(&f2));
            }
        }

        /// The widest shift each width allows, where the scaled terms come closest to the
        /// integers' limits.
        #[test]
        fn block_scaled_loops_hold_at_the_largest_shifts(values in proptest::collection::vec(finite(), 1..200)) {
            let mut exps = vec![0u8; values.len().div_ceil(SCALE_BLOCK)];
            max_block_exponents(Isa::Scalar, &mut exps, &values);
            let per_element: Vec<u8> = (0..values.len()).map(|i| exps[i / SCALE_BLOCK]).collect();
            for isa in Isa::all_available() {
                let (mut a, mut b) = (vec![0i64; values.len()], vec![0i64; values.len()]);
                add_fixed64(Isa::Scalar, &mut a, &values, &per_element, 39);
                add_fixed64_blocks(isa, &mut b, &values, &exps, 0, 39, false);
                let mut c = vec![7i64; values.len()];
                add_fixed64_blocks(isa, &mut c, &values, &exps, 0, 39, true);
                prop_assert_eq!(&a, &c);
                prop_assert_eq!(&a, &b);
                let (mut a, mut b) = (vec![0i32; values.len()], vec![0i32; values.len()]);
                add_fixed32(Isa::Scalar, &mut a, &values, &per_element, 7);
                add_fixed32_blocks(isa, &mut b, &values, &exps, 0, 7, false);
                let mut c = vec![-3i32; values.len()];
                add_fixed32_blocks(isa, &mut c, &values, &exps, 0, 7, true);
                prop_assert_eq!(&a, &c);
                prop_assert_eq!(&a, &b);
            }
        }
    }

    proptest! {
        /// The spans' pass gives the scalar loop's bits on every instruction set: the
        /// largest field of each block, and the smallest among its nonzero values (255 for
        /// a block of zeros).
        #[test]
        fn a_block_s_span_is_its_nonzero_values_fields_on_every_instruction_set(
            terms in proptest::collection::vec(proptest::collection::vec(
                prop_oneof![any::<u32>().prop_map(f32::from_bits), Just(0.0f32), Just(-0.0f32)], 400), 0..6),
            start_block in 0usize..3,
            len in 0usize..270,
        ) {
            let start = start_block * SCALE_BLOCK;
            let refs: Vec<&[f32]> = terms.iter().map(|t| t.as_slice()).collect();
            let blocks = len.div_ceil(SCALE_BLOCK);
            let mut tops = vec![1u8; blocks];
            for t in &refs {
                max_block_exponents(Isa::Scalar, &mut tops, &t[start..start + len]);
            }
            let lows: Vec<u8> = (0..blocks)
                .map(|b| {
                    let r = start + b * SCALE_BLOCK..(start + (b + 1) * SCALE_BLOCK).min(start + len);
                    refs.iter()
                        .flat_map(|t| &t[r.clone()])
                        .filter(|x| x.to_bits() << 1 != 0)
                        .map(|x| field(x.to_bits()) as u8)
                        .min()
                        .unwrap_or(255)
                })
                .collect();
            for isa in Isa::all_available() {
                let (mut t, mut l) = (vec![7u8; blocks], vec![7u8; blocks]);
                let mut out = vec![0f32; len];
                sum_exact(isa, &mut out, &mut t, &mut l, &refs, start, 23);
                prop_assert_eq!(&t, &tops);
                prop_assert_eq!(&l, &lows);
            }
        }

        /// The `f64` sum gives the scalar loop's bits on every instruction set, from any
        /// start, and a zero sum is `+0.0`.
        #[test]
        fn the_f64_sum_gives_the_scalar_bits_on_every_instruction_set(
            terms in proptest::collection::vec(proptest::collection::vec(finite(), 300), 0..5),
            start in 0usize..100,
            len in 0usize..200,
        ) {
            let refs: Vec<&[f32]> = terms.iter().map(|t| t.as_slice()).collect();
            let mut expected = vec![0f32; len];
            let blocks = len.div_ceil(SCALE_BLOCK);
            let (mut tops, mut lows) = (vec![0u8; blocks], vec![0u8; blocks]);
            // A shift as wide as the fields: every block of finite terms is written.
            sum_exact(Isa::Scalar, &mut expected, &mut tops, &mut lows, &refs, start, 255);
            for (i, e) in expected.iter().enumerate() {
                let s: f64 = refs.iter().fold(0.0, |a, t| a + f64::from(t[start + i]));
                prop_assert_eq!(e.to_bits(), (s as f32).to_bits());
            }
            for isa in Isa::all_available() {
                let mut out = vec![1f32; len];
                sum_exact(isa, &mut out, &mut tops, &mut lows, &refs, start, 255);
                prop_assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    expected.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
        }
    }

    proptest! {
        /// The sums in registers give the bits of the loops through memory (the block
        /// scales, the conversions into an accumulator, the conversion back) on every
        /// instruction set, in both widths, from any start; a block with an infinity or NaN
        /// gets its scale, 255, and is left as it was.
        #[test]
        fn sums_in_registers_give_the_loops_through_memory_bits(
            terms in proptest::collection::vec(proptest::collection::vec(
                prop_oneof![20 => finite(), 1 => Just(f32::INFINITY), 1 => Just(f32::NAN)], 300), 0..5),
            start in 0usize..100,
            len in 0usize..200,
        ) {
            let refs: Vec<&[f32]> = terms.iter().map(|t| &t[start..start + len]).collect();
            let blocks = len.div_ceil(SCALE_BLOCK);
            let mut tops = vec![1u8; blocks];
            for t in &refs {
                max_block_exponents(Isa::Scalar, &mut tops, t);
            }
            let finite: Vec<u8> = tops.iter().map(|&e| e.min(254)).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (mut a64, mut a32) = (vec![0i64; len], vec![0i32; len]);
            for t in &refs {
                add_fixed64_blocks(Isa::Scalar, &mut a64, t, &finite, 0, 23, false);
                add_fixed32_blocks(Isa::Scalar, &mut a32, t, &finite, 0, 0, false);
            }
            let (mut want64, mut want32) = (vec![7f32; len], vec![7f32; len]);
            finish64_blocks(Isa::Scalar, &mut want64, &a64, &finite, 0, 23);
            finish32_blocks(Isa::Scalar, &mut want32, &a32, &finite, 0, 0);
            for (b, &e) in tops.iter().enumerate() {
                if e == 255 {
                    let r = b * SCALE_BLOCK..((b + 1) * SCALE_BLOCK).min(len);
                    want64[r.clone()].fill(7.0);
                    want32[r].fill(7.0);
                }
            }
            let all: Vec<&[f32]> = terms.iter().map(|t| t.as_slice()).collect();
            for isa in Isa::all_available() {
                let (mut out, mut got) = (vec![7f32; len], vec![0u8; blocks]);
                sum_fixed64_blocks(isa, &mut out, &mut got, &all, start, 23);
                prop_assert_eq!(&got, &tops);
                prop_assert_eq!(bits(&out), bits(&want64));
                let (mut out, mut got) = (vec![7f32; len], vec![0u8; blocks]);
                sum_fixed32_blocks(isa, &mut out, &mut got, &all, start, 0);
                prop_assert_eq!(&got, &tops);
                prop_assert_eq!(bits(&out), bits(&want32));
            }
        }
    }

    #[test]
    fn negative_zeros_sum_to_positive_zero_in_f64() {
        let z = [-0.0f32; 3];
        let mut out = [1.0f32; 3];
        let (mut tops, mut lows) = ([0u8; 1], [0u8; 1]);
        sum_exact(Isa::Scalar, &mut out, &mut tops, &mut lows, &[&z, &z], 0, 23);
        assert!(out.iter().all(|x| x.to_bits() == 0));
    }

    /// A block whose terms spread wider than the shift is not written (its caller sums it
    /// from the terms, which may include `out` itself), on every instruction set; the
    /// blocks on the grid beside it are.
    #[test]
    fn blocks_off_the_grid_are_left_unwritten() {
        let mut wide = vec![1.0f32; 2 * SCALE_BLOCK];
        wide[SCALE_BLOCK + 3] = 2f32.powi(-30);
        for isa in Isa::all_available() {
            let mut out = vec![7.0f32; 2 * SCALE_BLOCK];
            let (mut tops, mut lows) = ([0u8; 2], [0u8; 2]);
            sum_exact(isa, &mut out, &mut tops, &mut lows, &[&wide, &wide], 0, 23);
            assert!(out[..SCALE_BLOCK].iter().all(|&x| x == 2.0), "{isa:?}");
            assert!(out[SCALE_BLOCK..].iter().all(|&x| x == 7.0), "{isa:?}");
            assert_eq!((lows[1], tops[1]), (127 - 30, 127));
        }
    }

    #[test]
    fn a_lone_value_comes_back_exactly_in_64_bits_and_rounded_in_32() {
        let x = [1.0f32 + f32::EPSILON, -3.5, 1e-40, 0.0];
        let mut exps = vec![0u8; x.len()];
        max_exponents(Isa::Scalar, &mut exps, &x);
        let mut acc = vec![0i64; x.len()];
        add_fixed64(Isa::Scalar, &mut acc, &x, &exps, 23);
        let mut out = vec![0f32; x.len()];
        finish64(Isa::Scalar, &mut out, &acc, &exps, 23);
        assert_eq!(out, x);
        // In 32 bits at shift 0 a term below the element's largest keeps only the bits at
        // or above the largest's last place (2^-22 beside 2.0), rounded to nearest with
        // halves away from zero: 1 + 2^-23 is a half, and becomes 1 + 2^-22.
        let (big, small) = ([2.0f32], [1.0f32 + 2f32.powi(-23)]);
        let mut exps = vec![0u8; 1];
        max_exponents(Isa::Scalar, &mut exps, &big);
        max_exponents(Isa::Scalar, &mut exps, &small);
        let mut acc = vec![0i32; 1];
        add_fixed32(Isa::Scalar, &mut acc, &small, &exps, 0);
        let mut out = vec![0f32; 1];
        finish32(Isa::Scalar, &mut out, &acc, &exps, 0);
        assert_eq!(out[0], 1.0 + 2f32.powi(-22));
    }
}
