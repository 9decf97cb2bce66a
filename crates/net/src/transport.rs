//! Point-to-point transports between the ranks of a job: TCP between processes (with
//! shared-memory rings between ranks of one host, see [`crate::local`]), and an
//! in-process network for tests that can kill a rank at a chosen moment.
//!
//! Both carry [`Frame`]s and give every failure a bounded time to surface: a receive
//! waits until its deadline and then fails with [`CommError::Timeout`]; a peer whose
//! connection closes (or that was killed) fails with [`CommError::PeerLost`]; a peer that
//! sends a malformed or oversized frame fails with [`CommError::Protocol`]. Nothing
//! blocks forever, and nothing panics on bad input.
//!
//! Methods take `&self` so that a collective can send and receive at the same time from
//! two threads (a ring step sends to the right while it receives from the left).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::frame::{Frame, FrameError, read_frame_exact, read_frame_into, write_frame};
use crate::gate::{Gate, Limits};
use crate::handshake::{HandshakeError, handshake};
use crate::local::{ShmIn, ShmOut};

/// A communication failure, naming the peer.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The peer did not answer in time.
    #[error("rank {peer} did not answer within {waited:?}")]
    Timeout {
        /// The peer.
        peer: usize,
        /// How long we waited.
        waited: Duration,
    },
    /// The peer's connection closed or it died.
    #[error("lost rank {peer}: {reason}")]
    PeerLost {
        /// The peer.
        peer: usize,
        /// What happened.
        reason: String,
    },
    /// The peer broke the protocol (malformed, oversized or unexpected data).
    #[error("rank {peer} broke the protocol: {reason}")]
    Protocol {
        /// The peer.
        peer: usize,
        /// What it sent.
        reason: String,
    },
    /// Setting up the connections failed.
    #[error("cannot connect the job: {0}")]
    Setup(String),
    /// A peer answered and the handshake failed: this process does not hold the job's
    /// secret (or speaks another protocol version). Trying again cannot help, so whoever
    /// dials stops at the first refusal (see [`refused`]).
    #[error("{0}")]
    Refused(String),
    /// The job was aborted from outside the collective (the coordinator reported a lost
    /// member, or was lost itself).
    #[error("{0}")]
    Aborted(String),
}

/// Sends and receives frames between the ranks of a job.
pub trait Transport: Sync {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// Sends a frame to `to`.
    fn send(&self, to: usize, kind: u8, payload: &[u8]) -> Result<(), CommError>;
    /// Receives the next frame from `from`, waiting at most until `deadline`.
    fn recv(&self, from: usize, deadline: Instant) -> Result<Frame, CommError>;
    /// Like [`recv`](Transport::recv), into `payload` (reusing its allocation); returns
    /// the frame's kind.
    fn recv_into(&self, from: usize, deadline: Instant, payload: &mut Vec<u8>) -> Result<u8, CommError> {
        let f = self.recv(from, deadline)?;
        *payload = f.payload;
        Ok(f.kind)
    }
    /// Like [`recv`](Transport::recv), for a frame whose payload must be exactly
    /// `payload.len()` bytes, written straight into `payload`; returns the frame's kind. A
    /// frame of another length is a [`CommError::Protocol`] error, after which the link is
    /// of no further use (a stream transport is left inside that frame).
    fn recv_exact(&self, from: usize, deadline: Instant, payload: &mut [u8]) -> Result<u8, CommError> {
        let f = self.recv(from, deadline)?;
        if f.payload.len() != payload.len() {
            let e = FrameError::Length { got: f.payload.len(), expected: payload.len() };
            return Err(CommError::Protocol { peer: from, reason: e.to_string() });
        }
        payload.copy_from_slice(&f.payload);
        Ok(f.kind)
    }
    /// Bytes of frames (headers included) that a send to `to` takes now without waiting
    /// for `to` to read anything: what a ring of shared memory has free. Zero, the
    /// default, when the transport cannot tell.
    fn room(&self, _to: usize) -> usize {
        0
    }
}

