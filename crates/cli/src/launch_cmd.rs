//! `steadfast launch`: an embedded coordinator and N worker processes on this host.
//!
//! The launcher draws a random secret for the job, listens for the rendezvous on a
//! loopback port, starts `--nproc` copies of this binary running the given `train`
//! command with their rank, the world size, the coordinator's address and the secret in
//! the environment, streams their output with rank prefixes, and fails if any worker
//! fails.
//!
//! After the rendezvous the embedded coordinator keeps membership by heartbeat: a worker
//! that dies, hangs or is cut off is reported to the others, which abort at once. When
//! no member is left alive, workers that have not exited within a grace period (a
//! stopped process, say) are killed.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use crate::elastic_launch::OnFailure;

const EXAMPLES: &str = "\
Examples:
  # Four workers, reproducible gradient sums: the same fingerprint as one process
  steadfast launch --nproc 4 -- train --model mlp --data synthetic --steps 50 --batch 64 --micro-batch 16 --reduce reproducible

  # Compare replica fingerprints every 10 steps
  steadfast launch --nproc 2 -- train --model cnn --fingerprint-every 10

  # Survive lost workers: replace each (at most 3 times) from the live replicas' state
  steadfast launch --nproc 3 --max-restarts 3 -- train --reduce reproducible \
      --fault 'crash:rank=1,step=40,phase=vote'

  # The baselines, to compare: go back to an in-memory copy kept every 20 steps, or
  # restart every worker from the checkpoint written every 20 steps
  steadfast launch --nproc 3 --max-restarts 3 --recovery memory --save-every 20 -- train --reduce reproducible
  steadfast launch --nproc 3 --max-restarts 3 --recovery checkpoint --save-every 20 -- train --reduce reproducible

  # Go on with the survivors instead (same bits in the reproducible mode)
  steadfast launch --nproc 3 --on-failure shrink --min-nproc 2 -- train --reduce reproducible";

/// Arguments of `steadfast launch`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct LaunchArgs {
    /// Number of worker processes.
    #[arg(long)]
    nproc: usize,
    /// Seconds to wait for every worker to join.
    #[arg(long, default_value_t = 120.0)]
    rendezvous_timeout: f64,
    /// Seconds of silence after which the coordinator declares a worker lost.
    #[arg(long, default_value_t = 10.0)]
    heartbeat_timeout: f64,
    /// Make the job elastic and replace failed workers at most K times in all; their
    /// replacements fetch the state from the live replicas.
    #[arg(long, value_name = "K")]
    max_restarts: Option<u32>,
    /// What an elastic job does when a worker fails [default: replace with --max-restarts,
    /// shrink without].
    #[arg(long, value_enum)]
    on_failure: Option<OnFailure>,
    /// The fewest workers an elastic job that shrinks goes on with.
    #[arg(long, default_value_t = 1)]
    min_nproc: usize,
    /// Seconds an elastic job waits for enough workers (a replacement, say) before it
    /// stops.
    #[arg(long, default_value_t = 60.0)]
    quorum_timeout: f64,
    /// How a job with --max-restarts recovers a lost worker: `live` rebuilds it from the
    /// live replicas' current state (no rollback); the baselines `memory` (every worker
    /// copies its state in memory every --save-every steps and all go back to the copy)
    /// and `checkpoint` (every worker restarts from the last checkpoint on disk, written
    /// every --save-every steps) are there to compare with.
    #[arg(long, value_enum, default_value_t = Recovery::Live)]
    recovery: Recovery,
    /// Steps between the copies (`--recovery memory`) or checkpoints (`checkpoint`).
    #[arg(long, value_name = "K", default_value_t = 50)]
    save_every: u64,
    /// Where `--recovery checkpoint` writes its checkpoints [default: a new directory
    /// under the system's temporary directory, removed when the job succeeds].
    #[arg(long, value_name = "DIR")]
    save_dir: Option<std::path::PathBuf>,
    /// The worker command: `train` and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// How a job recovers a lost worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Recovery {
    /// From the live replicas' current state, with no rollback.
    Live,
    /// Every survivor goes back to its in-memory copy of the state; a replacement fetches
    /// the copy's state.
    Memory,
    /// Every worker is restarted from the last checkpoint on disk.
    Checkpoint,
}

