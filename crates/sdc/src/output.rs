//! A campaign's results as files: the CSV tables of [`crate::rows`], the spec it ran,
//! and a Markdown summary for people; and the texts that describe a campaign and a trial.
//!
//! | file | holds |
//! |------|-------|
//! | `*.csv` | the tables, one row type each ([`Tables`]) |
//! | `spec.toml` | the spec, with every default written out (as its runner wrote it) |
//! | `summary.md` | the same tables, condensed |

use std::fmt::Write as _;
use std::path::Path;

use fault::campaign::Outcome;

use crate::rows::{SensitivityRow, Tables, sensitivity_rows};
use crate::{About, Detector, GoldenRecord, SdcError, TrialResult};

/// Writes every table of a finished campaign, its summary and its spec (`spec_text`, the
/// TOML its runner reads) into `dir`; returns the Markdown summary. A record that does not
/// fit its spec ([`crate::check`]) is refused before anything is written.
pub fn write(
    dir: &Path,
    about: &About,
    spec_text: &str,
    goldens: &[GoldenRecord],
    results: &[TrialResult],
    elapsed: std::time::Duration,
) -> Result<String, SdcError> {
    crate::check(about, goldens, results)?;
    std::fs::create_dir_all(dir).map_err(SdcError::output(dir))?;
    let tables = Tables::of(about, goldens, results);
    tables.write(dir)?;
    let golden_time: f64 = goldens.iter().map(|g| g.time.as_secs_f64()).sum();
    let summary = summary_md(about, &tables, elapsed.as_secs_f64(), golden_time);
    let path = dir.join("summary.md");
    std::fs::write(&path, &summary).map_err(SdcError::output(&path))?;
    let path = dir.join("spec.toml");
    std::fs::write(&path, spec_text).map_err(SdcError::output(&path))?;
    Ok(summary)
}

/// The campaign's title: what was trained (and in which framework, when not by Steadfast
/// itself), on how many replicas, how many trials.
pub fn headline(about: &About) -> String {
    let framework = about.framework.as_deref().map_or_else(String::new, |f| format!(" ({})", framework_name(f)));
    let data = if about.data.is_empty() { String::new() } else { format!(" on {}", about.data) };
    format!(
        "Campaign: {}{framework}{data}, {} replica(s), {} trial(s) x {} strategy(ies)",
        about.model,
        about.replicas,
        about.trials.count,
        about.reduce.len()
    )
}

/// A framework's name as people write it.
fn framework_name(word: &str) -> &str {
    match word {
        crate::about::PYTORCH => "PyTorch",
        other => other,
    }
}

/// What the trials inject, where, and what an alarm does.
pub fn faults(about: &About) -> String {
    let amount = match about.trials.rate {
        Some(rate) => format!("each candidate bit flipped with probability {rate}"),
        None => format!("{} flip(s)", about.trials.flips),
    };
    format!(
        "Faults: {amount} of `{}` bits, burst {}, in {:?}, injected at steps {:?}, then {} steps; \
         response to alarms: {:?}.",
        about.trials.bits,
        about.trials.burst,
        about.trials.state.iter().map(|k| k.name()).collect::<Vec<_>>(),
        about.trials.inject_at,
        about.trials.steps_after,
        about.detect.response,
    )
}

/// Trials grouped by the class of the highest bit flipped (`none`: nothing flipped).
fn by_bit_class(tables: &Tables) -> Vec<SensitivityRow> {
    sensitivity_rows(&tables.trials, |t| {
        Some(t.top_bit().map_or("none", |b| fault::BitClass::of_f32_bit(b).name()).to_owned())
    })
}

fn outcome_table(s: &mut String, key: &str, rows: &[SensitivityRow]) {
    let _ = write!(s, "| strategy | {key} | trials |");
    for o in Outcome::ALL {
        let _ = write!(s, " {} |", o.name());
    }
    let _ = write!(s, "\n|---|---|---:|");
    for _ in Outcome::ALL {
        s.push_str("---:|");
    }
    s.push('\n');
    for r in rows {
        let _ = write!(s, "| {} | {} | {} |", r.reduce, r.key, r.trials);
        for o in Outcome::ALL {
            match r.count(o) {
                0 => s.push_str(" 0 |"),
                c => {
                    let _ = write!(s, " {c} ({:.0}%) |", 100.0 * c as f64 / r.trials as f64);
                }
            }
        }
        s.push('\n');
    }
    s.push('\n');
}

fn summary_md(about: &About, tables: &Tables, elapsed: f64, golden_time: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", headline(about));
    let _ = writeln!(s, "{} Wall-clock {elapsed:.1} s ({golden_time:.1} s for the golden runs).\n", faults(about));
    s.push_str("## Outcomes by kind of state\n\n");
    outcome_table(&mut s, "state", &tables.by_state);
    s.push_str("## Outcomes by bit class\n\n");
    outcome_table(&mut s, "bits", &by_bit_class(tables));
    s.push_str("## Detectors\n\n");
    if about.detect.response != fault::campaign::Response::Observe {
        s.push_str(
            "Detection rates are meaningful with `response = \"observe\"`: here an alarm acts at once, so a \
             caught fault leaves no difference from golden to count as affected.\n\n",
        );
    }
    s.push_str(
        "| strategy | detector | caught / affected | caught / harmful | mean latency (steps) | false alarms / golden steps |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for d in &tables.detectors {
        let mean = d.mean_latency_steps.map_or("-".to_owned(), |m| format!("{m:.2}"));
        let _ = writeln!(
            s,
            "| {} | {} | {}/{} | {}/{} | {mean} | {}/{} |",
            d.reduce,
            d.detector,
            d.detected,
            d.affected_trials,
            d.harmful_detected,
            d.harmful_trials,
            d.false_alarms,
            d.golden_steps
        );
    }
    s
}

/// One trial in a few lines (what `steadfast campaign --replay` prints): its fault, the
/// flips, which detectors fired when, and how it ended.
pub fn trial(r: &TrialResult) -> String {
    let mut out = String::new();
    let t = &r.trial;
    let _ = writeln!(
        out,
        "trial {} [{}]: {} of rank {} at step {} (flip seed {}) -> {}",
        t.index,
        r.reduce,
        t.fault.state.name(),
        t.fault.rank,
        t.fault.step,
        t.fault.flips.seed,
        r.outcome.name()
    );
    for (rank, f) in &r.flips {
        let _ = writeln!(
            out,
            "  flipped {}[{}] bits {:?} on rank {rank}: {} -> {}",
            f.tensor, f.element, f.bits, f.old, f.new
        );
    }
    for d in Detector::ALL {
        if let Some(step) = r.first_alarm[d.index()] {
            let _ = writeln!(out, "  {} fired at step {step} ({} after the fault)", d, step - t.fault.step);
        }
    }
    if let Some((loss, acc)) = r.quality {
        let _ = writeln!(
            out,
            "  final test loss {loss:.6}, accuracy {acc:.4}; bitwise golden: {}",
            r.evidence.bitwise_golden
        );
    }
    if let Some(s) = r.rejoined {
        let _ = writeln!(out, "  state equal to golden again after step {s}");
    }
    let most = r.replica_differing.iter().flatten().max().copied().unwrap_or(0);
    let _ = writeln!(out, "  at most {most} elements differed from golden in one replica");
    if let Some(e) = &r.error {
        let _ = writeln!(out, "  error: {e}");
    }
    out
}
