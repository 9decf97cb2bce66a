//! `steadfast campaign` and `steadfast report` on small campaigns over synthetic data:
//! the tables, exact replay of single trials, independence from the thread count, what
//! each detector must catch, repair from a healthy replica, refusal of bad specs, a
//! PyTorch campaign's spec (replayed through its interpreter), and the report as a
//! browser renders it.

mod common;

use std::path::Path;

use common::{ok, steadfast};
use fault::campaign::Outcome;
use fault::live::StateKind;
use lab::campaign::Detector;
use lab::campaign::rows::{GoldenRow, StepRow, TrialRow};
use lab::table;

fn spec(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A campaign small enough for a test: the MLP on synthetic data, two replicas.
const SMALL: &str = r#"
[run]
model = "mlp"
data = "synthetic"
batch = 48
micro_batch = 12
replicas = 2
reduce = ["deterministic", "reproducible"]
eval_examples = 500
[trials]
count = 24
seed = 7
inject_at = [12, 16]
steps_after = 6
state = ["param", "optim", "grad", "activation"]
bits = "any"
"#;

/// The trials of a campaign, with the timing cleared (the only column that may differ
/// between two runs).
fn without_timing(dir: &Path) -> Vec<TrialRow> {
    let mut r: Vec<TrialRow> = table::read(&dir.join("trials.csv")).unwrap();
    for row in &mut r {
        row.seconds = 0.0;
    }
    r
}

#[test]
fn a_campaign_writes_its_tables_replays_trials_and_ignores_the_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(tmp.path(), "small.toml", SMALL);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let summary = ok(steadfast(&["campaign", &s, "--out", a.to_str().unwrap(), "--threads", "2"]));
    assert!(summary.contains("## Detectors"), "{summary}");
    ok(steadfast(&["campaign", &s, "--out", b.to_str().unwrap(), "--threads", "1"]));
    for table in ["steps.csv", "golden.csv", "propagation.csv", "sensitivity_bit.csv", "detectors.csv"] {
        assert_eq!(
            std::fs::read(a.join(table)).unwrap(),
            std::fs::read(b.join(table)).unwrap(),
            "{table} depends on the thread count"
        );
    }
    assert_eq!(without_timing(&a), without_timing(&b));

    let trials: Vec<TrialRow> = table::read(&a.join("trials.csv")).unwrap();
    assert_eq!(trials.len(), 48, "24 trials under 2 strategies");
    for t in &trials {
        assert_ne!(t.outcome, Outcome::Crashed, "{t:?}");
        assert_eq!(t.bits.0.len(), 1, "one bit per trial: {t:?}");
        let step = Some(t.step);
        match t.state {
            // Stored state changed under its checksum: caught before it is used.
            StateKind::Param | StateKind::Optim => assert_eq!(t.alarm(Detector::Checksum), step, "{t:?}"),
            // One replica's copy of the sum differs: the commit vote sees it at once.
            StateKind::Grad => assert_eq!(t.alarm(Detector::Vote), step, "{t:?}"),
            // A fault in the arithmetic enters the shared sum: every replica agrees.
            StateKind::Activation => {
                assert_eq!(t.alarm(Detector::Vote), None, "{t:?}");
                assert_eq!(t.alarm(Detector::Checksum), None, "{t:?}");
                assert_eq!(t.alarm(Detector::Fingerprint), None, "{t:?}");
            }
        }
        if t.bitwise_golden {
            assert_eq!(t.outcome, Outcome::Masked, "{t:?}");
        }
    }
    // A fault in one replica's stored parameters reaches the other replica through the
    // gradient sum (unless the flipped weight fed only dead units).
    let steps: Vec<StepRow> = table::read(&a.join("steps.csv")).unwrap();
    let last_of = |t: &TrialRow| steps.iter().rfind(|r| r.trial == t.trial && r.reduce == t.reduce).cloned().unwrap();
    let param = trials
        .iter()
        .filter(|t| t.state == StateKind::Param && !t.diverged)
        .find(|t| last_of(t).differing.0[1 - t.rank] != 0)
        .expect("a parameter fault that spread to the other replica");
    let last = last_of(param);
    assert_eq!(last.step, param.step + 6);
    assert_ne!(last.differing.0[param.rank], 0, "{last:?}");
    let golden: Vec<GoldenRow> = table::read(&a.join("golden.csv")).unwrap();
    assert!(golden.iter().all(|g| g.alarms.0.is_empty()), "the golden run raised an alarm");

    // Replaying trials alone gives the rows of the campaign.
    let picks = [trials[0].trial, param.trial];
    let replay = ok(steadfast(&["campaign", &s, "--replay", &format!("{},{}", picks[0], picks[1])]));
    for pick in picks {
        for t in trials.iter().filter(|t| t.trial == pick) {
            let line = format!(
                "trial {pick} [{}]: {} of rank {} at step {} (flip seed {}) -> {}",
                t.reduce,
                t.state,
                t.rank,
                t.step,
                t.flip_seed,
                t.outcome.name()
            );
            assert!(replay.contains(&line), "{line}\n{replay}");
            if let Some(element) = t.element {
                let flip = format!("flipped {}[{}] bits {:?}", t.tensor, element, t.bits.0);
                assert!(replay.contains(&flip), "{flip}\n{replay}");
            }
        }
    }
}

