//! # fault: the faults that Steadfast injects and studies
//!
//! This crate owns fault models and their injection:
//! - [`bits`]: which bits of an element (sign, exponent, mantissa, any, positions), for
//!   every float and integer dtype;
//! - [`plan`]: which tensors, elements and bits a fault hits, drawn from a seed;
//! - [`inject`]: flipping those bits inside checkpoint files of every supported format
//!   (Steadfast, safetensors, PyTorch, NumPy, HDF5), with a JSON log that redoes and
//!   undoes the change exactly;
//! - [`memory`]: the same flips, logs, replay and undo in tensors held in memory (a
//!   framework's state dict, through the Python package);
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

/// Serde for a type through its text form (`Display` and `FromStr`), as spec files write it.
macro_rules! serde_as_text {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod bits;
pub mod campaign;
pub mod crash;
pub mod inject;
pub mod live;
pub mod memory;
pub mod plan;
pub mod value;

pub use bits::{BitClass, BitSpec, flip_f32, flip_le};
