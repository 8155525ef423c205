//! Quantized matmul on the CPU: `act(alpha · op(A) · dequantize(W)ᵀ + bias + beta · C)`.
//!
//! The weight `W` `[N, K]` stays quantized in memory (the two planes of `quant_tensor.rs`);
//! it is dequantized 32 elements at a time straight from the planes into `f32` lanes
//! (`qgroup.rs`: one scale's group, bit for bit what the host dequantizer gives):
//! - **Decode** (`M ≤ 16`): threads over blocks of output columns (rows of `W`), every weight
//!   byte read from memory once, whatever `M`; `op(A)` is densified to f32 once (`M × K`,
//!   L1/L2-resident). On AVX-512, up to [`ROWS_MAX_M`] rows, each weight row's groups are
//!   dequantized by hand-written intrinsics into registers (`qgroup.rs`'s `avx512`: the 4-bit
//!   formats as a 16-entry table lookup, the scales once per block) and met by the same
//!   columns of each row of `op(A)`, the sums in registers ([`avx512::decode_rows`]); on AVX2
//!   the same in 8-lane vectors up to [`AVX2_ROWS_MAX_M`] rows ([`avx2::decode_rows`]).
//!   Otherwise, below [`TILES_MIN_M`] rows, that order in plain Rust compiled per instruction
//!   set (`simd.rs`, [`decode_fmt`]: the portable copy, on aarch64 NEON). Above those, a few
//!   weight rows at a time are dequantized chunk by chunk of `K` into an L1 buffer and met by
//!   `gemv.rs`'s dense `N × K` register tiles (six rows and the 16-lane dot tiles on AVX-512,
//!   [`avx512::decode`], the K-quants dequantized by the intrinsics groups; three rows and the
//!   8-lane tiles elsewhere, [`tiles_fmt`]), so each row of `op(A)` is read once per six or
//!   three weight rows rather than per row.
//! - **Larger M**: threads over panels of [`panel_cols`] weight rows; each panel is dequantized
//!   group by group into an L2-sized f32 scratch (`cols × K`), then one single-threaded `gemm`
//!   call multiplies `op(A)` by it. Only a panel, never the whole weight, is ever dequantized;
//!   the dequantization costs a few instructions per weight against `M` multiply-adds.
//!
//! Both write f32 sums column-major into an `N × M` scratch; the epilogue (`matmul.rs`'s, so
//! bias, beta·C and the activation are exactly the dense matmul's) then runs row by row and
//! rounds once into the output's storage type.

use super::matmul::{Epilogue, SKINNY_M, Strided, epilogue_rows, gemm_f32};
use super::pool::{for_each_chunk_mut, try_for_each_chunk_mut};
use super::qgroup::{Format, G, chunk_of, dequant_rows, with_format};
use super::simd::{Isa, madd, multiversion};
use super::{Elem, internal, scratch};
use crate::Result;
use crate::quant_tensor::PlaneGeometry;
use tilekit_kernels::MatmulDesc;
use tilekit_kernels::quant::GgmlType;

/// Below this many multiply-adds the work runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 20;

/// f32 elements of one panel of dequantized weight rows (256 KiB: L2-resident).
const PANEL: usize = 1 << 16;

/// Lanes of each row's accumulator (one AVX-512 vector, two AVX2 ones).
const LANES: usize = 16;

/// A quantized weight `[n, k]`: its type and the bytes of its two planes.
#[derive(Clone, Copy)]
pub(super) struct QWeights<'d> {
    pub(super) ty: GgmlType,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) scales: &'d [u8],
    pub(super) body: &'d [u8],
}

impl QWeights<'_> {
    /// Whether rows `j0 .. j0 + rows` of the planes hold whole blocks of format `F` (`k` a
    /// multiple of its block size): the bounds the intrinsics kernels assert before reading
    /// the planes through pointers.
    #[cfg(target_arch = "x86_64")]
    fn holds<F: Format>(&self, j0: usize, rows: usize) -> bool {
        let blocks = (j0 + rows) * (self.k / F::BS);
        self.k.is_multiple_of(F::BS)
            && j0 + rows <= self.n
            && self.scales.len() >= blocks * F::SB
            && self.body.len() >= blocks * F::BB
    }

    /// Checks that the planes hold `n · k / block_size` blocks.
    pub(super) fn check(&self) -> Result<PlaneGeometry> {
        let g = PlaneGeometry::of(self.ty).ok_or_else(|| internal(format!("{} is not quantized", self.ty)))?;
        let bs = self.ty.block_size();
        let blocks = self.n.checked_mul(self.k / bs).ok_or_else(|| internal("block count overflows".into()))?;
        if !self.k.is_multiple_of(bs)
            || blocks.checked_mul(g.scale_bytes).is_none_or(|b| b > self.scales.len())
            || blocks.checked_mul(g.body_bytes).is_none_or(|b| b > self.body.len())
        {
            return Err(internal(format!("{} planes too short for [{}, {}]", self.ty, self.n, self.k)));
        }
        Ok(g)
    }
}

