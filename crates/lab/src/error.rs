//! The lab's errors: a failed training run, a spec that cannot be run, an output that
//! cannot be written or read.

use std::path::PathBuf;

/// An experiment failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A training run (a golden run, a trial's setup) failed.
    #[error(transparent)]
    Train(#[from] train::TrainError),
    /// Saving or loading a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] ckpt::CkptError),
    /// The experiment's spec cannot be run as written.
    #[error("invalid spec: {0}")]
    Spec(String),
    /// A campaign's record does not fit its spec.
    #[error(transparent)]
    Record(sdc::SdcError),
    /// Writing an output failed.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A measurement could not be taken.
    #[error("benchmark failed: {0}")]
    Bench(String),
    /// A plot cannot be drawn.
    #[error("cannot draw a plot: {0}")]
    Plot(String),
    /// An input (a table of an earlier run) cannot be read.
    #[error("cannot read {path}: {reason}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The record's errors as the lab's (a table that cannot be read is [`LabError::Input`]
/// whoever reads it).
impl From<sdc::SdcError> for LabError {
    fn from(e: sdc::SdcError) -> LabError {
        match e {
            sdc::SdcError::Output { path, source } => LabError::Output { path, source },
            sdc::SdcError::Input { path, reason } => LabError::Input { path, reason },
            other => LabError::Record(other),
        }
    }
}

impl LabError {
    /// A plotting library's error as [`LabError::Plot`].
    pub fn plot<E: std::fmt::Debug>(e: E) -> LabError {
        LabError::Plot(format!("{e:?}"))
    }

    /// A closure that wraps an I/O error on `path` as [`LabError::Output`].
    pub fn output(path: &std::path::Path) -> impl Fn(std::io::Error) -> LabError + '_ {
        move |source| LabError::Output { path: path.to_owned(), source }
    }
}
