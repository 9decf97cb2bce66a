//! Run-to-run variability metrics, as the FPNA study defines them.
//!
//! - Scalars: `V_s = 1 - |S_nd / S_d|`, where `S_d` is the deterministic result and `S_nd`
//!   a non-deterministic one. Zero when they are equal; its magnitude is the relative
//!   difference.
//! - Arrays: the mean element-wise relative difference `|nd_i - d_i| / |d_i|` against the
//!   deterministic result (elements where `d_i = 0` contribute `|nd_i|`), and the fraction
//!   of elements whose bits differ.
//! - Over repeated runs: the number of distinct outputs (bitwise).

use std::collections::BTreeSet;

/// `V_s = 1 - |S_nd / S_d|` (0 when both are 0; infinite when only `S_d` is 0).
pub fn scalar_variability(nd: f64, d: f64) -> f64 {
    if nd == d {
        return 0.0;
    }
    if d == 0.0 {
        return f64::INFINITY;
    }
    1.0 - (nd / d).abs()
}

/// Variability of an array result against the deterministic one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArrayVariability {
    /// Mean element-wise relative difference.
    pub mean_relative_difference: f64,
    /// Largest element-wise relative difference.
    pub max_relative_difference: f64,
    /// Fraction of elements whose bits differ.
    pub fraction_differing: f64,
}

/// An element of a result the metrics compare: its bits, and its value widened to f64
/// (exactly, for both types).
pub trait Element: Copy {
    /// The bits, zero-extended.
    fn bits(self) -> u64;
    /// The value.
    fn wide(self) -> f64;
}

impl Element for f32 {
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn wide(self) -> f64 {
        f64::from(self)
    }
}

impl Element for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn wide(self) -> f64 {
        self
    }
}

/// Compares a non-deterministic array result with the deterministic one.
pub fn array_variability<T: Element>(nd: &[T], d: &[T]) -> ArrayVariability {
    assert_eq!(nd.len(), d.len(), "arrays differ in length");
    if d.is_empty() {
        return ArrayVariability::default();
    }
    let (mut sum, mut max, mut differing) = (0.0f64, 0.0f64, 0usize);
    for (&a, &b) in nd.iter().zip(d) {
        if a.bits() != b.bits() {
            differing += 1;
        }
        let (a, b) = (a.wide(), b.wide());
        let rel = if b == 0.0 { a.abs() } else { ((a - b) / b).abs() };
        sum += rel;
        max = max.max(rel);
    }
    ArrayVariability {
        mean_relative_difference: sum / d.len() as f64,
        max_relative_difference: max,
        fraction_differing: differing as f64 / d.len() as f64,
    }
}

/// Number of bitwise-distinct outputs among repeated runs.
pub fn distinct_outputs<'a>(outputs: impl IntoIterator<Item = &'a [f32]>) -> usize {
    outputs.into_iter().map(|o| crate::fingerprint::fingerprint([("output", o)])).collect::<BTreeSet<u64>>().len()
}

/// Number of distinct outputs among repeated runs, each given as its bytes (any element
/// type): compared whole, so two outputs count as one only if every byte agrees.
pub fn distinct_bytes<'a>(outputs: impl IntoIterator<Item = &'a [u8]>) -> usize {
    outputs.into_iter().collect::<BTreeSet<&[u8]>>().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_match_their_definitions() {
        assert_eq!(scalar_variability(2.0, 2.0), 0.0);
        assert!((scalar_variability(2.0 + 1e-6, 2.0) + 5e-7).abs() < 1e-12);
        let v = array_variability(&[1.0, 2.0, 0.5, 0.0], &[1.0, 2.5, 0.5, 0.0]);
        assert_eq!(v.fraction_differing, 0.25);
        assert!((v.mean_relative_difference - 0.05).abs() < 1e-12);
        assert!((v.max_relative_difference - 0.2).abs() < 1e-12);
        let a = [1.0f32, 2.0];
        let b = [1.0f32, 2.0000002];
        assert_eq!(distinct_outputs([&a[..], &a[..], &b[..]]), 2);
        let bytes = |x: &[f32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(distinct_bytes([&bytes(&a)[..], &bytes(&a), &bytes(&b)]), 2);
        // f64: a difference below f32's resolution still counts.
        let w = array_variability(&[1.0f64, 1.0 + 1e-12], &[1.0, 1.0]);
        assert_eq!(w.fraction_differing, 0.5);
        assert!(w.max_relative_difference > 0.0);
    }
}
