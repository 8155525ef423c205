//! The channel-vector kernel for small NCHW planes (MobileNet's 7² and 14² layers; any size
//! with 3 × 3 kernels on AVX2) and strided ones (up to 64 × 64 outputs).
//!
//! On a plane of a few dozen pixels the band kernel spends most of its time building bands
//! and on row bookkeeping, not multiplying. Here `G` consecutive output planes are taken
//! together:
//! - their input planes are transposed into one zero-padded tile, pixel-major with the `G`
//!   planes as the vector lanes (the NHWC order, a channel vector per pixel), 8 × 8 blocks in
//!   AVX registers ([`avx::planes_in`]);
//! - every tap of an output pixel is then one `G`-wide load at a fixed offset from the
//!   pixel's, with no border test, times the tap's `G` weights (one vector per tap for the
//!   whole group), so the stride, the dilation and the kernel size are only offsets;
//! - `PX` output pixels of a row are accumulated together in registers, each tap's weight
//!   vector loaded once for them (one load per `PX` multiply-adds, which take their input
//!   straight from memory); 3 × 3 kernels with horizontal dilation 1 and stride 1 or 2, on
//!   AVX2 and FMA, instead keep the nine weight vectors in registers and load each input
//!   vector once per kernel row for the 4 pixels that read it
//!   (`nhwc3::avx::dense_rows`, the NHWC row kernel's tiles: 0.79–0.91 of the time on
//!   MobileNetV2's 7², 14² and strided layers, one core and two, in-process A/B, same bits);
//! - the sums go to a second buffer, pixel-major, where the activation runs over the whole
//!   group at once, and are transposed back into the `G` output planes
//!   ([`avx::planes_out`]).
//!
//! The tile's padding is written only when the buffer is zeroed for a layer: every group of
//! the layer writes the same data pixels, so it stays zero. Where the whole padded plane does
//! not fit (past about 60 × 60), the tile holds a band of rows at a time and each band zeroes
//! its own padding rows; where the group's output planes do not fit the sums buffer (3 × 3
//! rows past 64² outputs), each band's sums are transposed into the planes before the next
//! band (half-precision outputs, which are narrowed from one buffer of the whole output,
//! take the band kernel there).

use super::super::activation::apply_isa;
use super::super::simd::{Isa, madd, multiversion};
use super::super::{Elem, Halves};
use super::{Conv, HALF_IN, LayerBufs, MAX_TAPS, V};
use tilekit_kernels::Conv2dDesc;

/// Output planes per group: the lanes of one AVX2 vector.
pub(super) const G: usize = V;

/// Output pixels of a row accumulated together (independent sums per tap).
const PX: usize = 8;

/// Largest stride-1 input plane (pixels) that takes this kernel (16 × 16). On larger planes
/// the band kernel, which reads stride-1 rows where they lie, is as fast or faster than the
/// tile's tap-by-tap loop; with a stride of 2 this kernel is faster up to the largest tile
/// (`TBUF`). Measured on this project's 2-core AVX2 machine (see `ARCHITECTURE.md`).
const MAX_PLANE_S1: usize = 256;

/// Whether the layer's rows take `nhwc3::avx::dense_rows` where the CPU has AVX2 and FMA.
fn dense(d: &Conv2dDesc) -> bool {
    cfg!(target_arch = "x86_64") && super::rows_3x3(d)
}

/// f32 elements of each of a thread's three buffers (the tile, the sums, the narrowing
/// buffer for half-precision outputs): 128 KiB.
const TBUF: usize = 1 << 15;
const _: () = assert!(TBUF.is_power_of_two(), "the kernel masks offsets with TBUF − 1");
/// Elements past `TBUF` in each buffer: a window of `PX` pixels at stride 2 that starts
/// inside the first `TBUF` ends inside `TBUF + TPAD` (so its loads need no bounds checks).
const TPAD: usize = 2 * PX * G;

