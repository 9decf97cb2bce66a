//! What `steadfast launch` was asked for, and which job that makes: a static job on one
//! node or several ([`static_job`](crate::static_job)), an elastic job
//! ([`elastic`](crate::elastic)), the checkpoint-restart baseline
//! ([`restart`](crate::restart)), or a job under MPI ([`mpi`](crate::mpi)). Each
//! combination that cannot work is refused here with the flag to change, before any
//! process starts.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::elastic::Span;
use crate::slots::Placement;
use crate::static_job::{Meeting, Nodes, StaticJob};
use crate::{LaunchError, OnFailure};

/// How a job with restarts recovers a lost worker (`--recovery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// From the live replicas' current state, with no rollback.
    Live,
    /// Every survivor goes back to its in-memory copy of the state; a replacement fetches
    /// the copy's state.
    Memory,
    /// Every worker is restarted from the last checkpoint on disk.
    Checkpoint,
    /// A pipeline job: a lost stage is rebuilt from its checkpoint by replaying its
    /// neighbours' boundary logs; nobody else rolls back.
    Replay,
}

impl repro::words::Word for Recovery {
    const KIND: &'static str = "recovery";
    const ALL: &'static [Self] = &[Recovery::Live, Recovery::Memory, Recovery::Checkpoint, Recovery::Replay];

    fn word(self) -> &'static str {
        match self {
            Recovery::Live => "live",
            Recovery::Memory => "memory",
            Recovery::Checkpoint => "checkpoint",
            Recovery::Replay => "replay",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Recovery::Live => "from the live replicas' current state, with no rollback",
            Recovery::Memory => "every survivor goes back to its in-memory copy of the state",
            Recovery::Checkpoint => "every worker restarts from the last checkpoint on disk",
            Recovery::Replay => "a pipeline's lost stage replays its neighbours' logs from its checkpoint",
        }
    }
}

repro::text_form!(Recovery);

/// The launcher's settings, as given (flags and `PET_*` variables).
#[derive(Clone, Debug)]
pub struct LaunchRequest {
    /// Workers on this node.
    pub nproc: usize,
    /// Nodes in the job (at the start, for an elastic job).
    pub nnodes: usize,
    /// The most nodes an elastic job takes (`--nnodes MIN:MAX`; `nnodes` when fixed).
    pub max_nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// The coordinator's `HOST:PORT`, when given.
    pub coordinator: Option<String>,
    /// `etcd://HOST:PORT/JOB`, when the workers meet in etcd.
    pub rendezvous: Option<String>,
    /// Where this node's workers listen.
    pub local_addr: Option<IpAddr>,
    /// Seconds to wait for every worker to join.
    pub rendezvous_timeout: f64,
    /// Seconds of silence after which a worker is lost.
    pub heartbeat_timeout: f64,
    /// Seconds an elastic job waits for enough workers.
    pub quorum_timeout: f64,
    /// Restarts allowed (makes the job elastic, or restartable under MPI).
    pub max_restarts: Option<u32>,
    /// What an elastic job does when a worker fails.
    pub on_failure: Option<OnFailure>,
    /// The fewest workers an elastic job goes on with (`None`: 1 when it shrinks; every
    /// worker when it replaces them on one host).
    pub min_nproc: Option<usize>,
    /// How a lost worker is recovered.
    pub recovery: Option<Recovery>,
    /// Steps between the copies or checkpoints of the baselines.
    pub save_every: u64,
    /// Where the checkpoint baseline writes.
    pub save_dir: Option<PathBuf>,
    /// Ranks that share the replay of a lost pipeline stage.
    pub replay_helpers: usize,
    /// The MPI starter and its options, for a job under MPI.
    pub mpirun: Option<String>,
    /// How the job's slots are laid on its nodes (`--place`).
    pub place: Placement,
    /// The worker command.
    pub command: Vec<String>,
}

fn bad(text: impl Into<String>) -> LaunchError {
    LaunchError::Config(text.into())
}

