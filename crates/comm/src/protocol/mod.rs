//! The step protocol of an elastic job (data-parallel, or pipelined: see
//! [pipelines](#pipelines)), as two state machines with no I/O:
//! a [`Worker`] per training process and one [`Coordinator`].
//!
//! Neither machine owns a socket, a thread or a clock. The caller (a TCP shell, or the
//! simulated network of [`crate::sim`]) feeds each one what happened, with the time, and
//! carries out the [`Action`]s it returns, in order: send a message, compute and all-reduce
//! a step's gradients, apply the held sum, fetch the state from live replicas. A worker has
//! one entry, [`Worker::step`], for every [`Event`] (raft's `step(message)`): messages, the
//! clock, and the shell's answer to each action. The worker decides every check and its
//! consequence (see [`Checks`]); a shell makes the checks an action names and reports what
//! it found, so the elastic trainer, the simulator and any other shell run one protocol.
//!
//! # The protocol, in order
//!
//! 1. **Report.** Every worker reports its [`Status`] to the coordinator at once on every
//!    change of phase, and every heartbeat interval otherwise: the step of the state it
//!    holds, that state's fingerprint, the digest of the sum that produced it, the digest of
//!    a sum it holds but has not applied, and the epoch it runs in. A report is also the
//!    heartbeat: a worker silent for `lost_after` is lost. Hashing the state costs a pass
//!    over it, so a shell may leave the fingerprint of an update unknown; the worker asks
//!    for it ([`Action::Hash`]) when it must report, check a roll-forward or join a
//!    quorum, and a job that steps without failures hashes its state once an epoch, not once
//!    a step.
//! 2. **Gather.** The coordinator gathers when the job starts, when a member is lost, when a
//!    member stops running its epoch (it aborted a step), and when a worker that is not a
//!    member reports (a replacement, or a worker joining a running job). It tells the
//!    members of the current epoch to stop ([`Msg::Reconfigure`]) and waits until every
//!    live worker is idle and has acknowledged the newest epoch it was put in (an older
//!    report may predate a roll-forward or a fetch), or `settle` has passed.
//! 3. **Form a quorum.** Among the idle workers, the newest step `M` wins. The workers
//!    holding step `M` with the [`majority`](crate::majority)'s fingerprint are the
//!    *sources*. Without a strict majority (two replicas at one step that disagree) nobody
//!    can tell which state is right, and the job stops, saying so. Every idle
//!    worker is a member, ranked by id; the micro-batches of a step are spread over the
//!    members by rank. The quorum ([`Quorum`]) gets an epoch above every epoch any worker
//!    has reported; a restarted coordinator's epochs carry its generation in their top
//!    bits, so that it never reuses one, even one still in flight.
//!    Fewer idle workers than `min_world` for longer than `quorum_timeout`: the job stops,
//!    and every worker is told why.
//! 4. **Synchronise.** A member already at `M` with the sources' fingerprint is synced. A
//!    member one step behind that holds the unapplied sum of step `M - 1`, with the digest
//!    the sources committed, **rolls forward**: it applies that sum, exactly as the others
//!    did. Any other member (a fresh replacement, a replica whose state disagrees) fetches
//!    the state from the sources. When every member reports itself synced, the
//!    coordinator starts the epoch ([`Msg::Start`]).
//! 5. **Step.** Each member computes the gradients of its micro-batches and all-reduces
//!    them with the members of its epoch; then it sends its ballot (the sum's digest, and
//!    whether it is finite) to every other member. A member applies the sum only when it
//!    holds every member's ballot and all agree. A lost peer, a ballot that does not arrive
//!    within `vote_timeout`, a disagreeing vote or a [`Msg::Reconfigure`] ends the epoch for
//!    the member: it goes idle, keeping the sum it did not apply, and reports (step 1).
//! 6. **Finish.** A member that has applied the last step reports itself done; when every
//!    member is done the coordinator tells each to finish. A worker that reports after the
//!    end is stopped.
//!
//! # Invariants
//!
//! - A member applies the sum of step `s` at most once, and only when every member of its
//!   epoch has cast a ballot for the same digest. So the members of an epoch are never more
//!   than one step apart, and the late ones hold the sum that the others applied: rolling
//!   forward is exact where an algebraic undo of the update would not be.
//! - Epochs only grow, and each is issued once: messages of an older epoch are ignored.
//! - Every quorum's members start from the same step and fingerprint.
//! - Survivors never go back to an older state: `M` is the newest step any of them holds.
//!   (Unless they keep copies: the baseline below.)
//!
//! # Pipelines
//!
//! In a pipeline job of `S` stages ([`Coordinator::with_stages`]) worker `id` holds stage
//! `id mod S` (the launcher's slots: replica `id / S`), and the replicas of each stage
//! hold one state. Everything above holds stage by stage:
//!
//! - the newest step `M` any trusted worker holds is the job's; each stage's sources are
//!   its own workers at `M` with the majority of that stage's fingerprints, and a member
//!   holds, rolls forward to or fetches its own stage's state ([`Quorum::sync_of`]);
//! - a stage none of whose live workers holds `M`, but whose workers one step behind hold
//!   the sum their stage agreed on (every holder was lost after the vote), rolls forward
//!   with no source ([`StageState::fingerprint`] is `None`); its other workers join the
//!   next epoch and fetch from them;
//! - a stage with neither has lost its state. The coordinator waits while a live worker of
//!   the stage may still report it (a stage with no live worker at all stops the job after
//!   `quorum_timeout`, naming it); then the stage's workers replay it from the newest
//!   checkpoint they can all load on the tensors its neighbours logged ([`Action::Replay`]),
//!   while the other stages keep theirs. Up to `helpers` workers share a replay
//!   ([`Coordinator::with_replay_helpers`]): the stage's own, and members of other stages
//!   that sum with them. A boundary whose logs a worker found it cannot read
//!   ([`Status::unlogged`]: not logged, or cut short) joins the stages on both sides: they
//!   go back to their newest common checkpoint and replay together, the tensors between
//!   them going live ([`StageReplay::with_next`]). A group of every stage, or a replay
//!   that cannot be done ([`Status::unreplayable`]), takes every stage back to its
//!   checkpoint of the newest step all stages have ([`StageState::restore`],
//!   [`Action::Load`]), the initial state at worst;
//! - a ballot carries the member's stage's sum: the vote commits when every ballot is
//!   finite and the ballots of each stage agree ([`decide_in_groups`](crate::commit::decide_in_groups));
//!   a replica check compares each stage's replicas with each other
//!   ([`compare_in_groups`](crate::majority::compare_in_groups)); each stage's first-ranked
//!   member commits its stage's checkpoints, once every part of every stage is durable.
//!
//! A data-parallel job is a pipeline of one stage.
//!
//! # The rollback baseline
//!
//! For comparison, a worker may also recover the way in-memory checkpointing does
//! (Elastic Horovod's commits, CheckFreq's snapshots): its shell copies the state every
//! few steps and tells the worker ([`Event::Copied`]); whenever the worker leaves an
//! epoch it puts that copy back ([`Action::Restore`]) before it reports. Every survivor
//! goes back to the last copy, the steps since are computed again, and a replacement
//! fetches the copy's state. The bits are the same; the time and the memory are not.

