//! The reproducible reduce-scatter when every rank holds few parts: the terms go to the
//! chunk's owner as they are, and the owner sums them.
//!
//! A reproducible sum scales every term of a block of [`repro::batched::EXP_BLOCK`]
//! elements by one power of two fixed by the block's largest exponent among *all* terms.
//! The ring of [`crate::collective`] therefore agrees on the scales first (a ring of its
//! own, and a pass over the message to find them) and then adds integers. When every rank
//! holds few parts (one micro-batch per rank, the common data-parallel step; or two, in
//! 64-bit lanes), there is a cheaper way to the same bits: every rank sends the floats of
//! chunk `c` of each of its parts straight to the rank that owns it, no more bytes than the
//! ring's integers would take (4 bytes per element and part, against 8 or 4 per element),
//! and the owner, holding every term of its chunk, finds each block's scale and converts
//! and adds all of them tile by tile while the tile is in cache, then converts the sum back
//! to floats. No scales' round and no pass over memory before the sum, and the result is
//! the same function: the same scales (a maximum over the same terms), the same integers,
//! added in another order, which integers ignore.
//!
//! Chunks here are cut at block boundaries, so that every block's terms meet at one owner
//! (rank `r` owns chunk `r + 1`, as after the ring's reduce-scatter, so that the ring's
//! all-gather follows unchanged with these chunks).
//!
//! How many parts the other ranks hold is not known in advance, so each rank says how many
//! it holds in a small frame to every owner, and a rank with few enough sends their floats
//! right behind it without waiting for the others' answers. Every rank reads every other's
//! count, so all of them see the same counts and take the same way: the owners' sum when
//! every rank holds few enough, and otherwise the ring (after reading, and setting aside,
//! the floats that the other ranks had already sent).
//!
//! The sends follow a fixed schedule, segment by segment and, within a segment, to the
//! ranks `r + 1, r + 2, ...` in turn, while the receives take the same segment from
//! `r - 1, r - 2, ...`: at every stage the ranks pair off (each sends to the one that is
//! receiving from it), so that with the sends on their own thread no rank waits on another
//! that waits on it, whatever the links buffer.

use std::ops::Range;
use std::time::Instant;

use repro::batched::{EXP_BLOCK, Fixed};

use crate::fixed::FixedPoint;
use crate::frame::SEGMENT_BYTES;
use crate::transport::{CommError, Transport};

/// A rank's count of parts, before its terms.
const KIND_PARTS: u8 = 4;
/// A segment of a chunk's terms.
const KIND_TERMS: u8 = 5;

/// Elements per segment frame.
const PER: usize = SEGMENT_BYTES / 4;
/// Elements the owner sums at a time (whole blocks), every term of them in cache.
const TILE: usize = 4096;

/// Elements of chunk `c` of `n` elements over `world` ranks, cut at block boundaries: the
/// blocks are shared out as evenly as they go.
pub(crate) fn block_chunk(n: usize, world: usize, c: usize) -> Range<usize> {
    let blocks = n.div_ceil(EXP_BLOCK);
    let (q, r) = (blocks / world, blocks % world);
    let start = c * q + c.min(r);
    let end = start + q + usize::from(c < r);
    (start * EXP_BLOCK).min(n)..(end * EXP_BLOCK).min(n)
}

/// The chunk rank `rank` owns.
fn owned(n: usize, world: usize, rank: usize) -> Range<usize> {
    block_chunk(n, world, (rank + 1) % world)
}

/// Segment frames of a chunk of `len` elements: at least one, so that an empty chunk
/// still travels as an (empty) frame and both sides count the same frames.
fn segments(len: usize) -> usize {
    len.div_ceil(PER).max(1)
}

/// Segment `k` of `chunk`.
fn segment(chunk: &Range<usize>, k: usize) -> Range<usize> {
    (chunk.start + k * PER).min(chunk.end)..(chunk.start + (k + 1) * PER).min(chunk.end)
}

