//! The floating-point non-associativity lab: run-to-run variability of parallel
//! reductions whose order depends on thread timing (atomic adds), against fixed-order and
//! reproducible versions, with the FPNA study's metrics; then a model trained repeatedly
//! with atomic-order and with reproducible gradient accumulation, and the spread of the
//! outcomes. [`write_outputs`] writes CSV tables, SVG plots and `summary.json`.
//!
//! The training experiment takes the runtime's own step ([`train::step`]) and replaces
//! only the local reduction: racing atomic adds ([`repro::fpna::racy_sum_parts`]), the
//! kernel GPU frameworks use, which the training runtime itself does not offer.

pub mod text;

use std::path::Path;
use std::time::Instant;

use plotters::prelude::*;
use repro::fpna;
use repro::metrics::{array_variability, distinct_outputs, scalar_variability};
use repro::rng::Stream;
use serde::{Deserialize, Serialize};
use train::TrainConfig;
use train::data::DataKind;
use train::driver::{Driver, Flow, Reduction, Runner};
use train::model::ModelKind;
use train::step::{At, GradBuffer, NoHooks};
use train::trainer::Prepared;

use crate::LabError;
use crate::table;
use repro::words::Word;

/// The distribution the summed values are drawn from (a [`Word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Uniform in [0, 1).
    Uniform,
    /// Standard normal.
    Normal,
    /// Random sign and exponents spanning 2^-20 .. 2^20.
    Mixed,
}

impl Dist {
    /// Every distribution.
    pub const ALL: [Dist; 3] = [Dist::Uniform, Dist::Normal, Dist::Mixed];
}

impl Word for Dist {
    const KIND: &'static str = "distribution";
    const ALL: &'static [Self] = &Dist::ALL;
    fn word(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Normal => "normal",
            Dist::Mixed => "mixed",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform in [0, 1)",
            Dist::Normal => "standard normal",
            Dist::Mixed => "random sign and exponents spanning 2^-20 .. 2^20",
        }
    }
}
repro::text_form!(Dist);

/// What to measure: the sizes, distributions, thread counts and repetitions of the sweeps,
/// and the training experiment's runs.
#[derive(Clone, Debug)]
pub struct Sweeps {
    /// Array sizes of the sum sweep.
    pub sizes: Vec<usize>,
    /// Distributions of the inputs.
    pub dists: Vec<Dist>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Repetitions per configuration (at least 2).
    pub reps: usize,
    /// Sizes of the index-add sweep.
    pub index_sizes: Vec<usize>,
    /// Training runs per accumulation (0 skips the experiment).
    pub train_runs: usize,
    /// Steps per training run.
    pub train_steps: u64,
    /// Data set of the training experiment.
    pub data: DataKind,
    /// Seed of the inputs.
    pub seed: u64,
}

impl Sweeps {
    /// Units of work the sweeps and the experiment report through their progress callback.
    pub fn work(&self) -> u64 {
        (self.dists.len() * (self.sizes.len() + self.index_sizes.len()) * self.threads.len() + 2 * self.train_runs)
            as u64
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

/// One configuration of the sum sweep: a distribution, size and thread count, over the
/// repetitions (an entry of `summary.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SumRow {
    /// See the tables' columns of the same name.
    pub dist: Dist,
    /// See the tables' columns of the same name.
    pub n: usize,
    /// See the tables' columns of the same name.
    pub threads: usize,
    /// `V_s = 1 - |S_atomic / S_tree|` of each repetition.
    pub vs: Vec<f64>,
    /// See the tables' columns of the same name.
    pub distinct_atomic: usize,
    /// See the tables' columns of the same name.
    pub distinct_tree: usize,
    /// See the tables' columns of the same name.
    pub distinct_repro: usize,
    /// See the tables' columns of the same name.
    pub atomic_ms: f64,
    /// See the tables' columns of the same name.
    pub tree_ms: f64,
    /// See the tables' columns of the same name.
    pub repro_ms: f64,
    /// The largest relative error of an atomic sum against the exact sum.
    pub max_relative_error_atomic: f64,
}

impl SumRow {
    /// The mean of `|V_s|` over the repetitions.
    pub fn mean_abs_vs(&self) -> f64 {
        self.vs.iter().map(|v| v.abs()).sum::<f64>() / self.vs.len() as f64
    }

