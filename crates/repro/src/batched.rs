//! Reproducible element-wise sum of many equal-length vectors: what a gradient
//! all-reduce needs, bitwise identical for any number of parts, any grouping of them into
//! workers, and any arrival order.
//!
//! # The two phases
//!
//! 1. **Scales.** For each block of [`EXP_BLOCK`] consecutive elements, the maximum
//!    exponent field over every element of the block in every part (one byte per block;
//!    combined with `max`, which is associative and commutative).
//! 2. **Fixed point.** Each part converts each element to a 64-bit integer at the scale of
//!    its block, and the integers are summed (associative and commutative; the headroom
//!    below guarantees no overflow). The sum is converted back to f32 once.
//!
//! Because every term is converted at a scale that depends only on the global maximum of
//! its block, the integers, their sum, and the result are functions of the multiset of
//! terms alone. On the wire the scales cost 1/64 of a byte per element, so a distributed
//! sum moves the integers' bytes (8 per element; 4 in the 32-bit form of [`Fixed`] and
//! [`sum_parts_as`], at about the accuracy of a float sum) and one small round of scales.
//!
//! The loops over memory (the block maximum and both conversions) are
//! `kernels::fixed_point`'s, run on the instruction set the process selected: integer
//! operations only, so every instruction set gives the same bits.
//!
//! A sum of few terms ([`sum_range`], which [`sum_parts_as`] and the owners of a
//! distributed sum run) takes both phases a block at a time in registers, and adds a
//! block whose terms sit on its scale's grid in `f64`: the exact sum that the integers
//! would hold, rounded once, at a float sum's cost and with the same bits.
//!
//! # Accuracy
//!
//! With `headroom = h` bits (at most `2^h` parts), element `i` whose block has the largest
//! magnitude `M_b` over the parts is computed with an error below `n * 2^(h - 62) * M_b`
//! from the terms' truncation (toward zero, one unit of `2^-(62 - h)` relative to `M_b` per
//! term), plus half an ulp of the result for the final rounding. For the default `h = 16`
//! that is below `2^-30 * M_b` for up to 65,536 parts: an element within `2^-22` of its
//! block's largest keeps every bit a float sum could, and the error is far below the
//! `n * 2^-24 * Σ|terms|` bound of a naive f32 sum. Terms smaller than `2^-(62 - h)` times
//! their block's largest vanish.
//!
//! # Special values
//!
//! An element with any NaN, or both infinities, is NaN; otherwise an infinity wins. The
//! finite elements of a block that holds an infinity or NaN in any part are NaN (no scale
//! was agreed for them: the sum is not to be used). A zero sum is `+0.0` (the sign of zero
//! is not kept).

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
    /// Adds finite values at the finite scales of their blocks (`values[0]` is element
    /// `offset` of the block whose scale is `exps[0]`; see `kernels::fixed_point`).
    /// With `overwrite` the terms replace what `acc` held.
    fn add_finite(
        isa: kernels::Isa,
        acc: &mut [Self],
        values: &[f32],
        exps: &[u8],
        offset: usize,
        s: i32,
        overwrite: bool,
    );
    /// Converts finished sums at the finite scales of their blocks back to floats.
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[Self], exps: &[u8], offset: usize, s: i32);
    /// Sums the blocks of `terms` (elements `start ..`) into `out` in registers, each
    /// block's scale into `tops`; the blocks whose scale is 255 are left unwritten.
    fn sum_blocks(isa: kernels::Isa, out: &mut [f32], tops: &mut [u8], terms: &[&[f32]], start: usize, s: i32);
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
    } else if neg > 0 {
        f32::NEG_INFINITY
    } else {
        // A finite element of a block with a special term: no scale was agreed for it.
        f32::NAN
    }
}

