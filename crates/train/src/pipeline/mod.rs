//! Pipeline stages across a job's ranks: where each rank sits ([`Grid`]), the boundary
//! tensors on the wire, a stage's runner over any transport ([`StageLink`]), and the
//! stages' states put back together ([`gather`]).
//!
//! A job of `D * S` ranks runs `D` data-parallel replicas of an `S`-stage pipeline: rank
//! `d * S + s` holds stage `s` of replica `d`, so one replica's stages are neighbours
//! in rank order. Each replica takes the micro-batches `i` with `i mod D == d`
//! ([`schedule::pipeline`](crate::schedule::pipeline)); stage `s`'s replicas sum their
//! gradients among themselves (a [`comm::group::Group`]), vote with the whole job, and
//! compare digests and fingerprints within the stage. With a reproducible reduction
//! the sum of every stage's gradient is the single process's, whatever `D`, `S` and the
//! schedule, so the job ends with the bits of `steadfast train` on the whole model.
//!
//! The last stage of replica 0 (the *collector*) holds the summed loss; it writes the
//! metrics, and at each evaluation and at the end it gathers replica 0's stages into the
//! whole state, scores it and shares the result with every rank.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comm::transport::{CommError, Transport};

use crate::checkpointing::{self, Restored};
use crate::config::PipeSchedule;
use crate::config::TrainConfig;
use crate::driver::Runner;
use crate::error::{ConfigError, TrainError};
use crate::metrics::EvalReport;
use crate::model::Stage;
use crate::optim::Optimizer;
use crate::schedule::{Boundary, Op};
use crate::step::{At, Engine, TrainState};

pub mod groups;

/// The frame kinds of an activation, a gradient, and a named tensor of a stage's state.
const ACTIVATION: u8 = 0x50;
const GRADIENT: u8 = 0x51;
const STATE: u8 = 0x52;
/// The frame that closes a state: its step and update count.
const STATE_END: u8 = 0x53;

/// Where the ranks of a pipeline job sit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Stages of each pipeline.
    pub stages: usize,
    /// Data-parallel copies of the pipeline at the start (micro-batch `i` belongs to
    /// replica `i mod replicas` for the whole job).
    pub replicas: usize,
    /// Each rank's slot, its place at the start (`replica * stages + stage`): `0..D*S`
    /// unless workers were lost and their work rerouted (see [`Grid::rank`]).
    slots: Vec<usize>,
    /// The rank that computes each place's micro-batches, by slot: every send and receive
    /// looks it up.
    cover: Vec<usize>,
}

impl Grid {
    /// The layout of `stages` stages on a job of `world` ranks.
    pub fn of(stages: usize, world: usize) -> Result<Grid, ConfigError> {
        if stages == 0 || world == 0 || !world.is_multiple_of(stages) {
            return Err(ConfigError::Invalid(format!(
                "a job of {world} ranks is not whole pipelines of {stages} stages"
            )));
        }
        Ok(Grid::from_slots(stages, world / stages, (0..world).collect()))
    }

    /// The layout of `slots`, with who covers each place (see [`Grid::rank`]).
    fn from_slots(stages: usize, replicas: usize, slots: Vec<usize>) -> Grid {
        let holder = |place: usize| slots.iter().position(|&s| s == place);
        let cover = (0..replicas * stages)
            .map(|place| {
                let (replica, stage) = (place / stages, place % stages);
                (0..replicas).find_map(|k| holder((replica + k) % replicas * stages + stage)).unwrap_or(0)
            })
            .collect();
        Grid { stages, replicas, slots, cover }
    }

