//! What a campaign's runner hands over: per reduction strategy, what the tables need of the
//! golden run ([`GoldenRecord`]); per trial and strategy, what happened ([`TrialResult`]).
//! Plain data: the runner keeps its states and models, the record keeps numbers.

use std::collections::BTreeMap;
use std::time::Duration;

use comm::ReduceMode;
use fault::campaign::{Evidence, Outcome, Trial};
use fault::live::LiveFlip;

use crate::error::bad;
use crate::{Detector, SdcError};

/// The fault-free reference of one reduction strategy, as far as the tables need it.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenRecord {
    /// The strategy.
    pub reduce: ReduceMode,
    /// Training loss of every step from 0.
    pub losses: Vec<f32>,
    /// Gradient norm of every step from 0.
    pub grad_norms: Vec<f64>,
    /// The detectors that fired at each step (false positives).
    pub alarms: Vec<Vec<Detector>>,
    /// Held-out (loss, accuracy) at each step where a trial ends.
    pub evals: BTreeMap<u64, (f64, f64)>,
    /// Names of the state tensors, parameters then slots, with their element counts (the
    /// order of [`TrialResult::tensor_differing`]).
    pub tensors: Vec<(String, usize)>,
    /// Wall-clock time of the golden run.
    pub time: Duration,
}

/// What happened in one trial under one strategy.
#[derive(Clone, Debug)]
pub struct TrialResult {
    /// The fault.
    pub trial: Trial,
    /// The strategy.
    pub reduce: ReduceMode,
    /// The class.
    pub outcome: Outcome,
    /// What the classification saw.
    pub evidence: Evidence,
    /// The bits that were flipped, with the replica.
    pub flips: Vec<(usize, LiveFlip)>,
    /// The first step at which each detector fired ([`Detector::ALL`] order).
    pub first_alarm: [Option<u64>; 6],
    /// Training loss of each step from the injection step on.
    pub losses: Vec<f32>,
    /// Per step, per replica: elements that differ from golden after the step.
    pub replica_differing: Vec<Vec<u64>>,
    /// Per step, per tensor: elements that differ from golden in the worst replica.
    pub tensor_differing: Vec<Vec<u64>>,
    /// Final held-out (loss, accuracy), the worst over the replicas.
    pub quality: Option<(f64, f64)>,
    /// The step after which the trial's state was golden's again.
    pub rejoined: Option<u64>,
    /// Steps rolled back and redone.
    pub rollbacks: u32,
    /// Replicas repaired by copying from a healthy one.
    pub repairs: u32,
    /// Why the trial crashed.
    pub error: Option<String>,
    /// Wall-clock time.
    pub time: Duration,
}

/// Checks that a record fits its spec and itself, so that the tables can be computed:
/// each golden run has a loss, a gradient norm and a list of alarms for every step a trial
/// may train; each result has the golden run of its strategy, stays within it, counts no
/// more tensors than it has, and saw no alarm before its fault. (The lab's records fit by
/// construction; a record from elsewhere may not.) Errors name the field, as
/// `results[3].losses`.
pub fn check(about: &crate::About, goldens: &[GoldenRecord], results: &[TrialResult]) -> Result<(), SdcError> {
    let last = about.trials.last_step();
    for (i, g) in goldens.iter().enumerate() {
        let at = |field: &str| format!("goldens[{i}].{field}");
        let steps = g.losses.len();
        if (steps as u64) < last {
            return Err(bad(at("losses"), format!("{steps} steps, but trials train up to step {last}")));
        }
        if g.grad_norms.len() != steps {
            return Err(bad(at("grad_norms"), format!("{} steps against {steps} losses", g.grad_norms.len())));
        }
        if g.alarms.len() != steps {
            return Err(bad(at("alarms"), format!("{} steps against {steps} losses", g.alarms.len())));
        }
    }
    for (i, r) in results.iter().enumerate() {
        let at = |field: &str| format!("results[{i}].{field}");
        check_result(r, &at)?;
        let Some(golden) = goldens.iter().find(|g| g.reduce == r.reduce) else {
            return Err(bad(at("reduce"), format!("no golden run of {}", r.reduce)));
        };
        let end = r.trial.fault.step + r.losses.len() as u64;
        if end > golden.losses.len() as u64 {
            return Err(bad(
                at("losses"),
                format!("the trial trains up to step {end}, past the golden run's {}", golden.losses.len()),
            ));
        }
        if let Some(d) = r.tensor_differing.iter().find(|d| d.len() > golden.tensors.len()) {
            return Err(bad(
                at("tensor_differing"),
                format!("{} tensors, but the golden run has {}", d.len(), golden.tensors.len()),
            ));
        }
    }
    Ok(())
}

/// The rule of [`check`] that concerns a result alone: no detector fired before the fault
/// (`at` names a field of the result).
pub(crate) fn check_result(r: &TrialResult, at: &dyn Fn(&str) -> String) -> Result<(), SdcError> {
    for d in Detector::ALL {
        if let Some(step) = r.first_alarm[d.index()]
            && step < r.trial.fault.step
        {
            return Err(bad(
                at(&format!("first_alarm.{d}")),
                format!("step {step}, before the fault at step {}", r.trial.fault.step),
            ));
        }
    }
    Ok(())
}
