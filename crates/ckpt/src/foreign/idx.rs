//! IDX arrays, the format of the (Fashion-)MNIST image and label files.
//!
//! IDX is big-endian: a 4-byte magic (`0x00 0x00 <type> <ndim>`), `ndim` 4-byte
//! dimension sizes, then the elements in row-major order. Only unsigned bytes (type
//! `0x08`) are accepted, which is what the image and label files hold. The bytes come
//! from a download: every size is checked against the input before it is used.

/// Why bytes are not an IDX array of unsigned bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadIdx(pub String);

/// A decoded IDX array of bytes.
#[derive(Debug)]
pub struct IdxArray {
    /// Size of each dimension, outermost first.
    pub dims: Vec<usize>,
    /// The elements in row-major order.
    pub data: Vec<u8>,
}

/// Parses the bytes of an (uncompressed) IDX file, keeping them as the array's elements
/// (no copy of a file that may be tens of megabytes).
pub fn parse(mut raw: Vec<u8>, ndim: usize) -> Result<IdxArray, BadIdx> {
    let bad = |m: String| Err(BadIdx(m));
    if raw.len() < 4 {
        return bad(format!("{} bytes is too short for an IDX header", raw.len()));
    }
    if raw[0] != 0 || raw[1] != 0 {
        return bad(format!("bad IDX magic {:02x}{:02x}{:02x}{:02x}", raw[0], raw[1], raw[2], raw[3]));
    }
    if raw[2] != 0x08 {
        return bad(format!("IDX element type 0x{:02x} is not unsigned byte (0x08)", raw[2]));
    }
    if usize::from(raw[3]) != ndim {
        return bad(format!("expected {ndim} dimensions, the header says {}", raw[3]));
    }
    let header = 4 + 4 * ndim;
    if raw.len() < header {
        return bad(format!("truncated header: {} bytes, need {header}", raw.len()));
    }
    let dims: Vec<usize> =
        raw[4..header].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| BadIdx("dimension sizes overflow".into()))?;
    let body = raw.len() - header;
    if body != expected {
        return bad(format!("the header promises {expected} elements ({dims:?}) but the file holds {body}"));
    }
    raw.drain(..header);
    Ok(IdxArray { dims, data: raw })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], body: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn parses_a_well_formed_file() {
        let a = parse(idx(&[2, 3], &[1, 2, 3, 4, 5, 6]), 2).unwrap();
        assert_eq!(a.dims, vec![2, 3]);
        assert_eq!(a.data, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(parse(vec![0, 0], 1).unwrap_err().0.contains("too short"));
        assert!(parse(idx(&[2, 3], &[1, 2, 3]), 2).unwrap_err().0.contains("promises 6"));
        assert!(parse(idx(&[2, 3], &[0; 6]), 1).unwrap_err().0.contains("dimensions"));
        let mut wrong_type = idx(&[1], &[0]);
        wrong_type[2] = 0x0D;
        assert!(parse(wrong_type, 1).unwrap_err().0.contains("element type"));
        assert!(parse(vec![1, 2, 8, 1, 0, 0, 0, 0], 1).unwrap_err().0.contains("magic"));
        assert!(parse(vec![0, 0, 8, 2, 0, 0, 0], 2).unwrap_err().0.contains("truncated header"));
    }
}
