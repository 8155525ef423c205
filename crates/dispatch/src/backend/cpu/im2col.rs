//! `im2col` on the CPU as a gather: each output element is one input element (or zero in the
//! padding), copied in its storage type, so the result is the depthwise convolution with
//! one-hot filters bit for bit (`Device::im2col`) without its `kh·kw` multiply-adds per
//! element. (MobileNetV2's NHWC stem, 3 channels × 9 taps per pixel, took 3.3 ms through the
//! depthwise kernel at 224², a quarter of the network.)
//!
//! - NCHW: output plane `c·kh·kw + t` is input plane `c` shifted by tap `t`: per output row,
//!   the columns whose tap lands inside the input row are one copy (a `copy_from_slice` at
//!   horizontal stride 1; at stride 2 the first of each pair of columns, which LLVM
//!   vectorises: MobileNetV2's NCHW stem gather took 0.80 of the time of a `step_by` loop,
//!   the two interleaved in one process, medians of 300, three runs), the rest zeros.
//! - NHWC: per output pixel, each tap inside the input copies the pixel's `C` channels to
//!   channels `c·kh·kw + t`; taps in the padding write zeros. Pixels whose every tap is inside
//!   the input read their window through a table of tap offsets, without a bounds test per
//!   tap; a 3 × 3 window of 3 channels (an RGB stem's) is copied unrolled at constant offsets
//!   ([`window`]): MobileNetV2's NHWC stem gather in the whole network (profiled, previous
//!   build and this one alternated, three pairs) 102–108 µs against 122–130.
//!
//! Output rows are split over the pool's threads above [`PARALLEL_MIN`] elements.

use super::internal;
use super::pool::for_each_chunk_mut;
use super::simd::{Isa, multiversion};
use crate::Result;
use tilekit_kernels::{Conv2dDesc, Layout};

/// Below this many output elements the gather runs on the calling thread (a few µs).
const PARALLEL_MIN: usize = 1 << 16;

/// Output elements per parallel task.
const TASK: usize = 1 << 15;

/// The input index along one axis that output position `o` reads at tap offset `off`
/// (`k·dilation`), if it is inside `0..len`.
#[inline(always)]
fn source(o: usize, stride: usize, off: usize, pad: usize, len: usize) -> Option<usize> {
    (o * stride + off).checked_sub(pad).filter(|&i| i < len)
}

/// The `kh × kw` patches of `x` as `C·kh·kw` channels into `out` (the depthwise convolution
/// of `d`, whose multiplier is `kh·kw`, with one-hot filters), `zero` in the padding.
pub(super) fn gather<T: Copy + Send + Sync>(d: &Conv2dDesc, x: &[T], zero: T, out: &mut [T]) -> Result<()> {
    gather_by(d, x.len(), out, |oh, ow, first, dst| match d.layout {
        Layout::Nchw => nchw_rows(d, x, zero, oh, ow, first, dst),
        _ => nhwc_rows(d, x, zero, oh, ow, first, dst),
    })
}

/// [`gather`] of f32 data, NCHW's row gathers compiled for the CPU's vector instructions (the
/// baseline copy moved SSE's 4 lanes at a time). NHWC's per-pixel windows were no faster
/// compiled so (0.95–1.07 of the time on the stem) and take the baseline copy.
pub(super) fn gather_f32(d: &Conv2dDesc, x: &[f32], out: &mut [f32]) -> Result<()> {
    if d.layout != Layout::Nchw {
        return gather(d, x, 0.0, out);
    }
    let isa = Isa::detect();
    gather_by(d, x.len(), out, |oh, ow, first, dst| nchw_rows_f32(isa, d, x, oh, ow, first, dst))
}

multiversion! {
    /// [`nchw_rows`] of f32 data, zeros in the padding.
    pub(super) fn nchw_rows_f32(d: &Conv2dDesc, x: &[f32], oh: usize, ow: usize, first: usize, dst: &mut [f32]) => nchw_rows_f32_inner
}

#[inline(always)]
fn nchw_rows_f32_inner<const FMA: bool>(
    d: &Conv2dDesc,
    x: &[f32],
    oh: usize,
    ow: usize,
    first: usize,
    dst: &mut [f32],
) {
    nchw_rows(d, x, 0.0, oh, ow, first, dst);
}

