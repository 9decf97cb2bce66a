//! The checkpoint error type. Every variant names the file involved, and where it applies
//! the tensor, so that a person can act on it.

use std::path::PathBuf;

/// Anything that can go wrong reading, writing or verifying a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// The operating system refused an operation.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("cannot read", "cannot fsync", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file exists but does not follow the format.
    #[error("malformed checkpoint file {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checksum does not match: the bytes changed after they were written.
    #[error("corrupt checkpoint data in {path}{}: {reason}", tensor.as_ref().map(|t| format!(" (tensor {t})")).unwrap_or_default())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The tensor, when the damage is in a tensor's bytes.
        tensor: Option<String>,
        /// What does not match.
        reason: String,
    },
    /// The checkpoint was written by a newer format version than this reader knows.
    #[error(
        "{path} has checkpoint format version {found}; this build reads versions up to {supported}: upgrade Steadfast to read it"
    )]
    NewerVersion {
        /// The manifest.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// No committed checkpoint where one was expected.
    #[error("no committed checkpoint in {path}: {reason}")]
    NotFound {
        /// The directory searched.
        path: PathBuf,
        /// Why nothing qualified.
        reason: String,
    },
    /// The state handed to the writer, or expected by the reader, is inconsistent.
    #[error("checkpoint state mismatch: {0}")]
    Mismatch(String),
    /// Another live process writes this checkpoint directory (it holds the lock).
    #[error(
        "checkpoint directory {dir} is in use by {holder}: two runs cannot write one checkpoint directory; \
         give this run another directory, or stop that run first"
    )]
    Busy {
        /// The checkpoint root.
        dir: PathBuf,
        /// Who holds it ("pid 1234 on host a").
        holder: String,
        /// The job of the holder, where its lock file names one (see [`crate::owner`]).
        job: Option<String>,
    },
    /// The root holds a committed checkpoint of another run's configuration: a run never
    /// writes beside or over another run's checkpoints.
    #[error(
        "checkpoint directory {dir} holds checkpoints of another configuration (step {step} has configuration hash \
         {theirs}; this run's is {ours}): a run never writes beside or over another run's checkpoints; give this \
         run another checkpoint directory, or resume that run with its own configuration"
    )]
    OtherConfiguration {
        /// The checkpoint root.
        dir: PathBuf,
        /// The step of the other run's checkpoint found.
        step: u64,
        /// Its configuration hash.
        theirs: String,
        /// This run's.
        ours: String,
    },
    /// Memory for a copy of the state could not be had.
    #[error("cannot allocate {bytes} bytes to snapshot tensor {tensor}: not enough memory")]
    OutOfMemory {
        /// The bytes asked for.
        bytes: u64,
        /// The tensor being copied.
        tensor: String,
    },
    /// A failpoint armed for testing fired.
    #[error("failpoint {0} fired")]
    Failpoint(&'static str),
}

impl CkptError {
    /// An I/O error with its operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CkptError {
        let path = path.into();
        move |source| CkptError::Io { op, path, source }
    }
}

/// Result alias of this crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;
