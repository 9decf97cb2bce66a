//! Where a worker stands in its job, and what every kind of job has: the settings a
//! launcher hands its workers (through their flags and environment) and a worker runs
//! with. They live here, below the trainer and the launcher, so that the launcher needs
//! nothing of the training loop to place the processes it starts, whatever they run.

use std::time::Duration;

/// Where a training worker writes its metrics and checkpoints unless told (`train --out`),
/// which a launcher reads to find a job's checkpoints and write its record beside them.
pub const DEFAULT_OUT: &str = "runs/train";

/// This process's place in a data-parallel job. Each kind of job carries its own settings,
/// so that a setting one kind cannot use cannot be given to it.
#[derive(Clone, Debug)]
pub enum DistConfig {
    /// A rank of a static job on Steadfast's authenticated TCP mesh: every rank lives to
    /// the end, or the job fails (a launcher may then restart it whole from its last
    /// checkpoint).
    Mesh(MeshRank),
    /// A rank of a job on the system's MPI library (`mpirun` or `srun` starts the ranks):
    /// rank and size come from MPI, and the collectives run on MPI's (feature `mpi`; see
    /// `comm::mpi`). Static too.
    Mpi(JobSettings),
    /// A worker of an elastic job on Steadfast's mesh, which survives the loss of workers.
    Elastic(ElasticWorker),
}

/// What every kind of job has.
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// Bound on every collective step; a dead or hung peer surfaces within it.
    pub timeout: Duration,
    /// Compare the replicas' fingerprints every this many steps (0: only at the end).
    pub fingerprint_every: u64,
    /// Which process of its slot this is (0: the first; the launcher counts the processes
    /// it started there, and restarts a static job whole): named faults strike only the
    /// first, random ones draw again.
    pub incarnation: u64,
}

/// A rank of a static job on Steadfast's mesh.
#[derive(Clone, Debug)]
pub struct MeshRank {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Where the ranks meet.
    pub rendezvous: Rendezvous,
    /// The job's shared secret.
    pub secret: Vec<u8>,
    /// Address this rank listens on for its peers (port chosen by the system).
    pub bind: std::net::IpAddr,
    /// The job's settings.
    pub job: JobSettings,
}

/// A worker of an elastic job: its membership is kept by the job's coordinator.
#[derive(Clone, Debug)]
pub struct ElasticWorker {
    /// This worker's slot (its id in the job).
    pub slot: usize,
    /// The job's initial size.
    pub world: usize,
    /// Where the job's coordinator is found.
    pub coordinator: CoordinatorAt,
    /// The job's shared secret.
    pub secret: Vec<u8>,
    /// Address this worker listens on for its peers (port chosen by the system).
    pub bind: std::net::IpAddr,
    /// The job's settings.
    pub job: JobSettings,
    /// The rollback baseline: copy the state in memory every this many steps and go back
    /// to the copy when a member is lost, instead of recovering from the live replicas'
    /// current state.
    pub copy_every: Option<u64>,
    /// What the job does when its replicas disagree.
    pub on_divergence: OnDivergence,
}

/// Where an elastic job's coordinator is found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorAt {
    /// At the first address, or at the others, where a coordinator started again on
    /// another host may be (the worker dials them in turn when it loses its own).
    Listed(Vec<std::net::SocketAddr>),
    /// Wherever the holder of the coordinator role in etcd says; the worker keeps its
    /// liveness there too (a lease of its own).
    Etcd(crate::etcd::Target),
}

/// Where the ranks of a job on Steadfast's mesh meet, and who keeps their membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// A coordinator process (the launcher's, or `steadfast coordinator`) at this address:
    /// the address table, then heartbeats.
    Coordinator(std::net::SocketAddr),
    /// etcd: the table from the members' keys, then leases and a watch (static jobs
    /// only; see `comm::etcd`).
    Etcd(crate::etcd::Target),
}

/// What an elastic job does when its replicas' states disagree (silent data corruption).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDivergence {
    /// Stop the job, naming the replicas outvoted.
    #[default]
    Stop,
    /// The replicas outvoted by a strict majority, and a replica whose state changed
    /// between steps, fetch the state from the healthy ones; the job goes on.
    Repair,
}

impl DistConfig {
    /// The settings every kind of job has.
    pub fn settings(&self) -> &JobSettings {
        match self {
            DistConfig::Mesh(m) => &m.job,
            DistConfig::Mpi(s) => s,
            DistConfig::Elastic(e) => &e.job,
        }
    }

    /// The number of ranks, when it is known before the job starts (an MPI job learns it
    /// from MPI).
    pub fn world(&self) -> Option<usize> {
        match self {
            DistConfig::Mesh(m) => Some(m.world),
            DistConfig::Mpi(_) => None,
            DistConfig::Elastic(e) => Some(e.world),
        }
    }
}

impl JobSettings {
    /// Whether the replicas are compared after step `done`: every `fingerprint_every`
    /// steps, and after the last (`last`); the one rule of the step protocol's checks.
    pub fn checks_after(&self, done: u64, last: u64) -> bool {
        crate::protocol::Checks { every: self.fingerprint_every, repair: false }.compare_after(done, last)
    }
}

impl repro::words::Word for OnDivergence {
    const KIND: &'static str = "divergence policy";
    const ALL: &'static [Self] = &[OnDivergence::Stop, OnDivergence::Repair];
    fn word(self) -> &'static str {
        match self {
            OnDivergence::Stop => "stop",
            OnDivergence::Repair => "repair",
        }
    }
    fn help(self) -> &'static str {
        match self {
            OnDivergence::Stop => "stop the job, naming the replicas outvoted",
            OnDivergence::Repair => "outvoted or corrupted replicas fetch the state from the healthy ones",
        }
    }
}
repro::text_form!(OnDivergence);
