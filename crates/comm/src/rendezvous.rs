//! Rendezvous: how the workers of a job find each other.
//!
//! The coordinator (embedded in `steadfast launch`, or standalone) listens on a known
//! address. Each worker binds its own listener, connects to the coordinator, proves it
//! knows the job secret, and announces `(rank, listening address)`. When all `world` ranks
//! have joined, with distinct ranks, the coordinator sends every worker the heartbeat
//! timeout and the full address table, and the workers build their
//! [`TcpMesh`](crate::transport::TcpMesh). A worker that never shows up makes the
//! rendezvous fail at its deadline on every side.
//!
//! The connections to the coordinator stay open afterwards: they carry the heartbeats of
//! [`supervisor`](crate::supervisor).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::frame::{read_frame, write_frame};
use crate::gate::{Gate, Limits};
use crate::handshake::handshake;
use crate::transport::{CommError, DialError, dial};

/// The rank the coordinator uses in handshakes.
pub const COORDINATOR_RANK: u32 = u32::MAX;
const KIND_JOIN: u8 = 0xB1;
const KIND_TABLE: u8 = 0xB2;

fn setup(what: impl std::fmt::Display) -> CommError {
    CommError::Setup(what.to_string())
}

/// A job as the coordinator formed it.
#[derive(Debug)]
pub struct Formed {
    /// Every rank's listening address.
    pub table: Vec<SocketAddr>,
    /// The connection to each rank, by rank.
    pub streams: Vec<TcpStream>,
}

/// A job as a worker joined it.
#[derive(Debug)]
pub struct Joined {
    /// Every rank's listening address.
    pub table: Vec<SocketAddr>,
    /// The connection to the coordinator.
    pub coordinator: TcpStream,
    /// The heartbeat timeout the coordinator applies.
    pub heartbeat_timeout: Duration,
}

/// Coordinator side: waits for `world` workers, sends all of them the address table and
/// the `heartbeat_timeout`, and returns the formed job.
pub fn serve(
    listener: &TcpListener,
    world: usize,
    secret: &[u8],
    timeout: Duration,
    heartbeat_timeout: Duration,
) -> Result<Formed, CommError> {
    serve_unless(listener, world, secret, timeout, heartbeat_timeout, &AtomicBool::new(false))
}

/// [`serve`], giving up as soon as `abandon` is set (within a tenth of a second): the
/// launcher sets it when the workers it started have all exited, so that a job that can
/// no longer form (a misspelt flag fails every worker at once) ends at once instead of
/// at the rendezvous timeout.
pub fn serve_unless(
    listener: &TcpListener,
    world: usize,
    secret: &[u8],
    timeout: Duration,
    heartbeat_timeout: Duration,
    abandon: &AtomicBool,
) -> Result<Formed, CommError> {
    let deadline = Instant::now() + timeout;
    let secret = secret.to_vec();
    // Handshakes run concurrently behind the gate: a connection that says nothing, or
    // garbage, delays nobody.
    let gate = Gate::open(listener.try_clone().map_err(setup)?, Limits::default(), move |stream| {
        crate::transport::keepalive(stream).map_err(|e| e.to_string())?;
        let rank = handshake(stream, &secret, COORDINATOR_RANK).map_err(|e| e.to_string())? as usize;
        let f = read_frame(stream, 1024).map_err(|e| e.to_string())?;
        let addr: SocketAddr = std::str::from_utf8(&f.payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|_| f.kind == KIND_JOIN)
            .ok_or("malformed join message")?;
        if rank >= world {
            return Err(format!("rank {rank} is outside a world of {world}"));
        }
        Ok((rank, addr))
    })
    .map_err(setup)?;
    let mut joined: Vec<Option<(SocketAddr, TcpStream)>> = (0..world).map(|_| None).collect();
    while joined.iter().any(Option::is_none) {
        let missing = || (0..world).filter(|&r| joined[r].is_none()).collect::<Vec<usize>>();
        if abandon.load(Ordering::Relaxed) {
            return Err(setup(format!("abandoned before ranks {:?} joined", missing())));
        }
        let Some(a) = gate.next(deadline.min(Instant::now() + Duration::from_millis(100))) else {
            if Instant::now() >= deadline {
                return Err(setup(format!("ranks {:?} did not join within {timeout:?}", missing())));
            }
            continue;
        };
        let (rank, addr) = a.value;
        if joined[rank].is_none() {
            joined[rank] = Some((addr, a.stream));
        } else {
            tracing::warn!(from = %a.from, rank, "refused a second worker claiming the same rank");
        }
    }
    let (table, mut streams): (Vec<SocketAddr>, Vec<TcpStream>) = joined.into_iter().flatten().unzip();
    let addrs = table.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let text = format!("{}\n{addrs}", heartbeat_timeout.as_millis().max(1));
    for stream in &mut streams {
        write_frame(stream, KIND_TABLE, text.as_bytes()).map_err(setup)?;
        stream.flush().map_err(setup)?;
    }
    Ok(Formed { table, streams })
}

/// Worker side: joins the job at `coordinator` as `rank` listening on `my_addr`.
pub fn join(
    coordinator: SocketAddr,
    rank: usize,
    my_addr: SocketAddr,
    secret: &[u8],
    timeout: Duration,
) -> Result<Joined, CommError> {
    let deadline = Instant::now() + timeout;
    // A coordinator not yet listening, or one that sheds connections while strangers
    // crowd its gate, is tried again until the deadline; a wrong secret fails at once.
    let configure = |s: &TcpStream| {
        crate::transport::keepalive(s)?;
        s.set_read_timeout(Some(timeout))
    };
    let (mut stream, who) = match dial(coordinator, secret, rank as u32, deadline, &configure) {
        Ok(x) => x,
        Err(DialError::Unreachable(e)) => {
            return Err(setup(format!("cannot reach the coordinator at {coordinator}: {e}")));
        }
        Err(DialError::Refused(e)) => return Err(setup(format!("the coordinator at {coordinator}: {e}"))),
    };
    if who != COORDINATOR_RANK {
        return Err(setup(format!("{coordinator} answered as rank {who}, not as a coordinator")));
    }
    write_frame(&mut stream, KIND_JOIN, my_addr.to_string().as_bytes()).map_err(setup)?;
    let f = read_frame(&mut stream, 1 << 20).map_err(|e| setup(format!("waiting for the other ranks: {e}")))?;
    if f.kind != KIND_TABLE {
        return Err(setup("the coordinator sent something other than the address table"));
    }
    let text = std::str::from_utf8(&f.payload).map_err(setup)?;
    let (millis, addrs) = text.split_once('\n').ok_or_else(|| setup("malformed address table"))?;
    let millis: u64 = millis.parse().map_err(|e| setup(format!("bad heartbeat timeout {millis:?}: {e}")))?;
    let table = addrs
        .split(',')
        .map(|a| a.parse().map_err(|e| setup(format!("bad address {a:?}: {e}"))))
        .collect::<Result<Vec<SocketAddr>, CommError>>()?;
    Ok(Joined { table, coordinator: stream, heartbeat_timeout: Duration::from_millis(millis) })
}

/// The address of this host's interface that reaches `coordinator` (the one its route
/// goes out of): where a worker listens by default, so that its peers on other hosts can
/// dial it. Loopback for a coordinator on loopback. No packet is sent.
pub fn local_address_towards(coordinator: SocketAddr) -> std::io::Result<std::net::IpAddr> {
    let any: SocketAddr = if coordinator.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("literal");
    let probe = std::net::UdpSocket::bind(any)?;
    probe.connect(coordinator)?;
    Ok(probe.local_addr()?.ip())
}
