//! `steadfast fpna`: the floating-point non-associativity lab.
//!
//! Measures run-to-run variability of parallel reductions whose order depends on thread
//! timing (atomic adds), against fixed-order and reproducible versions, with the FPNA
//! study's metrics; then trains a model repeatedly with atomic-order and with
//! reproducible gradient accumulation and reports the spread of the outcomes. Writes CSV
//! files, SVG plots and `summary.json` into `--out`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use repro::fpna;
use repro::metrics::{array_variability, distinct_outputs, scalar_variability};
use repro::rng::Stream;
use serde_json::json;
use train::TrainConfig;
use train::data::DataKind;
use train::model::ModelKind;
use train::step::NoHooks;
use train::trainer::Prepared;

const EXAMPLES: &str = "\
Examples:
  # A one-minute tour (small sizes, few repetitions, a short training experiment)
  steadfast fpna --quick

  # The full sweep, 100 repetitions, 20 training runs per mode, results in runs/fpna
  steadfast fpna --reps 100 --train-runs 20 --out runs/fpna";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dist {
    /// Uniform in [0, 1).
    Uniform,
    /// Standard normal.
    Normal,
    /// Random sign and exponents spanning 2^-20 .. 2^20.
    Mixed,
}

impl Dist {
    fn name(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Normal => "normal",
            Dist::Mixed => "mixed",
        }
    }
}

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
    #[arg(long, value_delimiter = ',', value_enum)]
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

struct Plan {
    sizes: Vec<usize>,
    dists: Vec<Dist>,
    threads: Vec<usize>,
    reps: usize,
    index_sizes: Vec<usize>,
    train_runs: usize,
    train_steps: u64,
    data: DataKind,
}

impl FpnaArgs {
    fn plan(&self) -> Plan {
        let quick = self.quick;
        Plan {
            sizes: self.sizes.clone().unwrap_or(if quick {
                vec![1_000, 10_000, 100_000]
            } else {
                vec![1_000, 10_000, 100_000, 1_000_000, 10_000_000]
            }),
            dists: self.dists.clone().unwrap_or(vec![Dist::Uniform, Dist::Normal, Dist::Mixed]),
            threads: self.threads.clone().unwrap_or(if quick { vec![2, 4] } else { vec![2, 4, 8] }),
            reps: self.reps.unwrap_or(if quick { 10 } else { 50 }).max(2),
            index_sizes: if quick { vec![10_000, 100_000] } else { vec![10_000, 100_000, 1_000_000] },
            train_runs: self.train_runs.unwrap_or(if quick { 3 } else { 10 }),
            train_steps: self.train_steps.unwrap_or(if quick { 20 } else { 300 }),
            data: match self.data {
                Some(d) => d,
                None if quick => DataKind::Synthetic,
                None => DataKind::FashionMnist,
            },
        }
    }
}

fn inputs(dist: Dist, n: usize, seed: u64) -> Vec<f32> {
    let mut s = Stream::for_purpose(seed, "fpna.inputs", &[dist as u64, n as u64]);
    (0..n)
        .map(|_| match dist {
            Dist::Uniform => s.next_f32(),
            Dist::Normal => {
                // Box-Muller; the inputs need not be bit-portable across platforms.
                let (u, v) = (1.0 - f64::from(s.next_f32()), f64::from(s.next_f32()));
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            }
            Dist::Mixed => {
                let e = s.below(41) as i32 - 20;
                let sign = if s.next_u32() & 1 == 1 { -1.0 } else { 1.0 };
                sign * (1.0 + s.next_f32()) * 2f32.powi(e)
            }
        })
        .collect()
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2] * 1e3
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// One row of the sum sweep.
struct SumRow {
    dist: Dist,
    n: usize,
    threads: usize,
    vs: Vec<f64>,
    distinct_atomic: usize,
    distinct_tree: usize,
    distinct_repro: usize,
    atomic_ms: f64,
    tree_ms: f64,
    repro_ms: f64,
    atomic_error: f64,
}

