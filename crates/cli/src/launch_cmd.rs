//! `steadfast launch`: an embedded coordinator and N worker processes per node (the
//! arguments; [`launch::request`] chooses and runs the job).
//!
//! On one node the launcher draws the job's secret, serves the coordinator on a loopback
//! port and starts `--nproc-per-node` workers, streaming their output with rank prefixes.
//! On several (`--nnodes M --node-rank I --coordinator HOST:PORT`, as torchrun takes them,
//! or from Kubeflow's `PET_*` variables) one launcher runs on each node with the secret
//! from `STEADFAST_SECRET`; node 0's serves the coordinator, or with `--rendezvous
//! etcd://...` the workers meet in etcd. `--max-restarts` or `--on-failure` makes the job
//! elastic: each node replaces its own workers, the job goes on without a lost node, a
//! node started again joins it, and in etcd the launchers elect the coordinator.

use std::net::IpAddr;

use clap::Args;

use launch::OnFailure;
use launch::request::{LaunchRequest, Recovery};
use launch::slots::Placement;

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
  # 2 replicas of a 2-stage pipeline: a lost stage worker fetches its stage from its replica
  steadfast launch --nproc 4 --max-restarts 2 -- train --pipeline-stages 2 --reduce reproducible
  # A 3-stage pipeline whose lost stage is replayed from its neighbours' logs by 2 ranks
  steadfast launch --nproc 3 --max-restarts 1 --recovery replay --replay-helpers 2 -- train --pipeline-stages 3

  # 2 replicas of a 3-stage pipeline that go on without a lost worker: its stage's peer takes its micro-batches
  steadfast launch --nproc 6 --recovery replay --on-failure shrink -- train --pipeline-stages 3 --reduce reproducible

  # Go on with the survivors instead (same bits in the reproducible mode)
  steadfast launch --nproc 3 --on-failure shrink --min-nproc 2 -- train --reduce reproducible

  # Two nodes of four workers, as torchrun takes them (run on each node, I = 0 or 1;
  # node 0 serves the coordinator at 10.0.0.1:29500)
  export STEADFAST_SECRET=$(openssl rand -hex 32)   # the same on every node
  steadfast launch --nnodes 2 --node-rank I --nproc-per-node 4 --coordinator 10.0.0.1:29500 \\
      -- train --reduce reproducible

  # An elastic job of three nodes (run on each, I = 0, 1, 2): it goes on without a lost
  # node, and the node started again with the same command joins it
  steadfast launch --nnodes 3 --node-rank I --nproc-per-node 2 --coordinator 10.0.0.1:29500 \\
      --max-restarts 2 --min-nproc 2 -- train --reduce reproducible
  # The same with the coordinator elected in etcd: no node is a single point of failure
  steadfast launch --nnodes 3 --node-rank I --nproc-per-node 2 --rendezvous etcd://10.0.0.9:2379/job \\
      --max-restarts 2 --min-nproc 2 -- train --reduce reproducible
  # Two replicas of a 2-stage pipeline, one stage of each on each node (I = 0 or 1): a
  # lost node's stage is replayed on the other's boundary logs
  steadfast launch --nnodes 2 --node-rank I --nproc-per-node 2 --coordinator 10.0.0.1:29500 \\
      --place stages --recovery replay --max-restarts 1 -- train --pipeline-stages 2 --reduce reproducible

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
    /// Nodes in the job, each running one launcher; torchrun's `MIN:MAX` form makes an
    /// elastic job (--max-restarts or --on-failure) start with MIN nodes and take up to MAX
    /// [env: PET_NNODES].
    #[arg(long, default_value = "1", env = "PET_NNODES", value_parser = parse_nnodes, value_name = "M|MIN:MAX")]
    nnodes: (usize, usize),
    /// This node's index, 0 to --nnodes - 1; node 0 serves the coordinator [env:
    /// PET_NODE_RANK].
    #[arg(long, alias = "node_rank", default_value_t = 0, env = "PET_NODE_RANK")]
    node_rank: usize,
    /// The job's coordinator, HOST:PORT: node 0 listens on its port, every worker dials
    /// it; needed with --nnodes above 1. On one node too it listens there (the launcher
    /// says so first), so that a worker started by hand with the job's STEADFAST_SECRET
    /// joins an elastic job (--recovery checkpoint and replay, which keep their own on
    /// loopback, refuse it) [env: PET_RDZV_ENDPOINT, or PET_MASTER_ADDR and
    /// PET_MASTER_PORT; default on one node: a free loopback port].
    #[arg(long, visible_alias = "rdzv-endpoint", alias = "rdzv_endpoint", value_name = "HOST:PORT")]
    coordinator: Option<String>,
    /// Meet in etcd instead, `etcd://HOST:PORT/JOB[?ttl=SECONDS]`: a static job keeps its
    /// membership in etcd leases; an elastic one elects its coordinator there among the
    /// launchers [env: STEADFAST_RENDEZVOUS].
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
    /// shrink without]. In a pipeline job, `shrink` gives a lost stage worker's
    /// micro-batches to its stage's other workers (the same bits, no replacement).
    #[arg(long, value_parser = crate::choice::of::<OnFailure>())]
    on_failure: Option<OnFailure>,
    /// The fewest workers an elastic job goes on with [default: 1; with replace on one
    /// host, every worker: the job waits for a replacement]. Given with replace, the
    /// survivors step on while a replacement starts (the same bits with `--reduce
    /// reproducible` and for Python workers).
    #[arg(long)]
    min_nproc: Option<usize>,
    /// Seconds an elastic job waits for enough workers (a replacement, say) before it
    /// stops.
    #[arg(long, default_value_t = 60.0)]
    quorum_timeout: f64,
    /// How a job with --max-restarts recovers a lost worker: `live` rebuilds it from the
    /// live replicas' current state (no rollback); the baselines `memory` (every worker
    /// copies its state in memory every --save-every steps and all go back to the copy)
    /// and `checkpoint` (every worker restarts from the last checkpoint on disk, written
    /// every --save-every steps) are there to compare with. A pipeline job recovers `live`
    /// stage by stage (a lost stage worker fetches its stage from a live replica; a stage
    /// lost whole is replayed from its checkpoint on its neighbours' boundary logs, when
    /// the command logs them and keeps checkpoints); `replay` is `live` with every
    /// boundary logged and checkpoints every --save-every steps set for the command.
    /// [default: live; checkpoint with --engine mpi, the only one it has]
    #[arg(long, value_parser = crate::choice::of::<Recovery>())]
    recovery: Option<Recovery>,
    /// Steps between the copies (`--recovery memory`) or checkpoints (`checkpoint`).
    #[arg(long, value_name = "K", default_value_t = 50)]
    save_every: u64,
    /// Where `--recovery checkpoint` or `replay` writes its checkpoints, and resumes from [default:
    /// replay, OUT/checkpoints under train's --out; checkpoint, a temporary directory removed on success].
    #[arg(long, value_name = "DIR")]
    save_dir: Option<std::path::PathBuf>,
    /// Workers that share the replay of a lost pipeline stage: its own and workers of
    /// other stages (they sum reproducibly: give `--reduce reproducible`).
    #[arg(long, value_name = "R", default_value_t = 1)]
    replay_helpers: usize,
    /// How a job of several nodes lays its worker slots on them: `replicas` (node I runs
    /// slots I*N to I*N+N-1: with N = S, a pipeline's replica whole on each node) or
    /// `stages` (slots taken stage by stage: with N = replicas, one stage of every replica
    /// on each node, so a lost node's stage is replayed on its neighbours' logs).
    #[arg(long, value_parser = crate::choice::of::<Placement>(), default_value = "replicas")]
    place: Placement,
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

