//! One process, or one rank of a static job, as the step driver's runner: the
//! collectives of its job, its checkpoints and metrics, and, in a pipeline job, its
//! stage's boundary tensors.

use std::time::Duration;

use serde_json::json;

use super::{EvalReport, Ledger, Prepared, evaluate_state, report_injections};
use crate::checkpointing;
use crate::config::TrainConfig;
use crate::data::Dataset;
use crate::driver::{self, Flow, Reduction, Runner};
use crate::error::{ConfigError, TrainError};
use crate::job::Job;
use crate::pipeline::{self, Staged};
use crate::schedule::Boundary;
use crate::step::{At, Engine, GradBuffer, Injected, SumCheck, TrainState};

/// One process, or one rank of a static job, as the step driver's [`Runner`]: the
/// reduction is local or one all-reduce across the job ([`Job`]); a job votes with
/// [`comm::commit`], a single process refuses a non-finite sum by itself; checkpoints
/// are written by every rank (its own part) and committed by rank 0 once every part is
/// durable.
pub(super) struct StaticRunner<'c, 'e> {
    pub(super) config: &'c TrainConfig,
    /// Whether other ranks hold the same sum (data-parallel replicas).
    pub(super) shared: bool,
    pub(super) job: Option<Job>,
    /// In a pipeline job: this rank's stage.
    pub(super) pipe: Option<Staged>,
    /// Which steps are checkpointed.
    pub(super) schedule: Option<checkpointing::Schedule>,
    pub(super) writer: Option<ckpt::AsyncWriter>,
    /// In a job: whether every rank's writer was idle at this step's vote.
    pub(super) writers_idle: bool,
    /// The all-reduce's working space.
    pub(super) reducer: comm::collective::Reducer,
    /// The record, the watcher, the time in steps and the last loss.
    pub(super) ledger: Ledger<'e>,
    /// The step whose sum this rank computed in full (until it applies it).
    pub(super) reduced: Option<u64>,
}

impl Runner for StaticRunner<'_, '_> {
    fn reduce(&mut self, at: At, r: Reduction<'_, '_>) -> Result<Flow, TrainError> {
        match &self.job {
            Some(j) => j.sum_parts(&mut self.reducer, r.parts, r.sum.as_mut_slice(), self.config.reduce)?,
            None => r.local(),
        }
        self.reduced = Some(at.step);
        Ok(Flow::Go)
    }

    fn vote(&mut self, at: At, sum: &GradBuffer) -> Result<Flow, TrainError> {
        let Some(j) = &self.job else {
            driver::vote_alone(at.step, sum)?;
            return Ok(Flow::Go);
        };
        if let Some(w) = self.writer.as_mut() {
            w.poll()?;
        }
        let check = if self.shared { SumCheck::of(sum) } else { SumCheck::unshared(sum) };
        let ballots = j.vote(at.step, &check, self.writer.as_ref().map_or(0, |w| w.durable()))?;
        let durable = comm::commit::durable_everywhere(&ballots);
        // Every rank reads the same ballots, so every rank decides alike whether a
        // deferred checkpoint can be taken after this step.
        self.writers_idle = self.schedule.as_ref().is_none_or(|s| s.idle_everywhere(durable));
        if let Some(w) = self.writer.as_mut() {
            w.commit_through(durable)?;
        }
        if let Some(p) = self.pipe.as_mut()
            && durable > 0
        {
            p.checkpointed(durable);
        }
        Ok(Flow::Go)
    }

    fn updated(&mut self, at: At, state: &TrainState, sum: &GradBuffer) -> Result<(), TrainError> {
        self.ledger.stepped(state.step, sum.loss())?;
        if let Some(failure) = self.pipe.as_mut().and_then(|p| p.end_step(at.step)) {
            self.ledger.metrics.write(json!({"kind": "log_failed", "step": at.step, "reason": failure}))?;
        }
        Ok(())
    }

    fn check_replicas(&mut self, _at: At, state: &TrainState) -> Result<Flow, TrainError> {
        if let Some(j) = &self.job
            && j.checks_after(state.step, self.config.steps)
        {
            j.check_replicas(state.step, state.fingerprint())?;
        }
        Ok(Flow::Go)
    }

