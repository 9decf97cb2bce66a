//! A training run's starting weights and data order, written as safetensors files so that
//! other systems (the checkpoint study's PyTorch, TensorFlow and Chainer sides) can train
//! the same model from the same weights on the same order (`steadfast bench init` and
//! `steadfast bench order`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use train::model::ModelKind;

use crate::LabError;

/// Writes the initial parameters of `train --model M --width W --seed S` to `to`, with
/// tensors named as in a checkpoint (`model.fc1.weight`); returns the row to print.
pub fn init(model: ModelKind, width: usize, seed: u64, to: &Path) -> Result<serde_json::Value, LabError> {
    let params = train::model::initial_params(model, seed, width).ok_or_else(|| {
        LabError::Spec("the GPT's shape follows its text: `bench init` exports the MLP and LeNet-5 only".into())
    })?;
    let bytes: Vec<Vec<u8>> = params.iter().map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let plain: Vec<ckpt::export::Plain<'_>> = params
        .iter()
        .zip(&bytes)
        .map(|(t, b)| ckpt::export::Plain { name: &t.name, dtype: ckpt::DType::F32, shape: &t.shape, bytes: b })
        .collect();
    let metadata = BTreeMap::from([
        ("steadfast.model".to_string(), format!("{model:?}").to_lowercase()),
        ("steadfast.seed".to_string(), seed.to_string()),
    ]);
    let written = ckpt::export::write_plain(to, &plain, &metadata)?;
    Ok(json!({"to": to, "tensors": params.len(), "bytes": written}))
}

/// Writes the data order of `train --seed S` over `examples` examples for `epochs`
/// epochs: one U32 tensor `order` of shape [epochs, examples]; returns the row to print.
pub fn order(examples: usize, epochs: u64, seed: u64, to: &Path) -> Result<serde_json::Value, LabError> {
    if examples == 0 || epochs == 0 {
        return Err(LabError::Spec("--examples and --epochs must be positive".into()));
    }
    if u32::try_from(examples).is_err() {
        return Err(LabError::Spec("--examples must fit in 32 bits".into()));
    }
    let mut bytes = Vec::with_capacity(examples * epochs as usize * 4);
    for epoch in 0..epochs {
        bytes.extend(train::data::sampler::epoch_order(seed, examples, epoch).iter().flat_map(|i| i.to_le_bytes()));
    }
    let shape = [epochs as usize, examples];
    let plain = [ckpt::export::Plain { name: "order", dtype: ckpt::DType::U32, shape: &shape, bytes: &bytes }];
    let metadata = BTreeMap::from([("steadfast.seed".to_string(), seed.to_string())]);
    let written = ckpt::export::write_plain(to, &plain, &metadata)?;
    Ok(json!({"to": to, "epochs": epochs, "examples": examples, "bytes": written}))
}
