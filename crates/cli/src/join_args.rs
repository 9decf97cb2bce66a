//! How a worker process joins a data-parallel job: the flags and the environment (ours,
//! torchrun's, Slurm's) that `train` and `bench collective` read the same way.

use std::time::Duration;

use anyhow::Context;
use clap::Args;

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
    /// Meet the other workers in etcd instead of at a coordinator, and keep the
    /// membership there: `etcd://HOST:PORT/JOB[?ttl=SECONDS]` (a worker whose lease
    /// outlives its keep-alives by the ttl, 10 s by default, is lost). Static jobs only
    /// [env: STEADFAST_RENDEZVOUS].
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

/// Where a process stands in its job, once its flags and environment are read.
#[derive(Debug)]
pub struct Place {
    /// This worker's rank (an elastic worker's slot).
    pub rank: usize,
    /// The number of ranks (an elastic job's initial size).
    pub world: usize,
    /// How the ranks reach each other.
    pub meet: Meet,
    /// Bound on every collective step.
    pub timeout: Duration,
}

/// How the ranks of a job reach each other.
#[derive(Debug)]
pub enum Meet {
    /// Through MPI, which gives the rank and size when the job starts.
    Mpi,
    /// On Steadfast's mesh.
    Mesh {
        /// Where the ranks meet.
        rendezvous: train::Rendezvous,
        /// The job's shared secret.
        secret: Vec<u8>,
        /// Address this worker listens on for its peers.
        bind: std::net::IpAddr,
    },
}

/// The first of the environment variables `names` that is set and not empty.
pub fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

impl JoinArgs {
    /// This process's place, or `None` when nothing names a world size (a single process
    /// on the Steadfast engine). An `elastic` worker may hold a rank beyond the initial
    /// world (it joins a running job), and meets only at a coordinator.
    pub fn place(&self, elastic: bool) -> anyhow::Result<Option<Place>> {
        if !(self.comm_timeout > 0.0 && self.comm_timeout.is_finite()) {
            anyhow::bail!("--comm-timeout must be a positive number of seconds");
        }
        let timeout = Duration::from_secs_f64(self.comm_timeout);
        if self.engine == EngineArg::Mpi {
            if elastic || self.rank.is_some() || self.world_size.is_some() {
                anyhow::bail!(
                    "--engine mpi takes its rank and size from MPI, and an MPI job is not elastic \
                     (a rank's failure ends it; run it again with --resume latest to go on from its last checkpoint)"
                );
            }
            // MPI's rank and size replace these when the job starts.
            return Ok(Some(Place { rank: 0, world: 1, meet: Meet::Mpi, timeout }));
        }
        let parse = |v: String, what: &str| v.parse::<usize>().map_err(|e| anyhow::anyhow!("bad {what} {v:?}: {e}"));
        let world = match self.world_size {
            Some(w) => Some(w),
            None => env_first(&["STEADFAST_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"])
                .map(|v| parse(v, "world size"))
                .transpose()?,
        };
        let Some(world) = world else { return Ok(None) };
        let rank = match self.rank {
            Some(r) => r,
            None => env_first(&["STEADFAST_RANK", "RANK", "SLURM_PROCID"])
                .map(|v| parse(v, "rank"))
                .transpose()?
                .ok_or_else(|| anyhow::anyhow!("a world size was given but no rank (--rank or RANK)"))?,
        };
        if world == 0 || (rank >= world && !elastic) {
            anyhow::bail!("rank {rank} is not in a world of {world}");
        }
        let rendezvous = match self.rendezvous.clone().or_else(|| env_first(&["STEADFAST_RENDEZVOUS"])) {
            Some(url) => {
                if self.coordinator.is_some() {
                    anyhow::bail!("--rendezvous and --coordinator are two ways to meet: give one");
                }
                if elastic {
                    anyhow::bail!(
                        "an elastic job's membership is kept by its coordinator (--coordinator), not in etcd"
                    );
                }
                train::Rendezvous::Etcd(
                    url.parse::<comm::etcd::Target>().map_err(|e| anyhow::anyhow!("--rendezvous: {e}"))?,
                )
            }
            None => {
                let coordinator = self
                    .coordinator
                    .clone()
                    .or_else(|| env_first(&["STEADFAST_COORDINATOR"]))
                    .or_else(|| Some(format!("{}:{}", env_first(&["MASTER_ADDR"])?, env_first(&["MASTER_PORT"])?)))
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "no coordinator address (--coordinator, or MASTER_ADDR and MASTER_PORT) and no --rendezvous"
                        )
                    })?;
                train::Rendezvous::Coordinator(resolve(&coordinator, "the coordinator")?)
            }
        };
        // Listen where the peers can dial: on the interface that reaches the rendezvous.
        let towards = match &rendezvous {
            train::Rendezvous::Coordinator(a) => *a,
            train::Rendezvous::Etcd(t) => resolve(&t.endpoint, "etcd")?,
        };
        let bind = match self.bind {
            Some(ip) => ip,
            None => match env_first(&["STEADFAST_BIND"]) {
                Some(v) => v.parse().map_err(|e| anyhow::anyhow!("bad STEADFAST_BIND {v:?}: {e}"))?,
                None => comm::rendezvous::local_address_towards(towards)
                    .with_context(|| format!("no local address reaches {towards} (give --bind)"))?,
            },
        };
        let secret = env_first(&["STEADFAST_SECRET"])
            .ok_or_else(|| anyhow::anyhow!("STEADFAST_SECRET is not set (the launcher sets it for its workers)"))?
            .into_bytes();
        Ok(Some(Place { rank, world, meet: Meet::Mesh { rendezvous, secret, bind }, timeout }))
    }
}

/// The first address `host_port` resolves to.
fn resolve(host_port: &str, what: &str) -> anyhow::Result<std::net::SocketAddr> {
    std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .with_context(|| format!("cannot resolve {what} {host_port:?}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{what} {host_port:?} resolves to nothing"))
}
