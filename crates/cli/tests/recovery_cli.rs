//! Recovery without rollback: an elastic job that loses workers (crashed, hung, cut off,
//! killed from outside, or its coordinator killed) goes on from its live replicas and ends
//! with the bits of a job that never failed, which are those of single-process `train`.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{SMALL_MLP, fingerprint, steadfast, steps_recorded};

const STEPS: u64 = 40;

/// The training command of every job here (and of the reference run).
fn train_args(steps: u64, out: &Path) -> Vec<String> {
    let (steps, out) = (steps.to_string(), out.to_str().unwrap());
    [SMALL_MLP, &["--reduce", "reproducible", "--steps", &steps, "--out", out]]
        .concat()
        .into_iter()
        .map(String::from)
        .collect()
}

/// `launch --nproc 3 --heartbeat-timeout 1 <policy> -- train ... <extra>` for `steps`,
/// writing to `out`.
fn launch_args(policy: &[&str], steps: u64, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["launch", "--nproc", "3", "--heartbeat-timeout", "1"].map(String::from).to_vec();
    args.extend(policy.iter().map(|a| a.to_string()));
    args.push("--".into());
    args.extend(train_args(steps, out));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Runs [`launch_args`] to the end: whether it succeeded, its standard output and error.
fn launch(policy: &[&str], out: &Path, extra: &[&str]) -> (bool, String, String) {
    let args = launch_args(policy, STEPS, out, extra);
    let run = steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (run.status.success(), text(&run.stdout), text(&run.stderr))
}

/// Single-process `train`'s fingerprint after `steps`.
fn reference(steps: u64) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let args = train_args(steps, &tmp.path().join("ref"));
    fingerprint(&steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>()))
}

fn reference_40() -> &'static str {
    static F: OnceLock<String> = OnceLock::new();
    F.get_or_init(|| reference(STEPS))
}

/// A small deterministic generator for the schedules.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

const PHASES: [&str; 5] = ["forward", "backward", "allreduce", "vote", "update"];

/// Schedule `seed`'s faults. The first three are the named cases: rank 0 crashes; a
/// source crashes while it sends its state to a replacement; two workers crash close
/// together. The rest are random: one or two faults, crashes mostly, some hangs and cut
/// links, at any step and phase.
fn schedule(seed: u64) -> Vec<String> {
    let mut d = Draw(seed);
    let step = 1 + d.below(STEPS - 10);
    let phase = PHASES[d.below(5) as usize];
    match seed {
        0 => vec![format!("crash:rank=0,step={step},phase={phase}")],
        1 => {
            let (lost, source) = (d.below(3), d.below(2));
            let source = if source >= lost { source + 1 } else { source };
            vec![
                format!("crash:rank={lost},step={step},phase=forward"),
                format!("crash:rank={source},step={step},phase=transfer"),
            ]
        }
        2 => {
            let a = d.below(3);
            let b = (a + 1 + d.below(2)) % 3;
            let phase_b = PHASES[d.below(5) as usize];
            vec![
                format!("crash:rank={a},step={step},phase={phase}"),
                format!("crash:rank={b},step={},phase={phase_b}", step + d.below(2)),
            ]
        }
        _ => (0..1 + d.below(2))
            .map(|_| {
                let kind = ["crash", "crash", "crash", "hang", "cut"][d.below(5) as usize];
                let rank = d.below(3);
                let step = 1 + d.below(STEPS - 2);
                format!("{kind}:rank={rank},step={step},phase={}", PHASES[d.below(5) as usize])
            })
            .collect(),
    }
}

#[test]
fn jobs_that_lose_workers_end_with_the_bits_of_one_that_never_did() {
    let reference = reference_40();
    let tmp = tempfile::tempdir().unwrap();
    let schedules: u64 = std::env::var("STEADFAST_RECOVERY_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    for seed in 0..schedules {
        let faults = schedule(seed);
        let out = tmp.path().join(format!("s{seed}"));
        let extra: Vec<&str> = faults.iter().flat_map(|f| ["--fault", f.as_str()]).collect();
        let (ok, stdout, stderr) = launch(&["--max-restarts", "4"], &out, &extra);
        let context = format!("schedule {seed} {faults:?}:\n{stdout}\n{stderr}");
        assert!(ok, "{context}");
        assert!(stdout.contains("  replacing worker"), "the first fault always strikes: {context}");
        let got = common::fingerprints_in(&stdout);
        assert_eq!(got.len(), 3, "{context}");
        assert!(got.iter().all(|f| f == reference), "expected {reference}: {context}");
        // Worker 0's record (kept across its replacements) applies each step once, in order.
        let steps = steps_recorded(&out);
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}: {context}");
        assert_eq!(steps.last(), Some(&STEPS), "{context}");
    }
}