/// One step of a collective that sends and receives: `send` and then `receive` on this
/// thread when `sends_fit` (every frame fits the links' free room now, so no send waits on
/// a receive), otherwise `send` on a thread of its own while this one receives, so that
/// ranks sending to each other never wait on each other. A receive failure is the one
/// returned when both fail: it names the silent or broken peer.
pub(crate) fn send_and_receive<R>(
    sends_fit: bool,
    send: impl FnOnce() -> Result<(), CommError> + Send,
    receive: impl FnOnce() -> Result<R, CommError>,
) -> Result<R, CommError> {
    if sends_fit {
        send()?;
        return receive();
    }
    let (sent, got) = std::thread::scope(|s| {
        let sender = s.spawn(send);
        let got = receive();
        (sender.join().unwrap_or_else(|_| Err(CommError::Setup("sender thread panicked".into()))), got)
    });
    let got = got?;
    sent?;
    Ok(got)
}

fn frame_error(peer: usize, waited: Duration, e: FrameError) -> CommError {
    match e {
        FrameError::Timeout => CommError::Timeout { peer, waited },
        FrameError::Closed | FrameError::Truncated { .. } | FrameError::Io(_) => {
            CommError::PeerLost { peer, reason: e.to_string() }
        }
        FrameError::TooLarge { .. } | FrameError::Empty | FrameError::Length { .. } => {
            CommError::Protocol { peer, reason: e.to_string() }
        }
    }
}

/// One rank's end of an in-process network.
pub struct MemEndpoint {
    rank: usize,
    world: usize,
    to: Vec<Mutex<Option<Sender<Frame>>>>,
    from: Vec<Mutex<Receiver<Frame>>>,
}

