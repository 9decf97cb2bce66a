//! Silence measured only over time the observer itself was running.
//!
//! A monitor that was not running cannot conclude that others were silent: when the
//! coordinator is stopped (SIGSTOP, a suspended virtual machine, a long stall of its own),
//! the workers' heartbeats pile up in its sockets, unread. On waking, the clock says that
//! every worker has been silent for the whole pause, and a monitor that trusts it kills
//! healthy workers. [`AwakeClock`] notices such a gap in the monitor's own activity (it is
//! called at least once per tick, so a gap much longer than a tick means it was not
//! running) and returns the part of it beyond the normal interval, which the monitor's
//! shell hands to its state machine (`Coordinator::paused`, `Membership::paused`) to add
//! to every peer's "last heard" time: silence counts only while the monitor ran. A
//! peer that really died during the pause is still found, one timeout of running time
//! after the monitor wakes.

use std::time::{Duration, Instant};

/// The observer's own activity, for crediting its pauses to those it watches.
#[derive(Clone, Debug)]
pub struct AwakeClock {
    last: Option<Instant>,
    allowance: Duration,
}

impl AwakeClock {
    /// A clock for an observer that looks at least every `allowance` while it runs.
    pub fn new(allowance: Duration) -> AwakeClock {
        AwakeClock { last: None, allowance }
    }

    /// The observer runs at `now`: returns how long it was not running since it last
    /// looked (the gap beyond the allowance; zero when it kept looking).
    pub fn observe(&mut self, now: Instant) -> Duration {
        let paused =
            self.last.map_or(Duration::ZERO, |prev| now.saturating_duration_since(prev).saturating_sub(self.allowance));
        self.last = Some(self.last.map_or(now, |prev| prev.max(now)));
        paused
    }

    /// [`observe`](AwakeClock::observe) at this instant, for a coordinator's shell: a pause
    /// is logged as a warning and returned, to be handed to the state machine.
    pub fn pause(&mut self) -> Option<Duration> {
        let paused = self.observe(Instant::now());
        if paused.is_zero() {
            return None;
        }
        if worth_saying(paused) {
            tracing::warn!(
                "the coordinator did not run for {:.1} s (stopped or starved): not counted as the workers' silence",
                paused.as_secs_f64()
            );
        }
        Some(paused)
    }
}

/// Whether a pause is long enough to be said: a few milliseconds of scheduling delay beyond
/// the allowance are handed to the state machine all the same, but a warning that the
/// coordinator "did not run for 0.0 s" would be noise.
fn worth_saying(paused: Duration) -> bool {
    paused >= Duration::from_millis(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pause_that_shows_at_a_tenth_of_a_second_is_said() {
        assert!(!worth_saying(Duration::from_millis(3)));
        assert!(!worth_saying(Duration::from_millis(49)));
        assert!(worth_saying(Duration::from_millis(100)));
        assert!(worth_saying(Duration::from_secs(7)));
    }

    #[test]
    fn only_the_gap_beyond_the_allowance_is_a_pause() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = AwakeClock::new(Duration::from_millis(100));
        assert_eq!(c.observe(t0), Duration::ZERO);
        assert_eq!(c.observe(ms(90)), Duration::ZERO);
        assert_eq!(c.observe(ms(190)), Duration::ZERO);
        assert_eq!(c.observe(ms(8190)), Duration::from_millis(7900));
        // Out of order: time never goes back.
        assert_eq!(c.observe(ms(8000)), Duration::ZERO);
        assert_eq!(c.observe(ms(8250)), Duration::ZERO);
    }
}
