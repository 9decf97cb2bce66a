//! What an elastic launcher does when one of its workers exits: the policy alone, a pure
//! state machine that the launcher's process supervision ([`crate::elastic`])
//! feeds with each exit and obeys. It holds no process, clock or output, so each rule is
//! tested on its own below.
//!
//! The rules, in order, for a worker of slot `i` that exited:
//! 1. with success: it finished; nothing to do;
//! 2. once the job is over (every member holds the final state, or it is ending): nothing
//!    is replaced;
//! 3. with an error it reported (a wrong configuration, replicas that diverged): the job
//!    fails, since a new process would fail the same way;
//! 4. killed by a signal or a panic (it died), with `replace` and a restart left: a new
//!    process takes the slot;
//! 5. died otherwise (`shrink`, or the restarts used up): the slot is lost for good; when
//!    fewer workers than the job needs remain, the job is stopped at once, every survivor
//!    told why (rather than after the coordinator's quorum timeout); else the survivors go
//!    on.
//!
//! Once the job fails or is stopped, no later exit changes anything.

/// What the launcher does when a worker fails (`--on-failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Start a new process in the failed worker's slot; it fetches the state from the
    /// live replicas.
    Replace,
    /// Go on with the survivors.
    Shrink,
}

impl repro::words::Word for OnFailure {
    const KIND: &'static str = "failure policy";
    const ALL: &'static [Self] = &[OnFailure::Replace, OnFailure::Shrink];

    fn word(self) -> &'static str {
        match self {
            OnFailure::Replace => "replace",
            OnFailure::Shrink => "shrink",
        }
    }

    fn help(self) -> &'static str {
        match self {
            OnFailure::Replace => "start a new process in the slot; it fetches the state from the live replicas",
            OnFailure::Shrink => "go on with the survivors",
        }
    }
}

repro::text_form!(OnFailure);

/// How a worker's process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exit status 0.
    Success,
    /// Killed by a signal, or a panic (exit status 101): the process died.
    Died,
    /// Any other exit status: the process reported an error.
    Failed,
}

impl Exit {
    /// How `status` ended.
    pub fn of(status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        if status.success() {
            Exit::Success
        } else if status.signal().is_some() || status.code() == Some(101) {
            Exit::Died
        } else {
            Exit::Failed
        }
    }
}

/// What to do about an exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// Nothing: the worker finished, or the job is over.
    Nothing,
    /// Start process `restart` (1-based, of `max`) in the slot.
    Replace {
        /// Which restart this is.
        restart: u32,
    },
    /// The survivors go on without the slot.
    Shrink,
    /// The job ends on the error that the worker reported.
    Fail,
    /// The job can never again have the workers it needs: stop it, telling every survivor
    /// this reason.
    Stop {
        /// Why.
        reason: String,
    },
}

/// The policy of one job, and what it has spent.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    nproc: usize,
    on_failure: OnFailure,
    max_restarts: u32,
    min_world: usize,
    restarts: u32,
    lost_for_good: usize,
    ended: bool,
}

impl RestartPolicy {
    /// A job of `nproc` workers that needs at least `min_world` of them.
    pub fn new(nproc: usize, on_failure: OnFailure, max_restarts: u32, min_world: usize) -> RestartPolicy {
        RestartPolicy { nproc, on_failure, max_restarts, min_world, restarts: 0, lost_for_good: 0, ended: false }
    }

    /// Restarts spent so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// A worker's process ended as `exit`; `over` when the job is already over.
    pub fn on_exit(&mut self, exit: Exit, over: bool) -> Remedy {
        if exit == Exit::Success || over || self.ended {
            return Remedy::Nothing;
        }
        if exit == Exit::Failed {
            self.ended = true;
            return Remedy::Fail;
        }
        if self.on_failure == OnFailure::Replace && self.restarts < self.max_restarts {
            self.restarts += 1;
            return Remedy::Replace { restart: self.restarts };
        }
        self.lost_for_good += 1;
        let left = self.nproc.saturating_sub(self.lost_for_good);
        if left >= self.min_world {
            return Remedy::Shrink;
        }
        self.ended = true;
        let reason = match self.on_failure {
            OnFailure::Replace => format!(
                "too few workers remain: {left} of {}, and the {} restart(s) allowed are used up (raise \
                 --max-restarts, or use --on-failure shrink)",
                self.nproc, self.max_restarts
            ),
            OnFailure::Shrink => {
                format!("too few workers remain: {left} of {}, at least {} needed", self.nproc, self.min_world)
            }
        };
        Remedy::Stop { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_finished_or_a_job_that_is_over_needs_nothing() {
        let mut p = RestartPolicy::new(3, OnFailure::Replace, 1, 3);
        assert_eq!(p.on_exit(Exit::Success, false), Remedy::Nothing);
        assert_eq!(p.on_exit(Exit::Died, true), Remedy::Nothing);
        assert_eq!(p.on_exit(Exit::Failed, true), Remedy::Nothing);
        assert_eq!(p.restarts(), 0, "nothing spent");
    }

    #[test]
    fn an_error_a_worker_reported_ends_the_job_and_is_not_retried() {
        let mut p = RestartPolicy::new(3, OnFailure::Replace, 5, 3);
        assert_eq!(p.on_exit(Exit::Failed, false), Remedy::Fail);
        assert_eq!(p.restarts(), 0);
        // The job is ending: later exits change nothing.
        assert_eq!(p.on_exit(Exit::Died, false), Remedy::Nothing);
    }

    #[test]
    fn a_dead_worker_is_replaced_while_restarts_remain_then_the_job_ends_at_once() {
        let mut p = RestartPolicy::new(3, OnFailure::Replace, 2, 3);
        assert_eq!(p.on_exit(Exit::Died, false), Remedy::Replace { restart: 1 });
        assert_eq!(p.on_exit(Exit::Died, false), Remedy::Replace { restart: 2 });
        let Remedy::Stop { reason } = p.on_exit(Exit::Died, false) else { panic!("the job must end") };
        assert!(reason.contains("2 of 3") && reason.contains("2 restart(s) allowed are used up"), "{reason}");
    }

    #[test]
    fn shrinking_goes_on_down_to_the_fewest_workers_then_ends() {
        let mut p = RestartPolicy::new(4, OnFailure::Shrink, 9, 2);
        assert_eq!(p.on_exit(Exit::Died, false), Remedy::Shrink);
        assert_eq!(p.on_exit(Exit::Died, false), Remedy::Shrink);
        let Remedy::Stop { reason } = p.on_exit(Exit::Died, false) else { panic!("the job must end") };
        assert_eq!(reason, "too few workers remain: 1 of 4, at least 2 needed");
        assert_eq!(p.restarts(), 0, "shrinking restarts nobody");
    }

    #[test]
    fn exits_are_classified_by_status() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::ExitStatus::from_raw;
        assert_eq!(Exit::of(status(0)), Exit::Success);
        assert_eq!(Exit::of(status(9)), Exit::Died, "SIGKILL");
        assert_eq!(Exit::of(status(101 << 8)), Exit::Died, "a panic");
        assert_eq!(Exit::of(status(2 << 8)), Exit::Failed);
    }
}
