//! The elastic worker's loop: the protocol's actions carried out on the state, the engine
//! and the sockets. The step's own operations run through the step driver, with
//! [`ElasticRunner`] as its runner; what a step found goes back to the protocol from here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use comm::control::{Incoming, Link};
use comm::protocol::{Action, Event, Msg, Node, ReplayFailure, ReplayGroup, Saved, Worker, WorkerId, WorkerState};
use comm::transfer::Want;
use comm::transport::CommError;
use serde_json::json;

use super::epoch::{Asked, ElasticRunner, Found};
use super::held::{self, MemoryCopy, SharedState, lock_read, lock_write};
use super::timeline::Timeline;
use crate::driver::{Driver, Stop};
use crate::error::TrainError;
use crate::pipeline;
use crate::schedule::{self, Op};
use crate::step::{Engine, LiveFaults, TrainState};
use crate::trainer::{EvalReport, Prepared, Progress, Summary, evaluate_state, write_summary};

/// The worker's loop: the protocol's actions, carried out on the state, the engine and
/// the sockets.
pub(super) struct Shell<'c, 'e, 'a> {
    pub(super) engine: Engine<'a>,
    pub(super) driver: Driver,
    pub(super) worker: Worker,
    pub(super) queue: VecDeque<Action>,
    pub(super) held: Arc<RwLock<SharedState>>,
    pub(super) hooks: LiveFaults,
    /// The step of the current place: the data-parallel schedule of `(rank, world)`, or
    /// a pipeline stage's of `(epoch, rank)`.
    pub(super) ops: Vec<Op>,
    pub(super) placed: Option<(u64, usize)>,
    /// The state's layout digest and element count, which a fetch asks for.
    pub(super) layout: (u64, u64),
    /// Set by the server of fetches when it found the state changed at rest.
    pub(super) served_changed: Arc<AtomicBool>,
    pub(super) copy: MemoryCopy,
    pub(super) last_eval: Option<EvalReport>,
    pub(super) timeline: Timeline,
    pub(super) side: ElasticRunner<'c, 'e>,
}

