//! Heartbeats over the coordinator connections: the socket shell around
//! [`membership`](crate::membership).
//!
//! After the rendezvous every worker keeps its connection to the coordinator, and both
//! ends send a `PING` frame every quarter of the heartbeat timeout.
//!
//! - The coordinator ([`supervise`]) runs one reader thread per worker, which turns
//!   frames and closed connections into messages for a single loop that owns the
//!   [`Membership`]. When a member is lost, every surviving member receives a `LOST`
//!   frame naming it. The loop ends when no member is alive.
//! - A worker ([`Heartbeat`]) sends its pings from one thread and reads the coordinator's
//!   frames in another. A `LOST` frame, or a coordinator silent for the timeout, becomes
//!   a [`Notice`] for the training loop, which typically aborts its transport so that a
//!   blocked collective fails at once instead of at its own deadline.
//! - A worker that finishes says `BYE` ([`Heartbeat::finish`]); one that drops its
//!   connection without it (it crashed, or returned an error) is lost.
//!
//! This catches what a collective's deadline alone catches late or never: a worker that
//! is stopped or partitioned while its peers compute, and a worker that fails outside a
//! collective.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::awake::AwakeClock;
use crate::frame::{FrameError, read_frame, write_frame};
use crate::membership::{Lost, Membership};

const KIND_PING: u8 = 0xB3;
const KIND_BYE: u8 = 0xB4;
const KIND_LOST: u8 = 0xB5;
const MAX_CONTROL_FRAME: u32 = 4096;

/// The interval between pings for a heartbeat timeout.
pub fn ping_interval(timeout: Duration) -> Duration {
    (timeout / 4).max(Duration::from_millis(5))
}

enum Signal {
    Frame(usize),
    Closed { rank: usize, finished: bool },
}

/// Coordinator side: supervises the members connected by `streams` (indexed by rank)
/// until none is alive, calling `on_event` for each loss. Returns the final membership.
pub fn supervise(streams: Vec<TcpStream>, timeout: Duration, on_event: &mut dyn FnMut(&Lost)) -> Membership {
    supervise_rounds(streams, timeout, on_event, false)
}

/// [`supervise`] until every member finished or one is lost: then the survivors are told
/// of the loss and the connections are closed, for a job whose members meet again
/// (a pipeline job that goes on with a replacement).
pub fn supervise_until_loss(streams: Vec<TcpStream>, timeout: Duration, on_event: &mut dyn FnMut(&Lost)) -> Membership {
    supervise_rounds(streams, timeout, on_event, true)
}

fn supervise_rounds(
    streams: Vec<TcpStream>,
    timeout: Duration,
    on_event: &mut dyn FnMut(&Lost),
    until_loss: bool,
) -> Membership {
    let interval = ping_interval(timeout);
    let (tx, rx) = mpsc::channel();
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for (rank, stream) in streams.iter().enumerate() {
        let reader = stream.try_clone();
        let _ = stream.set_write_timeout(Some(interval));
        writers.push(stream.try_clone().ok());
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let Ok(mut reader) = reader else {
                let _ = tx.send(Signal::Closed { rank, finished: false });
                return;
            };
            let _ = reader.set_read_timeout(Some(interval));
            loop {
                match read_frame(&mut reader, MAX_CONTROL_FRAME) {
                    Ok(f) if f.kind == KIND_BYE => {
                        let _ = tx.send(Signal::Closed { rank, finished: true });
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Signal::Frame(rank)).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Timeout) => {}
                    Err(_) => {
                        let _ = tx.send(Signal::Closed { rank, finished: false });
                        return;
                    }
                }
            }
        }));
    }
    drop(tx);

    let mut membership = Membership::new(streams.len(), timeout, Instant::now());
    let mut next_ping = Instant::now();
    // The loop runs at least once an interval; a longer gap is time it was not running.
    let mut awake = AwakeClock::new(2 * interval);
    awake.observe(next_ping);
    let mut lost_any = false;
    while !(membership.is_over() || until_loss && lost_any) {
        let received = rx.recv_timeout(interval);
        // Looked at after the wait, before any input is handled (see `AwakeClock`).
        if let Some(paused) = awake.pause() {
            membership.paused(paused);
        }
        let mut events = match received {
            Ok(Signal::Frame(rank)) => {
                membership.heartbeat(rank, Instant::now());
                Vec::new()
            }
            Ok(Signal::Closed { rank, finished }) => membership.left(rank, finished),
            Err(RecvTimeoutError::Timeout) => Vec::new(),
            // Every reader has ended: whoever is still alive can no longer be heard.
            Err(RecvTimeoutError::Disconnected) => {
                membership.alive().into_iter().flat_map(|r| membership.left(r, false)).collect()
            }
        };
        events.extend(membership.tick(Instant::now()));
        lost_any |= !events.is_empty();
        for event in &events {
            on_event(event);
            let Lost { rank, reason } = event;
            let text = format!("{rank}\n{reason}");
            for r in membership.alive() {
                if let Some(w) = writers[r].as_mut() {
                    let _ = write_frame(w, KIND_LOST, text.as_bytes());
                }
            }
        }
        if Instant::now() >= next_ping {
            for r in membership.alive() {
                if let Some(w) = writers[r].as_mut() {
                    let _ = write_frame(w, KIND_PING, &[]);
                }
            }
            next_ping = Instant::now() + interval;
        }
    }
    for s in &streams {
        let _ = s.shutdown(Shutdown::Both);
    }
    for r in readers {
        let _ = r.join();
    }
    membership
}

