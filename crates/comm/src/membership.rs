//! Membership by heartbeat: the coordinator's view of which workers are alive.
//!
//! This module is the protocol alone, a state machine with no sockets, threads or clock:
//! the caller feeds it what happened ([`Membership::heartbeat`], [`Membership::left`]) and
//! the current time ([`Membership::tick`]), and acts on the [`Lost`] members it returns. The
//! socket glue lives in [`supervisor`](crate::supervisor).
//!
//! Rules, in order:
//! 1. Every member starts alive at the moment the job is formed.
//! 2. Any message from a member (a heartbeat or anything else) renews it.
//! 3. A member that says goodbye has finished; it is never reported lost afterwards.
//! 4. A member whose connection drops without a goodbye is lost at once; one that stays
//!    silent for longer than the timeout is lost at the first tick after the timeout.
//!    Silence counts only while the coordinator runs: the caller reports a pause of its
//!    own (it was stopped; see [`AwakeClock`](crate::awake::AwakeClock)) with
//!    [`Membership::paused`], which credits it to every member.
//! 5. Each loss is reported exactly once. The job is over when no member is alive; it
//!    succeeded if nobody was lost.

use std::time::{Duration, Instant};

/// Why a member was declared lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// No message for longer than the heartbeat timeout.
    Silent(Duration),
    /// The connection closed without a goodbye (the process died or the link broke).
    Disconnected,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::Silent(d) => write!(f, "no heartbeat for {:.1} s", d.as_secs_f64()),
            LossReason::Disconnected => f.write_str("its connection to the coordinator closed"),
        }
    }
}

/// What the caller must act on: a member is gone, and the survivors must abort the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// Its rank.
    pub rank: usize,
    /// Why.
    pub reason: LossReason,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} lost: {}", self.rank, self.reason)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Alive { last: Instant },
    Finished,
    Lost(LossReason),
}

/// The membership of one job.
#[derive(Clone, Debug)]
pub struct Membership {
    timeout: Duration,
    members: Vec<State>,
}

impl Membership {
    /// A job of `world` members, all alive at `now`, each lost after `timeout` of silence.
    pub fn new(world: usize, timeout: Duration, now: Instant) -> Self {
        Membership { timeout, members: vec![State::Alive { last: now }; world] }
    }

    /// The caller (the coordinator) was not running for `paused`: that time is not the
    /// members' silence, so it is credited to every member that is alive.
    pub fn paused(&mut self, paused: Duration) {
        for s in &mut self.members {
            if let State::Alive { last } = s {
                *last += paused;
            }
        }
    }

    /// The heartbeat timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A message from `rank` arrived at `now`.
    pub fn heartbeat(&mut self, rank: usize, now: Instant) {
        if let Some(State::Alive { last }) = self.members.get_mut(rank) {
            *last = (*last).max(now);
        }
    }

    /// `rank`'s connection ended: cleanly after a goodbye (`finished`), or not.
    pub fn left(&mut self, rank: usize, finished: bool) -> Vec<Lost> {
        match self.members.get_mut(rank) {
            Some(s @ State::Alive { .. }) if finished => {
                *s = State::Finished;
                Vec::new()
            }
            Some(s @ State::Alive { .. }) => {
                *s = State::Lost(LossReason::Disconnected);
                vec![Lost { rank, reason: LossReason::Disconnected }]
            }
            _ => Vec::new(),
        }
    }

    /// Declares lost every member silent for longer than the timeout at `now`.
    pub fn tick(&mut self, now: Instant) -> Vec<Lost> {
        let mut events = Vec::new();
        for (rank, s) in self.members.iter_mut().enumerate() {
            if let State::Alive { last } = *s {
                let silent = now.saturating_duration_since(last);
                if silent > self.timeout {
                    let reason = LossReason::Silent(silent);
                    *s = State::Lost(reason.clone());
                    events.push(Lost { rank, reason });
                }
            }
        }
        events
    }

