//! The matrix product `C = A · B` with one order of operations for every instruction set
//! and thread count.
//!
//! # The order
//!
//! Every element is one chain of fused multiply-adds over the inner dimension, in
//! increasing order, starting from zero:
//!
//! ```text
//! c[i][j] = fma(a[i][K-1], b[K-1][j], ... fma(a[i][1], b[1][j], fma(a[i][0], b[0][j], 0.0)))
//! ```
//!
//! which is exactly what [`reference`] computes one element at a time. The fast paths get
//! their speed elsewhere: they keep a tile of `MR x NR` outputs in registers (vectors run
//! across the `NR` columns, each lane its own output) and work on it in place in `C`; they
//! read a row-major `A` or `B` where it lies (a `B` of short rows only) and pack any other
//! view (and the tiles cut short by the edges) for contiguous access; and they split the
//! rows of `C` between threads. The inner dimension is blocked by [`KC`] for the caches,
//! but a block goes on from the partial results of the block before it (they are stored
//! in `C` and loaded back), so blocking changes no rounding. None of the tile sizes, the
//! vector width or the thread count appears in the arithmetic; only the shapes do.

use std::cell::Cell;

use rayon::prelude::*;

use crate::isa::Isa;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Inner-dimension block: the panels of one block stay in the L1 and L2 caches.
pub const KC: usize = 256;
/// Most rows of `C` per task of the thread pool (a multiple of every path's `MR`).
const MC: usize = 96;
/// The longest row of a row-major `B` that is read in place. A tile reads one row of its
/// panel per step, so a panel of longer rows puts every step on a page of its own, and
/// the address translations, not the arithmetic, set the pace: such a `B` is packed.
const DIRECT_STRIDE: usize = 512;
/// Below this many multiply-adds, one thread does all the work.
const PARALLEL_WORK: usize = 1 << 20;

/// A read-only matrix view: element `(i, j)` is `data[i * row_stride + j * col_stride]`,
/// so a transposed matrix is the same data with its strides swapped ([`MatRef::t`]).
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A `rows x cols` matrix stored row after row.
    ///
    /// # Panics
    /// If `data` has fewer than `rows * cols` elements.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> MatRef<'a> {
        MatRef::strided(data, rows, cols, cols, 1)
    }

    /// A `rows x cols` matrix with the given strides (in elements).
    ///
    /// # Panics
    /// If an element of the view lies beyond `data`.
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> MatRef<'a> {
        if rows > 0 && cols > 0 {
            let last = (rows - 1)
                .checked_mul(row_stride)
                .and_then(|r| (cols - 1).checked_mul(col_stride).and_then(|c| r.checked_add(c)));
            assert!(
                last.is_some_and(|l| l < data.len()),
                "a {rows}x{cols} view with strides ({row_stride}, {col_stride}) needs more than {} elements",
                data.len()
            );
        }
        MatRef { data, rows, cols, row_stride, col_stride }
    }

    /// The transpose (no copy).
    pub fn t(self) -> MatRef<'a> {
        MatRef { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.row_stride + j * self.col_stride]
    }
}

/// `c = a · b`, with `c` row-major (`a.rows() x b.cols()`, overwritten), on the path of
/// `isa`: the bits of [`reference`] on every path.
///
/// # Panics
/// If the inner dimensions differ, `c` has the wrong length, or `isa` is not
/// [available](Isa::available) on this CPU.
pub fn matmul(isa: Isa, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    product(isa, a, b, c, false);
}

/// `c = c + a · b`, each element's chain going on from its value in `c`: so that
/// `matmul(a1, b1)` then `matmul_add(a2, b2)` gives the bits of one product whose inner
/// dimension is `a1`'s columns followed by `a2`'s (a sum over a batch of images, say).
///
/// # Panics
/// As [`matmul`].
pub fn matmul_add(isa: Isa, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    product(isa, a, b, c, true);
}