    /// The layout of a job that went on with the workers of `slots` alone (each rank's
    /// place at the start, in rank order): every stage must keep a worker.
    pub fn with_slots(&self, slots: Vec<usize>) -> Result<Grid, ConfigError> {
        let places = self.stages * self.replicas;
        if slots.iter().any(|&s| s >= places) || slots.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ConfigError::Invalid(format!("the slots {slots:?} are not places of {places}")));
        }
        let layout = Grid::from_slots(self.stages, self.replicas, slots);
        if let Some(stage) = (0..self.stages).find(|&s| layout.replicas_of(s).is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "every worker of stage {stage} was lost: its work has nowhere to go (restart the job from its checkpoints)"
            )));
        }
        Ok(layout)
    }

    /// Whether every worker of the start is here.
    pub fn is_whole(&self) -> bool {
        self.slots.len() == self.stages * self.replicas
    }

    /// The slot of `rank`: its rank at the start, the launcher's name for its worker.
    pub fn slot(&self, rank: usize) -> usize {
        self.slots[rank]
    }

    /// The ranks, in order.
    pub fn world(&self) -> usize {
        self.slots.len()
    }

    /// The replica and the stage that `rank` held at the start.
    pub fn place(&self, rank: usize) -> (usize, usize) {
        (self.slots[rank] / self.stages, self.slots[rank] % self.stages)
    }

    /// The rank that computes replica `replica`'s micro-batches at `stage`: the worker of
    /// that place, or, once it is lost, the next replica's worker of the same stage that
    /// is still here (their states are equal, so the bits are too).
    pub fn rank(&self, replica: usize, stage: usize) -> usize {
        self.cover[replica * self.stages + stage]
    }

    /// The replicas whose micro-batches `rank` computes at its stage, in order.
    pub fn serves(&self, rank: usize) -> Vec<usize> {
        let stage = self.place(rank).1;
        (0..self.replicas).filter(|&d| self.rank(d, stage) == rank).collect()
    }

    /// Every rank's stage, indexed by rank: the groups whose sums agree.
    pub fn stage_of(&self) -> Vec<usize> {
        (0..self.world()).map(|r| self.place(r).1).collect()
    }

    /// The ranks that hold `stage`, in rank order.
    pub fn replicas_of(&self, stage: usize) -> Vec<usize> {
        (0..self.world()).filter(|&r| self.place(r).1 == stage).collect()
    }

    /// The rank that holds the loss, writes the metrics and puts the state together: the
    /// last stage of replica 0.
    pub fn collector(&self) -> usize {
        self.rank(0, self.stages - 1)
    }

    /// The step of `rank` in `schedule`: its stage's passes over its replica's
    /// micro-batches (of `micro_batches` a step), and over those rerouted to it.
    pub fn ops(&self, schedule: PipeSchedule, rank: usize, micro_batches: usize) -> Vec<Op> {
        let (replica, stage) = self.place(rank);
        if self.is_whole() {
            return crate::schedule::pipeline(schedule, self.stages, stage, micro_batches, replica, self.replicas);
        }
        // A worker that computes another replica's micro-batches too orders them by GPipe,
        // and so does every stage: their exchanges then come in one order on each link
        // (the schedule changes no bit).
        let serves = self.serves(rank);
        crate::schedule::serving(PipeSchedule::GPipe, self.stages, stage, micro_batches, (&serves, self.replicas))
    }
}

fn kind(tensor: Boundary) -> u8 {
    match tensor {
        Boundary::Activation => ACTIVATION,
        Boundary::Gradient => GRADIENT,
    }
}

/// Sends `data`, micro-batch `micro`'s boundary `tensor`, to rank `to`, as little-endian
/// f32 through `bytes`.
pub fn send_tensor(
    t: &dyn Transport,
    to: usize,
    tensor: Boundary,
    data: &[f32],
    bytes: &mut Vec<u8>,
) -> Result<(), TrainError> {
    bytes.clear();
    bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    t.send(to, kind(tensor), bytes)?;
    Ok(())
}

/// Receives micro-batch `micro`'s boundary `tensor` from rank `from` into `data`, within
/// `timeout`; anything else is a protocol error that names what was expected.
pub fn recv_tensor(
    t: &dyn Transport,
    (from, micro, tensor): (usize, usize, Boundary),
    timeout: Duration,
    bytes: &mut Vec<u8>,
    data: &mut Vec<f32>,
) -> Result<(), TrainError> {
    let got = t.recv_into(from, Instant::now() + timeout, bytes)?;
    if got != kind(tensor) || !bytes.len().is_multiple_of(4) {
        return Err(CommError::Protocol {
            peer: from,
            reason: format!(
                "expected the {tensor:?} of micro-batch {micro} (kind {:#x}), got kind {got:#x} of {} bytes",
                kind(tensor),
                bytes.len()
            ),
        }
        .into());
    }
    data.clear();
    data.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    Ok(())
}