/// The most parts a rank may hold for the owners' route in integers of `fixed`: as many as
/// send no more bytes as floats than the ring's integers would (two for 64-bit lanes, one
/// for 32-bit).
fn most_parts(fixed: FixedPoint) -> usize {
    if fixed.wide { 2 } else { 1 }
}

/// The reduce-scatter of a reproducible sum whose every rank holds `parts`: when no rank
/// holds more than [`most_parts`], the sum of the chunk this rank owns ([`block_chunk`])
/// is written into its place in `out` and this returns `true`; otherwise nothing is
/// written, every rank returns `false` alike, and the links are left clean for the ring.
/// `scratch` and `terms` are kept by the caller between calls.
pub(crate) fn reduce_scatter<A: Fixed, P: AsRef<[f32]> + Sync>(
    t: &dyn Transport,
    parts: &[P],
    out: &mut [f32],
    fixed: FixedPoint,
    deadline: Instant,
    scratch: &mut Vec<i64>,
    terms: &mut Vec<i64>,
) -> Result<bool, CommError> {
    let (world, rank, n) = (t.world(), t.rank(), out.len());
    // The parts this rank sends as they are: all of them, or none when they are too many.
    let sent: Vec<&[f32]> =
        if parts.len() <= most_parts(fixed) { parts.iter().map(|p| p.as_ref()).collect() } else { Vec::new() };
    let count = (parts.len().min(u32::MAX as usize) as u32).to_le_bytes();
    let send = || send_terms(t, &count, &sent, n);
    // Whether every frame fits the links' free room now (shared memory).
    let fits = (1..world).all(|d| {
        let peer = (rank + d) % world;
        let len = owned(n, world, peer).len();
        sent.len() * (4 * len + segments(len) * (crate::frame::HEADER_BYTES + 8)) + crate::frame::HEADER_BYTES + 8
            <= t.room(peer)
    });
    // A rank that sends only its count sends a few bytes that no link refuses.
    crate::transport::send_and_receive(fits || sent.is_empty(), send, || {
        receive_terms::<A>(t, parts.len(), &sent, out, fixed, deadline, scratch, terms)
    })
}

/// The sending side: this rank's count to every other rank, then the elements of each
/// rank's chunk of every part in `sent`, segment by segment.
fn send_terms(t: &dyn Transport, count: &[u8; 4], sent: &[&[f32]], n: usize) -> Result<(), CommError> {
    let (world, rank) = (t.world(), t.rank());
    for d in 1..world {
        t.send((rank + d) % world, KIND_PARTS, count)?;
    }
    if sent.is_empty() {
        return Ok(());
    }
    let most = (1..world).map(|d| segments(owned(n, world, (rank + d) % world).len())).max().unwrap_or(0);
    for k in 0..most {
        for d in 1..world {
            let peer = (rank + d) % world;
            let chunk = owned(n, world, peer);
            if k < segments(chunk.len()) {
                for part in sent {
                    t.send(peer, KIND_TERMS, bytemuck::cast_slice(&part[segment(&chunk, k)]))?;
                }
            }
        }
    }
    Ok(())
}