    /// The largest `|V_s|`.
    pub fn max_abs_vs(&self) -> f64 {
        self.vs.iter().map(|v| v.abs()).fold(0.0, f64::max)
    }
}

/// `sums.csv`: one repetition of one configuration of the sum sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SumSample {
    /// The distribution.
    pub dist: Dist,
    /// Elements summed.
    pub n: usize,
    /// Threads racing.
    pub threads: usize,
    /// The repetition.
    pub rep: usize,
    /// `1 - |S_atomic / S_tree|`.
    pub v_s: f64,
}

/// `index_add.csv`: one configuration of the index-add sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexRow {
    /// See the tables' columns of the same name.
    pub dist: Dist,
    /// See the tables' columns of the same name.
    pub n: usize,
    /// See the tables' columns of the same name.
    pub threads: usize,
    /// See the tables' columns of the same name.
    pub mean_relative_difference: f64,
    /// See the tables' columns of the same name.
    pub fraction_differing: f64,
    /// See the tables' columns of the same name.
    pub distinct_atomic: usize,
    /// See the tables' columns of the same name.
    pub distinct_sorted: usize,
    /// See the tables' columns of the same name.
    pub atomic_ms: f64,
    /// See the tables' columns of the same name.
    pub sorted_ms: f64,
}

/// The sum sweep: for each distribution, size and thread count, `plan.reps` runs of the
/// atomic, tree and reproducible sums. Calls `progress` before each configuration.
pub fn sum_sweep(plan: &Sweeps, progress: &mut dyn FnMut(&str)) -> Vec<SumRow> {
    let mut sums = Vec::new();
    for &dist in &plan.dists {
        for &n in &plan.sizes {
            let xs = inputs(dist, n, plan.seed);
            let exact = f64::from(repro::sum::sum(&xs));
            for &threads in &plan.threads {
                progress(&format!("sum {} n={n} threads={threads}", dist));
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
                    max_relative_error_atomic: atomic
                        .iter()
                        .map(|&a| (f64::from(a) - exact).abs() / scale)
                        .fold(0.0, f64::max),
                });
            }
        }
    }

    sums
}

/// The index-add sweep: atomic against sorted (deterministic) scatter-adds. Calls
/// `progress` before each configuration.
pub fn index_sweep(plan: &Sweeps, progress: &mut dyn FnMut(&str)) -> Vec<IndexRow> {
    let mut index_rows = Vec::new();
    for &dist in &plan.dists {
        for &n in &plan.index_sizes {
            let values = inputs(dist, n, plan.seed ^ 1);
            let targets = (n / 32).max(1);
            let mut s = Stream::for_purpose(plan.seed, "fpna.index", &[n as u64]);
            let index: Vec<u32> = (0..n).map(|_| s.below(targets as u64) as u32).collect();
            for &threads in &plan.threads {
                progress(&format!("index_add {} n={n} threads={threads}", dist));
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
                    mean_relative_difference: mean(&|v| v.mean_relative_difference),
                    fraction_differing: mean(&|v| v.fraction_differing),
                    distinct_atomic: distinct_outputs(outs.iter().map(|o| o.as_slice())),
                    distinct_sorted: distinct_outputs(sorted_outs.iter().map(|o| o.as_slice())),
                    atomic_ms: median_ms(ta),
                    sorted_ms: median_ms(ts),
                });
            }
        }
    }

    index_rows
}

/// How the training experiment sums micro-batch gradients (a [`Word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulation {
    /// Racing threads adding with atomics: the order, and the bits, change from run to
    /// run, as GPU atomics do.
    Atomic,
    /// The reproducible sum of the training runtime.
    Reproducible,
}

impl Accumulation {
    /// Both, atomic first.
    pub const ALL: [Accumulation; 2] = [Accumulation::Atomic, Accumulation::Reproducible];
}

impl Word for Accumulation {
    const KIND: &'static str = "accumulation";
    const ALL: &'static [Self] = &Accumulation::ALL;
    fn word(self) -> &'static str {
        match self {
            Accumulation::Atomic => "atomic",
            Accumulation::Reproducible => "reproducible",
        }
    }
    fn help(self) -> &'static str {
        match self {
            Accumulation::Atomic => "racing atomic adds, as GPU kernels do",
            Accumulation::Reproducible => "the training runtime's reproducible sum",
        }
    }
}
repro::text_form!(Accumulation);

