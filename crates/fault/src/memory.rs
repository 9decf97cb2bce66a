//! Bit flips in tensors held in memory (a framework's tensors, a state dict's buffers),
//! with the plans and logs of file injection: the same [`FlipSpec`] draws its flips with
//! [`plan`], each flip is recorded as a [`FlipRecord`] whose `file` is the tensor's name
//! and whose `byte_offset` is the element's offset in that tensor, and the log replays or
//! undoes in memory exactly as a file's does on disk.
//!
//! ```
//! use ckpt::{DType, Role};
//! use fault::memory::{Buffer, inject, undo};
//! use fault::plan::{Amount, FlipSpec, Target};
//!
//! let mut w = 1.0f32.to_le_bytes().repeat(4);
//! let original = w.clone();
//! let spec = FlipSpec {
//!     target: Target::default(),
//!     bits: "sign".parse().unwrap(),
//!     amount: Amount::Count(1),
//!     burst: 1,
//!     seed: 7,
//! };
//! let log = inject(&mut [Buffer { name: "w", role: Role::Model, dtype: DType::F32, bytes: &mut w }], &spec).unwrap();
//! assert_eq!(log.flips[0].new_value, "-1");
//! undo(&log, &mut [Buffer { name: "w", role: Role::Model, dtype: DType::F32, bytes: &mut w }]).unwrap();
//! assert_eq!(w, original);
//! ```

use std::collections::HashMap;

use ckpt::{DType, Role};

use crate::bits::flip_le;
use crate::inject::{FlipRecord, InjectError, InjectionLog, LOG_VERSION, describe};
use crate::plan::{Candidate, FlipSpec, plan};
use crate::value::{hex_bytes, parse_hex, value_text};

/// The log's `target` and `format` for flips made in memory.
pub const MEMORY: &str = "memory";

/// A tensor's little-endian bytes, where they lie, with what a plan needs to know.
#[derive(Debug)]
pub struct Buffer<'a> {
    /// Name (a state dict's key path).
    pub name: &'a str,
    /// Role.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// The elements' bytes, row-major.
    pub bytes: &'a mut [u8],
}

