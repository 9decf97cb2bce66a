//! Checkpoints written in parts by several writers that hold the same state (the replicas
//! of a data-parallel job): each writes disjoint shards, writer 0 commits once all parts
//! are durable, and nothing is visible to readers before that.

mod common;

use ckpt::store::{Part, commit_parts};
use ckpt::{AsyncWriter, Retention, SaveOptions};
use common::{assert_holds_step, meta, refs, state};

const SIZES: &[usize] = &[300, 20, 4000, 7, 900, 64, 1, 2500];

fn writers(root: &std::path::Path, count: usize) -> Vec<AsyncWriter> {
    let options = SaveOptions { shards: 2, retention: Retention::default() };
    (0..count).map(|index| AsyncWriter::for_part(root, options, Part::of(index, count)).unwrap()).collect()
}

#[test]
fn three_writers_produce_the_same_checkpoint_as_one() {
    let root = tempfile::tempdir().unwrap();
    let s = state(6, SIZES);
    let mut ws = writers(root.path(), 3);
    for w in &mut ws {
        w.snapshot(meta(6), &refs(&s)).unwrap();
    }
    for w in &mut ws {
        w.wait_persisted().unwrap();
        assert_eq!(w.durable(), 6);
    }
    assert!(ckpt::reader::resolve(root.path()).is_err(), "nothing is committed before writer 0 commits");
    // Committing through an older step does nothing.
    ws[0].commit_through(5).unwrap();
    ws[0].finish().unwrap();
    assert!(ckpt::reader::resolve(root.path()).is_err());
    ws[0].commit_through(6).unwrap();
    let report = ws[0].finish().unwrap().expect("committed");
    assert_eq!(assert_holds_step(&report.dir, SIZES), 6);
    let c = ckpt::reader::open(&report.dir).unwrap();
    assert!(c.verify().is_empty());
    let sizes: Vec<u64> = SIZES.iter().map(|&n| n as u64 * 4).collect();
    let planned: usize = (0..3).map(|index| Part::of(index, 3).shards(&sizes, 2).len()).sum();
    assert_eq!(c.manifest.files.len(), planned);
    assert!(planned > 3, "several shards per writer");

    // The same tensors, checksums and registry order as a single writer's checkpoint.
    let single = tempfile::tempdir().unwrap();
    let one = common::save(single.path(), 6, SIZES, &SaveOptions::default());
    let one = ckpt::reader::open(&one.dir).unwrap();
    let key = |c: &ckpt::Checkpoint| -> Vec<(String, String)> {
        c.manifest.tensors.iter().map(|t| (t.name.clone(), t.xxh3.clone())).collect()
    };
    assert_eq!(key(&c), key(&one));
    // Only the committed directory and LATEST remain (and the writers' lock files).
    let names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !ckpt::owner::is_lock_file(n))
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_missing_part_is_never_committed() {
    let root = tempfile::tempdir().unwrap();
    let s = state(4, SIZES);
    let mut ws = writers(root.path(), 3);
    // Writer 2 dies before persisting anything.
    for w in ws.iter_mut().take(2) {
        w.snapshot(meta(4), &refs(&s)).unwrap();
        w.wait_persisted().unwrap();
    }
    let err = commit_parts(root.path(), &meta(4), Part::of(0, 3), Retention::default()).unwrap_err();
    assert!(err.to_string().contains("part-0002.json"), "{err}");
    assert!(ckpt::store::list(root.path()).unwrap().is_empty());
    assert!(ckpt::reader::resolve(root.path()).is_err());
    // A new writer 0 clears the leftovers of the failed checkpoint.
    drop(ws);
    let _fresh = writers(root.path(), 3);
    let left: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !ckpt::owner::is_lock_file(n))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_part_record_from_another_step_or_job_shape_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let s = state(4, SIZES);
    let mut ws = writers(root.path(), 2);
    for w in &mut ws {
        w.snapshot(meta(4), &refs(&s)).unwrap();
        w.wait_persisted().unwrap();
    }
    // Committing as if the job had three writers, or another step, fails clearly.
    let err = commit_parts(root.path(), &meta(4), Part::of(0, 3), Retention::default()).unwrap_err();
    assert!(err.to_string().contains("part 0/2, expected step 4 part 0/3"), "{err}");
    assert!(commit_parts(root.path(), &meta(5), Part::of(0, 2), Retention::default()).is_err());
    // The real commit still works afterwards.
    let report = commit_parts(root.path(), &meta(4), Part::of(0, 2), Retention::default()).unwrap();
    assert_eq!(assert_holds_step(&report.dir, SIZES), 4);
}