/// One row of the index-add sweep.
struct IndexRow {
    dist: Dist,
    n: usize,
    threads: usize,
    mean_rel: f64,
    frac_differ: f64,
    distinct_atomic: usize,
    distinct_sorted: usize,
    atomic_ms: f64,
    sorted_ms: f64,
}

/// Runs `steadfast fpna`.
pub fn run(args: FpnaArgs) -> anyhow::Result<()> {
    let plan = args.plan();
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let work =
        plan.dists.len() * (plan.sizes.len() + plan.index_sizes.len()) * plan.threads.len() + 2 * plan.train_runs;
    let bar = ProgressBar::new(work as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len}  {msg}").expect("valid template"));

    let mut sums = Vec::new();
    for &dist in &plan.dists {
        for &n in &plan.sizes {
            let xs = inputs(dist, n, args.seed);
            let exact = f64::from(repro::sum::sum(&xs));
            for &threads in &plan.threads {
                bar.set_message(format!("sum {dist:?} n={n} threads={threads}"));
                let (d, _) = timed(|| fpna::tree_sum(&xs, threads));
                let (mut atomic, mut tree, mut rep) = (Vec::new(), Vec::new(), Vec::new());
                let (mut ta, mut tt, mut tr) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..plan.reps {
                    let (a, t) = timed(|| fpna::atomic_sum(&xs, threads));
                    atomic.push(a);
                    ta.push(t);
                    let (b, t) = timed(|| fpna::tree_sum(&xs, threads));
                    tree.push(b);
                    tt.push(t);
                    let (c, t) = timed(|| fpna::repro_sum(&xs, threads));
                    rep.push(c);
                    tr.push(t);
                }
                let one = |v: &Vec<f32>| distinct_outputs(v.iter().map(std::slice::from_ref));
                let scale = xs.iter().map(|x| f64::from(x.abs())).sum::<f64>().max(f64::MIN_POSITIVE);
                sums.push(SumRow {
                    dist,
                    n,
                    threads,
                    vs: atomic.iter().map(|&a| scalar_variability(f64::from(a), f64::from(d))).collect(),
                    distinct_atomic: one(&atomic),
                    distinct_tree: one(&tree),
                    distinct_repro: one(&rep),
                    atomic_ms: median_ms(ta),
                    tree_ms: median_ms(tt),
                    repro_ms: median_ms(tr),
                    atomic_error: atomic.iter().map(|&a| (f64::from(a) - exact).abs() / scale).fold(0.0, f64::max),
                });
                bar.inc(1);
            }
        }
    }

    let mut index_rows = Vec::new();
    for &dist in &plan.dists {
        for &n in &plan.index_sizes {
            let values = inputs(dist, n, args.seed ^ 1);
            let targets = (n / 32).max(1);
            let mut s = Stream::for_purpose(args.seed, "fpna.index", &[n as u64]);
            let index: Vec<u32> = (0..n).map(|_| s.below(targets as u64) as u32).collect();
            for &threads in &plan.threads {
                bar.set_message(format!("index_add {dist:?} n={n} threads={threads}"));
                let (reference, _) = timed(|| fpna::sorted_index_add(targets, &index, &values, threads));
                let (mut outs, mut sorted_outs, mut ta, mut ts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for _ in 0..plan.reps {
                    let (a, t) = timed(|| fpna::atomic_index_add(targets, &index, &values, threads));
                    outs.push(a);
                    ta.push(t);
                    let (b, t) = timed(|| fpna::sorted_index_add(targets, &index, &values, threads));
                    sorted_outs.push(b);
                    ts.push(t);
                }
                let vars: Vec<_> = outs.iter().map(|o| array_variability(o, &reference)).collect();
                let mean = |f: &dyn Fn(&repro::metrics::ArrayVariability) -> f64| {
                    vars.iter().map(f).sum::<f64>() / vars.len() as f64
                };
                index_rows.push(IndexRow {
                    dist,
                    n,
                    threads,
                    mean_rel: mean(&|v| v.mean_relative_difference),
                    frac_differ: mean(&|v| v.fraction_differing),
                    distinct_atomic: distinct_outputs(outs.iter().map(|o| o.as_slice())),
                    distinct_sorted: distinct_outputs(sorted_outs.iter().map(|o| o.as_slice())),
                    atomic_ms: median_ms(ta),
                    sorted_ms: median_ms(ts),
                });
                bar.inc(1);
            }
        }
    }

    let training = if plan.train_runs > 0 { Some(training_experiment(&plan, &bar)?) } else { None };
    bar.finish_and_clear();

    print_tables(&sums, &index_rows, training.as_ref(), &plan);
    write_outputs(&args.out, &sums, &index_rows, training.as_ref(), &plan)?;
    println!("\nwrote {}/{{sums.csv,index_add.csv,training.csv,summary.json,*.svg}}", args.out.display());
    Ok(())
}

/// How the training experiment sums micro-batch gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accumulation {
    /// Racing threads adding with atomics: the order, and the bits, change from run to
    /// run, as GPU atomics do.
    Atomic,
    /// The reproducible sum of the training runtime.
    Reproducible,
}

