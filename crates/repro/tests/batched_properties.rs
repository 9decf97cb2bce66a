//! The batched (element-wise) reproducible sum: any grouping of the parts into workers
//! and any combination order give the same bits, and the error stays within the bound.

use proptest::prelude::*;
use repro::batched::{
    DEFAULT_HEADROOM, EXP_BLOCK, NARROW_HEADROOM, Scratch, add_fixed, blocks_of, decode, encode, finish, max_exponents,
    sum_parts, sum_parts_as,
};

/// Sums `parts` the way W workers would: each reduces its own parts, then the workers'
/// exponents are max-combined and their fixed-point sums added in `order`.
fn as_workers(parts: &[Vec<f32>], owner: &[usize], workers: usize, order: &[usize]) -> Vec<f32> {
    let n = parts[0].len();
    let mut local_exps = vec![vec![0u8; blocks_of(n)]; workers];
    for (p, &w) in parts.iter().zip(owner) {
        max_exponents(&mut local_exps[w], p, 0);
    }
    let mut exps = vec![0u8; blocks_of(n)];
    for &w in order {
        for (e, &l) in exps.iter_mut().zip(&local_exps[w]) {
            *e = (*e).max(l);
        }
    }
    let mut local_acc = vec![vec![0i64; n]; workers];
    for (p, &w) in parts.iter().zip(owner) {
        add_fixed(&mut local_acc[w], p, &exps, 0, DEFAULT_HEADROOM);
    }
    let mut acc = vec![0i64; n];
    for &w in order {
        // Through the wire format, as a real all-reduce would send it.
        let (part, e, h) = decode(&encode(&local_acc[w], &exps, DEFAULT_HEADROOM)).unwrap();
        assert_eq!((e.as_slice(), h), (exps.as_slice(), DEFAULT_HEADROOM));
        for (a, b) in acc.iter_mut().zip(part) {
            *a += b;
        }
    }
    finish(&acc, &exps, DEFAULT_HEADROOM)
}

/// A seeded assignment of `parts` parts to `workers` workers, and an order of the workers.
fn grouping(parts: usize, workers: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let owner = (0..parts).map(|_| (next() % workers as u64) as usize).collect();
    let mut order: Vec<usize> = (0..workers).collect();
    for i in (1..workers).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    (owner, order)
}

