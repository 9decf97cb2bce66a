//! The step protocol under simulated failures: every schedule ends with all survivors
//! holding the state of a run that never failed (every step applied exactly once), or
//! all stopped with a reason when too few remain.

use std::time::{Duration, Instant};

use comm::protocol::{Checks, WorkerId};
use comm::sim::{self, Config, End, Fault, Report};

/// Checks the end of a run; returns whether the job finished.
fn check(c: &Config, r: &Report) -> bool {
    let context = || format!("seed {} faults {:?}\n{r:#?}", c.seed, c.faults);
    assert!(r.settled, "the run did not settle: {}", context());
    assert_eq!(r.rolled_back, 0, "a survivor went back to an older state: {}", context());
    for &(step, stage, fingerprint) in &r.checkpoints {
        let reference = sim::stage_reference(c.seed, stage, step);
        assert_eq!(fingerprint, reference, "checkpoint {step} of stage {stage} holds another state: {}", context());
    }
    let finished: Vec<&(WorkerId, End)> = r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).collect();
    for (id, e) in &r.workers {
        match e {
            End::Finished { step, fingerprint } => {
                let reference = sim::stage_reference(c.seed, comm::protocol::stage_of(*id, c.stages), c.steps);
                assert_eq!((*step, *fingerprint), (c.steps, reference), "{}", context());
            }
            End::Stopped(reason) => {
                assert!(!reason.is_empty(), "{}", context());
                if honest_end(reason) {
                    continue;
                }
                // Once the job has finished, a worker that missed it is told so. (A
                // divergence nobody can attribute ends the whole job.)
                assert!(
                    finished.is_empty() || reason.contains("finished without"),
                    "a stop beside finished workers: {reason}: {}",
                    context()
                );
            }
            End::Dead => {}
            End::Running(phase) => panic!("a worker still {phase:?}: {}", context()),
        }
    }
    !finished.is_empty()
}

#[test]
fn without_faults_every_world_size_ends_with_the_reference_state() {
    for workers in 1..=4 {
        let c = Config::new(u64::from(workers), workers, 20);
        let r = sim::run(&c);
        assert!(check(&c, &r));
        assert_eq!(r.applied, 20 * u64::from(workers));
        assert_eq!((r.fetched, r.rolled_forward, r.epochs), (0, 0, 1));
    }
}

