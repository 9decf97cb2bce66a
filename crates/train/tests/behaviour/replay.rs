//! Recovery by replay: a stage's checkpoint, replayed on the tensors its neighbours
//! logged, is the state the stage reached, bit for bit, whether one helper replays it or
//! several share the micro-batches; a damaged log is an error, never other bits.

use crate::common;

use std::path::Path;
use std::time::Duration;

use ckpt::log::{Edge as LogKey, LogWriter};
use train::driver::{Driver, Runner, Stop};
use train::model::ModelKind;
use train::optim::Optimizer;
use train::pipeline::StageLink;
use train::replay::{LoggedInputs, Replay, Task, replay};
use train::schedule::{self, Boundary};
use train::step::{At, GradBuffer, NoHooks, TrainState};
use train::trainer::Prepared;
use train::{ReduceMode, TrainConfig, TrainError};

/// A stage's runner that logs what it sends, as the ranks of a pipeline job do.
struct Logged<T> {
    link: StageLink<T>,
    logs: Vec<(usize, LogWriter)>,
}

impl<T: comm::transport::Transport> Runner for Logged<T> {
    fn send(&mut self, at: At, peer: usize, micro: usize, tensor: Boundary, data: &[f32]) -> Result<(), TrainError> {
        self.link.send(at, peer, micro, tensor, data)?;
        for (to, log) in &mut self.logs {
            if *to == peer {
                log.record(at.step, micro as u32, data);
            }
        }
        Ok(())
    }

    fn recv(&mut self, at: At, peer: usize, micro: usize, t: Boundary, data: &mut Vec<f32>) -> Result<(), TrainError> {
        self.link.recv(at, peer, micro, t, data)
    }

    fn updated(&mut self, at: At, _: &TrainState, _: &GradBuffer) -> Result<(), TrainError> {
        for (_, log) in &mut self.logs {
            log.end_step(at.step);
        }
        Ok(())
    }
}

/// The state of `stage` before the first step.
fn fresh(config: &TrainConfig, prepared: &Prepared, stages: usize, stage: usize) -> (TrainState, train::model::Stage) {
    let (whole, engine) = prepared.start(config);
    let cut = engine.stage(stages, stage).unwrap();
    let params = cut.params(&whole.params);
    (TrainState::new(params.clone(), Optimizer::new(config.optimizer, config.optim, &params)), cut)
}

