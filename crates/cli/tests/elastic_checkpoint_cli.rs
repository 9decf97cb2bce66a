//! Checkpoints in an elastic job: live replicas recover a partial loss, checkpoints a total
//! one. Every process of a running elastic job (its launcher and all its workers) is
//! killed with SIGKILL at a step drawn at random; every checkpoint left verifies, and the
//! job started again with `--resume latest` on another number of workers ends with the
//! bits of the run that never stopped.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{SMALL_MLP, children, fingerprint, fingerprints_in, steadfast, steps_recorded};

const STEPS: u64 = 400;

/// The training command of each run here, checkpointing every 20 steps into `ckpt`.
fn train_args(out: &Path, ckpt: &Path) -> Vec<String> {
    let (steps, out, ckpt) = (STEPS.to_string(), out.to_str().unwrap(), ckpt.to_str().unwrap());
    let extra = ["--reduce", "reproducible", "--steps", &steps, "--out", out, "--checkpoint-dir", ckpt];
    [SMALL_MLP, &extra, &["--checkpoint-every", "20", "--keep-last", "3"]]
        .concat()
        .into_iter()
        .map(String::from)
        .collect()
}

fn launch_args(nproc: usize, out: &Path, ckpt: &Path, extra: &[&str]) -> Vec<String> {
    let nproc = nproc.to_string();
    let mut args: Vec<String> =
        ["launch", "--nproc", &nproc, "--max-restarts", "1", "--heartbeat-timeout", "1"].map(String::from).to_vec();
    args.push("--".into());
    args.extend(train_args(out, ckpt));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// A step between 60 and 339 drawn from the clock: the kill lands anywhere in the run.
fn random_step() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    60 + (nanos.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 280
}

#[test]
fn an_elastic_job_killed_whole_resumes_from_its_checkpoint_on_another_worker_count_with_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("out"));
    let reference = {
        let args = train_args(&tmp.path().join("ref"), &tmp.path().join("ref-ckpt"));
        fingerprint(&steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };

    // Three workers, all killed with their launcher at a random step.
    let kill_at = random_step();
    let args = launch_args(3, &out, &ckpt, &[]);
    let mut job = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_recorded(&out).last().copied().unwrap_or(0) < kill_at {
        assert!(job.try_wait().unwrap().is_none(), "the job ended before step {kill_at}");
        assert!(Instant::now() < deadline, "the job did not reach step {kill_at}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let workers = children(job.id());
    assert_eq!(workers.len(), 3, "the launcher's workers: {workers:?}");
    let _ = Command::new("kill").arg("-9").arg(job.id().to_string()).args(workers.iter().map(u32::to_string)).status();
    job.wait().unwrap();
    let killed_at = steps_recorded(&out).last().copied().unwrap();
    assert!(killed_at < STEPS, "the job finished before it was killed");

    // Every checkpoint left verifies; there is one, from before the kill.
    let verify = steadfast(&["ckpt", "verify", ckpt.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "killed at step {killed_at}: {text}");
    let listed = steadfast(&["ckpt", "ls", "--json", ckpt.to_str().unwrap()]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let newest = rows.iter().filter_map(|r| r["step"].as_u64()).max().expect("a checkpoint before the kill");
    assert!(newest <= killed_at && newest + 40 >= killed_at.min(STEPS), "newest {newest}, killed at {killed_at}");

    // Two workers go on from it and end with the bits of the run that never stopped.
    let args = launch_args(2, &out, &ckpt, &["--resume", "latest"]);
    let run = steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(fingerprints_in(&stdout), vec![reference.clone(); 2], "killed at {killed_at}, resumed at {newest}");
    assert!(stdout.contains(&format!("resumed from: step {newest}")), "{stdout}");
    // The job's own checkpoints went on: the final step's is the newest, and verifies.
    let verify = steadfast(&["ckpt", "verify", ckpt.to_str().unwrap()]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    let listed = steadfast(&["ckpt", "ls", "--json", ckpt.to_str().unwrap()]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.iter().filter_map(|r| r["step"].as_u64()).max(), Some(STEPS));
}

/// `args` with 60 steps instead of [`STEPS`].
fn sixty_steps(mut args: Vec<String>) -> Vec<String> {
    let i = args.iter().position(|a| a == "--steps").unwrap();
    args[i + 1] = "60".into();
    args
}

/// A worker that fails as the job ends (here: the commit of the final step's checkpoint
/// fails) fails the job, although its peers finished: the launcher does not call a job
/// whose last checkpoint is missing a success. (A worker killed from outside after the
/// final state is a loss instead, which `scripts/chaos.sh`'s kills test.)
#[test]
fn a_worker_that_fails_its_last_checkpoint_fails_the_finished_job() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("out"));
    let mut args = sixty_steps(launch_args(2, &out, &ckpt, &[]));
    let every = args.iter().position(|a| a == "--checkpoint-every").unwrap();
    args[every + 1] = "1000".into(); // the final step's checkpoint only
    let run = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(&args)
        .env("STEADFAST_FAILPOINTS", "before_latest=error")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(!run.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("failpoint before_latest fired"), "{stderr}");
    assert!(!stdout.contains("the job finished in"), "{stdout}");
}

/// A checkpoint root whose committer's lock another run holds (a plain `train`, here this
/// test process): the elastic job is refused before its first step, names the holder, and
/// writes nothing there.
#[test]
fn an_elastic_job_is_refused_where_another_run_holds_the_roots_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("out"));
    std::fs::create_dir_all(&ckpt).unwrap();
    // This test process holds the lock of the writer that commits (part 0).
    let mut lock = std::fs::File::create(ckpt.join(".writer-0000.lock")).unwrap();
    lock.try_lock().unwrap();
    std::io::Write::write_all(&mut lock, b"pid 4242 on host elsewhere\n").unwrap();
    let args = sixty_steps(launch_args(2, &out, &ckpt, &[]));
    let started = Instant::now();
    let run = steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(!run.status.success(), "{stdout}\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "refused at once, not after {:?}", started.elapsed());
    assert!(stderr.contains("in use by pid 4242 on host elsewhere"), "{stderr}");
    assert!(fingerprints_in(&stdout).is_empty(), "{stdout}");
    let names: Vec<String> =
        std::fs::read_dir(&ckpt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, [".writer-0000.lock"], "{names:?}");
    drop(lock);
}

/// Two elastic jobs on one checkpoint directory: the second, started while the first
/// trains (another seed, so another configuration), is refused at once; the first ends
/// with its own bits, every checkpoint under the root is its own, and it resumes from them.
#[test]
fn a_second_elastic_job_on_one_directory_is_refused_and_replaces_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let (out_a, out_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args_a = launch_args(2, &out_a, &ckpt, &[]);
    let mut a = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(&args_a)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_recorded(&out_a).last().copied().unwrap_or(0) < 30 {
        assert!(a.try_wait().unwrap().is_none(), "job A ended early");
        assert!(Instant::now() < deadline, "job A did not reach step 30");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Job B: the same command but for its seed and output.
    let args_b = launch_args(2, &out_b, &ckpt, &["--seed", "22"]);
    let started = Instant::now();
    let b = steadfast(&args_b.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr_b = String::from_utf8_lossy(&b.stderr);
    assert!(!b.status.success(), "job B ran beside job A: {stderr_b}");
    assert!(started.elapsed() < Duration::from_secs(30), "B refused at once, not after {:?}", started.elapsed());
    assert!(stderr_b.contains("in use by") || stderr_b.contains("another configuration"), "B says why: {stderr_b}");
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success());
    let reference = {
        let args = train_args(&tmp.path().join("ref"), &tmp.path().join("ref-ckpt"));
        fingerprint(&steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    assert_eq!(fingerprints_in(&String::from_utf8_lossy(&a.stdout)), vec![reference.clone(); 2]);
    // Every checkpoint is A's: one configuration in the root, and A's resume takes it.
    let hashes: std::collections::BTreeSet<String> =
        ckpt::store::list(&ckpt).unwrap().iter().map(|(_, d)| ckpt::store::configuration_of(d).unwrap()).collect();
    assert_eq!(hashes.len(), 1, "{hashes:?}");
    let verify = steadfast(&["ckpt", "verify", ckpt.to_str().unwrap()]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    let mut resume = train_args(&tmp.path().join("a2"), &ckpt);
    resume.extend(["--resume".into(), "latest".into()]);
    let again = steadfast(&resume.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(fingerprint(&again), reference);
}

/// The members write each checkpoint in parts, one each, and a member lost between a
/// checkpoint's snapshot and its commit (worker 2 crashes in the step after a snapshot)
/// leaves that checkpoint uncommitted, never wrong: every checkpoint left verifies, the
/// newest holds the parts of three writers, no temporary is left, and the job, its worker
/// replaced, ends with the bits of the run that never failed.
#[test]
fn an_elastic_job_writes_its_checkpoints_in_parts_and_a_member_lost_mid_checkpoint_spoils_none() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("out"));
    let reference = {
        let args = train_args(&tmp.path().join("ref"), &tmp.path().join("ref-ckpt"));
        fingerprint(&steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    let args = launch_args(3, &out, &ckpt, &["--fault", "crash:rank=2,step=41,phase=vote"]);
    let run = steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("replacing worker 2"), "{stdout}");
    assert_eq!(fingerprints_in(&stdout), vec![reference; 3]);
    let verify = steadfast(&["ckpt", "verify", ckpt.to_str().unwrap()]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    let mut names: Vec<String> =
        std::fs::read_dir(&ckpt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert!(names.iter().all(|n| !n.starts_with(".tmp-")), "no temporary is left: {names:?}");
    // The last checkpoint: a shard from each of the three members.
    let last = ckpt.join(format!("step-{STEPS:08}"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(last.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().map_or(0, Vec::len);
    assert!(files >= 3, "the parts of three writers: {manifest}");
}
