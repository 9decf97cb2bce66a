//! The data order: which examples form each micro-batch of each step.
//!
//! Following the determinism contract, the training set is shuffled by a permutation
//! that is a pure function of `(seed, epoch)` (a Philox-driven Fisher–Yates shuffle).
//! Step `s` of an epoch takes the global batch `perm[s*B .. (s+1)*B]` and cuts it into
//! `B / m` micro-batches of `m` examples, in order. An epoch has `floor(n / B)` steps; the
//! last `n mod B` examples of each permutation are not used in that epoch (they are
//! different examples every epoch).
//!
//! A micro-batch is therefore a pure function of `(seed, epoch, step, index)`: it does not
//! matter which rank or thread computes it, or whether training was interrupted.

use crate::error::ConfigError;

/// The permutation of the `examples` training examples that epoch `epoch` visits, in
/// order: global step `s` of the epoch takes elements `s*B .. (s+1)*B`. Exported by
/// `steadfast bench order` so that other systems can train on the same order.
pub fn epoch_order(seed: u64, examples: usize, epoch: u64) -> Vec<u32> {
    repro::rng::data_order(seed, examples, epoch)
}

/// Cuts epochs into global batches and micro-batches.
#[derive(Clone, Debug)]
pub struct Sampler {
    seed: u64,
    examples: usize,
    global_batch: usize,
    micro_batch: usize,
    cached: Option<(u64, Vec<u32>)>,
}

/// Where a global step falls in the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Step within the epoch, from 0.
    pub step_in_epoch: u64,
}

impl Sampler {
    /// A sampler over `examples` training examples. The global batch must be a multiple of
    /// the micro-batch, and at most the number of examples.
    pub fn new(seed: u64, examples: usize, global_batch: usize, micro_batch: usize) -> Result<Self, ConfigError> {
        if micro_batch == 0 || global_batch == 0 {
            return Err(ConfigError::Invalid("batch and micro-batch sizes must be positive".into()));
        }
        if !global_batch.is_multiple_of(micro_batch) {
            return Err(ConfigError::Invalid(format!(
                "the batch ({global_batch}) must be a multiple of the micro-batch ({micro_batch})"
            )));
        }
        if global_batch > examples {
            return Err(ConfigError::Invalid(format!(
                "the batch ({global_batch}) is larger than the training set ({examples} examples)"
            )));
        }
        Ok(Sampler { seed, examples, global_batch, micro_batch, cached: None })
    }

    /// Examples in a global batch.
    pub fn batch(&self) -> usize {
        self.global_batch
    }

    /// Steps in one epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        (self.examples / self.global_batch) as u64
    }

    /// Micro-batches in one global batch.
    pub fn micro_batches(&self) -> usize {
        self.global_batch / self.micro_batch
    }

    /// The global batch size.
    pub fn global_batch(&self) -> usize {
        self.global_batch
    }

    /// Where global step `step` (from 0) falls.
    pub fn position(&self, step: u64) -> Position {
        let spe = self.steps_per_epoch();
        Position { epoch: step / spe, step_in_epoch: step % spe }
    }

    /// The example indices of micro-batch `index` of global step `step`.
    pub fn micro_batch(&mut self, step: u64, index: usize) -> Vec<u32> {
        assert!(index < self.micro_batches(), "micro-batch {index} of {}", self.micro_batches());
        let pos = self.position(step);
        let start = pos.step_in_epoch as usize * self.global_batch + index * self.micro_batch;
        let len = self.micro_batch;
        self.epoch_permutation(pos.epoch)[start..start + len].to_vec()
    }

    fn epoch_permutation(&mut self, epoch: u64) -> &[u32] {
        if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.cached = Some((epoch, epoch_order(self.seed, self.examples, epoch)));
        }
        &self.cached.as_ref().expect("filled above").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_tile_the_global_batch_and_epochs_cover_distinct_examples() {
        let mut s = Sampler::new(3, 100, 20, 5).unwrap();
        assert_eq!(s.steps_per_epoch(), 5);
        let mut seen: Vec<u32> =
            (0..5).flat_map(|st| (0..4).flat_map(|i| s.micro_batch(st, i)).collect::<Vec<_>>()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<u32>>());
    }

    #[test]
    fn a_micro_batch_does_not_depend_on_history_or_micro_batch_size() {
        let mut a = Sampler::new(3, 100, 20, 5).unwrap();
        let mut b = Sampler::new(3, 100, 20, 10).unwrap();
        let late = a.micro_batch(12, 1);
        let _ = a.micro_batch(0, 0);
        assert_eq!(late, a.micro_batch(12, 1));
        let whole_a: Vec<u32> = (0..4).flat_map(|i| a.micro_batch(7, i)).collect();
        let whole_b: Vec<u32> = (0..2).flat_map(|i| b.micro_batch(7, i)).collect();
        assert_eq!(whole_a, whole_b);
        assert_ne!(a.micro_batch(2, 0), a.micro_batch(7, 0));
    }

    #[test]
    fn bad_sizes_are_config_errors() {
        assert!(Sampler::new(0, 100, 20, 3).is_err());
        assert!(Sampler::new(0, 10, 20, 5).is_err());
        assert!(Sampler::new(0, 10, 0, 5).is_err());
    }
}
