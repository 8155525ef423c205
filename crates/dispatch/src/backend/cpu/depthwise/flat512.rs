//! NCHW 3 × 3 layers with stride and dilation 1, padding 1 on every side and rows of at most
//! 15 pixels, of 17 to 31 or of 32 to 256 on AVX-512: each plane as one flat run of pixels,
//! 16 outputs a vector whatever the row width, by column sums. The layer takes this kernel
//! for rows of up to 8 pixels (MobileNetV2's 7²), of 17 to 23 and of 33 or more; the
//! rolling rows ([`super::roll512`]) take rows of 9 to 16 and 24 to 32 (its 14² and 28²).
//!
//! With the padding 1 all round the output plane is the input's size, and output pixel `p`
//! (flat, `y·w + x`) reads input pixel `p + (ky − 1)·w + (kx − 1)` through tap `(ky, kx)`. The
//! kernel's three columns are summed down the rows first, at every pixel `q` of a vector:
//! `z_kx[q] = w[0][kx]·x[q − w] + w[1][kx]·x[q] + w[2][kx]·x[q + w]` (the centre column's
//! from the bias), then `out[p] = (z_1[p] + z_0[p − 1]) + z_2[p + 1]` ([`plane`]).
//!
//! - **The rows above and below** (`x[q ∓ w]`) are each one shift out of two of the plane's
//!   16-pixel blocks: blocks `j − 1` and `j` for the row above and `j`, `j + 1` for the one
//!   below where rows are at most 15 pixels, `j − 2`, `j − 1` and `j + 1`, `j + 2` from 17
//!   ([`vertical`]). The blocks are zero past the plane's ends (the padding rows), so these
//!   shifts take no mask; each block is loaded once per plane. Rows of 32 pixels or more
//!   ([`wide_plane`], planes of any height) load the rows above and below where they lie,
//!   masked where they leave the plane.
//! - **The columns left and right** (`z_0[p − 1]`, `z_2[p + 1]`) are one `valignd` each out of
//!   two vectors' sums, zeroing the lanes whose neighbour lies outside the row (one mask per
//!   vector for each side, [`Flat512`]; for wide rows one period of them, `w / gcd(w, 16)`
//!   vectors: made in the loop from the vector's first column, they took 1.35× the time).
//!
//! Each vector takes 4 shifts, 9 multiply-adds and 2 additions; summed tap by tap in kernel
//! order (as the tile and band kernels do) it took 8 shifts and 9 multiply-adds in a chain of
//! 9. One thread, bias + ReLU6, against that (separate processes alternated twice, 2-core
//! Zen 4): 576 × 14² in 0.72 of the time, 384 × 14² 0.69, 192 × 28² 0.66, 960 × 7² 0.86; other
//! widths (10², 13², 20², 31²) 0.66–0.74. Wide rows against the 16-lane rows (`rows512`, 2
//! threads): 32 × 56² 0.83, 96 × 32² 0.91, 64 × 33² 0.7; MobileNetV2's 32 × 112² and
//! 144 × 56², which stream from L3, 0.97–1.0. The sums are those of another order than the
//! other kernels': exact where every partial sum is (integers), within the depthwise
//! tolerance elsewhere, and the bits of the order above (a test holds them to a scalar model).
//!
//! The shifts are `vpermt2ps` by indices set once per layer from the row width, and on
//! MobileNetV2's planes `valignd` by an immediate (inline assembly: LLVM turns
//! `_mm512_maskz_alignr_epi32` into `vpermt2ps`), which on Zen 4 contends less with the
//! multiply-adds (8 `valignd` with 8 multiply-adds in 10.7 cycles, 8 `vpermt2ps` in 14.6).
//!
//! A thread's run of planes is one call ([`planes`]): the permute indices (where the plane
//! size takes them) are loaded once for the run, each plane's channel is counted along (no
//! division per plane), and MobileNetV2's 7² plane is compiled with its size known (as its
//! 14² and 28² were before the rolling rows took them), so the blocks' bounds fold to
//! constants and the shifts are immediates. One call per plane, with the size read from the
//! geometry, had taken 1.4× the time at 960 × 7², 1.15× at 576 × 14² and 1.1× at 192 × 28²
//! (bias + ReLU6, 2 threads, separate processes alternated three times, the same sums).

use super::super::activation::avx512::lanes;
use std::arch::x86_64::*;
use tilekit_kernels::{Conv2dDesc, Layout};

/// Lanes per vector (AVX-512).
const L: usize = 16;

/// The most pixels of a row: 15 (`NEAR`), or 17 to 31 (`FAR`).
const MAX_WIDTH: usize = 31;

/// The most vectors of a plane (1024 pixels) but for wide rows.
const MAX_VECTORS: usize = 64;

