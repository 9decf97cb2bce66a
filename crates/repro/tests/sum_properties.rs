//! The reproducible sum: invariance under order, partition, merge order and thread count
//! (property tests), and accuracy against an exact big-integer reference on hard cases.

use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive, Zero};
use proptest::prelude::*;
use repro::sum::{ReproSum, par_sum, sum};

/// The exact value of a finite float as (integer, power of two).
fn exact_f32(x: f32) -> BigInt {
    // In units of 2^-149.
    let bits = x.to_bits();
    let field = (bits >> 23) & 0xFF;
    let mant = i64::from((bits & 0x7F_FFFF) | (u32::from(field != 0) << 23));
    let v = BigInt::from(mant) << (field.max(1) - 1);
    if bits >> 31 == 1 { -v } else { v }
}

/// Rounds an exact multiple of 2^-149 to the nearest f32, ties to even, by the textbook
/// method (independent of the crate's limb arithmetic).
fn round_f32(total: &BigInt) -> f32 {
    if total.is_zero() {
        return 0.0;
    }
    let neg = total.is_negative();
    let m = total.abs();
    let top = m.bits() - 1; // index of the highest set bit
    let value = if top < 24 {
        f32::from_bits(m.to_u32().unwrap())
    } else {
        let shift = top - 23;
        let mut q: BigInt = &m >> shift;
        let rem: BigInt = &m - (&q << shift);
        let half = BigInt::from(1) << (shift - 1);
        if rem > half || (rem == half && q.bit(0)) {
            q += 1;
        }
        let (mut q, mut field) = (q.to_u64().unwrap(), shift + 1);
        if q == 1 << 24 {
            q >>= 1;
            field += 1;
        }
        if field >= 255 { f32::INFINITY } else { f32::from_bits(((field as u32) << 23) | (q as u32 & 0x7F_FFFF)) }
    };
    if neg { -value } else { value }
}

fn reference(xs: &[f32]) -> f32 {
    round_f32(&xs.iter().map(|&x| exact_f32(x)).sum())
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
}

/// Finite floats of every magnitude, including subnormals and zeros of both signs.
fn any_finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits).prop_filter("finite", |x| x.is_finite()),
        (-1000.0f32..1000.0),
        Just(0.0f32),
        Just(-0.0f32),
        (0u32..(1 << 23)).prop_map(f32::from_bits),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn equals_the_correctly_rounded_exact_sum(xs in prop::collection::vec(any_finite(), 0..200)) {
        let r = reference(&xs);
        let s = sum(&xs);
        // The sign of an exact zero follows IEEE (only all -0.0 gives -0.0); the reference
        // returns +0.0, so compare zeros by value.
        prop_assert!(same(s, r) || (s == 0.0 && r == 0.0), "sum {s:e} vs exact {r:e}");
    }

    #[test]
    fn order_partition_and_merge_order_do_not_matter(
        xs in prop::collection::vec(any_finite(), 1..300),
        seed in any::<u64>(),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let base = sum(&xs);
        // A permutation.
        let mut ys = xs.clone();
        let mut s = seed | 1;
        for i in (1..ys.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            ys.swap(i, (s % (i as u64 + 1)) as usize);
        }
        prop_assert!(same(sum(&ys), base));
        // Any partition into chunks, merged in reverse order.
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (ys.len() + 1)).collect();
        points.push(0);
        points.push(ys.len());
        points.sort_unstable();
        let mut parts: Vec<ReproSum<f32>> = points.windows(2).map(|w| {
            let mut a = ReproSum::new();
            a.add_slice(&ys[w[0]..w[1]]);
            a
        }).collect();
        parts.reverse();
        let mut total = ReproSum::new();
        for p in &parts {
            total.merge(p);
        }
        prop_assert!(same(total.finish(), base));
    }

    #[test]
    fn f64_sums_are_order_invariant(xs in prop::collection::vec(any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |x| x.is_finite()), 1..100)) {
        let mut ys = xs.clone();
        ys.reverse();
        prop_assert_eq!(sum(&xs).to_bits(), sum(&ys).to_bits());
    }
}

#[test]
fn hard_cases_are_exact() {
    // Huge cancellation: the small terms survive.
    let xs = [1e30f32, 1.0, -1e30, 1e-30, 3.0, -1e-30];
    assert_eq!(sum(&xs), 4.0);
    // Magnitudes spanning 2^-100 .. 2^100.
    let mut xs: Vec<f32> = (-100..=100).map(|e| 2f32.powi(e)).collect();
    xs.extend((-100..=100).map(|e| -(2f32.powi(e))));
    xs.push(2f32.powi(-100));
    assert_eq!(sum(&xs), 2f32.powi(-100));
    // Subnormals add exactly.
    let tiny = f32::from_bits(1);
    assert_eq!(sum(&[tiny; 1000]), f32::from_bits(1000));
    // Signed zeros.
    assert!(same(sum(&[-0.0f32, -0.0]), -0.0));
    assert!(same(sum(&[-0.0f32, 0.0]), 0.0));
    assert!(same(sum::<f32>(&[]), 0.0));
    assert!(same(sum(&[1.0f32, -1.0]), 0.0));
    // Overflow of the exact sum rounds to infinity; specials follow the documented rule.
    assert_eq!(sum(&[f32::MAX, f32::MAX]), f32::INFINITY);
    assert_eq!(sum(&[f32::MAX, f32::MAX, -f32::MAX]), f32::MAX);
    assert!(sum(&[1.0f32, f32::NAN]).is_nan());
    assert!(sum(&[f32::INFINITY, f32::NEG_INFINITY]).is_nan());
    assert_eq!(sum(&[f32::NEG_INFINITY, 1e38]), f32::NEG_INFINITY);
    // f64: the classic case that defeats naive and Kahan summation.
    assert_eq!(sum(&[1.0f64, 1e100, 1.0, -1e100]), 2.0);
    assert_eq!(sum(&[0.1f64; 10]), 1.0);
}

#[test]
fn thread_count_does_not_matter() {
    let xs: Vec<f32> =
        (0..2_000_003u32).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) as f32 - 1.6e7) * 1e-3).collect();
    let reference = sum(&xs);
    for threads in [1, 2, 3, 8] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert!(same(pool.install(|| par_sum(&xs)), reference), "{threads} threads");
    }
    assert_eq!(reference, round_f32(&xs.iter().map(|&x| exact_f32(x)).sum()));
}

#[test]
fn the_accumulator_survives_carry_passes() {
    // Many terms of the largest significand in one bucket, with merges in between.
    let x = f32::from_bits(0x4B7F_FFFF); // 2^24 - 1
    let mut a = ReproSum::new();
    for _ in 0..64 {
        a.add_slice(&vec![x; 10_000]);
        let snapshot = a.clone();
        a.merge(&ReproSum::new());
        assert_eq!(a.finish(), snapshot.finish());
    }
    let exact = BigInt::from(16_777_215u64 * 640_000) << 149;
    assert_eq!(a.finish(), round_f32(&exact));
    assert_eq!(ToPrimitive::to_f64(&BigInt::from(a.count())), Some(640_000.0));
}
