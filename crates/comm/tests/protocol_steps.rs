//! Each transition of the step protocol's two machines, driven by hand.

use std::time::{Duration, Instant};

use comm::protocol::coordinator::JobState;
use comm::protocol::{
    Action, Checks, Coordinator, Event, Msg, Node, Quorum, ReplayFailure, ReplayGroup, Saved, StageReplay, StageState,
    Status, Timing, Worker, WorkerState,
};

fn timing() -> Timing {
    Timing {
        heartbeat: Duration::from_millis(10),
        lost_after: Duration::from_millis(100),
        vote_timeout: Duration::from_millis(50),
        settle: Duration::from_millis(200),
        sync_timeout: Duration::from_millis(500),
        quorum_timeout: Duration::from_millis(1000),
    }
}

struct Clock(Instant);

impl Clock {
    fn at(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms)
    }
}

/// The worker's events, by name: each is one call of [`Worker::step`].
trait Events {
    fn on_message(&mut self, now: Instant, from: Node, msg: Msg) -> Vec<Action>;
    fn on_reduced(&mut self, now: Instant, epoch: u64, step: u64, sum: Option<(bool, u64)>) -> Vec<Action>;
    fn on_applied(&mut self, now: Instant, step: u64, fingerprint: Option<u64>) -> Vec<Action>;
    fn on_fetched(&mut self, now: Instant, epoch: u64, state: Option<(u64, u64)>) -> Vec<Action>;
    fn on_hashed(&mut self, now: Instant, fingerprint: u64) -> Vec<Action>;
    fn on_peer_lost(&mut self, now: Instant, peer: u32) -> Vec<Action>;
    fn tick(&mut self, now: Instant) -> Vec<Action>;
    fn keep_copy(&mut self, step: u64, fingerprint: u64);
}

impl Events for Worker {
    fn on_message(&mut self, now: Instant, from: Node, msg: Msg) -> Vec<Action> {
        self.step(now, Event::Message { from, msg })
    }
    fn on_reduced(&mut self, now: Instant, epoch: u64, step: u64, sum: Option<(bool, u64)>) -> Vec<Action> {
        self.step(now, Event::Computed { epoch, step, sum, saved: Saved::default() })
    }
    fn on_applied(&mut self, now: Instant, step: u64, fingerprint: Option<u64>) -> Vec<Action> {
        self.step(now, Event::Applied { step, fingerprint })
    }
    fn on_fetched(&mut self, now: Instant, epoch: u64, state: Option<(u64, u64)>) -> Vec<Action> {
        self.step(now, Event::Fetched { epoch, state })
    }
    fn on_hashed(&mut self, now: Instant, fingerprint: u64) -> Vec<Action> {
        self.step(now, Event::Hashed { fingerprint })
    }
    fn on_peer_lost(&mut self, now: Instant, peer: u32) -> Vec<Action> {
        self.step(now, Event::PeerLost(peer))
    }
    fn tick(&mut self, now: Instant) -> Vec<Action> {
        self.step(now, Event::Tick)
    }
    fn keep_copy(&mut self, step: u64, fingerprint: u64) {
        assert!(self.step(Instant::now(), Event::Copied { step, fingerprint }).is_empty());
    }
}

/// A ballot with no checkpoint part.
fn ballot(epoch: u64, step: u64, ok: bool, digest: u64) -> Msg {
    Msg::Ballot { epoch, step, ok, digest, saved: Saved::default() }
}

/// The update of `step` after a vote with no checkpoints, compared when `compare`.
fn apply(step: u64, compare: bool) -> Action {
    Action::Apply { step, verify: None, hash: false, compare, agreed: Some(Saved::default()) }
}

/// The step of a member ranked `rank` of `members` in epoch 1, with no check at rest.
fn compute(step: u64, rank: usize, members: &[u32]) -> Action {
    Action::Compute { epoch: 1, step, rank, members: members.to_vec(), verify: None }
}

/// The messages sent, a vote as a ballot to each member it names.
fn sent(actions: &[Action]) -> Vec<(Node, Msg)> {
    let mut out = Vec::new();
    for a in actions {
        match a {
            Action::Send { to, msg } => out.push((*to, msg.clone())),
            Action::Vote { epoch, step, ok, digest, saved, to } => out.extend(to.iter().map(|&m| {
                (Node::Worker(m), Msg::Ballot { epoch: *epoch, step: *step, ok: *ok, digest: *digest, saved: *saved })
            })),
            _ => {}
        }
    }
    out
}

fn others(actions: &[Action]) -> Vec<Action> {
    actions.iter().filter(|a| !matches!(a, Action::Send { .. } | Action::Vote { .. })).cloned().collect()
}

fn quorum(epoch: u64, members: &[u32], step: u64, fingerprint: u64, commit: Option<u64>) -> Quorum {
    Quorum::of_replicas((epoch, members.to_vec()), (step, fingerprint, commit), vec![members[0]])
}

/// Worker 1 of {0, 1}, synced in epoch 1 at step 0 with fingerprint 100, of a 2-step job.
fn synced_worker(c: &Clock) -> Worker {
    let (mut w, first) = Worker::new((1, 0), 2, (0, 100), (timing(), Checks::default()), c.at(0));
    assert_eq!(sent(&first)[0].0, Node::Coordinator);
    let a = w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(1, &[0, 1], 0, 100, None)));
    assert!(others(&a).is_empty(), "{a:?}");
    assert_eq!(w.status().phase, WorkerState::Synced);
    w
}

/// Runs the worker of [`synced_worker`] into step 0's vote, holding sum 7.
fn voting_worker(c: &Clock) -> Worker {
    let mut w = synced_worker(c);
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    assert_eq!(others(&a), vec![compute(0, 1, &[0, 1])]);
    let a = w.on_reduced(c.at(3), 1, 0, Some((true, 7)));
    assert_eq!(sent(&a), vec![(Node::Worker(0), ballot(1, 0, true, 7))], "the ballot goes to the other member");
    assert_eq!(a.iter().filter(|a| matches!(a, Action::Vote { .. })).count(), 1, "one vote action: {a:?}");
    assert_eq!(w.status().unapplied, Some(7));
    w
}

#[test]
fn worker_a_quorum_at_its_own_state_syncs_it_at_once_and_a_stale_one_is_ignored() {
    let c = Clock(Instant::now());
    let mut w = synced_worker(&c);
    let a = w.on_message(c.at(5), Node::Coordinator, Msg::Quorum(quorum(1, &[1], 0, 999, None)));
    assert!(a.is_empty(), "an epoch already seen changes nothing: {a:?}");
    let a = w.on_message(c.at(6), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 2], 0, 100, None)));
    assert_eq!((w.status().phase, w.status().epoch), (WorkerState::Idle, 2), "left out of epoch 2: {a:?}");
    assert!(w.quorum().is_none());
}

#[test]
fn worker_one_step_behind_with_the_committed_sum_rolls_forward() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    // The vote times out: the worker leaves the epoch, keeping the sum.
    let a = w.tick(c.at(60));
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, Some(7)), "{a:?}");
    let a = w.on_message(c.at(61), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 555, Some(7))));
    let roll = Action::Apply { step: 0, verify: None, hash: false, compare: false, agreed: None };
    assert_eq!(others(&a), vec![roll], "no vote, so nothing agreed of the checkpoints");
    assert_eq!(w.status().phase, WorkerState::Syncing);
    w.on_applied(c.at(62), 0, Some(555));
    assert_eq!((w.status().phase, w.status().step, w.status().last_commit), (WorkerState::Synced, 1, Some(7)));
}

