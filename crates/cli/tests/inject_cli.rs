//! `steadfast inject` against the real libraries of every format: the altered files load
//! in Python's safetensors, NumPy and h5py (and, for the committed PyTorch fixture, in our
//! pickle reader, checked against what PyTorch itself reported), and exactly the logged
//! bits differ. Replay and undo are exact; bad input is refused without touching files.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{ok, steadfast};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Python with the given modules, or `None` (a failure in CI, where they are required).
fn python_with(modules: &str) -> Option<()> {
    common::python_with(modules).then_some(())
}

fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read_log(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Loads `original` and `altered` with `loader` (Python code defining `load(path) ->
/// dict of name to numpy array`) and checks, element by element in row-major order (as
/// `a.flat` numbers them), that the differing elements are exactly the logged ones with
/// exactly the logged bytes.
const COMPARE: &str = r#"
import json, sys
import numpy as np
def compare(load, original, altered, log_path):
    a, b = load(original), load(altered)
    log = json.load(open(log_path))
    logged = {(f["tensor"], f["element"]): f for f in log["flips"]}
    assert sorted(a) == sorted(b), "the tensors differ"
    seen = set()
    for name in a:
        x = np.ascontiguousarray(a[name]).reshape(-1)
        y = np.ascontiguousarray(b[name]).reshape(-1)
        assert x.dtype == y.dtype and x.shape == y.shape
        xb = x.view(np.uint8).reshape(x.size, -1)
        yb = y.view(np.uint8).reshape(y.size, -1)
        for i in np.nonzero((xb != yb).any(axis=1))[0]:
            f = logged.get((name, int(i)))
            assert f is not None, f"{name}[{i}] changed but is not in the log"
            assert xb[i].tobytes().hex() == f["old_bytes"], (name, i)
            assert yb[i].tobytes().hex() == f["new_bytes"], (name, i)
            got = xb[i] ^ yb[i]
            bits = [k for k in range(8 * got.size) if got[k // 8] >> (k % 8) & 1]
            assert bits == f["bits"], (name, i, bits, f["bits"])
            seen.add((name, int(i)))
    assert seen == set(logged), f"logged but unchanged: {set(logged) - seen}"
    print(f"ok {len(seen)}")
"#;

fn inject_and_compare(original: &Path, loader: &str, extra: &[&str]) {
    let dir = original.parent().unwrap();
    let altered = dir.join(format!("altered-{}", original.file_name().unwrap().to_string_lossy()));
    let log = dir.join("log.json");
    ok(steadfast(
        &[&["inject", s(original), "--out", s(&altered), "--log", s(&log), "--seed", "3"][..], extra].concat(),
    ));
    let n = read_log(&log)["flips"].as_array().unwrap().len();
    assert!(n > 0);
    let script = format!("{COMPARE}\n{loader}\ncompare(load, *sys.argv[1:])");
    let out = python(&script, &[s(original), s(&altered), s(&log)]);
    assert_eq!(out.trim(), format!("ok {n}"));

    // Undo restores the original bytes exactly; replay reproduces the alteration exactly.
    let again = dir.join(format!("again-{}", original.file_name().unwrap().to_string_lossy()));
    ok(steadfast(&["inject", s(original), "--replay", s(&log), "--out", s(&again), "--log", s(&dir.join("l2.json"))]));
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&altered).unwrap());
    ok(steadfast(&["inject", s(&altered), "--undo", s(&log)]));
    assert_eq!(std::fs::read(&altered).unwrap(), std::fs::read(original).unwrap());
    // Undoing twice is refused: the elements no longer hold the altered bytes.
    let twice = steadfast(&["inject", s(&altered), "--undo", s(&log)]);
    assert_eq!(twice.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&twice.stderr).contains("not the file the log was made on"));
    assert_eq!(std::fs::read(&altered).unwrap(), std::fs::read(original).unwrap(), "a refused undo changes nothing");
    for f in [altered, again] {
        std::fs::remove_file(f).unwrap();
    }
}

#[test]
fn safetensors_files_altered_load_in_python_with_exactly_the_logged_bits() {
    if python_with("safetensors.numpy, numpy").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("w.safetensors");
    python(
        r#"
import sys, numpy as np
from safetensors.numpy import save_file
r = np.random.default_rng(0)
save_file({"model.w": r.standard_normal((40, 30)).astype(np.float32),
           "model.h": r.standard_normal(64).astype(np.float16),
           "optim.model.w.exp_avg": r.standard_normal((40, 30)).astype(np.float64),
           "model.count": np.arange(10, dtype=np.int32)}, sys.argv[1])
"#,
        &[s(&file)],
    );
    let loader = "from safetensors.numpy import load_file\nload = load_file";
    inject_and_compare(&file, loader, &["--count", "40"]);
    inject_and_compare(&file, loader, &["--count", "10", "--bits", "exponent", "--burst", "3"]);
}

#[test]
fn npz_archives_altered_load_in_numpy_with_exactly_the_logged_bits() {
    if python_with("numpy").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("w.npz");
    python(
        r#"
import sys, numpy as np
r = np.random.default_rng(1)
np.savez(sys.argv[1], dense_kernel=r.standard_normal((16, 8)).astype(np.float32),
         dense_bias=r.standard_normal(8), half=r.standard_normal(9).astype(np.float16),
         optimizer_m=r.standard_normal(50).astype(np.float32), steps=np.arange(4, dtype=np.int64))
"#,
        &[s(&file)],
    );
    // np.load checks each member's CRC-32 while reading: the rewritten CRCs must be right.
    let loader = "def load(p):\n    with np.load(p) as z:\n        return {k: z[k] for k in z.files}";
    inject_and_compare(&file, loader, &["--count", "30"]);
    inject_and_compare(&file, loader, &["--role", "optim", "--rate", "0.01"]);
}

#[test]
fn hdf5_files_altered_load_in_h5py_with_exactly_the_logged_bits() {
    if python_with("h5py, numpy").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("w.h5");
    python(
        r#"
import sys, h5py, numpy as np
r = np.random.default_rng(2)
with h5py.File(sys.argv[1], "w") as f:
    g = f.create_group("model_weights/dense")
    g["kernel:0"] = r.standard_normal((20, 10)).astype(np.float32)
    g["bias:0"] = r.standard_normal(10).astype(np.float32)
    f["optimizer_weights/adam/iterations:0"] = np.array(7, dtype=np.int64)
    f["optimizer_weights/adam/m:0"] = r.standard_normal((20, 10))
    f.create_dataset("chunked", data=np.ones(100, np.float32), chunks=(10,), compression="gzip")
"#,
        &[s(&file)],
    );
    let listing = ok(steadfast(&["inject", s(&file), "--list"]));
    assert!(listing.contains("model_weights/dense/kernel:0"), "{listing}");
    assert!(listing.contains("chunked") && listing.contains("skipped"), "{listing}");
    let loader = r#"
import h5py
def load(p):
    out = {}
    with h5py.File(p, "r") as f:
        f.visititems(lambda n, d: out.__setitem__(n, d[()]) if isinstance(d, h5py.Dataset) else None)
    return out"#;
    inject_and_compare(&file, loader, &["--count", "25", "--target", "*weights/*"]);
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state.pt")
}

#[test]
fn pytorch_checkpoints_are_parsed_as_pytorch_itself_reported() {
    use sha2::Digest;
    let located = ckpt::foreign::locate(&fixture()).unwrap();
    assert_eq!(located.format, ckpt::foreign::Format::PyTorch);
    let expected: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture().with_extension("pt.json")).unwrap()).unwrap();
    assert_eq!(located.tensors.len(), expected.len());
    let bytes = std::fs::read(fixture()).unwrap();
    for (t, e) in located.tensors.iter().zip(&expected) {
        let dtype = match e["dtype"].as_str().unwrap() {
            "float32" => "F32",
            "float16" => "F16",
            "bfloat16" => "BF16",
            "float64" => "F64",
            "int64" => "I64",
            other => panic!("unexpected {other}"),
        };
        assert_eq!((t.name.as_str(), t.dtype.name()), (e["name"].as_str().unwrap(), dtype));
        assert_eq!(serde_json::json!(t.shape), e["shape"]);
        let data = &bytes[t.offset as usize..(t.offset + t.len) as usize];
        assert_eq!(format!("{:x}", sha2::Sha256::digest(data)), e["sha256"].as_str().unwrap(), "{}", t.name);
        let optimizer = t.name.starts_with("optimizer.");
        assert_eq!(t.role == ckpt::Role::Optim, optimizer, "{}", t.name);
    }
}