fn product(isa: Isa, a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "inner dimensions differ: {m}x{k} times {}x{n}", b.rows);
    assert_eq!(c.len(), m * n, "the product of {m}x{k} and {k}x{n} has {} elements, not {}", m * n, c.len());
    assert!(isa.available(), "this CPU cannot run the {isa} path");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let (mr, nr) = (tile_rows(isa, m), tile(isa).1);
    // A row-major B of rows up to DIRECT_STRIDE long is read in place, but for its last
    // panel when that is narrower than a tile; any other B is packed whole.
    let direct = b.col_stride == 1 && b.row_stride <= DIRECT_STRIDE;
    let panels = n.div_ceil(nr);
    let packed_panels = if direct { usize::from(n % nr != 0) } else { panels };
    let mut packed_b = Scratch::take(&PACKED_B, KC.min(k) * packed_panels * nr);
    // Threads take equal shares of the rows, in whole tiles and at most MC rows at a time.
    // With one thread in the pool, handing the work to it would only add a wake-up.
    let threads = rayon::current_num_threads();
    let chunk = m.div_ceil(threads).next_multiple_of(mr).clamp(mr, MC);
    let parallel = threads > 1 && m.saturating_mul(n).saturating_mul(k) >= PARALLEL_WORK && m > chunk;
    let chunk = if parallel { chunk } else { MC };
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let packed_b = &mut packed_b[..kc * packed_panels * nr];
        pack_b(b, k0, kc, nr, (panels - packed_panels) * nr, packed_b);
        let block = Block { a, b, direct, k0, kc, packed_b, n, first: k0 == 0 && !accumulate };
        let work = |(index, rows): (usize, &mut [f32])| {
            let mut packed_a = Scratch::take(&PACKED_A, kc * mr);
            // Whole tiles, then the rows left over in the lowest tile that holds them with
            // the fewest empty rows (4 rows left by a 64-row product run as a 6-row tile,
            // not a 12-row one).
            let (height, i0) = (rows.len() / n, index * chunk);
            let whole = height / mr * mr;
            let (tiles, rest) = rows.split_at_mut(whole * n);
            if whole > 0 {
                block.rows(isa, mr, i0, tiles, &mut packed_a);
            }
            if height > whole {
                let low = tile_rows(isa, height - whole);
                block.rows(isa, low, i0 + whole, rest, &mut packed_a[..kc * low]);
            }
        };
        if parallel {
            c.par_chunks_mut(chunk * n).enumerate().for_each(work);
        } else {
            c.chunks_mut(chunk * n).enumerate().for_each(work);
        }
    }
}

thread_local! {
    /// Each thread's packing buffers, kept between products so that a product allocates
    /// (and zeroes) nothing once warm. Their contents never reach a result unwritten.
    static PACKED_A: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static PACKED_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// A packing buffer borrowed from a thread's [`PACKED_A`] or [`PACKED_B`] and given back
/// when dropped. A product nested in another on the same thread (work stealing inside a
/// parallel loop) finds the buffer taken and uses a fresh one.
struct Scratch {
    home: &'static std::thread::LocalKey<Cell<Vec<f32>>>,
    buf: Vec<f32>,
    len: usize,
}

impl Scratch {
    fn take(home: &'static std::thread::LocalKey<Cell<Vec<f32>>>, len: usize) -> Scratch {
        let mut buf = home.take();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        Scratch { home, buf, len }
    }
}

impl std::ops::Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.home.set(std::mem::take(&mut self.buf));
    }
}

/// `c = a · b` one element at a time, in the order of the module's documentation: the
/// definition that every path is tested against.
pub fn reference(a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "inner dimensions differ");
    assert_eq!(c.len(), m * n, "wrong output length");
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc = a.at(i, p).mul_add(b.at(p, j), acc);
            }
            c[i * n + j] = acc;
        }
    }
}

/// `(MR, NR)`: the register tile of each path (rows of `A`, columns of `B`). The vector
/// paths' `NR` is two vectors.
const SCALAR_TILE: (usize, usize) = (4, 8);
const AVX2_TILE: (usize, usize) = (6, 16);
const AVX512_TILE: (usize, usize) = (12, 32);

fn tile(isa: Isa) -> (usize, usize) {
    match isa {
        Isa::Scalar => SCALAR_TILE,
        Isa::Avx2 => AVX2_TILE,
        Isa::Avx512 => AVX512_TILE,
    }
}

/// The tile heights each path has, tallest (its [`tile`]) first.
fn tile_heights(isa: Isa) -> &'static [usize] {
    match isa {
        Isa::Scalar => &[SCALAR_TILE.0],
        Isa::Avx2 => &[AVX2_TILE.0, 4],
        Isa::Avx512 => &[AVX512_TILE.0, 8, 6],
    }
}

