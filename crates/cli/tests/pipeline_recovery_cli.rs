//! Pipeline jobs that lose a stage worker under `launch --recovery replay` (the elastic job
//! of every pipeline, with its boundaries logged and its checkpoints kept for the user):
//! a stage lost in every replica is rebuilt from its checkpoint by replaying its
//! neighbours' boundary logs (alone, with helpers, or with the stages an unreadable log
//! joins it to), a stage with a live replica is fetched from it, and the job ends with the
//! bits of a run that never failed. The faults strike at steps and phases drawn from a
//! seed that the test prints (`STEADFAST_PIPELINE_SEED` replays one).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const PHASES: [&str; 5] = ["forward", "backward", "allreduce", "vote", "update"];

/// A small deterministic generator for the faults' places.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn seed() -> u64 {
    let seed = std::env::var("STEADFAST_PIPELINE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos().into()
    });
    eprintln!("STEADFAST_PIPELINE_SEED={seed}");
    seed
}

fn train_args(model: &str, steps: u64, out: &Path) -> Vec<String> {
    let (batch, micro) = if model == "gpt" { ("8", "2") } else { ("32", "8") };
    let words = ["train", "--model", model, "--data", "synthetic", "--reduce", "reproducible", "--eval-every", "0"];
    let mut v: Vec<String> = words.iter().map(|s| s.to_string()).collect();
    v.extend([
        "--steps".into(),
        steps.to_string(),
        "--batch".into(),
        batch.into(),
        "--micro-batch".into(),
        micro.into(),
    ]);
    v.extend(["--out".into(), out.display().to_string()]);
    v
}

fn run(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_steadfast")).args(args).output().unwrap()
}

/// The fingerprint of the single process.
fn reference(model: &str, steps: u64, dir: &Path) -> String {
    let out = run(&train_args(model, steps, &dir.join("reference")));
    common::fingerprints_in(&String::from_utf8_lossy(&out.stdout)).remove(0)
}

/// The launcher's arguments for a pipeline job of `nproc` ranks and `stages` stages that
/// recovers by replay with `helpers` helpers.
fn replay_job(model: &str, (nproc, stages, helpers): (usize, usize, usize), steps: u64, dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = ["launch", "--max-restarts", "1", "--recovery", "replay", "--save-every", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(["--nproc".into(), nproc.to_string(), "--replay-helpers".into(), helpers.to_string()]);
    v.extend(["--save-dir".into(), dir.join("ck").display().to_string(), "--".into()]);
    v.extend(train_args(model, steps, &dir.join("out")));
    v.extend(["--pipeline-stages".into(), stages.to_string()]);
    v
}

/// A job of `model` for `steps` steps in `dir`, of (ranks, stages, helpers) `shape`, with
/// `fault` and `extra` train flags: checks that it ends with `reference`; returns how its
/// epochs were formed and a description of the case.
fn crash(
    (model, reference): (&str, &str),
    shape: (usize, usize, usize),
    steps: u64,
    dir: &Path,
    (fault, extra): (&str, &[&str]),
) -> (String, String) {
    let mut args = replay_job(model, shape, steps, dir);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--fault".into(), fault.to_owned()]);
    let context = format!("{model}, (ranks, stages, helpers) {shape:?}, {fault}");
    recovered(&args, reference, dir, &context)
}

/// Runs `args` and checks that every rank ends with `reference`; returns how the epochs
/// after the loss were formed (the coordinator's lines) and the output, for context.
fn recovered(args: &[String], reference: &str, dir: &Path, context: &str) -> (String, String) {
    let out = run(args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let context = format!("{context}\n{stdout}\n{stderr}");
    assert!(out.status.success(), "{context}");
    assert!(stdout.contains("with 1 replacement(s)"), "{context}");
    let fps = common::fingerprints_in(&stdout);
    assert!(!fps.is_empty() && fps.iter().all(|f| f == reference), "expected {reference}: {context}");
    let metrics = std::fs::read_to_string(dir.join("out").join("metrics.jsonl")).unwrap();
    // Whoever holds the loss after the failure appends to the lines of the steps before it.
    let trained = |step: u64| {
        metrics.lines().any(|l| l.contains("\"kind\":\"train\"") && l.contains(&format!("\"step\":{step},")))
    };
    assert!(trained(1), "the first step's line is lost: {context}\n{metrics}");
    let epochs: Vec<&str> =
        stdout.lines().filter(|l| l.starts_with("[coordinator]") && l.contains(" epoch ")).collect();
    (epochs.join("\n"), context)
}

#[test]
fn a_stage_worker_lost_at_a_random_step_is_replayed_to_the_same_bits_by_one_or_more_helpers() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 12;
    let reference = reference("mlp", steps, tmp.path());
    for (case, (stages, helpers)) in [(3, 1), (3, 2), (2, 2), (3, 3)].into_iter().enumerate() {
        let dir = tmp.path().join(format!("case{case}"));
        let (rank, step, phase) = (d.below(stages as u64), 2 + d.below(steps - 3), PHASES[d.below(5) as usize]);
        let fault = format!("crash:rank={rank},step={step},phase={phase}");
        let (epochs, context) = crash(("mlp", &reference), (stages, stages, helpers), steps, &dir, (&fault, &[]));
        let replays =
            format!("stage {rank}'s state was lost: its workers [{rank}] replay it from its checkpoint of step");
        assert!(epochs.contains(&replays), "{context}");
        // Helpers are workers of the other stages that hold their state (one that rolls
        // forward first does not help).
        assert_eq!(epochs.contains("helped by ["), helpers > 1, "{context}");
    }
}

#[test]
fn the_worker_that_holds_the_loss_lost_before_any_checkpoint_keeps_the_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 6;
    let reference = reference("mlp", steps, tmp.path());
    // Stage 2 holds the loss; no checkpoint comes before step 3: its replacement starts
    // from step 0 and replays.
    let fault = "crash:rank=2,step=2,phase=backward";
    let (epochs, context) = crash(("mlp", &reference), (3, 3, 1), steps, tmp.path(), (fault, &[]));
    let replays = "stage 2's state was lost: its workers [2] replay it from its checkpoint of step 0";
    assert!(epochs.contains(replays), "{context}");
}

