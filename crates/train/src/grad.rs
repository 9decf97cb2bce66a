//! A step's gradient as one flat buffer: every parameter's gradient at its range, in
//! registry order, then the loss, so that one reduction sums both; and what the commit
//! vote reads of a sum ([`SumCheck`]). The model writes into these buffers, the step sums
//! them, the optimizer reads them.

use std::ops::Range;
use std::sync::Arc;

use crate::state::{NamedTensor, Role};

/// Where a step's gradient lives in a flat buffer: each parameter's gradient at its range,
/// in registry order, then the loss as one more named field, so that one reduction sums
/// both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradLayout {
    tensors: Vec<(String, Range<usize>)>,
    loss: usize,
}

impl GradLayout {
    /// The name of the loss field.
    pub const LOSS: &'static str = "loss";

    /// The layout of the gradient of `params`.
    pub fn of(params: &[NamedTensor]) -> Self {
        let mut offset = 0;
        let tensors = params
            .iter()
            .map(|p| {
                let range = offset..offset + p.data.len();
                offset = range.end;
                (p.name.clone(), range)
            })
            .collect();
        GradLayout { tensors, loss: offset }
    }

    /// Each parameter's name and range, in registry order.
    pub fn tensors(&self) -> &[(String, Range<usize>)] {
        &self.tensors
    }

    /// Elements of a buffer: the gradient and the loss.
    pub fn len(&self) -> usize {
        self.loss + 1
    }

    /// Whether the layout has no gradient elements (a model without parameters).
    pub fn is_empty(&self) -> bool {
        self.loss == 0
    }

    /// Every field and its range, the loss last: what a tool prints to explain a buffer.
    pub fn fields(&self) -> impl Iterator<Item = (&str, Range<usize>)> {
        self.tensors
            .iter()
            .map(|(n, r)| (n.as_str(), r.clone()))
            .chain(std::iter::once((Self::LOSS, self.loss..self.len())))
    }
}

/// A flat buffer laid out by a [`GradLayout`]: one micro-batch's gradient, or their sum.
#[derive(Clone, Debug, PartialEq)]
pub struct GradBuffer {
    data: Vec<f32>,
    layout: Arc<GradLayout>,
}

impl GradBuffer {
    /// A zero-filled buffer.
    pub fn zeros(layout: Arc<GradLayout>) -> Self {
        GradBuffer { data: vec![0.0; layout.len()], layout }
    }

    /// Its layout.
    pub fn layout(&self) -> &GradLayout {
        &self.layout
    }

    /// Every element, the loss last: what a reduction sums.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Every element, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The gradient, in parameter order.
    pub fn grads(&self) -> &[f32] {
        &self.data[..self.layout.loss]
    }

    /// The loss field.
    pub fn loss(&self) -> f32 {
        self.data[self.layout.loss]
    }

    /// Sets the loss field.
    pub fn set_loss(&mut self, loss: f32) {
        self.data[self.layout.loss] = loss;
    }

    /// The gradient of parameter `index` (registry order), mutably.
    pub fn grad_mut(&mut self, index: usize) -> &mut [f32] {
        let range = self.layout.tensors[index].1.clone();
        &mut self.data[range]
    }

    /// The gradients of tensors `index` and `index + 1` at once (a layer's weight and
    /// bias).
    pub fn grad_pair_mut(&mut self, index: usize) -> (&mut [f32], &mut [f32]) {
        let (first, second) = (self.layout.tensors[index].1.clone(), self.layout.tensors[index + 1].1.clone());
        let (head, tail) = self.data.split_at_mut(second.start);
        (&mut head[first], &mut tail[..second.len()])
    }

    /// Each parameter's gradient as a named view: what a bit flip targets.
    pub fn views_mut(&mut self) -> Vec<(&str, Role, &mut [f32])> {
        let mut rest = &mut self.data[..self.layout.loss];
        self.layout
            .tensors
            .iter()
            .map(|(name, range)| {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
                rest = tail;
                (name.as_str(), Role::Model, head)
            })
            .collect()
    }

    /// Whether every element, the loss included, is finite.
    pub fn all_finite(&self) -> bool {
        // Blocks folded without an early exit vectorise; the exit between blocks keeps
        // the early answer for a buffer that is not finite.
        self.data.chunks(256).all(|block| block.iter().fold(true, |ok, x| ok & x.is_finite()))
    }

    /// The gradient's Euclidean norm (squares summed in f64, in order).
    pub fn grad_norm(&self) -> f64 {
        self.grads().iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
    }

    /// Copies another buffer of the same layout.
    pub fn copy_from(&mut self, other: &GradBuffer) {
        self.data.copy_from_slice(&other.data);
    }
}

/// What the vote reads of a summed gradient: its digest and whether it is finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SumCheck {
    /// xxh3-64 of the whole buffer, loss included (0 from [`SumCheck::unshared`]).
    pub digest: u64,
    /// Every element, loss included, is finite.
    pub finite: bool,
    /// The loss field.
    pub loss: f32,
}

impl SumCheck {
    /// Reads `sum`.
    pub fn of(sum: &GradBuffer) -> Self {
        SumCheck { digest: ckpt::checksum(bytemuck::cast_slice(sum.as_slice())), ..Self::unshared(sum) }
    }

    /// Reads `sum` without its digest (0), for a job of one rank: a digest is compared
    /// with other ranks' and there are none.
    pub fn unshared(sum: &GradBuffer) -> Self {
        SumCheck { digest: 0, finite: sum.all_finite(), loss: sum.loss() }
    }
}

impl AsRef<[f32]> for GradBuffer {
    fn as_ref(&self) -> &[f32] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, n: usize) -> NamedTensor {
        NamedTensor::new(name.into(), Role::Model, vec![n], vec![0.0; n])
    }

    #[test]
    fn the_layout_names_every_field_and_puts_the_loss_last() {
        let layout = GradLayout::of(&[tensor("model.a", 3), tensor("model.b", 2)]);
        let fields: Vec<(&str, Range<usize>)> = layout.fields().collect();
        assert_eq!(fields, vec![("model.a", 0..3), ("model.b", 3..5), ("loss", 5..6)]);
        assert_eq!(layout.len(), 6);
        let mut buf = GradBuffer::zeros(Arc::new(layout));
        buf.set_loss(2.5);
        buf.grad_mut(1).copy_from_slice(&[7.0, 8.0]);
        assert_eq!(buf.as_slice(), &[0.0, 0.0, 0.0, 7.0, 8.0, 2.5]);
        assert_eq!(buf.grads(), &[0.0, 0.0, 0.0, 7.0, 8.0]);
        let views = buf.views_mut();
        assert_eq!(
            views.iter().map(|(n, _, v)| (*n, v.len())).collect::<Vec<_>>(),
            vec![("model.a", 3), ("model.b", 2)]
        );
    }

    #[test]
    fn the_sum_check_sees_a_non_finite_gradient_under_a_finite_loss() {
        let mut buf = GradBuffer::zeros(Arc::new(GradLayout::of(&[tensor("model.a", 2)])));
        buf.as_mut_slice().copy_from_slice(&[3.0, 4.0, 0.5]);
        let ok = SumCheck::of(&buf);
        assert!(ok.finite);
        assert_eq!((ok.loss, buf.grad_norm()), (0.5, 5.0));
        buf.grad_mut(0)[1] = f32::NAN;
        let bad = SumCheck::of(&buf);
        assert!(!bad.finite && bad.loss.is_finite());
        assert_ne!(bad.digest, ok.digest);
    }
}
