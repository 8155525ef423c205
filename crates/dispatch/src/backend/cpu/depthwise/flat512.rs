//! NCHW 3 × 3 layers with stride and dilation 1, padding 1 on every side and rows of at most
//! 15 pixels, or of 17 to 31 (MobileNetV2's 7², 14² and 28² planes) on AVX-512: each plane as
//! one flat run of pixels, 16 outputs a vector whatever the row width.
//!
//! With the padding 1 all round the output plane is the input's size, and output pixel `p`
//! (flat, `y·w + x`) reads input pixel `p + (ky − 1)·w + (kx − 1)` through tap `(ky, kx)`. A
//! vector of outputs `16·j …` takes each tap's inputs from two of the plane's 16-pixel blocks by
//! one two-source permute (`vpermt2ps`, the indices set once per layer from the row width; on
//! MobileNetV2's planes one `valignd` by a constant shift instead, [`tap_input`]): blocks
//! `j − 1` and `j` for the taps above and the one to the left, `j` and `j + 1` for the others,
//! where rows are at most 15 pixels ([`NEAR_FIRST`]); from 17, `j − 2` and `j − 1` for the
//! taps above and `j + 1` and `j + 2` for those below ([`FAR_FIRST`]). The plane's blocks
//! are loaded once per group of vectors, never per tap. The padding is zeros, as in the tile
//! and band kernels: the blocks are zero past the plane's ends (the rows above and below), and
//! the permutes of the left and right taps zero the lanes whose tap column lies outside the
//! row (one mask per vector for each side); every tap is then one unmasked multiply-add, in
//! kernel order after the bias, so the sums are the tile's and the band's bits.
//!
//! Rows as vectors use 7, 14 or 28 lanes of 16 or 32 on these planes; flat, every lane but the
//! last vector's tail. Vectors go [`V`] at a time, `V` independent sums for each tap's weight.
//! With a plane in L1 a 14² plane took about 140 cycles, the 16-lane rows' 185; the taps' masks
//! per vector and tap (lanes outside skipped, not zero) took 185 too (2-core AVX-512 Xeon).
//!
//! A thread's run of planes is one call ([`planes`]): the taps' permute indices (where the
//! plane size takes them) are loaded once for the run, each plane's channel is counted along
//! (no division per plane), and MobileNetV2's plane sizes (49, 196 and 784 pixels) are
//! compiled with the size known, so the blocks' bounds and the groups fold to constants and
//! the taps' shifts are immediates. One call per plane, with the size read from the geometry,
//! took 1.4× the time at 960 × 7² (11.1–11.7 µs against 7.9–8.0),
//! 1.15× at 576 × 14² and 1.1× at 192 × 28² (bias + ReLU6, 2 threads, separate processes
//! alternated three times, the same sums).

use super::super::activation::avx512::lanes;
use std::arch::x86_64::*;
use tilekit_kernels::{Conv2dDesc, Layout};

/// Lanes per vector (AVX-512).
const L: usize = 16;

/// Vectors per group (independent sums).
const V: usize = 4;

/// The most pixels of a row: 15 (`NEAR_FIRST`), or 17 to 31 (`FAR_FIRST`).
const MAX_WIDTH: usize = 31;

/// The most vectors of a plane (1024 pixels).
const MAX_VECTORS: usize = 64;

/// Rows of up to 15 pixels: the first of the two blocks tap `t` reads, from vector `j`'s block:
/// `j − 1` for the kernel's top row and the left tap of its middle row (offsets −w − 1 … −1),
/// else `j` (offsets 0 … w + 1).
const NEAR_FIRST: [isize; 9] = [-1, -1, -1, -1, 0, 0, 0, 0, 0];

/// Rows of 17 to 31 pixels: `j − 2` for the top row (offsets −w − 1 … −w + 1, −32 … −16),
/// `j + 1` for the bottom row (16 … 32), the middle row as [`NEAR_FIRST`].
const FAR_FIRST: [isize; 9] = [-2, -2, -2, -1, 0, 0, 1, 1, 1];

