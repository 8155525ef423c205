//! Matmul on the CPU: the `gemm` crate for the product, a streaming kernel for skinny
//! products, and the fused epilogue applied to cache-resident output tiles.
//!
//! Five paths, chosen per call:
//! - **Plain f32** (f32 output, no bias, no C, `alpha = 1`, no activation): `gemm` writes
//!   straight into the output view (no scratch, no second pass). Below [`SMALL_GEMM`]
//!   multiply-adds it is one single-threaded call. Above it, with `op(B)` of at most
//!   [`SHARED_B`] elements, each thread takes one block of rows as a single-threaded call, the
//!   calling thread among them (see [`super::pool`]); a larger `B` gets one call with `gemm`'s
//!   own split, so that it is streamed from memory once.
//! - **Skinny** (`M ≤ 16`, the decode step): [`gemv`](super::gemv). It streams `B` exactly
//!   once in either layout, splits `N` across threads when there is enough work, and applies
//!   the epilogue to each block of columns while it is still in L1/L2. With `B` stored `K × N`
//!   (at least [`SHARED_B`] elements) it takes up to [`PANELS_KN_M`] rows where the CPU has
//!   AVX2 and FMA, and with `B` stored `N × K` where it has AVX-512: `gemm` is 1.2–3× slower
//!   there.
//! - **Packed `B`** (`crate::PackedMatmul`, any `M`): the strip kernel of [`gemv`](super::gemv).
//! - **Small f32 outputs with an epilogue** (at most [`CACHED_OUT`] elements, 1 MiB): as the
//!   plain path, each block of rows followed at once by the epilogue on it, in the L2 of the
//!   core that computed it (with a large `B`: one `gemm` call, then the epilogue in tasks of
//!   [`EPI_ROWS`] rows while the output is still in the cores' L2).
//! - **Everything else**: the output is cut into row panels (each `MR × N` block a few hundred
//!   KiB at most, so it stays in L2); each panel is one single-threaded `gemm` call followed
//!   at once by the epilogue (alpha, bias, beta·C, activation, rounding to the storage type)
//!   on that panel, and the panels run in parallel. The epilogue thus never makes a second
//!   pass over an output that has left the caches.
//!
//! Every `gemm` call of these paths with `B` stored `[N, K]` (`nn.Linear`'s layout), at most
//! [`ORIENT_MAX_ROWS`] rows and a large `B` computes the product with its rows contiguous and
//! transposes it into the output (`gemm` would otherwise pack all of `B` per call through a
//! transposing gather): 0.35–0.81 of the time from 97 to 256 rows, 0.31–0.52 with an epilogue.
//!
//! f32 operands are read where they are stored (no copy); f16 and bf16 operands are widened to
//! f32 first (in parallel, with `half`'s SIMD slice conversions), because `gemm`'s own f16 path
//! rounds its result to f16 before the epilogue could see the f32 sum.

use super::activation::apply_isa;
use super::pool::{for_each_chunk_mut, try_for_each_chunk_mut};
use super::simd::{Isa, madd, multiversion};
use super::transpose;
use super::{Elem, internal, scratch, scratch_f32};
use super::{F32s, Halves};
use crate::Result;
use crate::ops::MATMUL_STRIP as STRIP;
use rayon::prelude::*;
use tilekit_kernels::{Activation, MatmulDesc};

/// Below this many multiply-adds per batch, a batched matmul runs one batch per core instead of
/// letting `gemm` split each small product (whose own threading starts around this size).
const SMALL_GEMM: usize = 1 << 18;

/// Below this many multiply-adds a product's epilogue panels (and the skinny kernel's column
/// blocks) run on the calling thread.
const PARALLEL_MIN: usize = 1 << 20;

