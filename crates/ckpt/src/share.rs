//! A checkpoint shared out among the members of an elastic job's epoch: they hold equal
//! replicas, so the member ranked `r` of `n` writes part `r` of `n` ([`Part`], its group
//! the epoch), and the member ranked first commits once every part is durable.
//!
//! Where each member's part stands travels in the job's step vote ([`PartStatus`]: the
//! newest step it made durable, whether the committer holds the root's lock, and the step
//! and fingerprint of the state it wrote its newest part from); what the ballots agreed on
//! comes back through [`Share::heard`], and the committer commits every pending checkpoint
//! through that step, which every member's part has reached and every member wrote from
//! the same state (a replica corrupted since the last replica check never gets its part
//! committed). The last step's checkpoint is committed by [`Share::finish`], once the
//! members agree that every part of it is durable.
//!
//! The committer takes the root's lock before it votes, and its ballot says whether it
//! holds it: the members write their parts only when it does, so that a root locked by
//! another writer gets nothing from this job, not even temporaries. A lock held by
//! another run (another job, a plain `train`) is an error at the committer's next write
//! ([`CkptError::Busy`]); one held by a former member of this job (`job`, the tag every
//! process of one job writes) is waited for.
//!
//! A membership change between a snapshot and its commit leaves that checkpoint
//! uncommitted: its parts lie in a directory of the old epoch's own, which the next
//! epoch's committer removes; the parts of two epochs never share a directory. A
//! `kill -9` at any instant leaves the newest committed checkpoint valid.
//!
//! Both elastic shells keep their checkpoints this way: the trainer's and the Python
//! package's (`steadfast.elastic`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{CkptError, Result};
use crate::manifest::Meta;
use crate::store::{Part, RawTensorRef, SaveOptions};
use crate::writer::{AsyncWriter, WriterStats};

/// Where one member's part of the epoch's checkpoints stands, as its ballot carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartStatus {
    /// The newest step whose part this member made durable.
    pub durable: u64,
    /// (The committer) it holds the root's lock.
    pub locked: bool,
    /// The newest step whose part it wrote (0: none in this epoch).
    pub written: u64,
    /// The fingerprint of the state it wrote that part from.
    pub print: u64,
}

/// What [`Share::write`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Wrote {
    /// The part's snapshot was taken (its persist runs in the background): how long the
    /// caller waited.
    Snapshot(Duration),
    /// (The committer) nothing: it does not hold the root's lock, for this reason.
    Skipped(String),
    /// Nothing: the committer does not hold the root's lock, so no member writes.
    Nothing,
}

/// One member's share of the job's checkpoints.
pub struct Share {
    dir: PathBuf,
    options: SaveOptions,
    persist_nice: u8,
    /// This job's name in the root's lock.
    job: String,
    /// This member's writer in its epoch, and its part.
    writer: Option<(Part, AsyncWriter)>,
    /// The committer: why it could not take the root's lock, and when it last tried.
    busy: Option<(String, Instant)>,
    /// The committer: another run holds the root's lock (this job must stop).
    other_run: Option<CkptError>,
    /// Whether the epoch's committer holds the root's lock (the last vote said).
    committer_ready: bool,
    /// The newest step whose checkpoint the members wrote in this epoch (0: none), and the
    /// fingerprint of the state it was written from.
    written: u64,
    print: u64,
    /// The newest step every member of the epoch has made durable (the last vote's).
    durable_everywhere: u64,
    /// The totals of the writers this member has let go.
    done: WriterStats,
}

impl Share {
    /// A share of the checkpoints under `dir`, written with `options` by a persist thread
    /// niced by `persist_nice`, in the job named `job` in the root's lock.
    pub fn new(dir: PathBuf, options: SaveOptions, persist_nice: u8, job: String) -> Share {
        Share {
            dir,
            options,
            persist_nice,
            job,
            writer: None,
            busy: None,
            other_run: None,
            committer_ready: false,
            written: 0,
            print: 0,
            durable_everywhere: 0,
            done: WriterStats::default(),
        }
    }

    /// Whether every member's part of the newest checkpoint of this epoch is durable (a
    /// schedule that defers a checkpoint while the writers are busy asks; every member
    /// answers alike, from the last vote).
    pub fn idle(&self) -> bool {
        self.durable_everywhere >= self.written
    }

    fn writer_for(&mut self, part: Part) -> Result<AsyncWriter> {
        let mut w = AsyncWriter::for_part_of(&self.dir, self.options, part, Some(&self.job))?;
        w.set_persist_nice(self.persist_nice);
        Ok(w)
    }

    /// Where this member's part stands, for its ballot, as writer `part` of the epoch:
    /// the committer tries to take the root's lock first (at most once a second while
    /// another holds it). A writer of another epoch is let go first.
    pub fn ballot(&mut self, part: Part) -> PartStatus {
        if self.writer.as_ref().is_some_and(|(p, _)| *p != part) {
            self.release();
        }
        let retry = self.busy.as_ref().is_none_or(|(_, at)| at.elapsed() >= Duration::from_secs(1));
        if self.writer.is_none() && part.index == 0 && retry {
            match self.writer_for(part) {
                Ok(w) => {
                    self.writer = Some((part, w));
                    self.busy = None;
                }
                Err(CkptError::Busy { dir, holder, job }) if job.as_deref() != Some(self.job.as_str()) => {
                    let e = CkptError::Busy { dir, holder, job };
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
                PartStatus { durable: w.durable(), locked: part.index == 0, written, print }
            }
            None => PartStatus { written, print, ..PartStatus::default() },
        }
    }

    /// Writes this member's part (`part`) of the checkpoint of the state `tensors` of
    /// step `meta.step`, whose fingerprint is `print`, in the background, if the
    /// committer holds the root's lock. Fails when another run holds it.
    pub fn write(&mut self, part: Part, print: u64, meta: Meta, tensors: &[RawTensorRef<'_>]) -> Result<Wrote> {
        if !self.committer_ready {
            if part.index != 0 {
                return Ok(Wrote::Nothing);
            }
            if let Some(e) = self.other_run.take() {
                return Err(e);
            }
            let why = self.busy.as_ref().map_or("no writer", |(why, _)| why.as_str());
            return Ok(Wrote::Skipped(why.to_owned()));
        }
        (self.written, self.print) = (meta.step, print);
        if self.writer.is_none() {
            let w = self.writer_for(part)?;
            self.writer = Some((part, w));
        }
        let (_, writer) = self.writer.as_mut().expect("made above");
        Ok(Wrote::Snapshot(writer.snapshot_raw(meta, tensors)?))
    }

    /// What the vote's ballots agreed on: the committer commits through `durable`, and the
    /// members write their parts while the committer holds the root's lock (`locked`).
    pub fn heard(&mut self, durable: u64, locked: bool) {
        self.committer_ready = locked;
        self.commit_through(durable);
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
                tracing::warn!(group = part.group, "a checkpoint of an earlier epoch was not committed: {e}");
            }
            self.done.absorb(w.stats());
        }
    }

    /// At the end: this member's part of the last checkpoint made durable, then, once
    /// `gather` (an all-gather of the members' durable steps, returning their minimum)
    /// says every part is, its commit; returns this member's totals.
    pub fn finish<E: std::fmt::Display>(
        mut self,
        gather: impl FnOnce(u64) -> std::result::Result<u64, E>,
    ) -> Result<WriterStats> {
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
        Ok(self.done)
    }
}
