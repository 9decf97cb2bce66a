//! The fault side of campaigns: which faults trials draw, what detectors do, and the
//! classes of outcome.
//!
//! A campaign is a golden (fault-free) training run and many trials. Each trial resumes
//! from the golden state at one of the injection steps, suffers one fault, trains on for a
//! fixed number of steps and is judged against the golden run. This module owns what can
//! be said without a model: the `[trials]`, `[detect]` and `[classify]` sections of a
//! spec file ([`TrialSpec`], [`DetectSpec`], [`Thresholds`]; the `[run]` section and the
//! whole spec belong to the lab that trains), how trial `i`'s fault is drawn from the
//! campaign seed ([`TrialSpec::trial`], so that any trial can be replayed alone), and the
//! pure rule that turns what was observed into an [`Outcome`] ([`classify`]).
//!
//! ```
//! let trials: fault::campaign::TrialSpec = toml::from_str(r#"
//!     count = 10
//!     inject_at = [20]
//!     steps_after = 5
//!     state = ["param", "grad"]
//! "#).unwrap();
//! trials.validate(2).unwrap();
//! // Trial 3's fault is a pure function of the spec: drawing it twice gives the same.
//! assert_eq!(trials.trial(3, 2), trials.trial(3, 2));
//! ```

use serde::{Deserialize, Serialize};

use crate::bits::BitSpec;
use crate::live::{LiveFault, StateKind};
use crate::plan::{Amount, FlipSpec, Target};

/// The trials.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrialSpec {
    /// Number of trials (each runs once per reduction strategy).
    pub count: u64,
    /// Seed from which every trial's fault is drawn.
    pub seed: u64,
    /// Steps at which the golden state is snapshotted and a trial may inject (0-based: a
    /// fault at step `s` hits the step that turns state `s` into `s + 1`).
    pub inject_at: Vec<u64>,
    /// Steps trained after the injection step (the injection step included).
    pub steps_after: u64,
    /// Kinds of state a trial may hit: `param`, `grad`, `optim`, `activation`.
    pub state: Vec<StateKind>,
    /// Tensor-name glob (`model.fc1.*`, `act.*`); all tensors of the kind if absent.
    pub target: Option<String>,
    /// Bits: `sign`, `exponent`, `mantissa`, `any`, `N` or `N-M`.
    pub bits: BitSpec,
    /// Bursts flipped per trial.
    pub flips: u64,
    /// Instead of `flips`: each candidate bit of the hit kind of state flipped with this
    /// probability (a rate of corruption rather than a count; may flip none).
    pub rate: Option<f64>,
    /// Adjacent bits per burst.
    pub burst: u32,
    /// Replicas a fault may hit [default: all].
    pub ranks: Option<Vec<usize>>,
}

impl Default for TrialSpec {
    fn default() -> Self {
        TrialSpec {
            count: 100,
            seed: 1,
            inject_at: vec![100],
            steps_after: 50,
            state: vec![StateKind::Param, StateKind::Optim],
            target: None,
            bits: BitSpec::Class(crate::bits::BitClass::Any),
            flips: 1,
            rate: None,
            burst: 1,
            ranks: None,
        }
    }
}

/// What a campaign does when a detector fires.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Response {
    /// Record the alarm and train on: outcomes show what the fault does unchecked.
    #[default]
    Observe,
    /// Stop the trial at the first alarm, as a job that halts on corruption.
    Stop,
    /// Repair: copy the state of a healthy replica over the faulty one when the detector
    /// names it (checksums, commit vote, fingerprints with a majority); otherwise roll back
    /// to the last step that raised no alarm and redo it.
    Repair,
}

/// The detectors' knobs.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DetectSpec {
    /// Compare replica fingerprints every this many steps (data-parallel only).
    pub fingerprint_every: u64,
    /// The gradient-norm detector fires when the norm exceeds this multiple of its running
    /// average.
    pub grad_norm_factor: f64,
    /// The loss-spike detector fires when the loss exceeds this multiple of its running
    /// average.
    pub loss_factor: f64,
    /// Weight of the past in the running averages (exponential moving average).
    pub smoothing: f64,
    /// What an alarm does.
    pub response: Response,
    /// Rollbacks a trial may take before it is stopped as detected.
    pub max_rollbacks: u32,
}

