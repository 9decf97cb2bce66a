//! An elastic data-parallel worker: the training loop as the shell of the step protocol's
//! [`Worker`](comm::protocol::Worker).
//!
//! The protocol decides; this module carries out its actions on real state and sockets:
//!
//! - **Compute**: the gradients of the micro-batches this member owns in its epoch
//!   (`i mod world == rank`), all-reduced over the epoch's mesh, which
//!   [`Port::mesh`] builds when the epoch's first step begins. The sum is computed into a
//!   working buffer and becomes the *held* sum only when the all-reduce succeeded, so a
//!   failed step never spoils the sum a late member rolls forward with.
//! - **Ballots**: one all-gather of `(finite, digest)` over the mesh carries every
//!   member's ballot to every other; each arrives at the protocol as a message.
//! - **Apply**: the optimizer update with the held sum; the protocol hears the new
//!   fingerprint.
//! - **Fetch**: the state of the quorum's step, from its sources, in checksummed chunks
//!   from all of them at once ([`comm::transfer`]), written straight into this worker's
//!   state and checked against the quorum's fingerprint.
//!
//! Meanwhile a server thread answers other workers' fetches from the state it holds
//! (under a read lock: no copy of the model is made to serve it), and the
//! [`Link`](comm::control::Link) to the coordinator repeats the newest report every
//! heartbeat, so that a long step does not look like a lost worker.
//!
//! The micro-batches of a step, the sampler's position (a function of the step) and, in
//! the `reproducible` reduce mode, the bits of every sum do not depend on how many members
//! an epoch has: a job that loses, replaces or gains workers ends with the fingerprint of
//! one that never did. (In `deterministic` mode the bits depend on the world size, so a
//! job that shrinks ends with other bits; with replacement it keeps them.)

use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::ops::Range;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use comm::control::{Incoming, Link};
use comm::port::Port;
use comm::protocol::wire::Hello;
use comm::protocol::{Action, Msg, Node, Phase as Stage, Timing, Worker, WorkerId};
use comm::transfer::Want;
use comm::transport::{CommError, TcpConfig, TcpMesh, Transport};
use fault::crash::Phase;
use serde_json::json;

use crate::config::{DistConfig, TrainConfig};
use crate::error::{ConfigError, TrainError};
use crate::failpoint::ProcessFaults;
use crate::metrics::MetricsFile;
use crate::step::{At, Hooks, LiveFaults, SumCheck, TrainState};
use crate::trainer::{Event, Prepared, Summary, evaluate_state, report_injections, write_eval, write_summary};

/// The state this worker holds, shared with the thread that serves it to fetchers.
struct Held {
    state: TrainState,
    /// The state's fingerprint, once computed: an update leaves it unknown (a pass over
    /// the state that the protocol asks for only when it needs it), except where the
    /// job checks its state at rest (`--on-divergence repair`).
    fingerprint: Option<u64>,
}

fn lock_read(h: &RwLock<Held>) -> std::sync::RwLockReadGuard<'_, Held> {
    h.read().unwrap_or_else(|e| e.into_inner())
}

fn lock_write(h: &RwLock<Held>) -> std::sync::RwLockWriteGuard<'_, Held> {
    h.write().unwrap_or_else(|e| e.into_inner())
}

/// The mesh of the current epoch, shared with the link's thread, which aborts it when a
/// message from the coordinator ends the epoch while the loop is blocked in a collective.
#[derive(Clone, Default)]
struct Current(Arc<Mutex<Option<EpochMesh>>>);

/// An epoch and its mesh.
type EpochMesh = (u64, Arc<TcpMesh>);

impl Held {
    /// The state's fingerprint, computed when unknown.
    fn fingerprint(&mut self) -> u64 {
        *self.fingerprint.get_or_insert_with(|| self.state.fingerprint())
    }

    /// Whether the state still has the fingerprint it was committed with; when not,
    /// returns `(committed, found)` and takes `found` as the fingerprint it now holds. A
    /// state whose fingerprint was never taken cannot be checked: it is taken now.
    fn changed_since_commit(&mut self) -> Option<(u64, u64)> {
        let found = self.state.fingerprint();
        match self.fingerprint.replace(found) {
            Some(committed) if committed != found => Some((committed, found)),
            _ => None,
        }
    }
}

