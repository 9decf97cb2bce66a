//! A seeded simulation of an elastic data-parallel job, for testing the step protocol
//! ([`crate::protocol`]) under failures: thousands of schedules a second, each replayable
//! from its seed.
//!
//! The simulation runs one [`Coordinator`] and a [`Worker`] per process on a simulated
//! clock, and plays the shells' part: it delivers messages with a random latency (so they
//! arrive out of order), drops some, cuts links, kills, hangs and restarts processes, and
//! carries out the workers' actions on a model of the training state:
//!
//! - the sum of step `s` is [`digest`]`(seed, s)` whoever computes it, as the
//!   `reproducible` reduction's is for any number of workers;
//! - applying it turns the fingerprint `f` into `mix(f, digest)`, so the final fingerprint
//!   equals [`reference()`] only if every step was applied exactly once, in order;
//! - an all-reduce completes, after the compute time, only if every member of the epoch
//!   joined it and all are alive and connected; otherwise it fails for those that joined,
//!   at once or after the collective's timeout;
//! - a fetch copies the state of a live, reachable source after the transfer time.
//!
//! [`run`] returns what became of every worker; the tests check that all survivors
//! finished with the reference fingerprint, or all stopped with a reason.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use repro::rng::Stream;

use crate::protocol::{
    Action, Checks, Coordinator, Event, Msg, Node, ReplayFailure, ReplayGroup, Saved, Timing, Worker, WorkerId,
    WorkerState,
};

/// A fault at a moment of simulated time.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The process of a worker dies (its sockets close); with `replace_after`, the launcher
    /// starts a fresh one in its slot that long after.
    Kill {
        /// When.
        at: Duration,
        /// Which.
        worker: WorkerId,
        /// The replacement's delay (`None`: no replacement).
        replace_after: Option<Duration>,
    },
    /// A worker's process stops (as with SIGSTOP) for `span` (`None`: for good); what is
    /// sent to it waits in its socket buffers.
    Hang {
        /// When.
        at: Duration,
        /// Which.
        worker: WorkerId,
        /// For how long.
        span: Option<Duration>,
    },
    /// The link between two processes loses every message for `span`.
    Cut {
        /// When.
        at: Duration,
        /// One end.
        a: Node,
        /// The other end.
        b: Node,
        /// For how long.
        span: Duration,
    },
    /// The coordinator's process dies and is started again, with no memory, `restart_after`
    /// later.
    KillCoordinator {
        /// When.
        at: Duration,
        /// The restart's delay.
        restart_after: Duration,
    },
    /// A new worker process joins the running job.
    Join {
        /// When.
        at: Duration,
        /// Its id.
        worker: WorkerId,
    },
    /// A worker's state changes at rest (a memory fault between steps): it no longer has
    /// the fingerprint it committed.
    Corrupt {
        /// When.
        at: Duration,
        /// Which.
        worker: WorkerId,
    },
    /// A worker's next update goes wrong (a fault inside the update): its state after it
    /// is not the other replicas'.
    CorruptUpdate {
        /// When.
        at: Duration,
        /// Which.
        worker: WorkerId,
    },
}

impl Fault {
    fn at(&self) -> Duration {
        match self {
            Fault::Kill { at, .. }
            | Fault::Hang { at, .. }
            | Fault::Cut { at, .. }
            | Fault::KillCoordinator { at, .. }
            | Fault::Join { at, .. }
            | Fault::Corrupt { at, .. }
            | Fault::CorruptUpdate { at, .. } => *at,
        }
    }
}

/// A simulated job and its faults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seed of the latencies, drops and choices of source.
    pub seed: u64,
    /// Workers at the start (ids `0..workers`).
    pub workers: u32,
    /// Steps of the job.
    pub steps: u64,
    /// The fewest workers the job may go on with.
    pub min_world: usize,
    /// The protocol's clocks.
    pub timing: Timing,
    /// One-way latency of a message, drawn uniformly from this range.
    pub latency: (Duration, Duration),
    /// Probability that a message is lost.
    pub drop: f64,
    /// Time to compute a step's gradients and all-reduce them.
    pub compute: Duration,
    /// Time to fetch the state from a source.
    pub transfer: Duration,
    /// How long an all-reduce waits for members that do not join it.
    pub collective_timeout: Duration,
    /// The faults.
    pub faults: Vec<Fault>,
    /// Simulated time after which the run is abandoned as stuck.
    pub limit: Duration,
    /// Keep a copy of the state every this many steps, and go back to it on leaving an
    /// epoch (the rollback baseline of [`crate::protocol`]).
    pub copy_every: Option<u64>,
    /// The replica checks and repair the job asks for (`--fingerprint-every`,
    /// `--on-divergence repair`).
    pub checks: Checks,
    /// Take a checkpoint after every this many steps (`None`: none); each member writes
    /// its part, durable `persist` after the update.
    pub checkpoint_every: Option<u64>,
    /// How long a part takes to become durable.
    pub persist: Duration,
    /// The pipeline stages (1: data-parallel): worker `id` holds stage `id mod stages`,
    /// whose state and sums are its own.
    pub stages: usize,
    /// A pipeline's stages log the tensors they send: a stage that lost its state can
    /// replay it from a checkpoint (otherwise a replay fails, and the job goes back).
    pub logged: bool,
    /// The boundaries not logged even so (bit `b`: between stages `b` and `b + 1`): the
    /// stages on both sides replay together.
    pub unlogged: u64,
    /// Workers that share a replay, at most ([`Coordinator::with_replay_helpers`]).
    pub helpers: usize,
    /// Print every action to standard error (for reading a failing schedule).
    pub trace: bool,
}

impl Config {
    /// A job of `workers` workers and `steps` steps with no fault, on clocks scaled for
    /// simulation (milliseconds).
    pub fn new(seed: u64, workers: u32, steps: u64) -> Config {
        Config {
            seed,
            workers,
            steps,
            min_world: 1,
            timing: Timing {
                heartbeat: Duration::from_millis(20),
                lost_after: Duration::from_millis(200),
                vote_timeout: Duration::from_millis(300),
                settle: Duration::from_millis(400),
                sync_timeout: Duration::from_millis(2000),
                quorum_timeout: Duration::from_millis(3000),
            },
            latency: (Duration::from_micros(100), Duration::from_millis(3)),
            drop: 0.0,
            compute: Duration::from_millis(10),
            transfer: Duration::from_millis(30),
            collective_timeout: Duration::from_millis(250),
            faults: Vec::new(),
            limit: Duration::from_secs(600),
            copy_every: None,
            checks: Checks::default(),
            checkpoint_every: None,
            persist: Duration::from_millis(15),
            stages: 1,
            logged: false,
            unlogged: 0,
            helpers: 1,
            trace: false,
        }
    }

