//! Any single flipped bit in a checkpoint is caught by `verify` and by `load`, and bad
//! files give errors that name them.

mod common;

use std::path::{Path, PathBuf};

use ckpt::{CkptError, SaveOptions};

const SIZES: [usize; 3] = [6, 3, 5];

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn caught(dir: &Path) -> bool {
    let verify_caught = match ckpt::reader::open(dir) {
        Err(_) => true,
        Ok(c) => !c.verify().is_empty(),
    };
    let load_caught = ckpt::reader::open(dir).and_then(|c| c.load()).is_err();
    assert_eq!(verify_caught, load_caught, "verify and load disagree");
    let read_caught = ckpt::reader::open(dir).and_then(|c| read_into(&c).map(|_| ())).is_err();
    assert_eq!(verify_caught, read_caught, "verify and read_into disagree");
    verify_caught
}

/// Every tensor of `c`, read into buffers of our own.
fn read_into(c: &ckpt::reader::Checkpoint) -> ckpt::Result<Vec<Vec<u8>>> {
    let mut buffers: Vec<Vec<u8>> = c.manifest.tensors.iter().map(|t| vec![0u8; t.length as usize]).collect();
    let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    c.read_into(&mut slices)?;
    Ok(buffers)
}

#[test]
fn read_into_gives_the_bytes_load_gives_and_refuses_buffers_of_the_wrong_length() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &SIZES, &SaveOptions { shards: 2, ..SaveOptions::default() });
    let c = ckpt::reader::open(&report.dir).unwrap();
    let loaded: Vec<Vec<u8>> = c.load().unwrap().iter().map(|t| t.bytes().to_vec()).collect();
    assert_eq!(read_into(&c).unwrap(), loaded);
    let mut short = [0u8; 3];
    let err = c.read_into(&mut [&mut short[..]]).unwrap_err().to_string();
    assert!(err.contains("1 buffers for the 3 tensors"), "{err}");
    let mut buffers: Vec<Vec<u8>> = c.manifest.tensors.iter().map(|t| vec![0u8; t.length as usize + 1]).collect();
    let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    let err = c.read_into(&mut slices).unwrap_err().to_string();
    assert!(err.contains("a buffer of") && err.contains(&c.manifest.tensors[0].name), "{err}");
}

#[test]
fn a_checkpoint_whose_data_is_damaged_is_passed_over_for_the_newest_older_one_that_opens() {
    let root = tempfile::tempdir().unwrap();
    for step in 1..=3 {
        common::save(root.path(), step, &SIZES, &SaveOptions::default());
    }
    // Step 2's manifest is gone: resolve_older(3) passes over it, naming it, to step 1.
    std::fs::remove_file(root.path().join("step-00000002/manifest.json")).unwrap();
    let older = ckpt::reader::resolve_older(root.path(), 3).unwrap();
    assert!(older.dir.ends_with("step-00000001"), "{}", older.dir.display());
    assert_eq!(older.skipped.len(), 1);
    assert!(older.skipped[0].0.ends_with("step-00000002"));
    let err = ckpt::reader::resolve_older(root.path(), 1).unwrap_err().to_string();
    assert!(err.contains("no checkpoint older than step 1"), "{err}");
}

#[test]
fn every_single_bit_flip_of_every_file_is_caught() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &SIZES, &SaveOptions::default());
    let mut flips = 0;
    for path in files(&report.dir) {
        let original = std::fs::read(&path).unwrap();
        for i in 0..original.len() {
            for bit in 0..8 {
                let mut b = original.clone();
                b[i] ^= 1 << bit;
                std::fs::write(&path, &b).unwrap();
                assert!(caught(&report.dir), "flip of bit {bit} of byte {i} of {} went unnoticed", path.display());
                flips += 1;
            }
        }
        std::fs::write(&path, &original).unwrap();
        assert!(!caught(&report.dir));
    }
    assert!(flips > 8 * 1000, "only {flips} flips tried");
}

