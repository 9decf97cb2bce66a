//! The fixed-order kernels compute the same function as the framework's: the same loss,
//! gradients and evaluation to within rounding, with and without activation faults. (That
//! their bits do not depend on the instruction set is tested in `crates/kernels` kernel by
//! kernel, and on whole training runs by the command line's `cpu_kinds` tests.)

use burn::prelude::Device;
use fault::bits::BitSpec;
use fault::plan::{Amount, FlipSpec, Target};
use train::data::{Batch, DataKind, DataSpec, Dataset, Modality, Split};
use train::model::{GptConfig, Kernels, Loaded, Mlp, Model, ModelKind, Taps};
use train::step::{GradBuffer, GradLayout};

fn synthetic(modality: Modality, context: usize) -> Dataset {
    let spec = DataSpec { kind: DataKind::Synthetic, dir: None, modality, context, seed: 3 };
    Dataset::load(&spec).unwrap()
}

fn images(n: u32) -> Batch {
    synthetic(Modality::Images, 64).batch(Split::Train, &(0..n).collect::<Vec<_>>())
}

/// A GPT of `config`'s shape (its vocabulary taken from the synthetic text) and 16 of
/// that text's sequences.
fn gpt_and_text(config: GptConfig) -> (GptConfig, Batch) {
    let data = synthetic(Modality::Text, config.context);
    let Dataset::Text(text) = &data else { unreachable!() };
    let config = GptConfig { vocab: text.vocab.len(), ..config };
    (config, data.batch(Split::Train, &(0..16).collect::<Vec<_>>()))
}

/// Loss, gradients and the flips logged, on `kernels`, with `spec`'s activation faults.
fn run(model: &Model, kernels: Kernels, batch: &Batch, spec: Option<&FlipSpec>) -> (f32, Vec<f32>, Vec<String>) {
    let device = Device::flex().autodiff();
    let params = model.params();
    let mut out = GradBuffer::zeros(std::sync::Arc::new(GradLayout::of(&params)));
    let mut taps = Taps::none();
    if let Some(spec) = spec {
        taps.add(model, 16, spec).unwrap();
    }
    let loaded = Loaded { model, params: &params, kernels, device: &device };
    loaded.loss_and_grads_into(batch, 32, &mut taps, &mut out);
    let flips = taps.log.iter().map(|f| format!("{} {} {} -> {}", f.tensor, f.element, f.old, f.new)).collect();
    (out.loss(), out.grads().to_vec(), flips)
}

fn assert_close(name: &str, fixed: &[f32], framework: &[f32]) {
    let scale = framework.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in fixed.iter().zip(framework).enumerate() {
        assert!((a - b).abs() <= 1e-5 * scale + 1e-7, "{name}[{i}]: fixed {a} vs framework {b} (scale {scale})");
    }
}

fn model(kind: ModelKind, gpt: GptConfig, device: &Device) -> Model {
    Model::new(kind, 7, gpt, Mlp::DEFAULT_WIDTH, device)
}

fn computes_the_frameworks_loss_and_gradients(kind: ModelKind, gpt: GptConfig, batch: &Batch) {
    let model = model(kind, gpt, &Device::flex().autodiff());
    let isa = kernels::Isa::detect();
    let (loss, grads, _) = run(&model, Kernels::Fixed(isa), batch, None);
    let (loss_fw, grads_fw, _) = run(&model, Kernels::Framework, batch, None);
    assert!((loss - loss_fw).abs() <= 1e-6 * loss_fw.abs(), "loss {loss} vs {loss_fw}");
    let layout = GradLayout::of(&model.params());
    for (name, range) in layout.tensors() {
        assert_close(name, &grads[range.clone()], &grads_fw[range.clone()]);
    }
    assert_ne!(grads, grads_fw, "the two kernel sets round differently somewhere");

    let device = Device::flex();
    let params = model.params();
    let plain = self::model(kind, gpt, &device);
    let eval = |kernels| Loaded { model: &plain, params: &params, kernels, device: &device }.evaluate(batch);
    let (e, e_fw) = (eval(Kernels::Fixed(isa)), eval(Kernels::Framework));
    assert_eq!((e.count, e.correct), (e_fw.count, e_fw.correct));
    assert!((e.loss_sum - e_fw.loss_sum).abs() <= 1e-5 * e_fw.loss_sum, "{} vs {}", e.loss_sum, e_fw.loss_sum);
}

#[test]
fn the_fixed_mlp_computes_the_frameworks_loss_and_gradients() {
    computes_the_frameworks_loss_and_gradients(ModelKind::Mlp, GptConfig::small(0), &images(16));
}

#[test]
fn the_fixed_cnn_computes_the_frameworks_loss_and_gradients() {
    computes_the_frameworks_loss_and_gradients(ModelKind::Cnn, GptConfig::small(0), &images(16));
}

#[test]
fn the_fixed_gpt_computes_the_frameworks_loss_and_gradients() {
    // The default shape, and an awkward one: heads of 12 values, 13 tokens, 3 heads.
    let awkward = GptConfig { vocab: 0, context: 13, width: 36, layers: 2, heads: 3 };
    for config in [GptConfig::small(0), awkward] {
        let (config, batch) = gpt_and_text(config);
        computes_the_frameworks_loss_and_gradients(ModelKind::Gpt, config, &batch);
    }
}

fn faults_strike_the_same_elements(kind: ModelKind, layers: &[&str]) {
    let model = model(kind, GptConfig::small(0), &Device::flex().autodiff());
    let batch = images(16);
    // Mantissa flips keep the values finite, so the two passes stay comparable.
    let spec = FlipSpec {
        target: Target { glob: Some("act.*".into()), role: None },
        bits: BitSpec::Positions(16, 23),
        amount: Amount::Count(40),
        burst: 1,
        seed: 5,
    };
    let (loss, grads, flips) = run(&model, Kernels::Fixed(kernels::Isa::detect()), &batch, Some(&spec));
    let (loss_fw, grads_fw, flips_fw) = run(&model, Kernels::Framework, &batch, Some(&spec));
    assert_eq!(flips.len(), 40);
    for layer in layers {
        assert!(flips.iter().any(|f| f.starts_with(&format!("act.{layer} "))), "no flip in {layer}: {flips:?}");
    }
    // The same elements; the values before the flip differ only by the kernels' rounding,
    // so compare the places, and the gradients within rounding.
    let places =
        |v: &[String]| v.iter().map(|f| f.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect::<Vec<_>>();
    assert_eq!(places(&flips), places(&flips_fw));
    assert!((loss - loss_fw).abs() <= 1e-5 * loss_fw.abs(), "loss {loss} vs {loss_fw}");
    let layout = GradLayout::of(&model.params());
    for (name, range) in layout.tensors() {
        assert_close(&format!("{name} under faults"), &grads[range.clone()], &grads_fw[range.clone()]);
    }
    let (clean_loss, _, _) = run(&model, Kernels::Fixed(kernels::Isa::detect()), &batch, None);
    assert_ne!(loss, clean_loss, "the faults changed the loss");
}

#[test]
fn activation_faults_strike_the_same_elements_with_the_same_effect_on_both_kernel_sets() {
    faults_strike_the_same_elements(ModelKind::Mlp, &["fc1", "fc3"]);
}

#[test]
fn activation_faults_in_the_cnn_strike_the_same_elements_on_both_kernel_sets() {
    faults_strike_the_same_elements(ModelKind::Cnn, &["conv1", "conv2"]);
}
