//! The checkpoints of an elastic job: live replicas recover a partial loss, checkpoints a
//! total one.
//!
//! The members of an epoch hold equal replicas, so one of them writes each checkpoint
//! whole: the member ranked first in the epoch that applied the step. The writer's lock
//! ([`ckpt::owner`]) keeps it the only writer of the root. A member that is no longer
//! ranked first finishes its checkpoints and lets the lock go. A member ranked first that
//! cannot take the lock yet (a former writer still finishing, or stopped and not yet
//! gone) passes over that checkpoint, with a warning and a `checkpoint_skipped` event,
//! rather than write beside it. So a membership change never leaves two writers, and a
//! `kill -9` at any instant leaves the newest committed checkpoint valid (the store's
//! atomic commit); `--resume latest` starts the job again from it on any number of
//! workers.

use ckpt::{AsyncWriter, CkptError, WriterStats};
use serde_json::json;

use crate::checkpointing::{self, Schedule};
use crate::config::{CheckpointConfig, TrainConfig};
use crate::error::TrainError;
use crate::metrics::MetricsFile;
use crate::step::TrainState;

/// One worker's share of the job's checkpoints.
pub(super) struct Saving {
    config: CheckpointConfig,
    /// Every member advances the schedule alike; only the writer acts on it.
    schedule: Schedule,
    writer: Option<AsyncWriter>,
    /// The totals of the writers this worker has let go.
    done: WriterStats,
}

impl Saving {
    /// The checkpoints of `config`, if it takes any.
    pub fn new(config: &TrainConfig) -> Option<Saving> {
        let c = config.checkpoint.as_ref()?;
        Some(Saving {
            config: c.clone(),
            schedule: Schedule::new(c, config.steps),
            writer: None,
            done: WriterStats::default(),
        })
    }

    /// After step `done`, as the member of rank `rank`: whether this worker writes a
    /// checkpoint now. A worker no longer ranked first lets its writer go.
    pub fn due(&mut self, rank: usize, done: u64) -> Result<bool, TrainError> {
        if rank != 0 {
            self.release()?;
        }
        let writer = &mut self.writer;
        let take = self.schedule.take(done, || match writer.as_mut() {
            Some(w) => w.busy().map(|busy| !busy),
            None => Ok(true),
        })?;
        Ok(take && rank == 0)
    }

    /// Writes the checkpoint of `state` (in the background), taking the root's lock first
    /// if this worker does not hold it yet.
    pub fn write(&mut self, state: &TrainState, meta: ckpt::Meta, metrics: &mut MetricsFile) -> Result<(), TrainError> {
        if self.writer.is_none() {
            let c = &self.config;
            let options = ckpt::SaveOptions { shards: c.shards, retention: c.retention };
            match AsyncWriter::new(&c.dir, options) {
                Ok(mut w) => {
                    w.set_persist_nice(c.persist_nice);
                    self.writer = Some(w);
                }
                Err(why @ CkptError::Busy { .. }) => {
                    tracing::warn!(step = state.step, "no checkpoint of step {}: {why}", state.step);
                    let event = json!({"kind": "checkpoint_skipped", "step": state.step, "reason": why.to_string()});
                    return metrics.write(event);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let writer = self.writer.as_mut().expect("taken above");
        let stall = writer.snapshot(meta, &checkpointing::tensor_refs(state))?;
        metrics.write(json!({"kind": "checkpoint", "step": state.step, "stall_seconds": stall.as_secs_f64()}))
    }

    /// Finishes this worker's checkpoints (the last persist and its commit) and lets the
    /// root's lock go.
    pub fn release(&mut self) -> Result<(), TrainError> {
        if let Some(mut w) = self.writer.take() {
            w.finish()?;
            self.done.absorb(w.stats());
        }
        Ok(())
    }

    /// Lets the writer go and returns this worker's totals, and the due steps passed over.
    pub fn finish(mut self) -> Result<(WriterStats, u64), TrainError> {
        self.release()?;
        Ok((self.done, self.schedule.deferred()))
    }
}
