//! Optimizers over flat f32 buffers: SGD (momentum, weight decay) and AdamW.
//!
//! The optimizer owns its state as named tensors, `optim.<param>.<slot>` (for example
//! `optim.model.fc1.weight.exp_avg`), created in parameter order, so that checkpoints,
//! fingerprints and bit flips address every slot by name. Updates are element-wise with a
//! fixed operation order and no fused multiply-add; they are spread over threads by
//! element ranges, which cannot change any bit, so they give the same bits on every
//! thread count and every replica.

mod adamw;
mod sgd;

pub use adamw::AdamW;
pub use sgd::Sgd;

use crate::state::NamedTensor;

/// Elements a thread updates at once; smaller tensors are updated by one thread.
const MIN_CHUNK: usize = 1 << 15;

// The update loops below hand the pool blocks of `MIN_CHUNK` elements, and each block runs
// `f` over its elements in a plain loop, which the compiler inlines and vectorizes. (A
// per-element call through rayon's zipped iterators was left out of line, scalar, by some
// builds and not by others: the same AdamW step took 3x longer in one of two builds of the
// same source.) A tensor of one block, or a pool of one thread, is updated on the calling
// thread: handing it to the pool would only add a wake-up of another thread, and a step
// updates every tensor.

/// `f(weight, gradient)` on every element, by blocks.
fn each1(w: &mut [f32], g: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    use rayon::prelude::*;
    let block = |w: &mut [f32], g: &[f32]| {
        for (w, &g) in w.iter_mut().zip(g) {
            f(w, g);
        }
    };
    if repro::batched::on_pool(w.len(), MIN_CHUNK) {
        w.par_chunks_mut(MIN_CHUNK).zip(g.par_chunks(MIN_CHUNK)).for_each(|(w, g)| block(w, g));
    } else {
        block(w, g);
    }
}

/// `f(weight, gradient, slot)` on every element, by blocks.
fn each2(w: &mut [f32], g: &[f32], a: &mut [f32], f: impl Fn(&mut f32, f32, &mut f32) + Sync) {
    use rayon::prelude::*;
    let block = |w: &mut [f32], g: &[f32], a: &mut [f32]| {
        for ((w, &g), a) in w.iter_mut().zip(g).zip(a) {
            f(w, g, a);
        }
    };
    if repro::batched::on_pool(w.len(), MIN_CHUNK) {
        let blocks = w.par_chunks_mut(MIN_CHUNK).zip(g.par_chunks(MIN_CHUNK));
        blocks.zip(a.par_chunks_mut(MIN_CHUNK)).for_each(|((w, g), a)| block(w, g, a));
    } else {
        block(w, g, a);
    }
}

/// `f(weight, gradient, slot a, slot b)` on every element, by blocks.
fn each3(w: &mut [f32], g: &[f32], a: &mut [f32], b: &mut [f32], f: impl Fn(&mut f32, f32, &mut f32, &mut f32) + Sync) {
    use rayon::prelude::*;
    let block = |w: &mut [f32], g: &[f32], a: &mut [f32], b: &mut [f32]| {
        for (((w, &g), a), b) in w.iter_mut().zip(g).zip(a).zip(b) {
            f(w, g, a, b);
        }
    };
    if repro::batched::on_pool(w.len(), MIN_CHUNK) {
        let blocks = w.par_chunks_mut(MIN_CHUNK).zip(g.par_chunks(MIN_CHUNK));
        let blocks = blocks.zip(a.par_chunks_mut(MIN_CHUNK)).zip(b.par_chunks_mut(MIN_CHUNK));
        blocks.for_each(|(((w, g), a), b)| block(w, g, a, b));
    } else {
        block(w, g, a, b);
    }
}

/// Hyper-parameters of the optimizers; fields that an optimizer does not use are ignored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimConfig {
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum (0 disables the buffer).
    pub momentum: f32,
    /// Weight decay: L2 for SGD, decoupled for AdamW.
    pub weight_decay: f32,
    /// AdamW first-moment decay.
    pub beta1: f32,
    /// AdamW second-moment decay.
    pub beta2: f32,
    /// AdamW denominator guard.
    pub eps: f32,
}

