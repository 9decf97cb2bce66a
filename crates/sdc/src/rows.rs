//! The rows of a campaign's tables: one struct per CSV file, computed here from the
//! trials' results, written by [`crate::output`] and read back by `steadfast report` (and
//! by anyone with [`crate::table::read`]).
//!
//! | file | row | one row per |
//! |------|-----|-------------|
//! | `trials.csv` | [`TrialRow`] | trial and strategy: the fault, the outcome, the alarms, the quality |
//! | `steps.csv` | [`StepRow`] | trial, strategy and step: loss, and elements differing per replica |
//! | `golden.csv` | [`GoldenRow`] | strategy and step of the golden run: loss, gradient norm, false alarms |
//! | `propagation.csv` | [`PropagationRow`] | strategy, kind of state hit, tensor and steps since the fault |
//! | `sensitivity_bit.csv`, `sensitivity_state.csv`, `sensitivity_tensor.csv` | [`SensitivityRow`] | key and strategy: trials per outcome |
//! | `detectors.csv` | [`DetectorRow`] | strategy and detector: detection rate, latency, false positives |

use std::collections::BTreeMap;
use std::path::Path;

use comm::ReduceMode;
use fault::campaign::{Outcome, Thresholds};
use fault::live::StateKind;
use serde::{Deserialize, Serialize};

use crate::table::{self, List};
use crate::{About, Detector, GoldenRecord, SdcError, TrialResult};

/// `trials.csv`: one trial under one strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    /// The trial's index (`--replay` takes it).
    pub trial: u64,
    /// The strategy.
    pub reduce: ReduceMode,
    /// The kind of state hit.
    pub state: StateKind,
    /// The replica hit.
    pub rank: usize,
    /// The step of the fault (0-based: the step that turns state `step` into `step + 1`).
    pub step: u64,
    /// The tensor of the first flip (empty: the fault found nothing to flip).
    pub tensor: String,
    /// The element of the first flip.
    pub element: Option<u64>,
    /// Every bit flipped.
    pub bits: List<u32>,
    /// The first flipped element's value before.
    pub old: Option<f32>,
    /// And after.
    pub new: Option<f32>,
    /// The class.
    pub outcome: Outcome,
    /// The final state equals golden's bit for bit.
    pub bitwise_golden: bool,
    /// NaN/Inf, or a loss past the divergence threshold.
    pub diverged: bool,
    /// Final held-out loss (the worst replica's).
    pub test_loss: Option<f64>,
    /// Final held-out accuracy (the worst replica's).
    pub test_accuracy: Option<f64>,
    /// Golden's final accuracy minus the trial's.
    pub accuracy_drop: f64,
    /// The final held-out loss's rise over golden's, relative.
    pub loss_rise: f64,
    /// The most elements that differed from golden in one replica after one step.
    pub max_differing: u64,
    /// The step after which the state was golden's again.
    pub rejoined: Option<u64>,
    /// Steps rolled back and redone.
    pub rollbacks: u32,
    /// Replicas repaired from a healthy one.
    pub repairs: u32,
    /// The step at which the checksum detector first fired.
    pub alarm_checksum: Option<u64>,
    /// The same for the commit vote.
    pub alarm_vote: Option<u64>,
    /// The same for the replicas' fingerprints.
    pub alarm_fingerprint: Option<u64>,
    /// The same for NaN/Inf.
    pub alarm_nonfinite: Option<u64>,
    /// The same for the gradient-norm spike.
    pub alarm_grad_norm: Option<u64>,
    /// The same for the loss spike.
    pub alarm_loss_spike: Option<u64>,
    /// The seed of the flips.
    pub flip_seed: u64,
    /// Wall-clock time of the trial.
    pub seconds: f64,
    /// Why the trial crashed (empty: it did not).
    pub error: String,
}

impl TrialRow {
    /// The step at which detector `d` first fired.
    pub fn alarm(&self, d: Detector) -> Option<u64> {
        match d {
            Detector::Checksum => self.alarm_checksum,
            Detector::Vote => self.alarm_vote,
            Detector::Fingerprint => self.alarm_fingerprint,
            Detector::NonFinite => self.alarm_nonfinite,
            Detector::GradNorm => self.alarm_grad_norm,
            Detector::LossSpike => self.alarm_loss_spike,
        }
    }

