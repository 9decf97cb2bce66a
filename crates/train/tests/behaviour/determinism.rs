//! The determinism contract on one worker: the final state's bits are a function of the
//! configuration alone, whatever the thread count.

use crate::common;

use common::{fingerprint_with_threads, tiny};
use train::model::ModelKind;
use train::optim::OptimKind;

#[test]
fn same_configuration_same_bits_on_one_and_two_threads() {
    for model in [ModelKind::Mlp, ModelKind::Cnn, ModelKind::Gpt] {
        let mut c = tiny(model);
        if model == ModelKind::Mlp {
            // Large enough micro-batches that the matrix products take their parallel path.
            c.batch = 512;
            c.micro_batch = 256;
        }
        let one = fingerprint_with_threads(&c, 1);
        let two = fingerprint_with_threads(&c, 2);
        let again = fingerprint_with_threads(&c, 2);
        assert_eq!(one, two, "{model:?}: 1 vs 2 threads");
        assert_eq!(two, again, "{model:?}: two runs on 2 threads");
    }
}

#[test]
fn seed_and_optimizer_change_the_bits() {
    let base = tiny(ModelKind::Mlp);
    let fp = fingerprint_with_threads(&base, 2);
    let mut other_seed = base.clone();
    other_seed.seed = 1;
    assert_ne!(fp, fingerprint_with_threads(&other_seed, 2));
    let mut sgd = base.clone();
    sgd.optimizer = OptimKind::Sgd;
    assert_ne!(fp, fingerprint_with_threads(&sgd, 2));
}

#[test]
fn micro_batch_size_changes_memory_not_the_update() {
    // Accumulating 4 micro-batches of 8 or 1 micro-batch of 32 computes the same global
    // batch gradient; only the rounding of the sums differs, so parameters agree closely.
    let mut a = tiny(ModelKind::Mlp);
    a.optimizer = OptimKind::Sgd;
    a.optim.lr = 0.05;
    let mut b = a.clone();
    b.micro_batch = b.batch;
    let (_, sa) = train::train(&a, &mut |_| {}).unwrap();
    let (_, sb) = train::train(&b, &mut |_| {}).unwrap();
    let mut max_diff = 0.0f32;
    for (pa, pb) in sa.params.iter().zip(&sb.params) {
        assert_eq!(pa.name, pb.name);
        for (x, y) in pa.data.iter().zip(&pb.data) {
            max_diff = max_diff.max((x - y).abs());
        }
    }
    assert!(max_diff < 1e-4, "parameters differ by {max_diff}");
}
