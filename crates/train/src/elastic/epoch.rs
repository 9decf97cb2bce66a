//! An elastic worker's side of a step, as the step driver's [`Runner`]: the epoch's mesh,
//! the all-reduce over it, and the checks the protocol's action asked for (the state's
//! fingerprint at rest and just before the update, the gather of the replicas'
//! fingerprints after it). It decides nothing: what it found is left in [`ElasticRunner::found`]
//! for the shell to hand to the protocol.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm::member::Current;
use comm::port::Port;
use comm::protocol::WorkerId;
use comm::transport::{CommError, TcpConfig, TcpMesh};
use serde_json::json;

use crate::checkpointing;
use crate::config::{ElasticWorker, TrainConfig};
use crate::driver::{Flow, Reduction, Runner};
use crate::error::ConfigError;
use crate::error::TrainError;
use crate::metrics::Ledger;
use crate::pipeline::Staged;
use crate::schedule::Boundary;
use crate::step::{At, Engine, GradBuffer, Injected, SumCheck, TrainState};
use crate::trainer::report_injections;

use super::saving::Saving;
use super::stages::Stages;

/// What a step found that the protocol must hear.
#[derive(Debug)]
pub(super) enum Found {
    /// The sum is reduced: its check goes to the vote.
    Reduced(SumCheck),
    /// The epoch's mesh or its all-reduce failed.
    Failed(String),
    /// The state changed since its commit: `(committed, found)`.
    Corrupted { changed: (u64, u64) },
    /// After an update, when the action asked to compare: every member's fingerprint in
    /// rank order (`None`: the gather failed).
    Checked(Option<Vec<u64>>),
}

/// The worker's side of its steps.
pub(super) struct ElasticRunner<'c, 'e> {
    pub config: &'c TrainConfig,
    pub d: &'c ElasticWorker,
    pub id: WorkerId,
    pub port: Port,
    pub book: BTreeMap<WorkerId, SocketAddr>,
    pub tcp: TcpConfig,
    pub current: Current,
    pub reducer: comm::collective::Reducer,
    /// The all-reduce's output while the driver's sum holds a sum not yet applied
    /// (`sum_step`): it becomes the driver's sum only when the all-reduce succeeded, so a
    /// failed step never spoils the sum a late member rolls forward with. Otherwise, as in
    /// every step of a healthy job, the all-reduce writes the driver's sum itself: one
    /// buffer, warm in the cache from step to step, instead of two taking turns.
    pub work: GradBuffer,
    /// The step whose sum the driver holds, not yet applied.
    pub sum_step: Option<u64>,
    /// The record, the watcher, the time in steps and the last loss.
    pub ledger: Ledger<'e>,
    /// The epoch of the step in progress, and its members in rank order.
    pub epoch: u64,
    pub members: Vec<WorkerId>,
    /// The state's fingerprint where known (see `SharedState::fingerprint`), lent for the step.
    pub known: Option<u64>,
    /// What the protocol's action asked of the step: the fingerprints the state must
    /// still have at rest and just before the update, whether to hash it after the update,
    /// and whether to compare it with the other members'.
    pub asked: Asked,
    /// What the step found.
    pub found: Option<Found>,
    /// The job's checkpoints, if it takes any.
    pub saving: Option<Saving>,
    /// The step of the checkpoint this worker resumed from (0: none).
    pub resumed_from: u64,
    /// In a pipeline job: this worker's stage, and the epoch's layout.
    pub pipe: Option<Stages>,
}

/// The checks an action asked of a step.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Asked {
    pub at_rest: Option<u64>,
    pub before_update: Option<u64>,
    pub hash: bool,
    pub compare: bool,
}

impl ElasticRunner<'_, '_> {
    /// This member's part of the epoch's checkpoints: its rank among the members (of its
    /// stage, in a pipeline job, whose stages each have a root of their own).
    pub(super) fn part(&self) -> ckpt::Part {
        let writers: Vec<WorkerId> = match &self.pipe {
            Some(p) => {
                let stages = self.config.pipeline.stages;
                self.members.iter().copied().filter(|&m| comm::protocol::stage_of(m, stages) == p.stage()).collect()
            }
            None => self.members.clone(),
        };
        let index = writers.iter().position(|&m| m == self.id).unwrap_or(0);
        ckpt::Part { index, count: writers.len().max(1), group: self.epoch }
    }