    /// The most significant bit flipped.
    pub fn top_bit(&self) -> Option<u32> {
        self.bits.0.iter().max().copied()
    }

    fn of(r: &TrialResult) -> TrialRow {
        let t = &r.trial;
        let first = r.flips.first().map(|(_, f)| f);
        let alarm = |d: Detector| r.first_alarm[d.index()];
        TrialRow {
            trial: t.index,
            reduce: r.reduce,
            state: t.fault.state,
            rank: t.fault.rank,
            step: t.fault.step,
            tensor: first.map_or_else(String::new, |f| f.tensor.clone()),
            element: first.map(|f| f.element),
            bits: List(r.flips.iter().flat_map(|(_, f)| f.bits.iter().copied()).collect()),
            old: first.map(|f| f.old),
            new: first.map(|f| f.new),
            outcome: r.outcome,
            bitwise_golden: r.evidence.bitwise_golden,
            diverged: r.evidence.diverged,
            test_loss: r.quality.map(|q| q.0),
            test_accuracy: r.quality.map(|q| q.1),
            accuracy_drop: r.evidence.accuracy_drop,
            loss_rise: r.evidence.loss_rise,
            max_differing: r.replica_differing.iter().flatten().max().copied().unwrap_or(0),
            rejoined: r.rejoined,
            rollbacks: r.rollbacks,
            repairs: r.repairs,
            alarm_checksum: alarm(Detector::Checksum),
            alarm_vote: alarm(Detector::Vote),
            alarm_fingerprint: alarm(Detector::Fingerprint),
            alarm_nonfinite: alarm(Detector::NonFinite),
            alarm_grad_norm: alarm(Detector::GradNorm),
            alarm_loss_spike: alarm(Detector::LossSpike),
            flip_seed: t.fault.flips.seed,
            // Milliseconds are all a person reads; the rest is noise.
            seconds: (r.time.as_secs_f64() * 1000.0).round() / 1000.0,
            error: r.error.clone().unwrap_or_default(),
        }
    }
}

/// `steps.csv`: one step of one trial under one strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    /// The trial.
    pub trial: u64,
    /// The strategy.
    pub reduce: ReduceMode,
    /// The step count after this step (1-based).
    pub step: u64,
    /// The trial's training loss.
    pub loss: f32,
    /// Golden's training loss at the same step.
    pub golden_loss: f32,
    /// Per replica, in rank order: state elements whose bits differ from golden's.
    pub differing: List<u64>,
}

/// `golden.csv`: one step of a golden run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldenRow {
    /// The strategy.
    pub reduce: ReduceMode,
    /// The step count after this step (1-based).
    pub step: u64,
    /// Training loss.
    pub loss: f32,
    /// Norm of the summed gradient.
    pub grad_norm: f64,
    /// Detectors that fired (false positives).
    pub alarms: List<Detector>,
}

/// `propagation.csv`: how far faults in one kind of state spread into one tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PropagationRow {
    /// The strategy.
    pub reduce: ReduceMode,
    /// The kind of state the faults hit.
    pub state: StateKind,
    /// The tensor observed.
    pub tensor: String,
    /// Steps since the fault (1: after the injection step).
    pub since: u64,
    /// Trials still running then.
    pub trials: u64,
    /// Mean fraction of the tensor's elements that differ from golden's (worst replica).
    pub mean_fraction: f64,
}

/// `sensitivity_{bit,state,tensor}.csv`: the outcomes of the trials that share a key
/// (the highest bit flipped, the kind of state hit, the tensor hit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SensitivityRow {
    /// The strategy.
    pub reduce: ReduceMode,
    /// The bit, the kind of state or the tensor.
    pub key: String,
    /// Trials with this key.
    pub trials: u64,
    /// Of which masked.
    pub masked: u64,
    /// Degraded.
    pub degraded: u64,
    /// Diverged.
    pub diverged: u64,
    /// Crashed.
    pub crashed: u64,
    /// Detected.
    pub detected: u64,
    /// Corrected.
    pub corrected: u64,
}

impl SensitivityRow {
    /// Trials of the key with outcome `o`.
    pub fn count(&self, o: Outcome) -> u64 {
        match o {
            Outcome::Masked => self.masked,
            Outcome::Degraded => self.degraded,
            Outcome::Diverged => self.diverged,
            Outcome::Crashed => self.crashed,
            Outcome::Detected => self.detected,
            Outcome::Corrected => self.corrected,
        }
    }
}

