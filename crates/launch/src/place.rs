//! Where a worker stands in its job, read on the worker's side: its flags first, then the
//! environment that a launcher set (ours, which [`static_job`](crate::static_job) and
//! [`elastic`](crate::elastic) write, or torchrun's, Slurm's, Kubeflow's).
//!
//! The variables this module reads are the ones the launchers of this crate write, so the
//! two sides of that contract live together.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use comm::job::{CoordinatorAt, DistConfig, ElasticWorker, JobSettings, MeshRank, OnDivergence, Rendezvous};

use crate::LaunchError;

/// How the ranks of a job reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collectives {
    /// Steadfast's authenticated TCP mesh, met through a coordinator or etcd.
    Steadfast,
    /// The system's MPI library (`mpirun` or `srun` starts the ranks).
    Mpi,
}

/// The flags that place a process in a job; each `None` falls back on the environment.
#[derive(Clone, Debug)]
pub struct JoinFlags {
    /// The engine.
    pub engine: Collectives,
    /// This worker's rank [env: STEADFAST_RANK, RANK, SLURM_PROCID].
    pub rank: Option<usize>,
    /// Workers in the job [env: STEADFAST_WORLD_SIZE, WORLD_SIZE, SLURM_NTASKS].
    pub world_size: Option<usize>,
    /// The coordinator, `HOST:PORT` [env: STEADFAST_COORDINATOR, or MASTER_ADDR and MASTER_PORT].
    pub coordinator: Option<String>,
    /// `etcd://HOST:PORT/JOB[?ttl=SECONDS]` [env: STEADFAST_RENDEZVOUS].
    pub rendezvous: Option<String>,
    /// Address to listen on for the peers [env: STEADFAST_BIND].
    pub bind: Option<IpAddr>,
    /// Seconds a collective may wait for a peer.
    pub comm_timeout: f64,
}

/// A worker's place, once its flags and environment are read.
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
        rendezvous: Rendezvous,
        /// An elastic job's other coordinators (`--coordinator A,B`): where one started
        /// again on another host is found.
        standby: Vec<SocketAddr>,
        /// The job's shared secret.
        secret: Vec<u8>,
        /// Address this worker listens on for its peers.
        bind: IpAddr,
    },
}

/// What a training worker adds to its place: the settings of its kind of job.
#[derive(Clone, Debug)]
pub struct WorkerFlags {
    /// Where it joins.
    pub join: JoinFlags,
    /// An elastic worker [env: STEADFAST_ELASTIC=1].
    pub elastic: bool,
    /// Which process of its slot this is [env: STEADFAST_INCARNATION].
    pub incarnation: Option<u64>,
    /// The rollback baseline's copy interval [env: STEADFAST_COPY_EVERY].
    pub copy_every: Option<u64>,
    /// Compare the replicas' fingerprints every this many steps.
    pub fingerprint_every: u64,
    /// What an elastic job does when its replicas disagree.
    pub on_divergence: OnDivergence,
}

/// The first of the environment variables `names` that is set and not empty.
pub fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

fn bad(text: impl Into<String>) -> LaunchError {
    LaunchError::Config(text.into())
}

/// The environment variable `name` as a number, when set.
fn env_u64(name: &str) -> Result<Option<u64>, LaunchError> {
    env_first(&[name]).map(|v| v.parse::<u64>().map_err(|e| bad(format!("bad {name} {v:?}: {e}")))).transpose()
}

