//! The skinny matmul (`M ≤ 16`, the decode step; with `B` stored `K × N`, or `N × K` on
//! AVX-512, up to `PANELS_KN_M` rows): streams `B` once, in either layout; and the product
//! with a weight packed in strips (`crate::PackedMatmul`, any `M`).
//!
//! The output's columns are cut into blocks; a block's `M × width` accumulators live in a
//! buffer kept per thread (up to 256 KiB, L2: 4096 columns at M = 16), and the blocks are
//! split across threads when the product is large enough. Each element of `B` is loaded from
//! memory once and used for all `M` rows:
//! - `B` stored `K × N` (rows of `B` are runs of output columns): four rows of `B` at a time
//!   are multiplied into two accumulator rows at a time (`acc_i += a_i,p·B_p + … +
//!   a_i,p+3·B_p+3`), so each load and store of an accumulator carries four fused multiply-adds
//!   and each load of `B` from L1 serves two rows. From 14 rows of `A` on AVX2, instead, `B`
//!   is copied in 128 × 64 panels (the next panel prefetched while one is computed) and each
//!   16-column strip of a panel meets the rows of `A` (packed six rows side by side) six at
//!   a time with the sums in registers ([`avx::rows_panels`]). On AVX-512 from 3 to 96 rows
//!   (every row count past 2 that takes this kernel), `B` is read in place instead: passes of
//!   32 or 64 of its rows, strip by strip along them (each pass's rows are sequential streams),
//!   with the sums of up to 15 rows (from 16 rows: of 8 rows × three strips) in registers and
//!   the lines ahead prefetched into L2 ([`avx512::rows_direct`]);
//! - `B` stored `N × K` (each output column is a dot product with a contiguous row of `B`):
//!   `A` is packed once into groups of 4 rows, step by step of 8 columns side by side; K is
//!   cut into chunks of 1024 (4096 with one row group, M ≤ 4), and within a chunk each tile
//!   of 3 rows of `B` meets every row group in turn, with 4 × 3 eight-lane accumulators in
//!   registers (7 loads per 12 vector multiply-adds; 4 columns a tile at M ≤ 2; written in AVX
//!   intrinsics where the CPU has AVX2 and FMA). The tile's chunk of `B` (12 KiB; with one
//!   group 48 or 64 KiB, which no other group reads) is read from memory once, in runs of a
//!   page or more and in storage order, and from L1 by the other groups; the partial sums
//!   carry across chunks in an 8-lane buffer and are summed pairwise at the end. (The
//!   quantized decode kernels, `quant.rs`, run these tiles too, on dequantized chunks.)
//!   On AVX-512, instead, up to 16 rows of `A` meet `B` as dot products in 16 lanes, both
//!   operands read in place, 4 rows of `A` × 6 of `B` a register tile ([`avx512::cols_dot`]);
//!   from 13 to 16 rows, the rows of `A` are the 16 lanes instead: `Aᵀ` meets 16 rows of `B`
//!   at a time, one broadcast element of `B` per multiply-add, the rows copied (and a
//!   half-precision `B` widened) chunk by chunk into an L1 buffer ([`avx512::cols_bcast`], the
//!   same bits as the `K × N` kernels); from 17 rows (the mid-sized products) `B` is
//!   transposed into panels of two 16-column strips × 1024 rows of `K` (the packed weight's
//!   layout) and met by the AVX-512 register tiles ([`avx512::cols_panels`]).
//!
//! The epilogue runs on each block right after it is computed, then the block is rounded into
//! the output.

use super::matmul::{Epilogue, Geometry, MatmulOperands, epilogue_rows};
use super::pool::for_each_index;
use super::simd::{Isa, madd, multiversion};
use super::{Elem, Halves, scratch};
use crate::Result;
/// Columns per register tile of the `K × N` kernels (two 8-lane vectors), and per strip of a
/// packed weight (`crate::PackedMatmul`).
use crate::ops::MATMUL_STRIP as STRIP;
use std::borrow::Cow;
use tilekit_kernels::MatmulDesc;

/// f32 accumulators per column block (256 KiB, L2): 4096 columns at M = 16. With `B` stored
/// `K × N`, each row of `B` is read in runs of the block's width, so wider blocks stream it
/// better: from 512 columns (32 KiB, L1) to up to 4096 the M = 16 decode rows' medians fell by
/// 10–30% (the accumulators' loads and stores then come from L2, and keep pace).
const ACC: usize = 1 << 16;

thread_local! {
    /// This thread's accumulators (made on its first skinny product with `B` stored `K × N`,
    /// at most [`ACC`] elements: a 256 KiB stack array would not fit every caller's stack).
    static ACC_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Columns per block with `B` stored `N × K` (64 rows of B per task: at K = 4096, 1 MiB).
const NB_COLS: usize = 64;

/// Below this many multiply-adds the column blocks run on the calling thread.
const PARALLEL_MIN: usize = 1 << 19;

/// Lanes of the dot products (one AVX-512 vector, two AVX2 vectors).
const LANES: usize = 16;

/// What one column block needs.
pub(super) struct Block<'a> {
    /// `op(A)` as a dense `m × k` array with row stride `lda`.
    a: &'a [f32],
    lda: usize,
    /// `A` packed by [`pack_groups`], or `Aᵀ` by [`pack_lanes`] where `bcast` (`B` stored `N × K`
    /// only; empty otherwise).
    apack: &'a [f32],
    /// `B` from this batch's first element.
    b: &'a [f32],
    /// Elements between consecutive stored rows of `B`.
    ldb: usize,
    m: usize,
    k: usize,
    /// `B` stored `K × N` goes through [`avx512::rows_direct`] ([`direct_kn`]).
    direct: bool,
    /// `B` stored `N × K` goes through [`avx512::cols_bcast`] or, in half precision,
    /// [`avx512::cols_bcast_half`] ([`nk_bcast`]; `apack` holds `Aᵀ`).
    bcast: bool,
    /// `B` stored `K × N`: the sums go on from `acc` (the product of the `K` rows before this
    /// block's) instead of from zero. Every `K × N` kernel sums in `K` order, one fused
    /// multiply-add a step, so a product cut along `K` gives the bits of the whole.
    carry: bool,
}

/// `acc[i][0..nb] = Σ_p a[i][p] · B[p][j0 + ..]` for `B` stored `K × N`: [`avx::rows_panels`]
/// from [`PANEL_MIN_M`] rows of `A` where the CPU has AVX2 and FMA, else [`rows_plain`].
#[inline(always)]
fn rows_inner<const FMA: bool>(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if FMA && p.m >= PANEL_MIN_M {
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
        unsafe { avx::rows_panels(p, j0, nb, acc) };
        return;
    }
    rows_plain::<FMA>(p, j0, nb, acc);
}

/// Whether [`avx::rows_panels`] runs in `isa` (x86-64 with AVX2 and FMA).
pub(super) fn has_panels(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa != Isa::Portable
}

/// The fewest rows of `A` that take the panel kernel ([`avx::rows_panels`]) with `B` stored
/// `K × N`. Below it the row-streaming kernel was as fast or faster (in-process A/B at
/// 4–16 × 4096 × 4096: 0.6× at M = 4, even at 12–14, 1.15–1.3× at 16): with fewer rows per
/// panel the packing weighs more and the product is nearer the memory bound.
#[cfg(target_arch = "x86_64")]
const PANEL_MIN_M: usize = 14;

/// The last `nb mod 16` columns of a `K × N` block (from `full` on) for the panel and direct
/// kernels: streamed row by row ([`rows_plain`]) into a small buffer, then copied into `acc`
/// (rows `nb` apart).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rows_tail(p: &Block, j0: usize, full: usize, nb: usize, acc: &mut [f32]) {
    if full < nb {
        let (m, w) = (p.m, nb - full);
        let mut rest = [0.0f32; super::matmul::PANELS_KN_M * STRIP];
        if p.carry {
            for (i, r) in rest[..m * w].chunks_exact_mut(w).enumerate() {
                r.copy_from_slice(&acc[i * nb + full..][..w]);
            }
        }
        rows_plain::<true>(p, j0 + full, w, &mut rest[..m * w]);
        for (i, r) in rest[..m * w].chunks_exact(w).enumerate() {
            acc[i * nb + full..][..w].copy_from_slice(r);
        }
    }
}

/// The sum of `v`'s lanes, pairwise: the upper half added to the lower, lane by lane, until
/// one lane is left.
#[inline(always)]
pub(super) fn pairwise_sum<const L: usize>(mut v: [f32; L]) -> f32 {
    let mut w = L / 2;
    while w > 0 {
        for l in 0..w {
            v[l] += v[l + w];
        }
        w /= 2;
    }
    v[0]
}

/// [`rows_inner`] with `B` streamed row by row: four rows of `B` at a time into two rows of
/// accumulators at a time.
#[inline(always)]
fn rows_plain<const FMA: bool>(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
    let (a, b, lda, ldb, m, k) = (p.a, p.b, p.lda, p.ldb, p.m, p.k);
    if !p.carry {
        acc[..m * nb].fill(0.0);
    }
    let mut q = 0;
    while q + 4 <= k {
        let b0 = &b[q * ldb + j0..][..nb];
        let b1 = &b[(q + 1) * ldb + j0..][..nb];
        let b2 = &b[(q + 2) * ldb + j0..][..nb];
        let b3 = &b[(q + 3) * ldb + j0..][..nb];
        // Two rows of A per pass share each load of B: 8 multiply-adds per 6 loads and 2 stores.
        let mut i = 0;
        while i + 2 <= m {
            let ar = &a[i * lda + q..][..4];
            let br = &a[(i + 1) * lda + q..][..4];
            let (lo, hi) = acc[i * nb..(i + 2) * nb].split_at_mut(nb);
            for j in 0..nb {
                let s = madd::<FMA>(ar[0], b0[j], lo[j]);
                let s = madd::<FMA>(ar[1], b1[j], s);
                let s = madd::<FMA>(ar[2], b2[j], s);
                lo[j] = madd::<FMA>(ar[3], b3[j], s);
                let t = madd::<FMA>(br[0], b0[j], hi[j]);
                let t = madd::<FMA>(br[1], b1[j], t);
                let t = madd::<FMA>(br[2], b2[j], t);
                hi[j] = madd::<FMA>(br[3], b3[j], t);
            }
            i += 2;
        }
        if i < m {
            let ar = &a[i * lda + q..][..4];
            let row = &mut acc[i * nb..][..nb];
            for j in 0..nb {
                let s = madd::<FMA>(ar[0], b0[j], row[j]);
                let s = madd::<FMA>(ar[1], b1[j], s);
                let s = madd::<FMA>(ar[2], b2[j], s);
                row[j] = madd::<FMA>(ar[3], b3[j], s);
            }
        }
        q += 4;
    }
    while q < k {
        let bq = &b[q * ldb + j0..][..nb];
        for i in 0..m {
            let av = a[i * lda + q];
            let row = &mut acc[i * nb..][..nb];
            row.iter_mut().zip(bq).for_each(|(r, &bv)| *r = madd::<FMA>(av, bv, *r));
        }
        q += 1;
    }
}

multiversion! {
    fn rows_block(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) => rows_inner
}

/// Lanes of one accumulator of the `N × K` kernel (one AVX2 vector).
pub(super) const DOT_LANES: usize = 8;

/// Rows of `A` per register tile of the `N × K` kernel.
pub(super) const GROUP: usize = 4;

/// K elements per chunk of the `N × K` kernel with more than one row group of `A`: a tile's rows
/// of `B` over one chunk (3 × 4 KiB) stay in L1 while the row groups pass over them, and each
/// row of `B` is read from memory in page-long runs.
const KC: usize = 1024;

/// K elements per chunk with one row group (`M ≤ 4`): nothing reads a tile's chunk again, so
/// the chunk only sets how long the runs of each row of `B` are, and longer runs stream better.
/// On a 2-core Zen 3 EPYC (in-process A/B alternated per round, 2 threads, results bit for bit
/// the same) 4096 took 0.85, 0.84 and 0.91 of 1024's time at M = 1, 2 and 4 (N = K = 4096),
/// 0.88 at 1 × 11008 × 4096 and 0.96 at 1 × 4096 × 11008. With two and four groups (M = 8,
/// 16) it took 0.89–0.97; 1024 stays there, where the other groups find the chunk in L1, until
/// it is measured on AVX-512 too.
const KC_ONE_GROUP: usize = 4096;

/// K elements per chunk of the `N × K` kernel for `m` rows of `A`.
pub(super) fn kc(m: usize) -> usize {
    if m <= GROUP { KC_ONE_GROUP } else { KC }
}

/// `A`'s rows for the `N × K` kernel, packed so that a register tile reads one contiguous
/// stream: rows in groups of [`GROUP`] (the last group 1–3 rows), and within a group, step by
/// step of [`DOT_LANES`] columns, the group's rows side by side. Only the first
/// `k − k mod DOT_LANES` columns; the tail is read from `A` itself.
pub(super) fn pack_groups(a: &[f32], lda: usize, m: usize, k: usize) -> Result<Vec<f32>> {
    let full = k - k % DOT_LANES;
    let mut out = scratch(m * full)?;
    let mut at = 0;
    for g0 in (0..m).step_by(GROUP) {
        let r = GROUP.min(m - g0);
        for q in (0..full).step_by(DOT_LANES) {
            for i in g0..g0 + r {
                out[at..at + DOT_LANES].copy_from_slice(&a[i * lda + q..][..DOT_LANES]);
                at += DOT_LANES;
            }
        }
    }
    Ok(out)
}

/// One `R × C` register tile over one K chunk of `kl` columns (a multiple of [`DOT_LANES`]):
/// `ap` is the row group's packed steps over the chunk (`R` vectors a step), `b` the tile's
/// first row of `B` at the chunk (rows `ldb` apart). The `R·C` 8-lane partial sums come from
/// `part` (row `i`, column `j` at `part[i * pstride + j]`), stay in registers for the chunk
/// (each step: `C` loads of `B` and `R` of `A` for `R·C` multiply-adds), and go back. `next`
/// (or null): rows of `B` to prefetch meanwhile (the AVX2 copies; see [`avx::chunk_tile`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_tile<const FMA: bool, const R: usize, const C: usize>(
    ap: &[f32],
    b: &[f32],
    ldb: usize,
    kl: usize,
    part: &mut [[f32; DOT_LANES]],
    pstride: usize,
    next: *const f32,
) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
        unsafe { avx::chunk_tile::<R, C>(ap, b, ldb, kl, part, pstride, next) };
        return;
    }
    let _ = next; // No prefetch in the portable copy.
    // Each row of B cut to exactly `kl` once: with `q + DOT_LANES <= kl` as the loop condition
    // their bounds checks fold into the loop's own.
    let br: [&[f32]; C] = std::array::from_fn(|j| &b[j * ldb..][..kl]);
    let mut acc = [[[0.0f32; DOT_LANES]; C]; R];
    for (i, acc) in acc.iter_mut().enumerate() {
        acc.copy_from_slice(&part[i * pstride..][..C]);
    }
    let mut q = 0;
    for step in ap[..kl * R].chunks_exact(R * DOT_LANES) {
        if q + DOT_LANES > kl {
            break;
        }
        // The C vectors of B are loaded once into locals (registers) and serve all R rows.
        let mut bv = [[0.0f32; DOT_LANES]; C];
        for (v, br) in bv.iter_mut().zip(&br) {
            v.copy_from_slice(&br[q..q + DOT_LANES]);
        }
        for (acc, av) in acc.iter_mut().zip(step.chunks_exact(DOT_LANES)) {
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                for l in 0..DOT_LANES {
                    acc[l] = madd::<FMA>(av[l], bv[l], acc[l]);
                }
            }
        }
        q += DOT_LANES;
    }
    for (i, acc) in acc.iter().enumerate() {
        part[i * pstride..][..C].copy_from_slice(acc);
    }
}

/// Rows of `A` per task of the packed product ([`MatmulOperands::strips_product`]): each task
/// streams its columns' strips of `B` from memory once, so a product of `M` rows streams `B`
/// `⌈M/64⌉` times; 64 rows of 16-column register tiles keep that far below the arithmetic
/// (at 64 × 4096 × 4096 the strips took 22 ms, the unpacked `[K, N]` product 28 ms and
/// `gemm` 70 ms; at 128 rows the strips were still ahead, 38 against 41–43 ms).
const STRIP_ROWS: usize = 64;

/// `K` rows per pass of the register tiles over a strip of packed `B` (16 KiB: L1), which
/// every row group of `A` then reads from L1.
const STRIP_KC: usize = 256;

