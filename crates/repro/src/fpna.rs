//! Kernels for the floating-point non-associativity (FPNA) study: the same reductions
//! computed in a run-dependent order (as GPU atomics do), in a fixed order, and
//! reproducibly.
//!
//! **These kernels are deliberately non-deterministic** where their names say `atomic`
//! or `racy`: threads take blocks of work from a shared counter (dynamic scheduling, like
//! a GPU's block scheduler) and add their partial results into shared accumulators with
//! compare-and-swap, so the order of the additions, and therefore the rounding, depends on
//! thread timing. They exist to measure that variability; nothing in training uses them
//! unless the `fast` reduce mode is chosen explicitly. The atomics of this crate live in
//! this module only.
//!
//! The deterministic counterparts fix the order (a block tree, a sorted segment sum); the
//! reproducible ones use [`crate::sum`] and [`crate::batched`], whose results do not depend
//! on any order at all.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Elements a worker reduces locally before one atomic add (a thread block's share).
pub const BLOCK: usize = 256;

/// Adds `x` to the f32 stored (as bits) in `cell` with a compare-and-swap loop: the CPU
/// equivalent of a GPU `atomicAdd` on a float.
fn atomic_add_f32(cell: &AtomicU32, x: f32) {
    let mut current = cell.load(Ordering::Relaxed);
    loop {
        let new = (f32::from_bits(current) + x).to_bits();
        match cell.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(seen) => current = seen,
        }
    }
}

/// Runs `work(block_index)` for every block on `threads` threads, blocks handed out in
/// arrival order from a shared counter.
fn for_each_block(blocks: usize, threads: usize, work: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= blocks {
                        break;
                    }
                    work(b);
                }
            });
        }
    });
}

/// Sum with run-dependent order: each block of [`BLOCK`] elements is summed sequentially,
/// and block sums are added atomically into one accumulator in arrival order.
pub fn atomic_sum(xs: &[f32], threads: usize) -> f32 {
    let acc = AtomicU32::new(0f32.to_bits());
    let blocks = xs.len().div_ceil(BLOCK);
    for_each_block(blocks, threads, |b| {
        let part: f32 = xs[b * BLOCK..((b + 1) * BLOCK).min(xs.len())].iter().sum();
        atomic_add_f32(&acc, part);
    });
    f32::from_bits(acc.into_inner())
}

/// Deterministic sum: the same blocks, summed in parallel, combined by a fixed pairwise
/// tree. Same bits for any thread count.
pub fn tree_sum(xs: &[f32], threads: usize) -> f32 {
    let blocks = xs.len().div_ceil(BLOCK);
    let partials: Vec<AtomicU32> = (0..blocks).map(|_| AtomicU32::new(0)).collect();
    for_each_block(blocks, threads, |b| {
        let part: f32 = xs[b * BLOCK..((b + 1) * BLOCK).min(xs.len())].iter().sum();
        // Each block owns its slot: a plain store, no ordering question.
        partials[b].store(part.to_bits(), Ordering::Relaxed);
    });
    let partials: Vec<f32> = partials.into_iter().map(|p| f32::from_bits(p.into_inner())).collect();
    crate::sum::pairwise_sum(&partials)
}

/// Reproducible sum on `threads` threads: exact per-block accumulators merged in arrival
/// order; the result is the correctly rounded exact sum whatever that order.
pub fn repro_sum(xs: &[f32], threads: usize) -> f32 {
    let chunk = (xs.len().div_ceil(threads.max(1) * 4)).max(BLOCK);
    let blocks = xs.len().div_ceil(chunk);
    let total = std::sync::Mutex::new(crate::sum::ReproSum::<f32>::new());
    for_each_block(blocks, threads, |b| {
        let mut acc = crate::sum::ReproSum::new();
        acc.add_slice(&xs[b * chunk..((b + 1) * chunk).min(xs.len())]);
        total.lock().unwrap_or_else(|e| e.into_inner()).merge(&acc);
    });
    total.into_inner().unwrap_or_else(|e| e.into_inner()).finish()
}