/// Logs and records a state found changed since its commit (`when`: where it was found).
fn record_changed(
    metrics: &mut MetricsFile,
    (id, step): (WorkerId, u64),
    when: &str,
    (committed, found): (u64, u64),
) -> Result<(), TrainError> {
    tracing::error!(
        step,
        "the state of worker {id} changed {when} ({} -> {}): repairing it from the replicas",
        repro::fingerprint::hex(committed),
        repro::fingerprint::hex(found)
    );
    metrics.write(json!({"kind": "divergence", "step": step, "worker": id, "found": when}))
}

impl Current {
    fn get(&self) -> Option<EpochMesh> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Makes `mesh` the current one, and returns it.
    fn set(&self, epoch: u64, mesh: TcpMesh) -> Arc<TcpMesh> {
        let mesh = Arc::new(mesh);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, Arc::clone(&mesh)));
        mesh
    }
}

/// A digest of the names and shapes of the state's tensors.
fn layout_of(state: &TrainState) -> (u64, u64) {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut elements = 0u64;
    for t in state.tensors() {
        h.update(t.name.as_bytes());
        h.update(&[0]);
        for d in &t.shape {
            h.update(&(*d as u64).to_le_bytes());
        }
        elements += t.data.len() as u64;
    }
    (h.digest(), elements)
}

/// Copies the elements `range` of the flat state out as little-endian bytes.
fn copy_out(state: &TrainState, range: Range<usize>, out: &mut Vec<u8>) {
    let mut offset = 0;
    for t in state.tensors() {
        let span = offset..offset + t.data.len();
        let (lo, hi) = (range.start.max(span.start), range.end.min(span.end));
        if lo < hi {
            out.extend_from_slice(bytemuck::cast_slice(&t.data[lo - offset..hi - offset]));
        }
        offset = span.end;
    }
}

/// Writes little-endian `bytes` into the elements `range` of the flat state.
fn copy_in(state: &mut TrainState, range: Range<usize>, bytes: &[u8]) {
    let mut offset = 0;
    let tensors = state.params.iter_mut().chain(state.optimizer.slots_mut());
    for t in tensors {
        let span = offset..offset + t.data.len();
        let (lo, hi) = (range.start.max(span.start), range.end.min(span.end));
        if lo < hi {
            let src = &bytes[4 * (lo - range.start)..4 * (hi - range.start)];
            for (d, s) in t.data[lo - offset..hi - offset].iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes(s.try_into().expect("4 bytes"));
            }
        }
        offset = span.end;
    }
}

/// Serves fetches of the state held, until the process ends.
fn spawn_server(
    port: &mut Port,
    held: Arc<RwLock<Held>>,
    layout: (u64, u64),
    faults: ProcessFaults,
    id: WorkerId,
) -> Result<(), TrainError> {
    let transfers = port.transfers().ok_or_else(|| CommError::Setup("the port's transfers are taken".into()))?;
    std::thread::spawn(move || {
        while let Ok((peer, stream)) = transfers.recv() {
            let (held, faults) = (Arc::clone(&held), faults.clone());
            std::thread::spawn(move || {
                let mut served = 0u64;
                comm::transfer::serve(stream, Duration::from_secs(60), &mut |want, range, out| {
                    let h = lock_read(&held);
                    if (want.layout, want.elements) != layout {
                        return Err("the state's layout differs (another model or optimizer)".into());
                    }
                    // A source reported its fingerprint, so it is known; a state whose
                    // fingerprint is not (it moved on) is not the one asked for.
                    let Some(fingerprint) = h.fingerprint else {
                        return Err(format!("holds step {} whose fingerprint is not known yet", h.state.step));
                    };
                    if (h.state.step, fingerprint) != (want.step, want.fingerprint) {
                        return Err(format!(
                            "holds step {} ({}), not step {} ({})",
                            h.state.step,
                            repro::fingerprint::hex(fingerprint),
                            want.step,
                            repro::fingerprint::hex(want.fingerprint)
                        ));
                    }
                    if served == 1 {
                        // The `transfer` phase: after the first chunk went out.
                        faults.reach(At { step: want.step, rank: id as usize }, Phase::Transfer);
                    }
                    served += 1;
                    copy_out(&h.state, range, out);
                    Ok(h.state.optimizer.updates())
                });
                tracing::debug!(peer, chunks = served, "a fetch ended");
            });
        }
    });
    Ok(())
}