#[test]
fn worker_with_another_sum_or_state_fetches_and_a_bad_fetch_leaves_the_epoch() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    w.tick(c.at(60));
    let a = w.on_message(c.at(61), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 555, Some(8))));
    assert_eq!(others(&a), vec![Action::Fetch { epoch: 2, step: 1, fingerprint: 555, sources: vec![0] }]);
    assert_eq!(w.status().unapplied, None, "a sum nobody committed is dropped");
    w.on_fetched(c.at(70), 2, Some((1, 556)));
    assert_eq!(w.status().phase, WorkerState::Idle, "a state with the wrong fingerprint is refused");
    assert_eq!((w.status().step, w.status().fingerprint), (1, 556), "and reported as what it is");
    let a = w.on_message(c.at(71), Node::Coordinator, Msg::Quorum(quorum(3, &[0, 1], 1, 555, Some(8))));
    assert!(matches!(others(&a)[..], [Action::Fetch { .. }]));
    w.on_fetched(c.at(80), 3, Some((1, 555)));
    let s = w.status();
    assert_eq!((s.phase, s.step, s.fingerprint, s.last_commit), (WorkerState::Synced, 1, 555, Some(8)));
}

#[test]
fn worker_whose_state_is_corrupted_leaves_the_epoch_and_reports_it_as_it_is() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    let a = w.step(c.at(4), Event::Changed { fingerprint: 999 });
    assert!(others(&a).is_empty(), "{a:?}");
    let s = w.status();
    assert_eq!((s.phase, s.step, s.fingerprint, s.unapplied, s.last_commit), (WorkerState::Idle, 0, 999, None, None));
    assert!(s.suspect);
    assert!(matches!(&sent(&a)[..], [(Node::Coordinator, Msg::Report(_))]));
    // The next quorum, whose majority holds the state at step 0 with fingerprint 100,
    // makes it fetch rather than start.
    let a = w.on_message(c.at(5), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 0, 100, None)));
    assert!(matches!(others(&a)[..], [Action::Fetch { step: 0, fingerprint: 100, .. }]), "{a:?}");
}

/// Worker 1 of {0, 1, 2} in a job of 4 steps with `checks`, in epoch 1 at step 0 with
/// fingerprint 100, once the vote on step 0 (sum 7) is unanimous: returns it and the
/// update it was asked for.
fn voted_in_three(c: &Clock, checks: Checks) -> (Worker, Action) {
    let (mut w, _) = Worker::new((1, 0), 4, (0, 100), (timing(), checks), c.at(0));
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(1, &[0, 1, 2], 0, 100, None)));
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    let verify = checks.repair.then_some(100);
    assert_eq!(others(&a), vec![Action::Compute { epoch: 1, step: 0, rank: 1, members: vec![0, 1, 2], verify }]);
    let saved = Saved { durable: 3, locked: false, written: 3, print: 103 };
    w.step(c.at(3), Event::Computed { epoch: 1, step: 0, sum: Some((true, 7)), saved });
    w.on_message(c.at(4), Node::Worker(2), Msg::Ballot { epoch: 1, step: 0, ok: true, digest: 7, saved });
    let first = Saved { durable: 2, locked: true, written: 3, print: 103 };
    let a =
        w.on_message(c.at(4), Node::Worker(0), Msg::Ballot { epoch: 1, step: 0, ok: true, digest: 7, saved: first });
    let [update] = &others(&a)[..] else { panic!("{a:?}") };
    (w, update.clone())
}

/// The worker of [`voted_in_three`], with checks every update, once the shell compared
/// the replicas after the update and gathered `prints` (fingerprint 101 its own).
fn checked_worker(c: &Clock, repair: bool, prints: Option<Vec<u64>>) -> (Worker, Vec<Action>) {
    let (mut w, update) = voted_in_three(c, Checks { every: 1, repair });
    assert!(matches!(update, Action::Apply { step: 0, compare: true, .. }), "{update:?}");
    let a = w.step(c.at(5), Event::Compared { step: 0, fingerprint: 101, prints });
    (w, a)
}

#[test]
fn the_vote_decides_the_checks_of_the_update_and_what_the_checkpoints_agree_on() {
    let c = Clock(Instant::now());
    // The committer holds the root's lock; the parts are durable through step 2 on every
    // member (the least of 2, 3 and 3).
    let agreed = Some(Saved { durable: 2, locked: true, ..Saved::default() });
    let (_, update) = voted_in_three(&c, Checks::default());
    assert_eq!(update, Action::Apply { step: 0, verify: None, hash: false, compare: false, agreed });
    // Compared every other update, and after the last; under repair, hashed after each.
    let (_, update) = voted_in_three(&c, Checks { every: 2, repair: true });
    assert_eq!(update, Action::Apply { step: 0, verify: Some(100), hash: true, compare: false, agreed });
    let (_, update) = voted_in_three(&c, Checks { every: 1, repair: false });
    assert_eq!(update, Action::Apply { step: 0, verify: None, hash: false, compare: true, agreed });
    assert!(Checks::default().compare_after(4, 4) && !Checks::default().compare_after(3, 4));
}

#[test]
fn a_repairing_worker_checks_its_state_just_before_the_update() {
    let c = Clock(Instant::now());
    let checks = Checks { every: 0, repair: true };
    let (mut w, _) = Worker::new((1, 0), 4, (0, 100), (timing(), checks), c.at(0));
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(1, &[0, 1], 0, 100, None)));
    w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    w.on_reduced(c.at(3), 1, 0, Some((true, 7)));
    let a = w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    let agreed = Some(Saved::default());
    assert_eq!(others(&a), vec![Action::Apply { step: 0, verify: Some(100), hash: true, compare: false, agreed }]);
    // The state changed before the update: the worker names itself.
    let a = w.step(c.at(5), Event::Changed { fingerprint: 666 });
    assert!(others(&a).is_empty() && w.status().suspect && w.status().phase == WorkerState::Idle, "{a:?}");
}

#[test]
fn a_roll_forward_that_lands_on_a_check_step_is_checked_against_the_quorum_not_the_old_mesh() {
    let c = Clock(Instant::now());
    // Every update is compared; worker 1 computed step 0 and voted, but its epoch ended
    // before the ballots arrived.
    let (mut w, _) = Worker::new((1, 0), 4, (0, 100), (timing(), Checks { every: 1, repair: true }), c.at(0));
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(1, &[0, 1, 2], 0, 100, None)));
    w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    w.on_reduced(c.at(3), 1, 0, Some((true, 7)));
    w.on_message(c.at(4), Node::Coordinator, Msg::Reconfigure { epoch: 1 });
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, Some(7)));
    // The others applied step 0 (a check step) and compared; epoch 2 rolls this one
    // forward. Its update is not compared over any mesh (the epoch it computed in is
    // gone, and the new one has not stepped): the quorum's fingerprint checks it.
    let a = w.on_message(c.at(5), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 555, Some(7))));
    let roll = Action::Apply { step: 0, verify: Some(100), hash: true, compare: false, agreed: None };
    assert_eq!(others(&a), vec![roll], "verified before (an epoch of two), hashed after, never compared");
    let a = w.on_applied(c.at(6), 0, Some(555));
    assert_eq!((w.status().phase, w.status().step), (WorkerState::Synced, 1), "{a:?}");
    // Rolled forward to another state than the quorum's: it fetches theirs.
    let (mut w, _) = Worker::new((1, 0), 4, (0, 100), (timing(), Checks { every: 1, repair: true }), c.at(0));
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(1, &[0, 1, 2], 0, 100, None)));
    w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    w.on_reduced(c.at(3), 1, 0, Some((true, 7)));
    w.on_message(c.at(4), Node::Coordinator, Msg::Reconfigure { epoch: 1 });
    w.on_message(c.at(5), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1, 2], 1, 555, Some(7))));
    let a = w.on_applied(c.at(6), 0, Some(556));
    assert!(matches!(others(&a)[..], [Action::Fetch { step: 1, fingerprint: 555, .. }]), "{a:?}");
}

