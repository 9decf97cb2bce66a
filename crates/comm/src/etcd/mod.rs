//! Rendezvous and membership kept in etcd, so that a static job needs no coordinator
//! process (`train --rendezvous etcd://HOST:PORT/JOB`).
//!
//! Each worker grants itself a lease in etcd (its time to live is the loss bound) and
//! creates the key `/steadfast/JOB/members/RANK` under it, holding its listening address;
//! a rank already taken is refused. It reads, then watches, the members' prefix until all
//! `world` ranks are there: that is the address table from which the mesh is built. Then a
//! background thread keeps the lease alive and goes on watching:
//!
//! - a member whose lease expires (its process died, hung or was cut off, so its
//!   keep-alives stopped) has its key deleted by etcd; every other worker sees the
//!   deletion and aborts its mesh, naming the rank ([`Notice::LeaseExpired`](crate::supervisor::Notice::LeaseExpired));
//! - a worker that finishes first writes `done` into its key, then revokes its lease:
//!   the deletion that follows is not a loss;
//! - while etcd itself is unreachable, training goes on (the mesh is between workers) and
//!   the thread retries; when etcd is back, with its data, it has renewed the leases, and
//!   the watch resumes from the last revision seen, so no deletion is missed. A loss that
//!   happens while etcd is down is noticed by the collectives' deadlines instead.
//!
//! An elastic job (`launch --rendezvous etcd://... --max-restarts K`, `train --elastic
//! --rendezvous ...`) keeps its step protocol's coordinator, and etcd keeps what would
//! otherwise make that coordinator a single point of failure ([`elastic`] holds the client):
//!
//! - **the coordinator role**, held under a lease: every launcher of the job (and every
//!   `steadfast coordinator --rendezvous`) is a candidate; one transaction creates
//!   `/steadfast/JOB/coordinator` (its listening address) under the candidate's lease if
//!   the key is absent, and counts the election in `/steadfast/JOB/generations`, whose
//!   version before the transaction is the winner's *generation* (its epochs are numbered
//!   above every earlier coordinator's). When the holder dies, is stopped or cut off, its
//!   lease expires, the key goes, and a waiting candidate wins; it rebuilds the membership
//!   from the workers' reports. A holder that finds its key gone or another's stops
//!   serving. While etcd itself is down nobody can be elected, so the holder goes on.
//! - **where the coordinator is**: each worker watches the role's key and dials the
//!   address it names, leaving the old coordinator for the new one when it changes;
//! - **the workers' liveness**: each worker process keeps `/steadfast/JOB/workers/ID/INC`
//!   under a lease of its own; the coordinator watches them, and an expired lease is a
//!   lost worker, as a silent connection is. A worker whose lease expired while it was
//!   stopped learns it when it runs again, takes a new lease, and rejoins the job (it
//!   fetches the state from the live replicas, like any returning worker);
//! - **the end**: the last coordinator writes `/steadfast/JOB/over` (for a minute), so
//!   that no standby takes the role of a finished job.
//!
//! Nothing here is needed by the coordinator's path; the crate feature `etcd` (on the
//! `etcd-client` crate, which needs `protoc` to build) turns it on.

use std::time::Duration;

/// Where a job meets in etcd: `etcd://HOST:PORT/JOB[?ttl=SECONDS]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The etcd client endpoint, `HOST:PORT`.
    pub endpoint: String,
    /// The job's name: its keys are under `/steadfast/JOB/`.
    pub job: String,
    /// The leases' time to live: how long after a worker's last keep-alive the others
    /// count it lost. 10 s unless the address says otherwise.
    pub ttl: Duration,
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| format!("{url:?} does not start with etcd://"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (endpoint, job) =
            rest.split_once('/').ok_or_else(|| format!("{url:?} names no job: etcd://HOST:PORT/JOB"))?;
        let port = endpoint.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
        if endpoint.is_empty() || port.parse::<u16>().is_err() {
            return Err(format!("{url:?}: the etcd endpoint must be HOST:PORT"));
        }
        if job.is_empty() || !job.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!("{url:?}: the job name must be letters, digits, '-', '_' or '.'"));
        }
        let mut ttl = Duration::from_secs(10);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("ttl", v)) => {
                    let secs: u64 = v.parse().map_err(|_| format!("{url:?}: ttl must be whole seconds"))?;
                    if secs == 0 {
                        return Err(format!("{url:?}: ttl must be at least 1 second"));
                    }
                    ttl = Duration::from_secs(secs);
                }
                _ => return Err(format!("{url:?}: unknown setting {pair:?} (only ttl=SECONDS)")),
            }
        }
        Ok(Target { endpoint: endpoint.to_owned(), job: job.to_owned(), ttl })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd://{}/{}?ttl={}", self.endpoint, self.job, self.ttl.as_secs())
    }
}

