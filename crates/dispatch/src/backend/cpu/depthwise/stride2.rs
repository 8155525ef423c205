//! NCHW 3 × 3 layers at stride 2 both ways with padding 1 at the top and left (0 or 1 at the
//! bottom and right; dilation 1, multiplier 1) on AVX-512: each output row 16 outputs a vector,
//! by column sums over the input's even and odd columns.
//!
//! Output `(oy, ox)` reads input rows `2·oy − 1 … 2·oy + 1` at columns `2·ox − 1 + kx`: kernel
//! column 1 reads an even column, columns 0 and 2 odd ones. A vector of 16 outputs reads the
//! 32 input columns from `32·v` of each of its three rows: two loads, split into the even and
//! the odd columns by two `vshufps` (each 128-bit lane on its own: output column `SPLIT[i]`
//! lands in lane `i`; in a micro-benchmark on Zen 4 in-lane shuffles ran beside the
//! multiply-adds at no cost, where `vpermt2ps` took 0.8 cycles each). Then, as the flat
//! planes' column sums ([`super::flat512`]):
//! - `z_1 = ((b + w1·e_up) + w4·e_mid) + w7·e_dn` over the even columns;
//! - `z_0 = (w0·o_up + w3·o_mid) + w6·o_dn` and `z_2` the same with `w2`, `w5`, `w8`, over
//!   the odd columns (each step one multiply-add, one rounding);
//! - `out = (z_1 + z_0[ox − 1]) + z_2`: `z_0` is one column to the left, moved there by one
//!   `vpermt2ps` with the vector before's (zero before the row's first), in the split order;
//! - then one `vpermps` back to the columns' order, the activation, and the store.
//!
//! Columns and rows outside the input read as zero: the rows above the first and below the
//! last are zero vectors, and the row's last vector loads masked to the row (every other
//! vector's 32 columns lie inside it). So a column past the row's end adds `w·0` terms (the
//! model test's `right`), and the first output's left neighbour adds `+0`.
//!
//! Output rows go two at a time ([`R`]): their five input rows are each split once, and each
//! vector has two independent sums. One at a time took 1.04–1.15× the time on one thread;
//! three at a time 1.1× at 112² (the registers run out).
//!
//! The 16-lane rows ([`super::rows512`]) took these layers before, in kernel order, each
//! vector's three even/odd splits made by `vpermt2ps` and a chain of nine multiply-adds.
//! Against them (bias + ReLU6, separate processes alternated three times, 2-core Zen 4): one
//! thread, MobileNetV2's 96 × 112² stride 2 in 0.64 of the time, 144 × 56² stride 2 0.71,
//! 192 × 28² stride 2 0.75; two threads 0.67, 0.71 and 0.78. Below 8 outputs a row the
//! channel blocks stay faster (256 × 8² and 256 × 10² at stride 2 took 1.6–1.9× their time
//! here; 576 × 14² about level).

use super::super::activation::avx512::lanes;
use super::flat512::Run;
use std::arch::x86_64::*;
use tilekit_kernels::{Conv2dDesc, Layout};

/// Lanes per vector (AVX-512).
const L: usize = 16;

/// The output column (of a vector's 16) in each lane after the `vshufps` split of 32 input
/// columns: lane `4k + i` holds the `i`th of the first half's 128-bit lane `k`, lane `4k + 2 + i`
/// the `i`th of the second half's.
const SPLIT: [usize; L] = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15];

/// The fewest outputs per row: below it, the channel blocks (16 planes in the lanes) take the
/// layer.
const MIN_WIDTH: usize = 8;

/// A layer's geometry for the kernel.
pub(super) struct Stride2 {
    /// Input rows and columns.
    h: usize,
    w: usize,
    /// Output rows and columns.
    oh: usize,
    ow: usize,
    /// Vectors per output row, and how many of them read 32 columns inside the input row.
    vectors: usize,
    full: usize,
    /// The last vector's lanes of its two 16-column loads inside the input row (where it is
    /// not `full`).
    last: [u16; 2],
}

