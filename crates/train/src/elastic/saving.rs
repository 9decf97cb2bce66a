//! The checkpoints of an elastic job: live replicas recover a partial loss, checkpoints a
//! total one.
//!
//! The members of an epoch hold equal replicas, so they share each checkpoint's writing:
//! the member ranked `r` of `n` writes part `r` of `n` ([`ckpt::Part`], its group the
//! epoch), and the member ranked first commits once every part is durable. Where each
//! member's part stands travels in the step's vote (its ballot's [`Saved`]: the newest
//! step it made durable, and the step and fingerprint of the state it wrote its newest
//! part from), and the protocol's update action says what the ballots agreed on: the
//! committer commits every pending checkpoint through that step, which every member's
//! part has reached and every member wrote from the same state (a replica corrupted since
//! the last replica check never gets its part committed). The last step's checkpoint,
//! whose states the replica check after the last update compares, is committed at the
//! end, after one all-gather of the durable steps.
//!
//! The committer takes the root's lock before it votes, and its ballot says whether it
//! holds it: the members write their parts of a checkpoint only when it does, so that a
//! root locked by another writer gets nothing from this job, not even temporaries.
//!
//! A membership change between a snapshot and its commit leaves that checkpoint
//! uncommitted: its parts lie in a directory of the old epoch's own, which the next
//! epoch's committer removes; the parts of two epochs never share a directory, and a part
//! record is created once, so no part ever has two writers. Only the committer takes the
//! root's lock ([`ckpt::owner`]); one that cannot take it yet (a former committer still
//! finishing, or stopped and not yet gone) passes over its checkpoints, with a warning and
//! a `checkpoint_skipped` event, rather than commit beside it. A `kill -9` at any instant
//! leaves the newest committed checkpoint valid (the store's atomic commit), and
//! `--resume latest` starts the job again from it on any number of workers.
//!
//! The committer's lock names the job ([`job_tag`]): a lock held by a former member of
//! this job is waited for, but one held by another run (a second job started on the same
//! root, or a plain `train`) stops this job with [`CkptError::Busy`](ckpt::CkptError): a
//! worker refuses such a root before its first step ([`refuse_other_jobs`]), and a
//! committer that finds one later stops at its next checkpoint. Neither a run of another
//! configuration nor one of the same can then write beside this job's checkpoints, and a
//! commit never replaces another configuration's checkpoint (the store refuses it).
//!
//! Every member takes the same checkpoints: the schedule's "are the writers idle" (for
//! `--checkpoint-when-busy defer`) is read from the minimum durable step of the vote,
//! never from a member's own writer.

use std::time::{Duration, Instant};

use ckpt::{AsyncWriter, Part, WriterStats};
use comm::protocol::Saved;
use serde_json::json;

use crate::checkpointing::{self, Schedule};
use crate::config::{CheckpointConfig, ElasticWorker, TrainConfig};
use crate::error::TrainError;
use crate::metrics::MetricsFile;
use crate::step::TrainState;

/// The name that a job's committers write into the root's lock: the same in every
/// process of one job, another in any other job. It follows from the job's secret (a
/// launcher on one node draws a fresh one for each job) and, for a job that meets in
/// etcd, the job's name there; not from addresses, which each node may resolve in its own
/// way. The secret itself is never written. Two jobs of several nodes given the same
/// `STEADFAST_SECRET` share a tag: the lock does not tell them apart, though a root of
/// another configuration refuses either (the store's configuration check).
pub(super) fn job_tag(d: &ElasticWorker) -> String {
    let mut text = d.secret.clone();
    if let crate::config::CoordinatorAt::Etcd(target) = &d.coordinator {
        text.extend_from_slice(format!("\0etcd job {}", target.job).as_bytes());
    }
    format!("{:016x}", ckpt::checksum(&text))
}