thread_local! {
    /// This thread's tile, sums and narrowing buffers: a group writes only its layer's input
    /// pixels into the tile, so the padding stays zero from one group, and one call, of the
    /// layer to the next (`LayerBufs`).
    static TILE_BUFS: std::cell::RefCell<LayerBufs> = const { std::cell::RefCell::new(LayerBufs::new()) };
}

/// The geometry of one layer for the channel-vector kernel.
pub(super) struct Tile {
    pub(super) d: Conv2dDesc,
    pub(super) oh: usize,
    pub(super) ow: usize,
    /// Padded tile height and width in pixels: the input at rows `pad_top..` and columns
    /// `pad_left..`, zeros around it, as far as any tap reaches. With bands, `hp` is a
    /// band's rows.
    pub(super) hp: usize,
    pub(super) wp: usize,
    /// Output rows per band: `oh` when the tile holds the whole padded plane, fewer where
    /// only a band of its rows fits (strided layers up to 64 × 64 outputs, and 3 × 3 layers
    /// at stride 1 on AVX2, any size).
    band: usize,
    /// Whether the sums buffer holds one band's rows at a time (the group's whole output
    /// planes are over [`TBUF`] elements), each band transposed into the planes when done.
    band_sums: bool,
    /// Per tap (`ky·kw + kx`): its offset in pixels from its output pixel's first tap.
    offs: [usize; MAX_TAPS],
    /// Whole plane: per input pixel (`y·w + x`), its pixel in the tile. Bands: per input
    /// column `x`, its pixel in the tile's row.
    pos: [u16; TBUF / G],
}

impl Tile {
    /// The geometry, or `None` where the layer is not for this kernel: more than
    /// [`MAX_TAPS`] taps, a stride-1 plane over [`MAX_PLANE_S1`] pixels (3 × 3 kernels with
    /// horizontal dilation 1 in AVX2 or AVX-512 take any size, in bands), a group's output
    /// over [`TBUF`] elements (but for those 3 × 3 layers, whose sums then go band by band),
    /// or a band of 4 output rows whose tile would be.
    pub(super) fn new(d: &Conv2dDesc, isa: Isa) -> Option<Tile> {
        let (kh, kw) = (d.kernel_h, d.kernel_w);
        let (oh, ow) = (d.out_h()?, d.out_w()?);
        if kh * kw > MAX_TAPS || kh == 0 || kw == 0 || oh == 0 || ow == 0 || d.stride_h == 0 || d.stride_w == 0 {
            return None;
        }
        // 3 × 3 rows through `nhwc3::avx::dense_rows`: any plane, in bands where needed.
        let dense_avx = isa != Isa::Portable && dense(d);
        if d.stride_h == 1 && d.stride_w == 1 && !dense_avx && d.height.checked_mul(d.width)? > MAX_PLANE_S1 {
            return None;
        }
        let reach = |o: usize, s: usize, k: usize, dil: usize| (o - 1) * s + (k - 1) * dil + 1;
        let mut hp = (d.pad_top + d.height).max(reach(oh, d.stride_h, kh, d.dilation_h));
        let wp = (d.pad_left + d.width).max(reach(ow, d.stride_w, kw, d.dilation_w));
        // The sums hold whole output planes, or (dense 3 × 3 rows) one band's.
        let band_sums = oh.checked_mul(ow)?.checked_mul(G)? > TBUF;
        if band_sums && !dense_avx {
            return None;
        }
        let mut band = oh;
        if band_sums || hp.checked_mul(wp)?.checked_mul(G)? > TBUF {
            // Bands of output rows: strided layers, and dense 3 × 3 rows at stride 1 (with
            // the general tap loop the band kernel was as fast on stride-1 planes this large).
            if d.stride_h * d.stride_w == 1 && !dense_avx {
                return None;
            }
            let rows = TBUF / G / wp;
            if rows < (kh - 1) * d.dilation_h + 1 + 3 * d.stride_h {
                return None; // Fewer than 4 output rows per band.
            }
            band = ((rows - (kh - 1) * d.dilation_h - 1) / d.stride_h + 1).min(oh);
            hp = reach(band, d.stride_h, kh, d.dilation_h);
            // A band's sums: band · ow ≤ band · wp ≤ rows · wp ≤ TBUF / G.
            if band_sums && band * ow * G > TBUF {
                return None;
            }
        }
        let mut offs = [0usize; MAX_TAPS];
        for ky in 0..kh {
            for kx in 0..kw {
                offs[ky * kw + kx] = ky * d.dilation_h * wp + kx * d.dilation_w;
            }
        }
        // Below hp · wp ≤ TBUF / G (a u16); h · w ≤ hp · wp entries for a whole plane, w ≤ wp
        // for bands.
        let mut pos = [0u16; TBUF / G];
        if band == oh {
            // Row by row, with no division per pixel (this runs once per call): pixel by
            // pixel, with a division each, MobileNetV2's 144 × 56² stride 2 on AVX2 (its 3136
            // input pixels) took 1.07–1.12× the time (2 threads, separate processes
            // alternated three times, the same sums); its 14² and 7² layers were level.
            for y in 0..d.height {
                let first = (y + d.pad_top) * wp + d.pad_left;
                for x in 0..d.width {
                    pos[y * d.width + x] = (first + x) as u16;
                }
            }
        } else {
            for (x, p) in pos.iter_mut().enumerate().take(d.width) {
                *p = (d.pad_left + x) as u16;
            }
        }
        Some(Tile { d: *d, oh, ow, hp, wp, band, band_sums, offs, pos })
    }