/// The fewest pixels of a wide row ([`wide_plane`]): two vectors, so a vector holds at most
/// one row's start and one row's end.
const WIDE: usize = 32;

/// The most pixels of a wide row: its vectors' masks repeat every `w / gcd(w, 16)` vectors, at
/// most 256.
const MAX_WIDE: usize = 256;

/// A layer's geometry for the kernel: the plane's sizes, the vertical shifts' permute indices
/// and the lanes of each vector with a neighbour left and right in the row.
pub(super) struct Flat512 {
    /// Pixels per plane (input and output).
    hw: usize,
    /// Pixels per row.
    w: usize,
    /// Rows of 17 to 31 pixels, else of up to 15 (and of at least [`WIDE`], with `wide`).
    far: bool,
    /// Rows of at least [`WIDE`] pixels, planes of any size: the rows above and below loaded
    /// where they lie, the row ends' masks counted along ([`wide_plane`]).
    wide: bool,
    /// The row above's and the row below's indices into their two blocks (16 · 2 elements):
    /// lane `l` of vector `j` reads pixel `16·j + l ∓ w`.
    idx: [[i32; L]; 2],
    /// Per vector, the lanes whose left and whose right neighbour lie in the row (`x ≥ 1`,
    /// `x + 1 < w`); for wide rows, vector `j`'s at `j mod period`.
    cols: [[u16; 2]; MAX_WIDE],
    /// Wide rows: the vectors after which the masks repeat, `w / gcd(w, 16)`.
    period: usize,
}

impl Flat512 {
    /// The geometry, or `None` where the layer is not NCHW 3 × 3 with stride and dilation 1,
    /// padding 1 on every side, multiplier 1, rows of 1 to 15 or 17 to [`MAX_WIDTH`] pixels
    /// and at most 256 pixels a plane (1024 from 17 a row).
    ///
    /// It is made once per call, so its cost is the layer's: built pixel by pixel (a division
    /// each), the column masks took 1.1× the time of MobileNetV2's 192 × 28² layer (20.0–20.3
    /// µs against 18.0–18.4) and 1.25× that of 30 × 20², where vector by vector and row by row
    /// they do not show (2 threads, separate processes alternated three times, the same sums).
    pub(super) fn new(d: &Conv2dDesc) -> Option<Flat512> {
        let (h, w) = (d.height, d.width);
        if !same_3x3(d)
            || !(1..=MAX_WIDE).contains(&w)
            || w == 16
            || h == 0
            || (w <= MAX_WIDTH && h * w > if w < 16 { 256 } else { L * MAX_VECTORS })
        {
            return None;
        }
        let (hw, far, wide) = (h * w, w > 16, w >= WIDE);
        // Wide rows: the masks of one period of vectors, every lane a pixel.
        let period = if wide { w / gcd(w, L) } else { 0 };
        let (mask_pixels, mask_rows) = if wide { (period * L, period * L / w) } else { (hw, h) };
        let mut idx = [[0i32; L]; 2];
        for (lanes, below) in idx.iter_mut().zip([false, true]) {
            // The pixel's offset and the first of the two blocks its lanes lie in.
            let (o, first) = match (below, far) {
                (false, false) => (-(w as isize), -1),
                (false, true) => (-(w as isize), -2),
                (true, false) => (w as isize, 0),
                (true, true) => (w as isize, 1),
            };
            for (l, i) in lanes.iter_mut().enumerate() {
                // Within the two blocks: 0 ≤ o − 16·first + l < 32 for every width but 16.
                *i = (o - first * L as isize + l as isize) as i32;
            }
        }
        // Every lane of the plane, then the rows' ends taken out: built vector by vector and
        // row by row, with no division per pixel (this runs once per call).
        let mut cols = [[0u16; 2]; MAX_WIDE];
        for (j, c) in cols.iter_mut().enumerate().take(mask_pixels.div_ceil(L)) {
            *c = [lanes(j * L, mask_pixels); 2];
        }
        for y in 0..mask_rows {
            // The row's first pixel has no left neighbour, its last no right one.
            let (first, last) = (y * w, y * w + w - 1);
            cols[first / L][0] &= !(1 << (first % L));
            cols[last / L][1] &= !(1 << (last % L));
        }
        Some(Flat512 { hw, w, far, wide, idx, cols, period })
    }

    /// Pixels per plane.
    pub(super) fn pixels(&self) -> usize {
        self.hw
    }
}

/// Whether the layer is NCHW 3 × 3 with stride and dilation 1, padding 1 on every side and
/// multiplier 1 (its output planes the input's size): the geometry of this kernel and of the
/// rolling rows (`super::roll512`).
pub(super) fn same_3x3(d: &Conv2dDesc) -> bool {
    let geometry = (d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w);
    let pads = [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right];
    d.layout == Layout::Nchw && geometry == (3, 3, 1, 1, 1, 1) && pads == [1; 4] && d.multiplier == 1
}