    fn checkpoint_due(&mut self, _at: At, state: &TrainState) -> Result<bool, TrainError> {
        let (Some(w), Some(s)) = (self.writer.as_mut(), self.schedule.as_mut()) else { return Ok(false) };
        let (in_job, idle) = (self.job.is_some(), self.writers_idle);
        s.take(state.step, || if in_job { Ok::<_, TrainError>(idle) } else { Ok(!w.busy()?) })
    }

    fn checkpoint(&mut self, _at: At, state: &TrainState, engine: &Engine<'_>) -> Result<(), TrainError> {
        let Some(w) = self.writer.as_mut() else { return Ok(()) };
        let world = self.job.as_ref().map_or(1, |j| j.place().1);
        let meta = checkpointing::meta(self.config, engine.sampler(), state, engine.kernels(), world);
        let stall = w.snapshot(meta, &checkpointing::tensor_refs(state))?;
        self.ledger
            .metrics
            .write(json!({"kind": "checkpoint", "step": state.step, "stall_seconds": stall.as_secs_f64()}))
    }

    fn injected(&mut self, flips: Vec<Injected>) -> Result<(), TrainError> {
        report_injections(&mut self.ledger.metrics, flips)
    }

    fn send(&mut self, at: At, peer: usize, micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        let (job, pipe) = self.staged()?;
        pipe.send(job.transport()?, (at.step, peer, micro), tensor, data)
    }

    fn recv(
        &mut self,
        _at: At,
        peer: usize,
        micro: usize,
        tensor: Boundary,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let timeout = self.timeout();
        let (job, pipe) = self.staged()?;
        pipe.recv(job.transport()?, (peer, micro, tensor), timeout, data)
    }
}

impl StaticRunner<'_, '_> {
    /// The job and this rank's stage, in a pipeline job.
    fn staged(&mut self) -> Result<(&Job, &mut Staged), TrainError> {
        match (&self.job, &mut self.pipe) {
            (Some(j), Some(p)) => Ok((j, p)),
            _ => Err(ConfigError::Invalid("this rank holds no pipeline stage".into()).into()),
        }
    }

    /// Scores the state when an evaluation is due after this step (every `eval_every`
    /// steps, and after the last), and records it.
    pub(super) fn evaluate_if_due(
        &mut self,
        engine: &mut Engine<'_>,
        prepared: &Prepared,
        state: &TrainState,
    ) -> Result<Option<EvalReport>, TrainError> {
        let (done, config) = (state.step, self.config);
        if done != config.steps && (config.eval_every == 0 || done % config.eval_every != 0) {
            return Ok(None);
        }
        let report = self.evaluate(engine, &prepared.data, state)?;
        self.ledger.evaluated(&report, prepared.unigram_perplexity)?;
        Ok(Some(report))
    }

    /// The job's bound on a collective step.
    fn timeout(&self) -> Duration {
        self.config.collective_timeout()
    }

    /// Scores the state on the held-out split: here, or, in a pipeline job, on the
    /// collector once it has gathered replica 0's stages (every rank gets its report, and
    /// the whole state's fingerprint is kept for the summary).
    fn evaluate(
        &mut self,
        engine: &mut Engine<'_>,
        data: &Dataset,
        state: &TrainState,
    ) -> Result<EvalReport, TrainError> {
        let limit = self.config.eval_limit;
        let (timeout, loss) = (self.timeout(), self.ledger.last_loss);
        let Ok((job, pipe)) = self.staged() else { return Ok(evaluate_state(engine, data, state, limit)) };
        let t = job.transport()?;
        let mine = if pipeline::gather(t, &pipe.layout, state, &mut pipe.whole, timeout)? {
            let report = evaluate_state(engine, data, &pipe.whole, limit);
            Some(pipeline::Shared { report, fingerprint: pipe.whole.fingerprint(), loss })
        } else {
            None
        };
        let shared = pipeline::share(t, &pipe.layout, mine.as_ref(), timeout)?;
        let report = shared.report.clone();
        pipe.shared = Some(shared);
        Ok(report)
    }
}
