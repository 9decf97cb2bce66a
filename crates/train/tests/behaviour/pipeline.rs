//! Pipeline schedules on the one step driver: each model cut into stages, each stage a
//! thread with its own part of the state, the boundary tensors over the in-process
//! transport, ends with the bits of `train` on the whole model.

use crate::common;

use std::time::Duration;

use train::driver::{Driver, Stop};
use train::model::ModelKind;
use train::optim::Optimizer;
use train::pipeline::StageLink;
use train::schedule::{self, Op};
use train::step::{LiveFaults, TrainState};
use train::trainer::Prepared;
use train::{TrainConfig, state};

/// Trains `config` as `stages` stages with `build`'s schedule; returns each stage's
/// final state.
fn train_stages(config: &TrainConfig, stages: usize, build: fn(usize, usize, usize) -> Vec<Op>) -> Vec<TrainState> {
    let prepared = Prepared::load(config).unwrap();
    let network = comm::transport::mem_network(stages);
    std::thread::scope(|scope| {
        let handles: Vec<_> = network
            .into_iter()
            .enumerate()
            .map(|(s, endpoint)| {
                let prepared = &prepared;
                scope.spawn(move || {
                    let (whole, engine) = prepared.start(config);
                    let stage = engine.stage(stages, s).unwrap();
                    let params = stage.params(&whole.params);
                    let mut state =
                        TrainState::new(params.clone(), Optimizer::new(config.optimizer, config.optim, &params));
                    let mut engine = engine.for_stage(stage);
                    let ops = build(stages, s, engine.sampler().micro_batches());
                    let mut driver = Driver::new(&engine, s);
                    let mut link = StageLink::new(endpoint, Duration::from_secs(30));
                    let mut hooks = LiveFaults::default();
                    while state.step < config.steps {
                        let stop = driver.run(&ops, 0, &mut engine, &mut state, &mut hooks, &mut link).unwrap();
                        assert_eq!(stop, Stop::Done);
                    }
                    state
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The stages' states put back together in registry order: parameters, then optimizer
/// slots, stage by stage.
fn joined(stages: &[TrainState]) -> Vec<state::NamedTensor> {
    let params = stages.iter().flat_map(|s| s.params.iter().cloned());
    let slots: Vec<_> = stages.iter().flat_map(|s| s.optimizer.slots().iter().cloned()).collect();
    params.chain(slots).collect()
}

/// Trains `config` whole and as every number of stages in `counts` with both
/// schedules: the joined stages' tensors have the bits of the whole model's.
fn stages_give_the_bits_of_train(config: &TrainConfig, counts: &[usize]) {
    let (summary, trained) = train::train(config, &mut |_| {}).unwrap();
    let whole: Vec<_> = trained.tensors().cloned().collect();
    for &count in counts {
        for (name, build) in [("gpipe", schedule::gpipe as fn(_, _, _) -> _), ("1f1b", schedule::one_f_one_b)] {
            let stages = train_stages(config, count, build);
            let tensors = joined(&stages);
            let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, whole.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), "{name}");
            for (got, want) in tensors.iter().zip(&whole) {
                let bits = |t: &state::NamedTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert!(bits(got) == bits(want), "{count} stages, {name}: {} differs from train's", got.name);
            }
            assert!(
                stages.iter().all(|s| s.step == trained.step && s.optimizer.updates() == trained.optimizer.updates())
            );
            assert_eq!(state::fingerprint(trained.step, tensors.iter()), summary.fingerprint, "{count}, {name}");
        }
    }
}

#[test]
fn pipelines_of_the_mlp_give_the_bits_of_train() {
    let mut config = common::tiny(ModelKind::Mlp);
    config.micro_batch = 8; // 4 micro-batches a step
    stages_give_the_bits_of_train(&config, &[2, 3]);
}

#[test]
fn pipelines_of_lenet_give_the_bits_of_train() {
    let mut config = common::tiny(ModelKind::Cnn);
    config.steps = 3;
    // A cut between the convolutions, one inside the linear layers, one after each unit.
    stages_give_the_bits_of_train(&config, &[2, 5]);
}

#[test]
fn pipelines_of_the_gpt_give_the_bits_of_train() {
    let mut config = common::tiny(ModelKind::Gpt);
    (config.steps, config.batch, config.micro_batch) = (2, 8, 4);
    // The embeddings alone, then blocks, then the head: every kind of boundary.
    stages_give_the_bits_of_train(&config, &[2, 6]);
}

#[test]
fn a_cut_into_more_stages_than_units_is_refused() {
    let config = common::tiny(ModelKind::Mlp);
    let prepared = Prepared::load(&config).unwrap();
    let (_, engine) = prepared.start(&config);
    let err = engine.stage(4, 0).unwrap_err();
    assert!(err.to_string().contains("1 to 3 stages"), "{err}");
}
