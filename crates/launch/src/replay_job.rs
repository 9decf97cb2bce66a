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
//! The checkpoints go to `--save-dir`, or to `OUT/checkpoints` under the workers' `--out`
//! (beside their metrics and boundary logs), and the launcher says where as it starts. A
//! job whose directory holds checkpoints already (the same command run again after the
//! whole job was killed) resumes from the newest step of which every stage has one, as
//! `--resume latest` asks explicitly: the workers verify their stage's checkpoints and
//! agree on the newest step they all hold (see `train::pipeline`), and nothing newer is
//! rewritten before the job gets there again.
//!
//! With `--on-failure shrink` no replacement comes: the coordinator forms the next
//! membership from the survivors (ranked in the order of their slots), and each lost
//! worker's micro-batches go to a surviving worker of its stage, which computes them
//! besides its own (see `train::pipeline::Grid::rank`). Nothing is replayed, so nothing
//! is logged; the bits are still those of the run that never failed.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::record::Recorder;
use crate::workers::{Exited, Workers};
use crate::{KILL_GRACE, LaunchError, say};

/// A pipeline job that recovers by replay, on one node.
pub struct ReplayJob {
    /// Workers.
    pub nproc: usize,
    /// Replacements at most, in all.
    pub max_restarts: u32,
    /// Steps between checkpoints.
    pub save_every: u64,
    /// Where the checkpoints go (`OUT/checkpoints` under the workers' `--out` when
    /// `None`: see [`checkpoint_root`]).
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

/// The value that the worker command `command` gives `flag` (`--flag VALUE` or
/// `--flag=VALUE`; the last, when given twice).
pub(crate) fn flag_value<'a>(command: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in command.iter().enumerate() {
        if a == flag {
            found = command.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
            found = Some(v);
        }
    }
    found
}