/// The distributed settings of a training worker, or `None` for a single process.
pub fn dist_config(flags: &WorkerFlags) -> Result<Option<DistConfig>, LaunchError> {
    let elastic = flags.elastic || env_first(&["STEADFAST_ELASTIC"]).is_some_and(|v| v == "1");
    let repair = flags.on_divergence == OnDivergence::Repair;
    if repair && !elastic {
        return Err(repair_needs_elastic());
    }
    let incarnation = match flags.incarnation {
        Some(n) => n,
        None => env_u64("STEADFAST_INCARNATION")?.unwrap_or(0),
    };
    let copy_every = match flags.copy_every {
        Some(k) => Some(k),
        None => env_u64("STEADFAST_COPY_EVERY")?,
    };
    if copy_every == Some(0) {
        return Err(bad("--copy-every must be at least 1"));
    }
    if copy_every.is_some() && !elastic {
        return Err(bad("--copy-every goes with --elastic (the rollback baseline of an elastic job)"));
    }
    let Some(place) = place(&flags.join, elastic)? else {
        return if repair { Err(repair_needs_elastic()) } else { Ok(None) };
    };
    let job = JobSettings { timeout: place.timeout, fingerprint_every: flags.fingerprint_every, incarnation };
    Ok(Some(match place.meet {
        Meet::Mpi => DistConfig::Mpi(job),
        Meet::Mesh { rendezvous, standby, secret, bind } if elastic => {
            let coordinator = match rendezvous {
                Rendezvous::Coordinator(first) => {
                    CoordinatorAt::Listed(std::iter::once(first).chain(standby).collect())
                }
                Rendezvous::Etcd(target) => CoordinatorAt::Etcd(target),
            };
            DistConfig::Elastic(ElasticWorker {
                slot: place.rank,
                world: place.world,
                coordinator,
                secret,
                bind,
                job,
                copy_every,
                on_divergence: flags.on_divergence,
            })
        }
        Meet::Mesh { rendezvous, secret, bind, .. } => {
            DistConfig::Mesh(MeshRank { rank: place.rank, world: place.world, rendezvous, secret, bind, job })
        }
    }))
}

fn repair_needs_elastic() -> LaunchError {
    bad("--on-divergence repair needs an elastic job, whose replicas can fetch the state from one another: \
         add --max-restarts K to its `launch` (or run `train --elastic` workers); a static job can only stop")
}

/// This process's place, or `None` when nothing names a world size (a single process on
/// the Steadfast engine). An `elastic` worker may hold a rank beyond the initial world
/// (it joins a running job), and meets only at a coordinator.
pub fn place(flags: &JoinFlags, elastic: bool) -> Result<Option<Place>, LaunchError> {
    if !(flags.comm_timeout > 0.0 && flags.comm_timeout.is_finite()) {
        return Err(bad("--comm-timeout must be a positive number of seconds"));
    }
    let timeout = Duration::from_secs_f64(flags.comm_timeout);
    if flags.engine == Collectives::Mpi {
        if elastic || flags.rank.is_some() || flags.world_size.is_some() {
            return Err(bad("--engine mpi takes its rank and size from MPI, and an MPI job is not elastic \
                 (a rank's failure ends it; run it again with --resume latest to go on from its last checkpoint)"));
        }
        // MPI's rank and size replace these when the job starts.
        return Ok(Some(Place { rank: 0, world: 1, meet: Meet::Mpi, timeout }));
    }
    let number = |given: Option<usize>, names: &[&str], what: &str| match given {
        Some(n) => Ok(Some(n)),
        None => {
            env_first(names).map(|v| v.parse::<usize>().map_err(|e| bad(format!("bad {what} {v:?}: {e}")))).transpose()
        }
    };
    let Some(world) = number(flags.world_size, &["STEADFAST_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"], "world size")?
    else {
        return Ok(None);
    };
    let rank = number(flags.rank, &["STEADFAST_RANK", "RANK", "SLURM_PROCID"], "rank")?
        .ok_or_else(|| bad("a world size was given but no rank (--rank or RANK)"))?;
    if world == 0 || (rank >= world && !elastic) {
        return Err(bad(format!("rank {rank} is not in a world of {world}")));
    }
    let (rendezvous, standby) = rendezvous(flags, elastic)?;
    // Listen where the peers can dial: on the interface that reaches the rendezvous.
    let towards = match &rendezvous {
        Rendezvous::Coordinator(a) => *a,
        Rendezvous::Etcd(t) => resolve(&t.endpoint, "etcd")?,
    };
    let bind = match flags.bind {
        Some(ip) => ip,
        None => match env_first(&["STEADFAST_BIND"]) {
            Some(v) => v.parse().map_err(|e| bad(format!("bad STEADFAST_BIND {v:?}: {e}")))?,
            None => comm::rendezvous::local_address_towards(towards).map_err(|e| LaunchError::Io {
                what: format!("no local address reaches {towards} (give --bind)"),
                source: e,
            })?,
        },
    };
    let secret = env_first(&["STEADFAST_SECRET"])
        .ok_or_else(|| bad("STEADFAST_SECRET is not set (the launcher sets it for its workers)"))?
        .into_bytes();
    Ok(Some(Place { rank, world, meet: Meet::Mesh { rendezvous, standby, secret, bind }, timeout }))
}

