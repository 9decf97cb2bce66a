//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use train::TrainConfig;
use train::data::DataKind;
use train::model::ModelKind;

/// True when the Debian data set is installed. When `STEADFAST_REQUIRE_DATA` is set (CI
/// sets it), a missing data set fails the test instead of skipping it.
pub fn have_data(dir: &str) -> bool {
    let present = Path::new(dir).is_dir();
    if !present {
        assert!(
            std::env::var_os("STEADFAST_REQUIRE_DATA").is_none(),
            "{dir} is missing but STEADFAST_REQUIRE_DATA is set"
        );
        // Written past the test harness's capture, so `cargo test` shows it.
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("skipped: {dir} is not installed\n"));
    }
    present
}

/// The operations of rank `rank` of `world`'s data-parallel step up to its reduction:
/// the load and the micro-batches it computes.
pub fn compute_ops(engine: &train::step::Engine<'_>, rank: usize, world: usize) -> Vec<train::schedule::Op> {
    let ops = train::schedule::data_parallel(engine.sampler().micro_batches(), rank, world);
    ops.into_iter().take_while(|o| *o != train::schedule::Op::Reduce).collect()
}

/// A short run on synthetic data with several micro-batches per step.
pub fn tiny(model: ModelKind) -> TrainConfig {
    let mut c = TrainConfig::defaults(model);
    c.data = DataKind::Synthetic;
    c.steps = 4;
    c.batch = 32;
    c.micro_batch = 8;
    c.eval_every = 0;
    c
}

/// Runs training on a dedicated rayon pool of `threads` threads and returns the
/// fingerprint.
pub fn fingerprint_with_threads(config: &TrainConfig, threads: usize) -> u64 {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| train::train(config, &mut |_| {}).unwrap().0.fingerprint)
}