/// The bit patterns of `v`, to compare sums bit for bit.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks each element of `sum` against the exact sum of `parts` within
/// `per_term * n * M + half an ulp of the result` (plus the f64 reference's own
/// rounding), `M` the largest magnitude in the element's block of every part.
fn within_bound(parts: &[Vec<f32>], sum: &[f32], per_term: f64) -> Result<(), TestCaseError> {
    for i in 0..sum.len() {
        let exact: f64 = parts.iter().map(|p| f64::from(p[i])).sum();
        let block = (i / EXP_BLOCK) * EXP_BLOCK..((i / EXP_BLOCK + 1) * EXP_BLOCK).min(sum.len());
        let max = parts.iter().flat_map(|p| &p[block.clone()]).map(|x| x.abs()).fold(0.0f32, f32::max) as f64;
        let bound =
            parts.len() as f64 * per_term * max + f64::from(sum[i]).abs() * 2f64.powi(-24) + max * 2f64.powi(-45); // the f64 reference itself rounds
        prop_assert!((f64::from(sum[i]) - exact).abs() <= bound, "element {i}: {} vs {exact}", sum[i]);
    }
    Ok(())
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![(-1.0f32..1.0), (-1e6f32..1e6), (-1e-6f32..1e-6), Just(0.0f32)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_worker_count_grouping_and_order_gives_the_same_bits(
        parts in (1usize..20, 1usize..200).prop_flat_map(|(p, n)| prop::collection::vec(prop::collection::vec(value(), n), p)),
        workers in 1usize..6,
        seed in any::<u64>(),
    ) {
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        let single = sum_parts(&refs, DEFAULT_HEADROOM);
        let (owner, order) = grouping(parts.len(), workers, seed);
        let grouped = as_workers(&parts, &owner, workers, &order);
        prop_assert_eq!(bits(&single), bits(&grouped));
        // Error bound: n * 2^(h - 62) * max|term| + half an ulp of the result.
        within_bound(&parts, &single, 2f64.powi(DEFAULT_HEADROOM as i32 - 62))?;
    }
}

#[test]
fn far_more_accurate_than_a_naive_f32_sum_on_cancellation() {
    // Per element: +big, many small, -big. A naive f32 sum loses the small terms.
    let n = 1000;
    let mut parts = vec![vec![1e7f32; 4]];
    parts.extend((0..n).map(|_| vec![0.1f32; 4]));
    parts.push(vec![-1e7f32; 4]);
    let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
    let r = sum_parts(&refs, DEFAULT_HEADROOM);
    let naive: f32 = parts.iter().map(|p| p[0]).sum();
    let exact = 0.1f32 as f64 * n as f64;
    assert!((f64::from(r[0]) - exact).abs() < 1e-3, "{}", r[0]);
    assert!((f64::from(naive) - exact).abs() > 1.0, "naive {naive}");
}

/// The 32-bit sum as W workers would run it: local accumulators added in `order`.
fn as_workers_narrow(parts: &[Vec<f32>], owner: &[usize], workers: usize, order: &[usize]) -> Vec<f32> {
    let n = parts[0].len();
    let mut exps = vec![0u8; blocks_of(n)];
    for &w in order {
        for (p, _) in parts.iter().zip(owner).filter(|(_, o)| **o == w) {
            max_exponents(&mut exps, p, 0);
        }
    }
    let mut local = vec![vec![0i32; n]; workers];
    for (p, &w) in parts.iter().zip(owner) {
        add_fixed(&mut local[w], p, &exps, 0, NARROW_HEADROOM);
    }
    let mut acc = vec![0i32; n];
    for &w in order {
        for (a, b) in acc.iter_mut().zip(&local[w]) {
            *a += b;
        }
    }
    finish(&acc, &exps, NARROW_HEADROOM)
}

fn narrow(parts: &[&[f32]]) -> Vec<f32> {
    let mut out = vec![0.0; parts[0].len()];
    sum_parts_as::<i32, _>(parts, NARROW_HEADROOM, &mut out, &mut Scratch::default());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_32_bit_sum_is_reproducible_and_as_accurate_as_a_float_sum(
        parts in (1usize..129, 1usize..150).prop_flat_map(|(p, n)| prop::collection::vec(prop::collection::vec(value(), n), p)),
        workers in 1usize..6,
        seed in any::<u64>(),
    ) {
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        let single = narrow(&refs);
        let (owner, order) = grouping(parts.len(), workers, seed);
        let grouped = as_workers_narrow(&parts, &owner, workers, &order);
        prop_assert_eq!(bits(&single), bits(&grouped));
        // Error bound (see `Fixed`): n * 2^-24 * max|term| + half an ulp of the result, the
        // bound of a naive f32 sum of n terms.
        within_bound(&parts, &single, 2f64.powi(-24))?;
    }
}

#[test]
fn the_32_bit_sum_keeps_special_values_and_refuses_too_many_parts() {
    // Each value at the start of a block of its own.
    let spaced =
        |v: &[f32]| -> Vec<f32> { v.iter().flat_map(|&x| std::iter::once(x).chain([0.0; EXP_BLOCK - 1])).collect() };
    let a = spaced(&[1.0f32, f32::INFINITY, f32::NAN, f32::NEG_INFINITY, -2.0]);
    let b = spaced(&[2.0f32, 1.0, 1.0, f32::INFINITY, 2.0]);
    let s = narrow(&[&a, &b]);
    let at = |i: usize| s[i * EXP_BLOCK];
    assert_eq!(at(0), 3.0);
    assert_eq!(at(1), f32::INFINITY);
    assert!(at(2).is_nan() && at(3).is_nan());
    assert_eq!(at(4).to_bits(), 0.0f32.to_bits());
    // 128 copies of the largest finite value still fit; 129 parts are refused.
    let big = vec![vec![f32::MAX; 3]; 128];
    let refs: Vec<&[f32]> = big.iter().map(|p| p.as_slice()).collect();
    assert_eq!(narrow(&refs), vec![f32::INFINITY; 3]);
    let one = vec![vec![1.5f32; 3]; 128];
    let refs: Vec<&[f32]> = one.iter().map(|p| p.as_slice()).collect();
    assert_eq!(narrow(&refs), vec![192.0; 3]);
    let too_many = vec![vec![1.0f32; 3]; 129];
    let refs: Vec<&[f32]> = too_many.iter().map(|p| p.as_slice()).collect();
    assert!(std::panic::catch_unwind(|| narrow(&refs)).is_err());
}

/// Values of every magnitude and both signs, from a fixed seed.
fn spread(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = repro::rng::Stream::new(seed, 0);
    (0..n).map(|_| rng.uniform_symmetric(0.5) * 2f32.powi(rng.below(40) as i32 - 20)).collect()
}

#[test]
fn blocks_and_threads_change_no_bit_of_a_long_sum() {
    // Several parallel blocks and a ragged last one.
    let n = 3 * (1 << 14) + 5;
    let parts: Vec<Vec<f32>> = (0..5).map(|s| spread(s, n)).collect();
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut wide = vec![0.0f32; n];
            let mut narrow = vec![0.0f32; n];
            sum_parts_as::<i64, _>(&parts, DEFAULT_HEADROOM, &mut wide, &mut Scratch::default());
            sum_parts_as::<i32, _>(&parts, NARROW_HEADROOM, &mut narrow, &mut Scratch::default());
            (wide, narrow)
        })
    };
    let (one, three) = (on(1), on(3));
    assert_eq!((bits(&one.0), bits(&one.1)), (bits(&three.0), bits(&three.1)));
    // Scale block by scale block, alone: the parallel blocks put every element where it
    // belongs.
    for b in (0..blocks_of(n)).step_by(97).chain([blocks_of(n) - 1]) {
        let range = b * EXP_BLOCK..((b + 1) * EXP_BLOCK).min(n);
        let column: Vec<&[f32]> = parts.iter().map(|p| &p[range.clone()]).collect();
        assert_eq!(bits(&sum_parts(&column, DEFAULT_HEADROOM)), bits(&one.0[range.clone()]), "block {b}");
    }
}