    /// The epoch's mesh and this worker's stage, in a pipeline job.
    fn staged(&mut self) -> Result<(Arc<TcpMesh>, &mut Staged), TrainError> {
        let mesh = self.mesh().map_err(CommError::Setup)?.0;
        match self.pipe.as_mut() {
            Some(p) => Ok((mesh, &mut p.staged)),
            None => Err(ConfigError::Invalid("this worker holds no pipeline stage".into()).into()),
        }
    }

    /// Whether `state` still has the fingerprint `expected` it was committed with; when
    /// not, returns `(expected, found)`. Either way the fingerprint is known now.
    fn changed_since_commit(&mut self, state: &TrainState, expected: Option<u64>) -> Option<(u64, u64)> {
        let expected = expected?;
        let found = state.fingerprint();
        self.known = Some(found);
        (found != expected).then_some((expected, found))
    }

    /// Logs and records a state found changed since its commit, and ends the step.
    fn corrupted(&mut self, step: u64, when: &'static str, changed: (u64, u64)) -> Result<Flow, TrainError> {
        tracing::error!(
            step,
            "the state of worker {} changed {when} ({} -> {}): repairing it from the replicas",
            self.id,
            repro::fingerprint::hex(changed.0),
            repro::fingerprint::hex(changed.1)
        );
        self.ledger.metrics.write(json!({"kind": "divergence", "step": step, "worker": self.id, "found": when}))?;
        self.found = Some(Found::Corrupted { changed });
        Ok(Flow::End)
    }

    /// The epoch's mesh, built by its first step, and how long building it took if this
    /// call built it.
    pub(super) fn mesh(&mut self) -> Result<(Arc<TcpMesh>, Option<Duration>), String> {
        match self.current.get() {
            Some((e, m)) if e == self.epoch => Ok((m, None)),
            _ => {
                let began = Instant::now();
                let intro = comm::port::Intro::Mesh { epoch: self.epoch };
                match self.port.mesh(intro, &self.members, &self.book, &self.tcp) {
                    Ok(m) => Ok((self.current.set(self.epoch, m), Some(began.elapsed()))),
                    Err(e) => Err(format!("cannot build the epoch's mesh: {e}")),
                }
            }
        }
    }

    /// Gathers every member's fingerprint, this one's `fingerprint` among them.
    fn gather_prints(&self, mesh: &TcpMesh, fingerprint: u64) -> Option<Vec<u64>> {
        match comm::collective::all_gather_u64(mesh, fingerprint, self.d.job.timeout) {
            Ok(all) => Some(all),
            Err(e) => {
                tracing::warn!("the replica check failed: {e}");
                None
            }
        }
    }
}

impl Runner for ElasticRunner<'_, '_> {
    /// The state at rest is checked against the fingerprint it was committed with, when
    /// the action asked; then the epoch's first step builds its mesh (its time is written
    /// as a `mesh` record and left out of the training time).
    fn loaded(&mut self, at: At, state: &mut TrainState) -> Result<Flow, TrainError> {
        if let Some(changed) = self.changed_since_commit(state, self.asked.at_rest) {
            return self.corrupted(at.step, "at rest", changed);
        }
        match self.mesh() {
            Ok((_, Some(took))) => {
                // Building the epoch's mesh is the epoch's setup, as a static job's mesh
                // is the job's: it is recorded on its own, not as the step's time.
                self.ledger.started += took;
                self.ledger.metrics.write(json!({
                    "kind": "mesh", "epoch": self.epoch, "members": self.members.len(),
                    "seconds": took.as_secs_f64(),
                }))?;
                Ok(Flow::Go)
            }
            Ok(_) => Ok(Flow::Go),
            Err(why) => {
                self.found = Some(Found::Failed(why));
                Ok(Flow::End)
            }
        }
    }