fn seconds(v: f64, flag: &str) -> Result<Duration, LaunchError> {
    if v.is_finite() && v > 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(bad(format!("--{flag} must be a positive number of seconds")))
    }
}

/// Runs the job that `r` asks for; fails unless it finished.
pub fn run(r: LaunchRequest) -> Result<(), LaunchError> {
    if r.nproc == 0 {
        return Err(bad("--nproc-per-node must be at least 1"));
    }
    let words: Vec<&str> = r.command.iter().take(2).map(String::as_str).collect();
    let trains = words.first() == Some(&"train");
    let benches = words == ["bench", "collective"];
    let restarts = r.max_restarts.is_some() || r.on_failure.is_some();
    let program = crate::workers::own_subcommand(&r.command).is_none();
    if r.command.is_empty() || (!program && !trains && !benches) {
        return Err(bad(format!(
            "the worker command must be `train ...`, `bench collective ...` or a program of an elastic job              (`python train.py` with steadfast.elastic), got {:?}",
            r.command
        )));
    }
    if program {
        other_program(&r, restarts)?;
    }
    if restarts && benches {
        return Err(bad("--max-restarts and --on-failure restart training, not a benchmark"));
    }
    if r.save_every == 0 && restarts {
        return Err(bad("--save-every must be at least 1"));
    }
    if r.mpirun.is_some() {
        return run_mpi(r);
    }
    if !restarts && r.max_nnodes != r.nnodes {
        return Err(bad(format!(
            "--nnodes {}:{} is a range of nodes, but a job without --max-restarts or --on-failure is static: \
             give one count, or make it elastic",
            r.nnodes, r.max_nnodes
        )));
    }
    let nodes = nodes(&r)?;
    check_placement(&r)?;
    if !restarts {
        let failures = crate::static_job::run(&StaticJob {
            nproc: r.nproc,
            nodes,
            command: &r.command,
            env: Vec::new(),
            rendezvous_timeout: Duration::from_secs_f64(r.rendezvous_timeout.max(1.0)),
            heartbeat_timeout: Duration::from_secs_f64(r.heartbeat_timeout.max(0.05)),
        })?;
        return failed_if_any(failures);
    }
    // Across nodes, or with the coordinator elected in etcd, the job spans (perhaps one)
    // nodes; otherwise it is this host's alone, with its coordinator on the port of
    // --coordinator when one is given (workers started by hand join it there).
    let (span, here) = match nodes.meeting {
        Meeting::Coordinator(address) if r.max_nnodes == 1 => (None, Some(address)),
        Meeting::Loopback => (None, None),
        meeting => (
            Some(Span {
                nnodes: r.nnodes,
                node_rank: r.node_rank,
                meeting,
                local_addr: r.local_addr,
                placement: r.place,
            }),
            None,
        ),
    };
    let world = r.nproc * r.nnodes;
    if r.min_nproc.is_some_and(|m| m == 0 || m > world) {
        return Err(bad(format!("--min-nproc must be between 1 and the job's workers at the start ({world})")));
    }
    let recovery = r.recovery.unwrap_or(Recovery::Live);
    let stages = crate::command::pipeline_stages(&r.command);
    if stages > 1 && !world.is_multiple_of(stages) {
        return Err(bad(format!(
            "the job's {world} workers are not whole pipelines of {stages} stages: give a multiple of {stages} \
             workers in all (--nproc-per-node x --nnodes)"
        )));
    }
    // A pipeline job recovers a lost stage worker from a live replica of its stage; the
    // in-memory copies of the rollback baseline hold whole models only.
    if recovery == Recovery::Memory && crate::command::pipeline_stages(&r.command) > 1 {
        return Err(bad(memory_pipeline_advice(&r)));
    }
    // The baselines serve a coordinator of their own on a free loopback port.
    let asked = here.is_some() && r.coordinator.is_some();
    if recovery == Recovery::Checkpoint {
        return run_restart(r, span.is_some(), asked);
    }
    if r.replay_helpers == 0 || r.replay_helpers > world {
        return Err(bad(format!("--replay-helpers must be between 1 and the job's {world} workers")));
    }
    // A replay job is the elastic job with the logs and checkpoints a replay needs.
    let command = match recovery {
        Recovery::Replay => {
            let shrink = r.on_failure == Some(OnFailure::Shrink);
            crate::replay::replay_command(&r.command, r.save_dir.as_ref(), r.save_every, shrink)?
        }
        _ => r.command,
    };
    crate::elastic::run(crate::elastic::ElasticJob {
        nproc: r.nproc,
        max_restarts: r.max_restarts.unwrap_or(0),
        on_failure: r.on_failure.unwrap_or(if r.max_restarts.is_some() {
            OnFailure::Replace
        } else {
            OnFailure::Shrink
        }),
        min_nproc: r.min_nproc,
        heartbeat_timeout: seconds(r.heartbeat_timeout, "heartbeat-timeout")?,
        settle: seconds(r.rendezvous_timeout, "rendezvous-timeout")?,
        quorum_timeout: seconds(r.quorum_timeout, "quorum-timeout")?,
        copy_every: (recovery == Recovery::Memory).then_some(r.save_every),
        span,
        coordinator: here,
        replay_helpers: r.replay_helpers,
        command,
    })
}