impl Default for DetectSpec {
    fn default() -> Self {
        DetectSpec {
            fingerprint_every: 1,
            grad_norm_factor: 10.0,
            loss_factor: 3.0,
            smoothing: 0.9,
            response: Response::Observe,
            max_rollbacks: 3,
        }
    }
}

/// Where the classes of outcome part.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Degraded: the final test accuracy is this much (absolute) below golden's...
    pub degraded_accuracy: f64,
    /// ...or the final test loss is this fraction above golden's.
    pub degraded_loss: f64,
    /// Diverged: a training loss above this multiple of golden's at the same step (or any
    /// NaN/Inf loss).
    pub diverged_loss: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { degraded_accuracy: 0.005, degraded_loss: 0.02, diverged_loss: 10.0 }
    }
}

/// A spec that cannot be run.
#[derive(Debug, thiserror::Error)]
#[error("bad campaign spec: {0}")]
pub struct BadSpec(pub String);

/// The fault of one trial.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// Index in the campaign.
    pub index: u64,
    /// The step, replica, kind of state, tensors and bits it hits; the flips are drawn on
    /// the live tensors from its seed, as for `train --inject`.
    pub fault: LiveFault,
}

impl TrialSpec {
    /// Checks what TOML's types cannot, for a group of `replicas` replicas.
    pub fn validate(&self, replicas: usize) -> Result<(), BadSpec> {
        let bad = |m: String| Err(BadSpec(m));
        if self.inject_at.is_empty() {
            return bad("trials.inject_at needs at least one step".into());
        }
        if self.steps_after == 0 {
            return bad("trials.steps_after must be at least 1".into());
        }
        if self.state.is_empty() {
            return bad("trials.state needs at least one kind".into());
        }
        if self.flips == 0 || self.burst == 0 {
            return bad("trials.flips and trials.burst must be at least 1".into());
        }
        if let Some(rate) = self.rate
            && !(rate > 0.0 && rate <= 1.0)
        {
            return bad(format!("trials.rate ({rate}) must lie in (0, 1]"));
        }
        if let Some(ranks) = &self.ranks
            && (ranks.is_empty() || ranks.iter().any(|&x| x >= replicas))
        {
            return bad(format!("trials.ranks must name replicas below {replicas}"));
        }
        Ok(())
    }

    /// How many bits a trial flips: `rate` if given, else `flips` bursts.
    pub fn amount(&self) -> Amount {
        self.rate.map_or(Amount::Count(self.flips), Amount::Rate)
    }

    /// The last step any trial trains.
    pub fn last_step(&self) -> u64 {
        self.inject_at.iter().max().copied().unwrap_or(0) + self.steps_after
    }

    /// Trial `index`'s fault in a group of `replicas` replicas, drawn from the campaign
    /// seed alone.
    pub fn trial(&self, index: u64, replicas: usize) -> Trial {
        let mut rng = repro::rng::Stream::for_purpose(self.seed, "campaign.trial", &[index]);
        let mut pick = |n: usize| rng.below(n as u64) as usize;
        let step = self.inject_at[pick(self.inject_at.len())];
        let state = self.state[pick(self.state.len())];
        let rank = match &self.ranks {
            Some(ranks) => ranks[pick(ranks.len())],
            None => pick(replicas),
        };
        let flips = FlipSpec {
            target: Target { glob: self.target.clone(), role: Some(state.role()) },
            bits: self.bits,
            amount: self.amount(),
            burst: self.burst,
            seed: rng.next_u64(),
        };
        Trial { index, fault: LiveFault { step, rank, state, flips } }
    }
}

