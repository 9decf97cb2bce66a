//! The elastic worker of a PyTorch job (`steadfast.elastic`): the step protocol's
//! [`Worker`], the same as the trainer's elastic worker runs, carried out on a state that
//! lives in Python.
//!
//! The protocol decides everything; this shell carries out its actions, and hands Python
//! only what Python alone can do:
//!
//! - **compute**: [`ElasticWorker::next`] returns `(step, rank, world)`; the Python loop
//!   runs the forward and backward of micro-batches `i` with `i % world == rank`, each into
//!   its own gradient buffer, and hands them to [`ElasticWorker::computed`], which sums
//!   every member's with the reproducible all-reduce over the epoch's mesh (the same bits
//!   for any number of members) and casts the ballot.
//! - **apply**: the host's `apply(step, which)` runs the optimizer on the sum in buffer
//!   `which` of the two the Python side allocated; once the update is hashed, the host
//!   hears `at_rest(steps_done)` (where its hooks may touch the state at rest).
//! - **the state**: the host's `state()` returns it as a header and tensors (see
//!   [`image`]), which this shell hashes (the fingerprint the protocol compares), images
//!   once per epoch for the workers that fetch it, and the host's `load(image, header)`
//!   takes a fetched state back.
//!
//! Everything else (the coordinator's link and its heartbeats, the epoch's mesh, the vote,
//! the replica check, the fetch from several sources at once, the server of other workers'
//! fetches) runs here in Rust, with the interpreter's lock released while it waits.
#![deny(unsafe_code)]

mod image;
mod saving;

use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use comm::control::{Incoming, Link};
use comm::job::{DistConfig, ElasticWorker as Placed, OnDivergence};
use comm::member::{Ballot, Current};
use comm::port::Port;
use comm::protocol::wire::Hello;
use comm::protocol::{Action, Checks, Event, Node, ReplayFailure, Saved, Timing, Worker, WorkerId};
use comm::transfer::Want;
use comm::transport::{CommError, TcpConfig};
use comm::{ReduceMode, collective::Reducer};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::checkpoint::TensorAt;
use crate::host::{host_bytes, host_bytes_mut};
use image::{At, Image, Served};
use saving::Saving;

pyo3::create_exception!(
    steadfast,
    JobError,
    pyo3::exceptions::PyRuntimeError,
    "The elastic job cannot go on: the coordinator stopped it, was lost, or its replicas diverged."
);

pyo3::create_exception!(
    steadfast,
    JobOver,
    JobError,
    "The elastic job had finished before this process joined (a replacement started before its end): \
     this process holds nothing of the final state, and that is no failure."
);

/// What the job's launcher told this process, read from its environment.
fn placed(check_every: u64, repair: bool) -> PyResult<Option<Placed>> {
    let flags = launch::place::WorkerFlags {
        join: launch::place::JoinFlags {
            engine: launch::place::Collectives::Steadfast,
            rank: None,
            world_size: None,
            coordinator: None,
            rendezvous: None,
            bind: None,
            comm_timeout: 60.0,
        },
        elastic: false,
        incarnation: None,
        copy_every: None,
        fingerprint_every: check_every,
        on_divergence: if repair { OnDivergence::Repair } else { OnDivergence::Stop },
    };
    match launch::place::dist_config(&flags) {
        Ok(None) => Ok(None),
        Ok(Some(DistConfig::Elastic(e))) if e.copy_every.is_some() => Err(PyValueError::new_err(
            "a Python worker recovers from its live replicas: launch it without --copy-every",
        )),
        Ok(Some(DistConfig::Elastic(e))) => Ok(Some(e)),
        Ok(Some(_)) => Err(PyValueError::new_err(
            "this process was started as a rank of a static job: a Python worker runs in an elastic job \
             (steadfast launch --nproc N --max-restarts K -- python train.py)",
        )),
        Err(e) => Err(PyValueError::new_err(e.to_string())),
    }
}

