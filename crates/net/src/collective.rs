//! Collectives over a [`Transport`]: ring all-reduce in the three reduce modes, a
//! one-round gather of a few words, broadcast and barrier. Every receive has a deadline, so a dead, silent or misbehaving peer makes
//! the collective fail on every survivor within the timeout instead of hanging.
//!
//! The ring all-reduce cuts the vector into `world` chunks. In `world - 1` reduce-scatter
//! steps each rank sends one chunk to its right neighbour while it receives another from
//! its left and combines it; after them rank `r` holds the full sum of chunk `r + 1`. In
//! `world - 1` all-gather steps the finished chunks travel round the ring. Each step
//! sends from one thread while the calling thread receives, so large chunks cannot
//! deadlock on full socket buffers (a step whose chunk fits in the free room of a
//! shared-memory ring sends first and then receives, on one thread); and each chunk travels as segments of
//! [`SEGMENT_BYTES`], which the receiver combines as they arrive while later segments are
//! still in flight (a pipeline, instead of receive-everything-then-add). A segment that
//! lands where it is to stay (the all-gathers, and the reproducible reduce-scatters, which
//! add this rank's contribution to it in place) is read from the socket straight into its
//! place ([`Transport::recv_exact`]); one that is combined with what is there already (the
//! float reduce-scatters) goes through a buffer.
//!
//! Modes:
//! - `fast` and `deterministic`: f32 sums. The order in which a chunk's contributions are
//!   added is fixed by the ring for a given world size, so both are deterministic here;
//!   `fast` leaves room for faster, order-free algorithms.
//! - `reproducible`: the two phases of [`repro::batched`]: a ring max of one scale byte
//!   per block of 64 elements, then a reduce-scatter of 64-bit fixed-point integers. Integer addition
//!   is associative, so each finished chunk is the same for any world size and any order;
//!   its owner converts it back to f32 once, and the all-gather circulates those f32 bits
//!   (half the bytes of the integers). The result is bitwise equal to
//!   [`repro::batched::sum_parts`] over all contributions.
//! - `reproducible32`: the same with 32-bit integers (equal to
//!   [`repro::batched::sum_parts_as`] for `i32`).
//!
//! A reproducible sum of parts ([`Reducer::sum_parts`], [`Reducer::sum_fixed`]) opens with
//! each rank's count of parts, a few bytes to every other rank. When no rank holds more
//! parts than its integers' bytes carry as floats (one in 32-bit lanes, two in 64-bit), the
//! ring of scales and integers gives way to a cheaper route to the same bits: the chunks
//! (cut at the scales' blocks) of every part travel as floats straight to their owners,
//! each owner finds its blocks' scales over every term, converts, adds and converts back in
//! cache, and the all-gather follows (`owner_sum`). No more bytes cross than in the ring,
//! and no pass over the message precedes the sum.
//!
//! In every reduce-scatter of a sum of parts (the exponents', the integers', and the
//! floats' of [`Reducer::sum_parts`]) a rank never computes its whole contribution up
//! front: it computes each chunk of it in the pass that needs it, the first segment by
//! segment in the sending thread just before each segment leaves, the others as the
//! partial sums arrive (`streamed_reduce_scatter`, `parts_reduce_scatter`); the float
//! sum keeps the bits of the local sum followed by the ring's. The exponent ring
//! also carries each rank's count of parts, so that every rank refuses, alike, a sum with
//! more parts than its integers can hold.

use std::time::{Duration, Instant};

use crate::ReduceMode;
pub use crate::fixed::FixedPoint;
pub use crate::frame::SEGMENT_BYTES;
use crate::transport::{CommError, Transport};

const KIND_CHUNK: u8 = 1;
const KIND_BCAST: u8 = 2;
const KIND_GATHER: u8 = 3;

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
impl Wire for i32 {}
impl Wire for u8 {}

#[cfg(target_endian = "big")]
compile_error!("the wire format of the collectives is little-endian");