/// `acc[i][s·16..s·16 + 16] = Σ_p a[i][p] · strip[s0 + s][p][..]` for the `ns` strips of
/// packed `B` from strip `s0` (`[⌈N/16⌉, K, 16]`), `acc`'s rows `ldc` apart: each strip is
/// read in storage order, [`STRIP_KC`] rows at a time, and every row of `A` meets those rows
/// from L1. One fused multiply-add per `K` step in order, as [`rows_plain`] and the panel
/// kernel: the same bits.
#[inline(always)]
fn strips_inner<const FMA: bool>(p: &Block, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
        unsafe { avx::strips(p, s0, ns, acc, ldc) };
        return;
    }
    let (a, lda, m, k) = (p.a, p.lda, p.m, p.k);
    for s in 0..ns {
        let strip = &p.b[(s0 + s) * k * STRIP..][..k * STRIP];
        for q0 in (0..k).step_by(STRIP_KC) {
            let kb = STRIP_KC.min(k - q0);
            for i in 0..m {
                let ar = &a[i * lda + q0..][..kb];
                let row: &mut [f32; STRIP] = (&mut acc[i * ldc + s * STRIP..][..STRIP]).try_into().expect("16 columns");
                for (&av, br) in ar.iter().zip(strip[q0 * STRIP..][..kb * STRIP].chunks_exact(STRIP)) {
                    for (r, &bv) in row.iter_mut().zip(br) {
                        *r = madd::<FMA>(av, bv, *r);
                    }
                }
            }
        }
    }
}

multiversion! {
    fn strips_block(p: &Block, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) => strips_inner
}

/// The skinny kernels' AVX register tiles: the panel kernel for `B` stored `K × N`
/// ([`rows_panels`](avx::rows_panels)) and the `N × K` tile ([`chunk_tile`](avx::chunk_tile)).
/// The plain-loop `N × K` tile compiles to the same 12 FMAs a step, but with its row pointers
/// reloaded from the stack and two bounds checks each step; the intrinsics took 15–25% less
/// time on the `N × K` decode shapes (in-process A/B, one and two threads).
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::super::aligned::AlignedBuf;
    use super::{Block, DOT_LANES, STRIP, STRIP_KC};
    use std::arch::x86_64::*;

    /// Rows of `B` per panel of [`rows_panels`].
    const PANEL_K: usize = 128;
    /// Columns per panel (4 strips of [`STRIP`]): a panel is 32 KiB. With the AVX2 tiles (on a
    /// Zen 3 EPYC) 128 × 64 took 6–10% less time than 64 × 128 on the M = 16 decode shapes,
    /// and 256 or 128 × 32 (runs of `B` of 128 bytes) a third more. Larger panels in L2 (16–128
    /// rows × 256–2048 columns), copied row by row or four rows at a time (four rows at a time
    /// is the faster way to read `B`; see [`super::avx512::DIRECT_M`]), with the next panel
    /// prefetched into L1 or L2 or not at all, took 0.83–1.19× the time of 128 × 64 at 16 ×
    /// 4096 × 4096 (in-process A/B on a Zen 3 EPYC, whose medians swung 6.7–14 ms between
    /// runs); the best, 64 × 1024 copied four rows at a time, 0.83 and 0.91 in two runs and
    /// 1.02 in a third, so 128 × 64 stays. There the copy is most of the time: 16 × 4096 ×
    /// 4096 with the copies and no register tiles took 0.74 of the whole product's time, and
    /// the packed weight's strips (no copy) 0.55–0.65 of it.
    const PANEL_N: usize = 64;
    /// Rows of `A` per register tile (12 accumulators, 2 vectors of `B`, a broadcast).
    const TILE_M: usize = 6;
    /// The largest packed `A` a thread keeps for its next product (1 MiB: 16 rows at K = 16384);
    /// a larger one is freed after its product.
    pub(super) const APACK_KEEP: usize = 1 << 18;

    thread_local! {
        /// This thread's panel of `B` (made on its first panel product, [`PANEL_K`] × [`PANEL_N`]
        /// elements, from a 64-byte boundary so that no vector of a strip straddles two cache
        /// lines). Taken out for the call and put back: a closure (as `with_borrow_mut` takes)
        /// would not inherit the caller's AVX2 target features, and the intrinsics in it would
        /// become calls.
        static PANEL: std::cell::Cell<AlignedBuf<f32>> = const { std::cell::Cell::new(AlignedBuf::empty()) };
        /// This thread's copy of `A`'s rows packed for the register tiles ([`pack_rows`]),
        /// kept between products as [`PANEL`] is while it holds at most [`APACK_KEEP`] elements.
        pub(super) static APACK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// `acc = A · B[.., j0..j0 + nb]` for `B` stored `K × N`, panel by panel: [`PANEL_K`] rows ×
    /// [`PANEL_N`] columns of `B` are copied into a buffer strip by strip (each 16-column
    /// strip's rows back to back, so a tile reads one contiguous stream with no L1 set conflicts:
    /// rows of `B` 16 KiB apart all fall in one set), then every strip meets each group of up to
    /// 6 rows of `A` with its `6 × 16` sums in registers over the panel's rows (2 loads of `B`
    /// and 6 broadcasts of `A` per 12 multiply-adds; the sums are loaded and stored once per
    /// panel). While a panel is computed, the next one's rows of `B` are prefetched in
    /// storage order, spread over its tiles, so the copy finds them in L1. The tiles read `A`
    /// packed ([`pack_rows`], once per block, in groups of the tile's rows), whose rows in place
    /// are `lda` elements apart (`K` for a dense `A`): at 4096 all in one L1 set. On a Zen 3
    /// EPYC packing took 0.92–0.98 of the time on the M = 16 decode shapes and 0.93 at 64 ×
    /// 4096 × 4096 (in-process A/B, the AVX2 tiles).
    ///
    /// Against the row-streaming kernel ([`rows_plain`](super::rows_plain)), whose two rows of
    /// accumulators per pass come from L2 for every four multiply-adds: 1.4× in cache (16 ×
    /// 512 × 256, one thread), 1.15–1.3× on the M = 16 decode shapes (in-process A/B). Without
    /// the prefetch the panels were slower than the row-streaming kernel from memory (copy and
    /// compute do not overlap), and a kernel on `B` in place (no copy) with these tiles lost
    /// to the set conflicts (the AVX-512 direct kernel, [`super::avx512::rows_direct`], reads
    /// `B` in place with tiles of up to 8 rows and three strips, and prefetches into L2; on
    /// AVX-512 it takes every row count these panels would: 64 × 128 panels with AVX-512 tiles
    /// of 8 rows × two strips took 1.05–1.4× its time from 33 to 96 rows, see
    /// [`super::avx512::DIRECT_M`]).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn rows_panels(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
        let (m, k) = (p.m, p.k);
        let (panel_k, panel_n, rows) = (PANEL_K, PANEL_N, TILE_M);
        let full = nb - nb % STRIP;
        let acc = &mut acc[..m * nb];
        if !p.carry {
            acc.fill(0.0);
        }
        // A's rows, packed for the tiles.
        let mut apk = APACK.take();
        pack_rows(p, rows, &mut apk);
        let mut buf = PANEL.take();
        if buf.len() < panel_k * panel_n {
            buf = AlignedBuf::zeroed(panel_k * panel_n);
        }
        // Panels in order: K steps outside, column steps inside.
        let next = |q0: usize, s0: usize| {
            let kb = panel_k.min(k - q0);
            if s0 + panel_n < full { (q0, s0 + panel_n) } else { (q0 + kb, 0) }
        };
        let (mut q0, mut s0) = (0, 0);
        while q0 < k && s0 < full {
            let (kb, ns) = (panel_k.min(k - q0), panel_n.min(full - s0));
            let strips = ns / STRIP;
            for q in 0..kb {
                let src = &p.b[(q0 + q) * p.ldb + j0 + s0..][..ns];
                for (st, v) in src.chunks_exact(STRIP).enumerate() {
                    buf[(st * kb + q) * STRIP..][..STRIP].copy_from_slice(v);
                }
            }
            // The next panel's cache lines (rows in storage order), spread evenly over
            // this panel's tiles.
            let (nq, ns0) = next(q0, s0);
            let (nkb, lines) =
                if nq < k { (panel_k.min(k - nq), panel_n.min(full - ns0).div_ceil(STRIP)) } else { (0, 1) };
            let tiles = strips * m.div_ceil(rows);
            let per_tile = (nkb * lines).div_ceil(tiles);
            let mut line = 0;
            for st in 0..strips {
                let panel = &buf[st * kb * STRIP..][..kb * STRIP];
                let mut g0 = 0;
                while g0 < m {
                    for _ in 0..per_tile.min(nkb * lines - line) {
                        let at = (nq + line / lines) * p.ldb + j0 + ns0 + line % lines * STRIP;
                        // SAFETY: a prefetch never faults; the address is inside B's slice.
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.b[at..].as_ptr() as *const i8) };
                        line += 1;
                    }
                    let r = rows.min(m - g0);
                    let c = &mut acc[g0 * nb + s0 + st * STRIP..];
                    // SAFETY: the caller promises AVX2 and FMA.
                    unsafe {
                        let a = &apk[g0 * k + q0 * r..];
                        match r {
                            6 => tile::<6, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                            5 => tile::<5, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                            4 => tile::<4, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                            3 => tile::<3, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                            2 => tile::<2, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                            _ => tile::<1, 1, false>(a, panel, kb, 0, kb, c, nb, 0),
                        }
                    }
                    g0 += r;
                }
            }
            (q0, s0) = next(q0, s0);
        }
        PANEL.set(buf);
        if apk.capacity() <= APACK_KEEP {
            APACK.set(apk);
        }
        super::rows_tail(p, j0, full, nb, acc);
    }

    /// [`super::strips_inner`] with each row group's `6 × 16` sums in registers. The first
    /// row group prefetches, one cache line per row of `B` it reads, the line [`STRIP_KC`]
    /// rows further on: the next pass's rows of this strip, or the next strip's first (they
    /// follow in memory), so each pass finds its 16 KiB in L1. Without it the hardware
    /// prefetchers alone left the strips 1.3–1.7× slower from memory on the decode shapes
    /// (M = 1 and 16, 4096–11008 columns, separate processes alternated); on a Zen 3 EPYC,
    /// 1.2–1.26× at M = 4 and 16 and level at M = 1 (in-process A/B, 4096 × 4096).
    ///
    /// From two rows on, the tiles read `A` packed by [`pack_rows`] (once per call): a group's
    /// six rows in place lie `lda` apart, in one L1 set when `lda` is a multiple of 1024, and
    /// evict the strip's lines. On the Zen 3 EPYC (in-process A/B, the same bits) packing took
    /// 0.90 of the time at 16 × 4096 × 4096, 0.95 at 16 × 11008 × 4096, 0.97 at 64 × 4096 ×
    /// 4096 and 0.90–0.95 at 1024³ (two threads and one), and was level at M = 2.
    ///
    /// With one to three rows, the tiles take four strips side by side (one row) or two (two or
    /// three rows) instead: one strip's two sums were two chains of dependent
    /// multiply-adds and one stream of `B`. On a 2-core Zen 3 EPYC (in-process A/B, two threads,
    /// medians of 40 alternated runs, the same bits): 0.86 of the time at 1 × 4096 × 4096, 0.91
    /// at 1 × 11008 × 4096, 0.88 at 1 × 4096 × 11008, 0.88 at M = 2 and 0.80 at M = 3 (4096²).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn strips(p: &Block, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
        let (m, k) = (p.m, p.k);
        // One row is its own packed form.
        let mut buf = Vec::new();
        let ap = if m == 1 {
            &p.a[..k]
        } else {
            buf = APACK.take();
            pack_rows(p, TILE_M, &mut buf);
            &buf[..]
        };
        // One group of at most three rows: its few sums would leave the FMA units waiting on
        // each other and the strip a single stream, so its tiles take several strips side by side.
        let wide = match m {
            1 => 4,
            2 | 3 => 2,
            _ => 1,
        };
        let ahead = STRIP_KC * STRIP;
        let mut s = 0;
        while s < ns {
            let w = wide.min(ns - s);
            let strips = &p.b[(s0 + s) * k * STRIP..][..w * k * STRIP];
            for q0 in (0..k).step_by(STRIP_KC) {
                let kb = STRIP_KC.min(k - q0);
                let mut g0 = 0;
                while g0 < m {
                    let r = TILE_M.min(m - g0);
                    let a = &ap[g0 * k + q0 * r..];
                    let c = &mut acc[g0 * ldc + s * STRIP..];
                    // SAFETY: the caller promises AVX2 and FMA. Several strips (`w > 1`) only
                    // with one group of `m ≤ 3` rows, whose (r, w) the first arms list.
                    unsafe {
                        match (r, w, g0 == 0) {
                            (1, 4, _) => tile::<1, 4, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (1, 3, _) => tile::<1, 3, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (1, 2, _) => tile::<1, 2, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (2, 2, _) => tile::<2, 2, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (3, 2, _) => tile::<3, 2, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (6, _, true) => tile::<6, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (5, _, true) => tile::<5, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (4, _, true) => tile::<4, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (3, _, true) => tile::<3, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (2, _, true) => tile::<2, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (_, _, true) => tile::<1, 1, true>(a, strips, k, q0, kb, c, ldc, ahead),
                            (6, _, _) => tile::<6, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                            (5, _, _) => tile::<5, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                            (4, _, _) => tile::<4, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                            (3, _, _) => tile::<3, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                            (2, _, _) => tile::<2, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                            _ => tile::<1, 1, false>(a, strips, k, q0, kb, c, ldc, 0),
                        }
                    }
                    g0 += r;
                }
            }
            s += w;
        }
        if m > 1 && buf.capacity() <= APACK_KEEP {
            APACK.set(buf);
        }
    }

    /// `A`'s rows in groups of `group` (the last 1 to `group` rows), each group step by step:
    /// the group's `r` values of column `q` side by side at `g0·k + q·r`.
    pub(super) fn pack_rows(p: &Block, group: usize, buf: &mut Vec<f32>) {
        let (m, k) = (p.m, p.k);
        buf.clear();
        buf.resize(m * k, 0.0);
        let mut g0 = 0;
        while g0 < m {
            let r = group.min(m - g0);
            let dst = &mut buf[g0 * k..][..r * k];
            for i in 0..r {
                let row = &p.a[(g0 + i) * p.lda..][..k];
                for (q, &v) in row.iter().enumerate() {
                    dst[q * r + i] = v;
                }
            }
            g0 += r;
        }
    }

    /// One `R × 16·W` tile: `R` rows of `A` (one row group, packed: `a` its steps from column
    /// `q0`, [`pack_rows`]) × `W` strips side by side over their rows `q0..q0 + kb`. `strips`
    /// holds the `W` strips, each `k` rows of 16 back to back; the sums come from and go back
    /// to `c` (rows `ldc` apart, the strips' 16 columns each in turn). With `PREFETCH`, each row
    /// also prefetches, in every strip, the line `ahead` elements on. Each column's sum takes
    /// one fused multiply-add per row of `B`, in order, whatever `W`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn tile<const R: usize, const W: usize, const PREFETCH: bool>(
        a: &[f32],
        strips: &[f32],
        k: usize,
        q0: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
        ahead: usize,
    ) {
        assert!(
            kb > 0
                && q0 + kb <= k
                && kb * R <= a.len()
                && W * k * STRIP <= strips.len()
                && (R - 1) * ldc + W * STRIP <= c.len(),
            "register tile past its operands"
        );
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX2 and FMA;
        // the assert bounds every access: A's steps q < kb of R values, each strip's rows
        // q0..q0 + kb of 16, c's rows i < R at W·16 columns.
        unsafe {
            let (ap, cp) = (a.as_ptr(), c.as_mut_ptr());
            let bp: [*const f32; W] = std::array::from_fn(|w| strips.as_ptr().add((w * k + q0) * STRIP));
            let mut s: [[[__m256; 2]; W]; R] = [[[_mm256_setzero_ps(); 2]; W]; R];
            for (i, s) in s.iter_mut().enumerate() {
                for (w, s) in s.iter_mut().enumerate() {
                    let at = cp.add(i * ldc + w * STRIP);
                    *s = [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))];
                }
            }
            for q in 0..kb {
                let aq = ap.add(q * R);
                // One strip: each row's broadcast used at once (six rows' broadcasts held
                // together would not fit beside the 12 sums). Several: the few rows' broadcasts
                // once for all the strips.
                let av: [__m256; R] =
                    std::array::from_fn(|i| if W > 1 { _mm256_broadcast_ss(&*aq.add(i)) } else { _mm256_setzero_ps() });
                for w in 0..W {
                    let br = bp[w].add(q * STRIP);
                    if PREFETCH {
                        // A prefetch never faults: the address may be past B's end
                        // (`wrapping_add` keeps computing it defined).
                        _mm_prefetch::<_MM_HINT_T0>(br.wrapping_add(ahead) as *const i8);
                    }
                    let (b0, b1) = (_mm256_loadu_ps(br), _mm256_loadu_ps(br.add(8)));
                    for i in 0..R {
                        let a = if W > 1 { av[i] } else { _mm256_broadcast_ss(&*aq.add(i)) };
                        s[i][w][0] = _mm256_fmadd_ps(a, b0, s[i][w][0]);
                        s[i][w][1] = _mm256_fmadd_ps(a, b1, s[i][w][1]);
                    }
                }
            }
            for (i, s) in s.iter().enumerate() {
                for (w, s) in s.iter().enumerate() {
                    let at = cp.add(i * ldc + w * STRIP);
                    _mm256_storeu_ps(at, s[0]);
                    _mm256_storeu_ps(at.add(8), s[1]);
                }
            }
        }
    }

    /// [`super::chunk_tile`] with the `R·C` sums in `ymm` registers. With `next` not null, each
    /// 16 columns of the chunk also prefetch into L2 one line of each of the `C` rows of `B`
    /// from `next` (rows `ldb` apart, never read here).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn chunk_tile<const R: usize, const C: usize>(
        ap: &[f32],
        b: &[f32],
        ldb: usize,
        kl: usize,
        part: &mut [[f32; DOT_LANES]],
        pstride: usize,
        next: *const f32,
    ) {
        assert!(
            kl.is_multiple_of(DOT_LANES)
                && kl * R <= ap.len()
                && (C - 1) * ldb + kl <= b.len()
                && (R - 1) * pstride + C <= part.len(),
            "register tile past its operands"
        );
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX2 and FMA;
        // the assert bounds every access: `ap` steps q < kl of R vectors, B's rows j < C at
        // columns q < kl, `part`'s rows i < R at columns j < C. The prefetch addresses are
        // only computed (wrapping) and prefetched, which never faults.
        unsafe {
            let bp: [*const f32; C] = std::array::from_fn(|j| b.as_ptr().add(j * ldb));
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for (i, acc) in acc.iter_mut().enumerate() {
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_loadu_ps(part[i * pstride + j].as_ptr());
                }
            }
            let mut a = ap.as_ptr();
            let mut q = 0;
            while q < kl {
                if !next.is_null() && q.is_multiple_of(16) {
                    for j in 0..C {
                        _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(j * ldb + q) as *const i8);
                    }
                }
                let bv: [__m256; C] = std::array::from_fn(|j| _mm256_loadu_ps(bp[j].add(q)));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let av = _mm256_loadu_ps(a.add(i * DOT_LANES));
                    for (acc, bv) in acc.iter_mut().zip(&bv) {
                        *acc = _mm256_fmadd_ps(av, *bv, *acc);
                    }
                }
                a = a.add(R * DOT_LANES);
                q += DOT_LANES;
            }
            for (i, acc) in acc.iter().enumerate() {
                for (j, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(part[i * pstride + j].as_mut_ptr(), *acc);
                }
            }
        }
    }
}