#[test]
fn thousands_of_random_schedules_end_with_the_survivors_agreeing() {
    let started = Instant::now();
    let (mut finished, mut recovered, mut rolled, mut hashed) = (0, 0, 0, 0);
    let (mut checkpointed, mut repaired, mut diverged) = (0, 0, 0);
    let mut unfinished = Vec::new();
    // STEADFAST_SIM_SCHEDULES=1000000 for a soak run.
    let n: u64 = std::env::var("STEADFAST_SIM_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    for seed in 0..n {
        let c = Config::random(seed, 3, 12);
        let r = sim::run(&c);
        let ended_diverged = r.workers.iter().any(|(_, e)| matches!(e, End::Stopped(why) if honest_end(why)));
        if check(&c, &r) {
            finished += 1;
        } else if ended_diverged {
            diverged += 1;
        } else if r.workers.iter().any(|(_, e)| *e != End::Dead) {
            // With one worker allowed, a job ends unfinished only when nobody survives.
            unfinished.push((seed, c.faults.clone(), r.clone()));
        }
        recovered += u64::from(r.fetched + r.rolled_forward > 0);
        rolled += u64::from(r.rolled_forward > 0);
        hashed += u64::from(r.hashed > 0);
        checkpointed += u64::from(!r.checkpoints.is_empty());
        repaired += u64::from(r.repairs > 0 || (r.fetched > 0 && c.faults.iter().any(is_corruption)));
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    println!(
        "{n} schedules, {finished} finished, {recovered} recovered state, {rolled} rolled a worker forward, \
         {checkpointed} committed checkpoints, {repaired} repaired a corruption, {diverged} ended on one they could \
         not repair; {rate:.0} schedules/s"
    );
    assert!(unfinished.is_empty(), "survivors that did not finish: {:#?}", &unfinished[..1]);
    assert!(finished > n * 9 / 10, "{finished} of {n} finished");
    assert!(recovered > n / 10, "the schedules exercise recovery: {recovered}");
    assert!(rolled > 0, "some schedule leaves ranks one step apart");
    // (Half the jobs repair, and hash every update.)
    assert!(hashed > n / 4, "the workers ask for fingerprints of updates not hashed: {hashed}");
    assert!(checkpointed > n / 5, "the schedules commit checkpoints: {checkpointed}");
    assert!(repaired > n / 50, "the schedules repair corruption among the other faults: {repaired}");
    assert!(diverged < n / 100, "few end on a corruption they cannot repair: {diverged}");
}

/// The same random schedules on pipeline jobs: two pipelines of three stages, whose
/// stages synchronise apart (each from its own replicas), vote in groups and compare
/// each stage's replicas. A stage that loses every replica holding the newest step
/// cannot go on from a live replica: its job stops, saying so.
#[test]
fn random_schedules_of_pipeline_jobs_end_with_every_stage_s_reference_state() {
    let n: u64 = std::env::var("STEADFAST_SIM_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let (mut finished, mut recovered, mut checkpointed, mut went_back, mut replayed) = (0, 0, 0, 0, 0);
    let (mut together, mut helped) = (0, 0);
    for seed in 0..n {
        let mut c = Config::random(seed, 6, 12);
        c.stages = 3;
        // Half the jobs log their boundaries: a lost stage replays, the others keep theirs.
        // A third of those leave one boundary out (its stages replay together), and the
        // replays are shared by up to three workers.
        c.logged = seed % 2 == 0;
        if seed % 3 == 0 {
            c.unlogged = 1 << (seed / 6 % 2);
        }
        c.helpers = 1 + (seed / 2 % 3) as usize;
        let r = sim::run(&c);
        together += u64::from(r.replayed_together > 0);
        helped += u64::from(r.helped > 0);
        finished += u64::from(check(&c, &r));
        recovered += u64::from(r.fetched + r.rolled_forward > 0);
        checkpointed += u64::from(r.checkpoints.iter().any(|&(_, stage, _)| stage == 2));
        went_back += u64::from(r.loaded > 0);
        replayed += u64::from(r.replayed > 0);
        if !c.logged {
            assert_eq!(r.replayed, 0, "seed {seed}: a replay without logs");
        }
    }
    println!(
        "{n} pipeline schedules, {finished} finished, {recovered} recovered state, {checkpointed} checkpointed, \
         {replayed} replayed a lost stage ({together} with another, {helped} helped), {went_back} went back to a \
         checkpoint"
    );
    assert!(finished > n * 97 / 100, "{finished} of {n} finished");
    assert!(replayed > n / 100, "the logged schedules replay lost stages: {replayed}");
    assert!(together > 0 && helped > 0, "replays together ({together}) and shared ({helped})");
    assert!(went_back > n / 100, "the others go back: {went_back}");
    assert!(recovered > n / 10, "the schedules exercise recovery: {recovered}");
    assert!(checkpointed > n / 5, "every stage commits checkpoints: {checkpointed}");
}

#[test]
fn a_pipeline_stage_fetches_from_its_own_replica_and_the_others_keep_their_state() {
    let mut c = Config::new(7, 4, 16);
    c.stages = 2;
    // Worker 3 (stage 1 of the second pipeline) dies and is replaced.
    c.faults =
        vec![Fault::Kill { at: Duration::from_millis(60), worker: 3, replace_after: Some(Duration::from_millis(5)) }];
    let r = sim::run(&c);
    assert!(check(&c, &r), "{r:#?}");
    assert_eq!(r.fetched, 1, "only the replacement fetches: {r:#?}");
    let finished = r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).count();
    assert_eq!(finished, 4);
}

#[test]
fn a_pipeline_that_loses_every_replica_of_a_stage_goes_back_to_the_newest_common_checkpoint() {
    let mut c = Config::new(8, 4, 16);
    c.stages = 2;
    c.checkpoint_every = Some(3);
    // Both workers of stage 1 die; their replacements start from nothing.
    let at = Duration::from_millis(100);
    c.faults = [1, 3].map(|worker| Fault::Kill { at, worker, replace_after: Some(Duration::from_millis(5)) }).to_vec();
    let r = sim::run(&c);
    assert!(check(&c, &r), "{r:#?}");
    assert_eq!(r.loaded, 4, "every worker loads its stage's checkpoint: {r:#?}");
    assert_eq!(r.replayed, 0, "a job that logs nothing cannot replay: {r:#?}");
    // A job that logs its boundaries replays the lost stage alone: nobody loads.
    let mut logged = c.clone();
    logged.logged = true;
    let r = sim::run(&logged);
    assert!(check(&logged, &r), "{r:#?}");
    assert_eq!((r.replayed, r.loaded), (2, 0), "{r:#?}");
    let finished = r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).count();
    assert_eq!(finished, 4);
    // Without checkpoints, every stage goes back to its initial state (where the
    // replacements are already: the two survivors load).
    c.checkpoint_every = None;
    let r = sim::run(&c);
    assert!(check(&c, &r) && r.loaded == 2, "{r:#?}");
}

