//! Node 0 of an elastic job of two nodes (`launch --nnodes 2 --coordinator ...`, no etcd)
//! is killed with SIGKILL, its coordinator with it. Node 1's worker says at once that the
//! coordinator is unreachable and until when it waits for it, and gives up after the
//! job's `--heartbeat-timeout` and `--quorum-timeout`, measured from the coordinator's last
//! word. It used to say nothing for about seven minutes, whatever the flags, and then
//! misstate how long it had waited.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{SMALL_MLP, free_port, steps_recorded};

const SECRET: &str = "coordinator-lost-secret";

/// One node's launcher, with each line of its output and when it came.
struct Node {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Node {
    fn start(rank: usize, coordinator: &str, out: &Path) -> Node {
        let rank = rank.to_string();
        let mut args = vec![
            "launch",
            "--nnodes",
            "2",
            "--node-rank",
            rank.as_str(),
            "--nproc-per-node",
            "1",
            "--coordinator",
            coordinator,
            "--max-restarts",
            "1",
            "--min-nproc",
            "1",
            "--heartbeat-timeout",
            "1",
            "--quorum-timeout",
            "2",
            "--",
        ];
        args.extend(SMALL_MLP);
        args.extend(["--steps", "1000000", "--comm-timeout", "2", "--out", out.to_str().unwrap()]);
        let (child, lines) = common::spawn_streamed(&args, SECRET);
        Node { child, lines }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn losing_node_0_is_said_at_once_and_the_other_node_gives_up_at_the_flags_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let coordinator = format!("127.0.0.1:{}", free_port());
    let node0 = Node::start(0, &coordinator, &tmp.path().join("n0"));
    let mut node1 = Node::start(1, &coordinator, &tmp.path().join("n1"));
    let started = Instant::now();
    while steps_recorded(&tmp.path().join("n0")).last().is_none_or(|&s| s < 20) {
        assert!(started.elapsed() < Duration::from_secs(60), "the job never reached step 20");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Node 0 goes: its launcher (and so the coordinator) at once, its worker moments later
    // (a worker ends when its launcher is gone).
    assert!(Command::new("kill").args(["-KILL", &node0.child.id().to_string()]).status().unwrap().success());
    let killed = Instant::now();
    let ended = loop {
        if node1.child.try_wait().unwrap().is_some() {
            break killed.elapsed();
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "node 1 still runs 30 s after node 0 was killed");
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines: Vec<(Instant, String)> =
        std::iter::from_fn(|| node1.lines.recv_timeout(Duration::from_secs(2)).ok()).collect();
    let text = lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n");
    // Said at once: the coordinator's connection closed with its process.
    let (said, warning) = lines
        .iter()
        .find(|(_, l)| l.contains(&format!("the coordinator at {coordinator} is unreachable: its connection closed")))
        .unwrap_or_else(|| panic!("the loss was never said:\n{text}"));
    let after = said.saturating_duration_since(killed);
    assert!(after < Duration::from_secs(2), "the loss was said {after:?} after the kill:\n{text}");
    assert!(warning.contains(" UTC (") && warning.contains("then gives up unless it comes back"), "{warning}");
    assert!(warning.contains("heartbeat timeout of 1.0 s and quorum timeout of 2.0 s"), "{warning}");
    // Given up at the bound the flags give (1 + 2 s after the last word), saying how long
    // it waited; node 1's launcher then ends its part of the job.
    assert!(
        text.contains(&format!("no word from the coordinator at {coordinator} for 3.")),
        "the wait did not end at the flags' bound:\n{text}"
    );
    assert!(text.contains("past its heartbeat timeout (1.0 s) and quorum timeout (2.0 s)"), "{text}");
    // (The launcher gives its other workers a grace before it ends.)
    assert!(ended < Duration::from_secs(15), "node 1 ended {ended:?} after the kill:\n{text}");
    assert!(!node1.child.wait().unwrap().success(), "{text}");
}