/// The pipeline stages that the worker command asks for (1: none).
pub(crate) fn pipeline_stages(command: &[String]) -> usize {
    flag_value(command, "--pipeline-stages").and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// Where the job's checkpoints go: `--save-dir`, or `OUT/checkpoints` under the workers'
/// `--out` (`train`'s default when the command gives none), beside the job's metrics and
/// boundary logs, so that the same command run again finds them and nothing is left in a
/// temporary directory.
pub(crate) fn checkpoint_root(save_dir: Option<&PathBuf>, command: &[String]) -> PathBuf {
    save_dir.cloned().unwrap_or_else(|| {
        PathBuf::from(flag_value(command, "--out").unwrap_or(comm::job::DEFAULT_OUT)).join("checkpoints")
    })
}

/// Takes `--resume` out of the worker command: this launcher resumes the job from its
/// checkpoint root by itself. Returns what was asked (`latest`: there must be a step to
/// resume from; `auto`: as without the flag); any other value is refused with what to do.
fn take_resume(command: &mut Vec<String>) -> Result<Option<String>, LaunchError> {
    let mut asked = None;
    let mut i = 0;
    while i < command.len() {
        let value = if command[i] == "--resume" {
            command.remove(i);
            if i < command.len() { command.remove(i) } else { String::new() }
        } else if let Some(value) = command[i].strip_prefix("--resume=") {
            let value = value.to_owned();
            command.remove(i);
            value
        } else {
            i += 1;
            continue;
        };
        if value != "latest" && value != "auto" {
            return Err(LaunchError::Config(format!(
                "--recovery replay resumes a job from the checkpoints in its --save-dir by itself: the same command \
                 run again goes on from the newest step of which every stage has a checkpoint (--resume latest insists \
                 on one, --resume auto does not). To go on from the checkpoints in {value:?}, give the launcher \
                 --save-dir with that job's checkpoint root (the directory that holds its stage-S-of-N directories)"
            )));
        }
        asked = Some(value);
    }
    Ok(asked)
}

/// Runs the job; fails unless every worker finished.
pub fn run(plan: ReplayJob) -> Result<(), LaunchError> {
    let bad = |text: &str| LaunchError::Config(text.to_owned());
    let stages = pipeline_stages(&plan.command);
    if stages < 2 {
        return Err(bad("--recovery replay replays the stages of a pipeline: the command needs --pipeline-stages S, \
             with S at least 2"));
    }
    let mut command = plan.command.clone();
    let asked = take_resume(&mut command)?;
    crate::restart::refuse_checkpoint_flags(&command, "replay")?;
    // Every boundary is logged unless the command chooses (by a list or a budget).
    let chooses =
        |a: &String| ["--log-boundaries", "--log-budget"].iter().any(|f| a == f || a.starts_with(&format!("{f}=")));
    if plan.shrink && command.iter().any(chooses) {
        return Err(bad("--on-failure shrink reroutes a lost stage's work and replays nothing: log no boundary"));
    }
    if !plan.shrink && !command.iter().any(chooses) {
        command.extend(["--log-boundaries".into(), "all".into()]);
    }
    let started = Instant::now();
    let dir = checkpoint_root(plan.save_dir.as_ref(), &plan.command);
    let newest = ckpt::reader::common_step(&dir, stages)
        .map_err(|e| LaunchError::Failed(format!("cannot list the stages' checkpoints: {e}")))?;
    if newest.is_none() && asked.as_deref() == Some("latest") {
        return Err(LaunchError::Config(format!(
            "--resume latest: {} holds no step of which every one of the {stages} stages has a checkpoint; \
             leave --resume out to start the job from the beginning",
            dir.display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(LaunchError::io(format!("cannot create {}", dir.display())))?;
    match newest {
        Some(step) => {
            say!(started, "resuming from the checkpoints in {}: every stage has one of step {step}", dir.display());
            command.extend(["--resume".into(), "latest".into()]);
        }
        None => say!(
            started,
            "the checkpoints go to {} (every {} steps, each stage its own): the same command resumes from them",
            dir.display(),
            plan.save_every
        ),
    }
    command.extend(["--checkpoint-dir".into(), dir.display().to_string()]);
    command.extend(["--checkpoint-every".into(), plan.save_every.to_string(), "--keep-last".into(), "2".into()]);
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
        // The job's record: this launcher serves the job's coordinator, and reaps its
        // workers (its workers' command, which says whether they resume).
        let record = Recorder::new(&command, 0..plan.nproc, None);
        let outcome = watch(&mut workers, &rx, (&plan, gone), (record, started));
        stop.store(true, Ordering::Relaxed);
        outcome
    });
    workers.join();
    // A job that failed says where to go on from, when it can.
    outcome.map_err(|e| match (e, ckpt::reader::common_step(&dir, stages)) {
        (LaunchError::Failed(why), Ok(Some(step))) => LaunchError::Failed(format!(
            "{why}; every stage has a checkpoint of step {step} in {}: the same command run again resumes from it",
            dir.display()
        )),
        (other, _) => other,
    })
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
    (mut record, started): (Recorder, Instant),
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
    record.open(true);
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
                record.exited(e.slot, e.incarnation, e.status.as_ref().copied().map_err(String::as_str));
                if plan.shrink && formed {
                    let mut gone = gone.lock().unwrap_or_else(|e| e.into_inner());
                    gone.push(e.slot);
                    let remaining = (0..plan.nproc as u64).filter(|s| !gone.contains(&(*s as usize)));
                    record.rerouted(e.slot, remaining, "its stage's other workers take over its micro-batches");
                    drop(gone);
                    left -= 1;
                    println!(
                        "[launcher] {:>10.2} s  {why}: its stage's other workers take over its micro-batches \
                         ({left} workers left)",
                        started.elapsed().as_secs_f64()
                    );
                } else if restarts < plan.max_restarts {
                    restarts += 1;
                    incarnations[e.slot] += 1;
                    record.replaced(e.slot, incarnations[e.slot], restarts, plan.max_restarts);
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
                    record.killing(rank, members[rank]);
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
    record.said(&match &failure {
        None => comm::control::MembershipEvent::Finished,
        Some(f) => comm::control::MembershipEvent::Stopped { reason: f.clone() },
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_worker_command_s_flags_are_read_in_both_forms() {
        let command = words("train --pipeline-stages 3 --out=runs/a --steps 9");
        assert_eq!(pipeline_stages(&command), 3);
        assert_eq!(pipeline_stages(&words("train --pipeline-stages=2")), 2);
        assert_eq!(pipeline_stages(&words("train --steps 9")), 1);
        assert_eq!(checkpoint_root(None, &command), PathBuf::from("runs/a/checkpoints"));
        let default = PathBuf::from(comm::job::DEFAULT_OUT).join("checkpoints");
        assert_eq!(checkpoint_root(None, &words("train --output-dir x")), default);
        assert_eq!(checkpoint_root(Some(&PathBuf::from("ck")), &command), PathBuf::from("ck"));
    }

    #[test]
    fn resume_latest_or_auto_is_taken_out_of_the_command_and_a_path_is_refused_with_advice() {
        let mut command = words("train --resume latest --steps 9");
        assert_eq!(take_resume(&mut command).unwrap().as_deref(), Some("latest"));
        assert_eq!(command, words("train --steps 9"));
        let mut command = words("train --resume=auto");
        assert_eq!(take_resume(&mut command).unwrap().as_deref(), Some("auto"));
        assert_eq!(command, words("train"));
        let mut command = words("train --steps 9");
        assert_eq!(take_resume(&mut command).unwrap(), None);
        let why = take_resume(&mut words("train --resume runs/ck")).unwrap_err().to_string();
        assert!(why.contains("give the launcher --save-dir"), "{why}");
    }
}