/// A stop that is the honest end of a job whose corruption cannot be repaired: two
/// replicas that disagree with no majority to tell which is right, or no replica left
/// whose state was not found changed.
fn honest_end(reason: &str) -> bool {
    reason.contains("diverged") || reason.contains("found changed since its commit")
}

fn is_corruption(f: &Fault) -> bool {
    matches!(f, Fault::Corrupt { .. } | Fault::CorruptUpdate { .. })
}

/// A job of `workers` in which one replica's state is corrupted, at rest or inside an
/// update, at a moment and on a worker drawn from `seed`; it repairs divergence and
/// compares the replicas after every update.
fn corrupted(seed: u64, workers: u32) -> Config {
    let mut c = Config::new(seed, workers, 12);
    let mut r = repro::rng::Stream::for_purpose(seed, "sim.corrupt", &[]);
    let span = (c.compute.as_micros() as u64 + 2_000) * c.steps;
    let (at, worker) = (Duration::from_micros(r.below(span)), r.below(u64::from(workers)) as WorkerId);
    c.faults.push(if r.below(2) == 0 { Fault::Corrupt { at, worker } } else { Fault::CorruptUpdate { at, worker } });
    c.checks = Checks { every: 1, repair: true };
    c.trace = std::env::var("STEADFAST_SIM_TRACE").is_ok_and(|v| v == seed.to_string());
    c
}

#[test]
fn random_corruptions_at_rest_and_in_updates_are_repaired_and_end_with_the_reference_state() {
    let (mut repaired, mut at_rest) = (0, 0);
    // STEADFAST_SIM_SCHEDULES=1000000 for a soak run.
    let n: u64 = std::env::var("STEADFAST_SIM_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    for seed in 0..n {
        let c = corrupted(seed, 2 + (seed % 4) as u32);
        let r = sim::run(&c);
        let pair_update = c.workers == 2 && matches!(c.faults[0], Fault::CorruptUpdate { .. });
        if pair_update {
            // Two replicas that disagree after an update: nobody can tell which is
            // right, and the job ends on the divergence rather than go on with either.
            let stopped = r.workers.iter().all(|(_, e)| matches!(e, End::Stopped(why) if why.contains("diverged")));
            assert!(stopped || check(&c, &r), "seed {seed}: {r:#?}");
            continue;
        }
        assert!(check(&c, &r), "seed {seed}: the job did not finish: {:?} {r:#?}", c.faults);
        repaired += u64::from(r.fetched > 0);
        at_rest += u64::from(matches!(c.faults[0], Fault::Corrupt { .. }));
    }
    println!("{n} schedules with a corruption each: {repaired} repaired by a fetch, {at_rest} at rest");
    assert!(repaired > n / 2, "the corrupted replicas fetched the state: {repaired}");
}

#[test]
fn a_corrupted_update_stops_a_job_that_does_not_repair_and_is_repaired_in_one_that_does() {
    let mut c = Config::new(5, 3, 12);
    c.faults.push(Fault::CorruptUpdate { at: Duration::from_millis(40), worker: 2 });
    c.checks.every = 1;
    let r = sim::run(&c);
    assert!(!check(&c, &r), "without repair the job cannot finish");
    let stopped = r.workers.iter().filter(|(_, e)| matches!(e, End::Stopped(why) if why.contains("diverged"))).count();
    assert_eq!(stopped, 3, "every member ends on the divergence: {r:#?}");
    c.checks.repair = true;
    let r = sim::run(&c);
    assert!(check(&c, &r), "with repair the job finishes with the reference state: {r:#?}");
    assert_eq!(r.fetched, 1, "the outvoted replica fetched the state once");
    // A state corrupted at rest is found by its own check before the next step.
    let mut c = Config::new(6, 3, 12);
    c.faults.push(Fault::Corrupt { at: Duration::from_millis(40), worker: 1 });
    c.checks.repair = true;
    let r = sim::run(&c);
    assert!(check(&c, &r), "{r:#?}");
    assert_eq!(r.fetched, 1);
}