/// The strip kernel and the `K × N` panels' register tiles in AVX-512: a strip's 16 columns
/// are one `zmm` vector, so a register tile takes up to 8 rows of `A` and two strips side by
/// side (16 sums in registers, 2 loads of `B` and 8 broadcasts per 16 multiply-adds), where the
/// AVX2 tile needs two vectors per strip; the strip kernel's tiles take three (24 sums, 3 loads
/// and 8 broadcasts per 24 multiply-adds). Three strips against two (2 threads, separate
/// processes alternated three times, the same bits): 16 × 4096 × 4096 packed in 2.31–2.33 ms
/// against 2.39–2.51, MobileNetV2's head (49 × 1280 × 320, bias and ReLU6) in 171–174 µs
/// against 176–179 (one thread: 295–311 against 314–327); 16 × 11008 × 4096 (8.5–8.8 ms
/// against 8.6–9.4), 64 × 1024 × 1024 and the memory-bound M = 1 products level.
///
/// On a 2-core AVX-512 Xeon (in-process A/B against the AVX2 tiles): packed strips, 16 × 4096 × 4096 in 3.4 ms against 6.0, 16 × 11008 × 4096 in
/// 12–13 against 18–21, 64 × 4096 × 4096 in 15 against 21, M = 1 (memory-bound) level;
/// `K × N` panels, 16 × 4096 × 4096 in 12–13.5 ms against 17–21 and 16 × 11008 × 4096 in 34
/// against 40–53 (alternated runs), and with 64 × 128 panels and these tiles 16 × 4096 × 4096
/// in 5.3–7.7 ms (those panels are gone: the direct kernel, [`avx512::rows_direct`], beat them
/// from 3 to 96 rows).
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::super::Halves;
    use super::super::activation::avx512::lanes;
    use super::super::depthwise::transpose16;
    use super::{Block, STRIP};
    use std::arch::x86_64::*;

    /// Rows of `A` per register tile.
    pub(super) const ROWS: usize = 8;

    /// `K` rows per pass of [`strips`] over its three strips (192 KiB of f32 `B`, which the
    /// other row groups of `A` read from L2).
    ///
    /// On a 2-core Zen 4 EPYC (1 MiB of L2 a core), with the prefetch [`STRIP_AHEAD`] rows on
    /// into L2, against the 64-row passes that prefetched the next pass's lines into L1 (2
    /// threads, separate processes alternated four times, the same bits): 16 × 4096 × 4096 in
    /// 0.63–0.68 of the time, 16 × 11008 × 4096 0.78, 64 × 4096 × 4096 0.68, 1 × 4096 × 4096
    /// 0.85, 4 × 4096 × 4096 0.9, MobileNetV2's head (49 × 1280 × 320) 0.85; 512 and 2048
    /// rows were level with 1024. One thread at 16 × 4096 × 4096, each change alone: passes
    /// of 32, 64, 128, 256, 1024 and 4096 rows (prefetch one pass on into L1) 8.7, 7.8, 7.8,
    /// 6.9, 6.0 (256 on into L2) and 5.6 ms; with 1024-row passes, the prefetch into L2 64,
    /// 128, 256 and 512 rows on 5.5, 5.2, 5.5 and 5.4 ms, into L1 5.7–5.9. (On the 2-core
    /// AVX-512 Xeon, where the 64-row passes and L1 prefetch were measured, 64 rows had beaten
    /// 256 against the AVX2 kernel's passes: 16 × 4096 × 4096 in 1.92–1.98 ms against
    /// 2.04–2.06; this pass length has not been measured there.)
    const STRIP_PASS: usize = 1024;
    /// Rows of each strip ahead of the one read at which [`strips`]'s first row group
    /// prefetches a line into L2 (see [`STRIP_PASS`]).
    const STRIP_AHEAD: usize = 128;

    /// [`super::strips_inner`] (the same sums in the same order: the same bits) with three
    /// strips per register tile (the last tile one or two when their count is not a multiple
    /// of three), [`STRIP_PASS`] rows of `K` a pass. The first row group prefetches into L2 the
    /// line [`STRIP_AHEAD`] rows on in each strip. The tiles read `A` packed in groups of
    /// [`ROWS`] (`super::avx::pack_rows`, once per call): a group's rows in place lie `lda`
    /// apart, in one L1 set when `lda` is a multiple of 1024 (one thread, 16 × 4096 × 4096:
    /// 0.95–0.97 of the time, the same bits).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn strips(p: &Block, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
        // SAFETY: the caller promises AVX-512F.
        unsafe { strips_of(p, p.b, s0, ns, acc, ldc) }
    }

    /// [`strips`] on a half-precision weight, converted as the tiles load it (as
    /// [`rows_direct_half`]): read once, at 2 bytes an element, with nothing written. Against
    /// the strips widened into a per-thread buffer first ([`super::HALF_STRIPS`]; f16, 2
    /// threads, separate processes alternated twice): 1 × 4096 × 4096 0.59–0.65 ms against
    /// 1.80 (f32: 1.21–1.28), 1 × 4096 × 11008 1.6–1.75 against 4.9–5.0 (f32: 3.6–3.8), 16 ×
    /// 4096 × 11008 5.9–6.1 against 9.5–10.3 (f32: 6.5–8.0).
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn strips_half(p: &Block, h: &Halves, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
        // SAFETY: the caller promises AVX-512F and F16C.
        unsafe {
            match h {
                Halves::F16(v) => strips_of(p, v, s0, ns, acc, ldc),
                Halves::Bf16(v) => strips_of(p, v, s0, ns, acc, ldc),
            }
        }
    }

    /// [`strips`] on the weight `b` (f32 or half precision).
    ///
    /// # Safety
    /// The CPU has AVX-512F, and F16C for a half-precision `b`.
    #[inline(always)]
    unsafe fn strips_of<T: Lanes16>(p: &Block, b: &[T], s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
        let (m, k) = (p.m, p.k);
        let mut apk = super::avx::APACK.take();
        super::avx::pack_rows(p, ROWS, &mut apk);
        let mut s = 0;
        while s < ns {
            let width = 3.min(ns - s);
            let strips = &b[(s0 + s) * k * STRIP..][..width * k * STRIP];
            for q0 in (0..k).step_by(STRIP_PASS) {
                let kb = STRIP_PASS.min(k - q0);
                let mut g0 = 0;
                while g0 < m {
                    let r = ROWS.min(m - g0);
                    let a = &apk[g0 * k + q0 * r..];
                    let c = &mut acc[g0 * ldc + s * STRIP..];
                    // SAFETY: the caller promises AVX-512F.
                    unsafe { tile_any(r, width, a, None, strips, k, q0, kb, c, ldc, g0 == 0) };
                    g0 += r;
                }
            }
            s += width;
        }
        if apk.capacity() <= super::avx::APACK_KEEP {
            super::avx::APACK.set(apk);
        }
    }

    /// Rows of `A` that take [`rows_direct`] (`B` stored `K × N`): up to
    /// [`PANELS_KN_M`](super::super::matmul::PANELS_KN_M), every row count the skinny products
    /// take. Below 3 the row-streaming kernel was faster (1.26× at M = 1, 1.06× at 2). From 33
    /// to 96 rows (groups of up to 8 rows, three strips a tile: [`DIRECT_ROWS`]) it took, of
    /// the panels' time (2-core Zen 4, 2 threads, separate processes alternated three times,
    /// the same bits): 0.73 at 33 × 4096 × 4096 (6.6 against 9.0 ms), 0.74 at 48, 0.83 at 64
    /// (12.2 against 14.7; one thread 0.83), 0.93 at 80, 0.95 at 96, 0.78 at 40 × 4096 ×
    /// 11008, 0.87 at 64 × 11008 × 4096, 0.93 at 64 × 1024 × 1024. (On the 2-core AVX-512 Xeon,
    /// before the 8-row groups, the panels were level or faster from 48 rows: 0.97–1.16× at
    /// 48–80, so the range ended at 32 then.)
    ///
    /// Only on AVX-512. On a 2-core Zen 3 EPYC (AVX2) the same kernel with AVX2 tiles (6 rows ×
    /// two vectors, or 8–12 rows × one vector; with and without the L2 prefetch) took
    /// 1.04–1.84× the panels' time at 16 × 4096 × 4096 in passes of 16–64 rows (in-process
    /// A/B, results bit for bit the same), and 2.3–3.8× in passes of 4–8 rows. Reading `B`
    /// in place from many rows at once streams slowly there: a read-only loop over a 4096 ×
    /// 4096 f32 array (two threads, each on half of every row, 16 columns from each of `r`
    /// rows in turn) ran at 10.3, 17.4, 19.6, 17.8, 12.5 and 8.7 GB/s for `r` = 1, 2, 4, 8, 16
    /// and 32, against 18.8 for one sequential stream per thread; and at 4–8 rows a pass, the
    /// sums' loads and stores (the block's accumulators are in L2) took over.
    pub(super) const DIRECT_M: std::ops::RangeInclusive<usize> = 3..=super::super::matmul::PANELS_KN_M;
    /// From this many rows of `A`, [`rows_direct`] meets `B` in groups of up to 8 rows, three
    /// strips a register tile (24 sums, 3 loads of `B` and 8 broadcasts per 24 multiply-adds);
    /// the first group streams the strips from memory, the others read them from L1. Below it,
    /// the rows are one group, one strip a tile (up to 15 sums, one load of `B` and a
    /// broadcast per multiply-add; up to 8 rows, two or four strips). Against one 16-row tile
    /// a strip (2 threads, separate processes alternated three times, the same bits): 16 ×
    /// 11008 × 4096 in 8.5–9.2 ms against 10.2–11.5, 16 × 14336 × 4096 11.8–13.3 against
    /// 13.9–15.7, 16 × 4096 × 11008 7.2–7.5 against 8.2–9.9, 20 × 11008 × 4096 10.4–10.6
    /// against 12.2–13.1, 24 and 32 × 4096 × 4096 3.1–3.2 and 3.9–4.1 against 4.6–4.9 and
    /// 5.1–5.3 (their 64-row passes); 16 × 4096 × 4096 and 17 × 4096 × 4096 level. At 9 and 12
    /// rows 8-row groups were level or slower, so those stay one group. In `cargo xtask bench`
    /// (three runs of this kernel against one of the 16-row tiles, the same sitting, where rows
    /// whose code did not change moved by up to ±10%): 16 × 4096 × 4096 2.2–2.5 ms against 2.6,
    /// 16 × 4096 × 11008 7.7 against 8.5, but 16 × 11008 × 4096 level (9.7–11.4 against 10.7),
    /// unlike the separate processes above; why the two differ there is not known.
    const DIRECT_ROWS: usize = 16;
    /// Cache lines ahead of the one being read that [`rows_direct`] prefetches, into L2 (four f32
    /// strips; eight of a half-precision `B`).
    const DIRECT_AHEAD: usize = 4;

    /// Rows of `B` per pass of [`rows_direct`] for `m` rows of `A` and rows of `B` `ldb` apart:
    /// 64 where `A`'s rows make more than one register tile (over [`DIRECT_ROWS`]) and rows of
    /// `B` are at most 6144 elements apart, else 32.
    ///
    /// With one tile every pass streams its rows of `B` from memory once, 64 or 32 streams per
    /// thread. Where `B` has to come from DRAM 64 streams read slowly: 16 × 4096 × 11008 (`B`
    /// 180 MB, rows 16 KiB apart) at 10 GB/s against 18 with 32 (0.55 of the time); 16 ×
    /// 4096 × 6144 0.63, 14 rows 0.68; 16 × 4096 × 4096 (`B` 64 MB, which stays in this
    /// machine's L3 between warm runs) 1.10× the time (in-process A/B alternated per round,
    /// medians of 15, 2-core AVX-512 Xeon; 24 passes were level with 32, 48 as slow as 64 at
    /// rows 44 KiB apart). A model's weights are far larger than any L3, so 32. With two tiles
    /// (17–32 rows) the second finds the strip in L1, `B` streams at half the rate per
    /// multiply-add, and 64 stayed level or faster (24 × 4096 × 11008 1.01×, 32 × 4096 × 4096
    /// 0.99× of 32's time; at K = 4096 before: 0.90–0.95 at N = 3072–5120, level at 6144,
    /// 1.1–1.3× at 7168–24576). From 3 to 12 rows 32 was as fast as 16 or 64, or faster.
    ///
    /// Exactly 16 rows with rows of `B` more than 6144 elements apart took passes of 16 while
    /// one 16-row tile a strip read `B` (32 streams read slowly there: 16 × 11008 × 4096 in
    /// 10.7–13.5 ms against 12.7–17.5). With the 8-row groups of three strips
    /// ([`DIRECT_ROWS`]) passes of 32 were faster there (16 × 11008 × 4096 8.5–9.2 ms against
    /// 9.1–10.5 in passes of 16, 16 × 14336 × 4096 11.8–13.3 against 12.3–13.3; separate
    /// processes alternated three times), so they take 32 too.
    fn direct_kb(m: usize, ldb: usize) -> usize {
        if m > DIRECT_ROWS && ldb <= 6144 { 64 } else { 32 }
    }

    /// `acc = A · B[.., j0..j0 + nb]` for `B` stored `K × N`, read in place: `K` is cut into
    /// passes of [`direct_kb`] rows (32 or 64); within a pass, strip by strip along the rows
    /// (three strips at a time from [`DIRECT_ROWS`] rows of `A`), each group of rows of `A`
    /// meets the pass's rows of the strips with its sums in registers ([`direct_tile`]: a load
    /// of `B` per strip and one broadcast per row a step, from a copy of the pass's columns of
    /// `A` laid out step by step). So a pass reads its rows of `B` as 32 or 64 sequential
    /// streams, each element once from memory (the other groups find the strips' lines in L1
    /// or L2). The first group's steps prefetch, into L2, the lines [`DIRECT_AHEAD`] lines
    /// further along their rows: rows a power of two apart all fall in one L1 set, so lines
    /// prefetched into L1 were gone before their use.
    ///
    /// Sums run in `K` order, one fused multiply-add a step from zero: the same bits as the
    /// panels ([`super::avx::rows_panels`]) and the packed weight's strips. Against the panels
    /// (in-process A/B, alternated per round, 2 threads): 16 × 4096 × 4096 in 0.67–0.73 of
    /// the time, 16 × 11008 × 4096 and 16 × 4096 × 11008 0.70–0.78, 32 rows 0.9; against the
    /// row-streaming kernel at 3–12 rows, 0.41–0.86 of the time (M = 6 and 10: 0.57 and 0.44).
    /// The panels copy `B` first and read it back from L1 (prefetching their next panel into
    /// L2 instead of L1 did not change their time).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn rows_direct(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
        let full = nb - nb % STRIP;
        // SAFETY: the caller promises AVX-512F.
        unsafe { padded(p, full, nb, acc, |acc, ldc| direct_strips(p, p.b, j0, full, ldc, acc)) };
        super::rows_tail(p, j0, full, nb, acc);
    }

    /// The fewest columns whose sums [`padded`] moves to rows one strip longer.
    const PAD_MIN: usize = 1024;

    thread_local! {
        /// This thread's sums for [`padded`], taken out for the call and put back.
        static PADDED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// Runs `f(sums, row stride)` on the first `full` columns of `acc` (`p.m` rows `ldc` apart):
    /// in place, or where the rows are a multiple of 4 KiB apart and at least [`PAD_MIN`]
    /// columns wide, on a copy whose rows are one strip longer, copied back after. Rows a
    /// multiple of 4 KiB apart all fall in one L1 set, as do the rows of `B` a pass reads, so a
    /// tile's 16 rows of sums and 32 rows of `B` competed for 12 ways and the sums were loaded
    /// and stored from L2 (16 × 4096 × 4096, `B` `K × N`, f32: 2.77–2.79 ms against 3.07–3.13;
    /// 16 × 4096 × 11008 7.6 against 8.3, 8 × 4096 × 4096 1.69 against 1.79; 2 threads, the
    /// 2-core AVX-512 Xeon, in-process A/B; at 16 × 1024 × 1024, 512 columns a block, the copy
    /// cost more than it saved: 0.21 against 0.19 ms).
    ///
    /// # Safety
    /// As `f`'s.
    #[inline(always)]
    unsafe fn padded(p: &Block, full: usize, ldc: usize, acc: &mut [f32], f: impl FnOnce(&mut [f32], usize)) {
        let m = p.m;
        if full < PAD_MIN || !(ldc * size_of::<f32>()).is_multiple_of(4096) {
            return f(acc, ldc);
        }
        let pl = full + STRIP;
        let mut sums = PADDED.take();
        sums.resize(m * pl, 0.0);
        if p.carry {
            for i in 0..m {
                sums[i * pl..][..full].copy_from_slice(&acc[i * ldc..][..full]);
            }
        }
        f(&mut sums, pl);
        for i in 0..m {
            acc[i * ldc..][..full].copy_from_slice(&sums[i * pl..][..full]);
        }
        PADDED.set(sums);
    }

    /// [`rows_direct`] on a half-precision `B` (its first element at `b0`), converted as the
    /// tiles load it (16 lanes a load: F16C's `vcvtph2ps`, or bf16's bits shifted up 16, as
    /// [`super::super::convert`] widens them): `B` is read once, at 2 bytes an element, with
    /// nothing written. Any number of rows up to [`DIRECT_M`]'s end (one and two as well:
    /// tiles of four strips). Only the first `full` columns (whole strips); `acc`'s rows are
    /// `ldc` apart.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn rows_direct_half(
        p: &Block,
        h: &Halves,
        b0: usize,
        j0: usize,
        full: usize,
        ldc: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: the caller promises AVX-512F and F16C.
        unsafe {
            match h {
                Halves::F16(v) => padded(p, full, ldc, acc, |acc, ldc| direct_strips(p, &v[b0..], j0, full, ldc, acc)),
                Halves::Bf16(v) => padded(p, full, ldc, acc, |acc, ldc| direct_strips(p, &v[b0..], j0, full, ldc, acc)),
            }
        }
    }

    /// A row of `B` as the direct kernel's tiles load it: 16 consecutive elements as f32.
    pub(in crate::backend::cpu) trait Lanes16: Copy {
        /// # Safety
        /// The CPU has AVX-512F and F16C; `p` covers 16 elements.
        unsafe fn load16(p: *const Self) -> __m512;
        /// The first `n` (below 16) elements at `p`, the other lanes 0; nothing past them is read.
        ///
        /// # Safety
        /// As [`Self::load16`], with `p` covering `n` elements.
        unsafe fn load_first(p: *const Self, n: usize) -> __m512;
    }

    impl Lanes16 for f32 {
        #[inline(always)]
        unsafe fn load16(p: *const f32) -> __m512 {
            // SAFETY: the caller's promises.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_first(p: *const f32, n: usize) -> __m512 {
            // SAFETY: the caller's promises; masked-off lanes are not read.
            unsafe { _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p) }
        }
    }

    /// The first `n` (below 16) halves at `p` in a zero-padded copy, converted as
    /// [`Lanes16::load16`] converts.
    ///
    /// # Safety
    /// As [`Lanes16::load_first`].
    #[inline(always)]
    unsafe fn halves_first<T: Lanes16>(p: *const T, n: usize) -> __m512 {
        // SAFETY: `p` covers `n` elements (the caller's promise), each 2 bytes like `u16`; the
        // copy holds 16.
        unsafe {
            let mut pad = [0u16; 16];
            std::ptr::copy_nonoverlapping(p.cast::<u16>(), pad.as_mut_ptr(), n);
            T::load16(pad.as_ptr().cast())
        }
    }

    impl Lanes16 for half::f16 {
        #[inline(always)]
        unsafe fn load16(p: *const half::f16) -> __m512 {
            // SAFETY: the caller's promises (16 halves are 32 bytes).
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_first(p: *const half::f16, n: usize) -> __m512 {
            // SAFETY: the caller's promises.
            unsafe { halves_first(p, n) }
        }
    }

    impl Lanes16 for half::bf16 {
        #[inline(always)]
        unsafe fn load16(p: *const half::bf16) -> __m512 {
            // The bits shifted up 16. A signalling NaN is not quieted here, as the widening does:
            // the multiply-add that takes it quiets it, so the sums are the same.
            // SAFETY: the caller's promises (16 halves are 32 bytes).
            unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))) }
        }
        #[inline(always)]
        unsafe fn load_first(p: *const half::bf16, n: usize) -> __m512 {
            // SAFETY: the caller's promises.
            unsafe { halves_first(p, n) }
        }
    }

    /// [`rows_direct`]'s passes over the first `full` columns (whole strips) of `b` (`B` from
    /// this batch's first element, rows `p.ldb` apart), into `acc` (rows `ldc` apart). Up to 8
    /// rows the tiles take several strips side by side (four for one or two rows, two for 3–8),
    /// so that a tile has at least four independent chains of multiply-adds: one strip's `r`
    /// sums are `r` chains, one step each per 4-cycle latency. Separate processes alternated
    /// twice (2 threads, 2-core AVX-512 Xeon, `B` 4096 × 4096 f32): 3 rows 1.43–1.48
    /// ms against 1.83–1.88, 4 rows 1.57–1.62 against 1.68–1.77, 8 rows 1.71 against 2.03–2.6;
    /// with `B` in f16 ([`rows_direct_half`]), 1 row 0.71–0.77 against 1.13–1.15, 2 rows
    /// 0.79–0.83 against 1.27–1.57, 4 rows 0.96 against 1.46–1.49, 1 × 11008 × 4096 1.75–1.80
    /// against 2.25–2.32. (In f32 one and two rows take the row-streaming kernel, already at
    /// the copy roof.)
    ///
    /// # Safety
    /// The CPU has AVX-512F, and F16C for a half-precision `b`.
    #[inline(always)]
    unsafe fn direct_strips<T: Lanes16>(p: &Block, b: &[T], j0: usize, full: usize, ldc: usize, acc: &mut [f32]) {
        let (m, k) = (p.m, p.k);
        assert!((1..=*DIRECT_M.end()).contains(&m), "{m} rows outside the direct kernel's range");
        assert!(full.is_multiple_of(STRIP) && full <= ldc, "direct kernel's columns past its sums");
        // From 16 rows: groups of up to 8 rows, three strips a tile.
        let tile8 = m >= DIRECT_ROWS;
        let kbmax = direct_kb(m, p.ldb);
        let acc = &mut acc[..m * ldc];
        if !p.carry {
            acc.fill(0.0);
        }
        // The row groups: from 16 rows as equal as can be of at most 8 rows (17 rows: 6 + 6 +
        // 5, 57: 8 + 7 × 7, not 8 × 7 + 1), else one group.
        let groups = || {
            let n = if tile8 { m.div_ceil(8) } else { 1 };
            let (base, extra) = (m / n, m % n);
            (0..n).scan(0, move |g0, g| {
                let r = base + usize::from(g < extra);
                *g0 += r;
                Some((*g0 - r, r))
            })
        };
        // The pass's columns of A, group after group, each step's `r` values side by side (at
        // most 64 steps of `DIRECT_M`'s rows).
        let mut at = [0.0f32; 64 * *DIRECT_M.end()];
        for q0 in (0..k).step_by(kbmax) {
            let kb = kbmax.min(k - q0);
            for (g0, r) in groups() {
                for (q, step) in at[g0 * kb..][..kb * r].chunks_exact_mut(r).enumerate() {
                    for (i, v) in step.iter_mut().enumerate() {
                        *v = p.a[(g0 + i) * p.lda + q0 + q];
                    }
                }
            }
            if tile8 {
                for s in (0..full).step_by(3 * STRIP) {
                    let w = ((full - s) / STRIP).min(3);
                    let b = &b[q0 * p.ldb + j0 + s..];
                    for (g0, r) in groups() {
                        let a = &at[g0 * kb..][..kb * r];
                        let c = &mut acc[g0 * ldc + s..];
                        // SAFETY: the caller promises AVX-512F (and F16C for halves);
                        // `direct_tile` asserts its bounds.
                        unsafe { direct_tile_w(r, w, g0 == 0, a, b, p.ldb, kb, c, ldc) };
                    }
                }
                continue;
            }
            // One or two rows: four strips a tile, four chains of multiply-adds.
            let ww = if m <= 2 { 4 } else { 2 };
            let wide = if m <= 8 { full - full % (ww * STRIP) } else { 0 };
            for s in (0..wide).step_by(ww * STRIP) {
                let b = &b[q0 * p.ldb + j0 + s..];
                let c = &mut acc[s..];
                // SAFETY: the caller promises AVX-512F (and F16C for halves); `direct_tile`
                // asserts its bounds.
                unsafe {
                    let a = &at[..m * kb];
                    match m {
                        1 => direct_tile::<1, 4, true, T>(a, b, p.ldb, kb, c, ldc),
                        2 => direct_tile::<2, 4, true, T>(a, b, p.ldb, kb, c, ldc),
                        _ => direct_tile_w(m, 2, true, a, b, p.ldb, kb, c, ldc),
                    }
                };
            }
            for s in (wide..full).step_by(STRIP) {
                let b = &b[q0 * p.ldb + j0 + s..];
                for (g0, r) in groups() {
                    let a = &at[g0 * kb..][..kb * r];
                    let c = &mut acc[g0 * ldc + s..];
                    // SAFETY: the caller promises AVX-512F (and F16C for halves); `direct_tile`
                    // asserts its bounds.
                    unsafe { direct_tile_any(r, a, b, p.ldb, kb, c, ldc) };
                }
            }
        }
    }

    /// [`direct_tile`] for `r` rows (1..=8) and `w` strips (1..=3), prefetching where `pf`.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn direct_tile_w<T: Lanes16>(
        r: usize,
        w: usize,
        pf: bool,
        a: &[f32],
        b: &[T],
        ldb: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        // SAFETY: the caller promises AVX-512F; `direct_tile` asserts its bounds.
        unsafe {
            macro_rules! by_rows {
                ($w:literal, $pf:literal) => {
                    match r {
                        8 => direct_tile::<8, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        7 => direct_tile::<7, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        6 => direct_tile::<6, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        5 => direct_tile::<5, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        4 => direct_tile::<4, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        3 => direct_tile::<3, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        2 => direct_tile::<2, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                        _ => direct_tile::<1, $w, $pf, T>(a, b, ldb, kb, c, ldc),
                    }
                };
            }
            match (w, pf) {
                (3, true) => by_rows!(3, true),
                (3, false) => by_rows!(3, false),
                (2, true) => by_rows!(2, true),
                (2, false) => by_rows!(2, false),
                (_, true) => by_rows!(1, true),
                (_, false) => by_rows!(1, false),
            }
        }
    }

    /// [`direct_tile`] for `r` rows (1..[`DIRECT_ROWS`]), one strip (up to 8 rows through
    /// [`direct_tile_w`]).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn direct_tile_any<T: Lanes16>(
        r: usize,
        a: &[f32],
        b: &[T],
        ldb: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        // SAFETY: the caller promises AVX-512F; `direct_tile` asserts its bounds.
        unsafe {
            if r <= 8 {
                return direct_tile_w(r, 1, true, a, b, ldb, kb, c, ldc);
            }
            match r {
                15 => direct_tile::<15, 1, true, T>(a, b, ldb, kb, c, ldc),
                14 => direct_tile::<14, 1, true, T>(a, b, ldb, kb, c, ldc),
                13 => direct_tile::<13, 1, true, T>(a, b, ldb, kb, c, ldc),
                12 => direct_tile::<12, 1, true, T>(a, b, ldb, kb, c, ldc),
                11 => direct_tile::<11, 1, true, T>(a, b, ldb, kb, c, ldc),
                10 => direct_tile::<10, 1, true, T>(a, b, ldb, kb, c, ldc),
                _ => direct_tile::<9, 1, true, T>(a, b, ldb, kb, c, ldc),
            }
        }
    }

    /// One `R × 16·W` tile (`W` strips side by side) over `kb` rows of `B` (`b` from the first
    /// strip's first, rows `ldb` apart, f32 or half precision): `a` holds the rows' `A` values
    /// step by step (`kb × R`), the sums come from and go back to `c` (rows `ldc` apart). With
    /// `PF`, each step prefetches, into L2, the lines [`DIRECT_AHEAD`] lines past the ones it
    /// reads.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn direct_tile<const R: usize, const W: usize, const PF: bool, T: Lanes16>(
        a: &[f32],
        b: &[T],
        ldb: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        assert!(
            kb > 0
                && kb * R <= a.len()
                && (kb - 1) * ldb + W * STRIP <= b.len()
                && (R - 1) * ldc + W * STRIP <= c.len(),
            "register tile past its operands"
        );
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX-512F; the
        // assert bounds every access: a's kb steps of R, b's rows q < kb at 16·W columns, c's
        // rows i < R at 16·W columns. The prefetch address is only computed (wrapping) and
        // prefetched, which never faults.
        unsafe {
            let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
            let mut sum = [[_mm512_setzero_ps(); W]; R];
            for (i, v) in sum.iter_mut().enumerate() {
                for (w, v) in v.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(cp.add(i * ldc + w * STRIP));
                }
            }
            for q in 0..kb {
                let mut bv = [_mm512_setzero_ps(); W];
                for (w, v) in bv.iter_mut().enumerate() {
                    *v = T::load16(bp.add(q * ldb + w * STRIP));
                }
                if PF {
                    let line = bp.wrapping_add(q * ldb) as *const i8;
                    for w in 0..(W * STRIP * size_of::<T>()).div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T1>(line.wrapping_add(DIRECT_AHEAD * 64 + w * 64));
                    }
                }
                for (i, v) in sum.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(q * R + i));
                    for (w, v) in v.iter_mut().enumerate() {
                        *v = _mm512_fmadd_ps(av, bv[w], *v);
                    }
                }
            }
            for (i, v) in sum.iter().enumerate() {
                for (w, v) in v.iter().enumerate() {
                    _mm512_storeu_ps(cp.add(i * ldc + w * STRIP), *v);
                }
            }
        }
    }

    /// `K` rows per panel of [`cols_panels`] (runs of 4 KiB from each row of `B`; the panel,
    /// 128 KiB, is read back from L2). On a 2-core Zen 4 (2 threads, separate processes
    /// alternated three times, the same bits), against 256 rows (32 KiB, L1): 32 × 4096 × 4096
    /// in 0.89 of the time, 64 × 4096 × 4096 0.92, 96 × 4096 × 4096 0.96, 24 × 4096 × 11008
    /// 0.79; 512 rows took 0.93 at 64 × 4096 × 4096, 2048 0.86 at 32 × 4096 × 4096 but 1.02
    /// at 96; three strips a panel in place of two were level.
    const NK_PANEL_K: usize = 1024;

    thread_local! {
        /// This thread's panel for [`cols_panels`] (two strips of [`NK_PANEL_K`] rows, 128 KiB).
        /// Taken out for the call and put back (see `avx::PANEL`).
        static NK_PANEL: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }

    /// `acc = A · B[j0..j0 + nb]ᵀ` for `B` stored `N × K` (rows `ldb` apart, `ldb` below 2^31 / 16)
    /// and more than 16 rows of `A` ([`super::nk_panels`]): panel by panel of two strips (32 rows
    /// of `B`) × [`NK_PANEL_K`], each strip transposed into the packed weight's layout (a `K`
    /// step's 16 columns side by side: 16 columns of its 16 rows loaded and transposed in
    /// registers at a time, `depthwise::transpose16`), then every group of up
    /// to 8 rows of `A` meets the panel with [`tile`]'s sums in registers. The panels go along `K`
    /// first, so the 32 rows of `B` are read as 32 sequential streams. In the strips the sums run
    /// in `K` order, one fused multiply-add a step: the same bits as the `K × N` kernels. The last
    /// `nb mod 16` columns are dot products in 16 lanes, summed pairwise (other bits, within the
    /// same bound).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn cols_panels(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
        let (m, k, ldb) = (p.m, p.k, p.ldb);
        assert!(
            ldb < (1 << 27) && (j0 + nb - 1) * ldb + k <= p.b.len() && (m - 1) * p.lda + k <= p.a.len(),
            "panel past its operands"
        );
        let full = nb - nb % STRIP;
        let acc = &mut acc[..m * nb];
        acc.fill(0.0);
        let mut buf = NK_PANEL.take();
        if buf.len() < 2 * NK_PANEL_K * STRIP {
            buf.resize(2 * NK_PANEL_K * STRIP, 0.0);
        }
        // SAFETY (the loads): the caller promises AVX-512F; a load reads B[j][q0 + q + c] for the
        // 16 rows j of a strip (j < j0 + full) at c < n, q + n ≤ kb, so at columns below
        // q0 + kb ≤ k, inside B (asserted above).
        unsafe {
            let mut s0 = 0;
            while s0 < full {
                let w = 2.min((full - s0) / STRIP);
                for q0 in (0..k).step_by(NK_PANEL_K) {
                    let kb = NK_PANEL_K.min(k - q0);
                    for st in 0..w {
                        let base = p.b.as_ptr().add((j0 + s0 + st * STRIP) * ldb + q0);
                        let dst = buf.as_mut_ptr().add(st * kb * STRIP);
                        // 16 columns of the strip's 16 rows at a time, transposed in registers
                        // (the last columns of the panel in masked loads).
                        let mut q = 0;
                        while q < kb {
                            let n = STRIP.min(kb - q);
                            let mut r = [_mm512_setzero_ps(); STRIP];
                            for (l, r) in r.iter_mut().enumerate() {
                                let src = base.add(l * ldb + q);
                                *r = if n == STRIP {
                                    _mm512_loadu_ps(src)
                                } else {
                                    _mm512_maskz_loadu_ps(lanes(0, n), src)
                                };
                            }
                            for (c, v) in transpose16(r).into_iter().enumerate().take(n) {
                                _mm512_storeu_ps(dst.add((q + c) * STRIP), v);
                            }
                            q += STRIP;
                        }
                    }
                    let panel = &buf[..w * kb * STRIP];
                    let mut g0 = 0;
                    while g0 < m {
                        let r = ROWS.min(m - g0);
                        let a = &p.a[g0 * p.lda + q0..];
                        let c = &mut acc[g0 * nb + s0..];
                        tile_any(r, w, a, Some(p.lda), panel, kb, 0, kb, c, nb, false);
                        g0 += r;
                    }
                }
                s0 += w * STRIP;
            }
        }
        NK_PANEL.set(buf);
        for j in full..nb {
            let br = &p.b[(j0 + j) * ldb..][..k];
            for i in 0..m {
                let ar = &p.a[i * p.lda..][..k];
                let mut lanes = [0.0f32; STRIP];
                let mut q = 0;
                while q + STRIP <= k {
                    for l in 0..STRIP {
                        lanes[l] = ar[q + l].mul_add(br[q + l], lanes[l]);
                    }
                    q += STRIP;
                }
                let mut t = super::pairwise_sum(lanes);
                for q in q..k {
                    t = ar[q].mul_add(br[q], t);
                }
                acc[i * nb + j] = t;
            }
        }
    }

    /// Rows of `B` per tile of [`cols_bcast`]: one vector of sums each, transposed 16 × 16 into
    /// the output at the end of the tile.
    const BC_ROWS: usize = 16;
    /// `K` per chunk of [`cols_bcast`]: a tile's rows of `B` over a chunk are copied into an L1
    /// buffer (two of 9 KiB) beside `Aᵀ`'s chunk (8 KiB).
    const BC_KC: usize = 128;
    /// Elements between a buffer's rows: one line more than a chunk, so that the 16 rows a
    /// step reads fall in 16 different L1 sets (rows of `B` a multiple of 4 KiB apart all fall
    /// in one).
    const BC_LD: usize = BC_KC + STRIP;

    /// One chunk of [`cols_bcast`]: its rows of `B` (`rows` of them from `src`, `ldb` apart,
    /// `kb` long) and where the copy or the prefetch of its lines has got to (row `r`, line `l`).
    struct Chunk<T> {
        src: *const T,
        rows: usize,
        kb: usize,
        r: usize,
        l: usize,
    }

    impl<T: Lanes16> Chunk<T> {
        /// Chunk `(jj, q0)` of the block's rows of `B` from `b` (`nb` rows, `k` long, `ldb` apart),
        /// or an empty one.
        fn at(at: Option<(usize, usize)>, b: *const T, ldb: usize, nb: usize, k: usize) -> Chunk<T> {
            match at {
                Some((jj, q0)) => Chunk {
                    src: b.wrapping_add(jj * ldb + q0),
                    rows: BC_ROWS.min(nb - jj),
                    kb: BC_KC.min(k - q0),
                    r: 0,
                    l: 0,
                },
                None => Chunk { src: b, rows: 0, kb: 0, r: 0, l: 0 },
            }
        }

        /// The next line (row, first column) of its rows, row by row (16 elements a line), or
        /// `None` once past them.
        #[inline(always)]
        fn step(&mut self) -> Option<(usize, usize)> {
            if self.r == self.rows {
                return None;
            }
            let at = (self.r, self.l * STRIP);
            self.l += 1;
            if self.l * STRIP >= self.kb {
                (self.r, self.l) = (self.r + 1, 0);
            }
            Some(at)
        }

        /// Line `l` (its first column) of row `r`, as f32, the lanes past the chunk zero.
        ///
        /// # Safety
        /// AVX-512F and F16C; row `r` is one of the chunk's, `l` below its length.
        #[inline(always)]
        unsafe fn load(&self, ldb: usize, r: usize, l: usize) -> __m512 {
            // SAFETY: the caller's promises: the row's elements from l to the chunk's end.
            unsafe {
                let at = self.src.add(r * ldb + l);
                if self.kb - l >= STRIP { T::load16(at) } else { T::load_first(at, self.kb - l) }
            }
        }
    }

    /// `acc = A · B[j0..j0 + nb]ᵀ` for `B` stored `N × K` and at most 16 rows of `A`, with the
    /// rows of `A` in the lanes: `Aᵀ` (`p.apack`, [`super::pack_lanes`]: `K` steps of 16 lanes,
    /// zero past `m`) meets [`BC_ROWS`] rows of `B` at a time, one broadcast element of `B`
    /// and one multiply-add per row a step (the broadcast folded into the multiply-add's
    /// operand), the 16 sums in registers across all of `K`: one load of `Aᵀ` per 16
    /// multiply-adds. Chunk by chunk of [`BC_KC`], each step also copies one line of the next
    /// chunk's rows into the other of two buffers, whose rows fall in different L1 sets, and
    /// prefetches one line of the chunk after it into L2. Each output is summed in `K` order,
    /// one fused multiply-add a step from zero: the same bits as the `K × N` kernels and the
    /// packed weight's strips.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn cols_bcast(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
        // SAFETY: the caller promises AVX-512F.
        unsafe { bcast_of(p, p.b, j0, nb, acc) }
    }

    /// [`cols_bcast`] with `B` in half precision (`h`, stored `N × K`, row `j` from `b0 + j ·
    /// ldb`), converted as its chunks are copied into the buffers: read once, at 2 bytes an
    /// element, the same bits as the product with `B` widened whole.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn cols_bcast_half(p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) {
        // SAFETY: the caller promises AVX-512F and F16C.
        unsafe {
            match h {
                Halves::F16(v) => bcast_of(p, &v[b0..], j0, nb, acc),
                Halves::Bf16(v) => bcast_of(p, &v[b0..], j0, nb, acc),
            }
        }
    }

    /// [`cols_bcast`] on `b` (f32 or half precision).
    ///
    /// # Safety
    /// The CPU has AVX-512F, and F16C for a half-precision `b`.
    #[inline(always)]
    unsafe fn bcast_of<T: Lanes16>(p: &Block, b: &[T], j0: usize, nb: usize, acc: &mut [f32]) {
        let (m, k, ldb) = (p.m, p.k, p.ldb);
        assert!(
            (1..=STRIP).contains(&m)
                && k > 0
                && nb > 0
                && p.apack.len() >= k * STRIP
                && (j0 + nb - 1) * ldb + k <= b.len()
                && acc.len() >= m * nb,
            "broadcast tile past its operands"
        );
        let mut bufs = [[0.0f32; BC_ROWS * BC_LD]; 2];
        // The chunk after `(jj, q0)`: these rows further on, or the next tile's first.
        let after = |(jj, q0): (usize, usize)| {
            if q0 + BC_KC < k {
                Some((jj, q0 + BC_KC))
            } else if jj + BC_ROWS < nb {
                Some((jj + BC_ROWS, 0))
            } else {
                None
            }
        };
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX-512F; the
        // assert bounds every access: Aᵀ's steps q < k of 16, B's rows j0 + jj + r < j0 + nb
        // at columns q0 + q < k (a chunk's masked loads read only those), a buffer's rows
        // r < 16 at columns below BC_KC + 16 = BC_LD, `acc`'s rows i < m at columns jj + j <
        // nb (the masked stores write only those). A prefetch never faults.
        unsafe {
            let (at, b) = (p.apack.as_ptr(), b.as_ptr().add(j0 * ldb));
            // In the block's last tile, where it has fewer than 16 rows, the buffers' other
            // rows hold earlier chunks' values (or zero): their sums are never stored.
            let mut cur = Some((0, 0));
            let mut ch = Chunk::at(cur, b, ldb, nb, k);
            while let Some((r, q)) = ch.step() {
                _mm512_storeu_ps(bufs[0].as_mut_ptr().add(r * BC_LD + q), ch.load(ldb, r, q));
            }
            let mut which = 0;
            let mut sum = [_mm512_setzero_ps(); BC_ROWS];
            while let Some((jj, q0)) = cur {
                let kb = BC_KC.min(k - q0);
                let next = after((jj, q0));
                let mut fill = Chunk::at(next, b, ldb, nb, k);
                let (bb, nbuf) = (bufs[which].as_ptr(), bufs[which ^ 1].as_mut_ptr());
                let mut pf = Chunk::at(next.and_then(after), b, ldb, nb, k);
                let whole = kb == BC_KC && fill.rows == BC_ROWS && fill.kb == BC_KC;
                if whole {
                    // Whole chunks: one line of the next chunk a step, row by row, without
                    // the cursor (the chunk after it prefetched where it is whole too).
                    let full = pf.rows == BC_ROWS && pf.kb == BC_KC;
                    let ahead = if full { pf.src } else { fill.src };
                    for r in 0..BC_ROWS {
                        for l in 0..BC_KC / STRIP {
                            let q = r * (BC_KC / STRIP) + l;
                            let v = T::load16(fill.src.add(r * ldb + l * STRIP));
                            _mm512_storeu_ps(nbuf.add(r * BC_LD + l * STRIP), v);
                            _mm_prefetch::<_MM_HINT_T1>(ahead.add(r * ldb + l * STRIP) as *const i8);
                            let a = _mm512_loadu_ps(at.add((q0 + q) * STRIP));
                            for (j, v) in sum.iter_mut().enumerate() {
                                *v = _mm512_fmadd_ps(_mm512_set1_ps(*bb.add(j * BC_LD + q)), a, *v);
                            }
                        }
                    }
                    fill.r = fill.rows;
                }
                for q in 0..if whole { 0 } else { kb } {
                    if let Some((r, l)) = fill.step() {
                        _mm512_storeu_ps(nbuf.add(r * BC_LD + l), fill.load(ldb, r, l));
                    }
                    if let Some((r, l)) = pf.step() {
                        _mm_prefetch::<_MM_HINT_T1>(pf.src.add(r * ldb + l) as *const i8);
                    }
                    let a = _mm512_loadu_ps(at.add((q0 + q) * STRIP));
                    for (j, v) in sum.iter_mut().enumerate() {
                        *v = _mm512_fmadd_ps(_mm512_set1_ps(*bb.add(j * BC_LD + q)), a, *v);
                    }
                }
                // A short last chunk leaves some of the next one to copy.
                while let Some((r, l)) = fill.step() {
                    _mm512_storeu_ps(nbuf.add(r * BC_LD + l), fill.load(ldb, r, l));
                }
                if q0 + kb == k {
                    let c = BC_ROWS.min(nb - jj);
                    for (i, v) in transpose16(sum).into_iter().enumerate().take(m) {
                        _mm512_mask_storeu_ps(acc.as_mut_ptr().add(i * nb + jj), lanes(0, c), v);
                    }
                    sum = [_mm512_setzero_ps(); BC_ROWS];
                }
                which ^= 1;
                cur = next;
            }
        }
    }

    /// Rows of `A` per register tile of [`cols_dot`].
    pub(in crate::backend::cpu) const DOT_A: usize = 4;
    /// Rows of `B` per register tile of [`cols_dot`]: 4 × 6 sums, 6 vectors of `B` and one of
    /// `A` in the 32 `zmm` registers.
    pub(in crate::backend::cpu) const DOT_B: usize = 6;
    /// `K` per chunk of [`cols_dot`]: a tile's 6 rows of `B` over one chunk (6 KiB) stay in L1
    /// while the row groups of `A` pass over them. With the prefetch, 256 took 0.84–0.99 of
    /// 512's time at 16 × 4096 × 4096, 16 × 4096 × 11008, 16 × 11008 × 4096 and 4 × 4096 ×
    /// 11008 (in-process, alternated per round); without it 1024 and 2048 were slower than 512.
    pub(in crate::backend::cpu) const DOT_KC: usize = 256;
    /// The most rows of `A` for which [`cols_dot_half`] converts `B` in the tiles.
    const DOT_HALF_FUSED: usize = 2 * DOT_A;
    /// Elements ahead along each row of `B` that the first row group's steps prefetch into L1
    /// (half a chunk: the next chunk's lines arrive while this one is computed). Against none,
    /// 128 took 0.92–0.94 of the time at the three 16-row shapes above; 64, 192 and 256 were
    /// slower, the next chunk into L2 instead level (2-core AVX-512 Xeon). On a 2-core Zen 4, 256
    /// and 512 were level with 128, 1024 slower (1.1×), the L2 hint level. The next tile's rows
    /// are prefetched into L2 as well ([`dot_tile`]).
    const DOT_AHEAD: usize = 128;

    /// `acc = A · B[j0..j0 + nb]ᵀ` for `B` stored `N × K` and at most
    /// [`SKINNY_M`](super::super::matmul::SKINNY_M) rows of `A`, as dot products along `K` in
    /// 16 lanes: tile by tile of [`DOT_B`] rows of `B` (each tile's rows read along all of `K`,
    /// six sequential streams), chunk by chunk of [`DOT_KC`], every group of up to [`DOT_A`]
    /// rows of `A` meets the chunk with the 4 × 6 sums in registers ([`dot_tile`]: 10 loads,
    /// both operands straight from their rows, per 24 multiply-adds; no packing). The sums
    /// carry across chunks in a small buffer (at most 16 × 6 vectors, L1) and each is reduced
    /// to one number at the end of its tile (a tree of adds). The last `k mod 16` elements are
    /// masked loads. Lane `l` sums the products at `q ≡ l (mod 16)` in `K` order, so the bits
    /// differ from the `K × N` kernels' (within the same bound).
    ///
    /// Against the kernels it replaces (in-process A/B alternated per round, 2 threads, on a
    /// 2-core AVX-512 Xeon, medians): the gathered panels ([`cols_panels`]) at 16 × 4096 ×
    /// 4096, 16 × 4096 × 11008 and 16 × 11008 × 4096 0.82–0.85 of the time; the AVX2 tile
    /// ([`super::cols_block`]) at 1–12 × 4096 × 4096, 1 × 11008 × 4096 and 4 × 4096 × 11008
    /// 0.71–0.96. From 32 rows the panels were faster (1.07–1.6×).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn cols_dot(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
        const MAX_M: usize = super::super::matmul::SKINNY_M;
        let (m, k, lda, ldb) = (p.m, p.k, p.lda, p.ldb);
        assert!(
            (1..=MAX_M).contains(&m)
                && k > 0
                && nb > 0
                && (j0 + nb - 1) * ldb + k <= p.b.len()
                && (m - 1) * lda + k <= p.a.len()
                && acc.len() >= m * nb,
            "dot tile past its operands"
        );
        // SAFETY: the caller promises AVX-512F; A's m rows of k and B's rows j0..j0 + nb of k
        // are inside their slices (asserted), so each chunk (rows jj..jj + c, columns
        // q0..q0 + kl of those) is too; the outputs are inside `acc` (asserted).
        unsafe {
            dot_tiles(
                m,
                k,
                p.a.as_ptr(),
                lda,
                nb,
                |jj, _, q0, _| (p.b.as_ptr().add((j0 + jj) * ldb + q0), ldb, true),
                |i, j, v| acc[i * nb + j] = v,
            )
        }
    }

    /// [`cols_dot`] with `B` in half precision (`h`, stored `N × K`, row `j` from `b0 + j ·
    /// ldb`), read from memory once, at 2 bytes an element: up to [`DOT_HALF_FUSED`] rows of
    /// `A` (one or two row groups) the tiles convert `B` as they load it ([`Lanes16`]); from
    /// there, where each of three or four row groups would convert it again, each tile's chunk
    /// ([`DOT_B`] rows × [`DOT_KC`]) is widened into an L1 buffer just before the row groups
    /// meet it. Either way the tiles, chunks and sums are [`cols_dot`]'s on the widened values:
    /// the same bits as the product with `B` widened whole. (From 13 rows [`cols_bcast_half`]
    /// takes the product instead.)
    ///
    /// In f16 (2 threads, the 2-core AVX-512 Xeon, separate processes alternated): converted
    /// as loaded, 1 × 4096 × 4096 in 0.62–0.66 ms, 1 × 11008 × 4096 in 1.67–1.71, 1 × 4096 ×
    /// 11008 in 1.62–1.65, 4 × 4096 × 4096 in 0.85, against 0.81–0.85, 2.2–3.8, 1.89–1.92 and
    /// 1.05–1.12 widened chunk by chunk, but 16 × 4096 × 4096 in 2.75 against 2.62–2.64, 16 ×
    /// 4096 × 11008 7.1–7.2 against 6.7–6.8. The chunks widened took 0.82–0.85 ms at 1 × 4096²
    /// against 1.53–1.55 with each column block's rows widened into a 1 MiB buffer first (f32
    /// `B`: 1.18 ms at 4096², 3.6–3.9 at 11008 × 4096).
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn cols_dot_half(p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) {
        const MAX_M: usize = super::super::matmul::SKINNY_M;
        let (m, k, lda, ldb) = (p.m, p.k, p.lda, p.ldb);
        assert!(
            (1..=MAX_M).contains(&m)
                && k > 0
                && nb > 0
                && b0 + (j0 + nb - 1) * ldb + k <= h.len()
                && (m - 1) * lda + k <= p.a.len()
                && acc.len() >= m * nb,
            "dot tile past its operands"
        );
        // SAFETY: the caller promises AVX-512F and F16C; A's m rows of k are inside `A` and
        // B's rows j0..j0 + nb of k from b0 inside `h` (asserted), so each chunk (rows
        // jj..jj + c, columns q0..q0 + kl of those) is too; the outputs are inside `acc`
        // (asserted).
        unsafe {
            let (a, store) = (p.a.as_ptr(), |i: usize, j: usize, v: f32| acc[i * nb + j] = v);
            if m > DOT_HALF_FUSED {
                let mut buf = [0.0f32; DOT_B * DOT_KC];
                let widen = |jj: usize, c: usize, q0: usize, kl: usize| {
                    for (j, row) in buf.chunks_exact_mut(DOT_KC).take(c).enumerate() {
                        h.widen_range(b0 + (j0 + jj + j) * ldb + q0, &mut row[..kl]);
                    }
                    (buf.as_ptr(), DOT_KC, false)
                };
                return dot_tiles(m, k, a, lda, nb, widen, store);
            }
            match h {
                Halves::F16(v) => {
                    let b = v.as_ptr().add(b0);
                    dot_tiles(m, k, a, lda, nb, |jj, _, q0, _| (b.add((j0 + jj) * ldb + q0), ldb, true), store)
                }
                Halves::Bf16(v) => {
                    let b = v.as_ptr().add(b0);
                    dot_tiles(m, k, a, lda, nb, |jj, _, q0, _| (b.add((j0 + jj) * ldb + q0), ldb, true), store)
                }
            }
        }
    }

    /// The dot products of [`cols_dot`]: `m` rows of `A` (`a`, rows `lda` apart, `k` long) with
    /// `nb` rows of `B`, tile by tile of [`DOT_B`] rows and chunk by chunk of [`DOT_KC`], every
    /// group of up to [`DOT_A`] rows of `A` meeting the chunk with the sums in registers
    /// ([`dot_tile_any`]), the sums carried across chunks and reduced once at the end of the
    /// tile into `store(row of A, row of B, sum)`. `chunk(jj, c, q0, kl)` gives rows
    /// `jj..jj + c` of `B` at columns `q0..q0 + kl`: a pointer to the first, their stride, and
    /// whether the first row group prefetches ahead along them (only where they are `B` itself,
    /// not a buffer).
    ///
    /// # Safety
    /// AVX-512F; `1 ≤ m ≤` [`SKINNY_M`](super::super::matmul::SKINNY_M), `k ≥ 1`; `a` covers the
    /// `m` rows of `k`; each chunk's pointer covers its `c` rows of `kl` at its stride until the
    /// next call of `chunk`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::cpu) unsafe fn dot_tiles<T: Lanes16>(
        m: usize,
        k: usize,
        a: *const f32,
        lda: usize,
        nb: usize,
        mut chunk: impl FnMut(usize, usize, usize, usize) -> (*const T, usize, bool),
        mut store: impl FnMut(usize, usize, f32),
    ) {
        const MAX_M: usize = super::super::matmul::SKINNY_M;
        let mut part = [_mm512_setzero_ps(); MAX_M * DOT_B];
        let mut jj = 0;
        while jj < nb {
            let c = DOT_B.min(nb - jj);
            let part = &mut part[..m * c];
            part.fill(_mm512_setzero_ps());
            for q0 in (0..k).step_by(DOT_KC) {
                let kl = DOT_KC.min(k - q0);
                let (b, ldb, ahead) = chunk(jj, c, q0, kl);
                let mut g0 = 0;
                while g0 < m {
                    let r = DOT_A.min(m - g0);
                    // SAFETY: the caller's promises: A's rows g0..g0 + r at columns q0..q0 + kl,
                    // the chunk's c rows of kl; `part` holds r · c vectors from g0 · c.
                    unsafe {
                        dot_tile_any(
                            r,
                            c,
                            a.add(g0 * lda + q0),
                            lda,
                            b,
                            ldb,
                            kl,
                            part.as_mut_ptr().add(g0 * c),
                            ahead && g0 == 0,
                        )
                    };
                    g0 += r;
                }
            }
            for i in 0..m {
                for j in 0..c {
                    store(i, jj + j, _mm512_reduce_add_ps(part[i * c + j]));
                }
            }
            jj += c;
        }
    }

    /// [`dot_tile`] for `r` rows of `A` (1..=[`DOT_A`]) and `c` rows of `B` (1..=[`DOT_B`]).
    ///
    /// # Safety
    /// As [`dot_tile`].
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::cpu) unsafe fn dot_tile_any<T: Lanes16>(
        r: usize,
        c: usize,
        a: *const f32,
        lda: usize,
        b: *const T,
        ldb: usize,
        kl: usize,
        part: *mut __m512,
        prefetch: bool,
    ) {
        macro_rules! by_rows {
            ($c:literal) => {
                match r {
                    4 => dot_tile::<4, $c, T>(a, lda, b, ldb, kl, part, prefetch),
                    3 => dot_tile::<3, $c, T>(a, lda, b, ldb, kl, part, prefetch),
                    2 => dot_tile::<2, $c, T>(a, lda, b, ldb, kl, part, prefetch),
                    _ => dot_tile::<1, $c, T>(a, lda, b, ldb, kl, part, prefetch),
                }
            };
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            match c {
                6 => by_rows!(6),
                5 => by_rows!(5),
                4 => by_rows!(4),
                3 => by_rows!(3),
                2 => by_rows!(2),
                _ => by_rows!(1),
            }
        }
    }

    /// One `R × C` tile of dot products over `kl` elements of `K`: `a` and `b` the first rows'
    /// first elements (rows `lda` and `ldb` apart), the 16-lane sums from and back to `part`
    /// (row `i`, column `j` at `i · C + j`). Steps of 16 elements, then the last `kl mod 16` as
    /// masked loads (the lanes past the end read as zero, from neither operand). With
    /// `prefetch`, each step also prefetches, into L1, the line [`DOT_AHEAD`] elements on in
    /// each row of `B`, and into L2 the line at the same place in each row of the next tile
    /// (rows `C + j`: a whole tile of lead, where the line ahead in L1 is only a few hundred
    /// cycles, too few for memory). On a 2-core Zen 4 (separate processes alternated, the same
    /// sums), against the L1 prefetch alone: 16 × 4096 × 4096 in 0.85–0.88 of the time on one
    /// thread and 0.91–0.94 on two, 16 × 11008 × 4096 0.90, 8 × 4096 × 4096 0.88–0.90, 4 × 4096
    /// × 4096 0.66–0.79, 1 × 4096 × 4096 0.60–0.86, 1 × 4096 × 11008 level (1.01–1.03).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `a` is readable at rows `i < R`, elements `q < kl`, `b` at rows
    /// `j < C`, elements `q < kl`, and `part` holds `R · C` vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn dot_tile<const R: usize, const C: usize, T: Lanes16>(
        a: *const f32,
        lda: usize,
        b: *const T,
        ldb: usize,
        kl: usize,
        part: *mut __m512,
        prefetch: bool,
    ) {
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX-512F and
        // the extents read and written; masked loads touch only their unmasked lanes, inside
        // the rows. The prefetch address is only computed (wrapping) and prefetched, which
        // never faults.
        unsafe {
            let mut s = [[_mm512_setzero_ps(); C]; R];
            for (i, row) in s.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = *part.add(i * C + j);
                }
            }
            let mut q = 0;
            while q + 16 <= kl {
                let bv: [__m512; C] = std::array::from_fn(|j| T::load16(b.add(j * ldb + q)));
                if prefetch {
                    for j in 0..C {
                        let at = b.wrapping_add(j * ldb + q) as *const i8;
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(DOT_AHEAD * size_of::<f32>()));
                    }
                    for j in 0..C {
                        let at = b.wrapping_add((C + j) * ldb + q) as *const i8;
                        _mm_prefetch::<_MM_HINT_T1>(at);
                    }
                }
                for (i, row) in s.iter_mut().enumerate() {
                    let av = _mm512_loadu_ps(a.add(i * lda + q));
                    for (v, bv) in row.iter_mut().zip(&bv) {
                        *v = _mm512_fmadd_ps(av, *bv, *v);
                    }
                }
                q += 16;
            }
            if q < kl {
                let mask = ((1u32 << (kl - q)) - 1) as __mmask16;
                let bv: [__m512; C] = std::array::from_fn(|j| T::load_first(b.add(j * ldb + q), kl - q));
                for (i, row) in s.iter_mut().enumerate() {
                    let av = _mm512_maskz_loadu_ps(mask, a.add(i * lda + q));
                    for (v, bv) in row.iter_mut().zip(&bv) {
                        *v = _mm512_fmadd_ps(av, *bv, *v);
                    }
                }
            }
            for (i, row) in s.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    *part.add(i * C + j) = *v;
                }
            }
        }
    }

    /// [`tile`] for `r` rows (1..=[`ROWS`]) and `w` strips (1 to 3), `A` packed (`lda` `None`)
    /// or in place (rows `lda` apart).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_any<T: Lanes16>(
        r: usize,
        w: usize,
        a: &[f32],
        lda: Option<usize>,
        strips: &[T],
        k: usize,
        q0: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
        prefetch: bool,
    ) {
        // SAFETY: the caller promises AVX-512F; `tile` asserts its bounds.
        unsafe {
            let (packed, lda) = (lda.is_none(), lda.unwrap_or(0));
            macro_rules! by_rows {
                ($w:literal, $p:literal) => {
                    match r {
                        8 => tile::<8, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        7 => tile::<7, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        6 => tile::<6, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        5 => tile::<5, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        4 => tile::<4, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        3 => tile::<3, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        2 => tile::<2, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                        _ => tile::<1, $w, $p, T>(a, lda, strips, k, q0, kb, c, ldc, prefetch),
                    }
                };
            }
            match (w, packed) {
                (3, true) => by_rows!(3, true),
                (2, true) => by_rows!(2, true),
                (_, true) => by_rows!(1, true),
                (3, false) => by_rows!(3, false),
                (2, false) => by_rows!(2, false),
                (_, false) => by_rows!(1, false),
            }
        }
    }

    /// One `R × 16·W` tile over rows `q0..q0 + kb` of `W` consecutive strips (`strips`, each
    /// `k` rows of 16): `a` holds the group's `A` from column `q0`, with `PACKED` step by step
    /// (`R` values a step, `super::avx::pack_rows`), else in place (rows `lda` apart); the sums
    /// come from and go back to `c` (rows `ldc` apart). `prefetch`: each row also prefetches
    /// into L2, in every strip, the line [`STRIP_AHEAD`] rows on.
    ///
    /// What bounds the 16-row products here (in-process, 2 threads, 2-core AVX-512 Xeon whose
    /// measured multiply-add peak is 341 GFLOP/s): with the packed `B` in cache the tiles ran at
    /// 269 GFLOP/s at 16 × 1024 × 1024 and 290 at 64 × 1024 × 1024; with `B` streamed they
    /// ran at 227–251 (16 × 4096 × 4096, 64 MB, which stays in L3 between warm runs) and
    /// 162–170 (16 × 32768 × 4096, 512 MB: 21 GB/s of `B`, where the M = 1 product streams
    /// the same weight at 29 GB/s). The prefetch: without it 0.92 of the time at 64 MB, but
    /// 1.2× at 180 and 512 MB; 128 rows ahead into L1, or 512 and 1024 rows ahead into L2,
    /// were level with 256 (the pass length then) at 512 MB. (Those figures are from tiles of
    /// two strips, passes of 256 rows and `A` read in place; see [`STRIP_PASS`] for the
    /// passes now.)
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const W: usize, const PACKED: bool, T: Lanes16>(
        a: &[f32],
        lda: usize,
        strips: &[T],
        k: usize,
        q0: usize,
        kb: usize,
        c: &mut [f32],
        ldc: usize,
        prefetch: bool,
    ) {
        assert!(
            kb > 0
                && q0 + kb <= k
                && (if PACKED { kb * R } else { (R - 1) * lda + kb }) <= a.len()
                && W * k * STRIP <= strips.len()
                && (R - 1) * ldc + W * STRIP <= c.len(),
            "register tile past its operands"
        );
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX-512F; the
        // assert bounds every access: A's rows i < R at q < kb, the strips' rows q0..q0 + kb,
        // c's rows i < R at 16·W columns. The prefetch address is only computed (wrapping) and
        // prefetched, which never faults.
        unsafe {
            let (ap, cp) = (a.as_ptr(), c.as_mut_ptr());
            let bp: [*const T; W] = std::array::from_fn(|w| strips.as_ptr().add((w * k + q0) * STRIP));
            let mut sum = [[_mm512_setzero_ps(); W]; R];
            for (i, row) in sum.iter_mut().enumerate() {
                for (w, v) in row.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(cp.add(i * ldc + w * STRIP));
                }
            }
            for q in 0..kb {
                let bv: [__m512; W] = std::array::from_fn(|w| T::load16(bp[w].add(q * STRIP)));
                if prefetch {
                    for b in bp {
                        _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add((q + STRIP_AHEAD) * STRIP) as *const i8);
                    }
                }
                for (i, row) in sum.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(if PACKED { q * R + i } else { i * lda + q }));
                    for (v, b) in row.iter_mut().zip(&bv) {
                        *v = _mm512_fmadd_ps(av, *b, *v);
                    }
                }
            }
            for (i, row) in sum.iter().enumerate() {
                for (w, v) in row.iter().enumerate() {
                    _mm512_storeu_ps(cp.add(i * ldc + w * STRIP), *v);
                }
            }
        }
    }
}