/// The decode kernel for format `F` over weight rows `j0 ..`: `acc[jj·m + i] = op(A)[i] ·
/// W[j0 + jj]`. Each 32-element group is dequantized once into `w` (registers) and used for
/// all `m` rows before the next group is read.
#[inline(always)]
fn decode_fmt<const FMA: bool, F: Format>(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
    let k = w.k;
    let nb = k / F::BS;
    for (jj, col) in acc.chunks_exact_mut(m).enumerate() {
        let mut lanes = [[0.0f32; LANES]; SKINNY_M];
        let lanes = &mut lanes[..m];
        let b0 = (j0 + jj) * nb;
        for b in 0..nb {
            let s = &w.scales[(b0 + b) * F::SB..][..F::SB];
            let q = &w.body[(b0 + b) * F::BB..][..F::BB];
            for g in 0..F::BS / G {
                let mut v = [0.0f32; G];
                F::group(s, q, g, &mut v);
                let k0 = b * F::BS + g * G;
                for (i, ln) in lanes.iter_mut().enumerate() {
                    let ar = &a[i * k + k0..][..G];
                    for l in 0..LANES {
                        ln[l] = madd::<FMA>(ar[l], v[l], ln[l]);
                    }
                    for l in 0..LANES {
                        ln[l] = madd::<FMA>(ar[LANES + l], v[LANES + l], ln[l]);
                    }
                }
            }
        }
        for (c, ln) in col.iter_mut().zip(lanes.iter()) {
            // Pairwise reduction of the lanes.
            let mut v = *ln;
            let mut h = LANES / 2;
            while h > 0 {
                for l in 0..h {
                    v[l] += v[l + h];
                }
                h /= 2;
            }
            *c = v[0];
        }
    }
}

#[inline(always)]
fn decode_cols_inner<const FMA: bool>(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
    with_format!(w.ty, F => decode_fmt::<FMA, F>(w, a, m, j0, acc), _ => acc.fill(f32::NAN));
}

multiversion! {
    /// [`decode_fmt`] for the weight's format and the detected instruction set (the type was
    /// checked by [`QWeights::check`]).
    fn decode_cols(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) => decode_cols_inner
}

/// The fewest rows of `A` that take [`tiles_fmt`] rather than [`decode_fmt`] without AVX-512
/// (on AVX-512, [`avx512::decode_rows`] takes up to [`ROWS_MAX_M`] rows and the AVX-512 tiles
/// the rest). In-process A/B against [`decode_fmt`] (alternated per round, 2 threads, 2-core
/// AVX-512 Xeon, medians), the AVX2 tiles (the AVX2 copy run on that machine): 16 rows
/// 0.41–0.60 of the time, 8 rows 0.49–0.67, 4 rows 0.56–0.85, 3 rows 0.80–1.04 (`Q4_1` and
/// `Q6_K` level); the AVX-512 tiles: at 16 × 4096 × 4096 0.26 in `Q8_0`, 0.37–0.38 in `Q4_0`,
/// `Q4_1` and `Q4_K`, 0.69 in `Q6_K`; at 8 × 11008 × 4096 0.53–0.70.
const TILES_MIN_M: usize = 3;

/// The most rows of `A` that take [`avx512::decode_rows`] rather than the AVX-512 tiles.
/// In-process A/B against the kernels it replaced (alternated per round, 2 threads, 2-core
/// AVX-512 Xeon, medians, all five formats): against [`decode_fmt`] at 1 × 4096 × 4096 0.39–0.61
/// of the time (`Q4_0` 0.39, `Q4_K` 0.42, `Q6_K` 0.61), at 1 × 11008 × 4096 and 1 × 4096 ×
/// 11008 0.35–0.69, at 2 rows 0.41–0.64; against the tiles at 3 rows 0.47–0.77, at 4 rows
/// 0.63–1.08 over two runs (level on average); with 5–8 rows (four sums a row no longer fit
/// the 32 registers) 0.73–1.40, so the tiles keep those.
#[cfg(target_arch = "x86_64")]
const ROWS_MAX_M: usize = 4;

/// How far ahead [`avx512::decode_rows`] and [`avx2::decode_rows`] prefetch the weight's
/// planes, in bytes of the body plane (the scale plane as many blocks ahead). In-process A/B
/// of the AVX-512 kernel at 1 × 11008 × 4096: 0.80–0.94 of the time without in `Q8_0` and
/// `Q4_1`, level (0.97–1.03) in the others.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 1024;

