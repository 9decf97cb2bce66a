//! A pipeline job that loses a stage worker and goes on (`launch --recovery replay`): the
//! launcher starts a replacement in the lost worker's place, the survivors keep their
//! state, and every rank joins the job again, where [`repair`] brings them all to one
//! step:
//!
//! 1. every rank says where it stands: its step, whether it is a replacement, and whether
//!    it holds the complete sum of the step it failed in;
//! 2. the step the job goes on from is the newest any survivor reached. A survivor one
//!    step behind applies the sum it holds (rolling forward): some survivor applied that
//!    step, so every ballot of its vote was cast and every rank had its sum, and the
//!    update is the one the others made;
//! 3. each replacement, restored from its stage's newest checkpoint, gets to that step:
//!    from a live replica of its stage when one exists (its state is sent whole), or else
//!    by replaying on the tensors its neighbours logged ([`crate::replay`]). A stage whose
//!    boundaries are both logged replays alone, shared with `helpers - 1` survivors that
//!    sum with it reproducibly; the stages of its [group](super::groups) (joined by
//!    unlogged boundaries) go back to their checkpoints and replay together. A log that
//!    cannot be read (missing, truncated, corrupt) joins the group across it too, and a
//!    group of every stage is a rollback of the whole job to the newest checkpoint that
//!    every stage has.
//!
//! Nobody outside the group rolls back, and the bits are those of the run that never
//! failed.

use std::ops::Range;
use std::time::Duration;

use comm::group::Group;
use comm::transport::Transport;

use super::groups::group_of;
use super::{Staged, fresh_stage, recv_state, send_state};
use crate::config::TrainConfig;
use crate::error::{ConfigError, TrainError};
use crate::job::Job;
use crate::prepared::Prepared;
use crate::replay::{Live, LoggedInputs, Replay, Task, replay};
use crate::schedule::Boundary;
use crate::step::{Engine, GradBuffer, TrainState};

/// The longest the other ranks wait for a replay (the coordinator's heartbeats, not this
/// bound, catch a replacement that dies or stops).
const REPLAY_BOUND: Duration = Duration::from_secs(24 * 3600);

/// What this rank brings to a repair.
pub(crate) struct Standing<'a> {
    /// Whether this process replaces a lost one.
    pub replacement: bool,
    /// The sum of the step this rank failed in, if it computed all of it.
    pub held: Option<&'a GradBuffer>,
    /// Ranks that share a replay.
    pub helpers: usize,
}

/// What a repair did.
pub(crate) struct Repaired {
    /// The step every rank is at.
    pub step: u64,
    /// For whoever reads the metrics.
    pub how: String,
}

/// The stages that replay together, and the checkpoint they start from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReplayPlan {
    stages: Range<usize>,
    from: u64,
}

