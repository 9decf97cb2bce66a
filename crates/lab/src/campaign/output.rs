//! A campaign's results as files: CSV tables for tools and the report, and a Markdown
//! summary for people.
//!
//! | file | one row per |
//! |------|-------------|
//! | `trials.csv` | trial and strategy: the fault, the outcome, the alarms, the quality |
//! | `steps.csv` | trial, strategy and step: loss and elements differing per replica |
//! | `golden.csv` | strategy and step of the golden run: loss, gradient norm, false alarms |
//! | `propagation.csv` | strategy, kind of state hit, tensor and steps since the fault: mean fraction of elements differing |
//! | `sensitivity_bit.csv`, `sensitivity_state.csv`, `sensitivity_tensor.csv` | key and strategy: trials per outcome |
//! | `detectors.csv` | strategy and detector: detection rate, latency, false positives |
//! | `summary.md` | the same tables, condensed |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use fault::campaign::Outcome;

use super::{Campaign, Detector, Golden, TrialResult};
use crate::LabError;

/// Writes every table of a finished campaign into `dir`; returns the Markdown summary.
pub fn write(
    dir: &Path,
    campaign: &Campaign,
    goldens: &[Golden],
    results: &[TrialResult],
    elapsed: std::time::Duration,
) -> Result<String, LabError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LabError::Output { path: path.clone(), source }
    };
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    let files: [(&str, String); 9] = [
        ("trials.csv", trials_csv(results)),
        ("steps.csv", steps_csv(goldens, results)),
        ("golden.csv", golden_csv(goldens)),
        ("propagation.csv", propagation_csv(goldens, results)),
        ("sensitivity_bit.csv", sensitivity_csv("bit", results, |r| top_bit(r).map(|b| b.to_string()))),
        ("sensitivity_state.csv", sensitivity_csv("state", results, |r| Some(r.trial.fault.state.name().to_owned()))),
        ("sensitivity_tensor.csv", sensitivity_csv("tensor", results, |r| r.flips.first().map(|f| f.1.tensor.clone()))),
        ("detectors.csv", detectors_csv(campaign, goldens, results)),
        ("summary.md", summary_md(campaign, goldens, results, elapsed)),
    ];
    for (name, text) in &files {
        let path = dir.join(name);
        std::fs::File::create(&path).and_then(|mut f| f.write_all(text.as_bytes())).map_err(err(&path))?;
    }
    let spec = toml::to_string(&campaign.spec).unwrap_or_default();
    let path = dir.join("spec.toml");
    std::fs::write(&path, spec).map_err(err(&path))?;
    Ok(files[8].1.clone())
}

/// The most significant bit a trial flipped.
fn top_bit(r: &TrialResult) -> Option<u32> {
    r.flips.iter().flat_map(|(_, f)| f.bits.iter().copied()).max()
}

fn trials_csv(results: &[TrialResult]) -> String {
    let mut s = String::from(
        "trial,reduce,state,rank,step,tensor,element,bits,old,new,outcome,bitwise_golden,diverged,\
         test_loss,test_accuracy,accuracy_drop,loss_rise,max_differing,rejoined,rollbacks,repairs",
    );
    for d in Detector::ALL {
        let _ = write!(s, ",alarm_{}", d.name());
    }
    s.push_str(",flip_seed,seconds,error\n");
    for r in results {
        let t = &r.trial;
        let first = r.flips.first().map(|(_, f)| f);
        let bits: Vec<String> = r.flips.iter().flat_map(|(_, f)| f.bits.iter().map(|b| b.to_string())).collect();
        let (q_loss, q_acc) = r.quality.map_or((String::new(), String::new()), |(l, a)| (l.to_string(), a.to_string()));
        let max_diff = r.replica_differing.iter().flatten().max().copied().unwrap_or(0);
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            t.index,
            r.reduce,
            t.fault.state.name(),
            t.fault.rank,
            t.fault.step,
            first.map_or("", |f| f.tensor.as_str()),
            first.map_or(String::new(), |f| f.element.to_string()),
            bits.join(";"),
            first.map_or(String::new(), |f| f.old.to_string()),
            first.map_or(String::new(), |f| f.new.to_string()),
            r.outcome.name(),
            r.evidence.bitwise_golden,
            r.evidence.diverged,
            q_loss,
            q_acc,
            r.evidence.accuracy_drop,
            r.evidence.loss_rise,
            max_diff,
            r.rejoined.map_or(String::new(), |x| x.to_string()),
            r.rollbacks,
            r.repairs,
        );
        for a in r.first_alarm {
            let _ = write!(s, ",{}", a.map_or(String::new(), |x| x.to_string()));
        }
        let error = r.error.as_deref().unwrap_or("").replace([',', '\n', '"'], " ");
        let _ = writeln!(s, ",{},{:.3},{error}", t.fault.flips.seed, r.time.as_secs_f64());
    }
    s
}

