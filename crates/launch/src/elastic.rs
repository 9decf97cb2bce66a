//! An elastic job, which survives the loss of workers (`steadfast launch --max-restarts
//! K`, or `--on-failure shrink`), on this host or on several.
//!
//! The launcher runs the step protocol's coordinator ([`comm::control::coordinate`]) and
//! starts `nproc` workers in its slots. When a worker's process exits with an error, or
//! the coordinator declares it lost (a hung or cut-off process, which the launcher then
//! kills), the [`RestartPolicy`] says whether a new process takes the slot (`replace`, at
//! most K times in all), which fetches the state from the live replicas, or the survivors
//! go on without it (`shrink`), or the job ends. Survivors never restart. Every failure
//! and recovery is one line of output.
//!
//! On this host alone the coordinator listens on a free loopback port, or, with
//! `--coordinator HOST:PORT`, on that port (on every interface) so that workers started
//! by hand with the job's secret can join the job; the launcher's first line names the
//! address it listens on.
//!
//! On several nodes ([`Span`]) one launcher runs on each, as for a static job: node `I`
//! starts the slots `I*N .. I*N+N-1` (or, with `--place stages`, its share of the slots
//! taken stage by stage: [`crate::slots`]), and node 0's launcher also serves the coordinator
//! on the port of `--coordinator`. Each launcher replaces its own workers; the
//! coordinator's quorum decides whether the job goes on without a lost node (down to
//! `--min-nproc` workers in all), and a node whose launcher is started again (or a new
//! node, up to the range's maximum) joins the running job, its workers fetching the
//! state from the live replicas.
//!
//! A job that meets in etcd (`--rendezvous etcd://...`) has no fixed coordinator: every
//! node's launcher is a candidate for the role ([`comm::etcd::elastic::campaign`]), the
//! one elected serves it on a port of its own, and when it is lost another launcher is
//! elected and rebuilds the membership from the workers' reports. The elected one also
//! watches the workers' leases: an expired lease is a lost worker.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comm::control::{MembershipEvent, Requests};
use comm::etcd::elastic::Candidacy;
use comm::protocol::coordinator::JobState;
use comm::protocol::{Coordinator, Timing};

use crate::record::Recorder;
use crate::slots::{Placement, SlotMap};
use crate::static_job::Meeting;
use crate::supervise::{Heard, Mode, Supervisor};
use crate::workers::Workers;
use crate::{LaunchError, OnFailure, RestartPolicy, say};

/// How an elastic job is run.
pub struct ElasticJob {
    /// Workers at the start (on this node).
    pub nproc: usize,
    /// Replacement processes allowed, in all (on this node).
    pub max_restarts: u32,
    /// Replace or shrink.
    pub on_failure: OnFailure,
    /// The fewest workers the job goes on with (in all), when the user said.
    pub min_nproc: Option<usize>,
    /// Silence after which a worker is lost.
    pub heartbeat_timeout: Duration,
    /// How long the first quorum waits for every worker.
    pub settle: Duration,
    /// How long the job waits for enough workers before it stops.
    pub quorum_timeout: Duration,
    /// The rollback baseline: workers copy their state every this many steps and go
    /// back to the copy when a member is lost.
    pub copy_every: Option<u64>,
    /// The nodes of a job of several (`None`: this host alone).
    pub span: Option<Span>,
    /// On this host alone, the `HOST:PORT` of `--coordinator`: the coordinator listens on
    /// its port and the workers dial it (`None`: a free loopback port). Unused with `span`,
    /// which says where the job meets.
    pub coordinator: Option<String>,
    /// Workers that share the replay of a lost pipeline stage, at most.
    pub replay_helpers: usize,
    /// The worker command (`train ...`).
    pub command: Vec<String>,
}

/// The nodes of an elastic job of several.
#[derive(Clone, Debug)]
pub struct Span {
    /// Nodes at the start: the coordinator's first quorum waits for their workers.
    pub nnodes: usize,
    /// This node's index (below the range's maximum).
    pub node_rank: usize,
    /// Where the workers meet: at the coordinator `HOST:PORT`, which node 0 serves on
    /// that port, or in etcd, where the launchers elect the one that serves it.
    pub meeting: Meeting,
    /// Where this node's workers listen (`None`: the address that reaches the coordinator).
    pub local_addr: Option<IpAddr>,
    /// How the job's slots are laid on its nodes.
    pub placement: Placement,
}

/// How this launcher takes part in coordinating the job.
enum Coordinating {
    /// It serves the coordinator on this listener from the start.
    Serves(TcpListener),
    /// It is a candidate for the role in etcd, and would serve it on this listener.
    Candidate(TcpListener, comm::etcd::Target),
    /// Another node serves it.
    Not,
}

