//! Sum throughput, side by side in one process: prints one JSON line per (kernel, size,
//! threads) with elements per second (median over repetitions of at least ~50 ms each).
//!
//! Kernels: naive sequential f32, pairwise f32, the reproducible sum (f32, 1 and N
//! threads), rayon's parallel f32 sum (not reproducible), `accurate`'s OnlineExactSum
//! (f32, exact), `xsum` (f64, exact), and the reproducible sum on the same f64 data; then
//! the scatter-add in its atomic and sorted (deterministic) versions.

use std::hint::black_box;
use std::time::Instant;

use accurate::sum::OnlineExactSum;
use accurate::traits::*;
use rayon::prelude::*;
use serde_json::json;
use xsum::{Xsum, XsumAuto};

fn rate(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    // Repeat until ~50 ms per sample, 5 samples, median.
    let t = Instant::now();
    black_box(f());
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let inner = ((0.05 / once).ceil() as usize).clamp(1, 100_000);
    let mut samples: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..inner {
                black_box(f());
            }
            (n * inner) as f64 / t.elapsed().as_secs_f64()
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[2]
}

fn main() {
    let threads: usize = std::env::var("THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let max_exp: u32 = std::env::var("MAX_EXP").ok().and_then(|t| t.parse().ok()).unwrap_or(8);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    for e in 3..=max_exp {
        let n = 10usize.pow(e);
        let mut s = repro::rng::Stream::new(7, e as u64);
        let xs: Vec<f32> = (0..n).map(|_| s.uniform_symmetric(1.0) * 2f32.powi(s.below(40) as i32 - 20)).collect();
        let xd: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
        let emit = |kernel: &str, t: usize, r: f64| {
            println!("{}", json!({"kernel": kernel, "n": n, "threads": t, "elements_per_s": r}));
        };
        emit("naive_f32", 1, rate(n, || f64::from(xs.iter().fold(0.0f32, |a, &x| a + x))));
        emit("pairwise_f32", 1, rate(n, || f64::from(repro::sum::pairwise_sum(&xs))));
        emit("repro_f32", 1, rate(n, || f64::from(repro::sum::sum(&xs))));
        emit("repro_f32", threads, pool.install(|| rate(n, || f64::from(repro::sum::par_sum(&xs)))));
        emit("rayon_f32", threads, pool.install(|| rate(n, || f64::from(xs.par_iter().sum::<f32>()))));
        emit("accurate_exact_f32", 1, rate(n, || f64::from(xs.iter().copied().sum_with_accumulator::<OnlineExactSum<f32>>())));
        emit("xsum_f64", 1, rate(n, || {
            let mut x = XsumAuto::new();
            x.add_list(&xd);
            x.sum()
        }));
        emit("repro_f64", 1, rate(n, || repro::sum::sum(&xd)));
        if e >= 4 && e <= 7 {
            let targets = (n / 32).max(1);
            let index: Vec<u32> = (0..n).map(|_| s.below(targets as u64) as u32).collect();
            emit("index_add_atomic", threads, rate(n, || f64::from(repro::fpna::atomic_index_add(targets, &index, &xs, threads)[0])));
            emit("index_add_sorted", threads, rate(n, || f64::from(repro::fpna::sorted_index_add(targets, &index, &xs, threads)[0])));
        }
    }
}
