//! `steadfast launch --max-restarts K --recovery checkpoint`: the checkpoint-restart
//! baseline, to compare with recovery from live replicas, and the way a job on MPI
//! (`--engine mpi`) survives a failure.
//!
//! The workers of a static job write a checkpoint every `--save-every` steps. When one
//! fails, the others abort (the coordinator's heartbeat tells them), and the launcher
//! starts every worker again from the last committed checkpoint, at most K times: the
//! steps since that checkpoint are computed again, and every worker pays a restart and a
//! read of the checkpoint. Resume is exact, so the bits are those of a run that never
//! failed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::static_job::{Nodes, StaticJob};
use crate::{LaunchError, say};

/// How a checkpoint-restart job is run.
pub struct RestartJob {
    /// Workers per run.
    pub nproc: usize,
    /// Who starts the workers.
    pub workers: Spawner,
    /// Restarts of the whole job allowed.
    pub max_restarts: u32,
    /// Steps between checkpoints.
    pub save_every: u64,
    /// Where the checkpoints go (a temporary directory when `None`).
    pub save_dir: Option<PathBuf>,
    /// The worker command (`train ...`).
    pub command: Vec<String>,
}

/// Who starts the workers of each run of the job.
pub enum Spawner {
    /// This launcher, on Steadfast's mesh, with its coordinator.
    Own {
        /// How long the workers have to join.
        rendezvous_timeout: Duration,
        /// Silence after which a worker is lost.
        heartbeat_timeout: Duration,
    },
    /// The MPI starter of `--engine mpi`.
    Mpi(crate::mpi::Starter),
}

/// Refuses a worker command that sets the checkpoint flags which `--recovery <mode>` sets.
pub(crate) fn refuse_checkpoint_flags(command: &[String], mode: &str) -> Result<(), LaunchError> {
    let taken = ["--checkpoint-dir", "--checkpoint-every", "--resume"];
    match command.iter().find(|a| taken.iter().any(|t| a.split('=').next() == Some(*t))) {
        Some(flag) => Err(LaunchError::Config(format!(
            "--recovery {mode} sets the workers' {flag}: give the launcher --save-dir and --save-every"
        ))),
        None => Ok(()),
    }
}

/// The directory the workers' checkpoints go to: `given`, or a new one under the system's
/// temporary directory (then `true`: removed when the job succeeds). Created.
pub(crate) fn save_dir(given: Option<&PathBuf>, mode: &str) -> Result<(PathBuf, bool), LaunchError> {
    let (dir, temporary) = match given {
        Some(d) => (d.clone(), false),
        None => {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let name = format!("steadfast-{mode}-{}-{}", std::process::id(), nanos.as_nanos());
            (std::env::temp_dir().join(name), true)
        }
    };
    std::fs::create_dir_all(&dir).map_err(LaunchError::io(format!("cannot create {}", dir.display())))?;
    Ok((dir, temporary))
}

/// Runs the job; fails unless it finished within its restarts.
pub fn run(plan: RestartJob) -> Result<(), LaunchError> {
    refuse_checkpoint_flags(&plan.command, "checkpoint")?;
    let (dir, temporary) = save_dir(plan.save_dir.as_ref(), "restart")?;
    let started = Instant::now();
    let mut restarts = 0u32;
    loop {
        let incarnation = u64::from(restarts);
        let last = ckpt::reader::newest_step(&dir)
            .map_err(|e| LaunchError::Failed(format!("cannot list the checkpoints in {}: {e}", dir.display())))?;
        let mut command = plan.command.clone();
        command.extend(["--checkpoint-dir".into(), dir.display().to_string()]);
        command.extend(["--checkpoint-every".into(), plan.save_every.to_string(), "--keep-last".into(), "2".into()]);
        match &last {
            Some(step) => {
                command.extend(["--resume".into(), "latest".into()]);
                say!(started, "starting {} workers from the checkpoint of step {step}", plan.nproc);
            }
            None => say!(started, "starting {} workers from the start", plan.nproc),
        }
        let env = vec![("STEADFAST_INCARNATION".to_owned(), incarnation.to_string())];
        let failures = match &plan.workers {
            Spawner::Mpi(starter) => starter.run(plan.nproc, &command, &env)?,
            &Spawner::Own { rendezvous_timeout, heartbeat_timeout } => crate::static_job::run(&StaticJob {
                nproc: plan.nproc,
                nodes: Nodes::single(),
                command: &command,
                env,
                rendezvous_timeout,
                heartbeat_timeout,
            })?,
        };
        if failures.is_empty() {
            println!(
                "[launcher] the job finished in {:.1} s with {restarts} restart(s) of every worker",
                started.elapsed().as_secs_f64()
            );
            if temporary {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Ok(());
        }
        say!(started, "the job failed: {}", failures.join("; "));
        if restarts >= plan.max_restarts {
            return Err(LaunchError::Failed(format!(
                "the job failed after {restarts} restart(s); its checkpoints are in {}",
                dir.display()
            )));
        }
        restarts += 1;
        say!(started, "restarting every worker from the last checkpoint (restart {restarts} of {})", plan.max_restarts);
    }
}
