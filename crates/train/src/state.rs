//! The state registry: training state as an ordered list of named f32 tensors.
//!
//! Parameters are named `model.<path>` (e.g. `model.fc1.weight`) and come first, in the
//! order the model declares them; optimizer slots follow as `optim.<param>.<slot>`.
//! Checkpoints, fingerprints, bit-flip targeting and state transfer all walk this order.

pub use ckpt::Role;

/// One named tensor of training state, stored flat and contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Registry name, e.g. `model.fc1.weight` or `optim.model.fc1.weight.exp_avg`.
    pub name: String,
    /// Model parameter or optimizer state.
    pub role: Role,
    /// Shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// Elements in row-major order; `data.len()` is the product of `shape`.
    pub data: Vec<f32>,
}

impl NamedTensor {
    /// A tensor from its parts. Panics if `data` does not match `shape`.
    pub fn new(name: String, role: Role, shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "tensor {name}: shape {shape:?} vs {} elements",
            data.len()
        );
        NamedTensor { name, role, shape, data }
    }

    /// A zero-filled tensor.
    pub fn zeros(name: String, role: Role, shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        NamedTensor { name, role, shape, data: vec![0.0; n] }
    }
}

/// The tensors as (name, role, data) views, in order: what [`fault::live::LiveFault::apply`]
/// flips bits in.
pub fn views(tensors: &mut [NamedTensor]) -> Vec<(&str, Role, &mut [f32])> {
    tensors.iter_mut().map(|t| (t.name.as_str(), t.role, t.data.as_mut_slice())).collect()
}

/// Fingerprint of tensors in registry order together with the step counter; see
/// [`repro::fingerprint`].
pub fn fingerprint<'a>(step: u64, tensors: impl IntoIterator<Item = &'a NamedTensor>) -> u64 {
    let mut f = repro::fingerprint::Fingerprinter::new();
    f.add_u64("step", step);
    for t in tensors {
        f.add(&t.name, &t.data);
    }
    f.finish()
}
