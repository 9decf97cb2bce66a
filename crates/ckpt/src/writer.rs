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

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Role;
use crate::error::{CkptError, Result};
use crate::manifest::Meta;
use crate::store::{SaveOptions, SaveReport, TensorRef, remove_stale_temporaries, save};

/// An owned copy of one tensor (a reusable snapshot buffer).
#[derive(Debug)]
struct Buffer {
    name: String,
    role: Role,
    shape: Vec<usize>,
    data: Vec<f32>,
}

type Persist = JoinHandle<(Vec<Buffer>, Result<SaveReport>)>;

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
}

/// Writes checkpoints in the background.
pub struct AsyncWriter {
    root: PathBuf,
    options: SaveOptions,
    idle: Vec<Buffer>,
    in_flight: Option<Persist>,
    stats: WriterStats,
    last: Option<SaveReport>,
}

impl AsyncWriter {
    /// A writer into `root` (created if needed; temporaries of crashed writers removed).
    pub fn new(root: &Path, options: SaveOptions) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(CkptError::io("cannot create", root))?;
        remove_stale_temporaries(root)?;
        Ok(AsyncWriter {
            root: root.to_owned(),
            options,
            idle: Vec::new(),
            in_flight: None,
            stats: WriterStats::default(),
            last: None,
        })
    }

    /// Copies `tensors` and starts persisting them as the checkpoint described by `meta`.
    /// Returns how long the caller was blocked.
    pub fn snapshot(&mut self, meta: Meta, tensors: &[TensorRef<'_>]) -> Result<Duration> {
        let started = Instant::now();
        self.wait_in_flight()?;
        let backpressure = started.elapsed();
        let mut buffers = std::mem::take(&mut self.idle);
        let reusable = buffers.len() == tensors.len()
            && buffers.iter().zip(tensors).all(|(b, t)| b.name == t.name && b.data.len() == t.data.len());
        if !reusable {
            buffers = tensors
                .iter()
                .map(|t| Buffer {
                    name: t.name.to_owned(),
                    role: t.role,
                    shape: t.shape.to_vec(),
                    data: vec![0.0; t.data.len()],
                })
                .collect();
        }
        for (b, t) in buffers.iter_mut().zip(tensors) {
            b.data.copy_from_slice(t.data);
            b.role = t.role;
            b.shape.clear();
            b.shape.extend_from_slice(t.shape);
        }
        let root = self.root.clone();
        let options = self.options;
        self.in_flight = Some(std::thread::spawn(move || {
            let refs: Vec<TensorRef<'_>> = buffers
                .iter()
                .map(|b| TensorRef { name: &b.name, role: b.role, shape: &b.shape, data: &b.data })
                .collect();
            let result = save(&root, &meta, &refs, &options);
            drop(refs);
            (buffers, result)
        }));
        let stall = started.elapsed();
        self.stats.snapshots += 1;
        self.stats.stall += stall;
        self.stats.max_stall = self.stats.max_stall.max(stall);
        self.stats.backpressure += backpressure;
        Ok(stall)
    }

    /// Waits for the persist in flight, if any, and reports its outcome.
    pub fn finish(&mut self) -> Result<Option<SaveReport>> {
        self.wait_in_flight()?;
        Ok(self.last.clone())
    }

    /// Totals so far.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    fn wait_in_flight(&mut self) -> Result<()> {
        if let Some(handle) = self.in_flight.take() {
            let (buffers, result) =
                handle.join().map_err(|_| CkptError::Mismatch("the checkpoint writer thread panicked".into()))?;
            self.idle = buffers;
            let report = result?;
            self.stats.committed += 1;
            self.stats.persist += report.duration;
            self.stats.bytes += report.bytes;
            self.last = Some(report);
        }
        Ok(())
    }
}

impl Drop for AsyncWriter {
    fn drop(&mut self) {
        if let Err(e) = self.wait_in_flight() {
            tracing::error!("checkpoint persist failed: {e}");
        }
    }
}