/// Runs worker `d.rank` (its slot), process `incarnation`, of an elastic job.
pub(crate) fn run(
    config: &TrainConfig,
    d: &DistConfig,
    incarnation: u64,
    on_event: &mut dyn FnMut(Event),
) -> Result<(Summary, TrainState), TrainError> {
    if config.checkpoint.is_some() || config.resume.is_some() {
        return Err(ConfigError::Invalid(
            "an elastic job recovers from its live replicas: it neither writes nor resumes checkpoints".into(),
        )
        .into());
    }
    let crate::config::Engine::Steadfast { rendezvous, secret, bind } = &d.engine else {
        return Err(ConfigError::Invalid(
            "an elastic job runs on Steadfast's engine: MPI ends a job when a rank fails".into(),
        )
        .into());
    };
    let crate::config::Rendezvous::Coordinator(coordinator) = rendezvous else {
        return Err(ConfigError::Invalid(
            "an elastic job's membership is kept by its coordinator (--coordinator), not in etcd".into(),
        )
        .into());
    };
    let (coordinator, bind) = (*coordinator, *bind);
    let id = d.rank as WorkerId;
    let prepared = Prepared::load(config)?;
    let (state, mut engine) = prepared.start(config);
    let parameters = state.parameters();
    let layout = layout_of(&state);
    let fingerprint = state.fingerprint();
    let held = Arc::new(RwLock::new(Held { state, fingerprint: Some(fingerprint) }));
    let faults = ProcessFaults::new(config.faults.clone(), Instant::now()).for_incarnation(incarnation);
    let mut metrics = MetricsFile::create(config.out_dir.as_ref().filter(|_| id == 0), incarnation > 0)?;

    let listener =
        TcpListener::bind((bind, 0)).map_err(|e| CommError::Setup(format!("cannot listen on {bind}: {e}")))?;
    let mut port = Port::open(listener, secret, id)?;
    spawn_server(&mut port, Arc::clone(&held), layout, faults.clone(), id)?;
    // The worker's own clocks: how often it reports, and how long it waits for ballots.
    let timing = Timing { vote_timeout: d.timeout, ..Timing::default() };
    let current = Current::default();
    let interrupt = {
        let current = current.clone();
        Box::new(move |m: &Msg| {
            let Some((epoch, mesh)) = current.get() else { return };
            match m {
                Msg::Reconfigure { epoch: e } if *e >= epoch => mesh.abort(format!("the coordinator ended epoch {e}")),
                Msg::Stop { reason } => mesh.abort(format!("the coordinator stopped the job: {reason}")),
                _ => {}
            }
        })
    };
    let hello = Hello { incarnation, addr: port.addr() };
    let deadline = Instant::now() + d.timeout.max(Duration::from_secs(30));
    let (link, incoming) = Link::connect(coordinator, secret, id, hello, timing.heartbeat, deadline, interrupt)?;
    let mut hooks = LiveFaults::new(config.inject.iter().cloned()).with_process(faults);
    {
        let (current, sever) = (current.clone(), link.severer());
        hooks.process_mut().on_cut(Arc::new(move || {
            sever();
            if let Some((_, mesh)) = current.get() {
                mesh.abort("this worker's links were cut (fault injection)".into());
            }
        }));
    }
    on_event(Event::Started { steps: config.steps, parameters });
    metrics.write(json!({"kind": "process", "worker": id, "incarnation": incarnation}))?;

    let tcp = TcpConfig {
        secret: secret.clone(),
        max_frame: comm::frame::DEFAULT_MAX_FRAME,
        connect_timeout: d.timeout,
        write_timeout: d.timeout,
        abort_grace: Duration::ZERO,
    };
    let (mut worker, first) = Worker::new((id, incarnation), config.steps, (0, fingerprint), timing, Instant::now());
    // The rollback baseline: a copy of the state every `copy_every` steps.
    let mut copy = MemoryCopy::new(d.copy_every);
    copy.keep(&mut worker, 0, &held);
    let mut queue: VecDeque<Action> = first.into();
    let mut book: BTreeMap<WorkerId, SocketAddr> = BTreeMap::new();
    let mut micro = Vec::new();
    let mut work = engine.buffer();
    let mut sum = engine.buffer();
    // The step whose sum `sum` holds.
    let mut sum_step: Option<u64> = None;
    let mut voted: Option<(u64, u64)> = None;
    let mut reducer = comm::collective::Reducer::default();
    let (mut train_time, mut optimizer_time) = (Duration::ZERO, Duration::ZERO);
    let mut last_loss = f32::NAN;
    let mut last_eval = None;
    let mut step_started = Instant::now();
    let mut timeline = Timeline::new(&worker);
    let outcome = loop {
        timeline.observe(&worker, &mut metrics)?;
        let Some(action) = queue.pop_front() else {
            let now = Instant::now();
            match incoming.recv_timeout(timing.heartbeat / 2) {
                Ok(Incoming::Msg(m)) => {
                    if let Msg::Reconfigure { epoch } = m {
                        timeline.why.get_or_insert_with(|| format!("the coordinator ended epoch {epoch}"));
                    }
                    queue.extend(worker.on_message(now, Node::Coordinator, m))
                }
                Ok(Incoming::Book(b)) => book.extend(b),
                Err(RecvTimeoutError::Timeout) => queue.extend(worker.tick(now)),
                // The link was severed for good (a `cut` fault): only the clock is left.
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(timing.heartbeat / 2);
                    queue.extend(worker.tick(Instant::now()));
                }
            }
            continue;
        };
        match action {
            Action::Send { to: Node::Coordinator, msg } => link.report(&msg),
            Action::Send { to: Node::Worker(_), msg: Msg::Ballot { epoch, step, ok, digest } } => {
                if voted == Some((epoch, step)) {
                    continue;
                }
                voted = Some((epoch, step));
                let now = Instant::now();
                let Some((e, mesh)) = current.get().filter(|(e, _)| *e == epoch) else { continue };
                let members = worker.quorum().map(|q| q.members.clone()).unwrap_or_default();
                match comm::collective::all_gather_words(&*mesh, &[u64::from(ok), digest], d.timeout) {
                    Ok(all) => {
                        for (r, words) in all.iter().enumerate() {
                            let Some(&peer) = members.get(r).filter(|&&p| p != id) else { continue };
                            let ballot = Msg::Ballot { epoch: e, step, ok: words[0] == 1, digest: words[1] };
                            queue.extend(worker.on_message(now, Node::Worker(peer), ballot));
                        }
                    }
                    Err(err) => {
                        tracing::warn!(epoch, step, "the vote failed: {err}");
                        timeline.why = Some(format!("the vote failed: {err}"));
                        let other = members.iter().copied().find(|&m| m != id).unwrap_or(id);
                        queue.extend(worker.on_peer_lost(now, other));
                    }
                }
            }
            Action::Send { .. } => {}
            Action::Compute { epoch, step, rank, members } => {
                step_started = Instant::now();
                let at = At { step, rank: id as usize };
                if let Some(changed) = check_at_rest(&held, &mut hooks, at, d.on_divergence)? {
                    report_injections(&mut metrics, hooks.take_flips())?;
                    record_changed(&mut metrics, (id, step), "at rest", changed)?;
                    queue.extend(worker.on_corrupted(Instant::now(), changed.1));
                    continue;
                }
                let reduced = (|| -> Result<Result<SumCheck, String>, TrainError> {
                    // The epoch's first step builds its mesh.
                    let mesh = match current.get() {
                        Some((e, m)) if e == epoch => m,
                        _ => match port.mesh(epoch, &members, &book, &tcp) {
                            Ok(m) => current.set(epoch, m),
                            Err(e) => return Ok(Err(format!("cannot build the epoch's mesh: {e}"))),
                        },
                    };
                    {
                        let h = lock_read(&held);
                        engine.compute(&h.state, rank, members.len(), &mut hooks, &mut micro)?;
                    }
                    hooks.reached(at, Phase::Allreduce);
                    if let Err(e) = reducer.sum_parts(&*mesh, &micro, work.as_mut_slice(), config.reduce, d.timeout) {
                        return Ok(Err(format!("the all-reduce failed: {e}")));
                    }
                    hooks.after_reduce(at, &mut work)?;
                    report_injections(&mut metrics, hooks.take_flips())?;
                    Ok(Ok(SumCheck::of(&work)))
                })()?;
                let now = Instant::now();
                match reduced {
                    Ok(check) => {
                        std::mem::swap(&mut work, &mut sum);
                        sum_step = Some(step);
                        hooks.reached(at, Phase::Vote);
                        queue.extend(worker.on_reduced(now, epoch, step, Some((check.finite, check.digest))));
                    }
                    Err(why) => {
                        tracing::warn!(epoch, step, "{why}");
                        timeline.why = Some(why);
                        queue.extend(worker.on_reduced(now, epoch, step, None));
                    }
                }
            }
            Action::Apply { step } => {
                if sum_step != Some(step) {
                    return Err(CommError::Setup(format!(
                        "the protocol applies the sum of step {step}, but the sum held is of step {sum_step:?}"
                    ))
                    .into());
                }
                let at = At { step, rank: id as usize };
                let pair = worker.quorum().is_some_and(|q| q.members.len() == 2);
                let repair = d.on_divergence == crate::config::OnDivergence::Repair;
                let fingerprint = {
                    let mut h = lock_write(&held);
                    hooks.before_update(at, &mut h.state)?;
                    report_injections(&mut metrics, hooks.take_flips())?;
                    // Two replicas that disagree after an update have no majority to name
                    // the bad one. So in an epoch of two, each checks, just before the
                    // update, that its state is still the one it committed: a replica
                    // whose state changed names itself.
                    if pair
                        && repair
                        && let Some(changed) = h.changed_since_commit()
                    {
                        record_changed(&mut metrics, (id, step), "before the update", changed)?;
                        sum_step = None;
                        queue.extend(worker.on_corrupted(Instant::now(), changed.1));
                        continue;
                    }
                    hooks.reached(at, Phase::Update);
                    let update = Instant::now();
                    h.state.apply(&sum);
                    optimizer_time += update.elapsed();
                    // Checking the state at rest needs its fingerprint after every update;
                    // otherwise the protocol asks for it when it needs it.
                    h.fingerprint = repair.then(|| h.state.fingerprint());
                    h.fingerprint
                };
                sum_step = None;
                train_time += step_started.elapsed();
                let done = step + 1;
                last_loss = sum.loss();
                metrics.write(json!({"kind": "train", "step": done, "loss": last_loss}))?;
                on_event(Event::Step { step: done, loss: last_loss });
                if config.eval_every > 0 && done % config.eval_every == 0 && done < config.steps {
                    let report =
                        evaluate_state(&mut engine, &prepared.data, &lock_read(&held).state, config.eval_limit);
                    write_eval(&mut metrics, &report, prepared.unigram_perplexity)?;
                    on_event(Event::Eval(&report));
                    last_eval = Some(report);
                }
                step_started = Instant::now();
                copy.keep(&mut worker, done, &held);
                let mut next = worker.on_applied(Instant::now(), step, fingerprint);
                if d.checks_after(done, config.steps) {
                    let members = worker.quorum().map(|q| q.members.clone()).unwrap_or_default();
                    let fingerprint = lock_write(&held).fingerprint();
                    let verdict = match current.get() {
                        Some((_, mesh)) => compare_replicas(&mesh, &members, fingerprint, d.timeout),
                        None => Verdict::Agree,
                    };
                    if verdict != Verdict::Agree {
                        // Leave the epoch: the next quorum's majority decides who fetches.
                        next.retain(|a| !matches!(a, Action::Compute { .. }));
                    }
                    match verdict {
                        Verdict::Agree => {}
                        Verdict::Lost(other) => {
                            timeline.why = Some("the replica check failed".into());
                            next.extend(worker.on_peer_lost(Instant::now(), other))
                        }
                        Verdict::Diverged { outvoted, majority } => {
                            metrics.write(json!({
                                "kind": "divergence", "step": done, "workers": outvoted, "found": "replica check",
                            }))?;
                            if d.on_divergence == crate::config::OnDivergence::Stop || !majority {
                                // Every member holds the verdict before any exits: a member
                                // that closed its connections early could make a peer's
                                // comparison fail, and that peer take it for a lost worker.
                                if let Some((_, mesh)) = current.get() {
                                    let _ = comm::collective::barrier(&*mesh, d.timeout);
                                }
                                let ranks = outvoted.iter().map(|&w| w as usize).collect();
                                return Err(TrainError::ReplicasDiverged { step: done, ranks });
                            }
                            tracing::error!(step = done, "workers {outvoted:?} hold another state: repairing them");
                            if outvoted.contains(&id) {
                                next.extend(worker.on_corrupted(Instant::now(), fingerprint));
                            } else {
                                next.extend(worker.on_peer_lost(Instant::now(), outvoted[0]));
                            }
                        }
                    }
                }
                queue.extend(next);
            }
            Action::Fetch { epoch, step, fingerprint, sources } => {
                let got = fetch(
                    &port,
                    &held,
                    &book,
                    &sources,
                    Want { step, fingerprint, layout: layout.0, elements: layout.1 },
                    d.timeout,
                    &hooks,
                    id,
                );
                sum_step = None;
                let got = match got {
                    Ok(stats) => {
                        tracing::info!(
                            step,
                            bytes = stats.bytes,
                            seconds = stats.elapsed.as_secs_f64(),
                            chunks = ?stats.chunks,
                            retried = stats.retried,
                            "fetched the state"
                        );
                        metrics.write(json!({
                            "kind": "fetch", "step": step, "bytes": stats.bytes,
                            "seconds": stats.elapsed.as_secs_f64(), "sources": sources, "retried": stats.retried,
                        }))?;
                        copy.keep(&mut worker, step, &held);
                        Some((step, fingerprint))
                    }
                    Err((e, holds)) => {
                        tracing::warn!(step, "cannot fetch the state: {e}");
                        holds
                    }
                };
                queue.extend(worker.on_fetched(Instant::now(), epoch, got));
            }
            Action::Hash => {
                let fingerprint = lock_write(&held).fingerprint();
                // Its answer comes before anything queued after the question.
                for a in worker.on_hashed(Instant::now(), fingerprint).into_iter().rev() {
                    queue.push_front(a);
                }
            }
            Action::Restore { step, fingerprint } => {
                let mut h = lock_write(&held);
                copy.restore(&mut h, (step, fingerprint))?;
                sum_step = None;
                tracing::warn!(step, "went back to the copy of step {step}");
                metrics.write(json!({"kind": "restore", "step": step, "worker": id}))?;
            }
            Action::Finished => break Ok(()),
            Action::Stopped { reason } => break Err(TrainError::JobStopped(reason)),
        }
    };
    // The last report (finished or stopped) goes out before the link closes.
    link.close();
    outcome?;
    if d.copy_every.is_some() {
        tracing::info!(seconds = copy.spent.as_secs_f64(), "time spent copying the state in memory");
    }
    let state = Arc::try_unwrap(held)
        .map_or_else(|h| lock_read(&h).state.clone(), |h| h.into_inner().unwrap_or_else(|e| e.into_inner()).state);
    let last_eval = match last_eval.filter(|e| e.step == state.step) {
        Some(e) => e,
        None => {
            let report = evaluate_state(&mut engine, &prepared.data, &state, config.eval_limit);
            write_eval(&mut metrics, &report, prepared.unigram_perplexity)?;
            on_event(Event::Eval(&report));
            report
        }
    };
    let summary = Summary {
        steps: config.steps,
        final_loss: last_loss,
        eval: last_eval,
        unigram_perplexity: prepared.unigram_perplexity,
        fingerprint: state.fingerprint(),
        kernels: engine.kernels(),
        train_time,
        optimizer_time,
        parameters,
        resumed_from: 0,
        checkpoints: ckpt::WriterStats::default(),
        checkpoints_deferred: 0,
    };
    write_summary(&mut metrics, &summary)?;
    Ok((summary, state))
}