    /// The same job under a random schedule of faults drawn from `seed`: up to two kills
    /// (each replaced or not), perhaps a hang, a cut link, a coordinator restart, a worker
    /// joining, and perhaps a lossy network; replica checks at a drawn interval, perhaps
    /// repair, perhaps checkpoints, and, where the job repairs, perhaps a state corrupted
    /// at rest. (Not a corrupted update: one whose replica check a loss cuts short may be
    /// the newest state the next quorum finds, and nothing then tells it from a healthy
    /// one; see `corrupted` in the tests for those on their own.)
    pub fn random(seed: u64, workers: u32, steps: u64) -> Config {
        let mut c = Config::new(seed, workers, steps);
        let mut r = Stream::for_purpose(seed, "sim.schedule", &[]);
        let span = (c.compute.as_micros() as u64 + 2_000) * steps;
        let at = |r: &mut Stream| Duration::from_micros(r.below(span.max(1)));
        let ms = |r: &mut Stream, lo: u64, hi: u64| Duration::from_millis(lo + r.below(hi - lo));
        for _ in 0..r.below(3) {
            let replace = r.below(10) < 7;
            let worker = r.below(u64::from(workers)) as u32;
            let replace_after = replace.then(|| ms(&mut r, 1, 300));
            c.faults.push(Fault::Kill { at: at(&mut r), worker, replace_after });
        }
        if r.below(10) < 2 {
            let span = (r.below(10) < 7).then(|| ms(&mut r, 1, 600));
            c.faults.push(Fault::Hang { at: at(&mut r), worker: r.below(u64::from(workers)) as u32, span });
        }
        if r.below(10) < 3 {
            let a = Node::Worker(r.below(u64::from(workers)) as u32);
            let b = if r.below(3) == 0 { Node::Coordinator } else { Node::Worker(r.below(u64::from(workers)) as u32) };
            if a != b {
                c.faults.push(Fault::Cut { at: at(&mut r), a, b, span: ms(&mut r, 1, 500) });
            }
        }
        if r.below(10) < 3 {
            c.faults.push(Fault::KillCoordinator { at: at(&mut r), restart_after: ms(&mut r, 1, 500) });
        }
        if r.below(10) < 2 {
            c.faults.push(Fault::Join { at: at(&mut r), worker: workers + 1 });
        }
        if r.below(10) < 3 {
            c.drop = 0.01;
        }
        // The checks, the checkpoints and silent corruption, in the same schedule.
        c.checks = Checks { every: r.below(4), repair: r.below(2) == 0 };
        c.checkpoint_every = (r.below(2) == 0).then(|| 2 + r.below(3));
        if c.checks.repair && r.below(10) < 3 {
            c.faults.push(Fault::Corrupt { at: at(&mut r), worker: r.below(u64::from(workers)) as u32 });
        }
        c
    }
}

/// How a worker ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Told to finish, holding the state of `step` with `fingerprint`.
    Finished {
        /// The step of its state.
        step: u64,
        /// Its fingerprint.
        fingerprint: u64,
    },
    /// Told to stop, or stopped itself.
    Stopped(String),
    /// Killed, or hung for good.
    Dead,
    /// Still running when the simulation ended (a stuck run).
    Running(WorkerState),
}

/// What a simulated run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// Every worker process that ever ran (a slot restarted twice appears three times), in
    /// the order they started.
    pub workers: Vec<(WorkerId, End)>,
    /// Simulated time at the end.
    pub time: Duration,
    /// The run ended with every survivor finished or stopped (not at the time limit).
    pub settled: bool,
    /// Updates applied, by steps and by rolling forward.
    pub applied: u64,
    /// Of those, applied when rolling forward.
    pub rolled_forward: u64,
    /// States fetched from sources.
    pub fetched: u64,
    /// Fetches that took a worker back to an older step than it held (a rollback; the
    /// protocol promises none).
    pub rolled_back: u64,
    /// Copies put back (the rollback baseline).
    pub restored: u64,
    /// Fingerprints the workers asked for (of updates that were not hashed).
    pub hashed: u64,
    /// Quorums the coordinators formed (distinct epochs sent).
    pub epochs: u64,
    /// Messages sent, and of those lost.
    pub messages: (u64, u64),
    /// The checkpoints committed, `(step, stage, fingerprint)`: each stage's once every
    /// member's part of the step (of every stage) was durable, with the fingerprint of the
    /// stage's state its parts hold.
    pub checkpoints: Vec<(u64, usize, u64)>,
    /// Replica checks that outvoted a member for repair.
    pub repairs: u64,
    /// Stage checkpoints loaded (a pipeline that lost a stage's state went back).
    pub loaded: u64,
    /// Stages replayed from a checkpoint on their neighbours' logs, by each worker that
    /// keeps the state.
    pub replayed: u64,
    /// Of those, replayed together with another stage (a boundary between them not logged).
    pub replayed_together: u64,
    /// Replays a worker of another stage helped with.
    pub helped: u64,
}

/// The sum of step `step`, as every worker computes it.
pub fn digest(seed: u64, step: u64) -> u64 {
    mix(seed ^ 0x5eed_5eed_5eed_5eed, step)
}

/// The seed of pipeline stage `stage`'s states and sums (stage 0's is the job's: a
/// data-parallel job is a pipeline of one stage).
pub fn stage_seed(seed: u64, stage: usize) -> u64 {
    if stage == 0 { seed } else { mix(seed, stage as u64) }
}

/// Stage `stage`'s state after `steps` steps, each applied once, in order.
pub fn stage_reference(seed: u64, stage: usize, steps: u64) -> u64 {
    reference(stage_seed(seed, stage), steps)
}

/// The fingerprint of the initial state.
pub fn initial(seed: u64) -> u64 {
    mix(seed, u64::MAX)
}

/// The fingerprint after `steps` steps, each applied once, in order.
pub fn reference(seed: u64, steps: u64) -> u64 {
    (0..steps).fold(initial(seed), |f, s| mix(f, digest(seed, s)))
}

