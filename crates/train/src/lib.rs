//! # train: models, data, optimizers and the training loop
//!
//! This crate turns a [`TrainConfig`] into a trained state whose bits are a function of
//! the configuration alone. It owns:
//!
//! - [`data`]: Fashion-MNIST, fortunes text and synthetic sets, each read by our own
//!   code, and the [`Sampler`](data::sampler::Sampler) that decides which examples form
//!   each micro-batch, as a pure function of `(seed, epoch, step, index)`;
//! - [`model`]: an MLP, LeNet-5 and a character-level GPT on burn's CPU backend,
//!   initialised from our own counter-based generator;
//! - [`optim`]: SGD and AdamW over flat f32 buffers;
//! - [`state`]: the state registry (named tensors `model.*` and `optim.*`) and its
//!   fingerprint;
//! - [`step`]: the parts of a training step: the [`TrainState`], the [`Engine`](step::Engine)
//!   that computes micro-batches into flat [`GradBuffer`](step::GradBuffer)s, and the
//!   [`Hooks`](step::Hooks) where faults and detectors attach;
//! - [`schedule`]: a step as data, a list of operations (a micro-batch's forward and
//!   backward, a send or receive, reduce, vote, update, check, checkpoint): the
//!   data-parallel step and the pipeline schedules (GPipe, 1F1B);
//! - [`driver`]: the one executor of schedules, which every runner uses with its own
//!   [`Runner`](driver::Runner) for the operations that leave the rank; [`pipeline`] is
//!   a pipeline stage's runner;
//! - [`replay`]: a lost pipeline stage rebuilt from its checkpoint and its neighbours'
//!   boundary logs, alone or by several helpers, with the same bits;
//! - [`config`]: what defines a run ([`TrainConfig`]) and where it runs ([`DistConfig`]);
//! - [`trainer`]: the step loop of one process or one rank of a static job, with
//!   evaluation, checkpoints and `metrics.jsonl` ([`metrics`]); [`job`] is a rank's side
//!   of the collectives; [`elastic`] is a worker of an elastic job;
//! - [`record`]: `events.jsonl`, the job's record of its workers' losses, replacements
//!   and epochs, which the launcher that holds the coordinator keeps;
//! - [`checkpointing`]: what a checkpoint of a run holds, and exact resumption;
//! - [`summary`]: the summary of a run as `steadfast train` prints it;
//! - [`vocabulary`]: the one text form of each configuration kind ([`Word`]);
//!
//! ```no_run
//! use train::{TrainConfig, model::ModelKind, data::DataKind};
//!
//! let mut config = TrainConfig::defaults(ModelKind::Mlp);
//! config.data = DataKind::Synthetic;
//! config.steps = 20;
//! let (summary, _state) = train::train(&config, &mut |_event| {}).unwrap();
//! println!("fingerprint: {:016x}", summary.fingerprint);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod checkpointing;
pub mod config;
pub mod data;
pub mod driver;
pub mod elastic;
pub mod error;
pub mod failpoint;
pub mod footprint;
pub mod grad;
pub mod job;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod pipeline;
pub mod prepared;
pub mod replay;
pub mod schedule;
pub mod state;
pub mod step;
pub mod summary;
pub mod trainer;
pub mod vocabulary;

pub use config::{
    BoundaryLog, CheckpointConfig, CoordinatorAt, DistConfig, ElasticWorker, JobSettings, MeshRank, OnDivergence,
    PipeSchedule, Pipeline, Rendezvous, TrainConfig, WhenBusy,
};
pub use error::{ConfigError, DataError, TrainError};
pub use step::TrainState;
pub use trainer::{EvalReport, Progress, Summary};
pub use vocabulary::{UnknownWord, Word};

/// The reduce mode of the gradient sums (`comm`'s), a setting of every run.
pub use comm::ReduceMode;

/// Runs training as configured, reporting progress to `on_event`: in one process, as a
/// rank of a static job ([`trainer::run`]), or as a worker of an elastic one
/// ([`elastic::run`]). Returns the summary and the final state.
pub fn train(config: &TrainConfig, on_event: &mut dyn FnMut(Progress)) -> Result<(Summary, TrainState), TrainError> {
    if config.steps == 0 {
        return Err(ConfigError::Invalid("--steps must be at least 1".into()).into());
    }
    match &config.dist {
        Some(DistConfig::Elastic(worker)) => elastic::run(config, worker, on_event),
        _ => trainer::run(config, on_event),
    }
}
