//! A static job's workers on this node: all live to the end, or the job fails.
//!
//! Node 0's launcher serves the rendezvous and then the membership by heartbeat
//! ([`comm::supervisor`]); every node's launcher starts its workers, forwards their
//! output, and kills those that outlive the job (a stopped process, say). A job whose
//! workers all exit before it forms is reported at once, not at the rendezvous timeout.

use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::slots::{Placement, SlotMap};
use crate::workers::{Exited, Workers};
use crate::{KILL_GRACE, LaunchError};

/// Where this launcher's workers sit in a job of one or several nodes.
pub struct Nodes {
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// Where the workers meet.
    pub meeting: Meeting,
    /// Where this node's workers listen (`None`: the address that reaches the
    /// coordinator or etcd).
    pub local_addr: Option<IpAddr>,
    /// How the job's slots are laid on its nodes.
    pub placement: Placement,
}

/// Where a job's workers meet.
#[derive(Clone, Debug)]
pub enum Meeting {
    /// At the launcher's coordinator on a free loopback port (one node only).
    Loopback,
    /// At the coordinator at HOST:PORT, which node 0's launcher serves.
    Coordinator(String),
    /// In etcd: no coordinator.
    Etcd(comm::etcd::Target),
}

impl Nodes {
    /// One node, with the coordinator on a free loopback port.
    pub fn single() -> Self {
        Nodes { nnodes: 1, node_rank: 0, meeting: Meeting::Loopback, local_addr: None, placement: Placement::Replicas }
    }
}

/// A static job: `nproc` workers on this node (of `nodes`) that all live to the end, or
/// the job fails.
pub struct StaticJob<'a> {
    /// Workers on this node.
    pub nproc: usize,
    /// Where they sit.
    pub nodes: Nodes,
    /// The worker command (`train ...`).
    pub command: &'a [String],
    /// More environment for every worker.
    pub env: Vec<(String, String)>,
    /// How long the workers have to join.
    pub rendezvous_timeout: Duration,
    /// Silence after which a worker is lost.
    pub heartbeat_timeout: Duration,
}

/// The port of a `HOST:PORT` address.
pub(crate) fn port_of(address: &str) -> Result<u16, LaunchError> {
    let bad = |why: String| LaunchError::Config(format!("the coordinator {address:?} {why}"));
    let (_, port) = address.rsplit_once(':').ok_or_else(|| bad("is not HOST:PORT".into()))?;
    port.parse().map_err(|e| bad(format!("has a bad port: {e}")))
}

/// What the launcher hears.
enum Heard {
    /// A worker's process exited.
    Exited(Exited),
    /// The coordinator's membership ended: no member is alive as far as it knows.
    Over,
}

/// Runs a static job's workers on this node (and, on node 0, its coordinator); returns
/// what failed (nothing when every worker succeeded).
pub fn run(job: &StaticJob<'_>) -> Result<Vec<String>, LaunchError> {
    let nodes = &job.nodes;
    let world = nodes.nnodes * job.nproc;
    let stages = crate::command::pipeline_stages(job.command);
    let slots = SlotMap::new(nodes.placement, job.nproc, nodes.nnodes, stages).of_node(nodes.node_rank);
    // On one node the secret is the launcher's to draw; the nodes of a larger job must
    // share it.
    let secret = crate::shared_secret(nodes.nnodes > 1)?;
    let (listener, meet) = meeting_point(nodes)?;
    let (tx, rx) = mpsc::channel();
    let mut env = vec![
        ("STEADFAST_WORLD_SIZE".to_owned(), world.to_string()),
        (meet.0.to_owned(), meet.1),
        ("STEADFAST_SECRET".to_owned(), secret.clone()),
        ("LOCAL_WORLD_SIZE".to_owned(), job.nproc.to_string()),
        ("GROUP_RANK".to_owned(), nodes.node_rank.to_string()),
    ];
    env.extend(nodes.local_addr.map(|ip| ("STEADFAST_BIND".to_owned(), ip.to_string())));
    env.extend(job.env.iter().cloned());
    let mut workers = Workers::new(job.command, env, tx.clone(), Heard::Exited)?;
    for (local, &rank) in slots.iter().enumerate() {
        let place = [("STEADFAST_RANK".to_owned(), rank.to_string()), ("LOCAL_RANK".to_owned(), local.to_string())];
        workers.start(rank, 0, &place)?;
    }
    let (timeout, heartbeat) = (job.rendezvous_timeout, job.heartbeat_timeout);
    // How long the others take to learn of a lost worker.
    let lost_after = match &nodes.meeting {
        Meeting::Etcd(target) => target.ttl,
        _ => heartbeat,
    };
    let secret_bytes = secret.into_bytes();
    // Set once every worker of this node has exited: a job that has not formed by then
    // never will, and its rendezvous is not waited out.
    let workers_gone = AtomicBool::new(false);
    let outcome = std::thread::scope(|s| -> Result<Vec<String>, LaunchError> {
        let workers_gone = &workers_gone;
        let coordinator = listener.map(|listener| {
            s.spawn(move || {
                let result =
                    comm::rendezvous::serve_unless(&listener, world, &secret_bytes, timeout, heartbeat, workers_gone)
                        .map(|job| {
                            comm::supervisor::supervise(job.streams, heartbeat, &mut |event| {
                                eprintln!("[coordinator] {event}");
                            })
                        });
                let _ = tx.send(Heard::Over);
                result
            })
        });
        let mut failures = watch(&mut workers, &rx, lost_after);
        workers_gone.store(true, Ordering::Relaxed);
        match coordinator.map(|c| c.join()) {
            None => {}
            Some(Ok(Err(e))) => failures.push(format!("rendezvous: {e}")),
            Some(Ok(Ok(membership))) => {
                failures.extend(membership.lost().into_iter().map(|(r, why)| format!("rank {r} was lost: {why}")))
            }
            Some(Err(_)) => failures.push("the coordinator thread panicked".into()),
        }
        Ok(failures)
    });
    workers.join();
    outcome
}

