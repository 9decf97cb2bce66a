//! Fault-injection campaigns: a golden run, then many trials, each resumed from the
//! golden state in memory, injected, trained on and judged.
//!
//! A campaign ([`Spec`]) names a training run, the injection steps, the
//! kinds of state and bits a fault may hit, the detectors' thresholds and what an alarm
//! does. [`Campaign::run`]:
//!
//! 1. trains the golden run once per reduction strategy, keeping every state from the
//!    first injection step to the last step in memory, the training losses, and the
//!    detectors' alarms (a golden alarm is a false positive);
//! 2. runs every trial under every strategy, in parallel over the cores. Trial `i` draws
//!    its fault from the campaign seed alone ([`Spec::trial`]), so `--replay i` replays it
//!    bit for bit, whatever the thread count;
//! 3. after each step, counts per tensor and per replica the elements whose bits differ
//!    from golden's (the propagation of the fault). A trial whose state, detectors
//!    included, is golden's again after its fault has fired has rejoined the golden run;
//!    by determinism the rest of it is golden's, so it stops there and copies golden's
//!    tail;
//! 4. classifies it ([`fault::campaign::classify`]) from its final held-out quality
//!    against golden's, its losses and its alarms.
//!
//! The replicas of a data-parallel job are simulated in this process ([`group`]): each has
//! its own state; micro-batch `i` is computed by replica `i mod W`; all replicas receive
//! the same sum, so corruption that enters a gradient reaches every replica, while
//! corruption of one replica's stored state stays its own until it is used.

mod detect;
mod group;
pub mod output;
mod spec;

pub use sdc::rows;
pub use sdc::{GoldenRecord, TrialResult};
pub use spec::{RunSpec, Spec};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use comm::ReduceMode;
use fault::campaign::{Evidence, Outcome, Response, Trial};
use fault::live::StateKind;
use rayon::prelude::*;

use detect::Monitors;
pub use detect::{Alarm, Detector};
use group::{Buffers, Env, Group, Replica, Verdict};

use crate::LabError;
use train::config::TrainConfig;
use train::step::{Engine, LiveFaults, TrainState};
use train::trainer::{Prepared, evaluate_first};

/// A campaign ready to run: the spec, the data, the training configuration.
pub struct Campaign {
    /// The spec.
    pub spec: Spec,
    config: TrainConfig,
    prepared: Prepared,
}

/// The fault-free reference of one reduction strategy: its record (what the tables need)
/// and the states that trials resume from.
pub struct Golden {
    /// Losses, gradient norms, false alarms, held-out quality, tensors, time.
    pub record: GoldenRecord,
    first: u64,
    states: Vec<(Replica, Monitors)>,
}

impl Golden {
    fn state(&self, step: u64) -> &(Replica, Monitors) {
        &self.states[(step - self.first) as usize]
    }

    /// The fingerprint of the state after the last step: that of `steadfast train` with
    /// the same configuration and steps (every replica holds it).
    pub fn fingerprint(&self) -> u64 {
        self.states.last().expect("the golden run keeps its final state").0.state.fingerprint()
    }
}

impl Campaign {
    /// Checks the spec against the code (model, data, strategies, targets) and loads the
    /// data.
    pub fn prepare(spec: Spec) -> Result<Campaign, LabError> {
        spec.validate().map_err(|e| LabError::Spec(e.to_string()))?;
        let r = &spec.run;
        let mut config = TrainConfig::defaults(r.model);
        config.data = r.data;
        config.optimizer = r.optimizer;
        if let Some(lr) = r.lr {
            config.optim.lr = lr;
        }
        config.data_dir = r.data_dir.clone();
        config.seed = r.seed;
        config.batch = r.batch;
        config.micro_batch = r.micro_batch.unwrap_or(r.batch / r.replicas);
        let prepared = Prepared::load(&config)?;
        let campaign = Campaign { spec, config, prepared };
        campaign.check_targets()?;
        Ok(campaign)
    }

    /// Every kind of state in the spec must have a tensor that its target matches.
    fn check_targets(&self) -> Result<(), LabError> {
        let (state, engine) = self.prepared.start(&self.config);
        let micro_batch = self.config.micro_batch;
        for &kind in &self.spec.trials.state {
            let names: Vec<String> = match kind {
                StateKind::Param | StateKind::Grad => state.params.iter().map(|p| p.name.clone()).collect(),
                StateKind::Optim => state.optimizer.slots().iter().map(|p| p.name.clone()).collect(),
                StateKind::Activation => engine.activations(micro_batch).into_iter().map(|(n, _)| n).collect(),
            };
            let target = fault::plan::Target { glob: self.spec.trials.target.clone(), role: None };
            if !names.iter().any(|n| target.matches(n, kind.role())) {
                return Err(LabError::Spec(format!(
                    "trials.target {:?} matches no {} tensor (they are: {})",
                    self.spec.trials.target.as_deref().unwrap_or("*"),
                    kind.name(),
                    if names.is_empty() { "none for this model".to_owned() } else { names.join(", ") }
                )));
            }
        }
        Ok(())
    }

