//! A campaign's simulated replicas take the one step of `train::step`: a fault-free group
//! ends with the fingerprint of `steadfast train` with the same configuration, for one
//! replica or several (whose micro-batch gradients are summed in index order, as one
//! process sums them), in both reductions a campaign compares.

use comm::ReduceMode;
use lab::campaign::Campaign;
use train::TrainConfig;
use train::data::DataKind;
use train::model::ModelKind;

/// A campaign over a short MLP run on synthetic data, with `replicas` simulated replicas, whose
/// golden run is the whole run (no trial injects before its end).
fn campaign(replicas: usize, reduce: &str) -> Campaign {
    let text = format!(
        r#"
[run]
model = "mlp"
data = "synthetic"
batch = 32
micro_batch = 8
replicas = {replicas}
reduce = ["{reduce}"]
eval_examples = 100
[trials]
count = 1
inject_at = [6]
steps_after = 2
state = ["param"]
"#
    );
    let spec = lab::campaign::Spec::parse(&text).unwrap();
    Campaign::prepare(spec).unwrap()
}

#[test]
fn a_campaigns_golden_run_ends_with_the_fingerprint_of_train() {
    for (replicas, reduce, mode) in [
        (1, "deterministic", ReduceMode::Deterministic),
        (2, "deterministic", ReduceMode::Deterministic),
        (4, "reproducible", ReduceMode::Reproducible),
    ] {
        let mut config = TrainConfig::defaults(ModelKind::Mlp);
        config.data = DataKind::Synthetic;
        config.steps = 8;
        config.batch = 32;
        config.micro_batch = 8;
        config.eval_every = 0;
        config.reduce = mode;
        let (summary, _) = train::train(&config, &mut |_| {}).unwrap();
        let golden = campaign(replicas, reduce).golden(mode).unwrap();
        assert_eq!(
            golden.fingerprint(),
            summary.fingerprint,
            "{replicas} simulated replicas ({reduce}) against one process"
        );
    }
}
