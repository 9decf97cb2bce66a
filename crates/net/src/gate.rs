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
//!
//! What the gate refuses is told in the log sparingly ([`RefusalLog`]): the first refusal
//! after a quiet spell in full, then at most one line every [`REFUSALS_TOLD_EVERY`]
//! counting the refusals since, so that a stranger who fails the handshake hundreds of
//! times a second fills neither the job's log nor its disk.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
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
    // What the admissions refused, told sparingly: the admissions record into it, this
    // loop tells the count that fell due once refusals stop coming.
    let refusals = Arc::new(Mutex::new(RefusalLog::new(REFUSALS_TOLD_EVERY)));
    // The listener is polled: often just after a connection (a mesh arrives as several),
    // seldom when idle, so that an idle gate does not wake a busy machine a thousand
    // times a second.
    let mut idle = IDLE_FIRST;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if let Some(told) = lock(&refusals).due(now) {
            tracing::warn!("{told}");
        }
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
        let refused = Arc::clone(&refusals);
        let spawned = std::thread::Builder::new().name("admit".into()).spawn(move || {
            match admission(stream, limits.deadline, &*admit) {
                Ok((stream, value)) => {
                    let _ = tx.send(Admitted { stream, from, value });
                }
                Err(reason) => {
                    if let Some(told) = lock(&refused).refused(Instant::now(), from, reason) {
                        tracing::warn!("{told}");
                    }
                }
            }
            done.store(true, Ordering::Release);
        });
        match spawned {
            Ok(_) => running.push((now + limits.deadline, handle, ended)),
            Err(e) => tracing::warn!("cannot start an admission thread: {e}"),
        }
    }
    // The gate closes: what was refused and not yet told is told now.
    if let Some(told) = lock(&refusals).rest(Instant::now()) {
        tracing::warn!("{told}");
    }
}

fn lock(log: &Mutex<RefusalLog>) -> std::sync::MutexGuard<'_, RefusalLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often a gate tells how many connections it refused, at most, while they keep
/// coming.
pub const REFUSALS_TOLD_EVERY: Duration = Duration::from_secs(10);

/// A connection that the gate refused: who, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Who connected.
    pub from: SocketAddr,
    /// Why the admission refused it (a wrong secret, garbage, its deadline).
    pub reason: String,
}

/// A line that a [`RefusalLog`] says to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// A refusal after a quiet spell, told in full.
    One(Refusal),
    /// `count` refusals over the `over` since the last line, the newest of them `last`.
    Many {
        /// Refusals not told before.
        count: u64,
        /// The time since the last line.
        over: Duration,
        /// The newest of them.
        last: Refusal,
    },
}

impl std::fmt::Display for Told {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Told::One(r) => write!(f, "refused a connection from {}: {}", r.from, r.reason),
            Told::Many { count, over, last } => write!(
                f,
                "refused {count} more connection(s) in the last {:.0} s, the last from {}: {} \
                 (refusals are told in sum, not one by one)",
                over.as_secs_f64(),
                last.from,
                last.reason,
            ),
        }
    }
}

/// What a gate tells of the connections it refused, so that anyone who can reach a port
/// cannot flood the log by failing the handshake over and over: the first refusal after a
/// quiet spell of `every` is told at once and in full; those after it are counted, and at
/// most one line per `every` tells how many there were and the newest. Over any span of
/// time `T` it says at most `1 + T / every` lines however many connections it refuses,
/// and one more when its gate closes ([`RefusalLog::rest`]).
///
/// It keeps no clock: every call takes the time, so its behaviour is a function of the
/// calls alone (and tested so). The caller logs what the calls return.
#[derive(Debug)]
pub struct RefusalLog {
    every: Duration,
    /// When the last line was told (`None`: never).
    told_at: Option<Instant>,
    /// The refusals since then not yet told, and the newest of them.
    untold: u64,
    newest: Option<Refusal>,
}

impl RefusalLog {
    /// A log that tells at most one line per `every`.
    pub fn new(every: Duration) -> RefusalLog {
        RefusalLog { every, told_at: None, untold: 0, newest: None }
    }

    /// Records a connection from `from` refused at `now` for `reason`; returns the line
    /// to log now, if one is due.
    pub fn refused(&mut self, now: Instant, from: SocketAddr, reason: String) -> Option<Told> {
        let refusal = Refusal { from, reason };
        let quiet = self.told_at.is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if quiet && self.untold == 0 {
            self.told_at = Some(now);
            return Some(Told::One(refusal));
        }
        self.untold += 1;
        self.newest = Some(refusal);
        self.due(now)
    }