/// The key prefix of a job's members.
// The key layout is the etcd client's (the `etcd` feature); its tests run without it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn members(job: &str) -> String {
    format!("/steadfast/{job}/members/")
}

/// A member's key; ranks are zero-padded so that keys sort by rank.
// The key layout is the etcd client's (the `etcd` feature); its tests run without it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn member_key(job: &str, rank: usize) -> String {
    format!("{}{rank:06}", members(job))
}

/// The rank a member key names, if it is one of `job`'s.
// The key layout is the etcd client's (the `etcd` feature); its tests run without it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn rank_of(job: &str, key: &[u8]) -> Option<usize> {
    std::str::from_utf8(key).ok()?.strip_prefix(&members(job))?.parse().ok()
}

/// What a member key holds once its worker finished.
// The key layout is the etcd client's (the `etcd` feature); its tests run without it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
const DONE: &[u8] = b"done";

/// Where an elastic job's coordinator listens, under its holder's lease.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn coordinator_key(job: &str) -> String {
    format!("/steadfast/{job}/coordinator")
}

/// The key whose version counts the elections of a job's coordinator.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn generations_key(job: &str) -> String {
    format!("/steadfast/{job}/generations")
}

/// The key that says an elastic job is over, and how.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn over_key(job: &str) -> String {
    format!("/steadfast/{job}/over")
}

/// The prefix of an elastic job's workers' keys.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn workers(job: &str) -> String {
    format!("/steadfast/{job}/workers/")
}

/// Worker `id`'s process `incarnation`'s key.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn worker_key(job: &str, id: crate::protocol::WorkerId, incarnation: u64) -> String {
    format!("{}{id:06}/{incarnation}", workers(job))
}

/// The worker and process a worker key names, if it is one of `job`'s.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn worker_of(job: &str, key: &[u8]) -> Option<(crate::protocol::WorkerId, u64)> {
    let (id, incarnation) = std::str::from_utf8(key).ok()?.strip_prefix(&workers(job))?.split_once('/')?;
    Some((id.parse().ok()?, incarnation.parse().ok()?))
}

#[cfg(feature = "etcd")]
pub use client::{Membership, join};

#[cfg(feature = "etcd")]
pub mod elastic;

/// A thread of this module's that runs until it is told to stop, and with what: a
/// membership's keep-alives, an elected coordinator's role, an elastic worker's lease.
/// [`stop`](Stoppable::stop) tells it and waits for it to end; its owner calls that from
/// `Drop` too, so a thread never outlives what it serves.
#[cfg(feature = "etcd")]
struct Stoppable<T> {
    stop: Option<tokio::sync::oneshot::Sender<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "etcd")]
impl<T> Stoppable<T> {
    fn new(stop: tokio::sync::oneshot::Sender<T>, thread: std::thread::JoinHandle<()>) -> Self {
        Stoppable { stop: Some(stop), thread: Some(thread) }
    }

    /// Tells the thread to stop with `why` (it may have ended already) and waits for it;
    /// after the first call, does nothing.
    fn stop(&mut self, why: T) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(why);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Without the `etcd` feature: the same functions, each refusing.
#[cfg(not(feature = "etcd"))]
pub mod elastic {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::Target;
    use crate::directory::Directory;
    use crate::protocol::WorkerId;
    use crate::transport::CommError;

