//! Hosts as network namespaces on one machine (`scripts/netns-hosts.sh`): one training job
//! across three hosts, one host's link cut in the middle, the survivors reporting the
//! failure within the bound; a two-node `launch` as torchrun users run it, giving the
//! single-process bits; and an elastic job of three nodes that loses a node (killed, then
//! started again) or a node's link, or the host of its coordinator (a coordinator started
//! on another host takes over), and ends with the single-process bits; and a pipeline job
//! over two hosts (a replica on each, or a stage on each) that loses a host and gets it
//! back, or goes on without it, with the single-process bits. Skipped where
//! namespaces cannot be made (not root, or a sandbox without them). The scripts run one at
//! a time: each times heartbeats, which a neighbour's load would only blur.

use std::process::Command;

mod common;

/// Runs `scripts/NAME` on the built binary; its output when it passed, `None` when it
/// cannot run here (skipped); panics when it failed.
fn run_script(name: &str) -> Option<String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if !is_root || !has_ip {
        common::skip("needs root and iproute2");
        return None;
    }
    let out = Command::new("bash")
        .arg(root.join("scripts").join(name))
        .arg(env!("CARGO_BIN_EXE_steadfast"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(77) => {
            common::skip(&text);
            None
        }
        Some(0) => Some(text),
        _ => panic!("{name} failed:\n{text}"),
    }
}

#[test]
fn cutting_a_hosts_link_fails_the_survivors_within_the_bound() {
    if let Some(text) = run_script("netns-cut-test.sh") {
        assert_eq!(text.matches("ok: rank").count(), 2, "{text}");
    }
}

#[test]
fn a_two_node_launch_gives_the_single_process_bits_and_fails_together() {
    if let Some(text) = run_script("netns-launch-test.sh") {
        assert_eq!(text.matches("printed the single-process fingerprint").count(), 4, "{text}");
        assert!(text.contains("ok: rank 3's crash failed both nodes"), "{text}");
    }
}

#[test]
fn an_elastic_job_of_three_nodes_survives_a_lost_node_and_a_cut_link_with_the_single_process_bits() {
    if let Some(text) = run_script("netns-elastic-test.sh") {
        // Host 2 killed and started again: all six workers; host 1 cut off: the four others.
        assert_eq!(text.matches("ok: kill: worker").count(), 6, "{text}");
        assert_eq!(text.matches("fetched the state from the live replicas").count(), 2, "{text}");
        assert_eq!(text.matches("ok: cut: worker").count(), 4, "{text}");
        // Each node's launcher says, once, that host 2's workers left and came back.
        assert_eq!(text.matches("launcher says: ").count(), 2, "{text}");
        // The coordinator's host lost and a coordinator started on another: both workers.
        assert_eq!(text.matches("ok: failover: the worker").count(), 2, "{text}");
        assert!(text.contains("ok: failover: the coordinator on host 1 saw the job finish"), "{text}");
    }
}

#[test]
fn a_pipeline_job_over_two_hosts_gets_a_lost_host_back_or_goes_on_without_it_with_the_single_process_bits() {
    if let Some(text) = run_script("netns-pipeline-test.sh") {
        // Host 1 (replica 1) killed at a drawn step and started again: all four workers,
        // its two fetching their stages' states from host 0's.
        assert_eq!(text.matches("ok: kill: worker").count(), 4, "{text}");
        assert!(text.contains("ok: host 1's new workers fetched their stages' states from host 0's"), "{text}");
        // Host 1 lost for good: host 0's workers finish the job, computing its micro-batches.
        assert_eq!(text.matches("ok: shrink: worker").count(), 2, "{text}");
        // A stage of both replicas on each host (--place stages): host 1 lost with stage
        // 1's state in every replica, which its new workers replay on stage 0's logs, and
        // all four workers end with the bits.
        assert!(text.contains("ok: stage 1's state was lost with host 1: its workers [1, 3] replay it"), "{text}");
        assert_eq!(text.matches("ok: stage: worker").count(), 4, "{text}");
    }
}
