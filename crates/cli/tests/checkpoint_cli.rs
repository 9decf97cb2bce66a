//! Checkpoints end to end through the binary: kill -9 in the middle of training and
//! resume to the same fingerprint; the `ckpt` tools and their exit codes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

mod common;

use common::{fingerprint, steadfast};

const RUN: [&str; 12] = [
    "train",
    "--model",
    "mlp",
    "--data",
    "synthetic",
    "--steps",
    "600",
    "--batch",
    "64",
    "--micro-batch",
    "32",
    "--eval-every=0",
];

/// The step at which the interrupted run is killed: one that takes a checkpoint.
const STOP: u64 = 105;

fn latest_step(root: &Path) -> Option<u64> {
    let name = std::fs::read_to_string(root.join("LATEST")).ok()?;
    ckpt::store::parse_step_dir(name.trim())
}

/// Whether process `pid` is stopped by a signal (state `T` in `/proc/PID/stat`).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
}

/// Starts `args` (a run with a `hang` fault) and returns once it has stopped, with the
/// thread that drains its stderr.
fn start_hanging(args: &[&str]) -> (Child, std::thread::JoinHandle<()>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, said) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match said.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("fault injection: hang") => {
                // The run stops itself (SIGSTOP) just after it says so; until it has, its
                // checkpoint writer may still be renaming files.
                while !stopped(child.id()) {
                    assert!(Instant::now() < deadline, "the run said it hangs but never stopped");
                    std::thread::sleep(Duration::from_millis(5));
                }
                return (child, reader);
            }
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => {
                panic!("training ended before it could be killed: {:?}", child.wait())
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("training did not reach its hang in time")
            }
        }
    }
}

#[test]
fn kill_dash_nine_mid_training_then_resume_gives_the_uninterrupted_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let uninterrupted = fingerprint(&steadfast(&[&RUN[..], &["--out", &out("a")]].concat()));

    let root = out("ckpt");
    let ck = ["--checkpoint-every", "7", "--checkpoint-dir", &root, "--keep-last", "2"];
    // The run stops itself as step STOP starts, just after handing that step's checkpoint
    // to its background writer, and says so on stderr. The kill follows that line, so it
    // lands there however fast this machine trains: perhaps in the middle of that save.
    let (mut child, reader) = start_hanging(
        &[&RUN[..], &ck[..], &["--out", &out("b"), "--fault", &format!("hang:rank=0,step={STOP}")]].concat(),
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    let killed_at = latest_step(Path::new(&root)).unwrap();
    assert!(killed_at < 600, "the run finished before the kill");
    // The checkpoint before STOP was durable before STOP's was begun.
    assert!((STOP - 7..=STOP).contains(&killed_at), "LATEST is step {killed_at}");

    // `auto` resumes as `latest` does when there is a checkpoint.
    let resumed = steadfast(&[&RUN[..], &ck[..], &["--resume", "auto", "--out", &out("b")]].concat());
    let stdout = String::from_utf8_lossy(&resumed.stdout).into_owned();
    assert!(stdout.contains("resumed from: step"), "{stdout}");
    assert_eq!(fingerprint(&resumed), uninterrupted);
}

#[test]
fn resume_auto_starts_from_step_zero_without_a_checkpoint_and_latest_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let job = [common::SMALL_MLP, &["--steps", "20"]].concat();
    let plain = fingerprint(&steadfast(&[&job[..], &["--out", &out("a")]].concat()));
    let root = out("ckpt");
    let ck = ["--checkpoint-every", "10", "--checkpoint-dir", &root];
    // A root that does not exist yet, as on a scheduler's first start.
    let first = steadfast(&[&job[..], &ck[..], &["--resume", "auto", "--out", &out("b")]].concat());
    assert!(!String::from_utf8_lossy(&first.stdout).contains("resumed from"));
    assert_eq!(fingerprint(&first), plain);
    assert_eq!(latest_step(Path::new(&root)), Some(20));
    // `latest` on an empty root is an error, not a fresh start.
    let empty = out("empty");
    std::fs::create_dir(&empty).unwrap();
    let refused =
        steadfast(&[&job[..], &["--checkpoint-dir", &empty, "--resume", "latest", "--out", &out("c")]].concat());
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no committed checkpoint"));
    // The kernel set is part of the configuration: the framework's kernels do not go on
    // from a state that the fixed-order ones computed.
    let other =
        steadfast(&[&job[..], &ck[..], &["--resume", "latest", "--kernels", "framework", "--out", &out("d")]].concat());
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("written by a different configuration") && err.contains("kernel set"), "{err}");
}