    fn missing(target: &Target) -> CommError {
        CommError::Setup(format!("cannot use {target}: this steadfast was built without etcd (cargo feature `etcd`)"))
    }

    /// How a campaign ended (none without etcd).
    pub enum Candidacy {
        /// This process holds the role.
        Won(CoordinatorRole),
        /// The job is over.
        Over(String),
        /// The candidate gave up.
        GaveUp,
    }

    /// The coordinator role (never held without etcd).
    pub struct CoordinatorRole;

    impl CoordinatorRole {
        /// The elections before this one.
        pub fn generation(&self) -> u64 {
            0
        }

        /// Gives the role back.
        pub fn resign(self, _over: Option<String>) {}
    }

    /// A background thread (none without etcd).
    pub struct Background;

    impl Background {
        /// Stops the thread.
        pub fn finish(self, _finished: bool) {}
    }

    /// Refuses: no etcd client.
    pub fn campaign(
        target: &Target,
        _addr: SocketAddr,
        _give_up: Arc<AtomicBool>,
        _on_lost: impl FnOnce(String) + Send + 'static,
    ) -> Result<Candidacy, CommError> {
        Err(missing(target))
    }

    /// Refuses: no etcd client.
    pub fn outcome(target: &Target) -> Result<Option<String>, CommError> {
        Err(missing(target))
    }

    /// Refuses: no etcd client.
    pub fn follow(target: &Target, _directory: Directory) -> Result<Background, CommError> {
        Err(missing(target))
    }

    /// Refuses: no etcd client.
    pub fn keep_worker(
        target: &Target,
        _id: WorkerId,
        _incarnation: u64,
        _on_note: impl Fn(String) + Send + 'static,
    ) -> Result<Background, CommError> {
        Err(missing(target))
    }

    /// Refuses: no etcd client.
    pub fn watch_workers(
        target: &Target,
        _on_expired: impl Fn(WorkerId, u64) + Send + 'static,
    ) -> Result<Background, CommError> {
        Err(missing(target))
    }
}

#[cfg(not(feature = "etcd"))]
/// Without the `etcd` feature there is no etcd client: the job cannot meet there.
pub fn join(
    target: &Target,
    _rank: usize,
    _world: usize,
    _me: std::net::SocketAddr,
    _timeout: Duration,
    _on_notice: impl Fn(crate::supervisor::Notice) + Send + 'static,
) -> Result<(Vec<std::net::SocketAddr>, Membership), crate::transport::CommError> {
    Err(crate::transport::CommError::Setup(format!(
        "cannot meet at {target}: this steadfast was built without etcd (cargo feature `etcd`)"
    )))
}

#[cfg(not(feature = "etcd"))]
/// A membership in etcd (none without the `etcd` feature).
pub struct Membership;

#[cfg(not(feature = "etcd"))]
impl Membership {
    /// Nothing to say.
    pub fn finish(self) {}
}

#[cfg(feature = "etcd")]
mod client {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use etcd_client::{
        Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
        PutOptions, Txn, TxnOp, WatchOptions, WatchResponse, WatchStream,
    };
    use tokio::sync::oneshot;

    use super::{DONE, Stoppable, Target, member_key, members, rank_of};
    use crate::supervisor::Notice;
    use crate::transport::CommError;

    fn setup(what: impl std::fmt::Display) -> CommError {
        CommError::Setup(what.to_string())
    }

    /// This worker's membership: the thread that keeps its lease alive and watches the
    /// others'. Dropping it without [`finish`](Membership::finish) stops the keep-alives,
    /// and the others count this worker lost once its lease expires.
    pub struct Membership {
        /// Told whether this worker finished.
        thread: Stoppable<bool>,
    }

    impl Membership {
        /// Says that this worker finished (its key holds `done`) and gives the lease back.
        pub fn finish(mut self) {
            self.thread.stop(true);
        }
    }

    impl Drop for Membership {
        fn drop(&mut self) {
            self.thread.stop(false);
        }
    }

