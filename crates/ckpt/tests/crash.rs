//! Crash safety: a writer killed with SIGKILL at any instant never leaves a `LATEST`
//! that does not verify, and never loses a checkpoint it reported as committed.
//!
//! The test re-runs its own binary as the writer (`writer_child`, inert unless
//! `CKPT_CRASH_ROOT` is set), which reports each commit on stdout. The kill instants do
//! not depend on how fast this machine saves: a trial waits for a random number of
//! reported commits, then for a random fraction of a save as measured in this run, then
//! kills. A writer is also stopped dead at each named failpoint of the commit protocol.
//! `CKPT_CRASH_TRIALS` raises the number of random trials (the soak script runs
//! thousands).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ckpt::failpoint::POINTS;
use ckpt::{Retention, SaveOptions};

const SIZES: [usize; 4] = [65536, 1024, 131072, 16];

/// How long the test waits for a writer's next commit, or for a writer stopped at a
/// failpoint to end: far more than a save takes on any machine.
const DEADLINE: Duration = Duration::from_secs(120);

fn options() -> SaveOptions {
    SaveOptions { shards: 2, retention: Retention { keep_last: Some(3), keep_every: None } }
}

/// The writer: saves consecutive steps forever, reporting each commit on stdout.
#[test]
fn writer_child() {
    let Ok(root) = std::env::var("CKPT_CRASH_ROOT") else { return };
    let root = Path::new(&root);
    let mut step: u64 = std::env::var("CKPT_CRASH_START").unwrap().parse().unwrap();
    ckpt::store::remove_stale_temporaries(root).unwrap();
    loop {
        common::save(root, step, &SIZES, &options());
        println!("committed {step}");
        step += 1;
    }
}

/// A small deterministic generator for the kill instants.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *state >> 33
}

/// The step after the newest valid checkpoint under `root`.
fn next_step(root: &Path) -> u64 {
    ckpt::reader::resolve(root).map(|d| ckpt::reader::open(&d).unwrap().manifest.meta.step + 1).unwrap_or(1)
}

/// A writer process, and the commits it reports with the instant each was read.
struct Writer {
    child: Child,
    spawned: Instant,
    commits: mpsc::Receiver<(u64, Instant)>,
    reader: JoinHandle<()>,
    /// The commits taken from `commits` so far.
    reported: Vec<(u64, Instant)>,
}

impl Writer {
    /// Starts a writer that continues after the newest checkpoint under `root`; with
    /// `failpoint`, one that aborts at that point of its first save.
    fn spawn(root: &Path, failpoint: Option<&str>) -> Writer {
        let exe = std::env::current_exe().unwrap();
        let mut command = match failpoint {
            None => Command::new(&exe),
            Some(point) => {
                // The abort must not leave a core file behind.
                let mut c = Command::new("sh");
                c.args(["-c", "ulimit -c 0 && exec \"$0\" \"$@\""]).arg(&exe);
                c.env("STEADFAST_FAILPOINTS", format!("{point}=abort"));
                c
            }
        };
        let mut child = command
            .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
            .env("CKPT_CRASH_ROOT", root)
            .env("CKPT_CRASH_START", next_step(root).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let spawned = Instant::now();
        let stdout = child.stdout.take().unwrap();
        let (tx, commits) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(step) = line.strip_prefix("committed ").and_then(|s| s.parse().ok())
                    && tx.send((step, Instant::now())).is_err()
                {
                    return;
                }
            }
        });
        Writer { child, spawned, commits, reader, reported: Vec::new() }
    }

    /// Waits for the writer's next commit.
    fn await_commit(&mut self) {
        match self.commits.recv_timeout(DEADLINE) {
            Ok(c) => self.reported.push(c),
            Err(RecvTimeoutError::Timeout) => panic!("no commit within {DEADLINE:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the writer ended by itself: {:?}", self.child.wait()),
        }
    }

    /// Waits for a writer armed with a failpoint to end there, without a commit.
    fn await_abort(&mut self) {
        match self.commits.recv_timeout(DEADLINE) {
            Err(RecvTimeoutError::Disconnected) => {}
            other => panic!("the writer went past its failpoint: {other:?}"),
        }
        let status = self.child.wait().unwrap();
        assert!(!status.success(), "{status}");
    }

    /// Kills the writer with SIGKILL (if it still runs); returns every step it reported.
    fn kill(mut self) -> Vec<u64> {
        if self.child.try_wait().unwrap().is_none() {
            self.child.kill().unwrap();
            self.child.wait().unwrap();
        }
        self.reader.join().unwrap();
        self.reported.extend(self.commits.try_iter());
        self.reported.iter().map(|&(step, _)| step).collect()
    }
}