#[test]
fn a_job_shrinks_from_three_workers_to_two_with_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = launch(
        &["--on-failure", "shrink", "--min-nproc", "2"],
        &tmp.path().join("shrink"),
        &["--fault", "crash:rank=2,step=12,phase=backward"],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("workers [0, 1] from step 12"), "{stdout}");
    assert!(!stdout.contains("replacing"), "{stdout}");
    assert_eq!(common::fingerprints_in(&stdout), vec![reference_40().to_owned(); 2], "{stdout}");
    // Each epoch's mesh is built once and timed on its own: three members, then two.
    let meshes: Vec<(u64, f64)> = std::fs::read_to_string(tmp.path().join("shrink").join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "mesh")
        .map(|v| (v["members"].as_u64().unwrap(), v["seconds"].as_f64().unwrap()))
        .collect();
    assert_eq!(meshes.iter().map(|m| m.0).collect::<Vec<_>>(), [3, 2], "{meshes:?}");
    assert!(meshes.iter().all(|m| m.1 > 0.0 && m.1 < 60.0), "{meshes:?}");
}

#[test]
fn a_job_with_too_few_workers_left_stops_every_survivor_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = launch(
        &["--on-failure", "shrink", "--min-nproc", "3", "--quorum-timeout", "1"],
        &tmp.path().join("few"),
        &["--fault", "crash:rank=1,step=5,phase=vote"],
    );
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("too few workers remain: 2 of 3, at least 3 needed"), "{stderr}");
    // Both survivors say so, and neither printed a result.
    assert_eq!(stderr.matches("the job stopped: too few workers remain").count(), 3, "{stderr}");
    assert!(common::fingerprints_in(&stdout).is_empty(), "{stdout}");
}

/// A process whose output lines arrive on a channel.
struct Streamed {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Streamed {
    fn start(args: &[String], secret: &str) -> Streamed {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, lines) = common::spawn_streamed(&args, secret);
        Streamed { child, lines, seen: Vec::new() }
    }

    /// Waits (at most a minute) for a line containing `needle`; returns it.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        while let Ok((_, line)) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
        panic!("no line with {needle:?} in:\n{}", self.seen.join("\n"));
    }

    /// Waits for the process and returns whether it succeeded and all it printed.
    fn finish(mut self) -> (bool, String) {
        let status = self.child.wait().unwrap();
        while let Ok((_, line)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status.success(), self.seen.join("\n"))
    }
}

