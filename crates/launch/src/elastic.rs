//! An elastic job on this host, which survives the loss of workers
//! (`steadfast launch --max-restarts K`, or `--on-failure shrink`).
//!
//! The launcher runs the step protocol's coordinator ([`comm::control::coordinate`]) on
//! a loopback port and starts `nproc` workers in slots `0..nproc`. When a worker's
//! process exits with an error, or the coordinator declares it lost (a hung or cut-off
//! process, which the launcher then kills), the [`RestartPolicy`] says whether a new
//! process takes the slot (`replace`, at most K times in all), which fetches the state
//! from the live replicas, or the survivors go on without it (`shrink`), or the job ends.
//! Survivors never restart. Every failure and recovery is one line of output.

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use comm::control::{Event, Requests};
use comm::protocol::coordinator::JobState;
use comm::protocol::{Coordinator, Timing};

use crate::workers::{Exited, Workers};
use crate::{Decision, Exit, KILL_GRACE, LaunchError, OnFailure, RestartPolicy, job_secret, say};

/// How an elastic job is run.
pub struct ElasticJob {
    /// Workers at the start.
    pub nproc: usize,
    /// Replacement processes allowed, in all.
    pub max_restarts: u32,
    /// Replace or shrink.
    pub on_failure: OnFailure,
    /// The fewest workers the job goes on with.
    pub min_nproc: usize,
    /// Silence after which a worker is lost.
    pub heartbeat_timeout: Duration,
    /// How long the first quorum waits for every worker.
    pub settle: Duration,
    /// How long the job waits for enough workers before it stops.
    pub quorum_timeout: Duration,
    /// The rollback baseline: workers copy their state every this many steps and go
    /// back to the copy when a member is lost.
    pub copy_every: Option<u64>,
    /// The worker command (`train ...`).
    pub command: Vec<String>,
}

/// What the launcher hears.
enum Heard {
    /// A worker's process exited.
    Exited(Exited),
    /// The coordinator lost process `incarnation` of `slot`.
    Lost { slot: usize, incarnation: u64 },
    /// Every member holds the final state: a failure is not replaced any more.
    Finished,
    /// The coordinator returned: the job is over.
    CoordinatorDone,
}

/// The launcher's side of the job while it runs.
struct Supervisor<'p> {
    plan: &'p ElasticJob,
    started: Instant,
    workers: Workers<Heard>,
    incarnations: Vec<u64>,
    policy: RestartPolicy,
    finished: bool,
    /// Since when the job is over (a worker still running then is killed after a grace).
    over_since: Option<Instant>,
    /// Whether the workers left after the grace were killed.
    killed: bool,
    stopped_on_error: Option<usize>,
}

