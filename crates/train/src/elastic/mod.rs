//! An elastic data-parallel worker: the training loop as the shell of the step protocol's
//! [`Worker`](comm::protocol::Worker).
//!
//! The protocol decides; this module carries out its actions on real state and sockets,
//! the step's own operations through the step [`driver`](crate::driver) (with
//! the worker's side of the epoch as its runner):
//!
//! - **Compute**: the gradients of the micro-batches this member owns in its epoch
//!   (`i mod world == rank`), all-reduced over the epoch's mesh, which
//!   [`Port::mesh`] builds when the epoch's first step begins. The sum is computed into a
//!   working buffer and becomes the *held* sum only when the all-reduce succeeded, so a
//!   failed step never spoils the sum a late member rolls forward with.
//! - **Vote**: the protocol casts a ballot once per step ([`Action::Vote`](comm::protocol::Action::Vote));
//!   one all-gather of `(finite, digest)` over the mesh carries every member's ballot to
//!   every other, and each arrives at the protocol as a message.
//! - **Apply**: the optimizer update with the held sum; the protocol hears the new
//!   fingerprint.
//! - **Fetch**: the state of the quorum's step, from its sources, in checksummed chunks
//!   from all of them at once ([`comm::transfer`]), written straight into this worker's
//!   state and checked against the quorum's fingerprint.
//!
//! Meanwhile a server thread answers other workers' fetches from the state it holds
//! (under a read lock: no copy of the model is made to serve it), and the
//! [`Link`](comm::control::Link) to the coordinator repeats the newest report every
//! heartbeat, so that a long step does not look like a lost worker.
//!
//! The micro-batches of a step, the sampler's position (a function of the step) and, in
//! the `reproducible` reduce mode, the bits of every sum do not depend on how many members
//! an epoch has: a job that loses, replaces or gains workers ends with the fingerprint of
//! one that never did. (In `deterministic` mode the bits depend on the world size, so a
//! job that shrinks ends with other bits; with replacement it keeps them.)

use std::net::TcpListener;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use comm::control::Link;
use comm::port::Port;
use comm::protocol::wire::Hello;
use comm::protocol::{Checks, Timing, Worker, WorkerId};
use comm::transport::CommError;
use serde_json::json;

use crate::config::{ElasticWorker, TrainConfig};
use crate::driver::Driver;
use crate::error::TrainError;
use crate::failpoint::ProcessFaults;
use crate::metrics::{Ledger, MetricsFile};
use crate::step::{LiveFaults, TrainState};
use crate::trainer::{Prepared, Progress, Summary};

mod epoch;
mod held;
mod saving;
mod shell;
mod stages;
mod timeline;

use comm::member::Current;
use epoch::ElasticRunner;
use held::{MemoryCopy, SharedState};
use saving::Saving;
use shell::Shell;
use stages::Stages;
use timeline::Timeline;

