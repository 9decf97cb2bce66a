//! The one loop that supervises a node's workers, for every kind of job.
//!
//! A launcher starts its node's workers and then hears, on one channel, each worker's exit
//! and what the job's coordinator says ([`Heard`]). What an exit means is the job's
//! [`Mode`]: in a static job every worker lives to the end, or the job fails; in an elastic
//! job the [`RestartPolicy`] replaces the worker, goes on without it, or ends the job. Either
//! way, once the job is over, a worker still running past a grace is hung or stopped, and is
//! killed; in an elastic job, so is a process the coordinator lost.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use comm::control::{MembershipEvent, Requests};

use crate::record::Recorder;
use crate::workers::{Exited, Workers};
use crate::{Exit, FINISHED_GRACE, KILL_GRACE, LaunchError, Remedy, RestartPolicy, say};

/// How long a launcher elected in etcd waits before it kills a worker its coordinator lost:
/// time for the role's thread to find out whether the role is still held.
const ROLE_CONFIRMED: Duration = Duration::from_secs(1);

/// What the launcher hears.
pub(crate) enum Heard {
    /// A worker's process exited.
    Exited(Exited),
    /// The coordinator lost process `incarnation` of `slot`.
    Lost { slot: usize, incarnation: u64 },
    /// Every member holds the final state: a failure is not replaced any more.
    Finished,
    /// The coordinator returned: the job is over.
    CoordinatorDone,
    /// This launcher was elected to the coordinator role (generation).
    Elected(u64),
    /// This launcher lost the coordinator role (why): another serves it now.
    RoleLost(String),
    /// The coordinator this launcher serves said this (for the job's record).
    Said(MembershipEvent),
}

/// What decides a worker's exit.
pub(crate) enum Mode {
    /// A static job: a worker that fails fails the job, and its peers learn of it within
    /// `lost_after` (from the coordinator, or from etcd), after which those still running
    /// are killed.
    Static { lost_after: Duration },
    /// An elastic job: its restart policy decides. `heartbeat_timeout` is the silence after
    /// which a worker is lost, `max_restarts` the replacements allowed, `node` this node's
    /// index in a job of several (for the job's record).
    Elastic { policy: RestartPolicy, max_restarts: u32, heartbeat_timeout: Duration, node: Option<u64> },
}

/// The launcher's side of the job while it runs.
pub(crate) struct Supervisor {
    mode: Mode,
    pub started: Instant,
    pub workers: Workers<Heard>,
    /// This node's slots, by local rank.
    slots: Vec<usize>,
    /// Processes started so far, by local rank.
    incarnations: Vec<u64>,
    /// Whether this launcher serves an elastic job's coordinator (one node, node 0 of
    /// several, or the holder of the role in etcd): it stays while the job goes on.
    pub serves: bool,
    /// Whether it holds the role by election (in etcd), and the workers its coordinator
    /// lost, to kill once the role is confirmed: a holder stopped past its lease and
    /// continued first sees its workers' connections to it closed (they moved to the new
    /// holder), and must not kill them for that.
    pub elected: bool,
    doomed: Vec<(Instant, usize, u64)>,
    pub finished: bool,
    /// Since when the job is over.
    over_since: Option<Instant>,
    /// When a static job's first worker failed.
    failed_at: Option<Instant>,
    /// The slots killed once the job was over (their exits are not failures).
    killed: BTreeSet<usize>,
    /// Whether the grace after the job's end is over (the workers left were killed).
    grace_over: bool,
    pub stopped_on_error: Option<usize>,
    /// The job's record (`events.jsonl`), kept while this launcher serves the coordinator.
    pub record: Recorder,
    /// What failed, in a static job.
    pub failures: Vec<String>,
}

impl Supervisor {
    /// The supervision of `workers` in `slots` (this node's, by local rank).
    pub fn new(mode: Mode, workers: Workers<Heard>, slots: Vec<usize>, record: Recorder) -> Self {
        Supervisor {
            mode,
            started: Instant::now(),
            workers,
            incarnations: vec![0; slots.len()],
            slots,
            serves: false,
            elected: false,
            doomed: Vec::new(),
            finished: false,
            over_since: None,
            failed_at: None,
            killed: BTreeSet::new(),
            grace_over: false,
            stopped_on_error: None,
            record,
            failures: Vec::new(),
        }
    }

    /// Whether the job is elastic.
    fn elastic(&self) -> bool {
        matches!(self.mode, Mode::Elastic { .. })
    }

    /// This node's index in an elastic job of several nodes.
    fn node(&self) -> Option<u64> {
        match self.mode {
            Mode::Elastic { node, .. } => node,
            Mode::Static { .. } => None,
        }
    }