impl Fixed for i64 {
    /// 24 + 39 = 63 bits: the largest term at shift 0 sits 39 bits below the sign.
    const MAX_HEADROOM: u32 = 39;
    fn add_finite(
        isa: kernels::Isa,
        acc: &mut [i64],
        values: &[f32],
        exps: &[u8],
        offset: usize,
        s: i32,
        overwrite: bool,
    ) {
        kernels::fixed_point::add_fixed64_blocks(isa, acc, values, exps, offset, s, overwrite)
    }
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[i64], exps: &[u8], offset: usize, s: i32) {
        kernels::fixed_point::finish64_blocks(isa, out, acc, exps, offset, s)
    }
    fn sum_blocks(isa: kernels::Isa, out: &mut [f32], tops: &mut [u8], terms: &[&[f32]], start: usize, s: i32) {
        kernels::fixed_point::sum_fixed64_blocks(isa, out, tops, terms, start, s)
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
    fn add_finite(
        isa: kernels::Isa,
        acc: &mut [i32],
        values: &[f32],
        exps: &[u8],
        offset: usize,
        s: i32,
        overwrite: bool,
    ) {
        kernels::fixed_point::add_fixed32_blocks(isa, acc, values, exps, offset, s, overwrite)
    }
    fn finish_finite(isa: kernels::Isa, out: &mut [f32], acc: &[i32], exps: &[u8], offset: usize, s: i32) {
        kernels::fixed_point::finish32_blocks(isa, out, acc, exps, offset, s)
    }
    fn sum_blocks(isa: kernels::Isa, out: &mut [f32], tops: &mut [u8], terms: &[&[f32]], start: usize, s: i32) {
        kernels::fixed_point::sum_fixed32_blocks(isa, out, tops, terms, start, s)
    }
    fn count_special(acc: &mut i32, bits: u32) {
        *acc += special_one(bits, 9) as i32;
    }
    fn finish_special(acc: i32) -> f32 {
        special_value(i64::from(acc), 9)
    }
}

/// Elements that share one scale: the first phase keeps one byte per block of this many
/// consecutive elements (block `b` holds elements `b * EXP_BLOCK ..`), so that it moves
/// 1/64 of a byte per element instead of a byte.
pub const EXP_BLOCK: usize = kernels::fixed_point::SCALE_BLOCK;

/// Scale blocks of a vector of `n` elements.
pub fn blocks_of(n: usize) -> usize {
    n.div_ceil(EXP_BLOCK)
}

/// Phase 1: raises the scale of each block of `exps` (one byte per block of the whole
/// vector) to the largest exponent among `values`, which are the vector's elements from
/// `offset` on. Start from zeros.
pub fn max_exponents(exps: &mut [u8], values: &[f32], offset: usize) {
    let isa = kernels::isa::selected();
    // A first block that `values` enters part of the way.
    let head = ((EXP_BLOCK - offset % EXP_BLOCK) % EXP_BLOCK).min(values.len());
    if head > 0 {
        let b = offset / EXP_BLOCK;
        kernels::fixed_point::max_block_exponents(isa, &mut exps[b..=b], &values[..head]);
    }
    let rest = &values[head..];
    let first = (offset + head) / EXP_BLOCK;
    kernels::fixed_point::max_block_exponents(isa, &mut exps[first..first + blocks_of(rest.len())], rest);
}

/// The stretches of the elements `offset .. offset + len` of a vector whose block scales are
/// `exps`, as `(range relative to offset, special)`: runs of blocks with finite scales, and
/// each block whose scale is special (an infinity or NaN among its terms) alone.
fn stretches(exps: &[u8], offset: usize, len: usize) -> impl Iterator<Item = (std::ops::Range<usize>, bool)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= len {
            return None;
        }
        let start = i;
        let block_end = |i: usize| ((((offset + i) / EXP_BLOCK) + 1) * EXP_BLOCK - offset).min(len);
        if exps[(offset + i) / EXP_BLOCK] == SPECIAL {
            i = block_end(i);
            return Some((start..i, true));
        }
        while i < len && exps[(offset + i) / EXP_BLOCK] != SPECIAL {
            i = block_end(i);
        }
        Some((start..i, false))
    })
}

