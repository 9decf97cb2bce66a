//! The training step's all-reduce in a job of one process per rank (`steadfast bench
//! collective`, started by `steadfast launch`, `mpirun` or `srun`), timed on whichever
//! engine the job runs, the modes taking turns repetition by repetition.
//! `bench/torch_collective.py` times PyTorch's on the same inputs.

use serde_json::json;

use crate::LabError;

/// What to time.
#[derive(Clone, Debug)]
pub struct CollectiveBench {
    /// Message sizes in MB (10^6 bytes of f32).
    pub mb: Vec<u64>,
    /// Summation modes.
    pub modes: Vec<comm::ReduceMode>,
    /// Timed repetitions per size and mode (the median is reported), after one untimed
    /// warm-up.
    pub repeats: usize,
}

/// Rank `rank`'s input to the all-reduce of `n` elements: values of many magnitudes and
/// both signs, so that a float sum depends on its order. `bench/torch_collective.py`
/// builds the same bits.
pub fn collective_input(rank: usize, n: usize) -> Vec<f32> {
    let stride = (2 * rank as u64 + 1) * 7919;
    (0..n as u64).map(|i| ((i * stride) % 2001) as f32 - 1000.0).map(|x| x * 1.1e-3).collect()
}

/// Times every size and mode on `job` (named `engine` in the rows); rank 0 hands `row`
/// one row per size and mode, with a fingerprint of the sum. Ends the job.
pub fn collective(
    job: train::job::Job,
    engine: &str,
    b: &CollectiveBench,
    row: &mut dyn FnMut(serde_json::Value),
) -> Result<(), LabError> {
    let (rank, world) = job.place();
    let mut reducer = comm::collective::Reducer::default();
    for &mb in &b.mb {
        let n = usize::try_from(mb * 1_000_000 / 4).map_err(|_| LabError::Bench("message too large".into()))?;
        let input = collective_input(rank, n);
        let mut out = vec![0.0f32; n];
        // The modes take turns, one repetition each, so that a drift of the machine's speed
        // (another process, the clock) falls on every mode alike.
        let mut times = vec![Vec::with_capacity(b.repeats); b.modes.len()];
        let mut prints = vec![String::new(); b.modes.len()];
        for i in 0..=b.repeats.max(1) {
            for (m, &mode) in b.modes.iter().enumerate() {
                job.barrier()?;
                let t = std::time::Instant::now();
                job.sum_parts(&mut reducer, &[&input[..]], &mut out, mode)?;
                if i > 0 {
                    times[m].push(t.elapsed().as_secs_f64());
                }
                if i == b.repeats.max(1) && rank == 0 {
                    prints[m] = repro::fingerprint::hex(repro::fingerprint::fingerprint([("sum", &out[..])]));
                }
            }
        }
        for ((&mode, times), print) in b.modes.iter().zip(&mut times).zip(prints) {
            times.sort_by(f64::total_cmp);
            let seconds = times[times.len() / 2];
            if rank == 0 {
                // Bus bandwidth as NCCL defines it: 2(W-1)/W of the message per second.
                let bus = 2.0 * (world as f64 - 1.0) / world as f64 * mb as f64 / seconds;
                row(json!({
                    "engine": engine, "world": world, "mb": mb, "mode": mode.to_string(),
                    "seconds": seconds, "bus_mb_per_s": bus, "sum_fingerprint": print,
                }));
            }
        }
    }
    job.barrier()?;
    job.finish();
    Ok(())
}
