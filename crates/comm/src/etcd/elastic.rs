//! The etcd client's side of an elastic job (see the parent module's docs for the keys).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    Txn, TxnOp, WatchOptions, WatchStream,
};
use tokio::sync::oneshot;

use super::{DONE, Stoppable, Target, coordinator_key, generations_key, over_key, worker_key, worker_of, workers};
use crate::directory::Directory;
use crate::protocol::WorkerId;
use crate::transport::CommError;

fn setup(what: impl std::fmt::Display) -> CommError {
    CommError::Setup(what.to_string())
}

fn runtime() -> Result<tokio::runtime::Runtime, CommError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| setup(format!("cannot start the etcd client's runtime: {e}")))
}

/// Connects to etcd, trying until it answers or `give_up` is set.
async fn connect(target: &Target, give_up: &AtomicBool) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(target.ttl.max(Duration::from_secs(2)));
    loop {
        // (The client may retry inside `connect` for as long as etcd is down.)
        let connecting = Client::connect([target.endpoint.as_str()], Some(options.clone()));
        match tokio::time::timeout(Duration::from_secs(3), connecting).await {
            Ok(Ok(c)) => return Some(c),
            Ok(Err(e)) => tracing::debug!("etcd at {} not reachable yet: {e}", target.endpoint),
            Err(_) => tracing::debug!("etcd at {} does not answer", target.endpoint),
        }
        if give_up.load(Ordering::Relaxed) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An etcd call bounded by the lease's time to live (at least 2 s): while etcd is down a
/// request waits as the client reconnects, and no step here may wait for it forever (a
/// launcher whose job is over must be able to give up, a holder to resign).
async fn bounded<T>(
    target: &Target,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Option<T> {
    tokio::time::timeout(target.ttl.max(Duration::from_secs(2)), call).await.ok()?.ok()
}

fn etcd_error(target: &Target, what: &str, e: etcd_client::Error) -> CommError {
    setup(format!("etcd at {}: {what}: {e}", target.endpoint))
}

/// How a campaign for the coordinator role ended.
pub enum Candidacy {
    /// This process holds the role.
    Won(CoordinatorRole),
    /// The job is over (what its last coordinator wrote): there is nothing to coordinate.
    Over(String),
    /// The candidate gave up before winning.
    GaveUp,
}

/// The coordinator role, held under this process's lease. Dropped without
/// [`resign`](CoordinatorRole::resign), the lease is given back and a standby takes the role.
pub struct CoordinatorRole {
    generation: u64,
    /// Told the job's end, where it is over.
    thread: Stoppable<Option<String>>,
}

impl CoordinatorRole {
    /// How many coordinators of this job were elected before this one.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Gives the role back; with `over`, first records that the job is over (so that no
    /// standby takes the role to wait for workers that will never come).
    pub fn resign(mut self, over: Option<String>) {
        self.thread.stop(over);
    }
}

impl Drop for CoordinatorRole {
    fn drop(&mut self) {
        self.thread.stop(None);
    }
}

/// Campaigns for the coordinator role of `target`'s job, to serve it at `addr`: waits
/// until the role is free and takes it, or the job is over, or `give_up` is set. While the
/// role is held, `on_lost` is called (once, from the role's thread) if it is lost: the
/// lease expired (this process was stopped or cut off from etcd for longer than its time
/// to live) or another process holds the key.
pub fn campaign(
    target: &Target,
    addr: SocketAddr,
    give_up: Arc<AtomicBool>,
    on_lost: impl FnOnce(String) + Send + 'static,
) -> Result<Candidacy, CommError> {
    let runtime = runtime()?;
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel();
    let target = target.clone();
    let thread = std::thread::Builder::new()
        .name("etcd-coordinator-role".into())
        .spawn(move || {
            runtime.block_on(async move {
                // etcd may go away during the campaign: the candidate connects again.
                let won = loop {
                    if give_up.load(Ordering::Relaxed) {
                        break Won::GaveUp;
                    }
                    let Some(client) = connect(&target, &give_up).await else { break Won::GaveUp };
                    match run_for(&target, client, addr, &give_up).await {
                        Ok(won) => break won,
                        Err(e) => tracing::debug!("campaign for the coordinator role: {e}"),
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                };
                match won {
                    Won::CoordinatorRole(held, generation) => {
                        let _ = tx.send(Won::Generation(generation));
                        hold(&target, *held, stop_rx, on_lost).await;
                    }
                    other => {
                        let _ = tx.send(other);
                    }
                }
            })
        })
        .map_err(|e| setup(format!("cannot start the etcd campaign's thread: {e}")))?;
    match rx.recv().map_err(|_| setup("the etcd campaign's thread ended"))? {
        Won::Generation(generation) => {
            Ok(Candidacy::Won(CoordinatorRole { generation, thread: Stoppable::new(stop_tx, thread) }))
        }
        Won::Over(what) => Ok(Candidacy::Over(what)),
        Won::GaveUp => Ok(Candidacy::GaveUp),
        Won::CoordinatorRole(..) => unreachable!("the role stays on its thread"),
    }
}

/// What the campaign's thread found.
enum Won {
    CoordinatorRole(Box<RoleLease>, u64),
    Generation(u64),
    Over(String),
    GaveUp,
}

/// Takes the role once it is free: one transaction creates the role's key under this
/// candidate's lease and counts the election, so two candidates never both win, and the
/// generation (the elections before) is the count read in the same transaction.
async fn run_for(
    target: &Target,
    mut client: Client,
    addr: SocketAddr,
    give_up: &AtomicBool,
) -> Result<Won, CommError> {
    let job = &target.job;
    let unreachable = || setup(format!("etcd at {} does not answer", target.endpoint));
    let lease =
        bounded(target, client.lease_grant(target.ttl.as_secs() as i64, None)).await.ok_or_else(unreachable)?.id();
    let (mut keeper, mut acks) = bounded(target, client.lease_keep_alive(lease)).await.ok_or_else(unreachable)?;
    let mut tick = tokio::time::interval(target.ttl / 3);
    loop {
        if give_up.load(Ordering::Relaxed) {
            let _ = bounded(target, client.lease_revoke(lease)).await;
            return Ok(Won::GaveUp);
        }
        let unreachable = || setup(format!("etcd at {} does not answer", target.endpoint));
        let over = bounded(target, client.get(over_key(job), None)).await.ok_or_else(unreachable)?;
        if let Some(kv) = over.kvs().first() {
            let _ = bounded(target, client.lease_revoke(lease)).await;
            return Ok(Won::Over(String::from_utf8_lossy(kv.value()).into_owned()));
        }
        let count = bounded(target, client.get(generations_key(job), None)).await.ok_or_else(unreachable)?;
        let elections = count.kvs().first().map_or(0, |kv| kv.version());
        let take = Txn::new()
            .when([
                Compare::create_revision(coordinator_key(job), CompareOp::Equal, 0),
                Compare::version(generations_key(job), CompareOp::Equal, elections),
                Compare::create_revision(over_key(job), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(coordinator_key(job), addr.to_string(), Some(PutOptions::new().with_lease(lease))),
                TxnOp::put(generations_key(job), "", None),
            ]);
        let taken = bounded(target, client.txn(take)).await.ok_or_else(unreachable)?;
        if taken.succeeded() {
            let held = RoleLease { client, lease, addr, keeper: Some((keeper, acks)) };
            return Ok(Won::CoordinatorRole(Box::new(held), elections as u64));
        }
        // Another holds the role: wait for its key to go (or a while, to look again).
        let revision = taken.header().map_or(0, |h| h.revision());
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut watch =
            bounded(target, client.watch(coordinator_key(job), Some(options))).await.ok_or_else(unreachable)?;
        let wait = tokio::time::sleep(Duration::from_millis(500));
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                _ = tick.tick() => keeper.keep_alive().await.map_err(|e| etcd_error(target, "cannot keep the lease alive", e))?,
                ack = acks.message() => match ack {
                    Ok(Some(a)) if a.ttl() > 0 => {}
                    other => return Err(setup(format!("lost the candidate's lease: {other:?}"))),
                },
                message = watch.message() => match message {
                    Ok(Some(r)) if r.events().iter().any(|e| e.event_type() == EventType::Delete) => break,
                    Ok(Some(_)) => {}
                    _ => break,
                },
            }
        }
    }
}

/// The role held: the client, the lease, this coordinator's address and the keep-alives.
struct RoleLease {
    client: Client,
    lease: i64,
    addr: SocketAddr,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

/// Keeps the role's lease alive and watches its key until told to resign. While etcd is
/// unreachable the role is kept (no other process can be elected meanwhile); when it is
/// back, the key is read again, and a key that no longer names this coordinator, or a
/// lease etcd says expired, is the role lost.
async fn hold(
    target: &Target,
    mut held: RoleLease,
    mut stop: oneshot::Receiver<Option<String>>,
    on_lost: impl FnOnce(String),
) {
    let key = coordinator_key(&target.job);
    let mine = held.addr.to_string();
    let mut on_lost = Some(on_lost);
    let mut lose = |why: String| {
        if let Some(f) = on_lost.take() {
            tracing::warn!("this process lost the coordinator role: {why}");
            f(why);
        }
    };
    let mut watch: Option<WatchStream> = None;
    let mut tick = tokio::time::interval(target.ttl / 3);
    let mut unreachable = false;
    loop {
        let mut broken = false;
        if held.keeper.is_none() {
            match bounded(target, held.client.lease_keep_alive(held.lease)).await {
                Some(k) => held.keeper = Some(k),
                None => broken = true,
            }
        }
        if watch.is_none() && !broken {
            match bounded(target, held.client.get(key.clone(), None)).await {
                Some(got) => {
                    match got.kvs().first() {
                        Some(kv) if kv.value() == mine.as_bytes() && kv.lease() == held.lease => {}
                        Some(_) => lose("another process holds the role".into()),
                        None => lose("its key in etcd is gone (its lease expired)".into()),
                    }
                    let revision = got.header().map_or(0, |h| h.revision());
                    let options = WatchOptions::new().with_start_revision(revision + 1);
                    match bounded(target, held.client.watch(key.clone(), Some(options))).await {
                        Some(w) => watch = Some(w),
                        None => broken = true,
                    }
                }
                None => broken = true,
            }
        }
        if broken != unreachable {
            unreachable = broken;
            if broken {
                tracing::warn!("etcd at {} is unreachable: the coordinator goes on", target.endpoint);
            } else {
                tracing::info!("etcd at {} is reachable again", target.endpoint);
            }
        }
        let retry = tokio::time::sleep(if broken { Duration::from_millis(300) } else { Duration::MAX / 4 });
        tokio::select! {
            over = &mut stop => {
                resign(target, &mut held, over.ok().flatten()).await;
                return;
            }
            _ = retry => {}
            _ = tick.tick() => {
                if let Some((k, _)) = held.keeper.as_mut() && k.keep_alive().await.is_err() {
                    held.keeper = None;
                }
            }
            ack = next_ack(&mut held.keeper) => match ack {
                Ok(Some(a)) if a.ttl() > 0 => {}
                Ok(Some(_)) => lose("etcd says its lease expired".into()),
                _ => held.keeper = None,
            },
            message = next_event(&mut watch) => match message {
                Ok(Some(r)) => {
                    for e in r.events() {
                        match (e.event_type(), e.kv()) {
                            (EventType::Delete, _) => lose("its key in etcd was deleted".into()),
                            (EventType::Put, Some(kv)) if kv.value() != mine.as_bytes() => {
                                lose("another process holds the role".into())
                            }
                            _ => {}
                        }
                    }
                }
                _ => watch = None,
            },
        }
    }
}

/// Gives the role back: the job's outcome first, when it is over, under a lease of its
/// own (a minute, or six leases' time) so that the job's name can be used again later.
async fn resign(target: &Target, held: &mut RoleLease, over: Option<String>) {
    let job = &target.job;
    if let Some(outcome) = over {
        let ttl = (target.ttl.as_secs() * 6).max(60) as i64;
        if let Some(g) = bounded(target, held.client.lease_grant(ttl, None)).await {
            let put = held.client.put(over_key(job), outcome, Some(PutOptions::new().with_lease(g.id())));
            let _ = bounded(target, put).await;
        }
    }
    let mine = Txn::new()
        .when([Compare::value(coordinator_key(job), CompareOp::Equal, held.addr.to_string())])
        .and_then([TxnOp::delete(coordinator_key(job), None)]);
    let _ = bounded(target, held.client.txn(mine)).await;
    let _ = bounded(target, held.client.lease_revoke(held.lease)).await;
}

async fn next_ack(
    keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
    match keeper {
        Some((_, acks)) => acks.message().await,
        None => std::future::pending().await,
    }
}

async fn next_event(watch: &mut Option<WatchStream>) -> Result<Option<etcd_client::WatchResponse>, etcd_client::Error> {
    match watch {
        Some(w) => w.message().await,
        None => std::future::pending().await,
    }
}

/// A thread that runs until dropped.
pub struct Background {
    /// Told whether the worker it serves finished.
    thread: Stoppable<bool>,
    stopping: Arc<AtomicBool>,
}

impl Background {
    /// Runs `body` on a thread of its own; it hears the stop on the channel, and sees the
    /// flag set (to stop connecting) first.
    fn spawn<F>(
        name: &str,
        body: impl FnOnce(oneshot::Receiver<bool>, Arc<AtomicBool>) -> F + Send + 'static,
    ) -> Result<Self, CommError>
    where
        F: std::future::Future<Output = ()>,
    {
        let runtime = runtime()?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || runtime.block_on(body(stop_rx, flag)))
            .map_err(|e| setup(format!("cannot start the thread {name}: {e}")))?;
        Ok(Background { thread: Stoppable::new(stop_tx, thread), stopping })
    }

    /// Stops the thread; `finished`: the worker it serves finished (its lease is given
    /// back as no loss).
    pub fn finish(mut self, finished: bool) {
        self.end(finished);
    }

    fn end(&mut self, finished: bool) {
        self.stopping.store(true, Ordering::Relaxed);
        self.thread.stop(finished);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// The job's outcome as its last coordinator wrote it in etcd when the job ended
/// (`finished`, or `stopped: ...`); `None` while it runs, before it starts, or when etcd
/// does not answer within a lease's time (whoever asks then waits for a coordinator as
/// before).
pub fn outcome(target: &Target) -> Result<Option<String>, CommError> {
    let give_up = AtomicBool::new(false);
    runtime()?.block_on(async {
        let asked = async {
            let mut client = connect(target, &give_up).await?;
            bounded(target, client.get(over_key(&target.job), None)).await
        };
        let got = tokio::time::timeout(target.ttl.max(Duration::from_secs(2)), asked).await.ok().flatten();
        Ok(got.and_then(|r| r.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())))
    })
}

/// Keeps `directory` on the address of whoever holds `target`'s coordinator role, until
/// dropped. (When the role's key goes, the address it named stays: the link to it fails
/// on its own, and the next holder's address replaces it.)
pub fn follow(target: &Target, directory: Directory) -> Result<Background, CommError> {
    let target = target.clone();
    Background::spawn("etcd-coordinator-follower", move |mut stop, never| async move {
        let key = coordinator_key(&target.job);
        let set = |value: &[u8]| match std::str::from_utf8(value).ok().and_then(|t| t.parse().ok()) {
            Some(addr) => directory.set(vec![addr]),
            None => tracing::warn!("the coordinator's address in etcd is malformed"),
        };
        loop {
            let watched = async {
                let mut client = connect(&target, &never).await?;
                let got = client.get(key.clone(), None).await.ok()?;
                if let Some(kv) = got.kvs().first() {
                    set(kv.value());
                }
                let revision = got.header().map_or(0, |h| h.revision());
                let options = WatchOptions::new().with_start_revision(revision + 1);
                let mut watch = client.watch(key.clone(), Some(options)).await.ok()?;
                while let Ok(Some(r)) = watch.message().await {
                    for e in r.events() {
                        if let (EventType::Put, Some(kv)) = (e.event_type(), e.kv()) {
                            set(kv.value());
                        }
                    }
                }
                Some(())
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = watched => {}
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Keeps worker `id`'s process `incarnation` in `target`'s membership: its key, under a
/// lease of its own, until dropped (the lease stops being kept and expires) or finished
/// (the key says `done`, then the lease is given back). When the lease expired while the
/// process was not running (stopped, or cut off from etcd), `on_note` hears it and the
/// worker takes a new lease: the coordinator has counted it lost, and it rejoins the job
/// as any returning worker does.
pub fn keep_worker(
    target: &Target,
    id: WorkerId,
    incarnation: u64,
    on_note: impl Fn(String) + Send + 'static,
) -> Result<Background, CommError> {
    let target = target.clone();
    Background::spawn("etcd-worker-lease", move |mut stop, stopping| async move {
        let key = worker_key(&target.job, id, incarnation);
        let mut lease: Option<(i64, LeaseKeeper, LeaseKeepAliveStream)> = None;
        let mut client: Option<Client> = None;
        let mut tick = tokio::time::interval(target.ttl / 3);
        let mut had_lease = false;
        loop {
            if client.is_none() {
                client = connect(&target, &stopping).await;
            }
            let Some(c) = client.as_mut() else { return };
            if lease.is_none() {
                let granted = async {
                    let id = bounded(&target, c.lease_grant(target.ttl.as_secs() as i64, None)).await?.id();
                    bounded(&target, c.put(key.clone(), "", Some(PutOptions::new().with_lease(id)))).await?;
                    let (k, s) = bounded(&target, c.lease_keep_alive(id)).await?;
                    Some((id, k, s))
                };
                lease = granted.await;
                if lease.is_some() && std::mem::replace(&mut had_lease, true) {
                    on_note(format!(
                        "worker {id}'s lease in etcd expired while it was not running: the job counted it lost, \
                         and it rejoins"
                    ));
                }
            }
            let retry =
                tokio::time::sleep(if lease.is_none() { Duration::from_millis(300) } else { Duration::MAX / 4 });
            tokio::select! {
                finished = &mut stop => {
                    if let (Ok(true), Some((l, _, _)), Some(c)) = (finished, lease.as_ref(), client.as_mut()) {
                        let _ = bounded(&target, c.put(key.clone(), DONE, Some(PutOptions::new().with_lease(*l)))).await;
                        let _ = bounded(&target, c.lease_revoke(*l)).await;
                    }
                    return;
                }
                _ = retry => {}
                _ = tick.tick() => {
                    if let Some((_, k, _)) = lease.as_mut() && k.keep_alive().await.is_err() {
                        // etcd is unreachable: try the same lease again when it is back.
                        client = None;
                        lease = None;
                        had_lease = false;
                    }
                }
                ack = async { match lease.as_mut() { Some((_, _, s)) => s.message().await, None => std::future::pending().await } } => {
                    match ack {
                        Ok(Some(a)) if a.ttl() > 0 => {}
                        // Expired: a new lease, and the note.
                        Ok(Some(_)) => lease = None,
                        _ => { client = None; lease = None; had_lease = false; }
                    }
                }
            }
        }
    })
}

/// Watches the workers' leases of `target`'s job and calls `on_expired(id, incarnation)`
/// for each one that expired (a worker that finished said so first, and is not named),
/// until dropped.
pub fn watch_workers(
    target: &Target,
    on_expired: impl Fn(WorkerId, u64) + Send + 'static,
) -> Result<Background, CommError> {
    let target = target.clone();
    Background::spawn("etcd-worker-watch", move |mut stop, never| async move {
        let prefix = workers(&target.job);
        let mut next_revision = None;
        loop {
            let watched = async {
                let mut client = connect(&target, &never).await?;
                let start = match next_revision {
                    Some(r) => r,
                    None => {
                        client
                            .get(prefix.clone(), Some(GetOptions::new().with_count_only()))
                            .await
                            .ok()?
                            .header()?
                            .revision()
                            + 1
                    }
                };
                next_revision = Some(start);
                let options = WatchOptions::new().with_prefix().with_prev_key().with_start_revision(start);
                let mut watch = client.watch(prefix.clone(), Some(options)).await.ok()?;
                while let Ok(Some(r)) = watch.message().await {
                    if r.canceled() {
                        // The revision was compacted away: from now on.
                        next_revision = None;
                        return Some(());
                    }
                    for e in r.events() {
                        let Some(kv) = e.kv() else { continue };
                        next_revision = Some(kv.mod_revision() + 1);
                        let finished = e.prev_kv().is_some_and(|p| p.value() == DONE);
                        if e.event_type() == EventType::Delete
                            && !finished
                            && let Some((id, incarnation)) = worker_of(&target.job, kv.key())
                        {
                            on_expired(id, incarnation);
                        }
                    }
                }
                Some(())
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = watched => {}
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}