#[test]
fn worker_whose_replicas_agree_after_an_update_steps_on() {
    let c = Clock(Instant::now());
    let (w, a) = checked_worker(&c, false, Some(vec![101, 101, 101]));
    assert_eq!(others(&a), vec![Action::Compute { epoch: 1, step: 1, rank: 1, members: vec![0, 1, 2], verify: None }]);
    let s = w.status();
    assert_eq!((s.phase, s.step, s.fingerprint, s.last_commit), (WorkerState::Stepping, 1, 101, Some(7)));
}

#[test]
fn worker_whose_check_fails_leaves_the_epoch_with_the_step_counted_and_blames_nobody() {
    let c = Clock(Instant::now());
    let (w, a) = checked_worker(&c, true, None);
    assert!(others(&a).is_empty(), "no next step, no repair: {a:?}");
    let s = w.status();
    assert_eq!((s.phase, s.step, s.last_commit, s.suspect), (WorkerState::Idle, 1, Some(7), false));
    assert!(matches!(&sent(&a)[..], [(Node::Coordinator, Msg::Report(_))]));
}

#[test]
fn worker_outvoted_by_a_strict_majority_reports_its_state_as_it_is_when_the_job_repairs() {
    let c = Clock(Instant::now());
    let (w, a) = checked_worker(&c, true, Some(vec![202, 101, 202]));
    assert_eq!(others(&a), vec![Action::Repair { step: 1, outvoted: vec![1] }]);
    let s = w.status();
    assert_eq!((s.phase, s.step, s.fingerprint, s.last_commit, s.suspect), (WorkerState::Idle, 1, 101, None, true));
    // A member of the majority leaves the epoch too, keeping its commit.
    let (w, a) = checked_worker(&c, true, Some(vec![202, 101, 101]));
    assert_eq!(others(&a), vec![Action::Repair { step: 1, outvoted: vec![0] }]);
    assert_eq!((w.status().phase, w.status().last_commit), (WorkerState::Idle, Some(7)));
}

#[test]
fn worker_ends_the_job_on_a_divergence_it_does_not_repair_or_cannot_attribute() {
    let c = Clock(Instant::now());
    let (_, a) = checked_worker(&c, false, Some(vec![202, 101, 101]));
    assert_eq!(others(&a), vec![Action::Diverged { step: 1, outvoted: vec![0] }], "the job does not repair");
    let (_, a) = checked_worker(&c, true, Some(vec![202, 101, 303]));
    assert_eq!(others(&a), vec![Action::Diverged { step: 1, outvoted: vec![0, 1, 2] }], "no strict majority");
}

/// Worker 1 of a pipeline of two stages on workers 0 to 3 (stage `id mod 2`), synced in
/// epoch 1 at step 0 and computing it: its stage's sum is 7.
fn pipeline_worker(c: &Clock, checks: Checks) -> Worker {
    let (mut w, _) = Worker::new((1, 0), 2, (0, 200), (timing(), checks), c.at(0));
    let state = |fingerprint, sources| StageState { fingerprint: Some(fingerprint), sources, ..StageState::unknown() };
    let q =
        Quorum { epoch: 1, members: vec![0, 1, 2, 3], step: 0, stages: vec![state(100, vec![0]), state(200, vec![1])] };
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(q));
    assert_eq!(w.status().phase, WorkerState::Synced, "its own stage's state");
    w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    w.on_reduced(c.at(3), 1, 0, Some((true, 7)));
    w
}

#[test]
fn a_pipeline_s_vote_commits_when_each_stage_s_members_agree_among_themselves() {
    let c = Clock(Instant::now());
    let mut w = pipeline_worker(&c, Checks::default());
    // Stage 0's members hold sum 5, stage 1's sum 7: each stage agrees.
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 5));
    w.on_message(c.at(4), Node::Worker(2), ballot(1, 0, true, 5));
    let a = w.on_message(c.at(4), Node::Worker(3), ballot(1, 0, true, 7));
    assert_eq!(others(&a), vec![apply(0, false)]);
    // Its stage's replica holds another sum: the vote fails.
    let mut w = pipeline_worker(&c, Checks::default());
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 5));
    w.on_message(c.at(4), Node::Worker(2), ballot(1, 0, true, 5));
    w.on_message(c.at(4), Node::Worker(3), ballot(1, 0, true, 8));
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, None));
}

#[test]
fn a_pipeline_s_replica_check_compares_each_stage_s_replicas_with_each_other() {
    let c = Clock(Instant::now());
    let checks = Checks { every: 1, repair: false };
    let compared = |prints: Vec<u64>| {
        let mut w = pipeline_worker(&c, checks);
        for (peer, digest) in [(0, 5), (2, 5), (3, 7)] {
            w.on_message(c.at(4), Node::Worker(peer), ballot(1, 0, true, digest));
        }
        let a = w.step(c.at(5), Event::Compared { step: 0, fingerprint: prints[1], prints: Some(prints) });
        (w, others(&a))
    };
    // Stage 0 holds 10 on both replicas, stage 1 holds 20: they agree.
    let (w, a) = compared(vec![10, 20, 10, 20]);
    assert_eq!((w.status().phase, w.status().step), (WorkerState::Stepping, 1), "{a:?}");
    // Stage 1's two replicas disagree: nobody can tell which is right.
    let (_, a) = compared(vec![10, 20, 10, 21]);
    assert_eq!(a, vec![Action::Diverged { step: 1, outvoted: vec![1, 3] }]);
}

#[test]
fn worker_applies_only_a_unanimous_vote_and_steps_on_to_done() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    let a = w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    assert_eq!(others(&a), vec![apply(0, false)]);
    let a = w.on_applied(c.at(5), 0, Some(101));
    assert_eq!(others(&a), vec![compute(1, 1, &[0, 1])]);
    // The other member's ballot for step 1 comes before this worker's own sum.
    w.on_message(c.at(6), Node::Worker(0), ballot(1, 1, true, 9));
    let a = w.on_reduced(c.at(7), 1, 1, Some((true, 9)));
    assert_eq!(others(&a), vec![apply(1, true)], "the early ballot was kept; the last update is compared");
    let a = w.step(c.at(8), Event::Compared { step: 1, fingerprint: 102, prints: Some(vec![102, 102]) });
    assert_eq!(w.status().phase, WorkerState::Done);
    assert!(matches!(&sent(&a)[..], [(Node::Coordinator, Msg::Report(Status { phase: WorkerState::Done, .. }))]));
    let a = w.on_message(c.at(9), Node::Coordinator, Msg::Finish);
    assert_eq!(others(&a), vec![Action::Finished]);
    let a = w.on_message(c.at(10), Node::Coordinator, Msg::Finish);
    assert!(matches!(&sent(&a)[..], [(Node::Coordinator, Msg::Report(Status { phase: WorkerState::Finished, .. }))]));
}

