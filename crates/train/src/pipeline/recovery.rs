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
//!    by replaying its stage on the tensors its neighbours logged ([`crate::replay`]),
//!    shared with `helpers - 1` survivors, which sum with it reproducibly.
//!
//! Nobody else rolls back, and the bits are those of the run that never failed.

use std::time::Duration;

use comm::group::Group;

use super::{Staged, fresh_stage, recv_state, send_state};
use crate::config::TrainConfig;
use crate::error::{ConfigError, TrainError};
use crate::job::Job;
use crate::replay::{LoggedInputs, Replay, Task, replay};
use crate::step::{Engine, GradBuffer, TrainState};
use crate::trainer::Prepared;

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
    // What happened, the same words on every rank.
    let behind: Vec<usize> = survivors.iter().copied().filter(|&r| all[r][0] < target).collect();
    let mut how = Vec::new();
    if !behind.is_empty() {
        how.push(format!("ranks {behind:?} rolled forward to step {target}"));
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
    let (layout, rank) = (pipe.layout, t.rank());
    let replacements: Vec<usize> = (0..all.len()).filter(|&r| all[r][1] == 1).collect();
    // Each replacement that must replay checks its inputs first; if one cannot, every
    // stage goes back to the newest checkpoint they all have and computes again.
    let mut problem = 0;
    if me.replacement && !survivors.iter().any(|&r| layout.place(r).1 == layout.place(rank).1) {
        let micro_batches = engine.sampler().micro_batches();
        let stage = layout.place(rank).1;
        if let Err(e) = logged_inputs(config, stage, layout.stages)
            .and_then(|mut inputs| inputs.check(state.step..target, micro_batches, layout.stages))
        {
            tracing::error!("stage {stage} cannot be replayed: {e}");
            problem = 1;
        }
    }
    let problems = comm::collective::all_gather_words(t, &[problem], timeout)?;
    if let Some(q) = (0..problems.len()).find(|&r| problems[r][0] == 1) {
        // The newest checkpoint that every stage has, no newer than any replacement's.
        let bound = replacements.iter().map(|&r| all[r][0]).min().unwrap_or(0);
        let mine = match &config.checkpoint {
            Some(c) => ckpt::store::list(&pipe.root(&c.dir))?.into_iter().map(|(s, _)| s).filter(|&s| s <= bound).max(),
            None => None,
        };
        let every = comm::collective::all_gather_u64(t, mine.unwrap_or(0), timeout)?;
        let back = every.into_iter().min().unwrap_or(0);
        roll_back(pipe, (config, prepared), state, back)?;
        how.push(format!("rank {q}'s stage cannot be replayed from its logs: every stage went back to step {back}"));
        return Ok(Repaired { step: back, how: how.join("; ") });
    }
    let mut ready: Vec<usize> = survivors.clone();
    for q in replacements {
        let stage = layout.place(q).1;
        let source = ready.iter().copied().filter(|&r| layout.place(r).1 == stage).min();
        if let Some(source) = source {
            if rank == source {
                send_state(t, q, state)?;
            } else if rank == q {
                recv_state(t, source, state, timeout)?;
            }
            how.push(format!("rank {q} (stage {stage}) fetched its state from rank {source}"));
        } else {
            let mut helpers = vec![q];
            helpers.extend(survivors.iter().copied().take(me.helpers.saturating_sub(1)));
            if let Some(k) = helpers.iter().position(|&h| h == rank) {
                let task = Task { stages: layout.stages, stage, helper: k, helpers: helpers.len() };
                let from = all[q][0];
                let group = Group::new(t, helpers.clone())?;
                if rank == q {
                    replay_here(config, engine, state, task, (from, target), &group, timeout)?;
                } else {
                    // A survivor that helps replays a copy of the lost stage's checkpoint.
                    let (mut copy, mut lost) = stage_at(pipe, config, prepared, stage, from)?;
                    replay_here(config, &mut lost, &mut copy, task, (from, target), &group, timeout)?;
                }
            }
            how.push(format!(
                "rank {q} (stage {stage}) replayed from step {} to step {target} on ranks {helpers:?}",
                all[q][0]
            ));
        }
        ready.push(q);
    }
    // Everyone goes on together: a survivor that went on at once would wait for the
    // replay in its first receive, whose bound a long replay exceeds. (A replacement that
    // dies meanwhile is reported by the coordinator, which ends this wait.)
    comm::collective::barrier(t, timeout.max(REPLAY_BOUND))?;
    Ok(Repaired { step: target, how: how.join("; ") })
}

/// Replays `state` (stage `task.stage` at step `from`) to step `to` on `engine`, as helper
/// `task.helper` of the ranks of `group`, reading the logged inputs.
fn replay_here(
    config: &TrainConfig,
    engine: &mut Engine<'_>,
    state: &mut TrainState,
    task: Task,
    (from, to): (u64, u64),
    group: &Group<'_>,
    timeout: Duration,
) -> Result<(), TrainError> {
    if state.step != from {
        return Err(ConfigError::Invalid(format!("a helper's copy is at step {}, not {from}", state.step)).into());
    }
    let mut inputs = logged_inputs(config, task.stage, task.stages)?;
    let mut get = |step, micro, tensor| inputs.get(step, micro, tensor);
    let mut runner = Replay { inputs: &mut get, helpers: Some((group, timeout)), reducer: Default::default() };
    replay(engine, state, task, to, &mut runner)
}

/// Stage `stage`'s inputs in the job's boundary logs, if both its boundaries are logged.
fn logged_inputs(config: &TrainConfig, stage: usize, stages: usize) -> Result<LoggedInputs, TrainError> {
    let log = config.log.as_ref().ok_or_else(|| ConfigError::Invalid("no boundary is logged".into()))?;
    let boundaries = [stage.checked_sub(1), (stage + 1 < stages).then_some(stage)];
    if let Some(b) = boundaries.into_iter().flatten().find(|b| !log.boundaries.contains(b)) {
        return Err(ConfigError::Invalid(format!("boundary {b} is not logged")).into());
    }
    let replicas = config.dist.as_ref().and_then(|d| d.world()).unwrap_or(1) / stages;
    Ok(LoggedInputs::new(&log.dir, stage, replicas))
}

/// Takes this rank's stage back to its checkpoint of `step` (its initial state at 0).
fn roll_back(
    pipe: &Staged,
    (config, prepared): (&TrainConfig, &Prepared),
    state: &mut TrainState,
    step: u64,
) -> Result<(), TrainError> {
    *state = stage_at(pipe, config, prepared, pipe.stage.index, step)?.0;
    Ok(())
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