/// Builds a fully connected in-process network of `world` ranks.
pub fn mem_network(world: usize) -> Vec<MemEndpoint> {
    let mut senders: Vec<Vec<Option<Sender<Frame>>>> = (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    let mut receivers: Vec<Vec<Option<Receiver<Frame>>>> =
        (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    for a in 0..world {
        for b in 0..world {
            let (tx, rx) = channel();
            senders[a][b] = Some(tx); // a -> b
            receivers[b][a] = Some(rx); // b receives from a
        }
    }
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| MemEndpoint {
            rank,
            world,
            to: to.into_iter().map(Mutex::new).collect(),
            from: from.into_iter().map(|r| Mutex::new(r.expect("filled above"))).collect(),
        })
        .collect()
}

impl MemEndpoint {
    /// Simulates this rank dying: its outgoing links close, so peers waiting on it fail
    /// with [`CommError::PeerLost`].
    pub fn kill(&self) {
        for s in &self.to {
            *s.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl Transport for MemEndpoint {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn send(&self, to: usize, kind: u8, payload: &[u8]) -> Result<(), CommError> {
        let guard = self.to[to].lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else {
            return Err(CommError::PeerLost { peer: self.rank, reason: "this rank was killed".into() });
        };
        tx.send(Frame { kind, payload: payload.to_vec() })
            .map_err(|_| CommError::PeerLost { peer: to, reason: "its endpoint is gone".into() })
    }
    fn recv(&self, from: usize, deadline: Instant) -> Result<Frame, CommError> {
        let rx = self.from[from].lock().unwrap_or_else(|e| e.into_inner());
        let waited = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(waited) {
            Ok(f) => Ok(f),
            Err(RecvTimeoutError::Timeout) => Err(CommError::Timeout { peer: from, waited }),
            Err(RecvTimeoutError::Disconnected) => {
                Err(CommError::PeerLost { peer: from, reason: "the link closed (the rank died)".into() })
            }
        }
    }
}

/// Settings of a TCP mesh.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// The job's shared secret.
    pub secret: Vec<u8>,
    /// Largest frame accepted.
    pub max_frame: u32,
    /// How long to keep trying to reach a peer while the job starts.
    pub connect_timeout: Duration,
    /// Bound on a single write.
    pub write_timeout: Duration,
    /// When a peer is lost, how long to wait for an [`abort`](TcpMesh::abort) that
    /// explains it before failing. With a coordinator that reports lost members, this
    /// makes every survivor name the member that failed first, rather than a neighbour
    /// that merely aborted sooner. Zero fails at once.
    pub abort_grace: Duration,
    /// Where ranks of one host make the shared-memory rings that carry their frames
    /// (normally `/dev/shm`, [`crate::local::default_dir`]); `None` keeps every pair on
    /// TCP.
    pub shared_memory: Option<PathBuf>,
}

/// How frames leave for one peer.
enum Outbound {
    Tcp(TcpStream),
    Shm(ShmOut),
}

impl Write for Outbound {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Outbound::Tcp(s) => s.write(buf),
            Outbound::Shm(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Outbound::Tcp(s) => s.write_vectored(bufs),
            Outbound::Shm(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Outbound::Tcp(s) => s.flush(),
            Outbound::Shm(s) => s.flush(),
        }
    }
}

/// How frames arrive from one peer.
enum Inbound {
    Tcp(TcpStream),
    Shm(ShmIn),
}

impl Inbound {
    /// Makes reads fail with a timeout at `deadline`.
    fn set_deadline(&mut self, deadline: Instant) -> std::io::Result<()> {
        match self {
            // (A socket refuses a zero timeout: a deadline that passed since the caller
            // looked gets the shortest one instead, and times out.)
            Inbound::Tcp(s) => {
                let left = deadline.saturating_duration_since(Instant::now());
                s.set_read_timeout(Some(left.max(Duration::from_micros(1))))
            }
            Inbound::Shm(s) => {
                s.set_deadline(deadline);
                Ok(())
            }
        }
    }
}

impl Read for Inbound {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Inbound::Tcp(s) => s.read(buf),
            Inbound::Shm(s) => s.read(buf),
        }
    }
}

/// A TCP connection to every other rank, authenticated by the job secret.
pub struct TcpMesh {
    rank: usize,
    world: usize,
    max_frame: u32,
    writers: HashMap<usize, Mutex<Outbound>>,
    readers: HashMap<usize, Mutex<Inbound>>,
    /// The peers reached through shared memory, in order.
    local: Vec<usize>,
    /// Handles used only to shut the sockets down, which wakes blocked reads and writes.
    wake: Vec<TcpStream>,
    aborted: Mutex<Option<String>>,
    /// Set with `aborted`, for the shared-memory links' waits to look at without a lock.
    abort_flag: Arc<AtomicBool>,
    abort_signal: Condvar,
    abort_grace: Duration,
}

impl TcpMesh {
    /// Connects rank `rank` to every other rank: it accepts connections from higher ranks
    /// on `listener` and connects to lower ranks at `addrs[j]`. Every connection is
    /// authenticated before use.
    pub fn connect(
        rank: usize,
        listener: TcpListener,
        addrs: &[SocketAddr],
        config: &TcpConfig,
    ) -> Result<Self, CommError> {
        let world = addrs.len();
        let setup = |what: &str, e: &dyn std::fmt::Display| CommError::Setup(format!("{what}: {e}"));
        let mut streams = HashMap::new();
        let deadline = Instant::now() + config.connect_timeout;
        for (peer, addr) in addrs.iter().enumerate().take(rank) {
            let configure = |s: &TcpStream| prepare(s, config);
            let (stream, got) = match dial(*addr, &config.secret, rank as u32, deadline, &configure) {
                Ok(x) => x,
                Err(DialError::Unreachable(e)) => {
                    return Err(setup(&format!("cannot reach rank {peer} at {addr}"), &e));
                }
                Err(DialError::Refused(e)) => return Err(handshake_error(peer, e)),
            };
            if got as usize != peer {
                return Err(CommError::Protocol { peer, reason: format!("answered as rank {got}") });
            }
            streams.insert(peer, stream);
        }
        // Higher ranks connect to this one; the gate admits them concurrently, so that
        // strangers holding connections to this port delay nobody.
        let tcp = config.clone();
        let limits = Limits { deadline: config.connect_timeout, ..Limits::default() };
        let gate = Gate::open(listener, limits, move |stream| {
            prepare(stream, &tcp).map_err(|e| format!("socket options: {e}"))?;
            let peer = handshake(stream, &tcp.secret, rank as u32).map_err(|e| e.to_string())? as usize;
            if peer <= rank || peer >= world {
                return Err(format!("the peer claims rank {peer}, not one of {}..{world}", rank + 1));
            }
            Ok(peer)
        })
        .map_err(|e| setup("listener", &e))?;
        while streams.len() < world - 1 {
            let Some(a) = gate.next(deadline) else {
                let missing: Vec<usize> = (rank + 1..world).filter(|p| !streams.contains_key(p)).collect();
                return Err(setup("accept", &format!("ranks {missing:?} did not connect in time")));
            };
            match streams.entry(a.value) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(a.stream);
                }
                std::collections::hash_map::Entry::Occupied(_) => {
                    tracing::warn!(from = %a.from, peer = a.value, "refused a second connection claiming the same rank");
                }
            }
        }
        TcpMesh::from_streams(rank, world, streams, config)
    }

    /// A mesh over connections already made and authenticated: `streams` holds one per
    /// other rank of `world`, keyed by rank. Pairs on one host then agree, over those
    /// connections, to carry their frames through shared memory ([`crate::local`]).
    pub fn from_streams(
        rank: usize,
        world: usize,
        streams: HashMap<usize, TcpStream>,
        config: &TcpConfig,
    ) -> Result<Self, CommError> {
        let setup = |what: &str, e: &dyn std::fmt::Display| CommError::Setup(format!("{what}: {e}"));
        if streams.len() + 1 != world || streams.contains_key(&rank) || streams.keys().any(|&p| p >= world) {
            return Err(CommError::Setup(format!("connections to ranks {:?} do not make a world of {world}", {
                let mut k: Vec<_> = streams.keys().collect();
                k.sort();
                k
            })));
        }
        let mut streams: Vec<(usize, TcpStream)> = streams.into_iter().collect();
        streams.sort_by_key(|(peer, _)| *peer);
        for (_, s) in &streams {
            prepare(s, config).map_err(|e| setup("socket options", &e))?;
        }
        let rings = crate::local::negotiate(rank, &mut streams, &config.secret, config.shared_memory.as_deref())
            .map_err(|e| setup("agreeing on the links", &e))?;
        let abort_flag = Arc::new(AtomicBool::new(false));
        let mut writers = HashMap::new();
        let mut readers = HashMap::new();
        let mut wake = Vec::new();
        let mut local = Vec::new();
        let mut rings: HashMap<usize, crate::local::Rings> = rings.into_iter().collect();
        for (peer, s) in streams {
            let clone = || s.try_clone().map_err(|e| setup("clone socket", &e));
            wake.push(clone()?);
            let (out, inb) = match rings.remove(&peer) {
                Some(r) => {
                    local.push(peer);
                    let flag = &abort_flag;
                    let out = ShmOut::new(r.writer, clone()?, Arc::clone(flag), config.write_timeout);
                    (Outbound::Shm(out), Inbound::Shm(ShmIn::new(r.reader, clone()?, Arc::clone(flag))))
                }
                None => (Outbound::Tcp(clone()?), Inbound::Tcp(s)),
            };
            writers.insert(peer, Mutex::new(out));
            readers.insert(peer, Mutex::new(inb));
        }
        if !local.is_empty() {
            tracing::debug!(rank, peers = ?local, "frames to ranks of this host go through shared memory");
        }
        Ok(TcpMesh {
            rank,
            world,
            max_frame: config.max_frame,
            writers,
            readers,
            local,
            wake,
            aborted: Mutex::new(None),
            abort_flag,
            abort_signal: Condvar::new(),
            abort_grace: config.abort_grace,
        })
    }

    /// Aborts the job on this rank: every pending and future send or receive fails at
    /// once with [`CommError::Aborted`] carrying `reason`. Safe to call from any thread,
    /// while collectives are blocked; the first reason wins.
    pub fn abort(&self, reason: String) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        if aborted.is_none() {
            *aborted = Some(reason);
        }
        self.abort_flag.store(true, Ordering::Relaxed);
        drop(aborted);
        self.abort_signal.notify_all();
        for s in &self.wake {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The peers whose frames go through shared memory (on this host), in order.
    pub fn shared_memory_peers(&self) -> &[usize] {
        &self.local
    }

    /// Why the job was aborted, if it was.
    pub fn aborted(&self) -> Option<String> {
        self.aborted.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// An abort explains any failure that follows it; a lost peer waits the grace for one.
    fn explain(&self, e: CommError) -> CommError {
        let aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        let aborted = if aborted.is_none() && matches!(e, CommError::PeerLost { .. }) && !self.abort_grace.is_zero() {
            self.abort_signal
                .wait_timeout_while(aborted, self.abort_grace, |a| a.is_none())
                .unwrap_or_else(|e| e.into_inner())
                .0
        } else {
            aborted
        };
        aborted.clone().map_or(e, CommError::Aborted)
    }
}

fn prepare(s: &TcpStream, config: &TcpConfig) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    keepalive(s)?;
    s.set_write_timeout(Some(config.write_timeout))?;
    // The handshake itself must not hang on a silent peer.
    s.set_read_timeout(Some(config.connect_timeout))
}

