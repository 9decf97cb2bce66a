//! Pipeline jobs through `steadfast launch`: every shape D x S of every model, with both
//! schedules, ends with the fingerprint of single-process `steadfast train` (reproducible
//! sums), and what cannot run is refused with a clear error.

use std::process::{Command, Output};

mod common;

fn steadfast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_steadfast")).args(args).output().expect("run steadfast")
}

/// Every `fingerprint:` line of a run's output (one per rank under `launch`).
fn fingerprints(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    common::fingerprints_in(&stdout)
}

fn train_args<'a>(model: &'a str, out: &'a str) -> Vec<&'a str> {
    train_steps(model, out, "3")
}

fn train_steps<'a>(model: &'a str, out: &'a str, steps: &'a str) -> Vec<&'a str> {
    let mut v = vec!["train", "--model", model, "--data", "synthetic", "--reduce", "reproducible", "--eval-every", "2"];
    v.extend(["--out", out, "--steps", steps, "--batch", "16", "--micro-batch", "4"]);
    v
}

/// `model` as `stages`-stage pipelines with `replicas` replicas, with `schedule`.
fn pipelined(model: &str, out: &str, (replicas, stages): (usize, usize), schedule: &str) -> Vec<String> {
    let (n, s) = ((replicas * stages).to_string(), stages.to_string());
    let launch = ["launch", "--nproc", &n, "--"];
    let pipe = ["--pipeline-stages", &s, "--schedule", schedule];
    let fps = fingerprints(&steadfast(&[&launch[..], &train_args(model, out), &pipe].concat()));
    assert_eq!(fps.len(), replicas * stages, "{model}: one summary per rank");
    fps
}

#[test]
fn every_pipeline_shape_and_schedule_gives_the_single_process_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // Every model; for each, stage counts that cut at each kind of boundary.
    let shapes: [(&str, &[(usize, usize)]); 3] =
        [("mlp", &[(1, 2), (1, 3), (2, 2)]), ("cnn", &[(1, 2), (2, 3)]), ("gpt", &[(1, 2), (1, 3), (2, 2)])];
    for (model, shapes) in shapes {
        let single = fingerprints(&steadfast(&train_args(model, out)));
        assert_eq!(single.len(), 1);
        for &shape in shapes {
            for schedule in ["gpipe", "1f1b"] {
                for fp in pipelined(model, out, shape, schedule) {
                    assert_eq!(fp, single[0], "{model}, {shape:?} (replicas, stages), {schedule}");
                }
            }
        }
    }
}

#[test]
fn the_collector_writes_the_metrics_with_the_loss_of_the_whole_model() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    fingerprints(&steadfast(&train_args("mlp", one.to_str().unwrap())));
    pipelined("mlp", two.to_str().unwrap(), (2, 3), "1f1b");
    let lines = |d: &std::path::Path| -> Vec<String> {
        let text = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
        // Drop the clock: every other field is a function of the configuration.
        text.lines().map(|l| l.split(",\"time\"").next().unwrap().to_owned()).collect()
    };
    let (a, b) = (lines(&one), lines(&two));
    let kinds = |ls: &[String], k: &str| -> Vec<String> {
        ls.iter().filter(|l| l.contains(&format!("\"kind\":\"{k}\""))).cloned().collect()
    };
    for k in ["train", "eval"] {
        assert_eq!(kinds(&a, k), kinds(&b, k), "the {k} lines");
        assert!(!kinds(&a, k).is_empty());
    }
}

