//! NCHW 3 × 3 layers with stride and dilation 1, padding 1 on every side, multiplier 1 and
//! rows of 9 to 16 or 24 to 32 pixels on AVX-512 ([`takes_width`]): each output row as one or
//! two 16-lane vectors, each input row read once and multiplied into the three output rows
//! that read it, whose sums roll down the plane.
//!
//! Input row `iy` is one load per vector and two shifts of it ([`taps`]: columns −1, 0 and
//! +1), and nine multiply-adds take it into output rows `iy + 1` (kernel row 0, a sum started
//! at the bias), `iy` (kernel row 1) and `iy − 1` (kernel row 2, which it completes: the
//! activation is applied in registers and the row stored, masked to the row). So each output
//! vector takes 9 multiply-adds, 2 shifts and, with ReLU6, 2 more operations: 13 on the
//! vector ports, against the flat planes' 17 ([`super::flat512`]: 9 multiply-adds, 4 shifts,
//! 2 additions, the activation), at the cost of the lanes past the row's end (2 of 16 at
//! 14², 4 of 32 at 28²).
//!
//! A tap whose column lies outside the input row (column −1, or `w` on the right) is a
//! multiply-add masked to the lanes inside: lanes outside keep their sum, as kernels that skip
//! such taps do, and kernel rows outside the plane (above the first row, below the last) are
//! not added. Each output's sum is the bias, then the taps in kernel order, one rounding each:
//! the band, tile and 16-lane rows kernels' bits (a test holds them to a scalar model). Only
//! the last row's loads are masked; nothing outside the plane is read.
//!
//! Against the flat planes, which took these layers before (bias + ReLU6, separate processes
//! alternated five times, 2-core AVX-512 Xeon): MobileNetV2's 576 × 14² in 0.74 of the time on
//! one thread and 0.76 on two, 192 × 28² in 0.86 on both (other widths at [`takes_width`]).

use super::super::activation::avx512::lanes;
use super::flat512::{Run, same_3x3};
use std::arch::x86_64::*;
use tilekit_kernels::Conv2dDesc;

/// Lanes per vector (AVX-512).
const L: usize = 16;

/// The row widths this kernel takes: one vector a row from 9 pixels, two from 24 to 32.
/// Against the flat planes ([`super::flat512`]), which fill every lane, on planes of about
/// 110 000 pixels (2 threads, separate processes alternated three times): rows of 9, 10 and
/// 12 took 0.95–0.97 of the time, 14 (MobileNetV2's 14², its size compiled in) 0.75, 24
/// 0.96, 28 (its 28²) 0.91, 31 0.73; 17 and 20, which fill 53% and 63% of their two
/// vectors, 1.09 and 1.11. Rows of 16 and 32, which the flat planes do not take as such
/// (the 16-lane rows, [`super::rows512`], and the flat planes' wide rows), took 0.56 and 0.59.
pub(super) fn takes_width(w: usize) -> bool {
    matches!(w, 9..=16 | 24..=32)
}

/// A layer's geometry for the kernel: the plane's sizes and each vector's lanes.
pub(super) struct Roll512 {
    h: usize,
    w: usize,
    /// Per vector of a row (the second only from 17 pixels): the lanes whose left neighbour
    /// lies in the row (`1 ≤ x < w`), the lanes in the row (`x < w`) and those whose right
    /// neighbour does (`x + 1 < w`).
    masks: [[u16; 3]; 2],
}

impl Roll512 {
    /// The geometry, or `None` where the layer is not NCHW 3 × 3 with stride and dilation 1,
    /// padding 1 on every side, multiplier 1 and rows of a width [`takes_width`].
    pub(super) fn new(d: &Conv2dDesc) -> Option<Roll512> {
        let (h, w) = (d.height, d.width);
        if !same_3x3(d) || !takes_width(w) || h == 0 {
            return None;
        }
        let mut masks = [[0u16; 3]; 2];
        for (v, m) in masks.iter_mut().enumerate().take(w.div_ceil(L)) {
            let inside = lanes(v * L, w);
            *m = [if v == 0 { inside & !1 } else { inside }, inside, lanes(v * L, w - 1)];
        }
        Some(Roll512 { h, w, masks })
    }

    /// Pixels per plane.
    pub(super) fn pixels(&self) -> usize {
        self.h * self.w
    }
}

