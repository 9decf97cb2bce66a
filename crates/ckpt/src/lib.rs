//! # ckpt: checkpoints that are fast, verified and crash-safe
//!
//! This crate owns how training state is written to and read from disk. It works on
//! named byte and f32 buffers and knows nothing of any tensor framework, so other tools
//! can read and check Steadfast checkpoints.
//!
//! Today it holds the vocabulary that every part of Steadfast uses to address state:
//! the [`Role`] of a tensor and the per-tensor checksum ([`checksum`]). The checkpoint
//! directory format (manifest + safetensors shards) is built on these.
//!
//! ```
//! use ckpt::{Role, checksum};
//!
//! assert_eq!(Role::of_name("model.fc1.weight"), Some(Role::Model));
//! assert_eq!(Role::of_name("optim.model.fc1.weight.exp_avg"), Some(Role::Optim));
//! assert_ne!(checksum(&[1, 2, 3]), checksum(&[1, 2, 4]));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// What part of training state a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A model parameter, named `model.<path>`.
    Model,
    /// Optimizer state, named `optim.<param>.<slot>`.
    Optim,
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
#[error("unknown role {0:?}: expected `model` or `optim`")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "model" => Ok(Role::Model),
            "optim" => Ok(Role::Optim),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

/// The checksum of a tensor's bytes as stored: xxh3-64.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_through_text() {
        for r in [Role::Model, Role::Optim] {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        }
        assert!("weights".parse::<Role>().is_err());
        assert_eq!(Role::of_name("step"), None);
    }
}
