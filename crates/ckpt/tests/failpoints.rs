//! The commit protocol stopped at each failpoint: the previous checkpoint stays the
//! latest valid one, nothing half-written is ever taken for a checkpoint, and the next
//! save succeeds. (One test: failpoints are process-wide.)

mod common;

use ckpt::failpoint::{self, Action, POINTS};
use ckpt::{AsyncWriter, SaveOptions};
use common::{assert_holds_step, save};

const SIZES: [usize; 3] = [300, 20, 100];

#[test]
fn a_failure_at_each_point_of_the_protocol_leaves_a_valid_latest() {
    for (i, point) in POINTS.iter().enumerate() {
        let root = tempfile::tempdir().unwrap();
        save(root.path(), 1, &SIZES, &SaveOptions::default());

        failpoint::arm(point, Action::Error);
        let s = common::state(2, &SIZES);
        let err =
            ckpt::store::save(root.path(), &common::meta(2), &common::refs(&s), &SaveOptions::default()).unwrap_err();
        failpoint::disarm_all();
        assert!(err.to_string().contains(point), "{point}: {err}");

        // Whatever the failure left, "the latest checkpoint" is a complete one: step 1
        // before the commit point (the rename), step 2 from it on, even before LATEST
        // is updated.
        let resolved = ckpt::reader::resolve(root.path()).unwrap();
        let step = assert_holds_step(&resolved, &SIZES);
        let committed = i >= POINTS.iter().position(|p| *p == "after_rename").unwrap();
        assert_eq!(step, if committed { 2 } else { 1 }, "{point}");
        for (_, dir) in ckpt::store::list(root.path()).unwrap() {
            assert_holds_step(&dir, &SIZES);
        }

        // A new writer cleans the debris and the next save commits.
        let mut w = AsyncWriter::new(root.path(), SaveOptions::default()).unwrap();
        let s = common::state(3, &SIZES);
        w.snapshot(common::meta(3), &common::refs(&s)).unwrap();
        w.finish().unwrap();
        assert_eq!(assert_holds_step(&ckpt::reader::resolve(root.path()).unwrap(), &SIZES), 3);
        let debris: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp"))
            .collect();
        assert!(debris.is_empty(), "{point}: {debris:?}");
    }
}

#[test]
fn a_persist_failure_is_reported_to_training() {
    let root = tempfile::tempdir().unwrap();
    let mut w = AsyncWriter::new(root.path(), SaveOptions::default()).unwrap();
    // Replace the checkpoint root by a file: the background persist must fail.
    std::fs::remove_dir_all(root.path()).unwrap();
    std::fs::write(root.path(), b"now a file").unwrap();
    let s = common::state(2, &SIZES);
    w.snapshot(common::meta(2), &common::refs(&s)).unwrap();
    let err = w.finish().unwrap_err();
    assert!(err.to_string().contains("cannot") && err.to_string().contains(&*root.path().to_string_lossy()), "{err}");
    std::fs::remove_file(root.path()).unwrap();
}