/// Where the ranks meet: etcd, or a coordinator (with an elastic job's standby
/// coordinators, when `--coordinator` lists several: `A,B`).
fn rendezvous(flags: &JoinFlags, elastic: bool) -> Result<(Rendezvous, Vec<SocketAddr>), LaunchError> {
    if let Some(url) = flags.rendezvous.clone().or_else(|| env_first(&["STEADFAST_RENDEZVOUS"])) {
        if flags.coordinator.is_some() {
            return Err(bad("--rendezvous and --coordinator are two ways to meet: give one"));
        }
        return Ok((Rendezvous::Etcd(url.parse().map_err(|e| bad(format!("--rendezvous: {e}")))?), Vec::new()));
    }
    let coordinator = flags
        .coordinator
        .clone()
        .or_else(|| env_first(&["STEADFAST_COORDINATOR"]))
        .or_else(|| Some(format!("{}:{}", env_first(&["MASTER_ADDR"])?, env_first(&["MASTER_PORT"])?)))
        .ok_or_else(|| {
            bad("no coordinator address (--coordinator, or MASTER_ADDR and MASTER_PORT) and no --rendezvous")
        })?;
    let mut addrs = Vec::new();
    for address in coordinator.split(',').map(str::trim) {
        addrs.push(resolve(address, "the coordinator")?);
    }
    if addrs.len() > 1 && !elastic {
        return Err(bad(format!(
            "--coordinator {coordinator}: a static job has one coordinator; standby coordinators go with --elastic"
        )));
    }
    let first = addrs.remove(0);
    Ok((Rendezvous::Coordinator(first), addrs))
}

/// The first address `host_port` resolves to.
pub fn resolve(host_port: &str, what: &str) -> Result<SocketAddr, LaunchError> {
    std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .map_err(LaunchError::io(format!("cannot resolve {what} {host_port:?}")))?
        .next()
        .ok_or_else(|| bad(format!("{what} {host_port:?} resolves to nothing")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> JoinFlags {
        JoinFlags {
            engine: Collectives::Steadfast,
            rank: Some(0),
            world_size: Some(2),
            coordinator: Some("127.0.0.1:29500".into()),
            rendezvous: None,
            bind: Some(IpAddr::from([127, 0, 0, 1])),
            comm_timeout: 5.0,
        }
    }

    fn worker(join: JoinFlags) -> WorkerFlags {
        WorkerFlags {
            join,
            elastic: false,
            incarnation: Some(0),
            copy_every: None,
            fingerprint_every: 0,
            on_divergence: OnDivergence::Stop,
        }
    }

    fn refused(result: Result<impl std::fmt::Debug, LaunchError>) -> String {
        match result {
            Err(LaunchError::Config(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn places_that_cannot_be_are_refused_before_the_environment_is_read() {
        let mpi = JoinFlags { engine: Collectives::Mpi, ..flags() };
        assert!(refused(place(&mpi, false)).contains("--engine mpi takes its rank and size from MPI"));
        let slow = JoinFlags { comm_timeout: f64::NAN, ..flags() };
        assert!(refused(place(&slow, false)).contains("--comm-timeout"));
        let outside = JoinFlags { rank: Some(2), ..flags() };
        assert_eq!(refused(place(&outside, false)), "rank 2 is not in a world of 2");
        let both = JoinFlags { rendezvous: Some("etcd://h:2379/j".into()), ..flags() };
        assert!(refused(place(&both, false)).contains("two ways to meet"));
        let standby = JoinFlags { coordinator: Some("127.0.0.1:29500,127.0.0.1:29501".into()), ..flags() };
        assert!(refused(place(&standby, false)).contains("a static job has one coordinator"));
    }

    #[test]
    fn an_elastic_setting_without_an_elastic_job_is_refused() {
        let repair = WorkerFlags { on_divergence: OnDivergence::Repair, ..worker(flags()) };
        assert!(refused(dist_config(&repair)).contains("add --max-restarts K"));
        let copies = WorkerFlags { copy_every: Some(5), ..worker(flags()) };
        assert!(refused(dist_config(&copies)).contains("--copy-every goes with --elastic"));
        let zero = WorkerFlags { copy_every: Some(0), elastic: true, ..worker(flags()) };
        assert_eq!(refused(dist_config(&zero)), "--copy-every must be at least 1");
    }
}