/// Brings every rank of the job, joined again, to one step (see the module's
/// documentation). `engine` is this rank's stage's.
pub(crate) fn repair(
    job: &Job,
    pipe: &mut Staged,
    (config, prepared): (&TrainConfig, &Prepared),
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    me: Standing<'_>,
) -> Result<Repaired, TrainError> {
    let t = job.transport()?;
    let timeout = config.collective_timeout();
    let words = [state.step, u64::from(me.replacement), u64::from(me.held.is_some())];
    let all = comm::collective::all_gather_words(t, &words, timeout)?;
    let survivors: Vec<usize> = (0..all.len()).filter(|&r| all[r][1] == 0).collect();
    let target = survivors.iter().map(|&r| all[r][0]).max().ok_or_else(|| {
        ConfigError::Invalid("every worker of the job was lost: restart it from its checkpoints".into())
    })?;
    // What happened, the same words on every rank, naming workers as the launcher does
    // (by their rank at the start, which a job that went on without some keeps).
    let behind: Vec<usize> =
        survivors.iter().copied().filter(|&r| all[r][0] < target).map(|r| pipe.layout.slot(r)).collect();
    let mut how = Vec::new();
    if !behind.is_empty() {
        how.push(format!("workers {behind:?} rolled forward to step {target}"));
    }
    if !me.replacement && state.step < target {
        match me.held {
            Some(sum) if state.step + 1 == target => {
                state.apply(sum);
                pipe.end_step(target - 1);
            }
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "this rank is at step {} without the sum that would take it to step {target}",
                    state.step
                ))
                .into());
            }
        }
    }
    // Whatever this rank logged of the step it failed in is sent again.
    pipe.abandon_logs();
    let (layout, rank) = (pipe.layout.clone(), t.rank());
    let replacements: Vec<usize> = (0..all.len()).filter(|&r| all[r][1] == 1).collect();
    let stage_of = |r: usize| layout.place(r).1;
    // Each replacement whose stage has no survivor plans its group's replay.
    let mut mine = [0; 4];
    if me.replacement && !survivors.iter().any(|&r| stage_of(r) == stage_of(rank)) {
        let micro_batches = engine.sampler().micro_batches();
        let reproducible = engine.reduce_mode().is_reproducible();
        // A checkpoint newer than the job's step (left by an earlier run of a job that
        // resumed from an older step common to every stage) is not where a replay starts.
        let plan = plan(config, pipe, (state.step.min(target), target), micro_batches, reproducible)?;
        mine = [1, plan.stages.start as u64, plan.stages.end as u64, plan.from];
    }
    let mut plans: Vec<ReplayPlan> = comm::collective::all_gather_words(t, &mine, timeout)?
        .into_iter()
        .filter(|w| w[0] == 1)
        .map(|w| ReplayPlan { stages: w[1] as usize..w[2] as usize, from: w[3] })
        .collect();
    plans.sort_by_key(|p| (p.stages.start, p.stages.end, p.from));
    plans.dedup();
    let whole = plans.iter().any(|p| p.stages == (0..layout.stages))
        || plans.windows(2).any(|w| w[0].stages.end > w[1].stages.start);
    if whole {
        let q = replacements.iter().copied().find(|&q| plans.iter().any(|p| p.stages.contains(&stage_of(q))));
        let bound = replacements.iter().map(|&r| all[r][0]).min().unwrap_or(0).min(target);
        let back = roll_everything_back(t, pipe, (config, prepared), state, bound)?;
        how.push(format!(
            "rank {}'s stage cannot be replayed from its logs: every stage went back to step {back}",
            q.unwrap_or(0)
        ));
        return Ok(Repaired { step: back, how: how.join("; ") });
    }
    let in_plan = |r: usize| plans.iter().any(|p| p.stages.contains(&stage_of(r)));
    // Replacements with a live replica fetch their stage first (it is quick).
    for &q in replacements.iter().filter(|&&q| !in_plan(q)) {
        let source = survivors.iter().copied().filter(|&r| stage_of(r) == stage_of(q)).min();
        let source = source.expect("a stage outside every plan has a survivor");
        fetch(t, rank, (source, q), state)?;
        how.push(format!("rank {q} (stage {}) fetched its state from rank {source}", stage_of(q)));
    }
    let mut idle: Vec<usize> = survivors.iter().copied().filter(|&r| !in_plan(r)).collect();
    for plan in &plans {
        let ctx = (t, pipe as &Staged, config, prepared, timeout);
        let text = if plan.stages.len() == 1 {
            let stage = plan.stages.start;
            let lost: Vec<usize> = replacements.iter().copied().filter(|&q| stage_of(q) == stage).collect();
            let take = if engine.reduce_mode().is_reproducible() { me.helpers.saturating_sub(1) } else { 0 };
            let helpers: Vec<usize> = idle.drain(..take.min(idle.len())).collect();
            replay_stage(ctx, engine, state, (plan, target), (&lost, &helpers))?
        } else {
            replay_group(ctx, engine, state, (plan, target))?
        };
        how.push(text);
    }
    let rerouted: Vec<String> = (0..layout.world())
        .filter(|&r| layout.serves(r).len() > 1)
        .map(|r| {
            let (worker, serves) = (layout.slot(r), layout.serves(r));
            format!("worker {worker} (stage {}) computes the micro-batches of replicas {serves:?}", stage_of(r))
        })
        .collect();
    if !rerouted.is_empty() {
        how.push(format!("without a replacement, {}", rerouted.join(", ")));
    }
    // Everyone goes on together: a survivor that went on at once would wait for the
    // replay in its first receive, whose bound a long replay exceeds. (A replacement that
    // dies meanwhile is reported by the coordinator, which ends this wait.)
    comm::collective::barrier(t, timeout.max(REPLAY_BOUND))?;
    Ok(Repaired { step: target, how: how.join("; ") })
}

/// What the replays of a repair share.
type Context<'a, 'p> = (&'a dyn Transport, &'a Staged, &'a TrainConfig, &'p Prepared, Duration);