/// Checks what a killed writer left under `root`: every committed directory is complete,
/// `LATEST` names a committed checkpoint, and no reported commit is lost. Returns whether
/// the state shows a save cut short (a temporary left, or `LATEST` behind the newest).
fn check(root: &Path, what: &str, reported: &[u64]) -> bool {
    // Every committed directory is complete and holds the right values.
    let listed = ckpt::store::list(root).unwrap();
    for (step, dir) in &listed {
        assert_eq!(common::assert_holds_step(dir, &SIZES), *step, "{what}");
    }
    // LATEST, when present, names a committed checkpoint.
    let latest = std::fs::read_to_string(root.join("LATEST")).ok();
    if let Some(name) = &latest {
        let dir = root.join(name.trim());
        assert!(ckpt::reader::open(&dir).unwrap().verify().is_empty(), "{what}: LATEST = {name}");
    }
    // Nothing reported as committed is lost.
    if let Some(&last) = reported.last() {
        let dir = root.join(ckpt::store::step_dir_name(last));
        assert_eq!(common::assert_holds_step(&dir, &SIZES), last, "{what}: lost step {last}");
        let resolved = ckpt::reader::resolve(root).unwrap();
        assert!(common::assert_holds_step(&resolved, &SIZES) >= last, "{what}");
    }
    let debris = std::fs::read_dir(root).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with('.'));
    let newest = listed.last().map(|(step, _)| ckpt::store::step_dir_name(*step));
    debris || newest.is_some_and(|n| latest.as_deref().map(str::trim) != Some(n.as_str()))
}

#[test]
fn sigkill_at_random_instants_never_leaves_an_invalid_latest_or_loses_a_commit() {
    let trials: usize = std::env::var("CKPT_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let root = tempfile::tempdir().unwrap();
    let root = root.path();

    // This run's pace: the time from start to the first commit, and one save, measured
    // on an uninterrupted writer (then killed right after its third commit).
    let mut w = Writer::spawn(root, None);
    for _ in 0..3 {
        w.await_commit();
    }
    let mut first = w.reported[0].1 - w.spawned;
    let mut save = (w.reported[2].1 - w.reported[0].1) / 2;
    let mut committed_total = 0;
    let reported = w.kill();
    committed_total += reported.len();
    check(root, "pace", &reported);

    // A writer that dies at each named point of the commit protocol: the new step counts
    // from the rename on.
    let committed_from = POINTS.iter().position(|p| *p == "after_rename").unwrap();
    for (i, point) in POINTS.iter().enumerate() {
        let step = next_step(root);
        let mut w = Writer::spawn(root, Some(point));
        w.await_abort();
        let reported = w.kill();
        assert!(reported.is_empty(), "{point}: {reported:?}");
        check(root, point, &reported);
        let expected = if i >= committed_from { step } else { step - 1 };
        assert_eq!(next_step(root) - 1, expected, "{point}");
    }

    // Random instants: after 0 to 3 reported commits, a random fraction of the work to
    // the next commit (the start-up and a first save, or one save).
    let mut rng = 0x5eed_u64;
    let (mut before_first, mut inside_a_save) = (0, 0);
    for trial in 0..trials {
        let commits = (next(&mut rng) % 4) as usize;
        let fraction = (next(&mut rng) % 1000) as f64 / 1000.0;
        let mut w = Writer::spawn(root, None);
        for _ in 0..commits {
            w.await_commit();
        }
        // Follow this machine's pace as it changes.
        if let (Some(a), Some(b)) = (w.reported.first(), w.reported.last()) {
            first = a.1 - w.spawned;
            if commits > 1 {
                save = (b.1 - a.1) / (commits as u32 - 1);
            }
        }
        // This sleep is the kill instant being drawn, not a synchronisation: the kill may
        // land anywhere, and every outcome is checked below.
        std::thread::sleep(if commits == 0 { first } else { save }.mul_f64(fraction));
        let reported = w.kill();
        assert!(reported.len() >= commits, "trial {trial}: {reported:?}");
        committed_total += reported.len();
        before_first += usize::from(reported.is_empty());
        inside_a_save += usize::from(check(root, &format!("trial {trial}"), &reported));
    }
    // The kills must have landed before, between and during saves for the test to mean
    // much.
    assert!(committed_total > trials, "only {committed_total} commits in {trials} trials");
    assert!(before_first > 0, "no kill landed before a writer's first commit");
    assert!(inside_a_save > 0, "no kill landed inside a save");
}