/// A run of consecutive planes of one layer (multiplier 1: output plane `p`, image ·
/// channels + channel, reads input plane `p`): the input planes from `first`, the weights
/// (`[channel][tap]`, or `[tap][channel]` where `packed`) and the bias of every channel.
pub(super) struct Run<'a> {
    pub(super) x: &'a [f32],
    pub(super) first: usize,
    pub(super) channels: usize,
    pub(super) w: &'a [f32],
    pub(super) packed: bool,
    pub(super) bias: Option<&'a [f32]>,
}

impl Run<'_> {
    /// Panics unless the run holds `n` input planes of `hw` pixels and every channel's nine
    /// weights and bias (`what` names the kernel).
    pub(super) fn check(&self, n: usize, hw: usize, what: &str) {
        let c = self.channels;
        assert!(
            self.x.len() >= n * hw && self.w.len() >= c * 9 && self.bias.is_none_or(|b| b.len() >= c) && c > 0,
            "{what} past their operands"
        );
    }

    /// Channel `ch`'s nine weights (tap order) and its bias, each in every lane.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    pub(super) unsafe fn channel(&self, ch: usize) -> ([__m512; 9], __m512) {
        let c = self.channels;
        // SAFETY: the caller's promise of AVX-512F; the indices are bounds-checked.
        unsafe {
            let w: [__m512; 9] = if self.packed {
                std::array::from_fn(|t| _mm512_set1_ps(self.w[t * c + ch]))
            } else {
                let wk = &self.w[ch * 9..][..9];
                std::array::from_fn(|t| _mm512_set1_ps(wk[t]))
            };
            (w, _mm512_set1_ps(self.bias.map_or(0.0, |b| b[ch])))
        }
    }
}

/// Output planes `r.first ..` (`out`, whole planes): each from its input plane, its channel's
/// nine weights and bias, with the activation `A` (`nhwc3::avx`'s `NONE`, `RELU` or `RELU6`)
/// applied in registers, and `each` called on every plane's output after it is stored (in
/// L1). The permute indices, where the plane size takes them, are loaded once for the run,
/// not per plane.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn planes<const A: u8>(g: &Flat512, r: &Run, out: &mut [f32], each: impl Fn(&mut [f32])) {
    let hw = g.hw;
    let n = out.len() / hw;
    r.check(n, hw, "NCHW 3 x 3 planes");
    // SAFETY: the caller's promise of AVX-512F; the operands are checked above.
    unsafe {
        // MobileNetV2's 7² plane with its size known to the compiler: the blocks' bounds
        // fold to constants, and the shifts are `valignd`s by constants. The width too: 49
        // pixels are also a 49 × 1 plane, whose shifts differ. (Its 14² and 28² planes take
        // the rolling rows, `super::roll512`.)
        match (g.wide, g.far, hw, g.w) {
            (true, ..) => run::<true, A, 0>(g, r, out, each),
            (_, false, 49, 7) => run::<false, A, 49>(g, r, out, each),
            (_, true, ..) => run::<true, A, 0>(g, r, out, each),
            (_, false, ..) => run::<false, A, 0>(g, r, out, each),
        }
    }
}

/// [`planes`] for one plane size (`HW`, a square plane's; 0 for the layer's, any shape): the
/// permute indices are loaded once for the run where the size is not known (with it, the
/// shifts need none).
///
/// # Safety
/// As [`planes`]'s, with the operands checked there.
#[inline(always)]
unsafe fn run<const FAR: bool, const A: u8, const HW: usize>(
    g: &Flat512,
    r: &Run,
    out: &mut [f32],
    each: impl Fn(&mut [f32]),
) {
    // SAFETY: the caller's promise of AVX-512F; `x` and `o` are whole planes, the index
    // vectors 16 `i32`s each.
    unsafe {
        let (hw, c) = (g.hw, r.channels);
        let mut idx = [_mm512_setzero_si512(); 2];
        if HW == 0 && !g.wide {
            for (v, i) in idx.iter_mut().zip(&g.idx) {
                *v = _mm512_loadu_si512(i.as_ptr().cast());
            }
        }
        // The channel counted along the planes, not divided out of each plane's index.
        let mut ch = r.first % c;
        for (i, o) in out.chunks_exact_mut(hw).enumerate() {
            let (w, b) = r.channel(ch);
            ch = if ch + 1 == c { 0 } else { ch + 1 };
            let x = &r.x[i * hw..][..hw];
            if FAR && HW == 0 && g.wide {
                wide_plane::<A>(g, x.as_ptr(), &w, b, o.as_mut_ptr());
            } else {
                plane::<FAR, A, HW>(g, x.as_ptr(), &w, &idx, b, o.as_mut_ptr());
            }
            each(o);
        }
    }
}

