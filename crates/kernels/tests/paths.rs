//! Every path of every kernel against the kernel's reference (the matrix product's
//! one-element-at-a-time `reference`, the scalar path for the others), bit for bit, on
//! random shapes (odd sizes, sizes below one vector, empty ones) and values (every
//! magnitude, subnormals, infinities), and against itself under other thread counts.

use kernels::attention::{self, Heads};
use kernels::gemm::{MatRef, matmul, matmul_add, reference};
use kernels::{Isa, gelu, norm};
use proptest::prelude::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A finite or infinite value of any magnitude (no NaN: its payload is not promised).
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -4.0f32..4.0,
        2 => (-30i32..30, -1.0f32..1.0).prop_map(|(e, m)| m * 2f32.powi(e)),
        1 => Just(f32::MIN_POSITIVE / 8.0),
        1 => Just(-0.0f32),
        1 => prop_oneof![Just(f32::INFINITY), Just(f32::NEG_INFINITY)],
    ]
}

/// `(m, k, n, a, b, a transposed?, b transposed?)`.
fn problem() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>, Vec<f32>, bool, bool)> {
    (0usize..40, 0usize..300, 0usize..70, any::<bool>(), any::<bool>()).prop_flat_map(|(m, k, n, ta, tb)| {
        (
            Just(m),
            Just(k),
            Just(n),
            prop::collection::vec(value(), m * k),
            prop::collection::vec(value(), k * n),
            Just(ta),
            Just(tb),
        )
    })
}

fn view(data: &[f32], rows: usize, cols: usize, transposed: bool) -> MatRef<'_> {
    if transposed { MatRef::row_major(data, cols, rows).t() } else { MatRef::row_major(data, rows, cols) }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn matmul_paths_give_the_reference_bits((m, k, n, a, b, ta, tb) in problem()) {
        let (a, b) = (view(&a, m, k, ta), view(&b, k, n, tb));
        let mut want = vec![0.0; m * n];
        reference(a, b, &mut want);
        for isa in Isa::all_available() {
            let mut got = vec![f32::NAN; m * n];
            matmul(isa, a, b, &mut got);
            prop_assert_eq!(bits(&got), bits(&want), "{} {}x{}x{}", isa, m, k, n);
        }
    }

    #[test]
    fn a_product_continued_by_matmul_add_gives_the_whole_products_bits(
        (m, k, n, a, b, _, _) in problem(),
        split in 0usize..300,
    ) {
        let k1 = split.min(k);
        let mut want = vec![0.0; m * n];
        reference(MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n), &mut want);
        // A's first k1 columns and B's first k1 rows, then the rest.
        let a1 = MatRef::strided(&a, m, k1, k, 1);
        let a2 = MatRef::strided(a.get(k1..).unwrap_or(&[]), m, k - k1, k, 1);
        let (b1, b2) = b.split_at(k1 * n);
        for isa in Isa::all_available() {
            let mut got = vec![f32::NAN; m * n];
            matmul(isa, a1, MatRef::row_major(b1, k1, n), &mut got);
            matmul_add(isa, a2, MatRef::row_major(b2, k - k1, n), &mut got);
            prop_assert_eq!(bits(&got), bits(&want), "{} {}x{}+{}x{}", isa, m, k1, k - k1, n);
        }
    }
}

/// `rows` rows of `d` values and a vector of `d`, `d >= 1`.
fn rows_and_vector(max_rows: usize, max_d: usize) -> impl Strategy<Value = (usize, Vec<f32>, Vec<f32>, Vec<f32>)> {
    (0..max_rows, 1..max_d).prop_flat_map(|(rows, d)| {
        (
            Just(d),
            prop::collection::vec(-4.0f32..4.0, rows * d),
            prop::collection::vec(-2.0f32..2.0, d),
            prop::collection::vec(-4.0f32..4.0, rows * d),
        )
    })
}

/// An attention shape and its `qkv` and output gradient.
fn attention_problem() -> impl Strategy<Value = (Heads, Vec<f32>, Vec<f32>)> {
    (1usize..4, 1usize..60, 1usize..4, 1usize..20).prop_flat_map(|(n, tokens, heads, head_dim)| {
        let shape = Heads { tokens, heads, head_dim };
        let rows = n * tokens;
        (
            Just(shape),
            prop::collection::vec(-3.0f32..3.0, rows * 3 * shape.width()),
            prop::collection::vec(-3.0f32..3.0, rows * shape.width()),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn gelu_paths_give_the_scalar_bits(x in prop::collection::vec(prop_oneof![8 => -20.0f32..20.0, 1 => value()], 0..300)) {
        let run = |isa| {
            let (mut y, mut slope) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            gelu::gelu_with_slope(isa, &x, &mut y, &mut slope);
            (bits(&y), bits(&slope))
        };
        let want = run(Isa::Scalar);
        for isa in Isa::all_available() {
            prop_assert_eq!(run(isa), want.clone(), "{}", isa);
        }
    }

    #[test]
    fn layer_norm_paths_give_the_scalar_bits((d, x, gamma, dy) in rows_and_vector(150, 70)) {
        let rows = x.len() / d;
        let run = |isa| {
            let (mut y, mut xhat, mut rstd) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; rows]);
            norm::forward(isa, &x, &gamma, &gamma, &mut y, &mut xhat, &mut rstd);
            let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; d], vec![0.0; d]);
            norm::backward(isa, &dy, &gamma, &xhat, &rstd, &mut dx, &mut dg, &mut db);
            [y, xhat, rstd, dx, dg, db].map(|v| bits(&v))
        };
        let want = run(Isa::Scalar);
        for isa in Isa::all_available() {
            prop_assert_eq!(run(isa), want.clone(), "{} {}x{}", isa, rows, d);
        }
    }

    #[test]
    fn attention_paths_give_the_scalar_bits((shape, qkv, dy) in attention_problem()) {
        let run = |isa| {
            let n = dy.len() / (shape.tokens * shape.width());
            let (mut y, mut probs) = (vec![0.0; dy.len()], vec![0.0; n * shape.heads * shape.probs_per_head()]);
            attention::forward(isa, shape, &qkv, &mut y, &mut probs);
            let mut dqkv = vec![0.0; qkv.len()];
            attention::backward(isa, shape, &qkv, &probs, &dy, &mut dqkv);
            [y, probs, dqkv].map(|v| bits(&v))
        };
        let want = run(Isa::Scalar);
        for isa in Isa::all_available() {
            prop_assert_eq!(run(isa), want.clone(), "{} {:?}", isa, shape);
        }
    }
}

#[test]
fn matmul_bits_do_not_depend_on_the_thread_count() {
    // Large enough to be split between threads.
    let (m, k, n) = (300, 700, 90);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 2001) as f32 * 1.1e-3 - 1.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 3001) as f32 * 0.7e-3 - 1.0).collect();
    let run = |threads: usize, isa: Isa| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut c = vec![0.0; m * n];
        pool.install(|| matmul(isa, MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n), &mut c));
        bits(&c)
    };
    let one = run(1, Isa::Scalar);
    for isa in Isa::all_available() {
        for threads in [1, 2, 5] {
            assert_eq!(run(threads, isa), one, "{isa} on {threads} threads");
        }
    }
}