    /// The elements of the tile buffer a group uses (its padding is zeroed once per layer).
    fn tile_len(&self) -> usize {
        self.hp * self.wp * G
    }

    /// Whether a group's whole output (its half-precision narrowing buffer) fits [`TBUF`]:
    /// not where the sums go band by band.
    pub(super) fn whole_output(&self) -> bool {
        !self.band_sums
    }
}

/// NCHW output planes `first..` (plane = image · out channels + out channel) into `dst`
/// (whole planes), `G` at a time.
pub(super) fn planes<E: Elem>(isa: Isa, t: &Tile, conv: &Conv, first: usize, dst: &mut [E]) {
    let plane = t.oh * t.ow;
    // A half-precision input: each group's planes widened into this thread's buffer first.
    let mut xw = if conv.xh.is_some() { HALF_IN.take() } else { Vec::new() };
    if conv.xh.is_some() && xw.len() < G * t.d.height * t.d.width {
        xw.resize(G * t.d.height * t.d.width, 0.0);
    }
    TILE_BUFS.with_borrow_mut(|bufs| {
        let [tile, sums, narrow] = bufs.get::<{ TBUF + TPAD }, 3>(Some((&t.d, t.tile_len())));
        for (i, dst) in dst.chunks_mut(G * plane).enumerate() {
            let mut a = GroupArgs {
                t,
                x: conv.x,
                xh: conv.xh.map(|xh| (xh, &mut xw[..])),
                w: conv.w,
                packed: conv.packed,
                bias: conv.bias,
                p0: first + i * G,
                nl: dst.len() / plane,
            };
            match E::as_f32_mut(dst) {
                Some(o) => group(isa, &mut a, tile, sums, o),
                None => {
                    let o = &mut narrow[..dst.len()];
                    group(isa, &mut a, tile, sums, o);
                    E::narrow_into(o, dst);
                }
            }
        }
    });
    if conv.xh.is_some() {
        HALF_IN.set(xw);
    }
}

/// What one group of output planes needs.
struct GroupArgs<'a> {
    t: &'a Tile,
    /// The whole input and weights (`[C·m, 1, kh, kw]`, or `[kh, kw, C·m]` where `packed`),
    /// and the bias. A half-precision input is in `xh` instead (`x` empty), with the buffer
    /// its group's planes are widened into (`G` planes).
    x: &'a [f32],
    xh: Option<(Halves<'a>, &'a mut [f32])>,
    w: &'a [f32],
    packed: bool,
    bias: Option<&'a [f32]>,
    /// The group's first output plane (image · out channels + out channel) and its planes
    /// (`G`, or fewer for the last group).
    p0: usize,
    nl: usize,
}