/// Sends the state of `source` to `to` (both job ranks), if this `rank` is either.
fn fetch(
    t: &dyn Transport,
    rank: usize,
    (source, to): (usize, usize),
    state: &mut TrainState,
) -> Result<(), TrainError> {
    if rank == source {
        send_state(t, to, state)?;
    } else if rank == to {
        // The source may still be replaying.
        recv_state(t, source, state, REPLAY_BOUND)?;
    }
    Ok(())
}

/// The replay of a lost stage alone (`plan` of one stage, to step `to`): its first
/// replacement in `lost` replays with the survivors `helpers`, each on a copy of the
/// stage's checkpoint, and the other replacements fetch from it.
fn replay_stage(
    (t, pipe, config, prepared, timeout): Context<'_, '_>,
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    (plan, to): (&ReplayPlan, u64),
    (lost, helpers): (&[usize], &[usize]),
) -> Result<String, TrainError> {
    let (stage, rank) = (plan.stages.start, t.rank());
    let q = lost[0];
    let mut ranks = vec![q];
    ranks.extend(helpers);
    if let Some(k) = ranks.iter().position(|&h| h == rank) {
        let task = Task { stages: pipe.layout.stages, stage, helper: k, helpers: ranks.len() };
        let group = Group::new(t, ranks.clone())?;
        let helpers = Some((&group as &dyn Transport, timeout));
        if rank == q {
            if state.step != plan.from {
                *state = stage_at(pipe, config, prepared, stage, plan.from)?.0;
            }
            replay_logged((config, pipe.layout.replicas), engine, state, task, to, (helpers, None))?;
        } else {
            // A survivor that helps replays a copy of the lost stage's checkpoint.
            let (mut copy, mut lost) = stage_at(pipe, config, prepared, stage, plan.from)?;
            replay_logged((config, pipe.layout.replicas), &mut lost, &mut copy, task, to, (helpers, None))?;
        }
    }
    for &other in &lost[1..] {
        fetch(t, rank, (q, other), state)?;
    }
    let mut text = format!("rank {q} (stage {stage}) replayed from step {} to step {to} on ranks {ranks:?}", plan.from);
    if lost.len() > 1 {
        text.push_str(&format!(", and ranks {:?} fetched it from rank {q}", &lost[1..]));
    }
    Ok(text)
}

/// The replay of a group of stages (`plan`, to step `to`) by every rank that holds one of
/// them: each goes back to its stage's checkpoint and replays its own pipeline's
/// micro-batches, exchanging the tensors inside the group live and reading the group's
/// edges from the logs; each stage's replicas sum together as in training.
fn replay_group(
    (t, pipe, config, prepared, timeout): Context<'_, '_>,
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    (plan, to): (&ReplayPlan, u64),
) -> Result<String, TrainError> {
    let layout = &pipe.layout;
    let (replica, stage) = layout.place(t.rank());
    let last = plan.stages.end - 1;
    let text = format!(
        "stages {} to {last} went back to step {} and replayed to step {to} together",
        plan.stages.start, plan.from
    );
    if !plan.stages.contains(&stage) {
        return Ok(text);
    }
    *state = stage_at(pipe, config, prepared, stage, plan.from)?.0;
    let task = Task { stages: layout.stages, stage, helper: replica, helpers: layout.replicas };
    let group = Group::new(t, layout.replicas_of(stage))?;
    let ranks = (0..layout.stages).map(|s| plan.stages.contains(&s).then(|| layout.rank(replica, s))).collect();
    let live = Live { transport: t, ranks, timeout: timeout.max(REPLAY_BOUND), bytes: Vec::new() };
    replay_logged((config, layout.replicas), engine, state, task, to, (Some((&group, timeout)), Some(live)))?;
    Ok(text)
}

