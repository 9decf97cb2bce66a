//! The header of NumPy's `.npy` format, the members of an `.npz` archive.
//!
//! An `.npy` file is the magic `\x93NUMPY`, a major and a minor version byte, the header
//! length (`u16` LE in version 1, `u32` LE in versions 2 and 3), then the header: a
//! Python dict literal with exactly the keys `descr` (the dtype, such as `'<f4'`),
//! `fortran_order` (`True` or `False`) and `shape` (a tuple of integers), padded with
//! spaces and ended by a newline. The array's bytes follow it.
//!
//! `fortran_order: True` means the elements are stored column-major (the first index
//! varies fastest); `np.save` writes it for arrays that are Fortran-contiguous but not
//! C-contiguous. The order is returned as an [`Order`], and
//! [`TensorLoc::storage_index`](super::TensorLoc::storage_index) maps an element's
//! row-major index to its place in storage.
//!
//! The header is untrusted: it is parsed strictly (no unknown or repeated keys, no
//! trailing text), and the element count and byte length are checked for overflow.

use super::Order;
use crate::DType;

/// What an `.npy` header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost dimension first.
    pub shape: Vec<u64>,
    /// Storage order of the elements.
    pub order: Order,
    /// Offset of the first data byte from the start of the `.npy` bytes.
    pub data_start: u64,
    /// Length of the data in bytes (elements times element size).
    pub data_len: u64,
}

/// The dtype of a NumPy `descr` such as `<f4`; big-endian arrays are refused.
fn dtype(descr: &str) -> Result<DType, String> {
    let mut chars = descr.chars();
    let order = chars.next();
    let code = chars.as_str();
    let dtype = match code {
        "f8" => DType::F64,
        "f4" => DType::F32,
        "f2" => DType::F16,
        "i8" => DType::I64,
        "i4" => DType::I32,
        "i2" => DType::I16,
        "i1" => DType::I8,
        "u8" => DType::U64,
        "u4" => DType::U32,
        "u2" => DType::U16,
        "u1" => DType::U8,
        "b1" => DType::Bool,
        _ => return Err(format!("unsupported NumPy dtype {descr:?}")),
    };
    match order {
        Some('<' | '|') => Ok(dtype),
        Some('>' | '=') if dtype.size() == 1 => Ok(dtype),
        Some('>') => Err(format!("big-endian arrays ({descr}) are not supported")),
        _ => Err(format!("NumPy dtype {descr:?} does not state a little-endian byte order")),
    }
}

/// A cursor over the header's dict literal.
struct Literal<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Literal<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }

    /// Consumes `token` (after any spaces) if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let found = self.rest().starts_with(token);
        if found {
            self.at += token.len();
        }
        found
    }

    fn expect(&mut self, token: &str) -> Result<(), String> {
        if self.eat(token) { Ok(()) } else { Err(format!("expected {token:?} at offset {} of the header", self.at)) }
    }

    /// A quoted string without escapes.
    fn string(&mut self) -> Result<&'a str, String> {
        self.skip_space();
        let rest = self.rest();
        let quote = rest.chars().next().filter(|c| matches!(c, '\'' | '"'));
        let quote = quote.ok_or_else(|| format!("expected a quoted string at offset {} of the header", self.at))?;
        let end = rest[1..].find(quote).ok_or("unterminated string in the header")?;
        let s = &rest[1..1 + end];
        if s.contains('\\') {
            return Err(format!("unsupported escape in the header string {s:?}"));
        }
        self.at += end + 2;
        Ok(s)
    }

    fn boolean(&mut self) -> Result<bool, String> {
        if self.eat("True") {
            Ok(true)
        } else if self.eat("False") {
            Ok(false)
        } else {
            Err(format!("expected True or False at offset {} of the header", self.at))
        }
    }

    /// A tuple of non-negative integers (`()`, `(5,)`, `(3, 4)`; Python 2's `4L` too).
    fn shape(&mut self) -> Result<Vec<u64>, String> {
        self.expect("(")?;
        let mut dims = Vec::new();
        loop {
            if self.eat(")") {
                return Ok(dims);
            }
            self.skip_space();
            let rest = self.rest();
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                return Err(format!("expected a dimension at offset {} of the header", self.at));
            }
            let d = rest[..digits].parse::<u64>().map_err(|_| format!("dimension {} is too large", &rest[..digits]))?;
            self.at += digits;
            self.eat("L");
            dims.push(d);
            if !self.eat(",") {
                self.expect(")")?;
                return Ok(dims);
            }
        }
    }
}