fn chunk_range(n: usize, world: usize, c: usize) -> std::ops::Range<usize> {
    (c * n / world)..((c + 1) * n / world)
}

/// The chunk at `send` to read and the (different) chunk at `recv` to write, of one slice.
fn split_chunks<T>(data: &mut [T], send: std::ops::Range<usize>, recv: std::ops::Range<usize>) -> (&mut [T], &mut [T]) {
    if send.start >= recv.end {
        let (lo, hi) = data.split_at_mut(send.start);
        (&mut hi[..send.len()], &mut lo[recv])
    } else {
        let (lo, hi) = data.split_at_mut(recv.start);
        (&mut lo[send], &mut hi[..recv.len()])
    }
}

/// A `prepare` for [`exchange`] that sends the chunk as it is.
fn as_is<T>(_: usize, _: &mut [T]) {}

/// `combine(offset, dst, bytes)`: folds a received segment (`bytes`, `offset` elements
/// into the chunk) into its place `dst`.
type Combine<'f, T> = &'f dyn Fn(usize, &mut [T], &[u8]);

/// How a ring step puts each received segment in its place.
enum Fold<'f, T> {
    /// Received straight into its place, with no buffer in between; then
    /// `after(offset, dst)` works on it there (`offset` elements into the chunk).
    Into(&'f mut dyn FnMut(usize, &mut [T])),
    /// Received into `buf`; then `combine(offset, dst, bytes)` folds it into place.
    Combine { combine: Combine<'f, T>, buf: &'f mut Vec<u8> },
}

/// No work on a segment received into place.
fn nothing<T>(_: usize, _: &mut [T]) {}

/// One ring step: sends `send` to the right neighbour while receiving `recv.len()`
/// elements from the left one, segment by segment; `prepare(offset, seg)` fills each
/// segment of `send` (starting `offset` elements into it) just before it leaves, so that
/// work on the outgoing chunk overlaps the transfer; `fold` puts each received segment in
/// its place in `recv`. When the link to the right has room for all of `send` now (a ring
/// of shared memory), the step sends first and then receives, on this thread; otherwise
/// a helper thread sends while this one receives, so that neither waits on the other.
fn exchange<T: Wire>(
    t: &dyn Transport,
    send: &mut [T],
    prepare: &(impl Fn(usize, &mut [T]) + Sync),
    recv: &mut [T],
    deadline: Instant,
    mut fold: Fold<'_, T>,
) -> Result<(), CommError> {
    let world = t.world();
    let right = (t.rank() + 1) % world;
    let left = (t.rank() + world - 1) % world;
    let per = (SEGMENT_BYTES / T::SIZE).max(1);
    let frames = send.len().div_ceil(per).max(1);
    let fits = send.len() * T::SIZE + frames * crate::frame::HEADER_BYTES <= t.room(right);
    crate::transport::send_and_receive(
        fits,
        || send_segments(t, right, send, per, prepare),
        || receive_segments(t, left, recv, per, deadline, &mut fold),
    )
}

/// The sending half of a ring step: `send` to `right` in segments of `per` elements.
fn send_segments<T: Wire>(
    t: &dyn Transport,
    right: usize,
    send: &mut [T],
    per: usize,
    prepare: &(impl Fn(usize, &mut [T]) + Sync),
) -> Result<(), CommError> {
    for (k, seg) in send.chunks_mut(per).enumerate() {
        prepare(k * per, seg);
        t.send(right, KIND_CHUNK, bytemuck::cast_slice(seg))?;
    }
    // An empty chunk still sends one (empty) frame, so both sides agree on counts.
    if send.is_empty() {
        t.send(right, KIND_CHUNK, &[])?;
    }
    Ok(())
}