#[test]
fn the_gpt_s_lost_stage_is_replayed_in_parallel_to_the_same_bits() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let reference = reference("gpt", steps, tmp.path());
    let (rank, step) = (d.below(3), 4 + d.below(3));
    let fault = format!("crash:rank={rank},step={step},phase=backward");
    let (epochs, context) = crash(("gpt", &reference), (3, 3, 2), steps, tmp.path(), (&fault, &[]));
    assert!(epochs.contains(&format!("stage {rank}'s state was lost")) && epochs.contains("helped by"), "{context}");
}

#[test]
fn a_lost_stage_worker_with_a_live_replica_fetches_its_stage() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 10;
    let reference = reference("mlp", steps, tmp.path());
    let (rank, step, phase) = (d.below(4), 2 + d.below(6), PHASES[d.below(5) as usize]);
    let fault = format!("crash:rank={rank},step={step},phase={phase}");
    let (epochs, context) = crash(("mlp", &reference), (4, 2, 1), steps, tmp.path(), (&fault, &[]));
    // Workers 0 and 2 hold stage 0, workers 1 and 3 stage 1.
    let replica = (rank + 2) % 4;
    assert!(
        epochs.contains(&format!("[{rank}] fetch their stages' states (stage {} from [{replica}])", rank % 2)),
        "{context}"
    );
    assert!(!epochs.contains("state was lost"), "{context}");
}

#[test]
fn a_budget_logs_some_boundaries_and_a_lost_stage_s_group_replays_together_to_the_same_bits() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 12;
    let reference = reference("mlp", steps, tmp.path());
    // 784-256-128-10 in batches of 32: boundary 0 logs 64 KiB a step, boundary 1 32 KiB.
    // Merging stages 1 and 2 (little work) costs least, so 70 kB logs boundary 0 alone.
    let (rank, step, phase) = (d.below(3), 2 + d.below(steps - 3), PHASES[d.below(5) as usize]);
    let fault = format!("crash:rank={rank},step={step},phase={phase}");
    let budget: &[&str] = &["--log-budget", "70kB"];
    let (epochs, context) = crash(("mlp", &reference), (3, 3, 1), steps, tmp.path(), (&fault, budget));
    let expected = if rank == 0 {
        "stage 0's state was lost: its workers [0] replay it"
    } else {
        "stages 1 to 2 go back to their checkpoints of step"
    };
    assert!(epochs.contains(expected), "{context}");
}