/// Parses the header at the start of `bytes` (an `.npy` file, or as much of its start as
/// holds the header).
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader, String> {
    let magic = bytes.get(..8).ok_or("not an .npy array (too short)")?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err("not an .npy array (bad magic)".into());
    }
    let (len, start) = match (magic[6], magic[7]) {
        (1, 0) => (bytes.get(8..10).map(|b| usize::from(u16::from_le_bytes([b[0], b[1]]))), 10usize),
        (2 | 3, 0) => (bytes.get(8..12).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize), 12),
        (major, minor) => return Err(format!("unsupported .npy version {major}.{minor}")),
    };
    let len = len.ok_or("truncated .npy header")?;
    let text = start.checked_add(len).and_then(|end| bytes.get(start..end)).ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(text).map_err(|_| "the .npy header is not text")?;

    let mut lit = Literal { text, at: 0 };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    lit.expect("{")?;
    while !lit.eat("}") {
        let key = lit.string()?;
        lit.expect(":")?;
        let repeated = match key {
            "descr" => descr.replace(lit.string()?).is_some(),
            "fortran_order" => fortran.replace(lit.boolean()?).is_some(),
            "shape" => shape.replace(lit.shape()?).is_some(),
            other => return Err(format!("unexpected key {other:?} in the .npy header")),
        };
        if repeated {
            return Err(format!("key {key:?} repeated in the .npy header"));
        }
        if !lit.eat(",") {
            lit.expect("}")?;
            break;
        }
    }
    lit.skip_space();
    if !lit.rest().is_empty() {
        return Err(format!("unexpected text after the .npy header dict: {:?}", lit.rest()));
    }
    let dtype = dtype(descr.ok_or("the .npy header has no descr")?)?;
    let fortran = fortran.ok_or("the .npy header has no fortran_order")?;
    let shape = shape.ok_or("the .npy header has no shape")?;
    let data_len = shape
        .iter()
        .try_fold(dtype.size() as u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} of {} overflows", dtype.name()))?;
    Ok(NpyHeader {
        dtype,
        shape,
        order: if fortran { Order::ColumnMajor } else { Order::RowMajor },
        data_start: (start + len) as u64,
        data_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b
    }

    #[test]
    fn reads_what_numpy_writes() {
        let h = parse_header(&npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }     \n")).unwrap();
        assert_eq!(
            h,
            NpyHeader { dtype: DType::F32, shape: vec![3, 4], order: Order::RowMajor, data_start: 75, data_len: 48 }
        );
        let h = parse_header(&npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 5, 7), }\n")).unwrap();
        assert_eq!((h.dtype, h.order, h.data_len), (DType::U8, Order::ColumnMajor, 70));
        let h = parse_header(&npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }\n")).unwrap();
        assert_eq!((h.shape.len(), h.data_len), (0, 8), "a scalar");
        let h = parse_header(&npy("{'shape': (5L,), 'fortran_order': False, 'descr': '<f2'}\n")).unwrap();
        assert_eq!((h.dtype, h.shape), (DType::F16, vec![5]), "any key order, Python 2 longs");
    }

    #[test]
    fn malformed_headers_are_errors_with_a_reason() {
        let cases = [
            ("{'descr': '<f4', 'shape': (3,), }\n", "no fortran_order"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }\n", "True or False"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}\n", "unexpected key"),
            ("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}\n", "repeated"),
            ("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }\n", "big-endian"),
            ("{'descr': '\u{e9}f4', 'fortran_order': False, 'shape': (3,), }\n", "byte order"),
            ("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }\n", "unsupported NumPy dtype"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }\n", "expected a dimension"),
            ("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", "overflows"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", "too large"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } x\n", "after the .npy header"),
            ("{'descr': '<f4", "unterminated"),
        ];
        for (header, why) in cases {
            let err = parse_header(&npy(header)).unwrap_err();
            assert!(err.contains(why), "{header:?}: {err}");
        }
        let mut cut = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n");
        cut.truncate(20);
        assert!(parse_header(&cut).unwrap_err().contains("truncated"));
        assert!(parse_header(b"\x93NUMPY\x04\x00\x00\x00").unwrap_err().contains("version 4.0"));
        assert!(parse_header(b"\x93NUMPY\x02\x00\xff\xff\xff\xff").unwrap_err().contains("truncated"));
        assert!(parse_header(b"PK\x03\x04").is_err());
    }

    /// The input the fuzzer (`fuzz/fuzz_targets/npy_header.rs`) found against the previous
    /// parser, which split the descr `'ė8'` after its first byte, inside the `ė`.
    #[test]
    fn a_descr_that_starts_with_a_character_of_two_bytes_is_an_error_not_a_panic() {
        let found =
            b"\x93NUMPY\x01\x00v\x00{'descr': '\xc4\x978',r': '<ran_order':HHHHHHHHHHHHHHHHHi3HHHHHHHHHHHHHHHH#H \
                      False, 'shape': (3, 49, 000000000000H2': )n_oddddddd\x00\x00\x00\x00\x00\x00\x00";
        assert_eq!(found.len(), 140);
        assert!(parse_header(found).is_err());
        let err = parse_header(&npy("{'descr': '\u{117}f4', 'fortran_order': False, 'shape': (3,), }\n")).unwrap_err();
        assert!(err.contains("byte order"), "{err}");
    }
}
