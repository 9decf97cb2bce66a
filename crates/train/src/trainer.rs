//! The trainer: the step loop, periodic evaluation and metrics, in one process or as
//! one rank of a data-parallel job.
//!
//! One step, in order:
//! 1. copy the registry's parameters into the burn model;
//! 2. for each micro-batch `i` of the global batch that this rank owns (`i mod world ==
//!    rank`), build it from the sampler and run forward and backward;
//! 3. sum the micro-batch gradients (and losses) in the configured reduce mode: locally
//!    with [`comm::sum_parts`], or across the job with one
//!    [`all_reduce_parts`](comm::collective::all_reduce_parts);
//! 4. in a job, the commit vote ([`comm::commit`]): every rank checks the sum is finite
//!    and hashes it; only if all ranks agree does anyone go on. The ballots also carry
//!    each rank's durable checkpoint step, from which rank 0 commits checkpoints;
//! 5. apply the optimizer to the flat parameters;
//! 6. every `fingerprint_every` steps compare the replicas; checkpoint (every rank writes
//!    its own part); every `eval_every` steps evaluate on the held-out split.
//!
//! In a job, a heartbeat thread ([`comm::supervisor::Heartbeat`]) listens to the
//! coordinator; when it reports a lost member, the transport is aborted, so that the step
//! in progress fails at once on every survivor.
//!
//! Nothing in the loop reads a clock, a thread id or an unordered container to decide
//! what to compute, so the final state is a function of the configuration alone (except
//! in the `fast` reduce mode, which opts into run-dependent summation order).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::prelude::Device;
use comm::ReduceMode;
use serde_json::json;

use crate::checkpointing::{self, CheckpointConfig};
use crate::data::sampler::Sampler;
use crate::data::text::unigram_cross_entropy;
use crate::data::{DataKind, DataSpec, Dataset, Modality, Split};
use crate::error::{ConfigError, TrainError};
use crate::model::{self, EvalSums, GptConfig, Model, ModelKind};
use crate::optim::{OptimConfig, OptimKind, Optimizer};
use crate::state::{self, NamedTensor};
use fault::live::StateKind;

/// Text sequences scored per evaluation (the first ones of the held-out split).
pub const TEXT_EVAL_SEQUENCES: usize = 1024;
/// Examples per forward pass during evaluation.
const EVAL_CHUNK: usize = 500;

/// Everything that defines a training run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Architecture.
    pub model: ModelKind,
    /// Data set.
    pub data: DataKind,
    /// Overrides the data set's directory.
    pub data_dir: Option<PathBuf>,
    /// Number of optimizer steps.
    pub steps: u64,
    /// Global batch size (examples per step).
    pub batch: usize,
    /// Examples per forward/backward pass; divides `batch`.
    pub micro_batch: usize,
    /// Optimizer.
    pub optimizer: OptimKind,
    /// Optimizer hyper-parameters.
    pub optim: OptimConfig,
    /// Seed of initialisation, data order and synthetic data.
    pub seed: u64,
    /// How micro-batch gradients are summed, in this process and across a job (see
    /// `docs/determinism.md`).
    pub reduce: ReduceMode,
    /// Evaluate every this many steps (and always at the end); 0 evaluates only at the end.
    pub eval_every: u64,
    /// Where to write `metrics.jsonl`; nothing is written without it.
    pub out_dir: Option<PathBuf>,
    /// Periodic checkpoints; none without it.
    pub checkpoint: Option<CheckpointConfig>,
    /// Resume from this checkpoint (a checkpoint directory, or a root whose newest
    /// committed checkpoint is used).
    pub resume: Option<PathBuf>,
    /// Data-parallel training across processes; `None` trains in this process alone.
    pub dist: Option<DistConfig>,
    /// Bit flips to inject into live state (`--inject`).
    pub inject: Vec<fault::live::LiveFault>,
}

