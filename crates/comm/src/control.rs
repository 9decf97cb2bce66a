//! The socket shells of the step protocol's control plane: the coordinator's
//! ([`coordinate`]) and a worker's connection to it ([`Link`]).
//!
//! Both are thin. [`coordinate`] admits workers through a [`Gate`] (the job secret, then
//! a [`Hello`] naming the worker's incarnation and listening address), turns their frames,
//! closed connections and the passing of time into calls of a
//! [`crate::protocol::Coordinator`], and carries out the messages it returns,
//! sending each quorum's members their address book first. A [`Link`] keeps a worker's
//! connection: it sends reports (and repeats the newest every heartbeat, so that a worker
//! busy computing is not taken for lost), hands incoming messages to the training loop,
//! and, when the connection drops (the coordinator was restarted), dials again until it is
//! closed. The coordinator pulses every worker every heartbeat with its bounds; the link
//! judges its silence by them ([`crate::watch`]), says at once when it is lost and until
//! when the worker waits for it, and tells the training loop when to give up
//! ([`Link::gave_up`]). What to do about the silence of the protocol itself is the
//! protocol's decision.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::awake::AwakeClock;
use crate::directory::Directory;
use crate::frame::{FrameError, read_frame, write_frame};
use crate::gate::{Gate, Limits};
use crate::handshake::handshake;
use crate::protocol::coordinator::{Admission, JobState};
use crate::protocol::wire::{self, Hello};
use crate::protocol::{Action, Arrival, Coordinator, Msg, Node, Quorum, Timing, WorkerId, WorkerState};
use crate::rendezvous::COORDINATOR_RANK;
use crate::transport::{CommError, DialError, dial};
use crate::watch::{CoordinatorWatch, DEFAULT_BOUNDS, Verdict};

const MAX_CONTROL_FRAME: u32 = 1 << 20;

/// What the coordinator's shell saw, for the launcher's output and the job's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// A worker process connected.
    Joined {
        /// Its slot.
        id: WorkerId,
        /// Which process of the slot.
        incarnation: u64,
    },
    /// A process that connected for a slot held by another was refused and told to stop.
    Refused {
        /// Its slot.
        id: WorkerId,
        /// Which process of the slot it said it is.
        incarnation: u64,
        /// Why.
        reason: String,
    },
    /// A worker was declared lost.
    Lost {
        /// Its slot.
        id: WorkerId,
        /// Which process of the slot (a replacement may already be starting).
        incarnation: u64,
        /// Why.
        reason: String,
    },
    /// A quorum was formed.
    Quorum {
        /// The quorum.
        quorum: Quorum,
        /// The members that roll forward (they hold the sum that produced the state).
        rolling: Vec<WorkerId>,
        /// The members that fetch the state from the sources.
        fetching: Vec<WorkerId>,
    },
    /// Every member of the epoch holds its state: stepping starts.
    Started {
        /// The epoch.
        epoch: u64,
    },
    /// Every member holds the final state.
    Finished,
    /// The job cannot go on.
    Stopped {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for MembershipEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipEvent::Joined { id, incarnation: 0 } => write!(f, "worker {id} joined"),
            MembershipEvent::Joined { id, incarnation } => {
                write!(f, "worker {id} joined (process {})", incarnation + 1)
            }
            MembershipEvent::Refused { id, reason, .. } => write!(f, "worker {id}: a process was refused: {reason}"),
            MembershipEvent::Lost { id, reason, .. } => write!(f, "worker {id} lost: {reason}"),
            MembershipEvent::Quorum { quorum: q, rolling, fetching } => {
                let prints: Vec<String> = q
                    .stages
                    .iter()
                    .map(|s| s.fingerprint.map_or_else(|| unknown(s), repro::fingerprint::hex))
                    .collect();
                write!(f, "epoch {}: workers {:?} from step {} ({})", epoch_text(q.epoch), q.members, q.step, {
                    prints.join(", ")
                })?;
                for how in how_members_sync(q, rolling, fetching) {
                    write!(f, "; {how}")?;
                }
                Ok(())
            }
            MembershipEvent::Started { epoch } => write!(f, "epoch {} steps", epoch_text(*epoch)),
            MembershipEvent::Finished => write!(f, "every member holds the final state"),
            MembershipEvent::Stopped { reason } => write!(f, "the job stops: {reason}"),
        }
    }
}

/// What a quorum says of a stage whose fingerprint it does not know.
fn unknown(s: &crate::protocol::StageState) -> String {
    match (s.restore, &s.replay) {
        (true, _) => "its checkpoint".into(),
        (_, Some(_)) => "replayed".into(),
        _ => "rolled forward".into(),
    }
}

