//! A static job's workers on this node: all live to the end, or the job fails.
//!
//! Node 0's launcher serves the rendezvous and then the membership by heartbeat
//! ([`comm::supervisor`]); every node's launcher starts its workers, forwards their
//! output, and kills those that outlive the job (a stopped process, say). A job whose
//! workers all exit before it forms is reported at once, not at the rendezvous timeout.

use std::net::{IpAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::procs::{KILL_GRACE, forward_output, job_secret};

/// Where this launcher's workers sit in a job of one or several nodes.
pub(crate) struct Nodes {
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// Where the workers meet.
    pub meeting: Meeting,
    /// Where this node's workers listen (`None`: the address that reaches the
    /// coordinator or etcd).
    pub local_addr: Option<IpAddr>,
}

/// Where a static job's workers meet.
pub(crate) enum Meeting {
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
        Nodes { nnodes: 1, node_rank: 0, meeting: Meeting::Loopback, local_addr: None }
    }
}

/// A static job: `nproc` workers on this node (of `nodes`) that all live to the end, or
/// the job fails.
pub(crate) struct StaticJob<'a> {
    /// Workers on this node.
    pub nproc: usize,
    pub nodes: Nodes,
    /// The worker command (`train ...`).
    pub command: &'a [String],
    /// More environment for every worker.
    pub env: Vec<(String, String)>,
    pub rendezvous_timeout: Duration,
    pub heartbeat_timeout: Duration,
}

/// The port of a `HOST:PORT` address.
fn port_of(address: &str) -> anyhow::Result<u16> {
    let (_, port) =
        address.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("the coordinator {address:?} is not HOST:PORT"))?;
    port.parse().map_err(|e| anyhow::anyhow!("the coordinator {address:?} has a bad port: {e}"))
}

/// Runs a static job's workers on this node (and, on node 0, its coordinator); returns
/// what failed (nothing when every worker succeeded).
pub(crate) fn run_static(job: &StaticJob<'_>) -> anyhow::Result<Vec<String>> {
    let nodes = &job.nodes;
    let world = nodes.nnodes * job.nproc;
    let first_rank = nodes.node_rank * job.nproc;
    // On one node the secret is the launcher's to draw; the nodes of a larger job must
    // share it.
    let secret = match std::env::var("STEADFAST_SECRET").ok().filter(|s| !s.is_empty()) {
        Some(s) => s,
        None if nodes.nnodes == 1 => job_secret()?,
        None => anyhow::bail!("a job of several nodes needs STEADFAST_SECRET, the same on every node"),
    };
    // Node 0 serves the coordinator: on the port of --coordinator, on every interface,
    // or on a free loopback port. A job that meets in etcd has none.
    let (listener, meet) = match (&nodes.meeting, nodes.node_rank) {
        (Meeting::Etcd(target), _) => (None, ("STEADFAST_RENDEZVOUS", target.to_string())),
        (Meeting::Loopback, _) => {
            let l = TcpListener::bind("127.0.0.1:0").context("cannot listen for the rendezvous")?;
            let address = l.local_addr()?.to_string();
            (Some(l), ("STEADFAST_COORDINATOR", address))
        }
        (Meeting::Coordinator(address), 0) => {
            let port = port_of(address)?;
            let l = TcpListener::bind(("0.0.0.0", port))
                .with_context(|| format!("cannot serve the coordinator on port {port}"))?;
            (Some(l), ("STEADFAST_COORDINATOR", address.clone()))
        }
        (Meeting::Coordinator(address), _) => (None, ("STEADFAST_COORDINATOR", address.clone())),
    };
    let exe = std::env::current_exe().context("cannot find this executable")?;

    let mut children = Vec::new();
    for local in 0..job.nproc {
        let rank = first_rank + local;
        let child = Command::new(&exe)
            .args(job.command)
            .env("STEADFAST_RANK", rank.to_string())
            .env("STEADFAST_WORLD_SIZE", world.to_string())
            .env(meet.0, &meet.1)
            .env("STEADFAST_SECRET", &secret)
            .env(crate::train_cmd::LAUNCHER_PID, std::process::id().to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", job.nproc.to_string())
            .env("GROUP_RANK", nodes.node_rank.to_string())
            .envs(nodes.local_addr.map(|ip| ("STEADFAST_BIND", ip.to_string())))
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start rank {rank}"))?;
        children.push(child);
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
    std::thread::scope(|s| -> anyhow::Result<Vec<String>> {
        let (over_tx, over_rx) = mpsc::channel();
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
                let _ = over_tx.send(());
                result
            })
        });
        let pumps: Vec<_> = children
            .iter_mut()
            .enumerate()
            .flat_map(|(local, child)| forward_output(first_rank + local, child))
            .collect();
        let mut failures = Vec::new();
        let mut running: Vec<usize> = (0..children.len()).collect();
        // When whoever still runs is killed: it is hung or stopped.
        let mut kill_at: Option<Instant> = None;
        while !running.is_empty() {
            let failed_before = failures.len();
            let mut still = Vec::new();
            for local in running {
                let rank = first_rank + local;
                match children[local].try_wait().with_context(|| format!("waiting for rank {rank}"))? {
                    Some(status) if !status.success() => failures.push(format!("rank {rank} exited with {status}")),
                    Some(_) => {}
                    None => still.push(local),
                }
            }
            running = still;
            // No member is alive as far as the coordinator knows; or a worker failed,
            // which the others learn within the loss bound (from the coordinator, or from
            // etcd when the job has none).
            if over_rx.try_recv().is_ok() {
                sooner(&mut kill_at, Instant::now() + KILL_GRACE);
            }
            if failed_before == 0 && !failures.is_empty() {
                sooner(&mut kill_at, Instant::now() + lost_after + KILL_GRACE);
            }
            if kill_at.is_some_and(|t| Instant::now() > t) {
                for &local in &running {
                    let _ = children[local].kill();
                    let _ = children[local].wait();
                    failures.push(format!("rank {} was killed: still running after the job ended", first_rank + local));
                }
                running.clear();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        workers_gone.store(true, Ordering::Relaxed);
        for p in pumps {
            let _ = p.join();
        }
        match coordinator.map(|c| c.join()) {
            None => {}
            Some(Ok(Err(e))) => failures.push(format!("rendezvous: {e}")),
            Some(Ok(Ok(membership))) => {
                failures.extend(membership.lost().into_iter().map(|(r, why)| format!("rank {r} was lost: {why}")))
            }
            Some(Err(_)) => failures.push("the coordinator thread panicked".into()),
        }
        Ok(failures)
    })
}

/// Moves `deadline` to `at` if that is sooner.
fn sooner(deadline: &mut Option<Instant>, at: Instant) {
    *deadline = Some(deadline.map_or(at, |d| d.min(at)));
}