/// Two runs on one checkpoint root: the second is refused before it writes anything,
/// naming the first's pid, and the first's checkpoints stay whole. When the first dies
/// (kill -9), the kernel releases its lock and a resume takes the directory over.
#[test]
fn a_second_run_on_a_checkpoint_directory_in_use_is_refused_and_destroys_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let job = [common::SMALL_MLP, &["--steps", "40"]].concat();
    let root = out("ckpt");
    let ck = ["--checkpoint-every", "5", "--checkpoint-dir", &root, "--keep-last", "2"];
    let (mut first, reader) = start_hanging(
        &[&job[..], &ck[..], &["--seed", "0", "--out", &out("a"), "--fault", "hang:rank=0,step=13"]].concat(),
    );
    let before = ckpt::store::list(Path::new(&root)).unwrap();
    let listing = |dir: &Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let files_before = listing(Path::new(&root));
    for seed in ["0", "1"] {
        let second = steadfast(&[&job[..], &ck[..], &["--seed", seed, "--out", &out("b")]].concat());
        assert_eq!(second.status.code(), Some(2), "the second run must be refused");
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(err.contains(&format!("in use by pid {}", first.id())), "{err}");
        assert_eq!(ckpt::store::list(Path::new(&root)).unwrap(), before, "the second run touched the checkpoints");
        assert_eq!(listing(Path::new(&root)), files_before);
    }
    first.kill().unwrap();
    first.wait().unwrap();
    reader.join().unwrap();
    let resumed = steadfast(&[&job[..], &ck[..], &["--seed", "0", "--resume", "latest", "--out", &out("a")]].concat());
    let plain = steadfast(&[&job[..], &["--seed", "0", "--out", &out("c")]].concat());
    assert_eq!(fingerprint(&resumed), fingerprint(&plain));
}

#[test]
fn deferred_checkpoints_skip_a_busy_writer_and_each_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let job = [common::SMALL_MLP, &["--steps", "12"]].concat();
    let plain = fingerprint(&steadfast(&[&job[..], &["--out", &out("a")]].concat()));

    // A checkpoint is due after every step, but each persist takes 400 ms (a slow disk).
    // Step 6, which retention keeps for good, is never put off.
    let root = out("ckpt");
    let deferred = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(
            [&job[..], &["--checkpoint-every", "1", "--checkpoint-dir", &root, "--checkpoint-when-busy", "defer"]]
                .concat(),
        )
        .args(["--keep-every", "6", "--out", &out("b")])
        .env("STEADFAST_FAILPOINTS", "after_shard_write=sleep:400")
        .output()
        .unwrap();
    assert_eq!(fingerprint(&deferred), plain, "checkpoints never change the trajectory");
    let s = common::summary(Path::new(&out("b")));
    let (taken, put_off) = (s["checkpoint_snapshots"].as_u64().unwrap(), s["checkpoints_deferred"].as_u64().unwrap());
    assert!((3..12).contains(&taken) && put_off >= 1, "{taken} taken, {put_off} put off");
    // Only steps 6 and 12 wait for a persist (waiting for every one would be 11 x 400 ms).
    let stall = s["checkpoint_stall_seconds"].as_f64().unwrap();
    assert!(stall < 2.0, "stalled {stall} s");
    let steps: Vec<u64> = ckpt::store::list(Path::new(&root)).unwrap().into_iter().map(|(step, _)| step).collect();
    assert_eq!(steps.len() as u64, taken);
    assert_eq!((steps.first(), steps.last()), (Some(&1), Some(&12)), "the first due and the last step: {steps:?}");
    assert!(steps.contains(&6), "{steps:?}");

    // Every checkpoint, taken at whatever step the writer was free, resumes to the same bits.
    for (i, step) in steps.iter().enumerate().filter(|(_, s)| **s < 12) {
        let dir = Path::new(&root).join(format!("step-{step:08}"));
        let resumed =
            steadfast(&[&job[..], &["--resume", dir.to_str().unwrap(), "--out", &out(&format!("r{i}"))]].concat());
        assert_eq!(fingerprint(&resumed), plain, "resumed from step {step}");
    }
}

