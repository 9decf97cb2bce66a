//! Error types of the training crate. Every variant carries what a person needs to act:
//! the file, the setting, or the tensor involved.

use std::path::PathBuf;

/// A data set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The data set's directory does not exist.
    #[error("data not found at {path}: {hint}")]
    Missing {
        /// The directory looked for.
        path: PathBuf,
        /// How to get the data.
        hint: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file was read but its content is not what the format requires.
    #[error("malformed data file {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The data set does not fit the model (e.g. images for a language model).
    #[error("data set {data} does not provide {modality}, which the model needs")]
    Mismatch {
        /// The data set.
        data: String,
        /// What the model needs.
        modality: String,
    },
}

/// A configuration value is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The value breaks a rule stated in the message.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// See [`DataError`].
    #[error(transparent)]
    Data(#[from] DataError),
    /// See [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Saving or loading a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] ckpt::CkptError),
    /// A checkpoint does not fit the run that tries to resume from it.
    #[error("cannot resume from {path}: {reason}")]
    Resume {
        /// The checkpoint directory.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// Communication with the other workers failed.
    #[error(transparent)]
    Comm(comm::transport::CommError),
    /// A boundary log cannot be written or read.
    #[error(transparent)]
    Log(#[from] ckpt::log::LogError),
    /// The replicas' parameters differ.
    #[error("replicas diverged at step {step}: rank(s) {ranks:?} hold different parameters than the others")]
    ReplicasDiverged {
        /// The step of the check.
        step: u64,
        /// The ranks whose fingerprint differs from the majority.
        ranks: Vec<usize>,
    },
    /// Writing metrics or outputs failed.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The commit vote refused a step: nobody applied its update.
    #[error(
        "step {step} was not committed: rank(s) {vetoed:?} found a non-finite gradient, rank(s) {disagreeing:?} \
         hold a different gradient sum than the others"
    )]
    CommitRefused {
        /// The step.
        step: u64,
        /// Ranks whose own checks failed.
        vetoed: Vec<usize>,
        /// Ranks whose gradient digest differs from the majority's.
        disagreeing: Vec<usize>,
    },
    /// A `--inject` fault cannot be applied.
    #[error("cannot inject: {0}")]
    Inject(#[from] fault::plan::PlanError),
    /// The summed gradient has NaN or Inf elements under a finite loss: applying it would
    /// poison the parameters.
    #[error("training diverged at step {step}: the summed gradient has NaN or Inf elements (loss {loss})")]
    GradientNotFinite {
        /// The step.
        step: u64,
        /// The loss value.
        loss: f32,
    },
    /// The coordinator of an elastic job stopped it (too few workers remain, say).
    #[error("the job stopped: {0}")]
    JobStopped(String),
    /// This process joined an elastic job that had already finished (a replacement
    /// started before its end): it holds nothing of the final state, and that is no error.
    #[error("the job had finished before this process joined: every member holds the final state")]
    JoinedAfterTheEnd,
    /// An elastic worker heard nothing from any coordinator of its job for the
    /// coordinator's heartbeat timeout and quorum timeout, and gave up (the text says for
    /// how long, since when, and why).
    #[error("{0}")]
    CoordinatorLost(String),
    /// The model produced a non-finite loss.
    #[error("training diverged at step {step}: loss is {loss}")]
    Diverged {
        /// The step.
        step: u64,
        /// The loss value.
        loss: f32,
    },
}

impl From<comm::transport::CommError> for TrainError {
    /// A communication failure; the one that says the job had finished before this process
    /// joined (a late replacement reaching etcd after the job's end) is no failure.
    fn from(e: comm::transport::CommError) -> TrainError {
        match e {
            comm::transport::CommError::Aborted(r) if r == comm::control::JOINED_AFTER_THE_END => {
                TrainError::JoinedAfterTheEnd
            }
            e => TrainError::Comm(e),
        }
    }
}