/// The largest `M` the skinny kernel takes: up to 16 rows of `A` reuse each loaded row of `B`
/// from registers and L1, which keeps it memory-bound up to here on AVX-512 hardware.
/// A strided f32 matrix for [`gemm_f32`]: element (i, j) at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(super) struct Strided<P> {
    pub(super) ptr: P,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

/// `dst = lhs · rhs` (m × k times k × n), or `dst += lhs · rhs` where `accumulate`, as one
/// call of the gemm crate on strided views (it packs both operands itself).
///
/// # Safety
/// Every element the views form for these sizes lies inside a buffer the view may read (for
/// `dst`, write), and `dst` overlaps neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    dst: Strided<*mut f32>,
    lhs: Strided<*const f32>,
    rhs: Strided<*const f32>,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    let alpha = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: the caller's contract, which is gemm's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr,
            dst.cs as isize,
            dst.rs as isize,
            accumulate,
            lhs.ptr,
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr,
            rhs.cs as isize,
            rhs.rs as isize,
            alpha,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

pub(super) const SKINNY_M: usize = 16;

/// With `B` stored `K × N` and at least [`SHARED_B`] elements, products of up to this many rows
/// take the skinny kernel's panels too (`gemv.rs`, where the CPU has AVX2 and FMA; on AVX-512
/// its direct kernel, which reads `B` in place, faster still: `gemv::avx512::DIRECT_M`) instead
/// of `gemm`: in-process A/B on two threads, `gemm` took 27, 41, 68 and 97 ms at M = 17, 32, 64
/// and 96 × 4096 × 4096 against 15, 20, 19–25 and 38 ms, and 3.6 against 1.5 ms at 64 × 1024 ×
/// 1024; at M = 128 the two were level, at 256 `gemm` was ahead, and below 2^20 elements of `B`
/// (32 × 512 × 512) level. On an AVX-512 Xeon, both with their AVX-512 kernels (best of
/// alternated runs): `gemm` 9.7, 16.5, 31.8 and 43.4 ms against 8.4, 12.5, 19.9 and 19.8 ms;
/// with the panels at 64 × 128 (medians), 128 and 256 rows still went to `gemm` (18.8 against
/// 20.6 ms, 35 against 38). With `B` stored `N × K`, on AVX-512 only (`gemv::nk_panels`),
/// the same bound: 32, 64 and 96 rows took half to two thirds of `gemm`'s time.
pub(super) const PANELS_KN_M: usize = 96;

/// Output elements of one epilogue panel (256 KiB of f32: L2-resident on any current core).
const PANEL: usize = 1 << 16;

/// f32 outputs of at most this many elements (1 MiB: within the L2 of the cores that wrote
/// them) take one multithreaded `gemm` call and then the epilogue, instead of row panels:
/// single-threaded `gemm` calls on panels of a small output each pack all of `B` again and
/// run its kernels on a few rows only (at 256³ with bias + GELU the panels ran at 0.6× of the
/// same product without an epilogue).
const CACHED_OUT: usize = 1 << 18;

/// `op(B)`s of at most this many elements (4 MiB of f32, which the last-level cache holds)
/// are multiplied by one block of rows per thread instead of one multithreaded `gemm` call:
/// each block reads all of `B`, so a larger one (a decode-sized weight) is streamed from memory
/// once per thread (32 × 4096 × 4096 ran 1.3× slower split by rows).
const SHARED_B: usize = 1 << 20;

/// Output rows per task of the epilogue after a one-call `gemm`.
const EPI_ROWS: usize = 16;

/// The most output elements of a half-precision product that [`MatmulOperands::half_out`]
/// computes into one f32 buffer (64 MiB, the largest the recycle shelf keeps); larger ones go
/// by panels.
const HALF_OUT: usize = 1 << 24;

