//! Depthwise 2-D convolution on the CPU, both layouts, any kernel size, stride, dilation,
//! padding and channel multiplier.
//!
//! - NCHW: one output row at a time is the SIMD vector. Each kernel row's taps are
//!   broadcast weights multiplied into shifted (or, at stride > 1, strided) runs of one input
//!   row. The padding is never materialised: every tap's valid output range is computed once
//!   per row ([`tap_range`]); for 3-wide kernels the three taps are fused into one pass over
//!   the columns where all three are valid, and the border columns take the taps one by one.
//! - NHWC: channels are the SIMD axis. Weights are transposed per task into a stack buffer
//!   laid out `[tap][channel]`, so every tap of a pixel is one contiguous multiply-add over
//!   the channel block.
//! - The bias and the activation are applied to the row while it is in L1, and half-precision
//!   outputs are rounded once when the row is stored. f32 outputs are accumulated where they
//!   lie; other dtypes through a stack buffer. No call allocates.
//! - Work is split over (image, channel plane) blocks for NCHW and (image, output row) blocks
//!   for NHWC, and only when the layer has enough multiply-adds to pay for the hand-off.

use super::activation::apply_isa;
use super::simd::{Isa, madd, multiversion};
use super::{Elem, internal};
use crate::Result;
use rayon::prelude::*;
use tilekit_kernels::{Conv2dDesc, Layout};

/// Below this many multiply-adds a convolution runs on the calling thread (~30 µs of work).
const PARALLEL_MIN: usize = 1 << 17;

/// Multiply-adds per parallel task (enough to amortise a task's ~1 µs many times over).
const TASK_WORK: usize = 1 << 16;

/// f32 elements of the stack buffers (32 KiB): a row piece of a half-precision output, or
/// the transposed weights of an NHWC channel block.
const BUF: usize = 8192;

/// A depthwise convolution over f32 inputs (widened if stored in half precision).
pub(super) struct Conv<'d> {
    pub(super) d: Conv2dDesc,
    pub(super) x: &'d [f32],
    pub(super) w: &'d [f32],
    pub(super) bias: Option<&'d [f32]>,
}

/// The output positions `o < out_len` whose tap at offset `off` (`k·dilation`) lands inside an
/// input of `len`: `0 ≤ o·stride + off − pad < len`. Returns `lo..hi` (empty if none).
fn tap_range(out_len: usize, len: usize, stride: usize, pad: usize, off: usize) -> (usize, usize) {
    let lo = pad.saturating_sub(off).div_ceil(stride);
    let hi = len.saturating_add(pad).saturating_sub(off).div_ceil(stride);
    let hi = hi.min(out_len);
    (lo.min(hi), hi)
}

