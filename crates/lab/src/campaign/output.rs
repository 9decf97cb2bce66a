//! A lab campaign's results as files: the record of the `sdc` crate ([`sdc::output`]: the
//! CSV tables, `summary.md`, `spec.toml`), written from a [`Campaign`] and its golden runs.
//! The texts (a campaign's headline, a trial in a few lines) are the record's too, so that
//! a PyTorch campaign's read the same.

use std::path::Path;

pub use sdc::output::{faults, headline, trial};

use super::{Campaign, Golden, TrialResult};
use crate::LabError;

/// Writes every table of a finished campaign, its spec (with every default written out)
/// and its summary into `dir`; returns the Markdown summary.
pub fn write(
    dir: &Path,
    campaign: &Campaign,
    goldens: &[Golden],
    results: &[TrialResult],
    elapsed: std::time::Duration,
) -> Result<String, LabError> {
    let spec = toml::to_string(&campaign.spec).map_err(|e| LabError::Spec(format!("cannot write the spec: {e}")))?;
    let records: Vec<sdc::GoldenRecord> = goldens.iter().map(|g| g.record.clone()).collect();
    Ok(sdc::output::write(dir, &campaign.spec.about(), &spec, &records, results, elapsed)?)
}
