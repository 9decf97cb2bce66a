//! Fashion-MNIST from Debian's `dataset-fashion-mnist` package.

use std::path::Path;

use super::ImageSet;
use super::idx::read_idx_gz;
use crate::error::DataError;

/// Where Debian's package installs the files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Loads the four gzipped IDX files from `dir` (default [`DEFAULT_DIR`]).
pub fn load(dir: Option<&Path>) -> Result<ImageSet, DataError> {
    let dir = dir.unwrap_or(Path::new(DEFAULT_DIR));
    if !dir.is_dir() {
        return Err(DataError::Missing {
            path: dir.to_owned(),
            hint: "install it with `apt-get install dataset-fashion-mnist`, or pass --data-dir".into(),
        });
    }
    let (train_pixels, rows, cols, train_labels) = load_pair(dir, "train")?;
    let (test_pixels, trows, tcols, test_labels) = load_pair(dir, "t10k")?;
    if (rows, cols) != (trows, tcols) {
        return Err(DataError::Format {
            path: dir.to_owned(),
            reason: format!("train images are {rows}x{cols} but test images are {trows}x{tcols}"),
        });
    }
    Ok(ImageSet { rows, cols, classes: 10, train_pixels, train_labels, test_pixels, test_labels })
}

fn load_pair(dir: &Path, prefix: &str) -> Result<(Vec<u8>, usize, usize, Vec<u8>), DataError> {
    let images_path = dir.join(format!("{prefix}-images-idx3-ubyte.gz"));
    let labels_path = dir.join(format!("{prefix}-labels-idx1-ubyte.gz"));
    let images = read_idx_gz(&images_path, 3)?;
    let labels = read_idx_gz(&labels_path, 1)?;
    if images.dims[0] != labels.dims[0] {
        return Err(DataError::Format {
            path: labels_path,
            reason: format!("{} labels for {} images", labels.dims[0], images.dims[0]),
        });
    }
    if let Some(&bad) = labels.data.iter().find(|&&l| l >= 10) {
        return Err(DataError::Format { path: labels_path, reason: format!("label {bad} is not a class in 0..10") });
    }
    Ok((images.data, images.dims[1], images.dims[2], labels.data))
}