#[test]
fn a_step_written_again_after_the_job_went_back_replaces_its_uncommitted_parts() {
    let root = tempfile::tempdir().unwrap();
    let mut ws = writers(root.path(), 2);
    // The parts of step 4 are durable (holding other bits) but not committed when the job
    // goes back to an older step; the same writers reach step 4 again.
    let other = state(3, SIZES);
    let s = state(4, SIZES);
    for bits in [&other, &s] {
        for w in &mut ws {
            w.snapshot(meta(4), &refs(bits)).unwrap();
            w.wait_persisted().unwrap();
            assert_eq!(w.durable(), 4);
        }
    }
    ws[0].commit_through(4).unwrap();
    let report = ws[0].finish().unwrap().expect("committed");
    assert!(ckpt::reader::open(&report.dir).unwrap().verify().is_empty());
    assert_eq!(assert_holds_step(&report.dir, SIZES), 4, "the second attempt's bits");
}

#[test]
fn each_writer_copies_only_its_own_shards() {
    let sizes: Vec<u64> = SIZES.iter().map(|&n| n as u64 * 4).collect();
    let mut covered = Vec::new();
    for index in 0..3 {
        let shards = Part::of(index, 3).shards(&sizes, 2);
        assert!(shards.iter().all(|(i, _)| i % 3 == index));
        covered.extend(shards.into_iter().flat_map(|(_, r)| r));
    }
    covered.sort();
    assert_eq!(covered, (0..SIZES.len()).collect::<Vec<_>>(), "every tensor exactly once");
}

/// The writers of one job own different parts and coexist; a second writer of a part that
/// is owned (another run on the same root) is refused, and leaves the owner's temporaries
/// alone; once the owner is gone, its part is free again.
#[test]
fn a_part_has_one_writer_and_a_second_one_is_refused_without_touching_anything() {
    let root = tempfile::tempdir().unwrap();
    let s = state(4, SIZES);
    let mut ws = writers(root.path(), 2);
    ws[1].snapshot(meta(4), &refs(&s)).unwrap();
    ws[1].wait_persisted().unwrap();
    let before: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    let options = SaveOptions::default();
    for part in [Part::of(0, 2), Part::of(1, 2), Part::WHOLE] {
        let err = AsyncWriter::for_part(root.path(), options, part).err().expect("a second writer of an owned part");
        assert!(matches!(err, ckpt::CkptError::Busy { .. }), "{err}");
        assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
    }
    let after: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after, "a refused writer removed or added something");
    drop(ws);
    AsyncWriter::new(root.path(), options).unwrap();
}

/// The writers of an elastic job's membership (`group`, its epoch).
fn group(root: &std::path::Path, count: usize, group: u64) -> Vec<AsyncWriter> {
    let options = SaveOptions { shards: 2, retention: Retention::default() };
    (0..count).map(|index| AsyncWriter::for_part(root, options, Part { index, count, group }).unwrap()).collect()
}

#[test]
fn the_memberships_of_an_elastic_job_write_apart_and_only_a_committer_locks() {
    let root = tempfile::tempdir().unwrap();
    let s = state(8, SIZES);
    // Epoch 1 of three writers snapshots step 8; its writer 2 never persists (lost).
    let mut first = group(root.path(), 3, 1);
    for w in first.iter_mut().take(2) {
        w.snapshot(meta(8), &refs(&s)).unwrap();
        w.wait_persisted().unwrap();
    }
    // Writer 1 of epoch 2 starts while epoch 1's writers live: no lock stops it (a
    // process may hold another index in each epoch); its committer waits for the lock.
    let options = SaveOptions { shards: 2, retention: Retention::default() };
    let mut second = vec![AsyncWriter::for_part(root.path(), options, Part { index: 1, count: 2, group: 2 }).unwrap()];
    second[0].snapshot(meta(8), &refs(&s)).unwrap();
    second[0].wait_persisted().unwrap();
    let busy = AsyncWriter::for_part(root.path(), options, Part { index: 0, count: 2, group: 2 });
    assert!(matches!(busy, Err(ckpt::CkptError::Busy { .. })), "epoch 1's committer holds the lock");
    // Epoch 1's committer never commits step 8 (a part is missing) and lets go.
    first[0].finish().unwrap();
    drop(first);
    assert!(ckpt::reader::resolve(root.path()).is_err());
    // Epoch 2's committer clears epoch 1's parts, keeps its own group's, and commits.
    second.insert(0, AsyncWriter::for_part(root.path(), options, Part { index: 0, count: 2, group: 2 }).unwrap());
    let temporaries = || -> Vec<String> {
        std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect()
    };
    assert_eq!(temporaries(), vec![format!(".tmp-{}-parts-g2", ckpt::store::step_dir_name(8))]);
    second[0].snapshot(meta(8), &refs(&s)).unwrap();
    second[0].wait_persisted().unwrap();
    second[0].commit_through(8).unwrap();
    let report = second[0].finish().unwrap().expect("committed");
    assert_eq!(assert_holds_step(&report.dir, SIZES), 8);
    assert!(ckpt::reader::open(&report.dir).unwrap().verify().is_empty());
    assert!(temporaries().is_empty());
}