    /// A fresh state and an engine in the reduce mode of `reduce`.
    fn start(&self, reduce: ReduceMode) -> (TrainState, Engine<'_>) {
        let config = TrainConfig { reduce, ..self.config.clone() };
        self.prepared.start(&config)
    }

    fn env(&self, response: Response) -> Env<'_> {
        Env { detect: &self.spec.detect, response }
    }

    /// Held-out (loss, accuracy) of `state`.
    fn quality(&self, engine: &mut Engine<'_>, state: &TrainState) -> (f64, f64) {
        let limit = self.eval_limit();
        let report = engine.with_model(&state.params, |m| evaluate_first(m, &self.prepared.data, state.step, limit));
        (report.loss, report.accuracy)
    }

    fn eval_limit(&self) -> usize {
        match self.spec.run.eval_examples {
            0 => usize::MAX,
            n => n,
        }
    }

    /// Trains the golden run of `reduce` up to the last step any trial reaches.
    pub fn golden(&self, reduce: ReduceMode) -> Result<Golden, LabError> {
        let started = Instant::now();
        let env = self.env(Response::Observe);
        let (state, mut engine) = self.start(reduce);
        let replica = Replica::new(state);
        let tensors = replica.state.tensors().map(|t| (t.name.clone(), t.data.len())).collect();
        let mut group = Group { replicas: vec![replica; self.spec.run.replicas], monitors: Monitors::default() };
        let mut bufs = Buffers::new(&engine, group.world());
        let mut no_faults = LiveFaults::default();
        let first = self.spec.trials.inject_at.iter().min().copied().unwrap_or(0);
        let last = self.spec.last_step();
        let ends: Vec<u64> = self.spec.trials.inject_at.iter().map(|s| s + self.spec.trials.steps_after).collect();
        let mut record = GoldenRecord {
            reduce,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            alarms: Vec::new(),
            evals: BTreeMap::new(),
            tensors,
            time: Duration::ZERO,
        };
        let mut states = Vec::new();
        for step in 0..last {
            if step >= first {
                states.push((group.replicas[0].clone(), group.monitors.clone()));
            }
            let report = group.step(&env, &mut engine, &mut bufs, &mut no_faults)?;
            if !report.loss.is_finite() {
                return Err(train::TrainError::Diverged { step, loss: report.loss }.into());
            }
            record.losses.push(report.loss);
            record.grad_norms.push(report.grad_norm);
            record.alarms.push(report.alarms.iter().map(|a| a.detector).collect());
            if ends.contains(&(step + 1)) {
                record.evals.insert(step + 1, self.quality(&mut engine, &group.replicas[0].state));
            }
        }
        states.push((group.replicas[0].clone(), group.monitors.clone()));
        record.time = started.elapsed();
        Ok(Golden { record, first, states })
    }

    /// Runs trial `trial` under `golden`'s strategy. Never fails: an error or a panic
    /// inside the trial is its outcome (crashed).
    pub fn trial(&self, golden: &Golden, trial: &Trial) -> TrialResult {
        let started = Instant::now();
        let mut result = TrialResult {
            trial: trial.clone(),
            reduce: golden.record.reduce,
            outcome: Outcome::Crashed,
            evidence: Evidence::default(),
            flips: Vec::new(),
            first_alarm: [None; 6],
            losses: Vec::new(),
            replica_differing: Vec::new(),
            tensor_differing: Vec::new(),
            quality: None,
            rejoined: None,
            rollbacks: 0,
            repairs: 0,
            error: None,
            time: Duration::ZERO,
        };
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.trial_inner(golden, trial, &mut result)));
        let crashed = match run {
            Ok(Ok(())) => false,
            Ok(Err(e)) => {
                result.error = Some(e.to_string());
                true
            }
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panic".into());
                result.error = Some(format!("panicked: {text}"));
                true
            }
        };
        result.evidence.crashed = crashed;
        result.outcome = fault::campaign::classify(&result.evidence, self.spec.detect.response, &self.spec.classify);
        result.time = started.elapsed();
        result
    }

    fn trial_inner(&self, golden: &Golden, trial: &Trial, out: &mut TrialResult) -> Result<(), LabError> {
        let response = self.spec.detect.response;
        let env = self.env(response);
        let (_, mut engine) = self.start(golden.record.reduce);
        let (start, monitors) = golden.state(trial.fault.step);
        let mut group = Group { replicas: vec![start.clone(); self.spec.run.replicas], monitors: monitors.clone() };
        let mut bufs = Buffers::new(&engine, group.world());
        let mut faults = LiveFaults::new([trial.fault.clone()]);
        let end = trial.fault.step + self.spec.trials.steps_after;
        let thresholds = &self.spec.classify;
        let mut alarmed = false;
        let mut step = trial.fault.step;
        while step < end {
            let before = (response == Response::Repair).then(|| group.clone());
            let report = group.step(&env, &mut engine, &mut bufs, &mut faults)?;
            out.flips.extend(report.flips.into_iter().map(|i| (i.at.rank, i.flip)));
            out.repairs += report.repaired as u32;
            for a in &report.alarms {
                out.first_alarm[a.detector.index()].get_or_insert(step);
                alarmed = true;
            }
            match report.verdict {
                Verdict::Applied => {}
                Verdict::Stop => break,
                Verdict::RollBack => {
                    out.rollbacks += 1;
                    if out.rollbacks > self.spec.detect.max_rollbacks {
                        break;
                    }
                    group = before.expect("kept when repairing");
                    continue;
                }
            }
            let golden_loss = golden.record.losses[step as usize];
            out.losses.push(report.loss);
            let (replicas, tensors) = differing(&group, &golden.state(step + 1).0);
            let rejoined =
                faults.all_fired() && replicas.iter().all(|&d| d == 0) && group.monitors == golden.state(step + 1).1;
            out.replica_differing.push(replicas);
            out.tensor_differing.push(tensors);
            step += 1;
            if !report.loss.is_finite() || f64::from(report.loss) > thresholds.diverged_loss * f64::from(golden_loss) {
                out.evidence.diverged = true;
                break;
            }
            if rejoined && step < end {
                out.rejoined = Some(step);
                for s in step..end {
                    out.losses.push(golden.record.losses[s as usize]);
                    out.replica_differing.push(vec![0; self.spec.run.replicas]);
                    out.tensor_differing.push(vec![0; golden.record.tensors.len()]);
                }
                step = end;
            }
        }
        out.evidence.acted_on_alarm = alarmed && response != Response::Observe;
        let finished = step == end && !out.evidence.diverged;
        out.evidence.bitwise_golden =
            finished && out.replica_differing.last().is_some_and(|r| r.iter().all(|&d| d == 0));
        if finished {
            let (g_loss, g_acc) = golden.record.evals[&end];
            let quality = if out.evidence.bitwise_golden {
                (g_loss, g_acc)
            } else {
                // The worst of the distinct replicas.
                let mut worst = (f64::NEG_INFINITY, f64::INFINITY);
                let mut seen: Vec<&[u64]> = Vec::new();
                for r in &group.replicas {
                    let print = r.fingerprint();
                    if seen.contains(&print) {
                        continue;
                    }
                    seen.push(print);
                    let (l, a) = self.quality(&mut engine, &r.state);
                    worst = (nan_max(worst.0, l), nan_min(worst.1, a));
                }
                worst
            };
            out.quality = Some(quality);
            out.evidence.accuracy_drop = g_acc - quality.1;
            out.evidence.loss_rise = (quality.0 - g_loss) / g_loss;
        }
        Ok(())
    }

    /// Runs the golden runs and every trial (`only`: just these trial indices), calling
    /// `progress` as trials finish. The result lists trials by index, then strategy.
    pub fn run(
        &self,
        only: Option<&[u64]>,
        progress: &(dyn Fn(&TrialResult) + Sync),
    ) -> Result<(Vec<Golden>, Vec<TrialResult>), LabError> {
        let goldens: Vec<Golden> =
            self.spec.run.reduce.par_iter().map(|&r| self.golden(r)).collect::<Result<Vec<_>, LabError>>()?;
        let indices: Vec<u64> = match only {
            Some(list) => list.to_vec(),
            None => (0..self.spec.trials.count).collect(),
        };
        let jobs: Vec<(u64, usize)> = indices.iter().flat_map(|&i| (0..goldens.len()).map(move |g| (i, g))).collect();
        let results = jobs
            .par_iter()
            .map(|&(i, g)| {
                let r = self.trial(&goldens[g], &self.spec.trial(i));
                progress(&r);
                r
            })
            .collect();
        Ok((goldens, results))
    }

    /// The number of trial runs of the whole campaign ([`Campaign::run`] with no `only`
    /// calls `progress` this many times).
    pub fn jobs(&self) -> u64 {
        self.spec.trials.count * self.spec.run.reduce.len() as u64
    }
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
}

/// Elements whose bits differ from `golden`'s: the total per replica, and per tensor the
/// largest count over the replicas.
fn differing(group: &Group, golden: &Replica) -> (Vec<u64>, Vec<u64>) {
    let mut per_tensor = vec![0u64; golden.state.tensors().count()];
    let per_replica = group
        .replicas
        .iter()
        .map(|r| {
            let mut total = 0;
            for (i, (a, b)) in r.state.tensors().zip(golden.state.tensors()).enumerate() {
                let d = a.data.iter().zip(&b.data).filter(|(x, y)| x.to_bits() != y.to_bits()).count() as u64;
                per_tensor[i] = per_tensor[i].max(d);
                total += d;
            }
            total
        })
        .collect();
    (per_replica, per_tensor)
}