/// A layer's geometry for the kernel: the plane's sizes, the taps' permute indices and the
/// lanes each tap of each vector has inside the input.
pub(super) struct Flat512 {
    /// Pixels per plane (input and output).
    hw: usize,
    /// Pixels per row.
    w: usize,
    /// Rows of 17 to 31 pixels ([`FAR_FIRST`]), else of up to 15 ([`NEAR_FIRST`]).
    far: bool,
    /// Per tap, the lanes' indices into its two blocks (16 · 2 elements).
    idx: [[i32; L]; 9],
    /// Per vector, the lanes whose left and whose right neighbour lie in the row (`x ≥ 1`,
    /// `x + 1 < w`).
    cols: [[u16; 2]; MAX_VECTORS],
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
        let geometry = (d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w);
        let pads = [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right];
        let (h, w) = (d.height, d.width);
        if d.layout != Layout::Nchw
            || geometry != (3, 3, 1, 1, 1, 1)
            || pads != [1; 4]
            || d.multiplier != 1
            || !(1..=MAX_WIDTH).contains(&w)
            || w == 16
            || h == 0
            || h * w > if w < 16 { 256 } else { L * MAX_VECTORS }
        {
            return None;
        }
        let (hw, far) = (h * w, w > 16);
        let mut idx = [[0i32; L]; 9];
        for (t, lanes) in idx.iter_mut().enumerate() {
            let o = (t / 3) as isize * w as isize + (t % 3) as isize - w as isize - 1;
            let first = if far { FAR_FIRST[t] } else { NEAR_FIRST[t] } * L as isize;
            for (l, i) in lanes.iter_mut().enumerate() {
                // Within the two blocks: 0 ≤ o − first + l < 32 for every width but 16.
                *i = (o - first + l as isize) as i32;
            }
        }
        // Every lane of the plane, then the rows' ends taken out: built vector by vector and
        // row by row, with no division per pixel (this runs once per call).
        let mut cols = [[0u16; 2]; MAX_VECTORS];
        for (j, c) in cols.iter_mut().enumerate().take(hw.div_ceil(L)) {
            *c = [lanes(j * L, hw); 2];
        }
        for y in 0..h {
            // The row's first pixel has no left neighbour, its last no right one.
            let (first, last) = (y * w, y * w + w - 1);
            cols[first / L][0] &= !(1 << (first % L));
            cols[last / L][1] &= !(1 << (last % L));
        }
        Some(Flat512 { hw, w, far, idx, cols })
    }

    /// Pixels per plane.
    pub(super) fn pixels(&self) -> usize {
        self.hw
    }
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

/// Output planes `r.first ..` (`out`, whole planes): each from its input plane, its channel's
/// nine weights and bias, with the activation `A` (`nhwc3::avx`'s `NONE`, `RELU` or `RELU6`)
/// applied in registers, and `each` called on every plane's output after it is stored (in
/// L1). The taps' permute indices, where the plane size takes them, are loaded once for the
/// run, not per plane.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn planes<const A: u8>(g: &Flat512, r: &Run, out: &mut [f32], each: impl Fn(&mut [f32])) {
    let hw = g.hw;
    let n = out.len() / hw;
    let (c, taps) = (r.channels, 9);
    assert!(
        r.x.len() >= n * hw && r.w.len() >= c * taps && r.bias.is_none_or(|b| b.len() >= c) && c > 0,
        "NCHW 3 x 3 planes past their operands"
    );
    // SAFETY: the caller's promise of AVX-512F; the operands are checked above.
    unsafe {
        // MobileNetV2's planes with their sizes known to the compiler: the blocks' bounds and
        // the groups fold to constants, and the shifts are `valignd`s by constants. The width
        // too: 49 pixels are also a 49 × 1 plane, 196 a 28 × 7 one, whose shifts differ.
        match (g.far, hw, g.w) {
            (false, 49, 7) => run::<false, A, 49>(g, r, out, each),
            (false, 196, 14) => run::<false, A, 196>(g, r, out, each),
            (true, 784, 28) => run::<true, A, 784>(g, r, out, each),
            (true, ..) => run::<true, A, 0>(g, r, out, each),
            (false, ..) => run::<false, A, 0>(g, r, out, each),
        }
    }
}