/// The tile height for a product of `m` rows: the tallest, unless `m` is short and a
/// lower tile leaves fewer of its rows empty (a 6-row product on AVX-512 would leave half
/// of a 12-row tile idle). Like every tile size, this changes the speed, never the bits.
fn tile_rows(isa: Isa, m: usize) -> usize {
    let heights = tile_heights(isa);
    if m >= 4 * heights[0] {
        return heights[0];
    }
    *heights.iter().min_by_key(|&&mr| m.next_multiple_of(mr) - m).expect("every path has a tile")
}

/// Packs rows `k0..k0+kc` of `b`'s columns from `from` on as panels of `nr` columns:
/// panel `q` holds, for each row `p`, columns `from+q*nr..from+q*nr+nr` (zeros past the
/// last column).
fn pack_b(b: MatRef<'_>, k0: usize, kc: usize, nr: usize, from: usize, out: &mut [f32]) {
    let n = b.cols;
    for (q, panel) in out.chunks_exact_mut(kc * nr).enumerate() {
        let j0 = from + q * nr;
        let width = nr.min(n - j0);
        if b.col_stride == 1 {
            // B row-major: each row's values for the panel lie side by side.
            for (p, row) in panel.chunks_exact_mut(nr).enumerate() {
                let start = (k0 + p) * b.row_stride + j0;
                row[..width].copy_from_slice(&b.data[start..start + width]);
                row[width..].fill(0.0);
            }
        } else if b.row_stride == 1 {
            // B transposed: one column's values for the block lie side by side, so packing
            // is a transpose (zeros past the last column).
            let first = j0 * b.col_stride + k0;
            match nr {
                8 => transpose_rows::<8>(b.data, first, b.col_stride, width, panel),
                16 => transpose_rows::<16>(b.data, first, b.col_stride, width, panel),
                32 => transpose_rows::<32>(b.data, first, b.col_stride, width, panel),
                _ => unreachable!("no path has a tile {nr} columns wide"),
            }
        } else {
            for (p, row) in panel.chunks_exact_mut(nr).enumerate() {
                for (j, slot) in row[..width].iter_mut().enumerate() {
                    *slot = b.at(k0 + p, j0 + j);
                }
                row[width..].fill(0.0);
            }
        }
    }
}

/// The transpose at the heart of packing: `out[p * W + i] = data[first + i * stride + p]`
/// for the `count` (at most `W`) source rows `i` and every step `p` of `out` (which holds
/// `W` values per step; zeros for the rows from `count` on). It goes by squares of `W`
/// rows and `SIDE` steps held in an array, which the compiler keeps free of bounds checks
/// and calls.
fn transpose_rows<const W: usize>(data: &[f32], first: usize, stride: usize, count: usize, out: &mut [f32]) {
    const SIDE: usize = 16;
    assert!(count <= W, "{count} rows do not fit {W}");
    debug_assert!(out.len().is_multiple_of(W), "{} values are not whole steps of {W}", out.len());
    let (steps, _) = out.as_chunks_mut::<W>();
    let kc = steps.len();
    let whole = kc / SIDE * SIDE;
    for p0 in (0..whole).step_by(SIDE) {
        let mut square = [[0.0f32; SIDE]; W];
        for (i, row) in square.iter_mut().enumerate().take(count) {
            let start = first + i * stride + p0;
            *row = data[start..start + SIDE].try_into().expect("SIDE values");
        }
        for (p, step) in steps[p0..p0 + SIDE].iter_mut().enumerate() {
            for (slot, row) in step.iter_mut().zip(&square) {
                *slot = row[p];
            }
        }
    }
    // The steps past the last whole square, one value at a time.
    for step in &mut steps[whole..] {
        step[count..].fill(0.0);
    }
    for (i, start) in (0..count).map(|i| first + i * stride).enumerate() {
        for (step, &v) in steps[whole..].iter_mut().zip(&data[start + whole..start + kc]) {
            step[i] = v;
        }
    }
}

