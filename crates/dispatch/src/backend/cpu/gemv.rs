//! The skinny matmul (`M ≤ 16`, the decode step): streams `B` once, in either layout.
//!
//! The output's columns are cut into blocks; a block's `M × width` accumulators live in a
//! stack buffer (32 KiB, L1: 512 columns at M = 16, up to 8192 at M = 1), and the blocks are split across threads when the
//! product is large enough. Each element of `B` is loaded from memory once and used for all
//! `M` rows:
//! - `B` stored `K × N` (rows of `B` are runs of output columns): four rows of `B` at a time
//!   are multiplied into two accumulator rows at a time (`acc_i += a_i,p·B_p + … +
//!   a_i,p+3·B_p+3`), so each load and store of an accumulator carries four fused multiply-adds
//!   and each load of `B` from L1 serves two rows;
//! - `B` stored `N × K` (each output column is a dot product with a contiguous row of `B`):
//!   register tiles of 4 rows of `A` × 2 rows of `B` (2 × 4 and 1 × 4 for the last rows), eight 8-lane accumulators that stay in
//!   registers over the whole of `K` (6 loads per 8 vector multiply-adds), summed pairwise at
//!   the end. A pair of rows of `B` is read from memory once and from cache by the other row
//!   groups of `A` right after.
//!
//! The epilogue runs on each block right after it is computed, then the block is rounded into
//! the output.

use super::matmul::{Epilogue, Geometry, MatmulOperands, epilogue_rows};
use super::simd::{Isa, madd, multiversion};
use super::{Elem, scratch};
use crate::Result;
use rayon::prelude::*;
use std::borrow::Cow;
use tilekit_kernels::MatmulDesc;

/// f32 accumulators per column block (32 KiB, L1): 512 columns at M = 16, 8192 at M = 1.
const ACC: usize = 8192;

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
    /// `B` from this batch's first element.
    b: &'a [f32],
    /// Elements between consecutive stored rows of `B`.
    ldb: usize,
    m: usize,
    k: usize,
}

