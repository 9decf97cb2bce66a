//! `steadfast fpna --quick`: runs within the CI budget and writes its tables, CSV files
//! and plots; the deterministic and reproducible kernels give one output over all runs.

use std::process::Command;
use std::time::{Duration, Instant};

use lab::fpna::{Accumulation, IndexRow, StudySummary, SumSample, TrainRun};
use lab::table;

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

    let samples: Vec<SumSample> = table::read(&out.path().join("sums.csv")).unwrap();
    let index: Vec<IndexRow> = table::read(&out.path().join("index_add.csv")).unwrap();
    let runs: Vec<TrainRun> = table::read(&out.path().join("training.csv")).unwrap();
    assert_eq!(samples.len(), 3 * 3 * 2 * 10, "3 distributions x 3 sizes x 2 thread counts x 10 repetitions");
    assert_eq!(index.len(), 3 * 2 * 2, "3 distributions x 2 sizes x 2 thread counts");
    assert_eq!(runs.len(), 2 * 3, "3 runs per accumulation");
    let repro: Vec<&TrainRun> = runs.iter().filter(|r| r.mode == Accumulation::Reproducible).collect();
    assert!(repro.iter().all(|r| r.fingerprint == repro[0].fingerprint), "{repro:?}");
    for svg in ["vs_histogram.svg", "distinct_outputs.svg", "training_accuracy.svg"] {
        let text = std::fs::read_to_string(out.path().join(svg)).unwrap();
        assert!(text.contains("<svg") && text.contains("<text"), "{svg} has no labelled plot");
    }
    let summary: StudySummary =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary.sums.len() * summary.reps, samples.len());
    for row in &summary.sums {
        assert_eq!(row.distinct_tree, 1, "{row:?}");
        assert_eq!(row.distinct_repro, 1, "{row:?}");
    }
    assert_eq!(summary.index_add, index);
    for row in &summary.index_add {
        assert_eq!(row.distinct_sorted, 1, "{row:?}");
    }
    let training = summary.training.unwrap();
    let repro = training.iter().find(|t| t.mode == Accumulation::Reproducible).unwrap();
    assert_eq!(repro.distinct_fingerprints, 1, "{repro:?}");
    assert_eq!(repro.accuracy_sd, 0.0);
}
