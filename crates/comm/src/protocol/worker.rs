//! A worker's side of the step protocol (steps 1, 4, 5 and 6 of [`super`]).
//!
//! One entry, [`Worker::step`], takes every [`Event`]: a message, the clock, and the
//! shell's answer to each action. Every decision of the worker's side is made here, so a
//! shell (the elastic trainer's, the Python package's, the simulator's) only carries out
//! actions: whether to check the state at rest or just before an update, when to compare
//! the replicas and whom a comparison outvotes, what the ballots agree on of the epoch's
//! checkpoints, when to hash, fetch, roll forward or leave an epoch.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{
    Action, Arrival, Checks, Event, Msg, Node, Quorum, ReplayFailure, Saved, Status, Timing, WorkerId, WorkerState,
    send,
};
use crate::commit::{Ballot, Decision, decide_in_groups};
use crate::majority::{Comparison, compare_in_groups};

/// One worker's protocol state.
#[derive(Clone, Debug)]
pub struct Worker {
    id: WorkerId,
    total: u64,
    timing: Timing,
    status: Status,
    /// The quorum of the epoch this worker is a member of.
    quorum: Option<Quorum>,
    /// Ballots by step (of the current epoch), by rank.
    ballots: BTreeMap<u64, Vec<Option<Cast>>>,
    vote_deadline: Option<Instant>,
    /// The copy of the state the shell keeps, `(step, fingerprint)`, for the rollback
    /// baseline.
    copy: Option<(u64, u64)>,
    /// Whether `status.fingerprint` is that of the state held: an update the shell did
    /// not hash leaves it unknown until something needs it.
    fresh: bool,
    /// What waits for the fingerprint the shell was asked for ([`Action::Hash`]).
    after_hash: AfterHash,
    next_report: Instant,
    heard_coordinator: Instant,
    /// The checks the job asks for.
    checks: Checks,
    /// The newest checkpoint of the epoch whose parts every member wrote from the same
    /// state (their ballots said so).
    verified: u64,
}

/// A member's ballot: its sum is finite, the sum's digest, its checkpoint part.
type Cast = (bool, u64, Saved);

impl Worker {
    /// Process `incarnation` of worker `id`, holding the state of `step` (0 for a fresh
    /// one) with `fingerprint`, in a job of `total` steps with `checks`. Returns it with
    /// its first report.
    pub fn new(
        (id, incarnation): (WorkerId, u64),
        total: u64,
        (step, fingerprint): (u64, u64),
        (timing, checks): (Timing, Checks),
        now: Instant,
    ) -> (Worker, Vec<Action>) {
        let status = Status {
            incarnation,
            phase: WorkerState::Idle,
            epoch: 0,
            step,
            fingerprint,
            last_commit: None,
            unapplied: None,
            suspect: false,
            saved: Vec::new(),
            unreplayable: None,
            unlogged: 0,
        };
        let mut w = Worker {
            id,
            total,
            timing,
            status,
            quorum: None,
            ballots: BTreeMap::new(),
            vote_deadline: None,
            copy: None,
            fresh: true,
            after_hash: AfterHash::default(),
            next_report: now,
            heard_coordinator: now,
            checks,
            verified: 0,
        };
        let mut out = Vec::new();
        w.report(now, &mut out);
        (w, out)
    }

    /// What this worker would report now (its fingerprint only once known: see
    /// [`Event::Applied`]).
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// The quorum of its epoch, while it is a member of one.
    pub fn quorum(&self) -> Option<&Quorum> {
        self.quorum.as_ref()
    }