/// Finite floats of every kind, and their negations, for sums that cancel: zeros, subnormals,
/// normals over the whole range, the largest.
fn adversarial() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(|b| f32::from_bits(b & 0x7F7F_FFFF | (b & 0x8000_0000))),
        any::<u32>().prop_map(|b| f32::from_bits(b & 0x807F_FFFF)),
        Just(f32::MAX),
        Just(-f32::MAX),
        Just(0.0f32),
        Just(-0.0f32),
        (-1.0f32..1.0),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The sums that break float sums (cancellation of huge terms, subnormals beside the
    /// largest values, terms and their negations in any order): every grouping and order
    /// gives the single process's bits, in both widths.
    #[test]
    fn adversarial_sums_have_the_same_bits_for_every_grouping_and_order(
        (parts, n) in (1usize..40, 1usize..160).prop_flat_map(|(p, n)| {
            (prop::collection::vec(prop::collection::vec(adversarial(), n), p), Just(n))
        }),
        negate in any::<bool>(),
        workers in 1usize..7,
        seed in any::<u64>(),
    ) {
        let mut parts = parts;
        if negate {
            // Every term beside its negation, shuffled by the grouping below.
            let negated: Vec<Vec<f32>> = parts.iter().map(|p| p.iter().map(|x| -x).collect()).collect();
            parts.extend(negated);
        }
        prop_assume!(parts.len() <= 128 && n > 0);
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        let single = sum_parts(&refs, DEFAULT_HEADROOM);
        let (owner, order) = grouping(parts.len(), workers, seed);
        prop_assert_eq!(bits(&single), bits(&as_workers(&parts, &owner, workers, &order)));
        prop_assert_eq!(bits(&narrow(&refs)), bits(&as_workers_narrow(&parts, &owner, workers, &order)));
        if negate {
            // Terms and their negations cancel exactly: the integers sum to zero.
            prop_assert!(single.iter().all(|&x| x.to_bits() == 0 || x.is_nan()), "{single:?}");
        }
    }

    /// A vector cut into pieces at arbitrary offsets (a gradient bucket's parameters, a
    /// ring's segments) gives the scales and sums of the whole.
    #[test]
    fn pieces_at_any_offsets_give_the_whole_vector_s_scales_and_sums(
        values in prop::collection::vec(adversarial(), 1..400),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let n = values.len();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(n)).chain([0, n]).collect();
        at.sort_unstable();
        at.dedup();
        let (mut whole, mut pieced) = (vec![0u8; blocks_of(n)], vec![0u8; blocks_of(n)]);
        max_exponents(&mut whole, &values, 0);
        for w in at.windows(2) {
            max_exponents(&mut pieced, &values[w[0]..w[1]], w[0]);
        }
        prop_assert_eq!(&whole, &pieced);
        let (mut a, mut b) = (vec![0i64; n], vec![0i64; n]);
        add_fixed(&mut a, &values, &whole, 0, DEFAULT_HEADROOM);
        for w in at.windows(2) {
            add_fixed(&mut b[w[0]..w[1]], &values[w[0]..w[1]], &whole, w[0], DEFAULT_HEADROOM);
        }
        prop_assert_eq!(&a, &b);
        // Written over whatever the accumulator held: the sum added into zeros.
        let mut c = vec![-99i64; n];
        for w in at.windows(2) {
            repro::batched::write_fixed(&mut c[w[0]..w[1]], &values[w[0]..w[1]], &whole, w[0], DEFAULT_HEADROOM);
        }
        prop_assert_eq!(&a, &c);
        let mut out = vec![0f32; n];
        for w in at.windows(2) {
            repro::batched::finish_into(&b[w[0]..w[1]], &whole, w[0], DEFAULT_HEADROOM, &mut out[w[0]..w[1]]);
        }
        prop_assert_eq!(bits(&out), bits(&finish(&a, &whole, DEFAULT_HEADROOM)));
    }
}

