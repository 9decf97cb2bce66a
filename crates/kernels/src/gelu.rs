//! GELU, `x Φ(x)` with `Φ` the standard normal distribution function, and its slope
//! `Φ(x) + x φ(x)`, from our own complementary error function.
//!
//! # The arithmetic
//!
//! Each value is computed in `f64` and rounded once to `f32`. With `z = |x| / √2`:
//!
//! ```text
//! tail  = Φ(-|x|) = erfc(z) / 2 = e^(-z²) erfcx(z) / 2
//! Φ(x)  = tail if x < 0, else 1 - tail
//! φ(x)  = e^(-z²) / √(2π)
//! ```
//!
//! `e^(-z²)` is [`crate::math`]'s exponential, and `erfcx(z) = e^(z²) erfc(z)` is a
//! degree-14 polynomial in `u = (28/11) · 3/(3 + z) - 17/11`, fitted by
//! `crates/kernels/tools/fit_erfcx.py` to a relative error below 1e-11 on `[0, 11]`.
//! Beyond `z = 11` GELU rounds to `-0` or `x`, and its slope to 0 or 1. Only
//! correctly rounded operations appear, with no fused multiply-add and no branch, so the
//! compiler vectorises the loops and every CPU gives the same bits (see `crate::lanes`).
//! The results are within one unit in the last place of the true values; the tests
//! measure how often they are the correctly rounded ones.

use std::f64::consts::FRAC_1_SQRT_2;

use crate::lanes::per_isa;
use crate::math::exp_in_range;

/// Where the tail is taken to be zero.
const Z_END: f64 = 11.0;
/// `1 / √(2π)`.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
/// `erfcx` in powers of `u`, constant term first (see the module documentation).
const ERFCX: [f64; 15] = [
    0.261_825_680_668_774_1,
    0.357_704_589_213_764_7,
    0.224_947_875_824_240_47,
    0.108_418_794_270_004_59,
    0.038_267_245_944_538_45,
    0.008_643_789_490_609_007,
    0.000_572_376_995_069_692_1,
    -0.000_318_808_837_854_332_53,
    -7.846_959_612_386_282e-5,
    1.198_197_504_472_589_7e-5,
    6.005_477_437_804_569e-6,
    -6.922_786_971_361_972e-7,
    -4.440_701_646_508_554e-7,
    4.878_843_738_662_995e-8,
    2.613_532_499_479_447_6e-8,
];

/// `e^(z²) erfc(z)` for `z` in `[0, 11]`.
#[inline(always)]
fn erfcx(z: f64) -> f64 {
    let u = (3.0 / (3.0 + z)) * (28.0 / 11.0) - 17.0 / 11.0;
    let mut p = ERFCX[14];
    for &c in ERFCX[..14].iter().rev() {
        p = p * u + c;
    }
    p
}

/// GELU and its slope at `x`. NaN gives NaN for both; `±inf` gives `(inf, 1)` and
/// `(-0, 0)`.
#[inline(always)]
fn value_and_slope(x: f32) -> (f32, f32) {
    let x = f64::from(x);
    let z = x.abs() * FRAC_1_SQRT_2;
    // NaN is not far: it runs through the arithmetic below and comes out NaN.
    let far = z > Z_END;
    let z = z.min(Z_END);
    let e = exp_in_range(-(z * z));
    let tail = 0.5 * e * erfcx(z);
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    let cdf = if far { if x < 0.0 { 0.0 } else { 1.0 } } else { cdf };
    let slope = if far { cdf } else { cdf + x * (e * FRAC_1_SQRT_2PI) };
    let value = if far { if x < 0.0 { -0.0 } else { x } } else { x * cdf };
    (value as f32, slope as f32)
}

per_isa! {
    /// `y = GELU(x)` and `slope = GELU'(x)`, element by element.
    ///
    /// # Panics
    /// If the three slices' lengths differ.
    pub fn gelu_with_slope(x: &[f32], y: &mut [f32], slope: &mut [f32]) {
        assert!(x.len() == y.len() && x.len() == slope.len(), "GELU's input, output and slope differ in length");
        for ((&v, out), s) in x.iter().zip(y.iter_mut()).zip(slope.iter_mut()) {
            (*out, *s) = value_and_slope(v);
        }
    }
}