/// Columns `jj..jj + C` of the block over the chunk at `q0` (`kl` long), for every row group.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_cols<const FMA: bool, const C: usize>(
    p: &Block,
    j0: usize,
    jj: usize,
    nb: usize,
    q0: usize,
    kl: usize,
    part: &mut [[f32; DOT_LANES]],
) {
    let b = &p.b[(j0 + jj) * p.ldb + q0..];
    // The next tile's rows of B in this chunk, prefetched into L2 by the first row group (the
    // others read this tile's rows from L1): the tile's runs are one to four pages long, too
    // short for the hardware prefetchers to get going. On a 2-core AVX-512 Xeon (in-process A/B
    // alternated per round, 2 threads, 4096 × 4096, chunks of 1024) M = 1, 4 and 8 took 0.67,
    // 0.57–0.64 and 0.75 of the time without it; into L1, 0.67, 0.62 and 0.84; the same rows'
    // next chunk instead, 0.75–0.80.
    let next = b.as_ptr().wrapping_add(C * p.ldb);
    tile_groups::<FMA, C>(p, b, p.ldb, next, jj, nb, q0, kl, part);
}

/// The tile of `C` rows of `B` whose chunk starts at `b` (rows `ldb` apart, `kl` long; the
/// chunk at `q0` along `K`) against every row group of `A`, into the partial sums of columns
/// `jj..jj + C`; the first group prefetches `next` (null: none).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile_groups<const FMA: bool, const C: usize>(
    p: &Block,
    b: &[f32],
    ldb: usize,
    next: *const f32,
    jj: usize,
    nb: usize,
    q0: usize,
    kl: usize,
    part: &mut [[f32; DOT_LANES]],
) {
    let (m, full) = (p.m, p.k - p.k % DOT_LANES);
    for g0 in (0..m).step_by(GROUP) {
        let r = GROUP.min(m - g0);
        // The group's packed steps start at g0 · full; its chunk at q0 · r further on.
        let ap = &p.apack[g0 * full + q0 * r..];
        let part = &mut part[g0 * nb + jj..];
        let next = if g0 == 0 { next } else { std::ptr::null() };
        match r {
            4 => chunk_tile::<FMA, 4, C>(ap, b, ldb, kl, part, nb, next),
            3 => chunk_tile::<FMA, 3, C>(ap, b, ldb, kl, part, nb, next),
            2 => chunk_tile::<FMA, 2, C>(ap, b, ldb, kl, part, nb, next),
            _ => chunk_tile::<FMA, 1, C>(ap, b, ldb, kl, part, nb, next),
        }
    }
}

