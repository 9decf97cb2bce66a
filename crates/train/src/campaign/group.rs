//! A data-parallel group simulated in one process: W replicas, each with its own copy of
//! the parameters and optimizer state, and one training step with faults, detectors and
//! the response to their alarms.
//!
//! The step follows the trainer's (see [`crate::trainer`]) phase by phase, with every
//! replica's buffers in reach so that a fault can hit one replica alone:
//!
//! 1. parameter faults (memory corruption between steps), then the parameter checksums;
//! 2. micro-batch `i` forward and backward on replica `i mod W`'s parameters (activation
//!    faults in the first micro-batch of the faulty replica);
//! 3. the sum of all micro-batch gradients in the chosen reduction, which every replica
//!    receives;
//! 4. gradient faults in one replica's copy of the sum, then the commit vote, the
//!    non-finite check and the spike detectors;
//! 5. optimizer faults, the slot checksums, the update on every replica, fresh checksums,
//!    and the fingerprint comparison every k steps.

use burn::prelude::Device;
use comm::ReduceMode;
use fault::campaign::{DetectSpec, Response};
use fault::live::{LiveFault, LiveFlip, StateKind};

use super::detect::{Alarm, Detector, Monitors, minority};
use crate::data::sampler::Sampler;
use crate::data::{Dataset, Split};
use crate::error::TrainError;
use crate::model::{Model, Taps};
use crate::optim::Optimizer;
use crate::state::{self, NamedTensor, Role};

/// One replica's training state, with the checksums taken after its last update.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub params: Vec<NamedTensor>,
    pub optim: Optimizer,
    sums: Vec<u64>,
}

impl Replica {
    pub fn new(params: Vec<NamedTensor>, optim: Optimizer) -> Self {
        let mut r = Replica { params, optim, sums: Vec::new() };
        r.sums = r.checksums();
        r
    }

    /// Parameters then slots, in registry order.
    pub fn tensors(&self) -> impl Iterator<Item = &NamedTensor> {
        self.params.iter().chain(self.optim.slots())
    }

    fn checksums(&self) -> Vec<u64> {
        self.tensors().map(|t| ckpt::checksum(bytemuck::cast_slice(&t.data))).collect()
    }

    /// Whether the tensors of `role` still match their checksums.
    fn intact(&self, role: Role) -> bool {
        let (tensors, sums) = match role {
            Role::Model => (&self.params[..], &self.sums[..self.params.len()]),
            Role::Optim => (self.optim.slots(), &self.sums[self.params.len()..]),
        };
        tensors.iter().zip(sums).all(|(t, &s)| ckpt::checksum(bytemuck::cast_slice(&t.data)) == s)
    }

    /// The checksums taken after the last update, one per tensor: the replica's state
    /// fingerprint (as discriminating as one hash over all of it, and already computed).
    pub fn fingerprint(&self) -> &[u64] {
        &self.sums
    }
}

/// What the commit vote and the numeric checks read of one summed gradient.
#[derive(Clone, Copy)]
struct SumStats {
    digest: u64,
    finite: bool,
    loss: f32,
    norm: f64,
}

impl SumStats {
    /// `flat` is the gradient followed by the loss.
    fn of(flat: &[f32]) -> Self {
        let (grad, loss) = flat.split_at(flat.len() - 1);
        SumStats {
            digest: ckpt::checksum(bytemuck::cast_slice(flat)),
            finite: flat.iter().all(|x| x.is_finite()),
            loss: loss[0],
            norm: grad.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt(),
        }
    }
}

/// The replicas and the detectors' running averages.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub replicas: Vec<Replica>,
    pub monitors: Monitors,
}

/// A fault waiting for its step; consumed when applied, so that a rolled-back step is
/// redone without it (the faults modelled are transient).
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub fault: LiveFault,
    pub done: bool,
}

/// What does not change during a campaign.
pub(crate) struct Env<'a> {
    pub data: &'a Dataset,
    pub device: &'a Device,
    pub reduce: ReduceMode,
    pub detect: &'a DetectSpec,
    /// The response to alarms (golden runs observe).
    pub response: Response,
    pub micro_batch: usize,
    pub denominator: usize,
}

/// What a step produced.
#[derive(Debug, Default)]
pub(crate) struct StepReport {
    pub loss: f32,
    pub grad_norm: f64,
    pub alarms: Vec<Alarm>,
    /// Replicas repaired by copying from a healthy one.
    pub repaired: usize,
    pub flips: Vec<(StateKind, usize, LiveFlip)>,
    pub verdict: Verdict,
}