/// The decode kernel on AVX-512 above [`ROWS_MAX_M`] rows of `A`: [`decode_fmt`]'s sums, with
/// the weight's rows taken [`DOT_B`](super::gemv::avx512::DOT_B) at a time and `K` in chunks of
/// [`DOT_KC`](super::gemv::avx512::DOT_KC): each chunk of those rows is dequantized into an
/// L1 buffer, then met by the dense `N × K` dot-product tiles (`gemv.rs`, 4 rows of `A` × 6
/// weight rows, 16-lane sums in registers) for every row group of `A`. So each element of `A`
/// is read from L1/L2 once per six weight rows, not once per row.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::gemv::avx512::{DOT_B, DOT_KC, dot_tiles};
    use super::super::qgroup::avx512::Group512;
    use super::super::qgroup::{Format, G, chunk_of, with_format};
    use super::{PREFETCH, QWeights, ROWS_MAX_M, SKINNY_M};
    use std::arch::x86_64::*;
    use tilekit_kernels::quant::GgmlType;

    /// `acc[jj·m + i] = op(A)[i] · W[j0 + jj]` for `m` (at most 16) dense rows of `A` (`m × k`).
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn decode(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
        // SAFETY: the caller promises AVX-512F and F16C.
        with_format!(w.ty, F => unsafe { tiles::<F>(w, a, m, j0, acc) }, _ => acc.fill(f32::NAN));
    }

    /// `acc[jj·m + i] = op(A)[i] · W[j0 + jj]` for `m` (1 to [`ROWS_MAX_M`]) dense rows of `A`
    /// (`m × k`).
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn decode_rows(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
        debug_assert!((1..=ROWS_MAX_M).contains(&m));
        // SAFETY: the caller promises AVX-512F and F16C.
        with_format!(w.ty, F => unsafe {
            match m {
                1 => rows::<F, 1>(w, a, j0, acc),
                2 => rows::<F, 2>(w, a, j0, acc),
                3 => rows::<F, 3>(w, a, j0, acc),
                _ => rows::<F, 4>(w, a, j0, acc),
            }
        }, _ => acc.fill(f32::NAN));
    }

    /// [`decode_rows`] for format `F` and `M` rows: each weight row's groups dequantized into
    /// registers ([`Group512`], the scales once per block) two at a time and met by the same
    /// 64 columns of each row of `A`; the sums stay in registers (four vectors per row, so
    /// consecutive fused multiply-adds do not wait on each other) and are reduced once per
    /// output. The weight's planes are prefetched [`PREFETCH`] bytes ahead.
    ///
    /// The one-group formats (Q8_0, Q4_0, Q4_1) convert their f16 scales 16 blocks at a time
    /// ([`halves16`], [`Group512::scales_of`]), so each block's scale is a broadcast from
    /// memory rather than a conversion of its own; Q4_K widens each pair of sub-blocks'
    /// shared bytes once ([`Group512::group512_pair`]). In-process A/B against one conversion
    /// per block (alternated four times, 2-core AVX-512 Xeon, 4096 × 4096, 11008 × 4096 and
    /// 4096 × 11008): at M = 1 Q8_0 in 0.48–0.65 of the time, Q4_0 in 0.60–0.84; at M = 2
    /// (4096²) 0.59 and 0.87; M = 4 level.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn rows<F: Group512, const M: usize>(w: &QWeights, a: &[f32], j0: usize, acc: &mut [f32]) {
        let (k, gpb) = (w.k, F::BS / G);
        let nb = k / F::BS;
        let cols = acc.len() / M;
        assert!(
            w.holds::<F>(j0, cols) && (gpb == 1 || gpb.is_multiple_of(2)) && a.len() >= M * k,
            "decode rows past their operands"
        );
        let pf = PREFETCH / F::BB;
        for (jj, out) in acc.chunks_exact_mut(M).enumerate() {
            let b0 = (j0 + jj) * nb;
            // SAFETY (every pointer below): rows j0 .. j0 + cols of both planes, nb blocks
            // each, and A's M rows of k are inside the slices (asserted); block b < nb of the
            // row starts at b · SB and b · BB, and its groups g < gpb at column b · BS + g · 32.
            let (sp, qp) = unsafe { (w.scales.as_ptr().add(b0 * F::SB), w.body.as_ptr().add(b0 * F::BB)) };
            let mut sum = [[_mm512_setzero_ps(); 4]; M];
            // Two groups at a time, the second into the other pair of sums: two blocks of the
            // one-group formats (and one at the end of an odd count), or two sub-blocks of a
            // K-quant super-block.
            let mut b = 0;
            // The one-group formats' f16 scales, 16 blocks' at a time (`halves16`).
            let mut halves = [0.0f32; 32];
            let h = F::SB / 2;
            while b < nb {
                unsafe {
                    // A hint only: past the planes' end it reads nothing.
                    _mm_prefetch::<_MM_HINT_T0>(qp.wrapping_add((b + pf) * F::BB).cast());
                    _mm_prefetch::<_MM_HINT_T0>(sp.wrapping_add((b + pf) * F::SB).cast());
                    let (s0, q0) = (sp.add(b * F::SB), qp.add(b * F::BB));
                    if gpb == 1 {
                        // b is even: a multiple of 16 starts the next 16 blocks.
                        if b % 16 == 0 {
                            halves = halves16::<F>(s0, nb - b);
                        }
                        let at = b % 16 * h;
                        let [w0, w1] = F::group512(&F::scales_of(&halves[at..at + h], s0, q0), q0, 0);
                        if b + 1 < nb {
                            let (s1, q1) = (sp.add((b + 1) * F::SB), qp.add((b + 1) * F::BB));
                            let sc1 = F::scales_of(&halves[at + h..at + 2 * h], s1, q1);
                            let [w2, w3] = F::group512(&sc1, q1, 0);
                            for (i, s) in sum.iter_mut().enumerate() {
                                madd4(s, a.as_ptr().add(i * k + b * G), [w0, w1, w2, w3]);
                            }
                        } else {
                            for (i, s) in sum.iter_mut().enumerate() {
                                madd2(s, a.as_ptr().add(i * k + b * G), [w0, w1]);
                            }
                        }
                        b += 2;
                    } else {
                        let sc0 = F::scales(s0, q0);
                        for g in (0..gpb).step_by(2) {
                            let [w0, w1, w2, w3] = F::group512_pair(&sc0, q0, g);
                            for (i, s) in sum.iter_mut().enumerate() {
                                madd4(s, a.as_ptr().add(i * k + b * F::BS + g * G), [w0, w1, w2, w3]);
                            }
                        }
                        b += 1;
                    }
                }
            }
            for (o, s) in out.iter_mut().zip(&sum) {
                *o = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
            }
        }
    }

    /// The f16 scales of up to 16 consecutive blocks of a one-group format (`SB` ≤ 4 bytes a
    /// block, `blocks` of them from `s` to the row's end), as f32, in storage order: one
    /// conversion of 16 (or 32) halves instead of one per block, so the decode rows take each
    /// block's scale by a broadcast from memory. The same values as each block's own
    /// conversion (`qgroup.rs`'s `scale`).
    ///
    /// # Safety
    /// AVX-512F and F16C; `min(blocks, 16) · SB` readable bytes at `s`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn halves16<F: Format>(s: *const u8, blocks: usize) -> [f32; 32] {
        const { assert!(F::SB <= 4, "two f16 scales a block at most") };
        let n = blocks.min(16) * F::SB;
        let mut tmp = [0u8; 64];
        let src = if n == 16 * F::SB {
            s
        } else {
            // SAFETY: the caller promises n bytes at s; tmp holds 64 ≥ n.
            unsafe { std::ptr::copy_nonoverlapping(s, tmp.as_mut_ptr(), n) };
            tmp.as_ptr()
        };
        let mut out = [0.0f32; 32];
        // SAFETY: src holds 16 · SB bytes (s where n is that, tmp otherwise); out 32 floats.
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(src.cast())));
            if F::SB > 2 {
                _mm512_storeu_ps(out.as_mut_ptr().add(16), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(32).cast())));
            }
        }
        out
    }

    /// [`chunk_of`] with the AVX-512 groups ([`Group512`], the same values bit for bit):
    /// elements `q0 .. q0 + dst.len()` of weight row `j` into `dst` (`q0` and the length
    /// multiples of the block size). [`tiles`] takes it for the K-quants, whose scales it
    /// unpacks once per super-block rather than once per group: in-process A/B against
    /// [`chunk_of`] at 5, 8 and 16 × 4096 × 4096 and 16 × 11008 × 4096, 0.67–0.86 of the time
    /// in `Q4_K`, 0.62–0.82 in `Q6_K`; the one-group formats took 1.01–1.45 with it, so they
    /// keep [`chunk_of`] (plain Rust that LLVM vectorises).
    ///
    /// # Safety
    /// AVX-512F and F16C; the row's blocks are inside the planes.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn chunk512<F: Group512>(w: &QWeights, j: usize, q0: usize, dst: &mut [f32]) {
        let b0 = j * (w.k / F::BS) + q0 / F::BS;
        for (b, blk) in dst.chunks_exact_mut(F::BS).enumerate() {
            // SAFETY: block b0 + b is inside both planes (the caller's promise); each group
            // writes its 32 floats inside the block's BS.
            unsafe {
                let (s, q) = (w.scales.as_ptr().add((b0 + b) * F::SB), w.body.as_ptr().add((b0 + b) * F::BB));
                let sc = F::scales(s, q);
                for (g, out) in blk.chunks_exact_mut(G).enumerate() {
                    let [lo, hi] = F::group512(&sc, q, g);
                    _mm512_storeu_ps(out.as_mut_ptr(), lo);
                    _mm512_storeu_ps(out.as_mut_ptr().add(16), hi);
                }
            }
        }
    }

    /// `s[v] += a[16v ..][..16] · w[v]` for the four vectors.
    ///
    /// # Safety
    /// AVX-512F; 64 readable `f32` at `a`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn madd4(s: &mut [__m512; 4], a: *const f32, w: [__m512; 4]) {
        for v in 0..4 {
            // SAFETY: the caller promises 64 floats at a.
            s[v] = unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(a.add(16 * v)), w[v], s[v]) };
        }
    }

    /// `s[v] += a[16v ..][..16] · w[v]` for the first two vectors.
    ///
    /// # Safety
    /// AVX-512F; 32 readable `f32` at `a`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn madd2(s: &mut [__m512; 4], a: *const f32, w: [__m512; 2]) {
        for v in 0..2 {
            // SAFETY: the caller promises 32 floats at a.
            s[v] = unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(a.add(16 * v)), w[v], s[v]) };
        }
    }

    /// [`decode`] for format `F`.
    ///
    /// At 16 × 4096 × 4096 (in-process, 2 threads, 2-core AVX-512 Xeon) the tiles alone,
    /// with the dequantization skipped, took 2.7 ms, as the dense f32 `[N, K]` product does,
    /// and everything but the tiles 1.0–1.1 ms (Q4_K) and 1.6–2.1 ms (Q4_0, Q8_0): 3.6–3.9 ms
    /// together. Tried without gain: the next chunk dequantized between the row groups' tiles
    /// (double buffered), `A` copied chunk by chunk so each chunk is contiguous, two to four
    /// weight tiles per pass of `A`'s chunk (slower: the chunk, the buffers and the sums
    /// outgrew L1), prefetching the planes two chunks ahead, and `chunk512` for the
    /// 32-element formats (1.1× `chunk_of`'s time).
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn tiles<F: Group512>(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
        let k = w.k;
        let cols = acc.len() / m;
        assert!(
            (1..=SKINNY_M).contains(&m) && k > 0 && a.len() >= m * k && w.holds::<F>(j0, cols),
            "decode tile past its operands"
        );
        let mut buf = [0.0f32; DOT_B * DOT_KC];
        let dequantize = |jj: usize, c: usize, q0: usize, kl: usize| {
            for (j, dst) in buf.chunks_exact_mut(DOT_KC).take(c).enumerate() {
                if F::BS == G {
                    chunk_of::<F>(w.scales, w.body, k, j0 + jj + j, q0, &mut dst[..kl]);
                } else {
                    // SAFETY: AVX-512F and F16C (the caller's promise); the row's blocks
                    // q0 / BS .. (q0 + kl) / BS are inside the planes (asserted).
                    unsafe { chunk512::<F>(w, j0 + jj + j, q0, &mut dst[..kl]) };
                }
            }
            (buf.as_ptr(), DOT_KC, false)
        };
        // SAFETY: the caller promises AVX-512F; A's m rows of k are inside `a` (asserted); each
        // chunk is the buffer's c rows of kl (c ≤ DOT_B, kl ≤ DOT_KC), valid until the next is
        // asked for; the outputs, column by column, are inside `acc` (cols · m of them).
        unsafe { dot_tiles(m, k, a.as_ptr(), k, cols, dequantize, |i, j, v| acc[j * m + i] = v) }
    }
}