/// A worker command that is another program (a PyTorch loop with `steadfast.elastic`)
/// runs as a worker of an elastic job, which recovers from the live replicas.
fn other_program(r: &LaunchRequest, restarts: bool) -> Result<(), LaunchError> {
    let shown = r.command.join(" ");
    if !restarts {
        return Err(bad(format!(
            "`{shown}` is not a steadfast subcommand: another program runs as a worker of an elastic job              (steadfast.elastic in a PyTorch loop); make the job elastic with --max-restarts K              (0: no replacements)"
        )));
    }
    if r.mpirun.is_some() {
        return Err(bad(format!("`{shown}` is not a steadfast subcommand: --mpirun starts `steadfast train` only")));
    }
    match r.recovery {
        None | Some(Recovery::Live) => Ok(()),
        Some(other) => Err(bad(format!(
            "`{shown}` recovers from its live replicas (--recovery live): --recovery {other} runs `steadfast train` \
             only"
        ))),
    }
}

/// The checkpoint-restart baseline (`--recovery checkpoint`), on this node.
fn run_restart(r: LaunchRequest, spans: bool, asked: bool) -> Result<(), LaunchError> {
    if r.on_failure == Some(OnFailure::Shrink) {
        return Err(bad("--recovery checkpoint restarts every worker: it does not go with --on-failure shrink"));
    }
    if spans {
        return Err(bad("--recovery checkpoint restarts the job on one node: across nodes, recover from the \
             live replicas (--recovery live) or the in-memory copies (memory)"));
    }
    own_coordinator("checkpoint", asked)?;
    crate::restart::run(crate::restart::RestartJob {
        nproc: r.nproc,
        workers: crate::restart::Spawner::Own {
            rendezvous_timeout: seconds(r.rendezvous_timeout, "rendezvous-timeout")?,
            heartbeat_timeout: seconds(r.heartbeat_timeout, "heartbeat-timeout")?,
        },
        max_restarts: r.max_restarts.unwrap_or(0),
        save_every: r.save_every,
        save_dir: r.save_dir,
        command: r.command,
    })
}

/// The baselines serve a coordinator of their own on a free loopback port: an address
/// asked for on the command line (`asked`) would be ignored, so it is refused. (One from
/// torchrun's variables is left to them.)
fn own_coordinator(mode: &str, asked: bool) -> Result<(), LaunchError> {
    if asked {
        return Err(bad(format!(
            "--recovery {mode} serves its coordinator on a free loopback port of this host: \
             --coordinator does not apply to it (leave it out, or recover with --recovery live or memory)"
        )));
    }
    Ok(())
}

