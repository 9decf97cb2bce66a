//! Helpers shared by the tests that run the `steadfast` binary.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

/// The small MLP job on generated data that most tests run (add `--steps` and what else
/// they vary).
pub const SMALL_MLP: &[&str] =
    &["train", "--model", "mlp", "--data", "synthetic", "--batch", "48", "--micro-batch", "16", "--eval-every", "0"];

/// Runs the binary with `args`.
pub fn steadfast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_steadfast")).args(args).output().expect("run steadfast")
}

/// The standard output of a run that must have succeeded.
pub fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The fingerprint (16 hex digits) a successful run printed last in its summary.
pub fn fingerprint(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let rest = stdout.lines().find_map(|l| l.split("fingerprint: ").nth(1)).expect("a fingerprint line");
    rest.split_whitespace().next().expect("a fingerprint").to_owned()
}

/// Says that a test is skipped and why, on the terminal: written past the test harness's
/// capture, so that `cargo test` shows it even when the test passes.
pub fn skip(reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
}

/// True when the Debian data set is installed. When `STEADFAST_REQUIRE_DATA` is set (CI
/// sets it), a missing data set fails the test instead of skipping it.
pub fn have_data(dir: &str) -> bool {
    let present = Path::new(dir).is_dir();
    if !present {
        assert!(
            std::env::var_os("STEADFAST_REQUIRE_DATA").is_none(),
            "{dir} is missing but STEADFAST_REQUIRE_DATA is set"
        );
        skip(&format!("{dir} is not installed"));
    }
    present
}

/// True when python3 imports `modules` (e.g. `"safetensors.numpy, numpy"`). When
/// `STEADFAST_REQUIRE_PYTHON` is set (CI sets it), their absence fails the test.
pub fn python_with(modules: &str) -> bool {
    let probe = Command::new("python3").args(["-c", &format!("import {modules}")]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(std::env::var_os("STEADFAST_REQUIRE_PYTHON").is_none(), "python3 with {modules} is missing");
    skip(&format!("python3 with {modules} is not installed"));
    false
}

/// The summary record of a run: the last line of `dir/metrics.jsonl`.
pub fn summary(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let last = text.lines().last().expect("metrics.jsonl is empty");
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["kind"], "summary");
    v
}

/// The steps recorded in `dir/metrics.jsonl` (in a data-parallel job, worker 0's), in the
/// order written.
pub fn steps_recorded(dir: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| v["step"].as_u64())
        .collect()
}

/// True when Open MPI's `mpirun` is installed. When `STEADFAST_REQUIRE_MPI` is set (CI sets
/// it), its absence fails the test.
pub fn have_mpirun() -> bool {
    let probe = Command::new("mpirun").arg("--version").output();
    if probe.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(std::env::var_os("STEADFAST_REQUIRE_MPI").is_none(), "mpirun is missing but STEADFAST_REQUIRE_MPI is set");
    skip("mpirun (Debian: openmpi-bin) is not installed");
    false
}

/// `mpirun -n N` of the binary with `args`, oversubscribed (more ranks than cores), as root
/// where the tests run as root.
pub fn mpirun(n: usize, args: &[&str]) -> Output {
    mpirun_with(n, args, &[])
}

/// [`mpirun`] with `env` added to the ranks' environment.
pub fn mpirun_with(n: usize, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("mpirun")
        .args(["--oversubscribe", "-n", &n.to_string(), env!("CARGO_BIN_EXE_steadfast")])
        .args(args)
        .envs(OMPI_AS_ROOT)
        .envs(env.iter().copied())
        .output()
        .expect("run mpirun")
}

/// What Open MPI needs to run as root (as in CI's containers).
pub const OMPI_AS_ROOT: [(&str, &str); 2] = [("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")];

/// Every fingerprint printed in `text`, in order (one per rank under a launcher, after its
/// `[rank]` prefix).
pub fn fingerprints_in(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once("fingerprint: "))
        .filter_map(|(_, f)| f.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Whether `rank` fetched its state, in some epoch, from live replicas other than itself
/// (a coordinator line such as `[2] fetch the state from [0, 1]`).
///
/// Which live replicas a plan names depends on when the fault landed: a survivor that had
/// not yet committed the newest step rolls forward instead of serving it. Tests assert on
/// what must hold either way: the sources are live replicas, never the rank itself.
pub fn fetched_from_others(text: &str, rank: usize) -> bool {
    let needle = format!("[{rank}] fetch the state from [");
    text.lines().filter_map(|l| l.split_once(needle.as_str())?.1.split_once(']')).any(|(list, _)| {
        let from: Vec<usize> = list.split(", ").filter_map(|r| r.trim().parse().ok()).collect();
        !from.is_empty() && !from.contains(&rank)
    })
}

/// A loopback port that was free when asked (the caller binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `steadfast launch -- COMMAND` once per node, each configured only by the `PET_*`
/// variables that Kubeflow's trainer sets (the coordinator on loopback), with the job
/// secret `secret` (`None`: unset); returns each node's output.
pub fn launch_pet_nodes<S: AsRef<std::ffi::OsStr>>(
    command: &[S],
    nnodes: usize,
    nproc: &str,
    secret: Option<&str>,
) -> Vec<Output> {
    let port = free_port().to_string();
    let nodes: Vec<_> = (0..nnodes)
        .map(|node| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
            c.args(["launch", "--"]).args(command);
            c.env("PET_NNODES", nnodes.to_string())
                .env("PET_NPROC_PER_NODE", nproc)
                .env("PET_NODE_RANK", node.to_string())
                .env("PET_MASTER_ADDR", "127.0.0.1")
                .env("PET_MASTER_PORT", &port);
            match secret {
                Some(s) => c.env("STEADFAST_SECRET", s),
                None => c.env_remove("STEADFAST_SECRET"),
            };
            c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("start launch")
        })
        .collect();
    nodes.into_iter().map(|n| n.wait_with_output().unwrap()).collect()
}

/// The pids of the children of `parent` (read from `/proc`).
pub fn children(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The parent's pid is the second field after the command's closing parenthesis.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}

/// Starts the binary with `args` and `STEADFAST_SECRET=secret`; each line of its standard
/// output and error arrives on the channel, with the instant it was read (a thread per
/// pipe, so that a chatty process never blocks on a full pipe).
pub fn spawn_streamed(
    args: &[&str],
    secret: &str,
) -> (std::process::Child, std::sync::mpsc::Receiver<(std::time::Instant, String)>) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(args)
        .env("STEADFAST_SECRET", secret)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start steadfast");
    let (tx, lines) = std::sync::mpsc::channel();
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send((std::time::Instant::now(), line));
            }
        });
    }
    (child, lines)
}
