//! The trainer: the step loop, periodic evaluation, checkpoints and metrics, in one
//! process or as one rank of a data-parallel job.
//!
//! Each step is the data-parallel [`schedule`](crate::schedule) of this rank, run by the
//! step [`driver`](crate::driver) with this module's runner: the hooks of `--inject`
//! faults, the compute phase on the micro-batches this rank owns (`i mod world == rank`),
//! the reduction (locally, or one all-reduce across the job through [`crate::job`]), the
//! vote (a job votes with [`comm::commit`]; a single process refuses a non-finite sum by
//! itself), and the update; then every `fingerprint_every` steps the replicas are
//! compared and checkpoints are written (every rank writes its own part). After the step,
//! every `eval_every` steps the model is scored on the held-out split.
//!
//! In a pipeline job (`--pipeline-stages`) each rank's step is its stage's pipeline
//! schedule instead, and its state and checkpoints are its stage's ([`crate::pipeline`]);
//! a static job fails together (a pipeline job that survives a loss is an elastic one:
//! `elastic`). The runner of all of it is in `ranks.rs`.
//!
//! In a job, a heartbeat thread ([`comm::supervisor::Heartbeat`]) listens to the
//! coordinator; when it reports a lost member, the transport is aborted, so that the step
//! in progress fails at once on every survivor.
//!
//! Nothing in the loop reads a clock, a thread id or an unordered container to decide
//! what to compute, so the final state is a function of the configuration alone (except
//! in the `fast` reduce mode, which promises nothing about summation order). Under
//! `--checkpoint-when-busy defer` the steps that are checkpointed depend on the disk's
//! timing (and with them where a `checkpoint`-phase fault strikes); the state does not.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::checkpointing;
use crate::config::{DistConfig, TrainConfig};
use crate::data::{Dataset, Split};
use crate::driver::Driver;
use crate::error::{ConfigError, TrainError};
use crate::failpoint::ProcessFaults;
use crate::job::Job;
use crate::metrics::MetricsFile;
use crate::model::{EvalSums, Kernels, Loaded};
use crate::pipeline::{Grid, Staged};
use crate::schedule::{self, Op};
use crate::step::{Engine, Injected, LiveFaults, TrainState};

mod ranks;
use ranks::StaticRunner;

pub(crate) use crate::metrics::Ledger;
pub use crate::metrics::{EvalReport, Progress};
pub use crate::prepared::Prepared;

/// Text sequences scored per evaluation (the first ones of the held-out split).
pub const TEXT_EVAL_SEQUENCES: usize = 1024;
/// Examples per forward pass during evaluation.
const EVAL_CHUNK: usize = 500;

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Steps taken.
    pub steps: u64,
    /// Mean training loss of the last step.
    pub final_loss: f32,
    /// The last evaluation.
    pub eval: EvalReport,
    /// Perplexity of a unigram model on the held-out text (text only).
    pub unigram_perplexity: Option<f64>,
    /// xxh3-64 fingerprint of all parameters and optimizer state.
    pub fingerprint: u64,
    /// The kernels that computed it (a fingerprint from another kernel set differs).
    pub kernels: Kernels,
    /// Wall-clock time of the training steps (without evaluation).
    pub train_time: Duration,
    /// Of which inside the optimizer update.
    pub optimizer_time: Duration,
    /// Number of parameters.
    pub parameters: usize,
    /// The step training resumed from (0 for a fresh start).
    pub resumed_from: u64,
    /// Checkpoint writer totals (all zero without checkpoints).
    pub checkpoints: ckpt::WriterStats,
    /// Steps at which a checkpoint fell due but was not taken, the writer being busy
    /// ([`crate::config::WhenBusy::Defer`]; several can end in one later checkpoint).
    pub checkpoints_deferred: u64,
    /// The totals of this rank's boundary logs (a pipeline job that logs).
    pub boundary_log: Option<ckpt::log::LogStats>,
}

