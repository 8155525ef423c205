//! 1 × 1 convolutions of few input channels in register tiles (AVX2 and FMA, or AVX-512): the
//! fused block's expansion of at most [`SMALL_K`] channels (MobileNetV2's blocks 2–7) and the
//! pointwise kernel's layers of at most [`SMALL_K`], both layouts (the stem's 27 → 32 over
//! the im2col patches, block 1's 32 → 16 projection, the unfused chain's expansions).
//!
//! [`conv`] (pixels with their channels contiguous: NHWC, the block's rows) takes 6 pixels ×
//! 16 output channels a tile: twelve sums in registers that start at the bias (plus the
//! residual), take the input channels in order (one broadcast of the pixel's channel, two
//! weight vectors, one fused multiply-add each), and are stored once through ReLU or ReLU6
//! in registers; the weight is transposed once per call into [`Weights`] (`[C][ld]`, a few
//! KiB at these sizes). [`conv_planes`] (NCHW) swaps the roles: 6 output channels × 16
//! pixels of the planes, two vectors of one input plane and a broadcast weight (read as
//! stored) per step, the same sums in the same order, the last pixels of a row through
//! masked loads and stores. With so few input channels, `gemm`'s per-call packing of its
//! operands (and a second pass for the bias and activation) was most of the work: see
//! `block.rs` and `pointwise.rs` for the measurements.
//!
//! On AVX-512 the tiles are twice as wide ([`avx512`]): 6 pixels × 32 channels or 6 channels
//! × 32 pixels in twelve 16-lane sums, the last lanes of a tile masked (weights, bias,
//! residual and output alike), one vector per sum where 16 lanes or fewer are left. The same
//! sums in the same order, so the same bits. MobileNetV2 at 224² profiled per layer, the
//! AVX-512 and AVX2 tiles interleaved run by run in one process (2 threads of a 2-core
//! AVX-512 Xeon, medians of 41 and 61 runs, two runs): the stem's pointwise layer (27 → 32)
//! 0.80–0.87 of the time, block 1 (its 32 → 16 projection) 0.93–0.97, blocks 2–7 (their
//! expansions) 0.70–0.97; the whole network 0.93–0.95.

// The tiles are x86-64's; elsewhere the callers never take them (`Isa::Portable`).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::scratch;
#[cfg(target_arch = "x86_64")]
use super::{internal, matmul::Strided, simd::Isa};
use crate::Result;

/// Input channels up to which the tiles take a 1 × 1 convolution.
pub(super) const SMALL_K: usize = 32;

/// Output channels per register tile.
pub(super) const TILE_N: usize = 16;

/// The activation applied in registers before the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Act {
    /// None (the caller applies any other activation afterwards).
    None,
    /// `max(x, 0)`, NaN kept, −0 → +0 (as `Activation::apply_f32`).
    Relu,
    /// `clamp(x, 0, 6)`, NaN and −0 kept (as `f32::clamp`).
    Relu6,
}

/// A `[cout, C]` weight transposed to `[C][ld]` and its bias `[ld]`, zero-padded: `ld` is
/// `cout` rounded up to [`TILE_N`], plus one more tile, so a tile starting at any channel
/// `j0 < cout` reads inside the rows.
pub(super) struct Weights {
    pub(super) c: usize,
    pub(super) ld: usize,
    pub(super) wt: Vec<f32>,
    pub(super) bias: Vec<f32>,
}

impl Weights {
    /// `w` is `[cout][c]` (PyTorch's `[out, in]`); `bias`, if given, has `cout` elements.
    pub(super) fn new(w: &[f32], c: usize, cout: usize, bias: Option<&[f32]>) -> Result<Weights> {
        let ld = cout.next_multiple_of(TILE_N) + TILE_N;
        let mut out = Weights { c, ld, wt: scratch(c * ld)?, bias: scratch(ld)? };
        if c > 0 {
            for (j, row) in w.chunks_exact(c).take(cout).enumerate() {
                for (k, v) in row.iter().enumerate() {
                    out.wt[k * ld + j] = *v;
                }
            }
        }
        if let Some(b) = bias {
            out.bias[..cout].copy_from_slice(&b[..cout]);
        }
        Ok(out)
    }
}