impl Stride2 {
    /// The geometry, or `None` where the layer is not NCHW 3 × 3 at stride 2 and dilation 1,
    /// padding 1 at the top and left and at most 1 at the bottom and right, multiplier 1, with
    /// at least [`MIN_WIDTH`] outputs a row.
    pub(super) fn new(d: &Conv2dDesc) -> Option<Stride2> {
        let geometry = (d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w);
        if d.layout != Layout::Nchw
            || geometry != (3, 3, 2, 2, 1, 1)
            || (d.pad_top, d.pad_left) != (1, 1)
            || d.pad_bottom > 1
            || d.pad_right > 1
            || d.multiplier != 1
        {
            return None;
        }
        let (oh, ow) = (d.out_h()?, d.out_w()?);
        let (h, w) = (d.height, d.width);
        let (vectors, full) = (ow.div_ceil(L), w / (2 * L));
        if ow < MIN_WIDTH || oh == 0 || h == 0 || full + 1 < vectors {
            return None;
        }
        let half = |from: usize| if from >= w { 0 } else { lanes(from, w) };
        let last = if full < vectors { [half(2 * L * full), half(2 * L * full + L)] } else { [0; 2] };
        Some(Stride2 { h, w, oh, ow, vectors, full: full.min(vectors), last })
    }

    /// Pixels per input plane and per output plane.
    pub(super) fn pixels(&self) -> (usize, usize) {
        (self.h * self.w, self.oh * self.ow)
    }
}

/// Output planes `r.first ..` (`out`, whole planes) from their input planes, as
/// [`super::flat512::planes`]: each channel's nine weights and bias, the activation `A`
/// (`nhwc3::avx`'s `NONE`, `RELU` or `RELU6`) applied in registers, and `each` called on every
/// plane's output after it is stored.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn planes<const A: u8>(g: &Stride2, r: &Run, out: &mut [f32], each: impl Fn(&mut [f32])) {
    let (hw, ohw) = g.pixels();
    let n = out.len() / ohw;
    r.check(n, hw, "NCHW 3 x 3 stride-2 planes");
    let c = r.channels;
    // SAFETY: the caller's promise of AVX-512F; the operands are checked above; the index
    // vectors are 16 `i32`s each.
    unsafe {
        let mut shift = [0i32; L];
        let mut unsplit = [0i32; L];
        let lane_of = |col: usize| SPLIT.iter().position(|&c| c == col).expect("a column") as i32;
        for (i, &col) in SPLIT.iter().enumerate() {
            // Lane i (column `col`) takes `z_0` of column `col − 1`: the vector before's last
            // for column 0.
            shift[i] = if col == 0 { L as i32 + lane_of(L - 1) } else { lane_of(col - 1) };
            unsplit[col] = i as i32;
        }
        let idx = [_mm512_loadu_si512(shift.as_ptr().cast()), _mm512_loadu_si512(unsplit.as_ptr().cast())];
        let mut ch = r.first % c;
        for (i, o) in out.chunks_exact_mut(ohw).enumerate() {
            let (w, b) = r.channel(ch);
            ch = if ch + 1 == c { 0 } else { ch + 1 };
            plane::<A>(g, r.x[i * hw..][..hw].as_ptr(), &w, b, &idx, o.as_mut_ptr());
            each(o);
        }
    }
}