/// `detectors.csv`: one detector's figures under one strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DetectorRow {
    /// The strategy.
    pub reduce: ReduceMode,
    /// The detector.
    pub detector: Detector,
    /// Trials whose fault changed some state (or crashed).
    pub affected_trials: u64,
    /// Of which the detector caught.
    pub detected: u64,
    /// `detected / affected_trials`.
    pub detection_rate: Option<f64>,
    /// Trials with a harmful outcome (degraded, diverged, crashed).
    pub harmful_trials: u64,
    /// Of which the detector caught.
    pub harmful_detected: u64,
    /// `harmful_detected / harmful_trials`.
    pub harmful_detection_rate: Option<f64>,
    /// Mean steps from the fault to the first alarm, over the caught trials.
    pub mean_latency_steps: Option<f64>,
    /// The longest of those.
    pub max_latency_steps: Option<u64>,
    /// Golden steps over which false alarms are counted.
    pub golden_steps: u64,
    /// Golden steps with an alarm.
    pub false_alarms: u64,
    /// `false_alarms / golden_steps`.
    pub false_positive_rate: Option<f64>,
    /// Alarms in trials whose state stayed golden throughout.
    pub alarms_on_unaffected: u64,
}

/// Every table of a campaign.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tables {
    /// `trials.csv`.
    pub trials: Vec<TrialRow>,
    /// `steps.csv`.
    pub steps: Vec<StepRow>,
    /// `golden.csv`.
    pub golden: Vec<GoldenRow>,
    /// `propagation.csv`.
    pub propagation: Vec<PropagationRow>,
    /// `sensitivity_bit.csv`.
    pub by_bit: Vec<SensitivityRow>,
    /// `sensitivity_state.csv`.
    pub by_state: Vec<SensitivityRow>,
    /// `sensitivity_tensor.csv`.
    pub by_tensor: Vec<SensitivityRow>,
    /// `detectors.csv`.
    pub detectors: Vec<DetectorRow>,
}

impl Tables {
    /// The tables of a finished campaign, whose record fits its spec ([`crate::check`];
    /// this panics on golden runs shorter than the trials).
    pub fn of(about: &About, goldens: &[GoldenRecord], results: &[TrialResult]) -> Tables {
        let trials: Vec<TrialRow> = results.iter().map(TrialRow::of).collect();
        Tables {
            steps: step_rows(goldens, results),
            golden: golden_rows(goldens),
            propagation: propagation_rows(goldens, results),
            by_bit: sensitivity_rows(&trials, |r| r.top_bit().map(|b| b.to_string())),
            by_state: sensitivity_rows(&trials, |r| Some(r.state.to_string())),
            by_tensor: sensitivity_rows(&trials, |r| (!r.tensor.is_empty()).then(|| r.tensor.clone())),
            detectors: detector_rows(about, goldens, results),
            trials,
        }
    }

    /// The files and what each holds.
    const FILES: [&'static str; 8] = [
        "trials.csv",
        "steps.csv",
        "golden.csv",
        "propagation.csv",
        "sensitivity_bit.csv",
        "sensitivity_state.csv",
        "sensitivity_tensor.csv",
        "detectors.csv",
    ];

    /// Writes every table into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), SdcError> {
        let [trials, steps, golden, propagation, bit, state, tensor, detectors] = Self::FILES.map(|f| dir.join(f));
        table::write(&trials, &self.trials)?;
        table::write(&steps, &self.steps)?;
        table::write(&golden, &self.golden)?;
        table::write(&propagation, &self.propagation)?;
        table::write(&bit, &self.by_bit)?;
        table::write(&state, &self.by_state)?;
        table::write(&tensor, &self.by_tensor)?;
        table::write(&detectors, &self.detectors)
    }

    /// Reads every table from `dir`, as [`Tables::write`] left them.
    pub fn read(dir: &Path) -> Result<Tables, SdcError> {
        if !dir.join(Self::FILES[0]).is_file() {
            return Err(SdcError::Input {
                path: dir.join(Self::FILES[0]),
                reason: format!(
                    "no such file: is {} the output of `steadfast campaign` (or of `steadfast.lab`)?",
                    dir.display()
                ),
            });
        }
        let [trials, steps, golden, propagation, bit, state, tensor, detectors] = Self::FILES.map(|f| dir.join(f));
        Ok(Tables {
            trials: table::read(&trials)?,
            steps: table::read(&steps)?,
            golden: table::read(&golden)?,
            propagation: table::read(&propagation)?,
            by_bit: table::read(&bit)?,
            by_state: table::read(&state)?,
            by_tensor: table::read(&tensor)?,
            detectors: table::read(&detectors)?,
        })
    }
}