/// [`planes`] for one plane size (`HW`, a square plane's; 0 for the layer's, any shape): the
/// taps' permute indices are loaded once for the run where the size is not known (with it,
/// the shifts need none, and nine index registers held over the run made the compiler spill
/// the weights).
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
        let (hw, c, taps) = (g.hw, r.channels, 9);
        let mut idx = [_mm512_setzero_si512(); 9];
        if HW == 0 {
            for (v, i) in idx.iter_mut().zip(&g.idx) {
                *v = _mm512_loadu_si512(i.as_ptr().cast());
            }
        }
        // The channel counted along the planes, not divided out of each plane's index.
        let mut ch = r.first % c;
        for (i, o) in out.chunks_exact_mut(hw).enumerate() {
            let w: [__m512; 9] = if r.packed {
                std::array::from_fn(|t| _mm512_set1_ps(r.w[t * c + ch]))
            } else {
                let wk = &r.w[ch * taps..][..taps];
                std::array::from_fn(|t| _mm512_set1_ps(wk[t]))
            };
            let b = _mm512_set1_ps(r.bias.map_or(0.0, |b| b[ch]));
            ch = if ch + 1 == c { 0 } else { ch + 1 };
            let x = &r.x[i * hw..][..hw];
            groups::<FAR, A, HW>(g, x.as_ptr(), &w, &idx, b, o.as_mut_ptr());
            each(o);
        }
    }
}

/// The plane's pixels: `HW` where that is not 0 (a size the compiler knows), else the layer's.
#[inline(always)]
fn pixels<const HW: usize>(g: &Flat512) -> usize {
    if HW > 0 { HW } else { g.hw }
}