/// How the step ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Applied.
    #[default]
    Applied,
    /// An alarm that no replica could repair: restore the state from before the step and
    /// redo it.
    RollBack,
    /// An alarm, and the response is to stop.
    Stop,
}

impl Group {
    pub fn world(&self) -> usize {
        self.replicas.len()
    }

    /// Handles an alarm by the response: `None` to go on (observed, or repaired).
    fn respond(&mut self, env: &Env<'_>, report: &mut StepReport, alarm: Alarm, copy: Restore) -> Option<Verdict> {
        let healthy = (0..self.world()).find(|r| !alarm.faulty.contains(r));
        let verdict = match env.response {
            Response::Observe => None,
            Response::Stop => Some(Verdict::Stop),
            Response::Repair => match healthy {
                Some(h) if !alarm.faulty.is_empty() => {
                    for &f in &alarm.faulty {
                        let source = self.replicas[h].clone();
                        let target = &mut self.replicas[f];
                        match copy {
                            Restore::Params => target.params = source.params,
                            Restore::Slots => target.optim = source.optim,
                            Restore::State => *target = source,
                            // The gradient is not state: the caller takes the healthy copy.
                            Restore::Gradient => {}
                        }
                        report.repaired += 1;
                    }
                    None
                }
                _ => Some(Verdict::RollBack),
            },
        };
        report.alarms.push(alarm);
        verdict
    }