/// Phase 2: adds `values` (the vector's elements from `offset` on) converted to fixed
/// point at their blocks' scales in `exps` into `acc` (aligned with `values`).
pub fn add_fixed<A: Fixed>(acc: &mut [A], values: &[f32], exps: &[u8], offset: usize, headroom: u32) {
    convert(acc, values, exps, offset, headroom, false);
}

/// [`add_fixed`] into an `acc` whose contents are replaced: the first term of a sum, with
/// no pass to zero the accumulator first.
pub fn write_fixed<A: Fixed>(acc: &mut [A], values: &[f32], exps: &[u8], offset: usize, headroom: u32) {
    convert(acc, values, exps, offset, headroom, true);
}

fn convert<A: Fixed>(acc: &mut [A], values: &[f32], exps: &[u8], offset: usize, headroom: u32, overwrite: bool) {
    assert_eq!(acc.len(), values.len(), "accumulator and value lengths differ");
    let s = A::shift(headroom);
    let isa = kernels::isa::selected();
    for (r, special) in stretches(exps, offset, values.len()) {
        let at = offset + r.start;
        if !special {
            A::add_finite(isa, &mut acc[r.clone()], &values[r], &exps[at / EXP_BLOCK..], at % EXP_BLOCK, s, overwrite);
            continue;
        }
        // A block whose scale is special counts its special values; its finite terms add
        // nothing, and an element with no special term comes out NaN (see the module's
        // documentation).
        if overwrite {
            acc[r.clone()].fill(A::default());
        }
        for (a, v) in acc[r.clone()].iter_mut().zip(&values[r]) {
            let bits = v.to_bits();
            if (bits >> 23) & 0xFF == 0xFF {
                A::count_special(a, bits);
            }
        }
    }
}

/// Phase 1 over several parts: [`max_exponents`] of the elements `range` of every part
/// into `exps`, the scales of the blocks of the whole vector.
pub fn max_exponents_of<P: AsRef<[f32]>>(exps: &mut [u8], parts: &[P], range: std::ops::Range<usize>) {
    for p in parts {
        max_exponents(exps, &p.as_ref()[range.clone()], range.start);
    }
}

/// Elements per tile of [`add_fixed_of`]: a tile's accumulators (32 KiB in 64 bits) stay
/// in a core's nearest cache while every part passes over them.
pub const TILE: usize = 4096;

/// Phase 2 over several parts: [`add_fixed`] of the elements `range` of every part into
/// `acc` (the range's length), at the scales of their blocks in `exps`, tile by tile, so
/// that a tile's accumulators stay in cache while every part is added. Integer addition:
/// the tiling changes no bit.
pub fn add_fixed_of<A: Fixed, P: AsRef<[f32]>>(
    acc: &mut [A],
    parts: &[P],
    range: std::ops::Range<usize>,
    exps: &[u8],
    headroom: u32,
) {
    sum_fixed_of(acc, parts, range, exps, 0, headroom, false);
}

/// [`add_fixed_of`] into an `acc` whose contents are replaced by the parts' sum (zeros
/// when there are no parts).
pub fn write_fixed_of<A: Fixed, P: AsRef<[f32]>>(
    acc: &mut [A],
    parts: &[P],
    range: std::ops::Range<usize>,
    exps: &[u8],
    headroom: u32,
) {
    sum_fixed_of(acc, parts, range, exps, 0, headroom, true);
}