/// One group: `out` holds its `nl` output planes one after another (bias and activation
/// included). `tile` is the padded tile (its padding zero), `sums` the pixel-major sums.
fn group(isa: Isa, a: &mut GroupArgs, tile: &mut [f32; TBUF + TPAD], sums: &mut [f32], out: &mut [f32]) {
    let t = a.t;
    let d = &t.d;
    let (hw, plane) = (d.height * d.width, t.oh * t.ow);
    let occ = d.out_channels();
    let nl = a.nl.clamp(1, G);
    // Where output plane `p` reads its input plane.
    let at = |p: usize| (p / occ * d.channels + p % occ / d.multiplier) * hw;
    // A half-precision input: the group's planes widened, lane `l`'s at `l·hw`.
    if let Some((xh, xw)) = &mut a.xh {
        for (l, w) in xw[..nl * hw].chunks_exact_mut(hw).enumerate() {
            xh.widen_range(at(a.p0 + l), w);
        }
    }
    // The group's input planes; lanes past `nl` repeat the first (their sums are not stored).
    let srcs: [&[f32]; G] = std::array::from_fn(|l| {
        let l = if l < nl { l } else { 0 };
        match &a.xh {
            Some((_, xw)) => &xw[l * hw..][..hw],
            None => &a.x[at(a.p0 + l)..][..hw],
        }
    });
    let sums = &mut sums[..if t.band_sums { t.band * t.ow } else { plane } * G];
    let out = &mut out[..nl * plane];
    #[cfg(target_arch = "x86_64")]
    let avx = isa != Isa::Portable;
    #[cfg(not(target_arch = "x86_64"))]
    let avx = false;
    // `pos` entries plus `offset` into the tile, from the planes `srcs`.
    let fill = |srcs: &[&[f32]; G], pos: &[u16], offset: usize, tile: &mut [f32; TBUF + TPAD]| {
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only made after the CPU reported AVX2.
            unsafe { avx::planes_in(srcs, pos, offset, tile) };
            return;
        }
        planes_in_scalar(srcs, 0, pos, offset, tile);
    };
    if t.band >= t.oh {
        fill(&srcs, &t.pos[..hw], 0, tile);
        compute(isa, a, tile, 0, t.oh, sums);
    } else {
        let (h, w, pt) = (d.height, d.width, d.pad_top);
        for oy0 in (0..t.oh).step_by(t.band) {
            let rows = t.band.min(t.oh - oy0);
            // The band's padded rows pr0..: input rows where they are inside the input, zero
            // rows where not (an earlier band may have put data there).
            let pr0 = oy0 * d.stride_h;
            let in_rows = (rows - 1) * d.stride_h + (d.kernel_h - 1) * d.dilation_h + 1;
            for r in 0..in_rows {
                let pr = pr0 + r;
                if pr < pt || pr - pt >= h {
                    tile[r * t.wp * G..][..t.wp * G].fill(0.0);
                } else {
                    let y = pr - pt;
                    let row: [&[f32]; G] = std::array::from_fn(|l| &srcs[l][y * w..][..w]);
                    fill(&row, &t.pos[..w], r * t.wp, tile);
                }
            }
            if t.band_sums {
                // The band's sums from the buffer's start, then into its rows of the planes.
                compute(isa, a, tile, 0, rows, sums);
                let at = oy0 * t.ow;
                let n = rows * t.ow;
                #[cfg(target_arch = "x86_64")]
                if avx {
                    // SAFETY: as above.
                    unsafe { avx::planes_out(&sums[..n * G], n, plane, at, nl, out) };
                    continue;
                }
                planes_out_scalar(&sums[..n * G], n, plane, at, 0, out);
            } else {
                compute(isa, a, tile, oy0, rows, sums);
            }
        }
        if t.band_sums {
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: as above.
        unsafe { avx::planes_out(sums, plane, plane, 0, nl, out) };
        return;
    }
    planes_out_scalar(sums, plane, plane, 0, 0, out);
}