#[test]
fn ckpt_tools_list_inspect_verify_diff_and_export() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let r = root.to_str().unwrap();
    let o = tmp.path().join("o");
    let run = ["train", "--data", "synthetic", "--steps", "6", "--batch", "32", "--checkpoint-every", "3"];
    fingerprint(&steadfast(&[&run[..], &["--checkpoint-dir", r, "--out", o.to_str().unwrap()]].concat()));

    let ls = steadfast(&["ckpt", "ls", r, "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[1]["latest"], true);

    let inspect = steadfast(&["ckpt", "inspect", r, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["manifest"]["meta"]["step"], 6);
    let kernels = v["manifest"]["meta"]["kernels"].as_str().unwrap();
    assert!(["fixed/scalar", "fixed/avx2", "fixed/avx512"].contains(&kernels), "{kernels}");
    assert_eq!(v["manifest"]["tensors"][0]["name"], "model.fc1.weight");
    let text = String::from_utf8_lossy(&steadfast(&["ckpt", "inspect", r]).stdout).into_owned();
    assert!(text.contains("optim.model.fc3.bias.exp_avg_sq") && text.contains("model: 6 tensors"), "{text}");
    assert!(text.contains(&format!("kernels:     {kernels}")), "{text}");

    let step3 = root.join("step-00000003");
    let s3 = step3.to_str().unwrap();
    assert_eq!(steadfast(&["ckpt", "verify", s3]).status.code(), Some(0));
    let diff = steadfast(&["ckpt", "diff", s3, r, "--json"]);
    assert_eq!(diff.status.code(), Some(1));
    let d: serde_json::Value = serde_json::from_slice(&diff.stdout).unwrap();
    assert_eq!(d["identical"], false);
    assert_eq!(d["tensors"][0]["status"], "differs");
    assert_eq!(steadfast(&["ckpt", "diff", s3, s3]).status.code(), Some(0));

    let exported = tmp.path().join("all.safetensors");
    let e = steadfast(&["ckpt", "export", r, "--to", exported.to_str().unwrap()]);
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    assert!(std::fs::metadata(&exported).unwrap().len() > 235_146 * 4 * 3);

    // Corrupt one tensor: verify names it and exits 1.
    let m = ckpt::reader::open(&step3).unwrap().manifest;
    let t = &m.tensors[3];
    let shard = step3.join(&t.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[t.offset as usize] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let v = steadfast(&["ckpt", "verify", s3]);
    assert_eq!(v.status.code(), Some(1));
    let text = String::from_utf8_lossy(&v.stdout).into_owned();
    assert!(text.contains(&format!("tensor {}", t.name)), "{text}");
    // Not a checkpoint at all: an error, exit 2.
    assert_eq!(steadfast(&["ckpt", "inspect", tmp.path().to_str().unwrap()]).status.code(), Some(2));
}

/// The shards are plain safetensors files that the reference Python library opens
/// unchanged (skipped when it is not installed, unless CI demands it).
#[test]
fn shards_open_in_python_safetensors() {
    if !common::python_with("safetensors.numpy, numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ckpt");
    let run =
        ["train", "--model", "cnn", "--data", "synthetic", "--steps", "2", "--batch", "16", "--checkpoint-every", "2"];
    let o = tmp.path().join("o");
    fingerprint(&steadfast(
        &[&run[..], &["--checkpoint-dir", root.to_str().unwrap(), "--out", o.to_str().unwrap()]].concat(),
    ));
    let dir = ckpt::reader::resolve(&root).unwrap();
    let c = ckpt::reader::open(&dir).unwrap();
    let loaded = c.load().unwrap();
    let script = r#"
import sys, json, hashlib
from safetensors.numpy import load_file
out = {}
for path in sys.argv[1:]:
    for name, array in load_file(path).items():
        out[name] = [str(array.dtype), list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()]
print(json.dumps(out))
"#;
    let shards: Vec<String> =
        c.manifest.files.iter().map(|f| dir.join(&f.file).to_string_lossy().into_owned()).collect();
    let py = Command::new("python3").arg("-c").arg(script).args(&shards).output().unwrap();
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&py.stdout).unwrap();
    assert_eq!(seen.as_object().unwrap().len(), loaded.len());
    for t in &loaded {
        let row = &seen[&t.name];
        assert_eq!(row[0], "float32", "{}", t.name);
        assert_eq!(row[1], serde_json::json!(t.shape), "{}", t.name);
        let sha = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        use std::io::Write;
        let mut sha = sha;
        sha.stdin.take().unwrap().write_all(t.bytes()).unwrap();
        let digest = String::from_utf8(sha.wait_with_output().unwrap().stdout).unwrap();
        assert_eq!(row[2].as_str().unwrap(), digest.split_whitespace().next().unwrap(), "{}", t.name);
    }
}

/// Changes the step recorded in a checkpoint's manifest (as a user editing it would).
fn edit_manifest_step(dir: &Path, to: u64) {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.find("\"step\":").expect("a step field") + "\"step\":".len();
    let digits = text[at..].trim_start().chars().take_while(char::is_ascii_digit).count();
    let start = at + (text[at..].len() - text[at..].trim_start().len());
    std::fs::write(&path, format!("{}{to}{}", &text[..start], &text[start + digits..])).unwrap();
}

/// A damaged newest checkpoint or a bad `LATEST` is never passed over in silence:
/// `ckpt verify` of the root names it and fails, while `--resume latest` and `ckpt export`
/// say which checkpoint they skipped and why (the resume in `metrics.jsonl` too).
#[test]
fn a_corrupt_manifest_or_a_bad_latest_is_named_by_verify_resume_and_export() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let root = out("ckpt");
    let job = |steps: &'static str| {
        [common::SMALL_MLP, &["--steps", steps, "--checkpoint-every", "10", "--checkpoint-dir", &root]].concat()
    };
    common::ok(steadfast(&[&job("20")[..], &["--out", &out("a")]].concat()));
    let newest = Path::new(&root).join("step-00000020");
    assert_eq!(steadfast(&["ckpt", "verify", &root]).status.code(), Some(0));
    edit_manifest_step(&newest, 15);

    let verify = steadfast(&["ckpt", "verify", &root]);
    let text = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(1), "{text}");
    assert!(text.contains("CORRUPT") && text.contains("step-00000020"), "{text}");
    assert!(text.contains("OK") && text.contains("step-00000010"), "{text}");
    assert!(text.contains("1 corrupt"), "{text}");

    let exported = out("export.safetensors");
    let export = steadfast(&["ckpt", "export", &root, "--to", &exported]);
    assert!(export.status.success());
    let err = String::from_utf8_lossy(&export.stderr);
    assert!(err.contains("skipped") && err.contains("step-00000020"), "{err}");

    let resumed = steadfast(&[&job("30")[..], &["--resume", "latest", "--out", &out("b")]].concat());
    let stdout = common::ok(resumed.clone());
    assert!(stdout.contains("resumed from: step 10"), "{stdout}");
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(err.contains("step-00000020"), "the fallback must be said on the terminal: {err}");
    let metrics = std::fs::read_to_string(Path::new(&out("b")).join("metrics.jsonl")).unwrap();
    let fallback = metrics.lines().find(|l| l.contains("\"resume_fallback\"")).expect("a resume_fallback event");
    assert!(fallback.contains("step-00000020"), "{fallback}");

    // A LATEST that holds garbage, then one naming a checkpoint that is not there.
    for (latest, needle) in [("nonsense\n", "not the name of a checkpoint"), ("step-00000099\n", "does not exist")] {
        std::fs::write(Path::new(&root).join("LATEST"), latest).unwrap();
        let verify = steadfast(&["ckpt", "verify", &root]);
        let text = String::from_utf8_lossy(&verify.stdout).into_owned();
        assert_eq!(verify.status.code(), Some(1), "{text}");
        assert!(text.contains("LATEST") && text.contains(needle), "{text}");
        let export = steadfast(&["ckpt", "export", &root, "--to", &exported]);
        assert!(String::from_utf8_lossy(&export.stderr).contains(needle));
    }

    // A path that does not exist is an error, not a corrupt checkpoint.
    let missing = steadfast(&["ckpt", "verify", &out("nonexistent")]);
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no such file or directory") && !err.contains("CORRUPT"), "{err}");
}

