//! A running job seen from outside: a process with a wrong secret stops at its first
//! refusal and cannot flood the coordinator's log however often it tries, and a launcher
//! given `--coordinator` on one node listens there and says so, so that a worker started
//! by hand joins its job.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::SMALL_MLP;

const EXE: &str = env!("CARGO_BIN_EXE_steadfast");

/// One frame as the job's sockets carry it: the length of what follows (u32 LE), the
/// kind, the payload (`comm::frame`).
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(payload.len() + 1).unwrap().to_le_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(payload);
    f
}

/// One attempt of a stranger who does not hold the job's secret: the handshake's hello
/// (this build's version, a rank, a nonce) and a proof made without the secret (`comm::handshake`),
/// then the coordinator's answer is read and the connection closed.
fn handshake_without_the_secret(addr: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = [&comm::handshake::VERSION.to_le_bytes()[..], &1u32.to_le_bytes(), &[7u8; 32]].concat();
    s.write_all(&frame(0xA1, &hello)).unwrap();
    let mut theirs = [0u8; 5 + 38];
    s.read_exact(&mut theirs).unwrap();
    s.write_all(&frame(0xA2, &[0u8; 32])).unwrap();
    let mut proof = [0u8; 5 + 32];
    let _ = s.read_exact(&mut proof);
}

/// Reads `pipe` to its end on a thread of its own (so that a chatty process never blocks
/// on a full pipe); the text comes back on join.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

#[test]
fn a_wrong_secret_stops_at_once_and_the_coordinator_logs_its_refusals_in_a_line_or_two() {
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("coordinator.log");
    let mut coordinator = Command::new(EXE)
        .args(["coordinator", "--elastic", "--bind", "127.0.0.1:0", "--world-size", "2"])
        .args(["--timeout", "300", "--quorum-timeout", "300"])
        .env("STEADFAST_SECRET", "the-job-secret")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut announced = BufReader::new(coordinator.stdout.take().unwrap());
    let mut first = String::new();
    announced.read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("coordinator listening on ").unwrap_or_else(|| panic!("{first:?}")).to_owned();
    let _rest = drain(announced);

    // A worker with a wrong secret: refused at the first attempt, it says why and exits.
    // (It used to dial again about 600 times a second for 30 s.)
    let out = tmp.path().join("stranger");
    let started = Instant::now();
    let stranger = Command::new(EXE)
        .args(SMALL_MLP)
        .args(["--steps", "5", "--out", out.to_str().unwrap()])
        .args(["--elastic", "--rank", "1", "--world-size", "2", "--coordinator", &addr])
        .env("STEADFAST_SECRET", "wrong")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&stranger.stderr);
    assert!(!stranger.status.success(), "{stderr}");
    assert!(stderr.contains("the secret does not match the job's"), "{stderr}");
    assert!(stderr.contains(&addr), "{stderr}");
    assert!(took < Duration::from_secs(10), "the stranger took {took:?} to give up: {stderr}");

    // However often a stranger tries, the coordinator's log gets a line or two, not one
    // per attempt.
    let attempts = 300;
    for _ in 0..attempts {
        handshake_without_the_secret(&addr);
    }
    std::thread::sleep(Duration::from_millis(300));
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    assert!(!refusals.is_empty(), "the first refusal is told: {log}");
    assert!(refusals[0].contains("failed to prove knowledge of the job secret"), "{log}");
    assert!(refusals.len() <= 3, "{} lines for {} refusals:\n{log}", refusals.len(), attempts + 1);
}

#[test]
fn a_launcher_given_a_coordinator_address_on_one_node_listens_there_and_a_worker_started_by_hand_joins() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let secret = "launch-coordinator-secret";
    let steps = "1500";
    let mut launcher = Command::new(EXE)
        .args(["launch", "--nproc", "2", "--max-restarts", "1", "--heartbeat-timeout", "1", "--coordinator", &addr])
        .arg("--")
        .args(SMALL_MLP)
        .args(["--reduce", "reproducible", "--steps", steps, "--out", &path("launched")])
        .env("STEADFAST_SECRET", secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = drain(launcher.stderr.take().unwrap());
    let mut stdout = BufReader::new(launcher.stdout.take().unwrap());
    // The launcher names where its coordinator listens before any worker starts (it used
    // to listen on a random loopback port and say nothing).
    let mut first = String::new();
    while !first.contains("coordinator listening on ") {
        first.clear();
        assert!(stdout.read_line(&mut first).unwrap() > 0, "the launcher never said where it listens");
        assert!(!first.contains("worker 0 started"), "workers started before the address was said: {first:?}");
    }
    assert!(first.contains(&format!(":{port}")) && first.contains(&addr), "{first:?}");
    let stdout = drain(stdout);
    // Something really listens there.
    drop(TcpStream::connect(&addr).unwrap_or_else(|e| panic!("nothing listens on {addr}: {e}")));

    // A worker started by hand with the job's secret joins the running job.
    let hand = Command::new(EXE)
        .args(SMALL_MLP)
        .args(["--reduce", "reproducible", "--steps", steps, "--out", &path("hand")])
        .args(["--elastic", "--rank", "2", "--world-size", "2", "--coordinator", &addr])
        .env("STEADFAST_SECRET", secret)
        .output()
        .unwrap();
    let hand_text = format!("{}\n{}", String::from_utf8_lossy(&hand.stdout), String::from_utf8_lossy(&hand.stderr));
    assert!(hand.status.success(), "{hand_text}");
    let status = launcher.wait().unwrap();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(status.success(), "{first}{stdout}\n{stderr}");
    assert!(stdout.contains("worker 2 joined"), "{stdout}");
    // The three hold the same final state.
    let hand_fingerprint = common::fingerprints_in(&hand_text);
    assert_eq!(hand_fingerprint.len(), 1, "{hand_text}");
    assert_eq!(common::fingerprints_in(&stdout), vec![hand_fingerprint[0].clone(); 2], "{stdout}");
}