pub mod coordinator;
pub mod wire;
mod worker;

pub use coordinator::Coordinator;
pub use worker::Worker;

use std::time::Duration;

/// A worker's identity, stable across its restarts (the launcher's slot).
pub type WorkerId = u32;

/// Who sends or receives a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// The coordinator.
    Coordinator,
    /// A worker.
    Worker(WorkerId),
}

/// The clocks of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How often a worker reports when nothing changes, and how often the coordinator
    /// repeats a message that has not taken effect.
    pub heartbeat: Duration,
    /// Silence after which a worker is lost.
    pub lost_after: Duration,
    /// How long a member waits for the other members' ballots.
    pub vote_timeout: Duration,
    /// How long the coordinator waits for workers to go idle, or to arrive at the start.
    pub settle: Duration,
    /// How long the members of a new quorum may take to synchronise.
    pub sync_timeout: Duration,
    /// How long the job waits for `min_world` workers before it stops. A waiting worker
    /// that hears nothing from the coordinator for `sync_timeout + 2 * quorum_timeout`
    /// (longer than the coordinator ever stays silent to a live worker) stops by itself.
    pub quorum_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_millis(200),
            lost_after: Duration::from_secs(2),
            vote_timeout: Duration::from_secs(10),
            settle: Duration::from_secs(30),
            sync_timeout: Duration::from_secs(300),
            quorum_timeout: Duration::from_secs(60),
        }
    }
}

