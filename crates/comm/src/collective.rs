//! Collectives over a [`Transport`]: ring all-reduce in the three reduce modes, broadcast
//! and barrier. Every receive has a deadline, so a dead, silent or misbehaving peer makes
//! the collective fail on every survivor within the timeout instead of hanging.
//!
//! The ring all-reduce cuts the vector into `world` chunks. In `world - 1` reduce-scatter
//! steps each rank sends one chunk to its right neighbour while it receives another from
//! its left and combines it; in `world - 1` all-gather steps the finished chunks travel
//! round the ring. Each step sends and receives concurrently (two threads), so large
//! chunks cannot deadlock on full socket buffers.
//!
//! Modes:
//! - `fast` and `deterministic`: f32 sums. The order in which a chunk's contributions are
//!   added is fixed by the ring for a given world size, so both are deterministic here;
//!   `fast` leaves room for faster, order-free algorithms.
//! - `reproducible`: the two phases of [`repro::batched`]: a ring max of one exponent byte
//!   per element, then a ring sum of 64-bit fixed-point integers, converted back once.
//!   Integer addition is associative, so the result is the same for any world size and
//!   any order: bitwise equal to [`repro::batched::sum_parts`] over all contributions.

use std::time::{Duration, Instant};

use crate::ReduceMode;
use crate::transport::{CommError, Transport};

const KIND_CHUNK: u8 = 1;
const KIND_BCAST: u8 = 2;

/// Plain element types that travel as their little-endian bytes (sent without copying:
/// the platforms Steadfast builds for are little-endian).
trait Wire: bytemuck::Pod + Send + Sync {
    const SIZE: usize = std::mem::size_of::<Self>();
    fn get(b: &[u8]) -> Self {
        bytemuck::pod_read_unaligned(b)
    }
}

impl Wire for f32 {}
impl Wire for i64 {}
impl Wire for u8 {}

#[cfg(target_endian = "big")]
compile_error!("the wire format of the collectives is little-endian");

fn chunk_range(n: usize, world: usize, c: usize) -> std::ops::Range<usize> {
    (c * n / world)..((c + 1) * n / world)
}

/// Sends `send` to the right neighbour while receiving a chunk of `expect` elements from
/// the left one into `buf`.
fn exchange<T: Wire>(
    t: &dyn Transport,
    send: &[T],
    expect: usize,
    deadline: Instant,
    buf: &mut Vec<u8>,
) -> Result<(), CommError> {
    let world = t.world();
    let right = (t.rank() + 1) % world;
    let left = (t.rank() + world - 1) % world;
    let bytes: &[u8] = bytemuck::cast_slice(send);
    let (sent, got) = std::thread::scope(|s| {
        let sender = s.spawn(|| t.send(right, KIND_CHUNK, bytes));
        let got = t.recv_into(left, deadline, buf);
        (sender.join().unwrap_or_else(|_| Err(CommError::Setup("sender thread panicked".into()))), got)
    });
    sent?;
    let kind = got?;
    if kind != KIND_CHUNK || buf.len() != expect * T::SIZE {
        return Err(CommError::Protocol {
            peer: left,
            reason: format!("expected a chunk of {} bytes, got kind {kind} with {} bytes", expect * T::SIZE, buf.len()),
        });
    }
    Ok(())
}

/// Ring all-reduce of `data` in place with the associative `combine`.
fn ring<T: Wire>(
    t: &dyn Transport,
    data: &mut [T],
    combine: impl Fn(&mut T, T),
    timeout: Duration,
) -> Result<(), CommError> {
    let (world, rank, n) = (t.world(), t.rank(), data.len());
    if world == 1 {
        return Ok(());
    }
    let deadline = || Instant::now() + timeout;
    // One receive buffer for the whole ring: its pages are touched once, not every step.
    let mut buf = Vec::new();
    for s in 0..world - 1 {
        let send_c = (rank + world - s) % world;
        let recv_c = (rank + world - s - 1) % world;
        let r = chunk_range(n, world, recv_c);
        exchange(t, &data[chunk_range(n, world, send_c)], r.len(), deadline(), &mut buf)?;
        for (d, x) in data[r].iter_mut().zip(buf.chunks_exact(T::SIZE)) {
            combine(d, T::get(x));
        }
    }
    for s in 0..world - 1 {
        let send_c = (rank + 1 + world - s) % world;
        let recv_c = (rank + world - s) % world;
        let r = chunk_range(n, world, recv_c);
        exchange(t, &data[chunk_range(n, world, send_c)], r.len(), deadline(), &mut buf)?;
        for (d, x) in data[r].iter_mut().zip(buf.chunks_exact(T::SIZE)) {
            *d = T::get(x);
        }
    }
    Ok(())
}

