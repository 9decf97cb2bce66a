//! Boundary logs: what a pipeline stage sends across a stage boundary, step by step, kept
//! on local storage so that a lost neighbour can be rebuilt by replaying its inputs.
//!
//! A [`LogWriter`] belongs to one directed boundary of one pipeline ([`Edge`]: the
//! activations stage `s` sends to `s + 1`, or the gradients `s + 1` sends back to `s`).
//! Training hands it each tensor as it is sent ([`LogWriter::record`]); the call copies
//! the values into a buffer and returns, and a background thread writes them. The bytes
//! waiting for that thread are bounded: a record that would exceed the budget waits
//! until the thread has written enough (the wait is counted as a stall). Once a
//! checkpoint of every stage makes the older steps unnecessary,
//! [`LogWriter::prune_before`] removes their files, also on the background thread.
//!
//! # Layout and format
//!
//! `<dir>/replica-<d>/<from>-to-<to>/step-<8 digits>.log`, one file a step, written as
//! `….log.tmp` and renamed when the step is complete: a file with the final name is
//! complete, and a `.tmp` left by a crash is ignored and removed by the next writer.
//! All integers are little-endian:
//!
//! | part | bytes |
//! |---|---|
//! | header | `SFBLOG01` (8), step u64, replica u32, from u32, to u32, reserved u32 (0) |
//! | each record | micro-batch u32, reserved u32 (0), value count u64, xxh3-64 of the values u64, the values (f32) |
//! | trailer | `SFBLOGND` (8), record count u64, xxh3-64 of every record's first 24 bytes in order u64 |
//!
//! [`read_step`] checks all of it: a missing, truncated, reordered or altered file is
//! an error that names the file and what is wrong, never wrong values.
//!
//! Logs survive the death of the process that writes them (the page cache keeps what was
//! written), not the loss of the machine: they are not synced.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64;

use crate::owner::Owner;

const MAGIC: &[u8; 8] = b"SFBLOG01";
const END: &[u8; 8] = b"SFBLOGND";
const HEADER: usize = 32;
const RECORD: usize = 24;
const TRAILER: usize = 24;

/// One directed boundary of one pipeline: what stage `from` of replica `replica` sends to
/// stage `to` (its neighbour).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    /// The pipeline.
    pub replica: u32,
    /// The sending stage.
    pub from: u32,
    /// The receiving stage.
    pub to: u32,
}

impl Edge {
    /// The boundary's directory under a log root.
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(format!("replica-{}", self.replica)).join(format!("{}-to-{}", self.from, self.to))
    }
}

/// The file of `step` in a boundary's directory.
pub fn step_path(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}.log"))
}

fn parse_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?.strip_suffix(".log")?;
    (digits.len() == 8 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

/// A boundary log that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The operating system refused an operation.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// No complete file for a step that was asked for.
    #[error("no boundary log of step {step} in {dir}")]
    Missing {
        /// The boundary's directory.
        dir: PathBuf,
        /// The step.
        step: u64,
    },
    /// The file ends early: it was cut off.
    #[error("boundary log {path} is truncated: {reason}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The file does not follow the format, or a checksum does not match.
    #[error("boundary log {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// Another live process writes this boundary's log.
    #[error("{0}")]
    Busy(String),
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LogError + use<> {
    let path = path.to_owned();
    move |source| LogError::Io { op, path, source }
}

/// One tensor of a step's log: the micro-batch it belongs to and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The micro-batch (its index in the global batch).
    pub micro: u32,
    /// The values sent.
    pub values: Vec<f32>,
}

/// What a writer has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogStats {
    /// Records handed to the writer.
    pub records: u64,
    /// Bytes of values handed to the writer.
    pub bytes: u64,
    /// Step files completed.
    pub steps: u64,
    /// Time training waited for the budget.
    pub stall: Duration,
    /// The most bytes that waited for the background thread at once.
    pub peak: u64,
}

enum ToWriter {
    Record { step: u64, micro: u32, values: Vec<f32> },
    EndStep(u64),
    Abandon,
    Prune(u64),
}

/// The bytes waiting for the background thread, bounded by a budget.
struct Budget {
    waiting: Mutex<u64>,
    freed: Condvar,
    cap: u64,
}

