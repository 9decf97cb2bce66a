//! A data-parallel group simulated in one process: W replicas, each with its own copy of
//! the parameters and optimizer state, and one training step with faults, detectors and
//! the response to their alarms.
//!
//! Every replica runs the data-parallel schedule of [`train::schedule`] on the step
//! [`driver`](train::driver), in lockstep with the others: its runner stops at every
//! operation that involves the other replicas, so that a fault can hit one replica alone
//! and the detectors can compare them between phases:
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

use comm::commit::{Ballot, Decision, decide};
use comm::majority::suspects;
use fault::campaign::{DetectSpec, Response};
use fault::live::StateKind;

use super::detect::{Alarm, Detector, Monitors};
use train::TrainError;
use train::driver::{Driver, Flow, Reduction, Runner, Stop};
use train::schedule::{self, Op};
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
            // (Training state holds no extra tensors: all of it is model or optimizer.)
            Role::Optim | Role::Extra => (self.state.optimizer.slots(), &self.sums[params.len()..]),
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

/// What a group's step keeps from step to step: each replica's schedule and step driver
/// (its micro-batch gradients and the sum it applies), the shared sum, and each replica's
/// own copy of it when a fault hits that copy alone.
pub(crate) struct Buffers {
    ops: Vec<Vec<Op>>,
    drivers: Vec<Driver>,
    shared: GradBuffer,
    own: Vec<GradBuffer>,
}

impl Buffers {
    pub fn new(engine: &Engine<'_>, world: usize) -> Self {
        let micro_batches = engine.sampler().micro_batches();
        Buffers {
            ops: (0..world).map(|r| schedule::data_parallel(micro_batches, r, world)).collect(),
            drivers: (0..world).map(|r| Driver::new(engine, r)).collect(),
            shared: engine.buffer(),
            own: vec![engine.buffer(); world],
        }
    }
}

/// A replica's runner: it stops its step at every operation that involves the other
/// replicas (and after the load, and before the optimizer, where the group checks the
/// stored state), so that the group takes them for all replicas at once.
struct Lockstep<'r> {
    flips: &'r mut Vec<Injected>,
}

