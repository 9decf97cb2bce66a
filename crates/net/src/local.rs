//! Shared-memory links between two ranks of one host.
//!
//! Two ranks whose TCP connection runs between two addresses of one host (loopback, or
//! both ends on the same address) move their frames through a pair of byte rings in a
//! [`shm::Region`] instead of through the kernel's TCP stack: one copy into the shared
//! pages, one copy out, and no system call while data flows. The TCP connection, already
//! authenticated by the [`handshake`](crate::handshake), stays open beside the rings. It
//! carries the offer that sets the rings up, and then only wake-ups: one byte from a
//! writer whose reader went to sleep. It is also the link's sign of life: a peer that
//! dies closes it (the kernel does that even on `kill -9`), so a rank waiting on a ring
//! notices the loss as it would on TCP; and shutting it down is how an abort wakes a
//! waiting rank.
//!
//! ## Setting up
//!
//! After the mesh's connections are made, each pair agrees on its link over its
//! connection, in three rounds that never wait in a cycle: every rank first sends an
//! offer to each higher rank (a region it created, or "TCP"), then answers each lower
//! rank's offer (opened, or not), then reads the answers to its own offers. The offer
//! carries a fresh nonce; the region's name and its token are HMACs of the job's secret
//! over that nonce, so the name never comes from the wire as a path, and only a process
//! that knows the secret finds or accepts the region. The file is created `O_EXCL` with
//! mode 0600 and removed as soon as both sides have mapped it. Anything that fails on the
//! way (no `/dev/shm`, a full one, ranks on two hosts) leaves that pair on TCP.
//!
//! ## Waiting
//!
//! A rank that finds its ring empty spins briefly, then yields its core (so that ranks
//! sharing few cores do not starve each other), then says in the ring that it sleeps and
//! sleeps in `poll` on the connection; the writer sees that after its next write and
//! rings (see the `shm` crate for why no wake-up is lost). A writer that finds the ring
//! full (a message larger than the ring's room) naps for growing intervals instead.
//! Every wait has a deadline, ends at once on an abort, and ends with the peer's loss
//! when the connection closes: never a hang, and no futex shared with another process.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::frame::{read_frame, write_frame};

/// Bytes of each direction's ring.
pub const RING_BYTES: usize = 4 << 20;
const KIND_OFFER: u8 = 0xB1;
const KIND_ANSWER: u8 = 0xB2;
const OFFER_VERSION: u8 = 1;
const MAX_SETUP_FRAME: u32 = 256;

/// The environment variable that keeps a job's ranks on TCP even on one host, when set
/// to `0` (for comparisons, and for hosts whose `/dev/shm` is too small).
pub const ENV_OFF: &str = "STEADFAST_SHARED_MEMORY";

/// The directory where ranks of one host make their rings: `/dev/shm` when there is one
/// and [`ENV_OFF`] is not `0`.
pub fn default_dir() -> Option<PathBuf> {
    if std::env::var(ENV_OFF).is_ok_and(|v| v == "0") {
        return None;
    }
    let dir = Path::new("/dev/shm");
    dir.is_dir().then(|| dir.to_path_buf())
}

/// Whether a connection runs between two addresses of this host.
pub fn same_host(s: &TcpStream) -> bool {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(a), Ok(b)) => a.ip() == b.ip() || (a.ip().is_loopback() && b.ip().is_loopback()),
        _ => false,
    }
}

fn mac(secret: &[u8], label: &[u8], nonce: &[u8; 16]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(nonce);
    m.finalize().into_bytes().into()
}

/// The region's file name and token for an offer's nonce.
fn region_of(secret: &[u8], nonce: &[u8; 16]) -> (String, shm::Token) {
    let name: String = mac(secret, b"steadfast-shm-name-v1", nonce)[..16].iter().map(|b| format!("{b:02x}")).collect();
    (format!("steadfast-{name}"), mac(secret, b"steadfast-shm-token-v1", nonce))
}

/// One side of a pair's rings.
pub(crate) struct Rings {
    pub(crate) writer: shm::Writer,
    pub(crate) reader: shm::Reader,
}

