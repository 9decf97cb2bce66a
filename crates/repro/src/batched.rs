//! Reproducible element-wise sum of many equal-length vectors: what a gradient
//! all-reduce needs, bitwise identical for any number of parts, any grouping of them into
//! workers, and any arrival order.
//!
//! # The two phases
//!
//! 1. **Exponents.** For each element, the maximum exponent field over all parts (one
//!    byte per element; combined with `max`, which is associative and commutative).
//! 2. **Fixed point.** Each part converts each element to a 64-bit integer at a scale
//!    fixed by that element's maximum exponent, and the integers are summed (associative
//!    and commutative; the headroom below guarantees no overflow). The sum is converted
//!    back to f32 once.
//!
//! Because every term is converted at a scale that depends only on the global maximum,
//! the integers, their sum, and the result are functions of the multiset of terms alone.
//! On the wire this costs 1 + 8 bytes per element, 2.25 times an f32 all-reduce. The
//! same phases with 32-bit integers ([`Fixed`], [`sum_parts_as`]) cost 1 + 4 bytes, at
//! about the accuracy of a float sum.
//!
//! The loops over memory (the exponent maximum and both conversions) are
//! `kernels::fixed_point`'s, run on the instruction set the process selected: integer
//! operations only, so every instruction set gives the same bits.
//!
//! # Accuracy
//!
//! With `headroom = h` bits (at most `2^h` parts), element `i` with maximum magnitude
//! `M_i` over the parts is computed with an error below `n * 2^(h - 62) * M_i` from the
//! terms' truncation (toward zero, one unit of `2^-(62 - h)` relative to `M_i` per term),
//! plus half an ulp of the result for the final rounding. For the default `h = 16` that is
//! below `2^-30 * M_i` for up to 65,536 parts, far below the `n * 2^-24 * M_i` bound of a
//! naive f32 sum. Terms smaller than `2^-(62 - h)` times the element's maximum vanish.
//!
//! # Special values
//!
//! An element with any NaN, or both infinities, is NaN; otherwise an infinity wins. A zero
//! sum is `+0.0` (the sign of zero is not kept).

/// Default headroom of the 64-bit sum: up to 65,536 parts.
pub const DEFAULT_HEADROOM: u32 = 16;
/// Headroom of the 32-bit sum: up to 128 parts, with no bit to spare below the largest
/// term's last place (see [`Fixed`]).
pub const NARROW_HEADROOM: u32 = 7;
const SPECIAL: u8 = 255;

/// The integer a reproducible sum accumulates in: `i64` (the default; far more accurate
/// than a float sum) or `i32` (half the bytes on the wire).
///
/// # The 32-bit sum
///
/// With headroom `h <= 7` the largest term of an element occupies `24 + 7 - h` bits, and
/// every term is rounded to the nearest multiple of that unit, `2^(h - 7)` of the largest
/// term's last place (halves away from zero). For `n <= 2^h` parts the integer sum of
/// element `i` is within `n / 2` units of the exact sum, and its conversion to f32 adds at
/// most half an ulp of the result `r`: with `h = 7` the error is below
/// `n · 2^-24 · M_i + 2^-24 · |r|` for the largest magnitude `M_i`, the order of a naive
/// f32 sum's bound (`(n - 1) · 2^-24 · Σ|terms|`), though not always below a naive sum's
/// actual error. It stays reproducible (integer addition) for any grouping and order.
pub trait Fixed: bytemuck::Pod + Default + Send + Sync + std::fmt::Debug + PartialEq {
    /// The largest headroom the width allows.
    const MAX_HEADROOM: u32;
    /// The left shift that places a 24-bit significand so that `2^headroom` of them fit.
    fn shift(headroom: u32) -> i32 {
        assert!(headroom <= Self::MAX_HEADROOM, "headroom {headroom} exceeds {} for this width", Self::MAX_HEADROOM);
        (Self::MAX_HEADROOM - headroom) as i32
    }
    /// Adds finite values at finite scales (see `kernels::fixed_point`).
    fn add_finite(isa: kernels::Isa, acc: &mut [Self], values: &[f32], exps: &[u8], s: i32);
    /// Converts finished sums at finite scales back to floats.
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[Self], exps: &[u8], s: i32);
    /// Counts a NaN or infinity of an element whose scale is 255: three counters packed
    /// into the integer, 21 bits each in an `i64` (enough for the default headroom's
    /// 65,536 parts) and 9 bits each in an `i32` (enough for its 128).
    fn count_special(acc: &mut Self, bits: u32);
    /// The special value an element whose scale is 255 sums to.
    fn finish_special(acc: Self) -> f32;
}

