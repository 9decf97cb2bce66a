//! `steadfast campaign`: run a fault-injection campaign from its TOML spec and write its
//! tables; or replay single trials of it. A PyTorch campaign's spec (`framework =
//! "pytorch"` in [run]) runs from Python, where its model trains; here its trials replay
//! through the interpreter the spec names.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lab::campaign::{Campaign, TrialResult};

const EXAMPLES: &str = "\
Examples:
  # The campaign of examples/campaign-mlp.toml; tables and summary.md land in runs/sdc-mlp
  steadfast campaign examples/campaign-mlp.toml --out runs/sdc-mlp

  # A quick look: the first 50 trials only, on 2 threads
  steadfast campaign examples/campaign-mlp.toml --out /tmp/quick --trials 50 --threads 2

  # Replay trials 17 and 230 of that campaign bit for bit, and print what they did
  steadfast campaign examples/campaign-mlp.toml --replay 17,230

  # Then render the report
  steadfast report runs/sdc-mlp

  # Replay trial 17 of a PyTorch campaign (run from Python by steadfast.lab), with the
  # interpreter its spec names in [run] python
  steadfast campaign runs/sdc-torch/spec.toml --replay 17

A spec ([run] must name the model and [trials] the count; every other key has a default):
  [run]
  model = \"mlp\"                # mlp | cnn | gpt
  data = \"fashion-mnist\"       # fashion-mnist | fortunes | synthetic
  batch = 128
  replicas = 2                 # simulated data-parallel replicas
  reduce = [\"deterministic\", \"reproducible\"]   # each trial runs under each
  eval_examples = 2000
  [trials]
  count = 1000
  seed = 1
  inject_at = [100, 200]       # golden snapshots a trial resumes from
  steps_after = 50
  state = [\"param\", \"optim\", \"grad\", \"activation\"]
  target = \"model.*\"           # tensor-name glob (act.* for activations)
  bits = \"any\"                 # sign | exponent | mantissa | any | N | N-M
  flips = 1                    # or: rate = 1e-6 (each candidate bit with this probability)
  burst = 1
  [detect]
  fingerprint_every = 1
  grad_norm_factor = 10.0
  loss_factor = 3.0
  response = \"observe\"         # observe | stop | repair
  [classify]
  degraded_accuracy = 0.005
  degraded_loss = 0.02
  diverged_loss = 10.0";

/// Arguments of `steadfast campaign`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct CampaignArgs {
    /// The campaign's TOML spec.
    spec: PathBuf,
    /// Directory for the tables and summary [default: runs/campaign].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only the first N trials (overrides trials.count).
    #[arg(long)]
    trials: Option<u64>,
    /// Worker threads [default: one per core]. The results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Replay these trials (comma-separated indices) and print them; writes nothing.
    #[arg(long, value_delimiter = ',')]
    replay: Vec<u64>,
}

pub fn run(args: CampaignArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.spec).with_context(|| format!("cannot read {}", args.spec.display()))?;
    if sdc::replay::is_pytorch(&text) {
        return replay_pytorch(&args.spec, &text, &args.replay);
    }
    let mut spec = lab::campaign::Spec::parse(&text).with_context(|| format!("in {}", args.spec.display()))?;
    if let Some(n) = args.trials {
        spec.trials.count = n;
    }
    let campaign = Campaign::prepare(spec)?;
    let threads = args.threads.unwrap_or(0);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("cannot start the threads")?;
    if !args.replay.is_empty() {
        let (_, results) = pool.install(|| campaign.run(Some(&args.replay), &|_| {}))?;
        for r in &results {
            print!("{}", lab::campaign::output::trial(r));
        }
        return Ok(());
    }
    let out = args.out.unwrap_or_else(|| PathBuf::from("runs/campaign"));
    let started = Instant::now();
    let bar = ProgressBar::new(campaign.jobs());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} trials  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("golden runs");
    let harmful = AtomicU64::new(0);
    let progress = |r: &TrialResult| {
        if !matches!(r.outcome, fault::campaign::Outcome::Masked | fault::campaign::Outcome::Corrected) {
            harmful.fetch_add(1, Ordering::Relaxed);
        }
        bar.set_message(format!("{} not masked", harmful.load(Ordering::Relaxed)));
        bar.inc(1);
    };
    let (goldens, results) = pool.install(|| campaign.run(None, &progress))?;
    bar.finish_and_clear();
    let summary = lab::campaign::output::write(&out, &campaign, &goldens, &results, started.elapsed())?;
    println!("{summary}");
    println!("Tables in {} (trials.csv, steps.csv, propagation.csv, detectors.csv, ...).", out.display());
    println!("Render them with: steadfast report {}", out.display());
    Ok(())
}

/// A PyTorch campaign: its trials replay in Python, with the campaign's interpreter.
fn replay_pytorch(path: &Path, text: &str, replay: &[u64]) -> anyhow::Result<()> {
    let mut command =
        sdc::replay::python_command(path, text, replay).with_context(|| format!("in {}", path.display()))?;
    let status = command.status().with_context(|| format!("cannot run {:?}", command.get_program()))?;
    anyhow::ensure!(status.success(), "`{command:?}` failed ({status})");
    Ok(())
}