/// Why the rollback baseline (`--recovery memory`, in-memory copies of the whole model)
/// cannot run the pipeline stages of `r`'s command, with the commands that recover a
/// pipeline job: said once, here, rather than by each worker as it refuses its
/// configuration.
fn memory_pipeline_advice(r: &LaunchRequest) -> String {
    let mut flags = vec![format!("--nproc {}", r.nproc)];
    flags.extend(r.max_restarts.map(|k| format!("--max-restarts {k}")));
    flags.extend(r.on_failure.map(|f| format!("--on-failure {f}")));
    format!(
        "--recovery memory keeps in-memory copies of the whole model, but this job's workers hold {} pipeline \
         stages: a pipeline job recovers a lost stage worker from a live replica of its stage:\n  steadfast launch \
         {} -- {}\n(or replays its neighbours' boundary logs with --recovery replay, or restarts every worker from \
         the last checkpoint with --recovery checkpoint)",
        crate::command::pipeline_stages(&r.command),
        flags.join(" "),
        r.command.join(" ")
    )
}

fn failed_if_any(failures: Vec<String>) -> Result<(), LaunchError> {
    if failures.is_empty() {
        Ok(())
    } else {
        Err(LaunchError::Failed(format!("the job failed: {}", failures.join("; "))))
    }
}

/// A job under the MPI starter, restarted whole from its last checkpoint with
/// `max_restarts`.
fn run_mpi(r: LaunchRequest) -> Result<(), LaunchError> {
    if r.max_nnodes > 1
        || r.coordinator.is_some()
        || r.rendezvous.is_some()
        || r.local_addr.is_some()
        || r.place != Placement::Replicas
    {
        return Err(bad("MPI places the ranks of --engine mpi and they meet through MPI: \
             give hosts in --mpirun's options (e.g. --hostfile), not --nnodes, --coordinator, --rendezvous, \
             --local-addr or --place"));
    }
    if r.on_failure.is_some() || matches!(r.recovery, Some(Recovery::Live | Recovery::Memory)) {
        return Err(bad("an MPI job is not elastic (a rank's failure ends every rank): \
             --max-restarts restarts it from its last checkpoint (--recovery checkpoint)"));
    }
    let starter = crate::mpi::Starter::parse(r.mpirun.as_deref().unwrap_or_default())?;
    if let Some(max_restarts) = r.max_restarts {
        return crate::restart::run(crate::restart::RestartJob {
            nproc: r.nproc,
            workers: crate::restart::Spawner::Mpi(starter),
            max_restarts,
            save_every: r.save_every,
            save_dir: r.save_dir,
            command: r.command,
        });
    }
    failed_if_any(starter.run(r.nproc, &r.command, &[])?)
}

/// `--place stages` lays the stages of whole pipelines on a fixed set of nodes.
fn check_placement(r: &LaunchRequest) -> Result<(), LaunchError> {
    if r.place == Placement::Replicas {
        return Ok(());
    }
    let stages = crate::command::pipeline_stages(&r.command);
    let world = r.nproc * r.nnodes;
    if stages < 2 {
        return Err(bad("--place stages lays a pipeline's stages on the nodes, but the worker command has one \
             stage: give `train --pipeline-stages S`, or leave --place out"));
    }
    if r.max_nnodes != r.nnodes {
        return Err(bad(format!(
            "--place stages lays the stages on a fixed set of nodes, but --nnodes {}:{} is a range (a node that \
             joins would hold part of every stage): give one count, or place by replica (--place replicas)",
            r.nnodes, r.max_nnodes
        )));
    }
    if !world.is_multiple_of(stages) {
        return Err(bad(format!(
            "the job's {world} workers are not whole pipelines of {stages} stages: give a multiple of {stages} \
             workers in all (--nproc-per-node x --nnodes)"
        )));
    }
    Ok(())
}

