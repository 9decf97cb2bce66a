//! `steadfast launch --max-restarts K --recovery replay`: a pipeline job that loses a stage
//! worker and goes on.
//!
//! The workers checkpoint every `--save-every` steps (each stage its own) and log every
//! stage boundary. When one fails, this launcher starts a replacement in its slot (at most
//! K times in all); the survivors keep their state and meet the replacement again at the
//! coordinator, which serves one rendezvous after another: each membership lasts until
//! a member is lost. The replacement restores its stage's newest checkpoint and replays
//! the steps since on the tensors its neighbours logged, shared with `--replay-helpers`
//! ranks, while the others wait (see `train::pipeline::recovery`). Nobody else rolls
//! back, and the job ends with the bits of a run that never failed.
//!
//! With `--on-failure shrink` no replacement comes: the coordinator forms the next
//! membership from the survivors (ranked in the order of their slots), and each lost
//! worker's micro-batches go to a surviving worker of its stage, which computes them
//! besides its own (see `train::pipeline::Layout::rank`). Nothing is replayed, so nothing
//! is logged; the bits are still those of the run that never failed.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::workers::{Exited, Workers};
use crate::{KILL_GRACE, LaunchError};

/// A pipeline job that recovers by replay, on one node.
pub struct ReplayJob {
    /// Workers.
    pub nproc: usize,
    /// Replacements at most, in all.
    pub max_restarts: u32,
    /// Steps between checkpoints.
    pub save_every: u64,
    /// Where the checkpoints go (a temporary directory when `None`).
    pub save_dir: Option<PathBuf>,
    /// Ranks that share a replay.
    pub helpers: usize,
    /// The worker command (`train ... --pipeline-stages S`).
    pub command: Vec<String>,
    /// How long the workers have to join, each time.
    pub rendezvous_timeout: Duration,
    /// Silence after which a worker is lost.
    pub heartbeat_timeout: Duration,
    /// Go on without a lost worker (`--on-failure shrink`) instead of replacing it.
    pub shrink: bool,
}

enum Heard {
    Exited(Exited),
    /// A membership formed: every worker running now is in it.
    Formed,
    /// The coordinator declared a member of the last membership lost (it may still run:
    /// stopped, or cut off).
    Lost(usize),
    /// The coordinator ended: every member finished, or a rendezvous failed.
    Over(Result<(), String>),
}

