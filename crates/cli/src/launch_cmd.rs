//! `steadfast launch`: an embedded coordinator and N worker processes per node.
//!
//! On one node (the default) the launcher draws a random secret for the job, listens for
//! the rendezvous on a loopback port, starts `--nproc-per-node` copies of this binary
//! running the given `train` command with their rank, the world size, the coordinator's
//! address and the secret in the environment, streams their output with rank prefixes,
//! and fails if any worker fails.
//!
//! On several nodes (`--nnodes M --node-rank I --coordinator HOST:PORT`, as torchrun
//! takes them, or from the `PET_*` variables that Kubeflow's trainer sets), one launcher
//! runs on each node: node 0's serves the coordinator on the port of `--coordinator`, and
//! every node starts its workers with the ranks `I*N .. I*N+N-1` of a world of `M*N`.
//! The job secret then comes from `STEADFAST_SECRET`, the same on every node. A
//! multi-node job is static: the loss of any worker fails the job on every node.
//!
//! After the rendezvous the coordinator keeps membership by heartbeat: a worker that
//! dies, hangs or is cut off is reported to the others, which abort at once. When no
//! member is left alive, workers that have not exited within a grace period (a stopped
//! process, say) are killed.

use std::net::IpAddr;
use std::time::Duration;

use clap::Args;

use launch::OnFailure;
use launch::static_job::{Meeting, Nodes, StaticJob};

use crate::join_args::EngineArg;

const EXAMPLES: &str = "\
Examples:
  # Four workers, reproducible gradient sums: the same fingerprint as one process
  steadfast launch --nproc 4 -- train --model mlp --data synthetic --steps 50 --batch 64 --micro-batch 16 --reduce reproducible

  # Compare replica fingerprints every 10 steps
  steadfast launch --nproc 2 -- train --model cnn --fingerprint-every 10

  # Survive lost workers: replace each (at most 3 times) from the live replicas' state
  steadfast launch --nproc 3 --max-restarts 3 -- train --reduce reproducible \\
      --fault 'crash:rank=1,step=40,phase=vote'

  # The baselines, to compare: go back to an in-memory copy kept every 20 steps, or
  # restart every worker from the checkpoint written every 20 steps
  steadfast launch --nproc 3 --max-restarts 3 --recovery memory --save-every 20 -- train --reduce reproducible
  steadfast launch --nproc 3 --max-restarts 3 --recovery checkpoint --save-every 20 -- train --reduce reproducible

  # Go on with the survivors instead (same bits in the reproducible mode)
  steadfast launch --nproc 3 --on-failure shrink --min-nproc 2 -- train --reduce reproducible

  # Two nodes of four workers, as torchrun takes them (run on each node, I = 0 or 1;
  # node 0 serves the coordinator at 10.0.0.1:29500)
  export STEADFAST_SECRET=$(openssl rand -hex 32)   # the same on every node
  steadfast launch --nnodes 2 --node-rank I --nproc-per-node 4 --coordinator 10.0.0.1:29500 \\
      -- train --reduce reproducible

  # Four ranks on the system's MPI library (mpirun starts them); if one fails, run the
  # whole job again from the checkpoint written every 20 steps, at most twice
  steadfast launch --engine mpi --nproc 4 --max-restarts 2 --save-every 20 -- train --reduce reproducible

  # In a Kubernetes pod that Kubeflow's trainer (or a JobSet) started: the PET_* variables
  # give the nodes, this node's rank, the processes per node and the coordinator
  steadfast launch -- train --reduce reproducible";

