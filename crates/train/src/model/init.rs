//! Seeded parameter construction.
//!
//! Every parameter is initialised from its own Philox stream, keyed by the seed and the
//! parameter's registry name, so the initial bits never depend on a framework RNG, on the
//! order in which layers are built, or on the thread count. Distributions are uniform
//! (an exact transform of random bits, no `ln`/`cos`), with PyTorch's default scales.

use burn::module::Param;
use burn::nn::conv::Conv2d;
use burn::nn::{Embedding, LayerNorm, LayerNormConfig, Linear, PaddingConfig2d};
use burn::prelude::*;
use repro::rng::Stream;

/// Builds burn layers whose parameters are drawn from our own generator.
pub struct Init<'a> {
    device: &'a Device,
    seed: u64,
}

impl<'a> Init<'a> {
    /// An initialiser for `seed` creating tensors on `device`.
    pub fn new(device: &'a Device, seed: u64) -> Self {
        Init { device, seed }
    }

    /// `n` values uniform in `[-bound, bound)` from the stream of parameter `name`.
    pub fn uniform(&self, name: &str, n: usize, bound: f32) -> Vec<f32> {
        let mut s = Stream::for_purpose(self.seed, "init", &[repro::rng::stream_id(name, &[])]);
        (0..n).map(|_| s.uniform_symmetric(bound)).collect()
    }

    fn param<const D: usize>(&self, data: Vec<f32>, shape: [usize; D]) -> Param<Tensor<D>> {
        Param::from_tensor(Tensor::from_data(TensorData::new(data, shape), self.device))
    }

    /// A uniform parameter of the given shape.
    pub fn uniform_param<const D: usize>(&self, name: &str, shape: [usize; D], bound: f32) -> Param<Tensor<D>> {
        self.param(self.uniform(name, shape.iter().product(), bound), shape)
    }

    /// A constant parameter of the given shape.
    pub fn constant_param<const D: usize>(&self, shape: [usize; D], value: f32) -> Param<Tensor<D>> {
        self.param(vec![value; shape.iter().product()], shape)
    }

    /// A linear layer `y = x W + b` with `W: [d_in, d_out]`, both drawn from
    /// `U(-1/sqrt(d_in), 1/sqrt(d_in))` as PyTorch's default does.
    pub fn linear(&self, name: &str, d_in: usize, d_out: usize) -> Linear {
        let bound = 1.0 / (d_in as f32).sqrt();
        self.linear_scaled(name, d_in, d_out, bound)
    }

    /// A linear layer with weights from `U(-bound, bound)` and zero bias.
    pub fn linear_scaled(&self, name: &str, d_in: usize, d_out: usize, bound: f32) -> Linear {
        Linear {
            weight: self.uniform_param(&format!("{name}.weight"), [d_in, d_out], bound),
            bias: Some(self.uniform_param(&format!("{name}.bias"), [d_out], 1.0 / (d_in as f32).sqrt())),
        }
    }

    /// A 2-D convolution `[c_out, c_in, k, k]` with stride 1 and the given padding, weights
    /// and bias from `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`.
    pub fn conv2d(&self, name: &str, c_in: usize, c_out: usize, k: usize, padding: usize) -> Conv2d {
        let bound = 1.0 / ((c_in * k * k) as f32).sqrt();
        Conv2d {
            weight: self.uniform_param(&format!("{name}.weight"), [c_out, c_in, k, k], bound),
            bias: Some(self.uniform_param(&format!("{name}.bias"), [c_out], bound)),
            stride: [1, 1],
            kernel_size: [k, k],
            dilation: [1, 1],
            groups: 1,
            padding: PaddingConfig2d::Explicit(padding, padding, padding, padding),
        }
    }

    /// An embedding table `[n, d]` with entries of standard deviation `std`.
    pub fn embedding(&self, name: &str, n: usize, d: usize, std: f32) -> Embedding {
        Embedding { weight: self.uniform_param(&format!("{name}.weight"), [n, d], std * 3f32.sqrt()) }
    }

    /// A layer norm over `d` features with `gamma = 1`, `beta = 0`, epsilon `1e-5`.
    pub fn layer_norm(&self, d: usize) -> LayerNorm {
        let mut ln = LayerNormConfig::new(d).init(self.device);
        ln.gamma = self.constant_param([d], 1.0);
        ln.beta = Some(self.constant_param([d], 0.0));
        ln
    }
}
