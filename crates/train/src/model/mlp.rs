//! A multi-layer perceptron for 28x28 images: 784-W-W/2-10 with ReLU (W = 256 unless a
//! run asks for another width, to study how costs grow with the model).

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::Taps;
use super::init::Init;

/// The MLP.
#[derive(Module, Debug)]
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl Mlp {
    /// The first hidden layer's width unless a run asks for another.
    pub const DEFAULT_WIDTH: usize = 256;

    /// Widths of the layers, input first, for a first hidden layer of `width`.
    pub fn widths(width: usize) -> [usize; 4] {
        [784, width, (width / 2).max(1), 10]
    }

    /// A freshly initialised MLP whose first hidden layer is `width` wide.
    pub fn new(init: &Init, width: usize) -> Self {
        let w = Self::widths(width);
        Mlp {
            fc1: init.linear("fc1", w[0], w[1]),
            fc2: init.linear("fc2", w[1], w[2]),
            fc3: init.linear("fc3", w[2], w[3]),
        }
    }

    /// Layer outputs that activation faults can hit, with their elements per example.
    pub(super) fn activations(&self) -> [(&'static str, usize); 3] {
        let out = |l: &Linear| l.weight.dims()[1];
        [("fc1", out(&self.fc1)), ("fc2", out(&self.fc2)), ("fc3", out(&self.fc3))]
    }

    /// Logits `[n, 10]` for images `[n, 784]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_tapped(x, &mut Taps::none())
    }

    /// [`forward`](Mlp::forward) with activation faults in the layer outputs.
    pub fn forward_tapped(&self, x: Tensor<2>, taps: &mut Taps) -> Tensor<2> {
        let h = relu(taps.tap("fc1", self.fc1.forward(x)));
        let h = relu(taps.tap("fc2", self.fc2.forward(h)));
        taps.tap("fc3", self.fc3.forward(h))
    }
}