/// Where the workers meet: how this launcher takes part, and the variable (and value)
/// that tells the workers. `here` is the coordinator's `HOST:PORT` of a job on this host
/// alone, if one was given.
fn meeting(span: Option<&Span>, here: Option<&str>) -> Result<(Coordinating, (&'static str, String)), LaunchError> {
    let at = |a: String| ("STEADFAST_COORDINATOR", a);
    match span.map(|s| (s, &s.meeting)) {
        None => crate::coordinator_listener(here).map(|(l, a)| (Coordinating::Serves(l), at(a))),
        Some((span, Meeting::Coordinator(address))) if span.node_rank == 0 => {
            crate::coordinator_listener(Some(address)).map(|(l, a)| (Coordinating::Serves(l), at(a)))
        }
        Some((_, Meeting::Coordinator(address))) => Ok((Coordinating::Not, at(address.clone()))),
        Some((span, Meeting::Etcd(target))) => {
            let ip = match span.local_addr {
                Some(ip) => ip,
                None => {
                    let etcd = crate::place::resolve(&target.endpoint, "etcd")?;
                    comm::rendezvous::local_address_towards(etcd)
                        .map_err(LaunchError::io(format!("no local address reaches etcd at {etcd}")))?
                }
            };
            let l = TcpListener::bind((ip, 0)).map_err(LaunchError::io("cannot listen for the coordinator"))?;
            Ok((Coordinating::Candidate(l, target.clone()), ("STEADFAST_RENDEZVOUS", target.to_string())))
        }
        Some((_, Meeting::Loopback)) => Err(LaunchError::Config(
            "an elastic job of several nodes meets at a \
             coordinator (--coordinator) or in etcd (--rendezvous)"
                .into(),
        )),
    }
}

/// Runs the job (this node's part of it); fails unless it finished.
pub fn run(plan: ElasticJob) -> Result<(), LaunchError> {
    let span = plan.span.as_ref();
    let secret = crate::shared_secret(span.is_some())?;
    let (role, meet_at) = meeting(span, plan.coordinator.as_deref())?;
    // Said before anything else: who starts workers by hand reads the address here.
    let announce = announcement(&role, &meet_at.1, &plan)?;
    let world = plan.nproc * span.map_or(1, |s| s.nnodes);
    let stages = crate::command::pipeline_stages(&plan.command);
    let nodes = span.map(|s| SlotMap::new(s.placement, plan.nproc, s.nnodes, stages));
    let slots = match (span, nodes) {
        (Some(span), Some(nodes)) => nodes.of_node(span.node_rank),
        _ => (0..plan.nproc).collect(),
    };
    let timing = Timing::for_coordinator(plan.heartbeat_timeout, plan.settle, plan.quorum_timeout);
    let min_world = match (span, plan.on_failure, plan.min_nproc) {
        // On one host a replaced worker is waited for unless the user gave the fewest
        // workers to go on with: the job keeps its world size (and, in the
        // `deterministic` mode, its bits).
        (None, OnFailure::Replace, None) => plan.nproc,
        // Otherwise the survivors step on while a replacement starts (the same bits where
        // the sum is reproducible); across nodes the quorum goes on without a lost node.
        (_, _, given) => given.unwrap_or(1),
    };
    let requests = Arc::new(Requests::default());
    let (tx, rx) = mpsc::channel();
    let mut env = vec![
        ("STEADFAST_WORLD_SIZE".to_owned(), world.to_string()),
        (meet_at.0.to_owned(), meet_at.1),
        ("STEADFAST_SECRET".to_owned(), secret.clone()),
        ("STEADFAST_ELASTIC".to_owned(), "1".to_owned()),
        ("LOCAL_WORLD_SIZE".to_owned(), plan.nproc.to_string()),
    ];
    env.extend(plan.copy_every.map(|k| ("STEADFAST_COPY_EVERY".to_owned(), k.to_string())));
    env.extend(span.and_then(|s| s.local_addr).map(|ip| ("STEADFAST_BIND".to_owned(), ip.to_string())));
    // A node of several never stops the job on its own count: the coordinator's quorum,
    // which sees every node, decides.
    let local_min = if span.is_some() { 0 } else { min_world };
    let policy = RestartPolicy::new(plan.nproc, plan.on_failure, plan.max_restarts, local_min);
    let workers = Workers::new(&plan.command, env, tx.clone(), Heard::Exited)?;
    let record = Recorder::new(&plan.command, slots.clone(), nodes);
    let mode = Mode::Elastic {
        policy,
        max_restarts: plan.max_restarts,
        heartbeat_timeout: plan.heartbeat_timeout,
        node: span.map(|s| s.node_rank as u64),
    };
    let mut job = Supervisor::new(mode, workers, slots, record);
    job.serves = matches!(role, Coordinating::Serves(_));
    job.elected = matches!(role, Coordinating::Candidate(..));
    if job.serves {
        job.record.open(true);
    }
    if let Some(line) = announce {
        say!(job.started, "{line}");
    }
    job.start_all()?;
    let started = job.started;
    let give_up = Arc::new(AtomicBool::new(false));
    let state = std::thread::scope(|s| -> Result<Option<JobState>, LaunchError> {
        let serving = Serving {
            key: secret.as_bytes(),
            world,
            stages,
            helpers: plan.replay_helpers,
            min_world,
            timing,
            requests: &requests,
            started,
            tx: tx.clone(),
            give_up: Arc::clone(&give_up),
        };
        let coordinator = match role {
            Coordinating::Not => None,
            role => Some(s.spawn(move || serving.serve(role))),
        };
        let supervised = job.supervise(&rx, Some(requests.as_ref()));
        // Also when supervision failed: the coordinator's thread (or campaign) must end.
        give_up.store(true, Ordering::Relaxed);
        requests.shutdown.store(true, Ordering::Relaxed);
        supervised?;
        let Some(coordinator) = coordinator else { return Ok(None) };
        let Some(state) =
            coordinator.join().map_err(|_| LaunchError::Failed("the coordinator thread panicked".into()))??
        else {
            return Ok(None);
        };
        // A job the coordinator stopped says why; one a worker's error ended points at it.
        if let Some(i) = job.stopped_on_error
            && matches!(state, JobState::Gathering { .. } | JobState::Syncing { .. } | JobState::Running)
        {
            return Err(LaunchError::Failed(format!("worker {i} stopped on an error (above)")));
        }
        Ok(Some(state))
    })?;
    let (restarts, errored, finished) = (job.restarts(), job.stopped_on_error.is_some(), job.finished);
    job.workers.join();
    outcome(state, restarts, (errored, finished), started)
}

/// The line that says where the coordinator this launcher serves listens (and where its
/// workers dial it, `dial_at`), said before anything else: who starts workers by hand
/// reads the address there. `None` when this launcher serves none.
fn announcement(role: &Coordinating, dial_at: &str, plan: &ElasticJob) -> Result<Option<String>, LaunchError> {
    Ok(match role {
        Coordinating::Serves(l) => {
            let local = l.local_addr().map_err(LaunchError::io("cannot read the coordinator's address"))?;
            let dial =
                if dial_at == local.to_string() { String::new() } else { format!(" (workers dial {})", dial_at) };
            let drawn = std::env::var_os("STEADFAST_SECRET").is_none_or(|s| s.is_empty());
            let secret_note = if plan.span.is_none() && plan.coordinator.is_some() && drawn {
                "; the job's secret was drawn for this launch: a worker started by hand joins only when \
             STEADFAST_SECRET is set, the same for the launcher and the worker"
            } else {
                ""
            };
            Some(format!("coordinator listening on {local}{dial}{secret_note}"))
        }
        _ => None,
    })
}

/// What the job's end means for this launcher: its exit (`state`: the coordinator's last
/// state, where this launcher served it; otherwise what its workers said: whether one
/// stopped on an error, whether they finished), said with the replacements it made.
fn outcome(
    state: Option<JobState>,
    restarts: u32,
    (errored, finished): (bool, bool),
    started: Instant,
) -> Result<(), LaunchError> {
    match state {
        Some(JobState::Finished) if errored => {
            Err(LaunchError::Failed("the job finished, but a worker failed as it ended (its output says why)".into()))
        }
        Some(JobState::Finished) => {
            println!(
                "[launcher] the job finished in {:.1} s with {restarts} replacement(s)",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(JobState::Stopped { reason }) => Err(LaunchError::Failed(format!("the job stopped: {reason}"))),
        Some(_) => Err(LaunchError::Failed("every worker exited before the job finished".into())),
        // A node without the coordinator hears the end from its workers.
        None if errored => Err(LaunchError::Failed("a worker of this node stopped on an error".into())),
        None if finished => {
            println!(
                "[launcher] this node's part of the job finished in {:.1} s with {restarts} replacement(s)",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        None => Err(LaunchError::Failed("every worker of this node exited before the job finished".into())),
    }
}

/// What the coordinator's thread needs to serve the job.
struct Serving<'a> {
    key: &'a [u8],
    world: usize,
    /// The pipeline stages of the workers' command (1: data-parallel).
    stages: usize,
    /// Workers that share a replay, at most.
    helpers: usize,
    min_world: usize,
    timing: Timing,
    requests: &'a Arc<Requests>,
    started: Instant,
    tx: Sender<Heard>,
    give_up: Arc<AtomicBool>,
}

impl Serving<'_> {
    /// Serves the coordinator (once elected, for a candidate) until the job is over or
    /// the role is lost; `None` when this launcher never served it or lost it.
    fn serve(self, role: Coordinating) -> Result<Option<JobState>, LaunchError> {
        let (listener, generation, elected) = match role {
            Coordinating::Not => return Ok(None),
            Coordinating::Serves(listener) => (listener, 0, None),
            Coordinating::Candidate(listener, target) => match self.elect(&listener, &target)? {
                Some((generation, held)) => (listener, generation, Some(held)),
                None => return Ok(None),
            },
        };
        let machine = Coordinator::new(generation, self.world, self.min_world, self.timing, Instant::now())
            .with_stages(self.stages)
            .with_replay_helpers(self.helpers);
        let (tx, started) = (&self.tx, self.started);
        let state = comm::control::coordinate(listener, self.key, machine, self.timing, self.requests, &mut |event| {
            println!("[coordinator] {:>7.2} s  {event}", started.elapsed().as_secs_f64());
            let _ = tx.send(Heard::Said(event.clone()));
            let _ = match event {
                MembershipEvent::Lost { id, incarnation, .. } => {
                    tx.send(Heard::Lost { slot: id as usize, incarnation })
                }
                MembershipEvent::Finished => tx.send(Heard::Finished),
                _ => Ok(()),
            };
        })
        .map_err(|e| LaunchError::Failed(format!("the coordinator failed: {e}")))?;
        if let Some(Elected { role, lost, .. }) = elected {
            if lost.load(Ordering::Relaxed) {
                // Another launcher serves the job now: this one's workers go on.
                return Ok(None);
            }
            let over = match &state {
                JobState::Finished => Some("finished".to_owned()),
                JobState::Stopped { reason } => Some(format!("stopped: {reason}")),
                _ => None,
            };
            role.resign(over);
        }
        let _ = self.tx.send(Heard::CoordinatorDone);
        Ok(Some(state))
    }

    /// Campaigns for the coordinator role in etcd; once elected, watches the workers'
    /// leases. `None`: the job is over, or the launcher gave up (its workers are gone).
    fn elect(
        &self,
        listener: &TcpListener,
        target: &comm::etcd::Target,
    ) -> Result<Option<(u64, Elected)>, LaunchError> {
        let addr: SocketAddr =
            listener.local_addr().map_err(LaunchError::io("cannot read the coordinator's address"))?;
        let lost = Arc::new(AtomicBool::new(false));
        let on_lost = {
            let (lost, requests, tx) = (Arc::clone(&lost), Arc::clone(self.requests), Mutex::new(self.tx.clone()));
            move |why: String| {
                lost.store(true, Ordering::Relaxed);
                requests.shutdown.store(true, Ordering::Relaxed);
                let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(Heard::RoleLost(why));
            }
        };
        let failed = |e: comm::transport::CommError| LaunchError::Failed(format!("the coordinator role in etcd: {e}"));
        let role =
            match comm::etcd::elastic::campaign(target, addr, Arc::clone(&self.give_up), on_lost).map_err(failed)? {
                Candidacy::Won(role) => role,
                Candidacy::Over(how) => {
                    say!(self.started, "the job is over in etcd ({how}): nothing to coordinate");
                    return Ok(None);
                }
                Candidacy::GaveUp => return Ok(None),
            };
        let generation = role.generation();
        let _ = self.tx.send(Heard::Elected(generation));
        let requests = Arc::clone(self.requests);
        let leases = comm::etcd::elastic::watch_workers(target, move |id, incarnation| {
            requests.expired.lock().unwrap_or_else(|e| e.into_inner()).push((id, incarnation));
        })
        .map_err(failed)?;
        Ok(Some((generation, Elected { role, lost, _leases: leases })))
    }
}

/// The coordinator role held in etcd: given back when dropped.
struct Elected {
    role: comm::etcd::elastic::CoordinatorRole,
    /// Set when the role was lost.
    lost: Arc<AtomicBool>,
    /// The watch on the workers' leases, for as long as the role is held.
    _leases: comm::etcd::elastic::Background,
}