/// The plane's pixels: `HW` where that is not 0 (a size the compiler knows), else the layer's.
#[inline(always)]
fn pixels<const HW: usize>(g: &Flat512) -> usize {
    if HW > 0 { HW } else { g.hw }
}

/// Block `k` of a plane (pixels `16·k …`), the lanes past the plane zero; zero for `k` outside
/// the plane.
///
/// # Safety
/// The CPU has AVX-512F; `x` is a plane of `g.hw` pixels.
#[inline(always)]
unsafe fn block<const HW: usize>(g: &Flat512, x: *const f32, k: isize) -> __m512 {
    let hw = pixels::<HW>(g);
    // SAFETY: only the lanes inside the plane are read.
    unsafe {
        if k < 0 || k as usize * L >= hw {
            return _mm512_setzero_ps();
        }
        let first = k as usize * L;
        if first + L <= hw {
            _mm512_loadu_ps(x.add(first))
        } else {
            _mm512_maskz_loadu_ps(lanes(first, hw), x.add(first))
        }
    }
}

/// One plane by column sums ([`column_sums`]), vector by vector:
/// `out = (z_1[p] + z_0[p − 1]) + z_2[p + 1]`, the left neighbours' sums shifted in from the
/// vector before, the right ones' from the vector after (each a `valignd` zeroing the lanes
/// at the row's ends), then the activation `A` and a store masked to the plane. The blocks
/// go through a window of five, `j − 2 … j + 2`, each loaded once.
///
/// # Safety
/// The CPU has AVX-512F; `x` and `out` are planes of `g.hw` pixels.
#[inline(always)]
unsafe fn plane<const FAR: bool, const A: u8, const HW: usize>(
    g: &Flat512,
    x: *const f32,
    w: &[__m512; 9],
    idx: &[__m512i; 2],
    b: __m512,
    out: *mut f32,
) {
    use super::nhwc3::avx::finish512;
    // SAFETY: the blocks read only the plane (`block`); the stores are masked to its pixels.
    unsafe {
        let hw = pixels::<HW>(g);
        let zero = _mm512_setzero_ps();
        // Rows of up to 15 pixels read blocks j − 1 … j + 1 only: the window's ends stay zero.
        let edge = |k: isize| if FAR { block::<HW>(g, x, k) } else { zero };
        let mut win = [edge(-2), block::<HW>(g, x, -1), block::<HW>(g, x, 0), block::<HW>(g, x, 1), edge(2)];
        // The sums of vector j − 1's left column, and vector j's three.
        let mut before = zero;
        let mut z = column_sums::<FAR, HW>(&win, w, idx, b);
        for j in 0..hw.div_ceil(L) {
            // The window moved on to vector j + 1.
            let k = j as isize + 3;
            win = if FAR {
                [win[1], win[2], win[3], win[4], block::<HW>(g, x, k)]
            } else {
                [zero, win[2], win[3], block::<HW>(g, x, k - 1), zero]
            };
            // Past the plane's last vector its sums are never read unmasked: zero.
            let after = if (j + 1) * L < hw { column_sums::<FAR, HW>(&win, w, idx, b) } else { [zero; 3] };
            let [left, right] = g.cols[j];
            let first = j * L;
            let s = combine(&z, before, &after, left, right);
            store(out.add(first), first, hw, finish512::<A>(s));
            before = z[0];
            z = after;
        }
    }
}

/// The three column sums of vector `j` from its window of blocks `j − 2 … j + 2`, in this
/// order: `z_0 = (w0·x[p − w] + w3·x[p]) + w6·x[p + w]`, `z_1 = ((b + w1·x[p − w]) + w4·x[p]) +
/// w7·x[p + w]`, `z_2` as `z_0` with `w2`, `w5`, `w8` (weights in tap order, `3·ky + kx`; each
/// step one multiply-add, one rounding).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn column_sums<const FAR: bool, const HW: usize>(
    win: &[__m512; 5],
    w: &[__m512; 9],
    idx: &[__m512i; 2],
    b: __m512,
) -> [__m512; 3] {
    // SAFETY: the caller's promise of AVX-512F.
    unsafe {
        let (up, dn) = if FAR {
            (vertical::<HW, false>(win[0], win[1], idx[0]), vertical::<HW, true>(win[3], win[4], idx[1]))
        } else {
            (vertical::<HW, false>(win[1], win[2], idx[0]), vertical::<HW, true>(win[2], win[3], idx[1]))
        };
        sums(up, win[2], dn, w, b)
    }
}

