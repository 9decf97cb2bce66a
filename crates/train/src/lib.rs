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
//! - [`trainer`]: the step loop with gradient accumulation over micro-batches;
//! - [`checkpointing`]: what a checkpoint of a run holds, and exact resumption;
//! - [`campaign`]: fault-injection campaigns against a golden run, in memory.
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

pub mod campaign;
pub mod checkpointing;
pub mod data;
pub mod error;
pub mod model;
pub mod optim;
pub mod state;
pub mod trainer;

pub use error::{ConfigError, DataError, TrainError};
pub use trainer::{DistConfig, EvalReport, Event, FinalState, Summary, TrainConfig, train};