#[test]
fn repair_from_a_healthy_replica_restores_golden_bits_and_stop_reports_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let base = SMALL
        .replace("replicas = 2", "replicas = 3")
        .replace("micro_batch = 12", "micro_batch = 16")
        .replace("count = 24", "count = 12")
        .replace(r#"["param", "optim", "grad", "activation"]"#, r#"["param", "optim", "grad"]"#);
    let repair = spec(tmp.path(), "repair.toml", &format!("{base}\n[detect]\nresponse = \"repair\"\n"));
    let out = tmp.path().join("repair");
    ok(steadfast(&["campaign", &repair, "--out", out.to_str().unwrap()]));
    for t in without_timing(&out) {
        // Three replicas: the checksums or the vote name the faulty one, and a copy from a
        // healthy one undoes the fault before it spreads.
        assert_eq!(t.outcome, Outcome::Corrected, "{t:?}");
        assert!(t.bitwise_golden, "{t:?}");
        assert_eq!(t.repairs, 1, "{t:?}");
        assert_eq!(t.rollbacks, 0, "{t:?}");
    }
    let stop = spec(tmp.path(), "stop.toml", &format!("{base}\n[detect]\nresponse = \"stop\"\n"));
    let out = tmp.path().join("stop");
    ok(steadfast(&["campaign", &stop, "--out", out.to_str().unwrap()]));
    for t in without_timing(&out) {
        assert_eq!(t.outcome, Outcome::Detected, "{t:?}");
    }
    // One replica cannot be repaired from another: a rollback redoes the step without
    // the (transient) fault.
    let single =
        base.replace("replicas = 3", "replicas = 1").replace(r#"["param", "optim", "grad"]"#, r#"["param", "optim"]"#);
    let solo = spec(tmp.path(), "solo.toml", &format!("{single}\n[detect]\nresponse = \"repair\"\n"));
    let out = tmp.path().join("solo");
    ok(steadfast(&["campaign", &solo, "--out", out.to_str().unwrap()]));
    for t in without_timing(&out) {
        assert_eq!(t.outcome, Outcome::Corrected, "{t:?}");
        assert_eq!(t.rollbacks, 1, "{t:?}");
    }
}

#[test]
fn bad_specs_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, text, needle) in [
        ("unknown.toml", SMALL.replace("steps_after = 6", "steps_after = 6\ncolour = 1"), "colour"),
        ("fast.toml", SMALL.replace(r#""deterministic", "reproducible""#, r#""fast""#), "fast"),
        ("target.toml", SMALL.replace("bits = \"any\"", "bits = \"any\"\ntarget = \"model.conv*\""), "matches no"),
        ("state.toml", SMALL.replace(r#""activation"]"#, r#""weights"]"#), "weights"),
        ("garbage.toml", "[run\nmodel = ".to_owned(), "bad campaign spec"),
        ("gpt.toml", SMALL.replace("\"mlp\"", "\"gpt\""), "activation"),
    ] {
        let path = spec(tmp.path(), name, &text);
        let out = steadfast(&["campaign", &path, "--out", tmp.path().join("x").to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
    let out = steadfast(&["campaign", tmp.path().join("missing.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    assert!(!tmp.path().join("x").exists(), "nothing is written for a refused spec");
}

/// A PyTorch campaign's spec: its model trains in Python, which runs the campaign.
const TORCH: &str = r#"
[run]
model = "mlp-pytorch"
framework = "pytorch"
[trials]
count = 3
inject_at = [5]
steps_after = 4
state = ["param"]
"#;

#[test]
fn a_pytorch_campaign_runs_from_python_and_replays_through_its_interpreter() {
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(tmp.path(), "spec.toml", TORCH);
    let out = steadfast(&["campaign", &s, "--out", tmp.path().join("x").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("runs from Python") && err.contains("python -m steadfast.lab"), "{err}");
    assert!(!tmp.path().join("x").exists());
    let out = steadfast(&["campaign", &s, "--replay", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("[run] needs `python`"), "{err}");

    // An interpreter that writes down how it was called, and one that fails.
    use std::os::unix::fs::PermissionsExt;
    let args = tmp.path().join("args.txt");
    for (name, body) in [("python", format!("echo \"$@\" > {}", args.display())), ("failing", "exit 3".into())] {
        let path = tmp.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let with = |python: &str| {
        TORCH.replace("[trials]", &format!("python = \"{}\"\n[trials]", tmp.path().join(python).display()))
    };
    let s = spec(tmp.path(), "spec.toml", &with("python"));
    ok(steadfast(&["campaign", &s, "--replay", "2,0"]));
    let called = std::fs::read_to_string(&args).unwrap();
    assert_eq!(called.trim(), format!("-m steadfast.lab replay {} --trials 2,0", tmp.path().display()));
    let s = spec(tmp.path(), "spec.toml", &with("failing"));
    let out = steadfast(&["campaign", &s, "--replay", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed"));
}

#[test]
fn the_report_renders_its_plots_in_a_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(tmp.path(), "small.toml", SMALL);
    let out = tmp.path().join("campaign");
    ok(steadfast(&["campaign", &s, "--out", out.to_str().unwrap()]));
    let page_path = ok(steadfast(&["report", out.to_str().unwrap()]));
    let page_path = Path::new(page_path.trim());
    assert_eq!(page_path, out.join("report.html"));
    let page = std::fs::read_to_string(page_path).unwrap();
    assert_eq!(page.matches("<svg").count(), 4, "four plots");
    for heading in ["Outcome by bit position", "Model against optimizer state", "Training loss", "Propagation"] {
        assert!(page.contains(heading), "{heading}");
    }

    let missing = steadfast(&["report", tmp.path().to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("output of `steadfast campaign`"));

    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| std::process::Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()));
    let Some(browser) = browser else {
        assert!(
            std::env::var_os("STEADFAST_REQUIRE_BROWSER").is_none(),
            "no headless browser (apt-get install chromium)"
        );
        common::skip("no chromium to render the report");
        return;
    };
    // A copy of the page with a script that marks how many plots the browser laid out
    // with a visible area and drawn content; the dumped DOM carries the mark.
    let probe = tmp.path().join("probe.html");
    let script = "<script>window.addEventListener('load',function(){var n=0;\
        document.querySelectorAll('section.plot svg').forEach(function(s){var b=s.getBoundingClientRect();\
        if(b.width>50&&b.height>50&&s.querySelectorAll('rect,path,polyline,line,circle,text').length>10)n++;});\
        document.body.setAttribute('data-plots-rendered',String(n));});</script>";
    std::fs::write(&probe, page.replace("</body>", &format!("{script}</body>"))).unwrap();
    let profile = tmp.path().join("profile");
    let dom = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,3000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", probe.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("data-plots-rendered=\"4\""),
        "the browser did not render 4 plots: {}",
        &dom[..dom.len().min(400)]
    );
}