/// Whether this process was started as a worker of an elastic job (its launcher's
/// environment says so).
#[pyfunction]
fn launched() -> bool {
    launch::place::env_first(&["STEADFAST_ELASTIC"]).is_some_and(|v| v == "1")
}

/// The reproducible mean of micro-batch gradients in one process: what the elastic
/// worker's all-reduce gives for any number of members, into `out` (float32, `n` elements
/// each), divided by `micro_batches`.
#[pyfunction]
fn mean_of_micro_batches(py: Python<'_>, terms: Vec<At>, out: At, micro_batches: usize) -> PyResult<()> {
    let out = floats_mut(out)?;
    let parts = terms.iter().map(|&t| floats(t)).collect::<PyResult<Vec<_>>>()?;
    if parts.iter().any(|p| p.len() != out.len()) {
        return Err(PyValueError::new_err("the micro-batches' gradients differ in length from the sum's"));
    }
    py.allow_threads(|| {
        ReduceMode::Reproducible
            .check_parts(parts.len() as u64, 1)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        comm::sum_parts_into(ReduceMode::Reproducible, &parts, out, &mut repro::batched::Scratch::default());
        divide(out, micro_batches);
        Ok(())
    })
}

fn floats(at: At) -> PyResult<&'static [f32]> {
    bytemuck::try_cast_slice(host_bytes(at.0, at.1))
        .map_err(|e| PyValueError::new_err(format!("a gradient is not a whole, aligned float32 tensor: {e}")))
}

fn floats_mut(at: At) -> PyResult<&'static mut [f32]> {
    bytemuck::try_cast_slice_mut(host_bytes_mut(at.0, at.1))
        .map_err(|e| PyValueError::new_err(format!("a sum buffer is not a whole, aligned float32 tensor: {e}")))
}

fn divide(sum: &mut [f32], micro_batches: usize) {
    let m = micro_batches as f32;
    for x in sum {
        *x /= m;
    }
}

/// A step handed to Python to compute: `(epoch, step)`, and this worker's rank among the
/// epoch's members and their number.
type Pending = ((u64, u64), (usize, usize));

/// One worker of an elastic PyTorch job.
#[pyclass(module = "steadfast._steadfast", unsendable)]
pub struct ElasticWorker {
    id: WorkerId,
    incarnation: u64,
    worker: Worker,
    queue: VecDeque<Action>,
    link: Option<Link>,
    incoming: Receiver<Incoming>,
    in_etcd: Vec<comm::etcd::elastic::Background>,
    port: Port,
    book: BTreeMap<WorkerId, SocketAddr>,
    tcp: TcpConfig,
    current: Current,
    timeout: Duration,
    heartbeat: Duration,
    reducer: Reducer,
    micro_batches: usize,
    /// The two sum buffers the Python side allocated: `held` is the one that holds the
    /// sum of `sum_step`, not applied yet (or where the next sum goes when none is held).
    sums: [At; 2],
    held: usize,
    sum_step: Option<u64>,
    /// The image this worker serves, and the epoch it was taken for.
    served: Served,
    imaged: Option<u64>,
    /// The buffer of the image served before, reused for the next.
    spare: Vec<u8>,
    /// The step handed to Python to compute.
    pending: Option<Pending>,
    /// The state as the host last handed it over (`state()`): its header, and where its
    /// tensors lie, which the host keeps alive until it hands the state over again. A
    /// check at rest hashes them again without asking Python: between an update and the
    /// next step nothing but the state's own memory can change (and a flip in it is what
    /// the check is for).
    last_state: Option<(Vec<u8>, Vec<At>)>,
    /// The members of the epoch whose step is computed, in rank order.
    members: Vec<WorkerId>,
    /// Whether the job is over (finished, or stopped).
    over: bool,
    /// The job's checkpoints, if it takes any.
    saving: Option<Saving>,
}