/// [`add_fixed_of`] (or [`write_fixed_of`]) with `exps` the scales of the blocks from element
/// `base` on (a multiple of [`EXP_BLOCK`]).
fn sum_fixed_of<A: Fixed, P: AsRef<[f32]>>(
    acc: &mut [A],
    parts: &[P],
    range: std::ops::Range<usize>,
    exps: &[u8],
    base: usize,
    headroom: u32,
    overwrite: bool,
) {
    assert_eq!(acc.len(), range.len(), "accumulator and range lengths differ");
    if parts.is_empty() && overwrite {
        acc.fill(A::default());
    }
    for (t, tile) in acc.chunks_mut(TILE).enumerate() {
        let start = range.start + t * TILE;
        for (k, p) in parts.iter().enumerate() {
            convert(tile, &p.as_ref()[start..start + tile.len()], exps, start - base, headroom, overwrite && k == 0);
        }
    }
}

/// Converts the summed fixed-point values back to floats (the vector from its start).
pub fn finish<A: Fixed>(acc: &[A], exps: &[u8], headroom: u32) -> Vec<f32> {
    let mut out = vec![0.0; acc.len()];
    finish_into(acc, exps, 0, headroom, &mut out);
    out
}

/// [`finish`] of the sums `acc` of the vector's elements from `offset` on, into `out` (of
/// the same length), for callers that reuse their buffers.
pub fn finish_into<A: Fixed>(acc: &[A], exps: &[u8], offset: usize, headroom: u32, out: &mut [f32]) {
    assert_eq!(acc.len(), out.len(), "lengths differ");
    let s = A::shift(headroom);
    let isa = kernels::isa::selected();
    for (r, special) in stretches(exps, offset, acc.len()) {
        let at = offset + r.start;
        if special {
            for (o, &a) in out[r.clone()].iter_mut().zip(&acc[r]) {
                *o = A::finish_special(a);
            }
        } else {
            A::finish_finite(isa, &mut out[r.clone()], &acc[r], &exps[at / EXP_BLOCK..], at % EXP_BLOCK, s);
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
    lows: Vec<u8>,
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
    let Scratch { exps, lows, acc } = scratch;
    for bytes in [&mut *exps, &mut *lows] {
        bytes.resize(blocks_of(n), 0);
    }
    let acc = words_as::<A>(acc, n);
    // A parallel block is a whole number of scale blocks: each works on its own slices
    // of the scales and sums, counted from its start (no allocation: a training step's sum
    // allocates nothing once its buffers have grown).
    const SCALES: usize = PAR_BLOCK / EXP_BLOCK;
    let block = |b: usize, out: &mut [f32], room: Room<'_, A>| {
        sum_range(parts, b * PAR_BLOCK..b * PAR_BLOCK + out.len(), out, headroom, room);
    };
    if on_pool(n, PAR_BLOCK) {
        let rooms = (exps.par_chunks_mut(SCALES).zip(lows.par_chunks_mut(SCALES)))
            .zip(acc.par_chunks_mut(PAR_BLOCK))
            .map(|((tops, lows), acc)| Room { tops, lows, acc });
        out.par_chunks_mut(PAR_BLOCK).zip(rooms).enumerate().for_each(|(b, (out, room))| block(b, out, room));
    } else {
        let rooms = (exps.chunks_mut(SCALES).zip(lows.chunks_mut(SCALES)))
            .zip(acc.chunks_mut(PAR_BLOCK))
            .map(|((tops, lows), acc)| Room { tops, lows, acc });
        out.chunks_mut(PAR_BLOCK).zip(rooms).enumerate().for_each(|(b, (out, room))| block(b, out, room));
    }
}

/// The most terms that [`sum_range`] adds in `f64` (in the 64-bit sum with the default
/// headroom: 64 terms below `2^47` units each stay below `2^53` units).
pub const MOST_EXACT_TERMS: usize = 64;

/// Whether a sum of `terms` terms at shift `s` takes the exact path of [`sum_range`] in the
/// blocks where it can: when the terms' magnitudes, below `2^(24 + s)` units each, add up
/// below `2^53` units (so that `f64` adds them exactly), and the shift is wide enough (at
/// least 16 bits: the 64-bit sums) that most blocks of real data have their terms on the
/// grid; in 32 bits (a shift of at most 7) few blocks would, and the spread's pass would
/// be wasted.
fn exact_path(terms: usize, s: i32) -> bool {
    s >= 16 && terms <= MOST_EXACT_TERMS && (terms as u128) << (24 + s) <= 1u128 << 53
}

/// The working room of [`sum_range`]: a byte per scale block (`tops`, `lows`) and an
/// accumulator per element, each as long as the range. Its contents on entry do not matter.
pub struct Room<'a, A> {
    /// The blocks' scales.
    pub tops: &'a mut [u8],
    /// The blocks' smallest exponent fields among nonzero terms.
    pub lows: &'a mut [u8],
    /// Fixed-point accumulators.
    pub acc: &'a mut [A],
}