/// Packs rows `r0..r0+height` of `a`, columns `k0..k0+kc` (`kc = out.len() / MR`), as
/// `MR` values per column (zeros past the last row). A transposed `a` is copied column by
/// column, a row-major one (only tiles cut short come here) transposed by
/// [`transpose_rows`], any other view element by element.
fn pack_a<const MR: usize>(a: MatRef<'_>, r0: usize, height: usize, k0: usize, out: &mut [f32]) {
    if height < MR {
        out.fill(0.0);
    }
    if a.row_stride == 1 {
        // A transposed: the tile's values for one column lie side by side (a copy of a
        // size known at compile time for a whole tile, which needs no call to `memcpy`).
        let (cols, _) = out.as_chunks_mut::<MR>();
        for (p, col) in cols.iter_mut().enumerate() {
            let start = (k0 + p) * a.col_stride + r0;
            if height == MR {
                *col = a.data[start..start + MR].try_into().expect("MR values");
            } else {
                col[..height].copy_from_slice(&a.data[start..start + height]);
            }
        }
    } else if a.col_stride == 1 {
        // A row-major: each row's values for the block lie side by side, so packing is a
        // transpose.
        transpose_rows::<MR>(a.data, r0 * a.row_stride + k0, a.row_stride, height, out);
    } else {
        for (p, col) in out.chunks_exact_mut(MR).enumerate() {
            for (i, slot) in col[..height].iter_mut().enumerate() {
                *slot = a.at(r0 + i, k0 + p);
            }
        }
    }
}

/// One inner-dimension block of the product: `a`'s columns `k0..k0+kc` against the packed
/// rows of `b`.
struct Block<'a> {
    a: MatRef<'a>,
    b: MatRef<'a>,
    /// Whether the full panels of `b` are read in place (`packed_b` then holds only the
    /// last, narrower one).
    direct: bool,
    k0: usize,
    kc: usize,
    packed_b: &'a [f32],
    n: usize,
    /// Whether this is the first block (the chains start at zero rather than from `C`).
    first: bool,
}

impl Block<'_> {
    /// Adds this block's terms to the rows `i0..` of `C` held in `c` (whole rows).
    /// Tiles of `mr` rows, one of [`tile_heights`].
    fn rows(&self, isa: Isa, mr: usize, i0: usize, c: &mut [f32], packed_a: &mut [f32]) {
        const SCALAR_NR: usize = SCALAR_TILE.1;
        const AVX2_NR: usize = AVX2_TILE.1;
        const AVX512_NR: usize = AVX512_TILE.1;
        match (isa, mr) {
            (Isa::Scalar, _) => self.rows_with::<{ SCALAR_TILE.0 }, SCALAR_NR>(isa, i0, c, packed_a),
            (Isa::Avx2, 4) => self.rows_with::<4, AVX2_NR>(isa, i0, c, packed_a),
            (Isa::Avx2, _) => self.rows_with::<{ AVX2_TILE.0 }, AVX2_NR>(isa, i0, c, packed_a),
            (Isa::Avx512, 8) => self.rows_with::<8, AVX512_NR>(isa, i0, c, packed_a),
            (Isa::Avx512, 6) => self.rows_with::<6, AVX512_NR>(isa, i0, c, packed_a),
            (Isa::Avx512, _) => self.rows_with::<{ AVX512_TILE.0 }, AVX512_NR>(isa, i0, c, packed_a),
        }
    }

    /// The block for rows `i0..i0 + c.len() / n`, in tiles of `MR x NR`. A whole tile
    /// runs on its place in `C`; one cut short by the edge of `C` runs on a copy. The tile
    /// reads a row-major `A` where it lies, and any other `A` (or rows cut short) packed.
    fn rows_with<const MR: usize, const NR: usize>(&self, isa: Isa, i0: usize, c: &mut [f32], packed_a: &mut [f32]) {
        let (n, kc) = (self.n, self.kc);
        let rows = c.len() / n;
        let mut acc = [[0.0f32; NR]; MR];
        for t0 in (0..rows).step_by(MR) {
            let height = MR.min(rows - t0);
            let a = if self.a.col_stride == 1 && height == MR {
                let start = (i0 + t0) * self.a.row_stride + self.k0;
                TileA { data: &self.a.data[start..], step: 1, row: self.a.row_stride }
            } else {
                pack_a::<MR>(self.a, i0 + t0, height, self.k0, packed_a);
                TileA { data: packed_a, step: MR, row: 1 }
            };
            for q in 0..n.div_ceil(NR) {
                let j0 = q * NR;
                let width = NR.min(n - j0);
                let (panel, ldb) = if self.direct && width == NR {
                    (&self.b.data[self.k0 * self.b.row_stride + j0..], self.b.row_stride)
                } else {
                    let q = if self.direct { 0 } else { q };
                    (&self.packed_b[q * kc * NR..(q + 1) * kc * NR], NR)
                };
                let tile = &mut c[t0 * n + j0..];
                // The chains start at zero in the first block, else from C.
                let b = TileB { data: panel, ld: ldb };
                if height == MR && width == NR {
                    tile_kernel::<MR, NR>(isa, kc, a, b, TileC { data: tile, ld: n, load: !self.first });
                    continue;
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    *row = [0.0; NR];
                    if !self.first && i < height {
                        row[..width].copy_from_slice(&tile[i * n..i * n + width]);
                    }
                }
                tile_kernel::<MR, NR>(isa, kc, a, b, TileC { data: acc.as_flattened_mut(), ld: NR, load: true });
                for (i, row) in acc.iter().enumerate().take(height) {
                    tile[i * n..i * n + width].copy_from_slice(&row[..width]);
                }
            }
        }
    }
}

