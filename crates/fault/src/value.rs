//! Element bytes as text: hex for logs, and the value each dtype gives them.

use ckpt::DType;

/// Lower-case hex of `bytes`, in file order.
pub fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex_bytes`] text.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, crate::inject::InjectError> {
    let bad = || crate::inject::InjectError::Mismatch(format!("bad hex bytes {text:?} in the log"));
    if !text.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| bad())).collect()
}

/// An IEEE half-precision value as f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1F);
    let mant = u32::from(h & 0x3FF);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        // Subnormal: normalise into f32's range.
        (0, m) => {
            let shift = m.leading_zeros() - 21;
            sign | ((127 - 15 - shift + 1) << 23) | (((m << shift) & 0x3FF) << 13)
        }
        (0x1F, m) => sign | 0x7F80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The value of one element's little-endian bytes, as text.
pub fn value_text(dtype: DType, b: &[u8]) -> String {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    match dtype {
        DType::F64 => f64::from_le_bytes(arr(8)).to_string(),
        DType::F32 => f32::from_le_bytes(b[..4].try_into().expect("4 bytes")).to_string(),
        DType::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])).to_string(),
        DType::BF16 => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16).to_string(),
        DType::I64 => i64::from_le_bytes(arr(8)).to_string(),
        DType::I32 => i32::from_le_bytes(b[..4].try_into().expect("4 bytes")).to_string(),
        DType::I16 => i16::from_le_bytes([b[0], b[1]]).to_string(),
        DType::I8 => (b[0] as i8).to_string(),
        DType::U64 => u64::from_le_bytes(arr(8)).to_string(),
        DType::U32 => u32::from_le_bytes(b[..4].try_into().expect("4 bytes")).to_string(),
        DType::U16 => u16::from_le_bytes([b[0], b[1]]).to_string(),
        DType::U8 => b[0].to_string(),
        DType::Bool => (b[0] != 0).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_decodes_exactly() {
        assert_eq!(f16_to_f32(0x3C00), 1.0);
        assert_eq!(f16_to_f32(0xC000), -2.0);
        assert_eq!(f16_to_f32(0x7BFF), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24), "smallest subnormal");
        assert_eq!(f16_to_f32(0x03FF), 1023.0 * 2f32.powi(-24), "largest subnormal");
        assert!(f16_to_f32(0x7E00).is_nan());
        assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
    }

    #[test]
    fn hex_round_trips_and_values_read_little_endian() {
        let b = 1.5f32.to_le_bytes();
        assert_eq!(parse_hex(&hex_bytes(&b)).unwrap(), b);
        assert!(parse_hex("abc").is_err() && parse_hex("zz").is_err());
        assert_eq!(value_text(DType::F32, &b), "1.5");
        assert_eq!(value_text(DType::BF16, &[0x80, 0x3f]), "1");
        assert_eq!(value_text(DType::I16, &[0xff, 0xff]), "-1");
        assert_eq!(value_text(DType::F32, &f32::NAN.to_le_bytes()), "NaN");
    }
}
