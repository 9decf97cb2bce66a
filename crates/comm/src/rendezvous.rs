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
//!
//! **Members by place.** A job that goes on without some of its workers (a pipeline that
//! reroutes a lost stage's work to its peers) forms again from the survivors alone: each
//! worker still announces its place at the start (its *slot*), the coordinator expects
//! the surviving slots ([`serve_members`]), and ranks are the slots' order, so that the
//! ranks stay `0..n`. The table carries the slots; a worker's rank is its slot's index.

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
    /// Every rank's slot (its place at the start of the job), by rank.
    pub slots: Vec<usize>,
    /// Every rank's listening address.
    pub table: Vec<SocketAddr>,
    /// The connection to each rank, by rank.
    pub streams: Vec<TcpStream>,
}

/// A job as a worker joined it.
#[derive(Debug)]
pub struct Joined {
    /// This worker's rank: its slot's index in `slots`.
    pub rank: usize,
    /// Every rank's slot, by rank (`0..n` unless workers were left out).
    pub slots: Vec<usize>,
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
    let slots: Vec<usize> = (0..world).collect();
    serve_members(listener, (&slots, &|_| false), secret, (timeout, heartbeat_timeout), abandon)
}

/// [`serve_unless`] for the workers of `slots` (distinct, in increasing order), which
/// become ranks `0..n` in that order (see the module's documentation). A slot for which
/// `left_out` becomes true while the others join (its worker exited) is no longer
/// waited for, nor made a member.
pub fn serve_members(
    listener: &TcpListener,
    (slots, left_out): (&[usize], &dyn Fn(usize) -> bool),
    secret: &[u8],
    (timeout, heartbeat_timeout): (Duration, Duration),
    abandon: &AtomicBool,
) -> Result<Formed, CommError> {
    if slots.windows(2).any(|w| w[0] >= w[1]) {
        return Err(setup(format!("the slots {slots:?} are not distinct and in order")));
    }
    let world = slots.len();
    let expected = slots.to_vec();
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
        let index = expected.binary_search(&rank);
        index.map(|i| (i, addr)).map_err(|_| format!("rank {rank} is not one of the workers expected, {expected:?}"))
    })
    .map_err(setup)?;
    let mut joined: Vec<Option<(SocketAddr, TcpStream)>> = (0..world).map(|_| None).collect();
    let awaited = |joined: &[Option<_>]| (0..world).any(|r| joined[r].is_none() && !left_out(slots[r]));
    while awaited(&joined) {
        let missing =
            || (0..world).filter(|&r| joined[r].is_none() && !left_out(slots[r])).map(|r| slots[r]).collect::<Vec<_>>();
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
            tracing::warn!(from = %a.from, slot = slots[rank], "refused a second worker claiming the same rank");
        }
    }
    let (mut members, mut table, mut streams) = (Vec::new(), Vec::new(), Vec::new());
    for (r, j) in joined.into_iter().enumerate() {
        if let Some((addr, stream)) = j.filter(|_| !left_out(slots[r])) {
            members.push(slots[r]);
            table.push(addr);
            streams.push(stream);
        }
    }
    let join = |items: Vec<String>| items.join(",");
    let addrs = join(table.iter().map(|a| a.to_string()).collect());
    let slots = members;
    let members = join(slots.iter().map(|s| s.to_string()).collect());
    let text = format!("{}\n{addrs}\n{members}", heartbeat_timeout.as_millis().max(1));
    for stream in &mut streams {
        write_frame(stream, KIND_TABLE, text.as_bytes()).map_err(setup)?;
        stream.flush().map_err(setup)?;
    }
    Ok(Formed { slots, table, streams })
}

/// Worker side: joins the job at `coordinator` as the worker of slot `rank` (its rank at
/// the start) listening on `my_addr`.
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
        Err(DialError::Refused(e)) => return Err(crate::transport::refused("the coordinator", coordinator, &e)),
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
    let mut lines = text.split('\n');
    let (Some(millis), Some(addrs), Some(members), None) = (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err(setup("malformed address table"));
    };
    let millis: u64 = millis.parse().map_err(|e| setup(format!("bad heartbeat timeout {millis:?}: {e}")))?;
    let table = addrs
        .split(',')
        .map(|a| a.parse().map_err(|e| setup(format!("bad address {a:?}: {e}"))))
        .collect::<Result<Vec<SocketAddr>, CommError>>()?;
    let slots = members
        .split(',')
        .map(|s| s.parse().map_err(|e| setup(format!("bad slot {s:?}: {e}"))))
        .collect::<Result<Vec<usize>, CommError>>()?;
    let me = slots.iter().position(|&s| s == rank);
    let Some(me) = me.filter(|_| slots.len() == table.len()) else {
        return Err(setup(format!(
            "the table's members {slots:?} do not match its addresses, or leave out slot {rank}"
        )));
    };
    Ok(Joined { rank: me, slots, table, coordinator: stream, heartbeat_timeout: Duration::from_millis(millis) })
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