/// Where a register tile finds its values of `A`: those of step `p` (one per row `i` of
/// the tile) are `data[p * step + i * row]`. Packed, `step` is the tile's height and `row`
/// is 1; read in place from a row-major `A`, `step` is 1 and `row` is `A`'s row stride.
#[derive(Clone, Copy)]
struct TileA<'a> {
    data: &'a [f32],
    step: usize,
    row: usize,
}

impl TileA<'_> {
    /// Whether `data` holds `steps` steps of `rows` values (the unchecked reads of the
    /// vector tiles rest on this; no overflow can pass it).
    fn holds(&self, steps: usize, rows: usize) -> bool {
        steps > 0
            && rows > 0
            && (steps - 1)
                .checked_mul(self.step)
                .zip((rows - 1).checked_mul(self.row))
                .and_then(|(a, b)| a.checked_add(b))
                .is_some_and(|last| last < self.data.len())
    }
}

/// Whether a slice of `len` values holds `rows` rows (at least one) of `width` values,
/// `stride` apart (no overflow can pass it: the vector tiles' unchecked accesses rest on
/// it).
fn fits(len: usize, rows: usize, stride: usize, width: usize) -> bool {
    rows > 0 && (rows - 1).checked_mul(stride).and_then(|r| r.checked_add(width)).is_some_and(|end| end <= len)
}

/// Where a register tile finds its panel of `B`: the `NR` values of step `p` start at
/// `data[p * ld]`.
#[derive(Clone, Copy)]
struct TileB<'a> {
    data: &'a [f32],
    ld: usize,
}

/// Where a register tile keeps its outputs: row `i` of the tile starts at `data[i * ld]`;
/// its chains go on from the values there if `load`, else start at zero.
struct TileC<'a> {
    data: &'a mut [f32],
    ld: usize,
    load: bool,
}

