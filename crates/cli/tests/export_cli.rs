//! Exports for other systems: `ckpt export` of another format's file, and `bench init` /
//! `bench order` (a run's starting weights and data order).

mod common;

use std::path::Path;

use common::{ok, steadfast};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tensors of a safetensors file, as (name, dtype, shape, bytes), read with our own reader.
fn tensors(path: &Path) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let located = ckpt::foreign::locate(path).unwrap();
    assert_eq!(located.format, ckpt::foreign::Format::Safetensors);
    let bytes = std::fs::read(path).unwrap();
    located
        .tensors
        .iter()
        .map(|t| {
            let data = bytes[t.offset as usize..(t.offset + t.len) as usize].to_vec();
            (t.name.clone(), t.dtype.name().to_owned(), t.shape.clone(), data)
        })
        .collect()
}

#[test]
fn a_pytorch_file_exports_every_tensor_with_its_bytes() {
    use sha2::Digest;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state.pt");
    let expected: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture.with_extension("pt.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("state.safetensors");
    let said: serde_json::Value =
        serde_json::from_str(&ok(steadfast(&["ckpt", "--json", "export", s(&fixture), "--to", s(&out)]))).unwrap();
    assert_eq!(said["format"], "pytorch");
    let got = tensors(&out);
    assert_eq!(got.len(), expected.len());
    for ((name, _, shape, data), e) in got.iter().zip(&expected) {
        assert_eq!(name, e["name"].as_str().unwrap());
        assert_eq!(serde_json::json!(shape), e["shape"]);
        assert_eq!(format!("{:x}", sha2::Sha256::digest(data)), e["sha256"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn a_column_major_npz_member_exports_row_major() {
    if !common::python_with("numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let npz = tmp.path().join("f.npz");
    let script = "import sys, numpy as np\n\
                  np.savez(sys.argv[1], k=np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)))";
    let made = std::process::Command::new("python3").args(["-c", script, s(&npz)]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let out = tmp.path().join("f.safetensors");
    ok(steadfast(&["ckpt", "export", s(&npz), "--to", s(&out)]));
    let got = tensors(&out);
    assert_eq!((got[0].0.as_str(), got[0].1.as_str(), got[0].2.clone()), ("k", "F32", vec![3, 4]));
    let values: Vec<f32> = got[0].3.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(values, (0..12).map(|i| i as f32).collect::<Vec<_>>());
}

#[test]
fn a_file_of_no_known_format_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.bin");
    std::fs::write(&junk, b"not a checkpoint at all").unwrap();
    let out = tmp.path().join("out.safetensors");
    let r = steadfast(&["ckpt", "export", s(&junk), "--to", s(&out)]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("unknown format"), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "only the input remains");
}

#[test]
fn the_exported_order_is_a_fixed_permutation_per_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.safetensors"), tmp.path().join("b.safetensors"));
    for out in [&a, &b] {
        ok(steadfast(&["bench", "order", "--examples", "1000", "--epochs", "3", "--seed", "4", "--to", s(out)]));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "the same flags give the same file");
    let got = tensors(&a);
    assert_eq!((got[0].0.as_str(), got[0].1.as_str(), got[0].2.clone()), ("order", "U32", vec![3, 1000]));
    let order: Vec<u32> = got[0].3.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    let epochs: Vec<&[u32]> = order.chunks(1000).collect();
    for epoch in &epochs {
        let mut sorted = epoch.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
    }
    assert_ne!(epochs[0], epochs[1]);
    // The order is the training run's: the sampler's own function.
    assert_eq!(epochs[2], train::data::sampler::epoch_order(4, 1000, 2));
    let r = steadfast(&["bench", "order", "--examples", "0", "--to", s(&a)]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("must be positive"));
}

#[test]
fn the_exported_initial_weights_are_the_models() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("init.safetensors");
    ok(steadfast(&["bench", "init", "--model", "cnn", "--seed", "3", "--to", s(&out)]));
    let want = train::model::initial_params(train::model::ModelKind::Cnn, 3, 256).unwrap();
    let got = tensors(&out);
    assert_eq!(got.len(), want.len());
    for ((name, dtype, shape, data), t) in got.iter().zip(&want) {
        assert_eq!((name, dtype.as_str()), (&t.name, "F32"));
        assert_eq!(shape.iter().map(|&d| d as usize).collect::<Vec<_>>(), t.shape);
        let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(values, t.data, "{name}");
    }
    let r = steadfast(&["bench", "init", "--model", "gpt", "--to", s(&out)]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("MLP and LeNet-5 only"));
}