/// Terms whose exponent fields lie within `spread` of `top` in every block (signed zeros,
/// and subnormals where the range reaches field 1, among them): the blocks a sum adds in
/// `f64` when the spread is within the shift (23 for the default 64-bit sum), and just
/// beyond it, where it adds integers in registers; now and then an infinity or a NaN,
/// whose block takes the integers through memory.
fn near(top: u32, spread: u32) -> impl Strategy<Value = f32> {
    let low = top.saturating_sub(spread).max(1);
    let finite = (any::<bool>(), low..=top, 0u32..1 << 23, any::<bool>()).prop_map(|(neg, f, m, sub)| {
        // Field 1 is also the subnormals' (exponent bits 0).
        let e = if f == 1 && sub { 0 } else { f };
        f32::from_bits(u32::from(neg) << 31 | e << 23 | m)
    });
    let special = prop_oneof![Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(f32::NAN)];
    prop_oneof![80 => finite, 10 => Just(0.0f32), 10 => Just(-0.0f32), 1 => special]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Blocks whose terms sit on their scale's grid are added in `f64` by a single process
    /// (up to 64 parts): the same bits as the integers of every grouping, at both ends of
    /// the exponent range (sums that overflow to infinity, subnormal sums), at spreads on
    /// both sides of the shift, with more parts than the `f64` path takes, and with terms
    /// beside their negations (exact zeros, `+0.0`).
    #[test]
    fn sums_of_terms_on_their_grid_have_the_integers_bits(
        (parts, n) in (
            prop_oneof![Just(1u32), Just(2), Just(24), 1u32..255, Just(253), Just(254)],
            prop_oneof![0u32..27, 22u32..25],
            prop_oneof![1usize..4, 1usize..70],
            1usize..200,
        )
            .prop_flat_map(|(top, spread, p, n)| (prop::collection::vec(prop::collection::vec(near(top, spread), n), p), Just(n))),
        negate in 0..3,
        workers in 1usize..5,
        seed in any::<u64>(),
    ) {
        let mut parts = parts;
        let negated = |p: &Vec<f32>| p.iter().map(|x| -x).collect::<Vec<f32>>();
        match negate {
            // Every part beside its negation: exact zeros.
            1 => parts.extend(parts.iter().map(negated).collect::<Vec<_>>()),
            // The first part's negation: the sum is that of the others, its last bits
            // uncovered by the cancellation of the largest terms.
            2 => parts.push(negated(&parts[0])),
            _ => {}
        }
        let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        let single = sum_parts(&refs, DEFAULT_HEADROOM);
        let (owner, order) = grouping(parts.len(), workers, seed);
        prop_assert_eq!(bits(&single), bits(&as_workers(&parts, &owner, workers, &order)));
        if negate == 1 {
            prop_assert!(single.iter().all(|&x| x.to_bits() == 0 || x.is_nan()), "{single:?}");
        }
        if parts.len() <= 1 << NARROW_HEADROOM {
            prop_assert_eq!(bits(&narrow(&refs)), bits(&as_workers_narrow(&parts, &owner, workers, &order)));
        }
        prop_assert_eq!(single.len(), n);
    }
}

#[test]
fn two_largest_terms_overflow_and_two_subnormals_add_exactly_on_the_f64_path() {
    let big = vec![f32::MAX; EXP_BLOCK];
    let half = vec![f32::MAX / 2.0; EXP_BLOCK];
    let sum = sum_parts(&[&big, &half], DEFAULT_HEADROOM);
    assert!(sum.iter().all(|&x| x == f32::INFINITY));
    let sum = sum_parts(&[&big, &big.iter().map(|x| -x).collect::<Vec<_>>()], DEFAULT_HEADROOM);
    assert!(sum.iter().all(|&x| x.to_bits() == 0));
    let (a, b) = (vec![f32::from_bits(3); EXP_BLOCK], vec![f32::from_bits(0x0040_0000); EXP_BLOCK]);
    let sum = sum_parts(&[&a, &b], DEFAULT_HEADROOM);
    assert!(sum.iter().all(|&x| x.to_bits() == 0x0040_0003));
    let zeros = vec![-0.0f32; EXP_BLOCK];
    assert!(sum_parts(&[&zeros, &zeros], DEFAULT_HEADROOM).iter().all(|&x| x.to_bits() == 0));
}