/// How the members of quorum `q` that do not hold its state get it, in words: those
/// `rolling` forward, those `fetching` (from which sources, by stage in a pipeline).
pub fn how_members_sync(q: &Quorum, rolling: &[WorkerId], fetching: &[WorkerId]) -> Vec<String> {
    let mut how = Vec::new();
    if q.stages.iter().any(|s| s.restore) {
        how.push(match q.step {
            0 => "a stage's state was lost: every stage goes back to its initial state".to_owned(),
            step => format!("a stage's state was lost: every stage goes back to its checkpoint of step {step}"),
        });
    }
    for (stage, state) in q.stages.iter().enumerate() {
        let Some(r) = &state.replay else { continue };
        let first = stage == 0 || q.stages[stage - 1].replay.as_ref().is_none_or(|p| !p.with_next);
        let group = q.replay_of(r.workers[0]).filter(|_| first);
        match group {
            Some(g) if g.workers.len() == 1 => {
                let (own, helpers): (Vec<WorkerId>, Vec<WorkerId>) =
                    r.workers.iter().partition(|&&w| q.stage_of(w) == stage);
                let shared = if helpers.is_empty() { String::new() } else { format!(", helped by {helpers:?}") };
                how.push(format!(
                    "stage {stage}'s state was lost: its workers {own:?} replay it from its checkpoint of step {} on \
                     its neighbours' logs{shared}",
                    r.from
                ));
            }
            Some(g) => how.push(format!(
                "stages {} to {} go back to their checkpoints of step {} and replay together ({:?}), the tensors \
                 between them live",
                g.first,
                g.stages().end - 1,
                g.from,
                g.workers
            )),
            None => {}
        }
    }
    if !rolling.is_empty() {
        how.push(format!("{rolling:?} roll forward"));
    }
    match &q.stages[..] {
        _ if fetching.is_empty() => {}
        [one] => how.push(format!("{fetching:?} fetch the state from {:?}", one.sources)),
        stages => {
            let from: Vec<String> = stages
                .iter()
                .enumerate()
                .filter(|(s, _)| fetching.iter().any(|&m| q.stage_of(m) == *s))
                .map(|(s, state)| format!("stage {s} from {:?}", state.sources))
                .collect();
            how.push(format!("{fetching:?} fetch their stages' states ({})", from.join(", ")));
        }
    }
    how
}

/// An epoch as `generation.counter` when a restarted coordinator issued it.
pub fn epoch_text(epoch: u64) -> String {
    let (generation, counter) = (epoch >> 40, epoch & ((1 << 40) - 1));
    if generation == 0 { counter.to_string() } else { format!("{generation}.{counter}") }
}

enum Input {
    Admitted { id: WorkerId, hello: Hello, stream: TcpStream },
    Frame { id: WorkerId, serial: u64, msg: Msg },
    Closed { id: WorkerId, serial: u64, why: String },
}

struct Conn {
    serial: u64,
    writer: TcpStream,
    addr: SocketAddr,
}

/// What the coordinator's owner can ask of it while it runs.
#[derive(Debug, Default)]
pub struct Requests {
    /// Set: stop serving at once (the job's processes are gone).
    pub shutdown: AtomicBool,
    /// Set: stop the job, telling every worker this reason (the launcher knows that the
    /// job can never again have the workers it needs).
    pub stop: Mutex<Option<String>>,
    /// Worker processes `(id, incarnation)` whose lease in etcd expired: each is lost, as
    /// if its connection had closed.
    pub expired: Mutex<Vec<(WorkerId, u64)>>,
}

