//! A coordinator on its own (`steadfast coordinator`), for a job whose workers run on
//! several hosts and were started by something else (a scheduler, a shell on each host).
//!
//! A static job's coordinator hands out the address table, then keeps membership by
//! heartbeat until every worker has finished or been lost. An elastic job's runs the step
//! protocol's coordinator ([`comm::control::coordinate`]) until the job finishes or stops;
//! it keeps nothing on disk, so one started again with a higher generation rebuilds the
//! membership from the workers' reports. With `--rendezvous etcd://...` it is a candidate
//! for the coordinator role instead: it serves once elected (its generation is the
//! election's count), so that standbys on other hosts take over from a lost one on their
//! own.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comm::etcd::elastic::{Background, Candidacy, CoordinatorRole, campaign};

use comm::protocol::coordinator::JobState;
use comm::protocol::{Coordinator, Timing};

use crate::LaunchError;

/// What a standalone coordinator serves.
#[derive(Clone, Debug)]
pub struct Standalone {
    /// Workers in the job (an elastic job's initial size).
    pub world: usize,
    /// How long the workers have to join.
    pub join_timeout: Duration,
    /// Silence after which a worker is lost.
    pub heartbeat_timeout: Duration,
    /// `Some` for an elastic job.
    pub elastic: Option<ElasticSettings>,
}

/// What only an elastic job's coordinator has.
#[derive(Clone, Debug)]
pub struct ElasticSettings {
    /// The fewest workers the job goes on with.
    pub min_world: usize,
    /// How many coordinators of this job were started before this one.
    pub generation: u64,
    /// How long the job waits for enough workers before it stops.
    pub quorum_timeout: Duration,
    /// Where the coordinator role is elected (`None`: this process serves at once, with
    /// `generation`); the election's count is the generation then.
    pub rendezvous: Option<comm::etcd::Target>,
}

/// Serves the job on `listener` until it ends, saying each event in a line; fails unless
/// every worker finished (static) or the job finished (elastic).
pub fn serve(
    listener: TcpListener,
    secret: &[u8],
    job: &Standalone,
    say: &mut dyn FnMut(String),
) -> Result<(), LaunchError> {
    if job.world == 0 {
        return Err(LaunchError::Config("--world-size must be at least 1".into()));
    }
    match &job.elastic {
        Some(elastic) => serve_elastic(listener, secret, job, elastic, say),
        None => serve_static(&listener, secret, job, say),
    }
}

fn serve_static(
    listener: &TcpListener,
    secret: &[u8],
    job: &Standalone,
    say: &mut dyn FnMut(String),
) -> Result<(), LaunchError> {
    let formed = comm::rendezvous::serve(listener, job.world, secret, job.join_timeout, job.heartbeat_timeout)?;
    for (rank, addr) in formed.table.iter().enumerate() {
        say(format!("rank {rank} at {addr}"));
    }
    let membership =
        comm::supervisor::supervise(formed.streams, job.heartbeat_timeout, &mut |event| say(event.to_string()));
    let lost = membership.lost();
    if lost.is_empty() {
        say(format!("all {} workers finished", job.world));
        Ok(())
    } else {
        Err(LaunchError::Failed(format!("{} of {} workers were lost", lost.len(), job.world)))
    }
}

fn serve_elastic(
    listener: TcpListener,
    secret: &[u8],
    job: &Standalone,
    elastic: &ElasticSettings,
    say: &mut dyn FnMut(String),
) -> Result<(), LaunchError> {
    if elastic.generation >= 1 << 24 {
        return Err(LaunchError::Config("--generation must be below 2^24".into()));
    }
    let timing = Timing::for_coordinator(job.heartbeat_timeout, job.join_timeout, elastic.quorum_timeout);
    let requests = Arc::new(comm::control::Requests::default());
    let lost = Arc::new(Mutex::new(None));
    let (generation, elected) = match &elastic.rendezvous {
        None => (elastic.generation, None),
        Some(target) => match elect(&listener, target, &requests, &lost, say)? {
            Some((role, leases)) => (role.generation(), Some((role, leases))),
            None => return Ok(()),
        },
    };
    let machine = Coordinator::new(generation, job.world, elastic.min_world, timing, Instant::now());
    let started = Instant::now();
    let state = comm::control::coordinate(listener, secret, machine, timing, &requests, &mut |event| {
        say(format!("{:>7.2} s  {event}", started.elapsed().as_secs_f64()));
    })?;
    if let Some(why) = lost.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(LaunchError::Failed(format!("this process lost the coordinator role: {why}")));
    }
    if let Some((role, _leases)) = elected {
        role.resign(match &state {
            JobState::Finished => Some("finished".to_owned()),
            JobState::Stopped { reason } => Some(format!("stopped: {reason}")),
            _ => None,
        });
    }
    match state {
        JobState::Finished => Ok(()),
        JobState::Stopped { reason } => Err(LaunchError::Failed(format!("the job stopped: {reason}"))),
        other => Err(LaunchError::Failed(format!("the coordinator ended while {other:?}"))),
    }
}

/// Campaigns for the coordinator role in etcd until elected (then watches the workers'
/// leases) or the job is over (`None`). A role lost later stops the coordinator and is
/// kept in `lost`.
fn elect(
    listener: &TcpListener,
    target: &comm::etcd::Target,
    requests: &Arc<comm::control::Requests>,
    lost: &Arc<Mutex<Option<String>>>,
    say: &mut dyn FnMut(String),
) -> Result<Option<(CoordinatorRole, Background)>, LaunchError> {
    let mut addr = listener.local_addr().map_err(LaunchError::io("cannot read the listening address"))?;
    if addr.ip().is_unspecified() {
        // Listening on every interface: the workers dial the one that reaches etcd.
        let etcd = crate::place::resolve(&target.endpoint, "etcd")?;
        addr.set_ip(
            comm::rendezvous::local_address_towards(etcd)
                .map_err(LaunchError::io(format!("no local address reaches etcd at {etcd}")))?,
        );
    }
    let failed = |e: comm::transport::CommError| LaunchError::Failed(format!("the coordinator role in etcd: {e}"));
    let on_lost = {
        let (requests, lost) = (Arc::clone(requests), Arc::clone(lost));
        move |why: String| {
            *lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            requests.shutdown.store(true, Ordering::Relaxed);
        }
    };
    say(format!("campaigning for the coordinator role at {target}, to serve at {addr}"));
    let role = match campaign(target, addr, Arc::new(AtomicBool::new(false)), on_lost).map_err(failed)? {
        Candidacy::Won(role) => role,
        Candidacy::Over(how) => {
            say(format!("the job is over in etcd ({how}): nothing to coordinate"));
            return Ok(None);
        }
        Candidacy::GaveUp => return Ok(None),
    };
    say(format!("this process holds the coordinator role (generation {})", role.generation()));
    let requests = Arc::clone(requests);
    let leases = comm::etcd::elastic::watch_workers(target, move |id, incarnation| {
        requests.expired.lock().unwrap_or_else(|e| e.into_inner()).push((id, incarnation));
    })
    .map_err(failed)?;
    Ok(Some((role, leases)))
}
