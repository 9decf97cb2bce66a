//! # net: the transport and collectives of data-parallel training
//!
//! This crate moves gradients and state between workers; it knows nothing of who the
//! workers are or how a job decides (the control plane is `comm`'s). It starts with the
//! choice every collective is parameterised by, the [`ReduceMode`], and the reference
//! semantics of combining per-worker gradients in a fixed order ([`reduce_in_order`]),
//! which a single process's sum ([`sum_parts_into`], by blocks on threads, element by
//! element in that order) and the distributed all-reduce must match in `deterministic`
//! mode.
//!
//! [`sum_parts`] (and [`sum_parts_into`], which reuses its buffers) combines vectors
//! locally in any of the modes. Across processes, from the bottom up:
//! - [`frame`]: length-prefixed frames with a size limit, and a clear error for a peer
//!   that disconnects mid-frame;
//! - [`handshake`]: mutual HMAC-SHA256 challenge-response over a per-job secret;
//! - [`gate`]: a listening port that admits connections concurrently, each handshake
//!   with its own deadline and their number bounded, so strangers delay no member;
//! - [`transport`]: an authenticated TCP mesh that can be aborted from another thread,
//!   and an in-process network whose ranks tests can kill; [`local`]: the mesh's
//!   shared-memory links between ranks of one host (rings of the `shm` crate);
//! - [`collective`]: abortable ring all-reduce in every mode, all-gather, broadcast,
//!   barrier; [`group`]: some of a job's ranks as a job of their own, for collectives
//!   among them (one pipeline stage's replicas);
//! - `mpi` (feature `mpi`): the step's collectives on the system's MPI library.
//!
//! ```
//! use net::{ReduceMode, reduce_in_order};
//!
//! assert_eq!("reproducible".parse::<ReduceMode>().unwrap(), ReduceMode::Reproducible);
//! let mut acc = vec![1.0f32, 2.0];
//! reduce_in_order(&mut acc, &[&[0.5, 0.5][..], &[0.25, 0.25][..]]);
//! assert_eq!(acc, vec![1.75, 2.75]);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod collective;
mod fixed;
pub mod frame;
pub mod gate;
pub mod group;
pub mod handshake;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
mod owner_sum;
pub mod transport;

use repro::words::Word;

/// How gradients from several workers are combined (see `docs/determinism.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ReduceMode {
    /// Plain float sums in whatever order is fastest; no promise about bits.
    Fast,
    /// A fixed order for a fixed world size: same configuration, same bits.
    #[default]
    Deterministic,
    /// Bitwise identical for any world size and arrival order.
    Reproducible,
    /// Bitwise identical for any world size and arrival order, in 32-bit fixed point: half
    /// the bytes of `Reproducible`'s integers, about a float sum's accuracy, and at most
    /// 128 parts (micro-batches) in all; see [`repro::batched::Fixed`].
    Reproducible32,
}

impl ReduceMode {
    /// Every mode, in order of increasing promise.
    pub const ALL: [ReduceMode; 4] =
        [ReduceMode::Fast, ReduceMode::Deterministic, ReduceMode::Reproducible, ReduceMode::Reproducible32];

    /// Whether the bits of a sum do not depend on how its parts are grouped or ordered.
    pub fn is_reproducible(self) -> bool {
        matches!(self, ReduceMode::Reproducible | ReduceMode::Reproducible32)
    }

    /// The most parts (micro-batches over all workers) one sum may have in this mode.
    pub fn max_parts(self) -> u64 {
        match self {
            ReduceMode::Fast | ReduceMode::Deterministic => u64::MAX,
            ReduceMode::Reproducible => 1 << repro::batched::DEFAULT_HEADROOM,
            ReduceMode::Reproducible32 => 1 << repro::batched::NARROW_HEADROOM,
        }
    }