/// Runs the job; fails unless every worker finished.
pub fn run(plan: ReplayJob) -> Result<(), LaunchError> {
    let bad = |text: &str| LaunchError::Config(text.to_owned());
    if !plan.command.iter().any(|a| a == "--pipeline-stages") {
        return Err(bad("--recovery replay replays the stages of a pipeline: the command needs --pipeline-stages"));
    }
    crate::restart::refuse_checkpoint_flags(&plan.command, "replay")?;
    let (dir, temporary) = crate::restart::save_dir(plan.save_dir.as_ref(), "replay")?;
    let mut command = plan.command.clone();
    command.extend(["--checkpoint-dir".into(), dir.display().to_string()]);
    command.extend(["--checkpoint-every".into(), plan.save_every.to_string(), "--keep-last".into(), "2".into()]);
    // Every boundary is logged unless the command chooses (by a list or a budget).
    let chooses =
        |a: &String| ["--log-boundaries", "--log-budget"].iter().any(|f| a == f || a.starts_with(&format!("{f}=")));
    if plan.shrink && command.iter().any(chooses) {
        return Err(bad("--on-failure shrink reroutes a lost stage's work and replays nothing: log no boundary"));
    }
    if !plan.shrink && !command.iter().any(chooses) {
        command.extend(["--log-boundaries".into(), "all".into()]);
    }
    let secret = crate::shared_secret(false)?;
    let (listener, address) = crate::coordinator_listener(None)?;
    let (tx, rx) = mpsc::channel();
    let mut env = vec![
        ("STEADFAST_WORLD_SIZE".to_owned(), plan.nproc.to_string()),
        ("STEADFAST_COORDINATOR".to_owned(), address),
        ("STEADFAST_SECRET".to_owned(), secret.clone()),
        ("LOCAL_WORLD_SIZE".to_owned(), plan.nproc.to_string()),
        ("GROUP_RANK".to_owned(), "0".to_owned()),
        ("STEADFAST_RECOVER_BY_REPLAY".to_owned(), "true".to_owned()),
        ("STEADFAST_REPLAY_HELPERS".to_owned(), plan.helpers.to_string()),
    ];
    if plan.shrink {
        env.push(("STEADFAST_REROUTE".to_owned(), "true".to_owned()));
    }
    let mut workers = Workers::new(&command, env, tx.clone(), Heard::Exited)?;
    let started = Instant::now();
    for rank in 0..plan.nproc {
        workers.start(rank, 0, &place(rank, 0))?;
    }
    let stop = AtomicBool::new(false);
    // The slots whose workers exited without a replacement (with --on-failure shrink).
    let gone = Mutex::new(Vec::new());
    let outcome = std::thread::scope(|s| {
        let (stop, gone) = (&stop, &gone);
        let secret = secret.into_bytes();
        s.spawn(move || {
            let times = (plan.rendezvous_timeout, plan.heartbeat_timeout);
            let shrink = plan.shrink.then_some(gone);
            let over = serve_rounds(&listener, (plan.nproc, shrink), &secret, times, stop, &mut |event| {
                let _ = tx.send(event);
            });
            let _ = tx.send(Heard::Over(over));
        });
        let outcome = watch(&mut workers, &rx, (&plan, gone), started);
        stop.store(true, Ordering::Relaxed);
        outcome
    });
    workers.join();
    if outcome.is_ok() && temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

/// The environment of process `incarnation` of `rank`.
fn place(rank: usize, incarnation: u64) -> Vec<(String, String)> {
    vec![
        ("STEADFAST_RANK".to_owned(), rank.to_string()),
        ("LOCAL_RANK".to_owned(), rank.to_string()),
        ("STEADFAST_INCARNATION".to_owned(), incarnation.to_string()),
    ]
}

/// The coordinator: one rendezvous after another, each membership supervised until a
/// member is lost (each told to `heard`, by slot); ends when a membership ends with every
/// member finished. Each membership is of the `world` slots, or, when `shrink`, of the
/// slots that the memberships before did not lose.
fn serve_rounds(
    listener: &std::net::TcpListener,
    (world, shrink): (usize, Option<&Mutex<Vec<usize>>>),
    secret: &[u8],
    (timeout, heartbeat): (Duration, Duration),
    stop: &AtomicBool,
    heard: &mut dyn FnMut(Heard),
) -> Result<(), String> {
    let mut slots: Vec<usize> = (0..world).collect();
    // A worker that exits while the others meet again is not waited for.
    let exited = |slot: usize| shrink.is_some_and(|g| g.lock().unwrap_or_else(|e| e.into_inner()).contains(&slot));
    for round in 0.. {
        let expected = (&slots[..], &exited as &dyn Fn(usize) -> bool);
        let job = comm::rendezvous::serve_members(listener, expected, secret, (timeout, heartbeat), stop)
            .map_err(|e| format!("rendezvous {round}: {e}"))?;
        heard(Heard::Formed);
        let members = job.slots.clone();
        let membership = comm::supervisor::supervise_until_loss(job.streams, heartbeat, &mut |event| {
            eprintln!("[coordinator] {event}");
            heard(Heard::Lost(members[event.rank]));
        });
        if membership.lost().is_empty() {
            return Ok(());
        }
        if shrink.is_some() {
            let lost: Vec<usize> = membership.lost().iter().map(|&(r, _)| members[r]).collect();
            slots.retain(|s| !lost.contains(s) && !exited(*s));
        }
    }
    Ok(())
}

/// Waits for every worker to finish, starting a replacement for each that fails while
/// restarts remain; otherwise ends the others. Returns whether the job finished.
fn watch(
    workers: &mut Workers<Heard>,
    rx: &mpsc::Receiver<Heard>,
    (plan, gone): (&ReplayJob, &Mutex<Vec<usize>>),
    started: Instant,
) -> Result<(), LaunchError> {
    let mut restarts = 0u32;
    let mut incarnations = vec![0u64; plan.nproc];
    // The processes of the last membership: a loss names one of them, perhaps one that a
    // replacement has taken the place of already.
    let mut members = incarnations.clone();
    let mut failure: Option<String> = None;
    let mut kill_at: Option<Instant> = None;
    let (mut finished, mut left) = (0, plan.nproc);
    // A worker that fails before the job first formed (a misspelt flag) fails the job.
    let mut formed = false;
    while workers.any_running() {
        let wait = kill_at.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait) {
            Ok(Heard::Exited(e)) => {
                workers.exited(&e);
                let ok = matches!(&e.status, Ok(s) if s.success());
                finished += usize::from(ok);
                if ok || failure.is_some() || e.incarnation != incarnations[e.slot] {
                    continue;
                }
                let why = match &e.status {
                    Ok(s) => format!("rank {} exited with {s}", e.slot),
                    Err(w) => format!("rank {} could not be reaped: {w}", e.slot),
                };
                if plan.shrink && formed {
                    gone.lock().unwrap_or_else(|e| e.into_inner()).push(e.slot);
                    left -= 1;
                    println!(
                        "[launcher] {:>10.2} s  {why}: its stage's other workers take over its micro-batches \
                         ({left} workers left)",
                        started.elapsed().as_secs_f64()
                    );
                } else if restarts < plan.max_restarts {
                    restarts += 1;
                    incarnations[e.slot] += 1;
                    println!(
                        "[launcher] {:>10.2} s  {why}: starting a replacement (restart {restarts} of {})",
                        started.elapsed().as_secs_f64(),
                        plan.max_restarts
                    );
                    workers.start(e.slot, incarnations[e.slot], &place(e.slot, incarnations[e.slot]))?;
                } else {
                    failure = Some(why);
                    kill_at = Some(Instant::now() + plan.heartbeat_timeout + KILL_GRACE);
                }
            }
            // A worker the others cannot hear is ended, so that a replacement takes its place.
            Ok(Heard::Formed) => {
                formed = true;
                members.clone_from(&incarnations);
            }
            Ok(Heard::Lost(rank)) => {
                if failure.is_none() && workers.kill(rank, Some(members[rank])).is_some() {
                    println!(
                        "[launcher] {:>10.2} s  rank {rank} was lost: its process is ended",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Ok(Heard::Over(Err(e))) => {
                failure.get_or_insert(e);
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
            Ok(Heard::Over(Ok(()))) => {}
            Err(RecvTimeoutError::Timeout) if kill_at.is_some() => {
                for rank in workers.running() {
                    workers.kill(rank, None);
                }
                kill_at = None;
            }
            Err(_) => {}
        }
    }
    if plan.shrink && finished == 0 {
        failure.get_or_insert_with(|| "no worker finished".to_owned());
    }
    match failure {
        None if plan.shrink => {
            println!(
                "[launcher] the job finished in {:.1} s with {left} of {} workers",
                started.elapsed().as_secs_f64(),
                plan.nproc
            );
            Ok(())
        }
        None => {
            println!(
                "[launcher] the job finished in {:.1} s with {restarts} replacement(s)",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(f) => Err(LaunchError::Failed(format!("the job failed after {restarts} replacement(s): {f}"))),
    }
}