impl Accumulation {
    const ALL: [Accumulation; 2] = [Accumulation::Atomic, Accumulation::Reproducible];

    fn name(self) -> &'static str {
        match self {
            Accumulation::Atomic => "atomic",
            Accumulation::Reproducible => "reproducible",
        }
    }
}

/// Outcome of one training run.
struct TrainRun {
    mode: Accumulation,
    run: usize,
    loss: f32,
    accuracy: f64,
    fingerprint: u64,
    params: Vec<f32>,
}

fn training_experiment(plan: &Plan, bar: &ProgressBar) -> anyhow::Result<Vec<TrainRun>> {
    let mut runs = Vec::new();
    for mode in Accumulation::ALL {
        for run in 0..plan.train_runs {
            bar.set_message(format!("training run {} ({})", run + 1, mode.name()));
            let mut c = TrainConfig::defaults(ModelKind::Mlp);
            c.data = plan.data;
            c.steps = plan.train_steps;
            c.batch = 128;
            c.micro_batch = 16;
            c.reduce = comm::ReduceMode::Reproducible;
            runs.push(train_once(&c, mode, run).context("training run failed")?);
            bar.inc(1);
        }
    }
    Ok(runs)
}

/// Trains `c` with the training runtime's step, summing the micro-batch gradients as
/// `mode` says, and scores the result.
fn train_once(c: &TrainConfig, mode: Accumulation, run: usize) -> Result<TrainRun, train::TrainError> {
    let prepared = Prepared::load(c)?;
    let (mut state, mut engine) = prepared.start(c);
    let (mut micro, mut sum) = (Vec::new(), engine.buffer());
    while state.step < c.steps {
        engine.compute(&state, 0, 1, &mut NoHooks, &mut micro)?;
        match mode {
            Accumulation::Atomic => {
                let parts: Vec<&[f32]> = micro.iter().map(|b| b.as_slice()).collect();
                sum.as_mut_slice().copy_from_slice(&fpna::racy_sum_parts(&parts));
            }
            Accumulation::Reproducible => engine.reduce_local(&micro, &mut sum),
        }
        state.apply(&sum);
    }
    let eval = engine.with_model(&state.params, |m, d| train::trainer::evaluate(m, &prepared.data, state.step, d));
    Ok(TrainRun {
        mode,
        run,
        loss: sum.loss(),
        accuracy: eval.accuracy,
        fingerprint: state.fingerprint(),
        params: state.params.iter().flat_map(|p| p.data.iter().copied()).collect(),
    })
}

/// Mean, standard deviation, min and max. Identical values have a standard deviation of
/// exactly 0 (not the rounding noise of the mean).
fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    let n = v.len() as f64;
    let (min, max) =
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    if min == max {
        return (min, 0.0, min, max);
    }
    let mean = repro::sum::sum(v) / n;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    (mean, sd, min, max)
}