fn steps_csv(goldens: &[Golden], results: &[TrialResult]) -> String {
    let replicas = results.first().map_or(1, |r| r.replica_differing.first().map_or(1, Vec::len));
    let mut s = String::from("trial,reduce,step,loss,golden_loss");
    for r in 0..replicas {
        let _ = write!(s, ",differing_replica{r}");
    }
    s.push('\n');
    for r in results {
        let golden = goldens.iter().find(|g| g.reduce == r.reduce).expect("a golden run per strategy");
        for (i, (loss, diff)) in r.losses.iter().zip(&r.replica_differing).enumerate() {
            let step = r.trial.fault.step + i as u64;
            let _ = write!(s, "{},{},{},{loss},{}", r.trial.index, r.reduce, step + 1, golden.losses[step as usize]);
            for d in diff {
                let _ = write!(s, ",{d}");
            }
            s.push('\n');
        }
    }
    s
}

fn golden_csv(goldens: &[Golden]) -> String {
    let mut s = String::from("reduce,step,loss,grad_norm,alarms\n");
    for g in goldens {
        for (i, (l, n)) in g.losses.iter().zip(&g.grad_norms).enumerate() {
            let alarms: Vec<&str> = g.alarms[i].iter().map(|d| d.name()).collect();
            let _ = writeln!(s, "{},{},{l},{n},{}", g.reduce, i + 1, alarms.join(";"));
        }
    }
    s
}

/// Mean fraction of each tensor's elements that differ from golden, by kind of state hit
/// and steps since the fault (1: after the injection step), over the trials still running.
fn propagation_csv(goldens: &[Golden], results: &[TrialResult]) -> String {
    let mut sums: BTreeMap<(String, &str, usize, usize), (f64, u64)> = BTreeMap::new();
    for r in results {
        let golden = goldens.iter().find(|g| g.reduce == r.reduce).expect("a golden run per strategy");
        for (since, per_tensor) in r.tensor_differing.iter().enumerate() {
            for (t, &d) in per_tensor.iter().enumerate() {
                let e = sums.entry((r.reduce.to_string(), r.trial.fault.state.name(), t, since + 1)).or_default();
                e.0 += d as f64 / golden.tensors[t].1 as f64;
                e.1 += 1;
            }
        }
    }
    let mut s = String::from("reduce,state,tensor,since,trials,mean_fraction\n");
    for ((reduce, state, t, since), (sum, n)) in sums {
        let golden = goldens.iter().find(|g| g.reduce.to_string() == reduce).expect("known");
        let _ = writeln!(s, "{reduce},{state},{},{since},{n},{}", golden.tensors[t].0, sum / n as f64);
    }
    s
}

fn outcome_counts<'a>(rows: impl Iterator<Item = &'a TrialResult>) -> [u64; 6] {
    let mut c = [0u64; 6];
    for r in rows {
        c[Outcome::ALL.iter().position(|&o| o == r.outcome).expect("listed")] += 1;
    }
    c
}

/// Trials grouped by strategy and by a key (trials without one are left out), in key
/// order.
fn grouped(
    results: &[TrialResult],
    key_of: impl Fn(&TrialResult) -> Option<String>,
) -> BTreeMap<(String, SortKey), Vec<&TrialResult>> {
    let mut groups: BTreeMap<(String, SortKey), Vec<&TrialResult>> = BTreeMap::new();
    for r in results {
        if let Some(k) = key_of(r) {
            groups.entry((r.reduce.to_string(), SortKey(k))).or_default().push(r);
        }
    }
    groups
}

