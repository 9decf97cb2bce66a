//! How a worker process joins a data-parallel job: the flags and the environment (ours,
//! torchrun's, Slurm's) that `train` and `bench collective` read the same way
//! ([`launch::place`] reads them).

use clap::Args;
use launch::place::{Collectives, JoinFlags};

/// The flags that place a process in a job. Each falls back on the environment that the
/// launchers (`steadfast launch`, torchrun, Slurm, Kubeflow) set.
#[derive(Args, Debug, Clone)]
pub struct JoinArgs {
    /// How the ranks of a data-parallel job reach each other: `steadfast` (Steadfast's
    /// authenticated TCP mesh, met through the launcher's coordinator) or `mpi` (started
    /// by `mpirun` or `srun`; rank and size come from MPI, the collectives are MPI's).
    #[arg(long, value_enum, default_value_t = EngineArg::Steadfast)]
    pub engine: EngineArg,
    /// This worker's rank in a data-parallel job [env: STEADFAST_RANK, RANK, SLURM_PROCID].
    #[arg(long)]
    pub rank: Option<usize>,
    /// Workers in the job [env: STEADFAST_WORLD_SIZE, WORLD_SIZE, SLURM_NTASKS].
    #[arg(long)]
    pub world_size: Option<usize>,
    /// The job's coordinator, HOST:PORT [env: STEADFAST_COORDINATOR, or MASTER_ADDR and MASTER_PORT].
    #[arg(long)]
    pub coordinator: Option<String>,
    /// Meet in etcd instead of at a coordinator, and keep the membership there:
    /// `etcd://HOST:PORT/JOB[?ttl=SECONDS]` (a worker whose lease outlives its keep-alives
    /// by the ttl, 10 s by default, is lost); an elastic worker dials the coordinator
    /// elected there [env: STEADFAST_RENDEZVOUS].
    #[arg(long, value_name = "etcd://HOST:PORT/JOB")]
    pub rendezvous: Option<String>,
    /// Address this worker listens on for its peers [env: STEADFAST_BIND; default: the
    /// local address that reaches the coordinator or etcd, so loopback on one host].
    #[arg(long)]
    pub bind: Option<std::net::IpAddr>,
    /// Seconds a collective may wait for a peer before the job fails.
    #[arg(long, default_value_t = 30.0)]
    pub comm_timeout: f64,
}

/// `--engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    Steadfast,
    Mpi,
}

impl JoinArgs {
    /// The flags as [`launch::place`] takes them.
    pub fn flags(&self) -> JoinFlags {
        JoinFlags {
            engine: match self.engine {
                EngineArg::Steadfast => Collectives::Steadfast,
                EngineArg::Mpi => Collectives::Mpi,
            },
            rank: self.rank,
            world_size: self.world_size,
            coordinator: self.coordinator.clone(),
            rendezvous: self.rendezvous.clone(),
            bind: self.bind,
            comm_timeout: self.comm_timeout,
        }
    }
}
