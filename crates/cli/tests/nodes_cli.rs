//! `steadfast launch` across nodes, as torchrun users run it: one launcher per node, on
//! loopback here (across network namespaces in `multihost.rs`), configured by flags or by
//! the `PET_*` variables that Kubeflow's trainer sets, and the bad settings it refuses.

use std::process::{Command, Output};

mod common;

/// The small MLP in the reproducible mode: the same bits on any number of ranks.
fn job(out: &str) -> Vec<&str> {
    [common::SMALL_MLP, &["--steps", "12", "--reduce", "reproducible", "--out", out]].concat()
}

/// The `[rank] fingerprint: ...` lines of a launcher's output, as (rank, fingerprint).
fn ranked_fingerprints(out: &Output) -> Vec<(usize, String)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .filter_map(|l| {
            let (rank, fp) = l.strip_prefix('[')?.split_once("] fingerprint: ")?;
            Some((rank.parse().ok()?, fp.split_whitespace().next()?.to_owned()))
        })
        .collect()
}

#[test]
fn two_launchers_set_up_by_pet_variables_give_the_single_process_bits() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let single = common::fingerprint(&common::steadfast(&job(&path("single"))));
    let outputs = common::launch_pet_nodes(&job(&path("job")), 2, "2", Some("nodes-test-secret"));
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
            "needs STEADFAST_SECRET",
        ),
        (
            &[
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--coordinator",
                "127.0.0.1:1",
                "--max-restarts",
                "1",
                "--recovery",
                "checkpoint",
            ],
            &[("STEADFAST_SECRET", "s")],
            "restarts the job on one node",
        ),
        (
            &["--nnodes", "2:1", "--nproc-per-node", "1", "--coordinator", "127.0.0.1:1", "--max-restarts", "1"],
            &[("STEADFAST_SECRET", "s")],
            "the most nodes are fewer than the least",
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
        c.arg("launch").args(*flags).arg("--").args(job(out)).env_remove("STEADFAST_SECRET");
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
