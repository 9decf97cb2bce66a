//! Bad data files give clear errors that name the file; they never panic.

use std::io::Write;
use std::path::Path;

use train::data::fashion_mnist;

fn gz(path: &Path, bytes: &[u8]) {
    let f = std::fs::File::create(path).unwrap();
    let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap();
}

fn idx(dims: &[u32], body_len: usize) -> Vec<u8> {
    let mut v = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend(std::iter::repeat_n(3u8, body_len));
    v
}

/// Writes a valid miniature Fashion-MNIST (n train, n test images of 28x28).
fn write_valid(dir: &Path, n: u32) {
    for prefix in ["train", "t10k"] {
        gz(&dir.join(format!("{prefix}-images-idx3-ubyte.gz")), &idx(&[n, 28, 28], n as usize * 784));
        gz(&dir.join(format!("{prefix}-labels-idx1-ubyte.gz")), &idx(&[n], n as usize));
    }
}

#[test]
fn a_valid_miniature_loads() {
    let dir = tempfile::tempdir().unwrap();
    write_valid(dir.path(), 5);
    let set = fashion_mnist::load(Some(dir.path())).unwrap();
    assert_eq!((set.rows, set.cols, set.train_labels.len(), set.test_labels.len()), (28, 28, 5, 5));
}

#[test]
fn truncated_gzip_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_valid(dir.path(), 5);
    let path = dir.path().join("train-images-idx3-ubyte.gz");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("train-images-idx3-ubyte.gz") && err.contains("gzip"), "{err}");
}

#[test]
fn truncated_body_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_valid(dir.path(), 5);
    gz(&dir.path().join("t10k-images-idx3-ubyte.gz"), &idx(&[5, 28, 28], 784 * 5 - 1));
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("t10k-images-idx3-ubyte.gz") && err.contains("promises"), "{err}");
}

#[test]
fn label_count_mismatch_and_bad_labels_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write_valid(dir.path(), 5);
    gz(&dir.path().join("train-labels-idx1-ubyte.gz"), &idx(&[4], 4));
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("train-labels") && err.contains("4 labels for 5 images"), "{err}");

    let mut labels = idx(&[5], 5);
    *labels.last_mut().unwrap() = 10;
    gz(&dir.path().join("train-labels-idx1-ubyte.gz"), &labels);
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("label 10"), "{err}");
}

#[test]
fn a_file_that_is_not_gzip_or_missing_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_valid(dir.path(), 5);
    std::fs::write(dir.path().join("t10k-labels-idx1-ubyte.gz"), b"plain text, not gzip").unwrap();
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("t10k-labels-idx1-ubyte.gz"), "{err}");

    std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    let err = fashion_mnist::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("cannot read") && err.contains("t10k-labels-idx1-ubyte.gz"), "{err}");

    let err = fashion_mnist::load(Some(Path::new("/nonexistent/fmnist"))).unwrap_err().to_string();
    assert!(err.contains("apt-get install dataset-fashion-mnist"), "{err}");
}
