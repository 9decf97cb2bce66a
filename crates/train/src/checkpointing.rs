//! The bridge between the trainer and the `ckpt` crate: what a checkpoint of a training
//! run holds, and how a run resumes from one.
//!
//! A checkpoint taken after step `k` holds every parameter and optimizer slot, the
//! optimizer's update count, and the metadata to continue exactly: the seed (the
//! counter-based RNG needs nothing else), the data cursor (which follows from `k`), and a
//! hash of the configuration. Resuming checks the hash, restores every tensor by name and
//! shape, and continues at step `k + 1`; the result is bit-identical to a run that never
//! stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{DataCursor, Meta, RngState, TensorData, TensorRef};

use crate::config::{CheckpointConfig, TrainConfig, WhenBusy};
use crate::data::sampler::Sampler;
use crate::error::TrainError;
use crate::model::{KernelSet, Kernels};
use crate::step::TrainState;

/// Name of the optimizer-update scalar in the manifest.
const UPDATES: &str = "optimizer.updates";

/// The hash of everything that determines a run's trajectory (not its length, not where
/// it writes): a checkpoint only resumes a run with the same hash.
pub fn config_hash(c: &TrainConfig) -> u64 {
    let o = &c.optim;
    let text = format!(
        "model={:?};data={:?};seed={};batch={};micro_batch={};reduce={};optimizer={:?};lr={:08x};momentum={:08x};\
         weight_decay={:08x};beta1={:08x};beta2={:08x};eps={:08x}",
        c.model,
        c.data,
        c.seed,
        c.batch,
        c.micro_batch,
        c.reduce,
        c.optimizer,
        o.lr.to_bits(),
        o.momentum.to_bits(),
        o.weight_decay.to_bits(),
        o.beta1.to_bits(),
        o.beta2.to_bits(),
        o.eps.to_bits()
    );
    // The default width leaves the text, and the hashes of older checkpoints, as they were;
    // so do the framework's kernels, which computed every model before the fixed-order ones.
    let width = match c.mlp_width {
        crate::model::Mlp::DEFAULT_WIDTH => String::new(),
        w => format!(";mlp_width={w}"),
    };
    let kernels = match c.kernel_set() {
        KernelSet::Framework => String::new(),
        set => format!(";kernels={set}"),
    };
    // So does the GPT's default shape.
    let gpt = match c.gpt {
        g if g == crate::model::GptConfig::small(g.vocab) => String::new(),
        g => format!(";gpt=context{},width{},blocks{},heads{}", g.context, g.width, g.layers, g.heads),
    };
    ckpt::checksum((text + &width + &kernels + &gpt).as_bytes())
}

/// The manifest metadata of `state`, computed by `kernels` in a job of `world` workers.
pub fn meta(config: &TrainConfig, sampler: &Sampler, state: &TrainState, kernels: Kernels, world: usize) -> Meta {
    let next = sampler.position(state.step);
    Meta {
        step: state.step,
        epoch: next.epoch,
        world_size: world as u32,
        config_hash: format!("{:016x}", config_hash(config)),
        kernels: kernels.to_string(),
        rng: RngState { algorithm: "philox4x32-10".into(), seed: config.seed },
        data_cursor: DataCursor {
            epoch: next.epoch,
            step_in_epoch: next.step_in_epoch,
            global_batch: sampler.global_batch() as u64,
        },
        scalars: BTreeMap::from([(UPDATES.to_owned(), state.optimizer.updates())]),
        tree: None,
    }
}

/// Fails if the checkpoint root of `config` holds checkpoints of another configuration:
/// a run never writes beside or over another run's checkpoints, and is refused before its
/// first step rather than at its first commit (which the store would refuse too).
pub fn refuse_other_configuration(config: &TrainConfig) -> Result<(), TrainError> {
    let Some(c) = &config.checkpoint else { return Ok(()) };
    let ours = format!("{:016x}", config_hash(config));
    Ok(ckpt::store::check_configuration(&c.dir, &ours, None)?)
}