/// The receiving half of a ring step: `recv` from `left`, in segments of `per` elements.
fn receive_segments<T: Wire>(
    t: &dyn Transport,
    left: usize,
    recv: &mut [T],
    per: usize,
    deadline: Instant,
    fold: &mut Fold<'_, T>,
) -> Result<(), CommError> {
    let len = recv.len();
    for k in 0..len.div_ceil(per).max(1) {
        let dst = &mut recv[(k * per).min(len)..((k + 1) * per).min(len)];
        let kind = match fold {
            Fold::Into(_) => t.recv_exact(left, deadline, bytemuck::cast_slice_mut(dst))?,
            Fold::Combine { buf, .. } => {
                let kind = t.recv_into(left, deadline, buf)?;
                if buf.len() != dst.len() * T::SIZE {
                    return Err(CommError::Protocol {
                        peer: left,
                        reason: format!("expected a segment of {} bytes, got {} bytes", dst.len() * T::SIZE, buf.len()),
                    });
                }
                kind
            }
        };
        if kind != KIND_CHUNK {
            return Err(CommError::Protocol {
                peer: left,
                reason: format!("expected a segment of a ring step, got a frame of kind {kind}"),
            });
        }
        match fold {
            Fold::Into(after) => after(k * per, dst),
            Fold::Combine { combine, buf } => combine(k * per, dst, buf),
        }
    }
    Ok(())
}

/// The reduce-scatter half of the ring: afterwards chunk `rank + 1` of `data` holds the
/// combination of every rank's chunk. Returns its index.
fn reduce_scatter<T: Wire>(
    t: &dyn Transport,
    data: &mut [T],
    combine: impl Fn(&mut T, T) + Sync,
    timeout: Duration,
    buf: &mut Vec<u8>,
) -> Result<usize, CommError> {
    let (world, rank, n) = (t.world(), t.rank(), data.len());
    let fold = |_: usize, dst: &mut [T], src: &[u8]| {
        for (d, x) in dst.iter_mut().zip(src.chunks_exact(T::SIZE)) {
            combine(d, T::get(x));
        }
    };
    for s in 0..world - 1 {
        let send_c = (rank + world - s) % world;
        let recv_c = (rank + world - s - 1) % world;
        let (send, recv) = split_chunks(data, chunk_range(n, world, send_c), chunk_range(n, world, recv_c));
        exchange(t, send, &as_is, recv, Instant::now() + timeout, Fold::Combine { combine: &fold, buf: &mut *buf })?;
    }
    Ok((rank + 1) % world)
}

/// The all-gather half of the ring: every rank starts holding chunk `rank + 1` and ends
/// holding all of them.
fn all_gather<T: Wire>(t: &dyn Transport, data: &mut [T], timeout: Duration) -> Result<(), CommError> {
    all_gather_chunks(t, data, timeout, chunk_range)
}

/// [`all_gather`] of the chunks that `chunk(n, world, c)` cuts.
fn all_gather_chunks<T: Wire>(
    t: &dyn Transport,
    data: &mut [T],
    timeout: Duration,
    chunk: fn(usize, usize, usize) -> std::ops::Range<usize>,
) -> Result<(), CommError> {
    let (world, rank, n) = (t.world(), t.rank(), data.len());
    for s in 0..world - 1 {
        let send_c = (rank + 1 + world - s) % world;
        let recv_c = (rank + world - s) % world;
        let (send, recv) = split_chunks(data, chunk(n, world, send_c), chunk(n, world, recv_c));
        exchange(t, send, &as_is, recv, Instant::now() + timeout, Fold::Into(&mut nothing))?;
    }
    Ok(())
}

