//! Fault campaigns on a PyTorch model (`steadfast.lab`): Python trains, and the rest is
//! `steadfast campaign`'s own code. A spec reads as `sdc::About` reads it, trial `i`'s
//! fault is drawn from the campaign seed as the lab draws it, a trial is classified by
//! `fault::campaign::classify`, and the tables, `summary.md` and `spec.toml` are written
//! by the `sdc` crate, so that `steadfast report` renders them like a lab campaign's.
//! Specs cross as their TOML text, golden runs and results as JSON (`sdc::json`).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use fault::campaign::Evidence;
use fault::plan::Amount;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sdc::{About, SdcError};

fn about(text: &str) -> PyResult<About> {
    About::parse(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A file that cannot be written is an `OSError`; anything else is bad input.
fn err(e: SdcError) -> PyErr {
    match e {
        SdcError::Output { .. } => PyOSError::new_err(e.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// The spec with every default of [trials], [detect] and [classify] written out, and its
/// [run] table as given.
#[pyfunction]
fn lab_spec(text: &str) -> PyResult<String> {
    sdc::about::complete(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The fault of trial `index`, drawn from the campaign seed as `steadfast campaign` draws
/// it: `index`, `step`, `rank`, `state`, `seed`, `target`, `role`, `bits`, `flips`, `rate` (or None), `burst`.
#[pyfunction]
fn lab_trial<'py>(py: Python<'py>, text: &str, index: u64) -> PyResult<Bound<'py, PyDict>> {
    let about = about(text)?;
    let trial = about.trial(index);
    let (fault, flips) = (&trial.fault, &trial.fault.flips);
    let (count, rate) = match flips.amount {
        Amount::Count(n) => (n, None),
        Amount::Rate(r) => (about.trials.flips, Some(r)),
    };
    let d = PyDict::new(py);
    d.set_item("index", trial.index)?;
    d.set_item("step", fault.step)?;
    d.set_item("rank", fault.rank)?;
    d.set_item("state", fault.state.name())?;
    d.set_item("seed", flips.seed)?;
    d.set_item("target", flips.target.glob.as_deref())?;
    d.set_item("role", flips.target.role.map(|r| r.as_str()))?;
    d.set_item("bits", flips.bits.to_string())?;
    d.set_item("flips", count)?;
    d.set_item("rate", rate)?;
    d.set_item("burst", flips.burst)?;
    Ok(d)
}

/// The class of a trial's outcome (`masked`, `degraded`, ...) from what was observed of it,
/// under the spec's response to alarms and thresholds.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn lab_classify(
    text: &str,
    crashed: bool,
    diverged: bool,
    acted_on_alarm: bool,
    bitwise_golden: bool,
    accuracy_drop: f64,
    loss_rise: f64,
) -> PyResult<&'static str> {
    let about = about(text)?;
    let evidence = Evidence { crashed, diverged, acted_on_alarm, bitwise_golden, accuracy_drop, loss_rise };
    Ok(fault::campaign::classify(&evidence, about.detect.response, &about.classify).name())
}

/// Writes a finished campaign's tables, `summary.md` and `spec.toml` (`text`) into `dir`
/// from its record (JSON: `{"goldens": [...], "results": [...]}`); returns the summary.
#[pyfunction]
fn lab_write(py: Python<'_>, dir: PathBuf, text: &str, record: &str, elapsed: f64) -> PyResult<String> {
    let about = about(text)?;
    let (goldens, results) = sdc::json::record(record).map_err(err)?;
    let elapsed = Duration::try_from_secs_f64(elapsed)
        .map_err(|e| PyValueError::new_err(format!("elapsed: {elapsed} seconds: {e}")))?;
    py.allow_threads(|| sdc::output::write(&dir, &about, text, &goldens, &results, elapsed)).map_err(err)
}

/// One trial's result (JSON, as in a record) in a few lines, as `steadfast campaign
/// --replay` prints it.
#[pyfunction]
fn lab_trial_text(text: &str, result: &str) -> PyResult<String> {
    about(text)?;
    let result = sdc::json::trial_result(result).map_err(err)?;
    Ok(sdc::output::trial(&result))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(lab_spec, m)?)?;
    m.add_function(wrap_pyfunction!(lab_trial, m)?)?;
    m.add_function(wrap_pyfunction!(lab_classify, m)?)?;
    m.add_function(wrap_pyfunction!(lab_write, m)?)?;
    m.add_function(wrap_pyfunction!(lab_trial_text, m)?)
}