/// Agrees with each peer on its link (see the module's docs); returns, by peer, the rings
/// of the pairs that use shared memory. `streams` holds one authenticated connection per
/// peer; `dir` is where to make rings (`None`: every pair stays on TCP).
pub(crate) fn negotiate(
    rank: usize,
    streams: &mut [(usize, TcpStream)],
    secret: &[u8],
    dir: Option<&Path>,
) -> io::Result<Vec<(usize, Rings)>> {
    let setup = |e: crate::frame::FrameError| io::Error::other(e.to_string());
    // Round 1: an offer to every higher rank.
    let mut offered: Vec<(usize, Arc<shm::Region>)> = Vec::new();
    for (peer, s) in streams.iter_mut().filter(|(p, _)| *p > rank) {
        let region = dir.filter(|_| same_host(s)).and_then(|dir| create(dir, secret));
        let payload = match &region {
            Some((nonce, _)) => [&[OFFER_VERSION][..], nonce].concat(),
            None => Vec::new(),
        };
        write_frame(s, KIND_OFFER, &payload).map_err(setup)?;
        if let Some((_, r)) = region {
            offered.push((*peer, Arc::new(r)));
        }
    }
    // Round 2: an answer to every lower rank's offer.
    let mut links = Vec::new();
    for (peer, s) in streams.iter_mut().filter(|(p, _)| *p < rank) {
        let offer = read_setup(s, *peer, KIND_OFFER)?;
        let opened = match (offer.payload.as_slice(), dir) {
            ([OFFER_VERSION, nonce @ ..], Some(dir)) if nonce.len() == 16 && same_host(s) => {
                let nonce: [u8; 16] = nonce.try_into().expect("16 bytes");
                let (name, token) = region_of(secret, &nonce);
                shm::Region::open(dir, &name, RING_BYTES, &token)
                    .inspect_err(|e| tracing::warn!(peer, "staying on TCP: {e}"))
                    .ok()
            }
            _ => None,
        };
        write_frame(s, KIND_ANSWER, &[u8::from(opened.is_some())]).map_err(setup)?;
        if let Some(region) = opened {
            let (writer, reader) = Arc::new(region).ends(false);
            links.push((*peer, Rings { writer, reader }));
        }
    }
    // Round 3: the answers to this rank's offers.
    for (peer, s) in streams.iter_mut().filter(|(p, _)| *p > rank) {
        let answer = read_setup(s, *peer, KIND_ANSWER)?;
        let Some(at) = offered.iter().position(|(p, _)| p == peer) else { continue };
        let (_, region) = offered.swap_remove(at);
        // Mapped by both sides now (or refused): the name is no longer needed.
        if let Err(e) = region.unlink() {
            tracing::warn!("{e}");
        }
        if answer.payload == [1] {
            let (writer, reader) = region.ends(true);
            links.push((*peer, Rings { writer, reader }));
        }
    }
    Ok(links)
}

/// The next frame from `peer`, which must be a setup frame of `kind`.
fn read_setup(s: &mut TcpStream, peer: usize, kind: u8) -> io::Result<crate::frame::Frame> {
    let frame = read_frame(s, MAX_SETUP_FRAME).map_err(|e| io::Error::other(e.to_string()))?;
    if frame.kind != kind {
        let what = if kind == KIND_OFFER { "its link offer" } else { "its answer" };
        return Err(io::Error::other(format!("rank {peer} sent a frame of kind {} instead of {what}", frame.kind)));
    }
    Ok(frame)
}

/// A fresh region in `dir` and its offer's nonce, or `None` (logged) when none can be made.
fn create(dir: &Path, secret: &[u8]) -> Option<([u8; 16], shm::Region)> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).ok()?;
    let (name, token) = region_of(secret, &nonce);
    shm::Region::create(dir, &name, RING_BYTES, &token)
        .inspect_err(|e| tracing::warn!("staying on TCP: {e}"))
        .ok()
        .map(|r| (nonce, r))
}

/// How long a waiting rank yields its core before it sleeps. It does not spin first:
/// yielding costs a rank with a core of its own no more than a spin (the call returns at
/// once when nothing else is runnable there), and gives the core away when ranks share
/// cores. A 20 us spin before the yields cost the 4-rank MLP rows of `bench/run.sh
/// engines` on 2 cores 7-9% of their steps/s (docs/clusters.md); sleeping and being woken
/// instead of yielding cost them about a quarter.
const YIELD: Duration = Duration::from_millis(2);
/// The longest sleep of a reader between two looks at its ring, were a wake-up lost
/// (none is: this only bounds the harm of a peer that breaks the rules).
const SLEEP_MAX: Duration = Duration::from_millis(50);
/// The longest nap of a writer that waits for room.
const NAP_MAX: Duration = Duration::from_micros(500);

/// A wait on a ring: it yields while young, then sleeps.
struct Wait {
    start: Instant,
    deadline: Instant,
    naps: u32,
}

impl Wait {
    fn until(deadline: Instant) -> Wait {
        Wait { start: Instant::now(), deadline, naps: 0 }
    }

    /// Fails with `ConnectionAborted` once the link was aborted, and with `TimedOut` past
    /// the deadline.
    fn check(&self, aborted: &AtomicBool) -> io::Result<()> {
        if aborted.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the link was aborted"));
        }
        if Instant::now() >= self.deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(())
    }

    /// Yields while the wait is young; false once it is time to sleep.
    fn busy(&self) -> bool {
        if self.start.elapsed() < YIELD {
            std::thread::yield_now();
            true
        } else {
            false
        }
    }

    /// The next sleep: growing from 20 us to `most`, never past the deadline.
    fn nap(&mut self, most: Duration) -> Duration {
        let nap = Duration::from_micros(20 << self.naps.min(8)).min(most);
        self.naps += 1;
        nap.min(self.deadline.saturating_duration_since(Instant::now()))
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the peer's connection closed")
}

