//! A rank's membership in a data-parallel job: connecting (through the coordinator to
//! Steadfast's mesh, or through MPI), the heartbeat whose notices abort the mesh, and the
//! collectives of a step (the all-reduce, the commit vote and the replica comparison).
//! The step's order is in [`crate::schedule`]; this module is the communicating side of
//! the reduce, vote and check operations of a static job.

use std::sync::Arc;
use std::time::Duration;

use comm::ReduceMode;
use comm::collective::Reducer;
use comm::commit::{Ballot, Decision};
use comm::transport::{CommError, TcpMesh};

use crate::config::{JobSettings, MeshRank, Rendezvous};
use crate::error::{ConfigError, TrainError};
use crate::pipeline::Grid;
use crate::step::SumCheck;

/// This rank's connections to a job.
pub struct Job {
    link: Link,
    rank: usize,
    world: usize,
    settings: JobSettings,
    /// The ranks this rank sums its gradient with (`None`: every rank).
    reduce_among: Option<Vec<usize>>,
    /// Every rank's group: ranks whose sums and states must agree (all one group but in
    /// a pipeline job, where each stage is one).
    group_of: Vec<usize>,
    /// Every rank's slot (see [`Job::slots`]).
    slots: Vec<usize>,
}

enum Link {
    /// The authenticated mesh to every other rank, and what keeps the membership.
    Tcp { mesh: Arc<TcpMesh>, watch: Watch },
    /// MPI's world (its collectives need `&mut` for their reused buffers).
    #[cfg(feature = "mpi")]
    Mpi(std::cell::RefCell<comm::mpi::MpiWorld>),
}

/// Who tells this rank that a member was lost.
enum Watch {
    /// The coordinator, over the heartbeat connection.
    Heartbeat(comm::supervisor::Heartbeat),
    /// etcd, by the expiry of the member's lease.
    Etcd(comm::etcd::Membership),
}

/// Where a notice of loss finds the mesh: not built yet (holding the first notice), or
/// built.
enum MeshSlot {
    Waiting(Option<String>),
    Ready(Arc<TcpMesh>),
}

impl Job {
    /// Joins the job: listen, meet the others (through the coordinator or in etcd),
    /// connect to all, and start the heartbeat (or the etcd lease and watch), whose
    /// notices abort the mesh. An MPI job is joined by [`Job::start_mpi`] instead.
    pub fn connect(d: &MeshRank) -> Result<Job, TrainError> {
        let MeshRank { rendezvous, secret, bind, .. } = d;
        let listener = std::net::TcpListener::bind((*bind, 0))
            .map_err(|e| CommError::Setup(format!("cannot listen on {bind}: {e}")))?;
        let me = listener.local_addr().map_err(|e| CommError::Setup(e.to_string()))?;
        let setup_time = d.job.timeout.max(Duration::from_secs(30));
        // The mesh exists only once the table is known; a notice that comes before it
        // (a member lost while the others connect) waits in the slot for it.
        let slot: Arc<std::sync::Mutex<MeshSlot>> = Arc::new(std::sync::Mutex::new(MeshSlot::Waiting(None)));
        let on_notice = {
            let slot = Arc::clone(&slot);
            move |notice: comm::supervisor::Notice| {
                tracing::error!("{notice}");
                match &mut *slot.lock().unwrap_or_else(|e| e.into_inner()) {
                    MeshSlot::Ready(mesh) => mesh.abort(notice.to_string()),
                    MeshSlot::Waiting(pending) => *pending = Some(notice.to_string()),
                }
            }
        };
        // This worker's rank in the membership formed, and every rank's slot.
        let (addrs, (rank, slots), watch, lost_after) = match rendezvous {
            Rendezvous::Coordinator(coordinator) => {
                let joined = comm::rendezvous::join(*coordinator, d.rank, me, secret, setup_time)?;
                let heartbeat =
                    comm::supervisor::Heartbeat::start(joined.coordinator, joined.heartbeat_timeout, on_notice)
                        .map_err(|e| CommError::Setup(format!("cannot start the heartbeat: {e}")))?;
                let place = (joined.rank, joined.slots);
                (joined.table, place, Watch::Heartbeat(heartbeat), joined.heartbeat_timeout)
            }
            Rendezvous::Etcd(target) => {
                let (table, membership) = comm::etcd::join(target, d.rank, d.world, me, setup_time, on_notice)?;
                let slots = (0..table.len()).collect();
                (table, (d.rank, slots), Watch::Etcd(membership), target.ttl)
            }
        };
        // A job that went on without some workers forms from the others (its slots); a
        // job of every worker has the world this one expects.
        let shrunk = slots.len() < d.world && slots.iter().all(|&s| s < d.world);
        if addrs.len() != d.world && !shrunk {
            return Err(ConfigError::Invalid(format!(
                "the rendezvous knows {} workers, this one expects {}",
                addrs.len(),
                d.world
            ))
            .into());
        }
        let config = comm::transport::TcpConfig {
            secret: secret.clone(),
            max_frame: comm::frame::DEFAULT_MAX_FRAME,
            connect_timeout: setup_time,
            write_timeout: d.job.timeout,
            // A peer's death reaches the coordinator at once: wait briefly for its verdict
            // so the error names the rank that failed, not a neighbour that aborted first.
            abort_grace: lost_after.min(Duration::from_secs(1)),
            shared_memory: comm::local::default_dir(),
        };
        let mesh = Arc::new(TcpMesh::connect(rank, listener, &addrs, &config)?);
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let MeshSlot::Waiting(Some(notice)) = &*slot {
            mesh.abort(notice.clone());
        }
        *slot = MeshSlot::Ready(Arc::clone(&mesh));
        drop(slot);
        let mut job = Job::new(Link::Tcp { mesh, watch }, rank, slots.len(), d.job.clone());
        job.slots = slots;
        Ok(job)
    }

