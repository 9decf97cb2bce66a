//! A small fixed-width two's-complement integer, just big enough to hold the exact sum
//! of many floats, and correct rounding of it to f32 or f64.
//!
//! Only what the reproducible sum needs: adding a shifted signed 128-bit value, and
//! rounding the total (in units of the format's smallest subnormal) to the nearest
//! float, ties to even.

/// A signed integer of `64 * N` bits in two's complement, least significant limb first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BigInt {
    limbs: Vec<u64>,
}

impl BigInt {
    /// Zero, with `limbs` 64-bit limbs.
    pub(crate) fn zero(limbs: usize) -> Self {
        BigInt { limbs: vec![0; limbs] }
    }

    /// Adds `value * 2^shift`. The caller sizes the integer so that this cannot overflow.
    pub(crate) fn add_shifted(&mut self, value: i128, shift: u32) {
        if value == 0 {
            return;
        }
        let fill = if value < 0 { u64::MAX } else { 0 };
        let (word, bit) = ((shift / 64) as usize, shift % 64);
        // value << bit spans up to three limbs, then sign-extends.
        let v = value as u128;
        let parts: [u64; 3] = if bit == 0 {
            [v as u64, (v >> 64) as u64, fill]
        } else {
            [(v << bit) as u64, (v >> (64 - bit)) as u64, (((value >> 64) >> (64 - bit)) as i64) as u64]
        };
        let mut carry = 0u64;
        for i in word..self.limbs.len() {
            let addend = parts.get(i - word).copied().unwrap_or(fill);
            let (s1, c1) = self.limbs[i].overflowing_add(addend);
            let (s2, c2) = s1.overflowing_add(carry);
            self.limbs[i] = s2;
            carry = u64::from(c1) + u64::from(c2);
        }
    }

    fn is_negative(&self) -> bool {
        self.limbs.last().is_some_and(|&l| l >> 63 == 1)
    }

    fn negate(&mut self) {
        let mut carry = 1u64;
        for l in &mut self.limbs {
            let (s, c) = (!*l).overflowing_add(carry);
            *l = s;
            carry = u64::from(c);
        }
    }

    fn bit(&self, i: u32) -> bool {
        self.limbs.get((i / 64) as usize).is_some_and(|l| (l >> (i % 64)) & 1 == 1)
    }

    fn any_below(&self, i: u32) -> bool {
        let (word, bit) = ((i / 64) as usize, i % 64);
        self.limbs[..word.min(self.limbs.len())].iter().any(|&l| l != 0)
            || (bit > 0 && word < self.limbs.len() && self.limbs[word] & ((1u64 << bit) - 1) != 0)
    }

    fn highest_bit(&self) -> Option<u32> {
        self.limbs.iter().enumerate().rev().find(|(_, l)| **l != 0).map(|(i, l)| i as u32 * 64 + 63 - l.leading_zeros())
    }

    /// Bits `lo .. lo + n` (n <= 64) as an integer.
    fn bits(&self, lo: u32, n: u32) -> u64 {
        (0..n).fold(0u64, |acc, k| acc | (u64::from(self.bit(lo + k)) << k))
    }

    /// Rounds `self * 2^-min_exp_units` to the nearest float of a binary format with
    /// `mant_bits` significand bits (hidden bit included) and `exp_bits` exponent bits,
    /// ties to even, and returns the float's bits. `self` counts units of the smallest
    /// subnormal. Overflow rounds to infinity. A zero total gives +0.
    pub(crate) fn round_to_float_bits(mut self, mant_bits: u32, exp_bits: u32) -> u64 {
        let negative = self.is_negative();
        if negative {
            self.negate();
        }
        let sign = u64::from(negative) << (mant_bits - 1 + exp_bits);
        let max_field = (1u64 << exp_bits) - 1;
        let Some(top) = self.highest_bit() else { return 0 };
        if top < mant_bits {
            // Below 2^mant_bits units the value is exactly representable, and its bit
            // pattern is the integer itself (subnormals, then exponent field 1).
            return sign | self.bits(0, mant_bits);
        }
        let shift = top - (mant_bits - 1);
        let mut q = self.bits(shift, mant_bits);
        let half = self.bit(shift - 1);
        let sticky = self.any_below(shift - 1);
        if half && (sticky || q & 1 == 1) {
            q += 1;
        }
        let mut field = u64::from(shift) + 1;
        if q == 1u64 << mant_bits {
            q >>= 1;
            field += 1;
        }
        if field >= max_field {
            return sign | (max_field << (mant_bits - 1));
        }
        sign | (field << (mant_bits - 1)) | (q & ((1u64 << (mant_bits - 1)) - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_integers_map_to_their_own_bit_patterns() {
        for m in [0i128, 1, 2, 12345, (1 << 23) - 1, 1 << 23, (1 << 24) - 1] {
            let mut b = BigInt::zero(6);
            b.add_shifted(m, 0);
            assert_eq!(b.round_to_float_bits(24, 8), m as u64);
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_overflows_to_infinity() {
        // 2^24 + 1 units of 2^-149 sits halfway between two floats: ties to even.
        let mut b = BigInt::zero(6);
        b.add_shifted((1 << 24) + 1, 0);
        assert_eq!(f32::from_bits(b.round_to_float_bits(24, 8) as u32), f32::from_bits((2 << 23) as u32));
        let mut b = BigInt::zero(6);
        b.add_shifted((1 << 24) + 3, 0);
        assert_eq!(b.round_to_float_bits(24, 8), (2 << 23) + 2);
        // 1.0 = 2^149 units; -1.0 too.
        let mut b = BigInt::zero(6);
        b.add_shifted(-1, 149);
        assert_eq!(f32::from_bits(b.round_to_float_bits(24, 8) as u32), -1.0);
        let mut b = BigInt::zero(6);
        b.add_shifted(1, 149 + 128);
        assert_eq!(f32::from_bits(b.round_to_float_bits(24, 8) as u32), f32::INFINITY);
    }

    #[test]
    fn carries_and_signs_propagate_across_limbs() {
        let mut b = BigInt::zero(4);
        b.add_shifted(i128::MAX, 70);
        b.add_shifted(i128::MAX, 70);
        b.add_shifted(-i128::MAX, 71);
        assert!(b.limbs.iter().all(|&l| l == 0), "{b:?}");
        b.add_shifted(-5, 3);
        b.add_shifted(5, 3);
        assert!(b.limbs.iter().all(|&l| l == 0), "{b:?}");
    }
}
