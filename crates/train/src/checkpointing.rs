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

use ckpt::{DataCursor, Meta, Retention, RngState, TensorData, TensorRef};

use crate::TrainConfig;
use crate::data::sampler::Sampler;
use crate::error::TrainError;
use crate::optim::Optimizer;
use crate::state::NamedTensor;

/// Name of the optimizer-update scalar in the manifest.
const UPDATES: &str = "optimizer.updates";

/// Where and how often to checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// Root directory of the checkpoints.
    pub dir: PathBuf,
    /// Checkpoint after every this many steps (the last step is always checkpointed).
    pub every: u64,
    /// Which checkpoints to keep.
    pub retention: Retention,
    /// Shard files written in parallel.
    pub shards: usize,
}

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
    ckpt::checksum(text.as_bytes())
}

/// The manifest metadata of the state after `step` steps.
pub fn meta(config: &TrainConfig, sampler: &Sampler, step: u64, optimizer: &Optimizer) -> Meta {
    let next = sampler.position(step);
    Meta {
        step,
        epoch: next.epoch,
        world_size: 1,
        config_hash: format!("{:016x}", config_hash(config)),
        rng: RngState { algorithm: "philox4x32-10".into(), seed: config.seed },
        data_cursor: DataCursor {
            epoch: next.epoch,
            step_in_epoch: next.step_in_epoch,
            global_batch: sampler.global_batch() as u64,
        },
        scalars: BTreeMap::from([(UPDATES.to_owned(), optimizer.updates())]),
    }
}

/// Borrowed views of the state, in registry order, for the writer.
pub fn tensor_refs<'a>(params: &'a [NamedTensor], slots: &'a [NamedTensor]) -> Vec<TensorRef<'a>> {
    params
        .iter()
        .chain(slots)
        .map(|t| TensorRef { name: &t.name, role: t.role, shape: &t.shape, data: &t.data })
        .collect()
}

/// Restores parameters and optimizer state from the checkpoint that `path` resolves to.
/// Returns the checkpoint's step and directory.
pub fn restore(
    path: &Path,
    config: &TrainConfig,
    params: &mut [NamedTensor],
    optimizer: &mut Optimizer,
) -> Result<(u64, PathBuf), TrainError> {
    let dir = ckpt::reader::resolve(path)?;
    let c = ckpt::reader::open(&dir)?;
    let resume_err = |reason: String| TrainError::Resume { path: dir.clone(), reason };
    let want = format!("{:016x}", config_hash(config));
    if c.manifest.meta.config_hash != want {
        return Err(resume_err(format!(
            "it was written by a different configuration (hash {}, this run's is {want}): model, data, seed, \
             batch, micro-batch and optimizer settings must be the same",
            c.manifest.meta.config_hash
        )));
    }
    let updates = *c.manifest.meta.scalars.get(UPDATES).ok_or_else(|| resume_err(format!("no {UPDATES} scalar")))?;
    let loaded = c.load()?;
    let expected = params.len() + optimizer.slots().len();
    if loaded.len() != expected {
        return Err(resume_err(format!("it holds {} tensors, this run has {expected}", loaded.len())));
    }
    let targets = params.iter_mut().chain(optimizer.slots_mut().iter_mut());
    for (t, l) in targets.zip(&loaded) {
        if t.name != l.name || t.shape != l.shape || t.role != l.role {
            return Err(resume_err(format!(
                "tensor {} {:?} ({}) where this run has {} {:?} ({})",
                l.name, l.shape, l.role, t.name, t.shape, t.role
            )));
        }
        let TensorData::F32(data) = &l.data else {
            return Err(resume_err(format!("tensor {} is {}, not F32", l.name, l.dtype)));
        };
        t.data.copy_from_slice(data);
    }
    optimizer.set_updates(updates);
    Ok((c.manifest.meta.step, dir))
}