/// The three column sums of 16 pixels from the rows above (`up`), at (`mid`) and below them
/// (`dn`), in [`column_sums`]' order.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn sums(up: __m512, mid: __m512, dn: __m512, w: &[__m512; 9], b: __m512) -> [__m512; 3] {
    // SAFETY: the caller's promise of AVX-512F.
    unsafe {
        let z0 = _mm512_fmadd_ps(w[6], dn, _mm512_fmadd_ps(w[3], mid, _mm512_mul_ps(w[0], up)));
        let z1 = _mm512_fmadd_ps(w[7], dn, _mm512_fmadd_ps(w[4], mid, _mm512_fmadd_ps(w[1], up, b)));
        let z2 = _mm512_fmadd_ps(w[8], dn, _mm512_fmadd_ps(w[5], mid, _mm512_mul_ps(w[2], up)));
        [z0, z1, z2]
    }
}

/// A vector's outputs from its column sums `z` and its neighbours':
/// `(z_1[p] + z_0[p − 1]) + z_2[p + 1]`, the left column's sums shifted in from `before` (the
/// vector before's), the right one's from `after`, the lanes outside `left` and `right` (the
/// rows' first and last pixels) zero.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn combine(z: &[__m512; 3], before: __m512, after: &[__m512; 3], left: u16, right: u16) -> __m512 {
    // SAFETY: the caller's promise of AVX-512F.
    unsafe { _mm512_add_ps(_mm512_add_ps(z[1], align::<15>(left, z[0], before)), align::<1>(right, after[2], z[2])) }
}

/// `s` stored at `out`, pixel `first` of a plane of `hw`: whole where all 16 lie inside, else
/// masked to the plane. The branch, not a mask made from `first` each vector: that mask
/// (a shift, then `kmovw` from a general register) took 1.1× the time of wide rows.
///
/// # Safety
/// The CPU has AVX-512F; `out` is pixel `first` of an output plane of `hw` pixels.
#[inline(always)]
unsafe fn store(out: *mut f32, first: usize, hw: usize, s: __m512) {
    // SAFETY: the caller's promises; only the lanes inside the plane are written.
    unsafe {
        if first + L <= hw {
            _mm512_storeu_ps(out, s);
        } else {
            _mm512_mask_storeu_ps(out, lanes(first, hw), s);
        }
    }
}

/// The greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Pixels `start ..` of a plane of `hw` pixels at `x`, zero outside it.
///
/// # Safety
/// The CPU has AVX-512F; `x` is a plane of `hw` pixels.
#[inline(always)]
unsafe fn span(x: *const f32, hw: usize, start: isize) -> __m512 {
    // SAFETY: the caller's promises; only the lanes inside the plane are read (a masked-off
    // lane is not accessed), the pointer formed by wrapping arithmetic.
    unsafe {
        if start >= 0 && start as usize + L <= hw {
            _mm512_loadu_ps(x.add(start as usize))
        } else {
            let from = (-start).clamp(0, L as isize) as u32;
            let to = (hw as isize - start).clamp(0, L as isize) as u32;
            let m = ((1u32 << to) - 1) & !((1u32 << from) - 1);
            _mm512_maskz_loadu_ps(m as u16, x.wrapping_offset(start))
        }
    }
}

/// The column sums of vector `j` of a plane of `hw` pixels in rows of `width`, its rows above
/// and below loaded where they lie.
///
/// # Safety
/// The CPU has AVX-512F; `x` is a plane of `hw` pixels.
#[inline(always)]
unsafe fn wide_sums(x: *const f32, hw: usize, width: usize, j: usize, w: &[__m512; 9], b: __m512) -> [__m512; 3] {
    let p = (j * L) as isize;
    // SAFETY: passed on.
    unsafe { sums(span(x, hw, p - width as isize), span(x, hw, p), span(x, hw, p + width as isize), w, b) }
}