/// `dst[px·ldo + j] = act(bias[j0 + j] + res[px·ldr + j] + Σ_k x(px, k) · wt[k][j0 + j])` for
/// `pixels` pixels and `j < jc` (see [`avx::conv`]), in the AVX-512 tiles where `isa` is
/// [`Isa::Avx512`], else the AVX2 ones; the same sums in the same order either way.
///
/// # Safety
/// `isa` is not [`Isa::Portable`] (so the CPU has AVX2 and FMA, and AVX-512F where `isa` says
/// so); `dst` is valid for writes of `jc` elements at each `px·ldo`, `px < pixels`, and no
/// other thread reads or writes those meanwhile.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn conv(
    isa: Isa,
    x: Strided<&[f32]>,
    x0: usize,
    w: &Weights,
    j0: usize,
    jc: usize,
    res: Option<(&[f32], usize)>,
    dst: *mut f32,
    ldo: usize,
    pixels: usize,
    act: Act,
) -> Result<()> {
    let c = w.c;
    if pixels == 0 || jc == 0 {
        return Ok(());
    }
    let last = (pixels - 1) * x.rs + c.saturating_sub(1) * x.cs;
    if c == 0
        || x0 + last >= x.ptr.len()
        || j0 + jc.next_multiple_of(TILE_N) > w.ld
        || w.wt.len() < c * w.ld
        || w.bias.len() < w.ld
        || res.is_some_and(|(r, ldr)| r.len() < (pixels - 1) * ldr + jc)
    {
        return Err(internal("a small-K 1x1 convolution past its buffers".into()));
    }
    let a = ConvArgs { x, x0, w, j0, jc, res, dst, ldo, pixels };
    // SAFETY: the operands checked above; the caller's contract; `Isa::Avx512` is only made
    // where the CPU has AVX-512F.
    unsafe {
        match isa {
            Isa::Avx512 => avx512::conv(&a, act),
            _ => avx::conv(&a, act),
        }
    }
    Ok(())
}

/// The operands of [`conv`], checked.
#[cfg(target_arch = "x86_64")]
struct ConvArgs<'a> {
    x: Strided<&'a [f32]>,
    x0: usize,
    w: &'a Weights,
    j0: usize,
    jc: usize,
    res: Option<(&'a [f32], usize)>,
    dst: *mut f32,
    ldo: usize,
    pixels: usize,
}

/// Pixels per block of [`avx::conv_planes`] and [`avx512::conv_planes`]: every group of output
/// channels takes one block before the next block starts, so the block's input (at most 32
/// planes × 512 bytes, 16 KiB) is read from L1 by all but the first group. Sweeping each group
/// over the whole row instead took 1.1–1.25× the time on MobileNetV2's NCHW layers of 16–32
/// input channels (in-process A/B, 2 threads); blocks of 64–512 pixels were level with this
/// (AVX2; on AVX-512, 512 was level with it on the stem).
#[cfg(target_arch = "x86_64")]
const PLANE_BLOCK: usize = 128;