/// Runs the job; fails unless it finished.
pub fn run(plan: ElasticJob) -> Result<(), LaunchError> {
    let secret = job_secret()?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(LaunchError::io("cannot listen for the coordinator"))?;
    let coordinator = listener.local_addr().map_err(LaunchError::io("cannot read the coordinator's address"))?;
    let timing = Timing::for_coordinator(plan.heartbeat_timeout, plan.settle, plan.quorum_timeout);
    let min_world = match plan.on_failure {
        // A replaced worker is waited for: the job keeps its world size (and, in the
        // `deterministic` mode, its bits).
        OnFailure::Replace => plan.nproc,
        OnFailure::Shrink => plan.min_nproc,
    };
    let machine = Coordinator::new(0, plan.nproc, min_world, timing, Instant::now());
    let requests = Requests::default();
    let (tx, rx) = mpsc::channel();
    let mut env = vec![
        ("STEADFAST_WORLD_SIZE".to_owned(), plan.nproc.to_string()),
        ("STEADFAST_COORDINATOR".to_owned(), coordinator.to_string()),
        ("STEADFAST_SECRET".to_owned(), secret.clone()),
        ("STEADFAST_ELASTIC".to_owned(), "1".to_owned()),
    ];
    env.extend(plan.copy_every.map(|k| ("STEADFAST_COPY_EVERY".to_owned(), k.to_string())));
    let mut job = Supervisor {
        plan: &plan,
        started: Instant::now(),
        workers: Workers::new(&plan.command, env, tx.clone(), Heard::Exited)?,
        incarnations: vec![0; plan.nproc],
        policy: RestartPolicy::new(plan.nproc, plan.on_failure, plan.max_restarts, min_world),
        finished: false,
        over_since: None,
        killed: false,
        stopped_on_error: None,
    };
    for slot in 0..plan.nproc {
        job.start(slot)?;
    }
    let started = job.started;
    let stage = std::thread::scope(|s| -> Result<JobState, LaunchError> {
        let requests = &requests;
        let key = secret.as_bytes();
        let coordinator = s.spawn(move || {
            let stage = comm::control::coordinate(listener, key, machine, timing, requests, &mut |event| {
                println!("[coordinator] {:>7.2} s  {event}", started.elapsed().as_secs_f64());
                let _ = match event {
                    Event::Lost { id, incarnation, .. } => tx.send(Heard::Lost { slot: id as usize, incarnation }),
                    Event::Finished => tx.send(Heard::Finished),
                    _ => Ok(()),
                };
            });
            let _ = tx.send(Heard::CoordinatorDone);
            stage
        });
        let supervised = job.supervise(&rx, requests);
        // Also when supervision failed: the coordinator's thread must end.
        requests.shutdown.store(true, Ordering::Relaxed);
        supervised?;
        let stage = match coordinator.join() {
            Ok(stage) => stage.map_err(|e| LaunchError::Failed(format!("the coordinator failed: {e}")))?,
            Err(_) => return Err(LaunchError::Failed("the coordinator thread panicked".into())),
        };
        // A job the coordinator stopped says why; one a worker's error ended points at it.
        if let Some(i) = job.stopped_on_error
            && matches!(stage, JobState::Gathering { .. } | JobState::Syncing { .. } | JobState::Running)
        {
            return Err(LaunchError::Failed(format!("worker {i} stopped on an error (above)")));
        }
        Ok(stage)
    })?;
    let restarts = job.policy.restarts();
    job.workers.join();
    match stage {
        JobState::Finished => {
            println!(
                "[launcher] the job finished in {:.1} s with {restarts} replacement(s)",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        JobState::Stopped { reason } => Err(LaunchError::Failed(format!("the job stopped: {reason}"))),
        _ => Err(LaunchError::Failed("every worker exited before the job finished".into())),
    }
}

impl Supervisor<'_> {
    /// Starts the slot's next process.
    fn start(&mut self, slot: usize) -> Result<(), LaunchError> {
        let incarnation = self.incarnations[slot];
        let env = [
            ("STEADFAST_RANK".to_owned(), slot.to_string()),
            ("STEADFAST_INCARNATION".to_owned(), incarnation.to_string()),
        ];
        let pid = self.workers.start(slot, incarnation, &env)?;
        say!(self.started, "worker {slot} started: process {} (pid {pid})", incarnation + 1);
        Ok(())
    }

    /// Handles what the launcher hears until no worker runs.
    fn supervise(&mut self, rx: &Receiver<Heard>, requests: &Requests) -> Result<(), LaunchError> {
        while self.workers.any_running() {
            // Once the job is over, a worker still running after the grace is hung or was
            // never told: it is killed.
            let wait = match self.over_since {
                Some(t) if !self.killed => KILL_GRACE.saturating_sub(t.elapsed()),
                _ => Duration::from_secs(3600),
            };
            match rx.recv_timeout(wait) {
                Ok(Heard::Exited(e)) => self.on_exit(e, requests)?,
                // A worker the coordinator lost may still run (hung, or cut off): end it.
                // (Only the process lost: its replacement may have started already.)
                Ok(Heard::Lost { slot, incarnation }) => {
                    if let Some(pid) = self.workers.kill(slot, Some(incarnation)) {
                        say!(self.started, "killing worker {slot} (pid {pid}): the coordinator lost it");
                    }
                }
                Ok(Heard::Finished) => self.finished = true,
                Ok(Heard::CoordinatorDone) => {
                    self.over_since.get_or_insert_with(Instant::now);
                }
                Err(RecvTimeoutError::Timeout) if self.over_since.is_none() || self.killed => {}
                Err(RecvTimeoutError::Timeout) => {
                    self.killed = true;
                    for slot in self.workers.running() {
                        if self.workers.kill(slot, None).is_some() {
                            say!(self.started, "killing worker {slot}: still running after the job ended");
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.stopped_on_error.is_some() {
                requests.shutdown.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// A worker's process exited: the policy decides.
    fn on_exit(&mut self, e: Exited, requests: &Requests) -> Result<(), LaunchError> {
        self.workers.exited(&e);
        let (slot, started) = (e.slot, self.started);
        let status = e.status.map_err(|why| LaunchError::Failed(format!("cannot reap worker {slot}: {why}")))?;
        let exit = Exit::of(status);
        // (A worker killed after the end of the job was said to be.)
        if exit != Exit::Success && !self.killed {
            say!(started, "worker {slot} (process {}) exited with {status}", e.incarnation + 1);
        }
        let over = self.over_since.is_some() || self.finished;
        match self.policy.on_exit(exit, over) {
            Decision::Nothing | Decision::Shrink => {}
            Decision::Replace { restart } => {
                self.incarnations[slot] += 1;
                say!(started, "replacing worker {slot} (restart {restart} of {})", self.plan.max_restarts);
                self.start(slot)?;
            }
            Decision::Fail => {
                say!(started, "worker {slot} stopped on an error: the job ends");
                self.stopped_on_error = Some(slot);
                self.over_since.get_or_insert_with(Instant::now);
            }
            Decision::Stop { reason } => {
                say!(started, "the job ends: {reason}");
                // The coordinator tells every survivor why, and they exit.
                *requests.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                self.over_since = Some(Instant::now());
            }
        }
        Ok(())
    }
}