fn sensitivity_csv(key: &str, results: &[TrialResult], key_of: impl Fn(&TrialResult) -> Option<String>) -> String {
    let groups = grouped(results, key_of);
    let mut s = format!("reduce,{key},trials");
    for o in Outcome::ALL {
        let _ = write!(s, ",{}", o.name());
    }
    s.push('\n');
    for ((reduce, k), rows) in groups {
        let _ = write!(s, "{reduce},{},{}", k.0, rows.len());
        for c in outcome_counts(rows.into_iter()) {
            let _ = write!(s, ",{c}");
        }
        s.push('\n');
    }
    s
}

/// Orders numbers numerically and words alphabetically.
#[derive(PartialEq, Eq)]
struct SortKey(String);

impl PartialOrd for SortKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SortKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self.0.parse::<u64>(), other.0.parse::<u64>()) {
            (Ok(a), Ok(b)) => a.cmp(&b),
            _ => self.0.cmp(&other.0),
        }
    }
}

/// One detector's figures under one strategy.
struct DetectorFigures {
    /// Trials whose fault changed some state (or crashed).
    affected: u64,
    /// Of which the detector caught.
    caught: u64,
    /// Trials with a harmful outcome (degraded, diverged, crashed), and those caught.
    harmful: u64,
    caught_harmful: u64,
    /// Steps from the fault to the first alarm, of the caught ones.
    latencies: Vec<u64>,
    /// Golden steps, and golden steps with an alarm.
    golden_steps: u64,
    false_alarms: u64,
    /// Alarms in trials whose state stayed golden throughout.
    on_harmless: u64,
}

impl DetectorFigures {
    fn mean_latency(&self) -> Option<f64> {
        (!self.latencies.is_empty()).then(|| self.latencies.iter().sum::<u64>() as f64 / self.latencies.len() as f64)
    }
}

fn detector_figures(
    d: Detector,
    golden: &Golden,
    results: &[&TrialResult],
    window: u64,
    thresholds: &fault::campaign::Thresholds,
) -> DetectorFigures {
    let mut f = DetectorFigures {
        affected: 0,
        caught: 0,
        harmful: 0,
        caught_harmful: 0,
        latencies: Vec::new(),
        golden_steps: 0,
        false_alarms: 0,
        on_harmless: 0,
    };
    for r in results {
        let alarm = r.first_alarm[d.index()];
        let affected =
            r.evidence.crashed || r.evidence.diverged || r.replica_differing.iter().flatten().any(|&x| x > 0);
        let e = &r.evidence;
        let harmful = e.crashed
            || e.diverged
            || !(e.accuracy_drop <= thresholds.degraded_accuracy && e.loss_rise <= thresholds.degraded_loss);
        if affected {
            f.affected += 1;
            if let Some(a) = alarm {
                f.caught += 1;
                f.latencies.push(a - r.trial.fault.step);
            }
        } else if alarm.is_some() {
            f.on_harmless += 1;
        }
        if harmful {
            f.harmful += 1;
            f.caught_harmful += u64::from(alarm.is_some());
        }
    }
    let first = golden.losses.len() as u64 - window;
    for step in first..golden.losses.len() as u64 {
        f.golden_steps += 1;
        f.false_alarms += u64::from(golden.alarms[step as usize].contains(&d));
    }
    f
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 { String::new() } else { format!("{:.4}", a as f64 / b as f64) }
}

fn detectors_csv(campaign: &Campaign, goldens: &[Golden], results: &[TrialResult]) -> String {
    let mut s = String::from(
        "reduce,detector,affected_trials,detected,detection_rate,harmful_trials,harmful_detected,harmful_detection_rate,\
         mean_latency_steps,max_latency_steps,golden_steps,false_alarms,false_positive_rate,alarms_on_unaffected\n",
    );
    let window = window(campaign);
    for g in goldens {
        let rows: Vec<&TrialResult> = results.iter().filter(|r| r.reduce == g.reduce).collect();
        for d in Detector::ALL {
            let f = detector_figures(d, g, &rows, window, &campaign.spec.classify);
            let mean = f.mean_latency().map_or(String::new(), |m| format!("{m:.2}"));
            let max = f.latencies.iter().max().map_or(String::new(), |m| m.to_string());
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{mean},{max},{},{},{},{}",
                g.reduce,
                d.name(),
                f.affected,
                f.caught,
                ratio(f.caught, f.affected),
                f.harmful,
                f.caught_harmful,
                ratio(f.caught_harmful, f.harmful),
                f.golden_steps,
                f.false_alarms,
                ratio(f.false_alarms, f.golden_steps),
                f.on_harmless
            );
        }
    }
    s
}