impl Timing {
    /// How long a running job waits after a newcomer for others before it takes them in,
    /// and after a loss for others before it forms the next quorum (a tenth of the loss
    /// bound: 200 ms at 2 s): changes that arrive together are one change.
    pub fn join_window(&self) -> Duration {
        self.lost_after / 10
    }

    /// A coordinator's clocks: a worker is lost after `lost_after` of silence, the first
    /// quorum waits at most `settle` for every worker, and the job stops after
    /// `quorum_timeout` with too few. Messages that have not taken effect are repeated
    /// every fifth of `lost_after`, between 20 and 200 ms.
    pub fn for_coordinator(lost_after: Duration, settle: Duration, quorum_timeout: Duration) -> Timing {
        Timing {
            heartbeat: (lost_after / 5).clamp(Duration::from_millis(20), Duration::from_millis(200)),
            lost_after,
            settle,
            quorum_timeout,
            ..Timing::default()
        }
    }
}

/// What a worker is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// In no epoch: waiting for a quorum.
    Idle,
    /// A member of a new epoch, rolling forward or fetching the state.
    Syncing,
    /// A member holding the epoch's state, waiting for the start.
    Synced,
    /// Computing, reducing or voting on a step.
    Stepping,
    /// Holding the state after the last step.
    Done,
    /// Told to finish: the job is over and this worker holds its final state.
    Finished,
    /// Told to stop: the job cannot go on.
    Stopped,
}

/// A worker's report to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Which process of the worker's slot reports: the launcher counts the processes it
    /// has started in a slot. A report of an older process (still in flight when its
    /// replacement started) is ignored.
    pub incarnation: u64,
    /// The phase.
    pub phase: WorkerState,
    /// The newest epoch the worker has heard of (0: none).
    pub epoch: u64,
    /// The step of the state it holds (0: the initial state).
    pub step: u64,
    /// That state's fingerprint.
    pub fingerprint: u64,
    /// The digest of the sum whose update produced the state (`None` at step 0 or after a
    /// fetch that did not say).
    pub last_commit: Option<u64>,
    /// The digest of the sum of step `step` that it holds and has not applied.
    pub unapplied: Option<u64>,
    /// The worker found its state changed since its commit (corrupted at rest, or
    /// outvoted by a replica check), until it holds a state it fetched: it cannot be a
    /// source.
    pub suspect: bool,
    /// The steps of its stage's committed checkpoints that it can load, newest first (a
    /// pipeline's worker says them: a stage that lost every replica goes back to one; see
    /// [`Event::Checkpoints`]).
    pub saved: Vec<u64>,
    /// The step it was asked to replay a stage to and could not (a checkpoint that does
    /// not load, sums that would not give the same bits): the next quorum takes the job
    /// back instead.
    pub unreplayable: Option<u64>,
    /// The pipeline boundaries whose logs it found it cannot replay from (bit `b`: the
    /// tensors between stages `b` and `b + 1`; not logged, or cut short): the stages on
    /// both sides of one replay together.
    pub unlogged: u64,
}

/// The coordinator's decision for an epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quorum {
    /// The epoch.
    pub epoch: u64,
    /// The members, in rank order.
    pub members: Vec<WorkerId>,
    /// The step every member starts the epoch from.
    pub step: u64,
    /// The state each pipeline stage's members start from, by stage: one entry in a
    /// data-parallel job (see [pipelines](self#pipelines)).
    pub stages: Vec<StageState>,
}

/// The state that the members of one pipeline stage start an epoch from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageState {
    /// The fingerprint of the stage's state at the quorum's step; `None` when no live
    /// worker of the stage holds that step, and its members (every one of them one step
    /// behind, holding the sum the others applied) roll forward to it.
    pub fingerprint: Option<u64>,
    /// The digest of the sum that produced it, for members that roll forward.
    pub commit: Option<u64>,
    /// Members of the stage that hold that state, for members that fetch it.
    pub sources: Vec<WorkerId>,
    /// The stage's members load its checkpoint of the quorum's step (or its initial
    /// state, at step 0): a stage of a pipeline that lost every worker holding the newest
    /// state takes the whole job back to the newest step of which every stage has a
    /// checkpoint.
    pub restore: bool,
    /// The stage is replayed from a checkpoint to the quorum's step: a pipeline stage
    /// that lost every worker holding the newest state, or one joined to such a stage by
    /// a boundary whose logs cannot be read, while the other stages keep theirs.
    pub replay: Option<StageReplay>,
}