impl DetectSpec {
    /// Checks the knobs' ranges.
    pub fn validate(&self) -> Result<(), BadSpec> {
        if self.grad_norm_factor <= 1.0 || self.loss_factor <= 1.0 || !(0.0..1.0).contains(&self.smoothing) {
            return Err(BadSpec("detect: the factors must exceed 1 and smoothing lie in [0, 1)".into()));
        }
        Ok(())
    }
}

impl Thresholds {
    /// Checks the thresholds' ranges.
    pub fn validate(&self) -> Result<(), BadSpec> {
        if self.degraded_accuracy < 0.0 || self.degraded_loss < 0.0 || self.diverged_loss <= 1.0 {
            return Err(BadSpec("classify: thresholds must be non-negative and diverged_loss above 1".into()));
        }
        Ok(())
    }
}

/// The class of a trial's outcome. Its serde form is [`Outcome::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// No visible effect: final quality within the thresholds of golden's.
    Masked,
    /// Trained on, but to a measurably worse model.
    Degraded,
    /// NaN/Inf, or a training loss far above golden's.
    Diverged,
    /// The trial failed with an error.
    Crashed,
    /// A detector caught it (and the trial stopped, or repair did not restore golden bits).
    Detected,
    /// A detector caught it and repair restored the golden bits.
    Corrected,
}

impl Outcome {
    /// Every class, in report order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Masked,
        Outcome::Degraded,
        Outcome::Diverged,
        Outcome::Crashed,
        Outcome::Detected,
        Outcome::Corrected,
    ];

    /// The class's name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Masked => "masked",
            Outcome::Degraded => "degraded",
            Outcome::Diverged => "diverged",
            Outcome::Crashed => "crashed",
            Outcome::Detected => "detected",
            Outcome::Corrected => "corrected",
        }
    }
}

/// What was observed of a trial, for [`classify`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evidence {
    /// The trial failed with an error.
    pub crashed: bool,
    /// A NaN/Inf loss, or a loss past the divergence threshold.
    pub diverged: bool,
    /// A detector fired (and the response acted on it).
    pub acted_on_alarm: bool,
    /// The final state equals golden's bit for bit.
    pub bitwise_golden: bool,
    /// Golden's final test accuracy minus the trial's.
    pub accuracy_drop: f64,
    /// (Trial's final test loss - golden's) / golden's.
    pub loss_rise: f64,
}