#[test]
fn pipelines_that_cannot_run_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let refused = |args: Vec<&str>, expected: &str| {
        let o = steadfast(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} ran");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    };
    // Alone: a pipeline needs a job.
    refused([&train_args("mlp", out)[..], &["--pipeline-stages", "2"]].concat(), "needs a job of D x 2 ranks");
    // More stages than the MLP's three layers.
    let launch = ["launch", "--nproc", "4", "--"];
    refused([&launch[..], &train_args("mlp", out), &["--pipeline-stages", "4"]].concat(), "1 to 3 stages");
    // Three ranks are not whole pipelines of two stages.
    let launch = ["launch", "--nproc", "3", "--"];
    refused([&launch[..], &train_args("mlp", out), &["--pipeline-stages", "2"]].concat(), "not whole pipelines");
    refused([&train_args("mlp", out)[..], &["--pipeline-stages", "2", "--schedule", "zigzag"]].concat(), "gpipe");
    // The framework's kernels have no stages.
    let launch = ["launch", "--nproc", "2", "--"];
    let framework = ["--pipeline-stages", "2", "--kernels", "framework"];
    refused([&launch[..], &train_args("mlp", out), &framework].concat(), "fixed-order kernels");
    // Logging chooses its boundaries by a list or by a budget, in bytes.
    let stages = ["--pipeline-stages", "3"];
    refused([&train_args("mlp", out)[..], &stages, &["--log-budget", "4 mb"]].concat(), "not a unit of bytes");
    let both = ["--log-budget", "4MB", "--log-boundaries", "all"];
    refused([&train_args("mlp", out)[..], &stages, &both].concat(), "cannot be used with");
    refused([&train_args("mlp", out)[..], &["--log-budget", "1MB"]].concat(), "give --pipeline-stages");
    refused([&train_args("mlp", out)[..], &stages, &["--log-boundaries", "2"]].concat(), "boundaries 0 to 1");
    // Rerouting replays nothing, and keeps the bits in the reproducible mode alone.
    let shrink = ["launch", "--nproc", "4", "--recovery", "replay", "--on-failure", "shrink", "--"];
    let two = ["--pipeline-stages", "2", "--log-boundaries", "all"];
    refused([&shrink[..], &train_args("mlp", out), &two].concat(), "log no boundary");
    let fast: Vec<&str> =
        train_args("mlp", out).into_iter().map(|a| if a == "reproducible" { "fast" } else { a }).collect();
    refused([&shrink[..], &fast, &["--pipeline-stages", "2"]].concat(), "only with --reduce reproducible");
}

#[test]
fn a_pipeline_job_restarted_from_its_stages_checkpoints_gives_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("out"), dir.path().join("ck"));
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let args = train_steps("mlp", out, "8");
    let single = fingerprints(&steadfast(&args));
    // Rank 1 (stage 1 of replica 0) crashes; the launcher starts every worker again from the
    // newest checkpoint that both stages have.
    let launch = ["launch", "--nproc", "4", "--max-restarts", "1", "--recovery", "checkpoint", "--save-every", "2"];
    let pipe = ["--pipeline-stages", "2", "--fault", "crash:rank=1,step=5,phase=backward"];
    // Each step lasts at least 25 ms (the `step_begin` failpoint), so that on a fast machine
    // the checkpoints of steps 2 and 4 are durable, and step 2's committed, before the crash.
    let o = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args([&launch[..], &["--save-dir", ck, "--"], &args, &pipe].concat())
        .env("STEADFAST_FAILPOINTS", "step_begin=sleep:25")
        .output()
        .expect("run steadfast");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("from the checkpoint of step"), "{stdout}");
    let fps = fingerprints(&o);
    assert_eq!(fps.len(), 4);
    assert!(fps.iter().all(|f| *f == single[0]), "{fps:?} vs {single:?}");

    // The stages' newest checkpoints differ (stage 1 lost its newest): both resume from the
    // newest they have in common, and end with the same bits.
    let stage1 = std::path::Path::new(ck).join("stage-1-of-2");
    let newest: Vec<_> = std::fs::read_dir(&stage1).unwrap().map(|e| e.unwrap().path()).collect();
    let newest = newest.iter().filter(|p| p.is_dir()).max().unwrap();
    std::fs::remove_dir_all(newest).unwrap();
    let _ = std::fs::remove_file(stage1.join("LATEST"));
    let longer = train_steps("mlp", out, "10");
    let single = fingerprints(&steadfast(&longer));
    let resume = ["--pipeline-stages", "2", "--checkpoint-dir", ck, "--checkpoint-every", "2", "--resume", "latest"];
    let o = steadfast(&[&["launch", "--nproc", "2", "--"][..], &longer, &resume].concat());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("another stage's newest checkpoint is older"), "{stderr}");
    assert!(fingerprints(&o).iter().all(|f| *f == single[0]));
}

#[test]
fn a_pipeline_under_the_rollback_baseline_is_refused_once_with_the_commands_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let pipe = ["--pipeline-stages", "2"];
    let flags = ["launch", "--nproc", "4", "--max-restarts", "2", "--recovery", "memory", "--"];
    let args = [&flags[..], &train_args("mlp", out), &pipe].concat();
    let o = steadfast(&args);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{args:?} ran: {stdout}\n{stderr}");
    assert!(stderr.contains("steadfast launch --nproc 4 --max-restarts 2 -- train"), "{stderr}");
    assert!(stderr.contains("--recovery replay"), "{stderr}");
    // The launcher refuses before any worker starts, where each of the four used to.
    assert_eq!(stderr.matches("pipeline stages").count(), 1, "{stderr}");
    assert!(!stdout.contains("[0]") && !stderr.contains("[0]"), "a worker started: {stdout}\n{stderr}");
}
