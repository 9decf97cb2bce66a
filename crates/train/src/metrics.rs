//! `metrics.jsonl`: what a run reports, one JSON object per line, flushed as written, so
//! that a run killed at any instant leaves every line it finished.
//!
//! A job of several replicas keeps one record, written by one process at a time. A static
//! job's record is rank 0's (a pipeline's, the rank that holds the loss). An elastic job's
//! is passed from process to process ([`MetricsFile::in_turns`]): the lowest-ranked member
//! of each epoch writes it, so that the record goes on when worker 0 (or its whole node) is
//! lost, and a replacement of worker 0 takes it back when it joins.

use std::io::Write;
use std::path::PathBuf;

use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::TrainError;

/// `metrics.jsonl`: one JSON object per line, flushed as written.
pub struct MetricsFile {
    file: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    /// The directory a process that takes the record over opens it in (appending).
    dir: Option<PathBuf>,
    /// Whether this process writes the record now: lines written while it does not are
    /// dropped (another process writes them).
    holding: bool,
}

impl MetricsFile {
    /// Opens `dir/metrics.jsonl` (appending when a run resumes); writes nothing without a
    /// directory.
    pub fn create(dir: Option<&PathBuf>, append: bool) -> Result<Self, TrainError> {
        let mut m = MetricsFile { file: None, dir: dir.cloned(), holding: true };
        m.open(append)?;
        Ok(m)
    }

    /// The record of an elastic job, which its workers write in turns: opened now (as
    /// [`MetricsFile::create`] does) when this process `holds` it from the start (worker
    /// 0, before any epoch); otherwise opened, appending, when [`MetricsFile::hold`] first
    /// hands it over. Writes nothing without a directory.
    pub fn in_turns(dir: Option<&PathBuf>, holds: bool, append: bool) -> Result<Self, TrainError> {
        let mut m = MetricsFile { file: None, dir: dir.cloned(), holding: holds };
        if holds {
            m.open(append)?;
        }
        Ok(m)
    }

    /// Takes the record over (`true`: from now on this process writes it, opening the file
    /// to append if it has not yet) or hands it on (`false`: lines are dropped).
    pub fn hold(&mut self, holds: bool) -> Result<(), TrainError> {
        if holds && !self.holding {
            tracing::debug!("this process writes the job's metrics.jsonl from now on");
        }
        self.holding = holds;
        if holds && self.file.is_none() {
            self.open(true)?;
        }
        Ok(())
    }

    /// Whether this process writes the record now.
    pub fn holding(&self) -> bool {
        self.holding && self.file.is_some()
    }

    fn open(&mut self, append: bool) -> Result<(), TrainError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join("metrics.jsonl");
        let err = |source| TrainError::Output { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(err)?;
        // Always in append mode, emptied first where a fresh run starts: a process whose
        // turn comes back then writes after what the others wrote, never over it.
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(err)?;
        if !append {
            f.set_len(0).map_err(err)?;
        }
        self.file = Some((path, std::io::BufWriter::new(f)));
        Ok(())
    }

    /// Writes one line, stamped with the time it was written (`"time"`, seconds since the
    /// Unix epoch), so that the lines of a job's processes, and of its restarts, fall on
    /// one time line. (Nothing while another process holds the record.)
    pub fn write(&mut self, mut value: serde_json::Value) -> Result<(), TrainError> {
        if !self.holding {
            return Ok(());
        }
        if let Some((path, w)) = &mut self.file {
            if let Some(object) = value.as_object_mut() {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                // Milliseconds are enough, and keep the lines short.
                let seconds = (now.as_secs_f64() * 1000.0).round() / 1000.0;
                object.insert("time".into(), serde_json::json!(seconds));
            }
            // One write per line (the buffer holds it whole): processes that append to
            // the same file in turns never split each other's lines.
            writeln!(w, "{value}")
                .and_then(|()| w.flush())
                .map_err(|source| TrainError::Output { path: path.clone(), source })?;
        }
        Ok(())
    }
}