/// `acc[i][0..nb] = Σ_p a[i][p] · B[p][j0 + ..]` for `B` stored `K × N`.
#[inline(always)]
fn rows_inner<const FMA: bool>(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
    let (a, b, lda, ldb, m, k) = (p.a, p.b, p.lda, p.ldb, p.m, p.k);
    acc[..m * nb].fill(0.0);
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
const DOT_LANES: usize = 8;

/// `R × C` dot products of rows `a[i]` (stride `lda`) with rows `b[j]` (stride `ldb`) over
/// `k`: `R·C` accumulators of [`DOT_LANES`] lanes stay in registers (8 vectors at 4 × 2), so
/// each step of 8 elements costs `R + C` loads for `R·C` multiply-adds; the lanes are summed
/// pairwise at the end, then the tail.
#[inline(always)]
fn dot_tile<const FMA: bool, const R: usize, const C: usize>(
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    k: usize,
) -> [[f32; C]; R] {
    let full = k - k % DOT_LANES;
    let (a, b) = (&a[..(R - 1) * lda + k], &b[..(C - 1) * ldb + k]);
    let mut acc = [[[0.0f32; DOT_LANES]; C]; R];
    let mut q = 0;
    while q < full {
        for (i, acc) in acc.iter_mut().enumerate() {
            let ar = &a[i * lda + q..][..DOT_LANES];
            for (j, acc) in acc.iter_mut().enumerate() {
                let br = &b[j * ldb + q..][..DOT_LANES];
                for l in 0..DOT_LANES {
                    acc[l] = madd::<FMA>(ar[l], br[l], acc[l]);
                }
            }
        }
        q += DOT_LANES;
    }
    let mut out = [[0.0f32; C]; R];
    for i in 0..R {
        for j in 0..C {
            let mut v = acc[i][j];
            let mut w = DOT_LANES / 2;
            while w > 0 {
                for l in 0..w {
                    v[l] += v[l + w];
                }
                w /= 2;
            }
            let mut t = v[0];
            for q in full..k {
                t = madd::<FMA>(a[i * lda + q], b[j * ldb + q], t);
            }
            out[i][j] = t;
        }
    }
    out
}

/// Rows `i0..i0 + R` of the block's output, columns `C` at a time (then one by one).
#[inline(always)]
fn cols_rows<const FMA: bool, const R: usize, const C: usize>(
    p: &Block,
    i0: usize,
    j0: usize,
    nb: usize,
    acc: &mut [f32],
) {
    let a = &p.a[i0 * p.lda..];
    let mut jj = 0;
    while jj + C <= nb {
        let t = dot_tile::<FMA, R, C>(a, p.lda, &p.b[(j0 + jj) * p.ldb..], p.ldb, p.k);
        for (i, r) in t.iter().enumerate() {
            acc[(i0 + i) * nb + jj..][..C].copy_from_slice(r);
        }
        jj += C;
    }
    while jj < nb {
        let t = dot_tile::<FMA, R, 1>(a, p.lda, &p.b[(j0 + jj) * p.ldb..], p.ldb, p.k);
        for (i, r) in t.iter().enumerate() {
            acc[(i0 + i) * nb + jj] = r[0];
        }
        jj += 1;
    }
}

/// `acc[i][0..nb] = A[i] · B[j0 + ..]` for `B` stored `N × K`: register tiles of 4 rows of A
/// × 2 rows of B ([`dot_tile`]). The block's 64 rows of B (1 MiB at K = 4096) are read from
/// memory once; each pair of them meets the row groups of A back to back, so its later passes
/// come from L1/L2, and A (at most 16 rows) stays in L2.
#[inline(always)]
fn cols_inner<const FMA: bool>(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) {
    let m = p.m;
    let mut i0 = 0;
    while i0 + 4 <= m {
        cols_rows::<FMA, 4, 2>(p, i0, j0, nb, acc);
        i0 += 4;
    }
    // The last 1–3 rows: more columns per tile keep 6–8 independent accumulators.
    match m - i0 {
        3 => cols_rows::<FMA, 3, 2>(p, i0, j0, nb, acc),
        2 => cols_rows::<FMA, 2, 4>(p, i0, j0, nb, acc),
        1 => cols_rows::<FMA, 1, 4>(p, i0, j0, nb, acc),
        _ => {}
    }
}

multiversion! {
    fn cols_block(p: &Block, j0: usize, nb: usize, acc: &mut [f32]) => cols_inner
}

impl MatmulOperands<'_> {
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
        // op(A) as dense rows: in place when its columns are contiguous, packed otherwise.
        let a: Cow<'_, [f32]> = if g.a_cs == 1 {
            Cow::Borrowed(&self.a[g.a0..])
        } else {
            let mut packed = scratch(m * k)?;
            for i in 0..m {
                for (q, v) in packed[i * k..][..k].iter_mut().enumerate() {
                    *v = self.a[g.a0 + i * g.a_rs + q * g.a_cs];
                }
            }
            Cow::Owned(packed)
        };
        let lda = if g.a_cs == 1 { g.a_rs } else { k };
        let by_rows = g.b_cs == 1;
        let block = Block { a: &a, lda, b: &self.b[g.b0..], ldb: if by_rows { g.b_rs } else { g.b_cs }, m, k };
        // Column blocks: with B stored K × N as wide as the accumulators allow (long contiguous
        // runs of each row of B for the prefetchers), but at least two blocks per thread.
        let threads = rayon::current_num_threads().max(1);
        let nb_max = if by_rows {
            let widest = (ACC / m) / LANES * LANES;
            widest.min(n.div_ceil(2 * threads).next_multiple_of(LANES)).max(LANES)
        } else {
            NB_COLS
        };
        // Computes block `bi` and hands each of its rows to `store(row, first column, values)`.
        let run = |bi: usize, store: &mut dyn FnMut(usize, usize, &[f32])| {
            let j0 = bi * nb_max;
            let nb = nb_max.min(n - j0);
            let mut acc = [0.0f32; ACC];
            let acc = &mut acc[..m * nb];
            if by_rows {
                rows_block(isa, &block, j0, nb, acc);
            } else {
                cols_block(isa, &block, j0, nb, acc);
            }
            epilogue_rows(isa, epi, 0, j0, nb, acc);
            for (i, src) in acc.chunks(nb).enumerate() {
                store(i, j0, src);
            }
        };
        let blocks = n.div_ceil(nb_max);
        if may_split && m * n * k >= PARALLEL_MIN && blocks > 1 {
            // Each task writes only its own columns of every row, so the rows are shared: the
            // tasks get a raw pointer and build a slice over just their own columns.
            let ptr = SendPtr(dst.as_mut_ptr());
            let len = dst.len();
            (0..blocks).into_par_iter().for_each(|bi| {
                let p = &ptr;
                run(bi, &mut |i, j0, src| {
                    let start = i * row_step + j0;
                    assert!(start + src.len() <= len, "skinny block past the output region");
                    // SAFETY: `dst` is exclusively borrowed for this whole call and outlives
                    // the tasks; `start..start + len` is inside it (asserted), and it is
                    // columns j0..j0 + nb of row i, which only block `bi` writes: the slices
                    // made by different tasks never overlap.
                    let seg = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), src.len()) };
                    E::narrow_into(src, seg);
                });
            });
        } else {
            for bi in 0..blocks {
                run(bi, &mut |i, j0, src| E::narrow_into(src, &mut dst[i * row_step + j0..][..src.len()]));
            }
        }
        Ok(())
    }
}

/// A raw pointer handed to the tasks of one skinny product (see the SAFETY note at its use).
struct SendPtr<E>(*mut E);
// SAFETY: the pointer is only used to write disjoint column segments, one block per task.
unsafe impl<E: Send> Sync for SendPtr<E> {}
// SAFETY: as above.
unsafe impl<E: Send> Send for SendPtr<E> {}