/// This process's place in a data-parallel job.
#[derive(Clone, Debug)]
pub struct DistConfig {
    /// This worker's rank.
    pub rank: usize,
    /// Number of workers.
    pub world: usize,
    /// Where the coordinator listens.
    pub coordinator: std::net::SocketAddr,
    /// The job's shared secret.
    pub secret: Vec<u8>,
    /// Address this worker listens on for its peers (port chosen by the system).
    pub bind: std::net::IpAddr,
    /// Bound on every collective step; a dead or hung peer surfaces within it.
    pub timeout: Duration,
    /// Compare the replicas' fingerprints every this many steps (0: only at the end).
    pub fingerprint_every: u64,
}

impl TrainConfig {
    /// The defaults for a model: sizes and schedules that reach the documented quality
    /// within a few minutes on two cores.
    pub fn defaults(model: ModelKind) -> Self {
        let adamw = OptimConfig { lr: 1e-3, momentum: 0.9, weight_decay: 0.0, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let (data, steps, batch, micro_batch, lr) = match model {
            ModelKind::Mlp => (DataKind::FashionMnist, 2000, 128, 128, 1e-3),
            ModelKind::Cnn => (DataKind::FashionMnist, 3000, 128, 128, 2e-3),
            ModelKind::Gpt => (DataKind::Fortunes, 1000, 32, 32, 2e-3),
        };
        TrainConfig {
            model,
            data,
            data_dir: None,
            steps,
            batch,
            micro_batch,
            optimizer: OptimKind::AdamW,
            optim: OptimConfig { lr, ..adamw },
            seed: 0,
            reduce: ReduceMode::Deterministic,
            eval_every: 500,
            out_dir: None,
            checkpoint: None,
            resume: None,
            dist: None,
            inject: Vec::new(),
        }
    }
}

/// Held-out quality at one step.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Step after which it was measured.
    pub step: u64,
    /// Mean cross-entropy per example (per token for text), in nats.
    pub loss: f64,
    /// Arg-max accuracy (images) or next-token accuracy (text).
    pub accuracy: f64,
    /// `exp(loss)`, for text.
    pub perplexity: Option<f64>,
}

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
}

/// Progress reported while training.
#[derive(Clone, Debug)]
pub enum Event<'a> {
    /// Training starts.
    Started {
        /// Steps to run.
        steps: u64,
        /// Number of model parameters.
        parameters: usize,
    },
    /// A step finished.
    Step {
        /// Steps done so far.
        step: u64,
        /// Mean training loss of that step.
        loss: f32,
    },
    /// An evaluation finished.
    Eval(&'a EvalReport),
}

/// The final training state, for tests and tools that inspect it.
#[derive(Clone, Debug)]
pub struct FinalState {
    /// Parameters, in registry order.
    pub params: Vec<NamedTensor>,
    /// Optimizer slots, in registry order.
    pub slots: Vec<NamedTensor>,
}

