//! The asynchronous two-phase checkpoint writer (as CheckFreq).
//!
//! Phase one, [`AsyncWriter::snapshot`], copies the state into host buffers that are
//! allocated once and reused: this copy is the only time training waits. Phase two runs
//! on a background thread and persists the copy with [`store::save`](crate::store::save)
//! (parallel shard writers, fsync, atomic commit). At most one persist is in flight: a
//! snapshot requested while the previous persist is still running waits for it
//! (back-pressure), and that wait is counted in the stall.
//!
//! A persist error is reported by the next `snapshot` or by [`AsyncWriter::finish`].
//!
//! The persist thread runs at a lower scheduling priority than training (its nice value
//! raised by [`AsyncWriter::DEFAULT_PERSIST_NICE`], or as set by
//! [`AsyncWriter::set_persist_nice`]; Linux schedules threads by their own nice value, and
//! the shard writers it starts inherit it). On a machine whose cores training keeps busy,
//! the persist then takes the cycles training leaves idle instead of a share of its
//! cores. A caller that would rather skip a checkpoint than wait for the disk asks
//! [`AsyncWriter::busy`] first (the trainer's `--checkpoint-when-busy defer`).
//!
//! In a data-parallel job every replica runs a writer for its [`Part`]: its snapshot
//! copies only the tensors of its own shards (so the stall shrinks with the world size)
//! and its persist makes them durable without committing ([`store::save_part`]). The
//! caller learns from every rank which step it has made durable ([`AsyncWriter::durable`];
//! the trainer carries it in the per-step commit vote) and tells writer 0, which commits
//! every pending checkpoint that all parts have reached ([`AsyncWriter::commit_through`],
//! in the background).

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CkptError, Result};
use crate::manifest::Meta;
use crate::owner::Owner;
use crate::store::{
    Part, RawTensorRef, SaveOptions, SaveReport, TensorRef, commit_parts, remove_stale_temporaries_for, save_part_raw,
    save_raw,
};
use crate::{DType, Role};

/// An owned copy of one tensor (a reusable snapshot buffer).
#[derive(Debug)]
struct Buffer {
    name: String,
    role: Role,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Buffer {
    fn as_ref(&self) -> RawTensorRef<'_> {
        RawTensorRef { name: &self.name, role: self.role, dtype: self.dtype, shape: &self.shape, bytes: &self.data }
    }
}

/// What a persist achieved: a committed checkpoint, or a durable part of one.
enum Persisted {
    Committed(SaveReport),
    Part { step: u64, bytes: u64, duration: Duration },
}

type Persist = JoinHandle<(Vec<Buffer>, Option<i32>, Result<Persisted>)>;
type Commit = JoinHandle<Result<Vec<SaveReport>>>;

/// Totals over the writer's life.
#[derive(Clone, Debug, Default)]
pub struct WriterStats {
    /// Snapshots taken.
    pub snapshots: u64,
    /// Checkpoints committed.
    pub committed: u64,
    /// Total time training waited (copy plus back-pressure).
    pub stall: Duration,
    /// Longest single wait.
    pub max_stall: Duration,
    /// Of the stall, time spent waiting for the previous persist.
    pub backpressure: Duration,
    /// Total persist time (background).
    pub persist: Duration,
    /// Bytes committed.
    pub bytes: u64,
    /// The nice value the last persist thread ran at (`None` before the first persist,
    /// or where the system would not say).
    pub persist_nice: Option<i32>,
}

impl WriterStats {
    /// Adds `other`'s totals to these (the writers of one process, one after another).
    pub fn absorb(&mut self, other: &WriterStats) {
        self.snapshots += other.snapshots;
        self.committed += other.committed;
        self.stall += other.stall;
        self.max_stall = self.max_stall.max(other.max_stall);
        self.backpressure += other.backpressure;
        self.persist += other.persist;
        self.bytes += other.bytes;
        self.persist_nice = other.persist_nice.or(self.persist_nice);
    }
}

/// Writes checkpoints in the background.
pub struct AsyncWriter {
    root: PathBuf,
    options: SaveOptions,
    part: Part,
    idle: Vec<Buffer>,
    in_flight: Option<Persist>,
    /// Writer 0 of a parted checkpoint: snapshots whose parts may not all be durable yet.
    pending: Vec<Meta>,
    committing: Option<Commit>,
    durable: u64,
    persist_nice: u8,
    stats: WriterStats,
    last: Option<SaveReport>,
    /// The lock of this writer's part, held while the writer lives (declared last: it is
    /// released after `Drop` has waited for the persists).
    _owner: Option<Owner>,
}