/// Runs `kc` steps of every chain of a register tile: `c[i][j] = fma(a[p][i], b[p][j],
/// c[i][j])` for `p` in `0..kc`, `MR` rows by `NR` columns (the sizes are [`tile`]'s).
fn tile_kernel<const MR: usize, const NR: usize>(isa: Isa, kc: usize, a: TileA<'_>, b: TileB<'_>, c: TileC<'_>) {
    match isa {
        Isa::Scalar => portable_tile::<MR, NR>(kc, a, b, c),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul` asserted that this CPU has AVX2 and FMA (`Isa::available`).
        Isa::Avx2 => unsafe { x86::tile_avx2::<MR>(kc, a, b, c) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul` asserted that this CPU has AVX-512F (`Isa::available`).
        Isa::Avx512 => unsafe { x86::tile_avx512::<MR>(kc, a, b, c) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("{isa} is never available off x86-64"),
    }
}

/// The register tile in plain Rust.
fn portable_tile<const MR: usize, const NR: usize>(kc: usize, a: TileA<'_>, b: TileB<'_>, c: TileC<'_>) {
    let (TileB { data: panel, ld: ldb }, TileC { data: c, ld: ldc, load }) = (b, c);
    assert!(a.holds(kc, MR), "tile sizes");
    let mut acc = [[0.0f32; NR]; MR];
    if load {
        for (i, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[i * ldc..i * ldc + NR]);
        }
    }
    for p in 0..kc {
        let b = &panel[p * ldb..p * ldb + NR];
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = a.data[p * a.step + i * a.row];
            for (c, &bj) in row.iter_mut().zip(b) {
                *c = ai.mul_add(bj, *c);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        c[i * ldc..i * ldc + NR].copy_from_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Values of many magnitudes and both signs, so that any change of order shows.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let scale = [1e-3f32, 0.1, 1.0, 7.0, 300.0][(s % 5) as usize];
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * scale
            })
            .collect()
    }

    /// Asserts that every path computes `a · b` with the bits of [`reference`].
    fn assert_paths_match_reference(a: MatRef<'_>, b: MatRef<'_>) {
        let (m, k, n) = (a.rows(), a.cols(), b.cols());
        let mut want = vec![0.0; m * n];
        reference(a, b, &mut want);
        for isa in Isa::all_available() {
            let mut got = vec![f32::NAN; m * n];
            matmul(isa, a, b, &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa} {m}x{k}x{n}");
        }
    }

    #[test]
    fn every_path_gives_the_reference_bits_on_awkward_shapes() {
        // Short products (6, 8, 16 and 40 rows) take the lower tiles; 130 rows leave 10
        // past the whole tiles.
        // (50, 600, 70): whole tiles of the tallest height whose chains go on from C
        // across three inner blocks.
        let shapes =
            [(1, 1, 1), (3, 5, 7), (17, 1, 33), (6, 300, 16), (9, 513, 31), (130, 70, 65), (50, 600, 70), (2, 0, 3)];
        let short = [(8, 25, 100), (16, 150, 70), (40, 9, 33)];
        // Rows of B longer than DIRECT_STRIDE: B packed although row-major, its last
        // panel cut short.
        let wide = [(30, 300, DIRECT_STRIDE + 45)];
        for &(m, k, n) in shapes.iter().chain(&short).chain(&wide) {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            assert_paths_match_reference(MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
        }
    }

    #[test]
    fn transposed_views_are_the_products_of_the_transposes() {
        // (5, 1, 70): B's transpose with one row is read in place with a row stride of 1.
        for (m, k, n) in [(7, 20, 5), (5, 1, 70), (9, 300, 40), (60, 300, 64)] {
            let (at, bt) = (values(k * m, 3), values(n * k, 4));
            assert_paths_match_reference(MatRef::row_major(&at, k, m).t(), MatRef::row_major(&bt, n, k).t());
        }
    }

    #[test]
    fn views_with_no_unit_stride_are_packed_too() {
        let (m, k, n) = (5, 270, 19);
        let (a, b) = (values(2 * m * k, 7), values(2 * k * n, 8));
        assert_paths_match_reference(MatRef::strided(&a, m, k, 2 * k, 2), MatRef::strided(&b, k, n, 2 * n, 2));
    }

    #[test]
    fn accumulating_products_continue_one_chain() {
        // Two products over 300 and 41 inner terms added into one output give the bits of
        // the single product over all 341 (the second block crosses a KC boundary too).
        let (m, n) = (13, 37);
        let (k1, k2) = (300, 41);
        let a = values(m * (k1 + k2), 5);
        let b = values((k1 + k2) * n, 6);
        let mut want = vec![0.0; m * n];
        reference(MatRef::row_major(&a, m, k1 + k2), MatRef::row_major(&b, k1 + k2, n), &mut want);
        for isa in Isa::all_available() {
            let mut got = vec![f32::NAN; m * n];
            let a1 = MatRef::strided(&a, m, k1, k1 + k2, 1);
            let a2 = MatRef::strided(&a[k1..], m, k2, k1 + k2, 1);
            matmul(isa, a1, MatRef::row_major(&b, k1, n), &mut got);
            matmul_add(isa, a2, MatRef::row_major(&b[k1 * n..], k2, n), &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa}");
            let before = got.clone();
            matmul_add(isa, MatRef::row_major(&[], m, 0), MatRef::row_major(&[], 0, n), &mut got);
            assert_eq!(bits(&got), bits(&before), "an empty product adds nothing");
        }
    }

    #[test]
    #[should_panic(expected = "inner dimensions differ")]
    fn mismatched_shapes_are_refused() {
        let x = [0.0f32; 6];
        matmul(Isa::Scalar, MatRef::row_major(&x, 2, 3), MatRef::row_major(&x, 2, 3), &mut [0.0; 9]);
    }

    #[test]
    #[should_panic(expected = "needs more than")]
    fn a_view_beyond_its_data_is_refused() {
        MatRef::row_major(&[0.0; 5], 2, 3);
    }
}
