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

use crate::config::TrainConfig;
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
    ckpt::checksum((text + &width + &kernels).as_bytes())
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
    }
}

/// Borrowed views of the state, in registry order, for the writer.
pub fn tensor_refs(state: &TrainState) -> Vec<TensorRef<'_>> {
    state.tensors().map(|t| TensorRef { name: &t.name, role: t.role, shape: &t.shape, data: &t.data }).collect()
}

/// Where a run resumed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    /// The checkpoint's step.
    pub step: u64,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Newer checkpoints that were passed over because their data does not verify, newest
    /// first, each with the reason.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Restores `state` from the checkpoint that `path` names. A checkpoint directory is
/// loaded as is; a checkpoint root resolves to its newest committed checkpoint, and if
/// that one's data does not verify (a corrupt or truncated shard), to the newest older
/// one that does: each one passed over is logged as an error and listed in the result.
/// A checkpoint of another configuration is never passed over: it stops the run.
pub fn restore(path: &Path, config: &TrainConfig, state: &mut TrainState) -> Result<Restored, TrainError> {
    if path.join(ckpt::manifest::MANIFEST_FILE).exists() {
        let step = restore_from(path, config, state)?;
        return Ok(Restored { step, dir: path.to_owned(), skipped: Vec::new() });
    }
    let newest = ckpt::reader::resolve(path)?;
    let newest_step = ckpt::store::parse_step_dir(&newest.file_name().unwrap_or_default().to_string_lossy());
    let older = ckpt::store::list(path)?
        .into_iter()
        .rev()
        .filter(|(step, _)| newest_step.is_some_and(|n| *step < n))
        .map(|(_, dir)| dir);
    let mut skipped = Vec::new();
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
