//! A multi-layer perceptron for 28x28 images: 784-256-128-10 with ReLU.

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::Taps;
use super::init::Init;

/// Layer outputs that activation faults can hit, with their elements per example.
pub(super) const ACTIVATIONS: [(&str, usize); 3] = [("fc1", 256), ("fc2", 128), ("fc3", 10)];

/// The MLP.
#[derive(Module, Debug)]
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl Mlp {
    /// Widths of the layers, input first.
    pub const WIDTHS: [usize; 4] = [784, 256, 128, 10];

    /// A freshly initialised MLP.
    pub fn new(init: &Init) -> Self {
        let w = Self::WIDTHS;
        Mlp {
            fc1: init.linear("fc1", w[0], w[1]),
            fc2: init.linear("fc2", w[1], w[2]),
            fc3: init.linear("fc3", w[2], w[3]),
        }
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