fn golden_of(goldens: &[GoldenRecord], reduce: ReduceMode) -> &GoldenRecord {
    goldens.iter().find(|g| g.reduce == reduce).expect("a golden run per strategy")
}

fn step_rows(goldens: &[GoldenRecord], results: &[TrialResult]) -> Vec<StepRow> {
    let mut rows = Vec::new();
    for r in results {
        let golden = golden_of(goldens, r.reduce);
        for (i, (&loss, diff)) in r.losses.iter().zip(&r.replica_differing).enumerate() {
            let step = r.trial.fault.step + i as u64;
            rows.push(StepRow {
                trial: r.trial.index,
                reduce: r.reduce,
                step: step + 1,
                loss,
                golden_loss: golden.losses[step as usize],
                differing: List(diff.clone()),
            });
        }
    }
    rows
}

fn golden_rows(goldens: &[GoldenRecord]) -> Vec<GoldenRow> {
    let mut rows = Vec::new();
    for g in goldens {
        for (i, (&loss, &grad_norm)) in g.losses.iter().zip(&g.grad_norms).enumerate() {
            rows.push(GoldenRow {
                reduce: g.reduce,
                step: i as u64 + 1,
                loss,
                grad_norm,
                alarms: List(g.alarms[i].clone()),
            });
        }
    }
    rows
}

