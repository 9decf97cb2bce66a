//! The arithmetic of the reproducible gradient hook (`steadfast.ddp`): the two phases of
//! `repro::batched` on tensors in host memory, each a pass over memory in Rust on the
//! instruction set the process selected (integer operations only, so every set gives the
//! same bits).
//!
//! A data-parallel step sums the gradients of every micro-batch of every rank. Each rank
//! calls [`fixed_exponents`] on its micro-batches' gradients (one scale byte per block of
//! 64 elements), the job takes the maximum of the scales (an all-reduce of bytes with `MAX`), each rank converts its terms with
//! [`fixed_add`] at those scales into one sum of 64-bit (or 32-bit) integers, the job sums the integers (an
//! all-reduce with `SUM`), and [`fixed_finish`] turns the sum back into floats divided by
//! the number of micro-batches. Integer sums do not depend on their order or grouping, so
//! the result has the same bits whichever ranks computed which micro-batches.
//!
//! Tensors cross as `(address, bytes)` pairs of contiguous host tensors that the caller
//! holds (see [`crate::host`]); outputs are tensors the caller allocated and reuses. A term
//! of a sum is a list of such tensors laid end to end (a bucket's gradients, one tensor
//! per parameter), so that gradients kept per parameter need no copy into one buffer.

#![forbid(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use repro::batched;

use crate::host::{host_bytes, host_bytes_mut};

/// A tensor's address and size in bytes.
type At = (usize, usize);

fn floats(at: At, what: &str) -> PyResult<&'static [f32]> {
    bytemuck::try_cast_slice(host_bytes(at.0, at.1))
        .map_err(|e| PyValueError::new_err(format!("{what} is not a whole, aligned float32 tensor: {e}")))
}

/// A term of a sum: its pieces, each with the offset of its first element in the term.
type Term = Vec<(usize, &'static [f32])>;

fn terms_of(terms: &[Vec<At>], n: usize) -> PyResult<Vec<Term>> {
    terms
        .iter()
        .map(|pieces| {
            let mut at = 0;
            let mut term = Vec::with_capacity(pieces.len());
            for &piece in pieces {
                let piece = floats(piece, "a gradient")?;
                term.push((at, piece));
                at += piece.len();
            }
            if at != n {
                return Err(PyValueError::new_err(format!("a gradient of {at} elements in a sum of {n}")));
            }
            Ok(term)
        })
        .collect()
}

fn check_headroom<A: batched::Fixed>(terms: usize, headroom: u32) -> PyResult<()> {
    if headroom > A::MAX_HEADROOM || (terms as u64) > (1u64 << headroom) {
        return Err(PyValueError::new_err(format!(
            "{terms} terms do not fit a headroom of {headroom} bits (at most 2^headroom terms, headroom at most {} \
             in {}-bit lanes)",
            A::MAX_HEADROOM,
            8 * std::mem::size_of::<A>()
        )));
    }
    Ok(())
}

/// The integer lanes of a sum: `lanes` bits (32 or 64), as a tensor of `what`.
fn lanes_of<'a, A: batched::Fixed>(bytes: &'a mut [u8], what: &str) -> PyResult<&'a mut [A]> {
    let bits = 8 * std::mem::size_of::<A>();
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| PyValueError::new_err(format!("{what} is not a whole, aligned int{bits} tensor: {e}")))
}

/// [`lanes_of`], read only.
fn lanes_in<'a, A: batched::Fixed>(bytes: &'a [u8], what: &str) -> PyResult<&'a [A]> {
    let bits = 8 * std::mem::size_of::<A>();
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| PyValueError::new_err(format!("{what} is not a whole, aligned int{bits} tensor: {e}")))
}

fn bad_lanes(lanes: u32) -> PyErr {
    PyValueError::new_err(format!("lanes={lanes}: the integer sum has 32- or 64-bit lanes"))
}

/// The number of scale bytes of a sum of `n` elements (one per block of
/// `repro::batched::EXP_BLOCK`).
#[pyfunction]
fn fixed_scales(n: usize) -> usize {
    batched::blocks_of(n)
}

/// Writes into the tensor `out` (one byte per block of the sum's `n` elements) each
/// block's largest exponent field over the float32 `terms` (each of `n` elements, in
/// pieces).
#[pyfunction]
fn fixed_exponents(py: Python<'_>, terms: Vec<Vec<At>>, n: usize, out: At) -> PyResult<()> {
    let exps = host_bytes_mut(out.0, out.1);
    py.allow_threads(|| {
        check_scales(exps.len(), n)?;
        let terms = terms_of(&terms, n)?;
        exps.fill(0);
        for (at, piece) in terms.iter().flatten() {
            batched::max_exponents(exps, piece, *at);
        }
        Ok(())
    })
}