/// Runs the coordinator on `listener` until the job is over (finished or stopped, and no
/// live worker waits for a word) or `requests.shutdown` is set. Returns the final stage.
///
/// Every worker connected and not lost gets a [`wire::Pulse`] every heartbeat, so that it
/// can tell a live coordinator with nothing to say from a lost one, by this coordinator's
/// own bounds ([`crate::watch`]).
///
/// A job that is over keeps its port until `requests.shutdown` is set (its owner is done
/// with its workers): a process that joins after the end is told that the job finished
/// (or why it stopped), instead of finding nobody there.
pub fn coordinate(
    listener: TcpListener,
    secret: &[u8],
    mut machine: Coordinator,
    timing: Timing,
    requests: &Arc<Requests>,
    on_event: &mut dyn FnMut(MembershipEvent),
) -> Result<JobState, CommError> {
    let (shutdown, stop_request) = (&requests.shutdown, &requests.stop);
    let gate = open_gate(listener, secret)?;
    let (tx, rx) = mpsc::channel();
    let stop_admitting = Arc::new(AtomicBool::new(false));
    // Once the job is over: what a process that joins is told.
    let over_reason: Arc<Mutex<Option<String>>> = Arc::default();
    let admitter = {
        let (tx, stop, over, requests) =
            (tx.clone(), Arc::clone(&stop_admitting), Arc::clone(&over_reason), Arc::clone(requests));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && !requests.shutdown.load(Ordering::Relaxed) {
                if let Some(mut a) = gate.next(Instant::now() + Duration::from_millis(50)) {
                    let (id, hello) = a.value;
                    if let Some(reason) = over.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                        tracing::warn!(id, "a process for worker {id} joined after the end of the job; told so");
                        tell_to_stop(&mut a.stream, reason);
                        continue;
                    }
                    if tx.send(Input::Admitted { id, hello, stream: a.stream }).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let pulse = wire::encode_pulse(&pulse_of(&timing));
    let mut next_pulse = Instant::now();
    let mut conns: BTreeMap<WorkerId, Conn> = BTreeMap::new();
    let mut serial = 0u64;
    // The workers whose loss was told (until they report again).
    let mut told_lost: BTreeSet<WorkerId> = BTreeSet::new();
    // Why a worker was lost, when the machine did not see it for itself.
    let mut why_lost: BTreeMap<WorkerId, String> = BTreeMap::new();
    let mut last_epoch = None;
    let mut last_stage = machine.stage().clone();
    let tick = (timing.heartbeat / 2).max(Duration::from_millis(5));
    let mut next_tick = Instant::now();
    // This loop runs at least once a tick; a longer gap is time it was not running.
    let mut awake = AwakeClock::new(2 * tick);
    awake.observe(next_tick);
    loop {
        let received = rx.recv_timeout(next_tick.saturating_duration_since(Instant::now()));
        // Looked at after the wait, before any input is handled: a pause that began during
        // the wait is credited before the silence it caused is judged.
        if let Some(paused) = awake.pause() {
            machine.paused(paused);
        }
        if let Some(reason) = stop_request.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let actions = machine.stop(Instant::now(), reason);
            perform(&mut conns, actions);
        }
        for (id, incarnation) in std::mem::take(&mut *requests.expired.lock().unwrap_or_else(|e| e.into_inner())) {
            let actions = expire(&mut machine, &mut conns, id, incarnation, &mut why_lost);
            perform(&mut conns, actions);
        }
        let actions = match received {
            Ok(Input::Admitted { id, hello, stream }) => {
                let joined = Joining { id, hello, stream, timing: &timing, tx: &tx };
                admit(joined, &mut machine, &mut conns, &mut serial, on_event);
                Vec::new()
            }
            Ok(Input::Frame { id, serial, msg }) if conns.get(&id).is_some_and(|c| c.serial == serial) => {
                machine.on_message(Instant::now(), Node::Worker(id), msg)
            }
            Ok(Input::Closed { id, serial, why }) if conns.get(&id).is_some_and(|c| c.serial == serial) => {
                conns.remove(&id);
                tracing::debug!(id, "connection closed: {why}");
                machine.on_disconnect(Instant::now(), id)
            }
            Ok(_) => Vec::new(),
            Err(RecvTimeoutError::Timeout) => {
                next_tick = Instant::now() + tick;
                machine.tick(Instant::now())
            }
            Err(RecvTimeoutError::Disconnected) => unreachable!("the loop holds a sender"),
        };
        perform(&mut conns, actions);
        if Instant::now() >= next_pulse {
            next_pulse = Instant::now() + timing.heartbeat;
            send_pulses(&mut conns, &machine, &pulse);
        }
        let stage = Told { lost: &mut told_lost, why: &mut why_lost, epoch: &mut last_epoch, stage: &mut last_stage }
            .tell(&machine, &conns, timing.lost_after, on_event);
        let over = matches!(stage, JobState::Finished | JobState::Stopped { .. })
            && machine.workers().all(|(_, s, l)| l || matches!(s.phase, WorkerState::Finished | WorkerState::Stopped));
        if over || shutdown.load(Ordering::Relaxed) {
            for c in conns.values_mut() {
                let _ = c.writer.flush();
                let _ = c.writer.shutdown(Shutdown::Both);
            }
            if over && !shutdown.load(Ordering::Relaxed) {
                // The admitter answers late joiners until the owner shuts down.
                *over_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(too_late(&stage));
            } else {
                stop_admitting.store(true, Ordering::Relaxed);
                let _ = admitter.join();
            }
            return Ok(stage);
        }
    }
}

/// Why a process that joins a job that has finished is stopped: not an error (a
/// replacement that started before the end and joined after it has nothing to do), which
/// the workers tell apart by this reason.
pub const JOINED_AFTER_THE_END: &str = "it had finished before this process joined: every member holds the final state";

/// What a process that joins a job that is over is told.
fn too_late(stage: &JobState) -> String {
    match stage {
        JobState::Stopped { reason } => format!("{reason} (before this process joined: the job is over)"),
        _ => JOINED_AFTER_THE_END.to_owned(),
    }
}

/// The bounds the coordinator runs with, as its pulses tell the workers.
fn pulse_of(timing: &Timing) -> wire::Pulse {
    wire::Pulse { lost_after: timing.lost_after, quorum_timeout: timing.quorum_timeout }
}

/// Sends a pulse to every connected worker that is not lost (a lost one, stopped say,
/// would only pile the pulses up unread until a write blocked).
fn send_pulses(conns: &mut BTreeMap<WorkerId, Conn>, machine: &Coordinator, pulse: &[u8]) {
    let ids: Vec<WorkerId> =
        conns.keys().copied().filter(|&id| machine.worker(id).is_none_or(|(_, lost)| !lost)).collect();
    for id in ids {
        send(conns, id, wire::KIND_PULSE, pulse);
    }
}

/// The coordinator's gate: a worker is admitted once it has proved the secret and sent
/// its hello.
fn open_gate(listener: TcpListener, secret: &[u8]) -> Result<Gate<(WorkerId, Hello)>, CommError> {
    let secret = secret.to_vec();
    Gate::open(listener, Limits::default(), move |stream| {
        crate::transport::keepalive(stream).map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let id = handshake(stream, &secret, COORDINATOR_RANK).map_err(|e| e.to_string())?;
        let f = read_frame(stream, MAX_CONTROL_FRAME).map_err(|e| e.to_string())?;
        if f.kind != wire::KIND_HELLO {
            return Err(format!("worker {id} sent a frame of kind {:#x} instead of its hello", f.kind));
        }
        Ok((id, wire::decode_hello(&f.payload).map_err(|e| e.to_string())?))
    })
    .map_err(|e| CommError::Setup(format!("coordinator listener: {e}")))
}

/// What the coordinator has told of the job so far: the workers whose loss was told (until
/// they report again), the last quorum's epoch, the last stage.
struct Told<'t> {
    lost: &'t mut BTreeSet<WorkerId>,
    why: &'t mut BTreeMap<WorkerId, String>,
    epoch: &'t mut Option<u64>,
    stage: &'t mut JobState,
}