/// The most rows of `A` that take [`avx2::decode_rows`] on AVX2 without AVX-512 (four sums a
/// row in the 16 `ymm` registers leave room for two rows). In-process A/B against
/// [`decode_fmt`] (the AVX2 copies forced on the 2-core AVX-512 Xeon, alternated per round, 1
/// and 2 rows × 4096 × 4096, 1 × 11008 × 4096, 1 × 4096 × 11008, medians): 0.51–0.60 of the
/// time in `Q4_0`, 0.49–0.54 in `Q4_1`, 0.47–0.56 in `Q4_K`, 0.83–0.95 in `Q6_K`, 0.84–0.93 in
/// `Q8_0` (a first run 0.88–1.21).
#[cfg(target_arch = "x86_64")]
const AVX2_ROWS_MAX_M: usize = 2;

/// The decode kernel for 1–2 rows of `A` on AVX2 without AVX-512: [`avx512::decode_rows`]'s
/// loop in 8-lane vectors, one group at a time (four sums a row), the groups from
/// `qgroup.rs`'s `avx2` copy.
///
/// Each block's f16 scale is broadcast before it is converted (`qgroup.rs`'s `scale8`).
/// Loaded into one lane, it had merged into the register of one of Q8_0's sums, so each
/// block waited for the one before it: with the broadcast, Q8_0 took 0.35–0.38 of the time
/// at 1 × 4096 × 4096 and 1 × 4096 × 11008 and 0.43–0.47 at 2 × 4096 × 4096 (the AVX2 copy
/// forced on the 2-core AVX-512 Xeon, separate processes alternated three times, 2 threads,
/// the same results); the other formats, whose merge register held a constant, were level.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::qgroup::avx2::Group256;
    use super::super::qgroup::{G, with_format};
    use super::{AVX2_ROWS_MAX_M, PREFETCH, QWeights};
    use std::arch::x86_64::*;
    use tilekit_kernels::quant::GgmlType;

    /// `acc[jj·m + i] = op(A)[i] · W[j0 + jj]` for `m` (1 to [`AVX2_ROWS_MAX_M`]) dense rows
    /// of `A` (`m × k`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn decode_rows(w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
        debug_assert!((1..=AVX2_ROWS_MAX_M).contains(&m));
        // SAFETY: the caller promises AVX2, FMA and F16C.
        with_format!(w.ty, F => unsafe {
            match m {
                1 => rows::<F, 1>(w, a, j0, acc),
                _ => rows::<F, 2>(w, a, j0, acc),
            }
        }, _ => acc.fill(f32::NAN));
    }

    /// [`decode_rows`] for format `F` and `M` rows.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows<F: Group256, const M: usize>(w: &QWeights, a: &[f32], j0: usize, acc: &mut [f32]) {
        let (k, gpb) = (w.k, F::BS / G);
        let nb = k / F::BS;
        let cols = acc.len() / M;
        assert!(w.holds::<F>(j0, cols) && a.len() >= M * k, "decode rows past their operands");
        let pf = PREFETCH / F::BB;
        for (jj, out) in acc.chunks_exact_mut(M).enumerate() {
            let b0 = (j0 + jj) * nb;
            // SAFETY (every pointer below): rows j0 .. j0 + cols of both planes, nb blocks
            // each, and A's M rows of k are inside the slices (asserted); block b < nb of the
            // row starts at b · SB and b · BB, and its groups g < gpb at column b · BS + g · 32.
            let (sp, qp) = unsafe { (w.scales.as_ptr().add(b0 * F::SB), w.body.as_ptr().add(b0 * F::BB)) };
            let mut sum = [[_mm256_setzero_ps(); 4]; M];
            for b in 0..nb {
                unsafe {
                    // A hint only: past the planes' end it reads nothing.
                    _mm_prefetch::<_MM_HINT_T0>(qp.wrapping_add((b + pf) * F::BB).cast());
                    _mm_prefetch::<_MM_HINT_T0>(sp.wrapping_add((b + pf) * F::SB).cast());
                    let (s, q) = (sp.add(b * F::SB), qp.add(b * F::BB));
                    let sc = F::scales(s, q);
                    for g in 0..gpb {
                        let wv = F::group256(&sc, q, g);
                        for (i, s) in sum.iter_mut().enumerate() {
                            let ap = a.as_ptr().add(i * k + b * F::BS + g * G);
                            for v in 0..4 {
                                s[v] = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(8 * v)), wv[v], s[v]);
                            }
                        }
                    }
                }
            }
            for (o, s) in out.iter_mut().zip(&sum) {
                let v = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                *o = _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)));
            }
        }
    }
}

