//! `steadfast report`: one self-contained HTML page with SVG plots, of a campaign's
//! tables (outcome by bit position, by kind of state, loss curves against golden, the
//! propagation heat map) or of a training run (its steps against time, with each failure
//! and recovery marked).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

const EXAMPLES: &str = "\
Examples:
  # Render runs/sdc-mlp/report.html from the campaign's tables
  steadfast campaign examples/campaign-mlp.toml --out runs/sdc-mlp
  steadfast report runs/sdc-mlp

  # A training run: its steps against time, each failure and recovery marked
  steadfast launch --nproc 3 --max-restarts 1 -- train --model mlp --out runs/elastic \\
      --reduce reproducible --fault 'crash:rank=1,step=200,phase=update'
  steadfast report runs/elastic

  # Write the page elsewhere
  steadfast report runs/sdc-mlp --out /tmp/sdc.html";

/// Arguments of `steadfast report`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct ReportArgs {
    /// A campaign's output directory, or a training run's (metrics.jsonl, events.jsonl).
    dir: PathBuf,
    /// Where to write the page [default: DIR/report.html].
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let page = lab::run_report::render_dir(&args.dir)?;
    let out = args.out.unwrap_or_else(|| args.dir.join("report.html"));
    std::fs::write(&out, page).with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", out.display());
    Ok(())
}