/// Where this node's workers sit, from the request and torchrun's `PET_*` variables.
fn nodes(r: &LaunchRequest) -> Result<Nodes, LaunchError> {
    if r.nnodes == 0 {
        return Err(bad("--nnodes must be at least 1"));
    }
    if r.max_nnodes < r.nnodes {
        return Err(bad(format!("--nnodes {}:{}: the most nodes are fewer than the least", r.nnodes, r.max_nnodes)));
    }
    if r.node_rank >= r.max_nnodes {
        return Err(bad(format!(
            "--node-rank {} is not one of the {} nodes (0 to {})",
            r.node_rank,
            r.max_nnodes,
            r.max_nnodes - 1
        )));
    }
    let pet = |name: &str| crate::place::env_first(&[name]);
    let coordinator = r
        .coordinator
        .clone()
        .or_else(|| pet("PET_RDZV_ENDPOINT"))
        .or_else(|| Some(format!("{}:{}", pet("PET_MASTER_ADDR")?, pet("PET_MASTER_PORT")?)));
    let meeting = match (&r.rendezvous, coordinator) {
        (Some(_), _) if r.coordinator.is_some() => {
            return Err(bad("--rendezvous and --coordinator are two ways to meet: give one"));
        }
        (Some(url), _) => Meeting::Etcd(url.parse().map_err(|e| bad(format!("--rendezvous: {e}")))?),
        (None, Some(address)) => Meeting::Coordinator(address),
        (None, None) if r.max_nnodes == 1 => Meeting::Loopback,
        (None, None) => {
            return Err(bad(format!(
                "a job of {} nodes needs the coordinator's address: --coordinator HOST:PORT \
                 (or PET_MASTER_ADDR and PET_MASTER_PORT), the same on every node",
                r.max_nnodes
            )));
        }
    };
    Ok(Nodes { nnodes: r.nnodes, node_rank: r.node_rank, meeting, local_addr: r.local_addr, placement: r.place })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> LaunchRequest {
        LaunchRequest {
            nproc: 2,
            nnodes: 1,
            max_nnodes: 1,
            node_rank: 0,
            coordinator: None,
            rendezvous: None,
            local_addr: None,
            rendezvous_timeout: 5.0,
            heartbeat_timeout: 1.0,
            quorum_timeout: 5.0,
            max_restarts: Some(1),
            on_failure: None,
            min_nproc: None,
            recovery: None,
            save_every: 10,
            save_dir: None,
            replay_helpers: 1,
            mpirun: None,
            place: Placement::Replicas,
            command: vec!["train".into()],
        }
    }

    /// Runs `r`, which must be refused before any process starts, and returns the reason.
    fn refused(r: LaunchRequest) -> String {
        match run(r) {
            Err(LaunchError::Config(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_rollback_baseline_of_pipeline_stages_names_the_commands_to_run_instead() {
        let command: Vec<String> = ["train", "--pipeline-stages", "2"].iter().map(|s| s.to_string()).collect();
        let r = LaunchRequest { nproc: 4, max_restarts: Some(2), command, ..request() };
        let why = memory_pipeline_advice(&r);
        assert!(why.contains("hold 2 pipeline stages"), "{why}");
        let instead = "steadfast launch --nproc 4 --max-restarts 2 -- train --pipeline-stages 2";
        assert!(why.contains(instead) && why.contains("--recovery replay"), "{why}");
    }

    #[test]
    fn each_combination_that_cannot_work_is_refused_naming_the_flag() {
        let cases: Vec<(LaunchRequest, &str)> = vec![
            (LaunchRequest { nproc: 0, ..request() }, "--nproc-per-node must be at least 1"),
            (LaunchRequest { command: vec!["ckpt".into()], ..request() }, "must be `train ...`"),
            (
                LaunchRequest {
                    nproc: 4,
                    max_restarts: Some(1),
                    command: ["train", "--pipeline-stages", "3"].map(str::to_owned).to_vec(),
                    ..request()
                },
                "not whole pipelines of 3 stages",
            ),
            (
                LaunchRequest { command: vec!["bench".into(), "collective".into()], ..request() },
                "restart training, not a benchmark",
            ),
            (LaunchRequest { save_every: 0, ..request() }, "--save-every must be at least 1"),
            (LaunchRequest { place: Placement::Stages, ..request() }, "the worker command has one stage"),
            (
                LaunchRequest {
                    nnodes: 2,
                    max_nnodes: 3,
                    coordinator: Some("h:1".into()),
                    place: Placement::Stages,
                    command: ["train", "--pipeline-stages", "2"].map(str::to_owned).to_vec(),
                    ..request()
                },
                "--nnodes 2:3 is a range",
            ),
            (
                LaunchRequest {
                    nproc: 3,
                    max_restarts: None,
                    place: Placement::Stages,
                    command: ["train", "--pipeline-stages", "2"].map(str::to_owned).to_vec(),
                    ..request()
                },
                "not whole pipelines of 2 stages",
            ),
            (
                LaunchRequest { nnodes: 2, max_nnodes: 2, node_rank: 2, ..request() },
                "--node-rank 2 is not one of the 2 nodes",
            ),
            (
                LaunchRequest {
                    nnodes: 2,
                    max_nnodes: 3,
                    max_restarts: None,
                    coordinator: Some("h:1".into()),
                    ..request()
                },
                "is a range of nodes, but a job without --max-restarts",
            ),
            (LaunchRequest { nnodes: 3, max_nnodes: 2, ..request() }, "the most nodes are fewer than the least"),
            (
                LaunchRequest {
                    nnodes: 2,
                    max_nnodes: 2,
                    coordinator: Some("h:1".into()),
                    recovery: Some(Recovery::Checkpoint),
                    ..request()
                },
                "restarts the job on one node",
            ),
            (
                LaunchRequest {
                    rendezvous: Some("etcd://h:2379/j".into()),
                    recovery: Some(Recovery::Checkpoint),
                    ..request()
                },
                "restarts the job on one node",
            ),
            (
                LaunchRequest {
                    rendezvous: Some("etcd://h:2379/j".into()),
                    coordinator: Some("h:1".into()),
                    ..request()
                },
                "two ways to meet",
            ),
            (
                LaunchRequest { min_nproc: Some(3), ..request() },
                "--min-nproc must be between 1 and the job's workers at the start (2)",
            ),
            (
                LaunchRequest {
                    recovery: Some(Recovery::Checkpoint),
                    on_failure: Some(OnFailure::Shrink),
                    ..request()
                },
                "does not go with --on-failure shrink",
            ),
            (LaunchRequest { heartbeat_timeout: 0.0, ..request() }, "--heartbeat-timeout must be a positive number"),
            (
                LaunchRequest {
                    mpirun: Some("mpirun".into()),
                    nnodes: 2,
                    max_nnodes: 2,
                    max_restarts: None,
                    ..request()
                },
                "MPI places the ranks",
            ),
            (
                LaunchRequest { mpirun: Some("mpirun".into()), recovery: Some(Recovery::Live), ..request() },
                "an MPI job is not elastic",
            ),
            (
                LaunchRequest { nnodes: 2, max_nnodes: 2, max_restarts: None, ..request() },
                "needs the coordinator's address",
            ),
            (
                LaunchRequest { recovery: Some(Recovery::Replay), ..request() },
                "--recovery replay replays the stages of a pipeline: the command needs --pipeline-stages S",
            ),
            (
                LaunchRequest {
                    coordinator: Some("127.0.0.1:1".into()),
                    recovery: Some(Recovery::Checkpoint),
                    ..request()
                },
                "--coordinator does not apply",
            ),
        ];
        for (r, want) in cases {
            let why = refused(r);
            assert!(why.contains(want), "{why:?} does not say {want:?}");
        }
    }
}