impl StageState {
    /// A stage whose state no member holds yet: no fingerprint, commit or source, to be
    /// completed by its one way of getting there.
    pub fn unknown() -> StageState {
        StageState { fingerprint: None, commit: None, sources: Vec::new(), restore: false, replay: None }
    }
}

/// How a pipeline stage is replayed ([`StageState::replay`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageReplay {
    /// The step of the checkpoint the replay starts from (0: the initial state).
    pub from: u64,
    /// The workers that replay it, in order: the `k`-th of `r` computes the micro-batches
    /// `i` with `i mod r == k`, and they sum together. The stage's own members (each ends
    /// holding the state) and, sharing the work, members of stages that keep theirs.
    pub workers: Vec<WorkerId>,
    /// It replays together with the next stage: the tensors between them go live, from
    /// worker to worker, instead of being read from logs.
    pub with_next: bool,
}

/// The stages that replay together, as the members that replay one see them
/// ([`Quorum::replay_of`], [`Action::Replay`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayGroup {
    /// The step of the checkpoints the stages start from.
    pub from: u64,
    /// The first stage of the group.
    pub first: usize,
    /// The workers that replay each stage of the group, in order (see
    /// [`StageReplay::workers`]).
    pub workers: Vec<Vec<WorkerId>>,
}

impl ReplayGroup {
    /// The stages of the group.
    pub fn stages(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.workers.len()
    }

    /// The stage worker `id` replays, and its place among that stage's workers.
    pub fn place_of(&self, id: WorkerId) -> Option<(usize, usize)> {
        self.workers.iter().enumerate().find_map(|(i, w)| Some((self.first + i, w.iter().position(|&x| x == id)?)))
    }

    /// Every worker of the replay, once each, stage by stage: the ranks of its mesh.
    pub fn participants(&self) -> Vec<WorkerId> {
        let mut all: Vec<WorkerId> = Vec::new();
        for &w in self.workers.iter().flatten() {
            if !all.contains(&w) {
                all.push(w);
            }
        }
        all
    }
}

/// How a member of a quorum gets to the quorum's state ([`Quorum::sync_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// It holds it.
    Holds,
    /// It is one step behind holding the sum that the sources applied: it applies it.
    RollsForward,
    /// It fetches the state from the sources of its stage.
    Fetches,
    /// It loads its stage's checkpoint of the quorum's step.
    Loads,
    /// It replays a stage from a checkpoint to the quorum's step: its own, or another
    /// whose replay it shares.
    Replays,
}

impl Quorum {
    /// The quorum of a data-parallel job (one stage): every member starts from the state
    /// of `step` with `fingerprint`, produced by the sum `commit`, held by `sources`.
    pub fn of_replicas(
        (epoch, members): (u64, Vec<WorkerId>),
        (step, fingerprint, commit): (u64, u64, Option<u64>),
        sources: Vec<WorkerId>,
    ) -> Quorum {
        let state = StageState { fingerprint: Some(fingerprint), commit, sources, restore: false, replay: None };
        Quorum { epoch, members, step, stages: vec![state] }
    }

    /// The rank of `id` in the epoch.
    pub fn rank_of(&self, id: WorkerId) -> Option<usize> {
        self.members.iter().position(|&m| m == id)
    }

    /// The pipeline stage worker `id` holds: `id mod stages`.
    pub fn stage_of(&self, id: WorkerId) -> usize {
        stage_of(id, self.stages.len())
    }

    /// The state worker `id`'s stage starts the epoch from.
    pub fn state_of(&self, id: WorkerId) -> &StageState {
        &self.stages[self.stage_of(id)]
    }

    /// Each member's stage, in rank order.
    pub fn member_stages(&self) -> Vec<usize> {
        self.members.iter().map(|&m| self.stage_of(m)).collect()
    }