/// Trains `stages` stages of one pipeline to `config.steps`, logging every boundary under
/// `logs`; returns each stage's state at step `at` (its checkpoint) and at the end.
fn train_logged(config: &TrainConfig, stages: usize, at: u64, logs: &Path) -> Vec<(TrainState, TrainState)> {
    let prepared = Prepared::load(config).unwrap();
    let network = comm::transport::mem_network(stages);
    std::thread::scope(|scope| {
        let handles: Vec<_> = network
            .into_iter()
            .enumerate()
            .map(|(s, endpoint)| {
                let prepared = &prepared;
                scope.spawn(move || {
                    let (mut state, cut) = fresh(config, prepared, stages, s);
                    let mut engine = prepared.start(config).1.for_stage(cut);
                    let ops = schedule::one_f_one_b(stages, s, engine.sampler().micro_batches());
                    let mut driver = Driver::new(&engine, s);
                    let peers = [s.checked_sub(1), (s + 1 < stages).then_some(s + 1)];
                    let logs = peers
                        .into_iter()
                        .flatten()
                        .map(|to| {
                            let key = LogKey { replica: 0, from: s as u32, to: to as u32 };
                            (to, LogWriter::open(logs, key, 1 << 20).unwrap())
                        })
                        .collect();
                    let mut runner = Logged { link: StageLink::new(endpoint, Duration::from_secs(30)), logs };
                    let mut checkpoint = None;
                    while state.step < config.steps {
                        if state.step == at {
                            checkpoint = Some(state.clone());
                        }
                        let stop = driver.run(&ops, 0, &mut engine, &mut state, &mut NoHooks, &mut runner).unwrap();
                        assert_eq!(stop, Stop::Done);
                    }
                    for (_, log) in runner.logs {
                        log.finish().unwrap();
                    }
                    (checkpoint.unwrap(), state)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Replays `stage` from `checkpoint` to `to` with `helpers` helpers (threads, summing
/// over an in-process network); returns every helper's final state.
fn replayed(
    config: &TrainConfig,
    stages: usize,
    stage: usize,
    checkpoint: &TrainState,
    to: u64,
    (logs, helpers): (&Path, usize),
) -> Vec<Result<TrainState, TrainError>> {
    let prepared = Prepared::load(config).unwrap();
    let network = comm::transport::mem_network(helpers);
    std::thread::scope(|scope| {
        let handles: Vec<_> = network
            .into_iter()
            .enumerate()
            .map(|(k, endpoint)| {
                let prepared = &prepared;
                scope.spawn(move || {
                    let (_, cut) = fresh(config, prepared, stages, stage);
                    let mut engine = prepared.start(config).1.for_stage(cut);
                    let mut state = checkpoint.clone();
                    let mut inputs = LoggedInputs::new(logs, stage, 1);
                    let mut get = |step, micro, tensor| inputs.get(step, micro, tensor);
                    let mut runner = Replay {
                        inputs: &mut get,
                        helpers: Some((&endpoint, Duration::from_secs(30))),
                        live: None,
                        reducer: Default::default(),
                    };
                    let task = Task { stages, stage, helper: k, helpers };
                    replay(&mut engine, &mut state, task, to, &mut runner).map(|()| state)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bits(s: &TrainState) -> Vec<u32> {
    s.tensors().flat_map(|t| t.data.iter().map(|v| v.to_bits())).collect()
}

fn every_stage_replays_to_the_bits_it_reached(config: &TrainConfig, stages: usize, helpers: &[usize]) {
    let logs = tempfile::tempdir().unwrap();
    let at = 2;
    let states = train_logged(config, stages, at, logs.path());
    for (stage, (checkpoint, reached)) in states.iter().enumerate() {
        assert_eq!(checkpoint.step, at);
        for &r in helpers {
            for (k, got) in
                replayed(config, stages, stage, checkpoint, config.steps, (logs.path(), r)).into_iter().enumerate()
            {
                let got = got.unwrap();
                assert_eq!(got.step, reached.step);
                assert!(bits(&got) == bits(reached), "stage {stage}, helper {k} of {r}: other bits");
                assert_eq!(got.optimizer.updates(), reached.optimizer.updates());
            }
        }
    }
}

fn config(model: ModelKind) -> TrainConfig {
    let mut c = common::tiny(model);
    c.reduce = ReduceMode::Reproducible;
    c.steps = 5;
    c
}

#[test]
fn every_stage_of_the_mlp_replays_to_its_bits_with_one_two_or_three_helpers() {
    every_stage_replays_to_the_bits_it_reached(&config(ModelKind::Mlp), 3, &[1, 2, 3]);
}

#[test]
fn the_gpt_s_stages_replay_to_their_bits_in_parallel() {
    let mut c = config(ModelKind::Gpt);
    (c.steps, c.batch, c.micro_batch) = (4, 8, 2);
    every_stage_replays_to_the_bits_it_reached(&c, 3, &[1, 3]);
}

#[test]
fn a_damaged_or_missing_log_stops_the_replay_with_its_name() {
    let c = config(ModelKind::Mlp);
    let logs = tempfile::tempdir().unwrap();
    let states = train_logged(&c, 2, 1, logs.path());
    // Stage 1's inputs: the activations stage 0 sent.
    let dir = LogKey { replica: 0, from: 0, to: 1 }.dir(logs.path());
    let file = ckpt::log::step_path(&dir, 3);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[100] ^= 0x04;
    std::fs::write(&file, &bytes).unwrap();
    let err = replayed(&c, 2, 1, &states[1].0, c.steps, (logs.path(), 1)).remove(0).unwrap_err();
    assert!(matches!(err, TrainError::Log(ckpt::log::LogError::Corrupt { .. })), "{err}");
    assert!(err.to_string().contains("step-00000003.log"), "{err}");
    std::fs::remove_file(&file).unwrap();
    let err = replayed(&c, 2, 1, &states[1].0, c.steps, (logs.path(), 2)).remove(0).unwrap_err();
    assert!(err.to_string().contains("no boundary log of step 3"), "{err}");
}

#[test]
fn a_parallel_replay_without_a_reproducible_sum_is_refused() {
    let mut c = config(ModelKind::Mlp);
    c.reduce = ReduceMode::Deterministic;
    let logs = tempfile::tempdir().unwrap();
    let states = train_logged(&c, 2, 1, logs.path());
    let err = replayed(&c, 2, 0, &states[0].0, c.steps, (logs.path(), 2)).remove(0).unwrap_err();
    assert!(err.to_string().contains("reproducible reduce mode"), "{err}");
    // One helper sums in the stage's own order: the same bits.
    let alone = replayed(&c, 2, 0, &states[0].0, c.steps, (logs.path(), 1)).remove(0).unwrap();
    assert!(bits(&alone) == bits(&states[0].1));
}