/// Pixels `from..` of the `G` input planes into the lanes of their tile pixels (`pos[q]` +
/// `offset`), one at a time.
fn planes_in_scalar(srcs: &[&[f32]; G], from: usize, pos: &[u16], offset: usize, tile: &mut [f32; TBUF + TPAD]) {
    for (q, &p) in pos.iter().enumerate().skip(from) {
        let v = &mut tile[(p as usize + offset) * G..][..G];
        for (v, src) in v.iter_mut().zip(srcs) {
            *v = src[q];
        }
    }
}

/// Pixels `from..n` of the pixel-major sums (`n` pixels) into the output planes (`plane`
/// elements apart) from element `at` of each, one at a time.
fn planes_out_scalar(sums: &[f32], n: usize, plane: usize, at: usize, from: usize, out: &mut [f32]) {
    for (l, dst) in out.chunks_exact_mut(plane).enumerate() {
        for (q, o) in dst[at..at + n].iter_mut().enumerate().skip(from) {
            *o = sums[q * G + l];
        }
    }
}

/// The transposes in 8 × 8 blocks of AVX registers (`transpose.rs`'s `t8`: 24 shuffles per
/// 64 elements, against 64 scalar stores).
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::super::super::transpose::avx::t8;
    use super::{G, TBUF, TPAD, Taps, planes_in_scalar, planes_out_scalar};
    use std::arch::x86_64::*;

    const _: () = assert!(G == 8, "one AVX register of f32 per pixel");

    /// [`super::pixels`] in AVX registers. Written with intrinsics because LLVM's SLP
    /// vectoriser turned the plain loops of the 8-pixel stride-1 block (64 contiguous
    /// elements) into transposes with spills, 5× slower.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn pixels<const N: usize, const SW: usize>(
        taps: &Taps,
        first: usize,
        sw: usize,
        out: &mut [f32],
    ) {
        let Taps { win, wv, offs, bias } = *taps;
        let out = &mut out[..N * G];
        // SAFETY (every intrinsic below): the caller promises AVX2 and FMA; each load and
        // store is of G = 8 elements of a slice bounds-checked (or masked into the array) here.
        unsafe {
            let b = _mm256_loadu_ps(bias.as_ptr());
            let mut acc = [b; N];
            for (wt, &off) in wv.iter().zip(offs) {
                let w = _mm256_loadu_ps(wt.as_ptr());
                let i = ((first + off) * G) & (TBUF - 1);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let k = if SW > 0 { i + j * SW * G } else { ((first + j * sw + off) * G) & (TBUF - 1) };
                    let x = _mm256_loadu_ps(win[k..k + G].as_ptr());
                    *acc = _mm256_fmadd_ps(w, x, *acc);
                }
            }
            for (o, acc) in out.chunks_exact_mut(G).zip(acc) {
                _mm256_storeu_ps(o.as_mut_ptr(), acc);
            }
        }
    }

    /// [`planes_in_scalar`] from pixel 0, eight pixels per transpose.
    #[target_feature(enable = "avx")]
    pub(super) fn planes_in(srcs: &[&[f32]; G], pos: &[u16], offset: usize, tile: &mut [f32; TBUF + TPAD]) {
        let full = pos.len() - pos.len() % 8;
        for q in (0..full).step_by(8) {
            // SAFETY: each slice is 8 elements (bounds-checked by the slicing).
            let r: [__m256; 8] = std::array::from_fn(|l| unsafe { _mm256_loadu_ps(srcs[l][q..q + 8].as_ptr()) });
            for (&p, c) in pos[q..q + 8].iter().zip(t8(r)) {
                let v = &mut tile[(p as usize + offset) * G..][..G];
                // SAFETY: `v` is G = 8 elements.
                unsafe { _mm256_storeu_ps(v.as_mut_ptr(), c) };
            }
        }
        planes_in_scalar(srcs, full, pos, offset, tile);
    }

    /// [`planes_out_scalar`] from pixel 0, eight pixels per transpose.
    #[target_feature(enable = "avx")]
    pub(super) fn planes_out(sums: &[f32], n: usize, plane: usize, at: usize, nl: usize, out: &mut [f32]) {
        let full = n - n % 8;
        for q in (0..full).step_by(8) {
            let px = &sums[q * G..][..8 * G];
            // SAFETY: each slice is 8 elements.
            let r: [__m256; 8] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(px[j * G..][..8].as_ptr()) });
            for (l, c) in t8(r).into_iter().enumerate().take(nl) {
                let o = &mut out[l * plane + at + q..][..8];
                // SAFETY: `o` is 8 elements.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), c) };
            }
        }
        planes_out_scalar(sums, n, plane, at, full, out);
    }
}

