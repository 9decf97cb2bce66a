//! A data-parallel group simulated in one process: W replicas, each with its own copy of
//! the parameters and optimizer state, and one training step with faults, detectors and
//! the response to their alarms.
//!
//! Every replica takes the one step of [`train::step`], phase by phase, in lockstep with
//! the others, so that a fault can hit one replica alone and the detectors can compare
//! them between phases:
//!
//! 1. parameter faults (memory corruption between steps), then the parameter checksums;
//! 2. the compute phase: micro-batch `i` forward and backward on replica `i mod W`'s
//!    parameters (activation faults in the first micro-batch of the faulty replica);
//! 3. the sum of all micro-batch gradients, in index order, in the chosen reduction
//!    (what one process computes, so a fault-free group ends with `steadfast train`'s
//!    fingerprint), which every replica receives;
//! 4. gradient faults in one replica's copy of the sum, then the commit vote, the
//!    non-finite check and the spike detectors;
//! 5. optimizer faults, the slot checksums, the update on every replica, fresh checksums,
//!    and the fingerprint comparison every k steps.

use comm::majority::suspects;
use fault::campaign::{DetectSpec, Response};
use fault::live::StateKind;

use super::detect::{Alarm, Detector, Monitors};
use train::TrainError;
use train::state::Role;
use train::step::{At, Engine, GradBuffer, Hooks, Injected, LiveFaults, SumCheck, TrainState};

/// One replica's training state, with the checksums taken after its last update.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub state: TrainState,
    sums: Vec<u64>,
}

impl Replica {
    pub fn new(state: TrainState) -> Self {
        let mut r = Replica { state, sums: Vec::new() };
        r.sums = r.checksums();
        r
    }

    fn checksums(&self) -> Vec<u64> {
        self.state.tensors().map(|t| ckpt::checksum(bytemuck::cast_slice(&t.data))).collect()
    }

    /// Whether the tensors of `role` still match their checksums.
    fn intact(&self, role: Role) -> bool {
        let params = &self.state.params;
        let (tensors, sums) = match role {
            Role::Model => (&params[..], &self.sums[..params.len()]),
            Role::Optim => (self.state.optimizer.slots(), &self.sums[params.len()..]),
        };
        tensors.iter().zip(sums).all(|(t, &s)| ckpt::checksum(bytemuck::cast_slice(&t.data)) == s)
    }

    /// The checksums taken after the last update, one per tensor: the replica's state
    /// fingerprint (as discriminating as one hash over all of it, and already computed).
    pub fn fingerprint(&self) -> &[u64] {
        &self.sums
    }
}

/// The replicas and the detectors' running averages.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub replicas: Vec<Replica>,
    pub monitors: Monitors,
}

/// The buffers of a group's step, reused from step to step: each replica's micro-batch
/// gradients, the shared sum, and each replica's own copy of it when a fault hits that
/// copy alone.
pub(crate) struct Buffers {
    micro: Vec<Vec<GradBuffer>>,
    shared: GradBuffer,
    own: Vec<GradBuffer>,
}

impl Buffers {
    pub fn new(engine: &Engine<'_>, world: usize) -> Self {
        Buffers { micro: vec![Vec::new(); world], shared: engine.buffer(), own: vec![engine.buffer(); world] }
    }
}

/// What does not change during a campaign's step besides the engine.
pub(crate) struct Env<'a> {
    pub detect: &'a DetectSpec,
    /// The response to alarms (golden runs observe).
    pub response: Response,
}

/// What a step produced.
#[derive(Debug, Default)]
pub(crate) struct StepReport {
    pub loss: f32,
    pub grad_norm: f64,
    pub alarms: Vec<Alarm>,
    /// Replicas repaired by copying from a healthy one.
    pub repaired: usize,
    pub flips: Vec<Injected>,
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