/// The golden steps over which false positives are counted: those trials can reach.
fn window(campaign: &Campaign) -> u64 {
    let first = campaign.spec.trials.inject_at.iter().min().copied().unwrap_or(0);
    campaign.spec.last_step() - first
}

fn summary_md(
    campaign: &Campaign,
    goldens: &[Golden],
    results: &[TrialResult],
    elapsed: std::time::Duration,
) -> String {
    let spec = &campaign.spec;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Campaign: {} on {}, {} replica(s), {} trial(s) x {} strategy(ies)\n",
        spec.run.model,
        spec.run.data,
        spec.run.replicas,
        results.len() / goldens.len().max(1),
        goldens.len()
    );
    let _ = writeln!(
        s,
        "Faults: {} flip(s) of `{}` bits, burst {}, in {:?}, injected at steps {:?}, then {} steps; response to alarms: {:?}. \
         Wall-clock {:.1} s ({:.1} s for the golden runs).\n",
        spec.trials.flips,
        spec.trials.bits,
        spec.trials.burst,
        spec.trials.state.iter().map(|k| k.name()).collect::<Vec<_>>(),
        spec.trials.inject_at,
        spec.trials.steps_after,
        spec.detect.response,
        elapsed.as_secs_f64(),
        goldens.iter().map(|g| g.time.as_secs_f64()).sum::<f64>()
    );
    let header = |s: &mut String, key: &str| {
        let _ = write!(s, "| strategy | {key} | trials |");
        for o in Outcome::ALL {
            let _ = write!(s, " {} |", o.name());
        }
        let _ = write!(s, "\n|---|---|---:|");
        for _ in Outcome::ALL {
            s.push_str("---:|");
        }
        s.push('\n');
    };
    let table = |s: &mut String, key: &str, key_of: &dyn Fn(&TrialResult) -> Option<String>| {
        header(s, key);
        for ((reduce, k), rows) in grouped(results, key_of) {
            let _ = write!(s, "| {reduce} | {} | {} |", k.0, rows.len());
            let n = rows.len() as f64;
            for c in outcome_counts(rows.into_iter()) {
                if c == 0 {
                    s.push_str(" 0 |");
                } else {
                    let _ = write!(s, " {c} ({:.0}%) |", 100.0 * c as f64 / n);
                }
            }
            s.push('\n');
        }
        s.push('\n');
    };
    s.push_str("## Outcomes by kind of state\n\n");
    table(&mut s, "state", &|r| Some(r.trial.fault.state.name().to_owned()));
    s.push_str("## Outcomes by bit class\n\n");
    table(&mut s, "bits", &|r| {
        Some(top_bit(r).map_or("none".into(), |b| fault::BitClass::of_f32_bit(b).name().to_owned()))
    });
    s.push_str("## Detectors\n\n");
    if spec.detect.response != fault::campaign::Response::Observe {
        s.push_str(
            "Detection rates are meaningful with `response = \"observe\"`: here an alarm acts at once, so a \
             caught fault leaves no difference from golden to count as affected.\n\n",
        );
    }
    s.push_str(
        "| strategy | detector | caught / affected | caught / harmful | mean latency (steps) | false alarms / golden steps |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let window = window(campaign);
    for g in goldens {
        let rows: Vec<&TrialResult> = results.iter().filter(|r| r.reduce == g.reduce).collect();
        for d in Detector::ALL {
            let f = detector_figures(d, g, &rows, window, &campaign.spec.classify);
            let mean = f.mean_latency().map_or("-".to_owned(), |m| format!("{m:.2}"));
            let _ = writeln!(
                s,
                "| {} | {} | {}/{} | {}/{} | {mean} | {}/{} |",
                g.reduce,
                d.name(),
                f.caught,
                f.affected,
                f.caught_harmful,
                f.harmful,
                f.false_alarms,
                f.golden_steps
            );
        }
    }
    s
}
