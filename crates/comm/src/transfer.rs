//! State transfer: a worker that joins an epoch fetches the training state from the live
//! replicas, in chunks, from several of them at once.
//!
//! The state is a flat array of `f32` elements (the parameters and the optimizer's slots,
//! in registry order). The fetcher asks for it by what it must be ([`Want`]: the step, the
//! fingerprint, a digest of the tensors' names and shapes, and the element count), one
//! chunk at a time; a source answers with the optimizer's update count, the xxh3-64 of the
//! chunk's bytes and the bytes, or refuses when it no longer holds that state. One thread
//! per source takes chunks from a shared queue, so a faster source serves more of them; a
//! source that fails (it died, refused, or sent a chunk whose checksum is wrong) puts its
//! chunk back for the others. The fetcher writes each verified chunk into its own state as
//! it arrives (no second copy of the model is made on either side) and checks the whole
//! against the fingerprint at the end.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::frame::{read_frame_into, write_frame};
use crate::protocol::WorkerId;
use crate::transport::CommError;

const KIND_GET: u8 = 0xC5;
const KIND_PART: u8 = 0xC6;
const KIND_REFUSE: u8 = 0xC7;

/// The most elements a chunk may hold: 4 MiB.
pub const CHUNK_ELEMENTS: usize = 1 << 20;

/// Elements per chunk for a state of `elements`: about 16 chunks, so that a small state
/// too is spread over every source, and between 4096 elements and [`CHUNK_ELEMENTS`].
pub fn chunk_for(elements: u64) -> usize {
    ((elements / 16) as usize).clamp(4096, CHUNK_ELEMENTS)
}

/// The state a fetcher asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    /// Its step.
    pub step: u64,
    /// Its fingerprint.
    pub fingerprint: u64,
    /// A digest of the tensors' names and shapes: both sides train the same model.
    pub layout: u64,
    /// Its number of elements.
    pub elements: u64,
}

impl Want {
    fn encode(&self, range: &Range<usize>) -> Vec<u8> {
        [self.step, self.fingerprint, self.layout, self.elements, range.start as u64, range.end as u64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }
    fn decode(b: &[u8]) -> Option<(Want, Range<usize>)> {
        if b.len() != 48 {
            return None;
        }
        let v: Vec<u64> = b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let want = Want { step: v[0], fingerprint: v[1], layout: v[2], elements: v[3] };
        (v[4] <= v[5] && v[5] <= v[3]).then(|| (want, v[4] as usize..v[5] as usize))
    }
}

/// How a source reads a chunk of the state it holds: see [`serve`].
pub type ReadChunk<'a> = dyn FnMut(&Want, Range<usize>, &mut Vec<u8>) -> Result<u64, String> + 'a;

/// Serves transfer requests on `stream` until the fetcher closes it. `read` appends the
/// elements of a range of the state `want` names to the buffer as little-endian bytes,
/// returning the optimizer's update count, or says why it cannot (it holds another state).
pub fn serve(mut stream: TcpStream, idle: Duration, read: &mut ReadChunk<'_>) {
    let _ = stream.set_read_timeout(Some(idle));
    let mut request = Vec::new();
    // The reply: the update count and checksum, then the chunk, read in place after them.
    let mut reply = Vec::new();
    while let Ok(kind) = read_frame_into(&mut stream, 64, &mut request) {
        reply.clear();
        reply.resize(16, 0);
        let answer = match (kind, Want::decode(&request)) {
            (KIND_GET, Some((want, range))) if range.len() <= CHUNK_ELEMENTS => read(&want, range, &mut reply),
            _ => Err("malformed request".to_owned()),
        };
        let sent = match answer {
            Ok(updates) => {
                let sum = xxhash_rust::xxh3::xxh3_64(&reply[16..]);
                reply[..8].copy_from_slice(&updates.to_le_bytes());
                reply[8..16].copy_from_slice(&sum.to_le_bytes());
                write_frame(&mut stream, KIND_PART, &reply)
            }
            Err(why) => write_frame(&mut stream, KIND_REFUSE, why.as_bytes()),
        };
        if sent.is_err() || stream.flush().is_err() {
            return;
        }
    }
}

/// What a fetch moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// The optimizer's update count at the sources.
    pub updates: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Chunks received from each source, in the order of the sources given.
    pub chunks: Vec<(WorkerId, u64)>,
    /// Sources that failed (each puts the chunk it was fetching back for the others).
    pub retried: u64,
    /// Wall-clock time of the fetch.
    pub elapsed: Duration,
}