#[test]
fn verify_names_each_corrupt_tensor() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &[100, 100, 100], &SaveOptions { shards: 1, ..SaveOptions::default() });
    let c = ckpt::reader::open(&report.dir).unwrap();
    let shard = report.dir.join(&c.manifest.files[0].file);
    let mut bytes = std::fs::read(&shard).unwrap();
    for t in [&c.manifest.tensors[0], &c.manifest.tensors[2]] {
        bytes[t.offset as usize + 5] ^= 0x10;
    }
    std::fs::write(&shard, &bytes).unwrap();
    let problems = c.verify();
    let names: Vec<&str> = problems.iter().filter_map(|p| p.tensor.as_deref()).collect();
    assert_eq!(names, vec!["model.t0", "model.t2"]);
    let err = c.load().unwrap_err();
    assert!(matches!(&err, CkptError::Corrupt { tensor: Some(t), .. } if t == "model.t0"), "{err}");
    assert!(err.to_string().contains("shard-0000.safetensors"), "{err}");
}

#[test]
fn truncated_and_missing_shards_are_named() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &SIZES, &SaveOptions { shards: 2, ..SaveOptions::default() });
    let shard = report.dir.join("shard-0001.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 3]).unwrap();
    let c = ckpt::reader::open(&report.dir).unwrap();
    let err = c.load().unwrap_err().to_string();
    assert!(err.contains("shard-0001.safetensors") && err.contains("bytes"), "{err}");
    assert_eq!(c.verify()[0].file, "shard-0001.safetensors");

    std::fs::remove_file(&shard).unwrap();
    let err = c.load().unwrap_err().to_string();
    assert!(err.contains("shard-0001.safetensors"), "{err}");
    assert!(c.verify()[0].reason.contains("cannot open"), "{:?}", c.verify());
}

#[test]
fn a_manifest_with_wrong_types_is_a_format_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &SIZES, &SaveOptions::default());
    let path = report.dir.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["tensors"][0]["shape"] = serde_json::json!("six");
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let err = ckpt::reader::open(&report.dir).unwrap_err();
    assert!(matches!(err, CkptError::Format { .. }), "{err}");
    assert!(err.to_string().contains("manifest.json"), "{err}");

    std::fs::write(&path, b"{\"format\": \"steadfast-checkpoint\", \"vers").unwrap();
    let err = ckpt::reader::open(&report.dir).unwrap_err().to_string();
    assert!(err.contains("not valid JSON") && err.contains("manifest.json"), "{err}");
}

/// A shard whose header lies about offsets, with every checksum recomputed to match, so
/// that only the structural checks can catch it.
#[test]
fn a_shard_header_that_lies_about_offsets_is_rejected_even_with_matching_checksums() {
    let root = tempfile::tempdir().unwrap();
    let report = common::save(root.path(), 1, &[4, 4], &SaveOptions { shards: 1, ..SaveOptions::default() });
    let shard = report.dir.join("shard-0000.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    // Make both tensors claim the same bytes.
    let lying = header.replacen("[16,32]", "[0,16] ", 1);
    assert_ne!(lying, header);
    let mut new = bytes.clone();
    new[8..8 + n].copy_from_slice(lying.as_bytes());
    std::fs::write(&shard, &new).unwrap();

    let mpath = report.dir.join("manifest.json");
    let mut m = ckpt::reader::open(&report.dir).unwrap().manifest;
    m.files[0].header_xxh3 = ckpt::manifest::hex64(ckpt::checksum(&new[..8 + n]));
    let m = ckpt::Manifest::new(m.meta, m.files, m.tensors);
    std::fs::write(&mpath, m.to_bytes()).unwrap();

    let c = ckpt::reader::open(&report.dir).unwrap();
    let err = c.load().unwrap_err().to_string();
    assert!(err.contains("shard-0000.safetensors") && err.contains("gap or overlap"), "{err}");
}
