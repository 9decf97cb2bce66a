//! `steadfast fpna --quick`: runs within the CI budget and writes its tables, CSV files
//! and plots; the deterministic and reproducible kernels give one output over all runs.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn quick_lab_writes_results_and_its_deterministic_kernels_never_vary() {
    let out = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let run = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["fpna", "--quick", "--out", out.path().to_str().unwrap()])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(elapsed < Duration::from_secs(90), "took {elapsed:?}");
    assert!(
        stdout.contains("Parallel sums") && stdout.contains("Index-add") && stdout.contains("reproducible"),
        "{stdout}"
    );

    for csv in ["sums.csv", "index_add.csv", "training.csv"] {
        let text = std::fs::read_to_string(out.path().join(csv)).unwrap();
        assert!(text.lines().count() > 2, "{csv}: {text}");
    }
    for svg in ["vs_histogram.svg", "distinct_outputs.svg", "training_accuracy.svg"] {
        let text = std::fs::read_to_string(out.path().join(svg)).unwrap();
        assert!(text.contains("<svg") && text.contains("<text"), "{svg} has no labelled plot");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    let sums = summary["sums"].as_array().unwrap();
    assert!(!sums.is_empty());
    for row in sums {
        assert_eq!(row["distinct_tree"], 1, "{row}");
        assert_eq!(row["distinct_repro"], 1, "{row}");
    }
    for row in summary["index_add"].as_array().unwrap() {
        assert_eq!(row["distinct_sorted"], 1, "{row}");
    }
    let training = summary["training"].as_array().unwrap();
    let repro = training.iter().find(|t| t["mode"] == "reproducible").unwrap();
    assert_eq!(repro["distinct_fingerprints"], 1, "{repro}");
    assert_eq!(repro["accuracy_sd"], 0.0);
}
