//! The short, seeded form of `scripts/chaos.sh`: one trial of each kind of blow from
//! outside (SIGKILL of one and of two workers, SIGSTOP of a worker with and without
//! SIGCONT, of the launcher with SIGCONT and with a SIGKILL after, a cut link between
//! namespace hosts, a full disk under the checkpoint directory), each checked against the
//! single-process fingerprint. The kinds that need root (namespaces, tmpfs) are skipped
//! where it is not; the long form (`scripts/chaos.sh 200 SEED`) is a benchmark, not a test.

use std::process::Command;

mod common;

#[test]
fn one_trial_of_each_kind_of_chaos_ends_with_the_single_process_bits() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/chaos.sh"))
        .args(["11", "3"])
        .env("BIN", env!("CARGO_BIN_EXE_steadfast"))
        // Long enough that the blows land inside the job: at 200 steps it could end (0.4 s
        // on the 2-core machine) before a blow drawn for its first half arrived.
        .env("STEPS", "400")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
    for line in text.lines().filter(|l| l.contains("skipped (cannot run here)")) {
        common::skip(line.trim());
    }
    let ran = text.lines().filter(|l| l.contains(" ok ")).count();
    assert!(ran >= 6, "only {ran} trials ran:\n{text}");
}
