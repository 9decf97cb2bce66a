//! Reproducible summation: the correctly rounded exact sum, whatever the order.
//!
//! # How
//!
//! Every finite float is an integer multiple of the format's smallest subnormal, so a
//! sum of floats is an integer multiple of it too. The accumulator keeps that integer
//! exactly, split by exponent: bucket `b` counts units of `2^(b - bias - mantissa)`, and
//! adding a float adds its signed significand (an integer below `2^24` for f32, `2^53` for
//! f64) to the bucket of its exponent field. Integer addition is associative and
//! commutative, so the buckets, and therefore the result, do not depend on the order of
//! the inputs, on how they were split into chunks, on the number of threads, or on the
//! order in which partial accumulators are merged. [`finish`](ReproSum::finish) adds the
//! buckets into one wide integer and rounds it once to the nearest float (ties to even).
//!
//! # Accuracy
//!
//! The result is the exact sum correctly rounded: its error is at most half a unit in the
//! last place of the result (0.5 ulp), the best any summation can do, and zero when the
//! exact sum is representable. There is no dependence on the number of terms or on
//! cancellation. Exact sums beyond the largest finite float round to infinity.
//!
//! # Special values
//!
//! - any NaN input, or both `+inf` and `-inf`, gives NaN;
//! - otherwise an infinite input gives that infinity;
//! - an exact zero sum gives `+0.0`, except that a sum whose inputs are all `-0.0` (at
//!   least one) gives `-0.0`, as IEEE-754 addition does; the empty sum is `+0.0`.
//!
//! # Cost
//!
//! Per f32 element: a handful of integer operations and one add into an L1-resident
//! bucket (four interleaved bucket arrays hide the store-to-load latency). Buckets are
//! `i64` for f32 (room for 2^39 terms before a carry pass, which runs automatically) and
//! `i128` for f64.

use crate::exact::BigInt;

/// Float formats the reproducible sum supports.
pub trait ReproFloat: Copy + Send + Sync + 'static {
    /// Significand bits including the hidden bit.
    const MANT_BITS: u32;
    /// Exponent bits.
    const EXP_BITS: u32;
    /// Limbs of the wide integer that holds any total.
    const LIMBS: usize;
    /// The bit pattern, widened.
    fn bits(self) -> u64;
    /// The float of a bit pattern.
    fn from_bits64(bits: u64) -> Self;
    /// Serialised type tag.
    const TAG: u8;
    /// The slice as f32, when `Self` is f32.
    fn as_f32(xs: &[Self]) -> Option<&[f32]>;
    /// The slice as f64, when `Self` is f64.
    fn as_f64(xs: &[Self]) -> Option<&[f64]>;
}

impl ReproFloat for f32 {
    const MANT_BITS: u32 = 24;
    const EXP_BITS: u32 = 8;
    // 254 buckets, weights up to 2^253 units, i64 buckets: under 384 bits.
    const LIMBS: usize = 6;
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn from_bits64(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
    const TAG: u8 = 4;
    fn as_f32(xs: &[Self]) -> Option<&[f32]> {
        Some(xs)
    }
    fn as_f64(_: &[Self]) -> Option<&[f64]> {
        None
    }
}

impl ReproFloat for f64 {
    const MANT_BITS: u32 = 53;
    const EXP_BITS: u32 = 11;
    // 2046 buckets, weights up to 2^2045 units, i128 buckets: under 2240 bits.
    const LIMBS: usize = 35;
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn from_bits64(bits: u64) -> Self {
        f64::from_bits(bits)
    }
    const TAG: u8 = 8;
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f64(xs: &[Self]) -> Option<&[f64]> {
        Some(xs)
    }
}

/// Counters of special inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Specials {
    nan: u64,
    pos_inf: u64,
    neg_inf: u64,
    /// Inputs that are not `-0.0` (counted only until the first one is seen).
    not_neg_zero: u64,
    /// All inputs.
    count: u64,
}

/// Decomposes a float's bits into (bucket, signed significand), or `None` for inf/NaN.
#[inline(always)]
fn split<F: ReproFloat>(bits: u64) -> Option<(usize, i64)> {
    let frac_bits = F::MANT_BITS - 1;
    let field = (bits >> frac_bits) & ((1 << F::EXP_BITS) - 1);
    if field == (1 << F::EXP_BITS) - 1 {
        return None;
    }
    let frac = bits & ((1 << frac_bits) - 1);
    // Subnormals (field 0) share the scale of field 1, without the hidden bit.
    let mant = (frac | (u64::from(field != 0) << frac_bits)) as i64;
    let negative = (bits >> (frac_bits + F::EXP_BITS)) & 1 == 1;
    Some((field.max(1) as usize, if negative { -mant } else { mant }))
}