/// Arguments of `steadfast launch`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct LaunchArgs {
    /// Worker processes on this node [env: PET_NPROC_PER_NODE].
    /// `auto` or `cpu`: one per CPU this process may use.
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc",
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        value_parser = parse_nproc,
        value_name = "N|auto"
    )]
    nproc: usize,
    /// Nodes in the job, each running one launcher; torchrun's `M:M` form is taken too,
    /// but not a range (a job of several nodes is static) [env: PET_NNODES].
    #[arg(long, default_value = "1", env = "PET_NNODES", value_parser = parse_nnodes, value_name = "M")]
    nnodes: usize,
    /// This node's index, 0 to --nnodes - 1; node 0 serves the coordinator [env:
    /// PET_NODE_RANK].
    #[arg(long, alias = "node_rank", default_value_t = 0, env = "PET_NODE_RANK")]
    node_rank: usize,
    /// The job's coordinator, HOST:PORT: node 0 listens on its port, every worker dials
    /// it; needed with --nnodes above 1 [env: PET_RDZV_ENDPOINT, or PET_MASTER_ADDR and
    /// PET_MASTER_PORT; default on one node: a free loopback port].
    #[arg(long, visible_alias = "rdzv-endpoint", alias = "rdzv_endpoint", value_name = "HOST:PORT")]
    coordinator: Option<String>,
    /// Meet in etcd instead, `etcd://HOST:PORT/JOB[?ttl=SECONDS]`: no coordinator is
    /// served, and membership is kept in etcd leases (static jobs only) [env:
    /// STEADFAST_RENDEZVOUS].
    #[arg(long, value_name = "etcd://HOST:PORT/JOB", env = "STEADFAST_RENDEZVOUS")]
    rendezvous: Option<String>,
    /// Address this node's workers listen on for their peers [default: the local
    /// address that reaches the coordinator].
    #[arg(long, alias = "local_addr", value_name = "IP")]
    local_addr: Option<IpAddr>,
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
    #[arg(long, value_parser = crate::choice::of::<OnFailure>())]
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
    /// [default: live; checkpoint with --engine mpi, the only one it has]
    #[arg(long, value_enum)]
    recovery: Option<Recovery>,
    /// Steps between the copies (`--recovery memory`) or checkpoints (`checkpoint`).
    #[arg(long, value_name = "K", default_value_t = 50)]
    save_every: u64,
    /// Where `--recovery checkpoint` writes its checkpoints [default: a new directory
    /// under the system's temporary directory, removed when the job succeeds].
    #[arg(long, value_name = "DIR")]
    save_dir: Option<std::path::PathBuf>,
    /// How the workers reach each other: `steadfast` (this launcher starts them, and they
    /// meet at its coordinator or in etcd) or `mpi` (the launcher runs them under the MPI
    /// starter of --mpirun, with `--engine mpi`; a job of MPI is restarted whole from its
    /// last checkpoint with --max-restarts).
    #[arg(long, value_enum, default_value_t = EngineArg::Steadfast)]
    engine: EngineArg,
    /// The MPI starter of --engine mpi and its options (a host file, say), split at
    /// spaces; the launcher adds `-n` [env: STEADFAST_MPIRUN].
    #[arg(long, value_name = "COMMAND", env = "STEADFAST_MPIRUN", default_value = "mpirun --oversubscribe")]
    mpirun: String,
    /// The worker command: `train` and its arguments (or `bench collective` and its).
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

/// Runs `steadfast launch`.
pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    if args.nproc == 0 {
        anyhow::bail!("--nproc-per-node must be at least 1");
    }
    let words: Vec<&str> = args.command.iter().take(2).map(String::as_str).collect();
    let trains = words.first() == Some(&"train");
    if !trains && words != ["bench", "collective"] {
        anyhow::bail!("the worker command must be `train ...` or `bench collective ...`, got {:?}", args.command);
    }
    if (args.max_restarts.is_some() || args.on_failure.is_some()) && !trains {
        anyhow::bail!("--max-restarts and --on-failure restart training, not a benchmark");
    }
    if args.engine == EngineArg::Mpi {
        return run_mpi(args);
    }
    let nodes = nodes_from_args(&args)?;
    if args.max_restarts.is_some() || args.on_failure.is_some() {
        if matches!(nodes.meeting, Meeting::Etcd(_)) {
            anyhow::bail!("--max-restarts and --on-failure need the launcher's coordinator, not --rendezvous etcd://");
        }
        if nodes.nnodes > 1 {
            anyhow::bail!(
                "--max-restarts and --on-failure run on one node: a job of several nodes is static \
                 (the loss of any worker fails it on every node)"
            );
        }
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
        let recovery = args.recovery.unwrap_or(Recovery::Live);
        if recovery == Recovery::Checkpoint {
            if args.on_failure == Some(OnFailure::Shrink) {
                anyhow::bail!("--recovery checkpoint restarts every worker: it does not go with --on-failure shrink");
            }
            return Ok(launch::restart::run(launch::restart::RestartJob {
                nproc: args.nproc,
                workers: launch::restart::Workers::Own {
                    rendezvous_timeout: seconds(args.rendezvous_timeout, "rendezvous-timeout")?,
                    heartbeat_timeout: seconds(args.heartbeat_timeout, "heartbeat-timeout")?,
                },
                max_restarts: args.max_restarts.unwrap_or(0),
                save_every: args.save_every,
                save_dir: args.save_dir,
                command: args.command,
            })?);
        }
        return Ok(launch::elastic::run(launch::elastic::ElasticJob {
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
            copy_every: (recovery == Recovery::Memory).then_some(args.save_every),
            command: args.command,
        })?);
    }
    let failures = launch::static_job::run(&StaticJob {
        nproc: args.nproc,
        nodes,
        command: &args.command,
        env: Vec::new(),
        rendezvous_timeout: Duration::from_secs_f64(args.rendezvous_timeout.max(1.0)),
        heartbeat_timeout: Duration::from_secs_f64(args.heartbeat_timeout.max(0.05)),
    })?;
    if failures.is_empty() { Ok(()) } else { anyhow::bail!("the job failed: {}", failures.join("; ")) }
}