/// Runs worker `d.slot` (process `d.job.incarnation` of the slot) of an elastic job.
pub(crate) fn run(
    config: &TrainConfig,
    d: &ElasticWorker,
    on_event: &mut dyn FnMut(Progress),
) -> Result<(Summary, TrainState), TrainError> {
    let (secret, bind, incarnation) = (&d.secret, d.bind, d.job.incarnation);
    let id = d.slot as WorkerId;
    // A pipeline stage's checkpoints go under its own root.
    let own = stages::stage_config(config, d);
    let config = own.as_ref().unwrap_or(config);
    let job = comm::member::job_tag(d);
    saving::refuse_other_jobs(config, &job)?;
    crate::checkpointing::refuse_other_configuration(config)?;
    let prepared = Prepared::load(config)?;
    let (mut state, engine) = prepared.start(config);
    let parameters = state.parameters();
    // A pipeline's `--log-budget` chooses the boundaries it logs.
    let budgeted = crate::pipeline::groups::apply_budget(config, &engine, &state.params)?;
    let config = budgeted.as_ref().map_or(config, |(c, _)| c);
    if let Some((_, note)) = &budgeted {
        on_event(Progress::Note(note.clone()));
    }
    let (pipe, engine) = Stages::cut(config, d, &mut state, engine)?;
    // After a total loss the job starts again from its newest valid checkpoint, on any
    // number of workers; a worker that joins a running job fetches a newer state anyway.
    let restored = match &pipe {
        Some(p) => stages::restore(config, config.pipeline.stages, p.stage(), &mut state)?,
        None => crate::trainer::restore(config, config.resume.as_deref(), &mut state)?,
    };
    let resumed_from = state.step;
    let layout = held::layout_of(&state);
    let fingerprint = state.fingerprint();
    let held = Arc::new(RwLock::new(SharedState { state, fingerprint: Some(fingerprint) }));
    let faults = ProcessFaults::new(config.faults.clone(), Instant::now()).for_incarnation(incarnation);
    let mut metrics = open_record(config, (id, incarnation), restored.as_ref(), on_event)?;

    let listener =
        TcpListener::bind((bind, 0)).map_err(|e| CommError::Setup(format!("cannot listen on {bind}: {e}")))?;
    let mut port = Port::open(listener, secret, id)?;
    // The server sets this when a fetch finds the state changed at rest.
    let served_changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    held::spawn_server(&mut port, Arc::clone(&held), layout, (faults.clone(), Arc::clone(&served_changed)), id)?;
    // The worker's own clocks: how often it reports, and how long it waits for ballots.
    let timing = Timing { vote_timeout: d.job.timeout, ..Timing::default() };
    let current = Current::default();
    let interrupt = current.aborts_moot_collectives();
    let hello = Hello { incarnation, addr: port.addr() };
    let deadline = Instant::now() + d.job.timeout.max(Duration::from_secs(30));
    let (directory, in_etcd) =
        comm::member::find_coordinator(&d.coordinator, id, incarnation, |note| tracing::warn!("{note}"))?;
    let (link, incoming) = Link::connect(&directory, secret, id, hello, timing.heartbeat, deadline, interrupt)
        .map_err(|e| with_finished_record(e, config.out_dir.as_deref(), deadline))?;
    let mut hooks = LiveFaults::new(config.inject.iter().cloned()).with_process(faults);
    sever_on_cut(&mut hooks, current.clone(), &link);
    on_event(Progress::Started { steps: config.steps, parameters });
    metrics.write(json!({"kind": "process", "worker": id, "incarnation": incarnation}))?;

    let tcp = comm::member::mesh_config(&d.secret, d.job.timeout);
    // The checks the protocol asks of the steps.
    let checks =
        Checks { every: d.job.fingerprint_every, repair: d.on_divergence == crate::config::OnDivergence::Repair };
    let (mut worker, first) =
        Worker::new((id, incarnation), config.steps, (resumed_from, fingerprint), (timing, checks), Instant::now());
    // The rollback baseline: a copy of the state every `copy_every` steps.
    let mut copy = MemoryCopy::new(d.copy_every);
    // (Step 0 here: the first copy is kept whatever step the state starts at.)
    copy.keep(&mut worker, 0, &held);
    let side = ElasticRunner {
        config,
        d,
        id,
        port,
        book: Default::default(),
        tcp,
        current,
        reducer: comm::collective::Reducer::default(),
        work: engine.buffer(),
        sum_step: None,
        ledger: Ledger::new(metrics, on_event),
        epoch: 0,
        members: Vec::new(),
        known: None,
        asked: Default::default(),
        found: None,
        saving: Saving::new(config, job),
        resumed_from,
        pipe,
    };
    let mut shell = Shell {
        driver: Driver::new(&engine, id as usize),
        engine,
        timeline: Timeline::new(&worker),
        worker,
        queue: first.into(),
        held,
        hooks,
        ops: Vec::new(),
        placed: None,
        layout,
        served_changed,
        copy,
        last_eval: None,
        side,
    };
    let outcome = shell.run(&incoming, &link, timing.heartbeat, &prepared);
    // The job's end (its last checkpoint's agreement, a pipeline's evaluation) still needs
    // every member: the link stays open through it, since the coordinator takes a closed
    // link for a lost worker and the launcher would end this process mid-way. On an error
    // of its own the worker leaves the link open until the process ends, so that it says
    // why it stopped before the launcher ends it.
    let outcome = outcome.and_then(|()| shell.finish(&prepared, parameters));
    // The last report (finished or stopped) goes out before the link closes.
    if matches!(outcome, Ok(_) | Err(TrainError::JobStopped(_) | TrainError::JoinedAfterTheEnd)) {
        link.close();
    }
    for thread in in_etcd {
        thread.finish(outcome.is_ok());
    }
    outcome
}