#[pymethods]
impl ElasticWorker {
    /// Joins the elastic job this process was launched into, holding the state that
    /// `host.state()` returns (at `step`: 0 for a fresh one), in a job of `steps` steps of
    /// `micro_batches` micro-batches each; `sums` are the two float32 buffers the sum goes
    /// into. `check_every`: compare the replicas' fingerprints after every that many
    /// updates (0: after the last only); `repair`: repair a replica whose state changed
    /// from the healthy ones instead of stopping the job.
    #[new]
    ///
    /// `checkpoint`: `(root, every, keep_last)`: the members write a checkpoint of the
    /// state under `root` every `every` steps and after the last, a part each, in the
    /// background; `keep_last` of them are kept (None: all).
    #[pyo3(signature = (host, step, steps, micro_batches, sums, check_every, repair, checkpoint=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: &Bound<'_, PyAny>,
        step: u64,
        steps: u64,
        micro_batches: usize,
        sums: [At; 2],
        check_every: u64,
        repair: bool,
        checkpoint: Option<(std::path::PathBuf, u64, Option<usize>)>,
    ) -> PyResult<Self> {
        let d = placed(check_every, repair)?
            .ok_or_else(|| PyRuntimeError::new_err("this process was not started by `steadfast launch`"))?;
        let saving = checkpoint.map(|c| Saving::new(c, steps, comm::member::job_tag(&d))).transpose()?;
        let fingerprint = hash_host(py, host)?;
        let id = d.slot as WorkerId;
        let incarnation = d.job.incarnation;
        let timeout = d.job.timeout;
        let setup = |e: CommError| match e {
            CommError::Aborted(reason) if reason == comm::control::JOINED_AFTER_THE_END => JobOver::new_err(reason),
            e => JobError::new_err(e.to_string()),
        };
        let listener = TcpListener::bind((d.bind, 0))
            .map_err(|e| JobError::new_err(format!("cannot listen on {}: {e}", d.bind)))?;
        let mut port = Port::open(listener, &d.secret, id).map_err(setup)?;
        let served = Served::default();
        served.spawn_server(&mut port).map_err(setup)?;
        let timing = Timing { vote_timeout: timeout, ..Timing::default() };
        let current = Current::default();
        let hello = Hello { incarnation, addr: port.addr() };
        let deadline = Instant::now() + timeout.max(Duration::from_secs(30));
        let (link, incoming, in_etcd) = py
            .allow_threads(|| {
                let (directory, in_etcd) = comm::member::find_coordinator(&d.coordinator, id, incarnation, |note| {
                    eprintln!("[steadfast] {note}")
                })?;
                let interrupt = current.aborts_moot_collectives();
                let (link, incoming) =
                    Link::connect(&directory, &d.secret, id, hello, timing.heartbeat, deadline, interrupt)?;
                Ok((link, incoming, in_etcd))
            })
            .map_err(setup)?;
        let checks = Checks { every: check_every, repair };
        let (worker, first) =
            Worker::new((id, incarnation), steps, (step, fingerprint), (timing, checks), Instant::now());
        Ok(ElasticWorker {
            id,
            incarnation,
            worker,
            queue: first.into(),
            link: Some(link),
            incoming,
            in_etcd,
            port,
            book: BTreeMap::new(),
            tcp: comm::member::mesh_config(&d.secret, timeout),
            current,
            timeout,
            heartbeat: timing.heartbeat,
            reducer: Reducer::default(),
            micro_batches,
            sums,
            held: 0,
            sum_step: None,
            served,
            imaged: None,
            spare: Vec::new(),
            pending: None,
            last_state: None,
            members: Vec::new(),
            over: false,
            saving,
        })
    }

    /// This worker's id in the job.
    #[getter]
    fn id(&self) -> u64 {
        u64::from(self.id)
    }

    /// Which process of its slot this is (0 for the first; a replacement counts up).
    #[getter]
    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Carries out the protocol's actions until Python has a step to compute: returns
    /// `(step, rank, world)`, or `None` once the job is complete. Raises `JobOver` when
    /// the job had finished before this process joined.
    fn next(&mut self, py: Python<'_>, host: &Bound<'_, PyAny>) -> PyResult<Option<(u64, usize, usize)>> {
        if self.pending.is_some() {
            return Err(PyRuntimeError::new_err("the step handed out is not computed yet: call computed() first"));
        }
        loop {
            if let Some(reason) = self.link.as_ref().and_then(Link::gave_up) {
                self.over = true;
                return Err(JobError::new_err(format!("the coordinator was lost: {reason}")));
            }
            self.image_if_source(py, host)?;
            let Some(action) = self.queue.pop_front() else {
                py.allow_threads(|| self.listen());
                continue;
            };
            match action {
                Action::Send { to: Node::Coordinator, msg } => {
                    if let Some(link) = &self.link {
                        link.report(&msg);
                    }
                }
                Action::Send { .. } => {}
                Action::Vote { epoch, step, ok, digest, saved, .. } => {
                    py.allow_threads(|| self.vote((epoch, step), Ballot { ok, digest, saved }))
                }
                Action::Compute { epoch, step, rank, members, verify } => {
                    if let Some(found) = verify.and_then(|v| self.changed(py, host, v).transpose()) {
                        self.hear(Event::Changed { fingerprint: found? });
                        continue;
                    }
                    let world = members.len();
                    if let Some(out) = self.begin(py, (epoch, step), (rank, members))? {
                        return Ok(Some((out, rank, world)));
                    }
                }
                Action::Apply { step, verify, hash, compare, agreed } => {
                    if let (Some(agreed), Some(saving)) = (agreed, self.saving.as_mut()) {
                        saving.heard(agreed);
                    }
                    self.apply(py, host, step, verify, (hash, compare))?
                }
                Action::Fetch { epoch, step, fingerprint, sources } => {
                    self.fetch(py, host, (epoch, step, fingerprint), &sources)?
                }
                Action::Hash => {
                    let fingerprint = self.hash(py, host)?;
                    for a in self.worker.step(Instant::now(), Event::Hashed { fingerprint }).into_iter().rev() {
                        self.queue.push_front(a);
                    }
                }
                // A Python job holds no pipeline stages: there is nothing to load or replay.
                Action::Load { epoch, .. } => self.hear(Event::Loaded { epoch, state: None }),
                Action::Replay { epoch, .. } => {
                    self.hear(Event::Replayed { epoch, state: Err(ReplayFailure::Impossible) })
                }
                Action::Restore { step, .. } => {
                    return Err(JobError::new_err(format!(
                        "the protocol restores a copy of step {step}, and none is kept"
                    )));
                }
                Action::Repair { step, outvoted } => {
                    eprintln!("[steadfast] step {step}: workers {outvoted:?} hold another state: repairing them");
                }
                Action::Diverged { step, outvoted } => {
                    self.over = true;
                    if let Some((_, mesh)) = self.current.get() {
                        let _ = py.allow_threads(|| comm::collective::barrier(&*mesh, self.timeout));
                    }
                    return Err(JobError::new_err(format!(
                        "the replicas diverged after step {step}: workers {outvoted:?} hold another state"
                    )));
                }
                Action::Finished => {
                    self.over = true;
                    self.finish_checkpoints(py)?;
                    return Ok(None);
                }
                Action::Stopped { reason } if reason == comm::control::JOINED_AFTER_THE_END => {
                    self.over = true;
                    return Err(JobOver::new_err(reason));
                }
                Action::Stopped { reason } => {
                    self.over = true;
                    return Err(JobError::new_err(format!("the coordinator stopped the job: {reason}")));
                }
            }
        }
    }

    /// The step handed out is computed: `terms` are this worker's micro-batches'
    /// gradients, each a float32 buffer of the sum's length, in the order of their
    /// indices. Sums them with every member's; the protocol hears the outcome (a lost
    /// member fails the step, which a later epoch computes again).
    fn computed(&mut self, py: Python<'_>, terms: Vec<At>) -> PyResult<()> {
        let ((epoch, step), (rank, world)) =
            self.pending.take().ok_or_else(|| PyRuntimeError::new_err("no step was handed out to compute"))?;
        let parts = terms.iter().map(|&t| floats(t)).collect::<PyResult<Vec<_>>>()?;
        let into = if self.sum_step.is_some() { 1 - self.held } else { self.held };
        let out = floats_mut(self.sums[into])?;
        if parts.iter().any(|p| p.len() != out.len()) {
            return Err(PyValueError::new_err("the micro-batches' gradients differ in length from the sum's"));
        }
        let summed = py.allow_threads(|| match self.current.get() {
            Some((e, mesh)) if e == epoch => {
                let mode = ReduceMode::Reproducible;
                self.reducer.sum_parts(&*mesh, &parts, out, mode, self.timeout).map_err(|e| e.to_string())?;
                divide(out, self.micro_batches);
                let finite = out.iter().all(|x| x.is_finite());
                Ok((finite, ckpt::checksum(bytemuck::cast_slice(out))))
            }
            _ => Err("the epoch's mesh is gone".to_owned()),
        });
        let sum = match summed {
            Ok(check) => {
                self.held = into;
                self.sum_step = Some(step);
                Some(check)
            }
            Err(why) => {
                eprintln!("[steadfast] step {step}: the all-reduce failed: {why}");
                None
            }
        };
        // Where this member's part of the epoch's checkpoints stands goes with its ballot.
        let part = ckpt::Part { index: rank, count: world, group: epoch };
        let saved = self.saving.as_mut().map_or_else(Saved::default, |s| s.ballot(part));
        self.hear(Event::Computed { epoch, step, sum, saved });
        Ok(())
    }

    /// Leaves the job: the last report goes out, then the link to the coordinator closes.
    /// (After the job finished; a worker that leaves earlier is taken for lost.)
    fn close(&mut self, py: Python<'_>) {
        let finished = self.over;
        if let Some(link) = self.link.take() {
            py.allow_threads(|| link.close());
        }
        for thread in self.in_etcd.drain(..) {
            thread.finish(finished);
        }
    }
}