/// `--nproc-per-node`: a number, or `auto`/`cpu` for the CPUs this process may use.
/// `launch --engine mpi`: the job under the MPI starter, restarted whole from its last
/// checkpoint with --max-restarts.
fn run_mpi(args: LaunchArgs) -> anyhow::Result<()> {
    if args.nnodes > 1 || args.coordinator.is_some() || args.rendezvous.is_some() || args.local_addr.is_some() {
        anyhow::bail!(
            "MPI places the ranks of --engine mpi and they meet through MPI: \
             give hosts in --mpirun's options (e.g. --hostfile), not --nnodes, --coordinator, --rendezvous or --local-addr"
        );
    }
    if args.on_failure.is_some() || matches!(args.recovery, Some(Recovery::Live | Recovery::Memory)) {
        anyhow::bail!(
            "an MPI job is not elastic (a rank's failure ends every rank): \
             --max-restarts restarts it from its last checkpoint (--recovery checkpoint)"
        );
    }
    let starter = launch::mpi::Starter::parse(&args.mpirun)?;
    if let Some(max_restarts) = args.max_restarts {
        if args.save_every == 0 {
            anyhow::bail!("--save-every must be at least 1");
        }
        return Ok(launch::restart::run(launch::restart::RestartJob {
            nproc: args.nproc,
            workers: launch::restart::Workers::Mpi(starter),
            max_restarts,
            save_every: args.save_every,
            save_dir: args.save_dir,
            command: args.command,
        })?);
    }
    let failures = starter.run(args.nproc, &args.command, &[])?;
    if failures.is_empty() { Ok(()) } else { anyhow::bail!("the job failed: {}", failures.join("; ")) }
}

fn parse_nproc(text: &str) -> Result<usize, String> {
    match text {
        "auto" | "cpu" => std::thread::available_parallelism()
            .map(usize::from)
            .map_err(|e| format!("cannot count the CPUs for {text:?}: {e}")),
        _ => text.parse().map_err(|_| format!("{text:?} is neither a number of processes nor auto")),
    }
}

/// `--nnodes`: `M`, or `M:M` as torchrun writes a fixed count.
fn parse_nnodes(text: &str) -> Result<usize, String> {
    let number = |t: &str| t.parse::<usize>().map_err(|_| format!("{text:?} is not a number of nodes"));
    match text.split_once(':') {
        None => number(text),
        Some((low, high)) if number(low)? == number(high)? => number(low),
        Some(_) => Err(format!("{text:?} is a range of nodes, but a job of several nodes is static: give one count")),
    }
}

/// Where this node's workers sit, from the arguments (and torchrun's `PET_*` variables).
fn nodes_from_args(args: &LaunchArgs) -> anyhow::Result<Nodes> {
    if args.nnodes == 0 {
        anyhow::bail!("--nnodes must be at least 1");
    }
    if args.node_rank >= args.nnodes {
        anyhow::bail!(
            "--node-rank {} is not one of the {} nodes (0 to {})",
            args.node_rank,
            args.nnodes,
            args.nnodes - 1
        );
    }
    let pet = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let coordinator = args
        .coordinator
        .clone()
        .or_else(|| pet("PET_RDZV_ENDPOINT"))
        .or_else(|| Some(format!("{}:{}", pet("PET_MASTER_ADDR")?, pet("PET_MASTER_PORT")?)));
    let meeting = match (&args.rendezvous, coordinator) {
        (Some(_), _) if args.coordinator.is_some() => {
            anyhow::bail!("--rendezvous and --coordinator are two ways to meet: give one")
        }
        (Some(url), _) => Meeting::Etcd(url.parse().map_err(|e| anyhow::anyhow!("--rendezvous: {e}"))?),
        (None, Some(address)) => Meeting::Coordinator(address),
        (None, None) if args.nnodes == 1 => Meeting::Loopback,
        (None, None) => anyhow::bail!(
            "a job of {} nodes needs the coordinator's address: --coordinator HOST:PORT \
             (or PET_MASTER_ADDR and PET_MASTER_PORT), the same on every node",
            args.nnodes
        ),
    };
    Ok(Nodes { nnodes: args.nnodes, node_rank: args.node_rank, meeting, local_addr: args.local_addr })
}