/// Worker 0's record of the job's epochs in `metrics.jsonl`, for `steadfast report`: the
/// epochs it leaves (a failure seen, and why, when this worker knows), the quorums it
/// joins (who, from which step, who holds the state), and each epoch's first step (the
/// end of a recovery).
struct Timeline {
    epoch: u64,
    phase: Stage,
    /// Why the current epoch is ending, as the shell saw it.
    why: Option<String>,
}

impl Timeline {
    fn new(worker: &Worker) -> Timeline {
        let s = worker.status();
        Timeline { epoch: s.epoch, phase: s.phase, why: None }
    }

    /// Writes what changed since the last call.
    fn observe(&mut self, worker: &Worker, metrics: &mut MetricsFile) -> Result<(), TrainError> {
        let s = worker.status();
        if (s.epoch, s.phase) == (self.epoch, self.phase) {
            return Ok(());
        }
        let member = |p: Stage| matches!(p, Stage::Syncing | Stage::Synced | Stage::Stepping);
        // Leaving the epoch for `Done` (the last step applied) or `Finished` is no failure.
        if member(self.phase) && !member(s.phase) && matches!(s.phase, Stage::Idle | Stage::Stopped) {
            let why = self.why.take();
            metrics.write(json!({"kind": "epoch_ended", "epoch": self.epoch, "step": s.step, "why": why}))?;
        }
        if let Some(q) = worker.quorum().filter(|q| q.epoch == s.epoch && s.epoch != self.epoch) {
            self.why = None;
            metrics.write(json!({
                "kind": "quorum", "epoch": q.epoch, "members": q.members, "step": q.step,
                "sources": q.sources, "synced": s.phase == Stage::Synced,
            }))?;
        }
        if s.phase == Stage::Stepping && self.phase != Stage::Stepping {
            metrics.write(json!({"kind": "epoch_started", "epoch": s.epoch, "step": s.step}))?;
        }
        (self.epoch, self.phase) = (s.epoch, s.phase);
        Ok(())
    }
}

