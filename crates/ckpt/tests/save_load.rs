//! Saving, committing, listing, retention and loading.

mod common;

use ckpt::{Retention, SaveOptions};
use common::{assert_holds_step, save};

const SIZES: [usize; 5] = [1000, 10, 3000, 1, 500];

#[test]
fn save_then_load_returns_every_bit_with_any_number_of_shards() {
    for shards in [1, 2, 3, 8] {
        let root = tempfile::tempdir().unwrap();
        let report = save(root.path(), 7, &SIZES, &SaveOptions { shards, retention: Retention::default() });
        let c = ckpt::reader::open(&report.dir).unwrap();
        let files = c.manifest.files.len();
        assert!((1..=shards.min(SIZES.len())).contains(&files), "{files} files for {shards} shards");
        assert_eq!(shards == 1, files == 1);
        assert!(c.verify().is_empty());
        assert_eq!(assert_holds_step(&report.dir, &SIZES), 7);
        assert_eq!(report.dir.file_name().unwrap(), "step-00000007");
    }
}

#[test]
fn latest_follows_commits_and_retention_keeps_what_it_promises() {
    let root = tempfile::tempdir().unwrap();
    let options = SaveOptions { shards: 2, retention: Retention { keep_last: Some(2), keep_every: Some(4) } };
    for step in 1..=9 {
        save(root.path(), step, &SIZES, &options);
        let latest = ckpt::reader::resolve(root.path()).unwrap();
        assert_eq!(assert_holds_step(&latest, &SIZES), step);
    }
    let kept: Vec<u64> = ckpt::store::list(root.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(kept, vec![4, 8, 9]);
}

#[test]
fn resolve_falls_back_when_latest_is_missing_or_dangling() {
    let root = tempfile::tempdir().unwrap();
    save(root.path(), 3, &SIZES, &SaveOptions::default());
    save(root.path(), 5, &SIZES, &SaveOptions::default());
    std::fs::write(root.path().join("LATEST"), "step-00000099\n").unwrap();
    assert_eq!(assert_holds_step(&ckpt::reader::resolve(root.path()).unwrap(), &SIZES), 5);
    std::fs::remove_file(root.path().join("LATEST")).unwrap();
    assert_eq!(assert_holds_step(&ckpt::reader::resolve(root.path()).unwrap(), &SIZES), 5);
    // A step directory without a manifest is never a checkpoint.
    std::fs::remove_file(root.path().join("step-00000005/manifest.json")).unwrap();
    assert_eq!(assert_holds_step(&ckpt::reader::resolve(root.path()).unwrap(), &SIZES), 3);
    let err = ckpt::reader::open(&root.path().join("step-00000005")).unwrap_err();
    assert!(err.to_string().contains("no manifest.json"), "{err}");
}

#[test]
fn saving_an_existing_step_again_replaces_it() {
    let root = tempfile::tempdir().unwrap();
    save(root.path(), 4, &SIZES, &SaveOptions::default());
    save(root.path(), 4, &[7, 7], &SaveOptions::default());
    let dir = ckpt::reader::resolve(root.path()).unwrap();
    assert_holds_step(&dir, &[7, 7]);
    let names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".tmp")), "{names:?}");
}

#[test]
fn async_writer_persists_in_the_background_and_reuses_buffers() {
    let root = tempfile::tempdir().unwrap();
    let mut w = ckpt::AsyncWriter::new(root.path(), SaveOptions::default()).unwrap();
    for step in 1..=5 {
        let s = common::state(step, &SIZES);
        w.snapshot(common::meta(step), &common::refs(&s)).unwrap();
        // The caller may change its state right away: the snapshot is a copy.
        drop(s);
    }
    let last = w.finish().unwrap().unwrap();
    assert_eq!(assert_holds_step(&last.dir, &SIZES), 5);
    let stats = w.stats();
    assert_eq!((stats.snapshots, stats.committed), (5, 5));
    assert!(stats.stall <= stats.persist + stats.backpressure + std::time::Duration::from_secs(1));
}

