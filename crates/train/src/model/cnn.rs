//! LeNet-5 for 28x28 images, in its modern form (ReLU and max pooling):
//! conv 5x5 (6, padding 2) - pool - conv 5x5 (16) - pool - 400-120-84-10.

use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::prelude::*;
use burn::tensor::activation::relu;
use burn::tensor::module::max_pool2d;
use burn::tensor::ops::MaxPoolOptions;

use super::Taps;
use super::init::Init;

/// Layer outputs that activation faults can hit, with their elements per example.
pub(super) const ACTIVATIONS: [(&str, usize); 5] =
    [("conv1", 6 * 28 * 28), ("conv2", 16 * 10 * 10), ("fc1", 120), ("fc2", 84), ("fc3", 10)];

/// LeNet-5.
#[derive(Module, Debug)]
pub struct LeNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl LeNet {
    /// A freshly initialised LeNet-5.
    pub fn new(init: &Init) -> Self {
        LeNet {
            conv1: init.conv2d("conv1", 1, 6, 5, 2),
            conv2: init.conv2d("conv2", 6, 16, 5, 0),
            fc1: init.linear("fc1", 16 * 5 * 5, 120),
            fc2: init.linear("fc2", 120, 84),
            fc3: init.linear("fc3", 84, 10),
        }
    }

    /// Logits `[n, 10]` for images `[n, 784]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_tapped(x, &mut Taps::none())
    }

    /// [`forward`](LeNet::forward) with activation faults in the layer outputs.
    pub fn forward_tapped(&self, x: Tensor<2>, taps: &mut Taps) -> Tensor<2> {
        let [n, _] = x.dims();
        let x = x.reshape([n, 1, 28, 28]);
        let x = max_pool2d(relu(taps.tap("conv1", self.conv1.forward(x))), MaxPoolOptions::new([2, 2]));
        let x = max_pool2d(relu(taps.tap("conv2", self.conv2.forward(x))), MaxPoolOptions::new([2, 2]));
        let x = x.reshape([n, 16 * 5 * 5]);
        let x = relu(taps.tap("fc1", self.fc1.forward(x)));
        let x = relu(taps.tap("fc2", self.fc2.forward(x)));
        taps.tap("fc3", self.fc3.forward(x))
    }
}
