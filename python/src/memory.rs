//! Bit flips in tensors held in memory, from Python: `fault::memory`'s plans, logs,
//! replay and undo on a framework's tensors where they lie (a state dict's, a module's, a
//! single tensor). Logs cross as their JSON text, in the format of file injection.

#![forbid(unsafe_code)]

use fault::inject::InjectionLog;
use fault::memory::Buffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::InjectError;
use crate::checkpoint::{TensorAt, describe};
use crate::host::host_bytes_mut;

fn err(e: fault::inject::InjectError) -> PyErr {
    InjectError::new_err(e.to_string())
}

/// The tensors' bytes, to be altered. Two tensors that share memory (tied weights) would
/// be two writable views of the same bytes: the Python side passes each storage once, and
/// this refuses any overlap that is left.
fn with_buffers<T>(
    tensors: &[TensorAt],
    f: impl FnOnce(&mut [Buffer<'_>]) -> Result<T, fault::inject::InjectError>,
) -> PyResult<T> {
    let described = describe(tensors)?;
    let mut spans: Vec<(usize, usize, &str)> =
        tensors.iter().filter(|t| t.5 > 0).map(|t| (t.4, t.4 + t.5, t.0.as_str())).collect();
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(PyValueError::new_err(format!("tensors {} and {} share memory: name one of them", w[0].2, w[1].2)));
    }
    let mut buffers: Vec<Buffer<'_>> = described
        .iter()
        .zip(tensors)
        .map(|((name, role, dtype, _), t)| Buffer { name, role: *role, dtype: *dtype, bytes: host_bytes_mut(t.4, t.5) })
        .collect();
    f(&mut buffers).map_err(err)
}

/// Flips bits in the tensors where they lie and returns the log (JSON text).
#[pyfunction]
#[pyo3(signature = (tensors, *, target=None, role=None, bits="any", count=None, rate=None, burst=1, seed=0))]
#[allow(clippy::too_many_arguments)]
fn inject_memory(
    tensors: Vec<TensorAt>,
    target: Option<String>,
    role: Option<&str>,
    bits: &str,
    count: Option<u64>,
    rate: Option<f64>,
    burst: u32,
    seed: u64,
) -> PyResult<String> {
    let spec = crate::inject::spec_of(target, role, bits, count, rate, burst, seed)?;
    let log = with_buffers(&tensors, |b| fault::memory::inject(b, &spec))?;
    crate::inject::to_json(&log)
}

/// Applies the flips of `log` to the tensors again; returns the log, its target `memory`.
#[pyfunction]
fn replay_memory(tensors: Vec<TensorAt>, log: &str) -> PyResult<String> {
    let log: InjectionLog = crate::inject::from_json(log)?;
    let log = with_buffers(&tensors, |b| fault::memory::replay(&log, b))?;
    crate::inject::to_json(&log)
}

/// Restores the bytes that `log` altered in the tensors.
#[pyfunction]
fn undo_memory(tensors: Vec<TensorAt>, log: &str) -> PyResult<()> {
    let log: InjectionLog = crate::inject::from_json(log)?;
    with_buffers(&tensors, |b| fault::memory::undo(&log, b))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(inject_memory, m)?)?;
    m.add_function(wrap_pyfunction!(replay_memory, m)?)?;
    m.add_function(wrap_pyfunction!(undo_memory, m)?)
}