/// `K` per chunk of [`cols_half_inner`]: a tile's widened chunk (at most 4 rows, 16 KiB) stays
/// in L1 while the row groups of `A` pass over it.
const HALF_KC: usize = 1024;

/// [`cols_inner`] with `B` in half precision (`h`, row `j` of the block from `b0 + (j0 + j) ·
/// ldb`): each tile's chunk of `B` is widened into an L1 buffer just before the row groups of
/// `A` meet it, and the tail along `K` from a widened copy. The same tiles and partial sums
/// over the widened values (the chunks of [`HALF_KC`] only cut each lane's sum, in `K` order,
/// into pieces): the same bits as [`cols_inner`] with `B` widened first.
///
/// In f16, the AVX2 copy forced on the 2-core AVX-512 Xeon (2 threads, separate processes
/// alternated twice): 1 × 4096 × 4096 in 1.25 ms, 1 × 11008 × 4096 in 3.5–3.7, 16 × 4096 ×
/// 4096 in 4.5–4.6, against 2.1–2.2, 5.7–6.0 and 6.2–6.3 with each column block's 64 rows
/// widened whole into a 1 MiB buffer first (f32 `B`: 1.34 ms at 4096²).
#[inline(always)]
fn cols_half_inner<const FMA: bool>(p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) {
    let (m, k, ldb) = (p.m, p.k, p.ldb);
    let full = k - k % DOT_LANES;
    let mut part = [[0.0f32; DOT_LANES]; 16 * NB_COLS];
    let part = &mut part[..m * nb];
    let mut buf = [0.0f32; 4 * HALF_KC];
    let row = |j: usize| b0 + (j0 + j) * ldb;
    let mut q0 = 0;
    while q0 < full {
        let kl = HALF_KC.min(full - q0);
        let mut jj = 0;
        while jj < nb {
            let c = if m <= 2 && jj + 4 <= nb {
                4
            } else if jj + 3 <= nb {
                3
            } else {
                1
            };
            for (j, dst) in buf.chunks_exact_mut(HALF_KC).take(c).enumerate() {
                h.widen_range(row(jj + j) + q0, &mut dst[..kl]);
            }
            let null = std::ptr::null();
            match c {
                4 => tile_groups::<FMA, 4>(p, &buf, HALF_KC, null, jj, nb, q0, kl, part),
                3 => tile_groups::<FMA, 3>(p, &buf, HALF_KC, null, jj, nb, q0, kl, part),
                _ => tile_groups::<FMA, 1>(p, &buf, HALF_KC, null, jj, nb, q0, kl, part),
            }
            jj += c;
        }
        q0 += kl;
    }
    let mut tail = [0.0f32; DOT_LANES];
    for j in 0..nb {
        let tail = &mut tail[..k - full];
        h.widen_range(row(j) + full, tail);
        for i in 0..m {
            let ar = &p.a[i * p.lda..];
            let mut t = pairwise_sum(part[i * nb + j]);
            for (q, &bq) in (full..k).zip(tail.iter()) {
                t = madd::<FMA>(ar[q], bq, t);
            }
            acc[i * nb + j] = t;
        }
    }
}

