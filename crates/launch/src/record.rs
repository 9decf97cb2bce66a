//! The launcher's part in the job's record ([`comm::record`]): what it knows that no
//! worker does, written to `events.jsonl` in the workers' output directory (the worker
//! command's `--out`).
//!
//! A launcher knows how each of its workers ended (the signal that killed it, the status
//! it exited with), which processes it killed and why, and which it started in a lost
//! one's place; the coordinator it serves knows every epoch, every loss of a worker on
//! another node, every join. A [`Recorder`] turns both into one event each:
//!
//! - a loss is written once, when the launcher reaps the process (with its signal, and
//!   the coordinator's reason when the coordinator saw it first, or the launcher killed it
//!   for the coordinator); a loss of another node's worker, which this launcher cannot
//!   reap, when the coordinator declares it (silent, its connection closed, its lease in
//!   etcd expired);
//! - a process started in a lost one's slot is a `replaced` event, and its arrival at the
//!   coordinator a `joined` one; joins before the first epoch are the start, not events;
//! - each epoch the coordinator forms is a `quorum` (who fetches, who rolls forward), and
//!   its first step `epoch_started`: the end of a recovery;
//! - an election to the coordinator role (in etcd) opens the record, appending; losing
//!   the role closes it: one launcher writes at a time.
//!
//! Only the launcher that serves the coordinator records: another node's launcher writes
//! nothing (its workers' signals are then not in the record; the coordinator's view of
//! their loss is).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitStatus;

use comm::control::MembershipEvent;
use comm::record::{EventKind, JobEvent, JobRecord};

use crate::slots::SlotMap;

/// The output directory of the worker command `command` (`train ... --out DIR`), where the
/// job's record goes beside the workers' `metrics.jsonl`; `None` for a command that is not
/// `train`.
pub fn out_dir(command: &[String]) -> Option<PathBuf> {
    if command.first().map(String::as_str) != Some("train") {
        return None;
    }
    let mut dir = None;
    for (i, arg) in command.iter().enumerate() {
        if arg == "--" {
            break;
        }
        if arg == "--out" {
            dir = command.get(i + 1).map(PathBuf::from);
        } else if let Some(d) = arg.strip_prefix("--out=") {
            dir = Some(PathBuf::from(d));
        }
    }
    Some(dir.unwrap_or_else(|| PathBuf::from(comm::job::DEFAULT_OUT)))
}

/// How a process ended, in words: `killed by signal 9 (SIGKILL)`, `exited with status 1`.
pub fn exit_cause(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(signal), _) => match signal_name(signal) {
            Some(name) => format!("killed by signal {signal} ({name})"),
            None => format!("killed by signal {signal}"),
        },
        (None, Some(101)) => "panicked (exit status 101)".to_owned(),
        (None, Some(code)) => format!("exited with status {code}"),
        (None, None) => format!("ended ({status})"),
    }
}

/// The name of a common Linux signal.
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        _ => return None,
    })
}

/// The launcher's side of the job's record (see the module's documentation).
pub struct Recorder {
    /// Where the record goes (`None`: the command is not `train`; nothing is recorded).
    dir: Option<PathBuf>,
    record: Option<JobRecord>,
    /// Where each slot runs, in a job of several nodes.
    nodes: Option<SlotMap>,
    /// This node's slots.
    local: Vec<usize>,
    /// The coordinator's reason for each local process it lost, and when, until the
    /// launcher reaps it.
    seen_lost: BTreeMap<(usize, u64), (String, f64)>,
    /// The local processes this launcher killed (the coordinator lost them).
    killed: BTreeSet<(usize, u64)>,
    /// Whether the coordinator formed its first epoch (joins before it are the start).
    formed: bool,
    /// Whether the job is over (a worker killed after that is no loss).
    over: bool,
    /// Whether the workers resume a run (`--resume`): its record goes on, as their
    /// `metrics.jsonl` does.
    resumes: bool,
}

