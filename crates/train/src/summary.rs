//! The summary of a run as `steadfast train` prints it: one line a fact, the fingerprint
//! last, with the kernels that computed it (bits computed by another kernel set differ,
//! and the line says so where fingerprints are compared).

use std::fmt::Write;

use crate::config::TrainConfig;
use crate::trainer::Summary;

/// The lines that end a run of `config` that produced `summary`.
pub fn text(config: &TrainConfig, summary: &Summary) -> String {
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    line(format!("model:        {:?} on {:?}, {} parameters", config.model, config.data, summary.parameters));
    if summary.resumed_from >= summary.steps {
        // A resume from the last step: nothing was trained, so there is no loss or speed.
        line(format!("steps:        0 (the checkpoint is at step {}: no step left to train)", config.steps));
    } else {
        let seconds = summary.train_time.as_secs_f64();
        line(format!(
            "steps:        {} at {:.1} steps/s (optimizer {:.1}% of step time)",
            summary.steps,
            summary.steps as f64 / seconds,
            100.0 * summary.optimizer_time.as_secs_f64() / seconds
        ));
        line(format!("final loss:   {:.4}", summary.final_loss));
    }
    line(format!("test loss:    {:.4}", summary.eval.loss));
    line(format!("test accuracy: {:.2}%", 100.0 * summary.eval.accuracy));
    if let (Some(p), Some(u)) = (summary.eval.perplexity, summary.unigram_perplexity) {
        line(format!("perplexity:   {p:.3} (unigram baseline {u:.3})"));
    }
    if summary.resumed_from > 0 {
        line(format!("resumed from: step {}", summary.resumed_from));
    }
    let ck = &summary.checkpoints;
    if ck.committed > 0 {
        line(format!(
            "checkpoints:  {} committed ({} due steps passed over while the writer was busy), {} MB, training \
             stalled {:.1} ms in all (max {:.1} ms), persist {:.1} ms in all",
            ck.committed,
            summary.checkpoints_deferred,
            ck.bytes / 1_000_000,
            ck.stall.as_secs_f64() * 1e3,
            ck.max_stall.as_secs_f64() * 1e3,
            ck.persist.as_secs_f64() * 1e3
        ));
    }
    if let Some(log) = &summary.boundary_log {
        line(format!(
            "boundary log: {:.3} MB in {} tensors over {} steps (this rank's), training stalled {:.1} ms for it",
            log.bytes as f64 / 1e6,
            log.records,
            log.steps,
            log.stall.as_secs_f64() * 1e3
        ));
    }
    if let Some(out) = &config.out_dir {
        line(format!("metrics:      {}", out.join("metrics.jsonl").display()));
    }
    let _ = writeln!(s, "fingerprint: {} ({})", repro::fingerprint::hex(summary.fingerprint), summary.kernels);
    s
}
