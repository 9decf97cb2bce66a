//! GELU, `x Φ(x)` with `Φ` the standard normal distribution function, and its slope
//! `Φ(x) + x φ(x)`, in `f32` from our own normal tail.
//!
//! # The arithmetic
//!
//! With `a = |x|`, the tail `Φ(-a)` is written as a Gaussian factor times a slowly varying
//! function, and both GELU and its slope come from the same two numbers:
//!
//! ```text
//! Φ(-a) = e^(-a²/2) g(a)          g(a) = e^(a²/2) Φ(-a), from 1/2 down to about 1/(a √(2π))
//! GELU(x)  = x e^(-a²/2) g(a)                if x < 0, else x - x e^(-a²/2) g(a)
//! GELU'(x) = e^(-a²/2) (g(a) - a/√(2π))      if x < 0, else 1 - e^(-a²/2) (g(a) - a/√(2π))
//! ```
//!
//! - `g` is a degree-10 polynomial in `u = (4 - a) / (4 + a)`, fitted by
//!   `crates/kernels/tools/fit_gelu_tail.py` to a relative error below 2e-8 on `[0, 14.5]`.
//! - `e^(-a²/2)` is where `f32` arithmetic would lose most: rounding `a²` costs a relative
//!   error of `a²/2 · 2^-24` in the exponential (85 units in the last place at `a = 13`).
//!   So `a` is split into two halves of 12 significant bits, `a = ah + al`, whose products
//!   are exact, and `-a²/2 = hi + lo` with `hi = -ah²/2` exact and `lo` a small correction.
//!   Then `e^(hi + lo) = 2^k e^r` with `k` the integer nearest `hi log2(e)` and
//!   `r = hi - k ln 2 + lo` (`ln 2` in two parts, the first exact when multiplied by `k`),
//!   and `e^r` is its Taylor series to degree 7.
//! - `2^k` stays apart until the last step: `k` falls to -152 at `a = 14.5`, below `f32`'s
//!   normal numbers, so the products are formed near 1 and scaled by `2^k` as two normal
//!   factors, which rounds once.
//!
//! Beyond `a = 14.5` GELU rounds to `-0` or `x`, and its slope to 0 or 1.
//!
//! Only correctly rounded `f32` operations appear, with no fused multiply-add and no
//! branch, so the compiler vectorises the loops sixteen values at a time with AVX-512 and
//! every CPU gives the same bits (see `crate::lanes`). Measured against the true values
//! (the tests below): values within 6 units in the last place, 88% of them correctly
//! rounded; slopes within 2e-7.

use crate::lanes::per_isa;

/// Where the tail is taken to be zero.
const END: f32 = 14.5;
/// `1 / √(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
/// `g(a)` in powers of `u`, constant term first (see the module documentation).
const TAIL: [f32; 11] = [
    0.094_410_64,
    0.170_397_73,
    0.124_379_18,
    0.071_707_2,
    0.030_865_76,
    0.008_493_835,
    0.000_502_108_2,
    -0.000_643_930_8,
    -0.000_171_927_41,
    4.895_490_6e-5,
    1.045_216_2e-5,
];
/// `1.5 * 2^23`: adding and subtracting it rounds an `f32` below `2^22` in magnitude to an
/// integer, ties to even.
const ROUND: f32 = 12_582_912.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts; the first has 16 significant bits, so `k * LN2_HI` is exact for
/// `|k| < 256`.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

/// `2^k` for `-126 <= k <= 127`, built from its bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