/// Mean fraction of each tensor's elements that differ from golden, by kind of state hit
/// and steps since the fault, over the trials still running.
fn propagation_rows(goldens: &[GoldenRecord], results: &[TrialResult]) -> Vec<PropagationRow> {
    let mut sums: BTreeMap<(ReduceMode, StateKind, usize, u64), (f64, u64)> = BTreeMap::new();
    for r in results {
        let golden = golden_of(goldens, r.reduce);
        for (since, per_tensor) in r.tensor_differing.iter().enumerate() {
            for (t, &d) in per_tensor.iter().enumerate() {
                let e = sums.entry((r.reduce, r.trial.fault.state, t, since as u64 + 1)).or_default();
                e.0 += d as f64 / golden.tensors[t].1 as f64;
                e.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|((reduce, state, t, since), (sum, n))| PropagationRow {
            reduce,
            state,
            tensor: golden_of(goldens, reduce).tensors[t].0.clone(),
            since,
            trials: n,
            mean_fraction: sum / n as f64,
        })
        .collect()
}

/// The trials grouped by strategy and by a key (those without one are left out); numeric
/// keys in numeric order, words in alphabetical order.
pub(crate) fn sensitivity_rows(
    trials: &[TrialRow],
    key_of: impl Fn(&TrialRow) -> Option<String>,
) -> Vec<SensitivityRow> {
    let mut groups: BTreeMap<(ReduceMode, SortKey), [u64; 6]> = BTreeMap::new();
    for r in trials {
        if let Some(k) = key_of(r) {
            let counts = groups.entry((r.reduce, SortKey(k))).or_default();
            counts[Outcome::ALL.iter().position(|&o| o == r.outcome).expect("listed")] += 1;
        }
    }
    groups
        .into_iter()
        .map(|((reduce, key), [masked, degraded, diverged, crashed, detected, corrected])| SensitivityRow {
            reduce,
            key: key.0,
            trials: masked + degraded + diverged + crashed + detected + corrected,
            masked,
            degraded,
            diverged,
            crashed,
            detected,
            corrected,
        })
        .collect()
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

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn detector_rows(about: &About, goldens: &[GoldenRecord], results: &[TrialResult]) -> Vec<DetectorRow> {
    let window = window(about);
    let mut rows = Vec::new();
    for g in goldens {
        let mine: Vec<&TrialResult> = results.iter().filter(|r| r.reduce == g.reduce).collect();
        for d in Detector::ALL {
            rows.push(detector_row(d, g, &mine, window, &about.classify));
        }
    }
    rows
}

/// The golden steps over which false positives are counted: those trials can reach.
fn window(about: &About) -> u64 {
    let first = about.trials.inject_at.iter().min().copied().unwrap_or(0);
    about.trials.last_step() - first
}

fn detector_row(
    d: Detector,
    golden: &GoldenRecord,
    results: &[&TrialResult],
    window: u64,
    thresholds: &Thresholds,
) -> DetectorRow {
    let (mut affected, mut caught, mut harmful, mut caught_harmful, mut on_harmless) = (0, 0, 0, 0, 0);
    let mut latencies = Vec::new();
    for r in results {
        let alarm = r.first_alarm[d.index()];
        let e = &r.evidence;
        let is_affected = e.crashed || e.diverged || r.replica_differing.iter().flatten().any(|&x| x > 0);
        let is_harmful = e.crashed
            || e.diverged
            || !(e.accuracy_drop <= thresholds.degraded_accuracy && e.loss_rise <= thresholds.degraded_loss);
        if is_affected {
            affected += 1;
            if let Some(a) = alarm {
                caught += 1;
                latencies.push(a - r.trial.fault.step);
            }
        } else if alarm.is_some() {
            on_harmless += 1;
        }
        if is_harmful {
            harmful += 1;
            caught_harmful += u64::from(alarm.is_some());
        }
    }
    let steps = golden.losses.len() as u64;
    let false_alarms = (steps - window..steps).filter(|&s| golden.alarms[s as usize].contains(&d)).count() as u64;
    DetectorRow {
        reduce: golden.reduce,
        detector: d,
        affected_trials: affected,
        detected: caught,
        detection_rate: ratio(caught, affected),
        harmful_trials: harmful,
        harmful_detected: caught_harmful,
        harmful_detection_rate: ratio(caught_harmful, harmful),
        mean_latency_steps: (!latencies.is_empty())
            .then(|| latencies.iter().sum::<u64>() as f64 / latencies.len() as f64),
        max_latency_steps: latencies.iter().max().copied(),
        golden_steps: window,
        false_alarms,
        false_positive_rate: ratio(false_alarms, window),
        alarms_on_unaffected: on_harmless,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fault::campaign::Evidence;
    use fault::live::LiveFlip;

    use super::*;
    use crate::check;

    fn about() -> About {
        About::parse(
            "[run]\nmodel = \"m\"\nframework = \"pytorch\"\nreplicas = 2\n[trials]\ncount = 3\ninject_at = [2]\n\
             steps_after = 2\nstate = [\"param\"]",
        )
        .unwrap()
    }

    fn golden() -> GoldenRecord {
        let mut alarms = vec![Vec::new(); 4];
        // A false alarm before the trials' window is not counted; one inside it is.
        alarms[0].push(Detector::GradNorm);
        alarms[3].push(Detector::LossSpike);
        GoldenRecord {
            reduce: ReduceMode::Deterministic,
            losses: vec![2.0, 1.5, 1.25, 1.0],
            grad_norms: vec![1.0; 4],
            alarms,
            evals: BTreeMap::from([(4, (1.0, 0.5))]),
            tensors: vec![("model.a".into(), 10), ("model.b".into(), 20)],
            time: Duration::ZERO,
        }
    }

    /// Trial `index`, which flipped `bit` of `tensor`, ended as `outcome`.
    fn result(index: u64, tensor: &str, bit: u32, outcome: Outcome, differing: Vec<Vec<u64>>) -> TrialResult {
        let flip = LiveFlip { tensor: tensor.into(), element: 1, bits: vec![bit], old: 1.0, new: -1.0 };
        let per_tensor = differing.iter().map(|d| vec![d.iter().sum(), 0]).collect();
        TrialResult {
            trial: about().trial(index),
            reduce: ReduceMode::Deterministic,
            outcome,
            evidence: Evidence::default(),
            flips: vec![(0, flip)],
            first_alarm: [None; 6],
            losses: vec![1.25; differing.len()],
            replica_differing: differing,
            tensor_differing: per_tensor,
            quality: Some((1.0, 0.5)),
            rejoined: None,
            rollbacks: 0,
            repairs: 0,
            error: None,
            time: Duration::ZERO,
        }
    }

    #[test]
    fn the_tables_count_outcomes_by_key_and_what_each_detector_caught() {
        let mut masked = result(0, "model.a", 30, Outcome::Masked, vec![vec![0, 0], vec![0, 0]]);
        masked.evidence.bitwise_golden = true;
        masked.first_alarm[Detector::Checksum.index()] = Some(2);
        let mut degraded = result(1, "model.b", 30, Outcome::Degraded, vec![vec![0, 4], vec![3, 9]]);
        degraded.evidence.accuracy_drop = 0.1;
        degraded.first_alarm[Detector::Checksum.index()] = Some(2);
        degraded.first_alarm[Detector::LossSpike.index()] = Some(3);
        let mut diverged = result(2, "model.a", 5, Outcome::Diverged, vec![vec![1, 1]]);
        diverged.evidence.diverged = true;
        let results = [masked, degraded, diverged];
        check(&about(), &[golden()], &results).unwrap();
        let t = Tables::of(&about(), &[golden()], &results);

        let counts = |rows: &[SensitivityRow]| -> Vec<(String, u64, u64, u64, u64)> {
            rows.iter().map(|r| (r.key.clone(), r.trials, r.masked, r.degraded, r.diverged)).collect()
        };
        let row = |k: &str, n, m, dg, dv| (k.to_owned(), n, m, dg, dv);
        assert_eq!(counts(&t.by_bit), [row("5", 1, 0, 0, 1), row("30", 2, 1, 1, 0)], "bits in numeric order");
        assert_eq!(counts(&t.by_state), [row("param", 3, 1, 1, 1)]);
        assert_eq!(counts(&t.by_tensor), [row("model.a", 2, 1, 0, 1), row("model.b", 1, 0, 1, 0)]);

        assert_eq!(t.detectors.iter().map(|d| d.detector).collect::<Vec<_>>(), Detector::ALL);
        let of = |d: Detector| &t.detectors[d.index()];
        let checksum = of(Detector::Checksum);
        assert_eq!((checksum.affected_trials, checksum.detected, checksum.detection_rate), (2, 1, Some(0.5)));
        assert_eq!((checksum.harmful_trials, checksum.harmful_detected), (2, 1));
        assert_eq!((checksum.mean_latency_steps, checksum.max_latency_steps), (Some(0.0), Some(0)));
        assert_eq!(checksum.alarms_on_unaffected, 1, "the alarm of the masked trial that changed nothing");
        let spike = of(Detector::LossSpike);
        assert_eq!((spike.detected, spike.mean_latency_steps), (1, Some(1.0)));
        assert_eq!((spike.golden_steps, spike.false_alarms, spike.false_positive_rate), (2, 1, Some(0.5)));
        let norm = of(Detector::GradNorm);
        assert_eq!((norm.detected, norm.false_alarms, norm.detection_rate), (0, 0, Some(0.0)));

        assert_eq!(t.trials.len(), 3);
        assert_eq!((t.trials[1].max_differing, t.trials[1].top_bit()), (9, Some(30)));
        assert_eq!(t.steps.len(), 5, "one row per step each trial trained");
        assert_eq!((t.steps[0].step, t.steps[0].golden_loss), (3, 1.25));
        assert_eq!(t.golden.len(), 4);
        let first = t.propagation.iter().find(|p| p.tensor == "model.a" && p.since == 1).unwrap();
        assert_eq!((first.trials, first.mean_fraction), (3, (0.0 + 0.4 + 0.2) / 3.0));
    }

    #[test]
    fn a_record_that_does_not_fit_its_spec_is_refused_with_the_field() {
        let mut short = golden();
        short.losses.pop();
        let err = check(&about(), &[short], &[]).unwrap_err().to_string();
        assert!(err.contains("goldens[0].losses"), "{err}");
        let mut other = result(0, "model.a", 3, Outcome::Masked, vec![vec![0, 0]]);
        other.reduce = ReduceMode::Reproducible;
        let err = check(&about(), &[golden()], &[other]).unwrap_err().to_string();
        assert!(err.contains("results[0].reduce: no golden run of reproducible"), "{err}");
        let mut long = result(0, "model.a", 3, Outcome::Masked, vec![vec![0, 0]; 3]);
        long.tensor_differing[0].push(0);
        let err = check(&about(), &[golden()], &[long]).unwrap_err().to_string();
        assert!(err.contains("results[0].losses"), "{err}");
    }
}
