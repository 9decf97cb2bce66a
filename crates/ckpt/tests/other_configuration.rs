//! A root never comes to hold two runs' checkpoints: a commit by another configuration
//! than the one of the root's checkpoints is refused, and leaves the root as it was.

mod common;

use ckpt::{CkptError, Meta, SaveOptions};
use common::{refs, state};

const SIZES: [usize; 2] = [64, 8];

fn meta(step: u64, hash: &str) -> Meta {
    Meta { step, world_size: 1, config_hash: hash.to_owned(), ..Meta::default() }
}

fn save(root: &std::path::Path, step: u64, hash: &str) -> ckpt::Result<ckpt::SaveReport> {
    let s = state(step, &SIZES);
    ckpt::store::save(root, &meta(step, hash), &refs(&s), &SaveOptions::default())
}

/// The root's listing: each checkpoint's step and configuration, and `LATEST`.
fn snapshot(root: &std::path::Path) -> (Vec<(u64, Option<String>)>, String) {
    let listed = ckpt::store::list(root).unwrap();
    let rows = listed.iter().map(|(s, d)| (*s, ckpt::store::configuration_of(d))).collect();
    (rows, std::fs::read_to_string(root.join("LATEST")).unwrap())
}

#[test]
fn another_configuration_neither_follows_nor_replaces_a_roots_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let ours = format!("{:016x}", 21);
    let theirs = format!("{:016x}", 22);
    save(root.path(), 100, &ours).unwrap();
    save(root.path(), 200, &ours).unwrap();
    let before = snapshot(root.path());

    // A later step and an existing one, by another configuration: both refused.
    for step in [300, 200, 100] {
        match save(root.path(), step, &theirs) {
            Err(CkptError::OtherConfiguration { step: found, theirs: t, ours: o, .. }) => {
                assert_eq!((t.as_str(), o.as_str()), (ours.as_str(), theirs.as_str()));
                assert!(found == 200 || found == step, "names the checkpoint it found: {found}");
            }
            other => panic!("step {step}: expected a refusal, got {other:?}"),
        }
        assert_eq!(snapshot(root.path()), before, "the root is unchanged after refusing step {step}");
    }
    // Nothing of the refused commits is left behind.
    let debris: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(debris.is_empty(), "{debris:?}");

    // The same configuration goes on; a save that names no configuration is never refused.
    save(root.path(), 300, &ours).unwrap();
    save(root.path(), 400, "").unwrap();
    assert!(ckpt::store::check_configuration(root.path(), &ours, None).is_ok());
    assert!(matches!(
        ckpt::store::check_configuration(root.path(), &theirs, Some(300)),
        Err(CkptError::OtherConfiguration { step: 300, .. })
    ));
}

#[test]
fn a_root_that_mixes_configurations_does_not_check_out() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    save(a.path(), 1, &format!("{:016x}", 21)).unwrap();
    save(a.path(), 2, &format!("{:016x}", 21)).unwrap();
    save(b.path(), 3, &format!("{:016x}", 22)).unwrap();
    assert!(ckpt::reader::check_root(a.path()).unwrap().ok());
    // Only by hand can a root come to mix: move another run's checkpoint in.
    std::fs::rename(b.path().join("step-00000003"), a.path().join("step-00000003")).unwrap();
    let report = ckpt::reader::check_root(a.path()).unwrap();
    assert_eq!(report.corrupt(), 0, "each checkpoint is valid on its own");
    assert!(report.mixed() && !report.ok());
    assert_eq!(report.configurations, [(format!("{:016x}", 21), vec![1, 2]), (format!("{:016x}", 22), vec![3])]);
}
