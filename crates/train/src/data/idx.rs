//! Reader for the gzipped IDX files of (Fashion-)MNIST.
//!
//! IDX is a big-endian format: a 4-byte magic (`0x00 0x00 <type> <ndim>`), `ndim`
//! 4-byte dimension sizes, then the elements. We accept only unsigned bytes
//! (type `0x08`), which is what the image and label files hold.

use std::io::Read;
use std::path::Path;

use crate::error::DataError;

/// A decoded IDX array of bytes.
#[derive(Debug)]
pub struct IdxArray {
    /// Size of each dimension, outermost first.
    pub dims: Vec<usize>,
    /// The elements in row-major order.
    pub data: Vec<u8>,
}

/// Reads a gzipped IDX file of unsigned bytes, checking that it has `ndim` dimensions.
pub fn read_idx_gz(path: &Path, ndim: usize) -> Result<IdxArray, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::io::BufReader::new(file))
        .read_to_end(&mut raw)
        .map_err(|e| DataError::Format { path: path.to_owned(), reason: format!("not a complete gzip stream: {e}") })?;
    parse_idx(&raw, ndim).map_err(|reason| DataError::Format { path: path.to_owned(), reason })
}

/// Parses the bytes of an (uncompressed) IDX file.
pub fn parse_idx(raw: &[u8], ndim: usize) -> Result<IdxArray, String> {
    if raw.len() < 4 {
        return Err(format!("{} bytes is too short for an IDX header", raw.len()));
    }
    if raw[0] != 0 || raw[1] != 0 {
        return Err(format!("bad IDX magic {:02x}{:02x}{:02x}{:02x}", raw[0], raw[1], raw[2], raw[3]));
    }
    if raw[2] != 0x08 {
        return Err(format!("IDX element type 0x{:02x} is not unsigned byte (0x08)", raw[2]));
    }
    if usize::from(raw[3]) != ndim {
        return Err(format!("expected {ndim} dimensions, the header says {}", raw[3]));
    }
    let header = 4 + 4 * ndim;
    if raw.len() < header {
        return Err(format!("truncated header: {} bytes, need {header}", raw.len()));
    }
    let dims: Vec<usize> =
        raw[4..header].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let expected = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or("dimension sizes overflow")?;
    let body = &raw[header..];
    if body.len() != expected {
        return Err(format!("the header promises {expected} elements ({dims:?}) but the file holds {}", body.len()));
    }
    Ok(IdxArray { dims, data: body.to_vec() })
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
        let a = parse_idx(&idx(&[2, 3], &[1, 2, 3, 4, 5, 6]), 2).unwrap();
        assert_eq!(a.dims, vec![2, 3]);
        assert_eq!(a.data, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(parse_idx(&[0, 0], 1).unwrap_err().contains("too short"));
        assert!(parse_idx(&idx(&[2, 3], &[1, 2, 3]), 2).unwrap_err().contains("promises 6"));
        assert!(parse_idx(&idx(&[2, 3], &[0; 6]), 1).unwrap_err().contains("dimensions"));
        let mut wrong_type = idx(&[1], &[0]);
        wrong_type[2] = 0x0D;
        assert!(parse_idx(&wrong_type, 1).unwrap_err().contains("element type"));
        assert!(parse_idx(&[1, 2, 8, 1, 0, 0, 0, 0], 1).unwrap_err().contains("magic"));
        assert!(parse_idx(&[0, 0, 8, 2, 0, 0, 0], 2).unwrap_err().contains("truncated header"));
    }
}
