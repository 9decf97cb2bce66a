//! XXH3-64 over a training state's bytes: [`kernels::hash`] on each instruction set
//! against the `xxhash-rust` crate (compiled for the baseline, as the workspace builds it),
//! side by side in one run, on a state that fits in cache and on one that does not.
//! Every row checks that the digests agree.
//!
//! `cargo bench -p steadfast-kernels --bench hash` (bench/run.sh hash runs it).

use std::time::Instant;

use kernels::Isa;
use kernels::hash::Xxh3;

fn median_seconds(mut run: impl FnMut() -> u64) -> (f64, u64) {
    let digest = run();
    let mut times: Vec<f64> = (0..11)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(run());
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], digest)
}

/// Hashes `data` in pieces of 1 MiB, as a checkpoint's writer and a state's fingerprint do.
fn streamed(mut h: impl FnMut(&[u8]), data: &[u8]) {
    for piece in data.chunks(1 << 20) {
        h(piece);
    }
}

fn main() {
    println!("| bytes | hasher | GB/s | vs the crate |");
    println!("|---|---|---|---|");
    for bytes in [256usize << 10, 64 << 20] {
        let data: Vec<u8> = (0..bytes).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3]).collect();
        let (base, want) = median_seconds(|| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            streamed(|p| h.update(p), &data);
            h.digest()
        });
        let gb = |s: f64| bytes as f64 / s / 1e9;
        println!("| {} | xxhash-rust | {:.1} | 1.00x |", bytes, gb(base));
        for isa in Isa::all_available() {
            let (s, got) = median_seconds(|| {
                let mut h = Xxh3::new(isa);
                streamed(|p| h.update(p), &data);
                h.digest()
            });
            assert_eq!(got, want, "{isa} gives another digest");
            println!(
                "| {} | kernels::hash on {isa}{} | {:.1} | {:.2}x |",
                bytes,
                if isa == Isa::Scalar { " (the crate's loop)" } else { "" },
                gb(s),
                base / s
            );
        }
    }
}