impl AsyncWriter {
    /// How much the persist thread's nice value is raised by default: enough that a
    /// training thread on the same core gets about ten times its share of cycles.
    pub const DEFAULT_PERSIST_NICE: u8 = 10;

    /// A writer into `root` (created if needed; temporaries of crashed writers removed).
    /// Fails with [`CkptError::Busy`] while another process writes into `root`.
    pub fn new(root: &Path, options: SaveOptions) -> Result<Self> {
        Self::for_part(root, options, Part::WHOLE)
    }

    /// One of the writers of parted checkpoints. In a job whose writers never change
    /// (group 0) each takes the lock of its part (see [`owner`](crate::owner)); writer 0
    /// then removes the temporaries of crashed writers, so it must be created before any
    /// other writer starts to persist.
    ///
    /// In an elastic job (the group is the membership's epoch) a process writes part 2 in
    /// one epoch and part 0 in the next, so only writer 0, the one that commits, takes the
    /// root's lock: a former committer still finishing makes it [`CkptError::Busy`]. It
    /// removes every temporary but its own group's, whose other writers may be persisting
    /// already; a part of another group being written then fails its writer, and is never
    /// committed.
    pub fn for_part(root: &Path, options: SaveOptions, part: Part) -> Result<Self> {
        Self::for_part_of(root, options, part, None)
    }

    /// [`for_part`](AsyncWriter::for_part) for a member of job `job`, which its lock file
    /// names (see [`owner`](crate::owner)).
    pub fn for_part_of(root: &Path, options: SaveOptions, part: Part, job: Option<&str>) -> Result<Self> {
        if part.count == 0 || part.index >= part.count {
            return Err(CkptError::Mismatch(format!("writer {} of {} does not exist", part.index, part.count)));
        }
        let owner = match (part.group, part.index) {
            (0, index) => Some(Owner::acquire_for(root, index, job)?),
            (_, 0) => Some(Owner::acquire_for(root, 0, job)?),
            _ => {
                std::fs::create_dir_all(root).map_err(CkptError::io("cannot create", root))?;
                None
            }
        };
        if part.index == 0 {
            remove_stale_temporaries_for(root, part)?;
        }
        Ok(AsyncWriter {
            root: root.to_owned(),
            options,
            part,
            idle: Vec::new(),
            in_flight: None,
            pending: Vec::new(),
            committing: None,
            durable: 0,
            persist_nice: Self::DEFAULT_PERSIST_NICE,
            stats: WriterStats::default(),
            last: None,
            _owner: owner,
        })
    }

    /// Sets how much the persist thread's nice value is raised above the caller's
    /// (clamped to the system's range; 0 persists at training's priority).
    pub fn set_persist_nice(&mut self, increment: u8) {
        self.persist_nice = increment;
    }

    /// Whether a persist is still running (after noticing one that has finished): a
    /// snapshot now would wait for it.
    pub fn busy(&mut self) -> Result<bool> {
        self.poll()?;
        Ok(self.in_flight.is_some())
    }