/// NaN, +inf and -inf counts packed at bits 0, `w` and `2w` of an accumulator.
fn special_one(bits: u32, w: u32) -> i64 {
    if bits & 0x7F_FFFF != 0 {
        1
    } else if bits >> 31 == 1 {
        1 << (2 * w)
    } else {
        1 << w
    }
}

fn special_value(acc: i64, w: u32) -> f32 {
    let mask = (1i64 << w) - 1;
    let (nan, pos, neg) = (acc & mask, (acc >> w) & mask, (acc >> (2 * w)) & mask);
    if nan > 0 || (pos > 0 && neg > 0) {
        f32::NAN
    } else if pos > 0 {
        f32::INFINITY
    } else {
        f32::NEG_INFINITY
    }
}

impl Fixed for i64 {
    /// 24 + 39 = 63 bits: the largest term at shift 0 sits 39 bits below the sign.
    const MAX_HEADROOM: u32 = 39;
    fn add_finite(isa: kernels::Isa, acc: &mut [i64], values: &[f32], exps: &[u8], s: i32) {
        kernels::fixed_point::add_fixed64(isa, acc, values, exps, s)
    }
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[i64], exps: &[u8], s: i32) {
        kernels::fixed_point::finish64(isa, out, acc, exps, s)
    }
    fn count_special(acc: &mut i64, bits: u32) {
        *acc += special_one(bits, 21);
    }
    fn finish_special(acc: i64) -> f32 {
        special_value(acc, 21)
    }
}

impl Fixed for i32 {
    /// 24 + 7 = 31 bits.
    const MAX_HEADROOM: u32 = 7;
    fn add_finite(isa: kernels::Isa, acc: &mut [i32], values: &[f32], exps: &[u8], s: i32) {
        kernels::fixed_point::add_fixed32(isa, acc, values, exps, s)
    }
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[i32], exps: &[u8], s: i32) {
        kernels::fixed_point::finish32(isa, out, acc, exps, s)
    }
    fn count_special(acc: &mut i32, bits: u32) {
        *acc += special_one(bits, 9) as i32;
    }
    fn finish_special(acc: i32) -> f32 {
        special_value(i64::from(acc), 9)
    }
}

/// Phase 1: `exps[i] = max(exps[i], exponent(values[i]))`. Start from zeros.
pub fn max_exponents(exps: &mut [u8], values: &[f32]) {
    kernels::fixed_point::max_exponents(kernels::isa::selected(), exps, values);
}

/// Blocks of this many elements take the vector loop unless one holds a special scale.
const BLOCK: usize = 1024;

/// Phase 2: adds `values` converted to fixed point at the scales of `exps` into `acc`.
pub fn add_fixed<A: Fixed>(acc: &mut [A], values: &[f32], exps: &[u8], headroom: u32) {
    assert!(acc.len() == values.len() && exps.len() == values.len(), "lengths differ");
    let s = A::shift(headroom);
    let isa = kernels::isa::selected();
    // Blocks without special values (nearly all) take the vector loop; a block with one
    // takes it element by element.
    for ((a, v), e) in acc.chunks_mut(BLOCK).zip(values.chunks(BLOCK)).zip(exps.chunks(BLOCK)) {
        if !e.contains(&SPECIAL) {
            A::add_finite(isa, a, v, e, s);
            continue;
        }
        for i in 0..a.len() {
            if e[i] == SPECIAL {
                let bits = v[i].to_bits();
                if (bits >> 23) & 0xFF == 0xFF {
                    A::count_special(&mut a[i], bits);
                }
            } else {
                A::add_finite(kernels::Isa::Scalar, &mut a[i..=i], &v[i..=i], &e[i..=i], s);
            }
        }
    }
}

/// Elements per tile of [`max_exponents_of`] and [`add_fixed_of`]: a tile's accumulators
/// (32 KiB in 64 bits) stay in a core's nearest cache while every part passes over them.
pub const TILE: usize = 4096;

/// Phase 1 over several parts: [`max_exponents`] of the elements `range` of every part
/// into `exps` (the range's length), tile by tile, so that `exps` is read and written once
/// per tile rather than once per part.
pub fn max_exponents_of<P: AsRef<[f32]>>(exps: &mut [u8], parts: &[P], range: std::ops::Range<usize>) {
    assert_eq!(exps.len(), range.len(), "exponent and range lengths differ");
    for (t, tile) in exps.chunks_mut(TILE).enumerate() {
        let start = range.start + t * TILE;
        for p in parts {
            max_exponents(tile, &p.as_ref()[start..start + tile.len()]);
        }
    }
}