impl ElasticWorker {
    /// Hands `event` to the protocol and queues what it answers.
    fn hear(&mut self, event: Event) {
        let actions = self.worker.step(Instant::now(), event);
        self.queue.extend(actions);
    }

    /// Waits for the coordinator's next message, or for the next tick of the clocks.
    fn listen(&mut self) {
        let event = match self.incoming.recv_timeout(self.heartbeat / 2) {
            Ok(Incoming::Msg(msg)) => Event::Message { from: Node::Coordinator, msg },
            Ok(Incoming::Book(b)) => {
                self.book.extend(b);
                return;
            }
            Err(RecvTimeoutError::Timeout) => Event::Tick,
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(self.heartbeat / 2);
                Event::Tick
            }
        };
        self.hear(event);
    }

    fn vote(&mut self, (epoch, step): (u64, u64), ballot: Ballot) {
        let now = Instant::now();
        let Some((_, mesh)) = self.current.get().filter(|(e, _)| *e == epoch) else { return };
        let members = self.worker.quorum().map(|q| q.members.clone()).unwrap_or_default();
        match comm::member::cast_ballots(&mesh, (&members, self.id), (epoch, step), ballot, self.timeout) {
            Ok(ballots) => {
                for (peer, msg) in ballots {
                    let actions = self.worker.step(now, Event::Message { from: Node::Worker(peer), msg });
                    self.queue.extend(actions);
                }
            }
            Err(err) => {
                eprintln!("[steadfast] step {step}: the vote failed: {err}");
                self.hear(Event::VoteFailed { epoch });
            }
        }
    }

    /// A source of its epoch's state images it as it hears the quorum that names it
    /// (once an epoch): the workers that join the epoch fetch the image while their
    /// sources wait for them, holding the state of the quorum's step.
    fn image_if_source(&mut self, py: Python<'_>, host: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(q) = self.worker.quorum() else { return Ok(()) };
        if self.imaged == Some(q.epoch) || !q.state_of(self.id).sources.contains(&self.id) {
            return Ok(());
        }
        let (epoch, step) = (q.epoch, q.step);
        let state = HostState::of(host)?;
        let (header, at) = (&state.header, state.at());
        let spare = std::mem::take(&mut self.spare);
        let image = py.allow_threads(|| Image::build(step, header, &at, spare));
        self.spare = self.served.put(image);
        self.last_state = Some((state.header.clone(), at));
        self.imaged = Some(epoch);
        Ok(())
    }

    /// The protocol's `Compute`: the epoch's mesh (built by its first step); returns the
    /// step for Python to compute, or `None` when the mesh could not be built (the
    /// protocol has heard so).
    fn begin(
        &mut self,
        py: Python<'_>,
        (epoch, step): (u64, u64),
        (rank, members): (usize, Vec<WorkerId>),
    ) -> PyResult<Option<u64>> {
        let world = members.len();
        self.members = members;
        if !matches!(self.current.get(), Some((e, _)) if e == epoch) {
            let intro = comm::port::Intro::Mesh { epoch };
            let built = py.allow_threads(|| self.port.mesh(intro, &self.members, &self.book, &self.tcp));
            match built {
                Ok(mesh) => {
                    self.current.set(epoch, mesh);
                }
                Err(e) => {
                    eprintln!("[steadfast] cannot build the mesh of epoch {epoch}: {e}");
                    self.hear(Event::Computed { epoch, step, sum: None, saved: Saved::default() });
                    return Ok(None);
                }
            }
        }
        self.pending = Some(((epoch, step), (rank, world)));
        Ok(Some(step))
    }

    /// The protocol's `Apply`: the optimizer's update with the sum held, and the checks
    /// the action asked for.
    fn apply(
        &mut self,
        py: Python<'_>,
        host: &Bound<'_, PyAny>,
        step: u64,
        verify: Option<u64>,
        (hash, compare): (bool, bool),
    ) -> PyResult<()> {
        if self.sum_step != Some(step) {
            return Err(JobError::new_err(format!(
                "the protocol applies the sum of step {step}, but the sum held is of step {:?}",
                self.sum_step
            )));
        }
        if let Some(found) = verify.and_then(|v| self.changed(py, host, v).transpose()) {
            self.hear(Event::Changed { fingerprint: found? });
            return Ok(());
        }
        host.call_method1("apply", (step, self.held))?;
        self.sum_step = None;
        let done = step + 1;
        let due = self.saving.as_ref().is_some_and(|s| s.due(done));
        let fingerprint = match (due, hash || compare) {
            (true, _) => Some(self.checkpoint(py, host, done)?),
            (false, true) => Some(self.hash(py, host)?),
            (false, false) => None,
        };
        let event = match (compare, fingerprint) {
            (true, Some(fingerprint)) => {
                let prints = self.current.get().and_then(|(_, mesh)| {
                    py.allow_threads(|| comm::collective::all_gather_u64(&*mesh, fingerprint, self.timeout))
                        .map_err(|e| eprintln!("[steadfast] step {step}: the replica check failed: {e}"))
                        .ok()
                });
                Event::Compared { step, fingerprint, prints }
            }
            _ => Event::Applied { step, fingerprint },
        };
        self.hear(event);
        // The state is at rest until the next step's check: where the host's hooks (a
        // fault campaign's, a test's) may alter it.
        host.call_method1("at_rest", (done,))?;
        Ok(())
    }

    /// The last checkpoint, committed once every member's part of it is durable (one
    /// all-gather of the members' durable steps over the epoch's mesh).
    fn finish_checkpoints(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(saving) = self.saving.take() else { return Ok(()) };
        let (mesh, timeout) = (self.current.get(), self.timeout);
        py.allow_threads(|| {
            saving.finish(|own| {
                let (_, mesh) = mesh.ok_or_else(|| "no epoch's mesh".to_owned())?;
                let all = comm::collective::all_gather_words(&*mesh, &[own], timeout).map_err(|e| e.to_string())?;
                Ok(all.iter().map(|w| w[0]).min().unwrap_or(0))
            })
        })
    }

    /// This member's part of the checkpoint of the state after `done` updates; returns
    /// the state's fingerprint (the one the part was written from).
    fn checkpoint(&mut self, py: Python<'_>, host: &Bound<'_, PyAny>, done: u64) -> PyResult<u64> {
        let state = HostState::of(host)?;
        let print = self.hash_state(py, &state);
        let (epoch, members) = self.worker.quorum().map(|q| (q.epoch, q.members.clone())).unwrap_or_default();
        let index = members.iter().position(|&m| m == self.id).unwrap_or(0);
        let part = ckpt::Part { index, count: members.len().max(1), group: epoch };
        if let Some(saving) = self.saving.as_mut() {
            saving.write(part, (done, print, members.len()), &state)?;
        }
        Ok(print)
    }

    /// The protocol's `Fetch`: the state of `step` from `sources`, several at once, into
    /// Python's state, checked against `fingerprint`.
    fn fetch(
        &mut self,
        py: Python<'_>,
        host: &Bound<'_, PyAny>,
        (epoch, step, fingerprint): (u64, u64, u64),
        sources: &[WorkerId],
    ) -> PyResult<()> {
        self.sum_step = None;
        let began = Instant::now();
        let (dialer, book, timeout) = (self.port.dialer(), &self.book, self.timeout);
        let fetched = py.allow_threads(|| fetch_image(&dialer, book, sources, (step, fingerprint), timeout));
        let state = match fetched {
            Ok((bytes, stats)) => {
                let header =
                    Image::header_len(&bytes).ok_or_else(|| JobError::new_err("a fetched image is cut short"))?;
                let image = PyByteArray::new(py, &bytes);
                host.call_method1("load", (image, header))?;
                let found = self.hash(py, host)?;
                if found == fingerprint {
                    eprintln!(
                        "[steadfast] fetched the state of step {step} ({} bytes) from workers {:?} in {:.2} s",
                        stats.bytes,
                        stats.chunks.iter().filter(|(_, n)| *n > 0).map(|(w, _)| *w).collect::<Vec<_>>(),
                        began.elapsed().as_secs_f64()
                    );
                } else {
                    eprintln!(
                        "[steadfast] the state fetched of step {step} loads with fingerprint {}, not the sources' {}",
                        repro::fingerprint::hex(found),
                        repro::fingerprint::hex(fingerprint)
                    );
                }
                Some((step, found))
            }
            Err(e) => {
                eprintln!("[steadfast] cannot fetch the state of step {step}: {e}");
                None
            }
        };
        self.hear(Event::Fetched { epoch, state });
        Ok(())
    }
}

