//! Injection into Steadfast checkpoints that are already corrupt, and logs that lie.
//!
//! The rule: a checksum is recomputed only for a tensor whose bytes matched it before
//! the change. A corrupt input is refused (nothing copied, nothing written) unless
//! `allow_corrupt_input`, and then its corrupt tensors keep their stale checksums.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{Meta, Role, SaveOptions, TensorRef};
use fault::inject::{InjectError, InjectOptions, InjectionLog, inject, replay, undo};
use fault::plan::{Amount, FlipSpec, Target};
use fault::{BitClass, BitSpec};

/// A committed checkpoint of two tensors under `root`; returns its directory.
fn checkpoint(root: &Path) -> PathBuf {
    let w: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    let m: Vec<f32> = (0..32).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    let tensors = [
        TensorRef { name: "model.w", role: Role::Model, shape: &[8, 8], data: &w },
        TensorRef { name: "optim.model.w.exp_avg", role: Role::Optim, shape: &[32], data: &m },
    ];
    let meta = Meta { step: 7, world_size: 1, config_hash: format!("{:016x}", 1), ..Meta::default() };
    ckpt::store::save(root, &meta, &tensors, &SaveOptions::default()).unwrap().dir
}

/// Inverts one byte of `tensor`'s data in place, as a disk fault would.
fn corrupt(dir: &Path, tensor: &str, byte: u64) {
    let c = ckpt::reader::open(dir).unwrap();
    let t = c.manifest.tensors.iter().find(|t| t.name == tensor).unwrap();
    let path = dir.join(&t.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(t.offset + byte) as usize] ^= 0xFF;
    std::fs::write(&path, bytes).unwrap();
}

/// Every file of a directory, by name.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

fn spec(target: &str, count: u64) -> FlipSpec {
    FlipSpec {
        target: Target { glob: Some(target.into()), role: None },
        bits: BitSpec::Class(BitClass::Mantissa),
        amount: Amount::Count(count),
        burst: 1,
        seed: 5,
    }
}

fn out(path: &Path) -> InjectOptions {
    InjectOptions { out: Some(path.to_owned()), ..InjectOptions::default() }
}

/// The tensors `steadfast ckpt verify` would report.
fn failing(dir: &Path) -> Vec<String> {
    ckpt::reader::open(dir).unwrap().verify().into_iter().filter_map(|p| p.tensor).collect()
}

fn xxh3_of(dir: &Path, tensor: &str) -> String {
    let c = ckpt::reader::open(dir).unwrap();
    c.manifest.tensors.iter().find(|t| t.name == tensor).unwrap().xxh3.clone()
}

#[test]
fn a_corrupt_tensor_is_refused_and_no_copy_is_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    corrupt(&dir, "model.w", 10);
    let before = snapshot(&dir);
    let copy = tmp.path().join("copy");
    let err = inject(&dir, &spec("model.w", 3), &out(&copy)).unwrap_err();
    assert!(matches!(&err, InjectError::CorruptInput { tensors, .. } if tensors == &["model.w"]), "{err}");
    let text = err.to_string();
    assert!(text.contains("model.w") && text.contains("already corrupt"), "{text}");
    assert!(!copy.exists(), "a refused injection leaves no copy behind");
    // In place: not a byte changes, the manifest included.
    let err = inject(&dir, &spec("model.w", 3), &InjectOptions::default()).unwrap_err();
    assert!(matches!(err, InjectError::CorruptInput { .. }), "{err}");
    let err = inject(&dir, &spec("model.w", 3), &InjectOptions { keep_checksums: true, ..Default::default() });
    assert!(matches!(err, Err(InjectError::CorruptInput { .. })), "kept checksums are no excuse");
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn allowed_corrupt_input_is_altered_but_not_laundered() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    corrupt(&dir, "model.w", 10);
    let before = snapshot(&dir);
    let stale = xxh3_of(&dir, "model.w");
    let copy = tmp.path().join("copy");
    let options = InjectOptions { allow_corrupt_input: true, ..out(&copy) };
    let log = inject(&dir, &spec("*", 6), &options).unwrap();
    assert_eq!(log.corrupt_input, ["model.w"]);
    assert_eq!(log.checksums, "rewritten");
    assert!(log.flips.iter().any(|f| f.tensor == "model.w"), "the corrupt tensor is altered too");
    assert!(log.flips.iter().any(|f| f.tensor.starts_with("optim.")));
    // The corrupt tensor keeps its old checksum and still fails; the clean one, altered,
    // has a fresh checksum and verifies.
    assert_eq!(xxh3_of(&copy, "model.w"), stale);
    assert_eq!(failing(&copy), ["model.w"]);
    // The log survives a round trip through JSON, and undo gives back the input exactly.
    let log: InjectionLog = serde_json::from_str(&serde_json::to_string(&log).unwrap()).unwrap();
    undo(&log, Some(&copy), &InjectOptions::default()).unwrap();
    assert_eq!(snapshot(&copy), before);
}