#[test]
fn pytorch_checkpoints_altered_keep_valid_crcs_and_change_only_the_logged_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let altered = tmp.path().join("alt.pt");
    let log = tmp.path().join("log.json");
    ok(steadfast(&["inject", s(&fixture()), "--out", s(&altered), "--log", s(&log), "--count", "15", "--seed", "9"]));
    let original = std::fs::read(fixture()).unwrap();
    let now = std::fs::read(&altered).unwrap();
    assert_eq!(original.len(), now.len());
    let log = read_log(&log);
    let mut allowed: Vec<std::ops::Range<usize>> = log["flips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let at = f["byte_offset"].as_u64().unwrap() as usize;
            at..at + f["old_bytes"].as_str().unwrap().len() / 2
        })
        .collect();
    // Each altered member's CRC-32, in its local header and the central directory.
    let members = ckpt::foreign::zip::members(&altered).unwrap();
    for m in &members {
        assert_eq!(ckpt::foreign::zip::crc_of(&altered, m).unwrap(), m.crc, "{} has a stale CRC", m.name);
        allowed.extend(m.crc_positions.iter().map(|&p| p as usize..p as usize + 4));
    }
    for (i, (a, b)) in original.iter().zip(&now).enumerate() {
        if a != b {
            assert!(allowed.iter().any(|r| r.contains(&i)), "byte {i} changed outside the logged elements");
        }
    }
    if python_with("zipfile").is_some() {
        let out = python("import sys, zipfile\nprint(zipfile.ZipFile(sys.argv[1]).testzip())", &[s(&altered)]);
        assert_eq!(out.trim(), "None", "Python's zipfile finds a bad CRC");
    }
}

