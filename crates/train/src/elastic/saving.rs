//! The checkpoints of an elastic job: live replicas recover a partial loss, checkpoints a
//! total one. The members of an epoch share each checkpoint's writing, a part each, and
//! the vote says where each part stands ([`ckpt::share`] holds the rules, which the
//! Python package's elastic worker follows too); this module puts them on the trainer's
//! schedule and in its record.
//!
//! The committer's lock names the job ([`comm::member::job_tag`]): a lock held by a former member of
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

use ckpt::share::{Share, Wrote};
use ckpt::{Part, WriterStats};
use comm::protocol::Saved;
use serde_json::json;

use crate::checkpointing::{self, Schedule};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::metrics::MetricsFile;
use crate::step::TrainState;

/// Fails if another run (another job, or a plain `train`) holds the lock of the
/// checkpoint root of `config`: this job must not write beside it.
pub(super) fn refuse_other_jobs(config: &TrainConfig, job: &str) -> Result<(), TrainError> {
    let Some(c) = &config.checkpoint else { return Ok(()) };
    Ok(ckpt::owner::refuse_other_jobs(&c.dir, job)?)
}

/// One worker's share of the job's checkpoints: the parts and their agreement
/// ([`Share`]), on the trainer's schedule, said in its record.
pub(super) struct Saving {
    share: Share,
    schedule: Schedule,
}

impl Saving {
    /// The checkpoints of `config`, if it takes any.
    pub fn new(config: &TrainConfig, job: String) -> Option<Saving> {
        let c = config.checkpoint.as_ref()?;
        let options = ckpt::SaveOptions { shards: c.shards, retention: c.retention };
        Some(Saving {
            share: Share::new(c.dir.clone(), options, c.persist_nice, job),
            schedule: Schedule::new(c, config.steps),
        })
    }

    /// After step `done`: whether to write a checkpoint now (every member answers alike).
    pub fn due(&mut self, done: u64) -> Result<bool, TrainError> {
        let idle = self.share.idle();
        self.schedule.take(done, || Ok(idle))
    }

    /// Where this member's part stands, for its ballot, as writer `part` of the epoch.
    pub fn ballot(&mut self, part: Part) -> Saved {
        let s = self.share.ballot(part);
        Saved { durable: s.durable, locked: s.locked, written: s.written, print: s.print }
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
        let tensors: Vec<ckpt::RawTensorRef<'_>> =
            checkpointing::tensor_refs(state).into_iter().map(Into::into).collect();
        match self.share.write(part, print, meta, &tensors)? {
            Wrote::Snapshot(stall) => {
                metrics.write(json!({"kind": "checkpoint", "step": state.step, "stall_seconds": stall.as_secs_f64()}))
            }
            Wrote::Skipped(why) => {
                tracing::warn!(step = state.step, "no checkpoint of step {}: {why}", state.step);
                metrics.write(json!({"kind": "checkpoint_skipped", "step": state.step, "reason": why}))
            }
            Wrote::Nothing => Ok(()),
        }
    }

    /// What the vote's ballots agreed on (the protocol's update says).
    pub fn heard(&mut self, agreed: Saved) {
        self.share.heard(agreed.durable, agreed.locked);
    }

    /// At the end: the last checkpoint committed once `gather` (an all-gather of the
    /// members' durable steps) says every part is durable; returns this worker's totals
    /// and the due steps passed over.
    pub fn finish(self, gather: impl FnOnce(u64) -> Result<u64, TrainError>) -> Result<(WriterStats, u64), TrainError> {
        let deferred = self.schedule.deferred();
        Ok((self.share.finish(gather)?, deferred))
    }
}