/// One line of the launcher's, timed from the start of the job like the coordinator's.
macro_rules! say {
    ($started:expr, $($arg:tt)*) => {
        println!("[launcher]    {:>7.2} s  {}", $started.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

/// How long workers may outlive the coordinator's last member before they are killed.
const KILL_GRACE: Duration = Duration::from_secs(3);

/// Runs `steadfast launch`.
pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    if args.nproc == 0 {
        anyhow::bail!("--nproc must be at least 1");
    }
    if args.command.first().map(String::as_str) != Some("train") {
        anyhow::bail!("the worker command must be `train ...`, got {:?}", args.command);
    }
    if args.max_restarts.is_some() || args.on_failure.is_some() {
        let seconds = |v: f64, what: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(anyhow::anyhow!("--{what} must be a positive number of seconds"))
            }
        };
        if args.min_nproc == 0 || args.min_nproc > args.nproc {
            anyhow::bail!("--min-nproc must be between 1 and --nproc ({})", args.nproc);
        }
        if args.save_every == 0 {
            anyhow::bail!("--save-every must be at least 1");
        }
        if args.recovery == Recovery::Checkpoint {
            if args.on_failure == Some(OnFailure::Shrink) {
                anyhow::bail!("--recovery checkpoint restarts every worker: it does not go with --on-failure shrink");
            }
            return crate::restart_launch::run(crate::restart_launch::Plan {
                nproc: args.nproc,
                max_restarts: args.max_restarts.unwrap_or(0),
                save_every: args.save_every,
                save_dir: args.save_dir,
                rendezvous_timeout: seconds(args.rendezvous_timeout, "rendezvous-timeout")?,
                heartbeat_timeout: seconds(args.heartbeat_timeout, "heartbeat-timeout")?,
                command: args.command,
            });
        }
        return crate::elastic_launch::run(crate::elastic_launch::Plan {
            nproc: args.nproc,
            max_restarts: args.max_restarts.unwrap_or(0),
            on_failure: args.on_failure.unwrap_or(if args.max_restarts.is_some() {
                OnFailure::Replace
            } else {
                OnFailure::Shrink
            }),
            min_nproc: args.min_nproc,
            heartbeat_timeout: seconds(args.heartbeat_timeout, "heartbeat-timeout")?,
            settle: seconds(args.rendezvous_timeout, "rendezvous-timeout")?,
            quorum_timeout: seconds(args.quorum_timeout, "quorum-timeout")?,
            copy_every: (args.recovery == Recovery::Memory).then_some(args.save_every),
            command: args.command,
        });
    }
    let failures = run_static(&StaticJob {
        nproc: args.nproc,
        command: &args.command,
        env: Vec::new(),
        rendezvous_timeout: Duration::from_secs_f64(args.rendezvous_timeout.max(1.0)),
        heartbeat_timeout: Duration::from_secs_f64(args.heartbeat_timeout.max(0.05)),
    })?;
    if failures.is_empty() { Ok(()) } else { anyhow::bail!("the job failed: {}", failures.join("; ")) }
}

/// A static job: `nproc` workers that all live to the end, or the job fails.
pub(crate) struct StaticJob<'a> {
    pub nproc: usize,
    /// The worker command (`train ...`).
    pub command: &'a [String],
    /// More environment for every worker.
    pub env: Vec<(String, String)>,
    pub rendezvous_timeout: Duration,
    pub heartbeat_timeout: Duration,
}

/// Runs a static job; returns what failed (nothing when every worker succeeded).
pub(crate) fn run_static(job: &StaticJob<'_>) -> anyhow::Result<Vec<String>> {
    let secret = job_secret()?;
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen for the rendezvous")?;
    let coordinator = listener.local_addr()?;
    let exe = std::env::current_exe().context("cannot find this executable")?;

    let mut children = Vec::new();
    for rank in 0..job.nproc {
        let child = Command::new(&exe)
            .args(job.command)
            .env("STEADFAST_RANK", rank.to_string())
            .env("STEADFAST_WORLD_SIZE", job.nproc.to_string())
            .env("STEADFAST_COORDINATOR", coordinator.to_string())
            .env("STEADFAST_SECRET", &secret)
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start rank {rank}"))?;
        children.push(child);
    }
    let (timeout, heartbeat) = (job.rendezvous_timeout, job.heartbeat_timeout);
    let secret_bytes = secret.into_bytes();
    let world = job.nproc;
    std::thread::scope(|s| -> anyhow::Result<Vec<String>> {
        let (over_tx, over_rx) = mpsc::channel();
        let coordinator = s.spawn(move || {
            let result = comm::rendezvous::serve(&listener, world, &secret_bytes, timeout, heartbeat).map(|job| {
                comm::supervisor::supervise(job.streams, heartbeat, &mut |event| {
                    eprintln!("[coordinator] {event}");
                })
            });
            let _ = over_tx.send(());
            result
        });
        let pumps: Vec<_> =
            children.iter_mut().enumerate().flat_map(|(rank, child)| forward_output(rank, child)).collect();
        let mut failures = Vec::new();
        let mut running: Vec<usize> = (0..children.len()).collect();
        let mut over_since: Option<Instant> = None;
        while !running.is_empty() {
            let mut still = Vec::new();
            for rank in running {
                match children[rank].try_wait().with_context(|| format!("waiting for rank {rank}"))? {
                    Some(status) if !status.success() => failures.push(format!("rank {rank} exited with {status}")),
                    Some(_) => {}
                    None => still.push(rank),
                }
            }
            running = still;
            if over_since.is_none() && over_rx.try_recv().is_ok() {
                over_since = Some(Instant::now());
            }
            // No member is alive as far as the coordinator knows: whoever still runs is
            // hung or stopped.
            if over_since.is_some_and(|t| t.elapsed() > KILL_GRACE) {
                for &rank in &running {
                    let _ = children[rank].kill();
                    let _ = children[rank].wait();
                    failures.push(format!("rank {rank} was killed: still running after the job ended"));
                }
                running.clear();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in pumps {
            let _ = p.join();
        }
        match coordinator.join() {
            Ok(Err(e)) => failures.push(format!("rendezvous: {e}")),
            Ok(Ok(membership)) => {
                failures.extend(membership.lost().into_iter().map(|(r, why)| format!("rank {r} was lost: {why}")))
            }
            Err(_) => failures.push("the coordinator thread panicked".into()),
        }
        Ok(failures)
    })
}

/// A fresh random secret for a job, as hex.
pub(crate) fn job_secret() -> anyhow::Result<String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("cannot draw the job secret: {e}"))?;
    Ok(secret.iter().map(|b| format!("{b:02x}")).collect())
}

/// Forwards a worker's standard output and error (piped) to ours, each line prefixed with
/// `[slot]` and written whole.
pub(crate) fn forward_output(slot: usize, child: &mut Child) -> [JoinHandle<()>; 2] {
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    [
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let text = format!("[{slot}] {line}");
                println!("{text}");
            }
        }),
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                // One write per line: unbuffered, a formatted line goes out in pieces.
                let text = format!("[{slot}] {line}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes());
            }
        }),
    ]
}
