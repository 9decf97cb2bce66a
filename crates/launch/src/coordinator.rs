//! A coordinator on its own (`steadfast coordinator`), for a job whose workers run on
//! several hosts and were started by something else (a scheduler, a shell on each host).
//!
//! A static job's coordinator hands out the address table, then keeps membership by
//! heartbeat until every worker has finished or been lost. An elastic job's runs the step
//! protocol's coordinator ([`comm::control::coordinate`]) until the job finishes or stops;
//! it keeps nothing on disk, so one started again with a higher generation rebuilds the
//! membership from the workers' reports.

use std::net::TcpListener;
use std::time::{Duration, Instant};

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
#[derive(Clone, Copy, Debug)]
pub struct ElasticSettings {
    /// The fewest workers the job goes on with.
    pub min_world: usize,
    /// How many coordinators of this job were started before this one.
    pub generation: u64,
    /// How long the job waits for enough workers before it stops.
    pub quorum_timeout: Duration,
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
    match job.elastic {
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
    elastic: ElasticSettings,
    say: &mut dyn FnMut(String),
) -> Result<(), LaunchError> {
    if elastic.generation >= 1 << 24 {
        return Err(LaunchError::Config("--generation must be below 2^24".into()));
    }
    let timing = Timing::for_coordinator(job.heartbeat_timeout, job.join_timeout, elastic.quorum_timeout);
    let machine = Coordinator::new(elastic.generation, job.world, elastic.min_world, timing, Instant::now());
    let started = Instant::now();
    let requests = comm::control::Requests::default();
    let state = comm::control::coordinate(listener, secret, machine, timing, &requests, &mut |event| {
        say(format!("{:>7.2} s  {event}", started.elapsed().as_secs_f64()));
    })?;
    match state {
        JobState::Finished => Ok(()),
        JobState::Stopped { reason } => Err(LaunchError::Failed(format!("the job stopped: {reason}"))),
        other => Err(LaunchError::Failed(format!("the coordinator ended while {other:?}"))),
    }
}