/// Where a replay of the stage of this replacement (restored to step `bound`) starts,
/// and which stages replay with it, for the others at step `to`: its group, grown across
/// every edge whose logs cannot be read (see the module's documentation).
fn plan(
    config: &TrainConfig,
    pipe: &Staged,
    (bound, to): (u64, u64),
    micro_batches: usize,
    reproducible: bool,
) -> Result<ReplayPlan, TrainError> {
    let stages = pipe.layout.stages;
    let logged = config.log.as_ref().map(|l| l.boundaries.clone()).unwrap_or_default();
    let mut group = group_of(pipe.stage.index, stages, &logged);
    let everything = ReplayPlan { stages: 0..stages, from: 0 };
    loop {
        // The replicas of a group sum as in training; in a mode that is not reproducible
        // that is not the sum the logs came from.
        if group == (0..stages) || (group.len() > 1 && pipe.layout.replicas > 1 && !reproducible) {
            return Ok(everything);
        }
        let from = common_checkpoint(config, pipe, group.clone(), bound)?;
        let edges = [
            (group.start > 0).then_some((group.start, Boundary::Activation)),
            (group.end < stages).then_some((group.end - 1, Boundary::Gradient)),
        ];
        let mut grown = group.clone();
        for (stage, kind) in edges.into_iter().flatten() {
            let checked = logged_inputs(config, stage, pipe.layout.replicas)
                .and_then(|mut inputs| inputs.check(from..to, micro_batches, &[kind]));
            if let Err(e) = checked {
                tracing::error!("stages {} to {} cannot be replayed from their logs: {e}", group.start, group.end - 1);
                grown = match kind {
                    Boundary::Activation => group_of(stage - 1, stages, &logged).start..grown.end,
                    Boundary::Gradient => grown.start..group_of(stage + 1, stages, &logged).end,
                };
            }
        }
        if grown == group {
            return Ok(ReplayPlan { stages: group, from });
        }
        group = grown;
    }
}

/// The newest step, no newer than `bound`, at which every stage of `stages` has a
/// checkpoint (0, the initial state, if some has none).
fn common_checkpoint(config: &TrainConfig, pipe: &Staged, stages: Range<usize>, bound: u64) -> Result<u64, TrainError> {
    let Some(c) = &config.checkpoint else { return Ok(0) };
    let mut common = bound;
    for s in stages {
        let steps = ckpt::store::list(&pipe.root_of(&c.dir, s))?;
        common = common.min(steps.into_iter().map(|(step, _)| step).filter(|&step| step <= bound).max().unwrap_or(0));
    }
    Ok(common)
}

/// Takes every stage back to the newest checkpoint they all have, no newer than `bound`
/// (every replacement's step, and the job's); returns its step.
fn roll_everything_back(
    t: &dyn Transport,
    pipe: &Staged,
    (config, prepared): (&TrainConfig, &Prepared),
    state: &mut TrainState,
    bound: u64,
) -> Result<u64, TrainError> {
    let mine = common_checkpoint(config, pipe, pipe.stage.index..pipe.stage.index + 1, bound)?;
    let every = comm::collective::all_gather_u64(t, mine, config.collective_timeout())?;
    let back = every.into_iter().min().unwrap_or(0);
    *state = stage_at(pipe, config, prepared, pipe.stage.index, back)?.0;
    Ok(back)
}

/// Replays `state` (stage `task.stage`) to step `to` on `engine` as helper `task.helper`,
/// summing with the `helpers` and exchanging with the `live` stages, reading the group's
/// edges from the logs of the job's `replicas` pipelines.
fn replay_logged(
    (config, replicas): (&TrainConfig, usize),
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    task: Task,
    to: u64,
    (helpers, live): (Option<(&dyn Transport, Duration)>, Option<Live<'_>>),
) -> Result<(), TrainError> {
    let mut inputs = logged_inputs(config, task.stage, replicas)?;
    let mut get = |step, micro, tensor| inputs.get(step, micro, tensor);
    let mut runner = Replay { inputs: &mut get, helpers, live, reducer: Default::default() };
    replay(engine, state, task, to, &mut runner)
}

/// Stage `stage`'s inputs in the job's boundary logs.
fn logged_inputs(config: &TrainConfig, stage: usize, replicas: usize) -> Result<LoggedInputs, TrainError> {
    let log = config.log.as_ref().ok_or_else(|| ConfigError::Invalid("no boundary is logged".into()))?;
    Ok(LoggedInputs::new(&log.dir, stage, replicas))
}

/// An engine for stage `stage` and that stage's state at `step`, read from its
/// checkpoint (or its initial state, at step 0).
fn stage_at<'p>(
    pipe: &Staged,
    config: &TrainConfig,
    prepared: &'p Prepared,
    stage: usize,
    step: u64,
) -> Result<(TrainState, Engine<'p>), TrainError> {
    let (whole, engine) = prepared.start(config);
    let cut = engine.stage(pipe.layout.stages, stage)?;
    let mut state = fresh_stage(config, &cut, &whole);
    if step > 0 {
        let c =
            config.checkpoint.as_ref().ok_or_else(|| ConfigError::Invalid("the job keeps no checkpoints".into()))?;
        let dir = pipe.root_of(&c.dir, stage).join(ckpt::store::step_dir_name(step));
        crate::checkpointing::restore(&dir, config, &mut state)?;
    }
    Ok((state, engine.for_stage(cut)))
}
