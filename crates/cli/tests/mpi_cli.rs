//! The MPI engine against Debian's Open MPI: `mpirun -n N steadfast train --engine mpi`
//! gives single-process `train`'s bits in `reproducible` mode for every N, and a job that
//! loses a rank resumes from its last checkpoint with the same bits.

mod common;

use common::{SMALL_MLP, fingerprint, have_mpirun, mpirun, steadfast};

/// The 40-step job of every test here, with `extra`.
fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [SMALL_MLP, &["--steps", "40"], extra].concat()
}

/// Every rank's fingerprint lines (each rank prints its summary).
fn fingerprints(out: &std::process::Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    common::fingerprints_in(&stdout)
}

/// A checkpoint directory and an output directory in `dir`, and the reference fingerprint:
/// single-process `train` of the job, reproducible.
fn checkpointed(dir: &tempfile::TempDir) -> (String, String, String) {
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (ckpt, runs) = (path("ckpt"), path("runs"));
    let reference = fingerprint(&steadfast(&with(&["--reduce", "reproducible", "--out", &runs])));
    (ckpt, runs, reference)
}

#[test]
fn mpirun_on_one_to_four_ranks_gives_the_bits_of_single_process_train() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let single = fingerprint(&steadfast(&with(&["--reduce", "reproducible", "--out", out])));
    let mpi = with(&["--reduce", "reproducible", "--engine", "mpi", "--out", out]);
    for n in 1..=4 {
        let prints = fingerprints(&mpirun(n, &mpi));
        assert_eq!(prints.len(), n, "every rank reports");
        assert!(prints.iter().all(|p| *p == single), "{n} ranks: {prints:?}, single process: {single}");
    }
    // Three ranks of one micro-batch each sum at the chunks' owners; the terms sent and the
    // sums gathered as messages (the way across nodes, forced here on one) give the same
    // bits, and a misspelt choice is refused.
    let messages = common::mpirun_with(3, &mpi, &[("STEADFAST_MPI_OWNERS", "messages")]);
    assert_eq!(fingerprints(&messages), vec![single; 3]);
    let wrong = common::mpirun_with(1, &mpi, &[("STEADFAST_MPI_OWNERS", "message")]);
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("STEADFAST_MPI_OWNERS is \"message\""));
}

#[test]
fn deterministic_and_fast_sums_on_mpi_repeat_their_bits_for_a_world_size() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    for mode in ["deterministic", "fast"] {
        let job = with(&["--reduce", mode, "--engine", "mpi", "--out", out]);
        let first = fingerprints(&mpirun(3, &job));
        let second = fingerprints(&mpirun(3, &job));
        assert_eq!(first.len(), 3);
        assert!(first.iter().all(|p| *p == first[0]), "{mode}: the replicas agree: {first:?}");
        assert_eq!(first, second, "{mode}: run to run");
    }
}

#[test]
fn an_mpi_job_that_loses_a_rank_resumes_from_its_last_checkpoint_with_the_same_bits() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, runs, reference) = checkpointed(&dir);
    let (ckpt, runs) = (ckpt.as_str(), runs.as_str());
    let job = with(&[
        "--reduce",
        "reproducible",
        "--engine",
        "mpi",
        "--checkpoint-every",
        "10",
        "--checkpoint-dir",
        ckpt,
        "--out",
        runs,
    ]);
    let crashed: Vec<&str> = job.iter().copied().chain(["--fault", "crash:rank=1,step=25,phase=update"]).collect();
    let out = mpirun(2, &crashed);
    assert!(!out.status.success(), "a rank's crash ends an MPI job");
    let resumed: Vec<&str> = job.iter().copied().chain(["--resume", "latest"]).collect();
    let out = mpirun(2, &resumed);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // Step 20's checkpoint is committed once both ranks have made their parts durable,
    // which the votes of the steps after it tell; a slow disk leaves step 10 the newest.
    assert!(
        stdout.contains("resumed from: step 20") || stdout.contains("resumed from: step 10"),
        "resumes from a checkpoint written before the crash:\n{stdout}"
    );
    assert!(fingerprints(&out).iter().all(|p| *p == reference), "{stdout}");
}

#[test]
fn an_mpi_job_takes_its_place_from_mpi_and_refuses_to_be_elastic() {
    for bad in [
        &["--engine", "mpi", "--rank", "1"][..],
        &["--engine", "mpi", "--elastic"],
        &["--engine", "mpi", "--world-size", "2"],
    ] {
        let out = steadfast(&with(bad));
        assert!(!std::path::Path::new("runs").exists(), "a refused job writes nothing");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("MPI"), "{bad:?}: {err}");
    }
}

/// `steadfast ARGS` with Open MPI allowed to run as root.
fn steadfast_mpi(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(args)
        .envs(common::OMPI_AS_ROOT)
        .output()
        .expect("run steadfast")
}

#[test]
fn launch_restarts_a_failed_mpi_job_from_its_last_checkpoint_with_the_same_bits() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, runs, reference) = checkpointed(&dir);
    let (ckpt, runs) = (ckpt.as_str(), runs.as_str());
    let launch = ["launch", "--engine", "mpi", "--nproc", "3", "--max-restarts", "1", "--save-every", "10"];
    let job = with(&["--reduce", "reproducible", "--out", runs, "--fault", "crash:rank=1,step=25,phase=update"]);
    let args = [&launch[..], &["--save-dir", ckpt, "--"], &job].concat();
    let out = steadfast_mpi(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("restarting every worker from the last checkpoint (restart 1 of 1)"), "{stdout}");
    let prints = fingerprints(&out);
    assert_eq!(prints.len(), 3, "every rank of the restarted job reports:\n{stdout}");
    assert!(prints.iter().all(|p| *p == reference), "{prints:?} against {reference}:\n{stdout}");

    // Without a restart left, the failure is the launcher's, and the checkpoints stay.
    let crash_again = with(&["--reduce", "reproducible", "--out", runs, "--fault", "crash:rank=2,step=5"]);
    let fresh = dir.path().join("fresh");
    let args =
        [&launch[..5], &["--max-restarts", "0", "--save-dir", fresh.to_str().unwrap(), "--"], &crash_again].concat();
    let out = steadfast_mpi(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("failed after 0 restart(s)"), "{stderr}");
}

#[test]
fn launch_refuses_what_an_mpi_job_cannot_do() {
    let job = with(&[]);
    for (flags, says) in [
        (&["--nnodes", "2", "--coordinator", "127.0.0.1:1"][..], "--hostfile"),
        (&["--recovery", "live", "--max-restarts", "1"], "not elastic"),
        (&["--on-failure", "shrink"], "not elastic"),
        (&["--mpirun", "mpirun -n 4"], "process count"),
    ] {
        let args = [&["launch", "--engine", "mpi", "--nproc", "2"][..], flags, &["--"], &job].concat();
        let out = steadfast(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{flags:?}: {err}");
    }
    let out = steadfast(
        &[&["launch", "--engine", "mpi", "--nproc", "2", "--"][..], &job, &["--engine", "steadfast"]].concat(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not --engine steadfast"), "{err}");
}
