//! Jobs that meet in etcd (`--rendezvous etcd://HOST:PORT/JOB`), against Debian's
//! `etcd-server` started by the test. A static job: no coordinator process; the loss and
//! return of the etcd server in the middle of training changes nothing; a worker whose
//! lease expires (stopped, so its keep-alives stop) is reported lost by the others; bad
//! addresses and a rank already taken are refused. An elastic job: its coordinator is
//! elected among the launchers (or standalone coordinators); etcd killed and restarted,
//! the process holding the role killed, a node brought back, and a worker stopped until
//! its lease expired and then continued: every worker ends with single-process bits.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

/// An etcd server on free loopback ports, with its data in a directory that outlives a
/// restart.
struct Etcd {
    data: PathBuf,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

impl Etcd {
    /// Starts a server, or says why it cannot run here (a failure when
    /// `STEADFAST_REQUIRE_ETCD` is set, as CI sets it).
    fn start(dir: &Path) -> Option<Etcd> {
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("STEADFAST_REQUIRE_ETCD").is_none(),
                "etcd is missing but STEADFAST_REQUIRE_ETCD is set"
            );
            common::skip("etcd (Debian: etcd-server) is not installed");
            return None;
        }
        let mut etcd =
            Etcd { data: dir.join("etcd"), client: common::free_port(), peer: common::free_port(), child: None };
        etcd.restart();
        Some(etcd)
    }

    fn url(&self, job: &str) -> String {
        format!("etcd://127.0.0.1:{}/{job}?ttl=2", self.client)
    }

    /// Starts the server (again, on the same data) and waits until it is healthy.
    fn restart(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client);
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", "default", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.healthy() {
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Each step of a job here lasts at least 5 ms (the `step_begin` failpoint), so that the
/// job is still running when a test acts on it, however fast the machine.
const PACE: &str = "step_begin=sleep:5";