impl Told<'_> {
    /// Tells what changed, once each; returns the stage now. (A worker that finished or
    /// stopped may close its connection: that is no loss.)
    fn tell(
        self,
        machine: &Coordinator,
        conns: &BTreeMap<WorkerId, Conn>,
        lost_after: Duration,
        on_event: &mut dyn FnMut(MembershipEvent),
    ) -> JobState {
        for (id, status, is_lost) in machine.workers() {
            let over = matches!(status.phase, WorkerState::Finished | WorkerState::Stopped);
            if !is_lost || over {
                self.lost.remove(&id);
            } else if self.lost.insert(id) {
                let reason = if let Some(why) = self.why.remove(&id) {
                    why
                } else if conns.contains_key(&id) {
                    format!("silent for {:.1} s", lost_after.as_secs_f64())
                } else {
                    "its connection closed".to_owned()
                };
                on_event(MembershipEvent::Lost { id, incarnation: status.incarnation, reason });
            }
        }
        if let Some(q) = machine.quorum()
            && *self.epoch != Some(q.epoch)
        {
            *self.epoch = Some(q.epoch);
            on_event(quorum_event(machine, q));
        }
        let stage = machine.stage().clone();
        if stage != *self.stage {
            match &stage {
                JobState::Running => on_event(MembershipEvent::Started { epoch: self.epoch.unwrap_or_default() }),
                JobState::Finished => on_event(MembershipEvent::Finished),
                JobState::Stopped { reason } => on_event(MembershipEvent::Stopped { reason: reason.clone() }),
                JobState::Gathering { .. } | JobState::Syncing { .. } => {}
            }
            *self.stage = stage.clone();
        }
        stage
    }
}

fn quorum_event(machine: &Coordinator, q: &Quorum) -> MembershipEvent {
    let mut rolling = Vec::new();
    let mut fetching = Vec::new();
    for &m in &q.members {
        let Some((s, _)) = machine.worker(m) else { continue };
        match q.sync_of(m, s) {
            Arrival::Holds => {}
            Arrival::RollsForward => rolling.push(m),
            Arrival::Fetches => fetching.push(m),
            Arrival::Loads | Arrival::Replays => {}
        }
    }
    MembershipEvent::Quorum { quorum: q.clone(), rolling, fetching }
}

/// Worker `id`'s process `incarnation` lost its lease in etcd: if it still holds its slot
/// and has not finished, it is lost and its connection closed.
fn expire(
    machine: &mut Coordinator,
    conns: &mut BTreeMap<WorkerId, Conn>,
    id: WorkerId,
    incarnation: u64,
    why: &mut BTreeMap<WorkerId, String>,
) -> Vec<Action> {
    let holds = machine.worker(id).is_some_and(|(s, lost)| {
        !lost && s.incarnation == incarnation && !matches!(s.phase, WorkerState::Finished | WorkerState::Stopped)
    });
    if !holds {
        return Vec::new();
    }
    if let Some(c) = conns.remove(&id) {
        let _ = c.writer.shutdown(Shutdown::Both);
    }
    why.insert(id, "its lease in etcd expired".into());
    machine.on_disconnect(Instant::now(), id)
}

/// A process that passed the gate, asking for a slot.
struct Joining<'a> {
    id: WorkerId,
    hello: Hello,
    stream: TcpStream,
    timing: &'a Timing,
    tx: &'a Sender<Input>,
}