multiversion! {
    fn cols_block_half(p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) => cols_half_inner
}

/// `acc[i][0..nb] = A[i] · B[j0 + ..]` for `B` stored `N × K`, K chunk by K chunk. Within a
/// chunk each tile of 3 rows of `B` (4 with at most 2 rows of `A`) meets every row group of
/// `A` back to back: its chunk of `B`, read from memory in runs of a page or more by the first
/// group, is in L1 for the others, and the rows of `B` are visited in storage order, so `B`
/// streams from memory once. `A` (packed, at most 16 rows) stays in L2. The 8-lane partial sums
/// carry from chunk to chunk in `part`; they are summed pairwise at the end, then the K tail.
#[inline(always)]
fn cols_inner<const FMA: bool>(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
    let (m, k) = (p.m, p.k);
    let full = k - k % DOT_LANES;
    let mut part = [[0.0f32; DOT_LANES]; 16 * NB_COLS];
    let part = &mut part[..m * nb];
    let wide = m <= 2;
    let kc = kc(m);
    let mut q0 = 0;
    while q0 < full {
        let kl = kc.min(full - q0);
        let mut jj = 0;
        if wide {
            while jj + 4 <= nb {
                chunk_cols::<FMA, 4>(p, j0, jj, nb, q0, kl, part);
                jj += 4;
            }
        }
        while jj + 3 <= nb {
            chunk_cols::<FMA, 3>(p, j0, jj, nb, q0, kl, part);
            jj += 3;
        }
        while jj < nb {
            chunk_cols::<FMA, 1>(p, j0, jj, nb, q0, kl, part);
            jj += 1;
        }
        q0 += kl;
    }
    for i in 0..m {
        for j in 0..nb {
            let (ar, br) = (&p.a[i * p.lda..], &p.b[(j0 + j) * p.ldb..]);
            let mut t = pairwise_sum(part[i * nb + j]);
            for q in full..k {
                t = madd::<FMA>(ar[q], br[q], t);
            }
            acc[i * nb + j] = t;
        }
    }
}

