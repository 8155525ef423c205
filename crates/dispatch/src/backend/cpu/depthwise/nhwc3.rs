//! NHWC 3 × 3 depthwise rows with the weights in registers (AVX2 and FMA; AVX-512 for the
//! fused block's rows): MobileNet's layers.
//! The NCHW channel-vector tile (`super::tile`, 8 planes as the lanes) runs its 3 × 3 rows
//! through the same register tiles ([`avx::dense_rows`]).
//!
//! One 8-channel block at a time, the nine taps' weight vectors are loaded into registers
//! once, and a row's pixels go 4 at a time (8 with 16-lane vectors: [`avx::Vector::TILE`])
//! with their sums in registers. Each input vector is loaded once per kernel row and meets
//! every pixel of the tile that reads it: per kernel row of a 4-pixel tile, 6 loads for 12
//! multiply-adds at stride 1 and 9 at stride 2 (of an 8-pixel tile, 10 and 17 for 24), where
//! the tap-list kernel ([`super::nhwc_pixels`]) loads the weights and the input per tap (10
//! loads per 8). Border pixels skip the taps outside the row (one pixel at a time, the weights
//! still in registers). ReLU and ReLU6 are applied to the sums in registers before they are
//! stored (0.8–0.95 of the time of a second pass over the row, two threads, separate
//! processes alternated); other activations run over the row after it. The pixels are cut
//! into segments of at least 8 tiles, more while their input (three rows, every channel)
//! fits in 16 KiB, and a segment's channel blocks run one after another, so the two blocks
//! that share an input line tend to meet it in L1.
//!
//! The sums are the tap-list kernel's: the bias, then the taps in kernel order (rows outside
//! the input skipped), one fused multiply-add each: the same bits. On a 2-core Zen 3 EPYC
//! (in-process A/B against the tap-list kernels, alternated per round, results bit for bit
//! the same), MobileNetV2's eight layers took 0.58–0.93 of the time on one core and 0.65–0.90
//! on two (32 × 112²: 0.58 and 0.65; 960 × 7²: 0.90 and 0.90). Segments of 16 KiB alone (a
//! tile or two at 144–960 channels, so the weights are reloaded every few pixels) took
//! 0.8–1.05 of the tap-list kernels' time at 144–960 channels, whole rows 1.15 at 96 × 112²
//! stride 2; prefetching the next segment's input changed nothing.
//!
//! The tiles are generic over the vector ([`avx::Vector`]): `__m256`, and `__m512` for the
//! fused inverted-residual block's rows ([`avx::row512`]: its chunks of hidden channels are
//! multiples of 16), the same sums in the same order in 16-channel blocks. MobileNetV2 at 224²
//! profiled per layer, the 16- and 8-channel rows interleaved run by run in one process
//! (2-core AVX-512 Xeon, medians of 61, two runs): the 17 blocks 0.97–1.0 of the time (blocks
//! 2–4 0.91–0.99, the rest within noise of level): the rows are mostly bound by the caches,
//! not the multiply-adds. The standalone NHWC op takes `row512` too where its channel block is
//! whole 16-channel vectors (`depthwise.rs`, `nhwc_row_inner`): MobileNetV2's eight layers
//! (batch 1, bias + ReLU6, the two widths interleaved in one process, medians of 61–201, three
//! runs) 0.86–0.91 of the time at 32 × 112², 0.87–0.98 at 96 × 112² (stride 2), 0.85–0.92 at
//! 960 × 7², the other five within noise of level (0.79–1.27 from run to run), bit for bit the
//! same.

/// Lanes per channel block (one AVX2 vector).
pub(in crate::backend::cpu) const LANES: usize = 8;

/// Where one output row's pixels read their input.
#[derive(Clone, Copy)]
pub(in crate::backend::cpu) struct RowGeometry {
    /// Input channels (elements between input pixels).
    pub(in crate::backend::cpu) c: usize,
    /// Input pixels per row.
    pub(in crate::backend::cpu) width: usize,
    pub(in crate::backend::cpu) pad_left: usize,
    /// The pixels `lo..hi` have every tap inside the input row.
    pub(in crate::backend::cpu) lo: usize,
    pub(in crate::backend::cpu) hi: usize,
    /// Output pixels per row.
    pub(in crate::backend::cpu) ow: usize,
}

pub(in crate::backend::cpu) mod avx {
    use super::{LANES, RowGeometry};
    use std::arch::x86_64::*;

    /// Bytes of input (three rows, every channel) per segment of pixels, unless that is fewer
    /// than [`MIN_TILES`] tiles.
    const SEGMENT_BYTES: usize = 16 << 10;
    /// The fewest tiles per segment.
    const MIN_TILES: usize = 8;

    /// [`row`]'s activation, applied to the sums before they are stored: none.
    pub(in crate::backend::cpu) const NONE: u8 = 0;
    /// ReLU: `x ≤ 0` (not NaN) gives +0, as `relu` in the activation kernel.
    pub(in crate::backend::cpu) const RELU: u8 = 1;
    /// ReLU6: below 0 gives 0 (−0 and NaN kept), then above 6 gives 6, as `relu6` there.
    pub(in crate::backend::cpu) const RELU6: u8 = 2;

