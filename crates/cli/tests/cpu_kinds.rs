//! The same bits on every CPU kind: training on the fixed-order kernels prints the same
//! fingerprint whichever instruction set computes it, both the ones this CPU offers
//! (`STEADFAST_ISA`) and older CPUs that an emulator presents (`qemu-x86_64 -cpu Haswell`,
//! AVX2 and FMA without AVX-512; `-cpu qemu64`, baseline x86-64 with neither). The
//! fingerprint line names the kernels and instruction set, so each run also shows that it
//! really ran on the path it was meant to.

mod common;

use std::process::{Command, Output};

use kernels::Isa;

/// Short runs of each model, each scoring a few held-out examples only (the evaluation
/// does not enter the fingerprint, and under the emulator it would take minutes).
const RUNS: &[(&str, &[&str])] = &[
    (
        "mlp",
        &[
            "--model",
            "mlp",
            "--data",
            "synthetic",
            "--steps",
            "3",
            "--batch",
            "32",
            "--micro-batch",
            "32",
            "--eval-every",
            "0",
            "--eval-limit",
            "64",
        ],
    ),
    // Batches of 16: two groups of the convolutions' weight gradient (8 images each),
    // and a short run under the emulator.
    (
        "cnn",
        &[
            "--model",
            "cnn",
            "--data",
            "synthetic",
            "--steps",
            "3",
            "--batch",
            "16",
            "--micro-batch",
            "16",
            "--eval-every",
            "0",
            "--eval-limit",
            "64",
        ],
    ),
    // One step on one sequence of 64 tokens (attention's tasks are sequences): the GPT is
    // the slowest of the three under the emulator (a minute for two steps of two).
    (
        "gpt",
        &[
            "--model",
            "gpt",
            "--data",
            "synthetic",
            "--steps",
            "1",
            "--batch",
            "1",
            "--micro-batch",
            "1",
            "--eval-every",
            "0",
            "--eval-limit",
            "1",
        ],
    ),
];

/// The fingerprint and the kernels named after it.
fn fingerprint_and_kernels(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find_map(|l| l.strip_prefix("fingerprint: ")).expect("a fingerprint line");
    let (hex, kernels) = line.split_once(' ').expect("the kernels follow the fingerprint");
    (hex.to_owned(), kernels.trim_matches(['(', ')']).to_owned())
}

/// `steadfast train ARGS --out OUT`, natively or under `qemu-x86_64 -cpu CPU`, with
/// `STEADFAST_ISA` set to `isa` (unset for `None`).
fn train(emulated: Option<&str>, isa: Option<Isa>, args: &[&str], out: &std::path::Path) -> Output {
    let bin = env!("CARGO_BIN_EXE_steadfast");
    let mut cmd = match emulated {
        Some(cpu) => {
            let mut c = Command::new("qemu-x86_64");
            c.args(["-cpu", cpu, bin]);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("train").args(args).arg("--out").arg(out);
    match isa {
        Some(isa) => cmd.env("STEADFAST_ISA", isa.name()),
        None => cmd.env_remove("STEADFAST_ISA"),
    };
    cmd.output().expect("run steadfast")
}

#[test]
fn every_instruction_set_of_this_cpu_gives_the_same_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    for (model, args) in RUNS {
        let mut seen = Vec::new();
        for isa in Isa::all_available() {
            let (hex, kernels) = fingerprint_and_kernels(&train(None, Some(isa), args, dir.path()));
            assert_eq!(kernels, format!("fixed/{isa}"), "{model}");
            seen.push((isa, hex));
        }
        assert!(seen.len() >= 2, "this CPU offers the scalar path and at least one vector path");
        for (isa, hex) in &seen {
            assert_eq!(hex, &seen[0].1, "{model}: {isa} gives other bits than {}", seen[0].0);
        }
        let (framework, kernels) =
            fingerprint_and_kernels(&train(None, None, &[args, &["--kernels", "framework"][..]].concat(), dir.path()));
        assert_eq!(kernels, "framework");
        assert_ne!(framework, seen[0].1, "{model}: the framework's kernels round differently");
    }
}

/// True when `qemu-x86_64` runs. When `STEADFAST_REQUIRE_QEMU` is set (CI sets it), its
/// absence fails the test instead of skipping it.
fn have_qemu() -> bool {
    let present = Command::new("qemu-x86_64").arg("-version").output().is_ok_and(|o| o.status.success());
    if !present {
        assert!(std::env::var_os("STEADFAST_REQUIRE_QEMU").is_none(), "qemu-x86_64 is missing");
        common::skip("qemu-x86_64 is not installed (apt-get install qemu-user)");
    }
    present
}

#[test]
fn emulated_older_cpus_give_the_same_fingerprint() {
    if !cfg!(target_arch = "x86_64") || !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (model, args) in RUNS {
        let (native, _) = fingerprint_and_kernels(&train(None, None, args, dir.path()));
        for (cpu, isa) in [("Haswell", "avx2"), ("qemu64", "scalar")] {
            let out = train(Some(cpu), None, args, dir.path());
            let (hex, kernels) = fingerprint_and_kernels(&out);
            assert_eq!(kernels, format!("fixed/{isa}"), "{model}: the emulated {cpu} picks its best path");
            assert_eq!(hex, native, "{model}: an emulated {cpu} gives other bits than this CPU");
        }
    }
}

#[test]
fn an_unknown_instruction_set_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let args = RUNS[0].1;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_steadfast"));
    let out = cmd.arg("train").args(args).arg("--out").arg(dir.path()).env("STEADFAST_ISA", "avx9").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("STEADFAST_ISA=\"avx9\" is not one of scalar, avx2, avx512, auto"), "{err}");
}