/// Which optimizer to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimKind {
    /// Stochastic gradient descent with optional momentum.
    Sgd,
    /// Adam with decoupled weight decay.
    AdamW,
}

/// An optimizer and its state.
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// See [`Sgd`].
    Sgd(Sgd),
    /// See [`AdamW`].
    AdamW(AdamW),
}

impl Optimizer {
    /// A fresh optimizer for the given parameters (state zeroed).
    pub fn new(kind: OptimKind, config: OptimConfig, params: &[NamedTensor]) -> Self {
        match kind {
            OptimKind::Sgd => Optimizer::Sgd(Sgd::new(config, params)),
            OptimKind::AdamW => Optimizer::AdamW(AdamW::new(config, params)),
        }
    }

    /// Applies one update to `params` given their gradients, laid out flat in parameter
    /// order (see [`GradLayout`](crate::grad::GradLayout)). Panics if the lengths differ.
    pub fn step(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        assert_eq!(params.iter().map(|p| p.data.len()).sum::<usize>(), grads.len(), "one gradient per parameter");
        match self {
            Optimizer::Sgd(o) => o.step(params, grads),
            Optimizer::AdamW(o) => o.step(params, grads),
        }
    }

    /// SWIFT's algebraic undo of the last update, which applied `grads`: the inverse of
    /// the update rule, for a replica that applied a step the others did not. Inexact in
    /// floating point; Steadfast's recovery rolls the late replicas forward instead, and
    /// keeps this to measure the difference (`docs/recovery.md`). Panics if no update was
    /// applied or the lengths differ.
    pub fn undo(&mut self, params: &mut [NamedTensor], grads: &[f32]) {
        assert_eq!(params.iter().map(|p| p.data.len()).sum::<usize>(), grads.len(), "one gradient per parameter");
        assert!(self.updates() > 0, "no update to undo");
        match self {
            Optimizer::Sgd(o) => o.undo(params, grads),
            Optimizer::AdamW(o) => o.undo(params, grads),
        }
    }

    /// The optimizer's state tensors, in registry order.
    pub fn slots(&self) -> &[NamedTensor] {
        match self {
            Optimizer::Sgd(o) => &o.slots,
            Optimizer::AdamW(o) => &o.slots,
        }
    }

    /// Mutable access to the state tensors (for loading and fault injection).
    pub fn slots_mut(&mut self) -> &mut [NamedTensor] {
        match self {
            Optimizer::Sgd(o) => &mut o.slots,
            Optimizer::AdamW(o) => &mut o.slots,
        }
    }

    /// Number of updates applied so far.
    pub fn updates(&self) -> u64 {
        match self {
            Optimizer::Sgd(o) => o.updates,
            Optimizer::AdamW(o) => o.updates,
        }
    }

    /// Sets the number of updates applied (when restoring from a checkpoint).
    pub fn set_updates(&mut self, updates: u64) {
        match self {
            Optimizer::Sgd(o) => o.updates = updates,
            Optimizer::AdamW(o) => o.updates = updates,
        }
    }
}

/// Each parameter with its gradient: `flat` cut into consecutive slices of the parameters'
/// lengths.
fn with_grads<'a>(
    params: &'a mut [NamedTensor],
    flat: &'a [f32],
) -> impl Iterator<Item = (usize, (&'a mut NamedTensor, &'a [f32]))> {
    let mut rest = flat;
    params
        .iter_mut()
        .map(move |p| {
            let (head, tail) = rest.split_at(p.data.len());
            rest = tail;
            (p, head)
        })
        .enumerate()
}

/// The slot tensor `optim.<param>.<slot>`, zero-filled, shaped like its parameter.
fn slot_for(param: &NamedTensor, slot: &str) -> NamedTensor {
    NamedTensor::zeros(format!("optim.{}.{slot}", param.name), crate::state::Role::Optim, param.shape.clone())
}