/// Weight rows per tile of [`tiles_fmt`] (the `N × K` tile's columns).
const TILE_W: usize = 3;

/// `K` per chunk of [`tiles_fmt`]: a tile's three dequantized rows over one chunk (12 KiB)
/// stay in L1 while the row groups of `A` pass over them, as in the dense `N × K` kernel.
const TILE_KC: usize = 1024;

/// The decode kernel without AVX-512, from [`TILES_MIN_M`] rows of `A`: [`decode_fmt`]'s sums
/// with the weight's rows taken [`TILE_W`] at a time and `K` in chunks of [`TILE_KC`]; each
/// chunk of those rows is dequantized into an L1 buffer and met by the dense `N × K` kernel's
/// register tiles (`gemv.rs`'s `chunk_tile`: 4 rows of `A`, packed by `pack_groups`, × 3
/// weight rows, 8-lane sums, summed pairwise at the end). Each row of `op(A)` is read once per
/// three weight rows instead of once per row.
#[inline(always)]
fn tiles_fmt<const FMA: bool, F: Format>(w: &QWeights, apack: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
    use super::gemv::{DOT_LANES, GROUP, chunk_tile, pairwise_sum};
    let k = w.k;
    let cols = acc.len() / m;
    let mut buf = [0.0f32; TILE_W * TILE_KC];
    let mut part = [[0.0f32; DOT_LANES]; SKINNY_M * TILE_W];
    let null = std::ptr::null();
    let mut jj = 0;
    while jj < cols {
        let c = TILE_W.min(cols - jj);
        let part = &mut part[..m * c];
        part.fill([0.0; DOT_LANES]);
        for q0 in (0..k).step_by(TILE_KC) {
            let kl = TILE_KC.min(k - q0);
            for (j, dst) in buf.chunks_exact_mut(TILE_KC).take(c).enumerate() {
                chunk_of::<F>(w.scales, w.body, k, j0 + jj + j, q0, &mut dst[..kl]);
            }
            for g0 in (0..m).step_by(GROUP) {
                let r = GROUP.min(m - g0);
                // The group's packed steps start at g0 · k; its chunk at q0 · r further on.
                let ap = &apack[g0 * k + q0 * r..];
                let pt = &mut part[g0 * c..];
                macro_rules! by_rows {
                    ($c:literal) => {
                        match r {
                            4 => chunk_tile::<FMA, 4, $c>(ap, &buf, TILE_KC, kl, pt, c, null),
                            3 => chunk_tile::<FMA, 3, $c>(ap, &buf, TILE_KC, kl, pt, c, null),
                            2 => chunk_tile::<FMA, 2, $c>(ap, &buf, TILE_KC, kl, pt, c, null),
                            _ => chunk_tile::<FMA, 1, $c>(ap, &buf, TILE_KC, kl, pt, c, null),
                        }
                    };
                }
                match c {
                    3 => by_rows!(3),
                    2 => by_rows!(2),
                    _ => by_rows!(1),
                }
            }
        }
        for j in 0..c {
            for i in 0..m {
                acc[(jj + j) * m + i] = pairwise_sum(part[i * c + j]);
            }
        }
        jj += c;
    }
}