/// The float reduce-scatter of [`Reducer::sum_parts`], with this rank's sum of its
/// `parts` computed where the ring needs it instead of in a pass before the ring: the
/// first chunk segment by segment in the sending thread just before each segment leaves,
/// the others as their partial sums arrive. `out` holds the sums, as after
/// [`crate::sum_parts_into`] and [`reduce_scatter`], with the same bits; the message is
/// read and written once fewer (a one-part sum copies nothing), and the local sum
/// overlaps the transfers. Returns the index of the chunk this rank owns.
fn parts_reduce_scatter<P: AsRef<[f32]> + Sync>(
    t: &dyn Transport,
    parts: &[P],
    out: &mut [f32],
    timeout: Duration,
    buf: &mut Vec<u8>,
) -> Result<usize, CommError> {
    let (world, rank, n) = (t.world(), t.rank(), out.len());
    for s in 0..world - 1 {
        let sr = chunk_range(n, world, (rank + world - s) % world);
        let rr = chunk_range(n, world, (rank + world - s - 1) % world);
        let fresh = |offset: usize, seg: &mut [f32]| crate::sum_range_into(parts, sr.start + offset..sr.end, seg, None);
        let fold = |offset: usize, dst: &mut [f32], bytes: &[u8]| {
            crate::sum_range_into(parts, rr.start + offset..rr.end, dst, Some(bytes));
        };
        let (send, recv) = split_chunks(out, sr.clone(), rr.clone());
        let deadline = Instant::now() + timeout;
        let fold = Fold::Combine { combine: &fold, buf: &mut *buf };
        if s == 0 {
            exchange(t, send, &fresh, recv, deadline, fold)?;
        } else {
            exchange(t, send, &as_is, recv, deadline, fold)?;
        }
    }
    Ok((rank + 1) % world)
}

/// Ring all-reduce of `data` in place with the associative `combine`; `buf` receives the
/// reduce-scatter's segments (one buffer for the whole ring, or kept across calls by a
/// [`Reducer`]).
fn ring<T: Wire>(
    t: &dyn Transport,
    data: &mut [T],
    combine: impl Fn(&mut T, T) + Sync,
    timeout: Duration,
    buf: &mut Vec<u8>,
) -> Result<(), CommError> {
    if t.world() == 1 {
        return Ok(());
    }
    reduce_scatter(t, data, combine, timeout, buf)?;
    all_gather(t, data, timeout)
}

/// Sums `data` element-wise across all ranks, in place, in the given mode. Fails on every
/// survivor within `timeout` per step if a peer dies, hangs or sends garbage. (A
/// [`Reducer`] does the same and keeps its working buffers for the next call.)
pub fn all_reduce_sum(
    t: &dyn Transport,
    data: &mut [f32],
    mode: ReduceMode,
    timeout: Duration,
) -> Result<(), CommError> {
    Reducer::default().sum(t, data, mode, timeout)
}

/// Sums, element-wise, every part held by every rank (each rank passes its own parts,
/// e.g. the gradients of its micro-batches; possibly none) and returns the total of
/// length `len` on every rank.
///
/// In `reproducible` mode the local parts are never added as floats: each is converted to
/// fixed point at the global exponents, so the result is bitwise the same however the
/// parts are spread over ranks, for any world size. In the other modes each rank first
/// adds its parts in order, then the ring adds the ranks' sums.
pub fn all_reduce_parts<P: AsRef<[f32]> + Sync>(
    t: &dyn Transport,
    parts: &[P],
    len: usize,
    mode: ReduceMode,
    timeout: Duration,
) -> Result<Vec<f32>, CommError> {
    let mut out = vec![0f32; len];
    Reducer::default().sum_parts(t, parts, &mut out, mode, timeout)?;
    Ok(out)
}

/// The all-reduce with working buffers kept between calls: a training loop that reduces
/// a gradient of the same size every step touches fresh memory only once.
#[derive(Debug, Default)]
pub struct Reducer {
    buf: Vec<u8>,
    exps: Vec<u8>,
    sending: Vec<i64>,
    receiving: Vec<i64>,
    local: repro::batched::Scratch,
}