#[test]
fn worker_leaves_the_epoch_on_a_disagreeing_vote_a_failed_reduce_a_lost_peer_or_a_reconfigure() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 8));
    assert_eq!((w.status().phase, w.status().unapplied, w.status().step), (WorkerState::Idle, None, 0));

    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, false, 7));
    assert_eq!(w.status().phase, WorkerState::Idle, "a veto");

    let mut w = synced_worker(&c);
    w.on_message(c.at(2), Node::Coordinator, Msg::Start { epoch: 1 });
    w.on_reduced(c.at(3), 1, 0, None);
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, None));

    let mut w = voting_worker(&c);
    w.on_peer_lost(c.at(4), 0);
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, Some(7)));

    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Coordinator, Msg::Reconfigure { epoch: 1 });
    assert_eq!(w.status().phase, WorkerState::Idle);
    // A reconfigure for an epoch it never heard of voids that epoch's quorum in flight.
    w.on_message(c.at(5), Node::Coordinator, Msg::Reconfigure { epoch: 4 });
    let a = w.on_message(c.at(6), Node::Coordinator, Msg::Quorum(quorum(4, &[0, 1], 0, 100, None)));
    assert!(a.is_empty() && w.status().phase == WorkerState::Idle && w.status().epoch == 4);
}

#[test]
fn worker_asks_for_the_fingerprint_of_an_unhashed_update_only_when_it_needs_it() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    // Stepping on needs no fingerprint.
    let a = w.on_applied(c.at(5), 0, None);
    assert_eq!(a, vec![compute(1, 1, &[0, 1])]);
    // Leaving the epoch does: the report waits for it.
    let a = w.on_peer_lost(c.at(6), 0);
    assert_eq!(a, vec![Action::Hash], "no report pairs step 1 with step 0's fingerprint");
    assert_eq!(w.status().phase, WorkerState::Idle);
    let a = w.on_hashed(c.at(7), 101);
    let Some((Node::Coordinator, Msg::Report(s))) = sent(&a).pop() else { panic!("{a:?}") };
    assert_eq!((s.phase, s.step, s.fingerprint, s.last_commit), (WorkerState::Idle, 1, 101, Some(7)));
    // Known now: the next quorum is joined at once.
    let a = w.on_message(c.at(8), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 101, None)));
    assert!(others(&a).is_empty() && w.status().phase == WorkerState::Synced, "{a:?}");

    // A quorum that reaches a worker whose fingerprint is unknown waits for it.
    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    w.on_applied(c.at(5), 0, None);
    let a = w.on_message(c.at(6), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 101, None)));
    assert_eq!(a, vec![Action::Hash]);
    assert_eq!(w.status().epoch, 1, "the quorum is not taken yet");
    let a = w.on_hashed(c.at(7), 202);
    assert!(matches!(others(&a)[..], [Action::Fetch { step: 1, fingerprint: 101, .. }]), "another state: {a:?}");

    // A roll-forward whose update was not hashed is checked once hashed.
    let mut w = voting_worker(&c);
    w.tick(c.at(60));
    w.on_message(c.at(61), Node::Coordinator, Msg::Quorum(quorum(2, &[0, 1], 1, 555, Some(7))));
    assert_eq!(w.on_applied(c.at(62), 0, None), vec![Action::Hash]);
    assert_eq!(w.status().phase, WorkerState::Syncing);
    w.on_hashed(c.at(63), 555);
    assert_eq!((w.status().phase, w.status().step), (WorkerState::Synced, 1));

    // The last step's report (done) carries the fingerprint of the final state.
    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    w.on_applied(c.at(5), 0, None);
    w.on_message(c.at(6), Node::Worker(0), ballot(1, 1, true, 9));
    w.on_reduced(c.at(7), 1, 1, Some((true, 9)));
    assert_eq!(w.on_applied(c.at(8), 1, None), vec![Action::Hash]);
    let a = w.on_hashed(c.at(9), 303);
    assert!(matches!(
        &sent(&a)[..],
        [(Node::Coordinator, Msg::Report(Status { phase: WorkerState::Done, step: 2, fingerprint: 303, .. }))]
    ));
}

#[test]
fn worker_with_a_copy_puts_it_back_when_it_leaves_an_epoch_and_reports_the_copy() {
    let c = Clock(Instant::now());
    let mut w = voting_worker(&c);
    w.keep_copy(0, 100);
    // A copy of the state it holds: nothing to put back.
    let a = w.on_peer_lost(c.at(4), 0);
    assert!(others(&a).is_empty(), "{a:?}");
    assert_eq!((w.status().phase, w.status().unapplied), (WorkerState::Idle, Some(7)));

    // After an update, leaving the epoch goes back to the copy, before the report.
    let mut w = voting_worker(&c);
    w.keep_copy(0, 100);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    w.on_applied(c.at(5), 0, Some(101));
    assert_eq!((w.status().step, w.status().fingerprint), (1, 101));
    let a = w.on_message(c.at(6), Node::Coordinator, Msg::Reconfigure { epoch: 1 });
    assert_eq!(a[0], Action::Restore { step: 0, fingerprint: 100 }, "{a:?}");
    let Some((_, Msg::Report(status))) = sent(&a).pop() else { panic!("{a:?}") };
    assert_eq!((status.phase, status.step, status.fingerprint), (WorkerState::Idle, 0, 100));
    assert_eq!((status.last_commit, status.unapplied), (None, None));

    // An update not hashed, of the copy's step, is the copy: nothing to put back or hash.
    let mut w = voting_worker(&c);
    w.on_message(c.at(4), Node::Worker(0), ballot(1, 0, true, 7));
    w.keep_copy(1, 101);
    w.on_applied(c.at(5), 0, None);
    let a = w.on_peer_lost(c.at(6), 0);
    let Some((_, Msg::Report(status))) = sent(&a).pop() else { panic!("{a:?}") };
    assert!(others(&a).is_empty(), "{a:?}");
    assert_eq!((status.step, status.fingerprint), (1, 101));
}

#[test]
fn worker_stops_when_told_or_when_the_coordinator_stays_silent() {
    let c = Clock(Instant::now());
    let mut w = synced_worker(&c);
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Stop { reason: "too few".into() });
    assert_eq!(others(&a), vec![Action::Stopped { reason: "too few".into() }]);
    assert!(w.on_message(c.at(3), Node::Coordinator, Msg::Start { epoch: 1 }).is_empty());

    let (mut w, _) = Worker::new((3, 0), 2, (0, 100), (timing(), Checks::default()), c.at(0));
    assert!(others(&w.tick(c.at(2499))).is_empty(), "sync timeout + twice the quorum timeout");
    let a = w.tick(c.at(2500));
    assert!(matches!(&others(&a)[..], [Action::Stopped { reason }] if reason.contains("no word")), "{a:?}");
}

fn report(c: &mut Coordinator, at: Instant, id: u32, status: Status) -> Vec<Action> {
    c.on_message(at, Node::Worker(id), Msg::Report(status))
}

