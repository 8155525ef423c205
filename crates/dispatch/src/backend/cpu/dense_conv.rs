//! The dense convolution (`Device::conv2d`) on the CPU for reductions `Cin·kh·kw` of at most
//! [`small_k::SMALL_K`] (an RGB network's first layer: MobileNetV2's stem, 3 → 32 channels,
//! 3 × 3, stride 2), where the CPU has AVX2 and FMA. Through `Device::im2col` +
//! `Device::pointwise_conv2d` the stem writes its 27 patch channels for every output pixel
//! (1.35 MB at 224²) and reads them back; here no patches leave the core's caches. Each task
//! takes a block of whole output rows of one image (about [`BLOCK_PIXELS`] pixels), whose
//! outputs are consecutive in either layout:
//! - **NCHW**: the block's patches are gathered into the thread's buffer (`im2col.rs`'s row
//!   gather, compiled for the CPU's vectors: `K` planes of the block's pixels, 108 KiB at
//!   most, in L2), then multiplied by the pointwise kernel's small-K plane tiles
//!   (`small_k::conv_planes`: 6 output channels × 32 pixels, the weight as stored, bias and
//!   ReLU/ReLU6 in registers) straight into the output planes. The sums are im2col +
//!   pointwise's, element for element: the same bits.
//! - **NHWC**: no gather. Per output row, the taps whose input row is inside the image form a
//!   list; [`PX`] output pixels × 32 channels (AVX-512; 16 on AVX2) are accumulated in
//!   registers, each tap one row of the weight transposed once per call (`small_k::Weights`)
//!   times the pixels' input values broadcast from where they lie. Pixels whose window
//!   crosses the left or right edge take the same strips on their own list of the taps inside
//!   the row. The sums start at the bias and take the taps in PyTorch's order (`c·kh·kw +
//!   ky·kw + kx`, im2col's), so they are im2col + pointwise's, except that a tap in the
//!   padding adds nothing instead of a zero product (only the sign of a zero sum can differ).
//!   ReLU and ReLU6 are applied in registers (the tiles' own `activate`) and the strips store
//!   straight into the output where `Cout` is a whole number of strips (the stem's 32);
//!   otherwise a strip's channels run past `Cout`, and the row goes through the thread's
//!   buffer. (Straight stores with the activation in registers: the stem in NHWC in 0.68–0.72
//!   of the time of the row buffer and an activation pass after, 2 threads, a Xeon with
//!   AVX-512, separate builds alternated, three runs.)
//! - Other activations (not ReLU or ReLU6) run over the block after it, while it is in L2;
//!   half-precision outputs are narrowed from one f32 buffer of the whole output.
//!
//! Larger reductions, and CPUs without AVX2, take the composition itself.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::activation::map_in_place;
use super::im2col::nchw_rows_f32;
use super::pool::{for_each_chunk_mut, for_each_index};
use super::simd::Isa;
use super::{CHUNK, Elem, internal, scratch, small_k, transpose};
use crate::Result;
use crate::backend::DenseConvDesc;
use tilekit_kernels::{Activation, Layout};

/// Output pixels per task (whole rows, at least one): the patches of 27 channels for this
/// many pixels are 108 KiB.
const BLOCK_PIXELS: usize = 1024;

/// Whether a call takes this kernel: a reduction of 1 to [`small_k::SMALL_K`], AVX2 and FMA.
pub(super) fn takes(d: &DenseConvDesc) -> bool {
    cfg!(target_arch = "x86_64")
        && Isa::detect() != Isa::Portable
        && (1..=small_k::SMALL_K).contains(&d.reduction())
        && d.cout > 0
}

/// A checked dense convolution: f32 input `[N, Cin, H, W]` or `[N, H, W, Cin]`, weight `[Cout,
/// Cin, kh, kw]` (read as `[Cout, K]`), bias `Cout`.
pub(super) struct DenseConv<'a> {
    pub(super) d: DenseConvDesc,
    pub(super) x: &'a [f32],
    pub(super) w: &'a [f32],
    pub(super) bias: Option<&'a [f32]>,
}

/// The output pointer shared by the tasks.
struct Out(*mut f32);
// SAFETY: every task writes only its own block's elements (disjoint), see `DenseConv::all`.
unsafe impl Sync for Out {}

