//! The lab's results as the text tables that `steadfast fpna` prints.

use std::fmt::Write;

use repro::words::Word;

use super::{IndexRow, SumRow, Sweeps, Training};

/// `writeln!` into a `String`, which cannot fail.
macro_rules! row {
    ($out:expr, $($arg:tt)*) => {
        let _ = writeln!($out, $($arg)*);
    };
}

/// The sums, the index-adds and the training runs as aligned text tables.
pub fn tables(sums: &[SumRow], index: &[IndexRow], training: Option<&Training>, plan: &Sweeps) -> String {
    let mut out = String::new();
    row!(out, "Parallel sums, {} repetitions each (V_s = 1 - |S_atomic / S_tree|):", plan.reps);
    row!(
        out,
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
        row!(
            out,
            "{:<8} {:>9} {:>7} {:>10.2e} {:>10.2e} {:>9} {:>9} {:>9} {:>9.3} {:>9.3} {:>9.3}",
            r.dist.word(),
            r.n,
            r.threads,
            r.mean_abs_vs(),
            r.max_abs_vs(),
            r.distinct_atomic,
            r.distinct_tree,
            r.distinct_repro,
            r.atomic_ms,
            r.tree_ms,
            r.repro_ms
        );
    }
    row!(out, "\nIndex-add (scatter), n pairs into n/32 targets, against the sorted deterministic version:");
    row!(
        out,
        "{:<8} {:>9} {:>7} {:>12} {:>10} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "dist",
        "n",
        "threads",
        "mean rel",
        "differ",
        "distinct",
        "sorted",
        "atomic ms",
        "sorted ms",
        "cost"
    );
    for r in index {
        row!(
            out,
            "{:<8} {:>9} {:>7} {:>12.2e} {:>10.4} {:>9} {:>9} {:>10.3} {:>10.3} {:>7.2}x",
            r.dist.word(),
            r.n,
            r.threads,
            r.mean_relative_difference,
            r.fraction_differing,
            r.distinct_atomic,
            r.distinct_sorted,
            r.atomic_ms,
            r.sorted_ms,
            r.sorted_ms / r.atomic_ms
        );
    }
    if let Some(training) = training {
        row!(
            out,
            "\nTraining the MLP {} times per mode ({} steps, batch 128 as 8 micro-batches of 16, {}):",
            plan.train_runs,
            plan.train_steps,
            plan.data
        );
        for s in &training.modes {
            row!(
                out,
                "{:<13} accuracy {:.4} +/- {:.1e} (min {:.4}, max {:.4}), loss sd {:.2e}, distinct fingerprints {}/{}, weights differ from run 1 in {:.1}% of elements",
                s.mode.word(),
                s.accuracy_mean,
                s.accuracy_sd,
                s.accuracy_min,
                s.accuracy_max,
                s.loss_sd,
                s.distinct_fingerprints,
                s.runs,
                100.0 * s.weights_fraction_differing_vs_run_1
            );
        }
    }
    out
}