/// When a run takes its checkpoints: after every `every` steps and after the last, and
/// under [`WhenBusy::Defer`] not while a persist is still running: a due checkpoint is then
/// owed, and taken after the first step at which the writers are idle. A due step that
/// `keep_every` keeps, and the last step, are never put off.
///
/// A state machine without I/O: the trainer tells it after each step whether the writers
/// are idle. In a data-parallel job that answer must be the same on every rank, so the
/// trainer reads it from the commit vote's ballots ([`Schedule::idle_everywhere`]), never
/// from its own writer; then every rank takes the same checkpoints.
#[derive(Clone, Debug)]
pub struct Schedule {
    every: u64,
    last: u64,
    keep_every: Option<u64>,
    when_busy: WhenBusy,
    owed: bool,
    newest: u64,
    deferred: u64,
}

impl Schedule {
    /// The schedule of `checkpoint` for a run that ends after step `last`.
    pub fn new(checkpoint: &CheckpointConfig, last: u64) -> Self {
        Schedule {
            every: checkpoint.every.max(1),
            last,
            keep_every: checkpoint.retention.keep_every.map(|k| k.max(1)),
            when_busy: checkpoint.when_busy,
            owed: false,
            newest: 0,
            deferred: 0,
        }
    }

    /// Whether every rank's writer is idle, from the newest step that every rank has
    /// made durable (the minimum over the ballots of a commit vote): each has then
    /// finished the persist of the newest checkpoint taken.
    pub fn idle_everywhere(&self, durable_everywhere: u64) -> bool {
        durable_everywhere >= self.newest
    }

    /// After step `done`: whether to take a checkpoint now. `idle` tells whether the
    /// writers are idle; it is asked only when the answer depends on it.
    pub fn take<E>(&mut self, done: u64, idle: impl FnOnce() -> Result<bool, E>) -> Result<bool, E> {
        let due = done.is_multiple_of(self.every);
        self.owed |= due;
        let pinned = done == self.last || (due && self.keep_every.is_some_and(|k| done.is_multiple_of(k)));
        let take = pinned
            || (self.owed
                && match self.when_busy {
                    WhenBusy::Wait => true,
                    WhenBusy::Defer => idle()?,
                });
        if take {
            (self.owed, self.newest) = (false, done);
        } else if due {
            self.deferred += 1;
        }
        Ok(take)
    }

    /// Steps at which a checkpoint fell due but was not taken, the writers being busy
    /// (several can end in one later checkpoint).
    pub fn deferred(&self) -> u64 {
        self.deferred
    }
}

/// Borrowed views of the state, in registry order, for the writer.
pub fn tensor_refs(state: &TrainState) -> Vec<TensorRef<'_>> {
    state.tensors().map(|t| TensorRef { name: &t.name, role: t.role, shape: &t.shape, data: &t.data }).collect()
}

/// The checkpoint that `--resume` names: `latest`, the newest under the checkpoint root
/// `root`; `auto`, the same if the root holds any checkpoint and a fresh start (`None`)
/// otherwise (a job that a scheduler restarts or requeues runs one command every time);
/// anything else, that path.
pub fn resume_from(arg: Option<PathBuf>, root: Option<&Path>) -> Result<Option<PathBuf>, crate::ConfigError> {
    let needs_root = |word: &str| crate::ConfigError::Invalid(format!("--resume {word} needs --checkpoint-dir"));
    Ok(match arg {
        Some(p) if p.as_os_str() == "latest" => Some(root.ok_or_else(|| needs_root("latest"))?.to_path_buf()),
        Some(p) if p.as_os_str() == "auto" => {
            let root = root.ok_or_else(|| needs_root("auto"))?;
            let newest = ckpt::reader::newest_step(root)
                .map_err(|e| crate::ConfigError::Invalid(format!("cannot list {}: {e}", root.display())))?;
            newest.map(|_| root.to_path_buf())
        }
        other => other,
    })
}

