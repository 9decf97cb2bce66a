//! The gate of a listening port: connections are admitted concurrently, each with its own
//! deadline, so that nobody who lacks the job's secret can delay a member.
//!
//! Anyone who can reach a port can open a connection and then say nothing, or send
//! garbage. Handled one at a time, twenty idle connections hold a coordinator up for twenty
//! handshake timeouts while the real workers wait behind them. The gate instead accepts on
//! one thread and runs each admission (the handshake and whatever the caller checks after
//! it) on a thread of its own. An admission still running `deadline` after its connection
//! was accepted has its socket shut down, however slowly the stranger dribbles bytes; at
//! most `max_pending` admissions run at once, and a connection beyond that is closed at
//! once (members retry: see [`crate::transport::dial`]). What passes is handed out
//! through [`Gate::next`], with the socket as the admission left it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The limits of a gate.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long one admission may take, from the accept to its verdict.
    pub deadline: Duration,
    /// How many admissions may run at once.
    pub max_pending: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { deadline: Duration::from_secs(5), max_pending: 256 }
    }
}

/// A connection that passed the gate, with what its admission returned.
#[derive(Debug)]
pub struct Admitted<T> {
    /// The connection, as the admission left it.
    pub stream: TcpStream,
    /// Who connected.
    pub from: SocketAddr,
    /// What the admission returned (the peer's rank, its announced address, ...).
    pub value: T,
}

/// An open gate. Dropping it stops accepting (admissions under way finish on their own).
pub struct Gate<T> {
    admitted: Receiver<Admitted<T>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Gate<T> {
    /// Opens the gate on `listener`: every connection goes through `admit` (on its own
    /// thread, with the limits' deadline as its socket timeout); those that return `Ok`
    /// are handed out by [`Gate::next`].
    pub fn open<F>(listener: TcpListener, limits: Limits, admit: F) -> std::io::Result<Gate<T>>
    where
        F: Fn(&mut TcpStream) -> Result<T, String> + Send + Sync + 'static,
    {
        listener.set_nonblocking(true)?;
        let (tx, admitted) = sync_channel(limits.max_pending.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let admit = Arc::new(admit);
        let acceptor = std::thread::Builder::new()
            .name("gate".into())
            .spawn(move || accept_loop(&listener, limits, &stopped, &tx, &admit))?;
        Ok(Gate { admitted, stop, acceptor: Some(acceptor) })
    }

    /// The next admitted connection, or `None` if none passes before `until`.
    pub fn next(&self, until: Instant) -> Option<Admitted<T>> {
        self.admitted.recv_timeout(until.saturating_duration_since(Instant::now())).ok()
    }
}

impl<T> Drop for Gate<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// The gate's first wait for a connection after one arrived, and its longest.
const IDLE_FIRST: Duration = Duration::from_millis(1);
const IDLE_MOST: Duration = Duration::from_millis(16);

fn accept_loop<T: Send + 'static>(
    listener: &TcpListener,
    limits: Limits,
    stop: &AtomicBool,
    tx: &SyncSender<Admitted<T>>,
    admit: &Arc<impl Fn(&mut TcpStream) -> Result<T, String> + Send + Sync + 'static>,
) {
    // The admissions under way: when each must end, a handle to shut its socket down, and
    // whether it has ended. Their count only bounds the threads; no result depends on it.
    let mut running: Vec<(Instant, TcpStream, Arc<AtomicBool>)> = Vec::new();
    let mut shed = 0u64;
    // The listener is polled: often just after a connection (a mesh arrives as several),
    // seldom when idle, so that an idle gate does not wake a busy machine a thousand
    // times a second.
    let mut idle = IDLE_FIRST;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        running.retain(|(until, socket, ended)| {
            if ended.load(Ordering::Acquire) {
                return false;
            }
            if now >= *until {
                // Wakes the admission's blocked read or write, which then fails.
                let _ = socket.shutdown(std::net::Shutdown::Both);
                return false;
            }
            true
        });
        let (stream, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(idle);
                idle = (idle * 2).min(IDLE_MOST);
                continue;
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        idle = IDLE_FIRST;
        let handle = match stream.try_clone() {
            Ok(h) if running.len() < limits.max_pending => h,
            _ => {
                shed += 1;
                if shed.is_power_of_two() {
                    tracing::warn!(%from, shed, "too many connections waiting to be admitted: closed this one");
                }
                continue;
            }
        };
        let ended = Arc::new(AtomicBool::new(false));
        let (done, tx, admit) = (Arc::clone(&ended), tx.clone(), Arc::clone(admit));
        let spawned = std::thread::Builder::new().name("admit".into()).spawn(move || {
            match admission(stream, limits.deadline, &*admit) {
                Ok((stream, value)) => {
                    let _ = tx.send(Admitted { stream, from, value });
                }
                Err(e) => tracing::warn!(%from, "refused a connection: {e}"),
            }
            done.store(true, Ordering::Release);
        });
        match spawned {
            Ok(_) => running.push((now + limits.deadline, handle, ended)),
            Err(e) => tracing::warn!("cannot start an admission thread: {e}"),
        }
    }
}

fn admission<T>(
    mut stream: TcpStream,
    deadline: Duration,
    admit: &impl Fn(&mut TcpStream) -> Result<T, String>,
) -> Result<(TcpStream, T), String> {
    let setup = |e: std::io::Error| e.to_string();
    stream.set_nonblocking(false).map_err(setup)?;
    stream.set_read_timeout(Some(deadline)).map_err(setup)?;
    stream.set_write_timeout(Some(deadline)).map_err(setup)?;
    let value = admit(&mut stream)?;
    Ok((stream, value))
}