    /// The count of the refusals not yet told, once `every` has passed since the last
    /// line (call it now and then: the refusals may have stopped coming).
    pub fn due(&mut self, now: Instant) -> Option<Told> {
        let told_at = self.told_at?;
        if now.saturating_duration_since(told_at) < self.every {
            return None;
        }
        self.rest(now)
    }

    /// The count of the refusals not yet told, whatever the time (when the gate closes).
    pub fn rest(&mut self, now: Instant) -> Option<Told> {
        if self.untold == 0 {
            return None;
        }
        let over = self.told_at.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.told_at = Some(now);
        let count = std::mem::take(&mut self.untold);
        let last = self.newest.take()?;
        Some(Told::Many { count, over, last })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn from(i: u64) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], 40_000 + (i % 1000) as u16))
    }

    fn count(lines: &[Told]) -> u64 {
        lines.iter().map(|l| if let Told::Many { count, .. } = l { *count } else { 1 }).sum()
    }

    #[test]
    fn a_stranger_retrying_600_times_a_second_for_30_s_gets_a_handful_of_lines() {
        let every = Duration::from_secs(10);
        let mut log = RefusalLog::new(every);
        let t0 = Instant::now();
        let mut lines = Vec::new();
        let mut when = Vec::new();
        let n = 18_000u64;
        for i in 0..n {
            let now = t0 + Duration::from_micros(i * 1_667);
            let reason = format!("the peer (claiming rank 1) failed to prove knowledge of the job secret ({i})");
            if let Some(l) = log.refused(now, from(i), reason) {
                lines.push(l);
                when.push(now);
            }
            // The gate's loop looks in between.
            if i % 7 == 0
                && let Some(l) = log.due(now)
            {
                lines.push(l);
                when.push(now);
            }
        }
        let end = t0 + Duration::from_secs(45);
        if let Some(l) = log.due(end) {
            lines.push(l);
            when.push(end);
        }
        assert!(log.rest(end).is_none(), "everything was told");
        // One line at the first refusal, one per 10 s after: 5 over 45 s, not 18000.
        assert!(lines.len() <= 1 + 45 / 10, "{} lines: {lines:#?}", lines.len());
        assert!(when.windows(2).all(|w| w[1] - w[0] >= every), "two lines less than {every:?} apart");
        // None is lost: the lines count every refusal.
        assert_eq!(count(&lines), n);
        assert!(matches!(&lines[0], Told::One(r) if r.from == from(0) && r.reason.ends_with("(0)")), "{lines:?}");
        let Told::Many { last, over, .. } = lines.last().unwrap() else { panic!("{lines:?}") };
        assert_eq!(last.from, from(n - 1));
        assert!(last.reason.ends_with(&format!("({})", n - 1)), "{last:?}");
        assert!(*over >= every);
    }

    #[test]
    fn a_refusal_after_a_quiet_spell_is_told_at_once_and_in_full() {
        let every = Duration::from_secs(10);
        let mut log = RefusalLog::new(every);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let refusal = |i: u64, reason: &str| Refusal { from: from(i), reason: reason.into() };
        assert_eq!(log.refused(at(0), from(1), "bad".into()), Some(Told::One(refusal(1, "bad"))));
        // A second one within the interval is counted, told once the interval has passed.
        assert_eq!(log.refused(at(3), from(2), "worse".into()), None);
        assert_eq!(log.due(at(9)), None);
        let told = log.due(at(10)).expect("due after the interval");
        assert_eq!(told, Told::Many { count: 1, over: every, last: refusal(2, "worse") });
        let text = told.to_string();
        let want = "refused 1 more connection(s) in the last 10 s, the last from 192.0.2.1:40002: worse";
        assert!(text.starts_with(want), "{text}");
        assert_eq!(log.due(at(30)), None, "nothing more to tell");
        // Quiet since: the next refusal is told in full again.
        assert_eq!(log.refused(at(31), from(3), "again".into()), Some(Told::One(refusal(3, "again"))));
        // What is untold when the gate closes is told then, whatever the time.
        assert_eq!(log.refused(at(32), from(4), "last".into()), None);
        assert!(matches!(log.rest(at(33)), Some(Told::Many { count: 1, .. })));
        assert_eq!(log.rest(at(34)), None);
    }
}