/// The writer of one boundary's log (see the module's documentation).
pub struct LogWriter {
    tx: Option<Sender<ToWriter>>,
    thread: Option<JoinHandle<()>>,
    budget: Arc<Budget>,
    /// Buffers the thread has written, for reuse.
    spare: Receiver<Vec<f32>>,
    failure: Arc<Mutex<Option<String>>>,
    stats: LogStats,
    _owner: Owner,
}

impl LogWriter {
    /// Opens the log of `boundary` under `root`, holding at most `budget` bytes of values
    /// in memory. Fails if another live process writes it; removes the `.tmp` files a
    /// dead writer left.
    pub fn open(root: &Path, boundary: Edge, budget: u64) -> Result<LogWriter, LogError> {
        let dir = boundary.dir(root);
        let owner = Owner::acquire(&dir, 0).map_err(|e| LogError::Busy(e.to_string()))?;
        for entry in std::fs::read_dir(&dir).map_err(io("cannot list", &dir))? {
            let path = entry.map_err(io("cannot list", &dir))?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
            }
        }
        let budget = Arc::new(Budget { waiting: Mutex::new(0), freed: Condvar::new(), cap: budget.max(1) });
        let failure = Arc::new(Mutex::new(None));
        let (tx, rx) = channel();
        let (spare_tx, spare) = channel();
        let thread = {
            let (budget, failure) = (Arc::clone(&budget), Arc::clone(&failure));
            std::thread::Builder::new()
                .name(format!("log-{}-{}", boundary.from, boundary.to))
                .spawn(move || background(&dir, boundary, &rx, &budget, &spare_tx, &failure))
                .map_err(io("cannot start the log thread for", root))?
        };
        Ok(LogWriter {
            tx: Some(tx),
            thread: Some(thread),
            budget,
            spare,
            failure,
            stats: LogStats::default(),
            _owner: owner,
        })
    }

    /// Logs `values`, micro-batch `micro`'s tensor of `step`: copies them and returns,
    /// after waiting if the budget is spent.
    pub fn record(&mut self, step: u64, micro: u32, values: &[f32]) {
        let bytes = 4 * values.len() as u64;
        let started = Instant::now();
        {
            let mut waiting = self.budget.waiting.lock().unwrap_or_else(|e| e.into_inner());
            // A record larger than the budget goes alone.
            while *waiting > 0 && *waiting + bytes > self.budget.cap && self.failure().is_none() {
                waiting = self.budget.freed.wait(waiting).unwrap_or_else(|e| e.into_inner());
            }
            *waiting += bytes;
            self.stats.peak = self.stats.peak.max(*waiting);
        }
        self.stats.stall += started.elapsed();
        let mut buf = self.spare.try_recv().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(values);
        self.stats.records += 1;
        self.stats.bytes += bytes;
        self.send(ToWriter::Record { step, micro, values: buf });
    }

    /// Every record of `step` was handed over: its file is completed.
    pub fn end_step(&mut self, step: u64) {
        self.stats.steps += 1;
        self.send(ToWriter::EndStep(step));
    }

    /// The step being logged will not end (it failed, and is computed again): what was
    /// recorded of it is dropped.
    pub fn abandon(&mut self) {
        self.send(ToWriter::Abandon);
    }

    /// Removes the files of the steps before `step` (a checkpoint of every stage at
    /// `step` or later makes them unnecessary).
    pub fn prune_before(&mut self, step: u64) {
        self.send(ToWriter::Prune(step));
    }

    /// Why the background thread stopped writing (a full disk, say), if it did: the log
    /// lacks every step from the one it failed on.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// Waits until everything handed over is written; returns the totals, or why the
    /// thread stopped writing.
    pub fn finish(mut self) -> Result<LogStats, String> {
        self.close();
        match self.failure() {
            Some(f) => Err(f),
            None => Ok(self.stats.clone()),
        }
    }

    fn send(&mut self, msg: ToWriter) {
        if let Some(tx) = &self.tx {
            // The thread ends only when it is dropped; a failed one drains what it gets.
            let _ = tx.send(msg);
        }
    }

    fn close(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.close();
    }
}