/// `launch --nproc 3 --rendezvous URL -- train ... --out OUT`, started.
fn launch(url: &str, extra: &[&str], out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["launch", "--nproc", "3", "--heartbeat-timeout", "2", "--rendezvous", url, "--"])
        .env("STEADFAST_FAILPOINTS", PACE)
        .args(common::SMALL_MLP)
        .args(["--reduce", "reproducible"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for_step(out: &Path, step: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::steps_recorded(out).last().is_none_or(|&s| s < step) {
        assert!(Instant::now() < deadline, "training did not reach step {step}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn workers_meet_in_etcd_without_a_coordinator_and_ride_out_its_loss_and_return() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut etcd) = Etcd::start(dir.path()) else { return };
    let steps = ["--steps", "1200"];
    let single = common::fingerprint(&common::steadfast(
        &[
            common::SMALL_MLP,
            &["--reduce", "reproducible"],
            &steps,
            &["--out", dir.path().join("single").to_str().unwrap()],
        ]
        .concat(),
    ));
    let out = dir.path().join("job");
    let job = launch(&etcd.url("survives-etcd"), &steps, &out);
    wait_for_step(&out, 50);
    // etcd goes away for longer than the leases' time to live, and comes back.
    etcd.kill();
    std::thread::sleep(Duration::from_secs(3));
    etcd.restart();
    let result = job.wait_with_output().unwrap();
    let log = text(&result);
    assert!(result.status.success(), "{log}");
    assert!(log.contains("is unreachable"), "the workers noticed that etcd was gone:\n{log}");
    assert!(log.contains("is reachable again"), "{log}");
    assert_eq!(common::fingerprints_in(&log), vec![single; 3], "{log}");
    assert!(!log.contains("[coordinator]"), "no coordinator took part");
}

#[test]
fn a_worker_whose_lease_expires_is_reported_lost_by_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_etcd) = Etcd::start(dir.path()) else { return };
    let out = dir.path().join("job");
    let url = _etcd.url("lease-expires");
    let job = launch(&url, &["--steps", "1000000"], &out);
    wait_for_step(&out, 20);
    // Rank 2's process: a child of the launcher with rank 2 in its environment.
    let rank2 = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env = String::from_utf8_lossy(&env);
            env.split('\0').any(|v| v == "STEADFAST_RANK=2") && env.contains("lease-expires")
        })
        .expect("rank 2's process");
    assert!(Command::new("kill").args(["-STOP", &rank2.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    let result = job.wait_with_output().unwrap();
    let waited = stopped.elapsed();
    let _ = Command::new("kill").args(["-9", &rank2.to_string()]).output();
    let log = text(&result);
    assert!(!result.status.success(), "{log}");
    for rank in [0, 1] {
        let line = format!("[{rank}] error: training failed: rank 2 was lost: its lease in etcd expired");
        assert!(log.contains(&line), "rank {rank} names rank 2:\n{log}");
    }
    // The lease's 2 s, then the launcher's grace for the stopped process.
    assert!(waited < Duration::from_secs(15), "the job took {waited:?} to fail:\n{log}");
}

#[test]
fn bad_rendezvous_settings_and_a_rank_already_taken_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let train = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
        c.args(common::SMALL_MLP).args(["--steps", "2", "--out", out]).args(extra).env("STEADFAST_SECRET", "s");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    for (extra, expected) in [
        (
            &["--rank", "0", "--world-size", "2", "--rendezvous", "http://127.0.0.1:1/j"][..],
            "does not start with etcd://",
        ),
        (&["--rank", "0", "--world-size", "2", "--rendezvous", "etcd://127.0.0.1:1"][..], "names no job"),
        (&["--rank", "0", "--world-size", "2", "--rendezvous", "etcd://127.0.0.1:1/j?ttl=0"][..], "at least 1 second"),
        (
            &[
                "--rank",
                "0",
                "--world-size",
                "2",
                "--rendezvous",
                "etcd://127.0.0.1:1/j",
                "--coordinator",
                "127.0.0.1:2",
            ][..],
            "give one",
        ),
    ] {
        let r = train(extra, &[]);
        assert!(!r.status.success(), "{extra:?} was accepted");
        assert!(String::from_utf8_lossy(&r.stderr).contains(expected), "{extra:?}: {}", text(&r));
    }
    let Some(etcd) = Etcd::start(dir.path()) else { return };
    // Rank 0 of a world of 2 waits for rank 1; a second rank 0 is refused at once.
    let url = etcd.url("taken");
    let args = ["--rank", "0", "--world-size", "2", "--rendezvous", url.as_str(), "--comm-timeout", "5"];
    let mut first = Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(common::SMALL_MLP)
        .args(["--steps", "2", "--out", out])
        .args(args)
        .env("STEADFAST_SECRET", "s")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let second = train(&args, &[]);
    let _ = first.kill();
    let _ = first.wait();
    assert!(!second.status.success());
    assert!(text(&second).contains("rank 0 of job \"taken\" is already taken in etcd"), "{}", text(&second));
}

/// A process whose output goes to a file, so that a test can read it while it runs.
struct Logged {
    child: Child,
    log: PathBuf,
}

impl Logged {
    fn start(command: &mut Command, log: PathBuf) -> Logged {
        let file = std::fs::File::create(&log).unwrap();
        let child = command.stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap();
        Logged { child, log }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the output contains `what`.
    fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.text().contains(what) {
            assert!(Instant::now() < deadline, "no {what:?} in:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the end; true on success.
    fn wait(mut self) -> (bool, String) {
        let status = self.child.wait().unwrap();
        (status.success(), self.text())
    }

    /// SIGKILL of the process and its children (a launcher and its workers: a node lost).
    fn kill_with_children(&mut self) {
        let kids = common::children(self.child.id());
        let _ = self.child.kill();
        for pid in kids {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_with_children();
        }
    }
}

const ELASTIC_STEPS: &str = "2000";
/// The pipeline job's node is back about 100 steps in (70 after it was started again, at
/// 80 steps a second on 2 idle cores): 800 leave room for a loaded machine.
const PIPELINE_STEPS: &str = "800";

fn single_process_fingerprint(dir: &Path, steps: &str) -> String {
    let out = dir.join("single");
    common::fingerprint(&common::steadfast(
        &[common::SMALL_MLP, &["--reduce", "reproducible", "--steps", steps], &["--out", out.to_str().unwrap()]]
            .concat(),
    ))
}

/// `launch` of node `node` of two (two workers each), electing the coordinator in etcd.
fn elastic_node(url: &str, node: usize, dir: &Path, log: &str) -> Logged {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
    c.env("STEADFAST_FAILPOINTS", PACE);
    c.args(["launch", "--nnodes", "2", "--node-rank", &node.to_string(), "--nproc-per-node", "2"])
        .args(["--rendezvous", url, "--heartbeat-timeout", "2", "--max-restarts", "2", "--min-nproc", "2", "--"])
        .args(common::SMALL_MLP)
        .args(["--reduce", "reproducible", "--steps", ELASTIC_STEPS, "--out"])
        .arg(dir.join(format!("node{node}")))
        .env("STEADFAST_SECRET", "elastic-etcd");
    Logged::start(&mut c, dir.join(log))
}

#[test]
fn an_elastic_job_elects_its_coordinator_in_etcd_and_outlives_etcd_and_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut etcd) = Etcd::start(dir.path()) else { return };
    let single = single_process_fingerprint(dir.path(), ELASTIC_STEPS);
    let url = etcd.url("elastic-nodes");
    // Node 1 starts first and takes the coordinator role; node 0's worker 0 logs the steps.
    let mut holder = elastic_node(&url, 1, dir.path(), "node1.log");
    holder.wait_for("holds the coordinator role (generation 0)");
    let node0 = elastic_node(&url, 0, dir.path(), "node0.log");
    let steps = dir.path().join("node0");
    wait_for_step(&steps, 40);
    // etcd goes away for longer than the leases' time to live, and comes back: nobody
    // can be elected meanwhile, so the holder keeps the role and the job goes on.
    etcd.kill();
    std::thread::sleep(Duration::from_secs(3));
    etcd.restart();
    let now = common::steps_recorded(&steps).last().copied().unwrap_or(0);
    wait_for_step(&steps, now + 40);
    // The holder's node is lost (its launcher and workers killed): node 0's launcher is
    // elected, and the job goes on with node 0's two workers.
    holder.kill_with_children();
    node0.wait_for("holds the coordinator role (generation 1)");
    node0.wait_for("workers [2, 3] left");
    let now = common::steps_recorded(&steps).last().copied().unwrap_or(0);
    wait_for_step(&steps, now + 40);
    // The node comes back with the same command, joins, and fetches the state.
    let back = elastic_node(&url, 1, dir.path(), "node1-again.log");
    let (ok0, log0) = node0.wait();
    let (ok1, log1) = back.wait();
    let first = holder.text();
    assert!(ok0 && ok1, "{log0}\n{log1}");
    assert!(!first.contains("lost the coordinator role"), "etcd's absence cost no role:\n{first}");
    // (The returning workers may join one epoch each.)
    let joined = log0.lines().rfind(|l| l.contains("joined at step")).unwrap_or_default();
    assert!(joined.contains(": 4 workers)"), "both returned:\n{log0}");
    assert_eq!(common::fingerprints_in(&log0), vec![single.clone(); 2], "{log0}");
    assert_eq!(common::fingerprints_in(&log1), vec![single; 2], "{log1}");
    // A node started again after the end (its outcome is in etcd): its workers have
    // nothing to do, say so, print no fingerprint, and the node ends well.
    let late = elastic_node(&url, 1, dir.path(), "node1-late.log");
    let (ok, late) = late.wait();
    assert!(ok, "{late}");
    assert!(late.contains("the job had finished before this process joined"), "{late}");
    assert!(common::fingerprints_in(&late).is_empty(), "{late}");
    // Node 0's directory has the job's record from its launcher's election on: the
    // holder's node lost (workers 2 and 3, whom the new coordinator never knew: the steps'
    // writer saw them leave) as a recovery, the node's return as joins.
    let node0 = dir.path().join("node0");
    let record = std::fs::read_to_string(node0.join("events.jsonl")).unwrap();
    assert!(record.starts_with("{\"kind\":\"elected\","), "{record}");
    assert!(record.contains("\"generation\":1,"), "{record}");
    let report = common::steadfast(&["report", node0.to_str().unwrap()]);
    assert!(report.status.success(), "{}", text(&report));
    let page = std::fs::read_to_string(node0.join("report.html")).unwrap();
    // One recovery, from the election to the first step again, with the node's workers.
    let moved = "<td>the coordinator moved (node 0, generation 1): ";
    let why = page.split(moved).nth(1).unwrap_or_else(|| panic!("{page}"));
    assert!(why.split("</td>").next().unwrap().contains("workers [2, 3] left"), "{page}");
    assert!(page.contains("2000 steps in "), "{page}");
}

#[test]
fn standby_coordinators_take_over_in_etcd_and_a_worker_stopped_past_its_lease_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = Etcd::start(dir.path()) else { return };
    let single = single_process_fingerprint(dir.path(), ELASTIC_STEPS);
    let url = etcd.url("elastic-standby");
    let coordinator = |log: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
        c.args(["coordinator", "--elastic", "--world-size", "3", "--bind", "127.0.0.1:0", "--rendezvous", &url])
            .args(["--heartbeat-timeout", "2", "--timeout", "60"])
            .env("STEADFAST_SECRET", "standby");
        Logged::start(&mut c, dir.path().join(log))
    };
    let mut first = coordinator("first.log");
    first.wait_for("holds the coordinator role (generation 0)");
    let standby = coordinator("standby.log");
    standby.wait_for("campaigning");
    let workers: Vec<Logged> = (0..3)
        .map(|rank| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
            c.env("STEADFAST_FAILPOINTS", PACE)
                .args(common::SMALL_MLP)
                .args(["--reduce", "reproducible", "--steps", ELASTIC_STEPS, "--elastic", "--world-size", "3"])
                .args(["--rank", &rank.to_string(), "--rendezvous", &url, "--out"])
                .arg(dir.path().join(format!("w{rank}")))
                .env("STEADFAST_SECRET", "standby");
            Logged::start(&mut c, dir.path().join(format!("w{rank}.log")))
        })
        .collect();
    let steps = dir.path().join("w0");
    wait_for_step(&steps, 40);
    // The holder of the role is killed: the standby is elected and rebuilds the
    // membership from the workers' reports; no worker is lost.
    first.kill_with_children();
    standby.wait_for("holds the coordinator role (generation 1)");
    standby.wait_for("workers [0, 1, 2] from step");
    let now = common::steps_recorded(&steps).last().copied().unwrap_or(0);
    wait_for_step(&steps, now + 40);
    // Worker 2 is stopped past its lease and continued: the job went on without it, and
    // it finds itself out of the membership and rejoins, fetching the state.
    let pid = workers[2].child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    standby.wait_for("worker 2 lost");
    std::thread::sleep(Duration::from_secs(3));
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let mut logs = Vec::new();
    for w in workers {
        let (ok, log) = w.wait();
        assert!(ok, "{log}");
        logs.push(log);
    }
    let (ok, said) = standby.wait();
    assert!(ok, "{said}");
    assert!(said.contains("[2] fetch the state"), "worker 2 rejoined:\n{said}");
    assert!(logs[2].contains("lease in etcd expired while it was not running"), "{}", logs[2]);
    for log in &logs {
        assert_eq!(common::fingerprints_in(log), vec![single.clone()], "{log}");
    }
}