    fn reduce(&mut self, _at: At, r: Reduction<'_, '_>) -> Result<Flow, TrainError> {
        let mesh = match self.mesh() {
            Ok((m, _)) => m,
            Err(why) => {
                self.found = Some(Found::Failed(why));
                return Ok(Flow::End);
            }
        };
        let holds = self.sum_step.is_some();
        let out = if holds { &mut self.work } else { &mut *r.sum };
        let (mode, timeout) = (self.config.reduce, self.d.job.timeout);
        // A pipeline stage sums with its own replicas.
        let summed = match &self.pipe {
            Some(p) => {
                let layout = &p.staged.layout;
                comm::group::Group::new(&*mesh, layout.replicas_of(p.stage()))
                    .and_then(|group| self.reducer.sum_parts(&group, r.parts, out.as_mut_slice(), mode, timeout))
            }
            None => self.reducer.sum_parts(&*mesh, r.parts, out.as_mut_slice(), mode, timeout),
        };
        match summed {
            Ok(()) => {
                if holds {
                    std::mem::swap(&mut self.work, r.sum);
                }
                Ok(Flow::Go)
            }
            Err(e) => {
                self.found = Some(Found::Failed(format!("the all-reduce failed: {e}")));
                Ok(Flow::End)
            }
        }
    }

    /// The vote is the protocol's: the step pauses with the sum's check, and resumes at
    /// the update when the protocol commits it.
    fn vote(&mut self, _at: At, sum: &GradBuffer) -> Result<Flow, TrainError> {
        self.found = Some(Found::Reduced(SumCheck::of(sum)));
        Ok(Flow::Pause)
    }

    /// Just before the update, the state is checked against the fingerprint it was
    /// committed with, when the action asked: a replica whose state changed while the
    /// step computed names itself.
    fn updating(&mut self, at: At, state: &mut TrainState) -> Result<Flow, TrainError> {
        if let Some(changed) = self.changed_since_commit(state, self.asked.before_update) {
            return self.corrupted(at.step, "before the update", changed);
        }
        Ok(Flow::Go)
    }

    /// The state is hashed after the update when the action asked (to check it at rest
    /// later, or to compare it); otherwise the protocol asks for it when it needs it.
    fn updated(&mut self, at: At, state: &TrainState, sum: &GradBuffer) -> Result<(), TrainError> {
        self.known = (self.asked.hash || self.asked.compare).then(|| state.fingerprint());
        self.ledger.stepped(state.step, sum.loss())?;
        // A pipeline stage's logs of the step are complete.
        if let Some(failure) = self.pipe.as_mut().and_then(|p| p.staged.end_step(at.step)) {
            self.ledger.metrics.write(json!({"kind": "log_failed", "step": at.step, "reason": failure}))?;
        }
        Ok(())
    }

    fn check_replicas(&mut self, _at: At, state: &TrainState) -> Result<Flow, TrainError> {
        if !self.asked.compare {
            return Ok(Flow::Go);
        }
        let fingerprint = *self.known.get_or_insert_with(|| state.fingerprint());
        let prints = match self.current.get() {
            Some((_, mesh)) => self.gather_prints(&mesh, fingerprint),
            None => None,
        };
        self.found = Some(Found::Checked(prints));
        Ok(Flow::Go)
    }

    /// The members share each checkpoint, a part each ([`Saving`]).
    fn checkpoint_due(&mut self, _at: At, state: &TrainState) -> Result<bool, TrainError> {
        match self.saving.as_mut() {
            Some(s) => s.due(state.step),
            None => Ok(false),
        }
    }

    fn checkpoint(&mut self, _at: At, state: &TrainState, engine: &Engine<'_>) -> Result<(), TrainError> {
        let part = self.part();
        let Some(saving) = self.saving.as_mut() else { return Ok(()) };
        let meta = checkpointing::meta(self.config, engine.sampler(), state, engine.kernels(), self.members.len());
        // The ballots compare the states the parts were written from.
        let print = *self.known.get_or_insert_with(|| state.fingerprint());
        saving.write(part, (state, print), meta, &mut self.ledger.metrics)
    }

    fn injected(&mut self, flips: Vec<Injected>) -> Result<(), TrainError> {
        report_injections(&mut self.ledger.metrics, flips)
    }

    /// A boundary tensor goes to the worker that computes `micro` at stage `peer`, over
    /// the epoch's mesh. A failed send or receive ends the step like a failed all-reduce:
    /// the protocol hears that the computation failed.
    fn send(&mut self, at: At, peer: usize, micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        let (mesh, pipe) = self.staged()?;
        pipe.send(&*mesh, (at.step, peer, micro), tensor, data)
    }

    fn recv(
        &mut self,
        _at: At,
        peer: usize,
        micro: usize,
        tensor: Boundary,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let timeout = self.d.job.timeout;
        let (mesh, pipe) = self.staged()?;
        pipe.recv(&*mesh, (peer, micro, tensor), timeout, data)
    }
}