impl ElasticWorker {
    /// The fingerprint of the host's state now, handed over afresh.
    fn hash(&mut self, py: Python<'_>, host: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.hash_state(py, &HostState::of(host)?))
    }

    /// The fingerprint of `state`, kept as the state last handed over.
    fn hash_state(&mut self, py: Python<'_>, state: &HostState<'_>) -> u64 {
        let (header, at) = (&state.header, state.at());
        let fingerprint = py.allow_threads(|| image::fingerprint(header, &at));
        self.last_state = Some((state.header.clone(), at));
        fingerprint
    }

    /// `Some(found)` when the host's state no longer has `fingerprint` (said on stderr):
    /// the state last handed over, hashed again where it lies.
    fn changed(&mut self, py: Python<'_>, host: &Bound<'_, PyAny>, fingerprint: u64) -> PyResult<Option<u64>> {
        let found = match &self.last_state {
            Some((header, tensors)) => py.allow_threads(|| image::fingerprint(header, tensors)),
            None => self.hash(py, host)?,
        };
        if found == fingerprint {
            return Ok(None);
        }
        eprintln!(
            "[steadfast] the state changed at rest since its commit ({} -> {}): repairing it from the replicas",
            repro::fingerprint::hex(fingerprint),
            repro::fingerprint::hex(found)
        );
        Ok(Some(found))
    }
}