/// Outcome of one training run: a row of `training.csv` (all but the parameters).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainRun {
    /// The accumulation.
    pub mode: Accumulation,
    /// The run's number.
    pub run: usize,
    /// Training loss of the last step.
    #[serde(rename = "final_loss")]
    pub loss: f32,
    /// Held-out accuracy at the end.
    #[serde(rename = "test_accuracy")]
    pub accuracy: f64,
    /// The final state's fingerprint, as `steadfast train` prints it.
    #[serde(with = "hex16")]
    pub fingerprint: u64,
    /// The final parameters, flat.
    #[serde(skip)]
    pub params: Vec<f32>,
}

/// A fingerprint as 16 hexadecimal digits.
mod hex16 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        u64::from_str_radix(&s, 16).map_err(serde::de::Error::custom)
    }
}

/// The training experiment's runs, and the spread of each accumulation's runs.
#[derive(Clone, Debug)]
pub struct Training {
    /// Every run, atomic first.
    pub runs: Vec<TrainRun>,
    /// One per accumulation, in [`Accumulation::ALL`] order.
    pub modes: Vec<ModeSummary>,
}

/// Trains the MLP `plan.train_runs` times per accumulation (batch 128 as 8 micro-batches
/// of 16), calling `progress` before each run. The data are loaded once.
pub fn training_experiment(plan: &Sweeps, progress: &mut dyn FnMut(&str)) -> Result<Training, LabError> {
    if plan.train_steps == 0 {
        return Err(LabError::Spec("the training experiment needs at least 1 step".into()));
    }
    let mut c = TrainConfig::defaults(ModelKind::Mlp);
    c.data = plan.data;
    c.steps = plan.train_steps;
    c.batch = 128;
    c.micro_batch = 16;
    c.reduce = comm::ReduceMode::Reproducible;
    let prepared = Prepared::load(&c)?;
    let mut runs = Vec::new();
    for mode in Accumulation::ALL {
        for run in 0..plan.train_runs {
            progress(&format!("training run {} ({})", run + 1, mode));
            runs.push(train_once(&prepared, &c, mode, run)?);
        }
    }
    let modes = Accumulation::ALL.map(|m| mode_summary(&runs, m)).to_vec();
    Ok(Training { runs, modes })
}

/// Trains `c` with the training runtime's step, summing the micro-batch gradients as
/// `mode` says, and scores the result.
fn train_once(
    prepared: &Prepared,
    c: &TrainConfig,
    mode: Accumulation,
    run: usize,
) -> Result<TrainRun, train::TrainError> {
    let (mut state, mut engine) = prepared.start(c);
    let ops = train::schedule::data_parallel(engine.sampler().micro_batches(), 0, 1);
    let mut driver = Driver::new(&engine, 0);
    while state.step < c.steps {
        driver.run(&ops, 0, &mut engine, &mut state, &mut NoHooks, &mut Accumulate(mode))?;
    }
    let eval = engine.with_model(&state.params, |m| train::trainer::evaluate(m, &prepared.data, state.step));
    Ok(TrainRun {
        mode,
        run,
        loss: driver.sum().loss(),
        accuracy: eval.accuracy,
        fingerprint: state.fingerprint(),
        params: state.params.iter().flat_map(|p| p.data.iter().copied()).collect(),
    })
}

/// The experiment's runner: one process sums its micro-batches as the accumulation
/// says, and applies whatever it gets (the experiment measures, it does not guard).
struct Accumulate(Accumulation);

impl Runner for Accumulate {
    fn reduce(&mut self, _at: At, r: Reduction<'_, '_>) -> Result<Flow, train::TrainError> {
        match self.0 {
            Accumulation::Atomic => {
                let parts: Vec<&[f32]> = r.parts.iter().map(|b| b.as_slice()).collect();
                r.sum.as_mut_slice().copy_from_slice(&fpna::racy_sum_parts(&parts));
            }
            Accumulation::Reproducible => r.local(),
        }
        Ok(Flow::Go)
    }

    fn vote(&mut self, _at: At, _sum: &GradBuffer) -> Result<Flow, train::TrainError> {
        Ok(Flow::Go)
    }
}