/// `e^(-a²/2)` for `a` in `[0, END]`, as `(m, k)` with the value `m 2^k` and `m` near 1.
#[inline(always)]
fn gauss(a: f32) -> (f32, i32) {
    // Veltkamp's split: `ah` keeps the top 12 bits of `a`, `al` the rest, so the products
    // below are exact.
    let c = a * 4097.0;
    let ah = c - (c - a);
    let al = a - ah;
    let hi = -(ah * ah * 0.5);
    let lo = -(ah * al) - al * al * 0.5;
    let shifted = hi * LOG2_E + ROUND;
    let k = shifted - ROUND;
    // `hi - k LN2_HI` is exact (the two are within a factor of two of each other).
    let r = ((hi - k * LN2_HI) - k * LN2_LO) + lo;
    let mut m = 1.0 / 5040.0;
    for d in [720.0, 120.0, 24.0, 6.0, 2.0, 1.0] {
        m = m * r + 1.0 / d;
    }
    let m = m * r + 1.0;
    (m, shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32)
}

/// `g(a) = e^(a²/2) Φ(-a)` for `a` in `[0, END]`.
#[inline(always)]
fn tail(a: f32) -> f32 {
    let u = (4.0 - a) / (4.0 + a);
    let mut p = TAIL[10];
    for &c in TAIL[..10].iter().rev() {
        p = p * u + c;
    }
    p
}

/// `v 2^k` for `-252 <= k <= 0`, as two normal factors: the first product is exact while
/// it stays normal, the second rounds once.
#[inline(always)]
fn scale(v: f32, k: i32) -> f32 {
    let half = k >> 1;
    v * pow2(half) * pow2(k - half)
}

/// GELU and its slope at `x`. NaN gives NaN for both; `±inf` gives `(inf, 1)` and
/// `(-0, 0)`.
#[inline(always)]
fn value_and_slope(x: f32) -> (f32, f32) {
    let a = x.abs();
    // NaN is not far: it runs through the arithmetic below (`x` and `a` themselves, not
    // the clamped `ac`, which `min` turns into END) and comes out NaN.
    let far = a > END;
    let ac = a.min(END);
    let (m, k) = gauss(ac);
    let g = tail(ac);
    let xt = scale(x * (m * g), k);
    let value = if x < 0.0 { xt } else { x - xt };
    let s = scale(m * (g - a * FRAC_1_SQRT_2PI), k);
    let slope = if x < 0.0 { s } else { 1.0 - s };
    let value = if far { if x < 0.0 { -0.0 } else { x } } else { value };
    let slope = if far { if x < 0.0 { 0.0 } else { 1.0 } } else { slope };
    (value, slope)
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
        let tail = 0.5 * erfc_reference(x.abs() * std::f64::consts::FRAC_1_SQRT_2);
        let cdf = if x < 0.0 { tail } else { 1.0 - tail };
        (x * cdf, cdf + x * (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt())
    }

    fn ulps(a: f32, b: f32) -> i64 {
        let key = |v: f32| {
            let i = v.to_bits() as i32;
            i64::from(if i < 0 { i32::MIN - i } else { i })
        };
        (key(a) - key(b)).abs()
    }

    #[test]
    fn values_are_within_six_ulps_and_slopes_within_2e_7_of_the_truth() {
        let (mut n, mut exact, mut worst) = (0u64, 0u64, 0i64);
        // Every 607th f32 with 2^-125 <= |x| < 16, past the end of the fitted range. (Below,
        // x/2 is subnormal and often a tie between two subnormals, and the rounding then
        // depends on the x² term, far below any error here.)
        for bits in (0x0100_0000..0x4180_0000u32).step_by(607) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let (v, s) = value_and_slope(x);
                let (rv, rs) = reference(x);
                let off = ulps(v, rv as f32);
                assert!(off <= 6, "gelu({x:e}) = {v:e}, expected {:e}", rv as f32);
                // The slope sums two terms of opposite sign for x < 0; compare absolutely.
                assert!((f64::from(s) - rs).abs() <= 2e-7, "slope({x:e}) = {s:e}, expected {rs:e}");
                n += 1;
                exact += u64::from(off == 0);
                worst = worst.max(off);
            }
        }
        println!("gelu: {exact} of {n} arguments correctly rounded, the rest within {worst} ulps");
        assert!(exact as f64 >= n as f64 * 0.85, "{exact} of {n}");
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
