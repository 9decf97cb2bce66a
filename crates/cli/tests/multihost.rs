//! Three hosts as network namespaces, one training job across them, one host's link cut
//! in the middle: the survivors report the failure within the bound. Runs
//! `scripts/netns-cut-test.sh`; skipped where namespaces cannot be made (not root, or a
//! sandbox without them).

use std::process::Command;

mod common;

#[test]
fn cutting_a_hosts_link_fails_the_survivors_within_the_bound() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if !is_root || !has_ip {
        common::skip("needs root and iproute2");
        return;
    }
    let out = Command::new("bash")
        .arg(root.join("scripts/netns-cut-test.sh"))
        .arg(env!("CARGO_BIN_EXE_steadfast"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(77) => common::skip(&text),
        Some(0) => {
            assert_eq!(text.matches("ok: rank").count(), 2, "{text}");
        }
        _ => panic!("multi-host test failed:\n{text}"),
    }
}