#[test]
fn steadfast_checkpoints_verify_after_alteration_unless_checksums_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    ok(steadfast(&[
        "train",
        "--model",
        "mlp",
        "--data",
        "synthetic",
        "--steps",
        "2",
        "--batch",
        "16",
        "--eval-every",
        "0",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
        s(&root),
        "--out",
        s(&tmp.path().join("o")),
    ]));
    let step = root.join("step-00000002");
    let (rewritten, kept) = (tmp.path().join("rewritten"), tmp.path().join("kept"));
    let log = tmp.path().join("log.json");
    ok(steadfast(&["inject", s(&root), "--out", s(&rewritten), "--log", s(&log), "--count", "20", "--role", "optim"]));
    ok(steadfast(&[
        "inject",
        s(&root),
        "--out",
        s(&kept),
        "--log",
        s(&tmp.path().join("k.json")),
        "--count",
        "20",
        "--keep-checksums",
    ]));
    assert_eq!(steadfast(&["ckpt", "verify", s(&rewritten)]).status.code(), Some(0));
    let verify = steadfast(&["ckpt", "verify", s(&kept)]);
    assert_eq!(verify.status.code(), Some(1), "stale checksums must be caught");

    // Exactly the logged elements differ, all of them optimizer state.
    let a = ckpt::reader::open(&step).unwrap().load().unwrap();
    let b = ckpt::reader::open(&rewritten).unwrap().load().unwrap();
    let log_v = read_log(&log);
    let logged: std::collections::BTreeSet<(String, u64)> = log_v["flips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["tensor"].as_str().unwrap().to_owned(), f["element"].as_u64().unwrap()))
        .collect();
    let mut differ = std::collections::BTreeSet::new();
    for (x, y) in a.iter().zip(&b) {
        for (i, (p, q)) in x.bytes().chunks(4).zip(y.bytes().chunks(4)).enumerate() {
            if p != q {
                differ.insert((x.name.clone(), i as u64));
            }
        }
    }
    assert_eq!(differ, logged);
    assert!(logged.iter().all(|(n, _)| n.starts_with("optim.")));

    // Undo gives back the original checkpoint, manifest included, byte for byte.
    ok(steadfast(&["inject", s(&rewritten), "--undo", s(&log)]));
    for entry in std::fs::read_dir(&step).unwrap() {
        let entry = entry.unwrap();
        assert_eq!(std::fs::read(entry.path()).unwrap(), std::fs::read(rewritten.join(entry.file_name())).unwrap());
    }
}