    /// Joins an MPI job: initializes MPI, whose rank and world are the job's. Call [`Job::barrier`] before any rank persists a checkpoint
    /// part, so that rank 0 has cleared crashed writers' leftovers first.
    #[cfg(feature = "mpi")]
    pub fn start_mpi(settings: &JobSettings) -> Result<Job, TrainError> {
        let world = comm::mpi::MpiWorld::init()?;
        let (rank, size) = (world.rank(), world.world());
        Ok(Job::new(Link::Mpi(std::cell::RefCell::new(world)), rank, size, settings.clone()))
    }

    /// Without the `mpi` feature an MPI job cannot start.
    #[cfg(not(feature = "mpi"))]
    pub fn start_mpi(_: &JobSettings) -> Result<Job, TrainError> {
        Err(ConfigError::Invalid("this steadfast was built without MPI (cargo feature `mpi`)".into()).into())
    }

    fn new(link: Link, rank: usize, world: usize, settings: JobSettings) -> Job {
        let slots = (0..world).collect();
        Job { link, rank, world, settings, reduce_among: None, group_of: vec![0; world], slots }
    }

    /// Every rank's slot: its place at the start of the job (its rank, unless the job
    /// went on without some workers).
    pub fn slots(&self) -> &[usize] {
        &self.slots
    }

    /// Makes this a rank of the pipeline job `layout`: it sums with its stage's replicas,
    /// and sums and states are compared within each stage.
    pub fn pipelined(&mut self, layout: &Grid) {
        self.reduce_among = Some(layout.replicas_of(layout.place(self.rank).1));
        self.group_of = layout.stage_of();
    }

    /// The job's point-to-point transport (Steadfast's mesh; MPI's has none here).
    pub fn transport(&self) -> Result<&dyn comm::transport::Transport, TrainError> {
        match &self.link {
            Link::Tcp { mesh, .. } => Ok(&**mesh),
            #[cfg(feature = "mpi")]
            Link::Mpi(_) => Err(ConfigError::Invalid("an MPI job has no point-to-point link here".into()).into()),
        }
    }

    /// This rank, and the number of ranks.
    pub fn place(&self) -> (usize, usize) {
        (self.rank, self.world)
    }

    /// The step's all-reduce: the sum over every rank of every rank's `parts`, into `out`.
    pub fn sum_parts<P: AsRef<[f32]> + Sync>(
        &self,
        reducer: &mut Reducer,
        parts: &[P],
        out: &mut [f32],
        mode: ReduceMode,
    ) -> Result<(), TrainError> {
        match &self.link {
            Link::Tcp { mesh, .. } => match &self.reduce_among {
                Some(members) => {
                    let group = comm::group::Group::new(&**mesh, members.clone())?;
                    reducer.sum_parts(&group, parts, out, mode, self.settings.timeout)?
                }
                None => reducer.sum_parts(&**mesh, parts, out, mode, self.settings.timeout)?,
            },
            #[cfg(feature = "mpi")]
            Link::Mpi(world) => world.borrow_mut().sum_parts(parts, out, mode)?,
        }
        Ok(())
    }

    /// Every rank's `words`, indexed by rank.
    fn all_gather_words(&self, words: &[u64]) -> Result<Vec<Vec<u64>>, TrainError> {
        Ok(match &self.link {
            Link::Tcp { mesh, .. } => comm::collective::all_gather_words(&**mesh, words, self.settings.timeout)?,
            #[cfg(feature = "mpi")]
            Link::Mpi(world) => world.borrow().all_gather_words(words),
        })
    }