#[test]
fn a_prepared_writer_saves_the_snapshot_not_the_prepared_values() {
    // Prepared with other values, and with another layout: the checkpoint holds what the
    // snapshot was given, every bit (assert_holds_step checks each value of step 3).
    for prepared in [common::state(1, &SIZES), common::state(1, &[7, 7])] {
        let root = tempfile::tempdir().unwrap();
        let mut w = ckpt::AsyncWriter::new(root.path(), SaveOptions::default()).unwrap();
        w.prepare(&common::refs(&prepared)).unwrap();
        let s = common::state(3, &SIZES);
        w.snapshot(common::meta(3), &common::refs(&s)).unwrap();
        let last = w.finish().unwrap().unwrap();
        assert_eq!(assert_holds_step(&last.dir, &SIZES), 3);
        assert_eq!(w.stats().snapshots, 1);
    }
}

#[test]
fn exported_file_is_one_plain_safetensors_file() {
    let root = tempfile::tempdir().unwrap();
    let report = save(root.path(), 2, &SIZES, &SaveOptions { shards: 3, retention: Retention::default() });
    let c = ckpt::reader::open(&report.dir).unwrap();
    let out = root.path().join("all.safetensors");
    ckpt::export::export(&c, &out).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let n = ckpt::safetensors::header_len(bytes[..8].try_into().unwrap(), bytes.len() as u64).unwrap();
    let h = ckpt::safetensors::parse_header(&bytes[8..8 + n as usize], bytes.len() as u64).unwrap();
    assert_eq!(h.entries.len(), SIZES.len());
    assert_eq!(h.metadata["steadfast.step"], "2");
    let loaded = c.load().unwrap();
    for e in &h.entries {
        let t = loaded.iter().find(|t| t.name == e.name).unwrap();
        let start = (h.data_start + e.begin) as usize;
        assert_eq!(&bytes[start..start + e.len() as usize], t.bytes());
    }
}

#[test]
fn tensors_of_any_dtype_and_a_state_tree_round_trip_and_a_wrong_length_is_refused() {
    use ckpt::{DType, Meta, RawTensorRef, Role};
    let root = tempfile::tempdir().unwrap();
    let bf16 = [0x3f80u16, 0xc000, 0x7fc1].map(u16::to_le_bytes).concat();
    let counter = 12345i64.to_le_bytes();
    let flags = [1u8, 0, 1, 1];
    let tensors = [
        RawTensorRef { name: "model.w", role: Role::Model, dtype: DType::BF16, shape: &[3], bytes: &bf16 },
        RawTensorRef { name: "optimizer.step", role: Role::Optim, dtype: DType::I64, shape: &[], bytes: &counter },
        RawTensorRef { name: "rng.flags", role: Role::Extra, dtype: DType::Bool, shape: &[2, 2], bytes: &flags },
        RawTensorRef { name: "empty", role: Role::Extra, dtype: DType::F32, shape: &[0, 4], bytes: &[] },
    ];
    let tree = serde_json::json!({"dict": [[{"str": "w"}, {"tensor": "model.w"}]]});
    let meta = Meta { step: 3, tree: Some(tree.clone()), ..Meta::default() };
    let report = ckpt::store::save_raw(root.path(), &meta, &tensors, &SaveOptions::default()).unwrap();
    let c = ckpt::reader::open(&report.dir).unwrap();
    assert!(c.verify().is_empty());
    assert_eq!(c.manifest.meta.tree, Some(tree));
    let loaded = c.load().unwrap();
    for (t, l) in tensors.iter().zip(&loaded) {
        assert_eq!(
            (l.name.as_str(), l.role, l.dtype, l.shape.as_slice(), l.bytes()),
            (t.name, t.role, t.dtype, t.shape, t.bytes)
        );
    }
    // Bytes that do not fill the shape, and a tree with a float, are refused before any write.
    let short = [RawTensorRef { bytes: &bf16[..4], ..tensors[0] }];
    let err = ckpt::store::save_raw(root.path(), &Meta { step: 4, ..Meta::default() }, &short, &SaveOptions::default());
    assert!(err.unwrap_err().to_string().contains("model.w"));
    let floats = Meta { step: 5, tree: Some(serde_json::json!([0.5])), ..Meta::default() };
    assert!(ckpt::store::save_raw(root.path(), &floats, &tensors, &SaveOptions::default()).is_err());
    assert_eq!(ckpt::store::list(root.path()).unwrap().len(), 1);
}