    /// A vector of channels the tiles run on: `__m256` (AVX2, 8 lanes) or `__m512` (AVX-512,
    /// 16). Every method is `#[inline(always)]` and compiled inside its caller's
    /// `#[target_feature]` copy.
    pub(in crate::backend::cpu) trait Vector: Copy {
        /// Channels per vector.
        const LANES: usize;
        /// Output pixels per register tile ([`tile`]): its sums, the 9 weights and the input
        /// vector in registers (4 pixels in AVX2's 16, 8 in AVX-512's 32).
        const TILE: usize;
        /// # Safety
        /// The CPU has the vector's instructions; `p` covers [`Self::LANES`] floats.
        unsafe fn load(p: *const f32) -> Self;
        /// # Safety
        /// As [`Self::load`], for writes.
        unsafe fn store(p: *mut f32, v: Self);
        /// # Safety
        /// The CPU has the vector's instructions.
        unsafe fn zero() -> Self;
        /// `a·b + c`, one rounding.
        ///
        /// # Safety
        /// The CPU has the vector's instructions and FMA.
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
        /// The activation `A` on the sums.
        ///
        /// # Safety
        /// The CPU has the vector's instructions.
        unsafe fn finish<const A: u8>(s: Self) -> Self;
        /// Lane `i` = `p[i·stride]` (a gather).
        ///
        /// # Safety
        /// The CPU has the vector's instructions; `p` covers `(LANES − 1)·stride + 1` floats,
        /// and `LANES·stride` fits an `i32`.
        unsafe fn gather(p: *const f32, stride: usize) -> Self;
        /// The nine tap vectors of [`Self::LANES`] channels whose weights are stored
        /// `[channel][tap]` from `p`: tap `t`'s lane `i` is `p[9·i + t]`. Nine gathers here;
        /// `__m512` overrides it.
        ///
        /// # Safety
        /// The CPU has the vector's instructions; `p` covers `9·LANES` floats.
        #[inline(always)]
        unsafe fn stored_taps(p: *const f32) -> [Self; 9] {
            // SAFETY: the caller's promises.
            std::array::from_fn(|t| unsafe { Self::gather(p.add(t), 9) })
        }
    }

