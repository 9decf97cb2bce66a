//! `steadfast ckpt`: list, inspect, verify, compare and export checkpoints.
//!
//! Exit status, as `grep` and `diff` do it: 0 when the answer is "yes" (valid,
//! identical), 1 when it is "no" (corrupt, different), 2 on error.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;

const EXAMPLES: &str = "\
Examples:
  steadfast ckpt ls runs/ckpt
  steadfast ckpt inspect runs/ckpt                 # the newest committed checkpoint
  steadfast ckpt verify runs/ckpt                  # every checkpoint and LATEST; exit 0 only if all hold
  steadfast ckpt verify runs/ckpt/step-00000500    # one checkpoint
  steadfast ckpt diff runs/a/step-00000500 runs/b/step-00000500 --json
  steadfast ckpt export runs/ckpt --to model.safetensors
  steadfast ckpt export model.pt --to model.safetensors   # a PyTorch, .npz or .h5 file's tensors";

/// Arguments of `steadfast ckpt`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct CkptArgs {
    #[command(subcommand)]
    command: CkptCommand,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum CkptCommand {
    /// List the committed checkpoints under a checkpoint root.
    Ls {
        /// Checkpoint root directory.
        dir: PathBuf,
    },
    /// Show a checkpoint's metadata and tensors (a root means its newest checkpoint).
    Inspect {
        /// Checkpoint directory or root.
        path: PathBuf,
    },
    /// Check every checksum; name each corrupt file or tensor. A root: every checkpoint
    /// in it, and its LATEST pointer.
    Verify {
        /// Checkpoint directory or root.
        path: PathBuf,
    },
    /// Compare two checkpoints tensor by tensor.
    Diff {
        /// First checkpoint (directory or root).
        a: PathBuf,
        /// Second checkpoint (directory or root).
        b: PathBuf,
    },
    /// Write all tensors into one plain safetensors file: from a Steadfast checkpoint
    /// (verified while read), or from a PyTorch `.pt`, NumPy `.npz` or HDF5/Keras `.h5` file.
    Export {
        /// Checkpoint directory or root, or a file of another format.
        path: PathBuf,
        /// Output file.
        #[arg(long)]
        to: PathBuf,
    },
}

/// Runs `steadfast ckpt`.
pub fn run(args: CkptArgs) -> anyhow::Result<ExitCode> {
    let json = args.json;
    match args.command {
        CkptCommand::Ls { dir } => ls(&dir, json),
        CkptCommand::Inspect { path } => inspect(&path, json),
        CkptCommand::Verify { path } => verify(&path, json),
        CkptCommand::Diff { a, b } => diff(&a, &b, json),
        CkptCommand::Export { path, to } => export(&path, &to, json),
    }
}

/// Opens the checkpoint that `path` names, saying on stderr what it passed over (a newer
/// checkpoint that does not check out, a bad `LATEST`); returns those too.
fn open(path: &std::path::Path) -> anyhow::Result<(ckpt::Checkpoint, Vec<serde_json::Value>)> {
    let resolved = ckpt::reader::resolve_reporting(path)?;
    let mut skipped = Vec::new();
    for (p, reason) in &resolved.skipped {
        eprintln!("warning: skipped {}: {reason}", p.display());
        skipped.push(json!({"path": p, "reason": reason}));
    }
    if !skipped.is_empty() {
        eprintln!("warning: using {}", resolved.dir.display());
    }
    Ok((ckpt::reader::open(&resolved.dir)?, skipped))
}