/// Mean, standard deviation, min and max. Identical values have a standard deviation of
/// exactly 0 (not the rounding noise of the mean).
pub fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
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

/// The spread of the runs of one accumulation (an entry of `summary.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModeSummary {
    /// The accumulation.
    pub mode: Accumulation,
    /// Runs.
    pub runs: usize,
    /// Distinct final fingerprints among them.
    pub distinct_fingerprints: usize,
    /// Mean held-out accuracy.
    pub accuracy_mean: f64,
    /// Its standard deviation (exactly 0 when every run agrees).
    pub accuracy_sd: f64,
    /// The lowest accuracy.
    pub accuracy_min: f64,
    /// The highest.
    pub accuracy_max: f64,
    /// Mean final training loss.
    pub loss_mean: f64,
    /// Its standard deviation.
    pub loss_sd: f64,
    /// Mean relative difference of the final weights from run 1's.
    pub weights_mean_relative_difference_vs_run_1: f64,
    /// Mean fraction of the final weights that differ from run 1's.
    pub weights_fraction_differing_vs_run_1: f64,
}

/// The spread of the runs of one accumulation.
pub fn mode_summary(runs: &[TrainRun], mode: Accumulation) -> ModeSummary {
    let mine: Vec<&TrainRun> = runs.iter().filter(|r| r.mode == mode).collect();
    let acc: Vec<f64> = mine.iter().map(|r| r.accuracy).collect();
    let loss: Vec<f64> = mine.iter().map(|r| f64::from(r.loss)).collect();
    let (accuracy_mean, accuracy_sd, accuracy_min, accuracy_max) = stats(&acc);
    let (loss_mean, loss_sd, _, _) = stats(&loss);
    let first = &mine[0].params;
    let against_first: Vec<_> = mine.iter().skip(1).map(|r| array_variability(&r.params, first)).collect();
    let mean_of = |v: Vec<f64>| if v.is_empty() { 0.0 } else { stats(&v).0 };
    ModeSummary {
        mode,
        runs: mine.len(),
        distinct_fingerprints: mine.iter().map(|r| r.fingerprint).collect::<std::collections::BTreeSet<_>>().len(),
        accuracy_mean,
        accuracy_sd,
        accuracy_min,
        accuracy_max,
        loss_mean,
        loss_sd,
        weights_mean_relative_difference_vs_run_1: mean_of(
            against_first.iter().map(|v| v.mean_relative_difference).collect(),
        ),
        weights_fraction_differing_vs_run_1: mean_of(against_first.iter().map(|v| v.fraction_differing).collect()),
    }
}

/// `summary.json`: the sweeps and the training experiment's spread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudySummary {
    /// Repetitions per configuration.
    pub reps: usize,
    /// The sum sweep.
    pub sums: Vec<SumRow>,
    /// The index-add sweep.
    pub index_add: Vec<IndexRow>,
    /// The training experiment, one entry per accumulation (absent when skipped).
    pub training: Option<Vec<ModeSummary>>,
}

/// Writes the tables (`sums.csv`, `index_add.csv`, `training.csv`), `summary.json` and
/// the plots into `out`.
pub fn write_outputs(
    out: &Path,
    sums: &[SumRow],
    index: &[IndexRow],
    training: Option<&Training>,
    plan: &Sweeps,
) -> Result<(), LabError> {
    std::fs::create_dir_all(out).map_err(LabError::output(out))?;
    let samples: Vec<SumSample> = sums
        .iter()
        .flat_map(|r| {
            r.vs.iter().enumerate().map(|(rep, &v_s)| SumSample { dist: r.dist, n: r.n, threads: r.threads, rep, v_s })
        })
        .collect();
    table::write(&out.join("sums.csv"), &samples)?;
    table::write(&out.join("index_add.csv"), index)?;
    table::write(&out.join("training.csv"), training.map_or(&[][..], |t| t.runs.as_slice()))?;
    let summary = StudySummary {
        reps: plan.reps,
        sums: sums.to_vec(),
        index_add: index.to_vec(),
        training: training.map(|t| t.modes.clone()),
    };
    let path = out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("plain JSON values"))
        .map_err(LabError::output(&path))?;
    plot_vs_histograms(out, sums)?;
    plot_distinct(out, sums, plan)?;
    if let Some(t) = training {
        plot_training(out, &t.runs)?;
    }
    Ok(())
}