    /// The step every replica is at.
    pub fn step_index(&self) -> u64 {
        self.replicas[0].state.step
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
                            Restore::Params => target.state.params = source.state.params,
                            Restore::Slots => target.state.optimizer = source.state.optimizer,
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

    /// The checksum detector on the stored tensors of `role`: replicas whose tensors no
    /// longer match the checksums taken after their last update raise an alarm, answered
    /// (by the response) with a copy of those tensors from a healthy replica.
    fn check_stored(&mut self, env: &Env<'_>, report: &mut StepReport, role: Role) -> Option<Verdict> {
        let bad: Vec<usize> = (0..self.world()).filter(|&r| !self.replicas[r].intact(role)).collect();
        if bad.is_empty() {
            return None;
        }
        let restore = match role {
            Role::Model => Restore::Params,
            Role::Optim => Restore::Slots,
        };
        self.respond(env, report, Alarm { detector: Detector::Checksum, faulty: bad }, restore)
    }

    /// Runs the replicas' next step with the faults that are due in it.
    pub fn step(
        &mut self,
        env: &Env<'_>,
        engine: &mut Engine<'_>,
        bufs: &mut Buffers,
        faults: &mut LiveFaults,
    ) -> Result<StepReport, TrainError> {
        let world = self.world();
        let step = self.step_index();
        let at = |rank| At { step, rank };
        let mut report = StepReport::default();

        // 1. Memory faults in parameters, caught (or not) by the checksums.
        for (r, replica) in self.replicas.iter_mut().enumerate() {
            faults.after_load(at(r), &mut replica.state)?;
        }
        report.flips.extend(faults.take_flips());
        if let Some(v) = self.check_stored(env, &mut report, Role::Model) {
            report.verdict = v;
            return Ok(report);
        }

        // 2. Forward and backward: micro-batch i on replica i mod W.
        for (r, replica) in self.replicas.iter().enumerate() {
            engine.compute(&replica.state, r, world, faults, &mut bufs.micro[r])?;
        }
        report.flips.extend(faults.take_flips());

        // 3. The reduction every replica receives, over the micro-batches in index order.
        let micro_batches = engine.sampler().micro_batches();
        let parts: Vec<&GradBuffer> = (0..micro_batches).map(|i| &bufs.micro[i % world][i / world]).collect();
        engine.reduce_local(&parts, &mut bufs.shared);

        // 4. Gradient faults in one replica's copy, then the vote and the numeric checks.
        let mut own = vec![false; world];
        for (r, copy) in bufs.own.iter_mut().enumerate() {
            if faults.due(at(r), StateKind::Grad) {
                copy.copy_from(&bufs.shared);
                faults.after_reduce(at(r), copy)?;
                own[r] = true;
            }
        }
        report.flips.extend(faults.take_flips());
        // Each distinct sum is read once: the shared one, and each replica's own copy.
        let shared = (SumCheck::of(&bufs.shared), bufs.shared.grad_norm());
        let mut checks: Vec<(SumCheck, f64)> = (0..world)
            .map(|r| if own[r] { (SumCheck::of(&bufs.own[r]), bufs.own[r].grad_norm()) } else { shared })
            .collect();
        if world > 1 {
            let digests: Vec<u64> = checks.iter().map(|(s, _)| s.digest).collect();
            if digests.iter().any(|&d| d != digests[0]) {
                let faulty = suspects(&digests);
                let alarm = Alarm { detector: Detector::Vote, faulty: faulty.clone() };
                if let Some(v) = self.respond(env, &mut report, alarm, Restore::Gradient) {
                    report.verdict = v;
                    return Ok(report);
                }
                if env.response == Response::Repair {
                    for f in faulty {
                        (own[f], checks[f]) = (false, shared);
                    }
                }
            }
        }
        let nonfinite: Vec<usize> = (0..world).filter(|&r| !checks[r].0.finite).collect();
        if !nonfinite.is_empty() {
            let alarm = Alarm { detector: Detector::NonFinite, faulty: nonfinite.clone() };
            if let Some(v) = self.respond(env, &mut report, alarm, Restore::Gradient) {
                report.verdict = v;
                return Ok(report);
            }
            if env.response == Response::Repair {
                for f in nonfinite {
                    (own[f], checks[f]) = (false, shared);
                }
            }
        }
        // The spike detectors see the worst replica (NaN if any is NaN).
        let (mut loss, mut norm) = (f32::MIN, 0.0f64);
        for (s, n) in &checks {
            loss = if s.loss.is_nan() || loss.is_nan() { f32::NAN } else { loss.max(s.loss) };
            norm = if n.is_nan() || norm.is_nan() { f64::NAN } else { norm.max(*n) };
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
        for (r, replica) in self.replicas.iter_mut().enumerate() {
            faults.before_update(at(r), &mut replica.state)?;
        }
        report.flips.extend(faults.take_flips());
        if let Some(v) = self.check_stored(env, &mut report, Role::Optim) {
            report.verdict = v;
            return Ok(report);
        }
        for (r, replica) in self.replicas.iter_mut().enumerate() {
            replica.state.apply(if own[r] { &bufs.own[r] } else { &bufs.shared });
            replica.sums = replica.checksums();
        }
        let done = step + 1;
        if world > 1 && env.detect.fingerprint_every > 0 && done.is_multiple_of(env.detect.fingerprint_every) {
            let prints: Vec<&[u64]> = self.replicas.iter().map(Replica::fingerprint).collect();
            if prints.iter().any(|p| *p != prints[0]) {
                let alarm = Alarm { detector: Detector::Fingerprint, faulty: suspects(&prints) };
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