fn idle(step: u64, fingerprint: u64, last_commit: Option<u64>) -> Status {
    Status {
        incarnation: 0,
        phase: WorkerState::Idle,
        epoch: 0,
        step,
        fingerprint,
        last_commit,
        unapplied: None,
        suspect: false,
        saved: Vec::new(),
        unreplayable: None,
        unlogged: 0,
    }
}

fn quorum_sent(actions: &[Action]) -> Option<Quorum> {
    sent(actions).into_iter().find_map(|(_, m)| if let Msg::Quorum(q) = m { Some(q) } else { None })
}

/// A coordinator of generation 0 running epoch 1 with workers 0, 1, 2 at step 0.
fn running(c: &Clock) -> Coordinator {
    let mut co = Coordinator::new(0, 3, 1, timing(), c.at(0));
    for id in 0..3 {
        report(&mut co, c.at(1), id, idle(0, 100, None));
    }
    assert_eq!(co.quorum().map(|q| q.epoch), Some(1));
    for id in 0..3 {
        let s = Status { phase: WorkerState::Synced, epoch: 1, ..idle(0, 100, None) };
        report(&mut co, c.at(2), id, s);
    }
    assert_eq!(*co.stage(), JobState::Running);
    co
}

#[test]
fn coordinator_forms_the_first_quorum_when_the_expected_workers_are_idle_or_after_settling() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(0, 3, 1, timing(), c.at(0));
    report(&mut co, c.at(1), 2, idle(0, 100, None));
    let a = report(&mut co, c.at(2), 0, idle(0, 100, None));
    assert!(quorum_sent(&a).is_none(), "two of three");
    report(&mut co, c.at(150), 2, idle(0, 100, None));
    report(&mut co, c.at(150), 0, idle(0, 100, None));
    let a = co.tick(c.at(200));
    let q = quorum_sent(&a).expect("formed after settling");
    assert_eq!((q.epoch, q.members.clone(), q.stages[0].sources.clone()), (1, vec![0, 2], vec![0, 2]));
    assert_eq!(sent(&a).len(), 2, "the quorum goes to each member");
}

#[test]
fn a_coordinator_that_takes_over_a_running_job_waits_one_loss_bound_not_for_the_jobs_size() {
    let c = Clock(Instant::now());
    // Generation 1 of a job of four, two of whose workers are alive: they report the
    // epoch of the coordinator before (lost_after 100 ms, settle 200 ms).
    let mut co = Coordinator::new(1, 4, 1, timing(), c.at(0));
    for id in [0, 3] {
        report(&mut co, c.at(1), id, Status { epoch: 1, ..idle(40, 100, Some(1)) });
    }
    assert!(quorum_sent(&co.tick(c.at(99))).is_none(), "within the loss bound");
    let q = quorum_sent(&co.tick(c.at(100))).expect("formed after one loss bound");
    assert_eq!((q.epoch, q.members.clone(), q.step), ((1 << 40) + 1, vec![0, 3], 40));
    // A fresh job's coordinator waits the whole settle for the workers it expects.
    let mut fresh = Coordinator::new(1, 4, 1, timing(), c.at(0));
    for id in [0, 3] {
        report(&mut fresh, c.at(1), id, idle(0, 100, None));
    }
    for id in [0, 3] {
        report(&mut fresh, c.at(150), id, idle(0, 100, None));
    }
    assert!(quorum_sent(&fresh.tick(c.at(199))).is_none(), "waits the settle");
    assert!(quorum_sent(&fresh.tick(c.at(200))).is_some());
}

#[test]
fn coordinator_picks_the_newest_step_and_its_most_common_fingerprint() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(0, 4, 1, timing(), c.at(0));
    report(&mut co, c.at(1), 0, idle(5, 50, Some(1)));
    report(&mut co, c.at(1), 1, idle(6, 61, Some(2)));
    report(&mut co, c.at(1), 2, idle(6, 60, Some(3)));
    let a = report(&mut co, c.at(1), 3, idle(6, 60, Some(3)));
    let q = quorum_sent(&a).unwrap();
    let s = &q.stages[0];
    assert_eq!((q.step, s.fingerprint, s.commit, s.sources.clone()), (6, Some(60), Some(3), vec![2, 3]));
    assert_eq!(q.members, vec![0, 1, 2, 3], "the stale and the odd replica sync from the sources");
}

/// A coordinator of a pipeline of two stages on workers 0 to 3, which expects four.
fn pipeline_coordinator(c: &Clock) -> Coordinator {
    Coordinator::new(0, 4, 1, timing(), c.at(0)).with_stages(2)
}

#[test]
fn coordinator_of_a_pipeline_names_each_stage_s_sources_among_its_own_replicas() {
    let c = Clock(Instant::now());
    let mut co = pipeline_coordinator(&c);
    report(&mut co, c.at(1), 0, idle(6, 60, Some(1)));
    report(&mut co, c.at(1), 2, idle(5, 50, Some(9)));
    report(&mut co, c.at(1), 1, idle(6, 61, Some(2)));
    let q = quorum_sent(&report(&mut co, c.at(1), 3, idle(6, 61, Some(2)))).unwrap();
    assert_eq!((q.step, q.members.clone()), (6, vec![0, 1, 2, 3]));
    let stage0 = StageState { fingerprint: Some(60), commit: Some(1), sources: vec![0], ..StageState::unknown() };
    assert_eq!(q.stages[0], stage0);
    let stage1 = StageState { fingerprint: Some(61), commit: Some(2), sources: vec![1, 3], ..StageState::unknown() };
    assert_eq!(q.stages[1], stage1);
}

#[test]
fn a_pipeline_stage_whose_holders_were_lost_after_the_vote_rolls_forward_without_a_source() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(0, 5, 1, timing(), c.at(0)).with_stages(2);
    // Stage 1's replicas are one step behind with the sum their stage agreed on; worker 5
    // (stage 1, a replacement) has nothing: it waits for the next epoch.
    let behind = Status { unapplied: Some(77), epoch: 3, ..idle(5, 51, Some(2)) };
    for (id, status) in [(0, idle(6, 60, Some(1))), (2, idle(6, 60, Some(1))), (1, behind.clone()), (3, behind)] {
        report(&mut co, c.at(1), id, status);
    }
    let q = quorum_sent(&report(&mut co, c.at(1), 5, idle(0, 1, None))).unwrap();
    assert_eq!((q.step, q.members.clone()), (6, vec![0, 1, 2, 3]), "worker 5 is left out");
    assert_eq!(q.stages[1], StageState { commit: Some(77), ..StageState::unknown() });
    // A member of that stage rolls forward, and holds the quorum's state once it has.
    let (mut w, _) = Worker::new((3, 0), 9, (5, 51), (timing(), Checks::default()), c.at(0));
    w.on_message(c.at(1), Node::Coordinator, Msg::Quorum(quorum(3, &[1, 3], 5, 51, None)));
    w.on_message(c.at(1), Node::Coordinator, Msg::Start { epoch: 3 });
    w.on_reduced(c.at(2), 3, 5, Some((true, 77)));
    w.on_message(c.at(3), Node::Coordinator, Msg::Reconfigure { epoch: 3 });
    assert_eq!((w.status().step, w.status().unapplied), (5, Some(77)));
    let a = w.on_message(c.at(4), Node::Coordinator, Msg::Quorum(q));
    assert!(matches!(&others(&a)[..], [Action::Apply { step: 5, .. }]), "{a:?}");
    w.on_applied(c.at(5), 5, Some(62));
    assert_eq!(w.status().phase, WorkerState::Synced);
}