/// Fails if another run (another job, or a plain `train`) holds the lock of the
/// checkpoint root of `config`: this job must not write beside it.
pub(super) fn refuse_other_jobs(config: &TrainConfig, job: &str) -> Result<(), TrainError> {
    let Some(c) = &config.checkpoint else { return Ok(()) };
    match ckpt::owner::holder(&c.dir, 0)? {
        Some(h) if h.is_other_job(job) => {
            Err(ckpt::CkptError::Busy { dir: c.dir.clone(), holder: h.text, job: h.job }.into())
        }
        _ => Ok(()),
    }
}

/// One worker's share of the job's checkpoints.
pub(super) struct Saving {
    config: CheckpointConfig,
    /// This job's name in the root's lock ([`job_tag`]).
    job: String,
    schedule: Schedule,
    /// This member's writer in its epoch, and its part.
    writer: Option<(Part, AsyncWriter)>,
    /// The committer: why it could not take the root's lock, and when it last tried.
    busy: Option<(String, Instant)>,
    /// The committer: another run holds the root's lock (this job must stop).
    other_run: Option<ckpt::CkptError>,
    /// Whether the epoch's committer holds the root's lock (its last ballot said).
    committer_ready: bool,
    /// The newest step whose checkpoint the members wrote in this epoch (0: none), and the
    /// fingerprint of the state it was written from.
    written: u64,
    print: u64,
    /// The newest step every member of the epoch has made durable (the last vote's).
    durable_everywhere: u64,
    /// The totals of the writers this worker has let go.
    done: WriterStats,
}

impl Saving {
    /// The checkpoints of `config`, if it takes any.
    pub fn new(config: &TrainConfig, job: String) -> Option<Saving> {
        let c = config.checkpoint.as_ref()?;
        Some(Saving {
            config: c.clone(),
            job,
            other_run: None,
            schedule: Schedule::new(c, config.steps),
            writer: None,
            busy: None,
            committer_ready: false,
            written: 0,
            print: 0,
            durable_everywhere: 0,
            done: WriterStats::default(),
        })
    }

    /// After step `done`: whether to write a checkpoint now (every member answers alike).
    pub fn due(&mut self, done: u64) -> Result<bool, TrainError> {
        // Idle: every member's part of the newest checkpoint of this epoch is durable.
        let idle = self.durable_everywhere >= self.written;
        self.schedule.take(done, || Ok(idle))
    }

    /// Where this member's part stands, for its ballot, as writer `part` of the epoch: the
    /// newest step of its part made durable, (the committer) whether it holds the root's
    /// lock, which it tries to take first (at most once a second while another holds it),
    /// and the newest part written with its state's fingerprint. A writer of another
    /// epoch is let go first.
    pub fn ballot(&mut self, part: Part) -> Saved {
        if self.writer.as_ref().is_some_and(|(p, _)| *p != part) {
            self.release();
        }
        let retry = self.busy.as_ref().is_none_or(|(_, at)| at.elapsed() >= Duration::from_secs(1));
        if self.writer.is_none() && part.index == 0 && retry {
            let c = &self.config;
            let options = ckpt::SaveOptions { shards: c.shards, retention: c.retention };
            match AsyncWriter::for_part_of(&c.dir, options, part, Some(&self.job)) {
                Ok(mut w) => {
                    w.set_persist_nice(c.persist_nice);
                    self.writer = Some((part, w));
                    self.busy = None;
                }
                Err(ckpt::CkptError::Busy { dir, holder, job }) if job.as_deref() != Some(self.job.as_str()) => {
                    let e = ckpt::CkptError::Busy { dir, holder, job };
                    self.busy = Some((e.to_string(), Instant::now()));
                    self.other_run = Some(e);
                }
                Err(why) => self.busy = Some((why.to_string(), Instant::now())),
            }
        }
        let (written, print) = (self.written, self.print);
        match self.writer.as_mut() {
            Some((_, w)) => {
                // (A failed persist is said when the writer is let go.)
                let _ = w.poll();
                Saved { durable: w.durable(), locked: part.index == 0, written, print }
            }
            None => Saved { written, print, ..Saved::default() },
        }
    }