    /// Copies `tensors` (all of the state, in registry order; a parted writer copies its
    /// own shards only) and starts persisting them as the checkpoint described by `meta`.
    /// Returns how long the caller was blocked.
    pub fn snapshot(&mut self, meta: Meta, all: &[TensorRef<'_>]) -> Result<Duration> {
        let raw: Vec<RawTensorRef<'_>> = all.iter().map(|&t| t.into()).collect();
        self.snapshot_raw(meta, &raw)
    }

    /// [`snapshot`](AsyncWriter::snapshot) of tensors of any element type (a PyTorch
    /// state's), as little-endian bytes.
    pub fn snapshot_raw(&mut self, meta: Meta, all: &[RawTensorRef<'_>]) -> Result<Duration> {
        let started = Instant::now();
        self.wait_in_flight()?;
        let backpressure = started.elapsed();
        let (plan, mine) = self.own_tensors(all);
        let buffers = Self::copy_into(std::mem::take(&mut self.idle), &mine)?;
        let root = self.root.clone();
        let options = self.options;
        let part = self.part;
        if part.count > 1 && part.index == 0 {
            // A pending step not older than this one was abandoned: the job went back.
            self.pending.retain(|m| m.step < meta.step);
            self.pending.push(meta.clone());
        }
        // Shard i of the plan holds the next `r.len()` buffers.
        let counts: Vec<(usize, usize)> = plan.iter().map(|(i, r)| (*i, r.len())).collect();
        let nice = self.persist_nice;
        self.in_flight = Some(std::thread::spawn(move || {
            let nice = lower_own_priority(nice);
            let refs: Vec<RawTensorRef<'_>> = buffers.iter().map(Buffer::as_ref).collect();
            let result = if part.count == 1 {
                save_raw(&root, &meta, &refs, &options).map(Persisted::Committed)
            } else {
                let started = Instant::now();
                let mut rest = &refs[..];
                let shards: Vec<(usize, Vec<RawTensorRef<'_>>)> = counts
                    .iter()
                    .map(|&(i, n)| {
                        let (head, tail) = rest.split_at(n);
                        rest = tail;
                        (i, head.to_vec())
                    })
                    .collect();
                save_part_raw(&root, &meta, part, &shards).map(|bytes| Persisted::Part {
                    step: meta.step,
                    bytes,
                    duration: started.elapsed(),
                })
            };
            drop(refs);
            (buffers, nice, result)
        }));
        let stall = started.elapsed();
        self.stats.snapshots += 1;
        self.stats.stall += stall;
        self.stats.max_stall = self.stats.max_stall.max(stall);
        self.stats.backpressure += backpressure;
        Ok(stall)
    }

    /// Allocates the snapshot's buffers for `all` (as [`snapshot`](AsyncWriter::snapshot)
    /// takes it) and fills them with its values, without persisting anything. A fresh
    /// buffer's pages are mapped by the system on first write, which for a large state
    /// costs far more than the copy itself (seconds for a gigabyte on a virtual machine);
    /// calling this before training moves that cost out of the first checkpoint's stall.
    /// Optional: a first snapshot without it allocates the buffers itself.
    pub fn prepare(&mut self, all: &[TensorRef<'_>]) -> Result<()> {
        self.wait_in_flight()?;
        let raw: Vec<RawTensorRef<'_>> = all.iter().map(|&t| t.into()).collect();
        let (_, mine) = self.own_tensors(&raw);
        self.idle = Self::copy_into(std::mem::take(&mut self.idle), &mine)?;
        Ok(())
    }

    /// The shard plan (parted writers) and the tensors this writer copies, in order.
    fn own_tensors<'a>(
        &self,
        all: &[RawTensorRef<'a>],
    ) -> (Vec<(usize, std::ops::Range<usize>)>, Vec<RawTensorRef<'a>>) {
        if self.part.count == 1 {
            return (Vec::new(), all.to_vec());
        }
        let sizes: Vec<u64> = all.iter().map(|t| t.bytes.len() as u64).collect();
        let plan = self.part.shards(&sizes, self.options.shards);
        let mine = plan.iter().flat_map(|(_, r)| all[r.clone()].iter().copied()).collect();
        (plan, mine)
    }

    /// Copies `tensors` into `buffers`, reusing them when they have the same names and
    /// lengths and allocating new ones (filled by the copy itself) when not.
    fn copy_into(mut buffers: Vec<Buffer>, tensors: &[RawTensorRef<'_>]) -> Result<Vec<Buffer>> {
        let reusable = buffers.len() == tensors.len()
            && buffers.iter().zip(tensors).all(|(b, t)| b.name == t.name && b.data.len() == t.bytes.len());
        if !reusable {
            // The snapshot is a second copy of the state: where memory runs short, that is
            // an error naming the tensor, not an abort of the process.
            return tensors
                .iter()
                .map(|t| {
                    let mut data = Vec::new();
                    data.try_reserve_exact(t.bytes.len()).map_err(|_| CkptError::OutOfMemory {
                        bytes: t.bytes.len() as u64,
                        tensor: t.name.to_owned(),
                    })?;
                    data.extend_from_slice(t.bytes);
                    Ok(Buffer { name: t.name.to_owned(), role: t.role, dtype: t.dtype, shape: t.shape.to_vec(), data })
                })
                .collect();
        }
        for (b, t) in buffers.iter_mut().zip(tensors) {
            b.data.copy_from_slice(t.bytes);
            (b.role, b.dtype) = (t.role, t.dtype);
            b.shape.clear();
            b.shape.extend_from_slice(t.shape);
        }
        Ok(buffers)
    }

    /// Waits for the persist in flight, if any, and (writer 0) for the commits started;
    /// reports the last commit.
    pub fn finish(&mut self) -> Result<Option<SaveReport>> {
        self.wait_in_flight()?;
        self.wait_committing()?;
        Ok(self.last.clone())
    }

    /// Waits for this writer's persist in flight, if any (its part is then durable).
    pub fn wait_persisted(&mut self) -> Result<()> {
        self.wait_in_flight()
    }

    /// Notices, without waiting, a persist that has finished.
    pub fn poll(&mut self) -> Result<()> {
        if self.in_flight.as_ref().is_some_and(|h| h.is_finished()) {
            self.wait_in_flight()?;
        }
        Ok(())
    }

    /// The newest step whose part (or whole checkpoint) this writer has made durable,
    /// as far as it has noticed ([`poll`](AsyncWriter::poll)); 0 for none.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Writer 0 of parted checkpoints: every writer has made its part of every step up
    /// to `step` durable, so commit the pending checkpoints up to it, in the background.
    /// Does nothing on other writers or when nothing is pending.
    pub fn commit_through(&mut self, step: u64) -> Result<()> {
        if self.part.index != 0 || self.part.count == 1 || !self.pending.iter().any(|m| m.step <= step) {
            return Ok(());
        }
        self.wait_committing()?;
        let ready: Vec<Meta> = self.pending.iter().filter(|m| m.step <= step).cloned().collect();
        self.pending.retain(|m| m.step > step);
        let (root, parts, retention) = (self.root.clone(), self.part, self.options.retention);
        self.committing = Some(std::thread::spawn(move || {
            ready.iter().map(|meta| commit_parts(&root, meta, parts, retention)).collect()
        }));
        Ok(())
    }

    fn wait_committing(&mut self) -> Result<()> {
        if let Some(handle) = self.committing.take() {
            let reports =
                handle.join().map_err(|_| CkptError::Mismatch("the checkpoint commit thread panicked".into()))??;
            for report in reports {
                self.stats.committed += 1;
                self.stats.persist += report.duration;
                self.last = Some(report);
            }
        }
        Ok(())
    }

    /// Forgets the checkpoints snapshotted but not committed: another writer's part of
    /// them may never come (a job that lost a writer goes on with a replacement, which
    /// writes only the checkpoints taken after it joined). Their temporary files are left
    /// for the next start of writer 0 to remove.
    pub fn forget_pending(&mut self) {
        self.pending.clear();
    }

    /// Totals so far.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    fn wait_in_flight(&mut self) -> Result<()> {
        if let Some(handle) = self.in_flight.take() {
            let (buffers, nice, result) =
                handle.join().map_err(|_| CkptError::Mismatch("the checkpoint writer thread panicked".into()))?;
            self.idle = buffers;
            self.stats.persist_nice = nice;
            match result? {
                Persisted::Committed(report) => {
                    self.durable = report.step;
                    self.stats.committed += 1;
                    self.stats.persist += report.duration;
                    self.stats.bytes += report.bytes;
                    self.last = Some(report);
                }
                Persisted::Part { step, bytes, duration } => {
                    self.durable = step;
                    self.stats.persist += duration;
                    self.stats.bytes += bytes;
                }
            }
        }
        Ok(())
    }
}

/// Raises the calling thread's nice value by `increment` (clamped to 19); returns the
/// value it now runs at, or `None` where the system refuses to say or to change it (the
/// persist then simply runs at the caller's priority). Linux keeps a nice value per
/// thread, so this leaves the rest of the process as it was.
fn lower_own_priority(increment: u8) -> Option<i32> {
    let me = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(me)).ok()?;
    if increment == 0 {
        return Some(now);
    }
    let target = now.saturating_add(i32::from(increment)).min(19);
    match rustix::process::setpriority_process(Some(me), target) {
        Ok(()) => Some(target),
        Err(e) => {
            tracing::debug!("cannot lower the checkpoint persist thread's priority: {e}");
            Some(now)
        }
    }
}

impl Drop for AsyncWriter {
    fn drop(&mut self) {
        if let Err(e) = self.wait_in_flight().and_then(|()| self.wait_committing()) {
            tracing::error!("checkpoint persist failed: {e}");
        }
    }
}