    /// Refuses a sum of `total` parts over `world` ranks that this mode's integers cannot
    /// hold (every rank that knows the total refuses alike).
    pub fn check_parts(self, total: u64, world: usize) -> Result<(), transport::CommError> {
        if total > self.max_parts() {
            return Err(transport::CommError::Setup(format!(
                "{total} parts over {world} ranks exceed the {} that the {self} sum can hold",
                self.max_parts()
            )));
        }
        Ok(())
    }
}

impl Word for ReduceMode {
    const KIND: &'static str = "reduce mode";
    const ALL: &'static [Self] = &ReduceMode::ALL;
    fn word(self) -> &'static str {
        match self {
            ReduceMode::Fast => "fast",
            ReduceMode::Deterministic => "deterministic",
            ReduceMode::Reproducible => "reproducible",
            ReduceMode::Reproducible32 => "reproducible32",
        }
    }
    fn help(self) -> &'static str {
        match self {
            ReduceMode::Fast => "plain in-place float sums, no promise about bits",
            ReduceMode::Deterministic => "in micro-batch order: same bits every run of a world size",
            ReduceMode::Reproducible => "order-independent fixed-point sum: same bits for any worker count",
            ReduceMode::Reproducible32 => {
                "reproducible in 32-bit fixed point: fewer bytes, a float sum's accuracy, at most 128 micro-batches"
            }
        }
    }
}
repro::text_form!(ReduceMode);

/// Sums equal-length vectors element-wise as `mode` prescribes: `Fast` and
/// `Deterministic` add them in the order given (`Fast` promises nothing about the order,
/// so a faster one may replace it), `Reproducible` uses the order-independent fixed-point
/// sum of [`repro::batched`]. This is the local form of the all-reduce: what one process
/// does with its micro-batch gradients. Allocates the result; a loop that sums every step
/// uses [`sum_parts_into`].
pub fn sum_parts(mode: ReduceMode, parts: &[&[f32]]) -> Vec<f32> {
    let mut out = vec![0.0; parts.first().map_or(0, |p| p.len())];
    sum_parts_into(mode, parts, &mut out, &mut repro::batched::Scratch::default());
    out
}

/// [`sum_parts`] into `out` (the length of every part), reusing `scratch`: no allocation
/// once the scratch has grown to the parts' length. Panics if a part's length differs
/// from `out`'s.
pub fn sum_parts_into<P: AsRef<[f32]> + Sync>(
    mode: ReduceMode,
    parts: &[P],
    out: &mut [f32],
    scratch: &mut repro::batched::Scratch,
) {
    assert!(parts.iter().all(|p| p.as_ref().len() == out.len()), "reduce of unequal lengths");
    match (mode, parts) {
        (_, []) => out.fill(0.0),
        (ReduceMode::Fast | ReduceMode::Deterministic, _) => sum_range_into(parts, 0..out.len(), out, None),
        (ReduceMode::Reproducible, _) => {
            repro::batched::sum_parts_into(parts, repro::batched::DEFAULT_HEADROOM, out, scratch)
        }
        (ReduceMode::Reproducible32, _) => {
            repro::batched::sum_parts_as::<i32, P>(parts, repro::batched::NARROW_HEADROOM, out, scratch)
        }
    }
}

