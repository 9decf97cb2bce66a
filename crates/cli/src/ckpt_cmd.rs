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
  steadfast ckpt export runs/ckpt --to model.safetensors --layout torch   # for torch.nn modules
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
    /// List the committed checkpoints under a checkpoint root (a pipeline job's: each stage's).
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
    /// in it, and its LATEST pointer (a pipeline job's root: each stage's, and their common step).
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
        /// Names and layouts: `steadfast` (every tensor as stored) or `torch` (the model's
        /// tensors as `torch.nn` modules hold them: linear weights transposed to
        /// `[out, in]`, layer norms' `gamma`/`beta` named `weight`/`bias`, no `model.`
        /// prefix), for `module.load_state_dict(safetensors.torch.load_file(...))`.
        #[arg(long, value_enum, default_value_t = ExportLayout::Steadfast)]
        layout: ExportLayout,
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
        CkptCommand::Export { path, to, layout } => export(&path, &to, layout, json),
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
    // A pipeline job's root: each stage's checkpoints, as a root's.
    let stages = ckpt::reader::stage_listing(dir)?;
    let rows = if stages.is_empty() { ckpt::reader::listing(dir)? } else { Vec::new() };
    if json {
        let v = if stages.is_empty() { serde_json::to_value(&rows)? } else { serde_json::to_value(&stages)? };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if stages.is_empty() {
        print!("{}", ckpt::reader::listing_table(&rows));
    }
    for s in stages.iter().filter(|_| !json) {
        print!("{}:\n{}", s.stage.dir.display(), ckpt::reader::listing_table(&s.checkpoints));
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
    print!("{}", c.describe());
    Ok(ExitCode::SUCCESS)
}

fn verify(path: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    if !path.exists() {
        anyhow::bail!("{}: no such file or directory", path.display());
    }
    if !path.is_dir() {
        anyhow::bail!(
            "{} is a file, not a checkpoint: verify takes a checkpoint directory (step-N, with its {}) or a \
             checkpoint root",
            path.display(),
            ckpt::manifest::MANIFEST_FILE
        );
    }
    if !path.join(ckpt::manifest::MANIFEST_FILE).exists() && path.is_dir() {
        return verify_root(path, json);
    }
    let problems = ckpt::reader::check(path);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"dir": path, "ok": problems.is_empty(), "problems": problems}))?
        );
    } else {
        println!("{}", ckpt::reader::problem_lines(path, &problems).join("\n"));
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A checkpoint root: every committed checkpoint in it, and its `LATEST`. Exit 1 when any
/// is bad; an error when the root holds no checkpoint at all.
fn verify_root(root: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    // A pipeline job's root: each stage's root, and the step common to every stage.
    if let Some(stages) = ckpt::reader::check_stages(root)? {
        let text = if json { serde_json::to_string_pretty(&stages.to_json(root))? } else { stages.text(root) };
        println!("{text}");
        return Ok(if stages.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    let report = ckpt::reader::check_root(root)?;
    let text =
        if json { serde_json::to_string_pretty(&report.to_json(root))? } else { report.lines(root, "").join("\n") };
    println!("{text}");
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn diff(a: &std::path::Path, b: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let ((ca, _), (cb, _)) = (open(a)?, open(b)?);
    let ta = ca.load().with_context(|| format!("loading {}", ca.dir.display()))?;
    let tb = cb.load().with_context(|| format!("loading {}", cb.dir.display()))?;
    let diffs = ckpt::diff::diff(&ta, &tb);
    let same = diffs.iter().all(|d| d.status == ckpt::diff::DiffStatus::Equal);
    if json {
        let rows: Vec<_> = diffs.iter().map(ckpt::diff::TensorDiff::to_json).collect();
        println!("{}", serde_json::to_string_pretty(&json!({"identical": same, "tensors": rows}))?);
    } else {
        println!("{}", ckpt::diff::text(&diffs, &ca.dir, &cb.dir));
    }
    Ok(if same { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The names and layouts an export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportLayout {
    /// Every tensor as the checkpoint stores it.
    Steadfast,
    /// The model's tensors as `torch.nn` modules hold them.
    Torch,
}

fn export(path: &std::path::Path, to: &std::path::Path, layout: ExportLayout, json: bool) -> anyhow::Result<ExitCode> {
    if !path.is_dir() {
        anyhow::ensure!(
            layout == ExportLayout::Steadfast,
            "--layout torch lays out a Steadfast checkpoint's model; {} is a file of another format, whose \
             tensors are exported as they are",
            path.display()
        );
        return export_foreign(path, to, json);
    }
    let (c, skipped) = open(path)?;
    let (tensors, bytes) = match layout {
        ExportLayout::Steadfast => (c.manifest.tensors.len(), ckpt::export::export(&c, to)?),
        ExportLayout::Torch => ckpt::export::export_torch(&c, to)?,
    };
    if json {
        println!("{}", json!({"from": c.dir, "to": to, "bytes": bytes, "tensors": tensors, "skipped": skipped}));
    } else {
        println!("wrote {} ({tensors} tensors, {bytes} bytes) from {}", to.display(), c.dir.display());
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
