//! # comm: moving gradients and state between workers
//!
//! This crate owns the transport, the collectives, membership and the per-step commit
//! protocol of data-parallel training. It starts with the choice every collective is
//! parameterised by, the [`ReduceMode`], and the reference semantics of combining
//! per-worker gradients in a fixed order ([`reduce_in_order`]), which a single process
//! uses today and the distributed all-reduce must match in `deterministic` mode.
//!
//! ```
//! use comm::{ReduceMode, reduce_in_order};
//!
//! assert_eq!("reproducible".parse::<ReduceMode>().unwrap(), ReduceMode::Reproducible);
//! let mut acc = vec![1.0f32, 2.0];
//! reduce_in_order(&mut acc, &[&[0.5, 0.5][..], &[0.25, 0.25][..]]);
//! assert_eq!(acc, vec![1.75, 2.75]);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// How gradients from several workers are combined (see `docs/determinism.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReduceMode {
    /// Plain float sums in whatever order is fastest; no promise about bits.
    Fast,
    /// A fixed order for a fixed world size: same configuration, same bits.
    #[default]
    Deterministic,
    /// Bitwise identical for any world size and arrival order.
    Reproducible,
}

impl fmt::Display for ReduceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceMode::Fast => "fast",
            ReduceMode::Deterministic => "deterministic",
            ReduceMode::Reproducible => "reproducible",
        })
    }
}

/// A word that is not a reduce mode.
#[derive(Debug, thiserror::Error)]
#[error("unknown reduce mode {0:?}: expected fast, deterministic or reproducible")]
pub struct UnknownReduceMode(pub String);

impl FromStr for ReduceMode {
    type Err = UnknownReduceMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fast" => Ok(ReduceMode::Fast),
            "deterministic" => Ok(ReduceMode::Deterministic),
            "reproducible" => Ok(ReduceMode::Reproducible),
            other => Err(UnknownReduceMode(other.to_owned())),
        }
    }
}

/// Adds each of `parts` into `acc`, element-wise, in the order given: the reference
/// reduction of the `deterministic` mode. Panics if a part's length differs from `acc`'s.
pub fn reduce_in_order(acc: &mut [f32], parts: &[&[f32]]) {
    for part in parts {
        assert_eq!(part.len(), acc.len(), "reduce of unequal lengths");
        for (a, &x) in acc.iter_mut().zip(*part) {
            *a += x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_text() {
        for m in [ReduceMode::Fast, ReduceMode::Deterministic, ReduceMode::Reproducible] {
            assert_eq!(m.to_string().parse::<ReduceMode>().unwrap(), m);
        }
        assert!("exact".parse::<ReduceMode>().is_err());
    }

    #[test]
    fn order_matters_for_floats_and_is_fixed_here() {
        // (1e8 + 1) - 1e8 in f32 loses the 1; the other order keeps it.
        let mut a = vec![1e8f32];
        reduce_in_order(&mut a, &[&[1.0][..], &[-1e8][..]]);
        let mut b = vec![1e8f32];
        reduce_in_order(&mut b, &[&[-1e8][..], &[1.0][..]]);
        assert_eq!(a, vec![0.0]);
        assert_eq!(b, vec![1.0]);
    }
}