/// Output planes `r.first ..` (`out`, whole planes): each from its input plane, its channel's
/// nine weights and bias, with the activation `A` (`nhwc3::avx`'s `NONE`, `RELU` or `RELU6`)
/// applied in registers, and `each` called on every plane's output after it is stored (in
/// L1).
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn planes<const A: u8>(g: &Roll512, r: &Run, out: &mut [f32], each: impl Fn(&mut [f32])) {
    let hw = g.pixels();
    let n = out.len() / hw;
    r.check(n, hw, "NCHW 3 x 3 rolling rows");
    // SAFETY: the caller's promise of AVX-512F; the operands are checked above.
    unsafe {
        // MobileNetV2's planes with their sizes known to the compiler: the loop's bounds and
        // the rows' offsets fold to constants.
        match (g.h, g.w) {
            (14, 14) => run::<1, A, 14, 14>(g, r, out, each),
            (28, 28) => run::<2, A, 28, 28>(g, r, out, each),
            (_, ..=L) => run::<1, A, 0, 0>(g, r, out, each),
            _ => run::<2, A, 0, 0>(g, r, out, each),
        }
    }
}

/// [`planes`] for rows of `V` vectors and one plane size (`H × W`; 0 for the layer's).
///
/// # Safety
/// As [`planes`]'s, with the operands checked there.
#[inline(always)]
unsafe fn run<const V: usize, const A: u8, const H: usize, const W: usize>(
    g: &Roll512,
    r: &Run,
    out: &mut [f32],
    each: impl Fn(&mut [f32]),
) {
    let hw = g.pixels();
    let c = r.channels;
    // The channel counted along the planes, not divided out of each plane's index.
    let mut ch = r.first % c;
    for (i, o) in out.chunks_exact_mut(hw).enumerate() {
        // SAFETY: the caller's promise of AVX-512F; `x` and `o` are whole planes.
        unsafe {
            let (w, b) = r.channel(ch);
            let x = &r.x[i * hw..][..hw];
            plane::<V, A, H, W>(g, x.as_ptr(), &w, b, o.as_mut_ptr());
        }
        ch = if ch + 1 == c { 0 } else { ch + 1 };
        each(o);
    }
}

/// Input row `iy`'s taps for each of its `V` vectors: columns −1, 0 and +1 of each. The row's
/// vectors are loaded (the last row's masked to the row; every other row is followed by one
/// more, so its `16·V ≤ 2·w − 1` pixels from its start lie inside the plane), and each is
/// shifted a lane up and a lane down with its neighbours' end lanes shifted in (`valignd`):
/// lane 0 of column −1 in the first vector and the lanes past the row's end in column +1 come
/// out of the vector's other end, and the multiply-adds mask them off. Two shifts took 0.9 of
/// the time of two more loads, which mostly cross a cache line (MobileNetV2's 576 × 14² and
/// 192 × 28², one and two threads, separate processes alternated five times).
///
/// # Safety
/// The CPU has AVX-512F; `x` is a plane of `h × w` pixels and `iy < h`; `last` says whether
/// `iy` is `h − 1`.
#[inline(always)]
unsafe fn taps<const V: usize>(g: &Roll512, x: *const f32, w: usize, iy: usize, last: bool) -> [[__m512; 3]; V] {
    // SAFETY: the caller's promises; the last row's loads are masked to it (a masked-off lane
    // is not accessed).
    unsafe {
        let row = x.add(iy * w);
        // Loops, not `std::array::from_fn`: a closure does not take the target features, so
        // the intrinsics in it would be calls.
        let mut c = [_mm512_setzero_si512(); V];
        for (v, c) in c.iter_mut().enumerate() {
            let at = row.add(v * L);
            *c = _mm512_castps_si512(if last { _mm512_maskz_loadu_ps(g.masks[v][1], at) } else { _mm512_loadu_ps(at) });
        }
        let mut t = [[_mm512_setzero_ps(); 3]; V];
        for (v, t) in t.iter_mut().enumerate() {
            let before = if v > 0 { c[v - 1] } else { c[v] };
            let after = if v + 1 < V { c[v + 1] } else { c[v] };
            *t = [
                _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(c[v], before)),
                _mm512_castsi512_ps(c[v]),
                _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(after, c[v])),
            ];
        }
        t
    }
}

/// `acc` plus one kernel row's three taps (`k`: weights `3·ky …` in tap order) of an input
/// row (`t`), column −1 masked to the lanes with a left neighbour and +1 to those with a right
/// one, one multiply-add (one rounding) each in kernel order.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn add_row<const V: usize>(g: &Roll512, acc: [__m512; V], t: &[[__m512; 3]; V], k: &[__m512]) -> [__m512; V] {
    // SAFETY: the caller's promise of AVX-512F.
    unsafe {
        let mut s = acc;
        for (v, s) in s.iter_mut().enumerate() {
            let [left, _, right] = g.masks[v];
            *s = _mm512_mask3_fmadd_ps(t[v][0], k[0], *s, left);
            *s = _mm512_fmadd_ps(t[v][1], k[1], *s);
            *s = _mm512_mask3_fmadd_ps(t[v][2], k[2], *s, right);
        }
        s
    }
}