/// One stage's runner over `T`, whose rank `ranks[s]` holds stage `s` of its pipeline. A
/// stage sums its own micro-batches and refuses a non-finite gradient alone (the
/// driver's defaults): with an engine [`for_stage`](crate::step::Engine::for_stage), the
/// stages of one pipeline step their own parameters and together compute the bits of
/// the whole model.
pub struct StageLink<T> {
    transport: T,
    ranks: Vec<usize>,
    timeout: Duration,
    bytes: Vec<u8>,
}

impl<T: Transport> StageLink<T> {
    /// The stage whose transport is `transport`, stage `s` being its rank `s`; a boundary
    /// tensor not received within `timeout` fails the step.
    pub fn new(transport: T, timeout: Duration) -> Self {
        let ranks = (0..transport.world()).collect();
        StageLink { transport, ranks, timeout, bytes: Vec::new() }
    }
}

impl<T: Transport> Runner for StageLink<T> {
    fn send(&mut self, _at: At, peer: usize, _micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        send_tensor(&self.transport, self.ranks[peer], tensor, data, &mut self.bytes)
    }

    fn recv(
        &mut self,
        _at: At,
        peer: usize,
        micro: usize,
        tensor: Boundary,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        recv_tensor(&self.transport, (self.ranks[peer], micro, tensor), self.timeout, &mut self.bytes, data)
    }
}

/// Puts replica 0's stages back together on the [`collector`](Grid::collector): every
/// other stage of replica 0 sends its tensors (parameters, then the optimizer's slots),
/// each named, and the collector writes them into `whole` (a state of the whole model),
/// with the step and update count of its own `stage` state. Ranks of other replicas do
/// nothing. Returns whether `whole` now holds the job's state (on the collector alone).
pub fn gather(
    t: &dyn Transport,
    layout: &Grid,
    stage: &TrainState,
    whole: &mut TrainState,
    timeout: Duration,
) -> Result<bool, TrainError> {
    let (rank, collector) = (t.rank(), layout.collector());
    if layout.rank(0, layout.place(rank).1) != rank {
        return Ok(false);
    }
    if rank != collector {
        send_state(t, collector, stage)?;
        return Ok(false);
    }
    let mut filled = vec![false; whole.params.len() + whole.optimizer.slots().len()];
    for tensor in stage.tensors() {
        slot(whole, &mut filled, &tensor.name, collector)?.copy_from_slice(&tensor.data);
    }
    for s in (0..layout.stages).filter(|&s| layout.rank(0, s) != collector) {
        recv_tensors(t, layout.rank(0, s), whole, &mut filled, timeout)?;
    }
    if let Some(missing) = filled.iter().position(|f| !f) {
        let name = whole.tensors().nth(missing).map(|t| t.name.clone()).unwrap_or_default();
        return Err(ConfigError::Invalid(format!("no stage sent {name}")).into());
    }
    whole.step = stage.step;
    whole.optimizer.set_updates(stage.optimizer.updates());
    Ok(true)
}

/// Sends `state` to rank `to`: its step and update count, then each tensor named.
pub fn send_state(t: &dyn Transport, to: usize, state: &TrainState) -> Result<(), TrainError> {
    let mut bytes = Vec::new();
    for tensor in state.tensors() {
        bytes.clear();
        bytes.extend((tensor.name.len() as u32).to_le_bytes());
        bytes.extend(tensor.name.as_bytes());
        bytes.extend(tensor.data.iter().flat_map(|v| v.to_le_bytes()));
        t.send(to, STATE, &bytes)?;
    }
    bytes.clear();
    bytes.extend(state.step.to_le_bytes());
    bytes.extend(state.optimizer.updates().to_le_bytes());
    t.send(to, STATE_END, &bytes)?;
    Ok(())
}