/// Phase 2 over several parts: [`add_fixed`] of the elements `range` of every part into
/// `acc` (the range's length), at the scales `exps` (the same length), tile by tile, so
/// that a tile's accumulators stay in cache while every part is added. Integer addition:
/// the tiling changes no bit.
pub fn add_fixed_of<A: Fixed, P: AsRef<[f32]>>(
    acc: &mut [A],
    parts: &[P],
    range: std::ops::Range<usize>,
    exps: &[u8],
    headroom: u32,
) {
    assert!(acc.len() == range.len() && exps.len() == range.len(), "lengths differ");
    for (t, (tile, e)) in acc.chunks_mut(TILE).zip(exps.chunks(TILE)).enumerate() {
        let start = range.start + t * TILE;
        for p in parts {
            add_fixed(tile, &p.as_ref()[start..start + tile.len()], e, headroom);
        }
    }
}

/// Converts the summed fixed-point values back to floats.
pub fn finish<A: Fixed>(acc: &[A], exps: &[u8], headroom: u32) -> Vec<f32> {
    let mut out = vec![0.0; acc.len()];
    finish_into(acc, exps, headroom, &mut out);
    out
}

/// [`finish`] into `out` (of the same length), for callers that reuse their buffers.
pub fn finish_into<A: Fixed>(acc: &[A], exps: &[u8], headroom: u32, out: &mut [f32]) {
    assert!(acc.len() == exps.len() && out.len() == acc.len(), "lengths differ");
    let s = A::shift(headroom);
    let isa = kernels::isa::selected();
    for ((o, a), e) in out.chunks_mut(BLOCK).zip(acc.chunks(BLOCK)).zip(exps.chunks(BLOCK)) {
        if !e.contains(&SPECIAL) {
            A::finish_finite(isa, o, a, e, s);
            continue;
        }
        for i in 0..o.len() {
            o[i] = if e[i] == SPECIAL {
                A::finish_special(a[i])
            } else {
                let mut one = [0f32];
                A::finish_finite(kernels::Isa::Scalar, &mut one, &a[i..=i], &e[i..=i], s);
                one[0]
            };
        }
    }
}

/// An element-wise reproducible sum held in memory: collects the parts' exponents, then
/// their fixed-point values. For a distributed sum, run the two phases through an
/// all-reduce instead (see [`encode`] and [`decode`]).
pub fn sum_parts(parts: &[&[f32]], headroom: u32) -> Vec<f32> {
    let mut out = vec![0.0; parts.first().map_or(0, |p| p.len())];
    sum_parts_into(parts, headroom, &mut out, &mut Scratch::default());
    out
}

/// The working buffers of [`sum_parts_into`], kept between calls so that a training loop
/// that sums gradients of one size every step allocates only on the first.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    exps: Vec<u8>,
    acc: Vec<i64>,
}

/// [`sum_parts`] into `out` (the length of every part), reusing `scratch`.
pub fn sum_parts_into<P: AsRef<[f32]> + Sync>(parts: &[P], headroom: u32, out: &mut [f32], scratch: &mut Scratch) {
    sum_parts_as::<i64, P>(parts, headroom, out, scratch)
}

/// Elements per parallel block of [`sum_parts_as`] (and of the other element-wise local
/// sums that run on the rayon pool): a block's exponents, accumulators and output
/// (16 + 128 + 64 KiB in 64 bits) and its slices of a few parts stay in a core's cache
/// while the three passes run over it.
pub const PAR_BLOCK: usize = 1 << 14;

/// Whether work on `len` elements cut into blocks of `block` goes to the rayon pool: only
/// when the pool has several threads and the work several blocks. Otherwise handing it to
/// the pool would only add a wake-up of another thread and a wait for it.
pub fn on_pool(len: usize, block: usize) -> bool {
    len > block && rayon::current_num_threads() > 1
}