#[inline(always)]
fn decode_tiles_inner<const FMA: bool>(w: &QWeights, apack: &[f32], m: usize, j0: usize, acc: &mut [f32]) {
    with_format!(w.ty, F => tiles_fmt::<FMA, F>(w, apack, m, j0, acc), _ => acc.fill(f32::NAN));
}

multiversion! {
    /// [`tiles_fmt`] for the weight's format and the detected instruction set.
    fn decode_tiles(w: &QWeights, apack: &[f32], m: usize, j0: usize, acc: &mut [f32]) => decode_tiles_inner
}

/// The decode kernels (`M ≤ 16`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Decode {
    /// [`decode_fmt`]: each group meets every row of `A`.
    Groups,
    /// [`tiles_fmt`]: dequantized chunks of three weight rows, `gemv.rs`'s `N × K` tiles.
    Tiles,
    /// [`avx512::decode`]: dequantized chunks of six weight rows, the AVX-512 dot tiles.
    #[cfg(target_arch = "x86_64")]
    Avx512Tiles,
    /// [`avx512::decode_rows`]: [`decode_fmt`]'s order with the groups and sums in registers.
    #[cfg(target_arch = "x86_64")]
    Avx512Rows,
    /// [`avx2::decode_rows`]: the same in 8-lane vectors, 1–2 rows.
    #[cfg(target_arch = "x86_64")]
    Avx2Rows,
}

/// The decode kernel for `m` rows of `A` in `isa`.
fn decode_kernel(isa: Isa, m: usize) -> Decode {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        return if m <= ROWS_MAX_M { Decode::Avx512Rows } else { Decode::Avx512Tiles };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && m <= AVX2_ROWS_MAX_M {
        return Decode::Avx2Rows;
    }
    if m < TILES_MIN_M {
        return Decode::Groups;
    }
    let _ = isa;
    Decode::Tiles
}

/// Weight rows per panel of the larger-M path: an L2-sized slab of `K` dequantized values per
/// row, at least 8 and at most 256 rows.
fn panel_cols(k: usize) -> usize {
    (PANEL / k.max(1)).clamp(8, 256)
}