/// Runs training as configured, reporting progress to `on_event`.
pub fn train(config: &TrainConfig, on_event: &mut dyn FnMut(Event)) -> Result<(Summary, FinalState), TrainError> {
    let modality = match config.model {
        ModelKind::Mlp | ModelKind::Cnn => Modality::Images,
        ModelKind::Gpt => Modality::Text,
    };
    let probe = GptConfig::small(0);
    let spec = DataSpec {
        kind: config.data,
        dir: config.data_dir.clone(),
        modality,
        context: probe.context,
        seed: config.seed,
    };
    let data = Dataset::load(&spec)?;
    let (gpt, tokens_per_example, unigram) = match &data {
        Dataset::Text(t) => (GptConfig::small(t.vocab.len()), t.context, Some(unigram_cross_entropy(t).exp())),
        Dataset::Images(_) => (probe, 1, None),
    };
    if config.steps == 0 {
        return Err(ConfigError::Invalid("--steps must be at least 1".into()).into());
    }
    let device = Device::flex().autodiff();
    let mut sampler = Sampler::new(config.seed, data.len(Split::Train), config.batch, config.micro_batch)?;
    let mut model = Model::new(config.model, config.seed, gpt, &device);
    let mut params = model.params();
    let mut optimizer = Optimizer::new(config.optimizer, config.optim, &params);
    let parameters = params.iter().map(|p| p.data.len()).sum();
    let mut first_step = 0;
    if let Some(path) = &config.resume {
        let (step, dir) = checkpointing::restore(path, config, &mut params, &mut optimizer)?;
        if step > config.steps {
            return Err(ConfigError::Invalid(format!(
                "the checkpoint {} is at step {step}, beyond --steps {}",
                dir.display(),
                config.steps
            ))
            .into());
        }
        tracing::info!(step, dir = %dir.display(), "resumed");
        first_step = step;
    }
    // In a data-parallel job the replicas are equal: rank 0 alone writes metrics, and
    // every rank writes its own part of each checkpoint. Writers exist before the job
    // connects, so rank 0 has cleared crashed writers' leftovers before anyone writes.
    let lead = config.dist.as_ref().is_none_or(|d| d.rank == 0);
    let part = config.dist.as_ref().map_or(ckpt::Part::WHOLE, |d| ckpt::Part { index: d.rank, count: d.world });
    let mut writer = match config.checkpoint.as_ref() {
        Some(c) => Some(ckpt::AsyncWriter::for_part(
            &c.dir,
            ckpt::SaveOptions { shards: c.shards, retention: c.retention },
            part,
        )?),
        None => None,
    };
    let job = match &config.dist {
        Some(d) => Some(connect(d)?),
        None => None,
    };
    let mesh = job.as_ref().map(|j| &*j.mesh);
    let mut metrics = MetricsFile::create(config.out_dir.as_ref().filter(|_| lead), first_step > 0)?;
    on_event(Event::Started { steps: config.steps, parameters });

    let denominator = config.batch * tokens_per_example;
    let (mut train_time, mut optimizer_time) = (Duration::ZERO, Duration::ZERO);
    let mut last_loss = f32::NAN;
    let mut last_eval = None;
    let crash_point = fault_point("STEADFAST_CRASH_AT");
    let stop_point = fault_point("STEADFAST_STOP_AT");
    // The summed gradient and the all-reduce's buffers, reused every step.
    let mut reduced: Vec<f32> = Vec::new();
    let mut reducer = comm::collective::Reducer::default();
    for step in first_step..config.steps {
        let started = Instant::now();
        model = model.load(&params);
        // Micro-batch i is computed by rank i mod world (all of them without a job).
        let (rank, world) = config.dist.as_ref().map_or((0, 1), |d| (d.rank, d.world));
        if crash_point == Some((rank, step)) {
            tracing::error!(rank, step, "crash point reached: aborting");
            std::process::abort();
        }
        if stop_point == Some((rank, step)) {
            stop_this_process(rank, step);
        }
        for f in config.inject.iter().filter(|f| f.step == step && f.rank == rank && f.state == StateKind::Param) {
            report_injection(&mut metrics, f, f.apply(&mut state::views(&mut params))?)?;
        }
        // Each micro-batch contributes its flat gradient followed by its loss, so one
        // reduction sums both (the loss is per-element data like any other).
        let mut micro_grads: Vec<Vec<f32>> = Vec::new();
        for i in (rank..sampler.micro_batches()).step_by(world) {
            let batch = data.batch(Split::Train, &sampler.micro_batch(step, i));
            // Activation faults hit the first micro-batch this rank computes in the step.
            let mut taps = model::Taps::none();
            let tapped = config
                .inject
                .iter()
                .filter(|f| i == rank && f.step == step && f.rank == rank && f.state == StateKind::Activation);
            for f in tapped.clone() {
                taps.add(&model, config.micro_batch, &f.flips)?;
            }
            let (l, g) = model.loss_and_grads_tapped(&batch, denominator, &device, &mut taps);
            if let Some(f) = tapped.clone().next() {
                report_injection(&mut metrics, f, std::mem::take(&mut taps.log))?;
            }
            let mut flat = g.concat();
            flat.push(l);
            micro_grads.push(flat);
        }
        let parts: Vec<&[f32]> = micro_grads.iter().map(|g| g.as_slice()).collect();
        match (mesh, &config.dist) {
            (Some(m), Some(d)) => {
                reduced.resize(parameters + 1, 0.0);
                reducer.sum_parts(m, &parts, &mut reduced, config.reduce, d.timeout)?;
            }
            _ => reduced = comm::sum_parts(config.reduce, &parts),
        }
        for f in config.inject.iter().filter(|f| f.step == step && f.rank == rank && f.state == StateKind::Grad) {
            // The gradient of each parameter is its slice of the flat sum.
            let mut views = state::flat_views(&mut reduced[..parameters], &params);
            report_injection(&mut metrics, f, f.apply(&mut views)?)?;
        }
        let flat = &reduced[..];
        let loss = flat[parameters];
        if let (Some(m), Some(d)) = (mesh, &config.dist) {
            if let Some(w) = writer.as_mut() {
                w.poll()?;
            }
            let ballot = comm::commit::Ballot {
                ok: flat.iter().all(|x| x.is_finite()),
                digest: ckpt::checksum(bytemuck::cast_slice(flat)),
                durable: writer.as_ref().map_or(0, |w| w.durable()),
            };
            let (decision, ballots) = comm::commit::vote(m, ballot, d.timeout)?;
            if let comm::commit::Decision::Abort { vetoed, disagreeing } = decision {
                if !loss.is_finite() {
                    return Err(TrainError::Diverged { step, loss });
                }
                return Err(TrainError::CommitRefused { step, vetoed, disagreeing });
            }
            if let Some(w) = writer.as_mut() {
                w.commit_through(comm::commit::durable_everywhere(&ballots))?;
            }
        }
        let grads = state::split_like(&flat[..parameters], &params);
        if !loss.is_finite() {
            return Err(TrainError::Diverged { step, loss });
        }
        for f in config.inject.iter().filter(|f| f.step == step && f.rank == rank && f.state == StateKind::Optim) {
            report_injection(&mut metrics, f, f.apply(&mut state::views(optimizer.slots_mut()))?)?;
        }
        let update = Instant::now();
        optimizer.step(&mut params, &grads);
        optimizer_time += update.elapsed();
        train_time += started.elapsed();
        last_loss = loss;
        let done = step + 1;
        metrics.write(json!({"kind": "train", "step": done, "loss": loss}))?;
        on_event(Event::Step { step: done, loss });

        if let (Some(m), Some(d)) = (mesh, &config.dist)
            && ((d.fingerprint_every > 0 && done % d.fingerprint_every == 0) || done == config.steps)
        {
            check_replicas(m, d, done, state::fingerprint(done, params.iter().chain(optimizer.slots())))?;
        }

        if let (Some(w), Some(c)) = (writer.as_mut(), config.checkpoint.as_ref())
            && (done % c.every.max(1) == 0 || done == config.steps)
        {
            let meta = checkpointing::meta(config, &sampler, done, &optimizer);
            let stall = w.snapshot(meta, &checkpointing::tensor_refs(&params, optimizer.slots()))?;
            metrics.write(json!({"kind": "checkpoint", "step": done, "stall_seconds": stall.as_secs_f64()}))?;
        }

        if done == config.steps || (config.eval_every > 0 && done % config.eval_every == 0) {
            model = model.load(&params);
            let report = evaluate(&model, &data, done, &device);
            let mut line = json!({
                "kind": "eval", "step": done, "test_loss": report.loss, "test_accuracy": report.accuracy,
            });
            if let Some(p) = report.perplexity {
                line["test_perplexity"] = json!(p);
                line["unigram_perplexity"] = json!(unigram);
            }
            metrics.write(line)?;
            on_event(Event::Eval(&report));
            last_eval = Some(report);
        }
    }
    if let Some(w) = writer.as_mut() {
        if let (Some(m), Some(d)) = (mesh, &config.dist) {
            // The last parts: once every rank's is durable, rank 0 commits.
            w.wait_persisted()?;
            let durable = comm::collective::all_gather_u64(m, w.durable(), d.timeout)?;
            w.commit_through(durable.into_iter().min().unwrap_or(0))?;
        }
        w.finish()?;
    }
    if let Some(job) = job {
        job.heartbeat.finish();
    }
    let checkpoints = writer.as_ref().map(|w| w.stats().clone()).unwrap_or_default();
    let last_eval = match last_eval {
        Some(e) => e,
        // Resumed at the final step: nothing trained, evaluate the restored state.
        None => {
            model = model.load(&params);
            evaluate(&model, &data, config.steps, &device)
        }
    };
    let fingerprint = state::fingerprint(config.steps, params.iter().chain(optimizer.slots()));
    let summary = Summary {
        steps: config.steps,
        final_loss: last_loss,
        eval: last_eval,
        unigram_perplexity: unigram,
        fingerprint,
        train_time,
        optimizer_time,
        parameters,
        resumed_from: first_step,
        checkpoints,
    };
    metrics.write(json!({
        "kind": "summary",
        "steps": summary.steps,
        "final_loss": summary.final_loss,
        "test_accuracy": summary.eval.accuracy,
        "test_perplexity": summary.eval.perplexity,
        "unigram_perplexity": summary.unigram_perplexity,
        "fingerprint": repro::fingerprint::hex(fingerprint),
        "train_seconds": train_time.as_secs_f64(),
        "optimizer_seconds": optimizer_time.as_secs_f64(),
        "resumed_from": first_step,
        "checkpoints": summary.checkpoints.committed,
        "checkpoint_stall_seconds": summary.checkpoints.stall.as_secs_f64(),
    }))?;
    Ok((summary, FinalState { params, slots: optimizer.slots().to_vec() }))
}