/// The in-memory copy of the rollback baseline (`--copy-every`): what SWIFT's recovery
/// from live replicas does without, at the price of one more model-sized buffer and a
/// copy every few steps.
struct MemoryCopy {
    every: Option<u64>,
    state: Option<Held>,
    /// Time spent copying.
    spent: Duration,
}

impl MemoryCopy {
    fn new(every: Option<u64>) -> MemoryCopy {
        MemoryCopy { every, state: None, spent: Duration::ZERO }
    }

    /// Copies `held`, which holds the state of `step`, when `step` is a multiple of the
    /// interval, and tells `worker`; locks `held` only then.
    fn keep(&mut self, worker: &mut Worker, step: u64, held: &RwLock<Held>) {
        let Some(every) = self.every else { return };
        if !step.is_multiple_of(every) {
            return;
        }
        let held = &mut *lock_write(held);
        let started = Instant::now();
        let fingerprint = held.fingerprint();
        match &mut self.state {
            Some(c) => {
                c.state.clone_from(&held.state);
                c.fingerprint = held.fingerprint;
            }
            None => self.state = Some(Held { state: held.state.clone(), fingerprint: held.fingerprint }),
        }
        self.spent += started.elapsed();
        worker.keep_copy(held.state.step, fingerprint);
    }