/// One plane of rows of at least [`WIDE`] pixels by column sums, as [`plane`]: the rows above
/// and below each vector loaded where they lie (`p ∓ w`, the lanes outside the plane masked
/// off, so zero), and the lanes at the rows' ends counted along from the vector's first
/// column (a vector holds at most one row's start and one row's end).
///
/// # Safety
/// The CPU has AVX-512F; `x` and `out` are planes of `g.hw` pixels, `g.w ≥ WIDE`.
#[inline(always)]
unsafe fn wide_plane<const A: u8>(g: &Flat512, x: *const f32, w: &[__m512; 9], b: __m512, out: *mut f32) {
    use super::nhwc3::avx::finish512;
    let (hw, width) = (g.hw, g.w);
    // SAFETY: the caller's promise of AVX-512F; the stores are masked to the plane.
    unsafe {
        let zero = _mm512_setzero_ps();
        let vectors = hw.div_ceil(L);
        let sums_at = |j: usize| if j < vectors { wide_sums(x, hw, width, j, w, b) } else { [zero; 3] };
        // Vector j − 1's left column's sums and vector j's and j + 1's: each iteration's sums
        // are the next one's, so its outputs wait on none of its own multiply-adds (64 × 40²
        // on one thread in 0.92 of the time of the sums for j + 1 made in the iteration; level
        // in `plane`, so not there).
        let (mut before, mut z, mut after) = (zero, sums_at(0), sums_at(1));
        // Vector j's place in the masks' period.
        let mut k = 0;
        for j in 0..vectors {
            let next = sums_at(j + 2);
            let [left, right] = g.cols[k];
            k = if k + 1 == g.period { 0 } else { k + 1 };
            let first = j * L;
            let s = combine(&z, before, &after, left, right);
            store(out.add(first), first, hw, finish512::<A>(s));
            (before, z, after) = (z[0], after, next);
        }
    }
}

/// MobileNetV2's plane size that this kernel takes (7², square planes only) and the row
/// above's and the row below's shift into their two blocks: the index of lane 0 (as
/// [`Flat512`]'s permute indices, lane `l` at `shift + l`).
const SHIFTS: [(usize, [u8; 2]); 1] = [(49, [9, 7])];

/// The row above (`BELOW` false) or below the 16 pixels of a vector, out of its two blocks
/// `lo` and `hi`: on the plane sizes of [`SHIFTS`] (`HW`) one `valignd` by the shift, else the
/// permute by `idx`.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn vertical<const HW: usize, const BELOW: bool>(lo: __m512, hi: __m512, idx: __m512i) -> __m512 {
    macro_rules! shift {
        ($s:literal) => {
            // SAFETY: the caller's promise of AVX-512F.
            unsafe {
                if BELOW { align::<{ SHIFTS[$s].1[1] }>(!0, hi, lo) } else { align::<{ SHIFTS[$s].1[0] }>(!0, hi, lo) }
            }
        };
    }
    if HW == SHIFTS[0].0 { shift!(0) } else { _mm512_permutex2var_ps(lo, idx, hi) }
}

