//! `events.jsonl`: a job's record of what happened to its workers, beside the
//! `metrics.jsonl` of its steps, in the run's output directory.
//!
//! `metrics.jsonl` is written by a worker, and a worker cannot say why another died: worker 0
//! killed with SIGKILL writes nothing, and its replacement does not know that it replaces
//! anyone. The job's record is kept instead by whoever watches the workers and holds the
//! coordinator: the launcher (`steadfast launch`). On one host that launcher; across nodes the
//! one that serves the coordinator (node 0's, or, when the nodes meet in etcd, the holder of
//! the coordinator role, from its election until it loses the role). So one process at a
//! time writes it, it outlives the loss of any worker, worker 0 included, and it knows how
//! each of its own workers ended: the signal that killed it, or the status it exited with.
//!
//! Each line is one [`JobEvent`]: its [`EventKind`], the time it was written (seconds since
//! the Unix epoch, as in `metrics.jsonl`, so that the two files fall on one time line), and
//! what it concerns: the worker (its slot), the process of that slot (from 1), its node, the
//! epoch and step when known, and the cause. `steadfast report` reads both files.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A worker process was lost: it died (a signal, a panic), exited with an error, or the
    /// coordinator lost it (silent, its connection closed, its lease in etcd expired).
    Lost,
    /// A new process took a lost worker's slot.
    Replaced,
    /// A lost pipeline worker's micro-batches went to the surviving workers of its stage.
    Rerouted,
    /// A process joined the running job: a replacement, a worker back, a new worker.
    Joined,
    /// A process was refused its slot (another holds it).
    Refused,
    /// The coordinator formed an epoch: its members, the step they start from, who fetches
    /// the state or rolls forward.
    Quorum,
    /// The epoch's members hold its state: stepping (again).
    EpochStarted,
    /// This launcher was elected to the coordinator role (in etcd) and keeps the record.
    Elected,
    /// This launcher lost the coordinator role: another keeps the record from now on.
    RoleLost,
    /// Every member holds the final state.
    Finished,
    /// The job cannot go on.
    Stopped,
}

impl EventKind {
    /// The kind as the record spells it (`"lost"`, `"epoch_started"`, ...).
    pub fn word(self) -> &'static str {
        match self {
            EventKind::Lost => "lost",
            EventKind::Replaced => "replaced",
            EventKind::Rerouted => "rerouted",
            EventKind::Joined => "joined",
            EventKind::Refused => "refused",
            EventKind::Quorum => "quorum",
            EventKind::EpochStarted => "epoch_started",
            EventKind::Elected => "elected",
            EventKind::RoleLost => "role_lost",
            EventKind::Finished => "finished",
            EventKind::Stopped => "stopped",
        }
    }
}

/// One line of `events.jsonl` (fields that do not apply are left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    /// What happened.
    pub kind: EventKind,
    /// When it was written: seconds since the Unix epoch, to the millisecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    /// The worker it concerns: its slot (its rank at the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u64>,
    /// Which process of the slot, from 1 (a replacement is process 2, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<u64>,
    /// The node the worker (or the launcher) runs on, in a job of several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// The epoch it concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The step it concerns, when the writer knows it (a loss seen by the launcher has
    /// none: the report places it on the steps by its time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// An epoch's members, or the workers that remain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<u64>>,
    /// The coordinator's generation (an election).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Why: the signal or exit status, the silence, the expired lease, the reason to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// What was done about it: the restart it used, who fetches the state from whom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
}

impl JobEvent {
    /// An event of `kind` that concerns nothing in particular yet.
    pub fn of(kind: EventKind) -> JobEvent {
        JobEvent {
            kind,
            time: None,
            worker: None,
            process: None,
            node: None,
            epoch: None,
            step: None,
            members: None,
            generation: None,
            cause: None,
            how: None,
        }
    }

    /// Concerning process `incarnation` (from 0) of worker `slot`.
    pub fn worker(mut self, slot: u64, incarnation: u64) -> JobEvent {
        self.worker = Some(slot);
        self.process = Some(incarnation + 1);
        self
    }

    /// On node `node` (nothing when `None`).
    pub fn node(mut self, node: Option<u64>) -> JobEvent {
        self.node = node;
        self
    }

    /// In epoch `epoch`.
    pub fn epoch(mut self, epoch: u64) -> JobEvent {
        self.epoch = Some(epoch);
        self
    }