impl Recorder {
    /// A recorder for the job whose worker command is `command`, of whose slots this node
    /// runs `local`; `nodes` in a job of several nodes. It writes nothing until
    /// [`Recorder::open`].
    pub fn new(command: &[String], local: Vec<usize>, nodes: Option<SlotMap>) -> Recorder {
        Recorder {
            dir: out_dir(command),
            record: None,
            nodes,
            local,
            seen_lost: BTreeMap::new(),
            killed: BTreeSet::new(),
            formed: false,
            over: false,
            resumes: command.iter().any(|a| a == "--resume" || a.starts_with("--resume=")),
        }
    }

    /// Starts keeping the record: a new one when `fresh` (the job starts) unless the
    /// workers resume a run, else appended to (this launcher takes the record over from
    /// another). A record that cannot be opened is said in a warning; the job goes on
    /// without it.
    pub fn open(&mut self, fresh: bool) {
        let Some(dir) = &self.dir else { return };
        match JobRecord::open(dir, fresh && !self.resumes) {
            Ok(r) => self.record = Some(r),
            Err(e) => {
                eprintln!("[launcher] cannot keep the job's record in {}: {e}", dir.join(JobRecord::FILE).display());
            }
        }
    }

    /// Stops keeping the record (another launcher keeps it now).
    pub fn close(&mut self) {
        self.record = None;
    }

    fn node_of(&self, slot: usize) -> Option<u64> {
        self.nodes.map(|n| n.node_of(slot) as u64)
    }

    fn write(&mut self, event: JobEvent) {
        if let Some(r) = self.record.as_mut() {
            r.write(event);
        }
    }

    /// The launcher kills process `incarnation` of `slot` because the coordinator lost it.
    pub fn killing(&mut self, slot: usize, incarnation: u64) {
        self.killed.insert((slot, incarnation));
    }

    /// Process `incarnation` of the local `slot` exited with `status`: a loss unless it
    /// succeeded or the job was over.
    pub fn exited(&mut self, slot: usize, incarnation: u64, status: Result<ExitStatus, &str>) {
        let seen = self.seen_lost.remove(&(slot, incarnation));
        let killed = self.killed.remove(&(slot, incarnation));
        if matches!(status, Ok(s) if s.success()) || self.over {
            return;
        }
        let ended = match status {
            Ok(s) => exit_cause(s),
            Err(why) => format!("could not be reaped: {why}"),
        };
        let cause = match (&seen, killed) {
            (Some((reason, _)), true) => format!("the coordinator lost it ({reason}); the launcher ended it: {ended}"),
            (None, true) => format!("the coordinator lost it; the launcher ended it: {ended}"),
            (Some((reason, _)), false) => format!("{ended} (the coordinator: {reason})"),
            (None, false) => ended,
        };
        let event = JobEvent::of(EventKind::Lost).worker(slot as u64, incarnation).node(self.node_of(slot));
        // Placed when the job first noticed: the coordinator may have seen it first.
        self.write(JobEvent { time: seen.map(|(_, at)| at), ..event.cause(cause) });
    }

    /// A new process `incarnation` takes the lost worker's `slot` (restart `restart` of
    /// `max`).
    pub fn replaced(&mut self, slot: usize, incarnation: u64, restart: u32, max: u32) {
        let event = JobEvent::of(EventKind::Replaced).worker(slot as u64, incarnation).node(self.node_of(slot));
        self.write(event.how(format!("restart {restart} of {max}")));
    }

    /// The lost worker `slot` is not replaced: `how` says who takes its work over.
    pub fn rerouted(&mut self, slot: usize, remaining: impl IntoIterator<Item = u64>, how: &str) {
        let event = JobEvent::of(EventKind::Rerouted).node(self.node_of(slot)).members(remaining);
        self.write(JobEvent { worker: Some(slot as u64), ..event }.how(how));
    }

