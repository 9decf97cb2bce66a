//! Element bytes as text: hex for logs, and the value each dtype gives them.
//!
//! This module depends on nothing else in the crate: [`crate::inject`] uses it to write
//! and read its logs.

use ckpt::DType;
use half::{bf16, f16};

/// Text that is not the hex of a whole number of bytes.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad hex bytes {0:?}: expected an even number of hex digits")]
pub struct BadHex(pub String);

/// Lower-case hex of `bytes`, in file order.
pub fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex_bytes`] text.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, BadHex> {
    let bad = || BadHex(text.to_owned());
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(bad());
    }
    let digit = |c: u8| char::from(c).to_digit(16).ok_or_else(bad);
    digits.chunks_exact(2).map(|p| Ok(((digit(p[0])? << 4) | digit(p[1])?) as u8)).collect()
}

/// The value of one element's little-endian bytes, as text. `b` holds at least the
/// dtype's size in bytes.
pub fn value_text(dtype: DType, b: &[u8]) -> String {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    let a = arr(dtype.size());
    let [b0, b1, b2, b3, ..] = a;
    match dtype {
        DType::F64 => f64::from_le_bytes(a).to_string(),
        DType::F32 => f32::from_le_bytes([b0, b1, b2, b3]).to_string(),
        DType::F16 => f16::from_le_bytes([b0, b1]).to_f32().to_string(),
        DType::BF16 => bf16::from_le_bytes([b0, b1]).to_f32().to_string(),
        DType::I64 => i64::from_le_bytes(a).to_string(),
        DType::I32 => i32::from_le_bytes([b0, b1, b2, b3]).to_string(),
        DType::I16 => i16::from_le_bytes([b0, b1]).to_string(),
        DType::I8 => i8::from_le_bytes([b0]).to_string(),
        DType::U64 => u64::from_le_bytes(a).to_string(),
        DType::U32 => u32::from_le_bytes([b0, b1, b2, b3]).to_string(),
        DType::U16 => u16::from_le_bytes([b0, b1]).to_string(),
        DType::U8 => b0.to_string(),
        DType::Bool => (b0 != 0).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of an f16 or bf16 element with these bits. An f32's text is its shortest
    /// round-trip form, so equal text means the decoded f32 is bit for bit the expected one.
    fn text(dtype: DType, bits: u16) -> String {
        value_text(dtype, &bits.to_le_bytes())
    }

    #[test]
    fn half_precision_decodes_exactly() {
        let f16 = |bits| text(DType::F16, bits);
        assert_eq!(f16(0x3C00), 1.0f32.to_string());
        assert_eq!(f16(0xC000), (-2.0f32).to_string());
        assert_eq!(f16(0x7BFF), 65504.0f32.to_string());
        assert_eq!(f16(0x0001), 2f32.powi(-24).to_string(), "smallest subnormal");
        assert_eq!(f16(0x03FF), (1023.0 * 2f32.powi(-24)).to_string(), "largest subnormal");
        assert_eq!(f16(0x8000), (-0.0f32).to_string(), "negative zero");
        assert_eq!(f16(0x7E00), "NaN");
        assert_eq!(f16(0xFC00), f32::NEG_INFINITY.to_string());
    }

    #[test]
    fn bfloat16_decodes_exactly() {
        let bf16 = |bits| text(DType::BF16, bits);
        assert_eq!(bf16(0x3F80), 1.0f32.to_string());
        assert_eq!(bf16(0xC049), (-3.140625f32).to_string());
        assert_eq!(bf16(0x0001), 2f32.powi(-133).to_string(), "smallest subnormal");
        assert_eq!(bf16(0x7F7F), f32::from_bits(0x7F7F_0000).to_string(), "largest finite");
        assert_eq!(bf16(0xFF80), f32::NEG_INFINITY.to_string());
        assert_eq!(bf16(0x7FC1), "NaN");
    }

    #[test]
    fn hex_round_trips_and_values_read_little_endian() {
        let b = 1.5f32.to_le_bytes();
        assert_eq!(parse_hex(&hex_bytes(&b)).unwrap(), b);
        assert_eq!(parse_hex("00ff7A").unwrap(), [0x00, 0xff, 0x7a]);
        assert_eq!(value_text(DType::F32, &b), "1.5");
        assert_eq!(value_text(DType::BF16, &[0x80, 0x3f]), "1");
        assert_eq!(value_text(DType::I16, &[0xff, 0xff]), "-1");
        assert_eq!(value_text(DType::I8, &[0x80]), "-128");
        assert_eq!(value_text(DType::F64, &(-0.25f64).to_le_bytes()), "-0.25");
        assert_eq!(value_text(DType::F32, &f32::NAN.to_le_bytes()), "NaN");
    }

    #[test]
    fn bad_hex_in_a_log_is_an_error_not_a_panic() {
        for text in ["abc", "zz", "+1", "a\u{e9}b", "\u{e9}\u{e9}"] {
            assert_eq!(parse_hex(text), Err(BadHex(text.to_owned())), "{text:?}");
        }
    }
}