impl Runner for Lockstep<'_> {
    fn loaded(&mut self, _at: At, _state: &mut TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Pause)
    }

    fn reduce(&mut self, _at: At, _r: Reduction<'_, '_>) -> Result<Flow, TrainError> {
        Ok(Flow::Pause)
    }

    fn vote(&mut self, _at: At, _sum: &GradBuffer) -> Result<Flow, TrainError> {
        Ok(Flow::Pause)
    }

    fn updating(&mut self, _at: At, _state: &mut TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Pause)
    }

    fn check_replicas(&mut self, _at: At, _state: &TrainState) -> Result<Flow, TrainError> {
        Ok(Flow::Pause)
    }

    fn injected(&mut self, flips: Vec<Injected>) -> Result<(), TrainError> {
        self.flips.extend(flips);
        Ok(())
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
            Role::Optim | Role::Extra => Restore::Slots,
        };
        self.respond(env, report, Alarm { detector: Detector::Checksum, faulty: bad }, restore)
    }

    /// Runs every replica's step on from `from` (the same operation for each, all
    /// schedules having the same shape) until each stops for the group.
    /// With `own`, through the update: replica `r` applies its own copy of the sum when
    /// `own[r]`, else the shared one, lent to its driver for the while (swapped in and
    /// out, not copied).
    fn advance(
        &mut self,
        engine: &mut Engine<'_>,
        bufs: &mut Buffers,
        faults: &mut LiveFaults,
        report: &mut StepReport,
        from: &mut [usize],
        own: Option<&[bool]>,
    ) -> Result<(), TrainError> {
        let Buffers { ops, drivers, shared, own: copies } = bufs;
        for (r, replica) in self.replicas.iter_mut().enumerate() {
            let mut sum = own.map(|own| if own[r] { &mut copies[r] } else { &mut *shared });
            if let Some(s) = sum.as_deref_mut() {
                std::mem::swap(drivers[r].sum_mut(), s);
            }
            let mut runner = Lockstep { flips: &mut report.flips };
            let stop = drivers[r].run(&ops[r], from[r], engine, &mut replica.state, faults, &mut runner);
            if let Some(s) = sum {
                std::mem::swap(drivers[r].sum_mut(), s);
            }
            from[r] = match stop? {
                Stop::Paused { next } => next,
                Stop::Done => ops[r].len(),
                Stop::Ended { at } => unreachable!("a lockstep replica never ends its step ({at:?})"),
            };
        }
        Ok(())
    }

    /// Runs the replicas' next step with the faults that are due in it.
    pub fn step(
        &mut self,
        env: &Env<'_>,
        engine: &mut Engine<'_>,
        bufs: &mut Buffers,
        faults: &mut LiveFaults,
    ) -> Result<StepReport, TrainError> {
        let mut report = StepReport::default();
        let mut from = vec![0; self.world()];
        // 1. Memory faults in parameters, caught (or not) by the checksums.
        self.advance(engine, bufs, faults, &mut report, &mut from, None)?;
        if let Some(v) = self.check_stored(env, &mut report, Role::Model) {
            report.verdict = v;
            return Ok(report);
        }
        // 2. Forward and backward: micro-batch i on replica i mod W, up to the reduction.
        self.advance(engine, bufs, faults, &mut report, &mut from, None)?;
        // 3. The reduction every replica receives, over the micro-batches in index order.
        let (world, micro_batches) = (self.world(), engine.sampler().micro_batches());
        let parts: Vec<&GradBuffer> = (0..micro_batches).map(|i| &bufs.drivers[i % world].micro()[i / world]).collect();
        engine.reduce_local(&parts, &mut bufs.shared);
        // 4. Up to the vote: gradient faults, the vote and the numeric checks.
        self.advance(engine, bufs, faults, &mut report, &mut from, None)?;
        let own = match self.check_sums(env, bufs, faults, &mut report)? {
            Ok(own) => own,
            Err(v) => {
                report.verdict = v;
                return Ok(report);
            }
        };
        // 5. Optimizer faults, slot checksums, the update, fresh checksums, fingerprints.
        self.advance(engine, bufs, faults, &mut report, &mut from, None)?;
        if let Some(v) = self.check_stored(env, &mut report, Role::Optim) {
            report.verdict = v;
            return Ok(report);
        }
        self.advance(engine, bufs, faults, &mut report, &mut from, Some(&own))?;
        for replica in &mut self.replicas {
            replica.sums = replica.checksums();
        }
        let done = self.step_index();
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
        self.advance(engine, bufs, faults, &mut report, &mut from, None)?;
        Ok(report)
    }

    /// The checks of the sums each replica is about to apply: gradient faults in one
    /// replica's copy, the commit vote ([`comm::commit::decide`]) and the non-finite
    /// check on the ballots, then the spike detectors. Returns which replicas apply their
    /// own copy, or the verdict that ends the step.
    fn check_sums(
        &mut self,
        env: &Env<'_>,
        bufs: &mut Buffers,
        faults: &mut LiveFaults,
        report: &mut StepReport,
    ) -> Result<Result<Vec<bool>, Verdict>, TrainError> {
        let world = self.world();
        let step = self.step_index();
        let mut own = vec![false; world];
        for (r, copy) in bufs.own.iter_mut().enumerate() {
            let at = At { step, rank: r };
            if faults.due(at, StateKind::Grad) {
                copy.copy_from(&bufs.shared);
                faults.after_reduce(at, copy)?;
                own[r] = true;
            }
        }
        report.flips.extend(faults.take_flips());
        // Each distinct sum is read once: the shared one, and each replica's own copy.
        let shared = (SumCheck::of(&bufs.shared), bufs.shared.grad_norm());
        let mut checks: Vec<(SumCheck, f64)> = (0..world)
            .map(|r| if own[r] { (SumCheck::of(&bufs.own[r]), bufs.own[r].grad_norm()) } else { shared })
            .collect();
        let ballots = |checks: &[(SumCheck, f64)]| -> Vec<Ballot> {
            checks.iter().map(|(s, _)| Ballot { ok: s.finite, digest: s.digest, durable: 0 }).collect()
        };
        // The commit rule names the replicas whose digest is outvoted, then (on the sums
        // left after a repair) those whose sum is not finite.
        for detector in [Detector::Vote, Detector::NonFinite] {
            let Decision::Abort { vetoed, disagreeing } = decide(&ballots(&checks)) else { break };
            let faulty = if detector == Detector::Vote { disagreeing } else { vetoed };
            if faulty.is_empty() {
                continue;
            }
            let alarm = Alarm { detector, faulty: faulty.clone() };
            if let Some(v) = self.respond(env, report, alarm, Restore::Gradient) {
                return Ok(Err(v));
            }
            if env.response == Response::Repair {
                for f in faulty {
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
                && let Some(v) = self.respond(env, report, Alarm { detector, faulty: Vec::new() }, Restore::Gradient)
            {
                return Ok(Err(v));
            }
        }
        Ok(Ok(own))
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