#[test]
fn corruption_in_a_tensor_left_alone_stays_visible() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    corrupt(&dir, "optim.model.w.exp_avg", 0);
    let copy = tmp.path().join("copy");
    let log = inject(&dir, &spec("model.w", 4), &out(&copy)).unwrap();
    assert!(log.corrupt_input.is_empty());
    assert_eq!(failing(&copy), ["optim.model.w.exp_avg"]);
}

#[test]
fn replay_on_a_corrupt_checkpoint_is_refused_before_any_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    let log = inject(&dir, &spec("model.w", 3), &out(&tmp.path().join("first"))).unwrap();
    // Another copy of the same checkpoint, struck by a disk fault elsewhere in model.w.
    let other = checkpoint(&tmp.path().join("other"));
    let flipped: Vec<u64> = log.flips.iter().map(|f| f.element * 4).collect();
    let byte = (0..256).find(|b| !flipped.contains(&(b / 4 * 4))).unwrap();
    corrupt(&other, "model.w", byte);
    let before = snapshot(&other);
    let again = tmp.path().join("again");
    let err = replay(&log, Some(&other), &out(&again)).unwrap_err();
    assert!(matches!(&err, InjectError::CorruptInput { tensors, .. } if tensors == &["model.w"]), "{err}");
    assert!(!again.exists());
    assert_eq!(snapshot(&other), before);
    // Allowed, the replay names the corrupt tensor and leaves its checksum stale.
    let options = InjectOptions { allow_corrupt_input: true, ..out(&again) };
    let replayed = replay(&log, Some(&other), &options).unwrap();
    assert_eq!(replayed.corrupt_input, ["model.w"]);
    assert_eq!(failing(&again), ["model.w"]);
}

#[test]
fn undo_refuses_to_launder_corruption_that_struck_after_the_injection() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    let copy = tmp.path().join("copy");
    let log = inject(&dir, &spec("optim.*", 2), &out(&copy)).unwrap();
    assert!(failing(&copy).is_empty());
    let flipped: Vec<u64> = log.flips.iter().map(|f| f.element * 4).collect();
    let byte = (0..128).find(|b| !flipped.contains(&(b / 4 * 4))).unwrap();
    corrupt(&copy, "optim.model.w.exp_avg", byte);
    let before = snapshot(&copy);
    let err = undo(&log, Some(&copy), &InjectOptions::default()).unwrap_err();
    assert!(matches!(&err, InjectError::CorruptInput { tensors, .. } if tensors == &["optim.model.w.exp_avg"]));
    assert_eq!(snapshot(&copy), before, "a refused undo changes nothing");
}

#[test]
fn a_log_with_bytes_that_do_not_fit_the_element_is_refused_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = checkpoint(&tmp.path().join("ckpt"));
    let copy = tmp.path().join("copy");
    let log = inject(&dir, &spec("model.w", 1), &out(&copy)).unwrap();
    let before = snapshot(&copy);
    // Undo would write old_bytes: eight bytes into a four-byte element would clobber the
    // next element.
    let mut long = log.clone();
    long.flips[0].old_bytes.push_str("00000000");
    let err = undo(&long, Some(&copy), &InjectOptions::default()).unwrap_err();
    assert!(err.to_string().contains("is 4 bytes, not 8"), "{err}");
    // Text that is not hex, even with characters of several bytes, is an error.
    let mut bad = log.clone();
    bad.flips[0].old_bytes = "0\u{e9}0000".into();
    let err = undo(&bad, Some(&copy), &InjectOptions::default()).unwrap_err();
    assert!(matches!(err, InjectError::BadLog { .. }), "{err}");
    // The same element listed twice.
    let mut twice = log.clone();
    twice.flips.push(log.flips[0].clone());
    let err = undo(&twice, Some(&copy), &InjectOptions::default()).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    assert_eq!(snapshot(&copy), before);
    undo(&log, Some(&copy), &InjectOptions::default()).unwrap();
    assert_eq!(snapshot(&copy), snapshot(&dir));
}