/// The elements `range` of the reproducible sum of `parts` (at least the range's length
/// each) into `out`, for a range that starts at a block boundary: the bits of
/// [`sum_parts_as`], which runs this block by block.
///
/// Up to [`MOST_EXACT_TERMS`] terms are summed a block at a time with every term's block
/// in cache: its scale over the terms, then each term converted at it and added in
/// registers, and the sum converted back, with no accumulator in memory.
///
/// Where a block's terms all sit on the grid of its scale's unit (their exponents spread
/// no wider than the shift: for the default 64-bit sum, 23 binades below the block's
/// largest; the rule in real data) the conversion to fixed point drops no bit, so the
/// integer sum is the exact sum of the terms and its conversion back rounds the exact sum
/// once. `f64` holds that exact sum too, so in the 64-bit sum such blocks are added in
/// `f64` and rounded once to `f32`, with no integers: the same bits (a zero sum is `+0.0`
/// on both paths; a subnormal sum is exact on both), at the cost of a float sum.
///
/// Blocks with an infinity or NaN among their terms, and sums of more terms, take the
/// integers through memory, tile by tile.
///
/// A block of `out` is written only once every term's values in it have been read, by
/// whichever way sums it: a caller whose output buffer is one of the terms (the Python
/// package's hook sums a bucket's micro-batches into the last one's gradients) gets the
/// same bits.
pub fn sum_range<A: Fixed, P: AsRef<[f32]>>(
    parts: &[P],
    range: std::ops::Range<usize>,
    out: &mut [f32],
    headroom: u32,
    room: Room<'_, A>,
) {
    let n = range.len();
    let Room { tops, lows, acc } = room;
    assert!(range.start.is_multiple_of(EXP_BLOCK), "a range that starts inside a block");
    assert!(out.len() == n && acc.len() == n, "output, accumulator and range lengths differ");
    assert!(tops.len() == blocks_of(n) && lows.len() == blocks_of(n), "one scale per block");
    let isa = kernels::isa::selected();
    let s = A::shift(headroom);
    if parts.len() > MOST_EXACT_TERMS {
        through_memory(parts, range, out, tops, acc, headroom);
        return;
    }
    let mut terms: [&[f32]; MOST_EXACT_TERMS] = [&[]; MOST_EXACT_TERMS];
    for (t, p) in terms.iter_mut().zip(parts) {
        *t = p.as_ref();
    }
    let terms = &terms[..parts.len()];
    // The blocks on the grid are summed in f64; the runs of the others in registers.
    let exact = exact_path(parts.len(), s);
    let in_f64 = |b: usize, tops: &[u8], lows: &[u8]| exact && kernels::fixed_point::on_grid(tops[b], lows[b], s);
    if exact {
        // The blocks on the grid in f64, and every block's span; the others are summed
        // below, from terms that no write has touched (`out` may be one of them).
        kernels::fixed_point::sum_exact(isa, out, tops, lows, terms, range.start, s);
    }
    let mut b = 0;
    while b < tops.len() {
        let on = in_f64(b, tops, lows);
        let mut e = b + 1;
        while e < tops.len() && in_f64(e, tops, lows) == on {
            e += 1;
        }
        if !on {
            let r = b * EXP_BLOCK..(e * EXP_BLOCK).min(n);
            A::sum_blocks(isa, &mut out[r], &mut tops[b..e], terms, range.start + b * EXP_BLOCK, s);
            // The blocks with an infinity or NaN, which the registers leave.
            for k in b..e {
                if tops[k] == SPECIAL {
                    let r = k * EXP_BLOCK..((k + 1) * EXP_BLOCK).min(n);
                    let at = range.start + r.start..range.start + r.end;
                    through_memory(parts, at, &mut out[r.clone()], &mut tops[k..=k], &mut acc[r], headroom);
                }
            }
        }
        b = e;
    }
}

