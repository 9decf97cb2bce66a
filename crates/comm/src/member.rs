//! What every shell of an elastic worker does alike around the step protocol's
//! [`Worker`](crate::protocol::Worker) (the trainer's, the Python package's): find the
//! coordinator, hold the epoch's mesh where the link's thread can abort it, and carry the
//! members' ballots to each other.
//!
//! The shells differ in what a step computes and where the state lives; the plumbing of
//! membership is the same, and lives here once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::directory::Directory;
use crate::job::CoordinatorAt;
use crate::protocol::{Msg, Saved, WorkerId};
use crate::transport::{CommError, TcpConfig, TcpMesh};

/// The mesh of the current epoch, shared with the link's thread, which aborts it when a
/// message from the coordinator ends the epoch while the loop is blocked in a collective.
#[derive(Clone, Default)]
pub struct Current(Arc<Mutex<Option<EpochMesh>>>);

/// An epoch and its mesh.
pub type EpochMesh = (u64, Arc<TcpMesh>);

impl Current {
    /// The epoch's mesh, if one is current.
    pub fn get(&self) -> Option<EpochMesh> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// No mesh is current (the next step builds the epoch's).
    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Makes `mesh` the current one, and returns it.
    pub fn set(&self, epoch: u64, mesh: TcpMesh) -> Arc<TcpMesh> {
        let mesh = Arc::new(mesh);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, Arc::clone(&mesh)));
        mesh
    }

    /// What the link does with each message from the coordinator before the worker's
    /// loop hears it: a message that makes the collective in progress moot (the epoch
    /// ended, the job stopped) aborts it, so that a loop blocked in it hears the message
    /// at once.
    pub fn aborts_moot_collectives(&self) -> Box<dyn Fn(&Msg) + Send> {
        let current = self.clone();
        Box::new(move |m: &Msg| {
            let Some((epoch, mesh)) = current.get() else { return };
            match m {
                Msg::Reconfigure { epoch: e } if *e >= epoch => {
                    mesh.abort(format!("the coordinator ended epoch {}", crate::control::epoch_text(*e)))
                }
                Msg::Stop { reason } => mesh.abort(format!("the coordinator stopped the job: {reason}")),
                _ => {}
            }
        })
    }
}

/// Where the coordinator is found, and the threads that keep this worker's part in etcd
/// (where the coordinator role is followed, and the worker's lease kept; `note` hears
/// what the lease's thread has to say, at any moment).
pub fn find_coordinator(
    at: &CoordinatorAt,
    id: WorkerId,
    incarnation: u64,
    note: impl Fn(String) + Send + 'static,
) -> Result<(Directory, Vec<crate::etcd::elastic::Background>), CommError> {
    match at {
        CoordinatorAt::Listed(addrs) => Ok((Directory::fixed(addrs.clone()), Vec::new())),
        CoordinatorAt::Etcd(target) => {
            // A process that starts after the job's end (a node's launcher started again
            // late) hears so at once, as a late joiner hears it from the coordinator.
            match crate::etcd::elastic::outcome(target)?.as_deref() {
                Some("finished") => return Err(CommError::Aborted(crate::control::JOINED_AFTER_THE_END.to_owned())),
                Some(how) => return Err(CommError::Aborted(format!("the job is over in etcd: {how}"))),
                None => {}
            }
            let directory = Directory::default();
            let follower = crate::etcd::elastic::follow(target, directory.clone())?;
            let lease = crate::etcd::elastic::keep_worker(target, id, incarnation, note)?;
            Ok((directory, vec![lease, follower]))
        }
    }
}

/// The name that a job's committers write into the root's lock: the same in every
/// process of one job, another in any other job. It follows from the job's secret (a
/// launcher on one node draws a fresh one for each job) and, for a job that meets in
/// etcd, the job's name there; not from addresses, which each node may resolve in its own
/// way. The secret itself is never written. Two jobs of several nodes given the same
/// `STEADFAST_SECRET` share a tag: the lock does not tell them apart, though a root of
/// another configuration refuses either (the store's configuration check).
pub fn job_tag(d: &crate::job::ElasticWorker) -> String {
    let mut text = d.secret.clone();
    if let CoordinatorAt::Etcd(target) = &d.coordinator {
        text.extend_from_slice(format!("\0etcd job {}", target.job).as_bytes());
    }
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&text))
}

/// The settings of the links of the epochs' meshes: the job's `secret`, and its
/// `timeout` for connecting and writing.
pub fn mesh_config(secret: &[u8], timeout: Duration) -> TcpConfig {
    TcpConfig {
        secret: secret.to_vec(),
        max_frame: crate::frame::DEFAULT_MAX_FRAME,
        connect_timeout: timeout,
        write_timeout: timeout,
        abort_grace: Duration::ZERO,
        shared_memory: crate::local::default_dir(),
    }
}

/// A member's ballot for a step: its sum is finite, the sum's digest, its checkpoint
/// part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ballot {
    /// Whether the sum is finite.
    pub ok: bool,
    /// The sum's digest.
    pub digest: u64,
    /// Where the member's checkpoint part stands.
    pub saved: Saved,
}

/// Casts this worker's `ballot` for `(epoch, step)`: one all-gather over the epoch's
/// `mesh` carries every member's to every other. Returns the other members' ballots as
/// the messages the protocol hears, each with its sender (`members`: the epoch's, in rank
/// order, `id` among them).
pub fn cast_ballots(
    mesh: &TcpMesh,
    (members, id): (&[WorkerId], WorkerId),
    (epoch, step): (u64, u64),
    ballot: Ballot,
    timeout: Duration,
) -> Result<Vec<(WorkerId, Msg)>, CommError> {
    let s = ballot.saved;
    let words = [u64::from(ballot.ok), ballot.digest, s.durable, u64::from(s.locked), s.written, s.print];
    let all = crate::collective::all_gather_words(mesh, &words, timeout)?;
    // The gathered ballots are in rank order, this worker's among them.
    Ok(all
        .iter()
        .enumerate()
        .filter_map(|(r, w)| {
            let &peer = members.get(r).filter(|&&p| p != id)?;
            let saved = Saved { durable: w[2], locked: w[3] == 1, written: w[4], print: w[5] };
            Some((peer, Msg::Ballot { epoch, step, ok: w[0] == 1, digest: w[1], saved }))
        })
        .collect())
}

/// The addresses of `sources` this worker knows (`book`), in their order: whom a fetch
/// dials.
pub fn addresses_of(
    sources: &[WorkerId],
    book: &std::collections::BTreeMap<WorkerId, SocketAddr>,
) -> Vec<(WorkerId, SocketAddr)> {
    sources.iter().filter_map(|s| book.get(s).map(|a| (*s, *a))).collect()
}
