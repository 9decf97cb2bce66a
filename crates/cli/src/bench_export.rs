//! `steadfast bench init` and `steadfast bench order`: a training run's starting weights
//! and data order, written as safetensors files so that other systems (the checkpoint
//! study's PyTorch, TensorFlow and Chainer sides) can train the same model from the
//! same weights on the same order.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use train::model::ModelKind;

use crate::choice;

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The model (the MLP or LeNet-5: `cnn`).
    #[arg(long, value_parser = choice::of::<ModelKind>(), default_value = "mlp")]
    model: ModelKind,
    /// The MLP's first hidden width, as `train --width`.
    #[arg(long, default_value_t = train::model::Mlp::DEFAULT_WIDTH)]
    width: usize,
    /// The seed, as `train --seed`.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The safetensors file to write (tensors named as in a checkpoint: `model.fc1.weight`).
    #[arg(long)]
    to: PathBuf,
}

#[derive(Args, Debug)]
pub struct OrderArgs {
    /// Training examples in the data set (Fashion-MNIST: 60000).
    #[arg(long, default_value_t = 60_000)]
    examples: usize,
    /// Epochs to write.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// The seed, as `train --seed`.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The safetensors file to write: one U32 tensor `order` of shape [epochs, examples];
    /// row `e` is epoch `e`'s permutation, and step `s` of the epoch takes its elements
    /// `s*B .. (s+1)*B` for a batch of `B`.
    #[arg(long)]
    to: PathBuf,
}

/// Writes the initial parameters of `train --model M --width W --seed S`.
pub fn init(a: &InitArgs) -> anyhow::Result<()> {
    let params = train::model::initial_params(a.model, a.seed, a.width)
        .context("the GPT's shape follows its text: `bench init` exports the MLP and LeNet-5 only")?;
    let bytes: Vec<Vec<u8>> = params.iter().map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let plain: Vec<ckpt::export::Plain<'_>> = params
        .iter()
        .zip(&bytes)
        .map(|(t, b)| ckpt::export::Plain { name: &t.name, dtype: ckpt::DType::F32, shape: &t.shape, bytes: b })
        .collect();
    let metadata = BTreeMap::from([
        ("steadfast.model".to_string(), format!("{:?}", a.model).to_lowercase()),
        ("steadfast.seed".to_string(), a.seed.to_string()),
    ]);
    let written = ckpt::export::write_plain(&a.to, &plain, &metadata)?;
    println!("{}", json!({"to": a.to, "tensors": params.len(), "bytes": written}));
    Ok(())
}

/// Writes the data order of `train --seed S` over `examples` examples.
pub fn order(a: &OrderArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.examples > 0 && a.epochs > 0, "--examples and --epochs must be positive");
    anyhow::ensure!(u32::try_from(a.examples).is_ok(), "--examples must fit in 32 bits");
    let mut bytes = Vec::with_capacity(a.examples * a.epochs as usize * 4);
    for epoch in 0..a.epochs {
        bytes.extend(train::data::sampler::epoch_order(a.seed, a.examples, epoch).iter().flat_map(|i| i.to_le_bytes()));
    }
    let shape = [a.epochs as usize, a.examples];
    let plain = [ckpt::export::Plain { name: "order", dtype: ckpt::DType::U32, shape: &shape, bytes: &bytes }];
    let metadata = BTreeMap::from([("steadfast.seed".to_string(), a.seed.to_string())]);
    let written = ckpt::export::write_plain(&a.to, &plain, &metadata)?;
    println!("{}", json!({"to": a.to, "epochs": a.epochs, "examples": a.examples, "bytes": written}));
    Ok(())
}