impl DenseConv<'_> {
    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let c = &self.d.conv;
        let (k, cout) = (self.d.reduction(), self.d.cout);
        let total = match (c.out_h(), c.out_w()) {
            (Some(h), Some(w)) => c.batch * cout * h * w,
            _ => return Err(internal("an empty conv2d output reached the backend".into())),
        };
        if !takes(&self.d)
            || self.x.len() < c.batch * c.channels * c.height * c.width
            || self.w.len() < cout * k
            || self.bias.is_some_and(|b| b.len() < cout)
            || out.len() < total
        {
            return Err(internal("conv2d operands do not match the descriptor".into()));
        }
        let out = &mut out[..total];
        match E::as_f32_mut(out) {
            Some(o) => self.all(o),
            None => {
                let mut o = scratch(total)?;
                self.all(&mut o)?;
                for_each_chunk_mut(out, CHUNK, |i, dst| E::narrow_into(&o[i * CHUNK..][..dst.len()], dst));
                Ok(())
            }
        }
    }

    /// Every block of output rows, in tasks over the pool.
    #[cfg(target_arch = "x86_64")]
    fn all(&self, out: &mut [f32]) -> Result<()> {
        let c = &self.d.conv;
        let (k, cout) = (self.d.reduction(), self.d.cout);
        let (oh, ow) = (c.out_h().unwrap_or(0), c.out_w().unwrap_or(0));
        // im2col's descriptor: the depthwise convolution with one-hot filters, multiplier kh·kw.
        let patches = c.multiplier(c.kernel_h * c.kernel_w);
        let isa = Isa::detect();
        let act = match c.activation {
            Activation::Relu => small_k::Act::Relu,
            Activation::Relu6 => small_k::Act::Relu6,
            _ => small_k::Act::None,
        };
        let after = act == small_k::Act::None && c.activation != Activation::None;
        let nhwc = c.layout != Layout::Nchw;
        // NHWC's tiles read the weight transposed (once per call); NCHW's as stored.
        let rows_w = if nhwc { Some(small_k::Weights::new(self.w, k, cout, self.bias)?) } else { None };
        // Blocks of about BLOCK_PIXELS, as many per image as a multiple of the threads where
        // one image is all the work (the stem at 224²: 14 blocks of 8 rows, not 13 of 9).
        let threads = rayon::current_num_threads().max(1);
        let mut want = (oh * ow).div_ceil(BLOCK_PIXELS).min(oh);
        if c.batch == 1 {
            want = want.next_multiple_of(threads).min(oh);
        }
        let rows = oh.div_ceil(want);
        let blocks = oh.div_ceil(rows);
        let plane = oh * ow;
        let o = Out(out.as_mut_ptr());
        let len = out.len();
        let failed = std::sync::Mutex::new(None);
        for_each_index(c.batch * blocks, &|t| {
            let o = &o;
            let (img, oy0) = (t / blocks, t % blocks * rows);
            let nr = rows.min(oh - oy0);
            let px = nr * ow;
            let (mut taps, mut edge) = (Vec::new(), Vec::new());
            let need = if nhwc { ow * rows_w.as_ref().map_or(0, |w| w.ld) } else { k * px };
            let r = transpose::with_product(need, |buf| -> Result<()> {
                let at = if nhwc { (img * oh + oy0) * ow * cout } else { img * cout * plane + oy0 * ow };
                let last = if nhwc { at + px * cout } else { at + (cout - 1) * plane + px };
                if last > len {
                    return Err(internal("a conv2d block past the output".into()));
                }
                // SAFETY (both): the block's output elements, from `at`, (NHWC) `px` pixels of
                // `cout` channels or (NCHW) `cout` runs of `px` pixels `plane` apart, are inside
                // the output (checked above) and only this task writes them; `isa` is not
                // Portable (`takes`).
                unsafe {
                    let dst = o.0.add(at);
                    if let Some(w) = &rows_w {
                        let dst = std::slice::from_raw_parts_mut(dst, px * cout);
                        for (i, dst) in dst.chunks_exact_mut(ow * cout).enumerate() {
                            let buf = &mut buf[..ow * w.ld];
                            let (ts, es) = (&mut taps, &mut edge);
                            match act {
                                small_k::Act::Relu6 => self.nhwc_row::<2>(isa, w, img, oy0 + i, ts, es, buf, dst),
                                small_k::Act::Relu => self.nhwc_row::<1>(isa, w, img, oy0 + i, ts, es, buf, dst),
                                small_k::Act::None => self.nhwc_row::<0>(isa, w, img, oy0 + i, ts, es, buf, dst),
                            }
                        }
                        if after {
                            map_in_place(isa, c.activation, dst, None);
                        }
                    } else {
                        for (kk, plane_rows) in buf.chunks_exact_mut(px).enumerate() {
                            nchw_rows_f32(isa, &patches, self.x, oh, ow, (img * k + kk) * oh + oy0, plane_rows);
                        }
                        small_k::conv_planes(isa, buf, px, self.w, k, self.bias, cout, None, dst, plane, px, act)?;
                        for j in (0..cout).filter(|_| after) {
                            map_in_place(
                                isa,
                                c.activation,
                                std::slice::from_raw_parts_mut(dst.add(j * plane), px),
                                None,
                            );
                        }
                    }
                }
                Ok(())
            });
            if let Err(e) | Ok(Err(e)) = r {
                failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
            }
        });
        match failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// NHWC output row `oy` of image `img` into `dst` (`ow` pixels of `cout`), with activation
    /// `A` (0 none, 1 ReLU, 2 ReLU6) applied in registers. Where `cout` is a whole number of
    /// strips the sums are stored straight into `dst`; otherwise a strip's channels run past
    /// `cout`, so they go pixel-major into `buf` (`w.ld` a pixel) and are copied from there.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn nhwc_row<const A: u8>(
        &self,
        isa: Isa,
        w: &small_k::Weights,
        img: usize,
        oy: usize,
        taps: &mut Vec<Tap>,
        edge: &mut Vec<Tap>,
        buf: &mut [f32],
        dst: &mut [f32],
    ) {
        let c = &self.d.conv;
        let (kh, kw, ch, width) = (c.kernel_h, c.kernel_w, c.channels, c.width);
        let (sw, pl) = (c.stride_w, c.pad_left);
        let ow = c.out_w().unwrap_or(0);
        let (ld, cout) = (w.ld, self.d.cout);
        // The row's taps whose input row is inside the image, in weight order.
        taps.clear();
        for ci in 0..ch {
            for ky in 0..kh {
                let Some(iy) = (oy * c.stride_h + ky * c.dilation_h).checked_sub(c.pad_top).filter(|&y| y < c.height)
                else {
                    continue;
                };
                for kx in 0..kw {
                    let kx_cols = kx * c.dilation_w;
                    let row = (img * c.height + iy) * width * ch + ci;
                    taps.push(Tap { w: ((ci * kh + ky) * kw + kx) * ld, x: row + kx_cols * ch, kx: kx_cols });
                }
            }
        }
        // Columns lo..hi have every tap's column inside the row.
        let span = (kw - 1) * c.dilation_w;
        let lo = pl.div_ceil(sw).min(ow);
        let hi = if width + pl > span { (width + pl - span).div_ceil(sw).min(ow) } else { 0 }.max(lo);
        let wide = isa == Isa::Avx512;
        let cbw = if wide { 32 } else { 16 };
        assert!(buf.len() >= ow * ld && w.wt.len() >= kh * kw * ch * ld, "conv2d row past its buffers");
        assert!(dst.len() >= ow * cout, "conv2d row past its output");
        // Where the sums go: `dst` (`cout` a pixel) or `buf` (`ld`).
        let direct = cout % cbw == 0;
        let (sums, ls) = if direct { (dst.as_mut_ptr(), cout) } else { (buf.as_mut_ptr(), ld) };
        // The edge columns: each through the strip kernel on its own list of the taps whose
        // column is inside the row, their inputs' indices absolute.
        for ox in (0..lo).chain(hi..ow) {
            edge.clear();
            edge.extend(taps.iter().filter_map(|t| {
                let ix = (ox * sw + t.kx).checked_sub(pl).filter(|&i| i < width)?;
                Some(Tap { w: t.w, x: t.x - t.kx * ch + ix * ch, kx: t.kx })
            }));
            assert!(edge.iter().all(|t| t.x < self.x.len()), "conv2d taps past the input");
            for cb in (0..cout).step_by(cbw) {
                // SAFETY: as for the interior strips below, every tap's index checked.
                unsafe {
                    let (xp, wp) = (self.x.as_ptr(), w.wt.as_ptr().add(cb));
                    let (bp, op) = (w.bias.as_ptr().add(cb), sums.add(ox * ls + cb));
                    if wide {
                        avx::strip512::<1, A>(xp, edge, 0, wp, bp, op, ls);
                    } else {
                        avx::strip256::<1, A>(xp, edge, 0, wp, bp, op, ls);
                    }
                }
            }
        }
        // The interior, PX pixels at a time (the last block overlapping the one before it;
        // rows of fewer interior pixels one at a time).
        if hi > lo {
            let last = taps.iter().map(|t| t.x).max().unwrap_or(0) + ((hi - 1) * sw - pl) * ch;
            assert!(taps.is_empty() || last < self.x.len(), "conv2d taps past the input");
            let mut ox = lo;
            while ox < hi {
                let (x0, n) = if hi - lo >= PX { (ox.min(hi - PX), PX) } else { (ox, 1) };
                let first = (x0 * sw - pl) * ch;
                for cb in (0..cout).step_by(cbw) {
                    // SAFETY: `isa` is AVX2 or AVX-512 (`takes`); every pixel read, interior
                    // and at most the last one, at a tap is at most `last` (asserted inside
                    // `x`); the weights of tap row k at t.w = k·ld, channels cb..cb + cbw ≤
                    // ld (`small_k::Weights` pads ld past cout by a tile); the stores, pixels
                    // x0..x0 + n ≤ ow of `ls` in `sums`: `buf` (`ld` ≥ cb + cbw) or, where
                    // cbw divides cout, `dst` (`cout` ≥ cb + cbw), both asserted long enough.
                    unsafe {
                        let (xp, wp) = (self.x.as_ptr().add(first), w.wt.as_ptr().add(cb));
                        let (bp, op) = (w.bias.as_ptr().add(cb), sums.add(x0 * ls + cb));
                        let step = sw * ch;
                        match (wide, n) {
                            (true, PX) => avx::strip512::<PX, A>(xp, taps, step, wp, bp, op, ls),
                            (true, _) => avx::strip512::<1, A>(xp, taps, step, wp, bp, op, ls),
                            (false, PX) => avx::strip256::<PX, A>(xp, taps, step, wp, bp, op, ls),
                            (false, _) => avx::strip256::<1, A>(xp, taps, step, wp, bp, op, ls),
                        }
                    }
                }
                ox = x0 + n;
            }
        }
        if !direct {
            for (d, s) in dst.chunks_exact_mut(cout).zip(buf.chunks_exact(ld)) {
                d.copy_from_slice(&s[..cout]);
            }
        }
    }

    /// Never taken off x86-64 (`takes`).
    #[cfg(not(target_arch = "x86_64"))]
    fn all(&self, _out: &mut [f32]) -> Result<()> {
        Err(internal("the direct conv2d kernel is x86-64's".into()))
    }
}