/// `valignd` by `S`: lanes `S …` of `lo` then `hi`, the lanes outside `m` zero.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn align<const S: u8>(m: __mmask16, hi: __m512, lo: __m512) -> __m512 {
    let r: __m512;
    // SAFETY: the caller's promise of AVX-512F; registers only.
    unsafe {
        std::arch::asm!(
            "valignd {r}{{{m}}}{{z}}, {hi}, {lo}, {imm}",
            r = lateout(zmm_reg) r,
            m = in(kreg) m,
            hi = in(zmm_reg) hi,
            lo = in(zmm_reg) lo,
            imm = const S,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    r
}

/// The column sums' scalar model, which the flat planes' and the stride-2 kernel's tests hold
/// their bits to.
#[cfg(test)]
pub(super) mod model {
    use super::super::super::tests::PageEnd;
    use super::Run;

    /// Images × channels of the model tests' layers.
    const PLANES: usize = 6;
    /// Channels of the model tests' layers.
    const CHANNELS: usize = 3;
    /// Where an output goes before the kernel writes it, and past the output.
    const SENTINEL: f32 = 1234.5;

    /// A layer of [`PLANES`] planes of `h × w` inputs and `oh × ow` outputs at `stride` (1 or
    /// 2, padding 1 at the top and left), its inputs and weights such that the sums round;
    /// `masked_right`: the kernel zeroes a right neighbour outside the row (the flat planes)
    /// rather than summing its padding column (stride 2).
    pub(in super::super) struct Layer {
        pub(in super::super) h: usize,
        pub(in super::super) w: usize,
        pub(in super::super) oh: usize,
        pub(in super::super) ow: usize,
        pub(in super::super) stride: usize,
        pub(in super::super) masked_right: bool,
    }

    impl Layer {
        /// The model's outputs against `planes`' (`run(operands, out)`), bit for bit, with
        /// weights as stored and packed: each step of a column sum one `mul_add`, the padding
        /// zero, `out = (z_1 + z_0[left]) + z_2[right]`, the first column's left neighbour
        /// `+0`. The input ends where a page without access begins, so a read past it faults;
        /// nothing may be written past the output. `what` names the layer in a failure.
        pub(in super::super) fn check(&self, what: &str, run: impl Fn(&Run, &mut [f32])) {
            let Layer { h, w, oh, ow, stride, masked_right } = *self;
            let (hw, ohw) = (h * w, oh * ow);
            let weights: Vec<f32> = (0..CHANNELS * 9).map(|i| ((i * 37) % 29) as f32 * 0.0771 - 1.03).collect();
            let packed: Vec<f32> = (0..CHANNELS * 9).map(|i| weights[(i % CHANNELS) * 9 + i / CHANNELS]).collect();
            let bias: Vec<f32> = (0..CHANNELS).map(|c| c as f32 * 0.3137 - 0.29).collect();
            let input: Vec<f32> = (0..PLANES * hw).map(|i| ((i * 7919) % 113) as f32 * 0.0517 - 2.9).collect();
            let guarded = PageEnd::new(&input);
            let x = guarded.get();
            let mut want = vec![0.0f32; PLANES * ohw];
            for (p, o) in want.chunks_exact_mut(ohw).enumerate() {
                let (wk, b) = (&weights[(p % CHANNELS) * 9..][..9], bias[p % CHANNELS]);
                let at = |y: isize, c: isize| {
                    let inside = (0..h as isize).contains(&y) && (0..w as isize).contains(&c);
                    if inside { x[p * hw + y as usize * w + c as usize] } else { 0.0 }
                };
                let column = |y: isize, c: isize, kx: usize| {
                    let (up, mid, dn) = (at(y - 1, c), at(y, c), at(y + 1, c));
                    let first = if kx == 1 { wk[1].mul_add(up, b) } else { wk[kx] * up };
                    wk[6 + kx].mul_add(dn, wk[3 + kx].mul_add(mid, first))
                };
                for (i, o) in o.iter_mut().enumerate() {
                    let (y, c) = ((stride * (i / ow)) as isize, (stride * (i % ow)) as isize);
                    let left = if c > 0 { column(y, c - 1, 0) } else { 0.0 };
                    let right = if c + 1 < w as isize || !masked_right { column(y, c + 1, 2) } else { 0.0 };
                    *o = (column(y, c, 1) + left) + right;
                }
            }
            for (wt, packed) in [(&weights, false), (&packed, true)] {
                let r = Run { x, first: 0, channels: CHANNELS, w: wt, packed, bias: Some(&bias) };
                let mut out = vec![SENTINEL; PLANES * ohw + 16];
                run(&r, &mut out[..PLANES * ohw]);
                assert!(out[PLANES * ohw..].iter().all(|&v| v == SENTINEL), "{what}: wrote past the output");
                for (i, (o, e)) in out.iter().zip(&want).enumerate() {
                    assert!(o.to_bits() == e.to_bits(), "{what} packed {packed}: output {i} is {o}, the model's {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 7² plane's geometry: its four vectors, the taps' indices, the lanes with neighbours
    /// left and right, and the layers the kernel does not take.
    #[test]
    fn geometry() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        let g = Flat512::new(&d).expect("flat");
        assert_eq!((g.hw, g.hw.div_ceil(L)), (49, 4));
        // The row above pixel p is p − 7: lane l of block j − 1 is index l, so l + 9. The row
        // below, p + 7, lane 7 + l of blocks j and j + 1.
        assert_eq!((g.idx[0][0], g.idx[0][15], g.idx[1][0]), (9, 24, 7));
        // Columns 1..7 have a left neighbour, 0..6 a right one: pixels 0, 7, 14 … are the
        // first of their rows, 6, 13, 20 … the last.
        assert_eq!(g.cols[0], [!0x4081, !0x2040]);
        // Vector 3 holds pixel 48 (row 6, column 6) only.
        assert_eq!(g.cols[3], [1, 0]);
        assert!(Flat512::new(&d.height(16).width(16)).is_none());
        assert!(Flat512::new(&d.stride_h(2).stride_w(2)).is_none());
        assert!(Flat512::new(&d.pad_left(0)).is_none());
        assert!(Flat512::new(&d.height(18).width(15)).is_none());
        assert!(Flat512::new(&d.height(17).width(15)).is_some());
        assert!(Flat512::new(&d.height(3).width(16)).is_none());
        // 28²: rows of 17 to 31 read the blocks two away for the rows above and below; the
        // row above pixel p is p − 28, lane l of block j − 2 is index l + 4.
        let g = Flat512::new(&d.height(28).width(28)).expect("flat");
        assert_eq!((g.far, g.hw.div_ceil(L), g.idx[0][0], g.idx[1][0]), (true, 49, 4, 12));
        assert!(Flat512::new(&d.height(33).width(31)).is_some());
        assert!(Flat512::new(&d.height(34).width(31)).is_none());
        // Wide rows: 32 to 256 pixels, any height; the masks repeat every w / gcd(w, 16)
        // vectors.
        let g = Flat512::new(&d.height(3).width(32)).expect("flat");
        assert!(g.wide && g.period == 2);
        let g = Flat512::new(&d.height(1000).width(40)).expect("flat");
        assert!(g.wide && g.period == 5);
        assert_eq!(Flat512::new(&d.height(1).width(255)).map(|g| g.period), Some(255));
        assert!(Flat512::new(&d.height(2).width(256)).is_some());
        assert!(Flat512::new(&d.height(2).width(257)).is_none());
    }

    /// The `valignd` shifts of MobileNetV2's planes are the permute indices the geometry
    /// builds for them, plane by plane, for the rows above and below.
    #[test]
    fn shifts_are_the_permute_indices() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        for (hw, shifts) in SHIFTS {
            let w = (1..=MAX_WIDTH).find(|w| w * w == hw).expect("a square plane");
            let g = Flat512::new(&d.height(w).width(w)).expect("flat");
            for (lanes, shift) in g.idx.iter().zip(shifts) {
                let expected: Vec<i32> = (0..L as i32).map(|l| i32::from(shift) + l).collect();
                assert_eq!(lanes[..], expected[..], "{w}², shift {shift}");
            }
        }
    }

    /// The sums are the column sums' order ([`column_sums`], [`plane`]), bit for bit, on
    /// inputs whose sums round: a scalar model of that order (each step one `mul_add`, the
    /// padding zero) against every plane of every row width the kernel takes, MobileNetV2's
    /// squares (their shifts compiled in), a plane of 49 × 1 and wide rows (32 to 256 pixels),
    /// with heights of one row to the most pixels; two images of three channels (each plane's channel counted along),
    /// weights as stored and packed. The input ends where a page without access begins, so a
    /// read past it faults; nothing is written past the output.
    #[test]
    fn sums_are_the_column_order() {
        use super::super::super::simd::Isa;
        if Isa::detect() != Isa::Avx512 {
            println!("SKIP sums_are_the_column_order: this CPU has no AVX-512F");
            return;
        }
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        let mut shapes: Vec<(usize, usize)> = vec![(7, 7), (14, 14), (28, 28), (49, 1)];
        for w in (1..=MAX_WIDTH).filter(|&w| w != 16) {
            let most = if w < 16 { 256 } else { L * MAX_VECTORS } / w;
            shapes.extend([1, 2, 3, 1 + w % 5, most].into_iter().map(|h| (h, w)));
        }
        // Wide rows: one row to several, a row a whole number of vectors or not.
        for w in [32, 33, 40, 47, 56, 100, 112, 255, 256] {
            shapes.extend([1, 2, 3, 7].into_iter().map(|h| (h, w)));
        }
        for (h, w) in shapes {
            let g = Flat512::new(&d.height(h).width(w)).expect("flat");
            let layer = model::Layer { h, w, oh: h, ow: w, stride: 1, masked_right: true };
            layer.check(&format!("{h} x {w}"), |r, out| {
                // SAFETY: the CPU has AVX-512F (above).
                unsafe { planes::<{ super::super::nhwc3::avx::NONE }>(&g, r, out, |_| {}) }
            });
        }
    }

    /// The lanes with neighbours left and right, built row by row, are those of the
    /// definition pixel by pixel, on every width the kernel takes and heights from one row to
    /// the most pixels (wide rows: one period of vectors, read at `j mod period` for every
    /// vector of planes of 1 to 17 rows).
    #[test]
    fn columns_match_the_pixels() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        for w in (1..=MAX_WIDE).filter(|&w| w != 16) {
            let most = if w < 16 { 256 } else { L * MAX_VECTORS } / w;
            let heights = if w >= WIDE { vec![1, 2, 5, 17] } else { vec![1, 2, 3, w, most / 2, most] };
            for h in heights.into_iter().filter(|&h| w >= WIDE || (1..=most).contains(&h)) {
                let g = Flat512::new(&d.height(h).width(w)).expect("flat");
                let mut cols = vec![[0u16; 2]; (h * w).div_ceil(L)];
                for p in 0..h * w {
                    let x = p % w;
                    if x >= 1 {
                        cols[p / L][0] |= 1 << (p % L);
                    }
                    if x + 1 < w {
                        cols[p / L][1] |= 1 << (p % L);
                    }
                }
                for (j, c) in cols.iter().enumerate() {
                    // The last vector's lanes past the plane: wide rows keep them (the store is
                    // masked to the plane).
                    let got = if g.wide { g.cols[j % g.period].map(|m| m & lanes(j * L, h * w)) } else { g.cols[j] };
                    assert_eq!(got, *c, "{h} x {w}, vector {j}");
                }
                if !g.wide {
                    assert!(g.cols[cols.len()..].iter().all(|&c| c == [0, 0]), "{h} x {w}");
                }
            }
        }
    }
}
