//! # launch: the supervision of a job's worker processes
//!
//! `steadfast launch` starts a job's workers (copies of the `steadfast` binary running
//! `train`), forwards their output, watches them and ends them. This crate is that
//! supervision, apart from the command line:
//!
//! - [`workers`]: starting a worker with its place in the job in its environment,
//!   forwarding its output line by line, and hearing of its exit as an event (a thread per
//!   worker waits for the end of its output, then reaps it): no loop polls the children;
//! - [`policy`]: what an elastic job does when a worker exits, a pure function of the exit
//!   and the job's state ([`RestartPolicy::on_exit`]), tested rule by rule;
//! - [`static_job`]: a static job on one node or several, which fails when any worker
//!   fails (node 0 serves the rendezvous and the heartbeat membership);
//! - [`elastic`]: an elastic job on one host or several, which replaces or sheds lost
//!   workers, with the step protocol's coordinator (data-parallel or pipelined;
//!   [`replay`]: what `--recovery replay` adds to a pipeline job's command);
//! - [`restart`]: the checkpoint-restart baseline, which starts every worker again from
//!   the last checkpoint (and the way an MPI job survives a failure);
//! - [`mpi`]: one run of a job under the system's MPI starter;
//! - [`request`]: what `steadfast launch` was asked for, refused when it cannot work, and
//!   the job it makes;
//! - [`record`]: the launcher's part in the job's record (`events.jsonl`): each loss
//!   with how the process ended, each replacement, each epoch, kept by the launcher that
//!   serves the coordinator;
//! - [`coordinator`]: a coordinator on its own, for workers that something else started;
//! - [`place`]: the worker's side: where it stands in its job, from its flags and the
//!   environment a launcher set (ours, torchrun's, Slurm's), and
//!   [`launcher_gone`]: its end when its launcher is gone.
//!
//! Every launcher waits on events (a worker's exit, the coordinator's word) with a
//! deadline, never on a timer that polls.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::time::Duration;

mod command;
pub mod coordinator;
pub mod elastic;
pub mod launcher_gone;
pub mod mpi;
pub mod place;
pub mod policy;
pub mod record;
pub mod replay;
pub mod request;
pub mod restart;
pub mod slots;
pub mod static_job;
mod supervise;
pub mod workers;

pub use comm::etcd::Target;
pub use policy::{Exit, OnFailure, Remedy, RestartPolicy};

/// The environment variable in which a launcher gives its workers its pid, so that a
/// worker ends when its launcher is gone.
pub const LAUNCHER_PID: &str = "STEADFAST_LAUNCHER_PID";

/// How long workers may outlive the end of a job (the coordinator's last member, or the
/// loss bound after a failure) before they are killed.
pub const KILL_GRACE: Duration = Duration::from_secs(3);

/// How long the workers of an elastic job that ended well (every member holds the final
/// state and was told so) may go on: they evaluate that state and write their summaries,
/// which a large model on few cores takes seconds to do; only a hung one is cut.
pub const FINISHED_GRACE: Duration = Duration::from_secs(120);

/// Why a job could not be run, or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The network failed (a rendezvous, a coordinator).
    #[error(transparent)]
    Comm(#[from] comm::transport::CommError),
    /// The job's settings cannot work.
    #[error("{0}")]
    Config(String),
    /// The job ran and did not finish.
    #[error("{0}")]
    Failed(String),
}

impl LaunchError {
    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }
}

/// One line of the launcher's, timed from the start of the job like the coordinator's.
#[macro_export]
macro_rules! say {
    ($started:expr, $($arg:tt)*) => {
        println!("[launcher]    {:>7.2} s  {}", $started.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

/// A fresh random secret for a job, as hex.
pub fn job_secret() -> Result<String, LaunchError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| LaunchError::Config(format!("cannot draw the job secret: {e}")))?;
    Ok(secret.iter().map(|b| format!("{b:02x}")).collect())
}

/// The job's secret: `STEADFAST_SECRET` when set; otherwise a fresh one on one node, and an
/// error on several, whose launchers must share it.
pub(crate) fn shared_secret(several_nodes: bool) -> Result<String, LaunchError> {
    match std::env::var("STEADFAST_SECRET").ok().filter(|s| !s.is_empty()) {
        Some(s) => Ok(s),
        None if !several_nodes => job_secret(),
        None => Err(LaunchError::Config(
            "a job of several nodes (or an elastic one that meets in etcd) needs STEADFAST_SECRET, \
                 the same on every node"
                .into(),
        )),
    }
}

/// The listener of the coordinator this launcher serves, and the address its workers dial:
/// on the port of `address` (`HOST:PORT`, the job's coordinator), on every interface; or,
/// with no address, on a free loopback port.
pub(crate) fn coordinator_listener(address: Option<&str>) -> Result<(std::net::TcpListener, String), LaunchError> {
    use std::net::TcpListener;
    match address {
        Some(address) => {
            let port = static_job::port_of(address)?;
            // A loopback address is served on loopback alone; any other on every interface
            // (a host's own name may resolve, on the host, to an address others cannot reach).
            let host = address.rsplit_once(':').map_or("", |(h, _)| h.trim_matches(['[', ']']));
            let ip = match host.parse::<std::net::IpAddr>() {
                Ok(ip) if ip.is_loopback() => ip,
                _ => std::net::IpAddr::from([0, 0, 0, 0]),
            };
            let l = TcpListener::bind((ip, port))
                .map_err(LaunchError::io(format!("cannot serve the coordinator on port {port}")))?;
            Ok((l, address.to_owned()))
        }
        None => {
            let l = TcpListener::bind("127.0.0.1:0").map_err(LaunchError::io("cannot listen for the coordinator"))?;
            let local = l.local_addr().map_err(LaunchError::io("cannot read the coordinator's address"))?;
            Ok((l, local.to_string()))
        }
    }
}
