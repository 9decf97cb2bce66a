//! The matrix product on the shapes of Steadfast's models: each path of [`kernels::gemm`]
//! against the `gemm` crate that the framework's CPU backend calls (whose bits depend on
//! the CPU), side by side in one run, on 1 thread and on all.
//!
//! `cargo bench -p steadfast-kernels --bench gemm` (bench/run.sh kernels runs it).

use std::time::Instant;

use kernels::Isa;
use kernels::gemm::{MatRef, matmul};

/// `(what, m, k, n)`: forward and backward products of the models' layers at batch 128.
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("mlp fc1 forward", 128, 784, 256),
    ("mlp fc1 weight grad", 256, 128, 784),
    ("mlp fc1 input grad", 128, 256, 784),
    ("mlp fc2 forward", 128, 256, 128),
    ("cnn conv2 (im2col)", 16, 150, 12800),
    ("gpt qkv forward", 2048, 128, 384),
    ("gpt mlp forward", 2048, 128, 512),
    ("gpt mlp weight grad", 512, 2048, 128),
    ("square 512", 512, 512, 512),
];

fn median_seconds(mut run: impl FnMut()) -> f64 {
    run();
    let mut times: Vec<f64> = (0..11)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn peer(threads: usize, m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    let parallelism = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the pointers and strides describe row-major m x k, k x n and m x n matrices
    // that lie within `a`, `b` and `c`, and `c` is not aliased.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("| shape | m x k x n | threads | gemm crate GFLOP/s | {} |", {
        let names: Vec<String> = Isa::all_available().iter().map(|i| format!("{i} GFLOP/s | {i} / gemm")).collect();
        names.join(" | ")
    });
    for &(what, m, k, n) in SHAPES {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 2001) as f32 * 1e-3 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 3001) as f32 * 1e-3 - 1.5).collect();
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64 / 1e9;
        for threads in [1, cores] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
            let base = median_seconds(|| peer(threads, m, k, n, &a, &b, &mut c));
            let mut row = format!("| {what} | {m} x {k} x {n} | {threads} | {:.1} |", flops / base);
            for isa in Isa::all_available() {
                let t = median_seconds(|| {
                    pool.install(|| matmul(isa, MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n), &mut c))
                });
                row.push_str(&format!(" {:.1} | {:.2}x |", flops / t, base / t));
            }
            println!("{row}");
            if cores == 1 {
                break;
            }
        }
    }
}
