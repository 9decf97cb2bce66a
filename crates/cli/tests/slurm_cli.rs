//! The Slurm examples for real: a one-host cluster (Debian's slurm-wlm and munge, started
//! by `scripts/slurm-one-host.sh` as root) runs `examples/slurm/train.sbatch`, whose `srun`
//! starts the workers, in each of its modes; then a worker is killed with SIGKILL in the
//! middle of training, and the job still ends with the bits of a run that lost no one.
//! It also runs `examples/slurm/elastic.sbatch`, whose `srun` starts one launcher per
//! task (each standing for a node), and kills a worker, which its launcher replaces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

/// A running one-host cluster; stopped on drop.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// A Slurm client command (`sbatch`, `scontrol`, ...) pointed at this cluster.
    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.env("SLURM_CONF", self.conf());
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).arg("stop").arg(self.dir.path()).output();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-one-host.sh")
}

/// Starts the cluster, or says why it cannot run here (a failure when
/// `STEADFAST_REQUIRE_SLURM` is set, as CI sets it).
fn start_cluster() -> Option<Cluster> {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash").arg(script()).arg("start").arg(dir.path()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(0) => Some(Cluster { dir }),
        Some(77) => {
            assert!(std::env::var_os("STEADFAST_REQUIRE_SLURM").is_none(), "STEADFAST_REQUIRE_SLURM is set: {text}");
            common::skip(&text);
            None
        }
        _ => panic!("the one-host Slurm cluster did not start:\n{text}"),
    }
}

/// Submits `examples/slurm/SCRIPT` with 3 tasks on the cluster's one node and `args` (a
/// mode and `train` arguments); returns the job id.
fn submit_script(cluster: &Cluster, script: &str, output: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let sbatch = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/slurm").join(script);
    let mut c = cluster.command("sbatch");
    // (`--ntasks-per-node` overrides the one launcher per node of `elastic.sbatch`.)
    c.args(["--parsable", "--ntasks", "3", "--ntasks-per-node", "3", "--output"]).arg(output).arg(sbatch).args(args);
    c.env("STEADFAST_BIN", env!("CARGO_BIN_EXE_steadfast")).current_dir(cluster.dir.path());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "sbatch failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap().to_owned()
}

/// Submits `train.sbatch` in `mode` with 3 tasks and `train` arguments; returns the job id.
fn submit(cluster: &Cluster, mode: &str, output: &Path, env: &[(&str, &str)], train: &[&str]) -> String {
    submit_script(cluster, "train.sbatch", output, env, &[&[mode], train].concat())
}

/// Waits for the job to end; returns its state (`COMPLETED`, `FAILED`, ...).
fn wait_for(cluster: &Cluster, job: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let out = cluster.command("scontrol").args(["show", "job", "-o", job]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let state = text.split_whitespace().find_map(|f| f.strip_prefix("JobState=")).unwrap_or("").to_owned();
        if !matches!(state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "") {
            return state;
        }
        assert!(Instant::now() < deadline, "job {job} still {state} after 300 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends SIGKILL to the task of global rank `rank` in the job's newest step.
fn kill_task(cluster: &Cluster, job: &str, rank: u32) {
    let pid = task_pid(cluster, job, rank);
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
}

/// The pid of the task of global rank `rank` in the job's newest step.
fn task_pid(cluster: &Cluster, job: &str, rank: u32) -> u32 {
    // A step's tasks register with slurmd one by one, so a listing taken as the step starts may
    // name some ranks and not yet others: ask again until this rank appears.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.command("scontrol").args(["listpids", job]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // PID JOBID STEPID LOCALID GLOBALID: the tasks of numbered steps (not the batch script).
        let found = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let step: u32 = f.get(2)?.parse().ok()?;
                (f.get(4)?.parse::<u32>().ok()? == rank).then(|| (step, f[0].to_owned()))
            })
            .max();
        match found {
            Some((_, pid)) => return pid.parse().unwrap(),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            None => panic!("no task of rank {rank} in job {job} after 30 s:\n{text}"),
        }
    }
}

/// The fingerprints the job's workers printed.
fn fingerprints(output: &Path) -> Vec<String> {
    common::fingerprints_in(&std::fs::read_to_string(output).unwrap_or_default())
}

