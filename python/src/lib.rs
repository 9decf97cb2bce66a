//! The native half of the `steadfast` Python package: Steadfast's Rust core, reached from
//! a PyTorch training loop.
//!
//! The Python API (`python/steadfast/`) is glue: it walks a framework's nested state into
//! named little-endian buffers and a tree that says where each one goes, and calls the
//! functions here, which do the work in Rust with the interpreter's lock released:
//!
//! - [`checkpoint`]: Steadfast checkpoints of any state (`save`, `load`, `verify`) and the
//!   asynchronous [`checkpoint::Saver`], all through the `ckpt` crate, so that
//!   `steadfast ckpt verify` and `ckpt inspect` read what Python wrote and the other way
//!   round.
//! - [`inject`]: bit flips in the tensors of a checkpoint or a framework's file, with
//!   `steadfast inject`'s plans, logs, replay and undo (the `fault` crate's), and
//!   [`memory`]: the same in tensors where they lie in memory.
//! - [`fpna`]: the FPNA lab's variability metrics on a framework's results.
//! - [`lab`]: fault campaigns on a PyTorch model: the spec, each trial's fault, the
//!   classification and the record (tables, summary) of `steadfast campaign`, so that
//!   `steadfast report` renders a PyTorch campaign too.
//! - [`reduce`]: the conversions of the reproducible gradient sum that `steadfast.ddp`'s
//!   DDP communication hook runs around its two all-reduces.
//! - [`data_order`]: the order in which an epoch visits the data, the one `steadfast
//!   train` uses, for the package's resumable sampler.
//!
//! Every failure becomes a Python exception that names the file and tensor concerned
//! (`CheckpointError`, a subclass of `OSError`); nothing here panics on bad input.
//!
//! Unsafe code: two functions, [`host::host_bytes`] and [`host::host_bytes_mut`], reach a
//! tensor's bytes at the address that PyTorch or NumPy reports, so that a save writes them
//! from where they lie, the asynchronous checkpointer copies them once into buffers it
//! reuses, and the gradient hook converts them in place, instead of going through a fresh
//! Python `bytes` object per tensor per call (the stable ABI for CPython 3.9, which this
//! wheel targets, has no buffer protocol). Every other module forbids unsafe code.
#![deny(unsafe_code)]

mod checkpoint;
mod elastic;
mod fpna;
mod host;
mod inject;
mod lab;
mod memory;
mod mesh;
mod reduce;

use pyo3::prelude::*;
use pyo3::types::PyByteArray;

pyo3::create_exception!(
    steadfast,
    CheckpointError,
    pyo3::exceptions::PyOSError,
    "A checkpoint could not be written, found or read back intact (the message names the file and tensor)."
);

/// The permutation of `0..examples` that epoch `epoch` visits for `seed`, as
/// little-endian u32s: a pure function of its arguments (Philox-driven Fisher-Yates).
#[pyfunction]
fn data_order<'py>(py: Python<'py>, seed: u64, examples: usize, epoch: u64) -> PyResult<Bound<'py, PyByteArray>> {
    if examples > u32::MAX as usize {
        return Err(pyo3::exceptions::PyValueError::new_err(format!("{examples} examples: at most 2^32 - 1")));
    }
    let order = py.allow_threads(|| repro::rng::data_order(seed, examples, epoch));
    let bytes: Vec<u8> = order.iter().flat_map(|i| i.to_le_bytes()).collect();
    Ok(PyByteArray::new(py, &bytes))
}

pyo3::create_exception!(
    steadfast,
    InjectError,
    pyo3::exceptions::PyException,
    "A fault could not be planned or applied, or a log does not fit the file it is applied to."
);

#[pymodule]
fn _steadfast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CheckpointError", m.py().get_type::<CheckpointError>())?;
    m.add("InjectError", m.py().get_type::<InjectError>())?;
    m.add("FORMAT_VERSION", ckpt::manifest::VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(data_order, m)?)?;
    checkpoint::register(m)?;
    elastic::register(m)?;
    fpna::register(m)?;
    reduce::register(m)?;
    mesh::register(m)?;
    inject::register(m)?;
    lab::register(m)?;
    memory::register(m)
}
