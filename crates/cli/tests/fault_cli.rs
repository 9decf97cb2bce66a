//! `--fault`: a process crashes, hangs or loses its links at the named phase of a step.
//! A single process shows where each phase lies (by the steps it recorded); a
//! data-parallel job shows that a fault at every phase is caught within the bound.

mod common;

use std::time::{Duration, Instant};

use common::{SMALL_MLP, steadfast, steps_recorded};

#[test]
fn a_crash_lands_in_the_named_phase_of_the_named_step() {
    let tmp = tempfile::tempdir().unwrap();
    // (phase, the last step recorded): the update of step 3 makes step count 4.
    for (phase, last) in
        [("forward", 3), ("backward", 3), ("allreduce", 3), ("vote", 3), ("update", 3), ("checkpoint", 4)]
    {
        let out = tmp.path().join(phase);
        let ckpt = tmp.path().join(format!("{phase}-ckpt"));
        let fault = format!("crash:rank=0,step=3,phase={phase}");
        let run = steadfast(
            &[
                SMALL_MLP,
                &["--steps", "20", "--out", out.to_str().unwrap(), "--fault", &fault],
                &["--checkpoint-every", "1", "--checkpoint-dir", ckpt.to_str().unwrap()],
            ]
            .concat(),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{phase}: the process should have crashed");
        assert!(stderr.contains("fault injection: crash"), "{phase}: {stderr}");
        assert!(stderr.contains(&format!("phase={phase}")), "{phase}: {stderr}");
        assert_eq!(steps_recorded(&out).last(), Some(&last), "{phase}");
    }
}

#[test]
fn a_fault_at_any_phase_of_a_data_parallel_job_is_caught_within_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    for (fault, says) in [
        ("crash:rank=1,step=4,phase=forward", "rank 1 exited"),
        ("crash:rank=1,step=4,phase=backward", "rank 1 exited"),
        ("crash:rank=1,step=4,phase=allreduce", "rank 1 exited"),
        ("crash:rank=1,step=4,phase=vote", "rank 1 exited"),
        ("crash:rank=1,step=4,phase=update", "rank 1 exited"),
        ("crash:rank=1,step=4,phase=checkpoint", "rank 1 exited"),
        ("cut:rank=1,step=4,phase=allreduce", "rank 1 was killed"),
        ("crash:mtbf=1,seed=5", "exited"),
    ] {
        let out = tmp.path().join(fault.replace([':', ',', '='], "_"));
        let ckpt = out.join("ckpt");
        let started = Instant::now();
        let run = steadfast(
            &[
                &["launch", "--nproc", "3", "--heartbeat-timeout", "2", "--"][..],
                SMALL_MLP,
                &["--steps", "100000", "--out", out.to_str().unwrap(), "--comm-timeout", "5", "--fault", fault],
                &["--checkpoint-every", "1", "--checkpoint-dir", ckpt.to_str().unwrap()],
            ]
            .concat(),
        );
        let elapsed = started.elapsed();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{fault}: the job should fail");
        assert!(elapsed < Duration::from_secs(60), "{fault}: took {elapsed:?}");
        assert!(stderr.contains(says), "{fault}: {stderr}");
        // The survivors say which rank they lost, not that they timed out.
        if fault.contains("rank=1") {
            assert!(
                stderr
                    .lines()
                    .any(|l| l.starts_with("[0]") && (l.contains("rank 1 was lost") || l.contains("lost rank 1"))),
                "{fault}: {stderr}"
            );
        }
    }
}

#[test]
fn a_malformed_fault_is_refused_before_training() {
    let run = steadfast(&[SMALL_MLP, &["--steps", "5", "--fault", "crash:rank=1,step=2,phase=lunch"]].concat());
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown phase \"lunch\""), "{stderr}");
}