fn mode_summary(runs: &[TrainRun], mode: Accumulation) -> serde_json::Value {
    let mine: Vec<&TrainRun> = runs.iter().filter(|r| r.mode == mode).collect();
    let acc: Vec<f64> = mine.iter().map(|r| r.accuracy).collect();
    let loss: Vec<f64> = mine.iter().map(|r| f64::from(r.loss)).collect();
    let (am, asd, amin, amax) = stats(&acc);
    let (lm, lsd, _, _) = stats(&loss);
    let distinct = mine.iter().map(|r| r.fingerprint).collect::<std::collections::BTreeSet<_>>().len();
    let first = &mine[0].params;
    let weight_rel: Vec<f64> =
        mine.iter().skip(1).map(|r| array_variability(&r.params, first).mean_relative_difference).collect();
    let differing: Vec<f64> =
        mine.iter().skip(1).map(|r| array_variability(&r.params, first).fraction_differing).collect();
    json!({
        "mode": mode.name(), "runs": mine.len(), "distinct_fingerprints": distinct,
        "accuracy_mean": am, "accuracy_sd": asd, "accuracy_min": amin, "accuracy_max": amax,
        "loss_mean": lm, "loss_sd": lsd,
        "weights_mean_relative_difference_vs_run_1": if weight_rel.is_empty() { 0.0 } else { stats(&weight_rel).0 },
        "weights_fraction_differing_vs_run_1": if differing.is_empty() { 0.0 } else { stats(&differing).0 },
    })
}

fn print_tables(sums: &[SumRow], index: &[IndexRow], training: Option<&Vec<TrainRun>>, plan: &Plan) {
    println!("Parallel sums, {} repetitions each (V_s = 1 - |S_atomic / S_tree|):", plan.reps);
    println!(
        "{:<8} {:>9} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "dist",
        "n",
        "threads",
        "mean|V_s|",
        "max|V_s|",
        "distinct",
        "tree",
        "repro",
        "atomic ms",
        "tree ms",
        "repro ms"
    );
    for r in sums {
        let abs: Vec<f64> = r.vs.iter().map(|v| v.abs()).collect();
        println!(
            "{:<8} {:>9} {:>7} {:>10.2e} {:>10.2e} {:>9} {:>9} {:>9} {:>9.3} {:>9.3} {:>9.3}",
            r.dist.name(),
            r.n,
            r.threads,
            abs.iter().sum::<f64>() / abs.len() as f64,
            abs.iter().copied().fold(0.0, f64::max),
            r.distinct_atomic,
            r.distinct_tree,
            r.distinct_repro,
            r.atomic_ms,
            r.tree_ms,
            r.repro_ms
        );
    }
    println!("\nIndex-add (scatter), n pairs into n/32 targets, against the sorted deterministic version:");
    println!(
        "{:<8} {:>9} {:>7} {:>12} {:>10} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "dist", "n", "threads", "mean rel", "differ", "distinct", "sorted", "atomic ms", "sorted ms", "cost"
    );
    for r in index {
        println!(
            "{:<8} {:>9} {:>7} {:>12.2e} {:>10.4} {:>9} {:>9} {:>10.3} {:>10.3} {:>7.2}x",
            r.dist.name(),
            r.n,
            r.threads,
            r.mean_rel,
            r.frac_differ,
            r.distinct_atomic,
            r.distinct_sorted,
            r.atomic_ms,
            r.sorted_ms,
            r.sorted_ms / r.atomic_ms
        );
    }
    if let Some(runs) = training {
        println!(
            "\nTraining the MLP {} times per mode ({} steps, batch 128 as 8 micro-batches of 16, {:?}):",
            plan.train_runs, plan.train_steps, plan.data
        );
        for mode in Accumulation::ALL {
            let s = mode_summary(runs, mode);
            println!(
                "{:<13} accuracy {:.4} +/- {:.1e} (min {:.4}, max {:.4}), loss sd {:.2e}, distinct fingerprints {}/{}, weights differ from run 1 in {:.1}% of elements",
                mode.name(),
                s["accuracy_mean"].as_f64().unwrap_or(0.0),
                s["accuracy_sd"].as_f64().unwrap_or(0.0),
                s["accuracy_min"].as_f64().unwrap_or(0.0),
                s["accuracy_max"].as_f64().unwrap_or(0.0),
                s["loss_sd"].as_f64().unwrap_or(0.0),
                s["distinct_fingerprints"],
                s["runs"],
                100.0 * s["weights_fraction_differing_vs_run_1"].as_f64().unwrap_or(0.0)
            );
        }
    }
}