/// Sums `data` element-wise across all ranks, in place, in the given mode. Fails on every
/// survivor within `timeout` per step if a peer dies, hangs or sends garbage.
pub fn all_reduce_sum(
    t: &dyn Transport,
    data: &mut [f32],
    mode: ReduceMode,
    timeout: Duration,
) -> Result<(), CommError> {
    let sum = all_reduce_parts(t, &[&*data], data.len(), mode, timeout)?;
    data.copy_from_slice(&sum);
    Ok(())
}

/// Sums, element-wise, every part held by every rank (each rank passes its own parts,
/// e.g. the gradients of its micro-batches; possibly none) and returns the total of
/// length `len` on every rank.
///
/// In `reproducible` mode the local parts are never added as floats: each is converted to
/// fixed point at the global exponents, so the result is bitwise the same however the
/// parts are spread over ranks, for any world size. In the other modes each rank first
/// adds its parts in order, then the ring adds the ranks' sums.
pub fn all_reduce_parts(
    t: &dyn Transport,
    parts: &[&[f32]],
    len: usize,
    mode: ReduceMode,
    timeout: Duration,
) -> Result<Vec<f32>, CommError> {
    let n = len;
    if parts.iter().any(|p| p.len() != n) {
        return Err(CommError::Setup("parts of different lengths".into()));
    }
    match mode {
        ReduceMode::Fast | ReduceMode::Deterministic => {
            let mut data = crate::sum_parts(mode, parts);
            if data.is_empty() {
                data = vec![0.0; n];
            }
            ring(t, &mut data, |a, b| *a += b, timeout)?;
            Ok(data)
        }
        ReduceMode::Reproducible => {
            let headroom = repro::batched::DEFAULT_HEADROOM;
            let mut exps = vec![0u8; n];
            for p in parts {
                repro::batched::max_exponents(&mut exps, p);
            }
            ring(t, &mut exps, |a, b| *a = (*a).max(b), timeout)?;
            let mut fixed = vec![0i64; n];
            for p in parts {
                repro::batched::add_fixed(&mut fixed, p, &exps, headroom);
            }
            ring(t, &mut fixed, |a, b| *a = a.wrapping_add(b), timeout)?;
            Ok(repro::batched::finish(&fixed, &exps, headroom))
        }
    }
}

/// Every rank's `value`, indexed by rank, on every rank.
pub fn all_gather_u64(t: &dyn Transport, value: u64, timeout: Duration) -> Result<Vec<u64>, CommError> {
    Ok(all_gather_words(t, &[value], timeout)?.into_iter().map(|w| w[0]).collect())
}

/// Every rank's `words` (the same number on every rank), indexed by rank, on every rank.
pub fn all_gather_words(t: &dyn Transport, words: &[u64], timeout: Duration) -> Result<Vec<Vec<u64>>, CommError> {
    let k = words.len();
    // Each rank fills its own slots and zeros elsewhere; a wrapping sum is then a gather.
    let mut slots = vec![0i64; t.world() * k];
    for (slot, &w) in slots[t.rank() * k..(t.rank() + 1) * k].iter_mut().zip(words) {
        *slot = w as i64;
    }
    ring(t, &mut slots, |a, b| *a = a.wrapping_add(b), timeout)?;
    Ok(slots.chunks(k.max(1)).take(t.world()).map(|c| c.iter().map(|&v| v as u64).collect()).collect())
}

/// Copies `data` from `root` to every rank.
pub fn broadcast(t: &dyn Transport, data: &mut Vec<u8>, root: usize, timeout: Duration) -> Result<(), CommError> {
    if t.rank() == root {
        for peer in (0..t.world()).filter(|&p| p != root) {
            t.send(peer, KIND_BCAST, data)?;
        }
        return Ok(());
    }
    let f = t.recv(root, Instant::now() + timeout)?;
    if f.kind != KIND_BCAST {
        return Err(CommError::Protocol { peer: root, reason: format!("expected a broadcast, got kind {}", f.kind) });
    }
    *data = f.payload;
    Ok(())
}

/// Returns once every rank has entered the barrier (or fails within `timeout`).
pub fn barrier(t: &dyn Transport, timeout: Duration) -> Result<(), CommError> {
    let mut token = vec![0u8];
    ring(t, &mut token, |a, b| *a = (*a).max(b), timeout)
}