    /// At step `step`.
    pub fn step(mut self, step: u64) -> JobEvent {
        self.step = Some(step);
        self
    }

    /// With these members.
    pub fn members(mut self, members: impl IntoIterator<Item = u64>) -> JobEvent {
        self.members = Some(members.into_iter().collect());
        self
    }

    /// Of the coordinator's generation `generation`.
    pub fn generation(mut self, generation: u64) -> JobEvent {
        self.generation = Some(generation);
        self
    }

    /// Because of `cause`.
    pub fn cause(mut self, cause: impl Into<String>) -> JobEvent {
        self.cause = Some(cause.into());
        self
    }

    /// Dealt with so.
    pub fn how(mut self, how: impl Into<String>) -> JobEvent {
        self.how = Some(how.into());
        self
    }

    /// Reads one line of the record; what is wrong with it otherwise.
    pub fn parse(line: &str) -> Result<JobEvent, String> {
        serde_json::from_str(line).map_err(|e| e.to_string())
    }
}

/// Seconds since the Unix epoch, to the millisecond: the time of a line of the record (and
/// of `metrics.jsonl`).
pub fn now() -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (now.as_secs_f64() * 1000.0).round() / 1000.0
}

/// `events.jsonl`, open for the one process that keeps the job's record. It never fails
/// the job: a line that cannot be written is said once in a warning, and the record stops.
pub struct JobRecord {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl JobRecord {
    /// The file name of the record in a run's output directory.
    pub const FILE: &'static str = "events.jsonl";

    /// Opens `dir/events.jsonl`: emptied when `fresh` (a new job), else appended to (a
    /// launcher elected to keep the record of a running job). Creates `dir`.
    pub fn open(dir: &Path, fresh: bool) -> std::io::Result<JobRecord> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(JobRecord::FILE);
        // Always in append mode, emptied first for a fresh record: a launcher whose file
        // another emptied meanwhile (another job given the same `--out`) goes on at its end,
        // never at a stale offset that would leave a hole of zeros.
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        // One keeper at a time: a second job given the same `--out` leaves the first's
        // record alone. (The kernel releases the lock when its keeper dies.)
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(std::io::Error::other(
                    "another process keeps this job record (another job on this --out?)",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        if fresh {
            file.set_len(0)?;
        }
        tracing::debug!(path = %path.display(), fresh, "keeping the job's record");
        Ok(JobRecord { path, file: Some(file) })
    }

    /// Where the record is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `event` as one line (one write, so that a record handed from one launcher to
    /// another never has a line split), stamped with the time unless it carries the time
    /// it happened (a loss the coordinator saw before the launcher reaped the process).
    pub fn write(&mut self, mut event: JobEvent) {
        let Some(file) = self.file.as_mut() else { return };
        event.time = event.time.or_else(|| Some(now()));
        let written = serde_json::to_string(&event)
            .map_err(std::io::Error::other)
            .and_then(|line| file.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), "cannot write the job's record ({e}): it stops here");
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_with_only_what_applies() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut record = JobRecord::open(&dir, true).unwrap();
        record.write(JobEvent::of(EventKind::Lost).worker(0, 0).cause("killed by signal 9 (SIGKILL)"));
        record.write(JobEvent::of(EventKind::Replaced).worker(0, 1).how("restart 1 of 1"));
        // While one keeps it, nobody else opens it (nor empties it); a launcher elected
        // later, once the first let go, appends.
        assert!(JobRecord::open(&dir, true).is_err());
        assert_eq!(std::fs::read_to_string(dir.join(JobRecord::FILE)).unwrap().lines().count(), 2);
        drop(record);
        let mut next = JobRecord::open(&dir, false).unwrap();
        next.write(JobEvent::of(EventKind::Elected).generation(1).node(Some(1)));
        let text = std::fs::read_to_string(dir.join(JobRecord::FILE)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with(r#"{"kind":"lost","time":"#), "{text}");
        assert!(lines[0].ends_with(r#","worker":0,"process":1,"cause":"killed by signal 9 (SIGKILL)"}"#), "{text}");
        let back = JobEvent::parse(lines[2]).unwrap();
        assert_eq!((back.kind, back.generation, back.node, back.worker), (EventKind::Elected, Some(1), Some(1), None));
        assert_eq!(EventKind::EpochStarted.word(), "epoch_started");
        // A fresh job empties the record.
        drop(next);
        drop(JobRecord::open(&dir, true).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join(JobRecord::FILE)).unwrap(), "");
    }
}
