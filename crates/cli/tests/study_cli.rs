//! The checkpoint/restart study's driver (`bench/study/study.py`) does not rot: its quick
//! form of the Steadfast side runs against this build, and what it reports holds: a
//! resumed run is bit-identical to the uninterrupted one on 1 and 2 threads, a checkpoint
//! records everything a restart needs, and a flipped bit and a truncated file are refused.
//! (The study itself, with PyTorch beside Steadfast, is a benchmark: `bench/run.sh study`.)

mod common;

use std::process::Command;

#[test]
fn the_quick_study_of_the_steadfast_side_runs_and_finds_exact_restarts() {
    if !common::have_data("/usr/share/datasets/fashion-mnist") || !common::python_with("json") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("study.json");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new("python3")
        .arg(format!("{root}/bench/study/study.py"))
        .args(["--quick", "--only", "steadfast", "--json"])
        .arg(&json)
        .env("STEADFAST_BIN", env!("CARGO_BIN_EXE_steadfast"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("## Determinism of a restart"), "{report}");

    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ours = &results[0];
    assert_eq!(ours["system"], "Steadfast");
    for width in ["256", "2048"] {
        let cost = &ours["cost"][width];
        for field in ["steps_per_s", "steps_per_s_with", "stall_seconds", "load_seconds"] {
            assert!(cost[field].as_f64().is_some_and(|v| v > 0.0), "{width} {field}: {cost}");
        }
        // A checkpoint is its tensors plus headers and a manifest: a little over the state.
        let ratio = cost["bytes"].as_f64().unwrap() / cost["state_bytes"].as_f64().unwrap();
        assert!((1.0..1.05).contains(&ratio), "{width}: {ratio}");
    }
    for threads in ["1", "2"] {
        let restart = &ours["restart"][threads];
        assert_eq!(restart["identical"], true, "{threads} threads: {restart}");
    }
    for (what, held) in ours["contents"].as_object().unwrap() {
        assert_eq!(held, true, "a checkpoint lacks {what}");
    }
    for damage in ["bit flip", "truncation"] {
        let outcome = ours["integrity"][damage].as_str().unwrap();
        assert!(outcome.starts_with("refused: CORRUPT"), "{damage}: {outcome}");
    }
}