impl Conv<'_> {
    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let d = &self.d;
        let (oh, ow) = match (d.out_h(), d.out_w()) {
            (Some(h), Some(w)) => (h, w),
            _ => return Err(internal("an empty conv output reached the backend".into())),
        };
        let occ = d.out_channels();
        let (h, w, c) = (d.height, d.width, d.channels);
        let total = d.batch * occ * oh * ow;
        if self.x.len() < d.batch * c * h * w
            || self.w.len() < occ * d.kernel_h * d.kernel_w
            || self.bias.is_some_and(|b| b.len() < occ)
            || out.len() < total
            || d.multiplier == 0
        {
            return Err(internal("conv buffers are shorter than the descriptor".into()));
        }
        if total == 0 {
            return Ok(());
        }
        let out = &mut out[..total];
        let isa = Isa::detect();
        let taps = d.kernel_h * d.kernel_w;
        let work = total * taps.max(1);
        match d.layout {
            Layout::Nchw => {
                let plane = oh * ow;
                let run = |first: usize, dst: &mut [E]| {
                    for (i, p) in dst.chunks_mut(plane).enumerate() {
                        self.nchw_plane(isa, first + i, ow, p);
                    }
                };
                if work < PARALLEL_MIN {
                    run(0, out);
                } else {
                    let per = (TASK_WORK / (plane * taps).max(1)).max(1);
                    out.par_chunks_mut(per * plane).enumerate().for_each(|(t, dst)| run(t * per, dst));
                }
            }
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            _ => {
                let row = ow * occ;
                let run = |first: usize, dst: &mut [E]| self.nhwc_rows(isa, first, oh, ow, dst);
                if work < PARALLEL_MIN {
                    run(0, out);
                } else {
                    let per = (TASK_WORK / (row * taps).max(1)).max(1);
                    out.par_chunks_mut(per * row).enumerate().for_each(|(t, dst)| run(t * per, dst));
                }
            }
        }
        Ok(())
    }

    /// One NCHW output plane (`plane` = image · out channels + out channel).
    fn nchw_plane<E: Elem>(&self, isa: Isa, plane: usize, ow: usize, dst: &mut [E]) {
        let d = &self.d;
        let occ = d.out_channels();
        let (n, oc) = (plane / occ, plane % occ);
        let hw = d.height * d.width;
        let xp = &self.x[(n * d.channels + oc / d.multiplier) * hw..][..hw];
        let taps = d.kernel_h * d.kernel_w;
        let wk = &self.w[oc * taps..][..taps];
        let bias = self.bias.map_or(0.0, |b| b[oc]);
        // Each tap's valid output columns depend only on the layer: computed once per plane
        // here, not per row (the divisions by the stride would dominate narrow rows).
        let mut ranges = [(0usize, 0usize); MAX_KW];
        for (kx, r) in ranges.iter_mut().enumerate().take(d.kernel_w.min(MAX_KW)) {
            *r = tap_range(ow, d.width, d.stride_w, d.pad_left, kx * d.dilation_w);
        }
        let p = RowArgs { d, xp, wk, bias, ow, ranges };
        match E::as_f32_mut(dst) {
            Some(dst) => nchw_plane_f32(isa, &p, dst),
            None => {
                let mut buf = [0.0f32; BUF];
                for (oy, row) in dst.chunks_mut(ow).enumerate() {
                    for c0 in (0..ow).step_by(BUF) {
                        let c1 = (c0 + BUF).min(ow);
                        nchw_row(isa, &p, oy, c0, &mut buf[..c1 - c0]);
                        E::narrow_into(&buf[..c1 - c0], &mut row[c0..c1]);
                    }
                }
            }
        }
    }

    /// NHWC output rows `first..` (row = image · out_h + oy) into `dst` (whole rows).
    fn nhwc_rows<E: Elem>(&self, isa: Isa, first: usize, oh: usize, ow: usize, dst: &mut [E]) {
        let d = &self.d;
        let occ = d.out_channels();
        let taps = d.kernel_h * d.kernel_w;
        // A channel block: its transposed weights fit the stack buffer, and (for half
        // precision) so does one output row of it. Multiples of 16 keep the vectors whole.
        let mut cbw = (BUF / taps.max(1)).min(occ);
        if E::as_f32(&[]).is_none() {
            cbw = cbw.min((BUF / ow).max(1));
        }
        if cbw >= 16 && cbw < occ {
            cbw -= cbw % 16;
        }
        let cbw = cbw.max(1);
        // Stack buffers; only a kernel of more than BUF taps, or a half-precision row wider
        // than BUF pixels, needs the heap.
        let (mut wt_stack, mut buf_stack) = ([0.0f32; BUF], [0.0f32; BUF]);
        let (mut wt_heap, mut buf_heap) = (Vec::new(), Vec::new());
        let wt: &mut [f32] = if taps * cbw <= BUF {
            &mut wt_stack
        } else {
            wt_heap.resize(taps * cbw, 0.0);
            &mut wt_heap
        };
        let buf: &mut [f32] = if ow * cbw <= BUF {
            &mut buf_stack
        } else {
            buf_heap.resize(ow * cbw, 0.0);
            &mut buf_heap
        };
        let rows = dst.len() / (ow * occ);
        for cb0 in (0..occ).step_by(cbw) {
            let cb1 = (cb0 + cbw).min(occ);
            let nb = cb1 - cb0;
            // [tap][channel] for this block.
            for (i, oc) in (cb0..cb1).enumerate() {
                for t in 0..taps {
                    wt[t * nb + i] = self.w[oc * taps + t];
                }
            }
            for r in 0..rows {
                let row = first + r;
                let (n, oy) = (row / oh, row % oh);
                let p = PixArgs {
                    d,
                    x: self.x,
                    wt: &wt[..taps * nb],
                    bias: self.bias.map(|b| &b[cb0..cb1]),
                    n,
                    oy,
                    ow,
                    cb0,
                    nb,
                };
                let dst_row = &mut dst[r * ow * occ..][..ow * occ];
                match E::as_f32_mut(dst_row) {
                    Some(o) => nhwc_row(isa, &p, &mut o[cb0..], occ),
                    None => {
                        nhwc_row(isa, &p, &mut buf[..ow * nb], nb);
                        for ox in 0..ow {
                            E::narrow_into(&buf[ox * nb..][..nb], &mut dst_row[ox * occ + cb0..][..nb]);
                        }
                    }
                }
            }
        }
    }
}