/// Runs training in one process or as a rank of a static job (not an elastic one: see
/// [`crate::train`], which picks). Returns the summary and the final state.
pub fn run(config: &TrainConfig, on_event: &mut dyn FnMut(Progress)) -> Result<(Summary, TrainState), TrainError> {
    let prepared = Prepared::load(config)?;
    let (mut state, mut engine) = prepared.start(config);
    let parameters = state.parameters();
    let budgeted = crate::pipeline::groups::apply_budget(config, &engine, &state.params)?;
    let config = budgeted.as_ref().map_or(config, |(c, _)| c);
    let (setup, for_rank) = set_up(config, &mut state, engine)?;
    engine = for_rank;
    let Setup { rank, world, incarnation, pipe, restored, mut metrics, writer, job } = setup;
    let first_step = state.step;
    if let Some(r) = &restored {
        record_resume(&mut metrics, r)?;
        on_event(Progress::Note(resumed_note(r)));
    }
    if let Some((_, note)) = &budgeted {
        on_event(Progress::Note(note.clone()));
    }
    on_event(Progress::Started { steps: config.steps, parameters });

    let mut hooks = LiveFaults::new(config.inject.iter().cloned())
        .with_process(ProcessFaults::new(config.faults.clone(), Instant::now()).for_incarnation(incarnation));
    if let Some(j) = &job {
        hooks.process_mut().on_cut(j.link_cutter()?);
    }
    let actions = actions(config, pipe.as_ref(), engine.sampler().micro_batches(), (rank, world));
    let mut driver = Driver::new(&engine, rank);
    let mut runner = StaticRunner {
        config,
        shared: world / config.pipeline.stages > 1,
        job,
        pipe,
        schedule: config.checkpoint.as_ref().map(|c| checkpointing::Schedule::new(c, config.steps)),
        writer,
        writers_idle: true,
        reducer: comm::collective::Reducer::default(),
        ledger: Ledger::new(metrics, on_event),
        reduced: None,
    };
    let mut last_eval = None;
    // Resumed at the final step, a pipeline's stages still put the whole state together to
    // score and fingerprint it (a stage alone holds only its part).
    if state.step >= config.steps && runner.pipe.is_some() {
        last_eval = runner.evaluate_if_due(&mut engine, &prepared, &state)?;
    }
    while state.step < config.steps {
        runner.ledger.started = Instant::now();
        let outcome = driver
            .run(&actions, 0, &mut engine, &mut state, &mut hooks, &mut runner)
            .and_then(|_| runner.evaluate_if_due(&mut engine, &prepared, &state));
        last_eval = outcome?.or(last_eval);
    }
    let StaticRunner { mut writer, job, mut pipe, schedule, ledger, .. } = runner;
    let Ledger { mut metrics, train_time, last_loss, .. } = ledger;
    let boundary_log = pipe.as_mut().and_then(Staged::finish_logs);
    if let Some(w) = writer.as_mut() {
        if let Some(j) = &job {
            // The last parts: once every rank's is durable, rank 0 commits.
            w.wait_persisted()?;
            w.commit_through(j.durable_everywhere(w.durable())?)?;
        }
        w.finish()?;
    }
    if let Some(job) = job {
        job.finish();
    }
    // Resumed at the final step: nothing trained, evaluate the restored state.
    let last_eval = last_eval.unwrap_or_else(|| evaluate_state(&mut engine, &prepared.data, &state, config.eval_limit));
    let summary = Summary {
        steps: config.steps,
        final_loss: pipe.as_ref().and_then(|p| p.shared.as_ref()).map_or(last_loss, |s| s.loss),
        eval: last_eval,
        unigram_perplexity: prepared.unigram_perplexity,
        // A pipeline's stages hold parts of the state: the job's is the gathered one's.
        fingerprint: pipe.and_then(|p| p.shared).map_or_else(|| state.fingerprint(), |s| s.fingerprint),
        kernels: engine.kernels(),
        train_time,
        optimizer_time: driver.update_time(),
        parameters,
        resumed_from: first_step,
        checkpoints: writer.as_ref().map(|w| w.stats().clone()).unwrap_or_default(),
        checkpoints_deferred: schedule.as_ref().map_or(0, checkpointing::Schedule::deferred),
        boundary_log,
    };
    write_summary(&mut metrics, &summary)?;
    Ok((summary, state))
}

/// This process's place in the run, and what it keeps besides the state, set up before
/// the first step.
struct Setup {
    rank: usize,
    world: usize,
    /// Which process of its rank this is.
    incarnation: u64,
    /// A pipeline job's stage.
    pipe: Option<Staged>,
    /// The checkpoint the state was restored from.
    restored: Option<checkpointing::Restored>,
    metrics: MetricsFile,
    writer: Option<ckpt::AsyncWriter>,
    job: Option<Job>,
}

