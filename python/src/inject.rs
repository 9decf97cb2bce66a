//! Bit flips in files from Python: `steadfast inject`'s plans, logs, replay and undo (the
//! `fault` crate's one implementation), for a Steadfast checkpoint or a safetensors,
//! PyTorch `.pt`, NumPy `.npz` or HDF5 `.h5` file. Logs cross as their JSON text.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use fault::inject::{InjectError as Error, InjectOptions, InjectionLog};
use fault::plan::{Amount, FlipSpec, Target};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::InjectError;

fn err(e: Error) -> PyErr {
    InjectError::new_err(e.to_string())
}

pub(crate) fn to_json(log: &InjectionLog) -> PyResult<String> {
    serde_json::to_string(log).map_err(|e| InjectError::new_err(format!("cannot encode the log: {e}")))
}

pub(crate) fn from_json(log: &str) -> PyResult<InjectionLog> {
    serde_json::from_str(log).map_err(|e| PyValueError::new_err(format!("not an injection log: {e}")))
}

fn options(out: Option<PathBuf>, keep_checksums: bool, allow_corrupt_input: bool) -> InjectOptions {
    InjectOptions { out, keep_checksums, allow_corrupt_input }
}

/// The fault that `inject`'s keyword arguments name (in a file or in memory).
pub(crate) fn spec_of(
    target: Option<String>,
    role: Option<&str>,
    bits: &str,
    count: Option<u64>,
    rate: Option<f64>,
    burst: u32,
    seed: u64,
) -> PyResult<FlipSpec> {
    let role =
        role.map(|r| r.parse::<ckpt::Role>()).transpose().map_err(|e| PyValueError::new_err(format!("role: {e}")))?;
    let bits: fault::BitSpec = bits.parse().map_err(|e| PyValueError::new_err(format!("bits: {e}")))?;
    let amount = match (count, rate) {
        (Some(k), None) => Amount::Count(k),
        (None, Some(p)) => Amount::Rate(p),
        (None, None) => Amount::Count(1),
        (Some(_), Some(_)) => return Err(PyValueError::new_err("give count or rate, not both")),
    };
    let spec = FlipSpec { target: Target { glob: target, role }, bits, amount, burst, seed };
    Ok(spec)
}

/// Where the log goes: `log`, or beside the altered file.
fn log_path(log: Option<PathBuf>, path: &Path, out: Option<&Path>) -> PathBuf {
    log.unwrap_or_else(|| InjectionLog::default_path(out.unwrap_or(path)))
}

/// Flips bits in the tensors of `path` as `steadfast inject` does (in place, or into a
/// copy at `out`); writes the log durably (to `log`, or `<altered>.inject.json`) before a
/// copy appears, and returns it.
#[pyfunction]
#[pyo3(signature = (path, *, out=None, target=None, role=None, bits="any", count=None, rate=None, burst=1, seed=0,
                    keep_checksums=false, allow_corrupt_input=false, log=None))]
#[allow(clippy::too_many_arguments)]
fn inject(
    py: Python<'_>,
    path: PathBuf,
    out: Option<PathBuf>,
    target: Option<String>,
    role: Option<&str>,
    bits: &str,
    count: Option<u64>,
    rate: Option<f64>,
    burst: u32,
    seed: u64,
    keep_checksums: bool,
    allow_corrupt_input: bool,
    log: Option<PathBuf>,
) -> PyResult<String> {
    let spec = spec_of(target, role, bits, count, rate, burst, seed)?;
    let log_path = log_path(log, &path, out.as_deref());
    let options = options(out, keep_checksums, allow_corrupt_input);
    let log = py
        .allow_threads(|| fault::inject::inject_logged(&path, &spec, &options, |l| l.save(&log_path)))
        .map_err(err)?;
    to_json(&log)
}

/// Applies the flips of `log` (JSON text) to `path` again, or to a copy at `out`; returns
/// the new log, also written to `log_out` (or beside the altered file).
#[pyfunction]
#[pyo3(signature = (path, log, *, out=None, log_out=None))]
fn replay(
    py: Python<'_>,
    path: PathBuf,
    log: &str,
    out: Option<PathBuf>,
    log_out: Option<PathBuf>,
) -> PyResult<String> {
    let log = from_json(log)?;
    let log_path = log_path(log_out, &path, out.as_deref());
    let options = options(out, false, false);
    let log = py
        .allow_threads(|| fault::inject::replay_logged(&log, Some(&path), &options, |l| l.save(&log_path)))
        .map_err(err)?;
    to_json(&log)
}

/// Restores the bytes that `log` (JSON text) altered in `path`, or in a copy at `out`.
#[pyfunction]
#[pyo3(signature = (path, log, *, out=None))]
fn undo(py: Python<'_>, path: PathBuf, log: &str, out: Option<PathBuf>) -> PyResult<()> {
    let log = from_json(log)?;
    let options = options(out, false, false);
    py.allow_threads(|| fault::inject::undo(&log, Some(&path), &options)).map_err(err)
}

/// A tensor found in a file: `(name, role, dtype, shape)`.
type Found = (String, String, String, Vec<u64>);

/// The tensors Steadfast finds in `path`.
#[pyfunction]
fn tensors_in(py: Python<'_>, path: PathBuf) -> PyResult<Vec<Found>> {
    let located = py.allow_threads(|| ckpt::foreign::locate(&path)).map_err(|e| InjectError::new_err(e.to_string()))?;
    Ok(located
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.role.as_str().to_owned(), t.dtype.name().to_owned(), t.shape.clone()))
        .collect())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(inject, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(undo, m)?)?;
    m.add_function(wrap_pyfunction!(tensors_in, m)?)
}