/// Worker `id`'s process `incarnation`'s part in the job's record (`metrics.jsonl`), which
/// says where it resumed from (`restored`). The first collector's first process (worker 0,
/// or a pipeline's last stage of replica 0) writes it from the start; after that each
/// epoch's collector does (see `Timeline`): a replacement waits its turn.
fn open_record(
    config: &TrainConfig,
    (id, incarnation): (WorkerId, u64),
    restored: Option<&crate::checkpointing::Restored>,
    on_event: &mut dyn FnMut(Progress),
) -> Result<MetricsFile, TrainError> {
    let collector = config.pipeline.stages as WorkerId - 1;
    let resumed = restored.is_some_and(|r| r.step > 0);
    let mut metrics = MetricsFile::in_turns(
        config.out_dir.as_ref(),
        id == collector && incarnation == 0,
        incarnation > 0 || resumed,
    )?;
    if let Some(r) = restored {
        crate::trainer::record_resume(&mut metrics, r)?;
        on_event(Progress::Note(crate::trainer::resumed_note(r)));
    }
    Ok(metrics)
}

/// A `cut` fault severs this worker's link to the coordinator and aborts the collective
/// of the epoch in progress, as a cut cable would.
fn sever_on_cut(hooks: &mut LiveFaults, current: Current, link: &Link) {
    let sever = link.severer();
    hooks.process_mut().on_cut(Arc::new(move || {
        sever();
        if let Some((_, mesh)) = current.get() {
            mesh.abort("this worker's links were cut (fault injection)".into());
        }
    }));
}

/// A first connection that found no coordinator until its deadline, with what this
/// worker can tell of the job from its output directory: a `metrics.jsonl` there that ends
/// with a summary records a run that finished (the job's, if the directory is the job's,
/// as it is when every node runs the same command on a shared or the same file system).
fn with_finished_record(error: CommError, out: Option<&std::path::Path>, deadline: Instant) -> CommError {
    if Instant::now() < deadline {
        return error;
    }
    match error {
        CommError::Setup(text) => match out.and_then(finished_record) {
            Some(record) => CommError::Setup(format!("{text}. {record}")),
            None => CommError::Setup(text),
        },
        other => other,
    }
}

/// "`OUT/metrics.jsonl` records a run that finished N s ago ..." when its last line is a
/// summary.
fn finished_record(out: &std::path::Path) -> Option<String> {
    let path = out.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).ok()?;
    let last: serde_json::Value = serde_json::from_str(text.lines().rev().find(|l| !l.trim().is_empty())?).ok()?;
    if last.get("kind").and_then(|k| k.as_str()) != Some("summary") {
        return None;
    }
    // Every line carries the time it was written, in seconds since the epoch.
    let written = last.get("time").and_then(serde_json::Value::as_f64)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    let ago = (now - written).max(0.0);
    let fingerprint =
        last.get("fingerprint").and_then(|f| f.as_str()).map(|f| format!(", fingerprint {f}")).unwrap_or_default();
    Some(format!(
        "{} records a run that finished {ago:.0} s ago (its summary{fingerprint}): if that was this job, the job is \
         over",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_worker_names_the_finished_run_its_output_directory_records() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let lines = [
            serde_json::json!({"kind": "step", "step": 9, "time": now - 50.0}),
            serde_json::json!({"kind": "summary", "steps": 10, "fingerprint": "abc123", "time": now - 42.0}),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        let unanswered = || CommError::Setup("no coordinator answers at 127.0.0.1:9 after 30.0 s of trying".into());
        let past = Instant::now();
        let CommError::Setup(said) = with_finished_record(unanswered(), Some(dir.path()), past) else { panic!() };
        assert!(said.starts_with("no coordinator answers at 127.0.0.1:9 after 30.0 s of trying. "), "{said}");
        assert!(said.contains("metrics.jsonl records a run that finished 42 s ago (its summary, fingerprint abc123)"));
        assert!(said.ends_with("if that was this job, the job is over"), "{said}");
        // A run still going (its last line is a step's), no record, or an error before the
        // deadline (a refusal): nothing is added.
        std::fs::write(dir.path().join("metrics.jsonl"), format!("{text}{}\n", lines[0])).unwrap();
        assert_eq!(with_finished_record(unanswered(), Some(dir.path()), past).to_string(), unanswered().to_string());
        assert_eq!(with_finished_record(unanswered(), None, past).to_string(), unanswered().to_string());
        let later = Instant::now() + Duration::from_secs(60);
        std::fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        assert_eq!(with_finished_record(unanswered(), Some(dir.path()), later).to_string(), unanswered().to_string());
    }
}