/// Fetches `want` from `sources` in chunks of [`chunk_for`] elements, opening one
/// connection to each source with `connect`, and
/// hands each verified chunk (its element range and little-endian bytes) to `on_chunk`,
/// on the calling thread. A source that fails (it died, refused, or sent a chunk whose
/// checksum is wrong) is dropped and its chunk fetched from another; the fetch fails when
/// no source is left for a chunk, or when two sources report different update counts.
pub fn fetch(
    sources: &[(WorkerId, SocketAddr)],
    connect: &(dyn Fn(WorkerId, SocketAddr) -> Result<TcpStream, CommError> + Sync),
    want: &Want,
    timeout: Duration,
    on_chunk: &mut dyn FnMut(Range<usize>, &[u8]),
) -> Result<Fetched, CommError> {
    let started = Instant::now();
    let n = want.elements as usize;
    let chunk = chunk_for(want.elements);
    let queue: Mutex<VecDeque<Range<usize>>> =
        Mutex::new((0..n).step_by(chunk).map(|s| s..(s + chunk).min(n)).collect());
    let total_chunks = queue.lock().expect("fresh").len();
    let remaining = AtomicUsize::new(total_chunks);
    let mut fetched = Fetched { chunks: sources.iter().map(|&(id, _)| (id, 0)).collect(), ..Fetched::default() };
    let mut failures = Vec::new();
    let mut received = 0;
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel::<Result<(usize, Range<usize>, u64, Vec<u8>), (usize, String)>>(
            2 * sources.len().max(1),
        );
        for (i, &(id, addr)) in sources.iter().enumerate() {
            let (tx, queue, remaining) = (tx.clone(), &queue, &remaining);
            s.spawn(move || {
                let result = (|| -> Result<(), String> {
                    let mut stream = connect(id, addr).map_err(|e| e.to_string())?;
                    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
                    loop {
                        // Each chunk's buffer goes to the caller whole (no copy of the bytes).
                        let mut payload = Vec::new();
                        let Some(range) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                            // A chunk another source failed may still come back.
                            if remaining.load(Ordering::Acquire) == 0 {
                                return Ok(());
                            }
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        };
                        let got = get(&mut stream, want, &range, &mut payload);
                        match got {
                            Ok(updates) => {
                                remaining.fetch_sub(1, Ordering::AcqRel);
                                if tx.send(Ok((i, range, updates, payload))).is_err() {
                                    return Ok(());
                                }
                            }
                            Err(why) => {
                                queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(range);
                                return Err(why);
                            }
                        }
                    }
                })();
                if let Err(why) = result {
                    let _ = tx.send(Err((i, why)));
                }
            });
        }
        drop(tx);
        let mut updates = None;
        while received < total_chunks {
            let Ok(msg) = rx.recv() else { break };
            match msg {
                Ok((i, range, u, bytes)) => {
                    if *updates.get_or_insert(u) != u {
                        // The sources do not hold one state: nothing fetched can be trusted.
                        failures.push(format!("worker {}: update count {u}, not {updates:?}", sources[i].0));
                        break;
                    }
                    let bytes = &bytes[16..];
                    on_chunk(range, bytes);
                    received += 1;
                    fetched.bytes += bytes.len() as u64;
                    fetched.chunks[i].1 += 1;
                }
                Err((i, why)) => {
                    fetched.retried += 1;
                    failures.push(format!("worker {}: {why}", sources[i].0));
                }
            }
        }
        fetched.updates = updates.unwrap_or(0);
        // Stop the other sources' threads: they find the queue empty and nothing to wait for.
        queue.lock().unwrap_or_else(|e| e.into_inner()).clear();
        remaining.store(0, Ordering::Release);
        drop(rx);
    });
    fetched.elapsed = started.elapsed();
    // A source that failed put its chunk back for the others: only a missing chunk fails.
    if received == total_chunks {
        return Ok(fetched);
    }
    if failures.is_empty() {
        failures.push("no source answered".into());
    }
    Err(CommError::Setup(format!("state transfer failed: {}", failures.join("; "))))
}

/// One request and its verified answer: the update count, then the checksum, then the
/// bytes, in `payload`.
fn get(stream: &mut TcpStream, want: &Want, range: &Range<usize>, payload: &mut Vec<u8>) -> Result<u64, String> {
    write_frame(stream, KIND_GET, &want.encode(range)).map_err(|e| e.to_string())?;
    stream.flush().map_err(|e| e.to_string())?;
    // The kind byte, the update count and checksum, and the largest chunk.
    let max = 1 + 16 + 4 * CHUNK_ELEMENTS as u32;
    let kind = read_frame_into(stream, max, payload).map_err(|e| e.to_string())?;
    match kind {
        KIND_PART if payload.len() == 16 + 4 * range.len() => {
            let updates = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
            let sum = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
            if xxhash_rust::xxh3::xxh3_64(&payload[16..]) != sum {
                return Err(format!("chunk {range:?} failed its checksum"));
            }
            Ok(updates)
        }
        KIND_PART => Err(format!("chunk {range:?} has {} bytes", payload.len())),
        KIND_REFUSE => Err(format!("refused: {}", String::from_utf8_lossy(payload))),
        k => Err(format!("unexpected frame kind {k:#x}")),
    }
}