/// The fault-injection hooks `STEADFAST_CRASH_AT=<rank>:<step>` (the process of that
/// rank aborts, as a kill -9 would end it, when that step starts) and
/// `STEADFAST_STOP_AT=<rank>:<step>` (it stops itself with SIGSTOP: alive but silent, as a
/// hung or partitioned worker). Inert when unset.
fn fault_point(var: &str) -> Option<(usize, u64)> {
    let spec = std::env::var(var).ok()?;
    let (rank, step) = spec.split_once(':')?;
    Some((rank.trim().parse().ok()?, step.trim().parse().ok()?))
}

fn stop_this_process(rank: usize, step: u64) {
    tracing::error!(rank, step, "stop point reached: stopping this process");
    let pid = std::process::id().to_string();
    if let Err(e) = std::process::Command::new("kill").args(["-STOP", &pid]).status() {
        tracing::error!("cannot stop this process: {e}");
    }
}

/// Logs the flips of a live fault (as a warning, and in `metrics.jsonl`).
fn report_injection(
    metrics: &mut MetricsFile,
    fault: &fault::live::LiveFault,
    flips: Vec<fault::live::LiveFlip>,
) -> Result<(), TrainError> {
    for f in flips {
        tracing::warn!(
            step = fault.step,
            rank = fault.rank,
            state = fault.state.name(),
            tensor = %f.tensor,
            element = f.element,
            bits = ?f.bits,
            "injected a bit flip: {} -> {}",
            f.old,
            f.new
        );
        metrics.write(json!({
            "kind": "inject", "step": fault.step, "rank": fault.rank, "state": fault.state.name(),
            "tensor": f.tensor, "element": f.element, "bits": f.bits,
            "old": f.old.to_string(), "new": f.new.to_string(),
        }))?;
    }
    Ok(())
}

