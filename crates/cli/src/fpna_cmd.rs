//! `steadfast fpna`: arguments, progress and the printed tables of the floating-point
//! non-associativity lab ([`lab::fpna`], which runs the sweeps and writes the CSV files,
//! SVG plots and `summary.json` into `--out`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lab::fpna::{self, Dist, Sweeps};
use train::data::DataKind;

const EXAMPLES: &str = "\
Examples:
  # A one-minute tour (small sizes, few repetitions, a short training experiment)
  steadfast fpna --quick

  # The full sweep, 100 repetitions, 20 training runs per mode, results in runs/fpna
  steadfast fpna --reps 100 --train-runs 20 --out runs/fpna";

/// Arguments of `steadfast fpna`.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct FpnaArgs {
    /// Small sweep that finishes within a minute.
    #[arg(long)]
    quick: bool,
    /// Array sizes to sum (comma-separated).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Input distributions.
    #[arg(long, value_delimiter = ',', value_parser = crate::choice::of::<Dist>())]
    dists: Option<Vec<Dist>>,
    /// Thread counts for the parallel kernels.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Repetitions of each non-deterministic kernel.
    #[arg(long)]
    reps: Option<usize>,
    /// Training runs per accumulation mode in the end-to-end experiment (0 skips it).
    #[arg(long)]
    train_runs: Option<usize>,
    /// Steps per training run.
    #[arg(long)]
    train_steps: Option<u64>,
    /// Data set of the training experiment [default: fashion-mnist, synthetic with --quick].
    #[arg(long, value_parser = crate::choice::of::<DataKind>())]
    data: Option<DataKind>,
    /// Seed of the inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory.
    #[arg(long, default_value = "runs/fpna")]
    out: PathBuf,
}

impl FpnaArgs {
    fn plan(&self) -> Sweeps {
        let quick = self.quick;
        Sweeps {
            sizes: self.sizes.clone().unwrap_or(if quick {
                vec![1_000, 10_000, 100_000]
            } else {
                vec![1_000, 10_000, 100_000, 1_000_000, 10_000_000]
            }),
            dists: self.dists.clone().unwrap_or(Dist::ALL.to_vec()),
            threads: self.threads.clone().unwrap_or(if quick { vec![2, 4] } else { vec![2, 4, 8] }),
            reps: self.reps.unwrap_or(if quick { 10 } else { 50 }).max(2),
            index_sizes: if quick { vec![10_000, 100_000] } else { vec![10_000, 100_000, 1_000_000] },
            train_runs: self.train_runs.unwrap_or(if quick { 3 } else { 10 }),
            train_steps: self.train_steps.unwrap_or(if quick { 20 } else { 300 }),
            seed: self.seed,
            data: match self.data {
                Some(d) => d,
                None if quick => DataKind::Synthetic,
                None => DataKind::FashionMnist,
            },
        }
    }
}

/// Runs `steadfast fpna`.
pub fn run(args: FpnaArgs) -> anyhow::Result<()> {
    let plan = args.plan();
    // Before minutes of sweeps: an output that cannot be written fails now.
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let bar = ProgressBar::new(plan.work());
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len}  {msg}").expect("valid template"));
    let mut progress = |msg: &str| {
        bar.inc(1);
        bar.set_message(msg.to_owned());
    };
    let sums = fpna::sum_sweep(&plan, &mut progress);
    let index_rows = fpna::index_sweep(&plan, &mut progress);
    let training = if plan.train_runs > 0 {
        Some(fpna::training_experiment(&plan, &mut progress).context("training run failed")?)
    } else {
        None
    };
    bar.finish_and_clear();

    print!("{}", fpna::text::tables(&sums, &index_rows, training.as_ref(), &plan));
    fpna::write_outputs(&args.out, &sums, &index_rows, training.as_ref(), &plan)?;
    println!("\nwrote {}/{{sums.csv,index_add.csv,training.csv,summary.json,*.svg}}", args.out.display());
    Ok(())
}
