//! # fault: the faults that Steadfast injects and studies
//!
//! This crate owns fault models and their injection:
//! - [`bits`]: which bits of an element (sign, exponent, mantissa, any, positions), for
//!   every float and integer dtype;
//! - [`plan`]: which tensors, elements and bits a fault hits, drawn from a seed;
//! - [`inject`]: flipping those bits inside checkpoint files of every supported format
//!   (Steadfast, safetensors, PyTorch, NumPy, HDF5), with a JSON log that redoes and
//!   undoes the change exactly;
//! - [`live`]: the same flips in live training state (parameters, gradients, optimizer
//!   slots, layer outputs) at a chosen step and rank;
//! - [`campaign`]: campaign specs, the fault of each trial, and the classes of outcome.
//!
//! ```
//! use fault::{BitClass, flip_f32};
//!
//! // Flipping the sign bit negates.
//! assert_eq!(flip_f32(1.5, &[31]), -1.5);
//! // The most significant exponent bit of 1.0 turns it into infinity.
//! assert_eq!(flip_f32(1.0, &[30]), f32::INFINITY);
//! assert_eq!(BitClass::Exponent.bits_f32(), 23..31);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bits;
pub mod campaign;
pub mod inject;
pub mod live;
pub mod plan;
pub mod value;

pub use bits::{BitClass, BitSpec, flip_f32, flip_le};
