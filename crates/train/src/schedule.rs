//! A step written as data: the list of operations ([`Op`]) one rank takes in one step.
//!
//! Every runner executes its step with the one [`driver`](crate::driver): a single process,
//! each rank of a static job (TCP or MPI), each worker of an elastic job, each simulated
//! replica of a campaign, and each run of the FPNA training experiment. What differs
//! between them is the schedule they are given and what they do at the actions that
//! leave the rank (the reduction, the vote, the replica check, a send or receive); the
//! order of the phases is written here once.
//!
//! Two families of schedule exist:
//!
//! - [`data_parallel`]: the rank holds the whole model and computes the micro-batches it
//!   owns (`i mod world == rank`), each as one [`Op::Compute`] (forward and backward
//!   together: with the whole model on the rank there is no boundary between them, and
//!   keeping every micro-batch's activations until a later action would only cost
//!   memory);
//! - [`gpipe`] and [`one_f_one_b`]: the rank holds one stage of a pipeline. Each
//!   micro-batch's [`Op::Forward`] and [`Op::Backward`] are separate, with the
//!   boundary tensors received from and sent to the neighbouring stages between them.
//!
//! Both end with the same tail: reduce the micro-batch gradients, vote, update, compare
//! replicas, checkpoint. Whether the last two are due at a step is the runner's
//! decision (every `k` steps, when the writer is idle).

/// What crosses a pipeline stage boundary for one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// The output of a stage's forward pass, the next stage's input.
    Activation,
    /// The gradient of the loss with respect to that output, from the next stage back.
    Gradient,
}

/// One operation of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The state at rest, before anything reads it: the hooks that strike stored state
    /// fire, and a runner that checks stored state checks it.
    Load,
    /// Forward and backward of micro-batch `micro` through the whole model; its gradient
    /// goes into the rank's buffer `slot`.
    Compute {
        /// The micro-batch (its index in the global batch).
        micro: usize,
        /// The rank's buffer that receives its gradient.
        slot: usize,
    },
    /// The forward pass of micro-batch `micro` through this rank's stage; its
    /// activations are kept in `slot` until its backward pass.
    Forward {
        /// The micro-batch.
        micro: usize,
        /// The rank's buffer of the micro-batch.
        slot: usize,
    },
    /// The backward pass of micro-batch `micro` through this rank's stage; the gradient
    /// goes into the rank's buffer `slot`.
    Backward {
        /// The micro-batch.
        micro: usize,
        /// The rank's buffer of the micro-batch.
        slot: usize,
    },
    /// Sends micro-batch `micro`'s boundary tensor to stage `peer`.
    Send {
        /// The micro-batch.
        micro: usize,
        /// Its buffer on this rank.
        slot: usize,
        /// Which tensor.
        tensor: Boundary,
        /// The stage it goes to.
        peer: usize,
    },
    /// Receives micro-batch `micro`'s boundary tensor from stage `peer`.
    Recv {
        /// The micro-batch.
        micro: usize,
        /// Its buffer on this rank.
        slot: usize,
        /// Which tensor.
        tensor: Boundary,
        /// The stage it comes from.
        peer: usize,
    },
    /// Sums the gradients of this rank's buffers, in slot order, with the other replicas'.
    Reduce,
    /// The replicas vote on the sum (the commit rule of [`comm::commit`]).
    Vote,
    /// The optimizer applies the sum; the step counts.
    Update,
    /// The replicas compare their states (when due).
    CheckReplicas,
    /// A checkpoint of the state after the update (when due).
    Checkpoint,
}

impl Op {
    /// The buffer the action reads or writes, if any.
    pub fn slot(&self) -> Option<usize> {
        match *self {
            Op::Compute { slot, .. }
            | Op::Forward { slot, .. }
            | Op::Backward { slot, .. }
            | Op::Send { slot, .. }
            | Op::Recv { slot, .. } => Some(slot),
            _ => None,
        }
    }
}

/// The actions every schedule ends with.
const TAIL: [Op; 5] = [Op::Reduce, Op::Vote, Op::Update, Op::CheckReplicas, Op::Checkpoint];

/// The buffers a schedule's actions use: one more than the largest slot.
pub fn slots(actions: &[Op]) -> usize {
    actions.iter().filter_map(Op::slot).max().map_or(0, |s| s + 1)
}