    /// Writes this member's part of the checkpoint of `state`, whose fingerprint is
    /// `print` (in the background), if the committer holds the root's lock.
    pub fn write(
        &mut self,
        part: Part,
        (state, print): (&TrainState, u64),
        meta: ckpt::Meta,
        metrics: &mut MetricsFile,
    ) -> Result<(), TrainError> {
        if !self.committer_ready {
            if part.index != 0 {
                return Ok(());
            }
            if let Some(e) = self.other_run.take() {
                return Err(e.into());
            }
            let why = self.busy.as_ref().map_or("no writer", |(why, _)| why.as_str());
            tracing::warn!(step = state.step, "no checkpoint of step {}: {why}", state.step);
            return metrics.write(json!({"kind": "checkpoint_skipped", "step": state.step, "reason": why}));
        }
        (self.written, self.print) = (state.step, print);
        if self.writer.is_none() {
            let c = &self.config;
            let options = ckpt::SaveOptions { shards: c.shards, retention: c.retention };
            let mut w = AsyncWriter::for_part_of(&c.dir, options, part, Some(&self.job))?;
            w.set_persist_nice(c.persist_nice);
            self.writer = Some((part, w));
        }
        let (_, writer) = self.writer.as_mut().expect("made above");
        let stall = writer.snapshot(meta, &checkpointing::tensor_refs(state))?;
        metrics.write(json!({"kind": "checkpoint", "step": state.step, "stall_seconds": stall.as_secs_f64()}))
    }

    /// What the vote's ballots agreed on (the protocol's update says): the committer
    /// commits through `agreed.durable`, and the members write their parts while the
    /// committer holds the root's lock.
    pub fn heard(&mut self, agreed: Saved) {
        self.committer_ready = agreed.locked;
        self.commit_through(agreed.durable);
    }

    fn commit_through(&mut self, durable_everywhere: u64) {
        self.durable_everywhere = durable_everywhere;
        if let Some((_, w)) = self.writer.as_mut()
            && let Err(e) = w.commit_through(durable_everywhere)
        {
            tracing::warn!("a checkpoint was not committed: {e}");
        }
    }

    /// Lets this epoch's writer go once its persist (and, for the committer, its commits)
    /// ended. A part of an epoch that ended may have been removed under it by the next
    /// epoch's committer: the checkpoint is then not committed, which is said, not fatal.
    fn release(&mut self) {
        (self.durable_everywhere, self.committer_ready, self.written, self.print) = (0, false, 0, 0);
        if let Some((part, mut w)) = self.writer.take() {
            if let Err(e) = w.finish() {
                tracing::warn!(epoch = %comm::control::epoch_text(part.group), "a checkpoint of an earlier epoch was not committed: {e}");
            }
            self.done.absorb(w.stats());
        }
    }

    /// At the end: this member's part of the last checkpoint made durable, then, once
    /// `gather` (an all-gather of the members' durable steps) says every part is, its
    /// commit; returns this worker's totals and the due steps passed over.
    pub fn finish(
        mut self,
        gather: impl FnOnce(u64) -> Result<u64, TrainError>,
    ) -> Result<(WriterStats, u64), TrainError> {
        let own = match self.writer.as_mut() {
            Some((_, w)) => {
                w.wait_persisted()?;
                w.durable()
            }
            None => 0,
        };
        match gather(own) {
            Ok(everywhere) => self.commit_through(everywhere),
            Err(e) => tracing::warn!("the last checkpoint was not committed: the members could not agree: {e}"),
        }
        if let Some((_, mut w)) = self.writer.take() {
            w.finish()?;
            self.done.absorb(w.stats());
        }
        Ok((self.done, self.schedule.deferred()))
    }
}