/// One output plane, [`R`] rows at a time (then one at a time): the first group (its
/// first input row is padding above), the groups whose input rows all lie inside, and the
/// last (whose last input row may be padding below), each compiled for its rows, so no mask
/// is made in the loop.
///
/// # Safety
/// The CPU has AVX-512F; `x` is an input plane and `out` an output plane of `g`.
#[inline(always)]
unsafe fn plane<const A: u8>(
    g: &Stride2,
    x: *const f32,
    w: &[__m512; 9],
    b: __m512,
    idx: &[__m512i; 2],
    out: *mut f32,
) {
    // SAFETY: the rows passed on lie inside the plane (`2·oy − 1 ≥ 0` from group row 1, the
    // last `2·(oy + n − 1) + 1 < h` where it is live, the others always: `2·oy ≤ 2·oh − 2 < h`
    // for the output's padding at most 1); the output rows inside `out`.
    unsafe {
        let mut oy = 0;
        while oy < g.oh {
            let n = if g.oh - oy >= R { R } else { 1 };
            let top = 2 * oy;
            // Input rows 2·oy − 1 … 2·(oy + n − 1) + 1; a dead row's pointer (row −1's: `x`) is
            // never read.
            let rows: [*const f32; 2 * R + 1] =
                std::array::from_fn(|k| if top + k >= 1 { x.wrapping_add((top + k - 1) * g.w) } else { x });
            let o: [*mut f32; R] = std::array::from_fn(|r| out.wrapping_add((oy + r) * g.ow));
            let below = top + 2 * n - 1 < g.h;
            match (n, oy > 0, below) {
                (R, true, true) => group::<R, true, true, A>(g, &rows, w, b, idx, &o),
                (R, false, true) => group::<R, false, true, A>(g, &rows, w, b, idx, &o),
                (R, true, false) => group::<R, true, false, A>(g, &rows, w, b, idx, &o),
                (R, false, false) => group::<R, false, false, A>(g, &rows, w, b, idx, &o),
                (_, true, true) => group::<1, true, true, A>(g, &rows, w, b, idx, &o),
                (_, false, true) => group::<1, false, true, A>(g, &rows, w, b, idx, &o),
                (_, true, false) => group::<1, true, false, A>(g, &rows, w, b, idx, &o),
                (_, false, false) => group::<1, false, false, A>(g, &rows, w, b, idx, &o),
            }
            oy += n;
        }
    }
}

/// Output rows per group: the group's `2·R + 1` input rows each split once, and `R`
/// independent sums a vector.
const R: usize = 2;

/// `N` output rows from their `2·N + 1` input rows, the first read where `TOP`, the last where
/// `BOTTOM` (else zero): the vectors whose 32 columns lie inside the input row with whole
/// loads, the last one masked to the row where its columns do not.
///
/// # Safety
/// The CPU has AVX-512F; the live rows are input rows of `g`'s plane, `out`'s first `N`
/// output rows.
#[inline(always)]
unsafe fn group<const N: usize, const TOP: bool, const BOTTOM: bool, const A: u8>(
    g: &Stride2,
    rows: &[*const f32; 2 * R + 1],
    w: &[__m512; 9],
    b: __m512,
    idx: &[__m512i; 2],
    out: &[*mut f32; R],
) {
    // SAFETY: passed on.
    unsafe {
        let mut before = [_mm512_setzero_ps(); N];
        for v in 0..g.full {
            let store = lanes(v * L, g.ow);
            vectors::<N, TOP, BOTTOM, false, A>(rows, v, [!0; 2], w, b, idx, &mut before, out, store);
        }
        if g.full < g.vectors {
            let v = g.full;
            vectors::<N, TOP, BOTTOM, true, A>(rows, v, g.last, w, b, idx, &mut before, out, lanes(v * L, g.ow));
        }
    }
}

/// An input row's 32 columns from `32·v`, split into the even and the odd ones (in
/// [`SPLIT`]'s order): zero where the row is not `live`, the two loads masked by `m` where
/// `MASKED`.
///
/// # Safety
/// The CPU has AVX-512F; a live row's columns `32·v …` inside `m` lie in the plane.
#[inline(always)]
unsafe fn split<const MASKED: bool>(live: bool, row: *const f32, v: usize, m: [u16; 2]) -> (__m512, __m512) {
    // SAFETY: the caller's promises; the pointers formed by wrapping arithmetic.
    unsafe {
        if !live {
            return (_mm512_setzero_ps(), _mm512_setzero_ps());
        }
        let p = row.wrapping_add(2 * L * v);
        let (lo, hi) = if MASKED {
            (_mm512_maskz_loadu_ps(m[0], p), _mm512_maskz_loadu_ps(m[1], p.wrapping_add(L)))
        } else {
            (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(L)))
        };
        (_mm512_shuffle_ps::<0x88>(lo, hi), _mm512_shuffle_ps::<0xdd>(lo, hi))
    }
}