/// The sums of every output pixel of the group into `sums` (pixel-major), from the tile, then
/// the activation.
#[inline(always)]
fn compute_inner<const FMA: bool>(a: &GroupArgs, tile: &[f32; TBUF + TPAD], oy0: usize, rows: usize, sums: &mut [f32]) {
    // The weights' array sized for 3 × 3 where it fits: it is zeroed for every group, and at
    // MAX_TAPS that was 2 KiB of stores per group (in-process A/B, 2 threads, medians:
    // 960×7² 0.051 → 0.045 ms, 576×14² stride 2 0.045 → 0.041, 384×14² 0.044 → 0.042).
    if a.t.d.kernel_h * a.t.d.kernel_w <= 9 {
        compute_taps::<FMA, 9>(a, tile, oy0, rows, sums);
    } else {
        compute_taps::<FMA, MAX_TAPS>(a, tile, oy0, rows, sums);
    }
}

/// [`compute_inner`] with room for `N` taps.
#[inline(always)]
fn compute_taps<const FMA: bool, const N: usize>(
    a: &GroupArgs,
    tile: &[f32; TBUF + TPAD],
    oy0: usize,
    rows: usize,
    sums: &mut [f32],
) {
    let t = a.t;
    let d = &t.d;
    let occ = d.out_channels();
    let taps = d.kernel_h * d.kernel_w;
    let nl = a.nl.min(G);
    // Each tap's weights across the group, and the bias: lanes past `nl` are zero.
    let mut wv = [[0.0f32; G]; N];
    let mut bv = [0.0f32; G];
    for l in 0..nl {
        let oc = (a.p0 + l) % occ;
        for (tap, wt) in wv.iter_mut().enumerate().take(taps) {
            wt[l] = if a.packed { a.w[tap * occ + oc] } else { a.w[oc * taps + tap] };
        }
        if let Some(b) = a.bias {
            bv[l] = b[oc];
        }
    }
    let taps = Taps { win: tile, wv: &wv[..taps], offs: &t.offs[..taps], bias: bv };
    let sums = &mut sums[oy0 * t.ow * G..][..rows * t.ow * G];
    // 3 × 3 with horizontal dilation 1 and stride 1 or 2, on AVX2 and FMA: the weights in
    // registers and each input vector loaded once per kernel row (`nhwc3::avx::dense_rows`).
    #[cfg(target_arch = "x86_64")]
    if FMA && dense(d) {
        let offs = [t.offs[0], t.offs[3], t.offs[6]];
        let step = d.stride_h * t.wp;
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
        unsafe {
            if d.stride_w == 1 {
                super::nhwc3::avx::dense_rows::<1>(tile, offs, step, rows, t.ow, &wv[..9], bv, sums);
            } else {
                super::nhwc3::avx::dense_rows::<2>(tile, offs, step, rows, t.ow, &wv[..9], bv, sums);
            }
        }
        apply_isa::<FMA>(d.activation, sums);
        return;
    }
    match d.stride_w {
        1 => out_rows::<FMA, 1>(t, &taps, rows, sums),
        2 => out_rows::<FMA, 2>(t, &taps, rows, sums),
        _ => out_rows::<FMA, 0>(t, &taps, rows, sums),
    }
    apply_isa::<FMA>(d.activation, sums);
}

