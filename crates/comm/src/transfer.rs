//! State transfer: a worker that joins an epoch fetches the training state from the live
//! replicas, in chunks, from several of them at once.
//!
//! The state is a flat array of `f32` elements (the parameters and the optimizer's slots,
//! in registry order). The fetcher asks for it by what it must be ([`Want`]: the step, the
//! fingerprint, a digest of the tensors' names and shapes, and the element count), one
//! chunk at a time; a source answers with the optimizer's update count, the xxh3-64 of the
//! chunk's bytes and the bytes, or refuses when it no longer holds that state. Which
//! source fetches which chunk is a state machine without I/O ([`Chunks`]): one thread per
//! source asks it for the next chunk, so a faster source serves more of them; a source that
//! fails (it died, refused, or sent a chunk whose checksum is wrong) puts its chunk back
//! for the others, and a source with nothing to take waits for news rather than polling. The fetcher writes each verified chunk into its own state as
//! it arrives (no second copy of the model is made on either side) and checks the whole
//! against the fingerprint at the end.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::{Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::frame::{read_frame_into, write_frame};
use crate::protocol::WorkerId;
use crate::transport::CommError;

const KIND_GET: u8 = 0xC5;
const KIND_PART: u8 = 0xC6;
const KIND_REFUSE: u8 = 0xC7;
const KIND_DESCRIBE: u8 = 0xC8;
const KIND_DESCRIBED: u8 = 0xC9;

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

/// How a source says what the state of `(step, fingerprint)` is: its layout digest and
/// element count, or why it does not hold it. See [`serve_described`].
pub type Describe<'a> = dyn FnMut(u64, u64) -> Result<(u64, u64), String> + 'a;

/// Serves transfer requests on `stream` until the fetcher closes it. `read` appends the
/// elements of a range of the state `want` names to the buffer as little-endian bytes,
/// returning the optimizer's update count, or says why it cannot (it holds another state).
pub fn serve(stream: TcpStream, idle: Duration, read: &mut ReadChunk<'_>) {
    serve_described(stream, idle, &mut |_, _| Err("this source does not describe its state".into()), read)
}

