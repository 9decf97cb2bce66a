//! # ckpt: checkpoints that are fast, verified and crash-safe
//!
//! This crate owns how training state is written to and read from disk. It works on
//! named f32 and byte buffers and knows nothing of any tensor framework, so other tools
//! can read and check Steadfast checkpoints.
//!
//! A checkpoint is a directory `step-<8 digits>/` holding plain safetensors shards and a
//! `manifest.json`, written last, that lists every tensor with its xxh3-64 checksum (see
//! `docs/checkpoint-format.md`). The main pieces:
//!
//! - [`store::save`]: writes shards in parallel and commits atomically (the protocol and
//!   its failpoints are listed in [`store`]); [`store::list`], the `LATEST` pointer and
//!   [`Retention`] policies;
//! - [`AsyncWriter`]: the two-phase writer; training waits only for a copy into reused
//!   buffers, a background thread persists;
//! - [`reader::resolve`], [`reader::open`], [`Checkpoint::load`] (verifies every checksum)
//!   and [`Checkpoint::verify`] (reports every problem);
//! - [`AsyncWriter::for_part`] and [`store::commit_parts`]: checkpoints written by every
//!   replica of a data-parallel job, each a disjoint part, committed once all are durable;
//! - [`diff::diff`] and [`export::export`] for tools;
//! - [`safetensors`]: the container, parsed strictly without I/O;
//! - [`foreign`]: where each tensor's bytes lie in other frameworks' files (safetensors,
//!   PyTorch `.pt`, NumPy `.npz`, HDF5 `.h5`), for tools that read or alter them.
//!
//! ```
//! use ckpt::{Meta, Role, SaveOptions, TensorRef};
//!
//! let root = tempfile::tempdir().unwrap();
//! let w = [1.0f32, 2.0, 3.0, 4.0];
//! let tensors = [TensorRef { name: "model.w", role: Role::Model, shape: &[2, 2], data: &w }];
//! let meta = Meta { step: 10, ..Meta::default() };
//! ckpt::store::save(root.path(), &meta, &tensors, &SaveOptions::default()).unwrap();
//!
//! let ckpt = ckpt::reader::open(&ckpt::reader::resolve(root.path()).unwrap()).unwrap();
//! assert_eq!(ckpt.manifest.meta.step, 10);
//! assert!(ckpt.verify().is_empty());
//! let loaded = ckpt.load().unwrap();
//! assert_eq!(loaded[0].data, ckpt::TensorData::F32(w.to_vec()));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod diff;
mod dtype;
mod error;
pub mod export;
pub mod failpoint;
pub mod foreign;
pub mod log;
pub mod manifest;
pub mod owner;
pub mod reader;
mod retention;
pub mod safetensors;
pub mod share;
pub mod store;
pub mod torch_layout;
mod writer;

use std::fmt;
use std::str::FromStr;

pub use dtype::DType;
pub use error::{CkptError, Result};
pub use manifest::{DataCursor, Manifest, Meta, RngState};
pub use owner::Owner;
pub use reader::{Checkpoint, LoadedTensor, Problem, TensorData};
pub use retention::Retention;
pub use store::{Part, RawTensorRef, SaveOptions, SaveReport, TensorRef};
pub use writer::{AsyncWriter, WriterStats};

/// What part of training state a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A model parameter, named `model.<path>`.
    Model,
    /// Optimizer state, named `optim.<param>.<slot>`.
    Optim,
    /// Other state a framework's loop resumes from: random generators' states, a
    /// sampler's position, tensors among its scalars (format version 3 on).
    Extra,
}

impl Role {
    /// The role implied by a registry name's prefix, if it has one.
    pub fn of_name(name: &str) -> Option<Role> {
        if name.starts_with("model.") {
            Some(Role::Model)
        } else if name.starts_with("optim.") {
            Some(Role::Optim)
        } else {
            None
        }
    }

    /// The lower-case word used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Model => "model",
            Role::Optim => "optim",
            Role::Extra => "extra",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not a role.
#[derive(Debug, thiserror::Error)]
#[error("unknown role {0:?}: expected `model`, `optim` or `extra`")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "model" => Ok(Role::Model),
            "optim" => Ok(Role::Optim),
            "extra" => Ok(Role::Extra),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

/// The checksum of a tensor's bytes as stored: xxh3-64 (its loop on the instruction set
/// the process selected; the same digest on every one).
pub fn checksum(bytes: &[u8]) -> u64 {
    kernels::hash::xxh3_64(kernels::isa::selected(), bytes)
}

/// A streaming [`checksum`], for bytes hashed as they are written or read.
pub fn checksummer() -> kernels::hash::Xxh3 {
    kernels::hash::Xxh3::new(kernels::isa::selected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_through_text() {
        for r in [Role::Model, Role::Optim, Role::Extra] {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        }
        assert!("weights".parse::<Role>().is_err());
        assert_eq!(Role::of_name("step"), None);
    }
}