#[test]
fn a_stage_lost_in_every_replica_replays_with_its_group_across_replicas_to_the_same_bits() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 12;
    let reference = reference("mlp", steps, tmp.path());
    // Two pipelines of three stages, boundary 1 logged: stages 0 and 1 form a group. Both
    // replicas of stage 0 or of stage 1 are lost at once: after the vote, which every rank
    // passes before either dies.
    let (stage, step) = (d.below(2), 2 + d.below(steps - 3));
    let mut args = replay_job("mlp", (6, 3, 1), steps, tmp.path());
    args[2] = "2".into();
    args.extend(["--log-boundaries".into(), "1".into()]);
    for rank in [stage, stage + 3] {
        args.extend(["--fault".into(), format!("crash:rank={rank},step={step},phase=update")]);
    }
    let out = run(&args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let context = format!("stage {stage}, step {step}\n{stdout}\n{stderr}");
    assert!(out.status.success(), "{context}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 6 && fps.iter().all(|f| *f == reference), "{context}");
    assert!(stdout.contains("stages 0 to 1 go back to their checkpoints of step"), "{context}");
    assert!(stdout.contains("([[0, 3], [1, 4]])"), "each stage's two workers replay it: {context}");
}

/// A job of 2 replicas of 3 stages that goes on without its lost workers (`--on-failure
/// shrink`), each lost at a step and phase drawn from `d`; returns its output and the
/// reference fingerprint.
fn rerouted(d: &mut Draw, lost: &[usize], dir: &Path) -> (Output, String) {
    let steps = 12;
    let reference = reference("mlp", steps, dir);
    let mut args = replay_job("mlp", (6, 3, 1), steps, dir);
    args.splice(1..3, ["--on-failure".to_owned(), "shrink".to_owned(), "--quorum-timeout".to_owned(), "3".to_owned()]);
    for &rank in lost {
        let (step, phase) = (2 + d.below(steps - 3), PHASES[d.below(5) as usize]);
        args.extend(["--fault".into(), format!("crash:rank={rank},step={step},phase={phase}")]);
    }
    (run(&args), reference)
}

#[test]
fn a_lost_stage_worker_s_micro_batches_go_to_its_stage_s_peers_with_the_same_bits() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    // One worker lost, then two of different stages (ranks d*3 + s hold stage s).
    let one = d.below(6) as usize;
    let a = d.below(3) as usize;
    let two = [a, 3 + (a + 1 + d.below(2) as usize) % 3];
    for (case, lost) in [vec![one], two.to_vec()].into_iter().enumerate() {
        let dir = tmp.path().join(format!("case{case}"));
        let (out, reference) = rerouted(&mut d, &lost, &dir);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let context = format!("lost {lost:?}\n{stdout}\n{stderr}");
        assert!(out.status.success(), "{context}");
        let left: Vec<usize> = (0..6).filter(|w| !lost.contains(w)).collect();
        assert!(stdout.contains(&format!(": workers {left:?} from step")), "{context}");
        let fps = common::fingerprints_in(&stdout);
        assert!(fps.len() == left.len() && fps.iter().all(|f| *f == reference), "expected {reference}: {context}");
    }
}

#[test]
fn a_stage_that_loses_every_worker_without_a_replacement_ends_the_job_clearly() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let stage = d.below(3) as usize;
    let (out, _) = rerouted(&mut d, &[stage, stage + 3], tmp.path());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success());
    let stops = format!("the job stops: no worker of stage {stage} that holds step");
    assert!(stdout.contains(&stops), "{stdout}\n{stderr}");
}

/// The environment variable `name` of process `pid`.
fn environ(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_owned)
    })
}

/// Runs the job of `args`, whose metrics go to `dir/out`; once step 30 is recorded runs
/// `meanwhile`, then kills rank 1 (the middle stage of the first pipeline) with SIGKILL
/// from outside. Returns the
/// job's output, once it has succeeded.
fn kill_the_middle_stage(args: &[String], dir: &Path, meanwhile: impl FnOnce()) -> (String, String) {
    let job = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::steps_recorded(&dir.join("out")).last().is_none_or(|&s| s < 30) {
        assert!(Instant::now() < deadline, "step 30 never came: {}", dir.join("out/metrics.jsonl").display());
        std::thread::sleep(Duration::from_millis(5));
    }
    meanwhile();
    let middle = common::children(job.id()).into_iter().find(|&p| environ(p, "STEADFAST_RANK").as_deref() == Some("1"));
    let killed = Command::new("kill").args(["-KILL", &middle.expect("rank 1 runs").to_string()]).status().unwrap();
    assert!(killed.success());
    let out = job.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout.into_owned(), stderr.into_owned())
}

#[test]
fn a_stage_worker_killed_from_outside_is_replayed_to_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 400;
    let reference = reference("mlp", steps, tmp.path());
    let args = replay_job("mlp", (3, 3, 1), steps, tmp.path());
    let (stdout, stderr) = kill_the_middle_stage(&args, tmp.path(), || {});
    assert!(stdout.contains("worker 1 (process 1) exited with signal: 9"), "{stdout}");
    assert!(stdout.contains("stage 1's state was lost: its workers [1] replay it"), "{stdout}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 3 && fps.iter().all(|f| *f == reference), "{stdout}\n{stderr}");
}