per_isa! {
    /// `y = GELU(x)`, element by element (the bits of [`gelu_with_slope`]'s `y`).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn gelu(x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "GELU's input and output differ in length");
        for (&v, out) in x.iter().zip(y.iter_mut()) {
            *out = value_and_slope(v).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;

    /// `erfc` by independent means: for `z < 2` one minus the everywhere-positive series
    /// `erf(z) = 2/√π e^(-z²) Σ (2z²)^n z / (1·3·…·(2n+1))`, beyond it Laplace's continued
    /// fraction, both to far more terms than they need.
    fn erfc_reference(z: f64) -> f64 {
        let two_over_sqrt_pi = 2.0 / std::f64::consts::PI.sqrt();
        if z < 2.0 {
            let (mut term, mut sum) = (z, z);
            for n in 1..200 {
                term *= 2.0 * z * z / f64::from(2 * n + 1);
                sum += term;
            }
            1.0 - two_over_sqrt_pi * (-z * z).exp() * sum
        } else {
            let mut f = z;
            for n in (1..400).rev() {
                f = z + f64::from(n) / 2.0 / f;
            }
            (-z * z).exp() / std::f64::consts::PI.sqrt() / f
        }
    }

    fn reference(x: f32) -> (f64, f64) {
        let x = f64::from(x);
        let tail = 0.5 * erfc_reference(x.abs() * FRAC_1_SQRT_2);
        let cdf = if x < 0.0 { tail } else { 1.0 - tail };
        (x * cdf, cdf + x * (-x * x / 2.0).exp() * FRAC_1_SQRT_2PI)
    }

    fn ulps(a: f32, b: f32) -> i64 {
        let key = |v: f32| {
            let i = v.to_bits() as i32;
            i64::from(if i < 0 { i32::MIN - i } else { i })
        };
        (key(a) - key(b)).abs()
    }

    #[test]
    fn values_and_slopes_are_within_an_ulp_of_the_truth() {
        let (mut n, mut exact) = (0u64, 0u64);
        // Every 607th f32 with 2^-125 <= |x| < 16, past the ends of the fitted range. (Below,
        // x/2 is subnormal and often a tie between two subnormals, and the rounding then
        // depends on the x² term, far below the fit's error.)
        for bits in (0x0100_0000..0x4180_0000u32).step_by(607) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let (v, s) = value_and_slope(x);
                let (rv, rs) = reference(x);
                assert!(ulps(v, rv as f32) <= 1, "gelu({x:e}) = {v:e}, expected {:e}", rv as f32);
                // The slope sums two terms of opposite sign for x < 0; compare absolutely.
                assert!((f64::from(s) - rs).abs() <= 1.2e-7, "slope({x:e}) = {s:e}, expected {rs:e}");
                n += 1;
                exact += u64::from(v == rv as f32);
            }
        }
        println!("gelu: {exact} of {n} arguments correctly rounded, the rest within one ulp");
        assert!(exact as f64 >= n as f64 * 0.99999, "{exact} of {n}");
    }

    #[test]
    fn special_values() {
        assert_eq!(value_and_slope(0.0), (0.0, 0.5));
        assert_eq!(value_and_slope(f32::INFINITY), (f32::INFINITY, 1.0));
        let (v, s) = value_and_slope(f32::NEG_INFINITY);
        assert_eq!((v, s), (0.0, 0.0));
        assert!(v.is_sign_negative());
        assert_eq!(value_and_slope(20.0), (20.0, 1.0));
        assert_eq!(value_and_slope(-20.0).0, 0.0);
        let (v, s) = value_and_slope(f32::NAN);
        assert!(v.is_nan() && s.is_nan(), "corruption stays visible");
        // Far in the negative tail the value is tiny but not zero.
        assert!(value_and_slope(-14.0).0 < 0.0);
    }

    #[test]
    fn every_path_gives_the_same_bits() {
        let mut x: Vec<f32> = (0..4099).map(|i| (i as f32 - 2049.0) * 0.0071).collect();
        x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-30, -14.5, 14.5]);
        let (mut y0, mut s0) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        gelu_with_slope(Isa::Scalar, &x, &mut y0, &mut s0);
        for isa in Isa::all_available() {
            let (mut y, mut s) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            gelu_with_slope(isa, &x, &mut y, &mut s);
            let mut only = vec![0.0; x.len()];
            gelu(isa, &x, &mut only);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&y0), "{isa}");
            assert_eq!(bits(&s), bits(&s0), "{isa}");
            assert_eq!(bits(&only), bits(&y0), "{isa}");
        }
    }
}
