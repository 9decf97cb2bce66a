//! Which bits of an element a flip may hit: a class (sign, exponent, mantissa, any), one
//! position `N`, or a range `N-M`, resolved against the element's dtype.

use std::ops::Range;
use std::str::FromStr;

use ckpt::DType;

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
        self.bits(DType::F32).expect("every class exists in f32")
    }

    /// Bit positions of this class in an element of `dtype`; `None` where the class does
    /// not exist (an integer has no exponent; an unsigned integer no sign).
    pub fn bits(self, dtype: DType) -> Option<Range<u32>> {
        let width = dtype.size() as u32 * 8;
        // (exponent bits, mantissa bits) of the float types.
        let float = match dtype {
            DType::F64 => Some((11, 52)),
            DType::F32 => Some((8, 23)),
            DType::F16 => Some((5, 10)),
            DType::BF16 => Some((8, 7)),
            _ => None,
        };
        let signed = matches!(dtype, DType::I64 | DType::I32 | DType::I16 | DType::I8);
        match (self, float) {
            (BitClass::Any, _) => Some(if dtype == DType::Bool { 0..1 } else { 0..width }),
            (BitClass::Sign, Some(_)) => Some(width - 1..width),
            (BitClass::Sign, None) if signed => Some(width - 1..width),
            (BitClass::Exponent, Some((e, m))) => Some(m..m + e),
            (BitClass::Mantissa, Some((_, m))) => Some(0..m),
            _ => None,
        }
    }

    /// The class that bit `bit` of an f32 belongs to.
    pub fn of_f32_bit(bit: u32) -> BitClass {
        BitClass::of_bit(DType::F32, bit)
    }

    /// The class that bit `bit` of an element of `dtype` belongs to (`Any` for integer
    /// bits other than the sign).
    pub fn of_bit(dtype: DType, bit: u32) -> BitClass {
        for class in [BitClass::Sign, BitClass::Exponent, BitClass::Mantissa] {
            if class.bits(dtype).is_some_and(|r| r.contains(&bit)) {
                return class;
            }
        }
        BitClass::Any
    }

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BitClass::Sign => "sign",
            BitClass::Exponent => "exponent",
            BitClass::Mantissa => "mantissa",
            BitClass::Any => "any",
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

/// The `--bits` choice: a class, or explicit positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitSpec {
    /// Any bit of a class.
    Class(BitClass),
    /// Positions `start..end` (bit 0 is the least significant).
    Positions(u32, u32),
}

impl BitSpec {
    /// The positions this spec allows in an element of `dtype`, or `None` if it allows
    /// none there (the class does not exist, or the positions exceed the width).
    pub fn positions(self, dtype: DType) -> Option<Range<u32>> {
        let width = if dtype == DType::Bool { 1 } else { dtype.size() as u32 * 8 };
        match self {
            BitSpec::Class(c) => c.bits(dtype),
            BitSpec::Positions(a, b) if b <= width && a < b => Some(a..b),
            BitSpec::Positions(..) => None,
        }
    }
}

impl std::fmt::Display for BitSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            BitSpec::Class(c) => f.write_str(c.name()),
            BitSpec::Positions(a, b) if b == a + 1 => write!(f, "{a}"),
            BitSpec::Positions(a, b) => write!(f, "{a}-{}", b - 1),
        }
    }
}

serde_as_text!(BitSpec);

/// A `--bits` value that is neither a class nor positions.
#[derive(Debug, thiserror::Error)]
#[error("bad --bits {0:?}: expected sign, exponent, mantissa, any, a position N or a range N-M")]
pub struct BadBitSpec(pub String);

impl FromStr for BitSpec {
    type Err = BadBitSpec;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(c) = s.parse::<BitClass>() {
            return Ok(BitSpec::Class(c));
        }
        let bad = || BadBitSpec(s.to_owned());
        match s.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if a > b || b >= 64 {
                    return Err(bad());
                }
                Ok(BitSpec::Positions(a, b + 1))
            }
            None => {
                let n: u32 = s.trim().parse().map_err(|_| bad())?;
                if n >= 64 {
                    return Err(bad());
                }
                Ok(BitSpec::Positions(n, n + 1))
            }
        }
    }
}

/// Inverts `bits` (0 = the least significant bit) of one element stored little-endian in
/// `element`: the one bit flip of the project, whether the element lies in a file, a live
/// buffer or a layer's output. Panics if a bit lies beyond the element.
pub fn flip_le(element: &mut [u8], bits: &[u32]) {
    for &b in bits {
        let byte = (b / 8) as usize;
        assert!(byte < element.len(), "an element of {} bytes has no bit {b}", element.len());
        element[byte] ^= 1 << (b % 8);
    }
}

/// `x` with `bits` inverted ([`flip_le`] on its bytes). Panics if a bit is 32 or more.
pub fn flip_f32(x: f32, bits: &[u32]) -> f32 {
    let mut b = x.to_le_bytes();
    flip_le(&mut b, bits);
    f32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flipping_twice_restores_every_bit() {
        for bit in 0..32 {
            let x = -3.25e-7f32;
            assert_eq!(flip_f32(flip_f32(x, &[bit]), &[bit]).to_bits(), x.to_bits());
            assert_ne!(flip_f32(x, &[bit]).to_bits(), x.to_bits());
            assert_eq!(flip_f32(x, &[bit]).to_bits(), x.to_bits() ^ (1 << bit), "little-endian bit numbering");
        }
    }

    #[test]
    fn classes_partition_the_bits_of_every_float_type() {
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            let width = dtype.size() as u32 * 8;
            let mut seen = vec![0; width as usize];
            for c in [BitClass::Sign, BitClass::Exponent, BitClass::Mantissa] {
                for b in c.bits(dtype).unwrap() {
                    seen[b as usize] += 1;
                    assert_eq!(BitClass::of_bit(dtype, b), c);
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{dtype:?}");
        }
        assert_eq!(BitClass::Exponent.bits(DType::BF16), Some(7..15));
        assert_eq!(BitClass::Exponent.bits(DType::F64), Some(52..63));
        assert_eq!(BitClass::Exponent.bits(DType::I32), None);
        assert_eq!(BitClass::Sign.bits(DType::I16), Some(15..16));
        assert_eq!(BitClass::Sign.bits(DType::U8), None);
    }

    #[test]
    fn bit_specs_parse_and_resolve_against_dtypes() {
        assert_eq!("exponent".parse::<BitSpec>().unwrap(), BitSpec::Class(BitClass::Exponent));
        assert_eq!("30".parse::<BitSpec>().unwrap(), BitSpec::Positions(30, 31));
        assert_eq!("20-22".parse::<BitSpec>().unwrap(), BitSpec::Positions(20, 23));
        assert_eq!("20-22".parse::<BitSpec>().unwrap().to_string(), "20-22");
        for bad in ["exp", "22-20", "64", "-1", ""] {
            assert!(bad.parse::<BitSpec>().is_err(), "{bad}");
        }
        assert_eq!(BitSpec::Positions(30, 31).positions(DType::F16), None, "an f16 has 16 bits");
        assert_eq!(BitSpec::Positions(30, 31).positions(DType::F32), Some(30..31));
    }
}
