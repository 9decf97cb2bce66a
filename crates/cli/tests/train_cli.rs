//! `steadfast train` end to end: determinism across thread counts, quality with default
//! arguments, and clear errors for bad input.

mod common;

use std::process::{Command, Output};

use common::{have_data, summary};
use std::time::{Duration, Instant};

fn steadfast(args: &[&str], threads: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_steadfast"));
    cmd.args(args);
    if let Some(t) = threads {
        cmd.env("RAYON_NUM_THREADS", t);
    }
    cmd.output().expect("run steadfast")
}

fn fingerprint_line(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "failed: {}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("fingerprint: ")).expect("a fingerprint line").to_owned();
    let hex = line.trim_start_matches("fingerprint: ").split_whitespace().next().unwrap_or_default();
    assert!(hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
    line
}

#[test]
fn same_fingerprint_with_one_and_two_threads() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    for model in ["mlp", "cnn"] {
        let args = [
            "train",
            "--model",
            model,
            "--data",
            "synthetic",
            "--steps",
            "5",
            "--batch",
            "256",
            "--micro-batch",
            "64",
            "--out",
            out,
        ];
        let one = fingerprint_line(&steadfast(&args, Some("1")));
        let two = fingerprint_line(&steadfast(&args, Some("2")));
        assert_eq!(one, two, "{model}");
        let hex = two.trim_start_matches("fingerprint: ").split_whitespace().next().unwrap();
        assert_eq!(summary(dir.path())["fingerprint"].as_str().unwrap(), hex);
    }
}

fn accuracy_with_defaults(model: &str, target: f64) {
    if !have_data("/usr/share/datasets/fashion-mnist") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out =
        steadfast(&["train", "--model", model, "--data", "fashion-mnist", "--out", dir.path().to_str().unwrap()], None);
    let elapsed = started.elapsed();
    fingerprint_line(&out);
    let accuracy = summary(dir.path())["test_accuracy"].as_f64().unwrap();
    eprintln!("{model}: test accuracy {accuracy:.4} in {elapsed:.1?}");
    assert!(accuracy >= target, "{model}: accuracy {accuracy} < {target}");
    assert!(elapsed < Duration::from_secs(300), "{model} took {elapsed:?}");
}

#[test]
fn mlp_reaches_85_percent_with_default_arguments() {
    accuracy_with_defaults("mlp", 0.85);
}

#[test]
fn cnn_reaches_88_percent_with_default_arguments() {
    accuracy_with_defaults("cnn", 0.88);
}