    /// The replay worker `id` takes part in, if any: the stages that replay together with
    /// the one it replays (its own, or one it helps with).
    pub fn replay_of(&self, id: WorkerId) -> Option<ReplayGroup> {
        let stage = self.stages.iter().position(|s| s.replay.as_ref().is_some_and(|r| r.workers.contains(&id)))?;
        let joined = |s: usize| self.stages[s].replay.as_ref().is_some_and(|r| r.with_next);
        let mut first = stage;
        while first > 0 && joined(first - 1) {
            first -= 1;
        }
        let mut last = stage;
        while joined(last) && last + 1 < self.stages.len() {
            last += 1;
        }
        let replays: Vec<&StageReplay> = self.stages[first..=last].iter().filter_map(|s| s.replay.as_ref()).collect();
        Some(ReplayGroup { from: replays[0].from, first, workers: replays.iter().map(|r| r.workers.clone()).collect() })
    }

    /// How worker `id`, whose last report is `s`, gets to the quorum's state. (A worker
    /// that replays says so until the epoch starts: the coordinator counts it synced once
    /// it reports the quorum's step.)
    pub fn sync_of(&self, id: WorkerId, s: &Status) -> Arrival {
        let state = self.state_of(id);
        if self.replay_of(id).is_some() {
            return Arrival::Replays;
        }
        if state.restore {
            // (A worker at that step holds the checkpoint's state: its stage's replicas
            // computed it alike, and a replacement loaded it as it started.)
            return if s.step == self.step && !s.suspect { Arrival::Holds } else { Arrival::Loads };
        }
        if s.step == self.step && state.fingerprint.is_none_or(|f| f == s.fingerprint) {
            Arrival::Holds
        } else if s.step + 1 == self.step && s.unapplied.is_some() && s.unapplied == state.commit {
            Arrival::RollsForward
        } else {
            Arrival::Fetches
        }
    }
}

/// The pipeline stage that worker `id` holds in a job of `stages` stages (at least one).
pub fn stage_of(id: WorkerId, stages: usize) -> usize {
    id as usize % stages.max(1)
}

/// The protocol's messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Worker to coordinator: its status (also the heartbeat).
    Report(Status),
    /// Coordinator to the members: the new epoch.
    Quorum(Quorum),
    /// Coordinator to the members: every member is synced; step.
    Start {
        /// The epoch.
        epoch: u64,
    },
    /// Coordinator to a worker running `epoch`: leave it and go idle.
    Reconfigure {
        /// The epoch to leave.
        epoch: u64,
    },
    /// Coordinator to the members: the job is complete.
    Finish,
    /// Coordinator to the workers: the job cannot go on.
    Stop {
        /// Why.
        reason: String,
    },
    /// Member to member: its vote on the sum of a step.
    Ballot {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// The sum is finite.
        ok: bool,
        /// The sum's digest.
        digest: u64,
        /// Where the member's part of the epoch's checkpoints stands.
        saved: Saved,
    },
}

/// Where a member's part of the epoch's checkpoints stands, carried in its ballot; in an
/// [`Action::Apply`] after a vote, what the members agreed on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// The newest step whose part this member has made durable (0: none). Agreed: the
    /// newest step the committer may commit: every member's part of it is durable, and
    /// every member wrote its part from the same state.
    pub durable: u64,
    /// This member holds the checkpoint root's lock (only the committer, the member ranked
    /// first, ever takes it). Agreed: the committer holds it, so the members write their
    /// parts.
    pub locked: bool,
    /// The step of the newest part this member wrote in the epoch (0: none).
    pub written: u64,
    /// The fingerprint of the state it wrote that part from. A checkpoint whose parts
    /// were written from different states (a replica corrupted since the last replica
    /// check) is never committed: it would load as valid and not be the job's state.
    pub print: u64,
}

/// The checks a job asks of its workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// Compare the replicas' states after every `every` updates (0: never), and always
    /// after the last.
    pub every: u64,
    /// Repair a divergence (`--on-divergence repair`) instead of ending the job with it:
    /// the state is hashed after every update and checked at rest before the next step
    /// (and, in an epoch of two, whose replica check has no majority, just before the
    /// update); a replica whose state changed, or that a replica check outvotes, fetches
    /// the healthy replicas' state.
    pub repair: bool,
}

impl Checks {
    /// Whether the replicas are compared after the update that makes the state `done` in
    /// a job of `total` steps.
    pub fn compare_after(&self, done: u64, total: u64) -> bool {
        (self.every > 0 && done.is_multiple_of(self.every)) || done == total
    }
}