/// `out[index[i]] += values[i]` with run-dependent order: blocks of pairs are taken in
/// arrival order and each addition is atomic.
pub fn atomic_index_add(out_len: usize, index: &[u32], values: &[f32], threads: usize) -> Vec<f32> {
    assert_eq!(index.len(), values.len(), "index and values differ in length");
    let out: Vec<AtomicU32> = (0..out_len).map(|_| AtomicU32::new(0)).collect();
    let blocks = index.len().div_ceil(BLOCK);
    for_each_block(blocks, threads, |b| {
        let range = b * BLOCK..((b + 1) * BLOCK).min(index.len());
        for (&i, &v) in index[range.clone()].iter().zip(&values[range]) {
            atomic_add_f32(&out[i as usize], v);
        }
    });
    out.into_iter().map(|c| f32::from_bits(c.into_inner())).collect()
}

/// Deterministic `out[index[i]] += values[i]`: the pairs are grouped by target with a
/// stable counting sort (keeping input order within a target), then each target's
/// segment is summed in that order, segments spread over threads.
pub fn sorted_index_add(out_len: usize, index: &[u32], values: &[f32], threads: usize) -> Vec<f32> {
    assert_eq!(index.len(), values.len(), "index and values differ in length");
    let mut starts = vec![0usize; out_len + 1];
    for &i in index {
        starts[i as usize + 1] += 1;
    }
    for t in 0..out_len {
        starts[t + 1] += starts[t];
    }
    let mut fill = starts.clone();
    let mut sorted = vec![0f32; values.len()];
    for (&i, &v) in index.iter().zip(values) {
        sorted[fill[i as usize]] = v;
        fill[i as usize] += 1;
    }
    let out: Vec<AtomicU32> = (0..out_len).map(|_| AtomicU32::new(0)).collect();
    let blocks = out_len.div_ceil(BLOCK);
    for_each_block(blocks, threads, |b| {
        for t in b * BLOCK..((b + 1) * BLOCK).min(out_len) {
            let s: f32 = sorted[starts[t]..starts[t + 1]].iter().sum();
            out[t].store(s.to_bits(), Ordering::Relaxed);
        }
    });
    out.into_iter().map(|c| f32::from_bits(c.into_inner())).collect()
}

/// Element-wise sum of equal-length vectors with run-dependent order: one thread per
/// part, each adding its vector into a shared buffer with atomic adds, racing the others.
/// This is the `fast` (atomic-order) gradient accumulation.
pub fn racy_sum_parts(parts: &[&[f32]]) -> Vec<f32> {
    let n = parts.first().map_or(0, |p| p.len());
    let out: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|s| {
        for part in parts {
            assert_eq!(part.len(), n, "parts differ in length");
            let out = &out;
            s.spawn(move || {
                for (cell, &x) in out.iter().zip(part.iter()) {
                    atomic_add_f32(cell, x);
                }
            });
        }
    });
    out.into_iter().map(|c| f32::from_bits(c.into_inner())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_agree_on_exact_data() {
        // Small integers: every order gives the exact result.
        let xs: Vec<f32> = (0..10_000).map(|i| (i % 7) as f32).collect();
        let exact: f32 = xs.iter().map(|&x| x as f64).sum::<f64>() as f32;
        for threads in [1, 2, 4] {
            assert_eq!(atomic_sum(&xs, threads), exact);
            assert_eq!(tree_sum(&xs, threads), exact);
            assert_eq!(repro_sum(&xs, threads), exact);
        }
        let index: Vec<u32> = (0..10_000u32).map(|i| i.wrapping_mul(2_654_435_761) % 97).collect();
        let a = atomic_index_add(97, &index, &xs, 3);
        let d = sorted_index_add(97, &index, &xs, 3);
        assert_eq!(a, d);
        let parts: Vec<Vec<f32>> = (0..5).map(|k| (0..100).map(|i| (i * k) as f32).collect()).collect();
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        assert_eq!(racy_sum_parts(&refs), crate::batched::sum_parts(&refs, 16));
    }

    #[test]
    fn deterministic_kernels_ignore_the_thread_count() {
        let xs: Vec<f32> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) as f32).sin() * 1e3).collect();
        let index: Vec<u32> = (0..100_000u32).map(|i| i.wrapping_mul(40_503) % 1000).collect();
        let (t1, r1, s1) = (tree_sum(&xs, 1), repro_sum(&xs, 1), sorted_index_add(1000, &index, &xs, 1));
        for threads in [2, 3, 8] {
            assert_eq!(tree_sum(&xs, threads).to_bits(), t1.to_bits());
            assert_eq!(repro_sum(&xs, threads).to_bits(), r1.to_bits());
            assert_eq!(sorted_index_add(1000, &index, &xs, threads), s1);
        }
    }
}