/// The receiving side: every other rank's count, then the terms of this rank's chunk from
/// the ranks that sent theirs, summed segment by segment when every rank did.
#[allow(clippy::too_many_arguments)]
fn receive_terms<A: Fixed>(
    t: &dyn Transport,
    mine: usize,
    own: &[&[f32]],
    out: &mut [f32],
    fixed: FixedPoint,
    deadline: Instant,
    scratch: &mut Vec<i64>,
    terms: &mut Vec<i64>,
) -> Result<bool, CommError> {
    let (world, rank, n) = (t.world(), t.rank(), out.len());
    let from = |d: usize| (rank + world - d) % world;
    let mut counts = vec![0usize; world];
    counts[rank] = mine;
    let mut frame = Vec::new();
    for d in 1..world {
        let kind = t.recv_into(from(d), deadline, &mut frame)?;
        match <[u8; 4]>::try_from(&frame[..]) {
            Ok(bytes) if kind == KIND_PARTS => counts[from(d)] = u32::from_le_bytes(bytes) as usize,
            _ => {
                let len = frame.len();
                let reason =
                    format!("expected a count of parts (4 bytes of kind {KIND_PARTS}), got {len} bytes of kind {kind}");
                return Err(protocol(from(d), reason));
            }
        }
    }
    // What each rank sent: its parts when it held few enough, nothing otherwise.
    let sent = |r: usize| if counts[r] <= most_parts(fixed) { counts[r] } else { 0 };
    let every = counts.iter().all(|&c| c <= most_parts(fixed));
    // Checked by every rank alike, after the terms are drained, so that the links stay clean.
    let total = counts.iter().map(|&c| c as u64).sum();
    let fits = fixed.check_parts(total, world);
    let chunk = owned(n, world, rank);
    // Room for one segment of every term the others send.
    let others: usize = (1..world).map(|d| sent(from(d))).sum();
    let stride = PER.min(chunk.len().max(1));
    let received: &mut [f32] = repro::batched::words_as(terms, others.max(1) * stride);
    for k in 0..segments(chunk.len()) {
        let seg = segment(&chunk, k);
        let mut at = 0;
        for d in 1..world {
            for _ in 0..sent(from(d)) {
                let into = &mut received[at * stride..][..seg.len()];
                let kind = t.recv_exact(from(d), deadline, bytemuck::cast_slice_mut(into))?;
                if kind != KIND_TERMS {
                    return Err(protocol(from(d), format!("expected a segment of terms, got a frame of kind {kind}")));
                }
                at += 1;
            }
        }
        if every && fits.is_ok() {
            let terms: Vec<&[f32]> = own
                .iter()
                .map(|p| &p[seg.clone()])
                .chain((0..others).map(|i| &received[i * stride..][..seg.len()]))
                .collect();
            sum_terms::<A>(&terms, &mut out[seg], fixed.headroom, scratch);
        }
    }
    if every {
        fits?;
    }
    Ok(every)
}

/// The reproducible sum of `terms` (every term of elements that start a block; zeros
/// when there are none) into `out`, tile by tile while the tile's terms are in cache
/// ([`repro::batched::sum_range`]): the bits of [`repro::batched::sum_parts_as`].
pub(crate) fn sum_terms<A: Fixed>(terms: &[&[f32]], out: &mut [f32], headroom: u32, scratch: &mut Vec<i64>) {
    let acc: &mut [A] = repro::batched::words_as(scratch, TILE.min(out.len()));
    let (mut tops, mut lows) = ([0u8; TILE / EXP_BLOCK], [0u8; TILE / EXP_BLOCK]);
    for (i, o) in out.chunks_mut(TILE).enumerate() {
        let blocks = o.len().div_ceil(EXP_BLOCK);
        let room =
            repro::batched::Room { tops: &mut tops[..blocks], lows: &mut lows[..blocks], acc: &mut acc[..o.len()] };
        repro::batched::sum_range(terms, i * TILE..i * TILE + o.len(), o, headroom, room);
    }
}

fn protocol(peer: usize, reason: String) -> CommError {
    CommError::Protocol { peer, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_whole_blocks_that_cover_the_message_once() {
        for n in [0, 1, 63, 64, 65, 640, 1000, 4096 * 3 + 5] {
            for world in 1..=9 {
                let chunks: Vec<_> = (0..world).map(|c| block_chunk(n, world, c)).collect();
                assert_eq!(chunks[0].start, 0);
                assert_eq!(chunks[world - 1].end, n);
                for w in chunks.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "n {n} world {world}");
                    assert!(w[0].end % EXP_BLOCK == 0 || w[0].end == n);
                }
            }
        }
    }
}