    impl Vector for __m256 {
        const LANES: usize = LANES;
        const TILE: usize = 4;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            // SAFETY: the caller's promises.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn finish<const A: u8>(s: Self) -> Self {
            // SAFETY: the caller's promises.
            unsafe { finish::<A>(s) }
        }
        #[inline(always)]
        unsafe fn gather(p: *const f32, stride: usize) -> Self {
            let s = stride as i32;
            // SAFETY: the caller's promises.
            unsafe { _mm256_i32gather_ps::<4>(p, _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s)) }
        }
    }

    impl Vector for __m512 {
        const LANES: usize = 16;
        const TILE: usize = 8;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            // SAFETY: the caller's promises.
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: the caller's promises.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn finish<const A: u8>(s: Self) -> Self {
            // SAFETY: the caller's promises.
            unsafe { finish512::<A>(s) }
        }
        #[inline(always)]
        unsafe fn gather(p: *const f32, stride: usize) -> Self {
            // SAFETY: the caller's promises.
            unsafe {
                let idx = _mm512_mullo_epi32(
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                    _mm512_set1_epi32(stride as i32),
                );
                _mm512_i32gather_ps::<4>(idx, p)
            }
        }
        /// The 144 weights in nine loads, split by twos of [`thirds`]: first each 48 (three
        /// vectors, taps `t ≡ ρ (mod 3)` apart), then the three runs of one `ρ` (the taps
        /// `3τ + ρ`). 36 permutes, where the nine gathers took about 190 cycles a block on a
        /// 2-core Zen 4 (a loop of them alone): MobileNetV2's 960 × 7² NHWC layer took about
        /// 0.85 of the time on one thread (9.5–10.8 µs against 11.2–11.5, separate processes
        /// alternated six times, the same sums).
        #[inline(always)]
        unsafe fn stored_taps(p: *const f32) -> [Self; 9] {
            // SAFETY: the caller's promises: 144 floats from `p`.
            unsafe {
                // Loops, not closures: a closure is compiled without the caller's target
                // features, and its intrinsics become calls.
                let mut v = [_mm512_setzero_ps(); 9];
                for (r, v) in v.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(p.add(16 * r));
                }
                // `s[c][ρ]` lane m: element 48c + 3m + ρ.
                let mut s = [[_mm512_setzero_ps(); 3]; 3];
                for (c, s) in s.iter_mut().enumerate() {
                    *s = thirds(v[3 * c], v[3 * c + 1], v[3 * c + 2]);
                }
                let mut w = [_mm512_setzero_ps(); 9];
                for rho in 0..3 {
                    // Runs of one ρ: lane m' = 16c + m is element 3m' + ρ; their thirds' lane
                    // i, part τ, is element 9i + 3τ + ρ: channel i, tap 3τ + ρ.
                    let o = thirds(s[0][rho], s[1][rho], s[2][rho]);
                    for (tau, o) in o.into_iter().enumerate() {
                        w[3 * tau + rho] = o;
                    }
                }
                w
            }
        }
    }

    /// The 48 elements `e` of `(a, b, c)` split by `e mod 3`: part `ρ`'s lane `m` is element
    /// `3m + ρ`, taken from `a` and `b` by one `vpermt2ps` (index `3m + ρ`, low five bits)
    /// and, in the lanes where that is 32 or more, from `c` by one masked `vpermps` (the same
    /// index, low four bits).
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn thirds(a: __m512, b: __m512, c: __m512) -> [__m512; 3] {
        /// Part ρ's indices `3m + ρ`, and the lanes where they are 32 or more.
        const IDX: [[i32; 16]; 3] = {
            let mut t = [[0; 16]; 3];
            let mut rho = 0;
            while rho < 3 {
                let mut m = 0;
                while m < 16 {
                    t[rho][m] = (3 * m + rho) as i32;
                    m += 1;
                }
                rho += 1;
            }
            t
        };
        const HIGH: [u16; 3] = {
            let mut k = [0u16; 3];
            let mut rho = 0;
            while rho < 3 {
                let mut m = 0;
                while m < 16 {
                    if 3 * m + rho >= 32 {
                        k[rho] |= 1 << m;
                    }
                    m += 1;
                }
                rho += 1;
            }
            k
        };
        // SAFETY: the caller's promise.
        let mut out = [unsafe { _mm512_setzero_ps() }; 3];
        for (rho, o) in out.iter_mut().enumerate() {
            // SAFETY: the caller's promise; `IDX[rho]` is 16 `i32`s.
            unsafe {
                let idx = _mm512_loadu_si512(IDX[rho].as_ptr().cast());
                *o = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, idx, b), HIGH[rho], idx, c);
            }
        }
        out
    }

    /// The activation `A` on eight sums.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    pub(super) unsafe fn finish<const A: u8>(s: __m256) -> __m256 {
        // SAFETY: the caller promises AVX2.
        unsafe {
            let zero = _mm256_setzero_ps();
            match A {
                RELU => _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(s, zero), s),
                // `max(0, s)` and `min(6, y)` return their second operand where the two are
                // unordered or both zeros: a NaN or −0 `s` is kept, below 0 gives +0.
                RELU6 => _mm256_min_ps(_mm256_set1_ps(6.0), _mm256_max_ps(zero, s)),
                _ => s,
            }
        }
    }

    /// [`finish`] on sixteen sums.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn finish512<const A: u8>(s: __m512) -> __m512 {
        // SAFETY: the caller promises AVX-512F.
        unsafe {
            let zero = _mm512_setzero_ps();
            match A {
                // Kept where `s > 0` or unordered: two instructions, where a blend on the
                // mask of `s ≤ 0` took three (the mask inverted first).
                RELU => _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(s, zero), s),
                // As the AVX2 `finish`: `max(0, s)` keeps a NaN or −0 `s`.
                RELU6 => _mm512_min_ps(_mm512_set1_ps(6.0), _mm512_max_ps(zero, s)),
                _ => s,
            }
        }
    }

    /// [`row`] in 16-channel blocks (`nb` a multiple of 16), compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX2 and FMA.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(in crate::backend::cpu) unsafe fn row512<const S: usize, const A: u8>(
        x: &[f32],
        rows: [Option<usize>; 3],
        g: &RowGeometry,
        wt: &[f32],
        ws: usize,
        bias: Option<&[f32]>,
        nb: usize,
        acc: &mut [f32],
        stride: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe { row::<__m512, S, A>(x, rows, g, wt, ws, bias, nb, acc, stride) }
    }

    /// [`row`] with its vector width, stride and activation chosen at run time: 16-lane
    /// vectors ([`row512`]) where `wide`, else 8-lane ones; stride 1 or 2 (`s` > 1 runs 2);
    /// activation [`NONE`], [`RELU`] or [`RELU6`] (any other value runs [`NONE`]).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and AVX-512F where `wide`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn row_for(
        wide: bool,
        s: usize,
        act: u8,
        x: &[f32],
        rows: [Option<usize>; 3],
        g: &RowGeometry,
        wt: &[f32],
        ws: usize,
        bias: Option<&[f32]>,
        nb: usize,
        acc: &mut [f32],
        stride: usize,
    ) {
        macro_rules! by_act {
            ($f:ident $(::<$v:ty>)?, $s:literal) => {
                match act {
                    RELU => $f::<$($v,)? $s, RELU>(x, rows, g, wt, ws, bias, nb, acc, stride),
                    RELU6 => $f::<$($v,)? $s, RELU6>(x, rows, g, wt, ws, bias, nb, acc, stride),
                    _ => $f::<$($v,)? $s, NONE>(x, rows, g, wt, ws, bias, nb, acc, stride),
                }
            };
        }
        // SAFETY: the caller's promises (AVX-512F for `row512` only where `wide`).
        unsafe {
            match (wide, s) {
                (true, 1) => by_act!(row512, 1),
                (true, _) => by_act!(row512, 2),
                (false, 1) => by_act!(row::<__m256>, 1),
                (false, _) => by_act!(row::<__m256>, 2),
            }
        }
    }

    /// One output row of a 3 × 3 kernel with dilation 1 and horizontal stride `S`, into `acc`
    /// (pixel `j`'s `nb` channels at `acc[j·stride..]`), bias and activation `A` included.
    /// `rows[ky]` is the offset in `x` of kernel row `ky`'s input row (its first pixel, the
    /// block's first channel), or `None` where that row is outside the image; input pixels
    /// are `c` elements apart, `g.width` to a row. Pixels `g.lo..g.hi` have every tap inside the row; the others
    /// skip the taps left of pixel 0 or right of the last. `wt` holds the block's weights
    /// `[tap][channel]`, tap `t`'s at `t·ws`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn row<V: Vector, const S: usize, const A: u8>(
        x: &[f32],
        rows: [Option<usize>; 3],
        g: &RowGeometry,
        wt: &[f32],
        ws: usize,
        bias: Option<&[f32]>,
        nb: usize,
        acc: &mut [f32],
        stride: usize,
    ) {
        let RowGeometry { c, width, pad_left, lo, hi, ow } = *g;
        if ow == 0 || nb == 0 {
            return;
        }
        assert!(
            nb.is_multiple_of(V::LANES)
                && nb <= c
                && width > 0
                && rows.iter().flatten().all(|&r| r + (width - 1) * c + nb <= x.len())
                && lo <= hi
                && hi <= ow
                && (lo == hi || (lo * S >= pad_left && S * (hi - 1) + 2 < width + pad_left))
                && 8 * ws + nb <= wt.len()
                && bias.is_none_or(|b| b.len() >= nb)
                && (ow - 1) * stride + nb <= acc.len(),
            "NHWC 3 x 3 row past its operands"
        );
        // Interior pixels per segment: whole tiles, at least MIN_TILES, else as many as have
        // their input (three rows, every channel) in SEGMENT_BYTES.
        let seg = (SEGMENT_BYTES / (3 * S * V::TILE * c * 4)).max(MIN_TILES) * V::TILE;
        let count = hi - lo;
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX2 and FMA;
        // the assert bounds every access: the interior pixels' taps lie inside the input rows,
        // the border pixels' taps are clipped to them ([`edge`]), channels stay below nb,
        // weights of taps below 9, the bias's nb channels, and acc's pixels below ow.
        unsafe {
            let rp: [*const f32; 3] = std::array::from_fn(|ky| match rows[ky] {
                Some(r) => x.as_ptr().add(r),
                None => std::ptr::null(),
            });
            let out = acc.as_mut_ptr();
            let mut j0 = 0;
            loop {
                let j1 = (j0 + seg).min(count);
                for c0 in (0..nb).step_by(V::LANES) {
                    let w: [V; 9] = std::array::from_fn(|t| V::load(wt.as_ptr().add(t * ws + c0)));
                    let b = match bias {
                        Some(b) => V::load(b.as_ptr().add(c0)),
                        None => V::zero(),
                    };
                    // The border pixels with the first and the last segment.
                    let r = rp.map(|r| if r.is_null() { r } else { r.add(c0) });
                    if j0 == 0 {
                        for ox in 0..lo {
                            edge::<V, A>(r, ox * S, g, &w, b, out.add(ox * stride + c0));
                        }
                    }
                    tiles::<V, S, A>(j1 - j0, c, &w, b, stride, |j| {
                        let px = lo + j0 + j;
                        let r = rp.map(|r| if r.is_null() { r } else { r.add((px * S - pad_left) * c + c0) });
                        (r, out.add(px * stride + c0))
                    });
                    if j1 == count {
                        for ox in hi..ow {
                            edge::<V, A>(r, ox * S, g, &w, b, out.add(ox * stride + c0));
                        }
                    }
                }
                if j1 == count {
                    break;
                }
                j0 = j1;
            }
        }
    }

    /// The vertical geometry of a layer, with [`RowGeometry`] for the rows: what
    /// [`plane_for`] needs to run every output row of one channel block.
    #[derive(Clone)]
    pub(in crate::backend::cpu) struct PlaneGeometry {
        pub(in crate::backend::cpu) row: RowGeometry,
        /// Horizontal stride: 1, or 2 for any other value.
        pub(in crate::backend::cpu) stride_w: usize,
        /// Input rows.
        pub(in crate::backend::cpu) height: usize,
        /// Output rows.
        pub(in crate::backend::cpu) oh: usize,
        pub(in crate::backend::cpu) stride_h: usize,
        pub(in crate::backend::cpu) dilation_h: usize,
        pub(in crate::backend::cpu) pad_top: usize,
        /// The rows to compute, `rows.start ≤ rows.end ≤ oh`: every one, or a band of them
        /// (`Conv::nhwc_blocks` splits a layer's rows between threads where that balances
        /// them better than its blocks do).
        pub(in crate::backend::cpu) rows: std::ops::Range<usize>,
    }

    /// One channel block of one image, its output rows `g.rows` ([`plane`]), with its vector
    /// width, stride and activation chosen at run time as [`row_for`] does. `x` is the image's
    /// input from the block's first channel (pixels `g.row.c` apart); the block's weight for
    /// tap `t`, lane `i` is `w[t·ts + i·cs]` (`cs` 1: a `[tap][channel]` layout, one load per
    /// tap; else, as stored `[channel][tap]`, one gather per tap); `bias` holds the block's
    /// channels. The sums are [`row`]'s: the same bits.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and AVX-512F where `wide`; `out` covers `g.oh·g.row.ow`
    /// pixels `stride` elements apart, each the block's lanes, and nothing else accesses them
    /// meanwhile.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn plane_for(
        wide: bool,
        act: u8,
        x: &[f32],
        g: &PlaneGeometry,
        w: &[f32],
        (ts, cs): (usize, usize),
        bias: Option<&[f32]>,
        out: *mut f32,
        stride: usize,
    ) {
        let RowGeometry { c, width, pad_left, lo, hi, .. } = g.row;
        let lanes = if wide { 16 } else { LANES };
        let s = if g.stride_w == 1 { 1 } else { 2 };
        assert!(
            width > 0
                && c >= lanes
                && g.height > 0
                && (g.height * width - 1) * c + lanes <= x.len()
                && lo <= hi
                && hi <= g.row.ow
                && g.rows.end <= g.oh
                && (lo == hi || (lo * s >= pad_left && s * (hi - 1) + 2 < width + pad_left))
                && 8 * ts + (lanes - 1) * cs < w.len()
                && cs * lanes <= i32::MAX as usize
                && bias.is_none_or(|b| b.len() >= lanes)
                && stride >= lanes,
            "NHWC 3 x 3 channel block past its operands"
        );
        let (x, w, b) = (x.as_ptr(), w.as_ptr(), bias.map_or(std::ptr::null(), |b| b.as_ptr()));
        macro_rules! by_act {
            ($f:ident, $s:literal) => {
                match act {
                    RELU => $f::<$s, RELU>(x, g, w, (ts, cs), b, out, stride),
                    RELU6 => $f::<$s, RELU6>(x, g, w, (ts, cs), b, out, stride),
                    _ => $f::<$s, NONE>(x, g, w, (ts, cs), b, out, stride),
                }
            };
        }
        // SAFETY: the caller's promises, and the assert: every input pixel of the block lies
        // in `x`, every interior pixel's taps inside its row, every weight in `w`.
        unsafe {
            match (wide, s) {
                (true, 1) => by_act!(plane512, 1),
                (true, _) => by_act!(plane512, 2),
                (false, 1) => by_act!(plane256, 1),
                (false, _) => by_act!(plane256, 2),
            }
        }
    }

    /// [`plane`] in 16-channel blocks, compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX2 and FMA; [`plane_for`]'s operands (its assert passed);
    /// `bias` null or the block's 16 channels.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn plane512<const S: usize, const A: u8>(
        x: *const f32,
        g: &PlaneGeometry,
        w: *const f32,
        wl: (usize, usize),
        bias: *const f32,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe { plane::<__m512, S, A>(x, g, &weights(w, wl), bias_or_zero(bias), out, stride) }
    }

    /// [`plane`] in 8-channel blocks, compiled for AVX2 and FMA.
    ///
    /// # Safety
    /// As [`plane512`], with AVX2 and FMA and 8 channels.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn plane256<const S: usize, const A: u8>(
        x: *const f32,
        g: &PlaneGeometry,
        w: *const f32,
        wl: (usize, usize),
        bias: *const f32,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe { plane::<__m256, S, A>(x, g, &weights(w, wl), bias_or_zero(bias), out, stride) }
    }

    /// The nine weight vectors of a block: tap `t`'s lane `i` at `w[t·ts + i·cs]`.
    ///
    /// # Safety
    /// The CPU has the vector's instructions; those weights lie in `w`'s allocation.
    #[inline(always)]
    unsafe fn weights<V: Vector>(w: *const f32, (ts, cs): (usize, usize)) -> [V; 9] {
        // SAFETY: the caller's promises.
        unsafe {
            match (ts, cs) {
                (_, 1) => std::array::from_fn(|t| V::load(w.add(t * ts))),
                (1, 9) => V::stored_taps(w),
                _ => std::array::from_fn(|t| V::gather(w.add(t * ts), cs)),
            }
        }
    }

    /// The bias vector at `b`, or zeros where `b` is null.
    ///
    /// # Safety
    /// The CPU has the vector's instructions; `b` null or covering one vector.
    #[inline(always)]
    unsafe fn bias_or_zero<V: Vector>(b: *const f32) -> V {
        // SAFETY: the caller's promises.
        unsafe { if b.is_null() { V::zero() } else { V::load(b) } }
    }

    /// The output rows `g.rows` of one channel block of one image, from its weights `w` and
    /// bias `b` in registers: per row, the border pixels one at a time ([`edge`]) and the
    /// others in tiles ([`tiles`]), as [`row`] computes them. The block's input, three rows of
    /// it at a time, stays in L1 from one output row to the next (read from L2 once, not once
    /// per output row as where each row runs every channel).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA and the vector's instructions; `x` and `out` as
    /// [`plane_for`]'s (its assert passed).
    #[inline(always)]
    unsafe fn plane<V: Vector, const S: usize, const A: u8>(
        x: *const f32,
        g: &PlaneGeometry,
        w: &[V; 9],
        b: V,
        out: *mut f32,
        stride: usize,
    ) {
        let r = &g.row;
        // Rows whose border pixels each have one tap outside the row, the first's leftmost and
        // the last's rightmost (3 × 3 "same" layers): every pixel goes in tiles, those two
        // skipping that tap ([`row_tiles`]). Against the border pixels one at a time
        // ([`edge`]), MobileNetV2's NHWC layers (2 threads, separate processes alternated
        // twice, the same bits): 960 × 7² 6.2–6.3 µs against 7.5–7.8, 384 × 14² 8.7–9.3
        // against 9.9–10.2, 192 × 28² 16.8–17.1 against 18.1–19.0.
        let whole = r.pad_left == 1 && r.lo == 1 && r.hi + 1 == r.ow && S * (r.ow - 1) + 2 == r.width + 1;
        // SAFETY (the pointer offsets): input rows `py − pad_top < height` only, pixels as
        // `row`'s; output pixels below `oh·ow`.
        unsafe {
            for oy in g.rows.clone() {
                let rp: [*const f32; 3] = std::array::from_fn(|ky| {
                    let py = oy * g.stride_h + ky * g.dilation_h;
                    if py >= g.pad_top && py - g.pad_top < g.height {
                        x.add((py - g.pad_top) * r.width * r.c)
                    } else {
                        std::ptr::null()
                    }
                });
                let o = out.add(oy * r.ow * stride);
                if whole {
                    // From input pixel −1 (never read).
                    let r0 = rp.map(|p| if p.is_null() { p } else { p.wrapping_sub(r.c) });
                    row_tiles::<V, S, A>(r.ow, r.c, w, b, stride, |j| {
                        (r0.map(|p| if p.is_null() { p } else { p.wrapping_add(j * S * r.c) }), o.add(j * stride))
                    });
                    continue;
                }
                for ox in 0..r.lo {
                    edge::<V, A>(rp, ox * S, r, w, b, o.add(ox * stride));
                }
                tiles::<V, S, A>(r.hi - r.lo, r.c, w, b, stride, |j| {
                    let px = r.lo + j;
                    (rp.map(|p| if p.is_null() { p } else { p.add((px * S - r.pad_left) * r.c) }), o.add(px * stride))
                });
                for ox in r.hi..r.ow {
                    edge::<V, A>(rp, ox * S, r, w, b, o.add(ox * stride));
                }
            }
        }
    }

    /// The NCHW channel-vector tile's rows (`super::tile`: 8 planes as the lanes, zero
    /// padded, so every tap is inside): `oh` output rows of `ow` pixels into `sums`
    /// (pixel-major, 8 lanes a pixel), with the 3 × 3 weights `wv` (per tap, the 8 planes'),
    /// from `bias`. Output row `oy`'s first pixel reads kernel row `ky` at tile pixel
    /// `oy·row_step + offs[ky]`; pixels are `S` tile pixels apart. The sums and their order are
    /// the tile kernel's: the same bits.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::backend::cpu) unsafe fn dense_rows<const S: usize>(
        win: &[f32],
        offs: [usize; 3],
        row_step: usize,
        oh: usize,
        ow: usize,
        wv: &[[f32; LANES]],
        bias: [f32; LANES],
        sums: &mut [f32],
    ) {
        if oh == 0 || ow == 0 {
            return;
        }
        let last = (oh - 1) * row_step + offs.iter().max().copied().unwrap_or(0) + S * (ow - 1) + 3;
        assert!(
            wv.len() == 9 && last * LANES <= win.len() && oh * ow * LANES <= sums.len(),
            "tile rows past their operands"
        );
        // SAFETY (every intrinsic and pointer offset below): the caller promises AVX2 and FMA;
        // the assert bounds every tap's load inside `win` and every store inside `sums`.
        unsafe {
            let w: [__m256; 9] = std::array::from_fn(|t| _mm256_loadu_ps(wv[t].as_ptr()));
            let b = _mm256_loadu_ps(bias.as_ptr());
            let (wp, sp) = (win.as_ptr(), sums.as_mut_ptr());
            for oy in 0..oh {
                tiles::<__m256, S, NONE>(ow, LANES, &w, b, LANES, |j| {
                    let r = offs.map(|o| wp.add((oy * row_step + o + j * S) * LANES));
                    (r, sp.add((oy * ow + j) * LANES))
                });
            }
        }
    }

    /// `n` consecutive output pixels of one channel block, [`Vector::TILE`] at a time and the
    /// rest together: `at(j)` gives pixel `j`'s input rows and output as [`tile`] takes them.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `at(j)` for `j < n` meets [`tile`]'s promises for the pixels
    /// from `j` on.
    #[inline(always)]
    unsafe fn tiles<V: Vector, const S: usize, const A: u8>(
        n: usize,
        c: usize,
        w: &[V; 9],
        b: V,
        stride: usize,
        at: impl Fn(usize) -> ([*const f32; 3], *mut f32),
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            let mut j = 0;
            while j + V::TILE <= n {
                let (r, o) = at(j);
                match V::TILE {
                    8 => tile::<V, S, 8, A, false, false>(r, c, w, b, o, stride),
                    _ => tile::<V, S, 4, A, false, false>(r, c, w, b, o, stride),
                }
                j += V::TILE;
            }
            if j < n {
                let (r, o) = at(j);
                // Only 1–3 with 4-pixel tiles.
                match n - j {
                    7 if V::TILE > 7 => tile::<V, S, 7, A, false, false>(r, c, w, b, o, stride),
                    6 if V::TILE > 6 => tile::<V, S, 6, A, false, false>(r, c, w, b, o, stride),
                    5 if V::TILE > 5 => tile::<V, S, 5, A, false, false>(r, c, w, b, o, stride),
                    4 if V::TILE > 4 => tile::<V, S, 4, A, false, false>(r, c, w, b, o, stride),
                    3 => tile::<V, S, 3, A, false, false>(r, c, w, b, o, stride),
                    2 => tile::<V, S, 2, A, false, false>(r, c, w, b, o, stride),
                    _ => tile::<V, S, 1, A, false, false>(r, c, w, b, o, stride),
                }
            }
        }
    }

    /// One border pixel of one 8-channel block, whose leftmost tap reads input pixel
    /// `at − g.pad_left` (possibly negative) of `rows` (at the block's first channel; null:
    /// outside the image, skipped); the taps outside the row are skipped.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the non-null rows hold `g.width` pixels of 8 lanes, `g.c`
    /// apart.
    #[inline(always)]
    unsafe fn edge<V: Vector, const A: u8>(
        rows: [*const f32; 3],
        at: usize,
        g: &RowGeometry,
        w: &[V; 9],
        b: V,
        out: *mut f32,
    ) {
        // The taps inside the row: kx in ka..kb.
        let ka = g.pad_left.saturating_sub(at).min(3);
        let kb = (g.width + g.pad_left).saturating_sub(at).clamp(ka, 3);
        // Input pixel `at + ka − pad_left`, the first read.
        let first = (at + ka).saturating_sub(g.pad_left);
        let r = rows.map(|r| if r.is_null() { r } else { r.wrapping_add(first * g.c) });
        // SAFETY: the caller's promises; taps ka..kb are inside the row.
        unsafe {
            match (ka, kb) {
                (1, 3) => edge_taps::<V, 1, 3, A>(r, g.c, w, b, out),
                (0, 2) => edge_taps::<V, 0, 2, A>(r, g.c, w, b, out),
                (2, 3) => edge_taps::<V, 2, 3, A>(r, g.c, w, b, out),
                (0, 1) => edge_taps::<V, 0, 1, A>(r, g.c, w, b, out),
                (1, 2) => edge_taps::<V, 1, 2, A>(r, g.c, w, b, out),
                (0, 3) => edge_taps::<V, 0, 3, A>(r, g.c, w, b, out),
                _ => V::store(out, V::finish::<A>(b)),
            }
        }
    }

    /// [`edge`] with taps `KA..KB` of each row, `rows` at tap `KA`'s input.
    ///
    /// # Safety
    /// [`edge`]'s.
    #[inline(always)]
    unsafe fn edge_taps<V: Vector, const KA: usize, const KB: usize, const A: u8>(
        rows: [*const f32; 3],
        c: usize,
        w: &[V; 9],
        b: V,
        out: *mut f32,
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            let mut s = b;
            s = edge_row::<V, 0, KA, KB>(rows[0], c, w, s);
            s = edge_row::<V, 1, KA, KB>(rows[1], c, w, s);
            s = edge_row::<V, 2, KA, KB>(rows[2], c, w, s);
            V::store(out, V::finish::<A>(s));
        }
    }

    /// `s` plus kernel row `KY`'s taps `KA..KB` from `r` (tap `KA`'s input; null: none).
    /// (One call per kernel row, so that the weights' indices are constants and they stay in
    /// registers.)
    ///
    /// # Safety
    /// [`edge`]'s.
    #[inline(always)]
    unsafe fn edge_row<V: Vector, const KY: usize, const KA: usize, const KB: usize>(
        r: *const f32,
        c: usize,
        w: &[V; 9],
        mut s: V,
    ) -> V {
        if !r.is_null() {
            for kx in KA..KB {
                // SAFETY: the caller's promises.
                s = unsafe { V::fmadd(w[KY * 3 + kx], V::load(r.add((kx - KA) * c)), s) };
            }
        }
        s
    }

    /// A whole row of `n` output pixels of one channel block in tiles, [`Vector::TILE`] at a
    /// time: the first tile's first pixel skips its leftmost tap and the last tile's last
    /// pixel its rightmost ([`tile`]'s `L` and `R`); `at(j)` gives pixel `j`'s input rows
    /// (from its leftmost tap, outside the row for pixel 0) and output.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `at(j)` for `j < n` meets [`tile`]'s promises for the pixels
    /// from `j` on, with only pixel 0's leftmost and pixel `n − 1`'s rightmost taps outside.
    #[inline(always)]
    unsafe fn row_tiles<V: Vector, const S: usize, const A: u8>(
        n: usize,
        c: usize,
        w: &[V; 9],
        b: V,
        stride: usize,
        at: impl Fn(usize) -> ([*const f32; 3], *mut f32),
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            macro_rules! last {
                ($l:literal, $k:expr, $r:expr, $o:expr) => {
                    match $k {
                        8 if V::TILE > 7 => tile::<V, S, 8, A, $l, true>($r, c, w, b, $o, stride),
                        7 if V::TILE > 6 => tile::<V, S, 7, A, $l, true>($r, c, w, b, $o, stride),
                        6 if V::TILE > 5 => tile::<V, S, 6, A, $l, true>($r, c, w, b, $o, stride),
                        5 if V::TILE > 4 => tile::<V, S, 5, A, $l, true>($r, c, w, b, $o, stride),
                        4 => tile::<V, S, 4, A, $l, true>($r, c, w, b, $o, stride),
                        3 => tile::<V, S, 3, A, $l, true>($r, c, w, b, $o, stride),
                        2 => tile::<V, S, 2, A, $l, true>($r, c, w, b, $o, stride),
                        _ => tile::<V, S, 1, A, $l, true>($r, c, w, b, $o, stride),
                    }
                };
            }
            let (r, o) = at(0);
            if n <= V::TILE {
                return last!(true, n, r, o);
            }
            match V::TILE {
                8 => tile::<V, S, 8, A, true, false>(r, c, w, b, o, stride),
                _ => tile::<V, S, 4, A, true, false>(r, c, w, b, o, stride),
            }
            let mut j = V::TILE;
            while j + V::TILE < n {
                let (r, o) = at(j);
                match V::TILE {
                    8 => tile::<V, S, 8, A, false, false>(r, c, w, b, o, stride),
                    _ => tile::<V, S, 4, A, false, false>(r, c, w, b, o, stride),
                }
                j += V::TILE;
            }
            let (r, o) = at(j);
            last!(false, n - j, r, o);
        }
    }

    /// `N` output pixels of one channel block: `rows[ky]` points at kernel row `ky`'s input
    /// for the first pixel's leftmost tap (null: outside the image, skipped), input pixels `c`
    /// elements apart; the sums start at `b` and go to `out` (pixels `stride` apart). With
    /// `L`, the first of those input pixels is left of the row (the first output pixel's
    /// leftmost tap is skipped, its pointer never read); with `R`, the last is right of it.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the non-null rows hold the `S·(N − 1) + 3` pixels of a
    /// vector each (less the first with `L` and the last with `R`), and `out` `N` pixels.
    #[inline(always)]
    unsafe fn tile<V: Vector, const S: usize, const N: usize, const A: u8, const L: bool, const R: bool>(
        rows: [*const f32; 3],
        c: usize,
        w: &[V; 9],
        b: V,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            let mut s = [b; N];
            for (ky, &r) in rows.iter().enumerate() {
                if r.is_null() {
                    continue;
                }
                // Input pixel i meets output pixel p through tap kx = i − S·p; taps in
                // ascending order for each output pixel. The pixels are written out one by
                // one (`i` a literal, the test on it constant): as a loop, the compiler kept
                // 8-pixel tiles rolled, with the weights and sums indexed in memory.
                macro_rules! pixels {
                    ($($i:literal)*) => {$(
                        if $i < S * (N - 1) + 3 && !(L && $i == 0) && !(R && $i == S * (N - 1) + 2) {
                            let v = V::load(r.add($i * c));
                            for (p, s) in s.iter_mut().enumerate() {
                                if let Some(kx) = ($i as usize).checked_sub(S * p).filter(|&kx| kx < 3) {
                                    *s = V::fmadd(w[ky * 3 + kx], v, *s);
                                }
                            }
                        }
                    )*};
                }
                pixels!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
            }
            for (p, s) in s.iter().enumerate() {
                V::store(out.add(p * stride), V::finish::<A>(*s));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::avx::Vector;
    use std::arch::x86_64::*;
    use tilekit_kernels::Activation;

    /// The nine tap vectors of weights stored `[channel][tap]` hold tap `t` of channel `i` in
    /// lane `i`, in 16 lanes (two rounds of permutes) and 8 (gathers), from 144 distinct values
    /// (each its index) at every start within a cache line, so a lane taken from the wrong
    /// element or register shows.
    #[test]
    fn stored_taps_hold_each_channels_taps() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIP stored_taps_hold_each_channels_taps: no AVX2 and FMA on this CPU");
            return;
        }
        let w: Vec<f32> = (0..160).map(|i| i as f32).collect();
        for start in 0..16 {
            let p = w[start..].as_ptr();
            // Tap `t`'s lanes as stored (`lanes` of them): channel `i`'s weight `9i + t`.
            let check = |lanes: usize, taps: Vec<Vec<f32>>| {
                for (t, got) in taps.iter().enumerate() {
                    let want: Vec<f32> = (0..lanes).map(|i| (start + 9 * i + t) as f32).collect();
                    assert_eq!(*got, want, "{lanes} lanes, tap {t}, from {start}");
                }
            };
            // SAFETY: AVX2 was detected above; 72 floats from `p`; a vector's 8 lanes are 8 floats.
            let taps = unsafe { <__m256 as Vector>::stored_taps(p) };
            check(8, taps.iter().map(|v| unsafe { std::mem::transmute::<__m256, [f32; 8]>(*v) }.to_vec()).collect());
            if !is_x86_feature_detected!("avx512f") {
                continue;
            }
            // SAFETY: AVX-512F was detected just above; 144 floats from `p`.
            let taps = unsafe { <__m512 as Vector>::stored_taps(p) };
            // SAFETY: a vector's 16 lanes are 16 floats.
            check(16, taps.iter().map(|v| unsafe { std::mem::transmute::<__m512, [f32; 16]>(*v) }.to_vec()).collect());
        }
    }

    /// The in-register ReLU and ReLU6 (8 and, with AVX-512, 16 lanes) give what the activation
    /// kernel's scalar forms give, bit for bit, on the values where their definitions differ: ±0, NaN, ±Inf, 6 and around.
    #[test]
    fn fused_activations_match_the_scalar_forms() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIP fused_activations_match_the_scalar_forms: no AVX2 and FMA on this CPU");
            return;
        }
        let xs = [0.0f32, -0.0, f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 6.0, 6.5, 5.9, -1e-30];
        for (a, act) in [(super::avx::RELU, Activation::Relu), (super::avx::RELU6, Activation::Relu6)] {
            for x in xs {
                let mut got = [0.0f32; 8];
                // SAFETY: AVX2 and FMA were detected above.
                unsafe {
                    let v = _mm256_set1_ps(x);
                    let r = match a {
                        super::avx::RELU => super::avx::finish::<{ super::avx::RELU }>(v),
                        _ => super::avx::finish::<{ super::avx::RELU6 }>(v),
                    };
                    _mm256_storeu_ps(got.as_mut_ptr(), r);
                }
                let want = act.apply_f32(x);
                assert!(got.iter().all(|g| g.to_bits() == want.to_bits()), "{act:?}({x}): {} against {want}", got[0]);
                if !is_x86_feature_detected!("avx512f") {
                    continue;
                }
                let mut got = [0.0f32; 16];
                // SAFETY: AVX-512F was detected just above.
                unsafe {
                    let v = _mm512_set1_ps(x);
                    let r = match a {
                        super::avx::RELU => super::avx::finish512::<{ super::avx::RELU }>(v),
                        _ => super::avx::finish512::<{ super::avx::RELU6 }>(v),
                    };
                    _mm512_storeu_ps(got.as_mut_ptr(), r);
                }
                assert!(got.iter().all(|g| g.to_bits() == want.to_bits()), "{act:?}({x}) in 16 lanes: {}", got[0]);
            }
        }
    }
}