#[test]
fn bad_input_is_refused_with_a_clear_error_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // A truncated PyTorch archive.
    let cut = tmp.path().join("cut.pt");
    let bytes = std::fs::read(fixture()).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = steadfast(&["inject", s(&cut), "--count", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cut.pt"));
    assert_eq!(std::fs::read(&cut).unwrap(), &bytes[..bytes.len() / 2]);
    // Not a checkpoint at all.
    let text = tmp.path().join("notes.txt");
    std::fs::write(&text, "hello, world").unwrap();
    let out = steadfast(&["inject", s(&text)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown format"));
    // Knobs that make no sense.
    for args in [&["--bits", "40", "--target", "model.half"][..], &["--bits", "exponent", "--target", "nothing*"]] {
        let copy = tmp.path().join("copy.pt");
        let out = steadfast(&[&["inject", s(&fixture()), "--out", s(&copy)][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!copy.exists(), "a refused injection leaves no copy behind");
    }
    let out = steadfast(&["inject", s(&fixture()), "--bits", "fraction"]);
    assert_eq!(out.status.code(), Some(2));
    // A log replayed on a different file is refused before any byte changes.
    let log = tmp.path().join("log.json");
    let alt = tmp.path().join("alt.pt");
    ok(steadfast(&["inject", s(&fixture()), "--out", s(&alt), "--log", s(&log), "--count", "3"]));
    let before = std::fs::read(&alt).unwrap();
    let out = steadfast(&["inject", s(&alt), "--replay", s(&log), "--log", s(&tmp.path().join("x.json"))]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read(&alt).unwrap(), before);
}

#[test]
fn fortran_ordered_npz_members_are_altered_at_their_row_major_elements() {
    if python_with("numpy").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("f.npz");
    python(
        r#"
import sys, numpy as np
r = np.random.default_rng(5)
kernel = np.asfortranarray(r.standard_normal((12, 7)).astype(np.float32))
assert kernel.flags.f_contiguous and not kernel.flags.c_contiguous
np.savez(sys.argv[1], kernel=kernel, cube=np.asfortranarray(np.arange(60, dtype=np.int16).reshape(3, 4, 5)),
         bias=r.standard_normal(7).astype(np.float32))
"#,
        &[s(&file)],
    );
    let listing = ok(steadfast(&["inject", s(&file), "--list"]));
    let line = |name: &str| listing.lines().find(|l| l.trim_start().starts_with(name)).unwrap().to_owned();
    assert!(line("kernel").ends_with("column-major") && line("cube").ends_with("column-major"), "{listing}");
    assert!(!line("bias").contains("column-major"), "{listing}");
    // COMPARE numbers elements row-major, as NumPy's `a.flat` does, whatever the storage.
    let loader = "def load(p):\n    with np.load(p) as z:\n        return {k: z[k] for k in z.files}";
    inject_and_compare(&file, loader, &["--count", "40"]);
    inject_and_compare(&file, loader, &["--target", "cube", "--count", "20", "--bits", "0-3"]);
}

/// A committed checkpoint of two tensors under `root`, one byte of `model.w` inverted
/// after its checksum was taken; returns the checkpoint directory.
fn corrupt_checkpoint(root: &Path) -> PathBuf {
    let w: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
    let m: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let tensors = [
        ckpt::TensorRef { name: "model.w", role: ckpt::Role::Model, shape: &[8, 8], data: &w },
        ckpt::TensorRef { name: "optim.model.w.exp_avg", role: ckpt::Role::Optim, shape: &[16], data: &m },
    ];
    let meta = ckpt::Meta { step: 3, world_size: 1, config_hash: format!("{:016x}", 9), ..ckpt::Meta::default() };
    let dir = ckpt::store::save(root, &meta, &tensors, &ckpt::SaveOptions::default()).unwrap().dir;
    let c = ckpt::reader::open(&dir).unwrap();
    let t = c.manifest.tensors.iter().find(|t| t.name == "model.w").unwrap();
    let shard = dir.join(&t.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[t.offset as usize + 5] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    dir
}

fn snapshot(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn a_checkpoint_that_already_fails_verification_is_refused_unless_allowed_and_never_laundered() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let dir = corrupt_checkpoint(&root);
    assert_eq!(steadfast(&["ckpt", "verify", s(&root)]).status.code(), Some(1));
    let before = snapshot(&dir);
    let (out, log) = (tmp.path().join("out"), tmp.path().join("log.json"));
    let args = ["inject", s(&root), "--out", s(&out), "--log", s(&log), "--target", "model.*", "--count", "3"];

    // Refused, with the tensor named and the way around it; nothing written anywhere.
    for extra in [&[][..], &["--keep-checksums"]] {
        let refused = steadfast(&[&args[..], extra].concat());
        assert_eq!(refused.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("model.w") && stderr.contains("already corrupt"), "{stderr}");
        assert!(stderr.contains("--allow-corrupt-input"), "{stderr}");
        assert!(!out.exists() && !log.exists(), "a refused injection writes nothing");
    }
    let in_place = steadfast(&["inject", s(&root), "--log", s(&log), "--count", "3", "--target", "model.*"]);
    assert_eq!(in_place.status.code(), Some(2));
    assert_eq!(snapshot(&dir), before, "the input is unchanged");

    // Allowed: it goes ahead, says so loudly, and the corruption still fails verification.
    let allowed = steadfast(&[&args[..], &["--allow-corrupt-input"]].concat());
    ok(allowed.clone());
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(stderr.contains("warning: the input was already corrupt") && stderr.contains("model.w"), "{stderr}");
    assert_eq!(read_log(&log)["corrupt_input"], serde_json::json!(["model.w"]));
    let verify = steadfast(&["ckpt", "verify", s(&out)]);
    assert_eq!(verify.status.code(), Some(1), "pre-existing corruption must not come out verifying");
    assert!(String::from_utf8_lossy(&verify.stdout).contains("model.w"));

    // Undo gives back the corrupt input exactly, its stale checksum included.
    ok(steadfast(&["inject", s(&out), "--undo", s(&log)]));
    assert_eq!(snapshot(&out), before);
}

/// `--out` is atomic: killed at each point of its work (the failpoints abort the process
/// as `kill -9` would), an injection leaves at `--out` nothing, or the whole altered copy
/// with its log; the next run cleans up the dead run's temporary and succeeds. Both forms:
/// a checkpoint directory and a single file.
#[test]
fn inject_out_killed_at_any_point_leaves_nothing_or_the_whole_copy_with_its_log() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let w: Vec<f32> = (0..4096).map(|i| i as f32 * 0.25).collect();
    let tensors = [ckpt::TensorRef { name: "model.w", role: ckpt::Role::Model, shape: &[64, 64], data: &w }];
    let meta = ckpt::Meta { step: 1, world_size: 1, config_hash: format!("{:016x}", 1), ..ckpt::Meta::default() };
    let dir = ckpt::store::save(&root, &meta, &tensors, &ckpt::SaveOptions::default()).unwrap().dir;
    let file = dir.join(&ckpt::reader::open(&dir).unwrap().manifest.files[0].file);
    for (input, name) in [(&root, "out-dir"), (&file, "out.safetensors")] {
        let (out, log) = (tmp.path().join(name), tmp.path().join(format!("{name}.inject.json")));
        let run = |failpoint: Option<&str>| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_steadfast"));
            cmd.args(["inject", s(input), "--out", s(&out), "--count", "5", "--seed", "3"]);
            if let Some(point) = failpoint {
                cmd.env("STEADFAST_FAILPOINTS", format!("{point}=abort"));
            }
            cmd.output().unwrap()
        };
        for point in ["inject_after_copy", "inject_before_log", "inject_before_commit"] {
            let killed = run(Some(point));
            assert!(!killed.status.success(), "{point}: the failpoint must kill the run");
            assert!(!out.exists(), "{point}: a killed run left {}", out.display());
            if point != "inject_before_commit" {
                assert!(!log.exists(), "{point}: a log without its copy");
            }
            let _ = std::fs::remove_file(&log);
        }
        // A temporary of each killed run was left beside --out; the next run removes them.
        ok(run(None));
        assert!(out.exists() && log.exists());
        let leftovers: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".partial-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert_eq!(read_log(&log)["target"], s(&out));
        // The copy holds the logged flips: undoing them gives back the input's bytes.
        ok(steadfast(&["inject", s(&out), "--undo", s(&log)]));
        if input.is_dir() {
            assert_eq!(snapshot(&ckpt::reader::resolve(&out).unwrap()), snapshot(&dir));
        } else {
            assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&file).unwrap());
        }
    }
}