/// TCP keepalive: an idle connection whose peer host vanished (power loss, a cut link,
/// no RST ever sent) is probed after 5 s and closed after 3 unanswered probes 1 s apart,
/// so that a blocked read fails even outside the collectives' own deadlines.
pub fn keepalive(s: &TcpStream) -> std::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(s, true)?;
    sockopt::set_tcp_keepidle(s, Duration::from_secs(5))?;
    sockopt::set_tcp_keepintvl(s, Duration::from_secs(1))?;
    sockopt::set_tcp_keepcnt(s, 3)?;
    Ok(())
}

/// Why [`dial`] failed.
#[derive(Debug)]
pub enum DialError {
    /// The peer could not be reached, or closed the connection, until the deadline (the
    /// last reason).
    Unreachable(String),
    /// The peer answered, and the handshake failed: a wrong secret, another version.
    Refused(HandshakeError),
}

/// Connects to `addr`, configures the socket and runs the handshake as `my_rank`; returns
/// the connection and the peer's rank. A peer not listening yet, or one that closes the
/// connection (a gate shedding it while strangers crowd the port), is tried again until
/// `deadline`; a handshake that the peer fails (a wrong secret) is an error at once,
/// [`DialError::Refused`], after one attempt: a caller that loops must not dial again
/// for it (see [`refused`]), or it floods the peer's port and log.
pub fn dial(
    addr: SocketAddr,
    secret: &[u8],
    my_rank: u32,
    deadline: Instant,
    configure: &dyn Fn(&TcpStream) -> std::io::Result<()>,
) -> Result<(TcpStream, u32), DialError> {
    loop {
        let reason = match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(mut s) => match configure(&s)
                .map_err(|e| HandshakeError::Frame(e.into()))
                .and_then(|()| handshake(&mut s, secret, my_rank))
            {
                Ok(peer) => return Ok((s, peer)),
                Err(HandshakeError::Frame(e)) => e.to_string(),
                Err(e) => return Err(DialError::Refused(e)),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(DialError::Unreachable(reason));
        }
        tracing::debug!(%addr, "not reachable yet, retrying: {reason}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error of a handshake that `who` ("the coordinator", say) at `addr` answered and
/// that failed, for the side that dialled: [`CommError::Refused`], which names the secret
/// when the proofs did not match. (The dialler cannot tell its own wrong secret from a
/// peer of another job: either way the two do not share the secret.)
pub fn refused(who: &str, addr: SocketAddr, e: &HandshakeError) -> CommError {
    CommError::Refused(match e {
        HandshakeError::BadProof(_) => format!(
            "the secret does not match the job's: {who} at {addr} holds another than this process's \
             STEADFAST_SECRET (give the secret the job was started with)"
        ),
        other => format!("{who} at {addr} refused the handshake: {other}"),
    })
}

fn handshake_error(peer: usize, e: HandshakeError) -> CommError {
    match e {
        HandshakeError::Frame(f) => frame_error(peer, Duration::ZERO, f),
        other => CommError::Protocol { peer, reason: other.to_string() },
    }
}

impl Transport for TcpMesh {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn send(&self, to: usize, kind: u8, payload: &[u8]) -> Result<(), CommError> {
        self.send_frame(to, kind, payload).map_err(|e| self.explain(e))
    }
    fn recv(&self, from: usize, deadline: Instant) -> Result<Frame, CommError> {
        let mut payload = Vec::new();
        let kind = self.recv_into(from, deadline, &mut payload)?;
        Ok(Frame { kind, payload })
    }
    fn recv_into(&self, from: usize, deadline: Instant, payload: &mut Vec<u8>) -> Result<u8, CommError> {
        self.recv_frame(from, deadline, |s, max| read_frame_into(s, max, payload)).map_err(|e| self.explain(e))
    }
    fn recv_exact(&self, from: usize, deadline: Instant, payload: &mut [u8]) -> Result<u8, CommError> {
        self.recv_frame(from, deadline, |s, max| read_frame_exact(s, max, payload)).map_err(|e| self.explain(e))
    }
    fn room(&self, to: usize) -> usize {
        match self.writers.get(&to).map(|w| w.lock().unwrap_or_else(|e| e.into_inner())) {
            Some(w) => match &*w {
                Outbound::Shm(s) => s.room(),
                Outbound::Tcp(_) => 0,
            },
            None => 0,
        }
    }
}

impl TcpMesh {
    fn send_frame(&self, to: usize, kind: u8, payload: &[u8]) -> Result<(), CommError> {
        if let Some(reason) = self.aborted() {
            return Err(CommError::Aborted(reason));
        }
        let mut s = self
            .writers
            .get(&to)
            .ok_or_else(|| CommError::Setup(format!("no connection to rank {to}")))?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        write_frame(&mut *s, kind, payload).map_err(|e| frame_error(to, Duration::ZERO, e))?;
        s.flush().map_err(|e| CommError::PeerLost { peer: to, reason: e.to_string() })
    }
    /// Reads the next frame from `from` with `read(stream, max_frame)`, by `deadline`.
    fn recv_frame(
        &self,
        from: usize,
        deadline: Instant,
        read: impl FnOnce(&mut Inbound, u32) -> Result<u8, FrameError>,
    ) -> Result<u8, CommError> {
        if let Some(reason) = self.aborted() {
            return Err(CommError::Aborted(reason));
        }
        let mut s = self
            .readers
            .get(&from)
            .ok_or_else(|| CommError::Setup(format!("no connection to rank {from}")))?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let waited = deadline.saturating_duration_since(Instant::now());
        if waited.is_zero() {
            return Err(CommError::Timeout { peer: from, waited });
        }
        s.set_deadline(deadline).map_err(|e| CommError::PeerLost { peer: from, reason: e.to_string() })?;
        read(&mut s, self.max_frame).map_err(|e| frame_error(from, waited, e))
    }
}
