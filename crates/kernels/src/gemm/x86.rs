//! The register tiles of the AVX2 and AVX-512 paths, written with the vector intrinsics
//! (the compiler's vectoriser keeps the AVX2 tile in registers but not the AVX-512 one).
//!
//! Each vector lane is one output of the tile, and each step of `p` is one `vfmadd` per
//! lane: `acc = fma(a, b, acc)`, the operation [`f32::mul_add`] performs on the scalar path.
//! Only the number of outputs a step handles differs between the paths.

use super::{TileA, TileB, TileC, fits};
use std::arch::x86_64::{
    __m256, __m512, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps, _mm512_fmadd_ps,
    _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps,
};

/// `kc` steps of an `MR x 16` tile (two 8-lane vectors per row) on the operands `a`, `b`
/// and `c` (see [`TileA`], [`TileB`], [`TileC`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn tile_avx2<const MR: usize>(kc: usize, a: TileA<'_>, b: TileB<'_>, c: TileC<'_>) {
    const NR: usize = 16;
    let (TileB { data: panel, ld: ldb }, TileC { data: c, ld: ldc, load }) = (b, c);
    const { assert!(super::AVX2_TILE.1 == NR, "the AVX2 tile is two 8-lane vectors wide") };
    assert!(a.holds(kc, MR) && fits(panel.len(), kc, ldb, NR) && ldc >= NR && fits(c.len(), MR, ldc, NR), "tile sizes");
    let mut v: [[__m256; 2]; MR] = [[_mm256_set1_ps(0.0); 2]; MR];
    for (i, row) in v.iter_mut().enumerate().filter(|_| load) {
        for (h, lanes) in row.iter_mut().enumerate() {
            // SAFETY: `c` holds MR rows of 16 values `ldc` apart (asserted), so the 8
            // values at i * ldc + h * 8 are inside it.
            *lanes = unsafe { _mm256_loadu_ps(c.as_ptr().add(i * ldc + h * 8)) };
        }
    }
    for p in 0..kc {
        // SAFETY: `panel` holds kc steps of 16 values `ldb` apart (asserted), and p < kc.
        let b =
            unsafe { [_mm256_loadu_ps(panel.as_ptr().add(p * ldb)), _mm256_loadu_ps(panel.as_ptr().add(p * ldb + 8))] };
        for (i, row) in v.iter_mut().enumerate() {
            // SAFETY: `a` holds kc steps of MR values (asserted), and p < kc, i < MR.
            let a = _mm256_set1_ps(unsafe { *a.data.get_unchecked(p * a.step + i * a.row) });
            row[0] = _mm256_fmadd_ps(a, b[0], row[0]);
            row[1] = _mm256_fmadd_ps(a, b[1], row[1]);
        }
    }
    for (i, row) in v.iter().enumerate() {
        for (h, lanes) in row.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr().add(i * ldc + h * 8), *lanes) };
        }
    }
}

/// `kc` steps of an `MR x 32` tile (two 16-lane vectors per row), with the layout of
/// [`tile_avx2`].
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_avx512<const MR: usize>(kc: usize, a: TileA<'_>, b: TileB<'_>, c: TileC<'_>) {
    const NR: usize = 32;
    let (TileB { data: panel, ld: ldb }, TileC { data: c, ld: ldc, load }) = (b, c);
    const { assert!(super::AVX512_TILE.1 == NR, "the AVX-512 tile is two 16-lane vectors wide") };
    assert!(a.holds(kc, MR) && fits(panel.len(), kc, ldb, NR) && ldc >= NR && fits(c.len(), MR, ldc, NR), "tile sizes");
    let mut v: [[__m512; 2]; MR] = [[_mm512_set1_ps(0.0); 2]; MR];
    for (i, row) in v.iter_mut().enumerate().filter(|_| load) {
        for (h, lanes) in row.iter_mut().enumerate() {
            // SAFETY: `c` holds MR rows of 32 values `ldc` apart (asserted), so the 16
            // values at i * ldc + h * 16 are inside it.
            *lanes = unsafe { _mm512_loadu_ps(c.as_ptr().add(i * ldc + h * 16)) };
        }
    }
    for p in 0..kc {
        // SAFETY: `panel` holds kc steps of 32 values `ldb` apart (asserted), and p < kc.
        let b = unsafe {
            [_mm512_loadu_ps(panel.as_ptr().add(p * ldb)), _mm512_loadu_ps(panel.as_ptr().add(p * ldb + 16))]
        };
        for (i, row) in v.iter_mut().enumerate() {
            // SAFETY: `a` holds kc steps of MR values (asserted), and p < kc, i < MR.
            let a = _mm512_set1_ps(unsafe { *a.data.get_unchecked(p * a.step + i * a.row) });
            row[0] = _mm512_fmadd_ps(a, b[0], row[0]);
            row[1] = _mm512_fmadd_ps(a, b[1], row[1]);
        }
    }
    for (i, row) in v.iter().enumerate() {
        for (h, lanes) in row.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr().add(i * ldc + h * 16), *lanes) };
        }
    }
}
