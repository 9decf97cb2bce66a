//! The record's errors: a spec that cannot be read, a table or summary that cannot be
//! written or read back, a golden run or a result that does not say what it must.

use std::path::PathBuf;

use fault::campaign::BadSpec;

/// A campaign's record cannot be read, built or written.
#[derive(Debug, thiserror::Error)]
pub enum SdcError {
    /// The spec is not a campaign spec.
    #[error(transparent)]
    Spec(#[from] BadSpec),
    /// Writing an output failed.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An input (a table of an earlier campaign) cannot be read.
    #[error("cannot read {path}: {reason}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A golden run or a trial's result is not one: its JSON form lacks a field or has one
    /// of the wrong type, or it does not fit the spec or the golden runs.
    #[error("{field}: {reason}")]
    Record {
        /// The field, as `results[3].evidence.crashed`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl SdcError {
    /// A closure that wraps an I/O error on `path` as [`SdcError::Output`].
    pub fn output(path: &std::path::Path) -> impl Fn(std::io::Error) -> SdcError + '_ {
        move |source| SdcError::Output { path: path.to_owned(), source }
    }
}

/// [`SdcError::Record`] of `field`.
pub(crate) fn bad(field: impl Into<String>, reason: impl ToString) -> SdcError {
    SdcError::Record { field: field.into(), reason: reason.to_string() }
}
