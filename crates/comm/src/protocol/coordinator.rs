//! The coordinator's side of the step protocol (steps 2, 3, 4 and 6 of [`super`]).
//!
//! Everything it knows comes from the workers' reports, so a coordinator restarted with
//! no memory rebuilds the membership from the next round of reports: it starts by
//! gathering, and numbers its first epoch above every epoch reported to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Action, Arrival, Msg, Node, Quorum, StageReplay, StageState, Status, Timing, WorkerId, WorkerState, send};

/// The newest step, no newer than `newest`, in every one of the `lists` of checkpoint
/// steps (0, the initial state, at worst).
fn newest_common<'a>(lists: impl Iterator<Item = &'a [u64]>, newest: u64) -> u64 {
    let mut common: Option<Vec<u64>> = None;
    for list in lists {
        let steps: Vec<u64> = list.iter().copied().filter(|&s| s <= newest).collect();
        common = Some(match common {
            None => steps,
            Some(c) => c.into_iter().filter(|s| steps.contains(s)).collect(),
        });
    }
    common.and_then(|c| c.into_iter().max()).unwrap_or(0)
}

/// A quorum's step, members and the state each stage starts from.
type Formed = (u64, Vec<WorkerId>, Vec<StageState>);

/// What the coordinator can do with the workers ready now ([`Coordinator::plan`]).
enum Plan {
    /// Form this quorum.
    Form(u64, Vec<WorkerId>, Vec<StageState>),
    /// Wait for more workers (until the quorum timeout; then stop, saying why).
    Wait(String),
    /// The job cannot go on.
    Stop(String),
}

/// What the coordinator is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for the workers to go idle before forming a quorum.
    Gathering {
        /// Since when.
        since: Instant,
    },
    /// A quorum is formed; waiting for its members to synchronise.
    Syncing {
        /// Since when.
        since: Instant,
    },
    /// The members are stepping.
    Running,
    /// Every member holds the final state.
    Finished,
    /// The job cannot go on.
    Stopped {
        /// Why.
        reason: String,
    },
}

#[derive(Clone, Debug)]
struct Seen {
    status: Status,
    last: Instant,
    lost: bool,
    /// When a message that has not yet taken effect was last repeated to this worker.
    nudged: Option<Instant>,
    /// The newest epoch this coordinator has put the worker in: until the worker reports
    /// that epoch or a newer one, its reported state may be stale.
    sent: u64,
}

/// The process that holds a worker's slot: the newest admitted, told apart from an older
/// one by its incarnation or, where both have the same (two processes started by hand
/// with one `--rank`), by the address it listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    incarnation: u64,
    addr: SocketAddr,
    /// When it was admitted or last reported.
    heard: Instant,
    /// Its connection closed.
    closed: bool,
}

impl Holder {
    fn lost(&self, now: Instant, lost_after: Duration) -> bool {
        self.closed || now.saturating_duration_since(self.heard) > lost_after
    }
}

/// Whether a process that connects for a slot may have it ([`Coordinator::admit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It holds the slot now; when it took the slot from another process (`superseded`),
    /// that process must be told to stop, and its connection closed.
    Admit {
        /// The process it replaced, if another one held the slot.
        superseded: Option<SocketAddr>,
    },
    /// The slot belongs to another process: tell this one why ([`Msg::Stop`]) and close
    /// its connection; it must exit.
    Refuse {
        /// Why.
        reason: String,
    },
}

/// The coordinator's protocol state.
#[derive(Clone, Debug)]
pub struct Coordinator {
    timing: Timing,
    expected: usize,
    min_world: usize,
    /// The pipeline stages of the job (1: data-parallel).
    stages: usize,
    /// Workers that share the replay of a stage, at most.
    helpers: usize,
    workers: BTreeMap<WorkerId, Seen>,
    /// The newest epoch issued or reported.
    epoch: u64,
    stage: JobState,
    quorum: Option<Quorum>,
    formed: bool,
    holders: BTreeMap<WorkerId, Holder>,
    /// Since when a worker outside the running epoch waits to join it.
    newcomers_since: Option<Instant>,
    /// A running epoch ended by a loss: the next quorum forms no sooner than this, so that
    /// the workers of one node, whose losses arrive moments apart, leave in one change.
    quiet_until: Option<Instant>,
}