/// The plane's vectors in groups of [`V`], then the rest.
///
/// # Safety
/// As [`group`]'s.
#[inline(always)]
unsafe fn groups<const FAR: bool, const A: u8, const HW: usize>(
    g: &Flat512,
    x: *const f32,
    w: &[__m512; 9],
    idx: &[__m512i; 9],
    b: __m512,
    out: *mut f32,
) {
    let mut j = 0;
    // SAFETY: passed on from the caller; every group lies inside the plane's vectors.
    unsafe {
        let vectors = pixels::<HW>(g).div_ceil(L);
        while j + V <= vectors {
            group::<V, FAR, A, HW>(g, x, w, idx, b, j, out);
            j += V;
        }
        match vectors - j {
            3 => group::<3, FAR, A, HW>(g, x, w, idx, b, j, out),
            2 => group::<2, FAR, A, HW>(g, x, w, idx, b, j, out),
            1 => group::<1, FAR, A, HW>(g, x, w, idx, b, j, out),
            _ => {}
        }
    }
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

/// Output vectors `j..j + N` of a plane: blocks `j − 2 … j + N + 1` loaded once (those the
/// taps read: `j − 1 … j + N` for rows of up to 15 pixels), each tap's input
/// vectors permuted out of them (the lanes whose tap column is outside the row zeroed), the
/// `N` sums multiplied and added tap by tap.
///
/// # Safety
/// The CPU has AVX-512F; `x` and `out` are planes of `g.hw` pixels; `j + N ≤ vectors`.
#[inline(always)]
unsafe fn group<const N: usize, const FAR: bool, const A: u8, const HW: usize>(
    g: &Flat512,
    x: *const f32,
    w: &[__m512; 9],
    idx: &[__m512i; 9],
    b: __m512,
    j: usize,
    out: *mut f32,
) {
    use super::nhwc3::avx::finish512;
    // SAFETY: the blocks read only the plane (`block`); the stores are masked to its pixels.
    unsafe {
        // Blocks j − 2 … j + N + 1 (an array indexed by constants stays in registers; the
        // loads no tap reads are dropped).
        let mut blk = [_mm512_setzero_ps(); V + 4];
        for (k, v) in blk.iter_mut().enumerate().take(N + 4) {
            *v = block::<HW>(g, x, j as isize + k as isize - 2);
        }
        let mut s = [b; N];
        // The taps written out one by one: with the shifts as inline assembly, LLVM kept
        // a loop over them.
        macro_rules! tap {
            ($t:literal) => {
                for (v, s) in s.iter_mut().enumerate() {
                    // The left taps (kx = 0) zero the lanes at x = 0, the right ones those at
                    // x = w − 1; the blocks are zero above and below the plane.
                    let m = match $t % 3 {
                        0 => g.cols[j + v][0],
                        2 => g.cols[j + v][1],
                        _ => u16::MAX,
                    };
                    // The tap's first block, `j − 2 + k` for vector `j + v`.
                    let k = (v as isize + if FAR { FAR_FIRST[$t] } else { NEAR_FIRST[$t] } + 2) as usize;
                    let input = if $t == 4 { blk[k] } else { tap_input::<HW>($t, m, blk[k], blk[k + 1], idx[$t]) };
                    *s = _mm512_fmadd_ps(w[$t], input, *s);
                }
            };
        }
        tap!(0);
        tap!(1);
        tap!(2);
        tap!(3);
        tap!(4);
        tap!(5);
        tap!(6);
        tap!(7);
        tap!(8);
        for (v, s) in s.iter().enumerate() {
            let first = (j + v) * L;
            _mm512_mask_storeu_ps(out.add(first), lanes(first, pixels::<HW>(g)), finish512::<A>(*s));
        }
    }
}

/// MobileNetV2's plane sizes (7², 14², 28², square planes only) and, for each, every tap's
/// shift into its two blocks: the index of lane 0 (as [`Flat512`]'s permute indices, lane `l`
/// at `shift + l`), `(t / 3 − 1)·w + t % 3 − 1 − 16·first` with `first` from [`NEAR_FIRST`]
/// or [`FAR_FIRST`]. The centre tap (4) is its block itself.
const SHIFTS: [(usize, [i32; 9]); 3] = [
    (49, [8, 9, 10, 15, 0, 1, 6, 7, 8]),
    (196, [1, 2, 3, 15, 0, 1, 13, 14, 15]),
    (784, [3, 4, 5, 15, 0, 1, 11, 12, 13]),
];

/// Tap `t`'s inputs out of its two blocks `lo` and `hi`, the lanes outside `m` zero: on the
/// plane sizes of [`SHIFTS`] (`HW`) one `valignd` by the tap's shift, else the permute by
/// `idx`.
///
/// On Zen 4 `vpermt2ps` and the multiply-adds contend for the same units (8 of each in about
/// 14.6 cycles, where 8 multiply-adds take 8), and a `valignd` less (8 with 8 multiply-adds in
/// 10.7). One thread, ReLU6, against the permutes (separate processes alternated three
/// times, the same sums): 960 × 7² in 0.76–0.87 of the time, 576 × 14² 0.92–0.98, 384 × 14²
/// 0.85–0.98, 192 × 28² 0.83–0.87.
///
/// The shifts are inline assembly: LLVM turns `_mm512_maskz_alignr_epi32` into `vpermt2ps`.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tap_input<const HW: usize>(t: usize, m: __mmask16, lo: __m512, hi: __m512, idx: __m512i) -> __m512 {
    macro_rules! align {
        ($s:literal, $t:literal) => {{
            let r: __m512;
            // SAFETY: the caller's promise of AVX-512F; registers only.
            unsafe {
                std::arch::asm!(
                    "valignd {r}{{{m}}}{{z}}, {hi}, {lo}, {imm}",
                    r = lateout(zmm_reg) r,
                    m = in(kreg) m,
                    hi = in(zmm_reg) hi,
                    lo = in(zmm_reg) lo,
                    imm = const SHIFTS[$s].1[$t],
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            r
        }};
    }
    macro_rules! taps {
        ($s:literal) => {
            match t {
                0 => align!($s, 0),
                1 => align!($s, 1),
                2 => align!($s, 2),
                3 => align!($s, 3),
                5 => align!($s, 5),
                6 => align!($s, 6),
                7 => align!($s, 7),
                _ => align!($s, 8),
            }
        };
    }
    if HW == SHIFTS[0].0 {
        taps!(0)
    } else if HW == SHIFTS[1].0 {
        taps!(1)
    } else if HW == SHIFTS[2].0 {
        taps!(2)
    } else {
        _mm512_maskz_permutex2var_ps(m, lo, idx, hi)
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
        // Tap (0, 0) of pixel p reads p − 8: lane l of block j − 1 is index l, so l + 8.
        assert_eq!(g.idx[0][0], 8);
        // The centre tap is the block itself; tap (2, 2) reads p + 8, lane l of block j + 1.
        assert_eq!((g.idx[4][3], g.idx[8][0]), (3, 8));
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
        // 28²: rows of 17 to 31 read the blocks two away for the taps above and below; tap
        // (0, 0) of pixel p reads p − 29, lane l of block j − 2 is index l + 3.
        let g = Flat512::new(&d.height(28).width(28)).expect("flat");
        assert_eq!((g.far, g.hw.div_ceil(L), g.idx[0][0], g.idx[8][0]), (true, 49, 3, 13));
        assert!(Flat512::new(&d.height(33).width(31)).is_some());
        assert!(Flat512::new(&d.height(34).width(31)).is_none());
        assert!(Flat512::new(&d.height(3).width(32)).is_none());
    }

    /// The `valignd` shifts of MobileNetV2's planes are the permute indices the geometry
    /// builds for them, plane by plane and tap by tap.
    #[test]
    fn shifts_are_the_permute_indices() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        for (hw, shifts) in SHIFTS {
            let w = (1..=MAX_WIDTH).find(|w| w * w == hw).expect("a square plane");
            let g = Flat512::new(&d.height(w).width(w)).expect("flat");
            for (t, lanes) in g.idx.iter().enumerate() {
                let expected: Vec<i32> = (0..L as i32).map(|l| shifts[t] + l).collect();
                assert_eq!(lanes[..], expected[..], "{w}², tap {t}");
            }
        }
    }

    /// The lanes with neighbours left and right, built row by row, are those of the
    /// definition pixel by pixel, on every width the kernel takes and heights from one row to
    /// the most pixels.
    #[test]
    fn columns_match_the_pixels() {
        let d = Conv2dDesc::mobilenet_v2_block(1, 1, 7, 1, Layout::Nchw);
        for w in (1..=MAX_WIDTH).filter(|&w| w != 16) {
            let most = if w < 16 { 256 } else { L * MAX_VECTORS } / w;
            for h in [1, 2, 3, w, most / 2, most].into_iter().filter(|&h| (1..=most).contains(&h)) {
                let g = Flat512::new(&d.height(h).width(w)).expect("flat");
                let mut cols = [[0u16; 2]; MAX_VECTORS];
                for p in 0..h * w {
                    let x = p % w;
                    if x >= 1 {
                        cols[p / L][0] |= 1 << (p % L);
                    }
                    if x + 1 < w {
                        cols[p / L][1] |= 1 << (p % L);
                    }
                }
                assert_eq!(g.cols, cols, "{h} x {w}");
            }
        }
    }
}