    /// Ranks still alive.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.members.len()).filter(|&r| matches!(self.members[r], State::Alive { .. })).collect()
    }

    /// Ranks lost so far, with the reason.
    pub fn lost(&self) -> Vec<(usize, LossReason)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(r, s)| match s {
                State::Lost(reason) => Some((r, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// True once no member is alive.
    pub fn is_over(&self) -> bool {
        self.alive().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(1000);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn heartbeats_keep_members_alive() {
        let t0 = Instant::now();
        let mut m = Membership::new(3, T, t0);
        for ms in (0..5000).step_by(500) {
            for r in 0..3 {
                m.heartbeat(r, at(t0, ms));
            }
            assert!(m.tick(at(t0, ms + 10)).is_empty());
        }
        assert_eq!(m.alive(), vec![0, 1, 2]);
    }

    #[test]
    fn a_silent_member_is_lost_once_after_the_timeout() {
        let t0 = Instant::now();
        let mut m = Membership::new(3, T, t0);
        m.heartbeat(0, at(t0, 900));
        m.heartbeat(2, at(t0, 900));
        assert!(m.tick(at(t0, 1000)).is_empty(), "exactly the timeout is not yet a loss");
        let events = m.tick(at(t0, 1001));
        assert_eq!(events, vec![Lost { rank: 1, reason: LossReason::Silent(Duration::from_millis(1001)) }]);
        assert!(m.tick(at(t0, 1500)).is_empty(), "reported once");
        // A late heartbeat does not bring it back.
        m.heartbeat(1, at(t0, 1600));
        assert_eq!(m.alive(), vec![0, 2]);
        assert_eq!(m.lost().len(), 1);
    }

    #[test]
    fn a_goodbye_is_not_a_loss_but_a_dropped_connection_is() {
        let t0 = Instant::now();
        let mut m = Membership::new(2, T, t0);
        assert!(m.left(0, true).is_empty());
        assert_eq!(m.left(1, false), vec![Lost { rank: 1, reason: LossReason::Disconnected }]);
        assert!(m.tick(at(t0, 10_000)).is_empty(), "finished members never time out");
        assert!(m.is_over());
        assert_eq!(m.lost(), vec![(1, LossReason::Disconnected)]);
        // The connection of a finished member closing afterwards changes nothing.
        assert!(m.left(0, false).is_empty());
    }

    #[test]
    fn heartbeats_out_of_order_never_move_time_back() {
        let t0 = Instant::now();
        let mut m = Membership::new(1, T, t0);
        m.heartbeat(0, at(t0, 800));
        m.heartbeat(0, at(t0, 100));
        assert!(m.tick(at(t0, 1700)).is_empty());
        assert_eq!(m.tick(at(t0, 1801)).len(), 1);
    }

    #[test]
    fn a_pause_of_the_coordinator_itself_is_not_silence_of_the_members() {
        let t0 = Instant::now();
        let mut m = Membership::new(2, T, t0);
        m.heartbeat(0, at(t0, 1000));
        m.heartbeat(1, at(t0, 1000));
        // The coordinator stops for 8 s; on waking, its shell reports the pause and ticks
        // before reading the heartbeats that waited in its sockets: nobody is lost.
        m.paused(Duration::from_millis(8000));
        assert!(m.tick(at(t0, 9010)).is_empty());
        m.heartbeat(0, at(t0, 9020));
        // Member 1 really died during the pause: found one timeout of running time later.
        assert!(m.tick(at(t0, 9990)).is_empty());
        m.heartbeat(0, at(t0, 9995));
        assert_eq!(
            m.tick(at(t0, 10_010)),
            vec![Lost { rank: 1, reason: LossReason::Silent(Duration::from_millis(1010)) }]
        );
    }

    #[test]
    fn unknown_ranks_are_ignored() {
        let t0 = Instant::now();
        let mut m = Membership::new(1, T, t0);
        m.heartbeat(7, t0);
        assert!(m.left(7, false).is_empty());
        assert_eq!(m.alive(), vec![0]);
    }
}