impl Coordinator {
    /// A coordinator that forms the first quorum when `expected` workers are idle (or
    /// after `settle`), and stops the job when fewer than `min_world` remain.
    ///
    /// `generation` counts the coordinator processes of the job (the launcher's restarts
    /// of it): epochs carry it in their top 24 bits, so that every epoch of a restarted
    /// coordinator is newer than any of its predecessor's, including those still in
    /// flight that no worker has reported.
    pub fn new(generation: u64, expected: usize, min_world: usize, timing: Timing, now: Instant) -> Coordinator {
        Coordinator {
            timing,
            expected,
            min_world: min_world.max(1),
            stages: 1,
            helpers: 1,
            workers: BTreeMap::new(),
            epoch: generation << 40,
            stage: JobState::Gathering { since: now },
            quorum: None,
            formed: false,
            holders: BTreeMap::new(),
            newcomers_since: None,
            quiet_until: None,
        }
    }

    /// The coordinator of a pipeline job of `stages` stages: worker `id` holds stage `id
    /// mod stages`, and each stage's replicas synchronise apart (see
    /// [pipelines](super#pipelines)).
    pub fn with_stages(mut self, stages: usize) -> Coordinator {
        self.stages = stages.max(1);
        self
    }

    /// A pipeline job whose lost stage is replayed by up to `helpers` workers: its own,
    /// and members of stages that keep their state, which sum with them (the job's sums
    /// must not depend on how its micro-batches are shared out: a reproducible reduce).
    pub fn with_replay_helpers(mut self, helpers: usize) -> Coordinator {
        self.helpers = helpers.max(1);
        self
    }

    /// A process connects for slot `id`, as process `incarnation` of it, listening at
    /// `addr`. The rules, in order:
    /// 1. a slot nobody holds is taken;
    /// 2. a newer incarnation (the launcher's replacement) takes the slot;
    /// 3. the holder itself (same incarnation and address) reconnecting is admitted;
    /// 4. any other process (an older incarnation, or another with the holder's: started
    ///    by hand with the same `--rank`, or by a node's launcher started again, which
    ///    counts its processes from 0) takes the slot only if the holder is lost; while
    ///    the holder is alive it is refused.
    ///
    /// So a stopped worker that wakes after its replacement took its slot is refused, told
    /// why, and exits, instead of taking the slot back and being displaced in turn.
    pub fn admit(&mut self, now: Instant, id: WorkerId, incarnation: u64, addr: SocketAddr) -> Admission {
        let new = Holder { incarnation, addr, heard: now, closed: false };
        let Some(&old) = self.holders.get(&id) else {
            self.holders.insert(id, new);
            return Admission::Admit { superseded: None };
        };
        let admit = incarnation > old.incarnation
            || (incarnation == old.incarnation && addr == old.addr)
            || old.lost(now, self.timing.lost_after);
        if !admit {
            let reason = if incarnation < old.incarnation {
                format!(
                    "worker {id}'s slot was given to a replacement (process {} of the slot, at {}); this process \
                     ({}) is superseded",
                    old.incarnation + 1,
                    old.addr,
                    incarnation + 1
                )
            } else {
                format!(
                    "worker {id}'s slot is held by a live process at {}; this process (at {addr}) is superseded, \
                     or a second process was started with the same rank",
                    old.addr
                )
            };
            return Admission::Refuse { reason };
        }
        self.holders.insert(id, new);
        Admission::Admit { superseded: (old.addr != addr).then_some(old.addr) }
    }

    /// The coordinator was not running for `paused` (its shell noticed, with an
    /// [`AwakeClock`](crate::awake::AwakeClock)): a coordinator that was not running
    /// cannot tell that others were silent, so the pause is credited to every worker's
    /// silence, and to the waits it times.
    pub fn paused(&mut self, paused: Duration) {
        for seen in self.workers.values_mut() {
            seen.last += paused;
        }
        for holder in self.holders.values_mut() {
            holder.heard += paused;
        }
        match &mut self.stage {
            JobState::Gathering { since } | JobState::Syncing { since } => *since += paused,
            JobState::Running | JobState::Finished | JobState::Stopped { .. } => {}
        }
    }

    /// What it is doing.
    pub fn stage(&self) -> &JobState {
        &self.stage
    }