/// Where [`Op::Update`] is in `actions`: where a runner that votes outside the step
/// resumes it.
pub fn update_index(actions: &[Op]) -> Option<usize> {
    actions.iter().position(|a| *a == Op::Update)
}

/// The step of rank `rank` of a data-parallel job of `world` replicas, each holding the
/// whole model, over `micro_batches` micro-batches: the rank computes micro-batch `i`
/// when `i mod world == rank`, into its buffers in order.
///
/// ```
/// use train::schedule::{Op, data_parallel};
///
/// let s = data_parallel(5, 1, 2);
/// assert_eq!(s[1], Op::Compute { micro: 1, slot: 0 });
/// assert_eq!(s[2], Op::Compute { micro: 3, slot: 1 });
/// assert_eq!(s[3], Op::Reduce);
/// ```
pub fn data_parallel(micro_batches: usize, rank: usize, world: usize) -> Vec<Op> {
    let owned = (rank..micro_batches).step_by(world.max(1));
    std::iter::once(Op::Load)
        .chain(owned.enumerate().map(|(slot, micro)| Op::Compute { micro, slot }))
        .chain(TAIL)
        .collect()
}

/// The forward pass of micro-batch `m` on `stage` of `stages`, with its receive and send.
fn forward(stage: usize, stages: usize, m: usize) -> impl Iterator<Item = Op> {
    let recv = (stage > 0).then(|| Op::Recv { micro: m, slot: m, tensor: Boundary::Activation, peer: stage - 1 });
    let send =
        (stage + 1 < stages).then(|| Op::Send { micro: m, slot: m, tensor: Boundary::Activation, peer: stage + 1 });
    recv.into_iter().chain(std::iter::once(Op::Forward { micro: m, slot: m })).chain(send)
}

/// The backward pass of micro-batch `m` on `stage` of `stages`, with its receive and send.
fn backward(stage: usize, stages: usize, m: usize) -> impl Iterator<Item = Op> {
    let recv =
        (stage + 1 < stages).then(|| Op::Recv { micro: m, slot: m, tensor: Boundary::Gradient, peer: stage + 1 });
    let send = (stage > 0).then(|| Op::Send { micro: m, slot: m, tensor: Boundary::Gradient, peer: stage - 1 });
    recv.into_iter().chain(std::iter::once(Op::Backward { micro: m, slot: m })).chain(send)
}

/// GPipe's step on `stage` of `stages`: every micro-batch's forward pass, then every
/// backward pass in reverse order, then the tail. Each stage keeps all `micro_batches`
/// micro-batches' activations at once.
///
/// # Panics
/// If `stage` is not below `stages`.
pub fn gpipe(stages: usize, stage: usize, micro_batches: usize) -> Vec<Op> {
    assert!(stage < stages, "stage {stage} of {stages}");
    let forwards = (0..micro_batches).flat_map(|m| forward(stage, stages, m));
    let backwards = (0..micro_batches).rev().flat_map(|m| backward(stage, stages, m));
    std::iter::once(Op::Load).chain(forwards).chain(backwards).chain(TAIL).collect()
}

/// The one-forward-one-backward step on `stage` of `stages`: `stages - stage - 1`
/// forward passes to fill the pipeline, then one forward and one backward in turn, then
/// the remaining backward passes. A stage keeps at most `stages - stage` micro-batches'
/// activations at once.
///
/// # Panics
/// If `stage` is not below `stages`.
pub fn one_f_one_b(stages: usize, stage: usize, micro_batches: usize) -> Vec<Op> {
    assert!(stage < stages, "stage {stage} of {stages}");
    let warmup = (stages - stage - 1).min(micro_batches);
    let mut actions = vec![Op::Load];
    actions.extend((0..warmup).flat_map(|m| forward(stage, stages, m)));
    for k in 0..micro_batches - warmup {
        actions.extend(forward(stage, stages, warmup + k));
        actions.extend(backward(stage, stages, k));
    }
    actions.extend((micro_batches - warmup..micro_batches).flat_map(|m| backward(stage, stages, m)));
    actions.extend(TAIL);
    actions
}