/// [`sum_parts_into`] accumulating in `A`: `i64` is [`sum_parts_into`] itself, `i32` the
/// 32-bit sum of [`Fixed`] (at most `2^headroom <= 128` parts).
///
/// Runs the three passes block by block, on the current rayon pool when it has several
/// threads and there are several blocks. Each element's sum
/// depends on that element of the parts alone, so neither the blocks nor the number of
/// threads change a bit.
pub fn sum_parts_as<A: Fixed, P: AsRef<[f32]> + Sync>(
    parts: &[P],
    headroom: u32,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    use rayon::prelude::*;
    assert!(parts.len() as u64 <= 1u64 << headroom, "{} parts exceed the headroom of 2^{headroom}", parts.len());
    assert!(parts.iter().all(|p| p.as_ref().len() == out.len()), "parts of different lengths");
    let n = out.len();
    let Scratch { exps, acc } = scratch;
    exps.clear();
    exps.resize(n, 0);
    acc.clear();
    let acc = words_as::<A>(acc, n);
    let block = |b: usize, out: &mut [f32], exps: &mut [u8], acc: &mut [A]| {
        let range = b * PAR_BLOCK..b * PAR_BLOCK + out.len();
        max_exponents_of(exps, parts, range.clone());
        add_fixed_of(acc, parts, range, exps, headroom);
        finish_into(acc, exps, headroom, out);
    };
    if on_pool(n, PAR_BLOCK) {
        let blocks =
            out.par_chunks_mut(PAR_BLOCK).zip(exps.par_chunks_mut(PAR_BLOCK)).zip(acc.par_chunks_mut(PAR_BLOCK));
        blocks.enumerate().for_each(|(b, ((out, exps), acc))| block(b, out, exps, acc));
    } else {
        let blocks = out.chunks_mut(PAR_BLOCK).zip(exps.chunks_mut(PAR_BLOCK)).zip(acc.chunks_mut(PAR_BLOCK));
        blocks.enumerate().for_each(|(b, ((out, exps), acc))| block(b, out, exps, acc));
    }
}

/// `n` values of `T` (an accumulator of either width, or exponent bytes) viewed in a
/// buffer of 64-bit words, grown as needed: a caller keeps one buffer across calls and
/// element types. New words are zero; old ones keep their contents.
pub fn words_as<T: bytemuck::Pod>(words: &mut Vec<i64>, n: usize) -> &mut [T] {
    words.resize((n * std::mem::size_of::<T>()).div_ceil(8), 0);
    &mut bytemuck::cast_slice_mut(&mut words[..])[..n]
}

/// Wire format of a phase-2 accumulator: magic `RBS1`, headroom (u8), element count (u64
/// LE), the exponents (one byte each), then the fixed-point values (i64 LE each).
pub fn encode(acc: &[i64], exps: &[u8], headroom: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + exps.len() + 8 * acc.len());
    out.extend_from_slice(b"RBS1");
    out.push(headroom as u8);
    out.extend_from_slice(&(acc.len() as u64).to_le_bytes());
    out.extend_from_slice(exps);
    for a in acc {
        out.extend_from_slice(&a.to_le_bytes());
    }
    out
}

/// Parses [`encode`]'s output: `(acc, exps, headroom)`.
pub fn decode(bytes: &[u8]) -> Result<(Vec<i64>, Vec<u8>, u32), String> {
    if bytes.len() < 13 || &bytes[..4] != b"RBS1" {
        return Err("not a batched-sum accumulator (bad magic or too short)".into());
    }
    let headroom = u32::from(bytes[4]);
    if headroom > 39 {
        return Err(format!("headroom {headroom} is out of range"));
    }
    let n = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes")) as usize;
    let need = n.checked_mul(9).and_then(|b| b.checked_add(13)).ok_or("element count overflows")?;
    if bytes.len() != need {
        return Err(format!("{} bytes for {n} elements, expected {need}", bytes.len()));
    }
    let exps = bytes[13..13 + n].to_vec();
    let acc = bytes[13 + n..].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok((acc, exps, headroom))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_simple_vectors_and_specials() {
        let a = [1.0f32, -2.5, 1e-3, f32::INFINITY, 0.0, f32::NAN];
        let b = [2.0f32, 2.5, 1e-3, 1.0, -0.0, 1.0];
        let c = [0.5f32, 0.0, 1e-3, f32::NEG_INFINITY, 0.0, 2.0];
        let s = sum_parts(&[&a, &b, &c], DEFAULT_HEADROOM);
        assert_eq!(s[0], 3.5);
        assert_eq!(s[1], 0.0);
        assert!((s[2] - 3e-3).abs() < 1e-9);
        assert!(s[3].is_nan());
        assert_eq!(s[4], 0.0);
        assert!(s[5].is_nan());
        let s = sum_parts(&[&a[3..4], &b[3..4]], DEFAULT_HEADROOM);
        assert_eq!(s[0], f32::INFINITY);
    }

    #[test]
    fn wire_format_round_trips_and_rejects_damage() {
        let (acc, exps) = (vec![5i64, -7, 1 << 40], vec![127u8, 130, 255]);
        let bytes = encode(&acc, &exps, 16);
        assert_eq!(decode(&bytes).unwrap(), (acc, exps, 16));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"RBS2").is_err());
    }
}