/// What the coordinator connection tells a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The coordinator declared a member lost.
    PeerLost {
        /// Its rank.
        rank: usize,
        /// Why, as the coordinator put it.
        reason: String,
    },
    /// The coordinator itself is gone or silent.
    CoordinatorLost(String),
    /// A member's lease in etcd expired: its keep-alives stopped (a job that meets in
    /// etcd, [`crate::etcd`]).
    LeaseExpired {
        /// Its rank.
        rank: usize,
    },
    /// This worker's own lease in etcd is gone: the others count it lost.
    OwnLeaseLost(String),
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::PeerLost { rank, reason } => {
                write!(f, "rank {rank} was lost: {reason} (reported by the coordinator)")
            }
            Notice::CoordinatorLost(why) => write!(f, "lost the coordinator: {why}"),
            Notice::LeaseExpired { rank } => {
                write!(f, "rank {rank} was lost: its lease in etcd expired (its keep-alives stopped)")
            }
            Notice::OwnLeaseLost(why) => write!(f, "this worker's lease in etcd is gone: {why}"),
        }
    }
}

/// A worker's heartbeat: pings the coordinator and listens for its notices.
pub struct Heartbeat {
    stream: TcpStream,
    stop: Option<mpsc::Sender<()>>,
    pinger: Option<JoinHandle<()>>,
    listener: Option<JoinHandle<()>>,
    stopping: Arc<Mutex<bool>>,
}

impl Heartbeat {
    /// Starts pinging over `stream` (the connection to the coordinator) and calls
    /// `on_notice` (from a background thread) for the first notice that arrives.
    pub fn start(
        stream: TcpStream,
        timeout: Duration,
        on_notice: impl Fn(Notice) + Send + 'static,
    ) -> std::io::Result<Self> {
        let interval = ping_interval(timeout);
        stream.set_write_timeout(Some(timeout))?;
        let mut pinger_stream = stream.try_clone()?;
        let mut reader = stream.try_clone()?;
        reader.set_read_timeout(Some(timeout))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let pinger = std::thread::spawn(move || {
            // The channel is both the timer and the stop signal.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                if write_frame(&mut pinger_stream, KIND_PING, &[]).is_err() {
                    return;
                }
            }
        });
        let stopping = Arc::new(Mutex::new(false));
        let stopping_reader = Arc::clone(&stopping);
        let listener = std::thread::spawn(move || {
            let notice = loop {
                match read_frame(&mut reader, MAX_CONTROL_FRAME) {
                    Ok(f) if f.kind == KIND_LOST => break parse_lost(&f.payload),
                    Ok(_) => {}
                    Err(FrameError::Timeout) => {
                        break Notice::CoordinatorLost(format!("silent for {:.1} s", timeout.as_secs_f64()));
                    }
                    Err(e) => break Notice::CoordinatorLost(e.to_string()),
                }
            };
            if !*stopping_reader.lock().unwrap_or_else(|e| e.into_inner()) {
                on_notice(notice);
            }
        });
        Ok(Heartbeat { stream, stop: Some(stop), pinger: Some(pinger), listener: Some(listener), stopping })
    }

    /// Another handle on the connection to the coordinator (to sever it on purpose:
    /// shutting it down makes the coordinator report this worker lost).
    pub fn connection(&self) -> std::io::Result<TcpStream> {
        self.stream.try_clone()
    }

    /// Says goodbye: this worker finished and must not be reported lost.
    pub fn finish(mut self) {
        self.stop_threads(true);
    }

    fn stop_threads(&mut self, goodbye: bool) {
        *self.stopping.lock().unwrap_or_else(|e| e.into_inner()) = true;
        drop(self.stop.take());
        if let Some(p) = self.pinger.take() {
            let _ = p.join();
        }
        if goodbye {
            let _ = write_frame(&mut self.stream, KIND_BYE, &[]);
            let _ = self.stream.flush();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(l) = self.listener.take() {
            let _ = l.join();
        }
    }
}

impl Drop for Heartbeat {
    /// Leaving without [`finish`](Heartbeat::finish) closes the connection without a
    /// goodbye: the coordinator reports this worker lost.
    fn drop(&mut self) {
        self.stop_threads(false);
    }
}

fn parse_lost(payload: &[u8]) -> Notice {
    let text = String::from_utf8_lossy(payload);
    match text.split_once('\n').and_then(|(r, why)| Some((r.parse().ok()?, why))) {
        Some((rank, why)) => Notice::PeerLost { rank, reason: why.to_owned() },
        None => Notice::CoordinatorLost(format!("malformed notice {text:?}")),
    }
}