/// The checks and the split of [`gather`]: `rows(oh, ow, first, dst)` gathers whole output
/// rows from row `first` into `dst`.
fn gather_by<T: Send>(
    d: &Conv2dDesc,
    x_len: usize,
    out: &mut [T],
    rows: impl Fn(usize, usize, usize, &mut [T]) + Sync,
) -> Result<()> {
    let (oh, ow) = match (d.out_h(), d.out_w()) {
        (Some(h), Some(w)) => (h, w),
        _ => return Err(internal("an empty im2col output reached the backend".into())),
    };
    let (n, c, h, w) = (d.batch, d.channels, d.height, d.width);
    let (kh, kw) = (d.kernel_h, d.kernel_w);
    let taps = kh * kw;
    if d.multiplier != taps || taps == 0 {
        return Err(internal(format!("im2col of {kh}x{kw} taps with multiplier {}", d.multiplier)));
    }
    let total = n * c * taps * oh * ow;
    if x_len < n * c * h * w || out.len() < total {
        return Err(internal("im2col buffers are shorter than the descriptor".into()));
    }
    if total == 0 {
        return Ok(());
    }
    let out = &mut out[..total];
    // Whole output rows per task: NCHW rows of `ow`, NHWC pixel rows of `ow · C · taps`.
    let row = match d.layout {
        Layout::Nchw => ow,
        _ => ow * c * taps,
    };
    if total < PARALLEL_MIN {
        rows(oh, ow, 0, out);
    } else {
        let per = (TASK / row).max(1);
        for_each_chunk_mut(out, per * row, |i, dst| rows(oh, ow, i * per, dst));
    }
    Ok(())
}

/// NCHW output rows `first..` (row = ((image · C + c) · taps + t) · OH + oy), whole rows.
/// What a plane's rows share (its input plane, tap and columns inside the input) is worked
/// out once per plane: per row that was five divisions, a third of the stem's gather.
#[inline(always)]
pub(super) fn nchw_rows<T: Copy>(d: &Conv2dDesc, x: &[T], zero: T, oh: usize, ow: usize, first: usize, dst: &mut [T]) {
    let (c, h, w) = (d.channels, d.height, d.width);
    let taps = d.kernel_h * d.kernel_w;
    let total = dst.len() / ow;
    let mut r = 0;
    while r < total {
        let row = first + r;
        let (plane, oy0) = (row / oh, row % oh);
        let run = (oh - oy0).min(total - r);
        let (img_c, t) = (plane / taps, plane % taps);
        let (ky, kx) = (t / d.kernel_w, t % d.kernel_w);
        debug_assert!(img_c < d.batch * c);
        let xplane = &x[img_c * h * w..][..h * w];
        // The columns `lo..hi` read inside the row.
        let off = kx * d.dilation_w;
        let lo = d.pad_left.saturating_sub(off).div_ceil(d.stride_w).min(ow);
        let hi = if w + d.pad_left > off { (w + d.pad_left - off).div_ceil(d.stride_w).min(ow) } else { 0 }.max(lo);
        let first_x = (lo * d.stride_w + off).saturating_sub(d.pad_left);
        for (i, orow) in dst[r * ow..(r + run) * ow].chunks_exact_mut(ow).enumerate() {
            let Some(iy) = source(oy0 + i, d.stride_h, ky * d.dilation_h, d.pad_top, h) else {
                orow.fill(zero);
                continue;
            };
            let xrow = &xplane[iy * w..][..w];
            orow[..lo].fill(zero);
            orow[hi..].fill(zero);
            if lo < hi {
                let (o, n) = (&mut orow[lo..hi], hi - lo);
                match d.stride_w {
                    1 => o.copy_from_slice(&xrow[first_x..][..n]),
                    // Pairs of columns, the first of each kept: a shape LLVM turns into vector
                    // shuffles, where `step_by` stayed one element at a time.
                    2 => {
                        let pairs = &xrow[first_x..][..2 * n - 1];
                        for (o, p) in o.iter_mut().zip(pairs.chunks_exact(2)) {
                            *o = p[0];
                        }
                        o[n - 1] = pairs[2 * n - 2];
                    }
                    s => o.iter_mut().zip(xrow[first_x..].iter().step_by(s)).for_each(|(o, &v)| *o = v),
                }
            }
        }
        r += run;
    }
}