/// Lets the machine decide whether the process of `j` may hold its slot
/// ([`Coordinator::admit`]): refused, it is told why and its connection closed; admitted,
/// its frames are read from now on, and a process it superseded is told to stop.
fn admit(
    j: Joining<'_>,
    machine: &mut Coordinator,
    conns: &mut BTreeMap<WorkerId, Conn>,
    serial: &mut u64,
    on_event: &mut dyn FnMut(MembershipEvent),
) {
    let Joining { id, hello, mut stream, timing, tx } = j;
    let _ = stream.set_write_timeout(Some(timing.lost_after));
    let superseded = match machine.admit(Instant::now(), id, hello.incarnation, hello.addr) {
        Admission::Admit { superseded } => superseded,
        Admission::Refuse { reason } => {
            tracing::warn!(id, "refused a process for worker {id}: {reason}");
            on_event(MembershipEvent::Refused { id, incarnation: hello.incarnation, reason: reason.clone() });
            tell_to_stop(&mut stream, reason);
            return;
        }
    };
    *serial += 1;
    let reader = match stream.try_clone() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(id, "cannot read the connection of worker {id}: {e}");
            return;
        }
    };
    if let Some(mut old) = conns.insert(id, Conn { serial: *serial, writer: stream, addr: hello.addr }) {
        match superseded {
            Some(addr) => tell_to_stop(
                &mut old.writer,
                format!(
                    "worker {id}'s slot was taken by another process at {}; this one (at {addr}) is superseded",
                    hello.addr
                ),
            ),
            None => {
                let _ = old.writer.shutdown(Shutdown::Both);
            }
        }
    }
    // The first pulse at once: the worker judges this coordinator by its bounds from now.
    send(conns, id, wire::KIND_PULSE, &wire::encode_pulse(&pulse_of(timing)));
    spawn_reader(id, *serial, reader, timing.lost_after, tx.clone());
    on_event(MembershipEvent::Joined { id, incarnation: hello.incarnation });
}

/// Carries out the machine's actions: its messages to workers (a quorum's members get
/// their address book first).
fn perform(conns: &mut BTreeMap<WorkerId, Conn>, actions: Vec<Action>) {
    for action in actions {
        let Action::Send { to: Node::Worker(id), msg } = action else { continue };
        if let Msg::Quorum(q) = &msg {
            let book: Vec<(WorkerId, SocketAddr)> =
                q.members.iter().filter_map(|m| conns.get(m).map(|c| (*m, c.addr))).collect();
            send(conns, id, wire::KIND_BOOK, &wire::encode_book(&book));
        }
        send(conns, id, wire::KIND_MSG, &wire::encode(&msg));
    }
}

/// Tells a process that has no place in the job why ([`Msg::Stop`]), and closes its
/// connection: it exits instead of dialling again.
fn tell_to_stop(stream: &mut TcpStream, reason: String) {
    let _ = write_frame(stream, wire::KIND_MSG, &wire::encode(&Msg::Stop { reason }));
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Both);
}

fn send(conns: &mut BTreeMap<WorkerId, Conn>, id: WorkerId, kind: u8, payload: &[u8]) {
    let Some(c) = conns.get_mut(&id) else { return };
    if write_frame(&mut c.writer, kind, payload).and_then(|()| c.writer.flush().map_err(Into::into)).is_err() {
        // The reader sees the connection close and reports it.
        let _ = c.writer.shutdown(Shutdown::Both);
    }
}

fn spawn_reader(id: WorkerId, serial: u64, mut reader: TcpStream, silence: Duration, tx: Sender<Input>) {
    std::thread::spawn(move || {
        let _ = reader.set_read_timeout(Some(silence));
        let why = loop {
            match read_frame(&mut reader, MAX_CONTROL_FRAME) {
                Ok(f) if f.kind == wire::KIND_MSG => match wire::decode(&f.payload) {
                    Ok(msg) => {
                        if tx.send(Input::Frame { id, serial, msg }).is_err() {
                            return;
                        }
                    }
                    Err(e) => break e.to_string(),
                },
                Ok(f) => break format!("unexpected frame kind {:#x}", f.kind),
                // Silence is the protocol's to judge (it declares the worker lost).
                Err(FrameError::Timeout) => {}
                Err(e) => break e.to_string(),
            }
        };
        let _ = reader.shutdown(Shutdown::Both);
        let _ = tx.send(Input::Closed { id, serial, why });
    });
}

/// What a worker's [`Link`] hands to the training loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A protocol message from the coordinator.
    Msg(Msg),
    /// Where the members of the next quorum listen.
    Book(Vec<(WorkerId, SocketAddr)>),
}

struct LinkShared {
    writer: Mutex<Option<TcpStream>>,
    report: Mutex<Option<Vec<u8>>>,
    closed: AtomicBool,
    /// The directory's version when the connection was made.
    dialled: AtomicU64,
    /// When the coordinator was last heard, and what that means.
    watch: Mutex<CoordinatorWatch>,
}

impl LinkShared {
    /// Runs `f` on the watch and says what it found: a loss, or a return after one, is a
    /// warning (the default log level shows it), said once.
    fn judge(&self, f: impl FnOnce(&mut CoordinatorWatch) -> Verdict) {
        let verdict = f(&mut self.watch.lock().unwrap_or_else(|e| e.into_inner()));
        match verdict {
            Verdict::Quiet => {}
            Verdict::Unreachable(text) | Verdict::Back(text) => tracing::warn!("{text}"),
        }
    }
}