    /// Puts the copy of `(step, fingerprint)` back into `held`.
    fn restore(&self, held: &mut Held, want: (u64, u64)) -> Result<(), TrainError> {
        match &self.state {
            Some(c) if (c.state.step, c.fingerprint) == (want.0, Some(want.1)) => {
                held.state.clone_from(&c.state);
                held.fingerprint = c.fingerprint;
                Ok(())
            }
            _ => {
                Err(CommError::Setup(format!("the protocol restores a copy of step {} that is not kept", want.0))
                    .into())
            }
        }
    }
}

/// Fetches `want` from `sources` into the state held, checking it against the
/// fingerprint. A fetch that fails after writing part of the state says what the state
/// now is, `(step, fingerprint)`, with its error.
#[allow(clippy::too_many_arguments)]
fn fetch(
    port: &Port,
    held: &RwLock<Held>,
    book: &BTreeMap<WorkerId, SocketAddr>,
    sources: &[WorkerId],
    want: Want,
    timeout: Duration,
    hooks: &LiveFaults,
    id: WorkerId,
) -> Result<comm::transfer::Fetched, (CommError, Option<(u64, u64)>)> {
    let sources: Vec<(WorkerId, SocketAddr)> = sources.iter().filter_map(|s| book.get(s).map(|a| (*s, *a))).collect();
    let deadline = Instant::now() + timeout;
    let dialer = port.dialer();
    let connect = |peer: WorkerId, addr: SocketAddr| dialer.transfer(peer, addr, deadline);
    let mut h = lock_write(held);
    let mut chunks = 0u64;
    let fetched = comm::transfer::fetch(&sources, &connect, &want, timeout, &mut |range, bytes| {
        copy_in(&mut h.state, range, bytes);
        chunks += 1;
        if chunks == 1 {
            hooks.process().reach(At { step: want.step, rank: id as usize }, Phase::Transfer);
        }
    });
    let fetched = match fetched {
        Ok(f) => f,
        Err(e) if chunks == 0 => return Err((e, None)),
        Err(e) => {
            h.fingerprint = None;
            return Err((e, Some((h.state.step, h.fingerprint()))));
        }
    };
    h.state.step = want.step;
    h.state.optimizer.set_updates(fetched.updates);
    h.fingerprint = None;
    let found = h.fingerprint();
    if found != want.fingerprint {
        let e = CommError::Setup(format!(
            "the fetched state has fingerprint {}, not the sources' {}",
            repro::fingerprint::hex(found),
            repro::fingerprint::hex(want.fingerprint)
        ));
        return Err((e, Some((h.state.step, found))));
    }
    Ok(fetched)
}