/// One interior pixel's window of `C` channels × `KH × KW` taps at dilation 1 along rows
/// (each of its `KH` rows is `KW · C` contiguous elements of `win`, rows `ld` apart) into
/// `pix` in PyTorch's order (`c · KH · KW + t`). With every size a constant, the copies are
/// unrolled at fixed offsets, one bounds test per row: the generic loop took an index, a
/// bounds test and a loop step per element.
#[inline(always)]
fn window<T: Copy, const C: usize, const KH: usize, const KW: usize>(win: &[T], ld: usize, pix: &mut [T]) {
    let pix = &mut pix[..C * KH * KW];
    for ky in 0..KH {
        let row = &win[ky * ld..][..KW * C];
        for ch in 0..C {
            for kx in 0..KW {
                pix[(ch * KH + ky) * KW + kx] = row[kx * C + ch];
            }
        }
    }
}

/// NHWC output rows `first..` (row = image · OH + oy), whole rows of `OW` pixels.
fn nhwc_rows<T: Copy>(d: &Conv2dDesc, x: &[T], zero: T, oh: usize, ow: usize, first: usize, dst: &mut [T]) {
    let (c, h, w) = (d.channels, d.height, d.width);
    let taps = d.kernel_h * d.kernel_w;
    let (kh, kw, dh, dw) = (d.kernel_h, d.kernel_w, d.dilation_h, d.dilation_w);
    // Each tap's offset in `x` from its window's first pixel.
    let offs: Vec<usize> = (0..taps).map(|t| ((t / kw) * dh * w + (t % kw) * dw) * c).collect();
    // Output columns lo..hi and rows with every tap inside the input.
    let (span_w, span_h) = ((kw - 1) * dw, (kh - 1) * dh);
    let lo = d.pad_left.div_ceil(d.stride_w).min(ow);
    let hi = if w + d.pad_left > span_w { (w + d.pad_left - span_w).div_ceil(d.stride_w).min(ow) } else { 0 }.max(lo);
    let inside = |oy: usize| oy * d.stride_h >= d.pad_top && oy * d.stride_h + span_h < h + d.pad_top;
    // The 3 × 3 window of 3 channels (an RGB stem's) unrolled.
    let rgb3x3 = (c, kh, kw, dw) == (3, 3, 3, 1);
    for (r, orow) in dst.chunks_exact_mut(ow * c * taps).enumerate() {
        let row = first + r;
        let (img, oy) = (row / oh, row % oh);
        for (ox, pix) in orow.chunks_exact_mut(c * taps).enumerate() {
            if (lo..hi).contains(&ox) && inside(oy) {
                // Interior: no bounds tests per tap.
                let iy = oy * d.stride_h - d.pad_top;
                let ix = ox * d.stride_w - d.pad_left;
                let win = &x[((img * h + iy) * w + ix) * c..];
                if rgb3x3 {
                    window::<T, 3, 3, 3>(win, dh * w * c, pix);
                    continue;
                }
                for (ch, taps_out) in pix.chunks_exact_mut(taps).enumerate() {
                    for (o, &off) in taps_out.iter_mut().zip(&offs) {
                        *o = win[off + ch];
                    }
                }
                continue;
            }
            for ky in 0..d.kernel_h {
                let iy = source(oy, d.stride_h, ky * d.dilation_h, d.pad_top, h);
                for kx in 0..d.kernel_w {
                    let t = ky * d.kernel_w + kx;
                    let ix = source(ox, d.stride_w, kx * d.dilation_w, d.pad_left, w);
                    match iy.zip(ix) {
                        Some((iy, ix)) => {
                            let xp = &x[((img * h + iy) * w + ix) * c..][..c];
                            for (ch, &v) in xp.iter().enumerate() {
                                pix[ch * taps + t] = v;
                            }
                        }
                        None => {
                            for ch in 0..c {
                                pix[ch * taps + t] = zero;
                            }
                        }
                    }
                }
            }
        }
    }
}