fn write_outputs(
    out: &Path,
    sums: &[SumRow],
    index: &[IndexRow],
    training: Option<&Vec<TrainRun>>,
    plan: &Plan,
) -> anyhow::Result<()> {
    let write = |name: &str, text: String| -> anyhow::Result<()> {
        let p = out.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
    };
    let mut csv = String::from("dist,n,threads,rep,v_s\n");
    for r in sums {
        for (i, v) in r.vs.iter().enumerate() {
            csv += &format!("{},{},{},{},{:e}\n", r.dist.name(), r.n, r.threads, i, v);
        }
    }
    write("sums.csv", csv)?;
    let mut csv = String::from(
        "dist,n,threads,mean_relative_difference,fraction_differing,distinct_atomic,distinct_sorted,atomic_ms,sorted_ms\n",
    );
    for r in index {
        csv += &format!(
            "{},{},{},{:e},{},{},{},{},{}\n",
            r.dist.name(),
            r.n,
            r.threads,
            r.mean_rel,
            r.frac_differ,
            r.distinct_atomic,
            r.distinct_sorted,
            r.atomic_ms,
            r.sorted_ms
        );
    }
    write("index_add.csv", csv)?;
    let mut csv = String::from("mode,run,final_loss,test_accuracy,fingerprint\n");
    for r in training.into_iter().flatten() {
        csv += &format!("{},{},{},{},{:016x}\n", r.mode.name(), r.run, r.loss, r.accuracy, r.fingerprint);
    }
    write("training.csv", csv)?;
    let summary = json!({
        "reps": plan.reps,
        "sums": sums.iter().map(|r| json!({
            "dist": r.dist.name(), "n": r.n, "threads": r.threads,
            "mean_abs_vs": r.vs.iter().map(|v| v.abs()).sum::<f64>() / r.vs.len() as f64,
            "distinct_atomic": r.distinct_atomic, "distinct_tree": r.distinct_tree, "distinct_repro": r.distinct_repro,
            "max_relative_error_atomic": r.atomic_error,
            "atomic_ms": r.atomic_ms, "tree_ms": r.tree_ms, "repro_ms": r.repro_ms,
        })).collect::<Vec<_>>(),
        "index_add": index.iter().map(|r| json!({
            "dist": r.dist.name(), "n": r.n, "threads": r.threads,
            "mean_relative_difference": r.mean_rel, "fraction_differing": r.frac_differ,
            "distinct_atomic": r.distinct_atomic, "distinct_sorted": r.distinct_sorted,
            "deterministic_cost": r.sorted_ms / r.atomic_ms,
        })).collect::<Vec<_>>(),
        "training": training.map(|t| Accumulation::ALL.map(|m| mode_summary(t, m)).to_vec()),
    });
    write("summary.json", serde_json::to_string_pretty(&summary)?)?;
    plot_vs_histograms(out, sums)?;
    plot_distinct(out, sums, plan)?;
    if let Some(t) = training {
        plot_training(out, t)?;
    }
    Ok(())
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting failed: {e:?}")
}