/// What one NCHW output row needs.
struct RowArgs<'a> {
    d: &'a Conv2dDesc,
    /// The input plane.
    xp: &'a [f32],
    /// The plane's `kh × kw` weights.
    wk: &'a [f32],
    bias: f32,
    ow: usize,
    /// `tap_range` of the first `MAX_KW` kernel columns.
    ranges: [(usize, usize); MAX_KW],
}

/// Kernel columns whose tap ranges are precomputed per plane (wider kernels compute the rest
/// per row).
const MAX_KW: usize = 8;

/// `acc[i] += w · x[first + stride·i]` over `acc`.
#[inline(always)]
fn tap<const FMA: bool>(acc: &mut [f32], x: &[f32], first: usize, stride: usize, w: f32) {
    if stride == 1 {
        let x = &x[first..first + acc.len()];
        acc.iter_mut().zip(x).for_each(|(a, &x)| *a = madd::<FMA>(w, x, *a));
    } else {
        let x = &x[first..];
        acc.iter_mut().zip(x.iter().step_by(stride)).for_each(|(a, &x)| *a = madd::<FMA>(w, x, *a));
    }
}

/// Three taps (`x` offsets 0, `dil`, 2·`dil` from `first`) in one pass over `acc`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tap3<const FMA: bool>(acc: &mut [f32], x: &[f32], first: usize, stride: usize, dil: usize, w: [f32; 3]) {
    let n = acc.len();
    if n == 0 {
        return;
    }
    let span = (n - 1) * stride + 1;
    let x0 = &x[first..first + span];
    let x1 = &x[first + dil..first + dil + span];
    let x2 = &x[first + 2 * dil..first + 2 * dil + span];
    if stride == 1 {
        for (i, a) in acc.iter_mut().enumerate() {
            let s = madd::<FMA>(w[0], x0[i], *a);
            let s = madd::<FMA>(w[1], x1[i], s);
            *a = madd::<FMA>(w[2], x2[i], s);
        }
    } else {
        for (i, a) in acc.iter_mut().enumerate() {
            let j = i * stride;
            let s = madd::<FMA>(w[0], x0[j], *a);
            let s = madd::<FMA>(w[1], x1[j], s);
            *a = madd::<FMA>(w[2], x2[j], s);
        }
    }
}

/// Output row `oy`, columns `c0..c0 + acc.len()`, of one NCHW plane into `acc` (bias and
/// activation included).
#[inline(always)]
fn nchw_row_inner<const FMA: bool>(p: &RowArgs, oy: usize, c0: usize, acc: &mut [f32]) {
    let d = p.d;
    let c1 = c0 + acc.len();
    acc.fill(p.bias);
    for ky in 0..d.kernel_h {
        let py = oy * d.stride_h + ky * d.dilation_h;
        if py < d.pad_top || py - d.pad_top >= d.height {
            continue;
        }
        let xrow = &p.xp[(py - d.pad_top) * d.width..][..d.width];
        let wrow = &p.wk[ky * d.kernel_w..][..d.kernel_w];
        // Each tap's valid output columns, clipped to this piece.
        let range = |kx: usize| {
            let (lo, hi) = if kx < MAX_KW {
                p.ranges[kx]
            } else {
                tap_range(p.ow, d.width, d.stride_w, d.pad_left, kx * d.dilation_w)
            };
            (lo.max(c0), hi.min(c1).max(lo.max(c0)))
        };
        let first = |kx: usize, o: usize| o * d.stride_w + kx * d.dilation_w - d.pad_left;
        let mut done_inner = (0, 0);
        if d.kernel_w == 3 {
            // Columns where all three taps are valid: one fused pass.
            let (l0, h0) = range(0);
            let (l1, h1) = range(1);
            let (l2, h2) = range(2);
            let (lo, hi) = (l0.max(l1).max(l2), h0.min(h1).min(h2));
            if lo < hi {
                let w = [wrow[0], wrow[1], wrow[2]];
                tap3::<FMA>(&mut acc[lo - c0..hi - c0], xrow, first(0, lo), d.stride_w, d.dilation_w, w);
                done_inner = (lo, hi);
            }
        }
        let (fl, fh) = done_inner;
        for (kx, &wv) in wrow.iter().enumerate() {
            let (lo, hi) = range(kx);
            // The part outside the fused columns (all of it when nothing was fused; the fused
            // columns lie inside every tap's range).
            let parts = if fl < fh { [(lo, hi.min(fl)), (lo.max(fh), hi)] } else { [(lo, hi), (0, 0)] };
            for (a, b) in parts {
                if a < b {
                    tap::<FMA>(&mut acc[a - c0..b - c0], xrow, first(kx, a), d.stride_w, wv);
                }
            }
        }
    }
    apply_isa::<FMA>(d.activation, acc);
}