/// [`conv`] with channels and pixels swapped, for planes (NCHW; see [`avx::conv_planes`]), in
/// the AVX-512 tiles where `isa` is [`Isa::Avx512`], else the AVX2 ones.
///
/// # Safety
/// As [`conv`], `dst` valid for writes of `pixels` elements at each `j·ldo`, `j < jc`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn conv_planes(
    isa: Isa,
    x: &[f32],
    ldx: usize,
    w: &[f32],
    c: usize,
    bias: Option<&[f32]>,
    jc: usize,
    res: Option<(&[f32], usize)>,
    dst: *mut f32,
    ldo: usize,
    pixels: usize,
    act: Act,
) -> Result<()> {
    if pixels == 0 || jc == 0 {
        return Ok(());
    }
    if c == 0
        || x.len() < (c - 1) * ldx + pixels
        || w.len() < jc * c
        || bias.is_some_and(|b| b.len() < jc)
        || res.is_some_and(|(r, ldr)| r.len() < (jc - 1) * ldr + pixels)
    {
        return Err(internal("a small-K 1x1 convolution past its buffers".into()));
    }
    // SAFETY: as in `conv`.
    unsafe {
        match isa {
            Isa::Avx512 => avx512::conv_planes(x, ldx, w, c, bias, jc, res, dst, ldo, pixels, act),
            _ => avx::conv_planes(x, ldx, w, c, bias, jc, res, dst, ldo, pixels, act),
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx {
    use super::{Act, ConvArgs, PLANE_BLOCK, TILE_N};
    use std::arch::x86_64::*;

    /// Pixels per register tile (6 × 16 sums, two weight vectors and the broadcast input in
    /// registers).
    const P: usize = 6;

    /// `dst[px·ldo + j] = act(bias[j0 + j] + res[px·ldr + j] + Σ_k x(px, k) · wt[k][j0 + j])`
    /// for `pixels` pixels and `j < jc`, where `x(px, k)` is `x.ptr[x0 + px·x.rs + k·x.cs]`
    /// (`w.c` channels) and `res` (if given) starts at the first pixel's first channel. The
    /// sums start at the bias, then add the residual, then take the channels in order, one
    /// fused multiply-add each; ReLU6 keeps NaN and −0 (MAXPS and MINPS return their second
    /// operand where either is NaN or both are zeros), ReLU keeps NaN and makes −0 +0.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `dst` is valid for writes of `jc` elements at each
    /// `px·ldo`, `px < pixels`, and no other thread reads or writes those meanwhile; the other
    /// operands are inside their buffers (checked by the dispatching `super` function).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn conv(a: &ConvArgs<'_>, act: Act) {
        // SAFETY: the caller's contract.
        unsafe {
            match act {
                Act::Relu6 => conv_act::<2>(a),
                Act::Relu => conv_act::<1>(a),
                Act::None => conv_act::<0>(a),
            }
        }
    }

    /// [`conv`] with activation `A` (0 none, 1 ReLU, 2 ReLU6): one copy per activation, so
    /// each copy's register tiles are allocated on their own.
    ///
    /// # Safety
    /// As [`conv`].
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn conv_act<const A: u8>(a: &ConvArgs<'_>) {
        let ConvArgs { x, x0, w, j0, jc, res, dst, ldo, pixels } = *a;
        let c = w.c;
        let mut px = 0;
        while px < pixels {
            let n = P.min(pixels - px);
            for jb in (0..jc).step_by(TILE_N) {
                let width = TILE_N.min(jc - jb);
                // SAFETY: pixels px..px + n and channels 0..c are inside x, channels
                // j0 + jb .. + 16 inside wt's rows and bias, the residual's pixels px..px + n
                // hold `width` channels from jb (all checked by `super::conv`); dst's are the
                // caller's promise, as is AVX2 and FMA.
                unsafe {
                    let t = Tile {
                        x: x.ptr.as_ptr().add(x0 + px * x.rs),
                        x_rs: x.rs,
                        x_cs: x.cs,
                        c,
                        w: w.wt.as_ptr().add(j0 + jb),
                        ldw: w.ld,
                        b: w.bias.as_ptr().add(j0 + jb),
                        res: res.map(|(r, ldr)| (r.as_ptr().add(px * ldr + jb), ldr)),
                        o: dst.add(px * ldo + jb),
                        ldo,
                        width,
                    };
                    match n {
                        6 => t.run::<6, A>(),
                        5 => t.run::<5, A>(),
                        4 => t.run::<4, A>(),
                        3 => t.run::<3, A>(),
                        2 => t.run::<2, A>(),
                        _ => t.run::<1, A>(),
                    }
                }
            }
            px += n;
        }
    }

    /// Output channels per tile of [`conv_planes`] (6 × 16 sums in registers).
    const CP: usize = 6;

    /// [`conv`] with channels and pixels swapped, for planes (NCHW): `dst[j·ldo + px] =
    /// act(bias[j] + res[j·ldr + px] + Σ_k w[j][k] · x[k·ldx + px])` for output channels
    /// `j < jc` and `pixels` pixels, where `x`, `res` and `dst` start at the first pixel of
    /// their first plane (for `x` its channel 0, for `res` and `dst` channel `j0`), and `w`
    /// is `[cout][c]` as stored, from channel `j0`. Tiles of 6 channels × 16 pixels: two
    /// vectors of a plane's pixels and a broadcast weight per step; the last pixels of a row
    /// through masked loads and stores. The sums in the same order as [`conv`]'s.
    ///
    /// # Safety
    /// As [`conv`]: AVX2 and FMA; `dst` is valid for writes of `pixels` elements at each
    /// `j·ldo`, `j < jc`, and no other thread reads or writes those meanwhile; the other
    /// operands are inside their buffers (checked by the dispatching `super` function).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn conv_planes(
        x: &[f32],
        ldx: usize,
        w: &[f32],
        c: usize,
        bias: Option<&[f32]>,
        jc: usize,
        res: Option<(&[f32], usize)>,
        dst: *mut f32,
        ldo: usize,
        pixels: usize,
        act: Act,
    ) {
        for p0 in (0..pixels).step_by(PLANE_BLOCK) {
            let p1 = (p0 + PLANE_BLOCK).min(pixels);
            let mut j = 0;
            while j < jc {
                let n = CP.min(jc - j);
                let mut px = p0;
                while px < p1 {
                    let width = TILE_N.min(p1 - px);
                    // SAFETY: channels j..j + n of w, bias and res, pixels px..px + width of
                    // every plane of x and res (checked by `super::conv_planes`); masked lanes
                    // past `width` are neither read nor written; dst's are the caller's
                    // promise, as is AVX2 and FMA.
                    unsafe {
                        let t = PlaneTile {
                            x: x.as_ptr().add(px),
                            ldx,
                            c,
                            w: w.as_ptr().add(j * c),
                            b: bias.map(|b| b.as_ptr().add(j)),
                            res: res.map(|(r, ldr)| (r.as_ptr().add(j * ldr + px), ldr)),
                            o: dst.add(j * ldo + px),
                            ldo,
                            width,
                        };
                        match n {
                            6 => t.run_act::<6>(act),
                            5 => t.run_act::<5>(act),
                            4 => t.run_act::<4>(act),
                            3 => t.run_act::<3>(act),
                            2 => t.run_act::<2>(act),
                            _ => t.run_act::<1>(act),
                        }
                    }
                    px += width;
                }
                j += n;
            }
        }
    }

    /// One tile of [`conv_planes`]: `x`, `res` and `o` at the tile's first pixel (planes
    /// `ldx`, `ldr`, `ldo` apart), `w` and `b` at its first channel, `width` (at most 16)
    /// pixels.
    struct PlaneTile {
        x: *const f32,
        ldx: usize,
        c: usize,
        w: *const f32,
        b: Option<*const f32>,
        res: Option<(*const f32, usize)>,
        o: *mut f32,
        ldo: usize,
        width: usize,
    }

    /// 16 floats from `p`, or the lanes of `(m0, m1)` where not `full` (the rest zero).
    ///
    /// # Safety
    /// The CPU has AVX2; `p` covers the lanes read.
    #[inline(always)]
    unsafe fn load(p: *const f32, full: bool, m0: __m256i, m1: __m256i) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        unsafe {
            if full {
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            } else {
                (_mm256_maskload_ps(p, m0), _mm256_maskload_ps(p.add(8), m1))
            }
        }
    }

    impl PlaneTile {
        /// # Safety
        /// As [`PlaneTile::run`].
        #[inline(always)]
        unsafe fn run_act<const N: usize>(&self, act: Act) {
            // SAFETY: the caller's contract.
            unsafe {
                match act {
                    Act::Relu6 => self.run::<N, 2>(),
                    Act::Relu => self.run::<N, 1>(),
                    Act::None => self.run::<N, 0>(),
                }
            }
        }

        /// `N` channels, activation `A` (as [`Tile::run`]).
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA; the pointers cover what the tile reads and writes.
        #[inline(always)]
        unsafe fn run<const N: usize, const A: u8>(&self) {
            // SAFETY: the caller's contract; lanes past `width` masked off.
            unsafe {
                let full = self.width == TILE_N;
                // Lane l of (m0, m1) is on where l < width.
                let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let wv = _mm256_set1_epi32(self.width as i32);
                let m0 = _mm256_cmpgt_epi32(wv, lanes);
                let m1 = _mm256_cmpgt_epi32(wv, _mm256_add_epi32(lanes, _mm256_set1_epi32(8)));
                let mut acc = [[_mm256_setzero_ps(); 2]; N];
                for (i, a) in acc.iter_mut().enumerate() {
                    let b = self.b.map_or(_mm256_setzero_ps(), |b| _mm256_broadcast_ss(&*b.add(i)));
                    *a = [b, b];
                    if let Some((r, ldr)) = self.res {
                        let (r0, r1) = load(r.add(i * ldr), full, m0, m1);
                        a[0] = _mm256_add_ps(a[0], r0);
                        a[1] = _mm256_add_ps(a[1], r1);
                    }
                }
                for k in 0..self.c {
                    let (x0, x1) = load(self.x.add(k * self.ldx), full, m0, m1);
                    for (i, a) in acc.iter_mut().enumerate() {
                        let wv = _mm256_broadcast_ss(&*self.w.add(i * self.c + k));
                        a[0] = _mm256_fmadd_ps(wv, x0, a[0]);
                        a[1] = _mm256_fmadd_ps(wv, x1, a[1]);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    let o = self.o.add(i * self.ldo);
                    let (v0, v1) = (activate::<A>(a[0]), activate::<A>(a[1]));
                    if full {
                        _mm256_storeu_ps(o, v0);
                        _mm256_storeu_ps(o.add(8), v1);
                    } else {
                        _mm256_maskstore_ps(o, m0, v0);
                        _mm256_maskstore_ps(o.add(8), m1, v1);
                    }
                }
            }
        }
    }

    /// One tile of [`conv`]: `x` at its first pixel, `w` and `b` at its first channel (`w`'s
    /// rows `ldw` apart), `res` and `o` at its first output (pixels `ldr`, `ldo` apart),
    /// `width` (at most 16) channels stored.
    struct Tile {
        x: *const f32,
        x_rs: usize,
        x_cs: usize,
        c: usize,
        w: *const f32,
        ldw: usize,
        b: *const f32,
        res: Option<(*const f32, usize)>,
        o: *mut f32,
        ldo: usize,
        width: usize,
    }

    /// `acc[i] += Σ_k x[i·x_rs + k·x_cs] · w[k·ldw..][..16]` over `k < c`, in order.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the pointers cover what is read.
    #[inline(always)]
    unsafe fn sums<const N: usize>(
        x: *const f32,
        x_rs: usize,
        x_cs: usize,
        c: usize,
        w: *const f32,
        ldw: usize,
        mut acc: [[__m256; 2]; N],
    ) -> [[__m256; 2]; N] {
        // SAFETY: the caller's contract.
        unsafe {
            for k in 0..c {
                let w0 = _mm256_loadu_ps(w.add(k * ldw));
                let w1 = _mm256_loadu_ps(w.add(k * ldw + 8));
                for (i, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_broadcast_ss(&*x.add(i * x_rs + k * x_cs));
                    a[0] = _mm256_fmadd_ps(xv, w0, a[0]);
                    a[1] = _mm256_fmadd_ps(xv, w1, a[1]);
                }
            }
            acc
        }
    }

    /// Activation `A` of [`Tile::run`] on one vector.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    pub(in super::super) unsafe fn activate<const A: u8>(v: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            let zero = _mm256_setzero_ps();
            match A {
                // Zero where v ≤ 0 (false for NaN, true for −0).
                1 => _mm256_blendv_ps(v, zero, _mm256_cmp_ps::<_CMP_LE_OQ>(v, zero)),
                // `black_box` keeps LLVM from hoisting the splat of 6 out of the tile loops:
                // held in a register across the multiply-adds it made the tiles spill a sum.
                2 => _mm256_min_ps(_mm256_set1_ps(std::hint::black_box(6.0)), _mm256_max_ps(zero, v)),
                _ => v,
            }
        }
    }

    impl Tile {
        /// `N` pixels, activation `A` (0 none, 1 ReLU, 2 ReLU6).
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA; the pointers cover what the tile reads and writes.
        #[inline(always)]
        unsafe fn run<const N: usize, const A: u8>(&self) {
            // SAFETY: the caller's contract; partial widths go through `buf`.
            unsafe {
                let full = self.width == TILE_N;
                let (b0, b1) = (_mm256_loadu_ps(self.b), _mm256_loadu_ps(self.b.add(8)));
                let mut acc = [[b0, b1]; N];
                if let Some((r, ldr)) = self.res {
                    let mut buf = [0.0f32; TILE_N];
                    for (i, a) in acc.iter_mut().enumerate() {
                        let rp = if full {
                            r.add(i * ldr)
                        } else {
                            std::ptr::copy_nonoverlapping(r.add(i * ldr), buf.as_mut_ptr(), self.width);
                            buf.as_ptr()
                        };
                        a[0] = _mm256_add_ps(a[0], _mm256_loadu_ps(rp));
                        a[1] = _mm256_add_ps(a[1], _mm256_loadu_ps(rp.add(8)));
                    }
                }
                let acc = sums(self.x, self.x_rs, self.x_cs, self.c, self.w, self.ldw, acc);
                for (i, a) in acc.iter().enumerate() {
                    let o = self.o.add(i * self.ldo);
                    if full {
                        _mm256_storeu_ps(o, activate::<A>(a[0]));
                        _mm256_storeu_ps(o.add(8), activate::<A>(a[1]));
                    } else {
                        let mut buf = [0.0f32; TILE_N];
                        _mm256_storeu_ps(buf.as_mut_ptr(), activate::<A>(a[0]));
                        _mm256_storeu_ps(buf.as_mut_ptr().add(8), activate::<A>(a[1]));
                        std::ptr::copy_nonoverlapping(buf.as_ptr(), o, self.width);
                    }
                }
            }
        }
    }
}