#[test]
fn a_stage_worker_killed_from_outside_is_rerouted_to_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 400;
    let reference = reference("mlp", steps, tmp.path());
    let mut args = replay_job("mlp", (6, 3, 1), steps, tmp.path());
    args.splice(1..3, ["--on-failure".to_owned(), "shrink".to_owned()]);
    let (stdout, stderr) = kill_the_middle_stage(&args, tmp.path(), || {});
    assert!(stdout.contains("worker 1 (process 1) exited with signal: 9"), "{stdout}");
    assert!(stdout.contains(": workers [0, 2, 3, 4, 5] from step"), "{stdout}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 5 && fps.iter().all(|f| *f == reference), "{stdout}\n{stderr}");
}

#[test]
fn without_logs_every_stage_goes_back_to_the_checkpoint_with_the_same_bits() {
    let mut d = Draw(seed());
    let tmp = tempfile::tempdir().unwrap();
    let steps = 12;
    let reference = reference("mlp", steps, tmp.path());
    let (rank, step) = (d.below(3), 4 + d.below(7));
    let fault = format!("crash:rank={rank},step={step},phase=backward");
    let no_logs: &[&str] = &["--log-boundaries", "none"];
    let (epochs, context) = crash(("mlp", &reference), (3, 3, 1), steps, tmp.path(), (&fault, no_logs));
    let back = ["every stage goes back to its checkpoint of step", "every stage goes back to its initial state"];
    assert!(back.iter().any(|b| epochs.contains(b)), "{context}");
}

#[test]
fn a_corrupted_log_is_refused_and_its_stages_go_back_together_with_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 400;
    let reference = reference("mlp", steps, tmp.path());
    // No checkpoint but the last: the replacement replays from step 0, through step 10.
    let mut args = replay_job("mlp", (3, 3, 1), steps, tmp.path());
    let at = args.iter().position(|a| a == "--save-every").unwrap();
    args[at + 1] = "1000".into();
    // A bit of stage 1's input at step 10 rots on disk; then stage 1 is killed.
    let (stdout, stderr) = kill_the_middle_stage(&args, tmp.path(), || {
        let file = tmp.path().join("out/boundary-logs/replica-0/0-to-1/step-00000010.log");
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[200] ^= 0x01;
        std::fs::write(&file, &bytes).unwrap();
    });
    assert!(stderr.contains("step-00000010.log is corrupt"), "{stderr}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 3 && fps.iter().all(|f| *f == reference), "{stdout}\n{stderr}");
    // Stage 1's group grows across the unreadable boundary 0; stage 2 does not go back.
    assert!(stdout.contains("stages 0 to 1 go back to their checkpoints of step 0 and replay together"), "{stdout}");
}

/// Whether process `pid` still runs (neither gone nor a zombie that nobody reaped).
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

/// The newest step of which every stage of `stages` under the job's checkpoint root `root`
/// has a committed checkpoint (0: none).
fn common_step(root: &Path, stages: usize) -> u64 {
    let steps = |s: usize| -> Vec<u64> {
        let dir = root.join(format!("stage-{s}-of-{stages}"));
        ckpt::store::list(&dir).map(|l| l.into_iter().map(|(step, _)| step).collect()).unwrap_or_default()
    };
    let first = steps(0);
    first.into_iter().filter(|step| (1..stages).all(|s| steps(s).contains(step))).max().unwrap_or(0)
}

#[test]
fn a_pipeline_job_killed_whole_resumes_from_its_stages_checkpoints_when_run_again() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 200;
    let reference = reference("mlp", steps, tmp.path());
    let args = replay_job("mlp", (3, 3, 1), steps, tmp.path());
    // The launcher is killed with SIGKILL once step 30 is recorded: each worker ends when
    // its launcher is gone, and the whole job with it.
    let mut job = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::steps_recorded(&tmp.path().join("out")).last().is_none_or(|&s| s < 30) {
        assert!(Instant::now() < deadline, "step 30 never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    let workers = common::children(job.id());
    assert_eq!(workers.len(), 3, "the launcher's workers: {workers:?}");
    job.kill().unwrap();
    job.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "a worker outlived its launcher");
        std::thread::sleep(Duration::from_millis(10));
    }
    let common = common_step(&tmp.path().join("ck"), 3);
    assert!(common >= 3 && common < steps, "the stages' newest common checkpoint is of step {common}");

    // The same command again: the job goes on from that step, to the bits of the run that
    // never stopped.
    let out = run(&args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("every stage has one of step {common}")), "{stdout}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 3 && fps.iter().all(|f| *f == reference), "expected {reference}: {stdout}\n{stderr}");
    let summary = common::summary(&tmp.path().join("out"));
    assert_eq!(summary["resumed_from"], common, "{summary}");
}