/// The elements `range` (from a block boundary) of the sum of `parts` into `out` through
/// integers in memory, tile by tile, with the scales of its blocks in `tops` and an
/// accumulator per element in `acc`: the way of any number of terms and of special values.
fn through_memory<A: Fixed, P: AsRef<[f32]>>(
    parts: &[P],
    range: std::ops::Range<usize>,
    out: &mut [f32],
    tops: &mut [u8],
    acc: &mut [A],
    headroom: u32,
) {
    let isa = kernels::isa::selected();
    tops.fill(0);
    for p in parts {
        kernels::fixed_point::max_block_exponents(isa, tops, &p.as_ref()[range.clone()]);
    }
    sum_fixed_of(acc, parts, range.clone(), tops, range.start, headroom, true);
    finish_into(acc, tops, 0, headroom, out);
}

/// `n` values of `T` (an accumulator of either width, or exponent bytes) viewed in a
/// buffer of 64-bit words, grown as needed: a caller keeps one buffer across calls and
/// element types. New words are zero; old ones keep their contents. The buffer never
/// shrinks: a caller that asks for a short view (the scales) between two long ones (the
/// sums) would otherwise have every word past it zeroed again at the next long one.
pub fn words_as<T: bytemuck::Pod>(words: &mut Vec<i64>, n: usize) -> &mut [T] {
    let needed = (n * std::mem::size_of::<T>()).div_ceil(8);
    if words.len() < needed {
        words.resize(needed, 0);
    }
    &mut bytemuck::cast_slice_mut(&mut words[..])[..n]
}