/// What happened to a worker: the one input of [`Worker::step`]. The shell hands each
/// answer to an action as soon as it has it, and everything else as it happens, between
/// actions: never while it is carrying one out (a peer lost during an update is heard
/// once the update's answer is in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message arrived (from the coordinator, or a member's ballot).
    Message {
        /// From whom.
        from: Node,
        /// What.
        msg: Msg,
    },
    /// Time passed (at least every half heartbeat).
    Tick,
    /// The answer to [`Action::Compute`]: `Some((finite, digest))` of the sum, or `None`
    /// when the mesh or the all-reduce failed; with where this member's checkpoint part
    /// stands, for its ballot.
    Computed {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// The sum's check.
        sum: Option<(bool, u64)>,
        /// This member's checkpoint part.
        saved: Saved,
    },
    /// The vote's collective failed (a member was lost, or the epoch was aborted).
    VoteFailed {
        /// The epoch.
        epoch: u64,
    },
    /// The answer to [`Action::Apply`]: the update of `step` is applied; the state has
    /// `fingerprint` when the action asked for it (`hash`).
    Applied {
        /// The step whose sum was applied.
        step: u64,
        /// The new state's fingerprint, if taken.
        fingerprint: Option<u64>,
    },
    /// The answer to [`Action::Apply`] with `compare`: the update is applied, the state
    /// has `fingerprint`, and the replica check gathered `prints`, every member's in rank
    /// order (`None`: the gather failed).
    Compared {
        /// The step whose sum was applied.
        step: u64,
        /// The new state's fingerprint.
        fingerprint: u64,
        /// The members' fingerprints, in rank order.
        prints: Option<Vec<u64>>,
    },
    /// The answer to an action that asked to `verify` the state: it no longer has the
    /// fingerprint it was committed with; it has `fingerprint` (corrupted at rest).
    Changed {
        /// What the state has now.
        fingerprint: u64,
    },
    /// The answer to [`Action::Hash`].
    Hashed {
        /// The state's fingerprint.
        fingerprint: u64,
    },
    /// The answer to [`Action::Fetch`]: `Some((step, fingerprint))` of what the state now
    /// is, or `None` when the fetch failed and left it untouched.
    Fetched {
        /// The epoch of the fetch.
        epoch: u64,
        /// What the state is now.
        state: Option<(u64, u64)>,
    },
    /// The shell copied the state, of `step` with `fingerprint` (the rollback baseline):
    /// from now on leaving an epoch puts this copy back.
    Copied {
        /// The copy's step.
        step: u64,
        /// Its fingerprint.
        fingerprint: u64,
    },
    /// The connection to another worker dropped.
    PeerLost(WorkerId),
    /// The steps of the committed checkpoints of this worker's stage that it can load,
    /// as the shell last listed them (newest first): its reports say them.
    Checkpoints {
        /// The steps.
        steps: Vec<u64>,
    },
    /// The answer to [`Action::Replay`]: `Ok((step, fingerprint))` of the state this
    /// worker holds now (the stage replayed, or its own, untouched, after helping with
    /// another's), or why the replay was not done (the state is then as before).
    Replayed {
        /// The epoch of the replay.
        epoch: u64,
        /// What the state is now.
        state: Result<(u64, u64), ReplayFailure>,
    },
    /// The answer to [`Action::Load`]: `Some((step, fingerprint))` of the state loaded,
    /// or `None` when it could not be loaded (the state is then as before).
    Loaded {
        /// The epoch of the load.
        epoch: u64,
        /// What the state is now.
        state: Option<(u64, u64)>,
    },
}

/// Why a replay was not done ([`Event::Replayed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayFailure {
    /// A worker of the replay was lost, or the epoch ended: the next quorum tries again.
    Lost,
    /// The logs of these boundaries (bit `b`: between stages `b` and `b + 1`) cannot be
    /// read: the next quorum replays the stages on both sides together.
    Unlogged(u64),
    /// It cannot be done (a checkpoint that does not load, sums that would not give the
    /// same bits): the next quorum takes the job back to a checkpoint.
    Impossible,
}

