//! The FPNA lab's run-to-run variability metrics (`repro::metrics`) on a framework's
//! results: arrays cross as their little-endian bytes with a dtype name (`F32` or `F64`;
//! the Python side widens half-precision results to `F32`, exactly).

#![forbid(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use repro::metrics::{ArrayVariability, Element, array_variability};

/// Reads little-endian elements out of bytes of a whole number of them.
fn elements<T: Element>(bytes: &[u8], size: usize, read: fn(&[u8]) -> T) -> PyResult<Vec<T>> {
    if !bytes.len().is_multiple_of(size) {
        return Err(PyValueError::new_err(format!(
            "{} bytes are not a whole number of {size}-byte elements",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(size).map(read).collect())
}

fn compare<T: Element>(nd: &[u8], d: &[u8], size: usize, read: fn(&[u8]) -> T) -> PyResult<ArrayVariability> {
    let (nd, d) = (elements(nd, size, read)?, elements(d, size, read)?);
    if nd.len() != d.len() {
        return Err(PyValueError::new_err(format!("{} elements against {}", nd.len(), d.len())));
    }
    Ok(array_variability(&nd, &d))
}

/// `(mean relative difference, max relative difference, fraction of elements whose bits
/// differ)` of the result `nd` against the reference `d`.
#[pyfunction]
fn array_metrics(py: Python<'_>, nd: PyBackedBytes, d: PyBackedBytes, dtype: &str) -> PyResult<(f64, f64, f64)> {
    let v = py.allow_threads(|| match dtype {
        "F32" => compare(&nd, &d, 4, |b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
        "F64" => compare(&nd, &d, 8, |b| f64::from_le_bytes(b.try_into().expect("8 bytes"))),
        other => Err(PyValueError::new_err(format!("metrics of {other} arrays: give F32 or F64"))),
    })?;
    Ok((v.mean_relative_difference, v.max_relative_difference, v.fraction_differing))
}

/// `V_s = 1 - |nd / d|` of a scalar result against the reference.
#[pyfunction]
fn scalar_variability(nd: f64, d: f64) -> f64 {
    repro::metrics::scalar_variability(nd, d)
}

/// How many of `outputs` (each an output's bytes) differ in at least one bit.
#[pyfunction]
fn distinct_outputs(py: Python<'_>, outputs: Vec<PyBackedBytes>) -> usize {
    py.allow_threads(|| repro::metrics::distinct_bytes(outputs.iter().map(|o| &o[..])))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(array_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(scalar_variability, m)?)?;
    m.add_function(wrap_pyfunction!(distinct_outputs, m)?)
}
