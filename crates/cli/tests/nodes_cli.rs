//! `steadfast launch` across nodes, as torchrun users run it: one launcher per node, on
//! loopback here (across network namespaces in `multihost.rs`), configured by flags or by
//! the `PET_*` variables that Kubeflow's trainer sets, and the bad settings it refuses.

use std::process::{Command, Output, Stdio};

mod common;

const JOB: &[&str] = &[
    "train",
    "--model",
    "mlp",
    "--data",
    "synthetic",
    "--steps",
    "12",
    "--batch",
    "64",
    "--micro-batch",
    "16",
    "--reduce",
    "reproducible",
    "--eval-every",
    "0",
];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `launch -- JOB --out OUT` with `env`, started (not waited for).
fn launcher(env: &[(&str, String)], out: &std::path::Path) -> std::process::Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
    c.args(["launch", "--"]).args(JOB).arg("--out").arg(out);
    c.env("STEADFAST_SECRET", "nodes-test-secret");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start launch")
}

/// The `[rank] fingerprint: ...` lines of a launcher's output, as (rank, fingerprint).
fn ranked_fingerprints(out: &Output) -> Vec<(usize, String)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .filter_map(|l| {
            let (rank, fp) = l.strip_prefix('[')?.split_once("] fingerprint: ")?;
            Some((rank.parse().ok()?, fp.trim().to_owned()))
        })
        .collect()
}

#[test]
fn two_launchers_set_up_by_pet_variables_give_the_single_process_bits() {
    let dir = tempfile::tempdir().unwrap();
    let single = common::fingerprint(&common::steadfast(&[JOB, &["--out", dir.path().to_str().unwrap()]].concat()));
    let port = free_port().to_string();
    let nodes: Vec<_> = (0..2)
        .map(|node| {
            let env = [
                ("PET_NNODES", "2".to_owned()),
                ("PET_NODE_RANK", node.to_string()),
                ("PET_NPROC_PER_NODE", "2".to_owned()),
                ("PET_MASTER_ADDR", "127.0.0.1".to_owned()),
                ("PET_MASTER_PORT", port.clone()),
            ];
            launcher(&env, &dir.path().join(format!("node{node}")))
        })
        .collect();
    let outputs: Vec<Output> = nodes.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (node, out) in outputs.iter().enumerate() {
        let mut got = ranked_fingerprints(out);
        got.sort();
        let expected: Vec<(usize, String)> = (node * 2..node * 2 + 2).map(|r| (r, single.clone())).collect();
        assert_eq!(got, expected, "node {node} runs ranks {} and {} of 4", node * 2, node * 2 + 1);
    }
}

#[test]
fn bad_node_settings_are_refused_before_any_worker_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // (launch flags, environment, what the error says)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--nnodes", "2", "--nproc-per-node", "1"], &[], "needs the coordinator's address"),
        (
            &["--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "--coordinator", "127.0.0.1:1"],
            &[],
            "--node-rank 2 is not one of the 2 nodes",
        ),
        (&["--nnodes", "1:4", "--nproc-per-node", "1"], &[], "range of nodes"),
        (&["--nproc-per-node", "many"], &[], "neither a number of processes nor auto"),
        (
            &["--nnodes", "2", "--nproc-per-node", "1", "--coordinator", "127.0.0.1:1", "--max-restarts", "1"],
            &[],
            "run on one node",
        ),
        (
            &["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--coordinator", "127.0.0.1:1"],
            &[("STEADFAST_SECRET", "")],
            "needs STEADFAST_SECRET",
        ),
        (&["--nproc-per-node", "1"], &[("PET_NNODES", "2")], "needs the coordinator's address"),
        (
            &["--nnodes", "2", "--nproc-per-node", "1", "--coordinator", "no-port"],
            &[("STEADFAST_SECRET", "s")],
            "not HOST:PORT",
        ),
    ];
    for (flags, env, expected) in cases {
        let mut c = Command::new(env!("CARGO_BIN_EXE_steadfast"));
        c.arg("launch").args(*flags).arg("--").args(JOB).args(["--out", out]).env_remove("STEADFAST_SECRET");
        for (k, v) in *env {
            c.env(k, v);
        }
        let result = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(expected), "{flags:?}: expected {expected:?} in {stderr}");
        assert!(!std::path::Path::new(out).join("metrics.jsonl").exists(), "{flags:?}: a worker ran");
    }
}
