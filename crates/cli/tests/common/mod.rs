//! Helpers shared by the tests that run the `steadfast` binary.
#![allow(dead_code)]

use std::process::{Command, Output};

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
    stdout.lines().find_map(|l| l.split("fingerprint: ").nth(1)).expect("a fingerprint line").trim().to_owned()
}