/// The outcome of a trial. With `Observe`, alarms do not change the class (they are
/// reported beside it); with `Stop`, an alarm is the outcome; with `Repair`, an alarm
/// ends as corrected when the final bits are golden's, detected otherwise (unless the
/// trial diverged anyway).
pub fn classify(e: &Evidence, response: Response, t: &Thresholds) -> Outcome {
    if e.crashed {
        return Outcome::Crashed;
    }
    match response {
        Response::Stop if e.acted_on_alarm => return Outcome::Detected,
        Response::Repair if e.acted_on_alarm && e.bitwise_golden => return Outcome::Corrected,
        _ => {}
    }
    if e.diverged {
        return Outcome::Diverged;
    }
    if response == Response::Repair && e.acted_on_alarm {
        return Outcome::Detected;
    }
    // A NaN in the quality (a non-finite model that kept a finite loss) is degradation.
    if e.bitwise_golden {
        Outcome::Masked
    } else if !(e.accuracy_drop <= t.degraded_accuracy && e.loss_rise <= t.degraded_loss) {
        Outcome::Degraded
    } else {
        Outcome::Masked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trials(text: &str) -> Result<TrialSpec, BadSpec> {
        let t: TrialSpec =
            toml::from_str(&format!("inject_at = [5, 9]\n{text}")).map_err(|e| BadSpec(e.to_string()))?;
        t.validate(2)?;
        Ok(t)
    }

    #[test]
    fn an_outcome_is_written_and_read_as_its_name() {
        for o in Outcome::ALL {
            let text = toml::Value::try_from(o).unwrap();
            assert_eq!(text.as_str(), Some(o.name()));
            assert_eq!(text.try_into::<Outcome>().unwrap(), o);
        }
    }

    #[test]
    fn a_rate_replaces_the_count_of_flips() {
        assert_eq!(trials("").unwrap().trial(0, 2).fault.flips.amount, Amount::Count(1));
        let t = trials("rate = 1e-6").unwrap();
        assert_eq!(t.trial(4, 2).fault.flips.amount, Amount::Rate(1e-6));
    }

    #[test]
    fn malformed_trials_are_refused_with_the_reason() {
        for (text, needle) in [
            ("colour = 1", "colour"),
            ("state = [\"weights\"]", "weights"),
            ("bits = \"fraction\"", "fraction"),
            ("count = \"many\"", "count"),
            ("flips = 0", "flips"),
            ("ranks = [2]", "ranks"),
            ("inject_at = []", "inject_at"),
            ("rate = 0.0", "rate"),
            ("rate = 1.5", "rate"),
        ] {
            let err = trials(text).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn trials_are_pure_functions_of_the_seed_and_cover_the_choices() {
        let s = trials("state = [\"param\", \"grad\", \"optim\", \"activation\"]\ncount = 400").unwrap();
        let drawn: Vec<Trial> = (0..400).map(|i| s.trial(i, 2)).collect();
        assert_eq!(drawn, (0..400).map(|i| s.trial(i, 2)).collect::<Vec<_>>());
        let all: Vec<&LiveFault> = drawn.iter().map(|t| &t.fault).collect();
        for kind in StateKind::ALL {
            assert!(all.iter().any(|t| t.state == kind), "{kind:?} never drawn");
        }
        assert!(all.iter().any(|t| t.rank == 1) && all.iter().any(|t| t.rank == 0));
        assert!(all.iter().any(|t| t.step == 5) && all.iter().any(|t| t.step == 9));
        let seeds: std::collections::BTreeSet<u64> = all.iter().map(|t| t.flips.seed).collect();
        assert_eq!(seeds.len(), 400, "every trial has its own flip seed");
        let optim = all.iter().find(|t| t.state == StateKind::Optim).unwrap();
        assert_eq!(optim.flips.target.role, Some(ckpt::Role::Optim));
        let mut other = s.clone();
        other.seed = 2;
        assert_ne!(other.trial(0, 2).fault.flips.seed, s.trial(0, 2).fault.flips.seed);
    }

    #[test]
    fn classification_follows_the_response() {
        let t = Thresholds::default();
        let clean = Evidence { bitwise_golden: true, ..Evidence::default() };
        assert_eq!(classify(&clean, Response::Observe, &t), Outcome::Masked);
        let small = Evidence { accuracy_drop: 0.001, loss_rise: 0.001, ..Evidence::default() };
        assert_eq!(classify(&small, Response::Observe, &t), Outcome::Masked);
        let worse = Evidence { accuracy_drop: 0.02, ..Evidence::default() };
        assert_eq!(classify(&worse, Response::Observe, &t), Outcome::Degraded);
        let nan = Evidence { accuracy_drop: f64::NAN, ..Evidence::default() };
        assert_eq!(classify(&nan, Response::Observe, &t), Outcome::Degraded);
        let blown = Evidence { diverged: true, acted_on_alarm: true, ..Evidence::default() };
        assert_eq!(classify(&blown, Response::Observe, &t), Outcome::Diverged);
        assert_eq!(classify(&blown, Response::Stop, &t), Outcome::Detected);
        assert_eq!(classify(&blown, Response::Repair, &t), Outcome::Diverged);
        let fixed = Evidence { acted_on_alarm: true, bitwise_golden: true, ..Evidence::default() };
        assert_eq!(classify(&fixed, Response::Repair, &t), Outcome::Corrected);
        let caught = Evidence { acted_on_alarm: true, ..Evidence::default() };
        assert_eq!(classify(&caught, Response::Repair, &t), Outcome::Detected);
        let crash = Evidence { crashed: true, acted_on_alarm: true, ..Evidence::default() };
        assert_eq!(classify(&crash, Response::Stop, &t), Outcome::Crashed);
    }
}
