//! One step for every runner: `train` in one process and a hand-driven loop over the
//! step's phases end with the same bits, and live faults fire at their hook points. (The
//! campaign's simulated replicas are held to the same bits in `lab`'s tests.)

use crate::common;

use comm::ReduceMode;
use train::driver::{Alone, Driver, Stop};
use train::schedule::Op;
use train::step::{Engine, LiveFaults, NoHooks, TrainState};
use train::trainer::Prepared;

/// Two ranks' data-parallel schedules run up to their reduction, their micro-batch
/// gradients summed together by hand, as a new runner would: the same bits as `train`.
#[test]
fn two_ranks_schedules_driven_by_hand_give_the_bits_of_train() {
    let mut config = common::tiny(train::model::ModelKind::Cnn);
    config.reduce = ReduceMode::Reproducible;
    let (summary, trained) = train::train(&config, &mut |_| {}).unwrap();

    let prepared = Prepared::load(&config).unwrap();
    let (mut state, mut engine): (TrainState, Engine) = prepared.start(&config);
    let mut ranks: Vec<(Vec<Op>, Driver)> =
        (0..2).map(|r| (common::compute_ops(&engine, r, 2), Driver::new(&engine, r))).collect();
    let mut sum = engine.buffer();
    while state.step < config.steps {
        for (ops, driver) in &mut ranks {
            assert_eq!(driver.run(ops, 0, &mut engine, &mut state, &mut NoHooks, &mut Alone).unwrap(), Stop::Done);
        }
        let all: Vec<_> = ranks.iter().flat_map(|(_, d)| d.micro().iter().cloned()).collect();
        engine.reduce_local(&all, &mut sum);
        state.apply(&sum);
    }
    assert_eq!(state.fingerprint(), summary.fingerprint);
    assert_eq!(state, trained);
}

/// A live fault fires once, at its hook point, and is spent.
#[test]
fn a_live_fault_fires_once_at_its_step_and_rank() {
    let config = common::tiny(train::model::ModelKind::Mlp);
    let prepared = Prepared::load(&config).unwrap();
    let (mut state, _engine) = prepared.start(&config);
    let fault: fault::live::LiveFault = "step=0,rank=1,state=param,bits=31,count=3,seed=5".parse().unwrap();
    let mut faults = LiveFaults::new([fault]);
    use train::step::{At, Hooks};
    let before = state.clone();
    faults.after_load(At { step: 0, rank: 0 }, &mut state).unwrap();
    assert_eq!(state, before, "rank 0 is not the fault's");
    faults.after_load(At { step: 0, rank: 1 }, &mut state).unwrap();
    let flips = Hooks::take_flips(&mut faults);
    assert_eq!(flips.len(), 3);
    assert!(faults.all_fired());
    let changed: usize = state
        .params
        .iter()
        .zip(&before.params)
        .map(|(a, b)| a.data.iter().zip(&b.data).filter(|(x, y)| x != y).count())
        .sum();
    assert_eq!(changed, 3, "three sign flips");
    let after = state.clone();
    faults.after_load(At { step: 0, rank: 1 }, &mut state).unwrap();
    assert_eq!(state, after, "a fired fault is spent");
}