multiversion! {
    fn cols_block(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) => cols_inner
}

/// Rows of `A` from which `B` stored `N × K` takes [`avx512::cols_bcast`] (up to 16; a
/// half-precision `B`, [`avx512::cols_bcast_half`]) in place of the dot products ([`avx512::cols_dot`]). On a 2-core Zen 4 (2 threads,
/// separate processes alternated three times, `B` 4096 × 4096), against the dot products: 16
/// rows 2.98 ms against 3.53, 15 rows 2.80 against 3.28, 14 rows 2.82 against 3.14, 13 rows
/// 2.77 against 2.97, but 12 rows 2.97 against 2.74 and 8 rows 2.83 against 2.26 (the
/// broadcast kernel's time hardly depends on the rows: its 16 lanes are rows of `A`, zero past
/// `m`); 16 × 11008 × 4096 8.0 against 9.4, 16 × 4096 × 11008 8.2 against 10.3 (f32).
const BCAST_MIN_M: usize = 13;

/// Whether `B` stored `N × K` takes [`avx512::cols_bcast`] (or [`avx512::cols_bcast_half`])
/// at `m` rows.
fn nk_bcast(isa: Isa, m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512 && (BCAST_MIN_M..=LANES).contains(&m);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, m);
        false
    }
}

/// `Aᵀ` for [`avx512::cols_bcast`]: `K` steps of [`LANES`] values, step `q` holding column `q`
/// of `A`'s `m` rows (zero past them).
fn pack_lanes(a: &[f32], lda: usize, m: usize, k: usize) -> Result<Vec<f32>> {
    let mut out = scratch(k * LANES)?;
    for i in 0..m {
        for (q, &v) in a[i * lda..][..k].iter().enumerate() {
            out[q * LANES + i] = v;
        }
    }
    Ok(out)
}

/// Whether `B` stored `N × K` takes [`avx512::cols_dot`] at `m` rows (where [`nk_bcast`] does
/// not take them): on AVX-512, up to [`SKINNY_M`](super::matmul::SKINNY_M) rows (from 32 the
/// panels were faster; at 16 the transposed panels took 1.4–1.7× the dot products' time on a
/// 2-core Zen 4).
fn nk_dot(isa: Isa, m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512 && m <= super::matmul::SKINNY_M;
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, m);
        false
    }
}

/// Whether `B` stored `N × K` (rows `ldb` apart) takes [`avx512::cols_panels`] at `m` rows:
/// on AVX-512 above [`SKINNY_M`](super::matmul::SKINNY_M) rows (the mid-sized products of
/// [`PANELS_KN_M`](super::matmul::PANELS_KN_M) rows at most; up to 16 [`nk_dot`] takes them).
/// In alternated runs on a 2-core AVX-512 Xeon (medians, ms), against `gemm`: 32, 64 and 96 ×
/// 4096 × 4096 6.9–8.6, 13–20 and 16.5–19 against 14.6–19.4, 17–39 and 26–27.7 (with the
/// panels gathered; there the 16 × 16 transposes that build them now were level or slower).
/// On a 2-core Zen 4, where a 16-lane gather took about 21 cycles, the gathers took 59% of
/// 32 × 4096 × 4096 on one thread; with the transposes it took 0.68 of the time on one thread
/// and 0.66 on two, 64 × 4096 × 4096 0.76, 24 × 4096 × 11008 0.78 (separate processes
/// alternated, the same sums).
pub(super) fn nk_panels(isa: Isa, m: usize, ldb: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512 && m > super::matmul::SKINNY_M && ldb < 1 << 27;
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, m, ldb);
        false
    }
}

#[cfg(test)]
thread_local! {
    /// Set by [`without_direct`] on the calling thread.
    static NO_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the direct kernel left out (tests: so the `K × N` panels' edges are reached
/// from 14 rows on AVX-512 too).
#[cfg(test)]
pub(super) fn without_direct(f: impl FnOnce()) {
    NO_DIRECT.set(true);
    f();
    NO_DIRECT.set(false);
}

/// Whether `m` rows with `B` stored `K × N` take [`avx512::rows_direct`] in `isa`.
fn direct_kn(isa: Isa, m: usize) -> bool {
    #[cfg(test)]
    if NO_DIRECT.get() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Avx512 && avx512::DIRECT_M.contains(&m);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, m);
        false
    }
}

/// Whether a half-precision `B` stored `K × N` takes [`avx512::rows_direct_half`] in `isa`
/// (AVX-512, any skinny `M`).
fn direct_half(isa: Isa) -> bool {
    #[cfg(test)]
    if NO_DIRECT.get() {
        return false;
    }
    cfg!(target_arch = "x86_64") && isa == Isa::Avx512
}

