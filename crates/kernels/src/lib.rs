//! # kernels: CPU kernels with the same bits on every instruction set
//!
//! A kernel here computes each output with an order of floating-point operations that the
//! shapes alone fix: never the vector width, the CPU's features or the thread count. A
//! wider vector unit computes more outputs at once; it never changes which partial sums
//! exist or how they are combined. So a training step gives the same bits on a CPU with
//! AVX-512, on one with AVX2 and FMA, and on one with neither (see `docs/determinism.md`).
//!
//! The rules every kernel follows:
//!
//! - **One accumulation order per output**, written down in the kernel's documentation (for
//!   the matrix product: a chain over the inner dimension in increasing order, starting at
//!   zero). Vectors run across *independent* outputs, never across the terms of one sum.
//! - **Fused multiply-add in the matrix product, nowhere else**: every product-and-add of
//!   a matrix product is one correctly rounded `fma`, on every path. The AVX2 and AVX-512
//!   paths use the hardware's; the scalar path calls [`f32::mul_add`], the same operation
//!   (in software on a CPU without FMA: slow, but the same bits). The other
//!   kernels (GELU, softmax, layer norm, attention's softmax) round every product and sum
//!   on its own, and the compiler vectorises them without changing an operation
//!   (`lanes`).
//! - **Threads split outputs, never sums**: a thread computes whole outputs, so the thread
//!   count changes only who computes them.
//!
//! Besides the arithmetic, two integer loops live here for the same reason (one copy per
//! instruction set, the same bits from each): the conversions of the reproducible sum
//! ([`fixed_point`]) and the loop of the XXH3-64 hash that fingerprints states and
//! checksums checkpoints ([`hash`]).
//!
//! The instruction set is chosen once per process ([`isa::selected`]): the best the CPU
//! has, or the one `STEADFAST_ISA=scalar|avx2|avx512` names. Every kernel also takes an
//! explicit [`Isa`], so that tests compare the paths bit for bit in one process.
//!
//! ```
//! use kernels::{Isa, gemm::{MatRef, matmul}};
//!
//! // C (2x2) = A (2x3) . B (3x2), on the scalar path and on the best one this CPU has.
//! let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [0.5f32, -1.0, 0.25, 2.0, 1e-3, 3.0];
//! let (mut c1, mut c2) = ([0.0f32; 4], [0.0f32; 4]);
//! matmul(Isa::Scalar, MatRef::row_major(&a, 2, 3), MatRef::row_major(&b, 3, 2), &mut c1);
//! matmul(Isa::detect(), MatRef::row_major(&a, 2, 3), MatRef::row_major(&b, 3, 2), &mut c2);
//! assert_eq!(c1.map(f32::to_bits), c2.map(f32::to_bits));
//! ```
//!
//! # Why this crate has `unsafe`
//!
//! The vector paths are functions compiled with `#[target_feature(enable = ...)]`; calling
//! one is `unsafe` because running it on a CPU without those features is undefined. Each
//! call is behind a run-time check that the CPU has them ([`Isa::available`]), stated in
//! its `// SAFETY:` comment. There is no other `unsafe` in the crate.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod attention;
pub mod conv;
pub mod fixed_point;
pub mod gelu;
pub mod gemm;
pub mod hash;
pub mod isa;
mod lanes;
pub mod math;
pub mod norm;
pub mod pool;
pub mod rows;
pub mod softmax;
#[cfg(test)]
mod testing;

pub use isa::Isa;