/// Waits until worker 0 has recorded `step` in `dir`.
fn wait_for_step(dir: &Path, step: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while steps_recorded(dir).last().is_none_or(|&s| s < step) {
        assert!(Instant::now() < deadline, "step {step} never came");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_worker_killed_from_outside_is_replaced_with_the_same_bits() {
    let steps = 300;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sigkill");
    let mut job = Streamed::start(&launch_args(&["--max-restarts", "1"], steps, &out, &[]), "");
    let line = job.wait_for("  worker 2 started: process 1 (pid ");
    let pid: u32 = line.rsplit("pid ").next().unwrap().trim_end_matches(')').parse().unwrap();
    wait_for_step(&out, 20);
    let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let (ok, text) = job.finish();
    assert!(ok, "{text}");
    assert!(text.contains("worker 2 (process 1) exited with signal: 9"), "{text}");
    // The replacement fetches from the live replicas: both, or (when the kill landed in a
    // vote and a survivor rolls forward) the one already at the newest step.
    assert!(common::fetched_from_others(&text, 2), "{text}");
    assert_eq!(common::fingerprints_in(&text), vec![reference(steps); 3], "{text}");
}

/// `launch --nproc 3 --max-restarts 1` whose worker 0 is killed with SIGKILL: worker 0
/// writes nothing as it dies, but the launcher's record of the job has the loss with its
/// signal and the replacement, and `steadfast report` counts and draws them.
#[test]
fn the_report_of_a_job_whose_worker_0_was_killed_says_what_happened() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("kill0");
    let mut job = Streamed::start(&launch_args(&["--max-restarts", "1"], 200, &out, &[]), "");
    let line = job.wait_for("  worker 0 started: process 1 (pid ");
    let pid: u32 = line.rsplit("pid ").next().unwrap().trim_end_matches(')').parse().unwrap();
    wait_for_step(&out, 20);
    signal(pid, "-KILL");
    let (ok, text) = job.finish();
    assert!(ok, "{text}");
    assert!(text.contains("worker 0 (process 1) exited with signal: 9"), "{text}");
    // The record: one loss, with its signal, one replacement, the job's end.
    let record: Vec<serde_json::Value> = std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str| record.iter().filter(|v| v["kind"] == kind).collect::<Vec<_>>();
    let (lost, replaced) = (of("lost"), of("replaced"));
    assert_eq!(lost.len(), 1, "{record:?}");
    assert_eq!((lost[0]["worker"].as_u64(), lost[0]["process"].as_u64()), (Some(0), Some(1)), "{record:?}");
    // (The launcher may have signalled it too, if the coordinator's word of the closed
    // connection came before the process was gone.)
    assert!(lost[0]["cause"].as_str().unwrap().contains("killed by signal 9 (SIGKILL)"), "{record:?}");
    assert_eq!(replaced.len(), 1, "{record:?}");
    assert_eq!((replaced[0]["worker"].as_u64(), replaced[0]["process"].as_u64()), (Some(0), Some(2)));
    assert_eq!(of("finished").len(), 1, "{record:?}");
    // The report: worker 0's replacement wrote the summary; the loss is counted, with its
    // cause, as the one recovery, and drawn on the time line.
    let page = tmp.path().join("kill0.html");
    let run = steadfast(&["report", out.to_str().unwrap(), "--out", page.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let page = std::fs::read_to_string(page).unwrap();
    assert!(page.contains("200 steps in "), "{page}");
    assert!(page.contains("; 1 loss, 1 replacement, 1 recovery.</p>"), "{page}");
    let why = page.split("<td>worker 0 (process 1): ").nth(1).unwrap_or_else(|| panic!("no loss of worker 0: {page}"));
    assert!(why.split("</td>").next().unwrap().contains("killed by signal 9 (SIGKILL)"), "{page}");
    assert!(page.contains("\nlost 0\n</text>"), "{page}");
}

/// Starts an elastic coordinator on `bind`; returns it and the address it listens on.
fn coordinator(bind: &str, world: usize, generation: u64, secret: &str) -> (Streamed, String) {
    let args: Vec<String> = [
        "coordinator",
        "--elastic",
        "--bind",
        bind,
        "--world-size",
        &world.to_string(),
        "--heartbeat-timeout",
        "1",
        "--generation",
        &generation.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut c = Streamed::start(&args, secret);
    let addr = c.wait_for("coordinator listening on ").rsplit(' ').next().unwrap().to_owned();
    (c, addr)
}

fn worker(steps: u64, rank: usize, world: usize, addr: &str, out: &Path, secret: &str) -> Streamed {
    let mut args = train_args(steps, out);
    args.extend(
        ["--elastic", "--rank", &rank.to_string(), "--world-size", &world.to_string(), "--coordinator", addr]
            .map(String::from),
    );
    Streamed::start(&args, secret)
}

#[test]
fn a_worker_joins_a_running_job_and_the_bits_do_not_change() {
    let steps = 300;
    let secret = "grow-test-secret";
    let tmp = tempfile::tempdir().unwrap();
    let (coord, addr) = coordinator("127.0.0.1:0", 2, 0, secret);
    let w0 = worker(steps, 0, 2, &addr, &tmp.path().join("w0"), secret);
    let w1 = worker(steps, 1, 2, &addr, &tmp.path().join("w1"), secret);
    wait_for_step(&tmp.path().join("w0"), 30);
    let w2 = worker(steps, 2, 2, &addr, &tmp.path().join("w2"), secret);
    let reference = reference(steps);
    for w in [w0, w1, w2] {
        let (ok, text) = w.finish();
        assert!(ok, "{text}");
        assert_eq!(common::fingerprints_in(&text), vec![reference.clone()], "{text}");
    }
    let (ok, text) = coord.finish();
    assert!(ok, "{text}");
    assert!(text.contains("workers [0, 1, 2] from step"), "{text}");
    assert!(text.contains("[2] fetch the state from [0, 1]"), "{text}");
}

#[test]
fn the_job_survives_its_coordinator_killed_and_started_again() {
    let steps = 300;
    let secret = "coordinator-restart-secret";
    let tmp = tempfile::tempdir().unwrap();
    let (mut first, addr) = coordinator("127.0.0.1:0", 3, 0, secret);
    let workers: Vec<Streamed> =
        (0..3).map(|r| worker(steps, r, 3, &addr, &tmp.path().join(format!("w{r}")), secret)).collect();
    wait_for_step(&tmp.path().join("w0"), 30);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let (second, _) = coordinator(&addr, 3, 1, secret);
    let reference = reference(steps);
    for w in workers {
        let (ok, text) = w.finish();
        assert!(ok, "{text}");
        assert_eq!(common::fingerprints_in(&text), vec![reference.clone()], "{text}");
    }
    let (ok, text) = second.finish();
    assert!(ok, "{text}");
    // The new coordinator's epochs carry its generation.
    assert!(text.contains("epoch 1.1: workers [0, 1, 2]"), "{text}");
}

#[test]
fn live_bit_flips_are_repaired_from_the_healthy_replicas_and_the_bits_are_golden() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = launch(
        &["--max-restarts", "1"],
        &tmp.path().join("repair"),
        &[
            "--on-divergence",
            "repair",
            "--fingerprint-every",
            "1",
            // A parameter of worker 1 flips at rest, before step 10 reads it.
            "--inject",
            "step=10,rank=1,state=param,bits=exponent,count=1,seed=3",
            // An optimizer slot of worker 2 flips as step 20's update begins: the check
            // just before the update finds it (a replica comparison after it would too).
            "--inject",
            "step=20,rank=2,state=optim,bits=exponent,count=1,seed=3",
            // Worker 0's summed gradient flips in step 30: the vote refuses the step.
            "--inject",
            "step=30,rank=0,state=grad,bits=exponent,count=1,seed=3",
        ],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stderr.contains("the state of worker 1 changed at rest"), "{stderr}");
    // Which replicas serve a repair depends on the moment it lands (a survivor one commit
    // behind rolls forward instead): what must hold is that the sources are healthy others.
    assert!(stdout.contains("from step 10 (") && common::fetched_from_others(&stdout, 1), "{stdout}");
    assert!(stderr.contains("the state of worker 2 changed before the update"), "{stderr}");
    assert!(common::fetched_from_others(&stdout, 2), "{stdout}");
    assert!(!stdout.contains("replacing"), "no process was lost: {stdout}");
    assert_eq!(common::fingerprints_in(&stdout), vec![reference_40().to_owned(); 3], "{stdout}");
}

#[test]
fn of_two_replicas_the_one_whose_state_changed_since_its_commit_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args: Vec<String> =
        ["launch", "--nproc", "2", "--heartbeat-timeout", "1", "--max-restarts", "1", "--"].map(String::from).to_vec();
    args.extend(train_args(STEPS, &tmp.path().join("pair")));
    // An optimizer slot of worker 1 flips in step 20's update: no majority can name it,
    // but its state is no longer the one it committed.
    args.extend(
        ["--on-divergence", "repair", "--inject", "step=20,rank=1,state=optim,bits=exponent,count=1,seed=3"]
            .map(String::from),
    );
    let run = steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("the state of worker 1 changed before the update"), "{stderr}");
    assert!(stdout.contains("[1] fetch the state from [0]"), "{stdout}");
    assert_eq!(common::fingerprints_in(&stdout), vec![reference_40().to_owned(); 2], "{stdout}");
}

#[test]
fn a_divergence_stops_the_job_when_it_is_not_to_be_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = launch(
        &["--max-restarts", "2"],
        &tmp.path().join("stop"),
        &["--fingerprint-every", "1", "--inject", "step=20,rank=2,state=optim,bits=exponent,count=1,seed=3"],
    );
    assert!(!ok, "{stdout}");
    assert_eq!(stderr.matches("replicas diverged at step 21: rank(s) [2]").count(), 3, "{stderr}");
    assert!(!stdout.contains("replacing"), "an error is not a crash: {stdout}");
}