#[test]
fn a_pipeline_job_without_a_save_dir_keeps_its_checkpoints_under_its_out_and_resumes_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let without_save_dir = |steps: u64| {
        let mut args = replay_job("mlp", (2, 2, 1), steps, tmp.path());
        let at = args.iter().position(|a| a == "--save-dir").unwrap();
        args.remove(at);
        args.remove(at);
        args
    };
    let ck = tmp.path().join("out").join("checkpoints");
    let first = run(&without_save_dir(6));
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&first.stderr));
    assert!(stdout.contains(&format!("the checkpoints go to {}", ck.display())), "named as it starts: {stdout}");
    for stage in 0..2 {
        assert!(ck.join(format!("stage-{stage}-of-2/step-00000006")).is_dir(), "stage {stage}'s final checkpoint");
    }

    // Longer, with --resume latest: it goes on from step 6 to the bits of 9 steps.
    let reference = reference("mlp", 9, tmp.path());
    let mut longer = without_save_dir(9);
    longer.extend(["--resume".into(), "latest".into()]);
    let again = run(&longer);
    let (stdout, stderr) = (String::from_utf8_lossy(&again.stdout), String::from_utf8_lossy(&again.stderr));
    assert!(again.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("every stage has one of step 6"), "{stdout}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 2 && fps.iter().all(|f| *f == reference), "expected {reference}: {stdout}\n{stderr}");
    assert_eq!(common::summary(&tmp.path().join("out"))["resumed_from"], 6);
    // The finished job run again: nothing is left to train, and its stages still put the
    // whole state together for the job's fingerprint.
    let finished = run(&longer);
    let (stdout, stderr) = (String::from_utf8_lossy(&finished.stdout), String::from_utf8_lossy(&finished.stderr));
    assert!(finished.status.success() && stdout.contains("no step left to train"), "{stdout}\n{stderr}");
    let fps = common::fingerprints_in(&stdout);
    assert!(fps.len() == 2 && fps.iter().all(|f| *f == reference), "expected {reference}: {stdout}\n{stderr}");

    // --resume latest with nothing to resume, and --resume of a path, are refused with what
    // to do instead.
    let mut fresh = replay_job("mlp", (2, 2, 1), 6, &tmp.path().join("elsewhere"));
    fresh.extend(["--resume".into(), "latest".into()]);
    let refused = run(&fresh);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("leave --resume out"), "{stderr}");
    let mut path = without_save_dir(6);
    path.extend(["--resume".into(), ck.display().to_string()]);
    let refused = run(&path);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("give the launcher --save-dir"), "{stderr}");
}

/// The report of a pipeline job that lost a stage worker: the launcher's record has the
/// loss (how the process ended), the replacement and the quorum that replayed the stage;
/// `steadfast report` counts them and tables the recovery.
#[test]
fn the_report_of_a_pipeline_job_says_which_worker_was_lost_and_how_it_was_replayed() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 12;
    let reference = reference("mlp", steps, tmp.path());
    let dir = tmp.path().join("report");
    let fault = "crash:rank=1,step=6,phase=forward";
    let (epochs, context) = crash(("mlp", &reference), (3, 3, 1), steps, &dir, (fault, &[]));
    let replays = "stage 1's state was lost: its workers [1] replay it from its checkpoint of step";
    assert!(epochs.contains(replays), "{context}");
    let record = std::fs::read_to_string(dir.join("out").join("events.jsonl")).unwrap();
    let lost: Vec<&str> = record.lines().filter(|l| l.contains("\"kind\":\"lost\"")).collect();
    assert_eq!(lost.len(), 1, "{context}\n{record}");
    assert!(lost[0].contains("\"worker\":1,\"process\":1,"), "{context}\n{record}");
    assert_eq!(record.matches("\"kind\":\"replaced\",").count(), 1, "{context}\n{record}");
    let page = dir.join("report.html");
    let out =
        run(&["report".into(), dir.join("out").display().to_string(), "--out".into(), page.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(page).unwrap();
    assert!(page.contains("; 1 loss, 1 replacement, 1 recovery.</p>"), "{context}\n{page}");
    assert!(page.contains("state was lost: its workers [1] replay it from its checkpoint"), "{context}\n{page}");
}
