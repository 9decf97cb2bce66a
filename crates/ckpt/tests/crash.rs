//! Crash safety: a writer killed with SIGKILL at random instants never leaves a `LATEST`
//! that does not verify, and never loses a checkpoint it reported as committed.
//!
//! The test re-runs its own binary as the writer (`writer_child`, inert unless
//! `CKPT_CRASH_ROOT` is set) and kills it after a random delay. `CKPT_CRASH_TRIALS`
//! raises the number of trials (the soak script runs thousands).

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ckpt::{Retention, SaveOptions};

const SIZES: [usize; 4] = [65536, 1024, 131072, 16];

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

/// A small deterministic generator for the kill delays.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn sigkill_at_random_instants_never_leaves_an_invalid_latest_or_loses_a_commit() {
    let trials: usize = std::env::var("CKPT_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let root = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = 0x5eed_u64;
    let mut committed_total = 0;
    for trial in 0..trials {
        let start = ckpt::reader::resolve(root.path())
            .map(|d| ckpt::reader::open(&d).unwrap().manifest.meta.step + 1)
            .unwrap_or(1);
        let mut child = Command::new(&exe)
            .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
            .env("CKPT_CRASH_ROOT", root.path())
            .env("CKPT_CRASH_START", start.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(2_000 + next(&mut rng) % 40_000));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let reported: Vec<u64> = out.lines().filter_map(|l| l.strip_prefix("committed ")?.parse().ok()).collect();
        committed_total += reported.len();

        // Every committed directory is complete and holds the right values.
        let listed = ckpt::store::list(root.path()).unwrap();
        for (step, dir) in &listed {
            assert_eq!(common::assert_holds_step(dir, &SIZES), *step, "trial {trial}");
        }
        // LATEST, when present, names a committed checkpoint.
        if let Ok(name) = std::fs::read_to_string(root.path().join("LATEST")) {
            let dir = root.path().join(name.trim());
            assert!(ckpt::reader::open(&dir).unwrap().verify().is_empty(), "trial {trial}: LATEST = {name}");
        }
        // Nothing reported as committed is lost.
        if let Some(&last) = reported.last() {
            let dir = root.path().join(ckpt::store::step_dir_name(last));
            assert_eq!(common::assert_holds_step(&dir, &SIZES), last, "trial {trial}: lost step {last}");
            let resolved = ckpt::reader::resolve(root.path()).unwrap();
            assert!(common::assert_holds_step(&resolved, &SIZES) >= last);
        }
    }
    // The kills must have landed both between and during saves for the test to mean much.
    assert!(committed_total > trials, "only {committed_total} commits in {trials} trials");
}