fn check_scales(scales: usize, n: usize) -> PyResult<()> {
    if scales != batched::blocks_of(n) {
        return Err(PyValueError::new_err(format!(
            "{scales} scale bytes for a sum of {n} elements, which has {} blocks",
            batched::blocks_of(n)
        )));
    }
    Ok(())
}

/// Writes into the integer tensor `out` (int64 with `lanes=64`, int32 with `lanes=32`) the
/// fixed-point sum of `terms` (in pieces) at the scales of the exponents `exps` (the job's
/// maxima).
#[pyfunction]
#[pyo3(signature = (terms, exps, out, headroom, lanes = 64))]
fn fixed_add(py: Python<'_>, terms: Vec<Vec<At>>, exps: At, out: At, headroom: u32, lanes: u32) -> PyResult<()> {
    let exps = host_bytes(exps.0, exps.1);
    let out = host_bytes_mut(out.0, out.1);
    match lanes {
        64 => add_into(py, &terms, exps, lanes_of::<i64>(out, "the sum")?, headroom),
        32 => add_into(py, &terms, exps, lanes_of::<i32>(out, "the sum")?, headroom),
        other => Err(bad_lanes(other)),
    }
}

fn add_into<A: batched::Fixed>(
    py: Python<'_>,
    terms: &[Vec<At>],
    exps: &[u8],
    acc: &mut [A],
    headroom: u32,
) -> PyResult<()> {
    py.allow_threads(|| {
        check_scales(exps.len(), acc.len())?;
        let terms = terms_of(terms, acc.len())?;
        check_headroom::<A>(terms.len(), headroom)?;
        if terms.is_empty() {
            acc.fill(A::default());
        }
        // The first term's pieces cover the sum once: written, the others added.
        for (k, term) in terms.iter().enumerate() {
            for (at, piece) in term {
                let acc = &mut acc[*at..at + piece.len()];
                if k == 0 {
                    batched::write_fixed(acc, piece, exps, *at, headroom);
                } else {
                    batched::add_fixed(acc, piece, exps, *at, headroom);
                }
            }
        }
        Ok(())
    })
}

/// Writes into the float32 tensor `out` the fixed-point sums `acc` (of `lanes` bits)
/// converted back at the scales of `exps`, each divided by `divisor` (the number of
/// micro-batches, for a mean).
#[pyfunction]
#[pyo3(signature = (acc, exps, headroom, divisor, out, lanes = 64))]
fn fixed_finish(py: Python<'_>, acc: At, exps: At, headroom: u32, divisor: f32, out: At, lanes: u32) -> PyResult<()> {
    let acc = host_bytes(acc.0, acc.1);
    let exps = host_bytes(exps.0, exps.1);
    let out: &mut [f32] = bytemuck::try_cast_slice_mut(host_bytes_mut(out.0, out.1))
        .map_err(|e| PyValueError::new_err(format!("the output is not a whole, aligned float32 tensor: {e}")))?;
    match lanes {
        64 => finish_from(py, lanes_in::<i64>(acc, "the sum")?, exps, headroom, divisor, out),
        32 => finish_from(py, lanes_in::<i32>(acc, "the sum")?, exps, headroom, divisor, out),
        other => Err(bad_lanes(other)),
    }
}

fn finish_from<A: batched::Fixed>(
    py: Python<'_>,
    acc: &[A],
    exps: &[u8],
    headroom: u32,
    divisor: f32,
    out: &mut [f32],
) -> PyResult<()> {
    py.allow_threads(|| {
        if acc.len() != out.len() {
            return Err(PyValueError::new_err(format!("{} sums and {} outputs", acc.len(), out.len())));
        }
        check_scales(exps.len(), acc.len())?;
        check_headroom::<A>(1, headroom)?;
        batched::finish_into(acc, exps, 0, headroom, out);
        if divisor != 1.0 {
            out.iter_mut().for_each(|o| *o /= divisor);
        }
        Ok(())
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fixed_scales, m)?)?;
    m.add_function(wrap_pyfunction!(fixed_exponents, m)?)?;
    m.add_function(wrap_pyfunction!(fixed_add, m)?)?;
    m.add_function(wrap_pyfunction!(fixed_finish, m)?)
}