/// The background thread: writes records into the open step's temporary file, completes
/// it at `EndStep`, prunes; after a failure it only frees the budget.
fn background(
    dir: &Path,
    boundary: Edge,
    rx: &Receiver<ToWriter>,
    budget: &Budget,
    spare: &Sender<Vec<f32>>,
    failure: &Mutex<Option<String>>,
) {
    let mut open: Option<StepFile> = None;
    for msg in rx {
        let failed = failure.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        let result = match msg {
            ToWriter::Record { step, micro, values } => {
                let bytes = 4 * values.len() as u64;
                let r = if failed { Ok(()) } else { write_record(dir, boundary, &mut open, step, micro, &values) };
                let mut waiting = budget.waiting.lock().unwrap_or_else(|e| e.into_inner());
                *waiting = waiting.saturating_sub(bytes);
                budget.freed.notify_all();
                drop(waiting);
                let _ = spare.send(values);
                r
            }
            ToWriter::EndStep(step) if !failed => match open.take() {
                Some(f) if f.step == step => f.complete(),
                Some(f) => Err(LogError::Corrupt { path: f.tmp, reason: format!("step {} ended as {step}", f.step) }),
                // A step that sent nothing across this boundary: an empty file says so.
                None => StepFile::create(dir, boundary, step).and_then(StepFile::complete),
            },
            ToWriter::Abandon => match open.take() {
                Some(f) => {
                    let tmp = f.tmp.clone();
                    drop(f);
                    std::fs::remove_file(&tmp).map_err(io("cannot remove", &tmp))
                }
                None => Ok(()),
            },
            ToWriter::Prune(before) if !failed => prune(dir, before),
            _ => Ok(()),
        };
        if let Err(e) = result {
            tracing::error!("boundary log {}: {e}; no further step is logged", dir.display());
            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            budget.freed.notify_all();
        }
    }
}

fn write_record(
    dir: &Path,
    boundary: Edge,
    open: &mut Option<StepFile>,
    step: u64,
    micro: u32,
    values: &[f32],
) -> Result<(), LogError> {
    if open.as_ref().is_some_and(|f| f.step != step) {
        let f = open.take().expect("checked");
        return Err(LogError::Corrupt { path: f.tmp, reason: format!("step {} was never ended", f.step) });
    }
    if open.is_none() {
        *open = Some(StepFile::create(dir, boundary, step)?);
    }
    open.as_mut().expect("opened").record(micro, values)
}

/// A step's file being written.
struct StepFile {
    step: u64,
    tmp: PathBuf,
    out: BufWriter<File>,
    records: u64,
    chain: Vec<u8>,
    bytes: Vec<u8>,
}

impl StepFile {
    fn create(dir: &Path, b: Edge, step: u64) -> Result<StepFile, LogError> {
        let tmp = step_path(dir, step).with_extension("log.tmp");
        let file = File::create(&tmp).map_err(io("cannot create", &tmp))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut header = Vec::with_capacity(HEADER);
        header.extend(MAGIC);
        header.extend(step.to_le_bytes());
        for v in [b.replica, b.from, b.to, 0] {
            header.extend(v.to_le_bytes());
        }
        out.write_all(&header).map_err(io("cannot write", &tmp))?;
        Ok(StepFile { step, tmp, out, records: 0, chain: Vec::new(), bytes: Vec::new() })
    }

    fn record(&mut self, micro: u32, values: &[f32]) -> Result<(), LogError> {
        self.bytes.clear();
        self.bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let mut head = [0u8; RECORD];
        head[..4].copy_from_slice(&micro.to_le_bytes());
        head[8..16].copy_from_slice(&(values.len() as u64).to_le_bytes());
        head[16..].copy_from_slice(&xxh3_64(&self.bytes).to_le_bytes());
        self.chain.extend(head);
        self.records += 1;
        self.out.write_all(&head).and_then(|()| self.out.write_all(&self.bytes)).map_err(io("cannot write", &self.tmp))
    }

    fn complete(mut self) -> Result<(), LogError> {
        let mut trailer = Vec::with_capacity(TRAILER);
        trailer.extend(END);
        trailer.extend(self.records.to_le_bytes());
        trailer.extend(xxh3_64(&self.chain).to_le_bytes());
        self.out.write_all(&trailer).and_then(|()| self.out.flush()).map_err(io("cannot write", &self.tmp))?;
        let path = self.tmp.with_extension("");
        std::fs::rename(&self.tmp, &path).map_err(io("cannot rename", &self.tmp))
    }
}