/// What the replica check after an update found.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Every member holds the same state.
    Agree,
    /// A member was lost during the check.
    Lost(WorkerId),
    /// The members `outvoted` hold another state than the others; `majority` says whether
    /// the others are a strict majority (otherwise nobody can tell who is right, and every
    /// member is in `outvoted`).
    Diverged { outvoted: Vec<WorkerId>, majority: bool },
}

/// Compares this member's `fingerprint` with every other member's.
fn compare_replicas(mesh: &TcpMesh, members: &[WorkerId], fingerprint: u64, timeout: Duration) -> Verdict {
    match comm::collective::all_gather_u64(mesh, fingerprint, timeout) {
        Ok(all) => match comm::majority::compare(&all) {
            comm::majority::Comparison::Agree => Verdict::Agree,
            comm::majority::Comparison::Diverged { outvoted, majority } => {
                Verdict::Diverged { outvoted: outvoted.iter().map(|&r| members[r]).collect(), majority }
            }
        },
        Err(e) => {
            tracing::warn!("the replica check failed: {e}");
            let me = mesh.rank();
            Verdict::Lost(members.iter().enumerate().find(|(r, _)| *r != me).map_or(0, |(_, &m)| m))
        }
    }
}

/// Before a step: the hooks that strike the state at rest fire, and, when the job repairs
/// divergence, the state is checked against the fingerprint it had after the last update.
/// Returns `(expected, found)` when it changed.
fn check_at_rest(
    held: &RwLock<Held>,
    hooks: &mut LiveFaults,
    at: At,
    policy: crate::config::OnDivergence,
) -> Result<Option<(u64, u64)>, TrainError> {
    let mut h = lock_write(held);
    hooks.after_load(at, &mut h.state)?;
    if policy != crate::config::OnDivergence::Repair {
        return Ok(None);
    }
    Ok(h.changed_since_commit())
}
