//! A static job's workers on this node: all live to the end, or the job fails.
//!
//! Node 0's launcher serves the rendezvous and then the membership by heartbeat
//! ([`comm::supervisor`]); every node's launcher starts its workers, forwards their
//! output, and kills those that outlive the job (a stopped process, say), in the loop
//! that supervises every kind of job (the `supervise` module). A job whose
//! workers all exit before it forms is reported at once, not at the rendezvous timeout.

use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::LaunchError;
use crate::record::Recorder;
use crate::slots::{Placement, SlotMap};
use crate::supervise::{Heard, Mode, Supervisor};
use crate::workers::Workers;

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
    let workers = Workers::new(job.command, env, tx.clone(), Heard::Exited)?;
    let (timeout, heartbeat) = (job.rendezvous_timeout, job.heartbeat_timeout);
    // How long the others take to learn of a lost worker.
    let lost_after = match &nodes.meeting {
        Meeting::Etcd(target) => target.ttl,
        _ => heartbeat,
    };
    let record = Recorder::new(job.command, slots.clone(), None);
    let mut supervisor = Supervisor::new(Mode::Static { lost_after }, workers, slots, record);
    supervisor.start_all()?;
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
                let _ = tx.send(Heard::CoordinatorDone);
                result
            })
        });
        let supervised = supervisor.supervise(&rx, None);
        workers_gone.store(true, Ordering::Relaxed);
        supervised?;
        let mut failures = std::mem::take(&mut supervisor.failures);
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
    supervisor.workers.join();
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