multiversion! {
    fn nchw_row(p: &RowArgs, oy: usize, c0: usize, acc: &mut [f32]) => nchw_row_inner
}

/// A whole f32 output plane, row by row, inside one instruction-set copy (no call per row).
#[inline(always)]
fn nchw_plane_inner<const FMA: bool>(p: &RowArgs, dst: &mut [f32]) {
    for (oy, row) in dst.chunks_mut(p.ow).enumerate() {
        nchw_row_inner::<FMA>(p, oy, 0, row);
    }
}

multiversion! {
    fn nchw_plane_f32(p: &RowArgs, dst: &mut [f32]) => nchw_plane_inner
}

/// What one NHWC output row (one channel block of it) needs.
struct PixArgs<'a> {
    d: &'a Conv2dDesc,
    /// The whole input.
    x: &'a [f32],
    /// The block's weights, `[tap][channel]`.
    wt: &'a [f32],
    /// The block's bias.
    bias: Option<&'a [f32]>,
    n: usize,
    oy: usize,
    ow: usize,
    /// The block's first channel and width.
    cb0: usize,
    nb: usize,
}

/// One NHWC output row's channel block: pixel `ox`'s channels are `acc[ox·stride..][..nb]`.
#[inline(always)]
fn nhwc_row_inner<const FMA: bool>(p: &PixArgs, acc: &mut [f32], stride: usize) {
    let d = p.d;
    let (h, w, c, m) = (d.height, d.width, d.channels, d.multiplier);
    let nb = p.nb;
    for ox in 0..p.ow {
        let a = &mut acc[ox * stride..][..nb];
        match p.bias {
            Some(b) => a.copy_from_slice(b),
            None => a.fill(0.0),
        }
        for ky in 0..d.kernel_h {
            let py = p.oy * d.stride_h + ky * d.dilation_h;
            if py < d.pad_top || py - d.pad_top >= h {
                continue;
            }
            let xrow = &p.x[(p.n * h + py - d.pad_top) * w * c..][..w * c];
            for kx in 0..d.kernel_w {
                let px = ox * d.stride_w + kx * d.dilation_w;
                if px < d.pad_left || px - d.pad_left >= w {
                    continue;
                }
                let wk = &p.wt[(ky * d.kernel_w + kx) * nb..][..nb];
                let xpix = &xrow[(px - d.pad_left) * c..][..c];
                if m == 1 {
                    let xs = &xpix[p.cb0..][..nb];
                    a.iter_mut().zip(xs).zip(wk).for_each(|((a, &x), &wv)| *a = madd::<FMA>(wv, x, *a));
                } else {
                    for (i, (a, &wv)) in a.iter_mut().zip(wk).enumerate() {
                        *a = madd::<FMA>(wv, xpix[(p.cb0 + i) / m], *a);
                    }
                }
            }
        }
        apply_isa::<FMA>(d.activation, a);
    }
}

multiversion! {
    fn nhwc_row(p: &PixArgs, acc: &mut [f32], stride: usize) => nhwc_row_inner
}
