//! A trained model's tensors under the names and layouts of PyTorch's `torch.nn` modules,
//! so that a module built with the same layer names loads them as they are
//! (`module.load_state_dict(...)`).
//!
//! Steadfast's layers follow `y = x·W + b`: a linear layer's weight is `[in, out]`, where
//! `torch.nn.Linear` keeps `[out, in]` for `y = x·Wᵀ + b`. Embedding tables (`[n, d]`),
//! convolution kernels (`[out, in, kh, kw]`) and biases are laid out alike in both. A
//! layer norm's scale and shift are `gamma` and `beta` here, `weight` and `bias` there.
//!
//! The rules, applied to the model's tensors only (role `model`; the optimizer's state has
//! no `torch.nn` counterpart), without the `model.` prefix of the registry names:
//! - a two-dimensional `<layer>.weight` with a `<layer>.bias` beside it is a linear layer's
//!   weight, and is transposed (an embedding table has no bias);
//! - `<layer>.gamma` and `<layer>.beta` become `<layer>.weight` and `<layer>.bias`;
//! - every other tensor keeps its name and bytes.
//!
//! ```
//! use ckpt::torch_layout::{Named, to_torch};
//! use ckpt::DType;
//!
//! // A 2 x 3 linear weight ([in, out]) and its bias.
//! let w: Vec<u8> = [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|x| x.to_le_bytes()).collect();
//! let b = vec![0u8; 12];
//! let out = to_torch(vec![
//!     Named { name: "model.fc.weight".into(), dtype: DType::F32, shape: vec![2, 3], bytes: w },
//!     Named { name: "model.fc.bias".into(), dtype: DType::F32, shape: vec![3], bytes: b },
//! ]);
//! assert_eq!(out[0].name, "fc.weight");
//! assert_eq!(out[0].shape, [3, 2]);
//! let t: Vec<f32> = out[0].bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
//! assert_eq!(t, [1., 4., 2., 5., 3., 6.]);
//! ```

use std::collections::BTreeSet;

use crate::DType;

/// The registry's prefix of model tensors.
const MODEL_PREFIX: &str = "model.";

/// One tensor: name, element type, shape (outermost first) and row-major bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Row-major little-endian elements.
    pub bytes: Vec<u8>,
}

/// The model tensors `model` (registry names, `model.` prefix optional) renamed and laid
/// out as `torch.nn` modules hold them, in the same order.
pub fn to_torch(model: Vec<Named>) -> Vec<Named> {
    let names: BTreeSet<String> = model.iter().map(|t| local(&t.name).to_owned()).collect();
    model
        .into_iter()
        .map(|t| {
            let name = local(&t.name).to_owned();
            if let Some(layer) = name.strip_suffix(".weight")
                && t.shape.len() == 2
                && names.contains(&format!("{layer}.bias"))
            {
                let bytes = transpose(&t.bytes, t.shape[0], t.shape[1], t.dtype.size());
                return Named { name, dtype: t.dtype, shape: vec![t.shape[1], t.shape[0]], bytes };
            }
            let name = match (name.strip_suffix(".gamma"), name.strip_suffix(".beta")) {
                (Some(layer), _) => format!("{layer}.weight"),
                (_, Some(layer)) => format!("{layer}.bias"),
                _ => name,
            };
            Named { name, ..t }
        })
        .collect()
}

fn local(name: &str) -> &str {
    name.strip_prefix(MODEL_PREFIX).unwrap_or(name)
}

/// The `rows x cols` matrix of `size`-byte elements in `bytes`, transposed.
fn transpose(bytes: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            out[to..to + size].copy_from_slice(&bytes[from..from + size]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, shape: &[usize]) -> Named {
        let n: usize = shape.iter().product();
        Named {
            name: name.into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            bytes: (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        }
    }

    #[test]
    fn linear_weights_turn_embeddings_and_kernels_stay_and_norms_are_renamed() {
        let out = to_torch(vec![
            t("model.tok.weight", &[5, 4]),
            t("model.fc.weight", &[4, 3]),
            t("model.fc.bias", &[3]),
            t("model.conv1.weight", &[6, 1, 5, 5]),
            t("model.conv1.bias", &[6]),
            t("model.ln_f.gamma", &[4]),
            t("model.ln_f.beta", &[4]),
        ]);
        let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["tok.weight", "fc.weight", "fc.bias", "conv1.weight", "conv1.bias", "ln_f.weight", "ln_f.bias"]
        );
        assert_eq!(out[0], Named { name: "tok.weight".into(), ..t("model.tok.weight", &[5, 4]) });
        assert_eq!(out[1].shape, [3, 4]);
        assert_eq!(out[3].bytes, t("x", &[6, 1, 5, 5]).bytes);
        // Transposed twice is the original.
        let back = transpose(&out[1].bytes, 3, 4, 4);
        assert_eq!(back, t("x", &[4, 3]).bytes);
        // Element (r, c) of the [4, 3] original is element (c, r) of the result.
        let at = |b: &[u8], i: usize| f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(at(&out[1].bytes, 2 * 4 + 1), 3.0 + 2.0);
    }
}