impl Reducer {
    /// [`all_reduce_sum`], reusing this reducer's buffers.
    pub fn sum(
        &mut self,
        t: &dyn Transport,
        data: &mut [f32],
        mode: ReduceMode,
        timeout: Duration,
    ) -> Result<(), CommError> {
        match mode {
            // In place: no copy of the message on either side of the ring.
            ReduceMode::Fast | ReduceMode::Deterministic => ring(t, data, |a, b| *a += b, timeout, &mut self.buf),
            ReduceMode::Reproducible | ReduceMode::Reproducible32 => {
                // The message is its own part, so its sum cannot be written while the
                // ring still reads it: the owned chunk is converted after the ring.
                let fixed = FixedPoint::of(mode).expect("a reproducible mode");
                let owned = self.reproducible(t, &[&*data], data.len(), fixed, None, timeout)?;
                self.finish(t.world(), fixed, owned, data);
                if t.world() > 1 {
                    all_gather(t, data, timeout)?;
                }
                Ok(())
            }
        }
    }

    /// [`all_reduce_parts`] into `out` (whose length is that of every part), reusing this
    /// reducer's buffers.
    pub fn sum_parts<P: AsRef<[f32]> + Sync>(
        &mut self,
        t: &dyn Transport,
        parts: &[P],
        out: &mut [f32],
        mode: ReduceMode,
        timeout: Duration,
    ) -> Result<(), CommError> {
        same_lengths(parts, out)?;
        match mode {
            ReduceMode::Fast | ReduceMode::Deterministic if t.world() > 1 && !parts.is_empty() => {
                parts_reduce_scatter(t, parts, out, timeout, &mut self.buf)?;
                all_gather(t, out, timeout)
            }
            ReduceMode::Fast | ReduceMode::Deterministic => {
                crate::sum_parts_into(mode, parts, out, &mut self.local);
                self.sum(t, out, mode, timeout)
            }
            ReduceMode::Reproducible | ReduceMode::Reproducible32 => {
                self.fixed_sum(t, parts, out, FixedPoint::of(mode).expect("a reproducible mode"), timeout)
            }
        }
    }

    /// [`Reducer::sum_parts`] as a reproducible sum in the integers `fixed` (the modes'
    /// sums are [`FixedPoint::of`] them; a caller with its own, such as PyTorch's gradient
    /// hook, gives its lanes and headroom). Refuses, on every rank alike, a sum of more
    /// parts than `2^headroom`.
    pub fn sum_fixed<P: AsRef<[f32]> + Sync>(
        &mut self,
        t: &dyn Transport,
        parts: &[P],
        out: &mut [f32],
        fixed: FixedPoint,
        timeout: Duration,
    ) -> Result<(), CommError> {
        same_lengths(parts, out)?;
        fixed.valid()?;
        self.fixed_sum(t, parts, out, fixed, timeout)
    }

    fn fixed_sum<P: AsRef<[f32]> + Sync>(
        &mut self,
        t: &dyn Transport,
        parts: &[P],
        out: &mut [f32],
        fixed: FixedPoint,
        timeout: Duration,
    ) -> Result<(), CommError> {
        if t.world() == 1 {
            // One rank: the ring phases would move nothing, and the local sum gives the
            // same bits (a reproducible sum does not depend on the grouping).
            fixed.check_parts(parts.len() as u64, 1)?;
            if parts.is_empty() {
                out.fill(0.0);
            } else if fixed.wide {
                repro::batched::sum_parts_as::<i64, P>(parts, fixed.headroom, out, &mut self.local);
            } else {
                repro::batched::sum_parts_as::<i32, P>(parts, fixed.headroom, out, &mut self.local);
            }
            return Ok(());
        }
        // Few parts on every rank: the terms meet at their chunk's owner, which sums them
        // (crate::owner_sum), and the chunks of whole blocks go round as the ring's do.
        let Reducer { sending, receiving, .. } = &mut *self;
        let deadline = Instant::now() + timeout;
        let summed = if fixed.wide {
            crate::owner_sum::reduce_scatter::<i64, P>(t, parts, out, fixed, deadline, sending, receiving)?
        } else {
            crate::owner_sum::reduce_scatter::<i32, P>(t, parts, out, fixed, deadline, sending, receiving)?
        };
        if summed {
            return all_gather_chunks(t, out, timeout, crate::owner_sum::block_chunk);
        }
        // The owned chunk's sum is converted to f32 segment by segment as the last ring
        // step completes it, while the segment is still in cache.
        self.reproducible(t, parts, out.len(), fixed, Some(&mut *out), timeout)?;
        all_gather(t, out, timeout)
    }