/// One tap of an NHWC row: its weights at `w` in `small_k::Weights::wt` (row `k`, `k·ld`),
/// the index in `x` of its input for the row's pixel at column 0 (the pixel's own offset
/// added by the kernel), and its column offset `kx·dilation`.
#[derive(Clone, Copy)]
struct Tap {
    w: usize,
    x: usize,
    kx: usize,
}

/// NHWC output pixels accumulated together: 6 × 32 channels in 12 AVX-512 registers, or 6 ×
/// 16 in 12 AVX2 ones.
const PX: usize = 6;

/// The NHWC interior strips: `N` pixels, each tap's input value broadcast from where it lies
/// (`x + t.x + j·step`) times one row of the transposed weight.
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::super::small_k::{avx as act256, avx512 as act512};
    use super::Tap;
    use std::arch::x86_64::*;

    /// 32 channels (two AVX-512 registers) of `N` pixels, from the bias `b`, into `out +
    /// j·ld`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `x + t.x + j·step` (j < N) is inside the input for every tap, `w
    /// + t.w` and `b` hold 32 floats, `out + j·ld` 32 writable ones.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn strip512<const N: usize, const A: u8>(
        x: *const f32,
        taps: &[Tap],
        step: usize,
        w: *const f32,
        b: *const f32,
        out: *mut f32,
        ld: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            let mut acc = [[_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16))]; N];
            for t in taps {
                let wv = [_mm512_loadu_ps(w.add(t.w)), _mm512_loadu_ps(w.add(t.w + 16))];
                let p = x.add(t.x);
                for (j, a) in acc.iter_mut().enumerate() {
                    let v = _mm512_set1_ps(*p.add(j * step));
                    a[0] = _mm512_fmadd_ps(v, wv[0], a[0]);
                    a[1] = _mm512_fmadd_ps(v, wv[1], a[1]);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(j * ld), act512::activate::<A>(a[0]));
                _mm512_storeu_ps(out.add(j * ld + 16), act512::activate::<A>(a[1]));
            }
        }
    }

    /// [`strip512`] on 16 channels in two AVX2 registers.
    ///
    /// # Safety
    /// As [`strip512`] with AVX2 and FMA, 16 floats at `w + t.w`, `b` and `out + j·ld`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn strip256<const N: usize, const A: u8>(
        x: *const f32,
        taps: &[Tap],
        step: usize,
        w: *const f32,
        b: *const f32,
        out: *mut f32,
        ld: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            let mut acc = [[_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8))]; N];
            for t in taps {
                let wv = [_mm256_loadu_ps(w.add(t.w)), _mm256_loadu_ps(w.add(t.w + 8))];
                let p = x.add(t.x);
                for (j, a) in acc.iter_mut().enumerate() {
                    let v = _mm256_set1_ps(*p.add(j * step));
                    a[0] = _mm256_fmadd_ps(v, wv[0], a[0]);
                    a[1] = _mm256_fmadd_ps(v, wv[1], a[1]);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(j * ld), act256::activate::<A>(a[0]));
                _mm256_storeu_ps(out.add(j * ld + 8), act256::activate::<A>(a[1]));
            }
        }
    }
}