/// A matmul's operands as f32 (borrowed where they are stored in f32).
pub(super) struct MatmulOperands<'d> {
    pub(super) a: F32s<'d>,
    /// `B` as f32 (empty where `b_half` holds it).
    pub(super) b: F32s<'d>,
    /// `B` in half precision for a skinny product (M ≤ [`SKINNY_M`], either layout) or packed in
    /// strips, which the product widens a chunk at a time.
    pub(super) b_half: Option<Halves<'d>>,
    /// The `N` bias values.
    pub(super) bias: Option<&'d [f32]>,
    /// `C`'s whole buffer.
    pub(super) c: Option<F32s<'d>>,
    /// `B` is packed in strips (`[⌈N/16⌉, K, 16]`, `crate::PackedMatmul`); `desc.b` and
    /// `desc.trans_b` are then unused.
    pub(super) strips: bool,
}

/// The epilogue of one batch: `act(alpha·acc + bias + beta·C)`.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    alpha: f32,
    bias: Option<&'a [f32]>,
    /// `C`'s buffer and its view, with `beta`.
    c: Option<(&'a [f32], tilekit_kernels::MatrixView, f32)>,
    activation: Activation,
    batch: usize,
}

impl<'a> Epilogue<'a> {
    /// The epilogue of batch `batch` (`c` is C's buffer, its view and `beta`).
    pub(super) fn new(
        alpha: f32,
        bias: Option<&'a [f32]>,
        c: Option<(&'a [f32], tilekit_kernels::MatrixView, f32)>,
        activation: Activation,
        batch: usize,
    ) -> Epilogue<'a> {
        Epilogue { alpha, bias, c, activation, batch }
    }

    /// Whether the epilogue leaves the product as it is.
    fn is_identity(&self) -> bool {
        self.alpha == 1.0 && self.bias.is_none() && self.c.is_none() && self.activation == Activation::None
    }

    /// Applies the epilogue to output row `i`, columns `j0..j0 + v.len()`, in place.
    #[inline(always)]
    fn apply<const FMA: bool>(&self, i: usize, j0: usize, v: &mut [f32]) {
        let n = v.len();
        if self.alpha != 1.0 {
            v.iter_mut().for_each(|x| *x *= self.alpha);
        }
        if let Some(b) = self.bias {
            v.iter_mut().zip(&b[j0..j0 + n]).for_each(|(x, &b)| *x += b);
        }
        if let Some((c, cv, beta)) = self.c {
            let cr = &c[cv.index(self.batch, i, j0)..][..n];
            v.iter_mut().zip(cr).for_each(|(x, &c)| *x = madd::<FMA>(beta, c, *x));
        }
        apply_isa::<FMA>(self.activation, v);
    }
}

#[inline(always)]
fn epilogue_rows_inner<const FMA: bool>(epi: &Epilogue, i0: usize, j0: usize, n: usize, block: &mut [f32]) {
    for (r, row) in block.chunks_mut(n).enumerate() {
        epi.apply::<FMA>(i0 + r, j0, row);
    }
}

multiversion! {
    /// The epilogue over a dense block of rows `i0..` (each `n` long, starting at column `j0`).
    pub(super) fn epilogue_rows(epi: &Epilogue, i0: usize, j0: usize, n: usize, block: &mut [f32]) => epilogue_rows_inner
}

/// Products with `B` stored `[N, K]` (`nn.Linear`'s and GGUF's layout) of at most this many
/// rows per `gemm` call, and `B` of at least [`ORIENT_MIN_B`] elements, are computed into a
/// buffer with the rows as the contiguous dimension, then transposed into the output. `gemm`
/// makes the output's contiguous dimension its `M`, so a row-major output puts `B` on its
/// left, packed per call through a transposing gather of all `N × K`; the other way round it
/// gathers `A`'s rows instead and reads `B` along its rows. In-process A/B on a 2-core
/// AVX-512 Xeon (2 threads, medians, against the same product written in place): 97 × 1024 ×
/// 1024 0.35 of the time, 128 × 1024 × 1024 0.40, 256 × 1024 × 1024 0.62, 384 × 1024 × 1024
/// (192 rows a call) 0.60, 100 × 4096 × 4096 0.73, 200 × 1024 × 4096 0.65, 256 × 4096 × 4096
/// 0.81, 128 × 11008 × 4096 0.67; with bias + GELU (the epilogue's row panels, each a `gemm`
/// call that packed all of `B`): 512 × 4096 × 4096 0.31, 1024³ 0.47, 256 × 1024 × 1024 0.52.
/// But 512 × 4096 × 4096 as one call of 512 rows took 1.12, and with a small `B` (300³,
/// 196 × 576 × 96, 128³) 1.03–1.2, hence the bounds.
const ORIENT_MAX_ROWS: usize = 256;