    /// The current quorum.
    pub fn quorum(&self) -> Option<&Quorum> {
        self.quorum.as_ref()
    }

    /// A worker's last report, and whether it is lost.
    pub fn worker(&self, id: WorkerId) -> Option<(&Status, bool)> {
        self.workers.get(&id).map(|s| (&s.status, s.lost))
    }

    /// Every worker that has reported: its id, last report, and whether it is lost.
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &Status, bool)> {
        self.workers.iter().map(|(&id, s)| (id, &s.status, s.lost))
    }

    /// A message arrived from `from`.
    pub fn on_message(&mut self, now: Instant, from: Node, msg: Msg) -> Vec<Action> {
        if let (Node::Worker(id), Msg::Report(status)) = (from, msg) {
            if self.workers.get(&id).is_some_and(|s| s.status.incarnation > status.incarnation) {
                // From a process that has since been replaced.
                return self.drive(now);
            }
            if let Some(h) = self.holders.get_mut(&id).filter(|h| h.incarnation == status.incarnation) {
                h.heard = h.heard.max(now);
            }
            self.epoch = self.epoch.max(status.epoch);
            let seen = self.workers.entry(id).or_insert(Seen {
                status: status.clone(),
                last: now,
                lost: false,
                nudged: None,
                sent: 0,
            });
            if seen.status != status {
                seen.nudged = None;
            }
            seen.status = status;
            seen.last = now;
            seen.lost = false;
        }
        self.drive(now)
    }

    /// The connection to worker `id` closed: it is lost at once.
    pub fn on_disconnect(&mut self, now: Instant, id: WorkerId) -> Vec<Action> {
        if let Some(h) = self.holders.get_mut(&id) {
            h.closed = true;
        }
        if let Some(seen) = self.workers.get_mut(&id) {
            seen.lost = true;
        }
        self.drive(now)
    }

    /// Its owner stops the job (it knows that the job can never again have the workers
    /// it needs): every live worker is told why, as when too few remain.
    pub fn stop(&mut self, now: Instant, reason: String) -> Vec<Action> {
        if matches!(self.stage, JobState::Finished | JobState::Stopped { .. }) {
            return Vec::new();
        }
        self.stage = JobState::Stopped { reason };
        self.drive(now)
    }

    /// Time passed.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        self.drive(now)
    }

    fn live(&self) -> impl Iterator<Item = (WorkerId, &Seen)> {
        self.workers.iter().filter(|(_, s)| !s.lost).map(|(&id, s)| (id, s))
    }

    /// Repeats `msg` to `id` at most once a heartbeat.
    fn nudge(&mut self, now: Instant, id: WorkerId, msg: Msg, out: &mut Vec<Action>) {
        let every = self.timing.heartbeat;
        let Some(seen) = self.workers.get_mut(&id) else { return };
        if seen.nudged.is_none_or(|t| now >= t + every) {
            seen.nudged = Some(now);
            out.push(send(Node::Worker(id), msg));
        }
    }

    fn drive(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let lost_after = self.timing.lost_after;
        for seen in self.workers.values_mut() {
            if now.saturating_duration_since(seen.last) > lost_after {
                seen.lost = true;
            }
        }
        match self.stage.clone() {
            JobState::Gathering { since } => self.gathering(now, since, &mut out),
            JobState::Syncing { since } => self.syncing(now, since, &mut out),
            JobState::Running => self.running(now, &mut out),
            JobState::Finished => self.finished(now, &mut out),
            JobState::Stopped { reason } => self.stop_all(now, &reason, &mut out),
        }
        out
    }

    /// Step 6, after the finish was sent: repeat it until a member acknowledges; send the
    /// others away after that; go back to gathering if every holder of the final state
    /// died before acknowledging while another worker lives to train to the end.
    fn finished(&mut self, now: Instant, out: &mut Vec<Action>) {
        let members = self.quorum.as_ref().map(|q| q.members.clone()).unwrap_or_default();
        let acknowledged =
            members.iter().any(|m| self.workers.get(m).is_some_and(|s| s.status.phase == WorkerState::Finished));
        let waiting: Vec<(WorkerId, WorkerState, u64)> = self
            .live()
            .filter(|(_, s)| !matches!(s.status.phase, WorkerState::Finished | WorkerState::Stopped))
            .map(|(id, s)| (id, s.status.phase, s.status.epoch))
            .collect();
        if !acknowledged {
            let holders = members.iter().any(|m| self.workers.get(m).is_some_and(|s| !s.lost));
            if !holders && !waiting.is_empty() {
                return self.gather(now, out);
            }
        }
        for (id, phase, epoch) in waiting {
            let msg = match phase {
                WorkerState::Done if members.contains(&id) => Msg::Finish,
                _ if acknowledged => Msg::Stop { reason: "the job has finished without this worker".into() },
                WorkerState::Syncing | WorkerState::Synced | WorkerState::Stepping => Msg::Reconfigure { epoch },
                _ => continue,
            };
            self.nudge(now, id, msg, out);
        }
    }

    /// The job cannot go on: every worker is told why, now and until it stops.
    fn stop_job(&mut self, now: Instant, reason: String, out: &mut Vec<Action>) {
        self.stop_all(now, &reason, out);
        self.stage = JobState::Stopped { reason };
    }

    fn stop_all(&mut self, now: Instant, reason: &str, out: &mut Vec<Action>) {
        let waiting: Vec<WorkerId> =
            self.live().filter(|(_, s)| s.status.phase != WorkerState::Stopped).map(|(id, _)| id).collect();
        for id in waiting {
            self.nudge(now, id, Msg::Stop { reason: reason.to_owned() }, out);
        }
    }

    /// Step 2: ends the running epoch.
    fn gather(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.stage = JobState::Gathering { since: now };
        self.gathering(now, now, out);
    }

    fn gathering(&mut self, now: Instant, since: Instant, out: &mut Vec<Action>) {
        // Running an epoch, or not yet heard of the newest one it was put in (its report
        // may predate a roll-forward or a fetch): not ready.
        let current =
            |s: &Seen| s.status.epoch >= s.sent && matches!(s.status.phase, WorkerState::Idle | WorkerState::Done);
        let busy: Vec<(WorkerId, u64)> = self
            .live()
            .filter(|(_, s)| {
                !current(s) && s.status.phase != WorkerState::Finished && s.status.phase != WorkerState::Stopped
            })
            .map(|(id, s)| (id, s.status.epoch.max(s.sent)))
            .collect();
        for (id, epoch) in busy.iter().copied() {
            self.nudge(now, id, Msg::Reconfigure { epoch }, out);
        }
        if self.quiet_until.is_some_and(|t| now < t) {
            return;
        }
        let ready: Vec<WorkerId> = self.live().filter(|(_, s)| current(s)).map(|(id, _)| id).collect();
        let waited = now.saturating_duration_since(since);
        let all_here = busy.is_empty() && (self.formed || ready.len() >= self.expected);
        // A coordinator that took over a running job (its workers report epochs of an
        // earlier one) waits one loss bound for their reports, not for the job's size:
        // a worker alive reports within it, and one that does not is lost.
        let took_over = !self.formed && self.live().any(|(_, s)| s.status.epoch > 0);
        let settle = if took_over { self.timing.settle.min(self.timing.lost_after) } else { self.timing.settle };
        if !(all_here || waited >= settle) {
            return;
        }
        if ready.len() >= self.min_world {
            match self.plan(&ready) {
                Plan::Form(step, members, stages) => self.form(now, (step, members, stages), out),
                Plan::Wait(why) if waited >= self.timing.quorum_timeout => {
                    let reason = format!("{why}, after {:.1} s", waited.as_secs_f64());
                    self.stop_job(now, reason, out);
                }
                Plan::Wait(_) => {}
                Plan::Stop(reason) => self.stop_job(now, reason, out),
            }
        } else if waited >= self.timing.quorum_timeout {
            let reason = format!(
                "too few workers remain: {} ready, at least {} needed, after {:.1} s",
                ready.len(),
                self.min_world,
                waited.as_secs_f64()
            );
            self.stop_job(now, reason, out);
        }
    }

    /// Step 3: the newest state wins; in each stage, the [`majority`](crate::majority) of
    /// its fingerprints names the sources.
    fn form(&mut self, now: Instant, (step, members, stages): Formed, out: &mut Vec<Action>) {
        self.epoch += 1;
        let q = Quorum { epoch: self.epoch, members, step, stages };
        for &m in &q.members {
            if let Some(seen) = self.workers.get_mut(&m) {
                seen.nudged = Some(now);
                seen.sent = q.epoch;
            }
            out.push(send(Node::Worker(m), Msg::Quorum(q.clone())));
        }
        self.quorum = Some(q);
        self.formed = true;
        self.stage = JobState::Syncing { since: now };
    }

    /// The step of the quorum of the `ready` workers, its members (those of a stage that
    /// rolls forward without a source wait for the next epoch, unless they roll forward
    /// themselves) and the state each stage starts from; or why the job cannot go on.
    fn plan(&self, ready: &[WorkerId]) -> Plan {
        let status = |id: WorkerId| &self.workers[&id].status;
        // A worker that found its own state changed since its commit is no source: the
        // newest state wins among the others (a suspect ahead of them fetches theirs).
        let trusted: Vec<WorkerId> = ready.iter().copied().filter(|&id| !status(id).suspect).collect();
        let Some(step) = trusted.iter().map(|&id| status(id).step).max() else {
            return Plan::Stop(format!(
                "every replica's state was found changed since its commit (workers {ready:?}): none is left to \
                 repair them from; resume the job from its newest checkpoint"
            ));
        };
        let newest: Vec<WorkerId> = trusted.iter().copied().filter(|&id| status(id).step == step).collect();
        let mut states = Vec::with_capacity(self.stages);
        let mut left_out = Vec::new();
        let mut lost = Vec::new();
        for stage in 0..self.stages {
            let of_stage = |id: &WorkerId| super::stage_of(*id, self.stages) == stage;
            let holders: Vec<WorkerId> = newest.iter().copied().filter(of_stage).collect();
            let named = if self.stages > 1 { format!(" of stage {stage}") } else { String::new() };
            if holders.is_empty() {
                // Every worker of the stage that held step `M` was lost after the vote
                // (some worker applied its sum, so every ballot was cast and agreed): those
                // left one step behind with their stage's agreed sum roll forward, and the
                // stage's other workers join the next epoch, fetching from them.
                let behind: Vec<WorkerId> = trusted
                    .iter()
                    .copied()
                    .filter(|&id| of_stage(&id) && status(id).step + 1 == step && status(id).unapplied.is_some())
                    .collect();
                let sums: Vec<Option<u64>> = behind.iter().map(|&id| status(id).unapplied).collect();
                let rolling = crate::majority::dissenters(&sums).map(|d| {
                    behind.iter().enumerate().filter(|(i, _)| !d.contains(i)).map(|(_, &id)| id).collect::<Vec<_>>()
                });
                if let Some(rolling) = rolling.filter(|r| !r.is_empty()) {
                    left_out.extend(ready.iter().copied().filter(|id| of_stage(id) && !rolling.contains(id)));
                    let commit = status(rolling[0]).unapplied;
                    states.push(StageState { commit, ..StageState::unknown() });
                    continue;
                }
                let at: Vec<(WorkerId, u64)> =
                    ready.iter().filter(|id| of_stage(id)).map(|&id| (id, status(id).step)).collect();
                // A live worker of the stage that is not ready yet (busy, or not yet heard
                // by a coordinator that took over) may hold it.
                if at.is_empty() || self.live().any(|(id, _)| of_stage(&id) && !ready.contains(&id)) {
                    return Plan::Wait(format!("no worker{named} that holds step {step} is ready (ready: {at:?})"));
                }
                // The stage's state is lost: it is replayed (see `replays`).
                lost.push(stage);
                states.push(StageState::unknown());
                continue;
            }
            let fingerprints: Vec<u64> = holders.iter().map(|&id| status(id).fingerprint).collect();
            // Replicas at one step hold one state unless one was corrupted. Without a
            // strict majority (two replicas that disagree, neither of which found itself
            // changed) nobody can tell which state is right: going on with either could
            // end the job with other bits than a run that never failed, so it stops.
            let Some(dissenters) = crate::majority::dissenters(&fingerprints) else {
                let prints: Vec<String> = holders
                    .iter()
                    .zip(&fingerprints)
                    .map(|(id, f)| format!("worker {id}: {}", repro::fingerprint::hex(*f)))
                    .collect();
                return Plan::Stop(format!(
                    "the replicas{named} diverged at step {step} and no majority can tell which state is right \
                     ({})",
                    prints.join(", ")
                ));
            };
            let sources: Vec<WorkerId> =
                holders.iter().enumerate().filter(|(i, _)| !dissenters.contains(i)).map(|(_, &id)| id).collect();
            let (fingerprint, commit) = (status(sources[0]).fingerprint, status(sources[0]).last_commit);
            states.push(StageState { fingerprint: Some(fingerprint), commit, sources, ..StageState::unknown() });
        }
        if !lost.is_empty() {
            if let Some(back) = self.replays(ready, step, &lost, &mut states) {
                return back;
            }
            // The workers of a stage that replays all replay it, rolling forward or not.
            left_out.retain(|&id| states[super::stage_of(id, self.stages)].replay.is_none());
        }
        let members = ready.iter().copied().filter(|id| !left_out.contains(id)).collect();
        Plan::Form(step, members, states)
    }

    /// The replays of the `lost` stages of a pipeline whose newest step is `step`, into
    /// `states`: each lost stage with the stages joined to it by boundaries whose logs some
    /// `ready` worker could not read, from the newest checkpoint every worker of those
    /// stages can load; a lone stage's replay shared with members of stages that keep
    /// their state, up to `helpers`. Returns the plan that takes every stage back instead
    /// when the group would be the whole pipeline, or a worker could not replay.
    fn replays(&self, ready: &[WorkerId], step: u64, lost: &[usize], states: &mut [StageState]) -> Option<Plan> {
        let status = |id: WorkerId| &self.workers[&id].status;
        let of_stage = |stage: usize| -> Vec<WorkerId> {
            ready.iter().copied().filter(|&id| super::stage_of(id, self.stages) == stage).collect()
        };
        let unlogged = ready.iter().fold(0u64, |m, &id| m | status(id).unlogged);
        let cut = |b: usize| b < 64 && unlogged & (1 << b) != 0;
        let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
        for &stage in lost {
            let (mut first, mut last) = (stage, stage);
            while first > 0 && cut(first - 1) {
                first -= 1;
            }
            while last + 1 < self.stages && cut(last) {
                last += 1;
            }
            if !groups.contains(&(first..last + 1)) {
                groups.push(first..last + 1);
            }
        }
        let workers_of = |g: &std::ops::Range<usize>| g.clone().flat_map(of_stage).collect::<Vec<_>>();
        let impossible = groups.iter().flat_map(workers_of).any(|id| status(id).unreplayable == Some(step));
        if impossible || groups.iter().any(|g| g.len() == self.stages) {
            return Some(self.roll_back(ready, step));
        }
        // Members of the stages that keep their state, holding it, may help.
        let mut idle: Vec<WorkerId> = ready
            .iter()
            .copied()
            .filter(|&id| {
                let stage = super::stage_of(id, self.stages);
                !groups.iter().any(|g| g.contains(&stage))
                    && status(id).step == step
                    && states[stage].fingerprint.is_some_and(|f| f == status(id).fingerprint)
            })
            .collect();
        for g in &groups {
            let from = newest_common(workers_of(g).into_iter().map(|id| &status(id).saved[..]), step);
            for stage in g.clone() {
                let mut workers = of_stage(stage);
                if g.len() == 1 && workers.len() < self.helpers {
                    let take = (self.helpers - workers.len()).min(idle.len());
                    workers.extend(idle.drain(..take));
                }
                let with_next = stage + 1 < g.end;
                states[stage] =
                    StageState { replay: Some(StageReplay { from, workers, with_next }), ..StageState::unknown() };
            }
        }
        None
    }

    /// A pipeline that lost a stage's state (no live worker holds the newest step `M`, nor
    /// the sum to roll forward to it): every `ready` worker loads its stage's checkpoint of
    /// the newest step, no newer than `M`, of which every stage has one that some ready
    /// worker of the stage can load (the initial state, step 0, at worst).
    fn roll_back(&self, ready: &[WorkerId], newest: u64) -> Plan {
        let mut common: Option<Vec<u64>> = None;
        for stage in 0..self.stages {
            let mut steps: Vec<u64> = ready
                .iter()
                .filter(|&&id| super::stage_of(id, self.stages) == stage)
                .flat_map(|&id| self.workers[&id].status.saved.iter().copied())
                .filter(|&s| s <= newest)
                .collect();
            steps.push(0);
            common = Some(match common {
                None => steps,
                Some(c) => c.into_iter().filter(|s| steps.contains(s)).collect(),
            });
        }
        let step = common.and_then(|c| c.into_iter().max()).unwrap_or(0);
        let state = StageState { restore: true, ..StageState::unknown() };
        Plan::Form(step, ready.to_vec(), vec![state; self.stages])
    }

    /// Step 4: start when every member holds the quorum's state.
    fn syncing(&mut self, now: Instant, since: Instant, out: &mut Vec<Action>) {
        let q = self.quorum.clone().expect("syncing has a quorum");
        // (A worker that replayed holds the quorum's step: its own stage's state replayed,
        // or kept while it helped with another's.)
        let holds = |m: WorkerId, s: &Status| match q.sync_of(m, s) {
            Arrival::Holds => true,
            Arrival::Replays => s.step == q.step,
            _ => false,
        };
        let mut synced = 0;
        for &m in &q.members {
            let seen = &self.workers[&m];
            let s = &seen.status;
            if seen.lost || (s.epoch == q.epoch && matches!(s.phase, WorkerState::Idle | WorkerState::Stopped)) {
                self.quiet_until = Some(now + self.timing.join_window());
                return self.gather(now, out);
            }
            if s.epoch < q.epoch {
                self.nudge(now, m, Msg::Quorum(q.clone()), out);
            } else if s.epoch == q.epoch && s.phase == WorkerState::Synced && holds(m, s) {
                synced += 1;
            }
        }
        if synced == q.members.len() {
            for &m in &q.members {
                if let Some(seen) = self.workers.get_mut(&m) {
                    seen.nudged = Some(now);
                }
                out.push(send(Node::Worker(m), Msg::Start { epoch: q.epoch }));
            }
            self.stage = JobState::Running;
        } else if now.saturating_duration_since(since) >= self.timing.sync_timeout {
            self.gather(now, out);
        }
    }

    /// Steps 5 and 6: watch the members; end the epoch on a loss, an abort or a newcomer;
    /// finish when every member is done.
    fn running(&mut self, now: Instant, out: &mut Vec<Action>) {
        let q = self.quorum.clone().expect("running has a quorum");
        let mut done = 0;
        for &m in &q.members {
            let seen = &self.workers[&m];
            let s = &seen.status;
            if seen.lost || (s.epoch == q.epoch && matches!(s.phase, WorkerState::Idle | WorkerState::Stopped)) {
                self.quiet_until = Some(now + self.timing.join_window());
                return self.gather(now, out);
            }
            match s.phase {
                WorkerState::Synced if s.epoch == q.epoch => self.nudge(now, m, Msg::Start { epoch: q.epoch }, out),
                WorkerState::Done if s.epoch == q.epoch => done += 1,
                _ => {}
            }
        }
        // Newcomers join together: the epoch ends a join window after the first was seen,
        // so that the workers of a node started again (which come up within moments of each
        // other) form one epoch, not one each. The members step on meanwhile.
        let newcomer = self.live().any(|(id, s)| q.rank_of(id).is_none() && s.status.phase == WorkerState::Idle);
        if !newcomer {
            self.newcomers_since = None;
        } else if now.saturating_duration_since(*self.newcomers_since.get_or_insert(now)) >= self.timing.join_window() {
            self.newcomers_since = None;
            return self.gather(now, out);
        }
        let strays: Vec<(WorkerId, u64)> = self
            .live()
            .filter(|(id, s)| {
                q.rank_of(*id).is_none()
                    && matches!(s.status.phase, WorkerState::Syncing | WorkerState::Synced | WorkerState::Stepping)
            })
            .map(|(id, s)| (id, s.status.epoch))
            .collect();
        for (id, epoch) in strays {
            self.nudge(now, id, Msg::Reconfigure { epoch }, out);
        }
        if done == q.members.len() {
            for &m in &q.members {
                if let Some(seen) = self.workers.get_mut(&m) {
                    seen.nudged = Some(now);
                }
                out.push(send(Node::Worker(m), Msg::Finish));
            }
            self.stage = JobState::Finished;
        }
    }
}