/// [`serve`], answering [`describe`] requests too: a fetcher that does not know the
/// state's layout (its shapes are the sources', as an optimizer's state is before its
/// first step) asks a source first.
pub fn serve_described(mut stream: TcpStream, idle: Duration, describe: &mut Describe<'_>, read: &mut ReadChunk<'_>) {
    let _ = stream.set_read_timeout(Some(idle));
    let mut request = Vec::new();
    // The reply: the update count and checksum, then the chunk, read in place after them.
    let mut reply = Vec::new();
    while let Ok(kind) = read_frame_into(&mut stream, 64, &mut request) {
        if kind == KIND_DESCRIBE {
            let asked = (request.len() == 16).then(|| {
                let word = |i: usize| u64::from_le_bytes(request[i..i + 8].try_into().expect("8 bytes"));
                (word(0), word(8))
            });
            let sent = match asked.ok_or_else(|| "malformed request".to_owned()).and_then(|(s, f)| describe(s, f)) {
                Ok((layout, elements)) => {
                    let words: Vec<u8> = [layout, elements].iter().flat_map(|v| v.to_le_bytes()).collect();
                    write_frame(&mut stream, KIND_DESCRIBED, &words)
                }
                Err(why) => write_frame(&mut stream, KIND_REFUSE, why.as_bytes()),
            };
            if sent.is_err() || stream.flush().is_err() {
                return;
            }
            continue;
        }
        reply.clear();
        reply.resize(16, 0);
        let answer = match (kind, Want::decode(&request)) {
            (KIND_GET, Some((want, range))) if range.len() <= CHUNK_ELEMENTS => read(&want, range, &mut reply),
            _ => Err("malformed request".to_owned()),
        };
        let sent = match answer {
            Ok(updates) => {
                let sum = kernels::hash::xxh3_64(kernels::isa::selected(), &reply[16..]);
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

/// What the state of `(step, fingerprint)` is, `(layout, elements)`, as the first of
/// `sources` that holds it says: the [`Want`] of a fetcher that does not know it. Each
/// source is asked in turn until one answers.
pub fn describe(
    sources: &[(WorkerId, SocketAddr)],
    connect: &(dyn Fn(WorkerId, SocketAddr) -> Result<TcpStream, CommError> + Sync),
    (step, fingerprint): (u64, u64),
    timeout: Duration,
) -> Result<(u64, u64), CommError> {
    let mut why = Vec::new();
    for &(id, addr) in sources {
        let asked = connect(id, addr).and_then(|mut stream| {
            stream.set_read_timeout(Some(timeout)).map_err(setup)?;
            let words: Vec<u8> = [step, fingerprint].iter().flat_map(|v| v.to_le_bytes()).collect();
            write_frame(&mut stream, KIND_DESCRIBE, &words).map_err(setup)?;
            stream.flush().map_err(setup)?;
            let mut answer = Vec::new();
            match read_frame_into(&mut stream, 1024, &mut answer).map_err(setup)? {
                KIND_DESCRIBED if answer.len() == 16 => {
                    let word = |i: usize| u64::from_le_bytes(answer[i..i + 8].try_into().expect("8 bytes"));
                    Ok((word(0), word(8)))
                }
                KIND_REFUSE => Err(CommError::Setup(format!("refused: {}", String::from_utf8_lossy(&answer)))),
                k => Err(CommError::Setup(format!("unexpected frame kind {k:#x}"))),
            }
        });
        match asked {
            Ok(described) => return Ok(described),
            Err(e) => why.push(format!("worker {id}: {e}")),
        }
    }
    Err(CommError::Setup(format!("no source describes the state of step {step}: {}", why.join("; "))))
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

/// What a source does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Fetch this chunk.
    Fetch(Range<usize>),
    /// Nothing is left to take now, but a chunk another source is fetching may come back
    /// (if that source fails): wait for news.
    Wait,
    /// The fetch is over, for this source at least.
    Stop,
}

/// The chunk schedule of one fetch, without I/O: which chunk each source fetches next,
/// what a source's failure puts back for the others, whether the sources agree on the
/// state they hold, and when the fetch is done or lost. [`fetch`] is its shell over TCP,
/// one thread a source; the tests below drive it by hand.
#[derive(Clone, Debug)]
pub struct Chunks {
    pending: VecDeque<Range<usize>>,
    in_flight: Vec<Option<Range<usize>>>,
    failed: Vec<bool>,
    total: usize,
    received: usize,
    updates: Option<u64>,
    per_source: Vec<u64>,
    retried: u64,
    failures: Vec<String>,
    disagree: bool,
}

impl Chunks {
    /// `elements` cut into chunks of `chunk`, for `sources` sources.
    pub fn new(elements: usize, chunk: usize, sources: usize) -> Chunks {
        let pending: VecDeque<_> = (0..elements).step_by(chunk.max(1)).map(|s| s..(s + chunk).min(elements)).collect();
        Chunks {
            total: pending.len(),
            pending,
            in_flight: vec![None; sources],
            failed: vec![false; sources],
            received: 0,
            updates: None,
            per_source: vec![0; sources],
            retried: 0,
            failures: Vec::new(),
            disagree: false,
        }
    }

    /// What `source` does next.
    pub fn next(&mut self, source: usize) -> Next {
        if self.over() || self.failed[source] {
            return Next::Stop;
        }
        if let Some(range) = self.pending.pop_front() {
            self.in_flight[source] = Some(range.clone());
            return Next::Fetch(range);
        }
        if self.in_flight.iter().any(Option::is_some) { Next::Wait } else { Next::Stop }
    }

    /// `source` received its chunk, verified, from a state of `updates` optimizer updates.
    /// An error when the sources do not hold one state: nothing fetched can be trusted.
    pub fn received(&mut self, source: usize, updates: u64) -> Result<(), String> {
        self.in_flight[source] = None;
        if *self.updates.get_or_insert(updates) != updates {
            let why = format!("source {source}: update count {updates}, not {:?}", self.updates);
            self.failures.push(why.clone());
            self.disagree = true;
            return Err(why);
        }
        self.received += 1;
        self.per_source[source] += 1;
        Ok(())
    }

    /// `source` failed (it died, refused, or sent a chunk whose checksum is wrong): its
    /// chunk goes back for the others, and it gets no other.
    pub fn failed(&mut self, source: usize, why: String) {
        if let Some(range) = self.in_flight[source].take() {
            self.pending.push_front(range);
        }
        self.failed[source] = true;
        self.retried += 1;
        self.failures.push(why);
    }

    /// Whether nothing more will happen: every chunk received, the sources disagree, or
    /// chunks are left and no source is.
    pub fn over(&self) -> bool {
        self.disagree || self.received == self.total || self.failed.iter().all(|&f| f)
    }

    /// Chunks received from each source, in the order of the sources.
    pub fn per_source(&self) -> &[u64] {
        &self.per_source
    }

    /// The outcome once [`Chunks::over`]: the sources' update count, or why the fetch failed.
    pub fn outcome(&self) -> Result<u64, String> {
        if !self.disagree && self.received == self.total {
            return Ok(self.updates.unwrap_or(0));
        }
        if self.failures.is_empty() {
            return Err("no source answered".into());
        }
        Err(self.failures.join("; "))
    }
}

/// Fetches `want` from `sources` in chunks of [`chunk_for`] elements, opening one
/// connection to each source with `connect`, and hands each verified chunk (its element
/// range and little-endian bytes) to `on_chunk`, on the calling thread. The [`Chunks`]
/// schedule decides who fetches what: a source that fails is dropped and its chunk fetched
/// from another; the fetch fails when no source is left for a chunk, or when two sources
/// report different update counts.
pub fn fetch(
    sources: &[(WorkerId, SocketAddr)],
    connect: &(dyn Fn(WorkerId, SocketAddr) -> Result<TcpStream, CommError> + Sync),
    want: &Want,
    timeout: Duration,
    on_chunk: &mut dyn FnMut(Range<usize>, &[u8]),
) -> Result<Fetched, CommError> {
    let started = Instant::now();
    let schedule = Mutex::new(Chunks::new(want.elements as usize, chunk_for(want.elements), sources.len()));
    // Rings when a chunk is received or a source fails: a source waiting for a chunk to
    // come back looks again.
    let news = Condvar::new();
    let mut fetched = Fetched::default();
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel::<(Range<usize>, Vec<u8>)>(2 * sources.len().max(1));
        for (i, &(id, addr)) in sources.iter().enumerate() {
            let (tx, schedule, news) = (tx.clone(), &schedule, &news);
            s.spawn(move || {
                let lock = || schedule.lock().unwrap_or_else(|e| e.into_inner());
                let mut stream = match connect(id, addr).and_then(|st| {
                    st.set_read_timeout(Some(timeout)).map_err(|e| CommError::Setup(e.to_string()))?;
                    Ok(st)
                }) {
                    Ok(st) => st,
                    Err(e) => {
                        lock().failed(i, format!("worker {id}: {e}"));
                        news.notify_all();
                        return;
                    }
                };
                let mut plan = lock();
                loop {
                    let range = match plan.next(i) {
                        Next::Fetch(range) => range,
                        Next::Wait => {
                            plan = news.wait(plan).unwrap_or_else(|e| e.into_inner());
                            continue;
                        }
                        Next::Stop => return,
                    };
                    drop(plan);
                    // Each chunk's buffer goes to the caller whole (no copy of the bytes).
                    let mut payload = Vec::new();
                    let got = get(&mut stream, want, &range, &mut payload);
                    plan = lock();
                    let kept = match got {
                        Ok(updates) => plan.received(i, updates).map_err(|why| format!("worker {id}: {why}")),
                        Err(why) => {
                            plan.failed(i, format!("worker {id}: {why}"));
                            Err(why)
                        }
                    };
                    news.notify_all();
                    if kept.is_ok() {
                        drop(plan);
                        if tx.send((range, payload)).is_err() {
                            return;
                        }
                        plan = lock();
                    }
                }
            });
        }
        drop(tx);
        for (range, bytes) in rx {
            let bytes = &bytes[16..];
            on_chunk(range, bytes);
            fetched.bytes += bytes.len() as u64;
        }
    });
    let schedule = schedule.into_inner().unwrap_or_else(|e| e.into_inner());
    fetched.elapsed = started.elapsed();
    fetched.retried = schedule.retried;
    fetched.chunks = sources.iter().map(|&(id, _)| id).zip(schedule.per_source().iter().copied()).collect();
    match schedule.outcome() {
        Ok(updates) => {
            fetched.updates = updates;
            Ok(fetched)
        }
        Err(why) => Err(CommError::Setup(format!("state transfer failed: {why}"))),
    }
}

fn setup(e: impl std::fmt::Display) -> CommError {
    CommError::Setup(e.to_string())
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
            if kernels::hash::xxh3_64(kernels::isa::selected(), &payload[16..]) != sum {
                return Err(format!("chunk {range:?} failed its checksum"));
            }
            Ok(updates)
        }
        KIND_PART => Err(format!("chunk {range:?} has {} bytes", payload.len())),
        KIND_REFUSE => Err(format!("refused: {}", String::from_utf8_lossy(payload))),
        k => Err(format!("unexpected frame kind {k:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunks_are_shared_out_in_order_and_the_fetch_ends_when_all_arrived() {
        let mut c = Chunks::new(10, 4, 2);
        assert_eq!(c.next(0), Next::Fetch(0..4));
        assert_eq!(c.next(1), Next::Fetch(4..8));
        c.received(0, 7).unwrap();
        // The faster source takes the next chunk.
        assert_eq!(c.next(0), Next::Fetch(8..10));
        assert_eq!(c.next(0), Next::Wait, "a chunk is still in flight elsewhere");
        c.received(1, 7).unwrap();
        c.received(0, 7).unwrap();
        assert!(c.over());
        assert_eq!(c.next(1), Next::Stop);
        assert_eq!(c.outcome(), Ok(7));
        assert_eq!(c.per_source(), [2, 1]);
    }

    #[test]
    fn a_failed_source_puts_its_chunk_back_for_another_and_gets_no_more() {
        let mut c = Chunks::new(8, 4, 2);
        assert_eq!(c.next(0), Next::Fetch(0..4));
        assert_eq!(c.next(1), Next::Fetch(4..8));
        c.received(1, 3).unwrap();
        assert_eq!(c.next(1), Next::Wait, "source 0 may still deliver or fail");
        c.failed(0, "worker 0: refused".into());
        assert_eq!(c.next(0), Next::Stop, "a failed source is done");
        assert_eq!(c.next(1), Next::Fetch(0..4), "its chunk came back");
        c.received(1, 3).unwrap();
        assert_eq!(c.outcome(), Ok(3));
        assert_eq!((c.per_source(), c.retried), (&[0, 2][..], 1));
    }

    #[test]
    fn the_fetch_fails_when_no_source_is_left_for_a_chunk() {
        let mut c = Chunks::new(8, 4, 2);
        let _ = (c.next(0), c.next(1));
        c.received(0, 1).unwrap();
        c.failed(1, "worker 1: died".into());
        assert_eq!(c.next(0), Next::Fetch(4..8));
        c.failed(0, "worker 0: chunk 4..8 failed its checksum".into());
        assert!(c.over());
        let why = c.outcome().unwrap_err();
        assert!(why.contains("worker 1: died") && why.contains("checksum"), "{why}");
        assert_eq!(Chunks::new(8, 4, 0).outcome(), Err("no source answered".into()));
    }

    #[test]
    fn sources_that_hold_different_states_end_the_fetch() {
        let mut c = Chunks::new(12, 4, 2);
        let _ = (c.next(0), c.next(1));
        c.received(0, 5).unwrap();
        assert!(c.received(1, 6).is_err());
        assert!(c.over());
        assert_eq!(c.next(0), Next::Stop);
        assert!(c.outcome().unwrap_err().contains("update count 6"));
    }

    #[test]
    fn an_empty_state_is_fetched_at_once() {
        let mut c = Chunks::new(0, 4, 3);
        assert_eq!(c.next(2), Next::Stop);
        assert_eq!(c.outcome(), Ok(0));
    }

    /// A source that serves over TCP: refuses to describe any state but `(step, print)`.
    fn source(step: u64, print: u64, described: (u64, u64)) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut describe = |s: u64, f: u64| {
                    if (s, f) == (step, print) { Ok(described) } else { Err(format!("holds step {step}")) }
                };
                serve_described(stream, Duration::from_secs(5), &mut describe, &mut |_, _, _| Err("no".into()));
            }
        });
        addr
    }

    #[test]
    fn a_fetcher_learns_the_layout_from_the_first_source_that_holds_the_state() {
        let connect = |_: WorkerId, addr: SocketAddr| TcpStream::connect(addr).map_err(setup);
        let (old, new) = (source(6, 0xAB, (1, 2)), source(7, 0xCD, (11, 4096)));
        let sources = [(3, old), (4, new)];
        assert_eq!(describe(&sources, &connect, (7, 0xCD), Duration::from_secs(5)).unwrap(), (11, 4096));
        let err = describe(&sources, &connect, (8, 0xEF), Duration::from_secs(5)).unwrap_err().to_string();
        assert!(err.contains("no source describes the state of step 8"), "{err}");
        assert!(err.contains("worker 3: ") && err.contains("refused: holds step 6"), "{err}");
        assert!(err.contains("worker 4: ") && err.contains("refused: holds step 7"), "{err}");
    }
}