/// One column block of the skinny product in `isa`: [`rows_block`] for `B` stored `K × N`
/// (on AVX-512 the direct kernel where [`Block::direct`]), [`cols_block`] for `N × K`, or on
/// AVX-512 its dot products ([`nk_dot`]) or panels ([`nk_panels`]). An AVX-512 version of
/// [`cols_block`]'s own tile (two rows of a group per `zmm`, 8 lanes of `K` each) was level
/// with the AVX2 tile at 16 × 4096 × 4096; the 16-lane dot tile with its own chunk order and
/// prefetch is what gained.
fn skinny_block(isa: Isa, p: &Block, by_rows: bool, j0: usize, nb: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if by_rows && p.direct {
        // SAFETY: `direct_kn` is only true for `Isa::Avx512`, which is only made where the CPU
        // reported AVX-512F.
        unsafe { avx512::rows_direct(p, j0, nb, acc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !by_rows && p.bcast {
        // SAFETY: `nk_bcast` is only true for `Isa::Avx512`, which is only made where the CPU
        // reported AVX-512F.
        unsafe { avx512::cols_bcast(p, j0, nb, acc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !by_rows && nk_dot(isa, p.m) {
        // SAFETY: `nk_dot` is only true for `Isa::Avx512`, which is only made where the CPU
        // reported AVX-512F.
        unsafe { avx512::cols_dot(p, j0, nb, acc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !by_rows && nk_panels(isa, p.m, p.ldb) {
        // SAFETY: `Isa::Avx512` is only made where the CPU reported AVX-512F.
        unsafe { avx512::cols_panels(p, j0, nb, acc) };
        return;
    }
    if by_rows {
        rows_block(isa, p, j0, nb, acc);
    } else {
        cols_block(isa, p, j0, nb, acc);
    }
}

/// `A` for [`avx512::cols_dot`] (`B` stored `N × K`), with its rows copied [`UNALIAS`]
/// elements further apart where they are a multiple of 512 elements (2 KiB) apart and there are
/// more than two groups of 4 rows (`avx512::DOT_A`); else as it is. Rows a multiple of 4 KiB
/// apart, as LLaMA's `K` = 4096 makes them, all fall in the same L1 sets at each chunk of `K`
/// (the set is picked by the address modulo 4 KiB), and so do the tile's rows of `B`, which are
/// as far apart: a row group's 4 rows of `A` and the tile's 6 rows of `B` are 10 lines per set
/// for the 8 ways of an AMD Zen 4's L1, and the rows of `B` that the next row groups reread are
/// evicted. 1 KiB further apart, 4 consecutive rows of `A` fall in 4 different quarters of the
/// sets. On a 2-core Zen 4 (separate processes alternated, the same sums), 16 × 4096 × 4096
/// took 0.91–0.95 of the time on one thread (7.7–8.2 ms against 8.4–8.6) and 0.86–0.98 on two,
/// 16 × 11008 × 4096 0.89–0.95 on two; 8 rows were level (0.86–1.05), so the copy starts at 9.
/// 16 × 4096 × 11008 (rows 44032 bytes apart, already spread over the four quarters) is left
/// alone.
fn unalias_rows(a: Cow<'_, [f32]>, lda: usize, m: usize, k: usize) -> Result<(Cow<'_, [f32]>, usize)> {
    if m <= 8 || !lda.is_multiple_of(512) {
        return Ok((a, lda));
    }
    let ld = lda + UNALIAS;
    let mut rows = scratch(m * ld)?;
    for (dst, src) in rows.chunks_exact_mut(ld).zip(a.chunks(lda)) {
        dst[..k].copy_from_slice(&src[..k]);
    }
    Ok((Cow::Owned(rows), ld))
}

/// How much further apart [`unalias_rows`] puts rows of `A` that are a multiple of 512
/// elements apart: 256 (1 KiB), so that consecutive rows start 1 or 3 quarters of the L1 sets
/// on from each other.
const UNALIAS: usize = 256;

impl MatmulOperands<'_> {
    /// `op(A)` of one batch as dense rows and their stride: in place when its columns are
    /// contiguous, copied otherwise.
    fn dense_a(&self, g: Geometry, m: usize, k: usize) -> Result<(Cow<'_, [f32]>, usize)> {
        if g.a_cs == 1 {
            return Ok((Cow::Borrowed(&self.a[g.a0..]), g.a_rs));
        }
        let mut packed = scratch(m * k)?;
        for i in 0..m {
            for (q, v) in packed[i * k..][..k].iter_mut().enumerate() {
                *v = self.a[g.a0 + i * g.a_rs + q * g.a_cs];
            }
        }
        Ok((Cow::Owned(packed), k))
    }

    /// The skinny product of one batch into `dst` (its output region, rows `row_step` apart).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn skinny<E: Elem>(
        &self,
        isa: Isa,
        desc: &MatmulDesc,
        g: Geometry,
        epi: &Epilogue,
        may_split: bool,
        row_step: usize,
        dst: &mut [E],
    ) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let (a, lda) = self.dense_a(g, m, k)?;
        let by_rows = g.b_cs == 1;
        let bcast = !by_rows && nk_bcast(isa, m);
        let (a, lda) = if !by_rows && !bcast && nk_dot(isa, m) { unalias_rows(a, lda, m, k)? } else { (a, lda) };
        let ldb = if by_rows { g.b_rs } else { g.b_cs };
        let apack = if bcast {
            pack_lanes(&a, lda, m, k)?
        } else if by_rows || nk_dot(isa, m) || nk_panels(isa, m, ldb) {
            Vec::new()
        } else {
            pack_groups(&a, lda, m, k)?
        };
        let b = if self.b_half.is_some() { &[][..] } else { &self.b[g.b0..] };
        let block = Block {
            a: &a,
            lda,
            apack: &apack,
            b,
            ldb,
            m,
            k,
            direct: by_rows && direct_kn(isa, m),
            bcast,
            carry: false,
        };
        // Column blocks: with B stored K × N as wide as the accumulators allow (long contiguous
        // runs of each row of B for the prefetchers), in the fewest equal blocks that are a
        // multiple of the thread count (two per thread where one would do made the runs half
        // as long and the decode rows' medians 5–20% longer; the widest blocks and a short
        // last one, 4096 + 4096 + 2816 at M = 16, N = 11008 on 2 threads, left one thread
        // 6912 columns against 5504 each, and took 7% more time in an in-process A/B). The
        // blocks are taken dynamically, so a late thread's block is taken by whichever
        // finishes first.
        let threads = rayon::current_num_threads().max(1);
        let nb_max = if by_rows {
            let widest = (ACC / m) / LANES * LANES;
            let blocks = threads * n.div_ceil(threads * widest.max(LANES));
            n.div_ceil(blocks).next_multiple_of(LANES).max(LANES)
        } else {
            NB_COLS
        };
        // Computes block `bi` and hands each of its rows to `store(row, first column, values)`.
        let run = |bi: usize, store: &mut dyn FnMut(usize, usize, &[f32])| {
            let j0 = bi * nb_max;
            let nb = nb_max.min(n - j0);
            ACC_BUF.with_borrow_mut(|buf| {
                if buf.len() < m * nb {
                    buf.resize(m * nb, 0.0);
                }
                let acc = &mut buf[..m * nb];
                // A half-precision B is widened chunk by chunk as the tiles reach it
                // (`cols_dot_half`, `cols_block_half`; stored K × N, a group of the block's rows
                // at a time below): read once, at 2 bytes an element. Widened whole before the
                // product it was read at 2 bytes, written at 4 and read again at 4; into a new
                // buffer each call, 4096 × 4096 in f16 took 32–40 ms at M = 1, most of it the
                // first touch of 64 MB of new pages.
                match &self.b_half {
                    Some(h) if by_rows => half_kn(isa, &block, h, g.b0, j0, nb, acc),
                    // SAFETY: `nk_bcast` and `nk_dot` are only true for `Isa::Avx512`, which is
                    // only made where the CPU reported AVX-512F and F16C.
                    #[cfg(target_arch = "x86_64")]
                    Some(h) if bcast => unsafe { avx512::cols_bcast_half(&block, h, g.b0, j0, nb, acc) },
                    // SAFETY: as above.
                    #[cfg(target_arch = "x86_64")]
                    Some(h) if nk_dot(isa, m) => unsafe { avx512::cols_dot_half(&block, h, g.b0, j0, nb, acc) },
                    Some(h) => cols_block_half(isa, &block, h, g.b0, j0, nb, acc),
                    None => skinny_block(isa, &block, by_rows, j0, nb, acc),
                }
                epilogue_rows(isa, epi, 0, j0, nb, acc);
                for (i, src) in acc.chunks(nb).enumerate() {
                    store(i, j0, src);
                }
            })
        };
        let blocks = n.div_ceil(nb_max);
        run_tasks(blocks, may_split && m * n * k >= PARALLEL_MIN, row_step, dst, &run);
        Ok(())
    }
}

/// `acc = A · B[.., j0..j0 + nb]` for a half-precision `B` stored `K × N` (its first element at
/// `b0`): on AVX-512 the direct kernel converting `B` as it loads it
/// ([`avx512::rows_direct_half`]), for whole strips; elsewhere, and for the last `nb mod 16`
/// columns, [`half_kn_groups`]. On AVX-512, against [`half_kn_groups`] (f16, 2 threads,
/// separate processes alternated twice): 1 × 4096 × 4096 0.71–0.77 ms against 1.6–1.8, 16 ×
/// 4096 × 4096 3.0 against 4.2, 4 × 4096 × 4096 0.96 against 2.7, 16 × 4096 × 11008 8.0
/// against 11.3–11.9.
fn half_kn(isa: Isa, p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) {
    let full = if direct_half(isa) { nb - nb % STRIP } else { 0 };
    if full == 0 {
        return half_kn_groups(isa, p, h, b0, j0, nb, acc);
    }
    // SAFETY: `Isa::Avx512` is only made where the CPU reported AVX-512F and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        avx512::rows_direct_half(p, h, b0, j0, full, nb, acc)
    };
    if full < nb {
        let (m, w) = (p.m, nb - full);
        let mut rest = [0.0f32; super::matmul::SKINNY_M * STRIP];
        half_kn_groups(isa, p, h, b0, j0 + full, w, &mut rest[..m * w]);
        for (i, r) in rest[..m * w].chunks_exact(w).enumerate() {
            acc[i * nb + full..][..w].copy_from_slice(r);
        }
    }
}

/// `acc = A · B[.., j0..j0 + nb]` for a half-precision `B` stored `K × N` (its first element at
/// `b0`), by groups of rows: each group's columns widened into a per-thread buffer
/// ([`HALF_KN_FLOATS`]), then the `K × N` kernel of `isa` on them, the sums carried from one
/// group to the next ([`Block::carry`]).
fn half_kn_groups(isa: Isa, p: &Block, h: &Halves, b0: usize, j0: usize, nb: usize, acc: &mut [f32]) {
    let k = p.k;
    let kc = (HALF_KN_FLOATS / nb / HALF_KN_STEP * HALF_KN_STEP).max(HALF_KN_STEP);
    HALF_KN_BUF.with_borrow_mut(|wide| {
        if wide.len() < kc * nb {
            wide.resize(kc * nb, 0.0);
        }
        for q0 in (0..k).step_by(kc) {
            let kb = kc.min(k - q0);
            let wide = &mut wide[..kb * nb];
            h.widen_rows(b0 + q0 * p.ldb + j0, p.ldb, nb, wide);
            let wide: &[f32] = wide;
            let rows = Block { a: &p.a[q0..], b: wide, ldb: nb, k: kb, carry: q0 > 0, ..*p };
            skinny_block(isa, &rows, true, 0, nb, acc);
        }
    });
}

/// The most f32 of a half-precision `B` stored `K × N` widened at a time in the skinny product
/// (256 KiB): a group of a column block's rows, a multiple of [`HALF_KN_STEP`] of them (at least
/// one), whose sums the next group carries on. Against the whole of `B` widened first (into a
/// new buffer: 180 MB at 4096 × 11008), in f16 (2 threads, the 2-core AVX-512 Xeon, separate
/// processes alternated twice): 1 × 4096 × 4096 1.6–1.8 ms against 3.6–5.0, 1 × 11008 × 4096
/// 4.4–4.8 against 27–34, 1 × 4096 × 11008 4.4–5.0 against 30–40, 16 × 4096 × 4096 4.0–4.8
/// against 5.4–6.7, 16 × 4096 × 11008 10.5–12.6 against 29–44. 1 MiB was level with 256 KiB.
/// Blocks of all of `K` and as few columns as fit were slower at `K` = 11008 than `B` widened
/// whole (16 columns: 128 scattered bytes from each row of `B`).
const HALF_KN_FLOATS: usize = 1 << 16;

/// Rows of `B` per widening of a half-precision `B` stored `K × N` come in multiples of this:
/// the direct kernel's passes.
const HALF_KN_STEP: usize = 32;

thread_local! {
    /// This thread's widened column block of a half-precision `B` stored `K × N`.
    static HALF_KN_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most strips per widening of a half-precision weight packed in strips (without AVX-512,
/// which converts it as it loads it: [`avx512::strips_half`]): four, the
/// one-row tile's width, while they fit in [`HALF_STRIP_FLOATS`] (at K = 4096, 1 MiB of f32);
/// fewer for a longer `K`. One strip of 11008 rows is 704 KiB; four, 2.8 MiB, outgrew L2: at
/// 1 × 4096 × 11008 in f16 one strip at a time took 5.8–6.6 ms against 9.5–9.7 with four, and
/// 10.5–10.9 against 13.0–13.3 at M = 16 (alternated twice; f32: 3.7 ms at M = 1, where the
/// one-row tile takes four strips side by side). Against the weight widened whole (into a recycled
/// buffer) first, in f16 (2 threads, the 2-core AVX-512 Xeon, separate processes alternated
/// twice): 1 × 1000 × 1280 (MobileNetV2's classifier) 0.10–0.12 ms against 0.30, 1 × 4096 ×
/// 4096 1.75–1.79 against 4.3–4.5, 16 × 4096 × 4096 3.2 against 5.8, 64 × 1024 × 1024 0.50
/// against 0.64 (f32: 0.08, 1.26–1.32, 2.33–2.36, 0.46).
const HALF_STRIPS: usize = 4;

/// The most f32 of widened strips at a time (1 MiB: half of this machine's L2).
const HALF_STRIP_FLOATS: usize = 1 << 18;

thread_local! {
    /// This thread's widened strips of a half-precision packed weight ([`HALF_STRIPS`] · K · 16
    /// floats, made on its first such product).
    static HALF_STRIP_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The strip kernel of `isa`: [`avx512::strips`] on AVX-512, else [`strips_block`].
fn strips_any(isa: Isa, p: &Block, s0: usize, ns: usize, acc: &mut [f32], ldc: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is only made where the CPU reported AVX-512F.
        unsafe { avx512::strips(p, s0, ns, acc, ldc) };
        return;
    }
    strips_block(isa, p, s0, ns, acc, ldc);
}

impl MatmulOperands<'_> {
    /// The product of one batch with `B` packed in strips ([`crate::PackedMatmul`]) into `dst`
    /// (its output region, rows `row_step` apart), for any `M`: the output is cut into tasks
    /// of up to [`STRIP_ROWS`] rows × a block of columns (the rows' accumulators at most
    /// [`ACC`], equal blocks, at least as many tasks as threads where `N` has the strips); each
    /// task streams its strips once ([`strips_block`], or the AVX-512 tiles), then applies the
    /// epilogue to its block while it is in L1/L2.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn strips_product<E: Elem>(
        &self,
        isa: Isa,
        desc: &MatmulDesc,
        g: Geometry,
        epi: &Epilogue,
        may_split: bool,
        row_step: usize,
        dst: &mut [E],
    ) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let (a, lda) = self.dense_a(g, m, k)?;
        let row_tasks = m.div_ceil(STRIP_ROWS);
        let rows = m.div_ceil(row_tasks);
        let threads = rayon::current_num_threads().max(1);
        let widest = (ACC / rows) / STRIP * STRIP;
        let want = threads.div_ceil(row_tasks);
        let blocks = want * n.div_ceil(want * widest);
        let nb_max = n.div_ceil(blocks).next_multiple_of(STRIP);
        let blocks = n.div_ceil(nb_max);
        // Computes task `t` and hands each of its rows to `store(row, first column, values)`.
        let run = |t: usize, store: &mut dyn FnMut(usize, usize, &[f32])| {
            let (i0, j0) = (t / blocks * rows, t % blocks * nb_max);
            let (r, nb) = (rows.min(m - i0), nb_max.min(n - j0));
            // The last block's last strip is zero-padded: its accumulators are 16 wide.
            let ldc = nb.next_multiple_of(STRIP);
            let block = Block {
                a: &a[i0 * lda..],
                lda,
                apack: &[],
                b: &self.b,
                ldb: STRIP,
                m: r,
                k,
                direct: false,
                bcast: false,
                carry: false,
            };
            ACC_BUF.with_borrow_mut(|buf| {
                if buf.len() < r * ldc {
                    buf.resize(r * ldc, 0.0);
                }
                let acc = &mut buf[..r * ldc];
                acc.fill(0.0);
                let (s0, ns) = (j0 / STRIP, ldc / STRIP);
                match &self.b_half {
                    // A half-precision weight on AVX-512: converted as the tiles load it.
                    // SAFETY: `Isa::Avx512` is only made where the CPU reported AVX-512F and F16C.
                    #[cfg(target_arch = "x86_64")]
                    Some(h) if isa == Isa::Avx512 => unsafe { avx512::strips_half(&block, h, s0, ns, acc, ldc) },
                    // Elsewhere [`HALF_STRIPS`] strips at a time widened into the thread's buffer
                    // (consecutive strips are one run of `B`), each group's columns computed from
                    // there.
                    Some(h) => HALF_STRIP_BUF.with_borrow_mut(|wide| {
                        let per = (HALF_STRIP_FLOATS / (k * STRIP)).clamp(1, HALF_STRIPS);
                        if wide.len() < per * k * STRIP {
                            wide.resize(per * k * STRIP, 0.0);
                        }
                        for g0 in (0..ns).step_by(per) {
                            let g = per.min(ns - g0);
                            let wide = &mut wide[..g * k * STRIP];
                            h.widen_range((s0 + g0) * k * STRIP, wide);
                            let group = Block { b: wide, ..block };
                            strips_any(isa, &group, 0, g, &mut acc[g0 * STRIP..], ldc);
                        }
                    }),
                    None => strips_any(isa, &block, s0, ns, acc, ldc),
                }
                for (i, row) in acc.chunks_mut(ldc).enumerate() {
                    let row = &mut row[..nb];
                    epilogue_rows(isa, epi, i0 + i, j0, nb, row);
                    store(i0 + i, j0, row);
                }
            })
        };
        run_tasks(row_tasks * blocks, may_split && m * n * k >= PARALLEL_MIN, row_step, dst, &run);
        Ok(())
    }
}

/// Runs tasks `0..tasks`, in parallel when `parallel` and there is more than one. Task `t`
/// computes one block of the output and hands each of its rows to `store(row, first column,
/// values)`, which rounds them into `dst` (rows `row_step` apart). The tasks' blocks must not
/// overlap (each writes its own columns of its own rows).
fn run_tasks<E: Elem, F>(tasks: usize, parallel: bool, row_step: usize, dst: &mut [E], run: &F)
where
    F: Fn(usize, &mut dyn FnMut(usize, usize, &[f32])) + Sync,
{
    if parallel && tasks > 1 {
        // The rows are shared between tasks: they get a raw pointer and build a slice over
        // just their own columns.
        let ptr = SendPtr(dst.as_mut_ptr());
        let len = dst.len();
        for_each_index(tasks, &|t| {
            let p = &ptr;
            run(t, &mut |i, j0, src| {
                let start = i * row_step + j0;
                assert!(start + src.len() <= len, "a task's block past the output region");
                // SAFETY: `dst` is exclusively borrowed for this whole call and outlives the
                // tasks; `start..start + len` is inside it (asserted), and it is the columns of
                // row i that only task `t` writes: the slices made by different tasks never
                // overlap.
                let seg = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), src.len()) };
                E::narrow_into(src, seg);
            });
        });
    } else {
        for t in 0..tasks {
            run(t, &mut |i, j0, src| E::narrow_into(src, &mut dst[i * row_step + j0..][..src.len()]));
        }
    }
}

/// A raw pointer handed to the tasks of one skinny product (see the SAFETY note at its use).
struct SendPtr<E>(*mut E);
// SAFETY: the pointer is only used to write disjoint column segments, one block per task.
unsafe impl<E: Send> Sync for SendPtr<E> {}
// SAFETY: as above.
unsafe impl<E: Send> Send for SendPtr<E> {}