    /// A reproducible mode up to the all-gather: the exponents' reduce-scatter and
    /// all-gather, then the fixed-point reduce-scatter. With `out`, the sum of the chunk
    /// this rank owns is converted into its place there as it completes; without, it is
    /// left in one of the two chunk buffers, for [`Reducer::finish`].
    fn reproducible<P: AsRef<[f32]> + Sync>(
        &mut self,
        t: &dyn Transport,
        parts: &[P],
        n: usize,
        fixed: FixedPoint,
        out: Option<&mut [f32]>,
        timeout: Duration,
    ) -> Result<Owned, CommError> {
        let (world, rank) = (t.world(), t.rank());
        let Reducer { exps, sending, receiving, .. } = self;
        // The exponents travel with each rank's count of parts (four bytes per rank after
        // them; each rank writes only its own and zeros elsewhere, so the bytewise maximum
        // is a gather): every rank learns the total and refuses a sum that its integers
        // cannot hold, all of them alike.
        let count = (parts.len().min(u32::MAX as usize) as u32).to_le_bytes();
        let nb = repro::batched::blocks_of(n);
        let own_exps = |range: std::ops::Range<usize>, acc: &mut [u8], fresh: bool| {
            if fresh {
                acc.fill(0);
            }
            // The scales of blocks `range` (those below `nb`), over their elements.
            let blocks = range.start.min(nb)..range.end.min(nb);
            let block = repro::batched::EXP_BLOCK;
            let elements = (blocks.start * block).min(n)..(blocks.end * block).min(n);
            for p in parts {
                repro::batched::max_exponents(&mut acc[..blocks.len()], &p.as_ref()[elements.clone()], 0);
            }
            for (k, &byte) in count.iter().enumerate() {
                let at = nb + 4 * rank + k;
                if range.contains(&at) {
                    acc[at - range.start] = acc[at - range.start].max(byte);
                }
            }
        };
        let len = nb + 4 * world;
        let (a, b) = chunk_buffers::<u8>(len, world, sending, receiving);
        let mine = streamed_reduce_scatter(t, len, &mut *a, &mut *b, &own_exps, &mut |_, _| {}, timeout)?;
        let sum = if mine.in_first { a } else { b };
        exps.resize(len, 0);
        exps[mine.range.clone()].copy_from_slice(&sum[..mine.range.len()]);
        if world > 1 {
            all_gather(t, exps, timeout)?;
        }
        let total: u64 =
            exps[nb..].chunks_exact(4).map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes")))).sum();
        exps.truncate(nb);
        fixed.check_parts(total, world)?;
        if fixed.wide {
            fixed_reduce_scatter::<i64, P>(t, parts, n, fixed.headroom, out, timeout, self)
        } else {
            fixed_reduce_scatter::<i32, P>(t, parts, n, fixed.headroom, out, timeout, self)
        }
    }

    /// Converts the integer sum that [`Reducer::reproducible`] left to f32, into its
    /// place in `out`.
    fn finish(&mut self, world: usize, fixed: FixedPoint, owned: Owned, out: &mut [f32]) {
        if fixed.wide {
            self.finish_as::<i64>(world, fixed.headroom, owned, out);
        } else {
            self.finish_as::<i32>(world, fixed.headroom, owned, out);
        }
    }

