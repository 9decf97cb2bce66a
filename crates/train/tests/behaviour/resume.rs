//! A run stopped at step k and resumed from its checkpoint ends with the same bits as the
//! run that never stopped: model, optimizer state, RNG and data position all restored.

use crate::common;

use common::tiny;
use train::CheckpointConfig;
use train::model::ModelKind;
use train::optim::OptimKind;
use train::{TrainConfig, TrainError};

fn with_checkpoints(mut c: TrainConfig, dir: &std::path::Path, every: u64) -> TrainConfig {
    c.checkpoint = Some(CheckpointConfig::every(dir, every));
    c
}

fn fingerprint(c: &TrainConfig) -> u64 {
    train::train(c, &mut |_| {}).unwrap().0.fingerprint
}

#[test]
fn resumed_runs_match_uninterrupted_runs_for_mlp_and_gpt_with_sgd_and_adamw() {
    for model in [ModelKind::Mlp, ModelKind::Gpt] {
        for optimizer in [OptimKind::Sgd, OptimKind::AdamW] {
            let mut c = tiny(model);
            c.optimizer = optimizer;
            c.optim.lr = if optimizer == OptimKind::Sgd { 0.05 } else { 1e-3 };
            c.steps = 7;
            if model == ModelKind::Gpt {
                c.batch = 8;
                c.micro_batch = 4;
            }
            let uninterrupted = fingerprint(&c);

            let root = tempfile::tempdir().unwrap();
            let mut first = with_checkpoints(c.clone(), root.path(), 2);
            first.steps = 5; // checkpoints at 2, 4 and 5
            assert_ne!(fingerprint(&first), uninterrupted);

            let mut resumed = with_checkpoints(c.clone(), root.path(), 2);
            resumed.resume = Some(root.path().to_owned());
            let (summary, _) = train::train(&resumed, &mut |_| {}).unwrap();
            assert_eq!(summary.resumed_from, 5);
            assert_eq!(summary.fingerprint, uninterrupted, "{model:?} {optimizer:?} from step 5");

            // From an older checkpoint too (one that does not fall on the final step).
            let mut from_two = c.clone();
            from_two.resume = Some(root.path().join("step-00000002"));
            assert_eq!(fingerprint(&from_two), uninterrupted, "{model:?} {optimizer:?} from step 2");
        }
    }
}

#[test]
fn a_checkpoint_of_another_configuration_is_refused() {
    let c = tiny(ModelKind::Mlp);
    let root = tempfile::tempdir().unwrap();
    train::train(&with_checkpoints(c.clone(), root.path(), 2), &mut |_| {}).unwrap();
    let mut other = c.clone();
    other.seed = 99;
    other.resume = Some(root.path().to_owned());
    let err = train::train(&other, &mut |_| {}).unwrap_err();
    assert!(matches!(err, TrainError::Resume { .. }), "{err}");
    assert!(err.to_string().contains("different configuration"), "{err}");
}

#[test]
fn a_corrupt_checkpoint_is_never_loaded() {
    let c = tiny(ModelKind::Mlp);
    let root = tempfile::tempdir().unwrap();
    train::train(&with_checkpoints(c.clone(), root.path(), 4), &mut |_| {}).unwrap();
    let dir = root.path().join("step-00000004");
    let m = ckpt::reader::open(&dir).unwrap().manifest;
    let t = m.tensors.iter().find(|t| t.name == "optim.model.fc2.weight.exp_avg").unwrap();
    let shard = dir.join(&t.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[t.offset as usize + 17] ^= 0x04;
    std::fs::write(&shard, bytes).unwrap();
    let mut resumed = c.clone();
    resumed.resume = Some(dir);
    let err = train::train(&resumed, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("optim.model.fc2.weight.exp_avg") && err.contains("corrupt"), "{err}");
}

/// Flips one bit of `tensor`'s bytes in checkpoint `dir`.
fn corrupt(dir: &std::path::Path, tensor: &str) {
    let m = ckpt::reader::open(dir).unwrap().manifest;
    let t = m.tensors.iter().find(|t| t.name == tensor).unwrap();
    let shard = dir.join(&t.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[t.offset as usize + 5] ^= 0x10;
    std::fs::write(&shard, bytes).unwrap();
}

#[test]
fn resuming_from_a_root_falls_back_past_a_corrupt_newest_checkpoint_and_says_so() {
    let mut c = tiny(ModelKind::Mlp);
    c.steps = 6;
    let uninterrupted = fingerprint(&c);
    let root = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut first = with_checkpoints(c.clone(), root.path(), 2);
    first.steps = 5; // checkpoints at 2, 4 and 5
    fingerprint(&first);
    corrupt(&root.path().join("step-00000005"), "model.fc1.weight");
    let latest_before = std::fs::read(root.path().join("LATEST")).unwrap();

    let mut resumed = with_checkpoints(c.clone(), root.path(), 100);
    resumed.resume = Some(root.path().to_owned());
    resumed.out_dir = Some(out.path().to_owned());
    let (summary, _) = train::train(&resumed, &mut |_| {}).unwrap();
    assert_eq!(summary.resumed_from, 4, "the newest checkpoint that verifies");
    assert_eq!(summary.fingerprint, uninterrupted);
    let metrics = std::fs::read_to_string(out.path().join("metrics.jsonl")).unwrap();
    let fallback: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["kind"] == "resume_fallback")
        .expect("a resume_fallback line in metrics.jsonl");
    assert!(fallback["skipped"].as_str().unwrap().ends_with("step-00000005"), "{fallback}");
    assert!(fallback["reason"].as_str().unwrap().contains("model.fc1.weight"), "{fallback}");
    assert_eq!(fallback["step"], 4);
    // The corrupt checkpoint is left as it was, for whoever investigates.
    assert!(root.path().join("step-00000005").is_dir());
    assert_ne!(std::fs::read(root.path().join("LATEST")).unwrap(), latest_before, "the resumed run committed step 6");

    // Naming the corrupt checkpoint itself does not fall back.
    let mut named = c.clone();
    named.resume = Some(root.path().join("step-00000005"));
    let err = train::train(&named, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("model.fc1.weight"), "{err}");

    // When nothing verifies, the error lists every checkpoint tried.
    for step in ["step-00000002", "step-00000004", "step-00000006"] {
        corrupt(&root.path().join(step), "model.fc1.bias");
    }
    let err = train::train(&resumed, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("no checkpoint under it verifies") && err.contains("step-00000002"), "{err}");
}

#[test]
fn a_single_process_refuses_a_non_finite_gradient_under_a_finite_loss() {
    let mut c = tiny(ModelKind::Mlp);
    // Every exponent bit inverted in 40% of the first-layer weight gradients: those of
    // weights that see only black pixels are exactly 0 and become infinite, while the
    // loss (not a gradient element) stays finite.
    c.inject = vec!["step=2,state=grad,target=model.fc1.weight,bits=23,burst=8,rate=0.4,seed=1".parse().unwrap()];
    let err = train::train(&c, &mut |_| {}).unwrap_err();
    assert!(matches!(err, TrainError::GradientNotFinite { step: 2, .. }), "{err}");
}
