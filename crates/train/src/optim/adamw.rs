//! AdamW (Loshchilov & Hutter), with PyTorch's update rule (the bias correction of the
//! second moment is applied as a multiplication by a precomputed reciprocal, which saves a
//! division per element):
//!
//! ```text
//! p   -= lr * wd * p
//! m    = b1 * m + (1 - b1) * g
//! v    = b2 * v + (1 - b2) * g * g
//! p   -= (lr / (1 - b1^t)) * m / (sqrt(v) * (1 / sqrt(1 - b2^t)) + eps)
//! ```
//!
//! The bias corrections `b^t` are computed in f64 by exponentiation by squaring (only
//! correctly rounded multiplications), so they do not depend on the platform's `pow`.

use super::{OptimConfig, each3, slot_for, with_grads};
use crate::state::NamedTensor;

/// Adam with decoupled weight decay.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    config: OptimConfig,
    /// `exp_avg` and `exp_avg_sq` per parameter, interleaved in parameter order.
    pub(super) slots: Vec<NamedTensor>,
    pub(super) updates: u64,
}

fn pow_by_squaring(base: f64, mut exp: u64) -> f64 {
    let (mut result, mut b) = (1.0f64, base);
    while exp > 0 {
        if exp & 1 == 1 {
            result *= b;
        }
        b *= b;
        exp >>= 1;
    }
    result
}

impl AdamW {
    /// A fresh optimizer for `params`.
    pub fn new(config: OptimConfig, params: &[NamedTensor]) -> Self {
        let slots = params.iter().flat_map(|p| [slot_for(p, "exp_avg"), slot_for(p, "exp_avg_sq")]).collect();
        AdamW { config, slots, updates: 0 }
    }

    /// The factors of update `t` (1-based): the step size with the first moment's bias
    /// correction, the reciprocal square root of the second moment's, and the decay.
    fn factors(&self, t: u64) -> (f32, f32, f32) {
        let OptimConfig { lr, weight_decay: wd, beta1: b1, beta2: b2, .. } = self.config;
        let bc1 = 1.0 - pow_by_squaring(f64::from(b1), t);
        let bc2 = 1.0 - pow_by_squaring(f64::from(b2), t);
        ((f64::from(lr) / bc1) as f32, (1.0 / bc2.sqrt()) as f32, 1.0 - lr * wd)
    }

    /// Runs `f(weight, gradient, first moment, second moment)` on every element, spread
    /// over threads by element ranges (element-wise, so no bit depends on the split).
    fn each_element(
        &mut self,
        params: &mut [NamedTensor],
        grads: &[f32],
        f: impl Fn(&mut f32, f32, &mut f32, &mut f32) + Sync,
    ) {
        for (i, (p, g)) in with_grads(params, grads) {
            let (m_slot, v_slot) = self.slots[2 * i..2 * i + 2].split_at_mut(1);
            let (m, v) = (&mut m_slot[0].data, &mut v_slot[0].data);
            each3(&mut p.data, g, m, v, &f);
        }
    }

    pub(super) fn step(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        let OptimConfig { beta1: b1, beta2: b2, eps, .. } = self.config;
        let t = self.updates + 1;
        let (step_size, inv_bc2_sqrt, decay) = self.factors(t);
        self.each_element(params, grads, |w, g, m, v| {
            *w *= decay;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * (g * g);
            *w -= step_size * *m / (v.sqrt() * inv_bc2_sqrt + eps);
        });
        self.updates = t;
    }

    /// SWIFT's algebraic undo of the last update, which applied `grads`: the update rule
    /// solved for the old weights and moments, with the same bias corrections. Exact in
    /// real arithmetic, not in floating point (each inverse operation rounds again, and a
    /// square root loses what the square kept).
    pub(super) fn undo(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        let OptimConfig { beta1: b1, beta2: b2, eps, .. } = self.config;
        let t = self.updates;
        let (step_size, inv_bc2_sqrt, decay) = self.factors(t);
        self.each_element(params, grads, |w, g, m, v| {
            *w += step_size * *m / (v.sqrt() * inv_bc2_sqrt + eps);
            *w /= decay;
            *m = (*m - (1.0 - b1) * g) / b1;
            *v = ((*v - (1.0 - b2) * (g * g)) / b2).max(0.0);
        });
        self.updates = t - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Role;

    #[test]
    fn pow_matches_repeated_multiplication_closely() {
        let mut r = 1.0f64;
        for t in 1..=200u64 {
            r *= 0.999;
            assert!((pow_by_squaring(0.999, t) - r).abs() < 1e-12);
        }
    }

    #[test]
    fn first_step_moves_each_weight_by_about_lr_against_the_gradient_sign() {
        let cfg = OptimConfig { lr: 0.01, momentum: 0.0, weight_decay: 0.0, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let mut p = vec![NamedTensor::new("model.w".into(), Role::Model, vec![3], vec![1.0, 1.0, 1.0])];
        let mut opt = AdamW::new(cfg, &p);
        opt.step(&mut p, &[0.5, -2.0, 0.0]);
        assert!((p[0].data[0] - 0.99).abs() < 1e-6);
        assert!((p[0].data[1] - 1.01).abs() < 1e-6);
        assert_eq!(p[0].data[2], 1.0);
        assert_eq!(opt.slots[0].name, "optim.model.w.exp_avg");
        assert_eq!(opt.slots[1].name, "optim.model.w.exp_avg_sq");
    }
}