#[test]
fn a_pipeline_stage_with_no_live_holder_is_replayed_or_else_takes_the_job_back_and_one_not_ready_is_waited_for() {
    let c = Clock(Instant::now());
    // Both replicas of stage 1 are fresh replacements: stage 1's state is lost. Stage 0
    // has checkpoints of steps 3 and 6, stage 1 of step 3 only (its step 6 was never
    // committed): stage 1's workers replay it from step 3 to 6, stage 0 keeps its state.
    let mut co = pipeline_coordinator(&c);
    let saved = |steps: &[u64], status: Status| Status { saved: steps.to_vec(), ..status };
    report(&mut co, c.at(1), 0, saved(&[6, 3], idle(6, 60, Some(1))));
    report(&mut co, c.at(1), 2, saved(&[6, 3], idle(6, 60, Some(1))));
    report(&mut co, c.at(1), 1, saved(&[3], idle(3, 31, None)));
    let q = quorum_sent(&report(&mut co, c.at(1), 3, saved(&[3], idle(0, 1, None)))).expect("a quorum");
    assert_eq!((q.step, q.members.clone()), (6, vec![0, 1, 2, 3]));
    assert_eq!(q.stages[0].sources, vec![0, 2]);
    let replay = StageReplay { from: 3, workers: vec![1, 3], with_next: false };
    assert_eq!(q.stages[1], StageState { replay: Some(replay), ..StageState::unknown() });
    let (mut w, _) = Worker::new((3, 0), 9, (0, 1), (timing(), Checks::default()), c.at(0));
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Quorum(q.clone()));
    let group = ReplayGroup { from: 3, first: 1, workers: vec![vec![1, 3]] };
    assert_eq!(others(&a), vec![Action::Replay { epoch: q.epoch, to: 6, group }]);
    // It cannot (its checkpoint does not load): it says so, and the next quorum takes
    // every stage back to step 3, which both stages have.
    let a = w.step(c.at(3), Event::Replayed { epoch: q.epoch, state: Err(ReplayFailure::Impossible) });
    assert_eq!((w.status().phase, w.status().unreplayable), (WorkerState::Idle, Some(6)));
    let Some((_, Msg::Report(said))) = sent(&a).into_iter().next() else { panic!("{a:?}") };
    for (id, status) in [(0, idle(6, 60, Some(1))), (2, idle(6, 60, Some(1))), (1, idle(3, 31, None))] {
        let steps = if id == 1 { vec![3] } else { vec![6, 3] };
        report(&mut co, c.at(4), id, Status { epoch: q.epoch, saved: steps, ..status });
    }
    report(&mut co, c.at(4), 3, said);
    let q = quorum_sent(&co.tick(c.at(40))).expect("a quorum after the join window");
    assert_eq!((q.step, q.members.clone()), (3, vec![0, 1, 2, 3]));
    assert!(q.stages.iter().all(|s| s.restore && s.sources.is_empty()), "{q:?}");
    // Worker 1 restored that checkpoint as it started: it holds the state. The others load.
    let (mut w, _) = Worker::new((2, 0), 9, (6, 60), (timing(), Checks::default()), c.at(0));
    let a = w.on_message(c.at(42), Node::Coordinator, Msg::Quorum(q.clone()));
    assert_eq!(others(&a), vec![Action::Load { epoch: q.epoch, step: 3 }]);
    w.step(c.at(43), Event::Loaded { epoch: q.epoch, state: Some((3, 30)) });
    assert_eq!((w.status().phase, w.status().step, w.status().fingerprint), (WorkerState::Synced, 3, 30));
    let (mut w, _) = Worker::new((1, 0), 9, (3, 31), (timing(), Checks::default()), c.at(0));
    w.on_message(c.at(42), Node::Coordinator, Msg::Quorum(q));
    assert_eq!(w.status().phase, WorkerState::Synced);
    // No worker of stage 1 has reported yet: the coordinator waits for one, and stops
    // after the quorum timeout, saying why.
    let mut co = pipeline_coordinator(&c);
    let mut said = Vec::new();
    for at in (1..1000).step_by(50) {
        for id in [0, 2] {
            said.extend(report(&mut co, c.at(at), id, idle(6, 60, Some(1))));
        }
    }
    assert!(quorum_sent(&said).is_none() && *co.stage() != JobState::Running, "it waits: {said:?}");
    let a = co.tick(c.at(1001));
    assert!(matches!(co.stage(), JobState::Stopped { reason } if reason.contains("no worker of stage 1")), "{a:?}");
}

#[test]
fn a_lost_stage_s_replay_is_shared_with_a_worker_of_another_stage_which_keeps_its_own_state() {
    let c = Clock(Instant::now());
    // Stage 1 of a 2 x 2 pipeline is lost; three workers may share a replay: its two new
    // workers and worker 0, a holder of stage 0.
    let mut co = pipeline_coordinator(&c).with_replay_helpers(3);
    for (id, status) in [(0, idle(6, 60, Some(1))), (2, idle(6, 60, Some(1))), (1, idle(0, 1, None))] {
        report(&mut co, c.at(1), id, status);
    }
    let q = quorum_sent(&report(&mut co, c.at(1), 3, idle(0, 1, None))).expect("a quorum");
    let replay = StageReplay { from: 0, workers: vec![1, 3, 0], with_next: false };
    assert_eq!(q.stages[1], StageState { replay: Some(replay), ..StageState::unknown() });
    assert_eq!(q.stages[0].sources, vec![0, 2], "stage 0 keeps its state");
    // The helper replays stage 1 as the third of three, and keeps its own state.
    let (mut w, _) = Worker::new((0, 0), 9, (6, 60), (timing(), Checks::default()), c.at(0));
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Quorum(q.clone()));
    let group = ReplayGroup { from: 0, first: 1, workers: vec![vec![1, 3, 0]] };
    assert_eq!(group.place_of(0), Some((1, 2)));
    assert_eq!(others(&a), vec![Action::Replay { epoch: q.epoch, to: 6, group: group.clone() }]);
    w.step(c.at(3), Event::Replayed { epoch: q.epoch, state: Ok((6, 60)) });
    let s = w.status().clone();
    assert_eq!((s.phase, s.step, s.fingerprint, s.last_commit), (WorkerState::Synced, 6, 60, None));
    // Stage 1's workers hold the replayed state; worker 2 holds its own: the epoch starts
    // once every one has said so.
    let synced = |status: Status| Status { phase: WorkerState::Synced, epoch: q.epoch, ..status };
    report(&mut co, c.at(4), 0, synced(s));
    report(&mut co, c.at(4), 2, synced(idle(6, 60, Some(1))));
    report(&mut co, c.at(4), 1, synced(idle(6, 61, None)));
    assert_ne!(*co.stage(), JobState::Running, "worker 3 is still replaying");
    let a = report(&mut co, c.at(5), 3, synced(idle(6, 61, None)));
    assert_eq!(sent(&a).iter().filter(|(_, m)| *m == Msg::Start { epoch: q.epoch }).count(), 4, "{a:?}");
}

