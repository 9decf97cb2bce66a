//! How a worker judges the silence of its elastic job's coordinator.
//!
//! The coordinator sends every worker a [`Pulse`] every heartbeat, so a worker knows when
//! it last heard from it even through a long epoch in which the protocol has nothing to
//! say. A [`CoordinatorWatch`] keeps that instant on the monotonic clock, and judges:
//!
//! - the coordinator is **unreachable** as soon as its connection closes, or once it has
//!   been silent for its heartbeat timeout (the bound after which it takes a worker for
//!   lost, which its pulses carry). The worker says so at once, once per loss, with the
//!   instant at which it will give up;
//! - the worker **gives up** once the coordinator has been silent for its heartbeat
//!   timeout and then its quorum timeout (how long the job waits for what it needs before
//!   it stops): time for a coordinator started again, a standby, or a newly elected one
//!   to answer. So `--heartbeat-timeout` and `--quorum-timeout`, given to the launcher or
//!   to `steadfast coordinator`, bound the wait, and the reason names the time truly
//!   elapsed since the last word.
//!
//! Silence is measured from the last word heard, and only a word (a frame, or a
//! connection the coordinator accepted) moves that instant: failed attempts to dial it
//! again do not. Time in which this process itself did not run (stopped, or starved), as
//! an [`AwakeClock`] finds it, is not counted as the coordinator's silence: its pulses
//! piled up unread meanwhile.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::awake::AwakeClock;
use crate::protocol::wire::Pulse;

/// The bounds a worker uses until its coordinator's first pulse says otherwise: the
/// defaults of `steadfast launch` and `steadfast coordinator` (`--heartbeat-timeout 10`,
/// `--quorum-timeout 60`).
pub const DEFAULT_BOUNDS: Pulse =
    Pulse { lost_after: Duration::from_secs(10), quorum_timeout: Duration::from_secs(60) };

/// What a look at the coordinator found, for the owner of the watch to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing new.
    Quiet,
    /// The coordinator was just found unreachable (said once per loss): the text says
    /// since when, why, and when this worker gives up.
    Unreachable(String),
    /// It answers again after a loss that was said.
    Back(String),
}

/// A worker's view of its coordinator's liveness.
#[derive(Clone, Debug)]
pub struct CoordinatorWatch {
    bounds: Pulse,
    /// When the coordinator was last heard: the instant itself, never moved by a pause.
    heard: Instant,
    /// The part of the time since `heard` in which this process did not run.
    paused: Duration,
    awake: AwakeClock,
    /// Where the coordinator was last reached.
    at: Option<SocketAddr>,
    /// Since when the connection is closed, and why (`None`: connected).
    closed: Option<(Instant, String)>,
    /// The loss was said.
    said: bool,
    /// The link was cut on purpose (a fault): nothing to judge.
    severed: bool,
}

impl CoordinatorWatch {
    /// A watch on a coordinator heard at `now` (its connection was just made), at `at`,
    /// judged by `bounds` until its first pulse. `allowance` is the longest gap between two
    /// looks of a process that runs (see [`AwakeClock`]).
    pub fn new(now: Instant, at: Option<SocketAddr>, bounds: Pulse, allowance: Duration) -> CoordinatorWatch {
        let mut awake = AwakeClock::new(allowance);
        awake.observe(now);
        CoordinatorWatch {
            bounds,
            heard: now,
            paused: Duration::ZERO,
            awake,
            at,
            closed: None,
            said: false,
            severed: false,
        }
    }

    /// The bounds in force.
    pub fn bounds(&self) -> Pulse {
        self.bounds
    }

    /// A frame arrived from the coordinator at `now`.
    pub fn heard(&mut self, now: Instant) -> Verdict {
        self.look(now);
        let silence = self.silence(now);
        self.heard = self.heard.max(now);
        self.paused = Duration::ZERO;
        self.closed = None;
        if !std::mem::take(&mut self.said) {
            return Verdict::Quiet;
        }
        Verdict::Back(format!(
            "the coordinator{} answers again, {:.1} s after it was last heard",
            self.where_(),
            silence.as_secs_f64()
        ))
    }

    /// A pulse arrived at `now`: the coordinator's bounds, and a word from it.
    pub fn pulse(&mut self, now: Instant, pulse: Pulse) -> Verdict {
        self.bounds = pulse;
        self.heard(now)
    }