/// Lanes of interleaved buckets for f32 (independent dependency chains).
const LANES: usize = 4;
/// Terms a bucket of the f32 accumulator may take before a carry pass (each under 2^24,
/// an i64 holds 2^39 of them).
const F32_BUDGET: u64 = 1 << 38;

/// A mergeable accumulator whose total is the exact sum of everything added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReproSum<F: ReproFloat> {
    /// f32: `LANES` arrays of 256 i64 buckets (fixed sizes, so indexing by an 8-bit
    /// exponent needs no bounds check). Empty for f64.
    small: Vec<[i64; 256]>,
    /// f64: 2048 i128 buckets. Empty for f32.
    wide: Vec<[i128; 2048]>,
    /// Terms added to `small` since its last carry pass.
    pending: u64,
    specials: Specials,
    _float: std::marker::PhantomData<F>,
}

impl<F: ReproFloat> Default for ReproSum<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F: ReproFloat> ReproSum<F> {
    /// An empty accumulator.
    pub fn new() -> Self {
        let (small, wide) =
            if F::TAG == 4 { (vec![[0; 256]; LANES], Vec::new()) } else { (Vec::new(), vec![[0; 2048]]) };
        ReproSum { small, wide, pending: 0, specials: Specials::default(), _float: std::marker::PhantomData }
    }

    /// Adds one value.
    pub fn add(&mut self, x: F) {
        self.add_slice(std::slice::from_ref(&x));
    }

    /// Adds every value of `xs`.
    pub fn add_slice(&mut self, xs: &[F]) {
        let neg_zero = 1u64 << (F::MANT_BITS - 1 + F::EXP_BITS);
        // Only "are all inputs -0.0?" matters, and the first other input settles it.
        if self.specials.not_neg_zero == 0 {
            self.specials.not_neg_zero = xs.iter().filter(|x| x.bits() != neg_zero).count() as u64;
        }
        self.specials.count += xs.len() as u64;
        if let Some(xs) = F::as_f32(xs) {
            for chunk in xs.chunks(F32_BUDGET as usize) {
                if self.pending + chunk.len() as u64 > F32_BUDGET {
                    self.carry();
                }
                self.pending += chunk.len() as u64;
                self.add_f32(chunk);
            }
        } else if let Some(xs) = F::as_f64(xs) {
            let buckets = &mut self.wide[0];
            let mut specials = Vec::new();
            for x in xs {
                let bits = x.to_bits();
                match split::<f64>(bits) {
                    Some((b, m)) => buckets[b & 2047] += i128::from(m),
                    None => specials.push(bits),
                }
            }
            for bits in specials {
                self.special(bits);
            }
        }
    }

    /// The f32 hot loop: four interleaved bucket arrays, indexed by the 8-bit exponent.
    fn add_f32(&mut self, xs: &[f32]) {
        #[inline(always)]
        fn one(lane: &mut [i64; 256], x: f32, specials: &mut Vec<u64>) {
            let bits = x.to_bits();
            let field = (bits >> 23) as u8; // the sign bit is shifted out by the cast
            if field == 0xFF {
                specials.push(u64::from(bits));
                return;
            }
            let mant = i64::from((bits & 0x7F_FFFF) | (u32::from(field != 0) << 23));
            let signed = if (bits as i32) < 0 { -mant } else { mant };
            lane[usize::from(field.max(1))] += signed;
        }
        let [l0, l1, l2, l3] = &mut self.small[..] else { unreachable!("f32 accumulators have four lanes") };
        let mut specials = Vec::new();
        let mut quads = xs.chunks_exact(LANES);
        for q in &mut quads {
            one(l0, q[0], &mut specials);
            one(l1, q[1], &mut specials);
            one(l2, q[2], &mut specials);
            one(l3, q[3], &mut specials);
        }
        for &x in quads.remainder() {
            one(l0, x, &mut specials);
        }
        for bits in specials {
            self.special(bits);
        }
    }

    #[cold]
    fn special(&mut self, bits: u64) {
        let frac = bits & ((1 << (F::MANT_BITS - 1)) - 1);
        if frac != 0 {
            self.specials.nan += 1;
        } else if bits >> (F::MANT_BITS - 1 + F::EXP_BITS) == 1 {
            self.specials.neg_inf += 1;
        } else {
            self.specials.pos_inf += 1;
        }
    }

    /// Folds the f32 lanes into lane 0 and moves each bucket's high bits to the bucket 32
    /// exponents up (same value, smaller numbers), so buckets never overflow.
    fn carry(&mut self) {
        if F::TAG != 4 {
            return;
        }
        let (first, rest) = self.small.split_at_mut(1);
        let lane0 = &mut first[0];
        for lane in rest {
            for (a, b) in lane0.iter_mut().zip(lane.iter_mut()) {
                *a += std::mem::take(b);
            }
        }
        // Bucket b+32 has weight 2^32 times bucket b; the top buckets keep their bits
        // (they hold at most 2^32 terms' worth after a carry and can take 2^38 more).
        for b in 1..224 {
            let c = lane0[b] >> 32;
            lane0[b] -= c << 32;
            lane0[b + 32] += c;
        }
        self.pending = 0;
    }