/// Joins the job (if any), cuts `state` and `engine` to this rank's pipeline stage (if
/// any), restores a checkpoint when asked, and opens the metrics and the writer.
fn set_up<'a>(
    config: &TrainConfig,
    state: &mut TrainState,
    mut engine: Engine<'a>,
) -> Result<(Setup, Engine<'a>), TrainError> {
    // An MPI job learns its rank and size from MPI, so it joins first.
    let mpi_job = match &config.dist {
        Some(DistConfig::Mpi(settings)) => Some(Job::start_mpi(settings)?),
        _ => None,
    };
    let (rank, world) = match (&mpi_job, &config.dist) {
        (Some(j), _) => j.place(),
        (None, Some(DistConfig::Mesh(m))) => (m.rank, m.world),
        (None, Some(DistConfig::Elastic(_))) => {
            return Err(ConfigError::Invalid("an elastic worker is run by `train::elastic`".into()).into());
        }
        (None, _) => (0, 1),
    };
    let incarnation = config.dist.as_ref().map_or(0, |d| d.settings().incarnation);
    // A rank of a pipeline job holds one stage: its state, its engine, its checkpoints.
    let layout = (config.pipeline.stages > 1).then(|| Grid::of(config.pipeline.stages, world)).transpose()?;
    let mut pipe = None;
    if let Some(l) = &layout {
        let (staged, for_stage) = Staged::cut(config, l.clone(), rank, state, engine)?;
        engine = for_stage;
        pipe = Some(staged);
    }
    let resume = config.resume.as_ref().map(|r| pipe.as_ref().map_or_else(|| r.clone(), |p| p.root(r)));
    let mut restored = restore(config, resume.as_deref(), state)?;
    // In a data-parallel job the replicas are equal: rank 0 alone writes metrics (in a
    // pipeline job, the rank that holds the summed loss), and every rank writes its own
    // part of each checkpoint (of its stage's). Writers exist before the job connects (or,
    // on MPI, before a barrier), so rank 0 has cleared crashed writers' leftovers before
    // anyone writes.
    let reporter = layout.as_ref().map_or(0, Grid::collector);
    let part = pipe.as_ref().map_or(ckpt::Part::of(rank, world), |p| p.part(rank));
    let writer = open_writer(config, pipe.as_ref(), part, state)?;
    // (Before the metrics file is emptied: a refused run changes nothing.)
    checkpointing::refuse_other_configuration(config)?;
    // A replacement appends to what its predecessor wrote, even from step 0.
    let metrics = MetricsFile::create(config.out_dir.as_ref().filter(|_| rank == reporter), state.step > 0)?;
    let mut job = match (mpi_job, &config.dist) {
        (Some(j), _) => {
            j.barrier()?;
            Some(j)
        }
        (None, Some(DistConfig::Mesh(m))) => Some(Job::connect(m)?),
        (None, _) => None,
    };
    if let (Some(p), Some(j)) = (pipe.as_mut(), job.as_mut()) {
        j.pipelined(&p.layout);
        // Each stage resumed from its own newest checkpoint: all go to the newest in common.
        restored = p.agree_on_resume(j.transport()?, config, state, restored)?;
    }
    Ok((Setup { rank, world, incarnation, pipe, restored, metrics, writer, job }, engine))
}

/// The step of `rank` of `world`: its stage's pipeline schedule, or the data-parallel one.
fn actions(
    config: &TrainConfig,
    pipe: Option<&Staged>,
    micro_batches: usize,
    (rank, world): (usize, usize),
) -> Vec<Op> {
    match pipe {
        Some(p) => p.layout.ops(config.pipeline.schedule, rank, micro_batches),
        None => schedule::data_parallel(micro_batches, rank, world),
    }
}

/// Restores `state` from `path` (`--resume`, if asked): the checkpoint it came from.
pub(crate) fn restore(
    config: &TrainConfig,
    path: Option<&std::path::Path>,
    state: &mut TrainState,
) -> Result<Option<checkpointing::Restored>, TrainError> {
    let Some(path) = path else { return Ok(None) };
    let restored = checkpointing::restore(path, config, state)?;
    if state.step > config.steps {
        return Err(ConfigError::Invalid(format!(
            "the checkpoint {} is at step {}, beyond --steps {}",
            restored.dir.display(),
            state.step,
            config.steps
        ))
        .into());
    }
    Ok(Some(restored))
}

/// The line that says where a run resumed from.
pub(crate) fn resumed_note(r: &checkpointing::Restored) -> String {
    let skipped = match r.skipped.len() {
        0 => String::new(),
        n => format!(", passing over {n} newer that did not check out"),
    };
    format!("resumed from the checkpoint of step {} ({}{skipped})", r.step, r.dir.display())
}

/// Logs a resumption and records it in `metrics.jsonl`, with every checkpoint passed over.
pub(crate) fn record_resume(metrics: &mut MetricsFile, r: &checkpointing::Restored) -> Result<(), TrainError> {
    tracing::info!(step = r.step, dir = %r.dir.display(), "resumed");
    metrics.write(json!({"kind": "resumed", "step": r.step, "from": r.dir.display().to_string()}))?;
    for (dir, reason) in &r.skipped {
        metrics.write(json!({
            "kind": "resume_fallback", "skipped": dir.display().to_string(), "reason": reason,
            "resumed_from": r.dir.display().to_string(), "step": r.step,
        }))?;
    }
    Ok(())
}