/// See [`ORIENT_MAX_ROWS`] (2 MiB of f32).
const ORIENT_MIN_B: usize = 1 << 19;

/// Strides of `op(A)` and `op(B)` and the first elements of one batch.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    pub(super) a0: usize,
    pub(super) a_rs: usize,
    pub(super) a_cs: usize,
    pub(super) b0: usize,
    pub(super) b_rs: usize,
    pub(super) b_cs: usize,
}

impl Geometry {
    fn new(desc: &MatmulDesc, bt: usize) -> Geometry {
        let (a_rs, a_cs) = if desc.trans_a { (1, desc.a.ld) } else { (desc.a.ld, 1) };
        let (b_rs, b_cs) = if desc.trans_b { (1, desc.b.ld) } else { (desc.b.ld, 1) };
        Geometry {
            a0: desc.a.offset + bt * desc.a.batch_stride,
            a_rs,
            a_cs,
            b0: desc.b.offset + bt * desc.b.batch_stride,
            b_rs,
            b_cs,
        }
    }
}

impl MatmulOperands<'_> {
    /// `dst(rows × n, row stride dst_rs) = op(A)[i0..i0 + rows] · op(B)` with `gemm`.
    ///
    /// # Safety
    /// `dst` must point to `rows` rows of `n` writable f32 at row stride `dst_rs`, not aliasing
    /// the operands; the views of A and B must have been checked to fit their buffers.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_rows(
        &self,
        g: Geometry,
        i0: usize,
        rows: usize,
        n: usize,
        k: usize,
        dst: *mut f32,
        dst_rs: usize,
        par: gemm::Parallelism,
    ) {
        // Both operands along K (`B` stored `[N, K]`): the product rows-contiguous (see
        // [`ORIENT_MAX_ROWS`]) into this thread's product buffer, then transposed into `dst`
        // (without the buffer, where it cannot be allocated, written in place below).
        let orient = g.a_cs == 1 && g.b_rs == 1 && rows < n && rows <= ORIENT_MAX_ROWS && n * k >= ORIENT_MIN_B;
        // SAFETY: as below, with `t` (n × rows, column stride rows) as the destination; then
        // `t` holds n rows of `rows`, and dst `rows` rows of n at stride dst_rs.
        if orient
            && let Ok(()) = transpose::with_product(rows * n, |t| unsafe {
                gemm_f32(
                    rows,
                    n,
                    k,
                    Strided { ptr: t.as_mut_ptr(), rs: 1, cs: rows },
                    Strided { ptr: self.a.as_ptr().add(g.a0 + i0 * g.a_rs), rs: g.a_rs, cs: g.a_cs },
                    Strided { ptr: self.b.as_ptr().add(g.b0), rs: g.b_rs, cs: g.b_cs },
                    false,
                    par,
                );
                transpose::transpose(Isa::detect(), n, rows, t.as_ptr(), rows, dst, dst_rs, Default::default());
            })
        {
            return;
        }
        // SAFETY: (the caller's contract) every element (i, p) of op(A) at
        // a0 + i·a_rs + p·a_cs and (p, j) of op(B) lies inside the checked buffers, which are
        // only read; dst holds rows × n elements at row stride dst_rs, column stride 1.
        // `read_dst` is false, so gemm computes dst = 1·A·B without reading dst.
        unsafe {
            gemm_f32(
                rows,
                n,
                k,
                Strided { ptr: dst, rs: dst_rs, cs: 1 },
                Strided { ptr: self.a.as_ptr().add(g.a0 + i0 * g.a_rs), rs: g.a_rs, cs: g.a_cs },
                Strided { ptr: self.b.as_ptr().add(g.b0), rs: g.b_rs, cs: g.b_cs },
                false,
                par,
            );
        }
    }

    /// Runs the matmul into `out` (the output buffer, in its storage type).
    pub(super) fn run<E: Elem>(&self, desc: &MatmulDesc, out: &mut [E]) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let ov = desc.out;
        if desc.batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if m > 1 && ov.ld < n {
            return Err(internal("output leading dimension below N".into()));
        }
        // Each batch's output region: rows at multiples of ld, the last row n long. Validation
        // guarantees the regions are in bounds and, when batch > 1, that consecutive regions
        // (batch_stride apart) do not overlap, so each task can own one.
        let row_step = if m > 1 { ov.ld } else { n };
        let region = (m - 1) * row_step + n;
        let step = if desc.batch > 1 { ov.batch_stride } else { region };
        if step < region {
            return Err(internal("output batches overlap".into()));
        }
        let end = ov.offset + (desc.batch - 1) * step + region;
        let out = out.get_mut(ov.offset..end).ok_or_else(|| internal("output view out of bounds".into()))?;
        let b_need = if self.strips {
            n.div_ceil(STRIP).checked_mul(k * STRIP)
        } else {
            desc.b.required_len(desc.batch, desc.b_stored().0, desc.b_stored().1)
        };
        for (name, need, len) in [
            ("a", desc.a.required_len(desc.batch, desc.a_stored().0, desc.a_stored().1), self.a.len()),
            ("b", b_need, self.b_half.map_or(self.b.len(), |h| h.len())),
        ] {
            if need.is_none_or(|need| need > len) {
                return Err(internal(format!("{name}'s view is out of bounds")));
            }
        }
        if let (Some(cv), Some(c)) = (desc.c, &self.c)
            && cv.required_len(desc.batch, m, n).is_none_or(|need| need > c.len())
        {
            return Err(internal("c's view is out of bounds".into()));
        }
        if self.bias.is_some_and(|b| b.len() < n) {
            return Err(internal("bias shorter than N".into()));
        }
        let isa = Isa::detect();
        let small = desc.batch > 1 && m * n * k < SMALL_GEMM;
        let batch_task = |bt: usize, dst: &mut [E]| -> Result<()> {
            let epi = Epilogue {
                alpha: desc.alpha,
                bias: self.bias,
                c: match (desc.c, &self.c) {
                    (Some(cv), Some(c)) => Some((&c[..], cv, desc.beta)),
                    _ => None,
                },
                activation: desc.activation,
                batch: bt,
            };
            let g = Geometry::new(desc, bt);
            if self.strips && k > 0 {
                return self.strips_product(isa, desc, g, &epi, !small, row_step, dst);
            }
            // Mid-sized products over a large B: the skinny kernel's panels (B [K, N] on AVX2 and
            // AVX-512, B [N, K] on AVX-512).
            let panels = m <= PANELS_KN_M
                && k * n >= SHARED_B
                && if g.b_cs == 1 { super::gemv::has_panels(isa) } else { super::gemv::nk_panels(isa, m, g.b_cs) };
            if (m <= SKINNY_M || panels) && k > 0 {
                return self.skinny(isa, desc, g, &epi, !small, row_step, dst);
            }
            if let Some(o) = E::as_f32_mut(dst)
                && k > 0
                && (epi.is_identity() || m * n <= CACHED_OUT)
            {
                let par =
                    if small || m * n * k < SMALL_GEMM { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(0) };
                if !matches!(par, gemm::Parallelism::None) && k * n <= SHARED_B {
                    // One panel of rows per thread: each a single-threaded `gemm` call followed
                    // by the epilogue on its rows while they are in that core's L2. The
                    // calling thread takes a panel at once (`gemm`'s own split puts it to
                    // sleep until the pool's threads wake and finish: at 128³ and 256³ the
                    // median doubled). Each panel packs all of B, read from the shared cache.
                    let per_thread = m.div_ceil(rayon::current_num_threads().max(1));
                    return self.panels(isa, desc, g, &epi, true, per_thread, row_step, dst);
                }
                // SAFETY: `o` is this batch's output region: m rows at stride row_step (n
                // elements each), exclusively borrowed; A and B were checked above.
                unsafe { self.gemm_rows(g, 0, m, n, k, o.as_mut_ptr(), row_step, par) };
                if !epi.is_identity() {
                    // The output is still in the caches: the epilogue reads it from there.
                    let rows = |(p, rows): (usize, &mut [f32])| {
                        let (i0, nrows) = (p * EPI_ROWS, EPI_ROWS.min(m - p * EPI_ROWS));
                        for (r, row) in rows.chunks_mut(row_step).take(nrows).enumerate() {
                            epilogue_rows(isa, &epi, i0 + r, 0, n, &mut row[..n]);
                        }
                    };
                    if !small && m * n * k >= PARALLEL_MIN {
                        for_each_chunk_mut(o, EPI_ROWS * row_step, |p, r| rows((p, r)));
                    } else {
                        o.chunks_mut(EPI_ROWS * row_step).enumerate().for_each(rows);
                    }
                }
                return Ok(());
            }
            let parallel = !small && m * n * k >= PARALLEL_MIN;
            // A half-precision output, split as an f32 one would be: one panel of rows per
            // thread where `B` is small enough for each to pack it (and the panel's f32 sums
            // at most 4 MiB), else one `gemm` call over every row into an f32 buffer.
            if E::as_f32(&[]).is_none() && k > 0 && !small && m * n * k >= SMALL_GEMM {
                let per_thread = m.div_ceil(rayon::current_num_threads().max(1));
                if k * n <= SHARED_B && per_thread * n <= 16 * PANEL {
                    return self.panels(isa, desc, g, &epi, true, per_thread, row_step, dst);
                }
                if k * n > SHARED_B && m * n <= HALF_OUT {
                    return self.half_out(isa, g, &epi, m, n, k, row_step, dst);
                }
            }
            self.panels(isa, desc, g, &epi, parallel, panel_rows(m, n, parallel), row_step, dst)
        };
        if desc.batch == 1 {
            return batch_task(0, out);
        }
        if small {
            out.par_chunks_mut(step)
                .take(desc.batch)
                .enumerate()
                .try_for_each(|(bt, chunk)| batch_task(bt, &mut chunk[..region]))
        } else {
            out.chunks_mut(step)
                .take(desc.batch)
                .enumerate()
                .try_for_each(|(bt, chunk)| batch_task(bt, &mut chunk[..region]))
        }
    }

    /// A product with a half-precision output whose `B` is too large to pack once per thread
    /// (`K · N` over [`SHARED_B`]): one `gemm` call over all the rows, split across threads as
    /// an f32 output's is, into an f32 buffer; then the epilogue and the rounding to `E`, rows
    /// at a time in parallel. In panels of L2-sized row blocks (16 rows at N = 4096) each
    /// single-threaded `gemm` call packed all of `B` again: 128 × 4096 × 4096 in f16 took
    /// 51–59 ms against f32's 16.5 (2 threads, the 2-core AVX-512 Xeon).
    #[allow(clippy::too_many_arguments)]
    fn half_out<E: Elem>(
        &self,
        isa: Isa,
        g: Geometry,
        epi: &Epilogue,
        m: usize,
        n: usize,
        k: usize,
        row_step: usize,
        dst: &mut [E],
    ) -> Result<()> {
        // From the recycle shelf, and back onto it below: a new zeroed buffer each call would
        // be first-touched every time.
        let mut acc = scratch_f32(m * n)?;
        // SAFETY: `acc` is a dense m × n buffer owned here.
        unsafe { self.gemm_rows(g, 0, m, n, k, acc.as_mut_ptr(), n, gemm::Parallelism::Rayon(0)) };
        if !epi.is_identity() {
            for_each_chunk_mut(&mut acc, EPI_ROWS * n, |p, rows| {
                for (r, row) in rows.chunks_mut(n).enumerate() {
                    epilogue_rows(isa, epi, p * EPI_ROWS + r, 0, n, row);
                }
            });
        }
        let sums = &acc[..];
        for_each_chunk_mut(dst, EPI_ROWS * row_step, |p, rows| {
            for (r, row) in rows.chunks_mut(row_step).enumerate() {
                E::narrow_into(&sums[(p * EPI_ROWS + r) * n..][..n], &mut row[..n]);
            }
        });
        super::recycle::give(acc);
        Ok(())
    }

    /// Row panels of `mr` rows (split across threads when `parallel`): `gemm` then the
    /// epilogue on each panel while it is in L2.
    #[allow(clippy::too_many_arguments)]
    fn panels<E: Elem>(
        &self,
        isa: Isa,
        desc: &MatmulDesc,
        g: Geometry,
        epi: &Epilogue,
        parallel: bool,
        mr: usize,
        row_step: usize,
        dst: &mut [E],
    ) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let mr = mr.max(1);
        let panel = |p: usize, rows: &mut [E]| -> Result<()> {
            let i0 = p * mr;
            let nrows = mr.min(m - i0);
            match E::as_f32_mut(rows) {
                Some(o) => {
                    if k > 0 {
                        // SAFETY: `o` holds this panel's nrows rows at stride row_step.
                        unsafe {
                            self.gemm_rows(g, i0, nrows, n, k, o.as_mut_ptr(), row_step, gemm::Parallelism::None)
                        };
                    } else {
                        o.chunks_mut(row_step).for_each(|r| r[..n].fill(0.0));
                    }
                    if !epi.is_identity() {
                        for (r, row) in o.chunks_mut(row_step).enumerate() {
                            epilogue_rows(isa, epi, i0 + r, 0, n, &mut row[..n]);
                        }
                    }
                }
                _ => {
                    let mut acc = scratch(nrows * n)?;
                    if k > 0 {
                        // SAFETY: `acc` is a dense nrows × n buffer owned here.
                        unsafe { self.gemm_rows(g, i0, nrows, n, k, acc.as_mut_ptr(), n, gemm::Parallelism::None) };
                    }
                    epilogue_rows(isa, epi, i0, 0, n, &mut acc);
                    for (src, row) in acc.chunks(n).zip(rows.chunks_mut(row_step)) {
                        E::narrow_into(src, &mut row[..n]);
                    }
                }
            }
            Ok(())
        };
        // Panel p covers rows p·mr.. of the output: mr rows at stride row_step (the last one
        // shorter, and the last row of the region only n long).
        let chunk = mr * row_step;
        if parallel {
            try_for_each_chunk_mut(dst, chunk, panel)
        } else {
            dst.chunks_mut(chunk).enumerate().try_for_each(|(p, rows)| panel(p, rows))
        }
    }
}

/// Rows per panel of the general path: L2-sized, and at least two panels per thread when
/// splitting.
fn panel_rows(m: usize, n: usize, parallel: bool) -> usize {
    let mr = (PANEL / n.max(1)).max(1);
    if parallel { mr.min(m.div_ceil(2 * rayon::current_num_threads().max(1))).max(1) } else { mr }
}