    /// This launcher was elected to the coordinator role (`generation`, on `node`): it
    /// keeps the record from now on, appending to it unless the job starts now.
    pub fn elected(&mut self, generation: u64, node: Option<u64>) {
        self.open(generation == 0);
        let cause = if generation == 0 {
            "the job's first election".to_owned()
        } else {
            format!("the holder of generation {} is gone: this launcher took the role over", generation - 1)
        };
        self.write(JobEvent::of(EventKind::Elected).generation(generation).node(node).cause(cause));
    }

    /// This launcher lost the coordinator role (`why`): its last line.
    pub fn role_lost(&mut self, why: &str, node: Option<u64>) {
        self.write(JobEvent::of(EventKind::RoleLost).node(node).cause(why));
        self.close();
    }

    /// What the coordinator this launcher serves said.
    pub fn said(&mut self, event: &MembershipEvent) {
        let e = match event {
            MembershipEvent::Lost { id, incarnation, reason } => {
                let slot = *id as usize;
                if self.local.contains(&slot) {
                    // Written when the launcher reaps it, with how it ended.
                    self.seen_lost.insert((slot, *incarnation), (reason.clone(), comm::record::now()));
                    return;
                }
                JobEvent::of(EventKind::Lost)
                    .worker(u64::from(*id), *incarnation)
                    .node(self.node_of(slot))
                    .cause(reason)
            }
            MembershipEvent::Joined { id, incarnation } => {
                if !self.formed {
                    return;
                }
                JobEvent::of(EventKind::Joined).worker(u64::from(*id), *incarnation).node(self.node_of(*id as usize))
            }
            MembershipEvent::Refused { id, incarnation, reason } => {
                JobEvent::of(EventKind::Refused).worker(u64::from(*id), *incarnation).cause(reason)
            }
            MembershipEvent::Quorum { quorum: q, rolling, fetching } => {
                self.formed = true;
                let how = comm::control::how_members_sync(q, rolling, fetching);
                let event = JobEvent::of(EventKind::Quorum).epoch(q.epoch).step(q.step);
                let event = event.members(q.members.iter().map(|&m| u64::from(m)));
                if how.is_empty() { event } else { event.how(how.join("; ")) }
            }
            MembershipEvent::Started { epoch } => JobEvent::of(EventKind::EpochStarted).epoch(*epoch),
            MembershipEvent::Finished => {
                self.over = true;
                JobEvent::of(EventKind::Finished)
            }
            MembershipEvent::Stopped { reason } => {
                self.over = true;
                JobEvent::of(EventKind::Stopped).cause(reason)
            }
        };
        self.write(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::Placement;
    use std::os::unix::process::ExitStatusExt;
    use std::path::Path;

    fn record(dir: &Path) -> Vec<JobEvent> {
        let text = std::fs::read_to_string(dir.join(JobRecord::FILE)).unwrap();
        text.lines().map(|l| JobEvent::parse(l).unwrap()).collect()
    }

    /// A directory of its own under the system's temporary one, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            Scratch(std::env::temp_dir().join(format!("steadfast-record-{name}-{}-{nanos}", std::process::id())))
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn command(out: &Path) -> Vec<String> {
        ["train", "--model", "mlp", "--out", out.to_str().unwrap()].map(String::from).to_vec()
    }

    #[test]
    fn the_output_directory_is_the_commands() {
        let c = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(out_dir(&c(&["train", "--out", "runs/x"])), Some(PathBuf::from("runs/x")));
        assert_eq!(out_dir(&c(&["train", "--steps", "3", "--out=runs/y"])), Some(PathBuf::from("runs/y")));
        assert_eq!(out_dir(&c(&["train", "--steps", "3"])), Some(PathBuf::from("runs/train")));
        assert_eq!(out_dir(&c(&["bench", "--out", "x"])), None);
    }

    #[test]
    fn a_signal_is_named() {
        assert_eq!(exit_cause(ExitStatus::from_raw(9)), "killed by signal 9 (SIGKILL)");
        assert_eq!(exit_cause(ExitStatus::from_raw(1 << 8)), "exited with status 1");
        assert_eq!(exit_cause(ExitStatus::from_raw(101 << 8)), "panicked (exit status 101)");
    }

    /// Worker 0 of a 3-worker job killed with SIGKILL and replaced: one loss with the
    /// signal (whichever of the coordinator and the reaper heard first), one replacement,
    /// the replacement's join, the epoch that starts again.
    #[test]
    fn a_killed_worker_is_one_loss_with_its_signal_then_a_replacement() {
        let tmp = Scratch::new("killed");
        let out = tmp.0.join("run");
        let mut r = Recorder::new(&command(&out), vec![0, 1, 2], None);
        r.open(true);
        let quorum = |epoch, fetching: Vec<u32>| MembershipEvent::Quorum {
            quorum: comm::protocol::Quorum::of_replicas((epoch, vec![0, 1, 2]), (20, 1, None), vec![1, 2]),
            rolling: Vec::new(),
            fetching,
        };
        for id in 0..3 {
            r.said(&MembershipEvent::Joined { id, incarnation: 0 });
        }
        r.said(&quorum(1, Vec::new()));
        r.said(&MembershipEvent::Started { epoch: 1 });
        // The coordinator hears the closed connection before the launcher reaps it.
        r.said(&MembershipEvent::Lost { id: 0, incarnation: 0, reason: "its connection closed".into() });
        r.exited(0, 0, Ok(ExitStatus::from_raw(9)));
        r.replaced(0, 1, 1, 1);
        r.said(&MembershipEvent::Joined { id: 0, incarnation: 1 });
        r.said(&quorum(2, vec![0]));
        r.said(&MembershipEvent::Started { epoch: 2 });
        r.said(&MembershipEvent::Finished);
        // Killed after the end: no loss.
        r.exited(1, 0, Ok(ExitStatus::from_raw(9)));
        let events = record(&out);
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.word()).collect();
        assert_eq!(
            kinds,
            ["quorum", "epoch_started", "lost", "replaced", "joined", "quorum", "epoch_started", "finished"]
        );
        let lost = &events[2];
        assert_eq!((lost.worker, lost.process), (Some(0), Some(1)));
        assert_eq!(
            lost.cause.as_deref(),
            Some("killed by signal 9 (SIGKILL) (the coordinator: its connection closed)")
        );
        assert_eq!((events[3].process, events[3].how.as_deref()), (Some(2), Some("restart 1 of 1")));
        assert_eq!(events[5].how.as_deref(), Some("[0] fetch the state from [1, 2]"));
    }

    #[test]
    fn a_hung_worker_the_launcher_ended_and_a_lost_node_say_why() {
        let tmp = Scratch::new("hung");
        let out = tmp.0.join("run");
        // Node 0 of two, two workers each.
        let mut r = Recorder::new(&command(&out), vec![0, 1], Some(SlotMap::new(Placement::Replicas, 2, 2, 1)));
        r.open(true);
        r.said(&MembershipEvent::Lost { id: 1, incarnation: 0, reason: "silent for 2.0 s".into() });
        r.killing(1, 0);
        r.exited(1, 0, Ok(ExitStatus::from_raw(9)));
        r.said(&MembershipEvent::Lost { id: 3, incarnation: 0, reason: "its lease in etcd expired".into() });
        r.role_lost("its lease expired", Some(0));
        // No longer the record's keeper: nothing more is written.
        r.said(&MembershipEvent::Lost { id: 2, incarnation: 0, reason: "its connection closed".into() });
        let events = record(&out);
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0].cause.as_deref(),
            Some("the coordinator lost it (silent for 2.0 s); the launcher ended it: killed by signal 9 (SIGKILL)")
        );
        assert_eq!((events[1].worker, events[1].node), (Some(3), Some(1)));
        assert_eq!(events[1].cause.as_deref(), Some("its lease in etcd expired"));
        assert_eq!(events[2].kind, EventKind::RoleLost);
    }
}