/// What the caller of a machine must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a message.
    Send {
        /// To whom.
        to: Node,
        /// What.
        msg: Msg,
    },
    /// Worker: cast this worker's ballot for `step` to the other members `to`. The shell
    /// carries every member's ballot to every other at once (one collective over the
    /// epoch's mesh) and hands each it receives to [`Worker::step`] as a
    /// [`Msg::Ballot`] from that member, or [`Event::VoteFailed`].
    Vote {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// Whether this worker's sum is finite.
        ok: bool,
        /// Its sum's digest.
        digest: u64,
        /// Its checkpoint part.
        saved: Saved,
        /// The other members, in rank order.
        to: Vec<WorkerId>,
    },
    /// Worker: compute the gradients of the micro-batches `i` with `i mod world == rank`
    /// for `step`, all-reduce them with `members`, and answer with [`Event::Computed`].
    /// With `verify`, first check that the state still has that fingerprint (the one it
    /// was committed with), and answer [`Event::Changed`] instead if not.
    Compute {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// This worker's rank.
        rank: usize,
        /// The members, in rank order.
        members: Vec<WorkerId>,
        /// The fingerprint the state must still have.
        verify: Option<u64>,
    },
    /// Worker: apply the sum held for `step` to the state, and answer with
    /// [`Event::Applied`] (or [`Event::Compared`] with `compare`).
    Apply {
        /// The step.
        step: u64,
        /// Just before the update, check that the state still has this fingerprint, and
        /// answer [`Event::Changed`] without updating if not.
        verify: Option<u64>,
        /// Hash the state after the update.
        hash: bool,
        /// After the update, gather every member's fingerprint over the epoch's mesh.
        compare: bool,
        /// After a vote: what the members' ballots agreed on of the epoch's checkpoints
        /// (the committer commits through `durable`; the members write their parts of
        /// the checkpoints to come only when `locked`).
        agreed: Option<Saved>,
    },
    /// Worker: fetch the state at `step` from `sources`, check it against `fingerprint`,
    /// and answer with [`Event::Fetched`].
    Fetch {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// The fingerprint the state must have.
        fingerprint: u64,
        /// Who holds it.
        sources: Vec<WorkerId>,
    },
    /// Worker: load this worker's stage's checkpoint of `step` (its initial state at step
    /// 0), and answer with [`Event::Loaded`].
    Load {
        /// The epoch.
        epoch: u64,
        /// The checkpoint's step.
        step: u64,
    },
    /// Worker: replay its place of `group` (see [`ReplayGroup::place_of`]) from the
    /// stage's checkpoint of `group.from` (its initial state at 0) to step `to`, with the
    /// group's other workers: the tensors at the group's edges come from the neighbours'
    /// logs, those inside it from the workers replaying the next and previous stages, and
    /// each stage's workers sum together. A worker of the replayed stage keeps the state
    /// replayed; a helper drops it. Answer with [`Event::Replayed`].
    Replay {
        /// The epoch.
        epoch: u64,
        /// The step to replay to.
        to: u64,
        /// Who replays what.
        group: ReplayGroup,
    },
    /// Worker: hash the state held now, and answer with [`Event::Hashed`] at once,
    /// carrying out what it returns before any action queued after this one.
    Hash,
    /// Worker: put back the copy of the state kept at `step` (see [`Event::Copied`]);
    /// it has `fingerprint`. No answer is needed.
    Restore {
        /// The step of the copy.
        step: u64,
        /// Its fingerprint.
        fingerprint: u64,
    },
    /// Worker: the job is complete; the state held is its result.
    Finished,
    /// Worker: the job cannot go on.
    Stopped {
        /// Why.
        reason: String,
    },
    /// Worker: a replica check found the members `outvoted` holding another state than a
    /// strict majority after the update of step `step - 1`; they fetch the majority's
    /// state in the next epoch. Record it; no answer is needed.
    Repair {
        /// The step the states are at.
        step: u64,
        /// The members outvoted.
        outvoted: Vec<WorkerId>,
    },
    /// Worker: the replicas' states diverged after the update of step `step - 1`, and the
    /// job does not repair them (or cannot tell who is right): end with that error, once
    /// every member holds the verdict.
    Diverged {
        /// The step the states are at.
        step: u64,
        /// The members outvoted (every member when there is no strict majority).
        outvoted: Vec<WorkerId>,
    },
}

fn send(to: Node, msg: Msg) -> Action {
    Action::Send { to, msg }
}