/// Receives into `state` what [`send_state`] sent from rank `from`: every tensor of
/// `state` must come, once, with its length; the step and update count follow.
pub fn recv_state(t: &dyn Transport, from: usize, state: &mut TrainState, timeout: Duration) -> Result<(), TrainError> {
    let mut filled = vec![false; state.params.len() + state.optimizer.slots().len()];
    let (step, updates) = recv_tensors(t, from, state, &mut filled, timeout)?;
    if let Some(missing) = filled.iter().position(|f| !f) {
        let name = state.tensors().nth(missing).map(|t| t.name.clone()).unwrap_or_default();
        return Err(protocol(from, format!("the state sent lacks {name}")));
    }
    state.step = step;
    state.optimizer.set_updates(updates);
    Ok(())
}

/// Receives named tensors from `from` into `state` until the closing frame; returns the
/// step and update count it carries.
fn recv_tensors(
    t: &dyn Transport,
    from: usize,
    state: &mut TrainState,
    filled: &mut [bool],
    timeout: Duration,
) -> Result<(u64, u64), TrainError> {
    let mut bytes = Vec::new();
    loop {
        let kind = t.recv_into(from, Instant::now() + timeout, &mut bytes)?;
        match kind {
            STATE_END if bytes.len() == 16 => {
                let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
                return Ok((word(0), word(8)));
            }
            STATE => {}
            _ => {
                let what = format!("kind {kind:#x} of {} bytes", bytes.len());
                return Err(protocol(from, format!("expected a tensor of a stage's state, got {what}")));
            }
        }
        let (name, values) = named(&bytes).ok_or_else(|| protocol(from, "a malformed state tensor".into()))?;
        let into = slot(state, filled, name, from)?;
        if values.len() != 4 * into.len() {
            return Err(protocol(from, format!("{name}: {} bytes for {} values", values.len(), into.len())));
        }
        for (v, b) in into.iter_mut().zip(values.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// The name and the value bytes of a state tensor's frame.
fn named(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    Some((name, &bytes[4 + len..]))
}

/// The values of `whole`'s tensor `name`, to be written once.
fn slot<'w>(
    whole: &'w mut TrainState,
    filled: &mut [bool],
    name: &str,
    from: usize,
) -> Result<&'w mut [f32], TrainError> {
    let params = whole.params.len();
    let (index, tensor) = match whole.params.iter().position(|p| p.name == name) {
        Some(i) => (i, &mut whole.params[i]),
        None => match whole.optimizer.slots().iter().position(|p| p.name == name) {
            Some(i) => (params + i, &mut whole.optimizer.slots_mut()[i]),
            None => return Err(protocol(from, format!("the model has no tensor {name}"))),
        },
    };
    if std::mem::replace(&mut filled[index], true) {
        return Err(protocol(from, format!("{name} was sent twice")));
    }
    Ok(&mut tensor.data)
}

fn protocol(peer: usize, reason: String) -> TrainError {
    CommError::Protocol { peer, reason }.into()
}

/// What the collector tells every rank after an evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Shared {
    /// The whole model's evaluation.
    pub report: EvalReport,
    /// The whole state's fingerprint.
    pub fingerprint: u64,
    /// The last step's training loss.
    pub loss: f32,
}

/// Shares the collector's evaluation, fingerprint and loss with every rank of the job:
/// the collector passes `Some`, the others `None`, and every rank gets the collector's.
pub fn share(t: &dyn Transport, layout: &Grid, mine: Option<&Shared>, timeout: Duration) -> Result<Shared, TrainError> {
    let words = match mine {
        Some(Shared { report: r, fingerprint, loss }) => [
            r.step,
            r.loss.to_bits(),
            r.accuracy.to_bits(),
            r.perplexity.unwrap_or(f64::NAN).to_bits(),
            *fingerprint,
            u64::from(loss.to_bits()),
        ],
        None => [0; 6],
    };
    let all = comm::collective::all_gather_words(t, &words, timeout)?;
    let w = &all[layout.collector()];
    let perplexity = f64::from_bits(w[3]);
    let report = EvalReport {
        step: w[0],
        loss: f64::from_bits(w[1]),
        accuracy: f64::from_bits(w[2]),
        perplexity: (!perplexity.is_nan()).then_some(perplexity),
    };
    Ok(Shared { report, fingerprint: w[4], loss: f32::from_bits(w[5] as u32) })
}