#[test]
fn the_baselines_go_back_to_a_copy_or_a_checkpoint_and_end_with_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let crash = ["--fault", "crash:rank=1,step=25,phase=update"];
    // Every survivor goes back to its in-memory copy of step 20; the replacement fetches it.
    let (ok, stdout, stderr) = launch(
        &["--max-restarts", "1", "--recovery", "memory", "--save-every", "10"],
        &tmp.path().join("memory"),
        &crash,
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stderr.matches("went back to the copy of step 20").count(), 2, "{stderr}");
    assert!(stdout.contains("from step 20") && stdout.contains("[1] fetch the state from [0, 2]"), "{stdout}");
    assert_eq!(common::fingerprints_in(&stdout), vec![reference_40().to_owned(); 3], "{stdout}");
    // The report draws the rollback: the loss, the copy put back, and the recovery's time.
    let page = tmp.path().join("memory.html");
    let dir = tmp.path().join("memory");
    let run = steadfast(&["report", dir.to_str().unwrap(), "--out", page.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let page = std::fs::read_to_string(page).unwrap();
    assert!(page.contains("back to the in-memory copy (restore)") && page.contains("<h2>Recoveries</h2>"), "{page}");
    let counts = format!("fingerprint <code>{}</code>; 1 loss, 1 replacement, 1 recovery.", reference_40());
    assert!(page.contains(&counts), "{page}");

    // Every worker restarts from the newest committed checkpoint.
    let (ok, stdout, stderr) = launch(
        &["--max-restarts", "1", "--recovery", "checkpoint", "--save-every", "10"],
        &tmp.path().join("checkpoint"),
        &crash,
    );
    assert!(ok, "{stdout}\n{stderr}");
    // Every rank writes its part of a checkpoint in the background; under load, the crashed
    // rank's part of step 20 may still have been in flight, and then the newest committed
    // checkpoint is step 10's. Either way every worker resumes from the same one.
    let from = ["20", "10"]
        .into_iter()
        .find(|s| stdout.contains(&format!("starting 3 workers from the checkpoint of step {s}")))
        .unwrap_or_else(|| panic!("no restart from a checkpoint of step 20 or 10: {stdout}"));
    assert_eq!(stdout.matches(&format!("resumed from: step {from}")).count(), 3, "{stdout}");
    assert_eq!(common::fingerprints_in(&stdout), vec![reference_40().to_owned(); 3], "{stdout}");

    // Out of restarts, the checkpoint job fails and says where its checkpoints are.
    let kept = tmp.path().join("kept");
    let (ok, _, stderr) = launch(
        &[
            "--max-restarts",
            "0",
            "--recovery",
            "checkpoint",
            "--save-every",
            "10",
            "--save-dir",
            kept.to_str().unwrap(),
        ],
        &tmp.path().join("none-left"),
        &crash,
    );
    assert!(!ok && stderr.contains("the job failed after 0 restart(s)"), "{stderr}");
    // (Step 20's when the crashed rank's part of it was on disk in time, else step 10's.)
    assert!(kept.join("step-00000020").is_dir() || kept.join("step-00000010").is_dir(), "{stderr}");
}

/// Sends `signal` (`-STOP`, `-CONT`, `-KILL`) to `pid`.
fn signal(pid: u32, signal: &str) {
    assert!(Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
}

/// A launcher stopped (SIGSTOP) for three heartbeat timeouts and continued: on waking it
/// does not count its own pause as its workers' silence, kills nobody and spends no
/// restart.
#[test]
fn a_launcher_stopped_and_continued_kills_none_of_its_healthy_workers() {
    let steps = 400;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("paused");
    let mut job = Streamed::start(&launch_args(&["--max-restarts", "1"], steps, &out, &[]), "");
    job.wait_for("  worker 2 started: process 1 (pid ");
    wait_for_step(&out, 20);
    signal(job.child.id(), "-STOP");
    std::thread::sleep(Duration::from_secs(3));
    signal(job.child.id(), "-CONT");
    let (ok, text) = job.finish();
    assert!(ok, "{text}");
    assert!(!text.contains(" lost: ") && !text.contains("killing worker"), "{text}");
    assert!(text.contains("with 0 replacement(s)"), "{text}");
    assert_eq!(common::fingerprints_in(&text), vec![reference(steps); 3], "{text}");
}

/// A worker stopped (SIGSTOP) long enough to be lost, replaced by a process started by
/// hand with its rank, then continued: it learns that its slot is taken, says so and exits
/// with an error, without a loop of rejoins; the job ends with the single-process bits.
#[test]
fn a_stopped_worker_that_returns_after_its_replacement_exits_and_the_job_goes_on() {
    let steps = 400;
    let secret = "superseded-worker-secret";
    let tmp = tempfile::tempdir().unwrap();
    let (mut coord, addr) = coordinator("127.0.0.1:0", 3, 0, secret);
    let mut workers: Vec<Streamed> =
        (0..3).map(|r| worker(steps, r, 3, &addr, &tmp.path().join(format!("w{r}")), secret)).collect();
    wait_for_step(&tmp.path().join("w0"), 20);
    let old = workers.remove(1);
    signal(old.child.id(), "-STOP");
    coord.wait_for("worker 1 lost");
    let replacement = worker(steps, 1, 3, &addr, &tmp.path().join("w1b"), secret);
    coord.wait_for("[1] fetch the state from");
    signal(old.child.id(), "-CONT");
    let woke = Instant::now();
    let mut old = old;
    while old.child.try_wait().unwrap().is_none() {
        if woke.elapsed() > Duration::from_secs(30) {
            old.child.kill().unwrap();
            panic!("the superseded worker still runs 30 s after it woke");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, text) = old.finish();
    assert!(!ok, "the superseded worker must fail:\n{text}");
    assert!(text.contains("superseded"), "{text}");
    assert!(woke.elapsed() < Duration::from_secs(20), "it took {:?} to exit", woke.elapsed());
    let reference = reference(steps);
    for w in workers.into_iter().chain([replacement]) {
        let (ok, text) = w.finish();
        assert!(ok, "{text}");
        assert_eq!(common::fingerprints_in(&text), vec![reference.clone()], "{text}");
    }
    let (ok, text) = coord.finish();
    assert!(ok, "{text}");
    let joins = text.matches("worker 1 joined").count();
    assert!(joins <= 3, "worker 1 joined {joins} times:\n{text}");
}

/// Once its restarts are used up a job that cannot have its workers again ends at once,
/// not after the quorum timeout.
#[test]
fn a_job_whose_restarts_are_used_up_ends_at_once_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (ok, stdout, stderr) = launch(
        &["--max-restarts", "0", "--quorum-timeout", "60"],
        &tmp.path().join("spent"),
        &["--fault", "crash:rank=1,step=5,phase=vote"],
    );
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("restart(s) allowed are used up"), "{stdout}\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "it waited {:?}", started.elapsed());
}

#[test]
fn an_elastic_job_that_ended_well_lets_its_workers_evaluate_the_final_state() {
    // The GPT's final evaluation (1024 held-out sequences) takes several seconds on two
    // workers sharing few cores: longer than the grace after which the launcher kills a
    // worker of a job that ended badly. Cutting it would lose the summary and the
    // fingerprint.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("gpt");
    let o = out.to_str().unwrap();
    let run = steadfast(&[
        "launch",
        "--nproc",
        "2",
        "--max-restarts",
        "1",
        "--",
        "train",
        "--model",
        "gpt",
        "--data",
        "fortunes",
        "--steps",
        "2",
        "--batch",
        "8",
        "--micro-batch",
        "4",
        "--reduce",
        "reproducible",
        "--out",
        o,
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!stderr.contains("killing worker"), "{stderr}");
    // The coordinator, gone once the job finished, is not missed during the evaluation.
    assert!(!stderr.contains("is unreachable"), "{stderr}");
    fingerprint(&run);
    assert_eq!(common::summary(&out)["steps"], 2);
}