/// Runs `steadfast launch`.
pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    Ok(launch::request::run(LaunchRequest {
        nproc: args.nproc,
        nnodes: args.nnodes.0,
        max_nnodes: args.nnodes.1,
        node_rank: args.node_rank,
        coordinator: args.coordinator,
        rendezvous: args.rendezvous,
        local_addr: args.local_addr,
        rendezvous_timeout: args.rendezvous_timeout,
        heartbeat_timeout: args.heartbeat_timeout,
        quorum_timeout: args.quorum_timeout,
        max_restarts: args.max_restarts,
        on_failure: args.on_failure,
        min_nproc: args.min_nproc,
        recovery: args.recovery,
        save_every: args.save_every,
        save_dir: args.save_dir,
        replay_helpers: args.replay_helpers,
        mpirun: (args.engine == EngineArg::Mpi).then_some(args.mpirun),
        place: args.place,
        command: args.command,
    })?)
}

/// `--nproc-per-node`: a number, or `auto`/`cpu` for the CPUs this process may use.
fn parse_nproc(text: &str) -> Result<usize, String> {
    match text {
        "auto" | "cpu" => std::thread::available_parallelism()
            .map(usize::from)
            .map_err(|e| format!("cannot count the CPUs for {text:?}: {e}")),
        _ => text.parse().map_err(|_| format!("{text:?} is neither a number of processes nor auto")),
    }
}

/// `--nnodes`: `M`, or `MIN:MAX` as torchrun writes it.
fn parse_nnodes(text: &str) -> Result<(usize, usize), String> {
    let number = |t: &str| t.parse::<usize>().map_err(|_| format!("{text:?} is not a number of nodes"));
    match text.split_once(':') {
        None => number(text).map(|n| (n, n)),
        Some((low, high)) => Ok((number(low)?, number(high)?)),
    }
}