/// Process `p` joins the collective `key` of `members` (created by the first to join), with
/// its fingerprint of now. `None` when it was already resolved (the others gave up);
/// else whether `p` is the first to join, and whether every member has joined.
fn enter(
    procs: &[Proc],
    cols: &mut BTreeMap<(u64, u64), Collective>,
    key: (u64, u64),
    members: Vec<WorkerId>,
    p: usize,
) -> Option<(bool, bool)> {
    let fresh = !cols.contains_key(&key);
    let col =
        cols.entry(key).or_insert(Collective { members, joined: Vec::new(), resolved: false, prints: Vec::new() });
    if col.resolved {
        return None;
    }
    col.joined.push(p);
    col.prints.push(procs[p].fingerprint);
    let everyone = col.members.iter().all(|m| col.joined.iter().any(|&j| procs[j].id == *m));
    Some((fresh, everyone))
}

/// What a corrupting fault mixes into a state.
const CORRUPTION: u64 = 0xbad_c0ffee;

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.rotate_left(29) ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One worker process.
struct Proc {
    id: WorkerId,
    machine: Worker,
    step: u64,
    fingerprint: u64,
    /// The sum it holds and has not applied: (step, digest).
    held: Option<(u64, u64)>,
    /// The copy of the state it keeps (the rollback baseline): (step, fingerprint).
    copy: Option<(u64, u64)>,
    dead: bool,
    hung_until: Option<Option<Duration>>,
    end: Option<End>,
    /// The root's lock: its epoch's committer holds it, so it writes its parts (as the
    /// last vote agreed).
    locked: bool,
    /// Its next update goes wrong.
    corrupt_update: bool,
    /// It compares its state with the others' after an update: its shell is blocked in
    /// that collective, and hears nothing else until it ends.
    checking: bool,
}

enum Scheduled {
    Deliver { to: Node, to_proc: Option<usize>, from: Node, msg: Msg },
    Tick(Node, Option<usize>),
    CollectiveDeadline { epoch: u64, step: u64 },
    Reduced { proc: usize, epoch: u64, step: u64, sum: Option<(bool, u64)> },
    CheckDeadline { epoch: u64, step: u64 },
    Checked { proc: usize, step: u64, own: u64, prints: Option<Vec<u64>> },
    Fetched { proc: usize, epoch: u64, source: usize, step: u64, want: u64 },
    FetchFailed { proc: usize, epoch: u64 },
    Replayed { proc: usize, epoch: u64, to: u64, group: ReplayGroup },
    Fault(usize),
    Resume(usize),
    Start(WorkerId),
    RestartCoordinator,
    Disconnected { proc: usize },
    PeerLost { proc: usize, peer: WorkerId },
}

struct Collective {
    members: Vec<WorkerId>,
    joined: Vec<usize>,
    resolved: bool,
    /// Each joined worker's fingerprint when it joined (in a replica check: the one its
    /// shell took right after the update).
    prints: Vec<u64>,
}

/// A member's part of a checkpoint: who wrote it, the fingerprint of the state it holds,
/// and when it is durable.
struct Part {
    writer: WorkerId,
    fingerprint: u64,
    durable_at: Duration,
}

impl Part {
    fn durable(&self, now: Duration) -> bool {
        self.durable_at <= now
    }
}

struct Sim<'a> {
    c: &'a Config,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BTreeMap<(Duration, u64), Scheduled>,
    rng: Stream,
    procs: Vec<Proc>,
    coordinator: Option<Coordinator>,
    /// Incarnation of the coordinator, so that ticks of a dead one stop.
    coordinator_life: u64,
    cuts: Vec<(Node, Node, Duration)>,
    /// When the last message on each link (sender, receiver process) arrives: a link is a
    /// TCP connection, which delivers in order.
    links: BTreeMap<(Node, Node, Option<usize>), Duration>,
    collectives: BTreeMap<(u64, u64), Collective>,
    /// The replica checks after the updates of `(epoch, step)`.
    checks: BTreeMap<(u64, u64), Collective>,
    /// The checkpoint parts written, by `(epoch, step)`: each epoch's parts lie apart.
    parts: BTreeMap<(u64, u64), Vec<Part>>,
    /// The newest step committed of each epoch's checkpoints, by `(epoch, stage)`.
    committed: BTreeMap<(u64, usize), u64>,
    /// Pending events that [`Sim::scheduled`] counts.
    scheduled: u64,
    /// Epochs of the quorums the coordinators sent.
    quorums: std::collections::BTreeSet<u64>,
    /// A worker ended the job on an error (its launcher stops the rest).
    failed: bool,
    report: Report,
}

/// Runs a simulated job to its end (or to the time limit).
pub fn run(c: &Config) -> Report {
    let mut sim = Sim {
        c,
        base: Instant::now(),
        now: Duration::ZERO,
        seq: 0,
        queue: BTreeMap::new(),
        rng: Stream::for_purpose(c.seed, "sim.network", &[]),
        procs: Vec::new(),
        coordinator: None,
        coordinator_life: 0,
        cuts: Vec::new(),
        links: BTreeMap::new(),
        collectives: BTreeMap::new(),
        checks: BTreeMap::new(),
        parts: BTreeMap::new(),
        committed: BTreeMap::new(),
        scheduled: 0,
        quorums: std::collections::BTreeSet::new(),
        failed: false,
        report: Report {
            workers: Vec::new(),
            time: Duration::ZERO,
            settled: false,
            applied: 0,
            rolled_forward: 0,
            fetched: 0,
            rolled_back: 0,
            restored: 0,
            hashed: 0,
            epochs: 0,
            messages: (0, 0),
            checkpoints: Vec::new(),
            repairs: 0,
            loaded: 0,
            replayed: 0,
            replayed_together: 0,
            helped: 0,
        },
    };
    sim.start_coordinator();
    for id in 0..c.workers {
        sim.start_worker(id);
    }
    for (i, f) in c.faults.iter().enumerate() {
        sim.at(f.at(), Scheduled::Fault(i));
    }
    while let Some(((t, _), event)) = sim.queue.pop_first() {
        if t > c.limit {
            break;
        }
        sim.now = t;
        sim.scheduled -= u64::from(Sim::scheduled(&event));
        sim.handle(event);
        if sim.settled() {
            sim.report.settled = true;
            break;
        }
    }
    sim.finish()
}