/// Progress reported while training.
#[derive(Clone, Debug)]
pub enum Progress<'a> {
    /// Training starts.
    Started {
        /// Steps to run.
        steps: u64,
        /// Number of model parameters.
        parameters: usize,
    },
    /// A step finished.
    Step {
        /// Steps done so far.
        step: u64,
        /// Mean training loss of that step.
        loss: f32,
    },
    /// An evaluation finished.
    Eval(&'a EvalReport),
    /// A line for whoever watches the run: a change in an elastic job's membership, a
    /// resumption from a checkpoint.
    Note(String),
}

pub(crate) fn write_eval(
    metrics: &mut MetricsFile,
    report: &EvalReport,
    unigram: Option<f64>,
) -> Result<(), TrainError> {
    let mut line = json!({
        "kind": "eval", "step": report.step, "test_loss": report.loss, "test_accuracy": report.accuracy,
    });
    if let Some(p) = report.perplexity {
        line["test_perplexity"] = json!(p);
        line["unigram_perplexity"] = json!(unigram);
    }
    metrics.write(line)
}

/// What every runner keeps of its steps beside the state, kept once for the static and
/// the elastic runner: the record, whoever watches the run, the time spent in steps and
/// the last step's loss.
pub(crate) struct Ledger<'e> {
    pub metrics: MetricsFile,
    pub on_event: &'e mut dyn FnMut(Progress),
    /// When the step in progress started.
    pub started: Instant,
    /// Time spent in steps, up to each one's update (evaluation and checkpoints excluded).
    pub train_time: Duration,
    /// The mean loss of the last step taken.
    pub last_loss: f32,
}

impl<'e> Ledger<'e> {
    pub fn new(metrics: MetricsFile, on_event: &'e mut dyn FnMut(Progress)) -> Ledger<'e> {
        Ledger { metrics, on_event, started: Instant::now(), train_time: Duration::ZERO, last_loss: f32::NAN }
    }

    /// A step's update is done, with `loss`, and the state is at `step`: its time counts,
    /// and its loss is recorded and shown.
    pub fn stepped(&mut self, step: u64, loss: f32) -> Result<(), TrainError> {
        self.train_time += self.started.elapsed();
        self.last_loss = loss;
        self.metrics.write(json!({"kind": "train", "step": step, "loss": loss}))?;
        (self.on_event)(Progress::Step { step, loss });
        Ok(())
    }

    /// An evaluation: recorded and shown.
    pub fn evaluated(&mut self, report: &EvalReport, unigram: Option<f64>) -> Result<(), TrainError> {
        write_eval(&mut self.metrics, report, unigram)?;
        (self.on_event)(Progress::Eval(report));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn the_record_passes_from_process_to_process_and_keeps_every_line() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "{\"kind\":\"stale\"}\n").unwrap();
        // Worker 0 holds it from the start (a fresh run: the stale line goes); worker 1
        // does not, and opens nothing.
        let mut w0 = MetricsFile::in_turns(Some(&dir), true, false).unwrap();
        let mut w1 = MetricsFile::in_turns(Some(&dir), false, false).unwrap();
        w0.write(serde_json::json!({"kind": "train", "step": 1})).unwrap();
        w1.write(serde_json::json!({"kind": "train", "step": 1})).unwrap();
        assert!(w0.holding() && !w1.holding());
        // Worker 0 is lost; worker 1 is the lowest member of the next epoch.
        w1.hold(true).unwrap();
        w1.write(serde_json::json!({"kind": "train", "step": 2})).unwrap();
        // Worker 0's replacement joins and takes the record back.
        let mut w0b = MetricsFile::in_turns(Some(&dir), false, true).unwrap();
        w1.hold(false).unwrap();
        w0b.hold(true).unwrap();
        w1.write(serde_json::json!({"kind": "train", "step": 3})).unwrap();
        w0b.write(serde_json::json!({"kind": "train", "step": 3})).unwrap();
        let got: Vec<u64> = lines(&dir).iter().map(|v| v["step"].as_u64().unwrap()).collect();
        assert_eq!(got, [1, 2, 3]);
        assert!(lines(&dir).iter().all(|v| v["time"].as_f64().is_some()));
    }
}

/// Held-out quality at one step.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Step after which it was measured.
    pub step: u64,
    /// Mean cross-entropy per example (per token for text), in nats.
    pub loss: f64,
    /// Arg-max accuracy (images) or next-token accuracy (text).
    pub accuracy: f64,
    /// `exp(loss)`, for text.
    pub perplexity: Option<f64>,
}
