//! A replica that applied a step the others did not: SWIFT undoes the update
//! algebraically, Steadfast rolls the others forward. Rolling forward gives the bits of
//! the run that never failed; the undo does not, and these tests measure by how much.
//!
//! `cargo test --release -p steadfast-train --test behaviour undo -- --nocapture` prints the figures
//! quoted in `docs/recovery.md`.

use crate::common;

use train::driver::{Alone, Driver};
use train::model::ModelKind;
use train::optim::OptimKind;
use train::step::{NoHooks, TrainState};
use train::trainer::Prepared;

/// Differing elements, elements, worst relative difference.
type Distance = (usize, usize, f64);

/// Elements of the parameters (`slots` false) or optimizer slots (`slots` true) of `a`
/// whose bits differ from `b`'s, of how many, and the largest difference relative to the
/// larger magnitude.
fn distance(a: &TrainState, b: &TrainState, slots: bool) -> Distance {
    let (mut differ, mut total, mut worst) = (0, 0, 0.0f64);
    let pick = |s: &TrainState| -> Vec<train::state::NamedTensor> {
        if slots { s.optimizer.slots().to_vec() } else { s.params.clone() }
    };
    for (x, y) in pick(a).iter().zip(&pick(b)) {
        for (&u, &v) in x.data.iter().zip(&y.data) {
            total += 1;
            if u.to_bits() != v.to_bits() {
                differ += 1;
                let scale = f64::from(u.abs().max(v.abs())).max(f64::MIN_POSITIVE);
                worst = worst.max(f64::from(u - v).abs() / scale);
            }
        }
    }
    (differ, total, worst)
}

/// Trains `steps` steps; at step `at`, applies the update and, with `undo`, undoes it and
/// applies it again (a replica that was ahead, brought back and then forward with the
/// others), or without, applies it once (rolled forward).
fn run(optimizer: OptimKind, steps: u64, at: u64, undo: bool) -> (TrainState, Option<[Distance; 2]>) {
    let mut config = common::tiny(ModelKind::Mlp);
    config.optimizer = optimizer;
    config.steps = steps;
    let prepared = Prepared::load(&config).unwrap();
    let (mut state, mut engine) = prepared.start(&config);
    let compute = common::compute_ops(&engine, 0, 1);
    let (mut driver, mut sum) = (Driver::new(&engine, 0), engine.buffer());
    let mut undone = None;
    while state.step < steps {
        driver.run(&compute, 0, &mut engine, &mut state, &mut NoHooks, &mut Alone).unwrap();
        engine.reduce_local(driver.micro(), &mut sum);
        if undo && state.step == at {
            let before = state.clone();
            state.apply(&sum);
            state.undo(&sum);
            assert_eq!(state.step, before.step);
            assert_eq!(state.optimizer.updates(), before.optimizer.updates());
            undone = Some([distance(&state, &before, false), distance(&state, &before, true)]);
        }
        state.apply(&sum);
    }
    (state, undone)
}

#[test]
fn the_algebraic_undo_is_close_but_not_exact_and_its_error_stays_in_the_model() {
    for optimizer in [OptimKind::Sgd, OptimKind::AdamW] {
        let (exact, _) = run(optimizer, 30, 10, false);
        let (undone, right_after) = run(optimizer, 30, 10, true);
        let [(differ, total, worst), (slot_differ, slot_total, slot_worst)] = right_after.unwrap();
        let (end_differ, _, end_worst) = distance(&undone, &exact, false);
        println!(
            "{optimizer:?}: right after the undo, {differ} of {total} weights differ (worst relative {worst:.1e}) \
             and {slot_differ} of {slot_total} slot elements (worst {slot_worst:.1e}); 20 steps later \
             {end_differ} weights differ (worst relative {end_worst:.1e})"
        );
        // The undo brings the weights back close to where they were...
        assert!(worst < 1e-3, "{optimizer:?}: the undo is far off: {worst:e}");
        // ...but not to the same bits, and training does not wash the difference out.
        assert!(differ > 0, "{optimizer:?}: the undo happened to be exact");
        assert!(end_differ > 0);
        assert_ne!(undone.fingerprint(), exact.fingerprint());
    }
}

#[test]
fn rolling_forward_is_the_run_that_never_failed() {
    // The late replica applies the held sum once: no undo, nothing to tell apart.
    let mut config = common::tiny(ModelKind::Mlp);
    config.steps = 30;
    let (summary, _) = train::train(&config, &mut |_| {}).unwrap();
    let (rolled, _) = run(config.optimizer, 30, 10, false);
    assert_eq!(rolled.fingerprint(), summary.fingerprint);
}