/// The member of quorum `q` that commits stage `stage`'s checkpoints: its first-ranked.
fn committer_of(q: &crate::protocol::Quorum, stage: usize) -> WorkerId {
    q.members.iter().copied().find(|&m| q.stage_of(m) == stage).expect("every stage has a member")
}

impl Sim<'_> {
    fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// The seed of the stage worker `id` holds.
    fn seed_of(&self, id: WorkerId) -> u64 {
        stage_seed(self.c.seed, crate::protocol::stage_of(id, self.c.stages))
    }

    fn at(&mut self, t: Duration, e: Scheduled) {
        self.seq += 1;
        self.scheduled += u64::from(Self::scheduled(&e));
        self.queue.insert((t, self.seq), e);
    }

    /// Whether the event is a fault or a start still to come (the run is not over while
    /// one is pending).
    fn scheduled(e: &Scheduled) -> bool {
        matches!(e, Scheduled::Fault(_) | Scheduled::Start(_) | Scheduled::RestartCoordinator | Scheduled::Resume(_))
    }

    fn after(&mut self, d: Duration, e: Scheduled) {
        self.at(self.now + d, e);
    }

    fn latency(&mut self) -> Duration {
        let (lo, hi) = self.c.latency;
        let span = (hi - lo).as_micros() as u64;
        lo + Duration::from_micros(self.rng.below(span.max(1)))
    }

    fn tick_every(&self) -> Duration {
        self.c.timing.heartbeat / 2
    }

    fn start_coordinator(&mut self) {
        let now = self.instant();
        let generation = self.coordinator_life;
        let coordinator = Coordinator::new(generation, self.c.workers as usize, self.c.min_world, self.c.timing, now);
        self.coordinator = Some(coordinator.with_stages(self.c.stages).with_replay_helpers(self.c.helpers));
        self.coordinator_life += 1;
        self.after(self.tick_every(), Scheduled::Tick(Node::Coordinator, None));
    }

    fn start_worker(&mut self, id: WorkerId) {
        let now = self.instant();
        let fingerprint = initial(self.seed_of(id));
        let incarnation = self.procs.iter().filter(|p| p.id == id).count() as u64;
        let (mut machine, mut actions) =
            Worker::new((id, incarnation), self.c.steps, (0, fingerprint), (self.c.timing, self.c.checks), now);
        let copy = self.c.copy_every.map(|_| (0, fingerprint));
        if let Some((step, fingerprint)) = copy {
            actions.extend(machine.step(now, Event::Copied { step, fingerprint }));
        }
        self.procs.push(Proc {
            id,
            machine,
            step: 0,
            fingerprint,
            held: None,
            copy,
            dead: false,
            hung_until: None,
            end: None,
            locked: false,
            corrupt_update: false,
            checking: false,
        });
        let p = self.procs.len() - 1;
        self.perform(Node::Worker(id), Some(p), actions);
        self.after(self.tick_every(), Scheduled::Tick(Node::Worker(id), Some(p)));
    }

    /// The live (not dead) process of a slot.
    fn proc_of(&self, id: WorkerId) -> Option<usize> {
        self.procs.iter().rposition(|p| p.id == id && !p.dead)
    }

    fn usable(&self, p: usize) -> bool {
        let p = &self.procs[p];
        !p.dead && p.hung_until.is_none()
    }

    fn cut(&self, a: Node, b: Node) -> bool {
        self.cuts.iter().any(|&(x, y, until)| until > self.now && ((x, y) == (a, b) || (x, y) == (b, a)))
    }

    fn settled(&self) -> bool {
        self.scheduled == 0 && self.procs.iter().all(|p| p.dead || p.hung_until == Some(None) || p.end.is_some())
    }

    fn perform(&mut self, node: Node, proc: Option<usize>, actions: Vec<Action>) {
        for a in actions {
            if self.c.trace {
                eprintln!("{:>10.3?} {node:?}/{proc:?}: {a:?}", self.now);
            }
            match a {
                Action::Send { to, msg } => self.send(node, to, msg),
                Action::Vote { epoch, step, ok, digest, saved, to } => {
                    for m in to {
                        self.send(node, Node::Worker(m), Msg::Ballot { epoch, step, ok, digest, saved });
                    }
                }
                Action::Compute { epoch, step, members, verify, .. } => {
                    let p = proc.expect("only workers compute");
                    if self.changed(p, verify) {
                        continue;
                    }
                    self.join_collective(p, epoch, step, members);
                }
                Action::Apply { step, verify, hash, compare, agreed } => {
                    let p = proc.expect("only workers apply");
                    if let Some(agreed) = agreed {
                        self.heard(p, agreed);
                    }
                    if self.changed(p, verify) {
                        self.procs[p].held = None;
                        continue;
                    }
                    self.apply(p, step, hash, compare);
                }
                Action::Fetch { epoch, step, fingerprint, sources } => {
                    let p = proc.expect("only workers fetch");
                    self.fetch(p, epoch, (step, fingerprint), &sources);
                }
                Action::Load { epoch, step } => {
                    let p = proc.expect("only workers load");
                    self.load(p, epoch, step);
                }
                Action::Replay { epoch, to, group } => {
                    let p = proc.expect("only workers replay");
                    self.replay(p, epoch, to, group);
                }
                Action::Hash => {
                    let p = proc.expect("only workers hash");
                    self.report.hashed += 1;
                    self.tell(p, Event::Hashed { fingerprint: self.procs[p].fingerprint });
                }
                Action::Restore { step, fingerprint } => {
                    let p = &mut self.procs[proc.expect("only workers restore")];
                    assert_eq!(p.copy, Some((step, fingerprint)), "worker {} restores a copy it does not keep", p.id);
                    (p.step, p.fingerprint, p.held) = (step, fingerprint, None);
                    self.report.restored += 1;
                }
                Action::Repair { .. } => self.report.repairs += 1,
                Action::Finished => {
                    let p = &mut self.procs[proc.expect("only workers finish")];
                    p.end = Some(End::Finished { step: p.step, fingerprint: p.fingerprint });
                }
                Action::Stopped { reason } => {
                    self.procs[proc.expect("only workers stop")].end = Some(End::Stopped(reason));
                }
                Action::Diverged { step, outvoted } => {
                    // The worker ends on the error, and its launcher ends the job: every
                    // other process is stopped, and nobody is started any more.
                    let reason = format!("replicas diverged at step {step}: {outvoted:?}");
                    for q in &mut self.procs {
                        if !q.dead && q.end.is_none() {
                            q.end = Some(End::Stopped(reason.clone()));
                        }
                    }
                    self.failed = true;
                }
            }
        }
    }

    fn send(&mut self, from: Node, to: Node, msg: Msg) {
        self.report.messages.0 += 1;
        if let Msg::Quorum(q) = &msg {
            self.quorums.insert(q.epoch);
        }
        let lost = self.cut(from, to) || (self.c.drop > 0.0 && (self.rng.next_f32() as f64) < self.c.drop);
        if lost {
            self.report.messages.1 += 1;
            return;
        }
        // The message goes to the process alive now; a later replacement never sees it.
        let to_proc = match to {
            Node::Worker(id) => match self.proc_of(id) {
                Some(p) => Some(p),
                None => return,
            },
            Node::Coordinator => None,
        };
        let d = self.latency();
        let last = self.links.entry((from, to, to_proc)).or_default();
        let arrive = (self.now + d).max(*last);
        *last = arrive;
        self.at(arrive, Scheduled::Deliver { to, to_proc, from, msg });
    }

    fn join_collective(&mut self, p: usize, epoch: u64, step: u64, members: Vec<WorkerId>) {
        match enter(&self.procs, &mut self.collectives, (epoch, step), members, p) {
            // Joined after the others gave up: it fails too.
            None => self.after(Duration::from_micros(1), Scheduled::Reduced { proc: p, epoch, step, sum: None }),
            Some((fresh, everyone)) => {
                if fresh {
                    self.after(self.c.collective_timeout, Scheduled::CollectiveDeadline { epoch, step });
                }
                if everyone {
                    self.resolve(epoch, step, false);
                }
            }
        }
    }

    fn resolve(&mut self, epoch: u64, step: u64, deadline: bool) {
        let Some(col) = self.collectives.get_mut(&(epoch, step)) else { return };
        if col.resolved {
            return;
        }
        col.resolved = true;
        let joined = col.joined.clone();
        let members = col.members.clone();
        let complete = !deadline
            && joined.iter().all(|&j| self.usable(j))
            && members
                .iter()
                .enumerate()
                .all(|(i, &a)| members[i + 1..].iter().all(|&b| !self.cut(Node::Worker(a), Node::Worker(b))));
        let delay = if complete { self.c.compute } else { Duration::from_micros(1) };
        for j in joined {
            // Each stage's members sum their stage's gradients.
            let sum = complete.then_some((true, digest(self.seed_of(self.procs[j].id), step)));
            let d = delay + self.latency();
            self.after(d, Scheduled::Reduced { proc: j, epoch, step, sum });
        }
    }

    /// The shell's check of an action's `verify`: whether the state no longer has the
    /// fingerprint it was committed with, in which case the worker hears so.
    fn changed(&mut self, p: usize, verify: Option<u64>) -> bool {
        let fingerprint = self.procs[p].fingerprint;
        if verify.is_none_or(|v| v == fingerprint) {
            return false;
        }
        self.tell(p, Event::Changed { fingerprint });
        true
    }

    /// The ballots' agreement on the epoch's checkpoints reached worker `p`: its part is
    /// written from now on if the committer holds the root's lock, and the committer
    /// commits every checkpoint of the epoch through `agreed.durable`. Committing one that
    /// is not whole, or holds another state than the run that never failed, is a bug.
    fn heard(&mut self, p: usize, agreed: Saved) {
        self.procs[p].locked = agreed.locked;
        let id = self.procs[p].id;
        let Some(q) = self.procs[p].machine.quorum() else { return };
        let (epoch, members, stage) = (q.epoch, q.members.clone(), q.stage_of(id));
        if committer_of(q, stage) != id || !agreed.locked {
            return;
        }
        let from = self.committed.get(&(epoch, stage)).copied().unwrap_or(0);
        if agreed.durable <= from {
            return;
        }
        let due: Vec<u64> =
            self.parts.range((epoch, from + 1)..=(epoch, agreed.durable)).map(|(&(_, s), _)| s).collect();
        for step in due {
            let parts = &self.parts[&(epoch, step)];
            let context = || format!("seed {}: the checkpoint of step {step} in epoch {epoch}", self.c.seed);
            for m in &members {
                let part = parts.iter().find(|part| part.writer == *m);
                assert!(part.is_some_and(|part| part.durable(self.now)), "{}: no durable part of {m}", context());
            }
            let stages = self.c.stages;
            let prints: Vec<u64> = parts
                .iter()
                .filter(|part| crate::protocol::stage_of(part.writer, stages) == stage)
                .map(|part| part.fingerprint)
                .collect();
            assert!(prints.windows(2).all(|w| w[0] == w[1]), "{}: parts of different states {prints:?}", context());
            self.report.checkpoints.push((step, stage, prints[0]));
            self.committed.insert((epoch, stage), step);
        }
    }

    /// A member writes its part of the checkpoint of the state it now holds, when one is
    /// due and the committer holds the root's lock.
    fn write_part(&mut self, p: usize) {
        let proc = &self.procs[p];
        let due = self.c.checkpoint_every.is_some_and(|k| proc.step.is_multiple_of(k));
        let Some(q) = proc.machine.quorum() else { return };
        if !due || !proc.locked || proc.machine.status().phase != WorkerState::Stepping {
            return;
        }
        let part = Part { writer: proc.id, fingerprint: proc.fingerprint, durable_at: self.now + self.c.persist };
        self.parts.entry((q.epoch, proc.step)).or_default().push(part);
    }

    /// Where worker `p`'s part of its epoch's checkpoints stands, for its ballot.
    fn saved(&self, p: usize, epoch: u64) -> Saved {
        let proc = &self.procs[p];
        let mine = || {
            self.parts
                .range((epoch, 0)..=(epoch, u64::MAX))
                .filter_map(|(&(_, s), parts)| Some((s, parts.iter().find(|part| part.writer == proc.id)?)))
        };
        let durable = mine().filter(|(_, part)| part.durable(self.now)).map(|(s, _)| s).max().unwrap_or(0);
        let (written, print) = mine().next_back().map_or((0, 0), |(s, part)| (s, part.fingerprint));
        let first =
            proc.machine.quorum().is_some_and(|q| q.epoch == epoch && committer_of(q, q.stage_of(proc.id)) == proc.id);
        Saved { durable, locked: first, written, print }
    }

    fn apply(&mut self, p: usize, step: u64, hash: bool, compare: bool) {
        let seed = self.c.seed;
        let proc = &mut self.procs[p];
        let (held_step, sum) = proc.held.expect("a worker applies only a sum it holds");
        assert_eq!(
            (held_step, proc.step),
            (step, step),
            "worker {} applies the sum of step {step} out of turn",
            proc.id
        );
        let stage = crate::protocol::stage_of(proc.id, self.c.stages);
        assert_eq!(sum, digest(stage_seed(seed, stage), step), "worker {} applies a wrong sum", proc.id);
        let rolling = proc.machine.status().phase == WorkerState::Syncing;
        proc.step += 1;
        let wrong = std::mem::take(&mut proc.corrupt_update);
        proc.fingerprint = mix(proc.fingerprint, if wrong { sum ^ CORRUPTION } else { sum });
        proc.held = None;
        self.report.applied += 1;
        self.report.rolled_forward += u64::from(rolling);
        self.keep_copy(p);
        self.write_part(p);
        let proc = &self.procs[p];
        let (fp, id) = (proc.fingerprint, proc.id);
        if compare && let Some(q) = proc.machine.quorum() {
            let (epoch, members) = (q.epoch, q.members.clone());
            self.procs[p].checking = true;
            self.join_check(p, epoch, step, members);
            return;
        }
        // Half the updates the protocol does not ask to hash are not hashed: the worker
        // asks for the fingerprint when it needs it (`Action::Hash`).
        let fingerprint = (hash || (step + u64::from(id)).is_multiple_of(2)).then_some(fp);
        self.tell(p, Event::Applied { step, fingerprint });
    }

    /// A worker applied the update of `step` and compares its state with the other
    /// members' (over the epoch's mesh, in a real job): a collective like the all-reduce.
    fn join_check(&mut self, p: usize, epoch: u64, step: u64, members: Vec<WorkerId>) {
        match enter(&self.procs, &mut self.checks, (epoch, step), members, p) {
            None => {
                let own = self.procs[p].fingerprint;
                self.after(Duration::from_micros(1), Scheduled::Checked { proc: p, step, own, prints: None })
            }
            Some((fresh, everyone)) => {
                if fresh {
                    self.after(self.c.collective_timeout, Scheduled::CheckDeadline { epoch, step });
                }
                if everyone {
                    self.resolve_check(epoch, step, false);
                }
            }
        }
    }

    /// Every member of a check joined it, or its deadline passed: what each finds.
    fn resolve_check(&mut self, epoch: u64, step: u64, deadline: bool) {
        let Some(col) = self.checks.get_mut(&(epoch, step)) else { return };
        if col.resolved {
            return;
        }
        col.resolved = true;
        let (joined, members, taken) = (col.joined.clone(), col.members.clone(), col.prints.clone());
        let complete = !deadline && joined.iter().all(|&j| self.usable(j));
        let prints: Vec<u64> = members
            .iter()
            .filter_map(|&m| joined.iter().position(|&j| self.procs[j].id == m).map(|k| taken[k]))
            .collect();
        for (k, j) in joined.into_iter().enumerate() {
            let prints = complete.then(|| prints.clone());
            let d = self.latency();
            self.after(d, Scheduled::Checked { proc: j, step, own: taken[k], prints });
        }
    }

    /// The rollback baseline: a worker whose state reached a multiple of the copy
    /// interval copies it.
    fn keep_copy(&mut self, p: usize) {
        let Some(every) = self.c.copy_every else { return };
        let proc = &mut self.procs[p];
        if proc.step.is_multiple_of(every) {
            let (step, fingerprint) = (proc.step, proc.fingerprint);
            proc.copy = Some((step, fingerprint));
            // (Its answer is empty: a copy only changes what leaving an epoch does.)
            let _ = proc.machine.step(self.base + self.now, Event::Copied { step, fingerprint });
        }
    }

    fn fetch(&mut self, p: usize, epoch: u64, (step, want): (u64, u64), sources: &[WorkerId]) {
        let me = Node::Worker(self.procs[p].id);
        let reachable: Vec<usize> = sources
            .iter()
            .filter_map(|&s| self.proc_of(s))
            .filter(|&s| self.usable(s) && !self.cut(me, Node::Worker(self.procs[s].id)))
            .collect();
        if reachable.is_empty() {
            let t = self.c.collective_timeout;
            self.after(t, Scheduled::FetchFailed { proc: p, epoch });
            return;
        }
        let source = reachable[self.rng.below(reachable.len() as u64) as usize];
        let t = self.c.transfer + self.latency();
        self.after(t, Scheduled::Fetched { proc: p, epoch, source, step, want });
    }

    /// Worker `p` loads its stage's checkpoint of `step` (its initial state at step 0),
    /// which must have been committed: a pipeline that lost a stage's state goes back.
    fn load(&mut self, p: usize, epoch: u64, step: u64) {
        let stage = crate::protocol::stage_of(self.procs[p].id, self.c.stages);
        let committed = self.report.checkpoints.iter().any(|&(s, g, _)| (s, g) == (step, stage));
        assert!(step == 0 || committed, "seed {}: stage {stage} loads step {step}, never committed", self.c.seed);
        let fingerprint = stage_reference(self.c.seed, stage, step);
        let proc = &mut self.procs[p];
        (proc.step, proc.fingerprint, proc.held) = (step, fingerprint, None);
        self.report.loaded += 1;
        self.tell(p, Event::Loaded { epoch, state: Some((step, fingerprint)) });
    }

    /// Worker `p` starts its place of a replay (see [`Action::Replay`]) from the stage's
    /// checkpoint of `group.from` (committed, or the initial state) to step `to`: it fails
    /// at once when an edge of the group it reads is not logged, and otherwise ends after
    /// a step's compute time per step replayed.
    fn replay(&mut self, p: usize, epoch: u64, to: u64, group: ReplayGroup) {
        let id = self.procs[p].id;
        let (stage, _) = group.place_of(id).expect("a worker replays its place");
        let committed = self.report.checkpoints.iter().any(|&(s, g, _)| (s, g) == (group.from, stage));
        let seed = self.c.seed;
        assert!(
            group.from == 0 || committed,
            "seed {seed}: stage {stage} replays from {}, never committed",
            group.from
        );
        assert!(group.from <= to, "seed {seed}: a replay from {} back to {to}", group.from);
        let range = group.stages();
        let edges = [
            (stage == range.start && stage > 0).then(|| stage - 1),
            (stage + 1 == range.end && stage + 1 < self.c.stages).then_some(stage),
        ];
        let unlogged: u64 = edges
            .into_iter()
            .flatten()
            .filter(|&b| !self.c.logged || self.c.unlogged & (1 << b) != 0)
            .fold(0, |m, b| m | 1 << b);
        if unlogged != 0 {
            self.tell(p, Event::Replayed { epoch, state: Err(ReplayFailure::Unlogged(unlogged)) });
            return;
        }
        let t = self.c.compute * (to - group.from).max(1) as u32;
        self.after(t, Scheduled::Replayed { proc: p, epoch, to, group });
    }

    /// Worker `p`'s place of a replay ended: done when every worker of it was there to the
    /// end (alive, in the epoch), and the stage's state is its reference at `to`.
    fn replayed(&mut self, p: usize, epoch: u64, to: u64, group: &ReplayGroup) {
        if !self.usable(p) {
            return;
        }
        let present = group.participants().into_iter().all(|w| {
            self.proc_of(w).is_some_and(|q| {
                let s = self.procs[q].machine.status();
                self.usable(q) && s.epoch == epoch && matches!(s.phase, WorkerState::Syncing | WorkerState::Synced)
            })
        });
        if !present {
            self.tell(p, Event::Replayed { epoch, state: Err(ReplayFailure::Lost) });
            return;
        }
        let own = crate::protocol::stage_of(self.procs[p].id, self.c.stages);
        let (stage, _) = group.place_of(self.procs[p].id).expect("a worker replays its place");
        let state = if stage == own {
            let fingerprint = stage_reference(self.c.seed, stage, to);
            let proc = &mut self.procs[p];
            (proc.step, proc.fingerprint, proc.held) = (to, fingerprint, None);
            self.report.replayed += 1;
            self.report.replayed_together += u64::from(group.workers.len() > 1);
            (to, fingerprint)
        } else {
            self.report.helped += 1;
            (self.procs[p].step, self.procs[p].fingerprint)
        };
        self.tell(p, Event::Replayed { epoch, state: Ok(state) });
    }

    /// The steps of the checkpoints of worker `p`'s stage committed so far, newest first,
    /// as a pipeline's shell lists them.
    fn list_checkpoints(&mut self, p: usize) {
        if self.c.stages < 2 {
            return;
        }
        let stage = crate::protocol::stage_of(self.procs[p].id, self.c.stages);
        let mut steps: Vec<u64> =
            self.report.checkpoints.iter().filter(|&&(_, g, _)| g == stage).map(|&(s, _, _)| s).collect();
        steps.sort_unstable_by(|a, b| b.cmp(a));
        steps.dedup();
        self.tell(p, Event::Checkpoints { steps });
    }

    /// The worker process an event is for, if any.
    fn target(event: &Scheduled) -> Option<usize> {
        match event {
            Scheduled::Deliver { to_proc, .. } => *to_proc,
            Scheduled::Reduced { proc, .. }
            | Scheduled::Fetched { proc, .. }
            | Scheduled::FetchFailed { proc, .. }
            | Scheduled::Replayed { proc, .. }
            | Scheduled::Checked { proc, .. }
            | Scheduled::PeerLost { proc, .. } => Some(*proc),
            _ => None,
        }
    }

    /// A fetch from `source` of the state of `step` ended.
    fn fetched(&mut self, proc: usize, epoch: u64, source: usize, (step, want): (u64, u64)) {
        let now = self.instant();
        if !self.usable(proc) {
            return;
        }
        // A replica whose state was found changed may go back to an older healthy state.
        let suspect = self.procs[proc].machine.status().suspect;
        let mut ok = self.usable(source) && self.procs[source].step == step;
        if ok && self.procs[source].fingerprint != want && self.procs[source].end.is_none() {
            // The source's server hashes what it serves: a state changed at rest since its
            // commit is refused, and its worker hears that it changed.
            ok = false;
            self.tell(source, Event::Changed { fingerprint: self.procs[source].fingerprint });
        }
        let state = ok.then(|| (self.procs[source].step, self.procs[source].fingerprint));
        let actions = self.procs[proc].machine.step(now, Event::Fetched { epoch, state });
        // The shell installs the state only if the machine took it (as the
        // quorum's, or as what it now holds).
        let p = &mut self.procs[proc];
        let st = p.machine.status();
        if let Some((s, f)) = state
            && (st.step, st.fingerprint) == (s, f)
        {
            if st.phase == WorkerState::Synced {
                self.report.rolled_back += u64::from(s < p.step && !suspect);
                self.report.fetched += 1;
            }
            (p.step, p.fingerprint, p.held) = (s, f, None);
            self.keep_copy(proc);
        }
        let id = self.procs[proc].id;
        self.perform(Node::Worker(id), Some(proc), actions);
    }

    fn handle(&mut self, event: Scheduled) {
        let now = self.instant();
        if let Some(p) = Self::target(&event) {
            if self.procs[p].dead {
                return;
            }
            if let Some(until) = self.procs[p].hung_until {
                // A stopped process takes it in when it resumes (socket buffers, a
                // computation that was under way).
                if let Some(t) = until {
                    self.at(t.max(self.now), event);
                }
                return;
            }
            if self.procs[p].checking && !matches!(event, Scheduled::Checked { .. }) {
                // Taken in once the shell's replica check is over.
                self.after(Duration::from_micros(100), event);
                return;
            }
        }
        match event {
            Scheduled::Deliver { to: Node::Coordinator, from, msg, .. } => {
                if let Some(c) = self.coordinator.as_mut() {
                    let actions = c.on_message(now, from, msg);
                    self.perform(Node::Coordinator, None, actions);
                }
            }
            Scheduled::Deliver { to_proc: Some(p), from, msg, .. } => self.tell(p, Event::Message { from, msg }),
            Scheduled::Deliver { to_proc: None, .. } => {}
            Scheduled::Tick(Node::Coordinator, _) => {
                let life = self.coordinator_life;
                if let Some(c) = self.coordinator.as_mut() {
                    let actions = c.tick(now);
                    self.perform(Node::Coordinator, None, actions);
                    if life == self.coordinator_life {
                        self.after(self.tick_every(), Scheduled::Tick(Node::Coordinator, None));
                    }
                }
            }
            Scheduled::Tick(node, Some(p)) => {
                if self.procs[p].dead || self.procs[p].end.is_some() {
                    return;
                }
                if self.procs[p].checking {
                    // Blocked in the check, the shell's link still repeats its report.
                    let report = Msg::Report(self.procs[p].machine.status().clone());
                    self.send(node, Node::Coordinator, report);
                } else if self.procs[p].hung_until.is_none() {
                    self.list_checkpoints(p);
                    self.tell(p, Event::Tick);
                }
                self.after(self.tick_every(), Scheduled::Tick(node, Some(p)));
            }
            Scheduled::Tick(_, None) => {}
            Scheduled::CollectiveDeadline { epoch, step } => self.resolve(epoch, step, true),
            Scheduled::Reduced { proc, epoch, step, sum } => self.reduced(proc, (epoch, step), sum),
            Scheduled::Fetched { proc, epoch, source, step, want } => self.fetched(proc, epoch, source, (step, want)),
            Scheduled::CheckDeadline { epoch, step } => self.resolve_check(epoch, step, true),
            Scheduled::Checked { proc, step, own, prints } => {
                self.procs[proc].checking = false;
                if self.usable(proc) {
                    // The shell hands over the fingerprint it compared (taken right after
                    // the update), whatever happened to the state since.
                    self.tell(proc, Event::Compared { step, fingerprint: own, prints });
                }
            }
            Scheduled::Replayed { proc, epoch, to, group } => self.replayed(proc, epoch, to, &group),
            Scheduled::FetchFailed { proc, epoch } => {
                if self.usable(proc) {
                    self.tell(proc, Event::Fetched { epoch, state: None });
                }
            }
            Scheduled::Fault(i) => self.fault(i),
            Scheduled::Resume(p) => {
                self.procs[p].hung_until = None;
            }
            Scheduled::Start(id) if !self.failed => self.start_worker(id),
            Scheduled::Start(_) => {}
            Scheduled::RestartCoordinator => self.start_coordinator(),
            Scheduled::PeerLost { proc, peer } => {
                if self.procs[proc].end.is_none() {
                    self.tell(proc, Event::PeerLost(peer));
                }
            }
            Scheduled::Disconnected { proc } => {
                let id = self.procs[proc].id;
                if let Some(c) = self.coordinator.as_mut() {
                    let actions = c.on_disconnect(now, id);
                    self.perform(Node::Coordinator, None, actions);
                }
                // Each shell hears of it between its actions (one blocked in a replica check
                // hears once the check is over).
                for q in 0..self.procs.len() {
                    if q != proc && !self.procs[q].dead && self.procs[q].end.is_none() {
                        self.at(self.now, Scheduled::PeerLost { proc: q, peer: id });
                    }
                }
            }
        }
    }

    /// Worker process `p` hears `event`, and its shell carries out what it answers.
    fn tell(&mut self, p: usize, event: Event) {
        let now = self.instant();
        let actions = self.procs[p].machine.step(now, event);
        let id = self.procs[p].id;
        self.perform(Node::Worker(id), Some(p), actions);
    }

    /// Worker process `p`'s all-reduce of `step` ended with `sum`; its shell keeps the sum
    /// only if the worker took it (not a stale step's).
    fn reduced(&mut self, p: usize, (epoch, step): (u64, u64), sum: Option<(bool, u64)>) {
        if !self.usable(p) {
            return;
        }
        let (saved, now) = (self.saved(p, epoch), self.instant());
        let actions = self.procs[p].machine.step(now, Event::Computed { epoch, step, sum, saved });
        let proc = &mut self.procs[p];
        let took = actions
            .iter()
            .any(|a| matches!(a, Action::Vote { .. }) || matches!(a, Action::Apply { step: s, .. } if *s == step));
        if let Some((_, d)) = sum
            && proc.machine.status().step == step
            && took
        {
            proc.held = Some((step, d));
        }
        let id = proc.id;
        self.perform(Node::Worker(id), Some(p), actions);
    }

    fn fault(&mut self, i: usize) {
        match self.c.faults[i].clone() {
            Fault::Kill { worker, replace_after, .. } => {
                let Some(p) = self.proc_of(worker) else { return };
                if self.procs[p].end.is_some() {
                    return;
                }
                self.procs[p].dead = true;
                // A dead process's sockets close: the others notice after a latency.
                let d = self.latency();
                self.after(d, Scheduled::Disconnected { proc: p });
                if let Some(after) = replace_after {
                    self.after(after, Scheduled::Start(worker));
                }
            }
            Fault::Hang { worker, span, .. } => {
                let Some(p) = self.proc_of(worker) else { return };
                if self.procs[p].end.is_some() || self.procs[p].hung_until.is_some() {
                    return;
                }
                let until = span.map(|s| self.now + s);
                self.procs[p].hung_until = Some(until);
                if let Some(t) = until {
                    self.at(t, Scheduled::Resume(p));
                }
            }
            Fault::Cut { a, b, span, .. } => {
                self.cuts.push((a, b, self.now + span));
            }
            Fault::KillCoordinator { restart_after, .. } => {
                self.coordinator = None;
                self.coordinator_life += 1;
                self.after(restart_after, Scheduled::RestartCoordinator);
            }
            Fault::Join { worker, .. } => {
                if self.proc_of(worker).is_none() {
                    self.start_worker(worker);
                }
            }
            Fault::Corrupt { worker, .. } => {
                let Some(p) = self.proc_of(worker).filter(|&p| self.procs[p].end.is_none()) else { return };
                let proc = &mut self.procs[p];
                proc.fingerprint = mix(proc.fingerprint, CORRUPTION);
            }
            Fault::CorruptUpdate { worker, .. } => {
                if let Some(p) = self.proc_of(worker) {
                    self.procs[p].corrupt_update = true;
                }
            }
        }
    }

    fn finish(self) -> Report {
        let mut report = self.report;
        report.time = self.now;
        report.epochs = self.quorums.len() as u64;
        report.workers = self
            .procs
            .iter()
            .map(|p| {
                let end = if p.dead || p.hung_until == Some(None) {
                    End::Dead
                } else {
                    p.end.clone().unwrap_or(End::Running(p.machine.status().phase))
                };
                (p.id, end)
            })
            .collect();
        report
    }
}