/// This rank's connections to a job.
struct Job {
    mesh: Arc<comm::transport::TcpMesh>,
    heartbeat: comm::supervisor::Heartbeat,
}

/// Joins the job: listen, meet the others through the coordinator, connect to all, and
/// start the heartbeat, whose notices abort the mesh.
fn connect(d: &DistConfig) -> Result<Job, TrainError> {
    let listener = std::net::TcpListener::bind((d.bind, 0))
        .map_err(|e| comm::transport::CommError::Setup(format!("cannot listen on {}: {e}", d.bind)))?;
    let me = listener.local_addr().map_err(|e| comm::transport::CommError::Setup(e.to_string()))?;
    let setup_time = d.timeout.max(Duration::from_secs(30));
    let joined = comm::rendezvous::join(d.coordinator, d.rank, me, &d.secret, setup_time)?;
    let addrs = joined.table;
    if addrs.len() != d.world {
        return Err(ConfigError::Invalid(format!(
            "the coordinator knows {} workers, this one expects {}",
            addrs.len(),
            d.world
        ))
        .into());
    }
    let config = comm::transport::TcpConfig {
        secret: d.secret.clone(),
        max_frame: comm::frame::DEFAULT_MAX_FRAME,
        connect_timeout: setup_time,
        write_timeout: d.timeout,
        // A peer's death reaches the coordinator at once: wait briefly for its verdict so
        // the error names the rank that failed, not a neighbour that aborted first.
        abort_grace: joined.heartbeat_timeout.min(Duration::from_secs(1)),
    };
    let mesh = Arc::new(comm::transport::TcpMesh::connect(d.rank, listener, &addrs, &config)?);
    let aborter = Arc::clone(&mesh);
    let heartbeat = comm::supervisor::Heartbeat::start(joined.coordinator, joined.heartbeat_timeout, move |notice| {
        tracing::error!("{notice}");
        aborter.abort(notice.to_string());
    })
    .map_err(|e| comm::transport::CommError::Setup(format!("cannot start the heartbeat: {e}")))?;
    Ok(Job { mesh, heartbeat })
}