/// The float sum of `parts` over elements `range`, into `dst` (as long as the range), then,
/// if given, `received` added to it (as many elements, little-endian bytes: a ring
/// neighbour's partial sum). Per element: the first part, then every other part in the
/// order given, then `received`. By blocks of [`repro::batched::PAR_BLOCK`], on the rayon
/// pool where [`repro::batched::on_pool`] says so: neither the blocks nor the threads
/// change an element's order of additions.
pub(crate) fn sum_range_into<P: AsRef<[f32]> + Sync>(
    parts: &[P],
    range: std::ops::Range<usize>,
    dst: &mut [f32],
    received: Option<&[u8]>,
) {
    use rayon::prelude::*;
    const BLOCK: usize = repro::batched::PAR_BLOCK;
    let Some((first, rest)) = parts.split_first() else { return dst.fill(0.0) };
    let block = |b: usize, acc: &mut [f32]| {
        let at = range.start + b * BLOCK..range.start + b * BLOCK + acc.len();
        acc.copy_from_slice(&first.as_ref()[at.clone()]);
        for part in rest {
            reduce_in_order(acc, &[&part.as_ref()[at.clone()]]);
        }
        if let Some(bytes) = received {
            for (d, x) in acc.iter_mut().zip(bytes[b * BLOCK * 4..].chunks_exact(4)) {
                *d += f32::from_le_bytes(x.try_into().expect("4 bytes"));
            }
        }
    };
    if repro::batched::on_pool(dst.len(), BLOCK) {
        dst.par_chunks_mut(BLOCK).enumerate().for_each(|(b, acc)| block(b, acc));
    } else {
        dst.chunks_mut(BLOCK).enumerate().for_each(|(b, acc)| block(b, acc));
    }
}

/// Adds each of `parts` into `acc`, element-wise, in the order given: the reference
/// reduction of the `deterministic` mode. Panics if a part's length differs from `acc`'s.
pub fn reduce_in_order<P: AsRef<[f32]>>(acc: &mut [f32], parts: &[P]) {
    for part in parts {
        let part = part.as_ref();
        assert_eq!(part.len(), acc.len(), "reduce of unequal lengths");
        for (a, &x) in acc.iter_mut().zip(part) {
            *a += x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_text() {
        for m in ReduceMode::ALL {
            assert_eq!(m.to_string().parse::<ReduceMode>().unwrap(), m);
        }
        assert!("exact".parse::<ReduceMode>().is_err());
    }

    #[test]
    fn reproducible_mode_ignores_the_order_of_the_parts() {
        let a = [1e8f32, 0.5];
        let b = [1.0f32, 0.25];
        let c = [-1e8f32, 0.125];
        let fwd = sum_parts(ReduceMode::Reproducible, &[&a, &b, &c]);
        let rev = sum_parts(ReduceMode::Reproducible, &[&c, &b, &a]);
        assert_eq!(fwd, rev);
        assert_eq!(fwd, vec![1.0, 0.875]);
        // In order, (1e8 + 1) - 1e8 loses the 1.
        assert_eq!(sum_parts(ReduceMode::Deterministic, &[&a, &b, &c]), vec![0.0, 0.875]);
        assert_eq!(sum_parts(ReduceMode::Deterministic, &[&a]), a.to_vec());
    }

    #[test]
    fn order_matters_for_floats_and_is_fixed_here() {
        // (1e8 + 1) - 1e8 in f32 loses the 1; the other order keeps it.
        let mut a = vec![1e8f32];
        reduce_in_order(&mut a, &[&[1.0][..], &[-1e8][..]]);
        let mut b = vec![1e8f32];
        reduce_in_order(&mut b, &[&[-1e8][..], &[1.0][..]]);
        assert_eq!(a, vec![0.0]);
        assert_eq!(b, vec![1.0]);
    }

    #[test]
    fn the_in_order_sum_by_blocks_on_threads_is_the_sequential_one() {
        // Several blocks of the parallel sum and a ragged last one, values whose sum
        // depends on the order of additions.
        let n = 2 * (1 << 14) + 3;
        let parts: Vec<Vec<f32>> = (0..3u32)
            .map(|p| (0..n as u32).map(|i| ((i * 7 + p * 13) % 29) as f32 * 1e7 - 1.4e8 + p as f32).collect())
            .collect();
        let mut sequential = parts[0].clone();
        reduce_in_order(&mut sequential, &parts[1..]);
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0.0; n];
            pool.install(|| sum_parts_into(ReduceMode::Deterministic, &parts, &mut out, &mut Default::default()));
            assert!(out.iter().zip(&sequential).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }
}