fn check_sizes(buffers: &[Buffer<'_>]) -> Result<(), InjectError> {
    match buffers.iter().find(|b| !b.bytes.len().is_multiple_of(b.dtype.size())) {
        Some(b) => Err(InjectError::Mismatch(format!(
            "tensor {}: {} bytes are not a whole number of {} elements",
            b.name,
            b.bytes.len(),
            b.dtype.name()
        ))),
        None => Ok(()),
    }
}

/// Draws the flips of `spec` over `buffers` and applies them; returns the log.
pub fn inject(buffers: &mut [Buffer<'_>], spec: &FlipSpec) -> Result<InjectionLog, InjectError> {
    check_sizes(buffers)?;
    let candidates: Vec<Candidate<'_>> = buffers
        .iter()
        .map(|b| Candidate {
            name: b.name,
            role: b.role,
            dtype: b.dtype,
            elements: (b.bytes.len() / b.dtype.size()) as u64,
        })
        .collect();
    let flips = plan(&candidates, spec)?;
    let mut records = Vec::with_capacity(flips.len());
    for f in flips {
        let b = &mut buffers[f.tensor];
        let size = b.dtype.size();
        let at = f.element as usize * size;
        let element = &mut b.bytes[at..at + size];
        let old = element.to_vec();
        flip_le(element, &f.bits);
        records.push(FlipRecord {
            tensor: b.name.to_owned(),
            role: b.role.as_str().to_owned(),
            dtype: b.dtype.name().to_owned(),
            element: f.element,
            bits: f.bits,
            file: b.name.to_owned(),
            byte_offset: at as u64,
            old_value: value_text(b.dtype, &old),
            new_value: value_text(b.dtype, element),
            old_bytes: hex_bytes(&old),
            new_bytes: hex_bytes(element),
        });
    }
    Ok(InjectionLog {
        version: LOG_VERSION,
        target: MEMORY.to_owned(),
        format: MEMORY.to_owned(),
        spec: describe(spec),
        seed: spec.seed,
        checksums: "none".to_owned(),
        corrupt_input: Vec::new(),
        flips: records,
    })
}

/// Applies the flips of `log` (made in memory or in a file whose tensors have these
/// names) to `buffers` again; every element must hold the log's old bytes, and nothing
/// changes unless all do. Returns the log, its target `memory`.
pub fn replay(log: &InjectionLog, buffers: &mut [Buffer<'_>]) -> Result<InjectionLog, InjectError> {
    apply(log, buffers, true)?;
    Ok(InjectionLog { target: MEMORY.to_owned(), format: MEMORY.to_owned(), ..log.clone() })
}

/// Restores the bytes that `log` altered in `buffers`; every element must hold the log's
/// new bytes, and nothing changes unless all do.
pub fn undo(log: &InjectionLog, buffers: &mut [Buffer<'_>]) -> Result<(), InjectError> {
    apply(log, buffers, false)
}

fn apply(log: &InjectionLog, buffers: &mut [Buffer<'_>], redo: bool) -> Result<(), InjectError> {
    if log.version != LOG_VERSION {
        return Err(InjectError::Mismatch(format!("log version {} is not {LOG_VERSION}", log.version)));
    }
    check_sizes(buffers)?;
    let by_name: HashMap<&str, usize> = buffers.iter().enumerate().map(|(i, b)| (b.name, i)).collect();
    // Check every element first, so that a log that does not fit changes nothing.
    let mut edits = Vec::with_capacity(log.flips.len());
    for r in &log.flips {
        let bad_hex = |source| InjectError::BadLog { tensor: r.tensor.clone(), element: r.element, source };
        let (old, new) = (parse_hex(&r.old_bytes).map_err(bad_hex)?, parse_hex(&r.new_bytes).map_err(bad_hex)?);
        let (expected, wanted) = if redo { (old, new) } else { (new, old) };
        let &i = by_name
            .get(r.tensor.as_str())
            .ok_or_else(|| InjectError::Mismatch(format!("no tensor {} in memory", r.tensor)))?;
        let b = &buffers[i];
        if DType::from_name(&r.dtype) != Some(b.dtype) {
            return Err(InjectError::Mismatch(format!(
                "tensor {} is {}, the log says {}",
                r.tensor,
                b.dtype.name(),
                r.dtype
            )));
        }
        let size = b.dtype.size();
        let at = usize::try_from(r.element).ok().and_then(|e| e.checked_mul(size)).filter(|&a| a < b.bytes.len());
        let Some(at) = at else {
            return Err(InjectError::Mismatch(format!(
                "tensor {} has {} elements, the log names element {}",
                r.tensor,
                b.bytes.len() / size,
                r.element
            )));
        };
        if expected.len() != size || wanted.len() != size {
            return Err(InjectError::Mismatch(format!(
                "the log's bytes of {}[{}] are not one element",
                r.tensor, r.element
            )));
        }
        if b.bytes[at..at + size] != expected[..] {
            return Err(InjectError::Mismatch(format!(
                "{}[{}] holds {}, the log expects {} (was the log made for this state, and is it {}?)",
                r.tensor,
                r.element,
                hex_bytes(&b.bytes[at..at + size]),
                hex_bytes(&expected),
                if redo { "not yet applied" } else { "still applied" }
            )));
        }
        edits.push((i, at, wanted));
    }
    for (i, at, wanted) in edits {
        buffers[i].bytes[at..at + wanted.len()].copy_from_slice(&wanted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Amount, Target};

    fn spec(count: u64, seed: u64) -> FlipSpec {
        FlipSpec {
            target: Target::default(),
            bits: "any".parse().unwrap(),
            amount: Amount::Count(count),
            burst: 1,
            seed,
        }
    }

    /// Buffers `a` (f32, model) and `b` (i64, optimizer) over `a` and `b`.
    fn two<'a>(a: &'a mut [u8], b: &'a mut [u8]) -> [Buffer<'a>; 2] {
        [
            Buffer { name: "a", role: Role::Model, dtype: DType::F32, bytes: a },
            Buffer { name: "b", role: Role::Optim, dtype: DType::I64, bytes: b },
        ]
    }

    #[test]
    fn flips_replay_and_undo_in_memory_and_a_wrong_log_changes_nothing() {
        let original: Vec<u8> = (0..64u8).collect();
        let (mut a, mut b) = (original.clone(), vec![7u8; 16]);
        let log = inject(&mut two(&mut a, &mut b), &spec(6, 3)).unwrap();
        assert_eq!(log.flips.len(), 6);
        let changed_a = a != original;
        // Undo, then replay onto a fresh copy: the same bytes as the injection left.
        let (after_a, after_b) = (a.clone(), b.clone());
        undo(&log, &mut two(&mut a, &mut b)).unwrap();
        assert_eq!((a.clone(), b.clone()), (original.clone(), vec![7u8; 16]));
        replay(&log, &mut two(&mut a, &mut b)).unwrap();
        assert_eq!((a.clone(), b.clone()), (after_a, after_b));
        // Replayed twice, the old bytes are no longer there: an error, and no change.
        let before = (a.clone(), b.clone());
        let err = replay(&log, &mut two(&mut a, &mut b)).unwrap_err();
        assert!(err.to_string().contains("the log expects"), "{err}");
        assert_eq!((a, b), before);
        assert!(changed_a || log.flips.iter().all(|f| f.tensor == "b"));
    }

    #[test]
    fn the_same_seed_draws_the_same_flips() {
        let run = || {
            let mut w = vec![0u8; 400];
            inject(&mut [Buffer { name: "w", role: Role::Model, dtype: DType::F32, bytes: &mut w }], &spec(5, 11))
                .unwrap()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn ragged_buffers_and_unknown_tensors_are_errors() {
        let mut w = vec![0u8; 6];
        let err = inject(&mut [Buffer { name: "w", role: Role::Model, dtype: DType::F32, bytes: &mut w }], &spec(1, 0))
            .unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
        let mut w = vec![0u8; 8];
        let log = inject(&mut [Buffer { name: "w", role: Role::Model, dtype: DType::F32, bytes: &mut w }], &spec(1, 0))
            .unwrap();
        let mut v = vec![0u8; 8];
        let err =
            undo(&log, &mut [Buffer { name: "v", role: Role::Model, dtype: DType::F32, bytes: &mut v }]).unwrap_err();
        assert!(err.to_string().contains("no tensor w"), "{err}");
    }
}
