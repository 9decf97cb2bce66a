//! The checkpoint/restart study's driver (`bench/study/study.py`) does not rot: its quick
//! form of the Steadfast side runs against this build, and what it reports holds: a
//! resumed run is bit-identical to the uninterrupted one on 1 and 2 threads, a checkpoint
//! records everything a restart needs, a flipped bit and a truncated file are refused, and
//! a checkpoint of a data-parallel job holds every worker's part.
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
    let costs = ours["cost"].as_array().unwrap();
    assert_eq!(costs.iter().map(|c| c["width"].as_u64().unwrap()).collect::<Vec<_>>(), [256, 2048]);
    for cost in costs {
        for field in ["steps_per_s", "steps_per_s_with", "stall_seconds", "load_seconds"] {
            assert!(cost[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {cost}");
        }
        // A checkpoint is its tensors plus headers and a manifest: a little over the state.
        let ratio = cost["bytes"].as_f64().unwrap() / cost["state_bytes"].as_f64().unwrap();
        assert!((1.0..1.05).contains(&ratio), "{cost}: {ratio}");
    }
    let every: Vec<u64> = ours["interval"].as_array().unwrap().iter().map(|r| r["every"].as_u64().unwrap()).collect();
    assert_eq!(every, [1, 10, 50]);
    let restarts = ours["restart"].as_array().unwrap();
    assert_eq!(restarts.iter().map(|r| r["threads"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    for restart in restarts {
        assert_eq!(restart["identical"], true, "{restart}");
    }
    for (what, held) in ours["contents"]["own"].as_object().unwrap() {
        assert_eq!(held, true, "a checkpoint lacks {what}");
    }
    for damage in ["bit flip", "truncation"] {
        let outcome = ours["integrity"]["own"][damage].as_str().unwrap();
        assert!(outcome.starts_with("refused: CORRUPT"), "{damage}: {outcome}");
    }

    // Scale: every worker writes its own shards, so a checkpoint of W workers holds W times
    // the shards of one worker's (and one manifest).
    let scale = ours["scale"].as_array().unwrap();
    let ranks: Vec<u64> = scale.iter().map(|r| r["ranks"].as_u64().unwrap()).collect();
    assert_eq!(ranks, [1, 2, 4]);
    let shards_of_one = scale[0]["files"].as_u64().unwrap() - 1;
    for row in scale {
        assert_eq!(row["replicas agree"], true, "{row}");
        assert!(row["stall_seconds"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        assert_eq!(row["files"].as_u64().unwrap(), 1 + shards_of_one * row["ranks"].as_u64().unwrap(), "{row}");
    }
}
