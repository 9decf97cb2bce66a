//! `train --inject`: bit flips in live state, repeatable from their seed, and caught in a
//! data-parallel job by the commit vote (a corrupted gradient sum on one rank) or by the
//! replica fingerprints (corrupted parameters on one rank).

mod common;

use common::{fingerprint, steadfast};

const TRAIN: [&str; 13] = [
    "train",
    "--model",
    "mlp",
    "--data",
    "synthetic",
    "--steps",
    "8",
    "--batch",
    "48",
    "--micro-batch",
    "16",
    "--eval-every",
    "0",
];

#[test]
fn a_live_flip_is_logged_repeats_from_its_seed_and_changes_the_result() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let clean = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out]].concat()));
    let fault = "step=3,state=param,target=model.fc1.weight,bits=exponent,count=2,seed=11";
    let a = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out, "--inject", fault]].concat()));
    let metrics = std::fs::read_to_string(tmp.path().join("metrics.jsonl")).unwrap();
    let b = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out, "--inject", fault]].concat()));
    assert_eq!(a, b, "the same fault gives the same bits");
    assert_ne!(a, clean, "two exponent flips change the result");
    let injected: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "inject")
        .collect();
    assert_eq!(injected.len(), 2);
    for v in &injected {
        assert_eq!((v["step"].as_u64(), v["state"].as_str()), (Some(3), Some("param")));
        assert_eq!(v["tensor"], "model.fc1.weight");
        let bit = v["bits"][0].as_u64().unwrap();
        assert!((23..31).contains(&bit));
        let (old, new): (f32, f32) =
            (v["old"].as_str().unwrap().parse().unwrap(), v["new"].as_str().unwrap().parse().unwrap());
        assert_eq!(old.to_bits() ^ new.to_bits(), 1 << bit);
    }
    // Optimizer-state and gradient faults, and a malformed one.
    for fault in ["step=2,state=optim,bits=mantissa,count=5", "step=2,state=grad,bits=sign,count=5"] {
        let f = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out, "--inject", fault]].concat()));
        assert_ne!(f, clean, "{fault}");
    }
    let bad = steadfast(&[&TRAIN[..], &["--out", out, "--inject", "step=2,state=activations"]].concat());
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not param, grad, optim or activation"));
}

#[test]
fn a_corrupted_gradient_sum_on_one_rank_is_refused_by_the_commit_vote() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let run = steadfast(
        &[
            &["launch", "--nproc", "3", "--"][..],
            &TRAIN,
            &["--out", out, "--reduce", "reproducible", "--inject", "step=4,rank=1,state=grad,bits=mantissa,count=1"],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("step 4 was not committed") && stderr.contains("rank(s) [1] hold a different gradient sum"),
        "{stderr}"
    );
    // Nobody applied step 4: rank 0 logged steps 1 to 4 only (steps 0..=3 done).
    let metrics = std::fs::read_to_string(tmp.path().join("metrics.jsonl")).unwrap();
    let trained = metrics.lines().filter(|l| l.contains(r#""kind":"train""#)).count();
    assert_eq!(trained, 4, "{metrics}");
}

#[test]
fn corrupted_parameters_on_one_rank_are_named_by_the_replica_check() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let run = steadfast(
        &[
            &["launch", "--nproc", "3", "--"][..],
            &TRAIN,
            &["--out", out, "--fingerprint-every", "1", "--inject", "step=5,rank=2,state=param,bits=0,count=1"],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("replicas diverged at step 6: rank(s) [2]"), "{stderr}");
}

#[test]
fn an_activation_flip_hits_a_layer_output_and_changes_the_result() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let clean = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out]].concat()));
    // The top mantissa bit of a logit (the output of fc3, which no ReLU can zero): the
    // value moves by up to half of itself.
    let fault = "step=2,state=activation,target=act.fc3,bits=22,count=1,seed=5";
    let a = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out, "--inject", fault]].concat()));
    let metrics = std::fs::read_to_string(tmp.path().join("metrics.jsonl")).unwrap();
    let b = fingerprint(&steadfast(&[&TRAIN[..], &["--out", out, "--inject", fault]].concat()));
    assert_eq!(a, b, "the same fault gives the same bits");
    assert_ne!(a, clean, "the corrupted activation reaches the weights");
    let flips: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "inject")
        .collect();
    assert_eq!(flips.len(), 1, "{metrics}");
    assert_eq!(flips[0]["state"], "activation");
    assert_eq!(flips[0]["tensor"], "act.fc3");
    assert_eq!(flips[0]["bits"], serde_json::json!([22]));
    // The fc3 output of a micro-batch of 16 has 16 x 10 elements.
    assert!(flips[0]["element"].as_u64().unwrap() < 16 * 10);
    let old: f32 = flips[0]["old"].as_str().unwrap().parse().unwrap();
    let new: f32 = flips[0]["new"].as_str().unwrap().parse().unwrap();
    assert_eq!(old.to_bits() ^ new.to_bits(), 1 << 22);

    let bad = steadfast(&[&TRAIN[..], &["--out", out, "--inject", "step=2,state=activation,target=model.*"]].concat());
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no tensor matches"), "{bad:?}");
}