/// A resume from the last step trains nothing and says so (no `final loss: NaN`).
#[test]
fn a_resume_with_no_step_left_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let root = out("ckpt");
    let job = [common::SMALL_MLP, &["--steps", "10", "--checkpoint-every", "10", "--checkpoint-dir", &root]].concat();
    let first = fingerprint(&steadfast(&[&job[..], &["--out", &out("a")]].concat()));
    let again = steadfast(&[&job[..], &["--resume", "latest", "--out", &out("b")]].concat());
    let stdout = common::ok(again.clone());
    assert!(!stdout.contains("NaN"), "{stdout}");
    assert!(stdout.contains("no step left to train"), "{stdout}");
    assert_eq!(fingerprint(&again), first);
}

/// A pipeline job's checkpoint root holds one root per stage (`stage-S-of-N`): `ckpt
/// verify` checks each and says which step a resume goes to, `ckpt ls` lists each, and
/// `inspect` and `export` of the job's root name the stage directories to pick from.
#[test]
fn ckpt_tools_understand_a_pipeline_job_s_stage_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, o) = (tmp.path().join("ck"), tmp.path().join("o"));
    let (r, out) = (root.to_str().unwrap(), o.to_str().unwrap());
    let job = ["launch", "--nproc", "2", "--", "train", "--data", "synthetic", "--steps", "4", "--batch", "16"];
    let pipe = ["--micro-batch", "4", "--eval-every", "0", "--pipeline-stages", "2", "--checkpoint-every", "2"];
    common::ok(steadfast(&[&job[..], &pipe, &["--checkpoint-dir", r, "--out", out]].concat()));
    let stage = |s: usize| root.join(format!("stage-{s}-of-2"));

    let verify = steadfast(&["ckpt", "verify", r]);
    let text = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&verify.stderr));
    for s in 0..2 {
        let said = format!("2 checkpoint(s) in {} (stage {s} of 2): 2 valid", stage(s).display());
        assert!(text.contains(&said), "{text}");
    }
    assert!(text.contains("every stage has a valid checkpoint of step 4"), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&steadfast(&["ckpt", "verify", r, "--json"]).stdout).unwrap();
    assert!(v["ok"] == true && v["common_step"] == 4, "{v}");
    assert_eq!(v["stages"].as_array().unwrap().len(), 2, "{v}");

    let ls = steadfast(&["ckpt", "ls", r]);
    let text = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(ls.status.success() && text.contains(&format!("{}:", stage(1).display())), "{text}");
    assert_eq!(text.matches("step-00000004").count(), 2, "{text}");
    let rows: serde_json::Value = serde_json::from_slice(&steadfast(&["ckpt", "ls", r, "--json"]).stdout).unwrap();
    assert!(rows[1]["stage"] == 1 && rows[1]["checkpoints"].as_array().unwrap().len() == 2, "{rows}");

    // The job's root is no checkpoint: inspect and export name the stages to pick from, and
    // take one stage's root.
    let to = tmp.path().join("stage.safetensors");
    let to = to.to_str().unwrap();
    for args in [&["ckpt", "inspect", r][..], &["ckpt", "export", r, "--to", to]] {
        let o = steadfast(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&stage(0).display().to_string()) && err.contains("stage-1-of-2"), "{args:?}: {err}");
    }
    let one = stage(1).display().to_string();
    common::ok(steadfast(&["ckpt", "inspect", &one]));
    common::ok(steadfast(&["ckpt", "export", &one, "--to", to]));

    // A tensor of stage 1's step 4 rots: verify names it, exits 1, and a resume would go
    // back to step 2.
    let step4 = stage(1).join("step-00000004");
    let t = ckpt::reader::open(&step4).unwrap().manifest.tensors[0].clone();
    let shard = step4.join(&t.file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[t.offset as usize] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let verify = steadfast(&["ckpt", "verify", r]);
    let text = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("CORRUPT {}", step4.display())) && text.contains(&t.name), "{text}");
    assert!(text.contains("every stage has a valid checkpoint of step 2"), "{text}");

    // A stage without its directory is said too.
    std::fs::remove_dir_all(stage(0)).unwrap();
    let verify = steadfast(&["ckpt", "verify", r]);
    let text = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(1), "{text}");
    assert!(text.contains("stage-0-of-2 is missing"), "{text}");
}