/// A rank's stage of a pipeline job, as the trainer keeps it.
pub(crate) struct Staged {
    pub(crate) layout: Grid,
    /// The stage.
    pub(crate) stage: Stage,
    /// The whole model's state, which the collector gathers the stages into (the
    /// initial state until then).
    pub(crate) whole: TrainState,
    /// The wire form of a boundary tensor.
    pub(crate) bytes: Vec<u8>,
    /// What the collector shared at the last evaluation.
    pub(crate) shared: Option<Shared>,
    /// The logs of the boundary tensors this stage sends, by the stage they go to.
    logs: Vec<(usize, ckpt::log::LogWriter)>,
    /// Whether a log's failure was reported.
    log_failed: bool,
    /// The newest step whose checkpoint every stage has made durable.
    durable: u64,
}

impl Staged {
    /// Cuts `state` (the whole model's initial state, which it becomes the stage's) and
    /// `engine` to the stage of `rank`.
    pub(crate) fn cut<'a>(
        config: &TrainConfig,
        layout: Grid,
        rank: usize,
        state: &mut TrainState,
        engine: Engine<'a>,
    ) -> Result<(Staged, Engine<'a>), TrainError> {
        let (replica, index) = layout.place(rank);
        let stage = engine.stage(layout.stages, index)?;
        let fresh = fresh_stage(config, &stage, state);
        let whole = std::mem::replace(state, fresh);
        let logs = open_logs(config, &layout, replica, index)?;
        let staged = Staged {
            layout,
            stage: stage.clone(),
            whole,
            bytes: Vec::new(),
            shared: None,
            logs,
            log_failed: false,
            durable: 0,
        };
        Ok((staged, engine.for_stage(stage)))
    }

    /// Sends `data`, the boundary `tensor` of micro-batch `micro` at `step`, over `t` to the
    /// rank that computes that micro-batch at stage `peer`, and logs it if that boundary is
    /// logged.
    pub(crate) fn send(
        &mut self,
        t: &dyn Transport,
        (step, peer, micro): (u64, usize, usize),
        tensor: Boundary,
        data: &[f32],
    ) -> Result<(), TrainError> {
        let to = self.layout.rank(micro % self.layout.replicas, peer);
        send_tensor(t, to, tensor, data, &mut self.bytes)?;
        self.log_sent(peer, step, micro, data);
        Ok(())
    }

    /// Receives into `data` the boundary `tensor` of micro-batch `micro` over `t` from the
    /// rank that computes that micro-batch at stage `peer`, within `timeout`.
    pub(crate) fn recv(
        &mut self,
        t: &dyn Transport,
        (peer, micro, tensor): (usize, usize, Boundary),
        timeout: Duration,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let from = self.layout.rank(micro % self.layout.replicas, peer);
        recv_tensor(t, (from, micro, tensor), timeout, &mut self.bytes, data)
    }

    /// Logs `data`, sent to stage `to` at `step` for micro-batch `micro`, if that boundary
    /// is logged.
    pub(crate) fn log_sent(&mut self, to: usize, step: u64, micro: usize, data: &[f32]) {
        if let Some((_, log)) = self.logs.iter_mut().find(|(peer, _)| *peer == to) {
            log.record(step, micro as u32, data);
        }
    }

    /// Step `step` is over: its logs are completed. Returns a log's failure the first
    /// time it is seen (the logs lack every step from it on).
    pub(crate) fn end_step(&mut self, step: u64) -> Option<String> {
        for (_, log) in &mut self.logs {
            log.end_step(step);
        }
        if self.log_failed {
            return None;
        }
        let failure = self.logs.iter().find_map(|(_, log)| log.failure());
        self.log_failed = failure.is_some();
        failure
    }

    /// Every part of every stage's checkpoint of `step` is durable: the logs older than
    /// the checkpoint before it go. (Not older than `step` itself: its commit runs in the
    /// background of each stage's first writer, which may be lost before it ends, and a
    /// stage that replays starts from its newest committed checkpoint.)
    pub(crate) fn checkpointed(&mut self, step: u64) {
        if step <= self.durable {
            return;
        }
        for (_, log) in &mut self.logs {
            log.prune_before(self.durable);
        }
        self.durable = step;
    }

    /// Waits for the logs to be written; their totals.
    pub(crate) fn finish_logs(&mut self) -> Option<ckpt::log::LogStats> {
        let mut total: Option<ckpt::log::LogStats> = None;
        for (_, log) in self.logs.drain(..) {
            let stats = log.stats().clone();
            if let Err(e) = log.finish() {
                tracing::error!("a boundary log failed: {e}");
            }
            let t = total.get_or_insert_with(Default::default);
            t.records += stats.records;
            t.bytes += stats.bytes;
            t.steps = t.steps.max(stats.steps);
            t.stall += stats.stall;
            t.peak = t.peak.max(stats.peak);
        }
        total
    }

    /// The stage's checkpoint root under the job's `root`: each stage's replicas write its
    /// checkpoints there, in parts.
    pub(crate) fn root(&self, root: &Path) -> PathBuf {
        self.root_of(root, self.stage.index)
    }

    /// Stage `stage`'s checkpoint root under the job's `root`.
    pub(crate) fn root_of(&self, root: &Path, stage: usize) -> PathBuf {
        root.join(ckpt::reader::stage_dir_name(stage, self.layout.stages))
    }

    /// What the logs hold of the step in progress is dropped: it failed, and is sent again.
    pub(crate) fn abandon_logs(&mut self) {
        for (_, log) in &mut self.logs {
            log.abandon();
        }
    }

    /// This rank's part of its stage's checkpoints: one for each worker of its stage.
    pub(crate) fn part(&self, rank: usize) -> ckpt::Part {
        let holders = self.layout.replicas_of(self.stage.index);
        ckpt::Part::of(holders.iter().position(|&r| r == rank).unwrap_or(0), holders.len())
    }

    /// After every stage resumed from its own newest checkpoint that verifies (`restored`,
    /// `state`): every rank goes to the newest step of which every stage has a checkpoint
    /// that verifies, or, when some stage has none, to the start. Rounds of agreement: each
    /// round every rank says its step, and each rank ahead of the oldest goes back to its
    /// stage's newest checkpoint no newer than that step that verifies (a stage may lack
    /// that very step, or hold it damaged: it then goes further back, and the others follow
    /// in the next round). Steps only go down, so the rounds end. Returns where it resumed,
    /// with every newer checkpoint passed over among its `skipped`.
    pub(crate) fn agree_on_resume(
        &self,
        t: &dyn Transport,
        config: &TrainConfig,
        state: &mut TrainState,
        restored: Option<Restored>,
    ) -> Result<Option<Restored>, TrainError> {
        let timeout = config.collective_timeout();
        let mut restored = restored;
        let mut passed_over: Vec<(PathBuf, String)> = Vec::new();
        loop {
            let steps = comm::collective::all_gather_u64(t, state.step, timeout)?;
            let common = steps.iter().copied().min().unwrap_or(0);
            if steps.iter().all(|&s| s == common) {
                if let Some(r) = restored.as_mut() {
                    r.skipped.extend(passed_over);
                }
                return Ok(restored);
            }
            if state.step == common {
                continue;
            }
            let Some(newest) = restored.take() else {
                return Err(ConfigError::Invalid("no checkpoint to go back from".into()).into());
            };
            let root = newest.dir.parent().unwrap_or(&newest.dir).to_path_buf();
            tracing::warn!(
                step = state.step,
                common,
                "another stage's newest checkpoint is older: going back from {} to step {common} or before",
                newest.dir.display()
            );
            passed_over.push((newest.dir, "newer than another stage's newest checkpoint".into()));
            passed_over.extend(newest.skipped);
            restored = self.go_back(config, state, &root, common, &mut passed_over)?;
        }
    }

    /// Restores this stage's newest checkpoint under its root `root` no newer than `step`
    /// that verifies, each one that does not joining `passed_over`; with none, the stage's
    /// initial state (`None`).
    fn go_back(
        &self,
        config: &TrainConfig,
        state: &mut TrainState,
        root: &Path,
        step: u64,
        passed_over: &mut Vec<(PathBuf, String)>,
    ) -> Result<Option<Restored>, TrainError> {
        let older = ckpt::store::list(root)?.into_iter().rev().filter(|(s, _)| *s <= step && *s > 0);
        for (_, dir) in older {
            match checkpointing::restore(&dir, config, state) {
                Ok(again) => return Ok(Some(again)),
                Err(TrainError::Checkpoint(e)) => {
                    tracing::error!(dir = %dir.display(), "checkpoint does not verify, trying the one before it: {e}");
                    passed_over.push((dir, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        tracing::warn!(
            step = state.step,
            "this stage has no checkpoint of step {step} or before that verifies: every stage starts from the beginning"
        );
        *state = fresh_stage(config, &self.stage, &self.whole);
        Ok(None)
    }
}

/// The log writers of stage `stage` of `replica`: towards each neighbour across a logged
/// boundary.
fn open_logs(
    config: &TrainConfig,
    layout: &Grid,
    replica: usize,
    stage: usize,
) -> Result<Vec<(usize, ckpt::log::LogWriter)>, TrainError> {
    let Some(log) = &config.log else { return Ok(Vec::new()) };
    let mut logs = Vec::new();
    let neighbours = [(stage + 1 < layout.stages).then(|| (stage, stage + 1)), stage.checked_sub(1).map(|b| (b, b))];
    for (boundary, to) in neighbours.into_iter().flatten() {
        if log.boundaries.contains(&boundary) {
            let key = ckpt::log::Edge { replica: replica as u32, from: stage as u32, to: to as u32 };
            let writer = ckpt::log::LogWriter::open(&log.dir, key, log.memory)
                .map_err(|e| ConfigError::Invalid(format!("cannot log boundary {boundary}: {e}")))?;
            logs.push((to, writer));
        }
    }
    Ok(logs)
}

/// The initial state of `stage`, cut from the whole model's initial state `whole`.
pub(crate) fn fresh_stage(config: &TrainConfig, stage: &Stage, whole: &TrainState) -> TrainState {
    let params = stage.params(&whole.params);
    let optimizer = Optimizer::new(config.optimizer, config.optim, &params);
    TrainState::new(params, optimizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_s_stages_are_neighbours_and_a_stage_s_replicas_a_group() {
        let l = Grid::of(3, 6).unwrap();
        assert_eq!((l.replicas, l.place(4), l.rank(1, 1)), (2, (1, 1), 4));
        assert_eq!(l.replicas_of(2), [2, 5]);
        assert_eq!(l.stage_of(), [0, 1, 2, 0, 1, 2]);
        assert_eq!(l.collector(), 2);
        assert!(Grid::of(4, 6).is_err());
        assert!(Grid::of(0, 6).is_err());
    }

    #[test]
    fn a_lost_worker_s_micro_batches_go_to_its_stage_s_next_replica() {
        // Three replicas of two stages; slots 1 (replica 0, stage 1) and 2 are lost.
        let l = Grid::of(2, 6).unwrap().with_slots(vec![0, 3, 4, 5]).unwrap();
        assert!(!l.is_whole());
        assert_eq!((l.place(1), l.place(2)), ((1, 1), (2, 0)));
        // Stage 1: replica 0's micro-batches go to replica 1's worker (rank 1).
        assert_eq!([l.rank(0, 1), l.rank(1, 1), l.rank(2, 1)], [1, 1, 3]);
        // Stage 0: replica 1's go to replica 2's (rank 2).
        assert_eq!([l.rank(0, 0), l.rank(1, 0), l.rank(2, 0)], [0, 2, 2]);
        assert_eq!((l.serves(1), l.serves(2), l.serves(0)), (vec![0, 1], vec![1, 2], vec![0]));
        assert_eq!((l.replicas_of(0), l.replicas_of(1)), (vec![0, 2], vec![1, 3]));
        assert_eq!(l.collector(), 1);
        let gone = Grid::of(2, 4).unwrap().with_slots(vec![0, 2]).unwrap_err();
        assert!(gone.to_string().contains("every worker of stage 1 was lost"), "{gone}");
    }
}