fn prune(dir: &Path, before: u64) -> Result<(), LogError> {
    for (step, path) in steps(dir)? {
        if step < before {
            std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
        }
    }
    Ok(())
}

/// The complete step files of a boundary's directory, by step (none if it does not exist).
pub fn steps(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(io("cannot list", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("cannot list", dir))?;
        if let Some(step) = parse_step(&entry.file_name().to_string_lossy()) {
            found.push((step, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Reads and checks the log of `step` of `boundary` under `root`.
pub fn read_step(root: &Path, boundary: Edge, step: u64) -> Result<Vec<Record>, LogError> {
    let dir = boundary.dir(root);
    let path = step_path(&dir, step);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LogError::Missing { dir, step }),
        Err(e) => return Err(io("cannot read", &path)(e)),
    };
    parse(&bytes, boundary, step).map_err(|(truncated, reason)| match truncated {
        true => LogError::Truncated { path, reason },
        false => LogError::Corrupt { path, reason },
    })
}

/// The records of a step file's `bytes`, or (whether it is cut short, what is wrong).
fn parse(bytes: &[u8], b: Edge, step: u64) -> Result<Vec<Record>, (bool, String)> {
    let short = |what: &str| (true, format!("it ends inside {what} ({} bytes)", bytes.len()));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if bytes.len() < HEADER {
        return Err(short("the header"));
    }
    if &bytes[..8] != MAGIC {
        return Err((false, "it does not start with the boundary log's magic".into()));
    }
    let said = (u64_at(8), u32_at(16), u32_at(20), u32_at(24));
    if said != (step, b.replica, b.from, b.to) {
        return Err((
            false,
            format!("its header says step {} of {}-to-{} of replica {}", said.0, said.2, said.3, said.1),
        ));
    }
    let (mut at, mut records, mut chain) = (HEADER, Vec::new(), Vec::new());
    loop {
        if bytes.len() >= at + 8 && &bytes[at..at + 8] == END {
            break;
        }
        if bytes.len() < at + RECORD {
            return Err(short("a record's header"));
        }
        let (micro, count, sum) = (u32_at(at), u64_at(at + 8), u64_at(at + 16));
        let len =
            usize::try_from(count).ok().and_then(|c| c.checked_mul(4)).ok_or((false, "a record too long".into()))?;
        let end = (at + RECORD).checked_add(len).ok_or((false, "a record too long".into()))?;
        if bytes.len() < end {
            return Err(short(&format!("micro-batch {micro}'s values")));
        }
        let values = &bytes[at + RECORD..end];
        if xxh3_64(values) != sum {
            return Err((false, format!("micro-batch {micro}'s values do not match their checksum")));
        }
        chain.extend(&bytes[at..at + RECORD]);
        records.push(Record {
            micro,
            values: values.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        });
        at = end;
    }
    if bytes.len() != at + TRAILER {
        return Err(if bytes.len() < at + TRAILER {
            short("the trailer")
        } else {
            (false, "bytes after the trailer".into())
        });
    }
    if u64_at(at + 8) != records.len() as u64 || u64_at(at + 16) != xxh3_64(&chain) {
        return Err((false, "the trailer does not match the records".into()));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Edge = Edge { replica: 1, from: 0, to: 1 };

    fn write_steps(root: &Path, steps: std::ops::Range<u64>, budget: u64) -> LogStats {
        let mut w = LogWriter::open(root, B, budget).unwrap();
        for step in steps {
            for micro in [1u32, 3] {
                let values: Vec<f32> = (0..100).map(|i| (step * 1000 + u64::from(micro) * 100 + i) as f32).collect();
                w.record(step, micro, &values);
            }
            w.end_step(step);
        }
        w.finish().unwrap()
    }

    #[test]
    fn what_is_recorded_reads_back_step_by_step() {
        let root = tempfile::tempdir().unwrap();
        let stats = write_steps(root.path(), 3..6, 1 << 20);
        assert_eq!((stats.records, stats.bytes, stats.steps), (6, 2400, 3));
        let got = read_step(root.path(), B, 4).unwrap();
        assert_eq!(got.iter().map(|r| r.micro).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(got[1].values[7], 4307.0);
        assert_eq!(steps(&B.dir(root.path())).unwrap().iter().map(|s| s.0).collect::<Vec<_>>(), [3, 4, 5]);
        assert!(matches!(read_step(root.path(), B, 9), Err(LogError::Missing { step: 9, .. })));
        let other = Edge { replica: 1, from: 1, to: 0 };
        assert!(matches!(read_step(root.path(), other, 4), Err(LogError::Missing { .. })));
    }

    #[test]
    fn memory_waiting_for_the_disk_stays_within_the_budget() {
        let root = tempfile::tempdir().unwrap();
        // Two records of 400 bytes a step, a budget of 500: one waits at a time.
        let stats = write_steps(root.path(), 0..20, 500);
        assert!(stats.peak <= 500, "{stats:?}");
        assert_eq!(read_step(root.path(), B, 19).unwrap().len(), 2);
    }

    #[test]
    fn a_truncated_or_altered_file_is_refused_with_its_name() {
        let root = tempfile::tempdir().unwrap();
        write_steps(root.path(), 0..1, 1 << 20);
        let path = step_path(&B.dir(root.path()), 0);
        let good = std::fs::read(&path).unwrap();
        for cut in [10, HEADER + 5, HEADER + RECORD + 7, good.len() - 3] {
            std::fs::write(&path, &good[..cut]).unwrap();
            let e = read_step(root.path(), B, 0).unwrap_err();
            assert!(matches!(e, LogError::Truncated { .. }), "cut at {cut}: {e}");
            assert!(e.to_string().contains("step-00000000.log"), "{e}");
        }
        for (at, what) in [(HEADER + RECORD + 40, "checksum"), (9, "header says"), (HEADER, "trailer")] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let e = read_step(root.path(), B, 0).unwrap_err();
            assert!(matches!(e, LogError::Corrupt { .. }) && e.to_string().contains(what), "flip at {at}: {e}");
        }
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert!(matches!(read_step(root.path(), B, 0), Err(LogError::Corrupt { .. })));
    }

    #[test]
    fn pruning_removes_older_steps_and_a_dead_writers_leftovers_go() {
        let root = tempfile::tempdir().unwrap();
        let dir = B.dir(root.path());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("step-00000009.log.tmp"), b"half").unwrap();
        let mut w = LogWriter::open(root.path(), B, 1 << 20).unwrap();
        assert!(!dir.join("step-00000009.log.tmp").exists());
        for step in 0..6 {
            w.record(step, 0, &[step as f32]);
            w.end_step(step);
        }
        w.prune_before(4);
        w.finish().unwrap();
        assert_eq!(steps(&dir).unwrap().iter().map(|s| s.0).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn two_writers_of_one_boundary_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let _first = LogWriter::open(root.path(), B, 1 << 20).unwrap();
        let e = LogWriter::open(root.path(), B, 1 << 20).err().expect("refused");
        assert!(matches!(e, LogError::Busy(_)), "{e}");
        // Another boundary of the same pipeline is another writer.
        LogWriter::open(root.path(), Edge { replica: 1, from: 1, to: 0 }, 1 << 20).unwrap();
    }

    #[test]
    fn an_abandoned_step_is_recorded_again_from_nothing() {
        let root = tempfile::tempdir().unwrap();
        let mut w = LogWriter::open(root.path(), B, 1 << 20).unwrap();
        w.record(4, 0, &[1.0]);
        w.record(4, 1, &[2.0]);
        w.abandon();
        w.record(4, 0, &[3.0]);
        w.end_step(4);
        w.finish().unwrap();
        assert_eq!(read_step(root.path(), B, 4).unwrap(), [Record { micro: 0, values: vec![3.0] }]);
    }

    #[test]
    fn a_step_that_sent_nothing_has_an_empty_file() {
        let root = tempfile::tempdir().unwrap();
        let mut w = LogWriter::open(root.path(), B, 1 << 20).unwrap();
        w.end_step(2);
        w.finish().unwrap();
        assert_eq!(read_step(root.path(), B, 2).unwrap(), []);
    }
}