/// This rank's checkpoint writer, if the run checkpoints: of the run's root, or of its
/// stage's directory under it.
fn open_writer(
    config: &TrainConfig,
    stage: Option<&Staged>,
    part: ckpt::Part,
    state: &TrainState,
) -> Result<Option<ckpt::AsyncWriter>, TrainError> {
    let Some(c) = config.checkpoint.as_ref() else { return Ok(None) };
    let root = stage.map_or_else(|| c.dir.clone(), |s| s.root(&c.dir));
    let mut w =
        ckpt::AsyncWriter::for_part(&root, ckpt::SaveOptions { shards: c.shards, retention: c.retention }, part)?;
    w.set_persist_nice(c.persist_nice);
    // The snapshot buffers are allocated (and their pages mapped) now, before the
    // training loop, rather than in the first checkpoint's stall.
    w.prepare(&checkpointing::tensor_refs(state))?;
    Ok(Some(w))
}

/// The `summary` line of `metrics.jsonl`.
pub(crate) fn write_summary(metrics: &mut MetricsFile, summary: &Summary) -> Result<(), TrainError> {
    metrics.write(json!({
        "kind": "summary",
        "steps": summary.steps,
        "final_loss": summary.final_loss,
        "kernels": summary.kernels.to_string(),
        "test_accuracy": summary.eval.accuracy,
        "test_perplexity": summary.eval.perplexity,
        "unigram_perplexity": summary.unigram_perplexity,
        "fingerprint": repro::fingerprint::hex(summary.fingerprint),
        "train_seconds": summary.train_time.as_secs_f64(),
        "optimizer_seconds": summary.optimizer_time.as_secs_f64(),
        "resumed_from": summary.resumed_from,
        "checkpoints": summary.checkpoints.committed,
        "checkpoint_stall_seconds": summary.checkpoints.stall.as_secs_f64(),
        "checkpoint_snapshots": summary.checkpoints.snapshots,
        "checkpoints_deferred": summary.checkpoints_deferred,
        "log_bytes": summary.boundary_log.as_ref().map(|l| l.bytes),
        "log_stall_seconds": summary.boundary_log.as_ref().map(|l| l.stall.as_secs_f64()),
    }))
}

/// Scores `state` on the held-out split (at most `limit` examples) with the engine's model.
pub(crate) fn evaluate_state(
    engine: &mut Engine<'_>,
    data: &Dataset,
    state: &TrainState,
    limit: Option<usize>,
) -> EvalReport {
    engine.with_model(&state.params, |model| evaluate_first(model, data, state.step, limit.unwrap_or(usize::MAX)))
}

/// Logs the flips of live faults (as warnings, and in `metrics.jsonl`).
pub(crate) fn report_injections(metrics: &mut MetricsFile, flips: Vec<Injected>) -> Result<(), TrainError> {
    for Injected { at, state, flip: f } in flips {
        tracing::warn!(
            step = at.step,
            rank = at.rank,
            state = state.name(),
            tensor = %f.tensor,
            element = f.element,
            bits = ?f.bits,
            "injected a bit flip: {} -> {}",
            f.old,
            f.new
        );
        metrics.write(json!({
            "kind": "inject", "step": at.step, "rank": at.rank, "state": state.name(),
            "tensor": f.tensor, "element": f.element, "bits": f.bits,
            "old": f.old.to_string(), "new": f.new.to_string(),
        }))?;
    }
    Ok(())
}

/// Scores the held-out split (all test images; the first [`TEXT_EVAL_SEQUENCES`] text
/// sequences), in fixed chunks.
pub fn evaluate(model: &Loaded<'_>, data: &Dataset, step: u64) -> EvalReport {
    evaluate_first(model, data, step, usize::MAX)
}

/// [`evaluate`] on at most the first `limit` held-out examples.
pub fn evaluate_first(model: &Loaded<'_>, data: &Dataset, step: u64, limit: usize) -> EvalReport {
    let n = match data {
        Dataset::Images(_) => data.len(Split::Test),
        Dataset::Text(_) => data.len(Split::Test).min(TEXT_EVAL_SEQUENCES),
    }
    .min(limit);
    let mut sums = EvalSums::default();
    let indices: Vec<u32> = (0..n as u32).collect();
    for chunk in indices.chunks(EVAL_CHUNK) {
        let s = model.evaluate(&data.batch(Split::Test, chunk));
        sums.loss_sum += s.loss_sum;
        sums.count += s.count;
        sums.correct += s.correct;
    }
    let loss = sums.loss_sum / sums.count as f64;
    EvalReport {
        step,
        loss,
        accuracy: sums.correct as f64 / sums.count as f64,
        perplexity: matches!(data, Dataset::Text(_)).then(|| loss.exp()),
    }
}
