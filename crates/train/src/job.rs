//! A rank's membership in a data-parallel job: connecting through the coordinator, the
//! heartbeat whose notices abort the mesh, and the collective checks of a step (the
//! commit vote and the replica comparison). The step's phases are in [`crate::step`];
//! this module is the socket side of the reduce, vote and check phases.

use std::sync::Arc;
use std::time::Duration;

use comm::commit::{Ballot, Decision};
use comm::transport::{CommError, TcpMesh, Transport};

use crate::config::DistConfig;
use crate::error::{ConfigError, TrainError};
use crate::step::SumCheck;

/// This rank's connections to a job.
pub struct Job {
    /// The authenticated mesh to every other rank.
    pub mesh: Arc<TcpMesh>,
    heartbeat: comm::supervisor::Heartbeat,
    config: DistConfig,
}

impl Job {
    /// Joins the job: listen, meet the others through the coordinator, connect to all, and
    /// start the heartbeat, whose notices abort the mesh.
    pub fn connect(d: &DistConfig) -> Result<Job, TrainError> {
        let listener = std::net::TcpListener::bind((d.bind, 0))
            .map_err(|e| CommError::Setup(format!("cannot listen on {}: {e}", d.bind)))?;
        let me = listener.local_addr().map_err(|e| CommError::Setup(e.to_string()))?;
        let setup_time = d.timeout.max(Duration::from_secs(30));
        let joined = comm::rendezvous::join(d.coordinator, d.rank, me, &d.secret, setup_time)?;
        let addrs = joined.table;
        if addrs.len() != d.world {
            return Err(ConfigError::Invalid(format!(
                "the coordinator knows {} workers, this one expects {}",
                addrs.len(),
                d.world
            ))
            .into());
        }
        let config = comm::transport::TcpConfig {
            secret: d.secret.clone(),
            max_frame: comm::frame::DEFAULT_MAX_FRAME,
            connect_timeout: setup_time,
            write_timeout: d.timeout,
            // A peer's death reaches the coordinator at once: wait briefly for its verdict
            // so the error names the rank that failed, not a neighbour that aborted first.
            abort_grace: joined.heartbeat_timeout.min(Duration::from_secs(1)),
        };
        let mesh = Arc::new(TcpMesh::connect(d.rank, listener, &addrs, &config)?);
        let aborter = Arc::clone(&mesh);
        let heartbeat =
            comm::supervisor::Heartbeat::start(joined.coordinator, joined.heartbeat_timeout, move |notice| {
                tracing::error!("{notice}");
                aborter.abort(notice.to_string());
            })
            .map_err(|e| CommError::Setup(format!("cannot start the heartbeat: {e}")))?;
        Ok(Job { mesh, heartbeat, config: d.clone() })
    }

    /// The mesh as a transport, for the all-reduce.
    pub fn transport(&self) -> &dyn Transport {
        &*self.mesh
    }

    /// The bound on every collective step.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The vote phase: every rank casts its ballot on the sum it holds (and its newest
    /// durable checkpoint step); the step goes on only if all commit. Returns the ballots.
    pub fn vote(&self, step: u64, check: &SumCheck, durable: u64) -> Result<Vec<Ballot>, TrainError> {
        let ballot = Ballot { ok: check.finite, digest: check.digest, durable };
        let (decision, ballots) = comm::commit::vote(&*self.mesh, ballot, self.config.timeout)?;
        match decision {
            Decision::Commit => Ok(ballots),
            Decision::Abort { .. } if !check.loss.is_finite() => Err(TrainError::Diverged { step, loss: check.loss }),
            Decision::Abort { vetoed, disagreeing } => Err(TrainError::CommitRefused { step, vetoed, disagreeing }),
        }
    }

    /// Whether the replicas are compared after step `done`: every `fingerprint_every`
    /// steps, and after the last (`last`).
    pub fn checks_after(&self, done: u64, last: u64) -> bool {
        let every = self.config.fingerprint_every;
        (every > 0 && done.is_multiple_of(every)) || done == last
    }

    /// Compares every replica's fingerprint; fails naming the ranks outvoted by the
    /// [`majority`](comm::majority) rule.
    pub fn check_replicas(&self, step: u64, fingerprint: u64) -> Result<(), TrainError> {
        let all = comm::collective::all_gather_u64(&*self.mesh, fingerprint, self.config.timeout)?;
        let ranks = comm::majority::suspects(&all);
        if ranks.is_empty() { Ok(()) } else { Err(TrainError::ReplicasDiverged { step, ranks }) }
    }

    /// The newest step whose checkpoint every rank has made durable, once this rank's own
    /// writes are done.
    pub fn durable_everywhere(&self, own: u64) -> Result<u64, TrainError> {
        let durable = comm::collective::all_gather_u64(&*self.mesh, own, self.config.timeout)?;
        Ok(durable.into_iter().min().unwrap_or(0))
    }

    /// A function that cuts every link of this rank (the mesh and the connection to the
    /// coordinator) while the process lives on: the `cut` process fault.
    pub fn link_cutter(&self) -> Result<Arc<dyn Fn() + Send + Sync>, TrainError> {
        let mesh = Arc::clone(&self.mesh);
        let coordinator = self
            .heartbeat
            .connection()
            .map_err(|e| CommError::Setup(format!("cannot hold the coordinator connection: {e}")))?;
        Ok(Arc::new(move || {
            let _ = coordinator.shutdown(std::net::Shutdown::Both);
            mesh.abort("this worker's links were cut (fault injection)".into());
        }))
    }

    /// Leaves the job: stops the heartbeat with a goodbye.
    pub fn finish(self) {
        self.heartbeat.finish();
    }
}