    /// Adds everything `other` holds. Merging is associative and commutative.
    pub fn merge(&mut self, other: &Self) {
        if F::TAG == 4 {
            self.carry();
            let mut o = other.clone();
            o.carry();
            for (a, b) in self.small[0].iter_mut().zip(o.small[0].iter()) {
                *a += b;
            }
            self.pending = 2 << 32; // both sides are carried: each bucket is below 2^32 + 2^32
        } else {
            for (a, b) in self.wide[0].iter_mut().zip(other.wide[0].iter()) {
                *a += b;
            }
        }
        let (s, o) = (&mut self.specials, &other.specials);
        s.nan += o.nan;
        s.pos_inf += o.pos_inf;
        s.neg_inf += o.neg_inf;
        s.not_neg_zero = s.not_neg_zero.max(o.not_neg_zero);
        s.count += o.count;
    }

    /// The number of values added.
    pub fn count(&self) -> u64 {
        self.specials.count
    }

    /// The exact sum, correctly rounded (see the module documentation for special values).
    pub fn finish(&self) -> F {
        let s = &self.specials;
        let exp_all_ones = ((1u64 << F::EXP_BITS) - 1) << (F::MANT_BITS - 1);
        let sign_bit = 1u64 << (F::MANT_BITS - 1 + F::EXP_BITS);
        if s.nan > 0 || (s.pos_inf > 0 && s.neg_inf > 0) {
            return F::from_bits64(exp_all_ones | (1 << (F::MANT_BITS - 2)));
        }
        if s.pos_inf > 0 {
            return F::from_bits64(exp_all_ones);
        }
        if s.neg_inf > 0 {
            return F::from_bits64(exp_all_ones | sign_bit);
        }
        let mut total = BigInt::zero(F::LIMBS);
        for lane in &self.small {
            for (b, &v) in lane.iter().enumerate().skip(1) {
                total.add_shifted(i128::from(v), b as u32 - 1);
            }
        }
        for lane in &self.wide {
            for (b, &v) in lane.iter().enumerate().skip(1) {
                total.add_shifted(v, b as u32 - 1);
            }
        }
        let bits = total.round_to_float_bits(F::MANT_BITS, F::EXP_BITS);
        if bits == 0 && s.count > 0 && s.not_neg_zero == 0 {
            return F::from_bits64(sign_bit);
        }
        F::from_bits64(bits)
    }
}

/// The reproducible sum of a slice: the exact sum, correctly rounded.
pub fn sum<F: ReproFloat>(xs: &[F]) -> F {
    let mut acc = ReproSum::new();
    acc.add_slice(xs);
    acc.finish()
}

/// The reproducible sum computed on the current rayon pool: the slice is cut into chunks,
/// each accumulated on some thread, and the accumulators merged. Bitwise identical to
/// [`sum`] for any number of threads.
pub fn par_sum<F: ReproFloat>(xs: &[F]) -> F {
    use rayon::prelude::*;
    xs.par_chunks(1 << 16)
        .fold(ReproSum::new, |mut acc, chunk| {
            acc.add_slice(chunk);
            acc
        })
        .reduce(ReproSum::new, |mut a, b| {
            a.merge(&b);
            a
        })
        .finish()
}

/// Sequential left-to-right sum: the order a naive loop uses (for comparison).
pub fn naive_sum<F: ReproFloat + std::ops::Add<Output = F> + Default>(xs: &[F]) -> F {
    xs.iter().fold(F::default(), |a, &x| a + x)
}

/// Pairwise (recursive halving) sum with a fixed split: deterministic for a given length,
/// error growing like `log2(n)` ulps rather than `n`.
pub fn pairwise_sum<F: ReproFloat + std::ops::Add<Output = F> + Default>(xs: &[F]) -> F {
    const BASE: usize = 32;
    if xs.len() <= BASE {
        return naive_sum(xs);
    }
    let (a, b) = xs.split_at(xs.len() / 2);
    pairwise_sum(a) + pairwise_sum(b)
}

/// Block-tree sum: fixed blocks of `block` elements summed left to right, then the block
/// sums combined pairwise. Deterministic for a given length and block size whatever the
/// thread count (blocks may be summed in parallel; the tree is fixed).
pub fn block_tree_sum<F: ReproFloat + std::ops::Add<Output = F> + Default>(xs: &[F], block: usize) -> F {
    use rayon::prelude::*;
    let partials: Vec<F> = xs.par_chunks(block.max(1)).map(naive_sum).collect();
    pairwise_sum(&partials)
}
