//! Reader for the gzipped IDX files of (Fashion-)MNIST: gunzip, then
//! [`ckpt::foreign::idx::parse`].

use std::io::Read;
use std::path::Path;

use crate::error::DataError;

pub use ckpt::foreign::idx::IdxArray;

/// Reads a gzipped IDX file of unsigned bytes, checking that it has `ndim` dimensions.
pub fn read_idx_gz(path: &Path, ndim: usize) -> Result<IdxArray, DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::io::BufReader::new(file))
        .read_to_end(&mut raw)
        .map_err(|e| DataError::Format { path: path.to_owned(), reason: format!("not a complete gzip stream: {e}") })?;
    ckpt::foreign::idx::parse(raw, ndim).map_err(|e| DataError::Format { path: path.to_owned(), reason: e.0 })
}