/// Sleeps up to `nap` in `poll` on the connection, which the writer rings (one byte) to
/// wake this reader, and which wakes it as well when the peer's end closes or the link is
/// shut down; drains the rings. Fails with `ConnectionAborted` once the connection is
/// closed.
fn sleep_until_rung(socket: &TcpStream, nap: Duration) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let timeout = Timespec { tv_sec: nap.as_secs() as i64, tv_nsec: i64::from(nap.subsec_nanos()) };
    let mut fds = [PollFd::new(socket, PollFlags::IN | PollFlags::RDHUP)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(()),
        Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    let mut rings = [0u8; 64];
    loop {
        match rustix::net::recv(socket, &mut rings, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Err(closed()),
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Err(closed()),
        }
    }
}

/// Whether the connection is closed, without taking anything from it.
fn is_closed(socket: &TcpStream) -> bool {
    use rustix::net::RecvFlags;
    let mut byte = [0u8; 1];
    match rustix::net::recv(socket, &mut byte, RecvFlags::DONTWAIT | RecvFlags::PEEK) {
        Ok((0, _)) => true,
        Ok(_) | Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => false,
        Err(_) => true,
    }
}

/// The receiving end of a shared-memory link, read as a stream of frames.
pub(crate) struct ShmIn {
    reader: shm::Reader,
    socket: TcpStream,
    aborted: Arc<AtomicBool>,
    deadline: Instant,
}

impl ShmIn {
    pub(crate) fn new(reader: shm::Reader, socket: TcpStream, aborted: Arc<AtomicBool>) -> ShmIn {
        ShmIn { reader, socket, aborted, deadline: Instant::now() }
    }

    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Sleeps until the writer rings, the connection closes or `nap` passes.
    fn sleep(&self, nap: Duration) -> io::Result<()> {
        self.reader.set_waiting(true);
        // Written between the last look and the flag: no ring will come for it.
        let slept = if self.reader.ready() { Ok(()) } else { sleep_until_rung(&self.socket, nap) };
        self.reader.set_waiting(false);
        slept
    }
}

impl Read for ShmIn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let wait = Wait::until(self.deadline);
        loop {
            // Bytes the peer wrote before it died are still read, as from a socket.
            let n = self.reader.read_some(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if n > 0 {
                return Ok(n);
            }
            let went_on = wait.check(&self.aborted).and_then(|()| {
                if wait.busy() {
                    Ok(())
                } else {
                    self.sleep(SLEEP_MAX.min(wait.deadline.saturating_duration_since(Instant::now())))
                }
            });
            match went_on {
                Ok(()) => {}
                // The end of the stream, once the ring is drained.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted && !self.reader.ready() => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The sending end of a shared-memory link.
pub(crate) struct ShmOut {
    writer: shm::Writer,
    socket: TcpStream,
    aborted: Arc<AtomicBool>,
    timeout: Duration,
}

impl ShmOut {
    pub(crate) fn new(writer: shm::Writer, socket: TcpStream, aborted: Arc<AtomicBool>, timeout: Duration) -> ShmOut {
        ShmOut { writer, socket, aborted, timeout }
    }
}

impl ShmOut {
    /// Bytes a write takes now without waiting (zero for a corrupt ring, whose next
    /// write reports it).
    pub(crate) fn room(&self) -> usize {
        self.writer.free().unwrap_or(0)
    }
}

impl Write for ShmOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut wait = Wait::until(Instant::now() + self.timeout);
        loop {
            let n = self.writer.write_some(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if n > 0 {
                if self.writer.reader_waiting() {
                    self.ring();
                }
                return Ok(n);
            }
            let broken = |e: io::Error| match e.kind() {
                io::ErrorKind::ConnectionAborted => io::Error::new(io::ErrorKind::BrokenPipe, e),
                _ => e,
            };
            wait.check(&self.aborted).map_err(broken)?;
            if !wait.busy() {
                // The reader frees room without ringing: look again after a nap.
                std::thread::sleep(wait.nap(NAP_MAX));
                if is_closed(&self.socket) {
                    return Err(broken(closed()));
                }
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ShmOut {
    /// Wakes the sleeping reader: one byte on the connection. A full socket buffer holds
    /// rings enough already, and a closed connection is the reader's to notice.
    fn ring(&self) {
        use rustix::net::SendFlags;
        let _ = rustix::net::send(&self.socket, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }
}