/// Compares every replica's fingerprint; fails naming the ranks that differ from the
/// majority.
fn check_replicas(m: &dyn comm::transport::Transport, d: &DistConfig, step: u64, fp: u64) -> Result<(), TrainError> {
    let all = comm::collective::all_gather_u64(m, fp, d.timeout)?;
    let majority = all.iter().copied().max_by_key(|v| all.iter().filter(|w| *w == v).count()).unwrap_or(fp);
    let divergent: Vec<usize> = (0..all.len()).filter(|&r| all[r] != majority).collect();
    if divergent.is_empty() { Ok(()) } else { Err(TrainError::ReplicasDiverged { step, ranks: divergent }) }
}

/// Scores the held-out split (all test images; the first [`TEXT_EVAL_SEQUENCES`] text
/// sequences), in fixed chunks.
pub fn evaluate(model: &Model, data: &Dataset, step: u64, device: &Device) -> EvalReport {
    evaluate_first(model, data, step, device, usize::MAX)
}

/// [`evaluate`] on at most the first `limit` held-out examples.
pub fn evaluate_first(model: &Model, data: &Dataset, step: u64, device: &Device, limit: usize) -> EvalReport {
    let n = match data {
        Dataset::Images(_) => data.len(Split::Test),
        Dataset::Text(_) => data.len(Split::Test).min(TEXT_EVAL_SEQUENCES),
    }
    .min(limit);
    let mut sums = EvalSums::default();
    let indices: Vec<u32> = (0..n as u32).collect();
    for chunk in indices.chunks(EVAL_CHUNK) {
        let s = model.evaluate(&data.batch(Split::Test, chunk), device);
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

/// `metrics.jsonl`: one JSON object per line, flushed as written.
struct MetricsFile {
    file: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
}

impl MetricsFile {
    fn create(dir: Option<&PathBuf>, append: bool) -> Result<Self, TrainError> {
        let Some(dir) = dir else {
            return Ok(MetricsFile { file: None });
        };
        let path = dir.join("metrics.jsonl");
        let err = |source| TrainError::Output { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(err)?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .map_err(err)?;
        Ok(MetricsFile { file: Some((path, std::io::BufWriter::new(f))) })
    }

    fn write(&mut self, value: serde_json::Value) -> Result<(), TrainError> {
        if let Some((path, w)) = &mut self.file {
            writeln!(w, "{value}")
                .and_then(|()| w.flush())
                .map_err(|source| TrainError::Output { path: path.clone(), source })?;
        }
        Ok(())
    }
}