/// Wire format of a phase-2 accumulator: magic `RBS2`, headroom (u8), element count (u64
/// LE), the scales (one byte per block of [`EXP_BLOCK`] elements), then the fixed-point
/// values (i64 LE each).
pub fn encode(acc: &[i64], exps: &[u8], headroom: u32) -> Vec<u8> {
    assert_eq!(exps.len(), blocks_of(acc.len()), "one scale per block");
    let mut out = Vec::with_capacity(13 + exps.len() + 8 * acc.len());
    out.extend_from_slice(b"RBS2");
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
    if bytes.len() < 13 || &bytes[..4] != b"RBS2" {
        return Err("not a batched-sum accumulator (bad magic or too short)".into());
    }
    let headroom = u32::from(bytes[4]);
    if headroom > 39 {
        return Err(format!("headroom {headroom} is out of range"));
    }
    let n = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes")) as usize;
    let need = n.checked_mul(8).and_then(|b| b.checked_add(13 + blocks_of(n))).ok_or("element count overflows")?;
    if bytes.len() != need {
        return Err(format!("{} bytes for {n} elements, expected {need}", bytes.len()));
    }
    let scales = 13 + blocks_of(n);
    let exps = bytes[13..scales].to_vec();
    let acc = bytes[scales..].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok((acc, exps, headroom))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `values` at the start of a block of their own each (the rest of the block zeros).
    fn in_blocks(values: &[f32]) -> Vec<f32> {
        let mut v = vec![0.0; values.len() * EXP_BLOCK];
        for (i, &x) in values.iter().enumerate() {
            v[i * EXP_BLOCK] = x;
        }
        v
    }

    #[test]
    fn a_short_view_between_long_ones_keeps_the_buffer() {
        let mut words = Vec::new();
        words_as::<i32>(&mut words, 1000).fill(7);
        assert_eq!(words_as::<u8>(&mut words, 10).len(), 10);
        // Not zeroed again: the long view finds what the first one left.
        assert!(words_as::<i32>(&mut words, 1000).iter().all(|&x| x == 7));
        assert_eq!(words.len(), 500);
    }

    #[test]
    fn sums_simple_vectors_and_specials() {
        let a = in_blocks(&[1.0f32, -2.5, 1e-3, f32::INFINITY, 0.0, f32::NAN, f32::INFINITY]);
        let b = in_blocks(&[2.0f32, 2.5, 1e-3, 1.0, -0.0, 1.0, 3.0]);
        let c = in_blocks(&[0.5f32, 0.0, 1e-3, f32::NEG_INFINITY, 0.0, 2.0, 1.0]);
        let s = sum_parts(&[&a, &b, &c], DEFAULT_HEADROOM);
        let at = |i: usize| s[i * EXP_BLOCK];
        assert_eq!(at(0), 3.5);
        assert_eq!(at(1), 0.0);
        assert!((at(2) - 3e-3).abs() < 1e-9);
        assert!(at(3).is_nan());
        assert_eq!(at(4), 0.0);
        assert!(at(5).is_nan());
        assert_eq!(at(6), f32::INFINITY);
        // The zeros that share a block with a special term have no agreed scale: NaN.
        assert!(s[3 * EXP_BLOCK + 1].is_nan() && s[5 * EXP_BLOCK + 1].is_nan());
        assert_eq!(s[EXP_BLOCK + 1], 0.0);
    }

    #[test]
    fn written_sums_equal_sums_added_into_zeros_special_blocks_too() {
        let mut a = in_blocks(&[1.5f32, f32::NAN, -2.0, f32::INFINITY]);
        a[1] = 3.0;
        let b = in_blocks(&[0.25f32, 1.0, f32::NEG_INFINITY, 2.0]);
        let mut exps = vec![0u8; blocks_of(a.len())];
        max_exponents_of(&mut exps, &[&a, &b], 0..a.len());
        let mut added = vec![0i64; a.len()];
        add_fixed_of(&mut added, &[&a, &b], 0..a.len(), &exps, DEFAULT_HEADROOM);
        let mut written = vec![12345i64; a.len()];
        write_fixed_of(&mut written, &[&a, &b], 0..a.len(), &exps, DEFAULT_HEADROOM);
        assert_eq!(added, written);
        let mut none = vec![7i32; 5];
        write_fixed_of::<i32, &[f32]>(&mut none, &[], 0..5, &exps, NARROW_HEADROOM);
        assert_eq!(none, vec![0; 5]);
    }

    #[test]
    fn a_block_shares_the_scale_of_its_largest_term() {
        // Beside 2^20 in its block, 1 + 2^-23 keeps the bits a 64-bit sum with 16 bits of
        // headroom keeps below 2^20's last place (2^-23 · 2^-3 here: all of them); beside
        // 2^40 it keeps those above 2^(40 - 46) only.
        let tiny = 1.0 + f32::EPSILON;
        let mut a = vec![0.0f32; 2 * EXP_BLOCK];
        (a[0], a[1], a[EXP_BLOCK], a[EXP_BLOCK + 1]) = (2f32.powi(20), tiny, 2f32.powi(40), tiny);
        let s = sum_parts(&[&a], DEFAULT_HEADROOM);
        assert_eq!(s[1], tiny);
        assert_eq!(s[EXP_BLOCK + 1], 1.0);
    }

    #[test]
    fn wire_format_round_trips_and_rejects_damage() {
        let (acc, exps) = (vec![5i64, -7, 1 << 40], vec![127u8]);
        let bytes = encode(&acc, &exps, 16);
        assert_eq!(decode(&bytes).unwrap(), (acc, exps, 16));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"RBS1").is_err());
    }
}