    /// A connection to the coordinator at `at` was made at `now` (it passed the
    /// handshake: the coordinator runs).
    pub fn connected(&mut self, now: Instant, at: Option<SocketAddr>) -> Verdict {
        self.at = at.or(self.at);
        self.heard(now)
    }

    /// The connection to the coordinator closed at `now`, for `why`: it is unreachable
    /// at once.
    pub fn closed(&mut self, now: Instant, why: String) -> Verdict {
        if self.closed.is_none() {
            self.closed = Some((now, why));
        }
        self.check(now)
    }

    /// The link was cut on purpose (the `cut` fault): the process lives on, silent, and
    /// neither warns nor gives up.
    pub fn sever(&mut self) {
        self.severed = true;
    }

    /// Looks at the coordinator at `now`: says it unreachable when its connection is
    /// closed or it has been silent for its heartbeat timeout (once per loss).
    pub fn check(&mut self, now: Instant) -> Verdict {
        self.look(now);
        let silence = self.silence(now);
        if self.severed || self.said || (self.closed.is_none() && silence < self.bounds.lost_after) {
            return Verdict::Quiet;
        }
        self.said = true;
        let why = match &self.closed {
            Some((_, why)) => format!("its connection closed ({why})"),
            None => {
                format!("it has been silent past its heartbeat timeout ({:.1} s)", self.bounds.lost_after.as_secs_f64())
            }
        };
        let left = self.deadline().saturating_duration_since(now);
        Verdict::Unreachable(format!(
            "the coordinator{} is unreachable: {why}; last heard {:.1} s ago{}. This worker waits for it (or for \
             another coordinator of the job) until {} ({:.1} s from now: its heartbeat timeout of {:.1} s and quorum \
             timeout of {:.1} s after the last word), then gives up unless it comes back",
            self.where_(),
            now.saturating_duration_since(self.heard).as_secs_f64(),
            self.pause_note(),
            wall_clock_in(left),
            left.as_secs_f64(),
            self.bounds.lost_after.as_secs_f64(),
            self.bounds.quorum_timeout.as_secs_f64(),
        ))
    }

    /// Why this worker gives up at `now`, once the coordinator has been silent for its
    /// heartbeat timeout and its quorum timeout; `None` before (or when the link was cut on
    /// purpose).
    pub fn gave_up(&mut self, now: Instant) -> Option<String> {
        self.look(now);
        if self.severed || now < self.deadline() {
            return None;
        }
        let why = match &self.closed {
            Some((since, why)) => {
                let ago = now.saturating_duration_since(*since).as_secs_f64();
                format!("its connection closed {ago:.1} s ago ({why})")
            }
            None => "its connection is open, but it says nothing".to_owned(),
        };
        Some(format!(
            "no word from the coordinator{} for {:.1} s{}: {why}. That is past its heartbeat timeout ({:.1} s) and \
             quorum timeout ({:.1} s), so this worker gives up: the job may be over, or the coordinator's node lost \
             (a job that keeps checkpoints goes on from its last with --resume)",
            self.where_(),
            now.saturating_duration_since(self.heard).as_secs_f64(),
            self.pause_note(),
            self.bounds.lost_after.as_secs_f64(),
            self.bounds.quorum_timeout.as_secs_f64(),
        ))
    }

    /// When this worker gives up unless the coordinator is heard before: the last word,
    /// plus the heartbeat and quorum timeouts, plus the time this process did not run.
    pub fn deadline(&self) -> Instant {
        self.heard + self.paused + self.bounds.lost_after + self.bounds.quorum_timeout
    }

    /// The coordinator's silence at `now`, over the time this process ran.
    pub fn silence(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.heard).saturating_sub(self.paused)
    }

    /// Credits a pause of this process since its last look.
    fn look(&mut self, now: Instant) {
        self.paused += self.awake.observe(now);
    }

    fn where_(&self) -> String {
        self.at.map(|a| format!(" at {a}")).unwrap_or_default()
    }

    fn pause_note(&self) -> String {
        if self.paused < Duration::from_millis(100) {
            return String::new();
        }
        let paused = self.paused.as_secs_f64();
        format!(" (this process itself did not run for {paused:.1} s of it, which is not counted)")
    }
}