/// Fetches the image of `(step, fingerprint)` from `sources`: its layout from the first
/// that describes it, then its chunks from all of them at once.
fn fetch_image(
    dialer: &comm::port::Dialer,
    book: &BTreeMap<WorkerId, SocketAddr>,
    sources: &[WorkerId],
    (step, fingerprint): (u64, u64),
    timeout: Duration,
) -> Result<(Vec<u8>, comm::transfer::Fetched), CommError> {
    let sources = comm::member::addresses_of(sources, book);
    let deadline = Instant::now() + timeout;
    let connect = |peer: WorkerId, addr: SocketAddr| dialer.transfer(peer, addr, deadline);
    let (layout, elements) = comm::transfer::describe(&sources, &connect, (step, fingerprint), timeout)?;
    let mut bytes = vec![0u8; 4 * elements as usize];
    let want = Want { step, fingerprint, layout, elements };
    let stats = comm::transfer::fetch(&sources, &connect, &want, timeout, &mut |range, chunk| {
        bytes[4 * range.start..4 * range.end].copy_from_slice(chunk);
    })?;
    let found = ckpt::checksum(&bytes);
    if found != fingerprint {
        return Err(CommError::Setup(format!(
            "the fetched image has fingerprint {}, not the sources' {}",
            repro::fingerprint::hex(found),
            repro::fingerprint::hex(fingerprint)
        )));
    }
    Ok((bytes, stats))
}