/// What every output pixel of a group reads: the tile, each tap's weights across the group
/// and its offset in pixels, and the bias.
struct Taps<'a> {
    win: &'a [f32; TBUF + TPAD],
    wv: &'a [[f32; G]],
    offs: &'a [usize],
    bias: [f32; G],
}

/// `oh` output rows from the tile's first row into `sums`: `SW` is the horizontal stride, or
/// 0 for any stride (`d.stride_w`).
#[inline(always)]
fn out_rows<const FMA: bool, const SW: usize>(t: &Tile, taps: &Taps, oh: usize, sums: &mut [f32]) {
    let ow = t.ow;
    let (sh, sw) = (t.d.stride_h, t.d.stride_w);
    for oy in 0..oh {
        let row = oy * sh * t.wp;
        // PX pixels at a time (PX / 2 in rows narrower than PX); the last block overlaps the
        // one before it rather than running short (the overlapping pixels get the same sums
        // again).
        let mut ox = 0;
        while ox < ow {
            let n = if ow >= PX {
                PX
            } else if ow >= PX / 2 {
                PX / 2
            } else {
                1
            };
            let x0 = ox.min(ow - n);
            let (first, out) = (row + x0 * sw, &mut sums[(oy * ow + x0) * G..]);
            match n {
                PX => pixels::<FMA, PX, SW>(taps, first, sw, out),
                4 => pixels::<FMA, { PX / 2 }, SW>(taps, first, sw, out),
                _ => pixels::<FMA, 1, SW>(taps, first, sw, out),
            }
            ox = x0 + n;
        }
    }
}

multiversion! {
    fn compute(a: &GroupArgs, tile: &[f32; TBUF + TPAD], oy0: usize, rows: usize, sums: &mut [f32]) => compute_inner
}

/// `N` output pixels, `sw` tile pixels apart from `first` (`SW` when it is not 0): their
/// `G`-lane sums over all taps, from the bias, into `out[..N·G]`.
#[inline(always)]
fn pixels<const FMA: bool, const N: usize, const SW: usize>(taps: &Taps, first: usize, sw: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
        unsafe { avx::pixels::<N, SW>(taps, first, sw, out) };
        return;
    }
    let Taps { win, wv, offs, bias } = *taps;
    let mut acc = [bias; N];
    for (wt, &off) in wv.iter().zip(offs) {
        // Every pixel read starts inside the tile (`Tile::new`), before TBUF: masking with
        // TBUF − 1 changes nothing and tells the compiler where the loads lie.
        let i = ((first + off) * G) & (TBUF - 1);
        for (j, acc) in acc.iter_mut().enumerate() {
            let xv: &[f32; G] = if SW > 0 {
                // A constant offset from the first pixel's, inside TBUF + TPAD since the first
                // is before TBUF (SW ≤ 2, N ≤ PX): no checks.
                const { assert!(SW <= 2 && N <= PX, "the window fits TPAD") };
                let k = i + j * SW * G;
                win[k..k + G].try_into().expect("G lanes")
            } else {
                let i = ((first + j * sw + off) * G) & (TBUF - 1);
                win[i..i + G].try_into().expect("G lanes")
            };
            for ((s, &wl), &xl) in acc.iter_mut().zip(wt).zip(xv) {
                *s = madd::<FMA>(wl, xl, *s);
            }
        }
    }
    for (o, acc) in out[..N * G].chunks_exact_mut(G).zip(&acc) {
        o.copy_from_slice(acc);
    }
}