/// The step of `stage` of replica `replica` of `replicas` data-parallel copies of a
/// pipeline: the replica takes micro-batch `i` when `i mod replicas == replica` (as a
/// data-parallel rank does), and its stages pass them through `schedule` in that order.
///
/// ```
/// use train::PipeSchedule;
/// use train::schedule::{Op, pipeline};
///
/// // Stage 0 of replica 1 of 2, 5 micro-batches: it takes 1 and 3, in buffers 0 and 1.
/// let s = pipeline(PipeSchedule::GPipe, 2, 0, 5, 1, 2);
/// assert_eq!(s[1], Op::Forward { micro: 1, slot: 0 });
/// assert_eq!(s[3], Op::Forward { micro: 3, slot: 1 });
/// ```
///
/// # Panics
/// If `stage` is not below `stages` or `replica` not below `replicas`.
pub fn pipeline(
    schedule: crate::PipeSchedule,
    stages: usize,
    stage: usize,
    micro_batches: usize,
    replica: usize,
    replicas: usize,
) -> Vec<Op> {
    assert!(replica < replicas, "replica {replica} of {replicas}");
    serving(schedule, stages, stage, micro_batches, (&[replica], replicas))
}

/// [`pipeline`] for a stage worker that computes the micro-batches of several replicas
/// (`serves`, of `replicas`): those of a lost worker of its stage, rerouted to it. It
/// takes micro-batch `i` when `i mod replicas` is one of `serves`, in increasing order,
/// each from and to the stages of its own replica.
///
/// # Panics
/// If a replica served is not below `replicas`.
pub fn serving(
    schedule: crate::PipeSchedule,
    stages: usize,
    stage: usize,
    micro_batches: usize,
    (serves, replicas): (&[usize], usize),
) -> Vec<Op> {
    assert!(serves.iter().all(|&d| d < replicas), "replicas {serves:?} of {replicas}");
    let owned: Vec<usize> = (0..micro_batches).filter(|i| serves.contains(&(i % replicas))).collect();
    let build = match schedule {
        crate::PipeSchedule::GPipe => gpipe,
        crate::PipeSchedule::OneFOneB => one_f_one_b,
    };
    let global = |k: usize| owned[k];
    build(stages, stage, owned.len())
        .into_iter()
        .map(|op| match op {
            Op::Forward { micro, slot } => Op::Forward { micro: global(micro), slot },
            Op::Backward { micro, slot } => Op::Backward { micro: global(micro), slot },
            Op::Send { micro, slot, tensor, peer } => Op::Send { micro: global(micro), slot, tensor, peer },
            Op::Recv { micro, slot, tensor, peer } => Op::Recv { micro: global(micro), slot, tensor, peer },
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Runs the stages' schedules against each other as a pipeline would, with unbounded
    /// queues between neighbours: fails if a stage waits for something nobody sends
    /// (a deadlock) or a tensor is left unreceived. Returns the order in which each
    /// stage ran its forward and backward passes.
    fn play(schedules: &[Vec<Op>]) -> Vec<Vec<Op>> {
        play_routed(schedules, &|_, peer, _| peer)
    }

    /// [`play`] where the ranks are not the stages: `route(rank, peer, micro)` is the rank
    /// that `rank` exchanges micro-batch `micro` with when its schedule names stage `peer`.
    fn play_routed(schedules: &[Vec<Op>], route: &dyn Fn(usize, usize, usize) -> usize) -> Vec<Vec<Op>> {
        let n = schedules.len();
        let mut queues: Vec<VecDeque<(usize, Boundary)>> = vec![VecDeque::new(); n * n];
        let mut next = vec![0usize; n];
        let mut ran = vec![Vec::new(); n];
        loop {
            let mut moved = false;
            for s in 0..n {
                while let Some(&a) = schedules[s].get(next[s]) {
                    match a {
                        Op::Send { micro, tensor, peer, .. } => {
                            queues[s * n + route(s, peer, micro)].push_back((micro, tensor))
                        }
                        Op::Recv { micro, tensor, peer, .. } => {
                            let q = &mut queues[route(s, peer, micro) * n + s];
                            match q.front() {
                                Some(&front) => {
                                    assert_eq!(front, (micro, tensor), "rank {s} receives out of order");
                                    q.pop_front();
                                }
                                None => break,
                            }
                        }
                        Op::Forward { .. } | Op::Backward { .. } => ran[s].push(a),
                        _ => {}
                    }
                    next[s] += 1;
                    moved = true;
                }
            }
            if next.iter().zip(schedules).all(|(i, s)| *i == s.len()) {
                assert!(queues.iter().all(VecDeque::is_empty), "a tensor was sent and never received");
                return ran;
            }
            assert!(moved, "the pipeline deadlocks at {next:?}");
        }
    }

    #[test]
    fn a_stage_that_serves_a_lost_replica_too_runs_gpipe_without_deadlock() {
        // Two replicas of two stages; replica 0's stage 1 is lost, and rank 2 (replica 1's
        // stage 1) computes both replicas' micro-batches there.
        for m in 1..=7 {
            let schedules = [
                pipeline(crate::PipeSchedule::GPipe, 2, 0, m, 0, 2),
                pipeline(crate::PipeSchedule::GPipe, 2, 0, m, 1, 2),
                serving(crate::PipeSchedule::GPipe, 2, 1, m, (&[0, 1], 2)),
            ];
            let route =
                |rank: usize, peer: usize, micro: usize| if peer == 1 { 2 } else { (rank == 2) as usize * (micro % 2) };
            let ran = play_routed(&schedules, &route);
            let forwards = |r: usize| ran[r].iter().filter(|a| matches!(a, Op::Forward { .. })).count();
            assert_eq!((forwards(0) + forwards(1), forwards(2)), (m, m), "{m} micro-batches");
        }
    }

    #[test]
    fn a_data_parallel_step_covers_every_micro_batch_once_across_ranks() {
        for (m, world) in [(1, 1), (4, 1), (4, 2), (5, 2), (8, 3), (2, 4)] {
            let mut seen = vec![0; m];
            for rank in 0..world {
                let s = data_parallel(m, rank, world);
                assert_eq!(s[0], Op::Load);
                assert_eq!(s[s.len() - 5..], TAIL);
                for (k, a) in s.iter().filter(|a| matches!(a, Op::Compute { .. })).enumerate() {
                    let Op::Compute { micro, slot } = *a else { unreachable!() };
                    assert_eq!((micro % world, slot), (rank, k));
                    seen[micro] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{m} micro-batches on {world} ranks: {seen:?}");
        }
    }

    #[test]
    fn pipeline_schedules_run_without_deadlock_and_each_pass_once() {
        for stages in 1..=4 {
            for m in 1..=6 {
                for build in [gpipe, one_f_one_b] {
                    let schedules: Vec<_> = (0..stages).map(|s| build(stages, s, m)).collect();
                    for (s, ran) in play(&schedules).into_iter().enumerate() {
                        for micro in 0..m {
                            let f = ran.iter().position(|a| *a == Op::Forward { micro, slot: micro });
                            let b = ran.iter().position(|a| *a == Op::Backward { micro, slot: micro });
                            assert!(f.unwrap() < b.unwrap(), "stage {s}: micro-batch {micro}'s backward first");
                        }
                        assert_eq!(ran.len(), 2 * m);
                    }
                    for s in &schedules {
                        assert_eq!(s[s.len() - 5..], TAIL);
                        assert_eq!(slots(s), m);
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_keeps_fewer_activations_than_gpipe() {
        // The most micro-batches whose forward ran and backward has not yet, per stage.
        let live = |s: &[Op]| {
            let (mut now, mut most) = (0i32, 0i32);
            for a in s {
                match a {
                    Op::Forward { .. } => now += 1,
                    Op::Backward { .. } => now -= 1,
                    _ => {}
                }
                most = most.max(now);
            }
            most
        };
        for stage in 0..4 {
            assert_eq!(live(&gpipe(4, stage, 8)), 8);
            assert_eq!(live(&one_f_one_b(4, stage, 8)), 4 - stage as i32);
        }
    }

    #[test]
    fn the_update_follows_the_vote() {
        for s in [data_parallel(4, 0, 2), gpipe(2, 1, 3), one_f_one_b(3, 0, 5)] {
            let vote = s.iter().position(|a| *a == Op::Vote).unwrap();
            assert_eq!(update_index(&s), Some(vote + 1));
        }
    }
}