    /// Runs step `step` (0-based) with the pending faults of that step.
    pub fn step(
        &mut self,
        env: &Env<'_>,
        model: &mut Option<Model>,
        sampler: &mut Sampler,
        step: u64,
        pending: &mut [Pending],
    ) -> Result<StepReport, TrainError> {
        let world = self.world();
        let mut report = StepReport::default();
        let mut due = |kind: StateKind| -> Vec<LiveFault> {
            let mut out = Vec::new();
            for p in pending.iter_mut().filter(|p| !p.done && p.fault.step == step && p.fault.state == kind) {
                p.done = true;
                out.push(p.fault.clone());
            }
            out
        };
        let (param_faults, act_faults, grad_faults, optim_faults) =
            (due(StateKind::Param), due(StateKind::Activation), due(StateKind::Grad), due(StateKind::Optim));

        // 1. Memory faults in parameters, caught (or not) by the checksums.
        for f in &param_faults {
            let flips = f.apply(&mut state::views(&mut self.replicas[f.rank].params))?;
            report.flips.extend(flips.into_iter().map(|x| (StateKind::Param, f.rank, x)));
        }
        let bad: Vec<usize> = (0..world).filter(|&r| !self.replicas[r].intact(Role::Model)).collect();
        if !bad.is_empty()
            && let Some(v) =
                self.respond(env, &mut report, Alarm { detector: Detector::Checksum, faulty: bad }, Restore::Params)
        {
            report.verdict = v;
            return Ok(report);
        }

        // 2. Forward and backward: micro-batch i on replica i mod W.
        let micro_batches = sampler.micro_batches();
        let mut parts: Vec<Vec<f32>> = vec![Vec::new(); micro_batches];
        for (r, replica) in self.replicas.iter().enumerate() {
            let m = model.take().expect("a model").load(&replica.params);
            for i in (r..micro_batches).step_by(world) {
                let batch = env.data.batch(Split::Train, &sampler.micro_batch(step, i));
                let mut taps = Taps::none();
                if i == r {
                    for f in act_faults.iter().filter(|f| f.rank == r) {
                        taps.add(&m, env.micro_batch, &f.flips)?;
                    }
                }
                let (l, g) = m.loss_and_grads_tapped(&batch, env.denominator, env.device, &mut taps);
                report.flips.extend(taps.log.into_iter().map(|x| (StateKind::Activation, r, x)));
                let mut flat = g.concat();
                flat.push(l);
                parts[i] = flat;
            }
            *model = Some(m);
        }

        // 3. The reduction every replica receives.
        let refs: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
        let shared = comm::sum_parts(env.reduce, &refs);
        let n = shared.len() - 1;

        // 4. Gradient faults in one replica's copy, then the vote and the numeric checks.
        let mut own: Vec<Option<Vec<f32>>> = vec![None; world];
        for f in &grad_faults {
            let copy = own[f.rank].get_or_insert_with(|| shared.clone());
            let flips = f.apply(&mut state::flat_views(&mut copy[..n], &self.replicas[f.rank].params))?;
            report.flips.extend(flips.into_iter().map(|x| (StateKind::Grad, f.rank, x)));
        }
        // Each distinct sum is read once: the shared one, and each replica's own copy.
        let shared_stats = SumStats::of(&shared);
        let mut stats: Vec<SumStats> = own.iter().map(|c| c.as_deref().map_or(shared_stats, SumStats::of)).collect();
        if world > 1 {
            let digests: Vec<u64> = stats.iter().map(|s| s.digest).collect();
            if digests.iter().any(|&d| d != digests[0]) {
                // Two replicas that disagree cannot tell which one is wrong.
                let faulty = minority(&digests).unwrap_or_else(|| (0..world).collect());
                let alarm = Alarm { detector: Detector::Vote, faulty: faulty.clone() };
                if let Some(v) = self.respond(env, &mut report, alarm, Restore::Gradient) {
                    report.verdict = v;
                    return Ok(report);
                }
                if env.response == Response::Repair {
                    for f in faulty {
                        (own[f], stats[f]) = (None, shared_stats);
                    }
                }
            }
        }
        let nonfinite: Vec<usize> = (0..world).filter(|&r| !stats[r].finite).collect();
        if !nonfinite.is_empty() {
            let alarm = Alarm { detector: Detector::NonFinite, faulty: nonfinite.clone() };
            if let Some(v) = self.respond(env, &mut report, alarm, Restore::Gradient) {
                report.verdict = v;
                return Ok(report);
            }
            if env.response == Response::Repair {
                for f in nonfinite {
                    (own[f], stats[f]) = (None, shared_stats);
                }
            }
        }
        // The spike detectors see the worst replica (NaN if any is NaN).
        let (mut loss, mut norm) = (f32::MIN, 0.0f64);
        for s in &stats {
            loss = if s.loss.is_nan() || loss.is_nan() { f32::NAN } else { loss.max(s.loss) };
            norm = if s.norm.is_nan() || norm.is_nan() { f64::NAN } else { norm.max(s.norm) };
        }
        report.loss = loss;
        report.grad_norm = norm;
        let (norm_fires, loss_fires) = self.monitors.check(f64::from(loss), norm, env.detect);
        for (fires, detector) in [(norm_fires, Detector::GradNorm), (loss_fires, Detector::LossSpike)] {
            if fires
                && let Some(v) =
                    self.respond(env, &mut report, Alarm { detector, faulty: Vec::new() }, Restore::Gradient)
            {
                report.verdict = v;
                return Ok(report);
            }
        }

        // 5. Optimizer faults, slot checksums, the update, fresh checksums, fingerprints.
        for f in &optim_faults {
            let flips = f.apply(&mut state::views(self.replicas[f.rank].optim.slots_mut()))?;
            report.flips.extend(flips.into_iter().map(|x| (StateKind::Optim, f.rank, x)));
        }
        let bad: Vec<usize> = (0..world).filter(|&r| !self.replicas[r].intact(Role::Optim)).collect();
        if !bad.is_empty()
            && let Some(v) =
                self.respond(env, &mut report, Alarm { detector: Detector::Checksum, faulty: bad }, Restore::Slots)
        {
            report.verdict = v;
            return Ok(report);
        }
        for (replica, copy) in self.replicas.iter_mut().zip(&own) {
            let grads = state::split_like(&copy.as_deref().unwrap_or(&shared)[..n], &replica.params);
            replica.optim.step(&mut replica.params, &grads);
            replica.sums = replica.checksums();
        }
        let done = step + 1;
        if world > 1 && env.detect.fingerprint_every > 0 && done.is_multiple_of(env.detect.fingerprint_every) {
            let prints: Vec<Vec<u64>> = self.replicas.iter().map(|r| r.fingerprint().to_vec()).collect();
            if prints.iter().any(|p| *p != prints[0]) {
                let faulty = minority(&prints).unwrap_or_else(|| (0..world).collect());
                let alarm = Alarm { detector: Detector::Fingerprint, faulty };
                if let Some(v) = self.respond(env, &mut report, alarm, Restore::State) {
                    report.verdict = v;
                    return Ok(report);
                }
            }
        }
        Ok(report)
    }
}

/// What a repair copies from a healthy replica.
#[derive(Clone, Copy, Debug)]
enum Restore {
    Params,
    Slots,
    State,
    Gradient,
}
