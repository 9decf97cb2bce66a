//! `steadfast launch --max-restarts K`: an elastic job on this host, which survives the
//! loss of workers.
//!
//! The launcher runs the step protocol's coordinator ([`comm::control::coordinate`]) on
//! a loopback port and starts `--nproc` workers in slots `0..nproc`. When a worker's
//! process exits with an error, or the coordinator declares it lost (a hung or cut-off
//! process, which the launcher then kills), the launcher either starts a new process in
//! the slot (`--on-failure replace`, at most K times in all), which fetches the state from
//! the live replicas, or leaves the survivors to go on without it (`shrink`). Survivors
//! never restart. Every failure and recovery is one line of output.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use comm::control::Event;
use comm::protocol::coordinator::Stage;
use comm::protocol::{Coordinator, Timing};

use crate::procs::{KILL_GRACE, forward_output, job_secret, say};
use crate::restart_policy::{Decision, Exit, OnFailure, RestartPolicy};

/// How an elastic job is run.
pub struct Plan {
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

struct Slot {
    child: Option<Child>,
    incarnation: u64,
    /// Exited with success.
    finished: bool,
}

/// Runs the job; fails unless it finished.
pub fn run(plan: Plan) -> anyhow::Result<()> {
    let secret = job_secret()?;
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen for the coordinator")?;
    let coordinator = listener.local_addr()?;
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let timing = Timing::for_coordinator(plan.heartbeat_timeout, plan.settle, plan.quorum_timeout);
    let min_world = match plan.on_failure {
        // A replaced worker is waited for: the job keeps its world size (and, in the
        // `deterministic` mode, its bits).
        OnFailure::Replace => plan.nproc,
        OnFailure::Shrink => plan.min_nproc,
    };
    let machine = Coordinator::new(0, plan.nproc, min_world, timing, Instant::now());
    let requests = comm::control::Requests::default();
    // Once every member holds the final state, a failure is not replaced.
    let finished = AtomicBool::new(false);
    let (lost_tx, lost_rx) = mpsc::channel();
    let started = Instant::now();
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    let spawn = |slot: usize, incarnation: u64, pumps: &mut Vec<JoinHandle<()>>| -> anyhow::Result<Child> {
        let mut child = Command::new(&exe)
            .args(&plan.command)
            .env("STEADFAST_RANK", slot.to_string())
            .env("STEADFAST_WORLD_SIZE", plan.nproc.to_string())
            .env("STEADFAST_COORDINATOR", coordinator.to_string())
            .env("STEADFAST_SECRET", &secret)
            .env("STEADFAST_ELASTIC", "1")
            .env("STEADFAST_INCARNATION", incarnation.to_string())
            .env(crate::train_cmd::LAUNCHER_PID, std::process::id().to_string())
            .envs(plan.copy_every.map(|k| ("STEADFAST_COPY_EVERY", k.to_string())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start worker {slot}"))?;
        pumps.extend(forward_output(slot, &mut child));
        say!(started, "worker {slot} started: process {} (pid {})", incarnation + 1, child.id());
        Ok(child)
    };
    let mut slots = Vec::new();
    for slot in 0..plan.nproc {
        slots.push(Slot { child: Some(spawn(slot, 0, &mut pumps)?), incarnation: 0, finished: false });
    }
    let mut policy = RestartPolicy::new(plan.nproc, plan.on_failure, plan.max_restarts, min_world);
    let stage = std::thread::scope(|s| -> anyhow::Result<Stage> {
        let (requests, finished) = (&requests, &finished);
        let shutdown = &requests.shutdown;
        let key = secret.as_bytes();
        let coordinator = s.spawn(move || {
            comm::control::coordinate(listener, key, machine, timing, requests, &mut |event| {
                println!("[coordinator] {:>7.2} s  {event}", started.elapsed().as_secs_f64());
                match event {
                    Event::Lost { id, incarnation, .. } => {
                        let _ = lost_tx.send((id as usize, incarnation));
                    }
                    Event::Finished => finished.store(true, Ordering::Relaxed),
                    _ => {}
                }
            })
        });
        let mut over_since: Option<Instant> = None;
        let mut stopped_on_error: Option<usize> = None;
        loop {
            // A worker the coordinator lost may still run (hung, or cut off): end it.
            // (Only the process lost: its replacement may have started already.)
            while let Ok((slot, incarnation)) = lost_rx.try_recv() {
                if let Some(s) = slots.get_mut(slot).filter(|s| s.incarnation == incarnation)
                    && let Some(child) = s.child.as_mut()
                    && child.try_wait().ok().flatten().is_none()
                {
                    say!(started, "killing worker {slot} (pid {}): the coordinator lost it", child.id());
                    let _ = child.kill();
                }
            }
            for (i, slot) in slots.iter_mut().enumerate() {
                let Some(child) = slot.child.as_mut() else { continue };
                let Some(status) = child.try_wait().with_context(|| format!("waiting for worker {i}"))? else {
                    continue;
                };
                slot.child = None;
                let exit = Exit::of(status);
                if exit == Exit::Success {
                    slot.finished = true;
                } else {
                    say!(started, "worker {i} (process {}) exited with {status}", slot.incarnation + 1);
                }
                let over = over_since.is_some() || finished.load(Ordering::Relaxed);
                match policy.on_exit(exit, over) {
                    Decision::Nothing | Decision::Shrink => {}
                    Decision::Replace { restart } => {
                        slot.incarnation += 1;
                        say!(started, "replacing worker {i} (restart {restart} of {})", plan.max_restarts);
                        slot.child = Some(spawn(i, slot.incarnation, &mut pumps)?);
                    }
                    Decision::Fail => {
                        say!(started, "worker {i} stopped on an error: the job ends");
                        stopped_on_error = Some(i);
                        over_since.get_or_insert_with(Instant::now);
                    }
                    Decision::Stop { reason } => {
                        say!(started, "the job ends: {reason}");
                        // The coordinator tells every survivor why, and they exit.
                        *requests.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                        over_since = Some(Instant::now());
                    }
                }
            }
            let running = slots.iter().any(|s| s.child.is_some());
            if coordinator.is_finished() && over_since.is_none() {
                over_since = Some(Instant::now());
            }
            if !running {
                shutdown.store(true, Ordering::Relaxed);
                break;
            }
            if stopped_on_error.is_some() {
                shutdown.store(true, Ordering::Relaxed);
            }
            // The job is over and a worker still runs: it is hung or was never told.
            if over_since.is_some_and(|t| t.elapsed() > KILL_GRACE) {
                for (i, slot) in slots.iter_mut().enumerate() {
                    if let Some(mut child) = slot.child.take() {
                        say!(started, "killing worker {i}: still running after the job ended");
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let stage = match coordinator.join() {
            Ok(stage) => stage?,
            Err(_) => anyhow::bail!("the coordinator thread panicked"),
        };
        // A job the coordinator stopped says why; one a worker's error ended points at it.
        if let Some(i) = stopped_on_error
            && matches!(stage, Stage::Gathering { .. } | Stage::Syncing { .. } | Stage::Running)
        {
            anyhow::bail!("worker {i} stopped on an error (above)");
        }
        Ok(stage)
    })?;
    for p in pumps {
        let _ = p.join();
    }
    match stage {
        Stage::Finished => {
            println!(
                "[launcher] the job finished in {:.1} s with {} replacement(s)",
                started.elapsed().as_secs_f64(),
                policy.restarts()
            );
            Ok(())
        }
        Stage::Stopped { reason } => anyhow::bail!("the job stopped: {reason}"),
        _ => anyhow::bail!("every worker exited before the job finished"),
    }
}