/// A worker's connection to the coordinator, kept up until [`Link::close`].
pub struct Link {
    shared: Arc<LinkShared>,
    threads: Vec<JoinHandle<()>>,
}

impl Link {
    /// Connects worker `id` (process `hello.incarnation`) to the coordinator at one of the
    /// `directory`'s addresses, trying until `deadline`. Messages arrive on the returned
    /// receiver; `interrupt` is called with each one first, on the link's thread (to abort
    /// a collective that a message makes moot while the training loop is blocked in it).
    ///
    /// When the connection is lost the link dials the directory's addresses again in turn,
    /// so a coordinator started again on another host (with a higher generation) is found
    /// there; when the directory changes, the link leaves the coordinator it has for the
    /// new one.
    ///
    /// The link keeps a [`CoordinatorWatch`]: a connection that closes, or a coordinator
    /// silent past its heartbeat timeout, is said at once with the instant this worker will
    /// give up, and [`Link::gave_up`] says when that instant has passed.
    ///
    /// When no coordinator answers before `deadline`, the error names where the link looked,
    /// for how long, and what that likely means (the job is over, or has not started).
    pub fn connect(
        directory: &Directory,
        secret: &[u8],
        id: WorkerId,
        hello: Hello,
        heartbeat: Duration,
        deadline: Instant,
        interrupt: Box<dyn Fn(&Msg) + Send>,
    ) -> Result<(Link, Receiver<Incoming>), CommError> {
        let started = Instant::now();
        let (version, first) = dial_from(directory, secret, id, &hello, deadline)
            .map_err(|e| unanswered(directory, started, deadline, e))?;
        // A pause of this process shows as a gap between the pinger's looks.
        let allowance = (2 * heartbeat).max(Duration::from_secs(1));
        let watch = CoordinatorWatch::new(Instant::now(), first.peer_addr().ok(), DEFAULT_BOUNDS, allowance);
        let shared = Arc::new(LinkShared {
            writer: Mutex::new(Some(first.try_clone().map_err(|e| CommError::Setup(e.to_string()))?)),
            report: Mutex::new(None),
            closed: AtomicBool::new(false),
            dialled: AtomicU64::new(version),
            watch: Mutex::new(watch),
        });
        let (tx, rx) = mpsc::channel();
        let reader = {
            let shared = Arc::clone(&shared);
            let secret = secret.to_vec();
            let directory = directory.clone();
            std::thread::spawn(move || {
                let mut stream = first;
                loop {
                    let closed = read_until_closed(&mut stream, &tx, &*interrupt, &shared);
                    let why = match closed {
                        // Told to stop (the job is over, or this process was superseded),
                        // told that the job finished (the coordinator then closes every
                        // connection), or nobody listens any more: there is nothing to
                        // dial back for.
                        Closed::Stopped | Closed::AfterFinish | Closed::Unheard => {
                            // The coordinator's silence from now on is no loss: a worker
                            // that evaluates the final state for long warns of nothing.
                            shared.watch.lock().unwrap_or_else(|e| e.into_inner()).sever();
                            return;
                        }
                        Closed::Lost(why) => why,
                    };
                    if shared.closed.load(Ordering::Relaxed) {
                        // Closed by this worker.
                        return;
                    }
                    if directory.version() != shared.dialled.load(Ordering::Relaxed) {
                        // Left on purpose for the new holder of the role: if that one does
                        // not answer, the watch finds it silent.
                        tracing::info!("left the coordinator for the new one: {why}");
                    } else {
                        shared.judge(|w| w.closed(Instant::now(), why));
                    }
                    // The coordinator is gone: dial again (a restarted one listens on the
                    // same address) until this link is closed.
                    *shared.writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    stream = loop {
                        if shared.closed.load(Ordering::Relaxed) {
                            return;
                        }
                        let soon = Instant::now() + Duration::from_millis(500);
                        match dial_from(&directory, &secret, id, &hello, soon) {
                            Ok((version, s)) => {
                                shared.dialled.store(version, Ordering::Relaxed);
                                shared.judge(|w| w.connected(Instant::now(), s.peer_addr().ok()));
                                break s;
                            }
                            // A coordinator that refuses (started again with another
                            // secret or build) is asked again no faster than twice a second.
                            Err(e @ CommError::Refused(_)) => {
                                tracing::debug!("the coordinator refuses this worker: {e}");
                                std::thread::sleep(Duration::from_millis(500));
                            }
                            Err(e) => tracing::debug!("the coordinator is not back yet: {e}"),
                        }
                    };
                    tracing::info!("connected to the coordinator again");
                    let Ok(w) = stream.try_clone() else { continue };
                    *shared.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
                    repeat_report(&shared);
                }
            })
        };
        let pinger = {
            let shared = Arc::clone(&shared);
            let directory = directory.clone();
            std::thread::spawn(move || {
                while !shared.closed.load(Ordering::Relaxed) {
                    std::thread::sleep(heartbeat);
                    shared.judge(|w| w.check(Instant::now()));
                    if directory.version() != shared.dialled.load(Ordering::Relaxed) {
                        // Another coordinator holds the role now: leave this one (the
                        // reader dials the new one).
                        tracing::info!("the coordinator moved: dialling the new one");
                        if let Some(s) = shared.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                        continue;
                    }
                    repeat_report(&shared);
                }
            })
        };
        Ok((Link { shared, threads: vec![reader, pinger] }, rx))
    }