/// The AVX-512 copies of [`avx::conv`] and [`avx::conv_planes`]: tiles of 6 pixels × 32 output
/// channels (rows) or 6 output channels × 32 pixels (planes), twelve 16-lane sums, the last
/// 16 or fewer lanes of a tile through masked loads and stores (a tile of at most 16 lanes
/// takes one vector per sum). The sums start and run as in the AVX2 tiles, so both give the
/// same bits.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::{Act, ConvArgs, PLANE_BLOCK};
    use std::arch::x86_64::*;

    /// Lanes per vector.
    const L: usize = 16;
    /// Pixels (rows) or output channels (planes) per tile.
    const P: usize = 6;

    /// Lanes `0..n` on (all 16 from `n = 16` on).
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        if n >= L { 0xffff } else { ((1u32 << n) - 1) as __mmask16 }
    }

    /// Activation `A` (0 none, 1 ReLU, 2 ReLU6) on one vector, as the AVX2 tiles' `activate`.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    pub(in super::super) unsafe fn activate<const A: u8>(v: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            let zero = _mm512_setzero_ps();
            match A {
                // Zero where v ≤ 0 (false for NaN, true for −0).
                1 => _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, zero), v, zero),
                // MAXPS and MINPS return their second operand where either is NaN or both are
                // zeros: NaN and −0 kept. `black_box`: as in the AVX2 tiles.
                2 => _mm512_min_ps(_mm512_set1_ps(std::hint::black_box(6.0)), _mm512_max_ps(zero, v)),
                _ => v,
            }
        }
    }

    /// [`super::avx::conv`] in 512-bit tiles.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX2 and FMA; `dst` is valid for writes of `jc` elements at each
    /// `px·ldo`, `px < pixels`, and no other thread reads or writes those meanwhile; the other
    /// operands are inside their buffers (checked by the dispatching `super` function).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn conv(a: &ConvArgs<'_>, act: Act) {
        // SAFETY: the caller's contract.
        unsafe {
            match act {
                Act::Relu6 => conv_act::<2>(a),
                Act::Relu => conv_act::<1>(a),
                Act::None => conv_act::<0>(a),
            }
        }
    }

    /// [`conv`] with activation `A`, its operands checked: one copy per activation, each
    /// with its own register allocation.
    ///
    /// # Safety
    /// As [`conv`], the operands inside their buffers.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn conv_act<const A: u8>(a: &ConvArgs<'_>) {
        let ConvArgs { x, x0, w, j0, jc, res, dst, ldo, pixels } = *a;
        let mut px = 0;
        while px < pixels {
            let n = P.min(pixels - px);
            let mut jb = 0;
            while jb < jc {
                let width = (2 * L).min(jc - jb);
                // SAFETY: pixels px..px + n and channels 0..c inside x, channels j0 + jb ..
                // + width inside wt's rows and the bias, the residual's pixels px..px + n
                // hold `width` channels from jb (all checked by `super::conv`); lanes past `width`
                // are masked off; dst's are the caller's promise, as are the features.
                unsafe {
                    let t = Tile {
                        x: x.ptr.as_ptr().add(x0 + px * x.rs),
                        x_rs: x.rs,
                        x_cs: x.cs,
                        c: w.c,
                        w: w.wt.as_ptr().add(j0 + jb),
                        ldw: w.ld,
                        b: w.bias.as_ptr().add(j0 + jb),
                        res: res.map(|(r, ldr)| (r.as_ptr().add(px * ldr + jb), ldr)),
                        o: dst.add(px * ldo + jb),
                        ldo,
                        m: [lanes(width), lanes(width.saturating_sub(L))],
                    };
                    match (n, width > L) {
                        (6, true) => t.run::<6, 2, A>(),
                        (5, true) => t.run::<5, 2, A>(),
                        (4, true) => t.run::<4, 2, A>(),
                        (3, true) => t.run::<3, 2, A>(),
                        (2, true) => t.run::<2, 2, A>(),
                        (_, true) => t.run::<1, 2, A>(),
                        (6, false) => t.run::<6, 1, A>(),
                        (5, false) => t.run::<5, 1, A>(),
                        (4, false) => t.run::<4, 1, A>(),
                        (3, false) => t.run::<3, 1, A>(),
                        (2, false) => t.run::<2, 1, A>(),
                        (_, false) => t.run::<1, 1, A>(),
                    }
                }
                jb += width;
            }
            px += n;
        }
    }

    /// One tile of [`conv`]: `x` at its first pixel, `w` and `b` at its first channel (`w`'s
    /// rows `ldw` apart), `res` and `o` at its first output (pixels `ldr`, `ldo` apart), the
    /// lanes of its two vectors of channels in `m`.
    struct Tile {
        x: *const f32,
        x_rs: usize,
        x_cs: usize,
        c: usize,
        w: *const f32,
        ldw: usize,
        b: *const f32,
        res: Option<(*const f32, usize)>,
        o: *mut f32,
        ldo: usize,
        m: [__mmask16; 2],
    }

    impl Tile {
        /// `N` pixels × `V` vectors of channels, activation `A`.
        ///
        /// # Safety
        /// The CPU has AVX-512F; the pointers cover the lanes of `m` that the tile reads and
        /// writes.
        #[inline(always)]
        unsafe fn run<const N: usize, const V: usize, const A: u8>(&self) {
            // SAFETY: the caller's contract; lanes off in `m` are neither read nor written.
            unsafe {
                let mut b = [_mm512_setzero_ps(); V];
                for (v, b) in b.iter_mut().enumerate() {
                    *b = _mm512_maskz_loadu_ps(self.m[v], self.b.add(v * L));
                }
                let mut acc = [b; N];
                if let Some((r, ldr)) = self.res {
                    for (i, a) in acc.iter_mut().enumerate() {
                        for (v, a) in a.iter_mut().enumerate() {
                            *a = _mm512_add_ps(*a, _mm512_maskz_loadu_ps(self.m[v], r.add(i * ldr + v * L)));
                        }
                    }
                }
                for k in 0..self.c {
                    let mut wv = [_mm512_setzero_ps(); V];
                    for (v, wv) in wv.iter_mut().enumerate() {
                        *wv = _mm512_maskz_loadu_ps(self.m[v], self.w.add(k * self.ldw + v * L));
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xv = _mm512_set1_ps(*self.x.add(i * self.x_rs + k * self.x_cs));
                        for (a, wv) in a.iter_mut().zip(&wv) {
                            *a = _mm512_fmadd_ps(xv, *wv, *a);
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    for (v, a) in a.iter().enumerate() {
                        _mm512_mask_storeu_ps(self.o.add(i * self.ldo + v * L), self.m[v], activate::<A>(*a));
                    }
                }
            }
        }
    }

    /// [`super::avx::conv_planes`] in 512-bit tiles.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX2 and FMA; `dst` is valid for writes of `pixels` elements at
    /// each `j·ldo`, `j < jc`, and no other thread reads or writes those meanwhile; the other
    /// operands are inside their buffers (checked by the dispatching `super` function).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn conv_planes(
        x: &[f32],
        ldx: usize,
        w: &[f32],
        c: usize,
        bias: Option<&[f32]>,
        jc: usize,
        res: Option<(&[f32], usize)>,
        dst: *mut f32,
        ldo: usize,
        pixels: usize,
        act: Act,
    ) {
        for p0 in (0..pixels).step_by(PLANE_BLOCK) {
            let p1 = (p0 + PLANE_BLOCK).min(pixels);
            let mut j = 0;
            while j < jc {
                let n = P.min(jc - j);
                let mut px = p0;
                while px < p1 {
                    let width = (2 * L).min(p1 - px);
                    // SAFETY: channels j..j + n of w, bias and res, pixels px..px + width of
                    // every plane of x and res (checked by `super::conv_planes`); lanes past
                    // `width` are masked off; dst's are the caller's promise, as are the
                    // features.
                    unsafe {
                        let t = PlaneTile {
                            x: x.as_ptr().add(px),
                            ldx,
                            c,
                            w: w.as_ptr().add(j * c),
                            b: bias.map(|b| b.as_ptr().add(j)),
                            res: res.map(|(r, ldr)| (r.as_ptr().add(j * ldr + px), ldr)),
                            o: dst.add(j * ldo + px),
                            ldo,
                            m: [lanes(width), lanes(width.saturating_sub(L))],
                        };
                        match (n, width > L) {
                            (6, true) => t.run_act::<6, 2>(act),
                            (5, true) => t.run_act::<5, 2>(act),
                            (4, true) => t.run_act::<4, 2>(act),
                            (3, true) => t.run_act::<3, 2>(act),
                            (2, true) => t.run_act::<2, 2>(act),
                            (_, true) => t.run_act::<1, 2>(act),
                            (6, false) => t.run_act::<6, 1>(act),
                            (5, false) => t.run_act::<5, 1>(act),
                            (4, false) => t.run_act::<4, 1>(act),
                            (3, false) => t.run_act::<3, 1>(act),
                            (2, false) => t.run_act::<2, 1>(act),
                            (_, false) => t.run_act::<1, 1>(act),
                        }
                    }
                    px += width;
                }
                j += n;
            }
        }
    }

    /// One tile of [`conv_planes`]: `x`, `res` and `o` at the tile's first pixel (planes
    /// `ldx`, `ldr`, `ldo` apart), `w` and `b` at its first channel, the lanes of its two
    /// vectors of pixels in `m`.
    struct PlaneTile {
        x: *const f32,
        ldx: usize,
        c: usize,
        w: *const f32,
        b: Option<*const f32>,
        res: Option<(*const f32, usize)>,
        o: *mut f32,
        ldo: usize,
        m: [__mmask16; 2],
    }

    impl PlaneTile {
        /// # Safety
        /// As [`PlaneTile::run`].
        #[inline(always)]
        unsafe fn run_act<const N: usize, const V: usize>(&self, act: Act) {
            // SAFETY: the caller's contract.
            unsafe {
                match act {
                    Act::Relu6 => self.run::<N, V, 2>(),
                    Act::Relu => self.run::<N, V, 1>(),
                    Act::None => self.run::<N, V, 0>(),
                }
            }
        }

        /// `N` channels × `V` vectors of pixels, activation `A`.
        ///
        /// # Safety
        /// The CPU has AVX-512F; the pointers cover the lanes of `m` that the tile reads and
        /// writes.
        #[inline(always)]
        unsafe fn run<const N: usize, const V: usize, const A: u8>(&self) {
            // SAFETY: the caller's contract; lanes off in `m` are neither read nor written.
            unsafe {
                let mut acc = [[_mm512_setzero_ps(); V]; N];
                for (i, a) in acc.iter_mut().enumerate() {
                    let b = self.b.map_or(_mm512_setzero_ps(), |b| _mm512_set1_ps(*b.add(i)));
                    for (v, a) in a.iter_mut().enumerate() {
                        *a = b;
                        if let Some((r, ldr)) = self.res {
                            *a = _mm512_add_ps(*a, _mm512_maskz_loadu_ps(self.m[v], r.add(i * ldr + v * L)));
                        }
                    }
                }
                for k in 0..self.c {
                    let mut xv = [_mm512_setzero_ps(); V];
                    for (v, xv) in xv.iter_mut().enumerate() {
                        *xv = _mm512_maskz_loadu_ps(self.m[v], self.x.add(k * self.ldx + v * L));
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let wv = _mm512_set1_ps(*self.w.add(i * self.c + k));
                        for (a, xv) in a.iter_mut().zip(&xv) {
                            *a = _mm512_fmadd_ps(wv, *xv, *a);
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    for (v, a) in a.iter().enumerate() {
                        _mm512_mask_storeu_ps(self.o.add(i * self.ldo + v * L), self.m[v], activate::<A>(*a));
                    }
                }
            }
        }
    }
}
