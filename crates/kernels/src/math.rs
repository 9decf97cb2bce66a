//! Elementary functions (`exp`, `ln`) of `f32` arguments, with the same bits on every CPU.
//!
//! The platform's maths library is not fit for that: glibc picks an FMA or a plain variant
//! of `exp` and `log` at run time, and the two round differently. The functions here use
//! only operations that IEEE 754 rounds correctly (addition, multiplication, division, and
//! conversions) on `f64` values, in a fixed sequence, with no fused multiply-add: every
//! compiler and every x86-64 or aarch64 CPU gives the same bits.
//!
//! Each function works in `f64` and rounds once to `f32` at the end. The `f64` result is
//! within about 1e-15 of the true value, so the `f32` result is the correctly rounded one
//! except for arguments whose true value lies within that distance of a rounding boundary
//! (the tests measure how rarely that happens); it is never more than one unit in the last
//! place away. Special values follow the usual conventions: `exp(-inf) = 0`,
//! `exp(inf) = inf`, `ln(0) = -inf`, `ln(x < 0) = NaN`, and NaN in gives NaN out.

/// `1.5 * 2^52`: adding and subtracting it rounds an `f64` below `2^51` in magnitude to an
/// integer, ties to even, with two correctly rounded additions (no library call).
const ROUND: f64 = 6_755_399_441_055_744.0;
/// `ln 2` split so that `k * LN2_HI` is exact for `|k| < 2^11`.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// Beyond these, `exp` of an `f32` rounds to infinity or to zero.
const EXP_OVERFLOW: f32 = 89.0;
const EXP_UNDERFLOW: f32 = -104.0;

/// `2^k` for `-1022 <= k <= 1023`, built from its bits (garbage, never a panic, outside).
#[inline(always)]
fn pow2(k: i64) -> f64 {
    f64::from_bits((k.wrapping_add(1023) as u64) << 52)
}

/// `e^x`.
pub fn exp(x: f32) -> f32 {
    exp_lanes(x)
}

/// [`exp`] without a branch, so that a loop over it vectorises (see `crate::lanes`).
#[inline(always)]
pub(crate) fn exp_lanes(x: f32) -> f32 {
    // Clamping keeps NaN, which then runs through the arithmetic and comes out NaN.
    let y = exp_in_range(f64::from(x.clamp(EXP_UNDERFLOW, EXP_OVERFLOW))) as f32;
    let y = if x > EXP_OVERFLOW { f32::INFINITY } else { y };
    if x < EXP_UNDERFLOW { 0.0 } else { y }
}

/// `e^x` in `f64` for `x` in `[-170, 170]` (or NaN), within about 1e-15 of the true value,
/// without a branch: [`exp`]'s arithmetic once its argument is clamped to `[-104, 89]`.
#[inline(always)]
fn exp_in_range(x: f64) -> f64 {
    // x = k ln2 + r with |r| <= ln2 / 2.
    let shifted = x * LOG2_E + ROUND;
    let k = shifted - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // Taylor series of e^r to degree 13: the first omitted term is below 3e-18 of the sum.
    let mut p = 1.0 / 6_227_020_800.0;
    for d in [479_001_600.0, 39_916_800.0, 3_628_800.0, 362_880.0, 40_320.0, 5_040.0, 720.0, 120.0, 24.0, 6.0, 2.0] {
        p = p * r + 1.0 / d;
    }
    let p = (p * r + 1.0) * r + 1.0;
    // The integer k is in the low bits of `shifted`, which lies in [2^52, 2^53). It lies
    // in [-246, 246]: the scaling is split in two so that both factors are normal numbers
    // (the bias of 256 keeps the shifted value positive). Any split gives the exact
    // product, a normal f64.
    let k = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i64;
    let half = ((k.wrapping_add(256) as u64) >> 1) as i64 - 128;
    p * pow2(half) * pow2(k.wrapping_sub(half))
}

/// The natural logarithm.
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    // Every f32, subnormals included, is a normal f64: x = m * 2^e with m in [1, 2).
    let bits = f64::from(x).to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    // Centre m on 1: m in [sqrt(1/2), sqrt(2)).
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(f) = 2 (f + f^3/3 + f^5/5 + ...) with f = (m-1)/(m+1), |f| < 0.172:
    // terms to f^23, the first omitted one below 1e-18 of the sum.
    let f = (m - 1.0) / (m + 1.0);
    let s = f * f;
    let mut p = 1.0 / 23.0;
    for d in [21.0, 19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0] {
        p = p * s + 1.0 / d;
    }
    let e = e as f64;
    (e * LN2_HI + (e * LN2_LO + 2.0 * f * p)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform's `f64` functions, rounded to `f32`: within a hair of correct rounding,
    /// and computed by independent code.
    fn close(ours: f32, reference: f64) -> bool {
        let r = reference as f32;
        if r.is_nan() {
            return ours.is_nan();
        }
        ours == r || (ours.to_bits() as i64 - r.to_bits() as i64).abs() <= 1
    }

    /// Every `step`-th f32 bit pattern of one sign, from 0 to infinity.
    fn sweep(step: u32, negative: bool) -> impl Iterator<Item = f32> {
        let sign = if negative { 0x8000_0000 } else { 0 };
        (0..0x7f80_0000u32).step_by(step as usize).map(move |b| f32::from_bits(b | sign))
    }

    /// Checks `ours` against `reference` on `xs`: every result within one ulp, and at most
    /// one in a million not the correctly rounded one. Prints the count (`cargo test
    /// --release -p steadfast-kernels math -- --nocapture`).
    fn sweep_against(name: &str, ours: fn(f32) -> f32, reference: fn(f64) -> f64, xs: impl Iterator<Item = f32>) {
        let (mut n, mut exact) = (0u64, 0u64);
        for x in xs {
            let (got, want) = (ours(x), reference(f64::from(x)));
            assert!(close(got, want), "{name}({x:e}) = {got:e}, expected {:e}", want as f32);
            n += 1;
            exact += u64::from(got == want as f32);
        }
        println!("{name}: {exact} of {n} arguments correctly rounded, the rest within one ulp");
        assert!(n > 1_000_000);
        assert!(exact as f64 >= n as f64 * 0.999_999, "{name}: {exact} of {n} correctly rounded");
    }

    #[test]
    fn exp_is_within_one_ulp_and_nearly_always_correctly_rounded() {
        let xs = sweep(997, false).chain(sweep(997, true)).filter(|x| x.abs() < 110.0);
        sweep_against("exp", exp, f64::exp, xs);
    }

    #[test]
    fn ln_is_within_one_ulp_and_nearly_always_correctly_rounded() {
        sweep_against("ln", ln, f64::ln, sweep(991, false));
    }

    #[test]
    fn special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-104.5), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-103.0) > 0.0, "the smallest results are subnormal, not zero");
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln(-0.0), f32::NEG_INFINITY);
        assert_eq!(ln(f32::INFINITY), f32::INFINITY);
        assert!(ln(-1.0).is_nan() && ln(f32::NAN).is_nan() && ln(f32::NEG_INFINITY).is_nan());
        assert!(close(ln(f32::from_bits(1)), (f64::from(f32::from_bits(1))).ln()));
    }
}
