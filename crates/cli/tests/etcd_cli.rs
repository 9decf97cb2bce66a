//! Jobs that meet in etcd (`--rendezvous etcd://HOST:PORT/JOB`), against Debian's
//! `etcd-server` started by the test: no coordinator process; the loss and return of the
//! etcd server in the middle of training changes nothing; a worker whose lease expires
//! (stopped, so its keep-alives stop) is reported lost by the others; bad addresses and a
//! rank already taken are refused.

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

/// `launch --nproc 3 --rendezvous URL -- train ... --out OUT`, started.
fn launch(url: &str, extra: &[&str], out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["launch", "--nproc", "3", "--heartbeat-timeout", "2", "--rendezvous", url, "--"])
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
        (&["--rank", "0", "--world-size", "2", "--elastic", "--rendezvous", "etcd://127.0.0.1:1/j"][..], "not in etcd"),
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
