//! The checkpoints of a Python elastic job: the members of an epoch write a part each of
//! the state's checkpoint in the background, and the first commits once every part is
//! durable, as the vote agrees ([`ckpt::share`], the rules the trainer's elastic job
//! follows too). What is written is an ordinary Steadfast checkpoint of the state's tree
//! and tensors, as `steadfast.torch.save` writes one: `steadfast.torch.load` reads it
//! back, and `Job(resume=...)` starts a job from it on any number of workers.

use std::path::PathBuf;

use ckpt::Part;
use ckpt::share::{Share, Wrote};
use comm::protocol::Saved;
use pyo3::prelude::*;

use super::{HostState, JobError};
use crate::checkpoint;
use crate::host::host_bytes;

/// Where and how often a job checkpoints.
pub(super) struct Saving {
    share: Share,
    /// A checkpoint after every this many updates, and after the last.
    every: u64,
    total: u64,
}

impl Saving {
    /// Checkpoints under `dir` every `every` steps of `total` (and after the last),
    /// keeping the newest `keep_last`, in the job tagged `job`. Fails when another run
    /// holds the root's lock.
    pub(super) fn new(
        (dir, every, keep_last): (PathBuf, u64, Option<usize>),
        total: u64,
        job: String,
    ) -> PyResult<Saving> {
        ckpt::owner::refuse_other_jobs(&dir, &job).map_err(|e| JobError::new_err(e.to_string()))?;
        let retention = ckpt::Retention { keep_last, keep_every: None };
        let options = ckpt::SaveOptions { shards: 2, retention };
        Ok(Saving { share: Share::new(dir, options, ckpt::AsyncWriter::DEFAULT_PERSIST_NICE, job), every, total })
    }

    /// Whether the state after `done` updates is checkpointed (every member answers
    /// alike): at the interval, and at the end, unless the last checkpoint's parts are
    /// still being made durable somewhere (then it is passed over).
    pub(super) fn due(&self, done: u64) -> bool {
        self.every > 0 && (done.is_multiple_of(self.every) || done == self.total) && self.share.idle()
    }

    /// Where this member's part stands, for its ballot, as writer `part`.
    pub(super) fn ballot(&mut self, part: Part) -> Saved {
        let s = self.share.ballot(part);
        Saved { durable: s.durable, locked: s.locked, written: s.written, print: s.print }
    }

    /// What the vote agreed on.
    pub(super) fn heard(&mut self, agreed: Saved) {
        self.share.heard(agreed.durable, agreed.locked);
    }

    /// Writes this member's part of the checkpoint of `state` (after `done` updates, with
    /// fingerprint `print`, by `members` workers) in the background.
    pub(super) fn write(
        &mut self,
        part: Part,
        (done, print, members): (u64, u64, usize),
        state: &HostState<'_>,
    ) -> PyResult<()> {
        let mut meta = checkpoint::meta(done, &state.tree)?;
        meta.world_size = u32::try_from(members).unwrap_or(u32::MAX);
        let described = checkpoint::describe(&state.tensors)?;
        let refs = checkpoint::refs(&described, state.tensors.iter().map(|t| host_bytes(t.4, t.5)));
        match self.share.write(part, print, meta, &refs).map_err(|e| JobError::new_err(e.to_string()))? {
            Wrote::Skipped(why) => eprintln!("[steadfast] no checkpoint of step {done}: {why}"),
            Wrote::Snapshot(_) | Wrote::Nothing => {}
        }
        Ok(())
    }

    /// At the end: the last checkpoint committed once `gather` says every part of it is
    /// durable.
    pub(super) fn finish(self, gather: impl FnOnce(u64) -> Result<u64, String>) -> PyResult<()> {
        self.share.finish(gather).map(|_| ()).map_err(|e| JobError::new_err(e.to_string()))
    }
}
