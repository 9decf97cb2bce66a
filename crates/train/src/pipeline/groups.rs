//! Selective logging: which stage boundaries to log, and the groups of stages that the
//! unlogged ones join.
//!
//! A boundary that is not logged ties its two stages together: if either is lost, no log
//! holds what crossed it, so both go back to their checkpoints and compute again, with the
//! tensors between them exchanged live. The stages between two logged boundaries form a
//! *group* ([`groups`]); a lost stage costs its whole group's recomputation, and nobody
//! outside the group rolls back.
//!
//! Logging every boundary makes each group one stage (the fastest recovery, the most
//! bytes); logging none makes one group of every stage (a global rollback, no bytes). A
//! budget of bytes per step picks between ([`within_budget`]): starting from every
//! boundary logged, it merges the two adjacent groups whose merge costs the least
//! expected recovery time per byte saved, until the logs fit. A stage is as likely to be
//! lost as any other, and a group's recovery takes as long as its stages' work, so the
//! expected cost of a cut is `sum over groups g of (stages(g) / S) * work(g)`.

use std::ops::Range;

use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::model::stage::Profile;
use crate::state::NamedTensor;
use crate::step::Engine;

/// `config` with the boundaries that its budget (if it has one) allows, chosen for the
/// model of `engine` with the parameters `params`, and a note that says what was chosen.
pub(crate) fn apply_budget(
    config: &TrainConfig,
    engine: &Engine<'_>,
    params: &[NamedTensor],
) -> Result<Option<(TrainConfig, String)>, TrainError> {
    let Some(budget) = config.log.as_ref().and_then(|l| l.budget) else { return Ok(None) };
    let stages = config.pipeline.stages;
    let profiles = engine.profiles(params, stages)?;
    let logged = within_budget(&profiles, config.batch, budget);
    let bytes: u64 = logged.iter().map(|&b| boundary_bytes(&profiles, b, config.batch)).sum();
    let all: u64 = (0..stages - 1).map(|b| boundary_bytes(&profiles, b, config.batch)).sum();
    let groups: Vec<String> = groups(stages, &logged)
        .into_iter()
        .map(|g| if g.len() == 1 { g.start.to_string() } else { format!("{}-{}", g.start, g.end - 1) })
        .collect();
    let note = format!(
        "a budget of {budget} bytes a step logs boundaries {logged:?} ({bytes} of {all} bytes a step); \
         stages recover in groups {}",
        groups.join(", ")
    );
    let mut chosen = config.clone();
    let log = chosen.log.as_mut().expect("a budget is a log's");
    log.boundaries = logged;
    Ok(Some((chosen, note)))
}

/// The groups of a pipeline of `stages` stages whose boundaries `logged` are logged: the
/// runs of stages that no logged boundary separates, in order.
pub fn groups(stages: usize, logged: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for b in 0..stages.saturating_sub(1) {
        if logged.contains(&b) {
            out.push(start..b + 1);
            start = b + 1;
        }
    }
    out.push(start..stages);
    out
}

/// The group that holds `stage`.
pub fn group_of(stage: usize, stages: usize, logged: &[usize]) -> Range<usize> {
    groups(stages, logged).into_iter().find(|g| g.contains(&stage)).unwrap_or(0..stages)
}

/// Bytes that boundary `b` logs a step: its activations forward and its gradients back,
/// four bytes a value, for `batch` examples.
pub fn boundary_bytes(profiles: &[Profile], b: usize, batch: usize) -> u64 {
    2 * 4 * (profiles[b].output * batch) as u64
}

/// The boundaries to log so that a step logs at most `budget` bytes (see the module's
/// documentation), for stages profiled by `profiles` and steps of `batch` examples.
pub fn within_budget(profiles: &[Profile], batch: usize, budget: u64) -> Vec<usize> {
    let stages = profiles.len();
    let mut logged: Vec<usize> = (0..stages.saturating_sub(1)).collect();
    let bytes = |logged: &[usize]| logged.iter().map(|&b| boundary_bytes(profiles, b, batch)).sum::<u64>();
    while bytes(&logged) > budget {
        let before = expected_cost(profiles, &logged);
        // The cheapest merge per byte saved; the first such boundary on a tie.
        let best = logged
            .iter()
            .map(|&b| {
                let without: Vec<usize> = logged.iter().copied().filter(|&x| x != b).collect();
                let saved = boundary_bytes(profiles, b, batch).max(1) as f64;
                (b, (expected_cost(profiles, &without) - before) / saved)
            })
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .map(|(b, _)| b);
        match best {
            Some(b) => logged.retain(|&x| x != b),
            None => break,
        }
    }
    logged
}

/// The expected recovery cost of a stage lost at random when `logged` are logged.
pub fn expected_cost(profiles: &[Profile], logged: &[usize]) -> f64 {
    let stages = profiles.len() as f64;
    groups(profiles.len(), logged)
        .into_iter()
        .map(|g| {
            let work: f64 = profiles[g.clone()].iter().map(|p| p.work).sum();
            g.len() as f64 / stages * work
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(work: f64, output: usize) -> Profile {
        Profile { work, output }
    }

    #[test]
    fn logged_boundaries_cut_the_pipeline_into_groups() {
        assert_eq!(groups(4, &[0, 1, 2]), [0..1, 1..2, 2..3, 3..4]);
        assert_eq!(groups(4, &[1]), [0..2, 2..4]);
        assert_eq!(groups(4, &[]), vec![(0..4)]);
        assert_eq!(groups(1, &[]), vec![(0..1)]);
        assert_eq!(group_of(1, 4, &[1]), 0..2);
        assert_eq!(group_of(3, 4, &[0]), 1..4);
    }

    #[test]
    fn a_budget_merges_the_groups_whose_merge_costs_least_per_byte() {
        // Four equal stages; boundary 1 is the widest, boundary 2 the narrowest.
        let p = [profile(10.0, 4), profile(10.0, 8), profile(10.0, 1), profile(10.0, 0)];
        let per = |b| boundary_bytes(&p, b, 1);
        assert_eq!((per(0), per(1), per(2)), (32, 64, 8));
        assert_eq!(within_budget(&p, 1, u64::MAX), [0, 1, 2]);
        // Dropping boundary 1 saves the most per unit of cost.
        assert_eq!(within_budget(&p, 1, 40), [0, 2]);
        assert_eq!(within_budget(&p, 1, 8), [2]);
        assert_eq!(within_budget(&p, 1, 7), Vec::<usize>::new());
        assert_eq!(within_budget(&p, 1, 0), Vec::<usize>::new());
        // The same bytes, but stage 0 ten times the work: merging it costs more.
        let heavy = [profile(100.0, 8), profile(10.0, 8), profile(10.0, 8), profile(10.0, 0)];
        assert_eq!(within_budget(&heavy, 1, 128), [0, 2]);
        assert_eq!(within_budget(&heavy, 1, 64), [0]);
    }

    #[test]
    fn the_expected_cost_grows_as_groups_merge() {
        let p = [profile(1.0, 1), profile(2.0, 1), profile(3.0, 1)];
        assert_eq!(expected_cost(&p, &[0, 1]), (1.0 + 2.0 + 3.0) / 3.0);
        assert_eq!(expected_cost(&p, &[]), 6.0);
        assert_eq!(expected_cost(&p, &[1]), 2.0 / 3.0 * 3.0 + 1.0 / 3.0 * 3.0);
    }
}