/// Histogram of V_s for the largest size, one panel per distribution.
fn plot_vs_histograms(out: &Path, sums: &[SumRow]) -> Result<(), LabError> {
    let path = out.join("vs_histogram.svg");
    let dists: Vec<Dist> = sums.iter().map(|r| r.dist).fold(Vec::new(), |mut v, d| {
        if !v.contains(&d) {
            v.push(d);
        }
        v
    });
    let root = SVGBackend::new(&path, (400 * dists.len().max(1) as u32, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(LabError::plot)?;
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
            .caption(format!("V_s of the atomic sum, {}, n={n_max}", dist), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(40)
            .build_cartesian_2d(lo..hi, 0u32..top + 1)
            .map_err(LabError::plot)?;
        chart
            .configure_mesh()
            .x_desc("V_s")
            .y_desc("runs")
            .x_labels(4)
            .x_label_formatter(&|x| format!("{x:.1e}"))
            .draw()
            .map_err(LabError::plot)?;
        chart
            .draw_series(counts.iter().enumerate().map(|(i, &c)| {
                let x0 = lo + i as f64 * width;
                Rectangle::new([(x0, 0), (x0 + width, c)], BLUE.mix(0.6).filled())
            }))
            .map_err(LabError::plot)?;
    }
    root.present().map_err(LabError::plot)
}

/// Distinct outputs (of `reps` runs) against size, per kernel and thread count.
fn plot_distinct(out: &Path, sums: &[SumRow], plan: &Sweeps) -> Result<(), LabError> {
    let path = out.join("distinct_outputs.svg");
    let root = SVGBackend::new(&path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(LabError::plot)?;
    let x_max = plan.sizes.iter().copied().max().unwrap_or(10) as f64;
    let x_min = plan.sizes.iter().copied().min().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Distinct sums in {} runs (worst input distribution)", plan.reps), ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(45)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0u32..plan.reps as u32 + 1)
        .map_err(LabError::plot)?;
    chart
        .configure_mesh()
        .x_desc("elements")
        .y_desc("distinct outputs")
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .draw()
        .map_err(LabError::plot)?;
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
            .map_err(LabError::plot)?
            .label(format!("atomic, {threads} threads"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(LabError::plot)?;
    }
    let repro: Vec<(f64, u32)> = plan
        .sizes
        .iter()
        .map(|&n| (n as f64, sums.iter().filter(|r| r.n == n).map(|r| r.distinct_repro as u32).max().unwrap_or(0)))
        .collect();
    chart
        .draw_series(LineSeries::new(repro, BLACK.stroke_width(2)))
        .map_err(LabError::plot)?
        .label("tree and reproducible")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(LabError::plot)?;
    root.present().map_err(LabError::plot)
}

/// Final test accuracy of every training run, per accumulation mode.
fn plot_training(out: &Path, runs: &[TrainRun]) -> Result<(), LabError> {
    let path = out.join("training_accuracy.svg");
    let root = SVGBackend::new(&path, (560, 380)).into_drawing_area();
    root.fill(&WHITE).map_err(LabError::plot)?;
    let accs: Vec<f64> = runs.iter().map(|r| r.accuracy).collect();
    let (lo, hi) = accs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.2).max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption("Final test accuracy per run", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..1.5f64, (lo - pad)..(hi + pad))
        .map_err(LabError::plot)?;
    chart
        .configure_mesh()
        .x_labels(2)
        .x_label_formatter(&|x| if *x < 0.5 { "atomic".into() } else { "reproducible".into() })
        .y_desc("accuracy")
        .y_label_formatter(&|y| format!("{y:.4}"))
        .draw()
        .map_err(LabError::plot)?;
    for r in runs {
        let x = if r.mode == Accumulation::Atomic { 0.0 } else { 1.0 } + (r.run as f64 * 0.37).fract() * 0.3 - 0.15;
        let color = if r.mode == Accumulation::Atomic { &RED } else { &BLUE };
        chart.draw_series(std::iter::once(Circle::new((x, r.accuracy), 4, color.filled()))).map_err(LabError::plot)?;
    }
    root.present().map_err(LabError::plot)
}