    /// Replacements made so far.
    pub fn restarts(&self) -> u32 {
        match &self.mode {
            Mode::Elastic { policy, .. } => policy.restarts(),
            Mode::Static { .. } => 0,
        }
    }

    /// The local rank of this node's `slot`.
    fn local(&self, slot: usize) -> usize {
        self.slots.iter().position(|&s| s == slot).expect("a slot of this node")
    }

    /// Starts every slot's first process.
    pub fn start_all(&mut self) -> Result<(), LaunchError> {
        for slot in self.slots.clone() {
            self.start(slot)?;
        }
        Ok(())
    }

    /// Starts the slot's next process (an elastic job's worker is told which it is, and
    /// each start is said).
    fn start(&mut self, slot: usize) -> Result<(), LaunchError> {
        let local = self.local(slot);
        let incarnation = self.incarnations[local];
        let mut env =
            vec![("STEADFAST_RANK".to_owned(), slot.to_string()), ("LOCAL_RANK".to_owned(), local.to_string())];
        if self.elastic() {
            env.push(("STEADFAST_INCARNATION".to_owned(), incarnation.to_string()));
        }
        let pid = self.workers.start(slot, incarnation, &env)?;
        if self.elastic() {
            say!(self.started, "worker {slot} started: process {} (pid {pid})", incarnation + 1);
        }
        Ok(())
    }

    /// When the workers still running are to be killed: a grace after the job is over (a
    /// static job's failure gives its peers the time to learn of it first). `None` while
    /// the job goes on, or once they were killed.
    fn kill_at(&self) -> Option<Instant> {
        if self.grace_over {
            return None;
        }
        match self.mode {
            Mode::Static { lost_after } => {
                let failed = self.failed_at.map(|t| t + lost_after + KILL_GRACE);
                failed.into_iter().chain(self.over_since.map(|t| t + KILL_GRACE)).min()
            }
            Mode::Elastic { heartbeat_timeout, .. } => {
                // A node without the coordinator learns of the end from its first worker
                // that finished, so the others get the time to hear it from the
                // coordinator as well. Workers of a job that ended well are evaluating the
                // final state: they get longer.
                let grace = if self.serves { KILL_GRACE } else { KILL_GRACE + 2 * heartbeat_timeout };
                let grace = if self.finished { grace.max(FINISHED_GRACE) } else { grace };
                self.over_since.map(|t| t + grace)
            }
        }
    }