impl Shell<'_, '_, '_> {
    /// Carries out the protocol's actions until it finishes or stops the job.
    pub(super) fn run(
        &mut self,
        incoming: &Receiver<Incoming>,
        link: &Link,
        heartbeat: Duration,
        prepared: &Prepared,
    ) -> Result<(), TrainError> {
        loop {
            // A coordinator lost for longer than its bounds allow ends the wait, whatever
            // this worker is doing (a job without its coordinator can neither change its
            // members nor finish).
            if let Some(reason) = link.gave_up() {
                return Err(TrainError::CoordinatorLost(reason));
            }
            if let Some(note) = self.timeline.observe(&self.worker, &mut self.side.ledger.metrics)? {
                (self.side.ledger.on_event)(Progress::Note(note));
            }
            if self.served_changed.swap(false, Ordering::Relaxed) {
                let fingerprint = lock_write(&self.held).fingerprint_now();
                tracing::error!(
                    "a fetch found this worker's state changed since its commit: repairing it from the replicas"
                );
                self.side
                    .ledger
                    .metrics
                    .write(json!({"kind": "divergence", "worker": self.side.id, "found": "serving a fetch"}))?;
                self.queue.extend(self.worker.step(Instant::now(), Event::Changed { fingerprint }));
            }
            let Some(action) = self.queue.pop_front() else {
                self.listen(incoming, heartbeat);
                continue;
            };
            match action {
                Action::Send { to: Node::Coordinator, msg } => link.report(&msg),
                Action::Vote { epoch, step, ok, digest, saved, .. } => self.vote((epoch, step), (ok, digest, saved)),
                Action::Send { .. } => {}
                Action::Compute { epoch, step, rank, members, verify } => {
                    self.compute(epoch, step, (rank, members), verify)?
                }
                Action::Apply { step, verify, hash, compare, agreed } => {
                    self.apply(step, Asked { at_rest: None, before_update: verify, hash, compare }, agreed, prepared)?
                }
                Action::Fetch { epoch, step, fingerprint, sources } => {
                    self.fetch(epoch, step, fingerprint, &sources)?
                }
                Action::Load { epoch, step } => self.load(epoch, step, prepared)?,
                Action::Replay { epoch, to, group } => self.replay(epoch, to, &group, prepared)?,
                Action::Hash => {
                    let fingerprint = lock_write(&self.held).fingerprint();
                    // Its answer comes before anything queued after the question.
                    for a in self.worker.step(Instant::now(), Event::Hashed { fingerprint }).into_iter().rev() {
                        self.queue.push_front(a);
                    }
                }
                Action::Restore { step, fingerprint } => {
                    self.copy.restore(&mut lock_write(&self.held), (step, fingerprint))?;
                    self.side.sum_step = None;
                    tracing::warn!(step, "went back to the copy of step {step}");
                    self.side.ledger.metrics.write(json!({"kind": "restore", "step": step, "worker": self.side.id}))?;
                }
                Action::Repair { step, outvoted } => {
                    tracing::error!(step, "workers {outvoted:?} hold another state: repairing them");
                    self.side.ledger.metrics.write(json!({
                        "kind": "divergence", "step": step, "workers": outvoted, "found": "replica check",
                    }))?;
                }
                Action::Diverged { step, outvoted } => return Err(self.diverged(step, &outvoted)),
                Action::Finished => return Ok(()),
                Action::Stopped { reason } if reason == comm::control::JOINED_AFTER_THE_END => {
                    return Err(TrainError::JoinedAfterTheEnd);
                }
                Action::Stopped { reason } => return Err(TrainError::JobStopped(reason)),
            }
        }
    }

    /// Waits for the coordinator's next message, or for the next tick of the clocks. An
    /// idle pipeline worker says which of its stage's checkpoints it can load first.
    fn listen(&mut self, incoming: &Receiver<Incoming>, heartbeat: Duration) {
        if self.side.pipe.is_some() && self.worker.status().phase == WorkerState::Idle {
            let steps = super::stages::saved_steps(self.side.config);
            self.queue.extend(self.worker.step(Instant::now(), Event::Checkpoints { steps }));
        }
        let now = Instant::now();
        match incoming.recv_timeout(heartbeat / 2) {
            Ok(Incoming::Msg(m)) => {
                if let Msg::Reconfigure { epoch } = m {
                    self.timeline.why.get_or_insert_with(|| {
                        format!("the coordinator ended epoch {}", comm::control::epoch_text(epoch))
                    });
                }
                self.queue.extend(self.worker.step(now, Event::Message { from: Node::Coordinator, msg: m }))
            }
            Ok(Incoming::Book(b)) => self.side.book.extend(b),
            Err(RecvTimeoutError::Timeout) => self.queue.extend(self.worker.step(now, Event::Tick)),
            // The link was severed for good (a `cut` fault): only the clock is left.
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(heartbeat / 2);
                self.queue.extend(self.worker.step(Instant::now(), Event::Tick));
            }
        }
    }

    /// Casts this worker's ballot: one all-gather over the epoch's mesh carries every
    /// member's to every other (`to`, the other members in rank order), and each reaches
    /// the protocol as a message.
    fn vote(&mut self, (epoch, step): (u64, u64), (ok, digest, saved): (bool, u64, Saved)) {
        let now = Instant::now();
        let Some((_, mesh)) = self.side.current.get().filter(|(e, _)| *e == epoch) else { return };
        let members = self.worker.quorum().map(|q| q.members.clone()).unwrap_or_default();
        let ballot = comm::member::Ballot { ok, digest, saved };
        let timeout = self.side.d.job.timeout;
        match comm::member::cast_ballots(&mesh, (&members, self.side.id), (epoch, step), ballot, timeout) {
            Ok(ballots) => {
                for (peer, msg) in ballots {
                    self.queue.extend(self.worker.step(now, Event::Message { from: Node::Worker(peer), msg }));
                }
            }
            Err(err) => {
                tracing::warn!(epoch = %comm::control::epoch_text(epoch), step, "the vote failed: {err}");
                self.timeline.why = Some(format!("the vote failed: {err}"));
                self.queue.extend(self.worker.step(now, Event::VoteFailed { epoch }));
            }
        }
    }

    /// Runs the schedule's operations from `from` on the state held.
    fn step_ops(&mut self, from: usize) -> Result<Stop, TrainError> {
        let mut guard = lock_write(&self.held);
        let h = &mut *guard;
        self.side.known = h.fingerprint;
        let stop = self.driver.run(&self.ops, from, &mut self.engine, &mut h.state, &mut self.hooks, &mut self.side);
        h.fingerprint = self.side.known;
        stop
    }

    /// The protocol's `Compute`: the step up to its vote, on the epoch's mesh (after the
    /// check at rest it asked for, if any).
    fn compute(
        &mut self,
        epoch: u64,
        step: u64,
        (rank, members): (usize, Vec<WorkerId>),
        verify: Option<u64>,
    ) -> Result<(), TrainError> {
        self.side.ledger.started = Instant::now();
        let micro_batches = self.engine.sampler().micro_batches();
        match self.side.pipe.as_mut() {
            // A pipeline's layout is the epoch's: which worker computes which place.
            Some(p) if self.placed != Some((epoch, rank)) => {
                p.enter(&members)?;
                self.ops = p.ops(self.side.config, rank, micro_batches);
                self.placed = Some((epoch, rank));
            }
            Some(_) => {}
            None if self.placed != Some((rank as u64, members.len())) => {
                self.ops = schedule::data_parallel(micro_batches, rank, members.len());
                self.placed = Some((rank as u64, members.len()));
            }
            None => {}
        }
        (self.side.epoch, self.side.members) = (epoch, members);
        self.side.asked = Asked { at_rest: verify, ..Asked::default() };
        // What a pipeline stage logged of a step that did not end is sent again.
        if let Some(p) = self.side.pipe.as_mut() {
            p.staged.abandon_logs();
        }
        let stop = match self.step_ops(0) {
            Ok(stop) => stop,
            // A pipeline stage's boundary tensors cross the epoch's mesh too: a peer lost
            // there fails the step as a lost member fails the all-reduce.
            Err(TrainError::Comm(e)) if self.side.pipe.is_some() => {
                self.side.found = Some(Found::Failed(format!("a boundary tensor did not cross: {e}")));
                Stop::Ended { at: schedule::Op::Load }
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        let event = match (stop, self.side.found.take()) {
            (Stop::Paused { .. }, Some(Found::Reduced(check))) => {
                self.side.sum_step = Some(step);
                // Where this member's part of the epoch's checkpoints stands goes with its
                // ballot.
                let part = self.side.part();
                let saved = self.side.saving.as_mut().map_or_else(Saved::default, |s| s.ballot(part));
                Event::Computed { epoch, step, sum: Some((check.finite, check.digest)), saved }
            }
            (Stop::Ended { .. }, Some(Found::Corrupted { changed })) => Event::Changed { fingerprint: changed.1 },
            (Stop::Ended { .. }, Some(Found::Failed(why))) => {
                tracing::warn!(epoch = %comm::control::epoch_text(epoch), step, "{why}");
                self.timeline.why = Some(why);
                Event::Computed { epoch, step, sum: None, saved: Saved::default() }
            }
            (stop, found) => return Err(unexpected(stop, found)),
        };
        self.queue.extend(self.worker.step(now, event));
        Ok(())
    }

    /// The protocol's `Apply`: the step from its update on, with the sum held and the
    /// checks the action asked for; the checkpoints hear what the vote agreed on first.
    fn apply(&mut self, step: u64, asked: Asked, agreed: Option<Saved>, prepared: &Prepared) -> Result<(), TrainError> {
        if self.side.sum_step != Some(step) {
            return Err(CommError::Setup(format!(
                "the protocol applies the sum of step {step}, but the sum held is of step {:?}",
                self.side.sum_step
            ))
            .into());
        }
        if let (Some(agreed), Some(saving)) = (agreed, self.side.saving.as_mut()) {
            saving.heard(agreed);
            // Every stage's checkpoint of that step is durable: a pipeline stage's logs
            // older than the one before it go.
            if let Some(p) = self.side.pipe.as_mut()
                && agreed.durable > 0
            {
                p.staged.checkpointed(agreed.durable);
            }
        }
        let update = schedule::update_index(&self.ops).expect("a data-parallel step has an update");
        // The members of the epoch that applies: a worker that rolls forward applies in a
        // later epoch than the one it computed in.
        self.side.members = self.worker.quorum().map(|q| q.members.clone()).unwrap_or_default();
        self.side.asked = asked;
        let stop = self.step_ops(update)?;
        self.side.sum_step = None;
        let found = self.side.found.take();
        let prints = match (stop, found) {
            (Stop::Ended { .. }, Some(Found::Corrupted { changed })) => {
                let event = Event::Changed { fingerprint: changed.1 };
                self.queue.extend(self.worker.step(Instant::now(), event));
                return Ok(());
            }
            (Stop::Done, Some(Found::Checked(prints))) => Some(prints),
            (Stop::Done, None) => None,
            (stop, found) => return Err(unexpected(stop, found)),
        };
        let done = step + 1;
        let config = self.side.config;
        if config.eval_every > 0 && done.is_multiple_of(config.eval_every) && done < config.steps {
            match self.evaluate(prepared) {
                Ok(report) => {
                    self.side.ledger.evaluated(&report, prepared.unigram_perplexity)?;
                    self.last_eval = Some(report);
                }
                // (A pipeline's evaluation gathers the stages: a lost one ends the epoch
                // at its next collective, not here.)
                Err(TrainError::Comm(e)) => tracing::warn!(step = done, "no evaluation after step {done}: {e}"),
                Err(e) => return Err(e),
            }
        }
        self.side.ledger.started = Instant::now();
        self.copy.keep(&mut self.worker, done, &self.held);
        let event = match prints {
            Some(prints) => {
                if prints.is_none() {
                    self.timeline.why = Some("the replica check failed".into());
                }
                let fingerprint = lock_write(&self.held).fingerprint();
                Event::Compared { step, fingerprint, prints }
            }
            // (Known only when the action asked for a hash.)
            None => Event::Applied { step, fingerprint: self.side.known },
        };
        self.queue.extend(self.worker.step(Instant::now(), event));
        Ok(())
    }

    /// Scores the state held on the held-out split: a pipeline's collector gathers its
    /// replica's stages over the epoch's mesh and shares the result with every member.
    fn evaluate(&mut self, prepared: &Prepared) -> Result<EvalReport, TrainError> {
        let config = self.side.config;
        let guard = lock_read(&self.held);
        let Some(p) = self.side.pipe.as_mut() else {
            return Ok(evaluate_state(&mut self.engine, &prepared.data, &guard.state, config.eval_limit));
        };
        let (_, mesh) = self.side.current.get().ok_or_else(|| CommError::Setup("no epoch's mesh".into()))?;
        let (staged, timeout) = (&mut p.staged, self.side.d.job.timeout);
        let mine = if pipeline::gather(&*mesh, &staged.layout, &guard.state, &mut staged.whole, timeout)? {
            let report = evaluate_state(&mut self.engine, &prepared.data, &staged.whole, config.eval_limit);
            let loss = self.side.ledger.last_loss;
            Some(pipeline::Shared { report, fingerprint: staged.whole.fingerprint(), loss })
        } else {
            None
        };
        let shared = pipeline::share(&*mesh, &staged.layout, mine.as_ref(), timeout)?;
        let report = shared.report.clone();
        staged.shared = Some(shared);
        Ok(report)
    }

    /// The protocol's `Diverged`: every member holds the verdict before any exits (a
    /// member that closed its connections early could make a peer's comparison fail, and
    /// that peer take it for a lost worker); then the job ends with the error.
    fn diverged(&mut self, step: u64, outvoted: &[WorkerId]) -> TrainError {
        let record = json!({"kind": "divergence", "step": step, "workers": outvoted, "found": "replica check"});
        if let Err(e) = self.side.ledger.metrics.write(record) {
            tracing::warn!("cannot record the divergence: {e}");
        }
        if let Some((_, mesh)) = self.side.current.get() {
            let _ = comm::collective::barrier(&*mesh, self.side.d.job.timeout);
        }
        TrainError::ReplicasDiverged { step, ranks: outvoted.iter().map(|&w| w as usize).collect() }
    }

    /// The protocol's `Load`: the stage's checkpoint of `step` (a pipeline that lost a
    /// stage's state goes back to it).
    fn load(&mut self, epoch: u64, step: u64, prepared: &Prepared) -> Result<(), TrainError> {
        let pipe = self.side.pipe.as_ref().ok_or_else(|| CommError::Setup("only a pipeline stage loads".into()))?;
        let state = match pipe.load(self.side.config, prepared, step) {
            Ok(state) => {
                let mut guard = lock_write(&self.held);
                guard.state = state;
                let fingerprint = guard.fingerprint_now();
                drop(guard);
                tracing::warn!(step, "a stage's state was lost: this stage went back to its checkpoint of step {step}");
                self.side.ledger.metrics.write(json!({"kind": "load", "step": step, "worker": self.side.id}))?;
                Some((step, fingerprint))
            }
            Err(e) => {
                tracing::warn!(step, "cannot load this stage's checkpoint of step {step}: {e}");
                None
            }
        };
        self.side.sum_step = None;
        self.queue.extend(self.worker.step(Instant::now(), Event::Loaded { epoch, state }));
        Ok(())
    }

    /// The protocol's `Replay`: this worker's place of `group`, replayed to `to` with the
    /// group's other workers (a pipeline stage that lost every worker holding the newest
    /// state, and the stages replayed with it); a helper keeps its own state.
    fn replay(&mut self, epoch: u64, to: u64, group: &ReplayGroup, prepared: &Prepared) -> Result<(), TrainError> {
        let began = Instant::now();
        let outcome = self.replay_place(epoch, to, group, prepared);
        // The replay's mesh is done with: the epoch's own is built by its first step.
        self.side.current.clear();
        // A helper keeps its own state, and the sum it holds of it (as the protocol does).
        let own = self.side.pipe.as_ref().map(|p| p.stage());
        if group.place_of(self.side.id).map(|(stage, _)| stage) == own {
            self.side.sum_step = None;
        }
        let (id, from) = (self.side.id, group.from);
        let state = match outcome {
            Ok(Some(state)) => {
                let mut guard = lock_write(&self.held);
                guard.state = state;
                let fingerprint = guard.fingerprint_now();
                drop(guard);
                let seconds = began.elapsed().as_secs_f64();
                let stages = group.stages();
                let named = match stages.len() {
                    1 => format!("stage {}", stages.start),
                    _ => format!("stages {} to {}", stages.start, stages.end - 1),
                };
                let with = group.participants().len();
                tracing::warn!(
                    from,
                    to,
                    "a stage's state was lost: {named} replayed steps {from} to {to} in {seconds:.2} s on {with} \
                     worker(s)"
                );
                self.side.ledger.metrics.write(json!({
                    "kind": "replay", "from": from, "to": to, "worker": id, "seconds": seconds,
                    "stages": [stages.start, stages.end - 1], "workers": group.participants(),
                }))?;
                Ok((to, fingerprint))
            }
            Ok(None) => {
                let guard = lock_read(&self.held);
                tracing::info!(from, to, "helped replay a lost stage from step {from} to {to}");
                Ok((guard.state.step, guard.fingerprint.unwrap_or_else(|| guard.state.fingerprint())))
            }
            Err(why) => Err(why),
        };
        self.queue.extend(self.worker.step(Instant::now(), Event::Replayed { epoch, state }));
        Ok(())
    }

    /// The work of [`Shell::replay`]: the state replayed when this worker's stage is the
    /// one replayed, `None` after helping with another's, or why it was not done.
    fn replay_place(
        &mut self,
        epoch: u64,
        to: u64,
        group: &ReplayGroup,
        prepared: &Prepared,
    ) -> Result<Option<TrainState>, ReplayFailure> {
        let config = self.side.config;
        let Some(pipe) = self.side.pipe.as_ref() else { return Err(ReplayFailure::Impossible) };
        let id = self.side.id;
        let checked = pipe.check_replay(config, (group, id), to, self.engine.sampler().micro_batches());
        if let Err(ReplayFailure::Unlogged(mask)) = checked {
            let boundaries: Vec<u32> = (0..64).filter(|b| mask & (1 << b) != 0).collect();
            tracing::warn!(
                from = group.from,
                to,
                "stage {} cannot be replayed alone: the logs of boundaries {boundaries:?} are missing or cut short \
                 (the stages beside them replay with it)",
                group.place_of(id).map_or(0, |(s, _)| s)
            );
        }
        checked?;
        let everyone = group.participants();
        let intro = comm::port::Intro::Replay { epoch };
        let mesh = match self.side.port.mesh(intro, &everyone, &self.side.book, &self.side.tcp) {
            // Registered as the epoch's, so that a message that ends the epoch aborts it.
            Ok(mesh) => self.side.current.set(epoch, mesh),
            Err(e) => {
                tracing::warn!(from = group.from, to, "cannot meet the replay's other workers: {e}");
                return Err(ReplayFailure::Lost);
            }
        };
        match pipe.replay((config, prepared), (group, id), to, &*mesh) {
            Ok(state) => Ok((group.place_of(id).map(|(s, _)| s) == Some(pipe.stage())).then_some(state)),
            Err(TrainError::Comm(e)) => {
                tracing::warn!(from = group.from, to, "the replay lost a worker: {e}");
                Err(ReplayFailure::Lost)
            }
            Err(e) => {
                tracing::error!(from = group.from, to, "cannot replay from step {} to {to}: {e}", group.from);
                Err(ReplayFailure::Impossible)
            }
        }
    }

    /// The protocol's `Fetch`: the state of `step` from `sources`.
    fn fetch(&mut self, epoch: u64, step: u64, fingerprint: u64, sources: &[WorkerId]) -> Result<(), TrainError> {
        let want = Want { step, fingerprint, layout: self.layout.0, elements: self.layout.1 };
        let side = &self.side;
        let got =
            held::fetch(&side.port, &self.held, &side.book, sources, want, side.d.job.timeout, &self.hooks, side.id);
        self.side.sum_step = None;
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
                self.side.ledger.metrics.write(json!({
                    "kind": "fetch", "step": step, "bytes": stats.bytes,
                    "seconds": stats.elapsed.as_secs_f64(), "sources": sources, "retried": stats.retried,
                }))?;
                self.copy.keep(&mut self.worker, step, &self.held);
                Some((step, fingerprint))
            }
            Err((e, holds)) => {
                tracing::warn!(step, "cannot fetch the state: {e}");
                holds
            }
        };
        self.queue.extend(self.worker.step(Instant::now(), Event::Fetched { epoch, state: got }));
        Ok(())
    }

    /// After the protocol finished: the last evaluation and the summary.
    pub(super) fn finish(
        mut self,
        prepared: &Prepared,
        parameters: usize,
    ) -> Result<(Summary, TrainState), TrainError> {
        if self.side.d.copy_every.is_some() {
            tracing::info!(seconds = self.copy.spent.as_secs_f64(), "time spent copying the state in memory");
        }
        let config = self.side.config;
        // A job resumed at its last step ran no step: the epoch's mesh, which the last
        // checkpoint's agreement and a pipeline's evaluation use, is built here.
        if self.side.current.get().is_none()
            && let Some(q) = self.worker.quorum()
        {
            (self.side.epoch, self.side.members) = (q.epoch, q.members.clone());
            if let Some(p) = self.side.pipe.as_mut() {
                p.enter(&q.members)?;
            }
            self.side.mesh().map_err(CommError::Setup)?;
        }
        // The last checkpoint, the final step's, is committed before the summary.
        let (checkpoints, checkpoints_deferred) = match self.side.saving.take() {
            Some(saving) => {
                let (current, timeout) = (self.side.current.get(), self.side.d.job.timeout);
                saving.finish(|own| {
                    let (_, mesh) = current.ok_or_else(|| CommError::Setup("no epoch's mesh".into()))?;
                    let all = comm::collective::all_gather_words(&*mesh, &[own], timeout)?;
                    Ok(all.iter().map(|w| w[0]).min().unwrap_or(0))
                })?
            }
            None => (ckpt::WriterStats::default(), 0),
        };
        let step = lock_read(&self.held).state.step;
        let last_eval = match self.last_eval.take().filter(|e| e.step == step) {
            Some(e) => e,
            None => {
                let report = self.evaluate(prepared)?;
                self.side.ledger.evaluated(&report, prepared.unigram_perplexity)?;
                report
            }
        };
        let state = Arc::try_unwrap(self.held)
            .map_or_else(|h| lock_read(&h).state.clone(), |h| h.into_inner().unwrap_or_else(|e| e.into_inner()).state);
        // A pipeline's stages hold parts of the state: the job's is the gathered one's, and
        // its loss the collector's.
        let shared = self.side.pipe.as_ref().and_then(|p| p.staged.shared.clone());
        let summary = Summary {
            steps: config.steps,
            final_loss: shared.as_ref().map_or(self.side.ledger.last_loss, |s| s.loss),
            eval: last_eval,
            unigram_perplexity: prepared.unigram_perplexity,
            fingerprint: shared.map_or_else(|| state.fingerprint(), |s| s.fingerprint),
            kernels: self.engine.kernels(),
            train_time: self.side.ledger.train_time,
            optimizer_time: self.driver.update_time(),
            parameters,
            resumed_from: self.side.resumed_from,
            checkpoints,
            checkpoints_deferred,
            boundary_log: self.side.pipe.as_mut().and_then(|p| p.staged.finish_logs()),
        };
        write_summary(&mut self.side.ledger.metrics, &summary)?;
        Ok((summary, state))
    }
}

/// A step that stopped where the protocol's shell did not expect it to.
fn unexpected(stop: Stop, found: Option<Found>) -> TrainError {
    CommError::Setup(format!("the step stopped at {stop:?} having found {found:?}")).into()
}
