//! # repro: arithmetic whose bits do not depend on how the work was split
//!
//! This crate owns the numerical building blocks of Steadfast's determinism contract
//! (see `docs/determinism.md`). It knows nothing of tensors or training; it works on
//! plain slices so that other programs can use it.
//!
//! - [`rng`]: a counter-based random number generator (Philox4x32-10). Every random
//!   number is a pure function of `(seed, purpose, indices, position)`, so data order,
//!   weight initialisation and dropout masks never depend on thread or rank scheduling.
//! - [`fingerprint`]: xxh3-64 fingerprints of named f32 tensors, compared across runs
//!   and replicas to prove that their bits are equal;
//! - [`sum`]: the reproducible sum (the exact sum, correctly rounded, whatever the order,
//!   chunking or thread count) with a mergeable accumulator, and fixed-order sums
//!   (pairwise, block tree) for comparison;
//! - [`batched`]: the reproducible element-wise sum of many vectors in two phases
//!   (exponent max, then 64-bit fixed point), the arithmetic of a reproducible all-reduce;
//! - [`fpna`] and [`metrics`]: the kernels and metrics of the floating-point
//!   non-associativity study (atomic-order, fixed-order and reproducible sums and
//!   index-adds; `V_s`, relative differences, distinct outputs);
//! - [`words`]: the text form of the configuration's enums (one word per value), which
//!   every crate's settings share, so that a run's description never depends on how a
//!   crate spelled its words.
//!
//! ```
//! use repro::{fingerprint::fingerprint, rng::permutation};
//!
//! // The data order of epoch 3 is the same wherever and whenever it is computed.
//! assert_eq!(permutation(42, "data", &[3], 10), permutation(42, "data", &[3], 10));
//!
//! // The same bits for any order of the terms.
//! let xs = [1e8f32, 1.0, -1e8, 0.25];
//! let ys = [0.25f32, -1e8, 1.0, 1e8];
//! assert_eq!(repro::sum::sum(&xs), 1.25);
//! assert_eq!(repro::sum::sum(&ys), 1.25);
//!
//! let w = [0.5f32, -1.25];
//! let fp = fingerprint([("model.w", &w[..])]);
//! assert_eq!(fp, fingerprint([("model.w", &[0.5f32, -1.25][..])]));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod batched;
mod exact;
pub mod fingerprint;
pub mod fpna;
pub mod metrics;
pub mod rng;
pub mod sum;
pub mod words;