/// Output row `oy`'s sums `s` through the activation `A` into `out`, masked to the row.
///
/// # Safety
/// The CPU has AVX-512F; `out` is a plane of `h × w` outputs and `oy < h`.
#[inline(always)]
unsafe fn store<const V: usize, const A: u8>(g: &Roll512, out: *mut f32, w: usize, oy: usize, s: [__m512; V]) {
    use super::nhwc3::avx::finish512;
    // SAFETY: the caller's promises; only the row's lanes are written.
    unsafe {
        let row = out.add(oy * w);
        for (v, s) in s.into_iter().enumerate() {
            let s = finish512::<A>(s);
            if (v + 1) * L <= w {
                _mm512_storeu_ps(row.add(v * L), s);
            } else {
                _mm512_mask_storeu_ps(row.add(v * L), g.masks[v][1], s);
            }
        }
    }
}

/// One plane, input row by input row: each row's taps ([`taps`]) finish output row `iy − 1`
/// (kernel row 2; then it is stored), go on with row `iy` (kernel row 1) and start row
/// `iy + 1` (kernel row 0, from the bias `b`).
///
/// # Safety
/// The CPU has AVX-512F; `x` and `out` are planes of `g.h × g.w` pixels, and each row is `V`
/// vectors (`16·(V − 1) < w ≤ 16·V`).
#[inline(always)]
unsafe fn plane<const V: usize, const A: u8, const H: usize, const W: usize>(
    g: &Roll512,
    x: *const f32,
    w: &[__m512; 9],
    b: __m512,
    out: *mut f32,
) {
    let h = if H > 0 { H } else { g.h };
    let wd = if W > 0 { W } else { g.w };
    // SAFETY: the caller's promises; `taps` and `store` stay inside the planes.
    unsafe {
        if h == 1 {
            let t = taps::<V>(g, x, wd, 0, true);
            store::<V, A>(g, out, wd, 0, add_row(g, [b; V], &t, &w[3..6]));
            return;
        }
        // The sums of output rows iy − 1 and iy before input row iy.
        let t = taps::<V>(g, x, wd, 0, false);
        let mut up = add_row(g, [b; V], &t, &w[3..6]);
        let mut mid = add_row(g, [b; V], &t, &w[0..3]);
        for iy in 1..h - 1 {
            let t = taps::<V>(g, x, wd, iy, false);
            store::<V, A>(g, out, wd, iy - 1, add_row(g, up, &t, &w[6..9]));
            up = add_row(g, mid, &t, &w[3..6]);
            mid = add_row(g, [b; V], &t, &w[0..3]);
        }
        let t = taps::<V>(g, x, wd, h - 1, true);
        store::<V, A>(g, out, wd, h - 2, add_row(g, up, &t, &w[6..9]));
        store::<V, A>(g, out, wd, h - 1, add_row(g, mid, &t, &w[3..6]));
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::tests::PageEnd;
    use super::super::nhwc3::avx::{NONE, RELU, RELU6};
    use super::*;
    use tilekit_kernels::Layout;

    /// Channels and images × channels of the model test's layers.
    const CHANNELS: usize = 3;
    const PLANES: usize = 6;
    /// Where an output goes before the kernel writes it, and past the output.
    const SENTINEL: f32 = 1234.5;

    /// The widths the kernel takes, and only those: MobileNetV2's 14² and 28², not its 7²
    /// (the flat planes') or rows of 17 to 23 (too few of their two vectors' lanes in use);
    /// not another geometry.
    #[test]
    fn geometry() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 14, 1, Layout::Nchw);
        let takes: Vec<usize> = (1..=64).filter(|&w| Roll512::new(&d.height(5).width(w)).is_some()).collect();
        assert_eq!(takes, (9..=16).chain(24..=32).collect::<Vec<_>>());
        let g = Roll512::new(&d).expect("14²");
        // Columns 1..14 have a left neighbour, 0..13 a right one.
        assert_eq!(g.masks[0], [0x3ffe, 0x3fff, 0x1fff]);
        let g = Roll512::new(&d.height(28).width(28)).expect("28²");
        assert_eq!(g.masks, [[0xfffe, 0xffff, 0xffff], [0x0fff, 0x0fff, 0x07ff]]);
        assert!(Roll512::new(&d.height(7).width(7)).is_none());
        assert!(Roll512::new(&d.stride_h(2).stride_w(2)).is_none());
        assert!(Roll512::new(&d.pad_left(0)).is_none());
        assert!(Roll512::new(&d.dilation_h(2)).is_none());
        assert!(Roll512::new(&d.height(0)).is_none());
        assert!(Roll512::new(&Conv2dDesc::mobilenet_v2_block(1, 1, 14, 1, Layout::Nhwc)).is_none());
    }

    /// The sums are the bias, then the taps in kernel order with those outside the input
    /// skipped, one rounding each, bit for bit, on inputs whose sums round: a scalar model
    /// (`mul_add`) against every width the kernel takes with heights of one row to 33
    /// (each edge row alone, both, and the rows between), MobileNetV2's 14² and 28² (their
    /// sizes compiled in), two images of three channels (each plane's channel counted along),
    /// weights as stored and packed, no activation, ReLU and ReLU6. The input ends where a
    /// page without access begins, so a read past it faults; nothing is written past the output.
    #[test]
    fn sums_are_the_kernel_order() {
        use super::super::super::simd::Isa;
        if Isa::detect() != Isa::Avx512 {
            println!("SKIP sums_are_the_kernel_order: this CPU has no AVX-512F");
            return;
        }
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 14, 1, Layout::Nchw);
        let mut shapes = vec![(14, 14), (28, 28)];
        for w in (1..=MAX_TEST_WIDTH).filter(|&w| takes_width(w)) {
            shapes.extend([1, 2, 3, 4, 1 + w % 7, 33].into_iter().map(|h| (h, w)));
        }
        let weights: Vec<f32> = (0..CHANNELS * 9).map(|i| ((i * 37) % 29) as f32 * 0.0771 - 1.03).collect();
        let packed: Vec<f32> = (0..CHANNELS * 9).map(|i| weights[(i % CHANNELS) * 9 + i / CHANNELS]).collect();
        let bias: Vec<f32> = (0..CHANNELS).map(|c| c as f32 * 0.3137 - 0.29).collect();
        for (i, (h, w)) in shapes.into_iter().enumerate() {
            let g = Roll512::new(&d.height(h).width(w)).expect("rolling rows");
            let hw = h * w;
            let input: Vec<f32> = (0..PLANES * hw).map(|i| ((i * 7919) % 113) as f32 * 0.0517 - 2.9).collect();
            let guarded = PageEnd::new(&input);
            let x = guarded.get();
            let act = [NONE, RELU, RELU6][i % 3];
            let mut want = vec![0.0f32; PLANES * hw];
            for (p, o) in want.chunks_exact_mut(hw).enumerate() {
                let (wk, b) = (&weights[(p % CHANNELS) * 9..][..9], bias[p % CHANNELS]);
                for (q, o) in o.iter_mut().enumerate() {
                    let (y, c) = (q / w, q % w);
                    let mut s = b;
                    for (t, k) in wk.iter().enumerate() {
                        let (iy, ix) = ((y + t / 3).wrapping_sub(1), (c + t % 3).wrapping_sub(1));
                        if iy < h && ix < w {
                            s = k.mul_add(x[p * hw + iy * w + ix], s);
                        }
                    }
                    *o = match act {
                        RELU => {
                            if s > 0.0 {
                                s
                            } else {
                                0.0
                            }
                        }
                        RELU6 => s.clamp(0.0, 6.0),
                        _ => s,
                    };
                }
            }
            for (wt, pk) in [(&weights, false), (&packed, true)] {
                let r = Run { x, first: 0, channels: CHANNELS, w: wt, packed: pk, bias: Some(&bias) };
                let mut out = vec![SENTINEL; PLANES * hw + 16];
                let o = &mut out[..PLANES * hw];
                // SAFETY: the CPU has AVX-512F (above).
                unsafe {
                    match act {
                        RELU => planes::<RELU>(&g, &r, o, |_| {}),
                        RELU6 => planes::<RELU6>(&g, &r, o, |_| {}),
                        _ => planes::<NONE>(&g, &r, o, |_| {}),
                    }
                }
                let what = format!("{h} x {w}, activation {act}, packed {pk}");
                assert!(out[PLANES * hw..].iter().all(|&v| v == SENTINEL), "{what}: wrote past the output");
                for (i, (o, e)) in out.iter().zip(&want).enumerate() {
                    assert!(o.to_bits() == e.to_bits(), "{what}: output {i} is {o}, the model's {e}");
                }
            }
        }
    }

    /// Widths the model test tries (every one the kernel takes lies below).
    const MAX_TEST_WIDTH: usize = 40;
}