fn ls(dir: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let latest = std::fs::read_to_string(dir.join(ckpt::store::LATEST_FILE)).ok().map(|s| s.trim().to_owned());
    let mut rows = Vec::new();
    for (step, path) in ckpt::store::list(dir)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let is_latest = latest.as_deref() == Some(name.as_str());
        let row = match ckpt::reader::open(&path) {
            Ok(c) => json!({
                "step": step, "dir": name, "latest": is_latest, "valid_manifest": true,
                "tensors": c.manifest.tensors.len(), "files": c.manifest.files.len(),
                "bytes": c.manifest.files.iter().map(|f| f.length).sum::<u64>(),
            }),
            Err(e) => {
                json!({"step": step, "dir": name, "latest": is_latest, "valid_manifest": false, "error": e.to_string()})
            }
        };
        rows.push(row);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{:<16} {:>10} {:>8} {:>14}  note", "checkpoint", "step", "tensors", "bytes");
        for r in &rows {
            let note = match (r["latest"].as_bool(), r["error"].as_str()) {
                (_, Some(e)) => format!("INVALID: {e}"),
                (Some(true), _) => "LATEST".to_owned(),
                _ => String::new(),
            };
            println!(
                "{:<16} {:>10} {:>8} {:>14}  {note}",
                r["dir"].as_str().unwrap_or(""),
                r["step"],
                r["tensors"].as_u64().map(|n| n.to_string()).unwrap_or_default(),
                r["bytes"].as_u64().map(|n| n.to_string()).unwrap_or_default()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect(path: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let (c, skipped) = open(path)?;
    let m = &c.manifest;
    if json {
        println!("{}", serde_json::to_string_pretty(&json!({"dir": c.dir, "skipped": skipped, "manifest": m}))?);
        return Ok(ExitCode::SUCCESS);
    }
    let meta = &m.meta;
    println!("checkpoint:  {}", c.dir.display());
    println!("format:      {} version {}", m.format, m.version);
    println!(
        "step:        {} (epoch {}, next step {} of the epoch)",
        meta.step, meta.epoch, meta.data_cursor.step_in_epoch
    );
    println!("world size:  {}", meta.world_size);
    println!("config hash: {}", meta.config_hash);
    if !meta.kernels.is_empty() {
        println!("kernels:     {}", meta.kernels);
    }
    println!("rng:         {} seed {}", meta.rng.algorithm, meta.rng.seed);
    for (k, v) in &meta.scalars {
        println!("{:<12} {v}", format!("{k}:"));
    }
    let mut by_role = std::collections::BTreeMap::<&str, (usize, u64)>::new();
    println!("\n{:<48} {:<6} {:<5} {:<16} {:>12}  file", "tensor", "role", "dtype", "shape", "bytes");
    for t in &m.tensors {
        let e = by_role.entry(t.role.as_str()).or_default();
        e.0 += 1;
        e.1 += t.length;
        println!(
            "{:<48} {:<6} {:<5} {:<16} {:>12}  {}",
            t.name,
            t.role,
            t.dtype,
            format!("{:?}", t.shape),
            t.length,
            t.file
        );
    }
    println!();
    for (role, (n, bytes)) in by_role {
        println!("{role}: {n} tensors, {bytes} bytes");
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(path: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    if !path.exists() {
        anyhow::bail!("{}: no such file or directory", path.display());
    }
    if !path.join(ckpt::manifest::MANIFEST_FILE).exists() && path.is_dir() {
        return verify_root(path, json);
    }
    let problems = check(path);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"dir": path, "ok": problems.is_empty(), "problems": problem_rows(&problems)})
            )?
        );
    } else {
        print_problems(path, &problems);
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Every problem of one checkpoint directory (its manifest's, or each file's and tensor's).
fn check(dir: &std::path::Path) -> Vec<ckpt::Problem> {
    match ckpt::reader::open(dir) {
        Ok(c) => c.verify(),
        Err(e) => {
            vec![ckpt::Problem { file: ckpt::manifest::MANIFEST_FILE.into(), tensor: None, reason: e.to_string() }]
        }
    }
}

fn problem_rows(problems: &[ckpt::Problem]) -> Vec<serde_json::Value> {
    problems.iter().map(|p| json!({"file": p.file, "tensor": p.tensor, "reason": p.reason})).collect()
}

fn print_problems(dir: &std::path::Path, problems: &[ckpt::Problem]) {
    if problems.is_empty() {
        println!("OK {}: every checksum holds", dir.display());
        return;
    }
    for p in problems {
        match &p.tensor {
            Some(t) => println!("CORRUPT {} {} tensor {t}: {}", dir.display(), p.file, p.reason),
            None => println!("CORRUPT {} {}: {}", dir.display(), p.file, p.reason),
        }
    }
}

/// A checkpoint root: every committed checkpoint in it, and its `LATEST`. Exit 1 when any
/// is bad; an error when the root holds no checkpoint at all.
fn verify_root(root: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let checkpoints = ckpt::store::list(root)?;
    if checkpoints.is_empty() {
        anyhow::bail!("{}: no committed checkpoint (no step-* directory)", root.display());
    }
    let latest = ckpt::reader::latest_target(root).err();
    let mut rows = Vec::new();
    let mut bad = 0;
    for (step, dir) in &checkpoints {
        let problems = check(dir);
        if !problems.is_empty() {
            bad += 1;
        }
        if !json {
            print_problems(dir, &problems);
        }
        rows.push(json!({"step": step, "dir": dir, "ok": problems.is_empty(), "problems": problem_rows(&problems)}));
    }
    let ok = bad == 0 && latest.is_none();
    if json {
        let report = json!({"root": root, "ok": ok, "checkpoints": rows, "latest_problem": latest});
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if let Some(why) = &latest {
            println!("BAD {}: {why}", root.join(ckpt::store::LATEST_FILE).display());
        }
        println!(
            "{} checkpoint(s) in {}: {} valid, {bad} corrupt{}",
            checkpoints.len(),
            root.display(),
            checkpoints.len() - bad,
            if latest.is_some() { "; LATEST is bad" } else { "" }
        );
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn diff(a: &std::path::Path, b: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let ((ca, _), (cb, _)) = (open(a)?, open(b)?);
    let ta = ca.load().with_context(|| format!("loading {}", ca.dir.display()))?;
    let tb = cb.load().with_context(|| format!("loading {}", cb.dir.display()))?;
    let diffs = ckpt::diff::diff(&ta, &tb);
    let same = diffs.iter().all(|d| d.status == ckpt::diff::DiffStatus::Equal);
    let finite = |x: Option<f64>| x.map(|v| if v.is_finite() { json!(v) } else { json!("inf") });
    if json {
        use ckpt::diff::DiffStatus::*;
        let rows: Vec<_> = diffs
            .iter()
            .map(|d| match &d.status {
                OnlyInA => json!({"tensor": d.name, "status": "only_in_a"}),
                OnlyInB => json!({"tensor": d.name, "status": "only_in_b"}),
                Incompatible { a, b } => json!({"tensor": d.name, "status": "incompatible", "a": a, "b": b}),
                Equal => json!({"tensor": d.name, "status": "equal"}),
                Differs(e) => json!({
                    "tensor": d.name, "status": "differs", "elements": e.elements, "total": e.total,
                    "max_abs": finite(e.max_abs), "max_rel": finite(e.max_rel),
                    "bits": e.bit_counts.iter().enumerate().filter(|(_, c)| **c > 0)
                        .map(|(b, c)| json!({"bit": b, "count": c})).collect::<Vec<_>>(),
                }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({"identical": same, "tensors": rows}))?);
    } else {
        for d in &diffs {
            use ckpt::diff::DiffStatus::*;
            match &d.status {
                Equal => {}
                OnlyInA => println!("{:<48} only in {}", d.name, ca.dir.display()),
                OnlyInB => println!("{:<48} only in {}", d.name, cb.dir.display()),
                Incompatible { a, b } => println!("{:<48} incompatible: {a} vs {b}", d.name),
                Differs(e) => {
                    let bits: Vec<String> = e
                        .bit_counts
                        .iter()
                        .enumerate()
                        .rev()
                        .filter(|(_, c)| **c > 0)
                        .map(|(b, c)| format!("{b}:{c}"))
                        .collect();
                    let fmt = |x: Option<f64>| x.map(|v| format!("{v:.3e}")).unwrap_or_else(|| "-".into());
                    println!(
                        "{:<48} {}/{} elements differ, max abs {}, max rel {}, bits {}",
                        d.name,
                        e.elements,
                        e.total,
                        fmt(e.max_abs),
                        fmt(e.max_rel),
                        bits.join(" ")
                    );
                }
            }
        }
        let differing = diffs.iter().filter(|d| d.status != ckpt::diff::DiffStatus::Equal).count();
        println!(
            "{}",
            if same { "identical".to_owned() } else { format!("{differing} of {} tensors differ", diffs.len()) }
        );
    }
    Ok(if same { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn export(path: &std::path::Path, to: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    if !path.is_dir() {
        return export_foreign(path, to, json);
    }
    let (c, skipped) = open(path)?;
    let bytes = ckpt::export::export(&c, to)?;
    if json {
        println!(
            "{}",
            json!({"from": c.dir, "to": to, "bytes": bytes, "tensors": c.manifest.tensors.len(), "skipped": skipped})
        );
    } else {
        println!(
            "wrote {} ({} tensors, {bytes} bytes) from {}",
            to.display(),
            c.manifest.tensors.len(),
            c.dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn export_foreign(path: &std::path::Path, to: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let done = ckpt::export::export_foreign(path, to)?;
    if json {
        let skipped: Vec<_> = done.skipped.iter().map(|(name, why)| json!({"name": name, "reason": why})).collect();
        println!(
            "{}",
            json!({"from": path, "format": done.format.name(), "to": to, "bytes": done.bytes,
                   "tensors": done.tensors, "skipped": skipped})
        );
    } else {
        println!(
            "wrote {} ({} tensors, {} bytes) from {} ({})",
            to.display(),
            done.tensors,
            done.bytes,
            path.display(),
            done.format.name()
        );
        for (name, why) in &done.skipped {
            println!("skipped {name}: {why}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