/// The time of day `left` from now, as `HH:MM:SS UTC`: an absolute instant a person can
/// compare with the other logs of the job.
fn wall_clock_in(left: Duration) -> String {
    let at = SystemTime::now() + left;
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02} UTC", day / 3600, day % 3600 / 60, day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Pulse = Pulse { lost_after: Duration::from_secs(2), quorum_timeout: Duration::from_secs(10) };

    fn at() -> Option<SocketAddr> {
        Some("10.0.0.1:29500".parse().unwrap())
    }

    /// A watch whose process looks at least every second, and a clock of milliseconds
    /// from its start.
    fn watch() -> (CoordinatorWatch, impl Fn(u64) -> Instant) {
        let t0 = Instant::now();
        (CoordinatorWatch::new(t0, at(), DEFAULT_BOUNDS, Duration::from_secs(1)), move |ms: u64| {
            t0 + Duration::from_millis(ms)
        })
    }

    /// Looks every 200 ms from `from` to `to` (a process that runs, hearing nothing),
    /// returning what was said and when.
    fn run(w: &mut CoordinatorWatch, t: &impl Fn(u64) -> Instant, from: u64, to: u64) -> Vec<(u64, Verdict)> {
        (from..=to).step_by(200).map(|ms| (ms, w.check(t(ms)))).filter(|(_, v)| *v != Verdict::Quiet).collect()
    }

    /// Pulses every 200 ms from `from` to `to`: nothing may be said.
    fn beat(w: &mut CoordinatorWatch, t: &impl Fn(u64) -> Instant, from: u64, to: u64) {
        for ms in (from..=to).step_by(200) {
            assert_eq!(w.pulse(t(ms), BOUNDS), Verdict::Quiet, "at {ms} ms");
            assert_eq!(w.check(t(ms)), Verdict::Quiet, "at {ms} ms");
        }
    }

    #[test]
    fn a_closed_connection_is_said_at_once_with_the_instant_of_giving_up() {
        let (mut w, t) = watch();
        beat(&mut w, &t, 0, 5600);
        let Verdict::Unreachable(text) = w.closed(t(5700), "connection reset by peer".into()) else {
            panic!("a closed connection must be said at once")
        };
        assert!(text.contains("at 10.0.0.1:29500 is unreachable"), "{text}");
        assert!(text.contains("its connection closed (connection reset by peer)"), "{text}");
        assert!(text.contains("last heard 0.1 s ago"), "{text}");
        // Given up 2 + 10 s after the last word (5.6 s): 11.9 s from now.
        assert!(text.contains(" UTC (11.9 s from now"), "{text}");
        assert!(text.contains("heartbeat timeout of 2.0 s and quorum timeout of 10.0 s"), "{text}");
        // Said once per loss, however often the link looks or fails to dial again.
        assert_eq!(run(&mut w, &t, 5800, 17_400), vec![]);
        assert_eq!(w.closed(t(17_500), "connection refused".into()), Verdict::Quiet);
        assert_eq!(w.gave_up(t(17_500)), None);
        let why = w.gave_up(t(17_700)).expect("past the bound");
        assert!(
            why.starts_with(
                "no word from the coordinator at 10.0.0.1:29500 for 12.1 s: its connection closed 12.0 s ago \
                 (connection reset by peer)"
            ),
            "{why}"
        );
        assert!(why.contains("heartbeat timeout (2.0 s) and quorum timeout (10.0 s)"), "{why}");
    }

    #[test]
    fn a_silent_coordinator_is_said_after_its_heartbeat_timeout_and_given_up_after_the_quorum_timeout() {
        let (mut w, t) = watch();
        beat(&mut w, &t, 0, 1000);
        let said = run(&mut w, &t, 1200, 12_800);
        assert_eq!(said.len(), 1, "{said:?}");
        let (3000, Verdict::Unreachable(text)) = &said[0] else {
            panic!("not said at the heartbeat timeout after the last word: {said:?}")
        };
        assert!(text.contains("silent past its heartbeat timeout (2.0 s)"), "{text}");
        assert!(text.contains("last heard 2.0 s ago"), "{text}");
        assert!(text.contains("(10.0 s from now"), "{text}");
        assert_eq!(w.gave_up(t(12_900)), None);
        let why = w.gave_up(t(13_000)).expect("2 + 10 s after the last word");
        assert!(why.contains("for 12.0 s: its connection is open, but it says nothing"), "{why}");
    }

    #[test]
    fn failed_attempts_to_dial_again_do_not_reset_the_clock_and_a_coordinator_that_returns_does() {
        let (mut w, t) = watch();
        beat(&mut w, &t, 0, 0);
        assert!(matches!(w.closed(t(500), "end of file".into()), Verdict::Unreachable(_)));
        // Dialling fails again and again: the link says nothing new, and the clock runs on.
        assert_eq!(run(&mut w, &t, 600, 3000), vec![]);
        assert_eq!(w.closed(t(3000), "connection refused".into()), Verdict::Quiet);
        assert_eq!(w.deadline(), t(12_000), "counted from the last word, not from a failed dial");
        assert_eq!(run(&mut w, &t, 3200, 8000), vec![]);
        let Verdict::Back(text) = w.connected(t(8000), at()) else { panic!("the return must be said") };
        assert_eq!(text, "the coordinator at 10.0.0.1:29500 answers again, 8.0 s after it was last heard");
        assert_eq!(w.deadline(), t(20_000), "counted from the new word");
        assert_eq!(w.gave_up(t(12_000)), None);
        // A second loss is said again.
        beat(&mut w, &t, 8200, 8400);
        assert!(matches!(w.closed(t(8500), "end of file".into()), Verdict::Unreachable(_)));
    }

    #[test]
    fn the_coordinators_pulse_sets_the_bounds_and_the_defaults_hold_until_then() {
        let (mut w, t) = watch();
        assert_eq!(w.bounds(), DEFAULT_BOUNDS);
        assert_eq!(w.deadline(), t(70_000), "10 s + 60 s by default");
        let short = Pulse { lost_after: Duration::from_secs(1), quorum_timeout: Duration::from_secs(3) };
        assert_eq!(w.pulse(t(500), short), Verdict::Quiet);
        assert_eq!(w.deadline(), t(4500));
        assert_eq!(run(&mut w, &t, 600, 4400).len(), 1);
        assert!(w.gave_up(t(4400)).is_none());
        assert!(w.gave_up(t(4600)).is_some());
    }

    #[test]
    fn a_pause_of_this_process_is_not_the_coordinators_silence() {
        let (mut w, t) = watch();
        let bounds = Pulse { lost_after: Duration::from_secs(5), quorum_timeout: Duration::from_secs(10) };
        w.pulse(t(0), bounds);
        assert_eq!(run(&mut w, &t, 200, 1000), vec![]);
        // Stopped for 30 s: on waking nothing is said (29 s beyond the second allowed
        // between looks were not running time), and the bound counts running time.
        assert_eq!(w.check(t(31_000)), Verdict::Quiet);
        assert_eq!(w.gave_up(t(31_000)), None);
        assert_eq!(w.deadline(), t(44_000));
        let said = run(&mut w, &t, 31_200, 43_800);
        assert_eq!(said.iter().map(|(ms, _)| *ms).collect::<Vec<_>>(), vec![34_000], "{said:?}");
        let why = w.gave_up(t(44_000)).expect("15 s of running time without a word");
        assert!(why.contains("for 44.0 s (this process itself did not run for 29.0 s of it"), "{why}");
    }

    #[test]
    fn a_link_cut_on_purpose_neither_warns_nor_gives_up() {
        let (mut w, t) = watch();
        beat(&mut w, &t, 0, 0);
        w.sever();
        assert_eq!(w.closed(t(100), "cut".into()), Verdict::Quiet);
        assert_eq!(run(&mut w, &t, 200, 20_000), vec![]);
        assert_eq!(w.gave_up(t(20_000)), None);
    }

    #[test]
    fn the_instant_of_giving_up_reads_as_a_time_of_day() {
        let text = wall_clock_in(Duration::from_secs(70));
        assert_eq!(text.len(), "HH:MM:SS UTC".len(), "{text}");
        assert!(text.ends_with(" UTC") && text.as_bytes()[2] == b':' && text.as_bytes()[5] == b':', "{text}");
    }
}