/// `launch` of node `node` of a pipeline job of two nodes, each one replica of two stages,
/// electing the coordinator in etcd.
fn pipeline_node(url: &str, node: usize, dir: &Path, log: &str) -> Logged {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
    c.env("STEADFAST_FAILPOINTS", PACE);
    c.args(["launch", "--nnodes", "2", "--node-rank", &node.to_string(), "--nproc-per-node", "2"])
        .args(["--rendezvous", url, "--heartbeat-timeout", "2", "--max-restarts", "2", "--min-nproc", "2", "--"])
        .args(common::SMALL_MLP)
        .args(["--reduce", "reproducible", "--steps", PIPELINE_STEPS, "--pipeline-stages", "2", "--out"])
        .arg(dir.join(format!("node{node}")))
        .env("STEADFAST_SECRET", "pipeline-etcd");
    Logged::start(&mut c, dir.join(log))
}

#[test]
fn a_pipeline_job_elects_its_coordinator_in_etcd_and_gets_back_the_holder_s_node() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = Etcd::start(dir.path()) else { return };
    let single = single_process_fingerprint(dir.path(), PIPELINE_STEPS);
    let url = etcd.url("pipeline-nodes");
    // Node 1 (replica 1: workers 2 and 3) takes the coordinator role; node 0's worker 1,
    // the last stage of replica 0, logs the steps.
    let mut holder = pipeline_node(&url, 1, dir.path(), "node1.log");
    holder.wait_for("holds the coordinator role (generation 0)");
    let node0 = pipeline_node(&url, 0, dir.path(), "node0.log");
    let steps = dir.path().join("node0");
    wait_for_step(&steps, 40);
    // The holder's node is lost: node 0's launcher is elected, and its two workers go on,
    // each computing replica 1's micro-batches of its stage too.
    holder.kill_with_children();
    node0.wait_for("holds the coordinator role (generation 1)");
    node0.wait_for("workers [2, 3] left");
    let now = common::steps_recorded(&steps).last().copied().unwrap_or(0);
    wait_for_step(&steps, now + 40);
    // The node comes back with the same command: its workers fetch their stages' states.
    let back = pipeline_node(&url, 1, dir.path(), "node1-again.log");
    let (ok0, log0) = node0.wait();
    let (ok1, log1) = back.wait();
    assert!(ok0 && ok1, "{log0}\n{log1}");
    assert!(log0.contains("fetch their stages' states"), "{log0}");
    assert_eq!(common::fingerprints_in(&log0), vec![single.clone(); 2], "{log0}");
    assert_eq!(common::fingerprints_in(&log1), vec![single; 2], "{log1}");
}