    fn finish_as<A: repro::batched::Fixed>(&mut self, world: usize, headroom: u32, owned: Owned, out: &mut [f32]) {
        let Reducer { exps, sending, receiving, .. } = self;
        // The same carving as the reduce-scatter's, so the same words.
        let (a, b) = chunk_buffers::<A>(out.len(), world, sending, receiving);
        let sum = if owned.in_first { a } else { b };
        let r = owned.range;
        repro::batched::finish_into(&sum[..r.len()], exps, r.start, headroom, &mut out[r]);
    }
}

/// Refuses parts whose lengths differ from the sum's.
fn same_lengths<P: AsRef<[f32]>>(parts: &[P], out: &[f32]) -> Result<(), CommError> {
    if parts.iter().any(|p| p.as_ref().len() != out.len()) {
        return Err(CommError::Setup("parts of different lengths".into()));
    }
    Ok(())
}

/// Where a [`streamed_reduce_scatter`] left the sum of the chunk this rank owns.
struct Owned {
    /// The chunk's elements.
    range: std::ops::Range<usize>,
    /// In the first of the two chunk buffers (otherwise in the second).
    in_first: bool,
}

/// Two buffers of the longest chunk of `n` elements over `world` ranks, as `T`s, carved
/// from the reducer's two vectors of 64-bit words (which keep their memory across calls
/// and element types).
fn chunk_buffers<'a, T: bytemuck::Pod>(
    n: usize,
    world: usize,
    a: &'a mut Vec<i64>,
    b: &'a mut Vec<i64>,
) -> (&'a mut [T], &'a mut [T]) {
    let longest = (0..world).map(|c| chunk_range(n, world, c).len()).max().unwrap_or(0);
    (repro::batched::words_as(a, longest), repro::batched::words_as(b, longest))
}

/// A reduce-scatter in which this rank's contribution is computed where it is needed:
/// `own(range, acc, fresh)` combines the contribution to elements `range` into `acc` (or,
/// when `fresh`, writes it there over what `acc` held), and received values are copied
/// before it runs, so `own` must be the combining operation. `then(range, acc)` sees each
/// segment of the owned chunk's finished sum right after its `own` (still in cache).
/// Each chunk of this rank's contribution is computed exactly once: the first, segment by
/// segment in the sending thread just before each segment leaves; the others as their
/// partial sums arrive from the left neighbour, received straight into their place.
/// `a` and `b` are chunk-sized buffers; returns the range of the chunk this rank owns and
/// which of them holds it.
fn streamed_reduce_scatter<'a, T: Wire + Default>(
    t: &dyn Transport,
    n: usize,
    mut a: &'a mut [T],
    mut b: &'a mut [T],
    own: &(impl Fn(std::ops::Range<usize>, &mut [T], bool) + Sync),
    then: &mut dyn FnMut(std::ops::Range<usize>, &mut [T]),
    timeout: Duration,
) -> Result<Owned, CommError> {
    let (world, rank) = (t.world(), t.rank());
    let first = chunk_range(n, world, rank);
    if world == 1 {
        own(0..n, &mut a[..n], true);
        then(0..n, &mut a[..n]);
        return Ok(Owned { range: first, in_first: true });
    }
    let mut owned = Owned { range: first, in_first: true };
    for s in 0..world - 1 {
        let sr = chunk_range(n, world, (rank + world - s) % world);
        let rr = chunk_range(n, world, (rank + world - s - 1) % world);
        let fresh = |offset: usize, seg: &mut [T]| {
            let start = sr.start + offset;
            own(start..start + seg.len(), seg, true);
        };
        let last = s == world - 2;
        let mut add_own = |offset: usize, dst: &mut [T]| {
            let start = rr.start + offset;
            own(start..start + dst.len(), dst, false);
            if last {
                then(start..start + dst.len(), dst);
            }
        };
        let (send, recv) = (&mut a[..sr.len()], &mut b[..rr.len()]);
        let deadline = Instant::now() + timeout;
        if s == 0 {
            exchange(t, send, &fresh, recv, deadline, Fold::Into(&mut add_own))?;
        } else {
            exchange(t, send, &as_is, recv, deadline, Fold::Into(&mut add_own))?;
        }
        std::mem::swap(&mut a, &mut b);
        owned = Owned { range: rr, in_first: !owned.in_first };
    }
    Ok(owned)
}

