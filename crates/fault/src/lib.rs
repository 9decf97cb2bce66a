//! # fault: the faults that Steadfast injects and studies
//!
//! This crate owns fault models: bit flips in checkpoint files and live training
//! buffers, and crashes at named points. It starts with the primitive every bit-flip
//! campaign rests on: flipping chosen bits of an IEEE-754 value, with bits named by
//! position or by class (sign, exponent, mantissa).
//!
//! ```
//! use fault::{BitClass, flip_f32};
//!
//! // Flipping the sign bit negates.
//! assert_eq!(flip_f32(1.5, 31), -1.5);
//! // The most significant exponent bit of 1.0 turns it into infinity's neighbourhood.
//! assert_eq!(flip_f32(1.0, 30), f32::INFINITY);
//! assert_eq!(BitClass::Exponent.bits_f32(), 23..31);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::ops::Range;
use std::str::FromStr;

/// A class of bits of a floating-point number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitClass {
    /// The sign bit.
    Sign,
    /// The biased exponent.
    Exponent,
    /// The stored fraction (mantissa).
    Mantissa,
    /// Any bit.
    Any,
}

impl BitClass {
    /// Bit positions of this class in an f32 (bit 0 is the least significant).
    pub fn bits_f32(self) -> Range<u32> {
        match self {
            BitClass::Sign => 31..32,
            BitClass::Exponent => 23..31,
            BitClass::Mantissa => 0..23,
            BitClass::Any => 0..32,
        }
    }

    /// The class that bit `bit` of an f32 belongs to.
    pub fn of_f32_bit(bit: u32) -> BitClass {
        match bit {
            31 => BitClass::Sign,
            23..=30 => BitClass::Exponent,
            _ => BitClass::Mantissa,
        }
    }
}

/// A word that is not a bit class.
#[derive(Debug, thiserror::Error)]
#[error("unknown bit class {0:?}: expected sign, exponent, mantissa or any")]
pub struct UnknownBitClass(pub String);

impl FromStr for BitClass {
    type Err = UnknownBitClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sign" => Ok(BitClass::Sign),
            "exponent" => Ok(BitClass::Exponent),
            "mantissa" => Ok(BitClass::Mantissa),
            "any" => Ok(BitClass::Any),
            other => Err(UnknownBitClass(other.to_owned())),
        }
    }
}

/// `x` with bit `bit` (0 = least significant) inverted. Panics if `bit >= 32`.
pub fn flip_f32(x: f32, bit: u32) -> f32 {
    assert!(bit < 32, "an f32 has bits 0..32, not {bit}");
    f32::from_bits(x.to_bits() ^ (1 << bit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flipping_twice_restores_every_bit() {
        for bit in 0..32 {
            let x = -3.25e-7f32;
            assert_eq!(flip_f32(flip_f32(x, bit), bit).to_bits(), x.to_bits());
            assert_ne!(flip_f32(x, bit).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn classes_partition_the_bits() {
        for bit in 0..32 {
            let c = BitClass::of_f32_bit(bit);
            assert!(c.bits_f32().contains(&bit));
        }
        let total: u32 =
            [BitClass::Sign, BitClass::Exponent, BitClass::Mantissa].iter().map(|c| c.bits_f32().len() as u32).sum();
        assert_eq!(total, 32);
        assert_eq!("mantissa".parse::<BitClass>().unwrap(), BitClass::Mantissa);
        assert!("exp".parse::<BitClass>().is_err());
    }
}