    /// What happened: returns the actions to carry out, in order.
    pub fn step(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Message { from, msg } => return self.on_message(now, from, msg),
            Event::Tick => return self.tick(now),
            Event::Computed { epoch, step, sum, saved } => return self.on_computed(now, (epoch, step), sum, saved),
            Event::VoteFailed { epoch } => {
                if self.status.phase == WorkerState::Stepping && self.status.epoch == epoch {
                    self.go_idle(now, &mut out);
                }
            }
            Event::Applied { step, fingerprint } => return self.on_applied(now, step, fingerprint),
            Event::Compared { step, fingerprint, prints } => return self.on_compared(now, step, fingerprint, prints),
            Event::Changed { fingerprint } => return self.on_changed(now, fingerprint),
            Event::Hashed { fingerprint } => return self.on_hashed(now, fingerprint),
            Event::Fetched { epoch, state } => return self.on_fetched(now, epoch, state),
            Event::Copied { step, fingerprint } => self.copy = Some((step, fingerprint)),
            Event::Checkpoints { steps } => {
                // An idle worker says them at once: the next quorum may need them.
                if steps != self.status.saved {
                    self.status.saved = steps;
                    if self.status.phase == WorkerState::Idle {
                        self.report(now, &mut out);
                    }
                }
            }
            Event::Loaded { epoch, state } => return self.on_loaded(now, epoch, state),
            Event::Replayed { epoch, state } => return self.on_replayed(now, epoch, state),
            Event::PeerLost(peer) => {
                let member = self.quorum.as_ref().is_some_and(|q| q.rank_of(peer).is_some());
                if member && self.in_epoch() {
                    self.go_idle(now, &mut out);
                }
            }
        }
        out
    }

    fn in_epoch(&self) -> bool {
        matches!(self.status.phase, WorkerState::Syncing | WorkerState::Synced | WorkerState::Stepping)
    }

    fn on_message(&mut self, now: Instant, from: Node, msg: Msg) -> Vec<Action> {
        let mut out = Vec::new();
        if self.is_over() {
            // A finished worker acknowledges every finish: the first answer may be lost.
            if self.status.phase == WorkerState::Finished && msg == Msg::Finish {
                self.report(now, &mut out);
            }
            return out;
        }
        if from == Node::Coordinator {
            self.heard_coordinator = now;
        }
        match msg {
            Msg::Quorum(q) => self.on_quorum(now, q, &mut out),
            Msg::Start { epoch } => {
                if self.status.phase == WorkerState::Synced && self.status.epoch == epoch {
                    self.begin_step(now, &mut out);
                }
            }
            Msg::Reconfigure { epoch } => {
                // An epoch newer than any quorum that reached this worker: the quorum was
                // lost or is still in flight; it is void now.
                if epoch > self.status.epoch {
                    self.status.epoch = epoch;
                    self.quorum = None;
                }
                match self.status.phase {
                    WorkerState::Syncing | WorkerState::Synced | WorkerState::Stepping
                        if self.status.epoch == epoch =>
                    {
                        self.go_idle(now, &mut out)
                    }
                    _ => self.report(now, &mut out),
                }
            }
            Msg::Finish => {
                if self.status.phase == WorkerState::Done {
                    self.status.phase = WorkerState::Finished;
                    self.report(now, &mut out);
                    out.push(Action::Finished);
                } else {
                    self.report(now, &mut out);
                }
            }
            Msg::Stop { reason } => self.stop(now, reason, &mut out),
            Msg::Ballot { epoch, step, ok, digest, saved } => {
                let Node::Worker(peer) = from else { return out };
                let Some(q) = &self.quorum else { return out };
                let Some(rank) = q.rank_of(peer) else { return out };
                if q.epoch != epoch || step < self.status.step {
                    return out;
                }
                let world = q.members.len();
                self.ballots.entry(step).or_insert_with(|| vec![None; world])[rank] = Some((ok, digest, saved));
                if self.status.phase == WorkerState::Stepping && step == self.status.step {
                    self.check_vote(now, &mut out);
                }
            }
            // Reports go to the coordinator; one here is misrouted.
            Msg::Report(_) => {}
        }
        out
    }

    /// The shell finished the gradients and all-reduce of `step`: `Some((finite, digest))`
    /// of the sum, or `None` when the all-reduce failed (a member was lost).
    fn on_computed(
        &mut self,
        now: Instant,
        (epoch, step): (u64, u64),
        sum: Option<(bool, u64)>,
        saved: Saved,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if self.status.phase != WorkerState::Stepping || self.status.epoch != epoch || self.status.step != step {
            return out;
        }
        let Some((ok, digest)) = sum else {
            self.go_idle(now, &mut out);
            return out;
        };
        let q = self.quorum.as_ref().expect("a stepping worker is a member");
        let rank = q.rank_of(self.id).expect("a member has a rank");
        // The sum is held until the vote says whether to apply it.
        self.status.unapplied = ok.then_some(digest);
        let world = q.members.len();
        self.ballots.entry(step).or_insert_with(|| vec![None; world])[rank] = Some((ok, digest, saved));
        let to: Vec<WorkerId> = q.members.iter().copied().filter(|&m| m != self.id).collect();
        if !to.is_empty() {
            out.push(Action::Vote { epoch, step, ok, digest, saved, to });
        }
        self.vote_deadline = Some(now + self.timing.vote_timeout);
        self.check_vote(now, &mut out);
        out
    }

    /// The shell applied the held sum of `step`; the state now has `fingerprint`, or, when
    /// the shell did not hash it (`None`), a fingerprint the worker asks for
    /// ([`Action::Hash`]) only when it needs it: to report, to check a roll-forward, to
    /// join a quorum. An epoch without failures hashes the state once, at its end.
    fn on_applied(&mut self, now: Instant, step: u64, fingerprint: Option<u64>) -> Vec<Action> {
        let mut out = Vec::new();
        if !self.applied(step, fingerprint) {
            return out;
        }
        match self.status.phase {
            WorkerState::Stepping => self.begin_step(now, &mut out),
            WorkerState::Syncing if self.fresh => self.check_rolled(now, &mut out),
            WorkerState::Syncing => {
                self.after_hash.check_rolled = true;
                self.ask_hash(&mut out);
            }
            _ => {}
        }
        out
    }

    /// The shell applied the held sum of `step`, then compared the replicas (a check was
    /// due after this update): the state has `fingerprint`, and the members' are
    /// `prints` (`None`: the comparison failed). When they agree, this is an ordinary
    /// update. Otherwise the step counts, but the epoch ends here:
    /// - a comparison that failed ends it as a lost member does;
    /// - a divergence the job repairs with a strict majority makes an outvoted worker
    ///   report its state as it is (as [`Event::Changed`] does), and the others leave
    ///   the epoch: the next quorum's majority decides who fetches;
    /// - any other divergence ends the job with [`Action::Diverged`].
    fn on_compared(&mut self, now: Instant, step: u64, fingerprint: u64, prints: Option<Vec<u64>>) -> Vec<Action> {
        let members = self.quorum.as_ref().map(|q| q.members.clone()).unwrap_or_default();
        let stages = self.quorum.as_ref().map(Quorum::member_stages).unwrap_or_default();
        // Each stage's replicas are compared with each other (in a data-parallel job, every
        // member with every other).
        let comparison = match &prints {
            Some(p) if p.len() == members.len() => compare_in_groups(p, &stages),
            // A gather that failed, or one of another epoch's size, compares nothing.
            _ => Comparison::Diverged { outvoted: Vec::new(), majority: false },
        };
        if comparison == Comparison::Agree {
            return self.on_applied(now, step, Some(fingerprint));
        }
        let mut out = Vec::new();
        if !self.applied(step, Some(fingerprint)) {
            return out;
        }
        let Comparison::Diverged { outvoted, majority } = comparison else { return out };
        if outvoted.is_empty() {
            self.go_idle(now, &mut out);
            return out;
        }
        let outvoted: Vec<WorkerId> = outvoted.iter().map(|&r| members[r]).collect();
        if majority && self.checks.repair {
            out.push(Action::Repair { step: self.status.step, outvoted: outvoted.clone() });
            if outvoted.contains(&self.id) {
                out.extend(self.on_changed(now, fingerprint));
            } else {
                self.go_idle(now, &mut out);
            }
        } else {
            out.push(Action::Diverged { step: self.status.step, outvoted });
        }
        out
    }

    /// The bookkeeping of an applied update of `step`, whose state has `fingerprint` when
    /// the shell hashed it; false when no such update was due.
    fn applied(&mut self, step: u64, fingerprint: Option<u64>) -> bool {
        if step != self.status.step || self.status.unapplied.is_none() {
            return false;
        }
        self.status.step += 1;
        self.fresh = fingerprint.is_some();
        self.status.fingerprint = fingerprint.unwrap_or_default();
        self.status.last_commit = self.status.unapplied.take();
        self.vote_deadline = None;
        self.ballots.retain(|&s, _| s >= self.status.step);
        true
    }

    /// The shell hashed the state it holds, as asked by [`Action::Hash`]: it has
    /// `fingerprint`. Carry out the returned actions before any left from earlier calls.
    fn on_hashed(&mut self, now: Instant, fingerprint: u64) -> Vec<Action> {
        let mut out = Vec::new();
        self.status.fingerprint = fingerprint;
        self.fresh = true;
        let after = std::mem::take(&mut self.after_hash);
        if after.check_rolled && self.status.phase == WorkerState::Syncing {
            self.check_rolled(now, &mut out);
        }
        if let Some(q) = after.quorum {
            self.on_quorum(now, q, &mut out);
        }
        if after.report {
            self.report(now, &mut out);
        }
        out
    }

    /// The shell fetched the state of `epoch`'s quorum: `Some((step, fingerprint))` of
    /// what it now holds, or `None` when it could not fetch and its state is untouched. A
    /// fetch that failed after overwriting part of the state answers with what the state
    /// now is: its fingerprint matches nobody's, so it fetches again in the next epoch and
    /// is never a source.
    fn on_fetched(&mut self, now: Instant, epoch: u64, state: Option<(u64, u64)>) -> Vec<Action> {
        let mut out = Vec::new();
        if self.status.phase != WorkerState::Syncing || self.status.epoch != epoch {
            return out;
        }
        let q = self.quorum.as_ref().expect("a syncing worker is a member");
        let target = q.state_of(self.id);
        match state {
            Some((step, fingerprint)) if step == q.step && Some(fingerprint) == target.fingerprint => {
                self.status.step = step;
                self.status.fingerprint = fingerprint;
                self.fresh = true;
                self.status.last_commit = target.commit;
                self.status.unapplied = None;
                self.status.suspect = false;
                self.status.phase = WorkerState::Synced;
                self.report(now, &mut out);
            }
            Some((step, fingerprint)) => {
                self.status.step = step;
                self.status.fingerprint = fingerprint;
                self.fresh = true;
                self.status.last_commit = None;
                self.status.unapplied = None;
                self.go_idle(now, &mut out);
            }
            None => self.go_idle(now, &mut out),
        }
        out
    }

    /// The shell loaded its stage's checkpoint for `epoch`'s quorum, or replayed its stage
    /// from one: `Some((step, fingerprint))` of what it now holds, or `None` when it could
    /// not (its state is untouched, and it leaves the epoch: the next quorum knows better).
    fn on_loaded(&mut self, now: Instant, epoch: u64, state: Option<(u64, u64)>) -> Vec<Action> {
        let mut out = Vec::new();
        if self.status.phase != WorkerState::Syncing || self.status.epoch != epoch {
            return out;
        }
        let q = self.quorum.as_ref().expect("a syncing worker is a member");
        match state {
            Some((step, fingerprint)) if step == q.step => {
                self.status.step = step;
                self.status.fingerprint = fingerprint;
                self.fresh = true;
                self.status.last_commit = None;
                self.status.unapplied = None;
                self.status.suspect = false;
                self.status.unreplayable = None;
                self.status.phase = WorkerState::Synced;
                self.report(now, &mut out);
            }
            _ => self.go_idle(now, &mut out),
        }
        out
    }

    /// The shell replayed its place of the epoch's replay, or could not (see
    /// [`ReplayFailure`]): what it could not do is said in its reports, for the next quorum.
    fn on_replayed(&mut self, now: Instant, epoch: u64, state: Result<(u64, u64), ReplayFailure>) -> Vec<Action> {
        let syncing = self.status.phase == WorkerState::Syncing && self.status.epoch == epoch;
        let q = self.quorum.as_ref().filter(|q| q.epoch == epoch);
        match state {
            Ok((step, fingerprint)) => {
                // A helper's own stage is untouched: it is synced as it was.
                let replayed = q.and_then(|q| Some((q.replay_of(self.id)?.place_of(self.id)?.0, q.stage_of(self.id))));
                if replayed.is_some_and(|(stage, own)| stage != own) {
                    let mut out = Vec::new();
                    if syncing && step == self.status.step {
                        self.status.phase = WorkerState::Synced;
                        self.report(now, &mut out);
                    } else if syncing {
                        self.go_idle(now, &mut out);
                    }
                    return out;
                }
                self.on_loaded(now, epoch, Some((step, fingerprint)))
            }
            Err(why) => {
                if syncing {
                    match why {
                        ReplayFailure::Lost => {}
                        ReplayFailure::Unlogged(boundaries) => self.status.unlogged |= boundaries,
                        ReplayFailure::Impossible => self.status.unreplayable = q.map(|q| q.step),
                    }
                }
                self.on_loaded(now, epoch, None)
            }
        }
    }

    /// The shell found that the state it holds is not the state the protocol believes it
    /// holds (a check after the update disagreed with the other replicas, or the state
    /// changed at rest): it now has `fingerprint`. The worker leaves its epoch, dropping any
    /// sum it holds, and reports the state as it is, so that the next quorum names it a
    /// dissenter and it fetches the state from the healthy replicas.
    fn on_changed(&mut self, now: Instant, fingerprint: u64) -> Vec<Action> {
        let mut out = Vec::new();
        if self.is_over() {
            return out;
        }
        self.status.fingerprint = fingerprint;
        self.fresh = true;
        self.status.last_commit = None;
        self.status.unapplied = None;
        self.status.suspect = true;
        self.go_idle(now, &mut out);
        out
    }

    /// Time passed.
    fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if self.is_over() {
            return out;
        }
        if self.status.phase == WorkerState::Stepping && self.vote_deadline.is_some_and(|d| now >= d) {
            self.go_idle(now, &mut out);
        }
        let waiting = matches!(
            self.status.phase,
            WorkerState::Idle | WorkerState::Syncing | WorkerState::Synced | WorkerState::Done
        );
        let silence = now.saturating_duration_since(self.heard_coordinator);
        // A live coordinator speaks to every worker within a sync timeout (it gives up on a
        // slow quorum and gathers) plus a quorum timeout (it forms one or stops the job):
        // wait longer than that, so that its verdict, and its reason, come first.
        if waiting && silence >= self.timing.sync_timeout + 2 * self.timing.quorum_timeout {
            let reason = format!("no word from the coordinator for {:.1} s", silence.as_secs_f64());
            self.stop(now, reason, &mut out);
            return out;
        }
        if now >= self.next_report {
            self.report(now, &mut out);
        }
        out
    }

    fn is_over(&self) -> bool {
        matches!(self.status.phase, WorkerState::Finished | WorkerState::Stopped)
    }

    /// Reports the status; when the fingerprint is unknown, asks for it first, and
    /// reports when it comes ([`Event::Hashed`]): a report never pairs a step with
    /// the fingerprint of another.
    fn report(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.next_report = now + self.timing.heartbeat;
        if !self.fresh {
            self.after_hash.report = true;
            self.ask_hash(out);
            return;
        }
        out.push(send(Node::Coordinator, Msg::Report(self.status.clone())));
    }

    fn ask_hash(&mut self, out: &mut Vec<Action>) {
        if !self.after_hash.asked {
            self.after_hash.asked = true;
            out.push(Action::Hash);
        }
    }

    fn stop(&mut self, now: Instant, reason: String, out: &mut Vec<Action>) {
        self.status.phase = WorkerState::Stopped;
        self.quorum = None;
        self.report(now, out);
        out.push(Action::Stopped { reason });
    }

    /// Leaves the epoch, keeping the state and any unapplied sum (or, with a copy kept,
    /// putting the copy back), and reports.
    fn go_idle(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.quorum = None;
        self.ballots.clear();
        self.vote_deadline = None;
        // A state of the copy's step that was not hashed is the copy: the shell copies the
        // state after the update, and a state changed since is reported with its
        // fingerprint (`on_corrupted`).
        if let Some((step, fingerprint)) = self.copy
            && step == self.status.step
            && !self.fresh
        {
            self.status.fingerprint = fingerprint;
            self.fresh = true;
        }
        if let Some((step, fingerprint)) = self.copy
            && (step, fingerprint) != (self.status.step, self.status.fingerprint)
        {
            self.status.step = step;
            self.status.fingerprint = fingerprint;
            self.status.last_commit = None;
            self.status.unapplied = None;
            out.push(Action::Restore { step, fingerprint });
        }
        // A state found changed is not the job's result, even after the last step: it
        // waits, idle, for a quorum that has it fetch the healthy replicas' state.
        let done = self.status.step >= self.total && !self.status.suspect;
        self.status.phase = if done { WorkerState::Done } else { WorkerState::Idle };
        self.report(now, out);
    }

    fn on_quorum(&mut self, now: Instant, q: Quorum, out: &mut Vec<Action>) {
        if q.epoch <= self.status.epoch {
            return;
        }
        if !self.fresh {
            // Whether this worker holds the quorum's state depends on its fingerprint.
            self.after_hash.quorum = Some(q);
            self.ask_hash(out);
            return;
        }
        self.status.epoch = q.epoch;
        self.ballots.clear();
        self.vote_deadline = None;
        // Each epoch's checkpoints have parts of their own.
        self.verified = 0;
        if q.rank_of(self.id).is_none() {
            self.quorum = None;
            self.go_idle(now, out);
            return;
        }
        let s = self.status.clone();
        match q.sync_of(self.id, &s) {
            Arrival::Holds => {
                // The quorum's state, held: whatever this worker found of it before.
                self.status.suspect = false;
                self.status.phase = WorkerState::Synced;
            }
            Arrival::RollsForward => {
                // Step 4: the others applied the sum this worker holds; apply it too.
                self.status.phase = WorkerState::Syncing;
                self.quorum = Some(q);
                self.report(now, out);
                out.push(self.apply(s.step, None));
                return;
            }
            Arrival::Fetches => {
                self.status.phase = WorkerState::Syncing;
                self.status.unapplied = None;
                out.extend(fetch_from(&q, self.id));
            }
            Arrival::Loads => {
                self.status.phase = WorkerState::Syncing;
                self.status.unapplied = None;
                out.push(Action::Load { epoch: q.epoch, step: q.step });
            }
            Arrival::Replays => {
                self.status.phase = WorkerState::Syncing;
                let group = q.replay_of(self.id).expect("a worker that replays has a place in a replay");
                // A helper keeps its own stage's state, and the sum it holds of it.
                if group.place_of(self.id).is_some_and(|(stage, _)| stage == q.stage_of(self.id)) {
                    self.status.unapplied = None;
                }
                out.push(Action::Replay { epoch: q.epoch, to: q.step, group });
            }
        }
        self.quorum = Some(q);
        self.report(now, out);
    }

    /// After a roll-forward: synced when the state is the quorum's, else fetch it.
    fn check_rolled(&mut self, now: Instant, out: &mut Vec<Action>) {
        let q = self.quorum.as_ref().expect("a syncing worker is a member");
        if q.sync_of(self.id, &self.status) == Arrival::Holds {
            self.status.phase = WorkerState::Synced;
            self.report(now, out);
        } else {
            // Rolled forward to a state that is not the sources': take theirs.
            out.extend(fetch_from(q, self.id));
        }
    }

    fn begin_step(&mut self, now: Instant, out: &mut Vec<Action>) {
        let q = self.quorum.as_ref().expect("a synced worker is a member");
        if self.status.step >= self.total {
            self.status.phase = WorkerState::Done;
            self.report(now, out);
            return;
        }
        let first = self.status.phase != WorkerState::Stepping;
        self.status.phase = WorkerState::Stepping;
        self.vote_deadline = None;
        let verify = self.verify();
        out.push(Action::Compute {
            epoch: q.epoch,
            step: self.status.step,
            rank: q.rank_of(self.id).expect("a member has a rank"),
            members: q.members.clone(),
            verify,
        });
        if first {
            self.report(now, out);
        }
    }

    /// The update of `step`, with the checks the job asks of it: a replica comparison when
    /// one is due (never on a roll-forward, whose result the quorum's fingerprint checks);
    /// under repair a hash after it and a check of the state just before it. (The check
    /// before the step keeps a changed state out of the sum; this one keeps a change made
    /// while the step computed out of the update, where only a replica comparison could
    /// find it, and an epoch of two has no majority to name the changed replica.)
    fn apply(&self, step: u64, agreed: Option<Saved>) -> Action {
        let rolling = self.status.phase == WorkerState::Syncing;
        let repair = self.checks.repair;
        Action::Apply {
            step,
            verify: self.verify(),
            hash: repair,
            compare: !rolling && self.checks.compare_after(step + 1, self.total),
            agreed,
        }
    }

    /// Under repair, the fingerprint the state must still have when the shell checks it
    /// (every update is hashed then, so the state held has a known one).
    fn verify(&self) -> Option<u64> {
        (self.checks.repair && self.fresh).then_some(self.status.fingerprint)
    }

    /// Step 5: apply the held sum when every member voted for it; leave the epoch when a
    /// member vetoed or voted for another sum.
    fn check_vote(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some(ballots) = self.ballots.get(&self.status.step) else { return };
        if ballots.iter().any(Option::is_none) {
            return;
        }
        let q = self.quorum.as_ref().expect("a voting worker is a member");
        let stages = q.member_stages();
        // The one commit rule of every runner: every ballot ok, and every digest the same
        // among the members of one stage (this worker's own ballot among them, so the same
        // as the sum it holds); in a data-parallel job, among all of them.
        let cast: Vec<Ballot> = ballots
            .iter()
            .flatten()
            .map(|&(ok, digest, saved)| Ballot { ok, digest, durable: saved.durable })
            .collect();
        if self.status.unapplied.is_some() && decide_in_groups(&cast, &stages) == Decision::Commit {
            // The checkpoints: each stage's committer (its member ranked first) commits
            // what every part of every stage has reached, and the parts are written while
            // it holds its stage root's lock. A checkpoint is verified when every member
            // wrote its part of the same step, and the parts of each stage from one state.
            let saved: Vec<Saved> = ballots.iter().flatten().map(|&(_, _, s)| s).collect();
            let one_step = saved.windows(2).all(|w| w[0].written == w[1].written);
            let one_state = |g: usize| {
                let prints = saved.iter().zip(&stages).filter(|(_, s)| **s == g).map(|(s, _)| s.print);
                prints.collect::<Vec<u64>>().windows(2).all(|w| w[0] == w[1])
            };
            if one_step && (0..q.stages.len()).all(one_state) {
                self.verified = self.verified.max(saved[0].written);
            }
            let mine = q.stage_of(self.id);
            let committer = stages.iter().position(|&s| s == mine).expect("this worker's stage has a member");
            let agreed = Saved {
                durable: crate::commit::durable_everywhere(&cast).min(self.verified),
                locked: saved[committer].locked,
                ..Saved::default()
            };
            out.push(self.apply(self.status.step, Some(agreed)));
        } else {
            self.status.unapplied = None;
            self.go_idle(now, out);
        }
    }
}

/// Work waiting for the fingerprint of the state held.
#[derive(Clone, Debug, Default)]
struct AfterHash {
    /// [`Action::Hash`] was emitted and not answered yet.
    asked: bool,
    report: bool,
    /// A roll-forward to check against the quorum's state.
    check_rolled: bool,
    /// A quorum to join.
    quorum: Option<Quorum>,
}

/// Worker `id` fetches its stage's state from the stage's sources (a stage whose members
/// roll forward has none: the coordinator makes only those members).
fn fetch_from(q: &Quorum, id: WorkerId) -> Option<Action> {
    let state = q.state_of(id);
    let fingerprint = state.fingerprint?;
    Some(Action::Fetch { epoch: q.epoch, step: q.step, fingerprint, sources: state.sources.clone() })
}