/// Where this node's workers meet, and the listener of the coordinator if this node
/// serves it: node 0 serves it on the port of --coordinator, on every interface, or on a
/// free loopback port. A job that meets in etcd has none.
fn meeting_point(nodes: &Nodes) -> Result<(Option<TcpListener>, (&'static str, String)), LaunchError> {
    Ok(match (&nodes.meeting, nodes.node_rank) {
        (Meeting::Etcd(target), _) => (None, ("STEADFAST_RENDEZVOUS", target.to_string())),
        (Meeting::Loopback, _) => {
            let (l, address) = crate::coordinator_listener(None)?;
            (Some(l), ("STEADFAST_COORDINATOR", address))
        }
        (Meeting::Coordinator(address), 0) => {
            let (l, address) = crate::coordinator_listener(Some(address))?;
            (Some(l), ("STEADFAST_COORDINATOR", address))
        }
        (Meeting::Coordinator(address), _) => (None, ("STEADFAST_COORDINATOR", address.clone())),
    })
}

/// Waits for every worker to exit; after the first failure, or once the coordinator has
/// no member left, whoever still runs past the loss bound and a grace is killed (it is
/// hung or stopped). Returns what failed.
fn watch(workers: &mut Workers<Heard>, rx: &Receiver<Heard>, lost_after: Duration) -> Vec<String> {
    let mut failures = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut killed: Vec<usize> = Vec::new();
    while workers.any_running() {
        let wait = kill_at.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait) {
            Ok(Heard::Exited(e)) => {
                workers.exited(&e);
                let rank = e.slot;
                match e.status {
                    _ if killed.contains(&rank) => {}
                    Ok(status) if status.success() => {}
                    Ok(status) => failures.push(format!("rank {rank} exited with {status}")),
                    Err(why) => failures.push(format!("rank {rank} could not be reaped: {why}")),
                }
                // The others learn of a failure within the loss bound (from the
                // coordinator, or from etcd when the job has none).
                if !failures.is_empty() && killed.is_empty() {
                    sooner(&mut kill_at, Instant::now() + lost_after + KILL_GRACE);
                }
            }
            Ok(Heard::Over) if killed.is_empty() => sooner(&mut kill_at, Instant::now() + KILL_GRACE),
            Ok(Heard::Over) => {}
            Err(RecvTimeoutError::Timeout) if kill_at.is_some() => {
                for rank in workers.running() {
                    if workers.kill(rank, None).is_some() {
                        failures.push(format!("rank {rank} was killed: still running after the job ended"));
                        killed.push(rank);
                    }
                }
                kill_at = None;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    failures
}

/// Moves `deadline` to `at` if that is sooner.
fn sooner(deadline: &mut Option<Instant>, at: Instant) {
    *deadline = Some(deadline.map_or(at, |d| d.min(at)));
}