#[test]
fn stages_joined_by_a_boundary_whose_logs_cannot_be_read_replay_together() {
    let c = Clock(Instant::now());
    // One pipeline of three stages: stage 1's worker is new. It is asked to replay alone,
    // and finds boundary 1 (to stage 2) not logged.
    let mut co = Coordinator::new(0, 3, 1, timing(), c.at(0)).with_stages(3);
    let saved = |steps: &[u64], status: Status| Status { saved: steps.to_vec(), ..status };
    report(&mut co, c.at(1), 0, saved(&[6, 3], idle(6, 60, Some(1))));
    report(&mut co, c.at(1), 2, saved(&[6, 3], idle(6, 62, Some(2))));
    let q = quorum_sent(&report(&mut co, c.at(1), 1, saved(&[3], idle(3, 31, None)))).expect("a quorum");
    let alone = ReplayGroup { from: 3, first: 1, workers: vec![vec![1]] };
    assert_eq!(q.replay_of(1), Some(alone.clone()));
    let (mut w, _) = Worker::new((1, 0), 9, (3, 31), (timing(), Checks::default()), c.at(0));
    w.step(c.at(1), Event::Checkpoints { steps: vec![3] });
    let a = w.on_message(c.at(2), Node::Coordinator, Msg::Quorum(q.clone()));
    assert_eq!(others(&a), vec![Action::Replay { epoch: q.epoch, to: 6, group: alone }]);
    let a = w.step(c.at(3), Event::Replayed { epoch: q.epoch, state: Err(ReplayFailure::Unlogged(0b10)) });
    assert_eq!((w.status().phase, w.status().unlogged, w.status().unreplayable), (WorkerState::Idle, 0b10, None));
    // The next quorum joins stages 1 and 2: both go back to step 3, the newest both have,
    // and replay together; stage 0 keeps its state.
    let Some((_, Msg::Report(said))) = sent(&a).into_iter().next() else { panic!("{a:?}") };
    report(&mut co, c.at(4), 0, saved(&[6, 3], Status { epoch: q.epoch, ..idle(6, 60, Some(1)) }));
    report(&mut co, c.at(4), 2, saved(&[6, 3], Status { epoch: q.epoch, ..idle(6, 62, Some(2)) }));
    report(&mut co, c.at(4), 1, said);
    let q = quorum_sent(&co.tick(c.at(40))).expect("a quorum after the join window");
    assert_eq!((q.step, q.stages[0].sources.clone()), (6, vec![0]));
    let together = ReplayGroup { from: 3, first: 1, workers: vec![vec![1], vec![2]] };
    assert_eq!(
        (q.replay_of(1), q.replay_of(2), q.replay_of(0)),
        (Some(together.clone()), Some(together.clone()), None)
    );
    assert!(q.stages[1].replay.as_ref().is_some_and(|r| r.with_next));
    // Worker 2 held step 6 of its stage: it goes back and replays too.
    let (mut w, _) = Worker::new((2, 0), 9, (6, 62), (timing(), Checks::default()), c.at(0));
    let a = w.on_message(c.at(42), Node::Coordinator, Msg::Quorum(q.clone()));
    assert_eq!(others(&a), vec![Action::Replay { epoch: q.epoch, to: 6, group: together }]);
    // Had stage 0 been joined too, the group would be the whole pipeline: every stage
    // goes back to its checkpoint instead.
    let mut co = Coordinator::new(0, 3, 1, timing(), c.at(0)).with_stages(3);
    report(&mut co, c.at(1), 0, saved(&[6, 3], Status { unlogged: 0b11, ..idle(6, 60, Some(1)) }));
    report(&mut co, c.at(1), 2, saved(&[6, 3], idle(6, 62, Some(2))));
    let q = quorum_sent(&report(&mut co, c.at(1), 1, saved(&[3], idle(3, 31, None)))).expect("a quorum");
    assert_eq!(q.step, 3);
    assert!(q.stages.iter().all(|s| s.restore), "{q:?}");
}

#[test]
fn coordinator_starts_the_epoch_when_every_member_is_synced() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(0, 2, 1, timing(), c.at(0));
    report(&mut co, c.at(1), 0, idle(0, 100, None));
    report(&mut co, c.at(1), 1, idle(0, 100, None));
    let a = report(&mut co, c.at(2), 0, Status { phase: WorkerState::Synced, epoch: 1, ..idle(0, 100, None) });
    assert!(sent(&a).is_empty());
    let a = report(&mut co, c.at(3), 1, Status { phase: WorkerState::Synced, epoch: 1, ..idle(0, 100, None) });
    assert_eq!(sent(&a).iter().filter(|(_, m)| *m == Msg::Start { epoch: 1 }).count(), 2);
}

#[test]
fn coordinator_ends_the_epoch_on_a_silent_a_disconnected_or_an_aborting_member_and_on_a_newcomer() {
    let c = Clock(Instant::now());
    let stepping = |e| Status { phase: WorkerState::Stepping, epoch: e, ..idle(0, 100, None) };
    // Silence: workers 0 and 1 report, 2 does not.
    let mut co = running(&c);
    report(&mut co, c.at(90), 0, stepping(1));
    report(&mut co, c.at(90), 1, stepping(1));
    let a = co.tick(c.at(103));
    assert!(matches!(co.stage(), JobState::Gathering { .. }));
    let told: Vec<Node> = sent(&a).iter().filter(|(_, m)| *m == Msg::Reconfigure { epoch: 1 }).map(|x| x.0).collect();
    assert_eq!(told, vec![Node::Worker(0), Node::Worker(1)]);
    // A closed connection.
    let mut co = running(&c);
    co.on_disconnect(c.at(5), 1);
    assert!(matches!(co.stage(), JobState::Gathering { .. }));
    // A member that left its epoch.
    let mut co = running(&c);
    report(&mut co, c.at(5), 2, Status { epoch: 1, ..idle(0, 100, None) });
    assert!(matches!(co.stage(), JobState::Gathering { .. }));
    // Workers joining the running job: taken in together, a join window (10 ms here)
    // after the first was seen, while the members step on.
    let mut co = running(&c);
    report(&mut co, c.at(5), 7, idle(0, 100, None));
    assert_eq!(*co.stage(), JobState::Running);
    report(&mut co, c.at(9), 8, idle(0, 100, None));
    for id in 0..3 {
        report(&mut co, c.at(9), id, stepping(1));
    }
    assert_eq!(*co.stage(), JobState::Running);
    co.tick(c.at(15));
    assert!(matches!(co.stage(), JobState::Gathering { .. }));
    let a: Vec<Action> =
        (0..3).flat_map(|id| report(&mut co, c.at(16), id, Status { epoch: 1, ..idle(0, 100, None) })).collect();
    let q = quorum_sent(&a).expect("one epoch for both newcomers");
    assert_eq!(q.members, vec![0, 1, 2, 7, 8]);
}

