//! `steadfast inject`: flip bits inside the tensors of a checkpoint file, replay a logged
//! injection, or undo one.

use std::path::PathBuf;

use clap::Args;
use fault::inject::{InjectError, InjectOptions, InjectionLog};
use fault::plan::{Amount, FlipSpec, Target};

const EXAMPLES: &str = "\
Examples:
  # Five random exponent-bit flips in the model weights of a Steadfast checkpoint, into a copy
  steadfast inject runs/ckpt/step-00000100 --out /tmp/altered --role model --bits exponent --count 5 --seed 1

  # One flip of bit 30 in a PyTorch state dict's first layer, in place; the log goes to flips.json
  steadfast inject model.pt --target 'fc1.*' --bits 30 --count 1 --log flips.json

  # Flip each bit of the optimizer state with probability 1e-7, leaving the checksums stale
  steadfast inject runs/ckpt --role optim --rate 1e-7 --keep-checksums

  # Alter a checkpoint that already fails verification, keeping its stale checksums stale
  steadfast inject runs/ckpt --out /tmp/altered --count 5 --allow-corrupt-input

  # Redo a logged injection on a fresh copy; undo it in place
  steadfast inject pristine.npz --replay flips.json --out again.npz
  steadfast inject altered.npz --undo flips.json

  # List the tensors Steadfast finds in a file
  steadfast inject weights.h5 --list";

/// Arguments of `steadfast inject`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct InjectArgs {
    /// A Steadfast checkpoint (directory or root), or a .safetensors, .pt/.pth, .npz or
    /// .h5 file.
    file: PathBuf,
    /// Alter a copy written here instead of the input.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Tensor names to target (shell glob: `*`, `?`).
    #[arg(long)]
    target: Option<String>,
    /// Target model parameters, optimizer state, or any.
    #[arg(long, default_value = "any")]
    role: String,
    /// Bits to flip: sign, exponent, mantissa, any, a position N or a range N-M.
    #[arg(long, default_value = "any")]
    bits: fault::BitSpec,
    /// Number of flips (bursts).
    #[arg(long, conflicts_with = "rate")]
    count: Option<u64>,
    /// Probability that each candidate bit flips.
    #[arg(long)]
    rate: Option<f64>,
    /// Adjacent bits flipped together, upward from the drawn bit.
    #[arg(long, default_value_t = 1)]
    burst: u32,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Leave a Steadfast manifest's checksums stale, so that verification catches the
    /// change (the default rewrites them, as corruption before checksumming would).
    #[arg(long)]
    keep_checksums: bool,
    /// Alter a Steadfast checkpoint even if a tensor to alter already fails its checksum
    /// (by default that is refused). Such tensors keep their old checksums, so the earlier
    /// corruption still fails verification, and the log names them.
    #[arg(long)]
    allow_corrupt_input: bool,
    /// Where to write the injection log (default: next to the altered file,
    /// `<name>.inject.json`).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Apply the flips of this log again (the file must hold the log's original bytes).
    #[arg(long, conflicts_with_all = ["undo", "count", "rate", "list"])]
    replay: Option<PathBuf>,
    /// Restore the bytes this log altered (the file must hold the log's altered bytes).
    #[arg(long, conflicts_with_all = ["count", "rate", "list", "out"])]
    undo: Option<PathBuf>,
    /// List the tensors found, and change nothing.
    #[arg(long)]
    list: bool,
}

/// Adds the way around a refusal to alter a corrupt input.
fn hint(e: InjectError) -> anyhow::Error {
    let corrupt = matches!(e, InjectError::CorruptInput { .. });
    let e = anyhow::Error::new(e);
    if corrupt { e.context("refused (pass --allow-corrupt-input to alter it anyway)") } else { e }
}

/// Runs `steadfast inject`.
pub fn run(args: InjectArgs) -> anyhow::Result<()> {
    if args.list {
        let located = ckpt::foreign::locate(&args.file)?;
        println!("{} ({})", args.file.display(), located.format.name());
        for t in &located.tensors {
            let order = if t.order == ckpt::foreign::Order::ColumnMajor { " column-major" } else { "" };
            println!("  {:<48} {:<5} {:<4} {:?}{order}", t.name, t.role.as_str(), t.dtype.name(), t.shape);
        }
        for (name, why) in &located.skipped {
            println!("  {name:<48} skipped: {why}");
        }
        return Ok(());
    }
    let options = InjectOptions {
        out: args.out.clone(),
        keep_checksums: args.keep_checksums,
        allow_corrupt_input: args.allow_corrupt_input,
    };
    if let Some(path) = &args.undo {
        let log = InjectionLog::read(path)?;
        fault::inject::undo(&log, Some(&args.file), &options).map_err(hint)?;
        let target = args.out.as_ref().unwrap_or(&args.file);
        println!("restored {} element(s) of {} in {}", log.flips.len(), args.file.display(), target.display());
        return Ok(());
    }
    // The log is written (and fsynced) before an altered copy at --out is put in place, so
    // that a copy never exists without its log. Its path is known before the log is.
    let log_path =
        args.log.clone().unwrap_or_else(|| InjectionLog::default_path(args.out.as_deref().unwrap_or(&args.file)));
    let save_log = |log: &InjectionLog| log.save(&log_path);
    let log = if let Some(path) = &args.replay {
        fault::inject::replay_logged(&InjectionLog::read(path)?, Some(&args.file), &options, save_log).map_err(hint)?
    } else {
        let role = match args.role.as_str() {
            "any" => None,
            r => Some(r.parse::<ckpt::Role>().map_err(|e| anyhow::anyhow!("--role: {e} (or `any`)"))?),
        };
        let amount = match (args.count, args.rate) {
            (Some(k), None) => Amount::Count(k),
            (None, Some(p)) => Amount::Rate(p),
            (None, None) => Amount::Count(1),
            (Some(_), Some(_)) => anyhow::bail!("give --count or --rate, not both"),
        };
        let spec = FlipSpec {
            target: Target { glob: args.target.clone(), role },
            bits: args.bits,
            amount,
            burst: args.burst,
            seed: args.seed,
        };
        fault::inject::inject_logged(&args.file, &spec, &options, save_log).map_err(hint)?
    };
    if !log.corrupt_input.is_empty() {
        eprintln!(
            "warning: the input was already corrupt: {} did not match the checksum in the manifest before any \
             flip; their checksums are left as they were, so verification still fails on them (the log lists \
             them under corrupt_input)",
            log.corrupt_input.join(", ")
        );
    }
    println!("altered {} ({}), checksums {}", log.target, log.format, log.checksums);
    for f in &log.flips {
        println!("  {}[{}] bits {:?}: {} -> {}", f.tensor, f.element, f.bits, f.old_value, f.new_value);
    }
    println!("log: {}", log_path.display());
    Ok(())
}