/// One panel of the larger-M path: dequantizes weight rows `j0 .. j0 + cols` and multiplies.
fn panel(isa: Isa, w: &QWeights, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) -> Result<()> {
    let k = w.k;
    let cols = acc.len() / m;
    let mut wp = scratch(cols * k)?;
    dequant_rows(isa, w.ty, w.scales, w.body, k, j0, &mut wp);
    // SAFETY: dst is `acc`, m × cols column-major (element (i, jj) at jj·m + i), exclusively
    // borrowed; lhs is `a`, m × k row-major, and rhs(p, jj) = wp[jj·k + p]: every index gemm
    // forms lies inside those three slices, which do not overlap. read_dst is false.
    unsafe {
        gemm_f32(
            m,
            cols,
            k,
            Strided { ptr: acc.as_mut_ptr(), rs: 1, cs: m },
            Strided { ptr: a.as_ptr(), rs: k, cs: 1 },
            Strided { ptr: wp.as_ptr(), rs: 1, cs: k },
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}

/// The operands of one quantized matmul, as f32 (but the weight).
pub(super) struct QuantOperands<'d> {
    pub(super) a: &'d [f32],
    pub(super) w: QWeights<'d>,
    pub(super) bias: Option<&'d [f32]>,
    pub(super) c: Option<&'d [f32]>,
}

impl QuantOperands<'_> {
    /// Runs the matmul into `out` (the output buffer, in its storage type).
    pub(super) fn run<E: Elem>(&self, desc: &MatmulDesc, out: &mut [E]) -> Result<()> {
        self.run_with(Isa::detect(), desc, out)
    }

    /// [`Self::run`] with the kernels compiled for `isa` (tests run every one the CPU has).
    pub(super) fn run_with<E: Elem>(&self, isa: Isa, desc: &MatmulDesc, out: &mut [E]) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        if self.w.n != n || self.w.k != k {
            return Err(internal("the weight's shape does not match the descriptor".into()));
        }
        self.w.check()?;
        let (ar, ac) = desc.a_stored();
        if desc.a.required_len(desc.batch, ar, ac).is_none_or(|need| need > self.a.len()) {
            return Err(internal("a's view is out of bounds".into()));
        }
        if let (Some(cv), Some(c)) = (desc.c, self.c)
            && cv.required_len(desc.batch, m, n).is_none_or(|need| need > c.len())
        {
            return Err(internal("c's view is out of bounds".into()));
        }
        if desc.out.required_len(desc.batch, m, n).is_none_or(|need| need > out.len()) {
            return Err(internal("the output view is out of bounds".into()));
        }
        if self.bias.is_some_and(|b| b.len() < n) {
            return Err(internal("bias shorter than N".into()));
        }
        let parallel = m * n * k >= PARALLEL_MIN;
        let mut a = scratch(m * k)?;
        let mut acc = scratch(n * m)?;
        let mut row = scratch(n)?;
        for bt in 0..desc.batch {
            // op(A) of this batch, dense row-major m × k.
            let a0 = desc.a.offset + bt * desc.a.batch_stride;
            let (rs, cs) = if desc.trans_a { (1, desc.a.ld) } else { (desc.a.ld, 1) };
            for (i, dst) in a.chunks_exact_mut(k.max(1)).enumerate().take(m) {
                for (p, x) in dst.iter_mut().enumerate() {
                    *x = self.a[a0 + i * rs + p * cs];
                }
            }
            if k > 0 {
                let (a, w) = (&a[..], &self.w);
                if m <= SKINNY_M {
                    let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
                    let cols = n.div_ceil(4 * threads).max(8);
                    let kernel = decode_kernel(isa, m);
                    // A packed in groups of 4 rows for the tiles without AVX-512.
                    let apack =
                        if kernel == Decode::Tiles { super::gemv::pack_groups(a, k, m, k)? } else { Vec::new() };
                    let task = |(b, chunk): (usize, &mut [f32])| match kernel {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `decode_kernel` only picks these for `Isa::Avx512`, which is only
                        // made where the CPU reported AVX-512F and F16C.
                        Decode::Avx512Tiles => unsafe { avx512::decode(w, a, m, b * cols, chunk) },
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: as above.
                        Decode::Avx512Rows => unsafe { avx512::decode_rows(w, a, m, b * cols, chunk) },
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: only picked for `Isa::Avx2`, made where the CPU reported
                        // AVX2, FMA and F16C.
                        Decode::Avx2Rows => unsafe { avx2::decode_rows(w, a, m, b * cols, chunk) },
                        Decode::Tiles => decode_tiles(isa, w, &apack, m, b * cols, chunk),
                        Decode::Groups => decode_cols(isa, w, a, m, b * cols, chunk),
                    };
                    if parallel {
                        for_each_chunk_mut(&mut acc, cols * m, |b, c| task((b, c)));
                    } else {
                        acc.chunks_mut(cols * m).enumerate().for_each(task);
                    }
                } else {
                    let cols = panel_cols(k);
                    let task = |(b, chunk): (usize, &mut [f32])| panel(isa, w, a, m, b * cols, chunk);
                    if parallel {
                        try_for_each_chunk_mut(&mut acc, cols * m, |b, c| task((b, c)))?;
                    } else {
                        acc.chunks_mut(cols * m).enumerate().try_for_each(task)?;
                    }
                }
            } else {
                acc.fill(0.0);
            }
            let epi = Epilogue::new(
                desc.alpha,
                self.bias.map(|b| &b[..n]),
                match (desc.c, self.c) {
                    (Some(cv), Some(c)) => Some((c, cv, desc.beta)),
                    _ => None,
                },
                desc.activation,
                bt,
            );
            for i in 0..m {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = acc[j * m + i];
                }
                epilogue_rows(isa, &epi, i, 0, n, &mut row);
                let o = desc.out.index(bt, i, 0);
                E::narrow_into(&row, &mut out[o..o + n]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::quant_tensor::split_planes;
    use half::f16;
    use tilekit_kernels::quant::dequantize;

    /// Blocks of `ty` with random quants and scales chosen so that every dequantized weight is
    /// a small multiple of 1/2 and every sum of up to 1280 products with A in `[-2, 2]` is
    /// exact in f32 (so any summation order gives the f64 reference's value).
    fn exact_blocks(ty: GgmlType, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 20) as u8
        };
        let mut out: Vec<u8> = (0..ty.tensor_bytes(&[n, k]).unwrap()).map(|_| next()).collect();
        let f = |x: f32| f16::from_f32(x).to_le_bytes();
        for (b, blk) in out.chunks_exact_mut(ty.block_bytes()).enumerate() {
            let d = [1.0, 0.5, 2.0][b % 3];
            match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 => blk[..2].copy_from_slice(&f(d)),
                GgmlType::Q4_1 => {
                    blk[..2].copy_from_slice(&f(d));
                    blk[2..4].copy_from_slice(&f([-3.0, 0.0, 1.5][b % 3]));
                }
                GgmlType::Q4K => {
                    blk[..2].copy_from_slice(&f(d.min(1.0)));
                    blk[2..4].copy_from_slice(&f([0.5, 1.0, 0.0][b % 3]));
                }
                GgmlType::Q6K => {
                    // Sub-block scales in [-16, 16).
                    for s in &mut blk[192..208] {
                        *s = (*s & 0x1F).wrapping_sub(16);
                    }
                    blk[208..210].copy_from_slice(&f(d.min(1.0)));
                }
                _ => unreachable!(),
            }
        }
        out
    }

    /// Runs `op(A) · dequantize(W)ᵀ (+ bias)` in `isa` and compares every output word with the
    /// f64 reference (and the guard words after the output with their sentinel).
    fn check(isa: Isa, ty: GgmlType, (m, n, k): (usize, usize, usize), trans_a: bool, seed: &mut u64) {
        let bytes = exact_blocks(ty, n, k, seed);
        let wd = dequantize(ty, &bytes, &[n, k]).unwrap();
        let a: Vec<f32> = (0..m * k).map(|p| ((p as u64 * 7 + *seed) % 5) as f32 - 2.0).collect();
        let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 - 3.0).collect();
        let with_bias = (m + n) % 2 == 1;
        let g = PlaneGeometry::of(ty).unwrap();
        let (s, b) = split_planes(g, ty.block_bytes(), &bytes);
        let mut desc = MatmulDesc::new(m, n, k);
        desc.trans_b = true;
        desc.trans_a = trans_a;
        let (ar, ac) = desc.a_stored();
        desc.a = tilekit_kernels::MatrixView::dense(ar, ac);
        // A stored as op(A)ᵀ when trans_a: element (i, p) of op(A) at p · m + i.
        let stored: Vec<f32> = if trans_a { (0..k * m).map(|x| a[(x % m) * k + x / m]).collect() } else { a.clone() };
        let ops = QuantOperands {
            a: &stored,
            w: QWeights { ty, n, k, scales: &s, body: &b },
            bias: with_bias.then_some(&bias[..]),
            c: None,
        };
        let mut out = vec![-77.0f32; m * n + 3];
        ops.run_with(isa, &desc, &mut out).unwrap();
        for i in 0..m {
            for j in 0..n {
                let mut e: f64 = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(wd[j * k + p])).sum();
                if with_bias {
                    e += f64::from(bias[j]);
                }
                let got = out[i * n + j];
                assert_eq!(got, e as f32, "{ty} {isa:?} {m}x{n}x{k} trans_a={trans_a}: [{i}, {j}]");
            }
        }
        assert!(out[m * n..].iter().all(|&x| x == -77.0), "{ty} {isa:?} {m}x{n}x{k}: wrote past the output");
    }

    /// The one-group formats' scales converted 16 blocks at a time (`avx512::halves16`, then
    /// `Group512::scales_of`) are bit for bit what each block's own conversion gives
    /// (`Group512::scales`), for scale bytes of every kind (random: NaN, ±Inf, subnormal
    /// halves among them), over 37 blocks: two whole runs of 16 and a short last one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn batched_scales_match_each_blocks_own() {
        use super::super::qgroup::avx512::Group512;
        use super::super::qgroup::{Q4_0, Q4_1, Q8_0};
        use std::arch::x86_64::{__m512, _mm512_storeu_ps};
        if !Isa::available().contains(&Isa::Avx512) {
            println!("SKIP batched scales: this CPU has no AVX-512");
            return;
        }
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        fn check<F: Group512<Scales = __m512>>(seed: &mut u64) {
            let blocks = 37;
            let bytes: Vec<u8> = (0..blocks * F::SB)
                .map(|_| {
                    *seed ^= *seed << 13;
                    *seed ^= *seed >> 7;
                    *seed ^= *seed << 17;
                    (*seed >> 24) as u8
                })
                .collect();
            let h = F::SB / 2;
            let bits = |v: __m512| {
                let mut o = [0.0f32; 16];
                // SAFETY: AVX-512F; o holds 16 floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
                o.map(f32::to_bits)
            };
            for b0 in (0..blocks).step_by(16) {
                // SAFETY: AVX-512F and F16C (checked above); min(37 − b0, 16) · SB bytes from
                // block b0 are inside `bytes`; the body pointer is not read by these formats'
                // scales (their SB scale bytes are all they need).
                unsafe {
                    let f = avx512::halves16::<F>(bytes.as_ptr().add(b0 * F::SB), blocks - b0);
                    for b in b0..blocks.min(b0 + 16) {
                        let s = bytes.as_ptr().add(b * F::SB);
                        let at = (b - b0) * h;
                        let batched = F::scales_of(&f[at..at + h], s, std::ptr::null());
                        assert_eq!(bits(batched), bits(F::scales(s, std::ptr::null())), "block {b}");
                    }
                }
            }
        }
        let mut seed = 0x5EED_0F5C_A1E5_u64;
        // SAFETY: the CPU has AVX-512F and F16C (Isa::Avx512 is only made where it does).
        unsafe {
            check::<Q8_0>(&mut seed);
            check::<Q4_0>(&mut seed);
            check::<Q4_1>(&mut seed);
        }
    }

    /// Every format in every instruction set the CPU has: M = 1…16 (decode: the register
    /// kernels to 4 rows on AVX-512 and 2 on AVX2, with an odd and an even count of 32-element
    /// blocks, then the tiles; the portable kernel below 3 rows and the tiles from 3; every
    /// row-group remainder) and 17 (panels), K one block and many (across the tiles' 256- and
    /// 1024-element chunks, the last one short for the 32-element formats), N leaving every
    /// remainder of the 3- and 6-row weight tiles; then shapes large enough to split N across
    /// threads into blocks that do not divide it.
    #[test]
    fn quantized_matmul_is_exact_in_every_isa() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for ty in GgmlType::QUANTIZED {
            let bs = ty.block_size();
            let many = if bs == 32 { 37 * bs } else { 5 * bs };
            for isa in Isa::available() {
                for m in 1..=17 {
                    check(isa, ty, (m, 13, bs), m == 3, &mut seed);
                    check(isa, ty, (m, 7, 2 * bs), false, &mut seed);
                    check(isa, ty, (m, 5, many), m == 16, &mut seed);
                }
                for m in [1, 7, 16, 17] {
                    let (n, k) = (67, many);
                    assert!(m * n * k >= PARALLEL_MIN || m < 16, "the shape must reach the parallel path");
                    check(isa, ty, (m, n, k), false, &mut seed);
                }
            }
        }
    }
}