/// The reproducible reduce-scatter in `A` integers: the fixed-point form of a chunk
/// exists only while the chunk passes through this rank (two chunk-sized buffers, not
/// one integer per element of the message), and this rank's contribution is converted
/// as the chunks pass ([`streamed_reduce_scatter`]). With `out`, the owned chunk's sum is
/// converted into its place there segment by segment; returns where the integer sum of
/// the chunk this rank ends up owning is.
fn fixed_reduce_scatter<A: repro::batched::Fixed + Wire, P: AsRef<[f32]> + Sync>(
    t: &dyn Transport,
    parts: &[P],
    n: usize,
    headroom: u32,
    mut out: Option<&mut [f32]>,
    timeout: Duration,
    r: &mut Reducer,
) -> Result<Owned, CommError> {
    let Reducer { exps, sending, receiving, .. } = r;
    let world = t.world();
    let exps = &exps[..];
    let own = |range: std::ops::Range<usize>, acc: &mut [A], fresh: bool| {
        if fresh {
            repro::batched::write_fixed_of(acc, parts, range, exps, headroom);
        } else {
            repro::batched::add_fixed_of(acc, parts, range, exps, headroom);
        }
    };
    let mut then = |range: std::ops::Range<usize>, acc: &mut [A]| {
        if let Some(out) = out.as_deref_mut() {
            repro::batched::finish_into(acc, exps, range.start, headroom, &mut out[range]);
        }
    };
    let (a, b) = chunk_buffers::<A>(n, world, sending, receiving);
    streamed_reduce_scatter(t, n, a, b, &own, &mut then, timeout)
}

/// Every rank's `value`, indexed by rank, on every rank.
pub fn all_gather_u64(t: &dyn Transport, value: u64, timeout: Duration) -> Result<Vec<u64>, CommError> {
    Ok(all_gather_words(t, &[value], timeout)?.into_iter().map(|w| w[0]).collect())
}

/// Every rank's `words` (the same number on every rank), indexed by rank, on every rank.
///
/// One round: each rank sends its words to every other rank and then reads theirs, so a
/// gather (a step's vote, a fingerprint check) waits for one message's latency, not for
/// a ring's `2 (world - 1)` steps. The messages are a few words each, so the sends never
/// wait on a receiver (a socket's or a shared-memory ring's room holds them), and each
/// link delivers in order, so a gather's message is never taken for a collective's that
/// follows it.
pub fn all_gather_words(t: &dyn Transport, words: &[u64], timeout: Duration) -> Result<Vec<Vec<u64>>, CommError> {
    let (world, rank) = (t.world(), t.rank());
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    // Every rank starts with its right neighbour, so no rank is everyone's first.
    for peer in (1..world).map(|k| (rank + k) % world) {
        t.send(peer, KIND_GATHER, &bytes)?;
    }
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::with_capacity(bytes.len());
    let mut all = Vec::with_capacity(world);
    for peer in 0..world {
        if peer == rank {
            all.push(words.to_vec());
            continue;
        }
        let kind = t.recv_into(peer, deadline, &mut buf)?;
        if kind != KIND_GATHER || buf.len() != bytes.len() {
            return Err(CommError::Protocol {
                peer,
                reason: format!(
                    "expected a gather of {} bytes, got a frame of kind {kind} with {} bytes",
                    bytes.len(),
                    buf.len()
                ),
            });
        }
        all.push(buf.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect());
    }
    Ok(all)
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

/// Returns once every rank has entered the barrier (or fails within `timeout`): a
/// gather of nothing.
pub fn barrier(t: &dyn Transport, timeout: Duration) -> Result<(), CommError> {
    all_gather_words(t, &[], timeout).map(|_| ())
}