#[test]
fn the_rollback_baseline_goes_back_to_its_copies_and_ends_with_the_same_state() {
    let (mut finished, mut restored) = (0, 0);
    for seed in 0..1000 {
        let mut c = Config::random(seed, 3, 12);
        c.copy_every = Some(4);
        let r = sim::run(&c);
        finished += u64::from(check(&c, &r));
        restored += r.restored;
    }
    assert!(finished > 900, "{finished} of 1000 finished");
    assert!(restored > 100, "the schedules go back to copies: {restored}");
    // Without faults, nothing is put back and every step is applied once.
    let mut c = Config::new(1, 3, 12);
    c.copy_every = Some(4);
    let r = sim::run(&c);
    assert!(check(&c, &r));
    assert_eq!((r.restored, r.applied), (0, 36));
}

#[test]
fn a_replaced_rank_0_fetches_the_state_and_the_job_ends_bitwise_equal() {
    let mut c = Config::new(7, 3, 30);
    c.faults.push(Fault::Kill {
        at: Duration::from_millis(100),
        worker: 0,
        replace_after: Some(Duration::from_millis(50)),
    });
    let r = sim::run(&c);
    assert!(check(&c, &r));
    assert!(r.fetched >= 1, "{r:#?}");
    assert_eq!(r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).count(), 3);
}

#[test]
fn a_crash_during_the_transfer_and_two_crashes_close_together_are_survived() {
    let mut c = Config::new(11, 3, 30);
    // Worker 1 dies; its replacement starts fetching, and the source it may pick dies
    // during the transfer; a third crash follows at once.
    c.faults.push(Fault::Kill {
        at: Duration::from_millis(100),
        worker: 1,
        replace_after: Some(Duration::from_millis(10)),
    });
    c.faults.push(Fault::Kill {
        at: Duration::from_millis(125),
        worker: 0,
        replace_after: Some(Duration::from_millis(10)),
    });
    c.faults.push(Fault::Kill {
        at: Duration::from_millis(126),
        worker: 2,
        replace_after: Some(Duration::from_millis(10)),
    });
    let r = sim::run(&c);
    assert!(check(&c, &r));
}

#[test]
fn a_restarted_coordinator_rebuilds_the_membership_from_reports() {
    let mut c = Config::new(5, 3, 30);
    c.faults.push(Fault::KillCoordinator { at: Duration::from_millis(80), restart_after: Duration::from_millis(100) });
    let r = sim::run(&c);
    assert!(check(&c, &r));
    assert!(r.epochs >= 2, "{r:#?}");
    assert_eq!(r.fetched, 0, "nobody lost state: {r:#?}");
}

#[test]
fn shrink_and_grow_keep_the_bits() {
    let mut shrink = Config::new(3, 3, 30);
    shrink.faults.push(Fault::Kill { at: Duration::from_millis(90), worker: 2, replace_after: None });
    let r = sim::run(&shrink);
    assert!(check(&shrink, &r));
    assert_eq!(r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).count(), 2);

    let mut grow = Config::new(4, 2, 30);
    grow.faults.push(Fault::Join { at: Duration::from_millis(90), worker: 2 });
    let r = sim::run(&grow);
    assert!(check(&grow, &r));
    assert_eq!(r.workers.iter().filter(|(_, e)| matches!(e, End::Finished { .. })).count(), 3);
    assert!(r.fetched >= 1);
}

#[test]
fn too_few_workers_stop_every_survivor_with_the_reason() {
    let mut c = Config::new(9, 3, 30);
    c.min_world = 3;
    c.faults.push(Fault::Kill { at: Duration::from_millis(90), worker: 1, replace_after: None });
    let r = sim::run(&c);
    assert!(!check(&c, &r));
    let stopped: Vec<&String> =
        r.workers.iter().filter_map(|(_, e)| if let End::Stopped(s) = e { Some(s) } else { None }).collect();
    assert_eq!(stopped.len(), 2, "{r:#?}");
    assert!(stopped.iter().all(|s| s.contains("too few workers")), "{stopped:?}");
}

#[test]
#[ignore = "prints one schedule's trace: STEADFAST_SIM_SEED=N cargo test -- --ignored --nocapture"]
fn trace_one_schedule() {
    let seed = std::env::var("STEADFAST_SIM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut c = Config::random(seed, 3, 12);
    c.trace = true;
    let r = sim::run(&c);
    println!("{:?}\n{r:#?}", c.faults);
}