    /// Handles what the launcher hears until no worker runs (and, while this launcher
    /// serves an elastic job's coordinator, until the job is over). `requests` reach an
    /// elastic job's coordinator.
    pub fn supervise(&mut self, rx: &Receiver<Heard>, requests: Option<&Requests>) -> Result<(), LaunchError> {
        while self.workers.any_running() || (self.serves && self.over_since.is_none()) {
            let now = Instant::now();
            let wait = self
                .kill_at()
                .into_iter()
                .chain(self.doomed.iter().map(|(at, ..)| *at))
                .map(|at| at.saturating_duration_since(now))
                .fold(Duration::from_secs(3600), Duration::min);
            match rx.recv_timeout(wait) {
                Ok(Heard::Exited(e)) => self.on_exit(e, requests)?,
                // A worker the coordinator lost may still run (hung, or cut off): end it.
                // (Only the process lost: its replacement may have started already.)
                Ok(Heard::Lost { slot, incarnation }) if self.elected => {
                    self.doomed.push((Instant::now() + ROLE_CONFIRMED, slot, incarnation));
                }
                Ok(Heard::Lost { slot, incarnation }) => self.kill_lost(slot, incarnation),
                Ok(Heard::Finished) => self.finished = true,
                Ok(Heard::CoordinatorDone) => {
                    self.over_since.get_or_insert_with(Instant::now);
                }
                Ok(Heard::Said(event)) => self.record.said(&event),
                Ok(Heard::Elected(generation)) => {
                    self.record.elected(generation, self.node());
                    self.serves = true;
                    say!(self.started, "this launcher holds the coordinator role (generation {generation})");
                }
                Ok(Heard::RoleLost(why)) => {
                    self.record.role_lost(&why, self.node());
                    self.serves = false;
                    say!(self.started, "this launcher lost the coordinator role: {why}");
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Once the job is over, a worker still running after the grace is hung or was
            // never told: it is killed.
            if self.kill_at().is_some_and(|at| at <= Instant::now()) {
                self.kill_the_rest();
            }
            if let Some(requests) = requests
                && self.stopped_on_error.is_some()
            {
                requests.shutdown.store(true, Ordering::Relaxed);
            }
            let now = Instant::now();
            for (_, slot, incarnation) in self.doomed.extract_if(.., |(at, ..)| *at <= now).collect::<Vec<_>>() {
                if self.serves {
                    self.kill_lost(slot, incarnation);
                } else {
                    say!(
                        self.started,
                        "worker {slot} goes on: this launcher's coordinator lost it after losing the role"
                    );
                }
            }
        }
        Ok(())
    }

    /// Kills every worker still running once the job is over.
    fn kill_the_rest(&mut self) {
        for slot in self.workers.running() {
            if let Some(pid) = self.workers.kill(slot, None) {
                self.killed.insert(slot);
                match self.mode {
                    Mode::Static { .. } => {
                        self.failures.push(format!("rank {slot} was killed: still running after the job ended"));
                    }
                    Mode::Elastic { .. } => {
                        say!(self.started, "killing worker {slot} (pid {pid}): still running after the job ended");
                    }
                }
            }
        }
        self.grace_over = true;
    }

    /// Kills process `incarnation` of `slot`, which the coordinator lost (hung, or cut off);
    /// its replacement may have started already, and lives.
    fn kill_lost(&mut self, slot: usize, incarnation: u64) {
        if let Some(pid) = self.workers.kill(slot, Some(incarnation)) {
            self.record.killing(slot, incarnation);
            say!(self.started, "killing worker {slot} (pid {pid}): the coordinator lost it");
        }
    }

    /// A worker's process exited: the job's mode decides.
    fn on_exit(&mut self, e: Exited, requests: Option<&Requests>) -> Result<(), LaunchError> {
        self.workers.exited(&e);
        if !self.elastic() {
            self.on_static_exit(e);
            return Ok(());
        }
        let (slot, started) = (e.slot, self.started);
        let killed = self.killed.contains(&slot);
        let status = e.status.map_err(|why| LaunchError::Failed(format!("cannot reap worker {slot}: {why}")))?;
        let exit = Exit::of(status);
        // (A worker killed after the end of the job was said to be.)
        if exit != Exit::Success && !killed {
            say!(started, "worker {slot} (process {}) exited with {status}", e.incarnation + 1);
            self.record.exited(slot, e.incarnation, Ok(status));
        }
        if exit == Exit::Success {
            // A worker exits with success only once the job has finished. A node without
            // the coordinator hears it so: the rest of its workers have a grace to end.
            self.finished = true;
            if !self.serves {
                self.over_since.get_or_insert_with(Instant::now);
            }
        }
        let over = self.over_since.is_some() || self.finished;
        // A worker that fails as it ends (its last checkpoint, evaluation or summary: an
        // error, or a panic) fails the job, finished or not. One killed from outside once
        // the job is over is a loss, not an error: its peers hold the final state, and a
        // kill during the last checkpoint's agreement fails them, which fails the job.
        let killed_from_outside = std::os::unix::process::ExitStatusExt::signal(&status).is_some();
        if exit != Exit::Success && !killed && over && !killed_from_outside {
            self.stopped_on_error.get_or_insert(slot);
        }
        let Mode::Elastic { policy, max_restarts, .. } = &mut self.mode else { unreachable!("an elastic job's exit") };
        let (remedy, max_restarts) = (policy.on_exit(exit, over), *max_restarts);
        match remedy {
            Remedy::Nothing | Remedy::Shrink => {}
            Remedy::Replace { restart } => {
                let local = self.local(slot);
                self.incarnations[local] += 1;
                say!(started, "replacing worker {slot} (restart {restart} of {max_restarts})");
                let incarnation = self.incarnations[local];
                self.record.replaced(slot, incarnation, restart, max_restarts);
                self.start(slot)?;
            }
            Remedy::Fail => {
                say!(started, "worker {slot} stopped on an error: the job ends");
                let reason = format!("worker {slot} stopped on an error (its output says which)");
                self.record.said(&MembershipEvent::Stopped { reason });
                self.stopped_on_error = Some(slot);
                self.over_since.get_or_insert_with(Instant::now);
            }
            Remedy::Stop { reason } => {
                say!(started, "the job ends: {reason}");
                // The coordinator tells every survivor why, and they exit.
                if let Some(requests) = requests {
                    *requests.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                }
                self.over_since = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// A static job's worker exited: a failure ends the job.
    fn on_static_exit(&mut self, e: Exited) {
        let slot = e.slot;
        match e.status {
            _ if self.killed.contains(&slot) => {}
            Ok(status) if status.success() => {}
            Ok(status) => self.failures.push(format!("rank {slot} exited with {status}")),
            Err(why) => self.failures.push(format!("rank {slot} could not be reaped: {why}")),
        }
        if !self.failures.is_empty() {
            self.failed_at.get_or_insert_with(Instant::now);
        }
    }
}