/// Where a run resumed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    /// The checkpoint's step.
    pub step: u64,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// What was passed over, newest first, each with the reason: newer checkpoints whose
    /// manifest or data does not verify, and a `LATEST` that names no valid checkpoint.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Restores `state` from the checkpoint that `path` names. A checkpoint directory is
/// loaded as is; a checkpoint root resolves to its newest committed checkpoint, and if
/// that one's data does not verify (a corrupt or truncated shard), to the newest older
/// one that does: each one passed over (and a `LATEST` that is wrong) is logged as an
/// error and listed in the result.
/// A checkpoint of another configuration is never passed over: it stops the run.
pub fn restore(path: &Path, config: &TrainConfig, state: &mut TrainState) -> Result<Restored, TrainError> {
    if path.join(ckpt::manifest::MANIFEST_FILE).exists() {
        let step = restore_from(path, config, state)?;
        return Ok(Restored { step, dir: path.to_owned(), skipped: Vec::new() });
    }
    let resolved = ckpt::reader::resolve_reporting(path)?;
    let newest = resolved.dir;
    let mut skipped = resolved.skipped;
    for (p, reason) in &skipped {
        tracing::error!(skipped = %p.display(), "passed over in {}: {reason}", path.display());
    }
    let newest_step = ckpt::store::parse_step_dir(&newest.file_name().unwrap_or_default().to_string_lossy());
    let older = ckpt::store::list(path)?
        .into_iter()
        .rev()
        .filter(|(step, _)| newest_step.is_some_and(|n| *step < n))
        .map(|(_, dir)| dir);
    for dir in std::iter::once(newest).chain(older) {
        match restore_from(&dir, config, state) {
            Ok(step) => return Ok(Restored { step, dir, skipped }),
            Err(TrainError::Checkpoint(e)) => {
                tracing::error!(dir = %dir.display(), "checkpoint does not verify, trying the one before it: {e}");
                skipped.push((dir, e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    let reasons: Vec<String> = skipped.iter().map(|(d, r)| format!("{}: {r}", d.display())).collect();
    Err(TrainError::Resume {
        path: path.to_owned(),
        reason: format!("no checkpoint under it verifies ({})", reasons.join("; ")),
    })
}

/// Restores `state` from checkpoint directory `dir`; returns its step. `state` is left
/// untouched unless every tensor verified and fits.
fn restore_from(dir: &Path, config: &TrainConfig, state: &mut TrainState) -> Result<u64, TrainError> {
    let c = ckpt::reader::open(dir)?;
    let resume_err = |reason: String| TrainError::Resume { path: dir.to_owned(), reason };
    let want = format!("{:016x}", config_hash(config));
    if c.manifest.meta.config_hash != want {
        return Err(resume_err(format!(
            "it was written by a different configuration (hash {}, this run's is {want}): model, data, seed, \
             batch, micro-batch, reduce mode, optimizer settings and kernel set must be the same",
            c.manifest.meta.config_hash
        )));
    }
    let updates = *c.manifest.meta.scalars.get(UPDATES).ok_or_else(|| resume_err(format!("no {UPDATES} scalar")))?;
    let loaded = c.load()?;
    let expected = state.tensors().count();
    if loaded.len() != expected {
        return Err(resume_err(format!("it holds {} tensors, this run has {expected}", loaded.len())));
    }
    for (t, l) in state.tensors().zip(&loaded) {
        if t.name != l.name || t.shape != l.shape || t.role != l.role {
            return Err(resume_err(format!(
                "tensor {} {:?} ({}) where this run has {} {:?} ({})",
                l.name, l.shape, l.role, t.name, t.shape, t.role
            )));
        }
        if !matches!(l.data, TensorData::F32(_)) {
            return Err(resume_err(format!("tensor {} is {}, not F32", l.name, l.dtype)));
        }
    }
    let TrainState { params, optimizer, step } = state;
    for (t, l) in params.iter_mut().chain(optimizer.slots_mut().iter_mut()).zip(&loaded) {
        if let TensorData::F32(data) = &l.data {
            t.data.copy_from_slice(data);
        }
    }
    optimizer.set_updates(updates);
    *step = c.manifest.meta.step;
    Ok(c.manifest.meta.step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(every: u64, keep_every: Option<u64>, when_busy: WhenBusy, last: u64) -> Schedule {
        let mut c = CheckpointConfig::every("unused", every);
        c.retention.keep_every = keep_every;
        c.when_busy = when_busy;
        Schedule::new(&c, last)
    }

    /// The steps taken over `1..=last` when the writer is idle at the steps of `idle`.
    fn taken(s: &mut Schedule, last: u64, idle: impl Fn(u64) -> bool) -> Vec<u64> {
        (1..=last).filter(|&d| s.take(d, || Ok::<_, ()>(idle(d))).unwrap()).collect()
    }

    #[test]
    fn waiting_takes_every_due_step_and_the_last() {
        let mut s = schedule(3, None, WhenBusy::Wait, 10);
        assert_eq!(taken(&mut s, 10, |_| false), [3, 6, 9, 10]);
        assert_eq!(s.deferred(), 0);
    }

    #[test]
    fn deferring_takes_an_owed_checkpoint_once_the_writer_is_free() {
        // A persist lasts three steps: a snapshot after step k leaves the writer busy
        // until step k + 3.
        let mut s = schedule(1, None, WhenBusy::Defer, 12);
        let mut busy_until = 0;
        let mut took = Vec::new();
        for d in 1..=12 {
            if s.take(d, || Ok::<_, ()>(d >= busy_until)).unwrap() {
                took.push(d);
                busy_until = d + 3;
            }
        }
        assert_eq!(took, [1, 4, 7, 10, 12]);
        assert_eq!(s.deferred(), 12 - 5);
    }

    #[test]
    fn a_step_that_retention_keeps_and_the_last_are_never_put_off() {
        let mut s = schedule(2, Some(4), WhenBusy::Defer, 10);
        assert_eq!(taken(&mut s, 10, |_| false), [4, 8, 10]);
        assert_eq!(s.deferred(), 2, "steps 2 and 6");
    }

    #[test]
    fn ranks_that_read_the_ballots_take_the_same_checkpoints_where_their_own_writers_would_not() {
        // Two ranks whose persists last 2 and 5 steps. Each step the ballots carry each
        // rank's newest durable step; both read their minimum.
        let persist = [2, 5];
        let mut ranks = [schedule(1, None, WhenBusy::Defer, 20), schedule(1, None, WhenBusy::Defer, 20)];
        let mut pending: [Option<(u64, u64)>; 2] = [None, None]; // (step, durable at)
        let mut durable = [0u64; 2];
        let mut took: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        for d in 1..=20 {
            for r in 0..2 {
                if let Some((step, at)) = pending[r]
                    && d >= at
                {
                    (durable[r], pending[r]) = (step, None);
                }
            }
            let everywhere = durable.iter().copied().min().unwrap();
            for r in 0..2 {
                let idle = ranks[r].idle_everywhere(everywhere);
                if ranks[r].take(d, || Ok::<_, ()>(idle)).unwrap() {
                    took[r].push(d);
                    pending[r] = Some((d, d + persist[r]));
                }
            }
        }
        assert_eq!(took[0], took[1]);
        assert_eq!(took[0], [1, 6, 11, 16, 20], "paced by the slower rank");
        // Deciding from its own writer, the faster rank would take others.
        let mut alone = schedule(1, None, WhenBusy::Defer, 20);
        let mut busy_until = 0;
        let own: Vec<u64> = (1..=20)
            .filter(|&d| {
                let go = alone.take(d, || Ok::<_, ()>(d >= busy_until)).unwrap();
                if go {
                    busy_until = d + persist[0];
                }
                go
            })
            .collect();
        assert_ne!(own, took[0]);
    }
}