    /// Waits until every rank has called it.
    pub fn barrier(&self) -> Result<(), TrainError> {
        match &self.link {
            Link::Tcp { mesh, .. } => comm::collective::barrier(&**mesh, self.settings.timeout)?,
            #[cfg(feature = "mpi")]
            Link::Mpi(world) => world.borrow().barrier(),
        }
        Ok(())
    }

    /// The vote phase: every rank casts its ballot on the sum it holds (and its newest
    /// durable checkpoint step); the step goes on only if all commit. Returns the ballots.
    pub fn vote(&self, step: u64, check: &SumCheck, durable: u64) -> Result<Vec<Ballot>, TrainError> {
        let ballot = Ballot { ok: check.finite, digest: check.digest, durable };
        let (decision, ballots) =
            comm::commit::tally_in_groups(&self.all_gather_words(&ballot.words())?, &self.group_of);
        match decision {
            Decision::Commit => Ok(ballots),
            Decision::Abort { .. } if !check.loss.is_finite() => Err(TrainError::Diverged { step, loss: check.loss }),
            Decision::Abort { vetoed, disagreeing } => Err(TrainError::CommitRefused { step, vetoed, disagreeing }),
        }
    }

    /// Whether the replicas are compared after step `done`: every `fingerprint_every`
    /// steps, and after the last (`last`).
    pub fn checks_after(&self, done: u64, last: u64) -> bool {
        self.settings.checks_after(done, last)
    }

    /// Compares every replica's fingerprint (within each stage, in a pipeline job); fails
    /// naming the ranks outvoted by the [`majority`](comm::majority) rule.
    pub fn check_replicas(&self, step: u64, fingerprint: u64) -> Result<(), TrainError> {
        let all: Vec<u64> = self.all_gather_words(&[fingerprint])?.into_iter().map(|w| w[0]).collect();
        let mut ranks = Vec::new();
        for group in 0..=self.group_of.iter().copied().max().unwrap_or(0) {
            let members: Vec<usize> = (0..all.len()).filter(|&r| self.group_of[r] == group).collect();
            let fingerprints: Vec<u64> = members.iter().map(|&r| all[r]).collect();
            if let comm::majority::Comparison::Diverged { outvoted, .. } = comm::majority::compare(&fingerprints) {
                ranks.extend(outvoted.into_iter().map(|i| members[i]));
            }
        }
        if ranks.is_empty() { Ok(()) } else { Err(TrainError::ReplicasDiverged { step, ranks }) }
    }

    /// The newest step whose checkpoint every rank has made durable, once this rank's own
    /// writes are done.
    pub fn durable_everywhere(&self, own: u64) -> Result<u64, TrainError> {
        let durable = self.all_gather_words(&[own])?;
        Ok(durable.into_iter().map(|w| w[0]).min().unwrap_or(0))
    }

    /// A function that cuts every link of this rank (the mesh and the connection to the
    /// coordinator) while the process lives on: the `cut` process fault. MPI has no link to
    /// cut by hand: there the fault ends the process, as a lost link ends an MPI job.
    pub fn link_cutter(&self) -> Result<Arc<dyn Fn() + Send + Sync>, TrainError> {
        match &self.link {
            Link::Tcp { mesh, watch } => {
                let mesh = Arc::clone(mesh);
                // (A job that meets in etcd keeps its lease: its peers see the cut links.)
                let coordinator = match watch {
                    Watch::Heartbeat(h) => Some(
                        h.connection()
                            .map_err(|e| CommError::Setup(format!("cannot hold the coordinator connection: {e}")))?,
                    ),
                    Watch::Etcd(_) => None,
                };
                Ok(Arc::new(move || {
                    if let Some(c) = &coordinator {
                        let _ = c.shutdown(std::net::Shutdown::Both);
                    }
                    mesh.abort("this worker's links were cut (fault injection)".into());
                }))
            }
            #[cfg(feature = "mpi")]
            Link::Mpi(_) => Ok(Arc::new(|| {
                tracing::error!("this rank's links were cut (fault injection): an MPI rank ends");
                std::process::abort();
            })),
        }
    }

    /// Leaves the job: stops the heartbeat with a goodbye, or says `done` in etcd (MPI is
    /// finalized, by every rank together, when its link is dropped).
    pub fn finish(self) {
        match self.link {
            Link::Tcp { watch: Watch::Heartbeat(h), .. } => h.finish(),
            Link::Tcp { watch: Watch::Etcd(m), .. } => m.finish(),
            #[cfg(feature = "mpi")]
            Link::Mpi(_) => {}
        }
    }
}
