//! SGD with momentum and L2 weight decay, with PyTorch's update rule:
//! `g += wd * p; buf = momentum * buf + g; p -= lr * buf` (without momentum, `p -= lr * g`).

use super::{OptimConfig, each1, each2, slot_for, with_grads};
use crate::state::NamedTensor;

/// Stochastic gradient descent.
#[derive(Clone, Debug, PartialEq)]
pub struct Sgd {
    config: OptimConfig,
    /// `optim.<param>.momentum_buffer` per parameter (empty without momentum).
    pub(super) slots: Vec<NamedTensor>,
    pub(super) updates: u64,
}

impl Sgd {
    /// A fresh optimizer for `params`.
    pub fn new(config: OptimConfig, params: &[NamedTensor]) -> Self {
        let slots = if config.momentum != 0.0 {
            params.iter().map(|p| slot_for(p, "momentum_buffer")).collect()
        } else {
            Vec::new()
        };
        Sgd { config, slots, updates: 0 }
    }

    pub(super) fn step(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        let OptimConfig { lr, momentum, weight_decay: wd, .. } = self.config;
        for (i, (p, g)) in with_grads(params, grads) {
            if momentum == 0.0 {
                each1(&mut p.data, g, |w, g| {
                    let g = g + wd * *w;
                    *w -= lr * g;
                });
            } else {
                let buf = &mut self.slots[i].data;
                each2(&mut p.data, g, buf, |w, g, b| {
                    let g = g + wd * *w;
                    *b = momentum * *b + g;
                    *w -= lr * *b;
                });
            }
        }
        self.updates += 1;
    }

    /// SWIFT's algebraic undo of the last update, which applied `grads`: solves the update
    /// rule for the old weights and buffer. Exact in real arithmetic, not in floating point
    /// (each inverse operation rounds again); a momentum of 0 divides by `1 - lr * wd`.
    pub(super) fn undo(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        let OptimConfig { lr, momentum, weight_decay: wd, .. } = self.config;
        for (i, (p, g)) in with_grads(params, grads) {
            if momentum == 0.0 {
                each1(&mut p.data, g, |w, g| *w = (*w + lr * g) / (1.0 - lr * wd));
            } else {
                let buf = &mut self.slots[i].data;
                each2(&mut p.data, g, buf, |w, g, b| {
                    *w += lr * *b;
                    let g = g + wd * *w;
                    *b = (*b - g) / momentum;
                });
            }
        }
        self.updates -= 1;
    }
}