    /// Why this worker gives up on its coordinator, once it has heard nothing from any for
    /// the coordinator's heartbeat timeout and then its quorum timeout (see
    /// [`CoordinatorWatch::gave_up`]); `None` until then.
    pub fn gave_up(&self) -> Option<String> {
        self.shared.watch.lock().unwrap_or_else(|e| e.into_inner()).gave_up(Instant::now())
    }

    /// Sends `msg` (a report) now, and repeats it every heartbeat until the next.
    pub fn report(&self, msg: &Msg) {
        let payload = wire::encode(msg);
        // Sent and kept under one lock, which the repeats take too: a repeat of the report
        // before never goes out after this one (the coordinator would take the worker
        // back to where it was, e.g. still stepping after it said it was done).
        let mut kept = self.shared.report.lock().unwrap_or_else(|e| e.into_inner());
        write_to(&self.shared, &payload);
        *kept = Some(payload);
    }

    /// A handle on the current connection, to sever it on purpose (the `cut` fault).
    pub fn connection(&self) -> Option<TcpStream> {
        self.shared.writer.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|s| s.try_clone().ok())
    }

    /// A function that closes the connection for good, from any thread, without dialling
    /// again: the `cut` fault.
    pub fn severer(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || {
            shared.closed.store(true, Ordering::Relaxed);
            shared.watch.lock().unwrap_or_else(|e| e.into_inner()).sever();
            *shared.report.lock().unwrap_or_else(|e| e.into_inner()) = None;
            if let Some(s) = shared.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Closes the connection for good.
    pub fn close(mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        if let Some(s) = self.shared.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The error of a first connection: when no coordinator answered before `deadline`, one
/// that says where the link looked, for how long, and what that likely means, instead of
/// the last socket error alone ("Connection refused"). An error before the deadline (a
/// coordinator that refused this worker's handshake) is left as it is.
fn unanswered(directory: &Directory, started: Instant, deadline: Instant, error: CommError) -> CommError {
    // A refusal (a wrong secret, another protocol version) is its own answer.
    if Instant::now() < deadline || matches!(error, CommError::Refused(..)) {
        return error;
    }
    let waited = started.elapsed().as_secs_f64();
    let last = match &error {
        CommError::Setup(text) => text.clone(),
        other => other.to_string(),
    };
    let (_, addrs) = directory.get();
    let text = if addrs.is_empty() {
        format!(
            "no coordinator of the job was named in {waited:.1} s of waiting ({last}): the job may have finished, or \
             not started yet"
        )
    } else {
        let at = addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(", ");
        format!(
            "no coordinator answers at {at} after {waited:.1} s of trying (the last attempt: {last}): the job may \
             have finished, or not started yet; check the address (--coordinator, STEADFAST_COORDINATOR)"
        )
    };
    CommError::Setup(text)
}

/// Sends the newest report again, holding it while it goes out (see [`Link::report`]).
fn repeat_report(shared: &LinkShared) {
    let kept = shared.report.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = kept.as_ref() {
        write_to(shared, r);
    }
}

fn write_to(shared: &LinkShared, payload: &[u8]) {
    let mut w = shared.writer.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = w.as_mut()
        && write_frame(s, wire::KIND_MSG, payload).and_then(|()| s.flush().map_err(Into::into)).is_err()
    {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Dials the directory's addresses until one answers or `deadline` passes, reading the
/// directory again after each round (it may be empty while a coordinator is elected);
/// returns the version of the addresses that answered. A coordinator that answers and
/// fails the handshake ([`CommError::Refused`]: the secrets differ) ends the dialling at
/// once: dialling again cannot help, and would flood its log.
fn dial_from(
    directory: &Directory,
    secret: &[u8],
    id: WorkerId,
    hello: &Hello,
    deadline: Instant,
) -> Result<(u64, TcpStream), CommError> {
    loop {
        let (version, addrs) = directory.get();
        let round = (Instant::now() + Duration::from_secs(2)).min(deadline);
        let error = match addrs.as_slice() {
            [] => {
                std::thread::sleep(Duration::from_millis(100).min(deadline.saturating_duration_since(Instant::now())));
                CommError::Setup("no coordinator is known yet".into())
            }
            addrs => match dial_any(addrs, secret, id, hello, round) {
                Ok(stream) => return Ok((version, stream)),
                Err(e @ CommError::Refused(_)) => return Err(e),
                Err(e) => e,
            },
        };
        if Instant::now() >= deadline {
            return Err(error);
        }
    }
}

/// Dials the coordinators `addrs` in turn, half a second each, until one answers or
/// `deadline` passes (one address: until the deadline); returns the last error. A round
/// in which every address refused the handshake ends at once with that refusal.
fn dial_any(
    addrs: &[SocketAddr],
    secret: &[u8],
    id: WorkerId,
    hello: &Hello,
    deadline: Instant,
) -> Result<TcpStream, CommError> {
    match addrs {
        [] => Err(CommError::Setup("no coordinator address".into())),
        [addr] => dial_coordinator(*addr, secret, id, hello, deadline),
        _ => loop {
            let (mut last, mut refusals) = (None, 0);
            for &addr in addrs {
                let soon = (Instant::now() + Duration::from_millis(500)).min(deadline);
                match dial_coordinator(addr, secret, id, hello, soon) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => {
                        refusals += usize::from(matches!(e, CommError::Refused(_)));
                        last = Some(e);
                    }
                }
            }
            if refusals == addrs.len() || Instant::now() >= deadline {
                return Err(last.expect("two addresses or more were tried"));
            }
        },
    }
}

fn dial_coordinator(
    addr: SocketAddr,
    secret: &[u8],
    id: WorkerId,
    hello: &Hello,
    deadline: Instant,
) -> Result<TcpStream, CommError> {
    let configure = |s: &TcpStream| {
        crate::transport::keepalive(s)?;
        s.set_nodelay(true)?;
        s.set_write_timeout(Some(Duration::from_secs(5)))
    };
    let (mut stream, who) = match dial(addr, secret, id, deadline, &configure) {
        Ok(x) => x,
        Err(DialError::Unreachable(e)) => {
            return Err(CommError::Setup(format!("cannot reach the coordinator at {addr}: {e}")));
        }
        Err(DialError::Refused(e)) => return Err(crate::transport::refused("the coordinator", addr, &e)),
    };
    if who != COORDINATOR_RANK {
        return Err(CommError::Setup(format!("{addr} answered as worker {who}, not as a coordinator")));
    }
    write_frame(&mut stream, wire::KIND_HELLO, &wire::encode_hello(hello))
        .map_err(|e| CommError::Setup(format!("cannot greet the coordinator: {e}")))?;
    stream.set_read_timeout(None).map_err(|e| CommError::Setup(e.to_string()))?;
    Ok(stream)
}

/// How a connection to the coordinator ended.
#[derive(Debug, PartialEq, Eq)]
enum Closed {
    /// After the coordinator told this worker to stop.
    Stopped,
    /// After it told this worker that the job finished (a worker is told so only once it
    /// holds the final state): the coordinator closes every connection then.
    AfterFinish,
    /// The training loop no longer listens (it ended on an error of its own; the
    /// connection stays open until the process ends, through the link's writer).
    Unheard,
    /// Otherwise, for this reason.
    Lost(String),
}

/// Hands the coordinator's messages to the training loop until the connection closes,
/// telling the link's watch of every frame (a [`wire::Pulse`] goes no further). Returns
/// how the connection ended.
fn read_until_closed(
    stream: &mut TcpStream,
    tx: &Sender<Incoming>,
    interrupt: &dyn Fn(&Msg),
    shared: &LinkShared,
) -> Closed {
    let mut last: Option<Msg> = None;
    let ended = |last: &Option<Msg>, why: String| match last {
        Some(Msg::Stop { .. }) => Closed::Stopped,
        Some(Msg::Finish) => Closed::AfterFinish,
        _ => Closed::Lost(why),
    };
    loop {
        let incoming = match read_frame(stream, MAX_CONTROL_FRAME) {
            Ok(f) if f.kind == wire::KIND_PULSE => match wire::decode_pulse(&f.payload) {
                Ok(p) => {
                    shared.judge(|w| w.pulse(Instant::now(), p));
                    continue;
                }
                Err(e) => Err(e),
            },
            Ok(f) if f.kind == wire::KIND_MSG => wire::decode(&f.payload).map(Incoming::Msg),
            Ok(f) if f.kind == wire::KIND_BOOK => wire::decode_book(&f.payload).map(Incoming::Book),
            Ok(f) => {
                tracing::warn!("the coordinator sent a frame of kind {:#x}", f.kind);
                return ended(&last, format!("it sent a frame of kind {:#x}", f.kind));
            }
            Err(e) => {
                tracing::debug!("the coordinator connection closed: {e}");
                return ended(&last, e.to_string());
            }
        };
        shared.judge(|w| w.heard(Instant::now()));
        match incoming {
            Ok(i) => {
                if let Incoming::Msg(m) = &i {
                    interrupt(m);
                    last = Some(m.clone());
                }
                if tx.send(i).is_err() {
                    return Closed::Unheard;
                }
            }
            Err(e) => {
                tracing::warn!("from the coordinator: {e}");
                return ended(&last, e.to_string());
            }
        }
    }
}