/// Vector `v` of `N` output rows from their input rows (as [`group`]'s), `before` each row's
/// vector before's `z_0` in and this one's out, stored masked by `store`.
///
/// # Safety
/// The CPU has AVX-512F; as [`split`]'s for each live row; `store` masks the output rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn vectors<const N: usize, const TOP: bool, const BOTTOM: bool, const MASKED: bool, const A: u8>(
    rows: &[*const f32; 2 * R + 1],
    v: usize,
    m: [u16; 2],
    w: &[__m512; 9],
    b: __m512,
    idx: &[__m512i; 2],
    before: &mut [__m512; N],
    out: &[*mut f32; R],
    store: u16,
) {
    use super::nhwc3::avx::finish512;
    // SAFETY: the caller's promises.
    unsafe {
        let eo: [(__m512, __m512); 2 * R + 1] = std::array::from_fn(|k| {
            let live = k <= 2 * N && (k > 0 || TOP) && (k < 2 * N || BOTTOM);
            split::<MASKED>(live, rows[k], v, m)
        });
        for r in 0..N {
            let ((e0, o0), (e1, o1), (e2, o2)) = (eo[2 * r], eo[2 * r + 1], eo[2 * r + 2]);
            let z0 = _mm512_fmadd_ps(w[6], o2, _mm512_fmadd_ps(w[3], o1, _mm512_mul_ps(w[0], o0)));
            let z1 = _mm512_fmadd_ps(w[7], e2, _mm512_fmadd_ps(w[4], e1, _mm512_fmadd_ps(w[1], e0, b)));
            let z2 = _mm512_fmadd_ps(w[8], o2, _mm512_fmadd_ps(w[5], o1, _mm512_mul_ps(w[2], o0)));
            let left = _mm512_permutex2var_ps(z0, idx[0], before[r]);
            before[r] = z0;
            let s = _mm512_permutexvar_ps(idx[1], _mm512_add_ps(_mm512_add_ps(z1, left), z2));
            let s = finish512::<A>(s);
            let o = out[r].add(L * v);
            if store == !0 {
                _mm512_storeu_ps(o, s);
            } else {
                _mm512_mask_storeu_ps(o, store, s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layers the kernel takes, and its vectors: those whose 32 columns lie inside the
    /// input row, and the last one's loads' lanes.
    #[test]
    fn geometry() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 112, 2, Layout::Nchw);
        let g = Stride2::new(&d).expect("stride 2");
        // 56 outputs a row: 4 vectors, the last reads columns 96 … 111 and nothing after.
        assert_eq!((g.oh, g.ow, g.vectors, g.full, g.last), (56, 56, 4, 3, [!0, 0]));
        // 28 outputs from 56 columns: columns 32 … 55 in the last vector.
        let g = Stride2::new(&d.height(56).width(56)).expect("stride 2");
        assert_eq!((g.ow, g.vectors, g.full, g.last), (28, 2, 1, [!0, 0xff]));
        // 32 outputs from 64 columns: no masked vector.
        let g = Stride2::new(&d.height(3).width(64)).expect("stride 2");
        assert_eq!((g.oh, g.ow, g.vectors, g.full), (2, 32, 2, 2));
        // No padding at the bottom and right: 15 × 17 gives 7 × 8.
        let g = Stride2::new(&d.height(15).width(17).pad_bottom(0).pad_right(0)).expect("stride 2");
        assert_eq!((g.oh, g.ow, g.vectors, g.full, g.last), (7, 8, 1, 0, [!0, 1]));
        // Rows of fewer than 8 outputs, other paddings, strides and kernels are not its.
        assert!(Stride2::new(&d.height(14).width(14)).is_none());
        assert!(Stride2::new(&d.pad_top(0)).is_none());
        assert!(Stride2::new(&d.pad_left(0)).is_none());
        assert!(Stride2::new(&d.pad_right(2)).is_none());
        assert!(Stride2::new(&d.stride_h(1)).is_none());
        assert!(Stride2::new(&d.dilation_w(2)).is_none());
        assert!(Stride2::new(&d.layout(Layout::Nhwc)).is_none());
    }

    /// The split puts output column `SPLIT[i]` in lane `i`: `vshufps` of 32 columns.
    #[test]
    fn split_order() {
        use super::super::super::simd::Isa;
        if Isa::detect() != Isa::Avx512 {
            println!("SKIP split_order: this CPU has no AVX-512F");
            return;
        }
        let cols: Vec<f32> = (0..2 * L).map(|c| c as f32).collect();
        let (mut e, mut o) = ([0.0f32; L], [0.0f32; L]);
        // SAFETY: the CPU has AVX-512F; 32 columns read, 16 written to each.
        unsafe {
            #[target_feature(enable = "avx512f")]
            unsafe fn go(cols: &[f32], e: &mut [f32; L], o: &mut [f32; L]) {
                // SAFETY: as the caller's.
                unsafe {
                    let (ev, ov) = split::<false>(true, cols.as_ptr(), 0, [!0; 2]);
                    _mm512_storeu_ps(e.as_mut_ptr(), ev);
                    _mm512_storeu_ps(o.as_mut_ptr(), ov);
                }
            }
            go(&cols, &mut e, &mut o);
        }
        for i in 0..L {
            assert_eq!((e[i], o[i]), ((2 * SPLIT[i]) as f32, (2 * SPLIT[i] + 1) as f32), "lane {i}");
        }
    }

    /// The sums are the column sums' order, bit for bit, on inputs whose sums round
    /// (`flat512::model`: each step one `mul_add`, the padding zero, the first column's left
    /// neighbour `+0`, a right one past the row the sum of its padding column): every plane of
    /// heights 1 to 9 and widths from the fewest outputs to several vectors, with and without
    /// padding at the bottom and right, MobileNetV2's 112², 56² and 28²; two images of three
    /// channels, weights as stored and packed, a guard page after the input and a guard band
    /// after the output.
    #[test]
    fn sums_are_the_column_order() {
        use super::super::super::simd::Isa;
        use super::super::flat512::model;
        if Isa::detect() != Isa::Avx512 {
            println!("SKIP sums_are_the_column_order: this CPU has no AVX-512F");
            return;
        }
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 112, 2, Layout::Nchw);
        let mut shapes = vec![(112, 112, 1), (56, 56, 1), (28, 28, 1)];
        for w in [15, 16, 17, 18, 31, 32, 33, 47, 63, 64, 65, 66, 95, 96, 97, 130] {
            for h in [1, 2, 3, 4, 5, 9] {
                shapes.extend([(h, w, 1), (h, w, 0)]);
            }
        }
        for (h, w, pad) in shapes {
            let dd = d.height(h).width(w).pad_bottom(pad).pad_right(pad);
            let Some(g) = Stride2::new(&dd) else {
                // Rows of fewer outputs, or no output row (one input row, no padding below).
                assert!(dd.out_w().is_some_and(|ow| ow < MIN_WIDTH) || dd.out_h().is_none(), "{h} x {w}");
                continue;
            };
            let layer = model::Layer { h, w, oh: g.oh, ow: g.ow, stride: 2, masked_right: false };
            layer.check(&format!("{h} x {w} pad {pad}"), |r, out| {
                // SAFETY: the CPU has AVX-512F (above).
                unsafe { planes::<{ super::super::nhwc3::avx::NONE }>(&g, r, out, |_| {}) }
            });
        }
    }
}