/// Histogram of V_s for the largest size, one panel per distribution.
fn plot_vs_histograms(out: &Path, sums: &[SumRow]) -> anyhow::Result<()> {
    let path = out.join("vs_histogram.svg");
    let dists: Vec<Dist> = sums.iter().map(|r| r.dist).fold(Vec::new(), |mut v, d| {
        if !v.contains(&d) {
            v.push(d);
        }
        v
    });
    let root = SVGBackend::new(&path, (400 * dists.len().max(1) as u32, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((1, dists.len().max(1)));
    for (panel, dist) in panels.iter().zip(&dists) {
        let n_max = sums.iter().filter(|r| r.dist == *dist).map(|r| r.n).max().unwrap_or(0);
        let vs: Vec<f64> =
            sums.iter().filter(|r| r.dist == *dist && r.n == n_max).flat_map(|r| r.vs.iter().copied()).collect();
        let (lo, hi) = vs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 1e-9, lo + 1e-9) };
        let bins = 20;
        let width = (hi - lo) / bins as f64;
        let mut counts = vec![0u32; bins];
        for v in &vs {
            counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
        }
        let top = counts.iter().copied().max().unwrap_or(1);
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("V_s of the atomic sum, {}, n={n_max}", dist.name()), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(40)
            .build_cartesian_2d(lo..hi, 0u32..top + 1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("V_s")
            .y_desc("runs")
            .x_labels(4)
            .x_label_formatter(&|x| format!("{x:.1e}"))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(counts.iter().enumerate().map(|(i, &c)| {
                let x0 = lo + i as f64 * width;
                Rectangle::new([(x0, 0), (x0 + width, c)], BLUE.mix(0.6).filled())
            }))
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)
}

/// Distinct outputs (of `reps` runs) against size, per kernel and thread count.
fn plot_distinct(out: &Path, sums: &[SumRow], plan: &Plan) -> anyhow::Result<()> {
    let path = out.join("distinct_outputs.svg");
    let root = SVGBackend::new(&path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let x_max = plan.sizes.iter().copied().max().unwrap_or(10) as f64;
    let x_min = plan.sizes.iter().copied().min().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Distinct sums in {} runs (worst input distribution)", plan.reps), ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(45)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0u32..plan.reps as u32 + 1)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("elements")
        .y_desc("distinct outputs")
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .draw()
        .map_err(plot_err)?;
    let palette = [&RED, &BLUE, &GREEN, &MAGENTA, &CYAN];
    for (k, &threads) in plan.threads.iter().enumerate() {
        let color = palette[k % palette.len()];
        let points: Vec<(f64, u32)> = plan
            .sizes
            .iter()
            .map(|&n| {
                let worst = sums
                    .iter()
                    .filter(|r| r.n == n && r.threads == threads)
                    .map(|r| r.distinct_atomic as u32)
                    .max()
                    .unwrap_or(0);
                (n as f64, worst)
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color))
            .map_err(plot_err)?
            .label(format!("atomic, {threads} threads"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(plot_err)?;
    }
    let repro: Vec<(f64, u32)> = plan
        .sizes
        .iter()
        .map(|&n| (n as f64, sums.iter().filter(|r| r.n == n).map(|r| r.distinct_repro as u32).max().unwrap_or(0)))
        .collect();
    chart
        .draw_series(LineSeries::new(repro, BLACK.stroke_width(2)))
        .map_err(plot_err)?
        .label("tree and reproducible")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(plot_err)?;
    root.present().map_err(plot_err)
}

/// Final test accuracy of every training run, per accumulation mode.
fn plot_training(out: &Path, runs: &[TrainRun]) -> anyhow::Result<()> {
    let path = out.join("training_accuracy.svg");
    let root = SVGBackend::new(&path, (560, 380)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let accs: Vec<f64> = runs.iter().map(|r| r.accuracy).collect();
    let (lo, hi) = accs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.2).max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption("Final test accuracy per run", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..1.5f64, (lo - pad)..(hi + pad))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_labels(2)
        .x_label_formatter(&|x| if *x < 0.5 { "atomic".into() } else { "reproducible".into() })
        .y_desc("accuracy")
        .y_label_formatter(&|y| format!("{y:.4}"))
        .draw()
        .map_err(plot_err)?;
    for r in runs {
        let x = if r.mode == Accumulation::Atomic { 0.0 } else { 1.0 } + (r.run as f64 * 0.37).fract() * 0.3 - 0.15;
        let color = if r.mode == Accumulation::Atomic { &RED } else { &BLUE };
        chart.draw_series(std::iter::once(Circle::new((x, r.accuracy), 4, color.filled()))).map_err(plot_err)?;
    }
    root.present().map_err(plot_err)
}