    /// Joins the job at `target` as `rank` of `world`, listening on `me`: returns the
    /// address table once every rank is there, and the membership, which calls
    /// `on_notice` (from its thread) for the first loss it sees.
    pub fn join(
        target: &Target,
        rank: usize,
        world: usize,
        me: SocketAddr,
        timeout: Duration,
        on_notice: impl Fn(Notice) + Send + 'static,
    ) -> Result<(Vec<SocketAddr>, Membership), CommError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| setup(format!("cannot start the etcd client's runtime: {e}")))?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let target = target.clone();
        let deadline = Instant::now() + timeout;
        let thread = std::thread::Builder::new()
            .name(format!("etcd-member-{rank}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let met = tokio::time::timeout_at(deadline.into(), meet(&target, rank, world, me))
                        .await
                        .unwrap_or_else(|_| {
                            Err(setup(format!(
                                "not every worker of {world} met at {target} within {:.0} s",
                                timeout.as_secs_f64()
                            )))
                        });
                    match met {
                        Ok(m) => {
                            let _ = ready_tx.send(Ok(m.table.clone()));
                            watch_members(&target, rank, world, m, stop_rx, &on_notice).await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                })
            })
            .map_err(|e| setup(format!("cannot start the etcd membership thread: {e}")))?;
        let table = ready_rx.recv().map_err(|_| setup("the etcd membership thread ended"))??;
        Ok((table, Membership { thread: Stoppable::new(stop_tx, thread) }))
    }

    /// A job met: the client, the lease and its keep-alive stream, the table and the
    /// revision it was read at.
    struct Met {
        client: Client,
        lease: i64,
        keeper: (LeaseKeeper, LeaseKeepAliveStream),
        table: Vec<SocketAddr>,
        revision: i64,
    }

    /// Connects (retrying while etcd is not up yet), takes the rank under a new lease,
    /// and waits until every rank is there.
    async fn meet(target: &Target, rank: usize, world: usize, me: SocketAddr) -> Result<Met, CommError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(target.ttl.max(Duration::from_secs(2)));
        let mut client = loop {
            match Client::connect([target.endpoint.as_str()], Some(options.clone())).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::debug!("etcd at {} not reachable yet: {e}", target.endpoint);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let etcd = |what: &str, e: etcd_client::Error| setup(format!("etcd at {}: {what}: {e}", target.endpoint));
        let lease = client
            .lease_grant(target.ttl.as_secs() as i64, None)
            .await
            .map_err(|e| etcd("cannot grant a lease", e))?
            .id();
        let key = member_key(&target.job, rank);
        let take = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, me.to_string(), Some(PutOptions::new().with_lease(lease)))]);
        if !client.txn(take).await.map_err(|e| etcd("cannot take the rank", e))?.succeeded() {
            let _ = client.lease_revoke(lease).await;
            return Err(setup(format!("rank {rank} of job {:?} is already taken in etcd", target.job)));
        }
        // The keep-alives start now: waiting for the others may outlast the lease.
        let (mut keeper, mut acks) =
            client.lease_keep_alive(lease).await.map_err(|e| etcd("cannot keep the lease alive", e))?;
        let prefix = members(&target.job);
        let got = client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd("cannot read the members", e))?;
        let mut revision = got.header().map_or(0, |h| h.revision());
        let mut table: Vec<Option<SocketAddr>> = vec![None; world];
        for kv in got.kvs() {
            note(&target.job, &mut table, kv.key(), Some(kv.value()))?;
        }
        let mut watch: Option<WatchStream> = None;
        let mut tick = tokio::time::interval(target.ttl / 3);
        while table.iter().any(Option::is_none) {
            if watch.is_none() {
                let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
                watch = Some(client.watch(prefix.clone(), Some(options)).await.map_err(|e| etcd("cannot watch", e))?);
            }
            tokio::select! {
                _ = tick.tick() => keeper.keep_alive().await.map_err(|e| etcd("cannot keep the lease alive", e))?,
                ack = acks.message() => match ack {
                    Ok(Some(a)) if a.ttl() > 0 => {}
                    other => return Err(setup(format!("lost the lease while waiting for the others: {other:?}"))),
                },
                response = next(&mut watch) => {
                    let response = response.map_err(|e| etcd("the watch failed", e))?
                        .ok_or_else(|| setup("etcd closed the watch"))?;
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        revision = revision.max(kv.mod_revision());
                        match event.event_type() {
                            EventType::Put => note(&target.job, &mut table, kv.key(), Some(kv.value()))?,
                            EventType::Delete => note(&target.job, &mut table, kv.key(), None)?,
                        }
                    }
                }
            }
        }
        let table = table.into_iter().map(|a| a.expect("every rank is there")).collect();
        Ok(Met { client, lease, keeper: (keeper, acks), table, revision })
    }

    /// Records in `table` what a member key now holds (`None`: deleted).
    fn note(job: &str, table: &mut [Option<SocketAddr>], key: &[u8], value: Option<&[u8]>) -> Result<(), CommError> {
        let Some(r) = rank_of(job, key) else { return Ok(()) };
        let world = table.len();
        let slot = table
            .get_mut(r)
            .ok_or_else(|| setup(format!("a worker of job {job:?} took rank {r}, beyond the world of {world}")))?;
        *slot = match value {
            Some(v) => Some(
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| setup(format!("rank {r}'s address in etcd is malformed")))?,
            ),
            None => None,
        };
        Ok(())
    }

    async fn next(watch: &mut Option<WatchStream>) -> Result<Option<WatchResponse>, etcd_client::Error> {
        match watch {
            Some(w) => w.message().await,
            None => std::future::pending().await,
        }
    }

    async fn next_ack(
        keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
        match keeper {
            Some((_, acks)) => acks.message().await,
            None => std::future::pending().await,
        }
    }

    /// After the rendezvous: keeps the lease alive and reports the first member lost,
    /// until told to stop (`true`: this worker finished).
    async fn watch_members(
        target: &Target,
        rank: usize,
        world: usize,
        met: Met,
        mut stop: oneshot::Receiver<bool>,
        on_notice: &(impl Fn(Notice) + Send),
    ) {
        let Met { mut client, lease, keeper, revision, .. } = met;
        let prefix = members(&target.job);
        let mut next_revision = revision + 1;
        let mut done = BTreeSet::new();
        let mut reported = false;
        let mut report = |notice: Notice| {
            if !std::mem::replace(&mut reported, true) {
                on_notice(notice);
            }
        };
        let mut keeper = Some(keeper);
        let mut watch: Option<WatchStream> = None;
        let mut unreachable_since: Option<Instant> = None;
        let mut tick = tokio::time::interval(target.ttl / 3);
        loop {
            let mut broken = None;
            if keeper.is_none() {
                match client.lease_keep_alive(lease).await {
                    Ok(k) => keeper = Some(k),
                    Err(e) => broken = Some(e.to_string()),
                }
            }
            if watch.is_none() && broken.is_none() {
                let options = WatchOptions::new().with_prefix().with_start_revision(next_revision);
                match client.watch(prefix.clone(), Some(options)).await {
                    Ok(w) => watch = Some(w),
                    Err(e) => broken = Some(e.to_string()),
                }
            }
            match (&broken, unreachable_since) {
                (Some(why), None) => {
                    tracing::warn!(
                        "etcd at {} is unreachable ({why}): training goes on; losses are seen when it is back",
                        target.endpoint
                    );
                    unreachable_since = Some(Instant::now());
                }
                (None, Some(since)) => {
                    tracing::warn!(
                        "etcd at {} is reachable again after {:.1} s",
                        target.endpoint,
                        since.elapsed().as_secs_f64()
                    );
                    unreachable_since = None;
                }
                _ => {}
            }
            let retry =
                tokio::time::sleep(if broken.is_some() { Duration::from_millis(300) } else { Duration::MAX / 4 });
            tokio::select! {
                finished = &mut stop => {
                    if finished.unwrap_or(false) {
                        let key = member_key(&target.job, rank);
                        let _ = client.put(key, DONE, Some(PutOptions::new().with_lease(lease))).await;
                        let _ = client.lease_revoke(lease).await;
                    }
                    return;
                }
                _ = retry => {}
                _ = tick.tick() => {
                    if let Some((k, _)) = keeper.as_mut()
                        && k.keep_alive().await.is_err()
                    {
                        keeper = None;
                    }
                }
                ack = next_ack(&mut keeper) => match ack {
                    Ok(Some(a)) if a.ttl() > 0 => {}
                    Ok(Some(_)) => report(Notice::OwnLeaseLost("etcd says it expired".into())),
                    _ => keeper = None,
                },
                response = next(&mut watch) => match response {
                    Ok(Some(r)) if r.canceled() => {
                        // The revision to resume from was compacted away: compare the
                        // members now with those that should be there.
                        watch = None;
                        // (When etcd cannot answer, the next round tries again.)
                        if let Ok(got) = client.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await {
                            next_revision = got.header().map_or(next_revision, |h| h.revision() + 1);
                            let present: BTreeSet<usize> =
                                got.kvs().iter().filter_map(|kv| rank_of(&target.job, kv.key())).collect();
                            if let Some(r) = (0..world).find(|r| !present.contains(r) && !done.contains(r)) {
                                report(Notice::LeaseExpired { rank: r });
                            }
                        }
                    }
                    Ok(Some(r)) => {
                        for event in r.events() {
                            let Some(kv) = event.kv() else { continue };
                            next_revision = next_revision.max(kv.mod_revision() + 1);
                            let Some(r) = rank_of(&target.job, kv.key()) else { continue };
                            match event.event_type() {
                                EventType::Put if kv.value() == DONE => {
                                    done.insert(r);
                                }
                                EventType::Put => {}
                                EventType::Delete if r == rank => {
                                    report(Notice::OwnLeaseLost("its key was deleted".into()))
                                }
                                EventType::Delete if !done.contains(&r) => report(Notice::LeaseExpired { rank: r }),
                                EventType::Delete => {}
                            }
                        }
                    }
                    _ => watch = None,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_say_why() {
        let t: Target = "etcd://127.0.0.1:2379/job-1".parse().unwrap();
        assert_eq!(t, Target { endpoint: "127.0.0.1:2379".into(), job: "job-1".into(), ttl: Duration::from_secs(10) });
        let t: Target = "etcd://etcd.example:2379/j?ttl=3".parse().unwrap();
        assert_eq!(t.ttl, Duration::from_secs(3));
        for (bad, why) in [
            ("http://h:1/j", "does not start with etcd://"),
            ("etcd://h:1", "names no job"),
            ("etcd://h/j", "HOST:PORT"),
            ("etcd://h:1/", "job name"),
            ("etcd://h:1/a/b", "job name"),
            ("etcd://h:1/j?ttl=0", "at least 1 second"),
            ("etcd://h:1/j?ttl=x", "whole seconds"),
            ("etcd://h:1/j?tll=3", "unknown setting"),
        ] {
            let e = bad.parse::<Target>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn member_keys_sort_by_rank_and_name_it() {
        assert_eq!(member_key("j", 7), "/steadfast/j/members/000007");
        assert!(member_key("j", 9) < member_key("j", 10));
        assert_eq!(rank_of("j", member_key("j", 12).as_bytes()), Some(12));
        assert_eq!(rank_of("j", member_key("k", 12).as_bytes()), None);
        assert_eq!(rank_of("j", b"/steadfast/j/members/x"), None);
    }

    #[test]
    fn worker_keys_name_the_worker_and_its_process() {
        assert_eq!(worker_key("j", 3, 2), "/steadfast/j/workers/000003/2");
        assert_eq!(worker_of("j", worker_key("j", 3, 2).as_bytes()), Some((3, 2)));
        assert_eq!(worker_of("k", worker_key("j", 3, 2).as_bytes()), None);
        assert_eq!(worker_of("j", b"/steadfast/j/workers/000003"), None);
        assert!(!coordinator_key("j").starts_with(&workers("j")));
        assert!(!over_key("j").starts_with(&workers("j")));
    }
}