/// The host's state as it hands it over (`state()`): its header (what the image and the
/// fingerprint begin with), its tree (JSON text, what a checkpoint's metadata holds) and
/// its tensors, with what keeps them alive while they are read.
struct HostState<'py> {
    header: Vec<u8>,
    tree: String,
    tensors: Vec<TensorAt>,
    _keep: Bound<'py, PyAny>,
}

impl HostState<'_> {
    fn of<'py>(host: &Bound<'py, PyAny>) -> PyResult<HostState<'py>> {
        let state = host.call_method0("state")?;
        let (header, tree, tensors): (Bound<'py, PyBytes>, String, Vec<TensorAt>) = state.extract()?;
        Ok(HostState { header: header.as_bytes().to_vec(), tree, tensors, _keep: state })
    }

    /// Where the tensors' bytes lie.
    fn at(&self) -> Vec<At> {
        self.tensors.iter().map(|t| (t.4, t.5)).collect()
    }
}

/// The fingerprint of the host's state now, as it hands it over.
fn hash_host(py: Python<'_>, host: &Bound<'_, PyAny>) -> PyResult<u64> {
    let state = HostState::of(host)?;
    let (header, at) = (&state.header, state.at());
    Ok(py.allow_threads(|| image::fingerprint(header, &at)))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("JobError", m.py().get_type::<JobError>())?;
    m.add("JobOver", m.py().get_type::<JobOver>())?;
    m.add_class::<ElasticWorker>()?;
    m.add_function(wrap_pyfunction!(launched, m)?)?;
    m.add_function(wrap_pyfunction!(mean_of_micro_batches, m)?)
}