#[test]
fn coordinator_waits_for_a_member_to_acknowledge_its_newest_epoch_before_counting_it_ready() {
    let c = Clock(Instant::now());
    let mut co = running(&c);
    co.on_disconnect(c.at(5), 2);
    // Worker 0 reports an idle state that predates epoch 1: not ready, told to leave it.
    let a = report(&mut co, c.at(6), 0, idle(0, 100, None));
    assert!(sent(&a).contains(&(Node::Worker(0), Msg::Reconfigure { epoch: 1 })));
    let a = report(&mut co, c.at(7), 1, Status { epoch: 1, ..idle(0, 100, None) });
    assert!(quorum_sent(&a).is_none());
    let a = report(&mut co, c.at(8), 0, Status { epoch: 1, ..idle(0, 100, None) });
    assert!(quorum_sent(&a).is_none(), "within the join window after the loss (10 ms here)");
    let a = co.tick(c.at(15));
    let q = quorum_sent(&a).expect("both acknowledged epoch 1");
    assert_eq!((q.epoch, q.members), (2, vec![0, 1]));
}

#[test]
fn the_losses_of_one_node_that_arrive_moments_apart_are_one_change() {
    let c = Clock(Instant::now());
    let mut co = running(&c);
    co.on_disconnect(c.at(5), 1);
    report(&mut co, c.at(6), 0, Status { epoch: 1, ..idle(0, 100, None) });
    co.on_disconnect(c.at(9), 2);
    let a = co.tick(c.at(15));
    let q = quorum_sent(&a).expect("one quorum after the window");
    assert_eq!((q.epoch, q.members), (2, vec![0]));
}

#[test]
fn coordinator_finishes_when_every_member_is_done_then_sends_the_rest_away() {
    let c = Clock(Instant::now());
    let mut co = running(&c);
    let done = Status { phase: WorkerState::Done, epoch: 1, ..idle(2, 300, Some(9)) };
    report(&mut co, c.at(5), 0, done.clone());
    report(&mut co, c.at(5), 1, done.clone());
    let a = report(&mut co, c.at(5), 2, done.clone());
    assert_eq!(sent(&a).iter().filter(|(_, m)| *m == Msg::Finish).count(), 3);
    assert_eq!(*co.stage(), JobState::Finished);
    let a = report(&mut co, c.at(6), 8, idle(0, 100, None));
    assert!(sent(&a).is_empty(), "nobody is sent away before a member has the result");
    report(&mut co, c.at(7), 0, Status { phase: WorkerState::Finished, ..done });
    let a = co.tick(c.at(30));
    assert!(sent(&a).iter().any(|(to, m)| *to == Node::Worker(8) && matches!(m, Msg::Stop { .. })));
}

#[test]
fn coordinator_stops_the_job_when_too_few_workers_remain() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(0, 3, 2, timing(), c.at(0));
    report(&mut co, c.at(1), 0, idle(0, 100, None));
    assert!(quorum_sent(&co.tick(c.at(500))).is_none(), "one worker is not enough");
    for t in (10..1000).step_by(10) {
        report(&mut co, c.at(t), 0, idle(0, 100, None));
    }
    let a = co.tick(c.at(1000));
    let JobState::Stopped { reason } = co.stage() else { panic!("{:?}", co.stage()) };
    assert!(reason.contains("too few workers remain: 1 ready, at least 2"), "{reason}");
    assert!(matches!(&sent(&a)[..], [(Node::Worker(0), Msg::Stop { .. })]));
}

#[test]
fn a_restarted_coordinator_ignores_replaced_processes_and_never_reuses_an_epoch() {
    let c = Clock(Instant::now());
    let mut co = Coordinator::new(1, 2, 1, timing(), c.at(0));
    let mut replaced = idle(0, 100, None);
    replaced.incarnation = 1;
    report(&mut co, c.at(1), 0, replaced);
    let stale = Status { phase: WorkerState::Stepping, epoch: 5, ..idle(4, 400, None) };
    report(&mut co, c.at(2), 0, stale);
    assert_eq!(co.worker(0).map(|(s, _)| s.incarnation), Some(1), "the old process's report is ignored");
    let a = report(&mut co, c.at(3), 1, Status { epoch: 7, ..idle(3, 300, None) });
    let q = quorum_sent(&a).unwrap();
    assert_eq!(q.epoch, (1 << 40) + 1, "above generation 0's epochs, and above epoch 7");
}

#[test]
fn coordinator_a_pause_of_its_own_is_not_the_members_silence() {
    let c = Clock(Instant::now());
    let stepping = |e| Status { phase: WorkerState::Stepping, epoch: e, ..idle(0, 100, None) };
    let mut co = running(&c);
    for id in 0..3 {
        report(&mut co, c.at(50), id, stepping(1));
    }
    // Stopped from 50 ms to 8050 ms: its shell says so before its first tick.
    co.paused(Duration::from_millis(8000));
    let a = co.tick(c.at(8055));
    assert_eq!(*co.stage(), JobState::Running, "{a:?}");
    assert!(co.workers().all(|(_, _, lost)| !lost));
    // The heartbeats that waited in its sockets arrive; worker 2's never do (it died
    // during the pause): it is lost one timeout of running time later, and only it.
    report(&mut co, c.at(8060), 0, stepping(1));
    report(&mut co, c.at(8060), 1, stepping(1));
    co.tick(c.at(8140));
    assert_eq!(*co.stage(), JobState::Running);
    report(&mut co, c.at(8145), 0, stepping(1));
    report(&mut co, c.at(8145), 1, stepping(1));
    co.tick(c.at(8151));
    assert!(matches!(co.stage(), JobState::Gathering { .. }));
    let lost: Vec<u32> = co.workers().filter(|(_, _, lost)| *lost).map(|(id, _, _)| id).collect();
    assert_eq!(lost, vec![2]);
}

#[test]
fn coordinator_admits_one_process_per_slot_and_refuses_a_superseded_one() {
    use comm::protocol::coordinator::Admission;
    let c = Clock(Instant::now());
    let addr = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut co = running(&c);
    let admitted = Admission::Admit { superseded: None };
    for id in 0..3 {
        assert_eq!(co.admit(c.at(6), id, 0, addr(1000 + id as u16)), admitted);
    }
    // The same process again (its connection dropped): admitted.
    assert_eq!(co.admit(c.at(6), 1, 0, addr(1001)), admitted);
    // A second process with the same rank while the holder lives: refused.
    assert!(
        matches!(co.admit(c.at(6), 1, 0, addr(2001)), Admission::Refuse { reason } if reason.contains("held by a live process"))
    );
    // The holder is lost (stopped): a process started by hand in its place takes the slot...
    co.on_disconnect(c.at(5), 1);
    assert_eq!(co.admit(c.at(6), 1, 0, addr(2001)), Admission::Admit { superseded: Some(addr(1001)) });
    // ...and the old one, waking up, is refused: it does not take the slot back.
    assert!(matches!(co.admit(c.at(6), 1, 0, addr(1001)), Admission::Refuse { .. }));
    // A launcher's replacement (a newer incarnation) takes the slot at once; the older
    // process is refused for good.
    assert_eq!(co.admit(c.at(6), 2, 1, addr(3002)), Admission::Admit { superseded: Some(addr(1002)) });
    assert!(
        matches!(co.admit(c.at(6), 2, 0, addr(1002)), Admission::Refuse { reason } if reason.contains("given to a replacement"))
    );
    // Once the replacement is lost too (its whole node, say), a process of any
    // incarnation takes the slot: a node's launcher started again counts from 0.
    co.on_disconnect(c.at(7), 2);
    assert_eq!(co.admit(c.at(8), 2, 0, addr(4002)), Admission::Admit { superseded: Some(addr(3002)) });
}