fn fails_with(args: &[&str], needle: &str) {
    let out = steadfast(args, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(stderr.contains(needle), "{args:?}: expected {needle:?} in\n{stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
}

#[test]
fn bad_configurations_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    fails_with(
        &["train", "--data", "synthetic", "--batch", "100", "--micro-batch", "30", "--out", out],
        "multiple of the micro-batch",
    );
    fails_with(&["train", "--data", "synthetic", "--batch", "100000", "--out", out], "larger than the training set");
    fails_with(&["train", "--data", "synthetic", "--lr=-1", "--out", out], "--lr must be a positive");
    fails_with(&["train", "--data", "synthetic", "--steps", "0", "--out", out], "at least 1");
    fails_with(&["train", "--model", "mlp", "--data", "fortunes", "--out", out], "does not provide Images");
    fails_with(&["train", "--model", "mlp", "--data-dir", "/nonexistent/fm", "--out", out], "/nonexistent/fm");
    fails_with(&["train", "--model", "resnet"], "invalid value 'resnet'");
    fails_with(
        &["train", "--data", "synthetic", "--eval-limit", "0", "--out", out],
        "invalid value '0' for '--eval-limit",
    );
}

/// What was once accepted in silence: a fault that could never fire, keeping no
/// checkpoint, a state that cannot fit in memory. Each is refused at once, by name.
#[test]
fn settings_that_would_do_nothing_or_cannot_fit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let job = ["train", "--data", "synthetic", "--steps", "10", "--out", out];
    let with = |extra: &[&str]| -> Vec<String> { job.iter().chain(extra).map(|s| s.to_string()).collect() };
    let fails_with =
        |args: Vec<String>, needle: &str| fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), needle);
    fails_with(with(&["--inject", "step=10,state=param,count=1"]), "--inject at step 10 would never fire");
    fails_with(with(&["--fault", "crash:rank=0,step=12"]), "--fault crash at step 12 would never fire");
    fails_with(with(&["--fault", "hang:rank=1,step=3"]), "--fault hang on rank 1 would never fire");
    fails_with(with(&["--inject", "step=3,rank=2,state=param,count=1"]), "on rank 2 would never fire");
    let ckpt = dir.path().join("ckpt");
    fails_with(
        with(&["--checkpoint-every", "5", "--keep-last", "0", "--checkpoint-dir", ckpt.to_str().unwrap()]),
        "--keep-last must be at least 1",
    );
    fails_with(
        with(&["--checkpoint-every", "5", "--checkpoint-shards", "0", "--checkpoint-dir", ckpt.to_str().unwrap()]),
        "--checkpoint-shards must be at least 1",
    );
    // A directory flag that names a file says so, instead of "File exists (os error 17)".
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let file = file.to_str().unwrap();
    fails_with(with(&["--checkpoint-dir", file]), "--checkpoint-dir");
    fails_with(with(&["--checkpoint-dir", file]), "is a file, not a directory");
    fails_with(["train", "--data", "synthetic", "--steps", "10", "--out", file].map(String::from).to_vec(), "--out");
    fails_with(
        ["train", "--data", "synthetic", "--steps", "10", "--out", &format!("{file}/run")].map(String::from).to_vec(),
        "which is a file, not a directory",
    );
    // `ckpt verify` of a plain file says it is no checkpoint, rather than calling it corrupt.
    let verify = common::steadfast(&["ckpt", "verify", file]);
    let err = String::from_utf8_lossy(&verify.stderr);
    assert_eq!(verify.status.code(), Some(2), "{err}");
    assert!(err.contains("is a file, not a checkpoint"), "{err}");
    assert!(std::fs::read(file).unwrap() == b"not a directory", "the file is left as it was");
    fails_with(with(&["--on-divergence", "repair"]), "add --max-restarts");
    fails_with(with(&["--context", "32"]), "shape the GPT, not the mlp");
    let gpt = |extra: &[&str]| {
        let mut args = ["train", "--model", "gpt", "--data", "synthetic", "--steps", "2"].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    fails_with(gpt(&["--gpt-width", "64", "--gpt-heads", "3"]), "--gpt-heads 3 must divide --gpt-width 64");
    fails_with(gpt(&["--gpt-blocks", "0"]), "--gpt-blocks");
    // 20 G parameters: refused before anything is allocated, with the estimate.
    let started = std::time::Instant::now();
    fails_with(with(&["--width", "200000"]), "this run needs at least");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn help_shows_examples() {
    let out = steadfast(&["train", "--help"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("Examples:") && text.contains("steadfast train --model cnn"), "{text}");
}

#[test]
fn a_gpt_of_another_shape_trains_and_its_checkpoints_resume_only_that_shape() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let shape = ["--context", "16", "--gpt-width", "32", "--gpt-blocks", "2", "--gpt-heads", "2"];
    let run = |steps: &str, extra: &[&str]| {
        let mut args = vec!["train", "--model", "gpt", "--data", "synthetic", "--batch", "4", "--steps", steps];
        args.extend(["--eval-every", "0", "--eval-limit", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt]);
        args.extend(["--out", out]);
        args.extend(extra);
        steadfast(&args, None)
    };
    let parameters = |out: &Output| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.contains(" parameters")).unwrap_or_else(|| panic!("{text}")).to_owned();
        line.split(", ").nth(1).unwrap().split(' ').next().unwrap().parse::<u64>().unwrap()
    };
    let small = run("2", &shape);
    assert!(small.status.success(), "{}", String::from_utf8_lossy(&small.stderr));
    // Width 32 and 2 blocks: about 1/32 of the default shape's weights in the blocks.
    let out = dir.path().join("default");
    let default = steadfast(
        &[
            "train",
            "--model",
            "gpt",
            "--data",
            "synthetic",
            "--steps",
            "1",
            "--eval-limit",
            "4",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert!(default.status.success(), "{}", String::from_utf8_lossy(&default.stderr));
    assert!(parameters(&small) * 8 < parameters(&default), "{} vs {}", parameters(&small), parameters(&default));
    // The shape is part of what a checkpoint resumes: the default shape is refused ...
    let other = run("4", &["--resume", ckpt]);
    assert!(!other.status.success(), "a checkpoint of another shape resumed");
    // ... and the same shape goes on.
    let same = run("4", &[&shape[..], &["--resume", ckpt]].concat());
    assert!(same.status.success(), "{}", String::from_utf8_lossy(&same.stderr));
}