#[test]
fn slurm_runs_the_example_in_every_mode_and_survives_a_killed_worker() {
    let Some(cluster) = start_cluster() else { return };
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name);
    let job = [&common::SMALL_MLP[1..], &["--reduce", "reproducible", "--steps", "150"]].concat();
    let single = common::fingerprint(&common::steadfast(
        &[
            common::SMALL_MLP,
            &["--reduce", "reproducible", "--steps", "150", "--out", path("single").to_str().unwrap()],
        ]
        .concat(),
    ));

    for mode in ["elastic", "static", "mpi"] {
        let output = path(&format!("{mode}.out"));
        let out_dir = path(&format!("run-{mode}"));
        let checkpoints = path(&format!("ck-{mode}"));
        let env = [("STEADFAST_CHECKPOINT_DIR", checkpoints.to_str().unwrap())];
        let id = submit(&cluster, mode, &output, &env, &[&job[..], &["--out", out_dir.to_str().unwrap()]].concat());
        let state = wait_for(&cluster, &id);
        let log = std::fs::read_to_string(&output).unwrap_or_default();
        assert_eq!(state, "COMPLETED", "{mode}:\n{log}");
        assert_eq!(fingerprints(&output), vec![single.clone(); 3], "{mode}: every worker's bits:\n{log}");
    }

    // A worker killed in the middle: the elastic job goes on without it; the MPI job
    // starts again from its last checkpoint.
    for mode in ["elastic", "mpi"] {
        let output = path(&format!("{mode}-killed.out"));
        let out_dir = path(&format!("run-{mode}-killed"));
        let checkpoints = path(&format!("ck-{mode}-killed"));
        let env = [("STEADFAST_CHECKPOINT_DIR", checkpoints.to_str().unwrap()), ("STEADFAST_CHECKPOINT_EVERY", "20")];
        let id = submit(&cluster, mode, &output, &env, &[&job[..], &["--out", out_dir.to_str().unwrap()]].concat());
        let deadline = Instant::now() + Duration::from_secs(120);
        while common::steps_recorded(&out_dir).last().is_none_or(|&s| s < 60) {
            assert!(Instant::now() < deadline, "{mode}: training did not reach step 60");
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_task(&cluster, &id, 1);
        let state = wait_for(&cluster, &id);
        let log = std::fs::read_to_string(&output).unwrap_or_default();
        assert_eq!(state, "COMPLETED", "{mode}:\n{log}");
        let expected = if mode == "elastic" {
            // The two survivors finish.
            vec![single.clone(); 2]
        } else {
            assert!(log.contains("restart 1 of 3 from the last checkpoint"), "{log}");
            vec![single.clone(); 3]
        };
        assert_eq!(fingerprints(&output), expected, "{mode} with a killed worker:\n{log}");
    }

    // The elastic job of one launcher per task (each task standing for a node, one worker
    // each): node 1's worker killed in the middle, its launcher replaces it, and the
    // replacement fetches the state from the live replicas.
    let output = path("launchers.out");
    let out_dir = path("run-launchers");
    let checkpoints = path("ck-launchers");
    let env = [
        ("STEADFAST_CHECKPOINT_DIR", checkpoints.to_str().unwrap()),
        ("STEADFAST_CHECKPOINT_EVERY", "20"),
        ("STEADFAST_NPROC_PER_NODE", "1"),
        ("STEADFAST_RESTARTS", "1"),
    ];
    let id = submit_script(
        &cluster,
        "elastic.sbatch",
        &output,
        &env,
        &[&job[..], &["--out", out_dir.to_str().unwrap()]].concat(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::steps_recorded(&out_dir).last().is_none_or(|&s| s < 60) {
        assert!(Instant::now() < deadline, "launchers: training did not reach step 60");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The task runs `bash`, which runs the launcher, which runs the worker.
    let task = task_pid(&cluster, &id, 1);
    let launcher = common::children(task);
    let worker: Vec<u32> = launcher.iter().flat_map(|&l| common::children(l)).collect();
    assert_eq!(worker.len(), 1, "node 1's worker under task {task}: {launcher:?} -> {worker:?}");
    assert!(Command::new("kill").args(["-9", &worker[0].to_string()]).status().unwrap().success());
    let state = wait_for(&cluster, &id);
    let log = std::fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "launchers:\n{log}");
    assert!(log.contains("replacing worker 1 (restart 1 of 1)"), "{log}");
    assert!(log.contains("[1] fetch the state from"), "{log}");
    assert_eq!(fingerprints(&output), vec![single.clone(); 3], "launchers with a killed worker:\n{log}");
}
