//! The step protocol of an elastic data-parallel job, as two state machines with no I/O:
//! a [`Worker`] per training process and one [`Coordinator`].
//!
//! Neither machine owns a socket, a thread or a clock. The caller (a TCP shell, or the
//! simulated network of [`crate::sim`]) feeds each one what happened, with the time, and
//! carries out the [`Action`]s it returns, in order: send a message, compute and all-reduce
//! a step's gradients, apply the held sum, fetch the state from live replicas.
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
//!    *sources* (without a strict majority, those agreeing with the lowest id). Every idle
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
//! # The rollback baseline
//!
//! For comparison, a worker may also recover the way in-memory checkpointing does
//! (Elastic Horovod's commits, CheckFreq's snapshots): its shell copies the state every
//! few steps and tells the worker ([`Worker::keep_copy`]); whenever the worker leaves an
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
    /// The fingerprint of the state at that step.
    pub fingerprint: u64,
    /// The digest of the sum that produced it, for members that roll forward.
    pub commit: Option<u64>,
    /// Members that hold the state, for members that fetch it.
    pub sources: Vec<WorkerId>,
}

impl Quorum {
    /// The rank of `id` in the epoch.
    pub fn rank_of(&self, id: WorkerId) -> Option<usize> {
        self.members.iter().position(|&m| m == id)
    }
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
    },
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
    /// epoch's mesh) and hands each it receives to [`Worker::on_message`] as a
    /// [`Msg::Ballot`] from that member.
    Vote {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// Whether this worker's sum is finite.
        ok: bool,
        /// Its sum's digest.
        digest: u64,
        /// The other members, in rank order.
        to: Vec<WorkerId>,
    },
    /// Worker: compute the gradients of the micro-batches `i` with `i mod world == rank`
    /// for `step`, all-reduce them with `members`, and answer with
    /// [`Worker::on_reduced`].
    Compute {
        /// The epoch.
        epoch: u64,
        /// The step.
        step: u64,
        /// This worker's rank.
        rank: usize,
        /// The members, in rank order.
        members: Vec<WorkerId>,
    },
    /// Worker: apply the sum held for `step` to the state, and answer with
    /// [`Worker::on_applied`].
    Apply {
        /// The step.
        step: u64,
    },
    /// Worker: fetch the state at `step` from `sources`, check it against `fingerprint`,
    /// and answer with [`Worker::on_fetched`].
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
    /// Worker: hash the state held now, and answer with [`Worker::on_hashed`] at once,
    /// carrying out what it returns before any action queued after this one.
    Hash,
    /// Worker: put back the copy of the state kept at `step` (see [`Worker::keep_copy`]);
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

/// What a replica check after an update found: the shell compares the members'
/// fingerprints over the epoch's mesh with the one majority rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compared {
    /// Every member holds the same state.
    Agree,
    /// The check failed: this member was lost during it.
    Lost(WorkerId),
    /// The members `outvoted` hold another state than the others; `majority` says whether
    /// the others are a strict majority (otherwise every member is outvoted).
    Diverged {
        /// The members to distrust.
        outvoted: Vec<WorkerId>,
        /// Whether the rest are a strict majority, so that repair is safe.
        majority: bool,
    },
}

fn send(to: Node, msg: Msg) -> Action {
    Action::Send { to, msg }
}
