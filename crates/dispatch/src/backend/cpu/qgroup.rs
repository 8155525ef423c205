//! Dequantization of one 32-element group of a quantized weight row, straight from the two
//! planes of `quant_tensor.rs` into 32 `f32` lanes (two AVX-512 vectors, four AVX2 ones).
//!
//! A group is what one scale governs (all of a `Q8_0`/`Q4_0`/`Q4_1` block, one sub-block of a
//! `Q4_K` super-block, two 16-element sub-blocks of a `Q6_K` one), so each group is a
//! branch-free loop over bytes — widen, mask or shift, convert, scale — that LLVM vectorises
//! inside the `#[target_feature]` copies of the kernels calling it (`simd.rs`). Each line does
//! the `f32` operations of `tilekit_kernels::quant::dequant` in the same order (Rust never
//! contracts `a * b + c`), so every weight is bit for bit the host dequantizer's; the tests
//! below check that for every type and group.
//!
//! The decode kernels that keep their sums in registers (`quant.rs`) take hand-written
//! intrinsics copies instead, [`avx512`] and [`avx2`]: each block's scales converted once, on
//! AVX-512 the 4-bit quants looked up in a 16-entry table by one permute. Each weight is still
//! computed by the same operations in the same order, and the tests below check them bit for
//! bit against [`Format::group`].

use super::simd::multiversion;
use tilekit_kernels::quant::GgmlType;
use tilekit_kernels::quant::blocks::f16_to_f32;

/// Elements per group.
pub(super) const G: usize = 32;

/// One block format, read from its scale-plane bytes `s` and body-plane bytes `q`.
pub(super) trait Format {
    /// Elements per block.
    const BS: usize;
    /// Bytes per block in the scale plane and in the body plane.
    const SB: usize;
    const BB: usize;
    /// Writes group `g` (`0 .. BS / 32`) of the block into `w`.
    fn group(s: &[u8], q: &[u8], g: usize, w: &mut [f32; G]);
}

#[inline(always)]
fn f16(s: &[u8], at: usize) -> f32 {
    f16_to_f32([s[at], s[at + 1]])
}

pub(super) struct Q8_0;
impl Format for Q8_0 {
    const BS: usize = 32;
    const SB: usize = 2;
    const BB: usize = 32;
    #[inline(always)]
    fn group(s: &[u8], q: &[u8], _: usize, w: &mut [f32; G]) {
        let d = f16(s, 0);
        let q = &q[..G];
        for l in 0..G {
            w[l] = f32::from(q[l] as i8) * d; // x[i].qs[j]*d
        }
    }
}

pub(super) struct Q4_0;
impl Format for Q4_0 {
    const BS: usize = 32;
    const SB: usize = 2;
    const BB: usize = 16;
    #[inline(always)]
    fn group(s: &[u8], q: &[u8], _: usize, w: &mut [f32; G]) {
        let d = f16(s, 0);
        let q = &q[..16];
        let (lo, hi) = w.split_at_mut(16);
        for l in 0..16 {
            lo[l] = (i32::from(q[l] & 0x0F) - 8) as f32 * d; // x0*d
            hi[l] = (i32::from(q[l] >> 4) - 8) as f32 * d; // x1*d
        }
    }
}

pub(super) struct Q4_1;
impl Format for Q4_1 {
    const BS: usize = 32;
    const SB: usize = 4;
    const BB: usize = 16;
    #[inline(always)]
    fn group(s: &[u8], q: &[u8], _: usize, w: &mut [f32; G]) {
        let (d, m) = (f16(s, 0), f16(s, 2));
        let q = &q[..16];
        let (lo, hi) = w.split_at_mut(16);
        for l in 0..16 {
            lo[l] = f32::from(q[l] & 0x0F) * d + m; // x0*d + m
            hi[l] = f32::from(q[l] >> 4) * d + m; // x1*d + m
        }
    }
}

pub(super) struct Q4K;
impl Format for Q4K {
    const BS: usize = 256;
    const SB: usize = 4;
    const BB: usize = 140;
    #[inline(always)]
    fn group(s: &[u8], q: &[u8], g: usize, w: &mut [f32; G]) {
        let (d, min) = (f16(s, 0), f16(s, 2));
        // The packed 6-bit scale and minimum of sub-block g (`BlockQ4K::scale_min`).
        let p = &q[..12];
        let (sc, mn) = if g < 4 {
            (p[g] & 63, p[g + 4] & 63)
        } else {
            ((p[g + 4] & 0xF) | ((p[g - 4] >> 6) << 4), (p[g + 4] >> 4) | ((p[g] >> 6) << 4))
        };
        let (d1, m1) = (d * f32::from(sc), min * f32::from(mn)); // d1 = d * sc; m1 = min * m
        // Sub-block g is the low (even g) or high (odd g) nibbles of qs[32·(g / 2) ..][..32].
        let qs = &q[12 + 32 * (g / 2)..][..G];
        let shift = 4 * (g & 1) as u32;
        for l in 0..G {
            w[l] = d1 * f32::from((qs[l] >> shift) & 0xF) - m1; // d1 * (q[l] & 0xF) - m1
        }
    }
}

pub(super) struct Q6K;
impl Format for Q6K {
    const BS: usize = 256;
    const SB: usize = 2;
    const BB: usize = 208;
    #[inline(always)]
    fn group(s: &[u8], q: &[u8], g: usize, w: &mut [f32; G]) {
        let d = f16(s, 0);
        // Half h (128 elements) and quarter t of it: element l of the group is element
        // 128h + 32t + l of the block, its low four bits in ql[64h + 32·(t & 1) + l] (low
        // nibble for t < 2, high for t ≥ 2), its high two bits at bit 2t of qh[32h + l], and
        // its scale scales[8h + l / 16 + 2t].
        let (h, t) = (g / 4, g % 4);
        let ql = &q[64 * h + 32 * (t & 1)..][..G];
        let qh = &q[128 + 32 * h..][..G];
        let sc = &q[192 + 8 * h + 2 * t..][..2];
        let (lshift, hshift) = (4 * (t >> 1) as u32, 2 * t as u32);
        for (half, (w, (ql, qh))) in
            w.chunks_exact_mut(16).zip(ql.chunks_exact(16).zip(qh.chunks_exact(16))).enumerate()
        {
            // d * sc[is] * q, evaluated left to right in f32.
            let ds = d * f32::from(sc[half] as i8);
            for l in 0..16 {
                let v = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4);
                w[l] = ds * (i32::from(v) - 32) as f32;
            }
        }
    }
}

/// Runs `$body` with `$F` bound to the [`Format`] of `$ty`, or evaluates `$dense` for a dense
/// type (callers have checked the type with `PlaneGeometry::of`).
macro_rules! with_format {
    ($ty:expr, $F:ident => $body:expr, _ => $dense:expr) => {
        match $ty {
            GgmlType::Q8_0 => {
                type $F = $crate::backend::cpu::qgroup::Q8_0;
                $body
            }
            GgmlType::Q4_0 => {
                type $F = $crate::backend::cpu::qgroup::Q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $F = $crate::backend::cpu::qgroup::Q4_1;
                $body
            }
            GgmlType::Q4K => {
                type $F = $crate::backend::cpu::qgroup::Q4K;
                $body
            }
            GgmlType::Q6K => {
                type $F = $crate::backend::cpu::qgroup::Q6K;
                $body
            }
            _ => $dense,
        }
    };
}
pub(super) use with_format;

/// The little-endian f16 at `s` (unaligned) as an f32 by F16C, in all eight lanes, for the
/// intrinsics copies ([`avx512`], [`avx2`]): the conversion is exact, so this is
/// [`f16`](fn@f16)'s value (a NaN stays a NaN, quieted as `half` quiets it).
///
/// The half is broadcast before it is converted, so the load writes a whole register. Loaded
/// into lane 0 alone, it was a `vpinsrw` that merged into whatever register LLVM picked for
/// the other lanes, at times a sum of the decode loop: each block's scale then waited for the
/// block before it (Q8_0's AVX2 decode rows took 19 cycles a block, against 9 for Q4_0's
/// whose merge source was a constant).
///
/// # Safety
/// F16C; two readable bytes at `s`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scale8(s: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller promises two bytes at s.
    let bits = unsafe { s.cast::<u16>().read_unaligned() };
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// [`scale8`] in sixteen lanes.
///
/// # Safety
/// AVX-512F and F16C; two readable bytes at `s`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn scale16(s: *const u8) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller promises two bytes at s.
    let bits = unsafe { s.cast::<u16>().read_unaligned() };
    _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16))
}

/// A `Q4_K` super-block's `d1 = d · sc` of its eight sub-blocks, then `m1 = min · m`
/// ([`Q4K::group`]'s, once per super-block), for the intrinsics copies: the eight 6-bit scales
/// and minimums unpacked in eight 32-bit lanes at once (four byte shuffles, then masks and
/// shifts per lane), each then one multiply, as [`Q4K::group`] computes it: the same bits.
/// (Unpacked one sub-block at a time, as the portable code does, they were about 70
/// instructions per 256 weights.)
///
/// # Safety
/// AVX2 and F16C; the block's 4 scale bytes at `s` and its body at `q` (140 bytes, the 12
/// packed scale bytes first: the 16 read here are inside it).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4k_scales(s: *const u8, q: *const u8) -> [f32; 16] {
    use std::arch::x86_64::*;
    // SAFETY: the caller's promise: 4 bytes at s, 16 of the body's 140 at q.
    let (d, min, v) = unsafe { (scale8(s), scale8(s.add(2)), _mm_loadu_si128(q.cast())) };
    // Lane g of each: the packed byte that holds its low bits (`a`: sc, `b`: m), and for g ≥ 4
    // the byte whose top two bits are its high bits (`c`: sc, `e`: m; 0 for g < 4).
    let lanes = |idx: __m128i| _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, idx));
    let a = lanes(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
    let b = lanes(_mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
    let c = lanes(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1));
    let e = lanes(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, -1, -1, -1, -1));
    let low = _mm256_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15);
    let high = |x: __m256i| _mm256_slli_epi32::<4>(_mm256_srli_epi32::<6>(x));
    // sc: p[g] & 63 (g < 4); (p[g + 4] & 0xF) | ((p[g − 4] >> 6) << 4) (g ≥ 4).
    let sc = _mm256_or_si256(_mm256_and_si256(a, low), high(c));
    // m: p[g + 4] & 63 (g < 4); (p[g + 4] >> 4) | ((p[g] >> 6) << 4) (g ≥ 4).
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let mn = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(b, shift), low), high(e));
    let mut out = [0.0; 16];
    // SAFETY: out holds 16 floats: 8 at 0 and 8 at 8.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc))); // d1
        _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(min, _mm256_cvtepi32_ps(mn))); // m1
    }
    out
}

/// A `Q6_K` super-block's `d · scales[i]` of its sixteen 16-element sub-blocks ([`Q6K::group`]'s,
/// once per super-block), for the intrinsics copies: the sixteen signed bytes widened in two
/// vectors, each lane then one multiply (the same bits).
///
/// # Safety
/// AVX2 and F16C; the block's 2 scale bytes at `s` and its 208 body bytes at `q`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q6k_scales(s: *const u8, q: *const u8) -> [f32; 16] {
    use std::arch::x86_64::*;
    // SAFETY: the caller's promise; the sub-block scales are bytes 192 .. 208 of the body.
    let (d, sc) = unsafe { (scale8(s), _mm_loadu_si128(q.add(192).cast())) };
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc)));
    let mut out = [0.0; 16];
    // SAFETY: out holds 16 floats: 8 at 0 and 8 at 8.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, lo));
        _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
    }
    out
}

/// The groups of [`Format`] dequantized with AVX-512 intrinsics straight into two vectors,
/// for the decode kernel that keeps its sums in registers (`quant.rs`'s `avx512::rows`) and
/// the K-quants' chunks in the decode tiles (`avx512::chunk512`): the same `f32` operations
/// in the same order as [`Format::group`], lane by lane, so the same weights bit for bit
/// (checked below).
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::{Format, Q4_0, Q4_1, Q4K, Q6K, Q8_0};
    use super::{q4k_scales, q6k_scales, scale16};
    use std::arch::x86_64::*;

    /// [`Format::group`] in two AVX-512 vectors, the block's scales read once per block.
    pub(in crate::backend::cpu) trait Group512: Format {
        /// What [`Self::group512`] needs of a block's scales, computed once per block.
        type Scales: Copy;

        /// The scales of the block whose scale bytes start at `s` and body bytes at `q`.
        ///
        /// # Safety
        /// The CPU has AVX-512F and F16C; `s` and `q` point at the block's `SB` and `BB`
        /// bytes.
        unsafe fn scales(s: *const u8, q: *const u8) -> Self::Scales;

        /// Group `g` of the block whose body bytes start at `q` and whose scales are `sc`:
        /// elements `0 .. 16` and `16 .. 32`.
        ///
        /// # Safety
        /// As [`Self::scales`]; `g < BS / 32`.
        unsafe fn group512(sc: &Self::Scales, q: *const u8, g: usize) -> [__m512; 2];

        /// [`Self::scales`] from the block's f16 scales already converted to f32 (`f`, the
        /// `SB / 2` of them in storage order; `s` and `q` as for [`Self::scales`]): the
        /// one-group formats override it to use `f`, the same values; the others read the
        /// block's bytes.
        ///
        /// # Safety
        /// As [`Self::scales`].
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales_of(f: &[f32], s: *const u8, q: *const u8) -> Self::Scales {
            let _ = f;
            // SAFETY: the caller's promise.
            unsafe { Self::scales(s, q) }
        }

        /// Groups `g` and `g + 1` (`g` even): [`Self::group512`]'s twice, or what a format
        /// shares between them.
        ///
        /// # Safety
        /// As [`Self::group512`], with `g + 1 < BS / 32`.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512_pair(sc: &Self::Scales, q: *const u8, g: usize) -> [__m512; 4] {
            // SAFETY: the caller's promise, for g and g + 1.
            let ([w0, w1], [w2, w3]) = unsafe { (Self::group512(sc, q, g), Self::group512(sc, q, g + 1)) };
            [w0, w1, w2, w3]
        }
    }

    /// 16 bytes at `p` widened to 16 `i32` lanes (zero-extended).
    ///
    /// # Safety
    /// AVX-512F; 16 readable bytes at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn u8x16(p: *const u8) -> __m512i {
        // SAFETY: the caller promises 16 bytes at p.
        _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) })
    }

    /// `0.0, 1.0, … 15.0`: the sixteen values of a 4-bit quant.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn iota() -> __m512 {
        _mm512_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0)
    }

    /// Lane `l` is `table[x[l] mod 16]` (`x` the lanes of 4-bit quants with any higher bits
    /// set, which the permute ignores): each dequantized weight is read from the sixteen
    /// values a block's scales give, which are computed with the same operations as
    /// [`Format::group`]'s per element, so they are the same bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn lookup(x: __m512i, table: __m512) -> __m512 {
        _mm512_permutexvar_ps(x, table)
    }

    /// `ds * (v - 32) as f32` in each lane, `v` the low bits `(l >> ls) & 0xF` and the high
    /// bits `(h >> hs) & 3` (`Q6_K`).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn q6k(l: __m512i, h: __m512i, ls: __m128i, hs: __m128i, ds: f32) -> __m512 {
        let lo = _mm512_and_si512(_mm512_srl_epi32(l, ls), _mm512_set1_epi32(0xF));
        let hi = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srl_epi32(h, hs), _mm512_set1_epi32(3)));
        let v = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
        _mm512_mul_ps(_mm512_set1_ps(ds), _mm512_cvtepi32_ps(v))
    }

    impl Group512 for Q8_0 {
        type Scales = __m512;

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> __m512 {
            // SAFETY: the block's 2 scale bytes (the caller's promise).
            unsafe { scale16(s) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales_of(f: &[f32], _: *const u8, _: *const u8) -> __m512 {
            _mm512_set1_ps(f[0])
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512(&d: &__m512, q: *const u8, _: usize) -> [__m512; 2] {
            // SAFETY: the block's 32 body bytes.
            let (lo, hi) = unsafe { (_mm_loadu_si128(q.cast()), _mm_loadu_si128(q.add(16).cast())) };
            [
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d),
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d),
            ]
        }
    }

    impl Group512 for Q4_0 {
        /// `(q - 8) as f32 * d` for `q` in `0 .. 16`.
        type Scales = __m512;

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> __m512 {
            // SAFETY: the block's 2 scale bytes.
            let d = unsafe { scale16(s) };
            _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.0)), d)
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales_of(f: &[f32], _: *const u8, _: *const u8) -> __m512 {
            _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.0)), _mm512_set1_ps(f[0]))
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512(&t: &__m512, q: *const u8, _: usize) -> [__m512; 2] {
            // SAFETY: the block's 16 body bytes.
            let x = unsafe { u8x16(q) };
            [lookup(x, t), lookup(_mm512_srli_epi32::<4>(x), t)]
        }
    }

    impl Group512 for Q4_1 {
        /// `q as f32 * d + m` for `q` in `0 .. 16`.
        type Scales = __m512;

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> __m512 {
            // SAFETY: the block's 4 scale bytes.
            let (d, m) = unsafe { (scale16(s), scale16(s.add(2))) };
            _mm512_add_ps(_mm512_mul_ps(iota(), d), m)
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales_of(f: &[f32], _: *const u8, _: *const u8) -> __m512 {
            _mm512_add_ps(_mm512_mul_ps(iota(), _mm512_set1_ps(f[0])), _mm512_set1_ps(f[1]))
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512(&t: &__m512, q: *const u8, _: usize) -> [__m512; 2] {
            // SAFETY: the block's 16 body bytes.
            let x = unsafe { u8x16(q) };
            [lookup(x, t), lookup(_mm512_srli_epi32::<4>(x), t)]
        }
    }

    impl Group512 for Q4K {
        /// `d1` of the eight sub-blocks, then `m1`.
        type Scales = [f32; 16];

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, q: *const u8) -> [f32; 16] {
            // SAFETY: the caller's promise, F16C included.
            unsafe { q4k_scales(s, q) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512(sc: &[f32; 16], q: *const u8, g: usize) -> [__m512; 2] {
            // d1 * q as f32 - m1 for q in 0 .. 16.
            let t = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(sc[g]), iota()), _mm512_set1_ps(sc[8 + g]));
            // SAFETY: sub-block g's 32 bytes at 12 + 32 · (g / 2) of the 140 (g < 8).
            let (lo, hi) = unsafe {
                let qs = q.add(12 + 32 * (g / 2));
                (u8x16(qs), u8x16(qs.add(16)))
            };
            if g & 1 == 0 {
                [lookup(lo, t), lookup(hi, t)]
            } else {
                [lookup(_mm512_srli_epi32::<4>(lo), t), lookup(_mm512_srli_epi32::<4>(hi), t)]
            }
        }

        /// The two sub-blocks are the low and the high nibbles of the same 32 bytes: widened
        /// once for both. M = 1 decode (`quant.rs`'s `avx512::rows`) at 1 × 4096 × 4096, 1 ×
        /// 11008 × 4096 and 1 × 4096 × 11008 took 0.85–0.94 of the time of widening them per
        /// group (in-process, alternated four times, 2-core AVX-512 Xeon). The decode tiles'
        /// chunks at 16 rows were level with it, so they keep one group at a time.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512_pair(sc: &[f32; 16], q: *const u8, g: usize) -> [__m512; 4] {
            let table =
                |g: usize| _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(sc[g]), iota()), _mm512_set1_ps(sc[8 + g]));
            let (t0, t1) = (table(g), table(g + 1));
            // SAFETY: sub-blocks g and g + 1 share the 32 bytes at 12 + 32 · (g / 2) of the 140
            // (g even, g + 1 < 8).
            let (lo, hi) = unsafe {
                let qs = q.add(12 + 32 * (g / 2));
                (u8x16(qs), u8x16(qs.add(16)))
            };
            let (lo1, hi1) = (_mm512_srli_epi32::<4>(lo), _mm512_srli_epi32::<4>(hi));
            [lookup(lo, t0), lookup(hi, t0), lookup(lo1, t1), lookup(hi1, t1)]
        }
    }

    impl Group512 for Q6K {
        /// `d · scales[i]` of the sixteen 16-element sub-blocks.
        type Scales = [f32; 16];

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, q: *const u8) -> [f32; 16] {
            // SAFETY: the caller's promise, F16C included.
            unsafe { q6k_scales(s, q) }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn group512(ds: &[f32; 16], q: *const u8, g: usize) -> [__m512; 2] {
            // The layout of `Q6K::group`: low bits at 64h + 32·(t & 1), high bits at 128 + 32h,
            // the two 16-element scales 8h + 2t and the next (g < 8, so all inside the 208 bytes).
            let (h, t) = (g / 4, g % 4);
            let (ls, hs) = (_mm_cvtsi32_si128(4 * (t >> 1) as i32), _mm_cvtsi32_si128(2 * t as i32));
            let ds = &ds[8 * h + 2 * t..][..2];
            // SAFETY: 32 bytes at each of ql and qh, inside the body.
            unsafe {
                let (ql, qh) = (q.add(64 * h + 32 * (t & 1)), q.add(128 + 32 * h));
                [q6k(u8x16(ql), u8x16(qh), ls, hs, ds[0]), q6k(u8x16(ql.add(16)), u8x16(qh.add(16)), ls, hs, ds[1])]
            }
        }
    }
}

/// The groups of [`Format`] dequantized with AVX2 intrinsics into four vectors: the AVX2 copy
/// of [`avx512`] for the decode kernel of 1–2 rows without AVX-512 (`quant.rs`'s
/// `avx2::rows`), the scales once per block, each weight by [`Format::group`]'s operations in
/// its order (checked bit for bit below).
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::{Format, Q4_0, Q4_1, Q4K, Q6K, Q8_0};
    use super::{q4k_scales, q6k_scales, scale8};
    use std::arch::x86_64::*;

    /// [`Format::group`] in four AVX2 vectors, the block's scales read once per block.
    pub(in crate::backend::cpu) trait Group256: Format {
        /// What [`Self::group256`] needs of a block's scales.
        type Scales: Copy;

        /// The scales of the block whose scale bytes start at `s` and body bytes at `q`.
        ///
        /// # Safety
        /// The CPU has AVX2, FMA and F16C; `s` and `q` point at the block's `SB` and `BB`
        /// bytes.
        unsafe fn scales(s: *const u8, q: *const u8) -> Self::Scales;

        /// Group `g` of the block whose body bytes start at `q`: elements `8v .. 8v + 8` in
        /// vector `v`.
        ///
        /// # Safety
        /// As [`Self::scales`]; `g < BS / 32`.
        unsafe fn group256(sc: &Self::Scales, q: *const u8, g: usize) -> [__m256; 4];
    }

    /// 8 bytes at `p` widened to 8 `i32` lanes (zero-extended).
    ///
    /// # Safety
    /// AVX2; 8 readable bytes at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn u8x8(p: *const u8) -> __m256i {
        // SAFETY: the caller promises 8 bytes at p.
        _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) })
    }

    /// The low nibble (`hi` false) or the high nibble of each lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn nibble(x: __m256i, hi: bool) -> __m256i {
        if hi { _mm256_srli_epi32::<4>(x) } else { _mm256_and_si256(x, _mm256_set1_epi32(0xF)) }
    }

    impl Group256 for Q8_0 {
        type Scales = __m256;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> __m256 {
            // SAFETY: the block's 2 scale bytes (the caller's promise).
            unsafe { scale8(s) }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn group256(&d: &__m256, q: *const u8, _: usize) -> [__m256; 4] {
            // x[i].qs[j]*d; SAFETY: the block's 32 body bytes, 8 at a time.
            let w = |v: usize| unsafe {
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * v).cast()))), d)
            };
            [w(0), w(1), w(2), w(3)]
        }
    }

    impl Group256 for Q4_0 {
        type Scales = __m256;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> __m256 {
            // SAFETY: the block's 2 scale bytes.
            unsafe { scale8(s) }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn group256(&d: &__m256, q: *const u8, _: usize) -> [__m256; 4] {
            // SAFETY: the block's 16 body bytes.
            let (x0, x1) = unsafe { (u8x8(q), u8x8(q.add(8))) };
            // (x - 8) * d: low nibbles are elements 0..16, high nibbles 16..32.
            let w = |v| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8))), d);
            [w(nibble(x0, false)), w(nibble(x1, false)), w(nibble(x0, true)), w(nibble(x1, true))]
        }
    }

    impl Group256 for Q4_1 {
        type Scales = [__m256; 2];

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, _: *const u8) -> [__m256; 2] {
            // SAFETY: the block's 4 scale bytes.
            unsafe { [scale8(s), scale8(s.add(2))] }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn group256(&[d, m]: &[__m256; 2], q: *const u8, _: usize) -> [__m256; 4] {
            // SAFETY: the block's 16 body bytes.
            let (x0, x1) = unsafe { (u8x8(q), u8x8(q.add(8))) };
            // x * d + m.
            let w = |v| _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(v), d), m);
            [w(nibble(x0, false)), w(nibble(x1, false)), w(nibble(x0, true)), w(nibble(x1, true))]
        }
    }

    impl Group256 for Q4K {
        /// `d1` of the eight sub-blocks, then `m1` (as `avx512::Group512`'s).
        type Scales = [f32; 16];

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, q: *const u8) -> [f32; 16] {
            // SAFETY: the caller's promise, F16C included.
            unsafe { q4k_scales(s, q) }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn group256(sc: &[f32; 16], q: *const u8, g: usize) -> [__m256; 4] {
            let (d1, m1) = (_mm256_set1_ps(sc[g]), _mm256_set1_ps(sc[8 + g]));
            let shift = _mm_cvtsi32_si128(4 * (g & 1) as i32);
            // d1 * ((qs >> shift) & 0xF) - m1; SAFETY: sub-block g's 32 bytes at
            // 12 + 32 · (g / 2) of the 140 (g < 8), 8 at a time.
            let w = |v: usize| unsafe {
                let x = u8x8(q.add(12 + 32 * (g / 2) + 8 * v));
                let x = _mm256_and_si256(_mm256_srl_epi32(x, shift), _mm256_set1_epi32(0xF));
                _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(x)), m1)
            };
            [w(0), w(1), w(2), w(3)]
        }
    }

    impl Group256 for Q6K {
        /// `d · scales[i]` of the sixteen 16-element sub-blocks.
        type Scales = [f32; 16];

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(s: *const u8, q: *const u8) -> [f32; 16] {
            // SAFETY: the caller's promise, F16C included.
            unsafe { q6k_scales(s, q) }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn group256(ds: &[f32; 16], q: *const u8, g: usize) -> [__m256; 4] {
            // `Q6K::group`'s layout: low bits at 64h + 32·(t & 1), high bits at 128 + 32h, the
            // scales of elements 0..16 and 16..32 at 8h + 2t and the next.
            let (h, t) = (g / 4, g % 4);
            let (ls, hs) = (_mm_cvtsi32_si128(4 * (t >> 1) as i32), _mm_cvtsi32_si128(2 * t as i32));
            let ds = &ds[8 * h + 2 * t..][..2];
            // SAFETY: 8 bytes at each offset 8v < 32 of ql and qh, inside the body.
            let w = |v: usize| unsafe {
                let (l, hb) = (u8x8(q.add(64 * h + 32 * (t & 1) + 8 * v)), u8x8(q.add(128 + 32 * h + 8 * v)));
                let lo = _mm256_and_si256(_mm256_srl_epi32(l, ls), _mm256_set1_epi32(0xF));
                let hi = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srl_epi32(hb, hs), _mm256_set1_epi32(3)));
                let x = _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32));
                _mm256_mul_ps(_mm256_set1_ps(ds[v / 2]), _mm256_cvtepi32_ps(x))
            };
            [w(0), w(1), w(2), w(3)]
        }
    }
}

/// Dequantizes whole rows: `dst` (`rows × k`, row-major) gets rows `j0 ..` of the weight whose
/// planes are `scales` and `body`.
#[inline(always)]
fn rows_of<F: Format>(scales: &[u8], body: &[u8], k: usize, j0: usize, dst: &mut [f32]) {
    for (jj, row) in dst.chunks_exact_mut(k).enumerate() {
        chunk_of::<F>(scales, body, k, j0 + jj, 0, row);
    }
}

/// Dequantizes elements `q0 .. q0 + dst.len()` of row `j` of a weight `[_, k]` in format `F`
/// into `dst` (`q0` and the length multiples of `F::BS`).
#[inline(always)]
pub(super) fn chunk_of<F: Format>(scales: &[u8], body: &[u8], k: usize, j: usize, q0: usize, dst: &mut [f32]) {
    let b0 = j * (k / F::BS) + q0 / F::BS;
    for (b, blk) in dst.chunks_exact_mut(F::BS).enumerate() {
        let s = &scales[(b0 + b) * F::SB..][..F::SB];
        let q = &body[(b0 + b) * F::BB..][..F::BB];
        for (g, out) in blk.chunks_exact_mut(G).enumerate() {
            let mut w = [0.0f32; G];
            F::group(s, q, g, &mut w);
            out.copy_from_slice(&w);
        }
    }
}

#[inline(always)]
fn dequant_rows_inner<const FMA: bool>(ty: GgmlType, scales: &[u8], body: &[u8], k: usize, j0: usize, dst: &mut [f32]) {
    with_format!(ty, F => rows_of::<F>(scales, body, k, j0, dst), _ => dst.fill(f32::NAN));
}

multiversion! {
    /// Dequantizes weight rows `j0 .. j0 + dst.len() / k` of a quantized `ty` weight into
    /// `dst` (row-major, `k` per row; `k` a multiple of the block size, planes checked).
    pub(super) fn dequant_rows(ty: GgmlType, scales: &[u8], body: &[u8], k: usize, j0: usize, dst: &mut [f32]) => dequant_rows_inner
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backend::cpu::simd::Isa;
    use crate::quant_tensor::{PlaneGeometry, split_planes};

    /// Random blocks of format `F` (`(scale plane, body plane)`, 600 blocks) and a check that
    /// `got`'s groups are bit for bit [`Format::group`]'s.
    #[cfg(target_arch = "x86_64")]
    fn check_groups<F: Format>(ty: GgmlType, got: impl Fn(&[u8], &[u8], &mut [[f32; G]])) {
        let mut seed = 0x0DDB_1A5E_5BAD_5EEDu64 ^ F::BB as u64;
        let blocks = 600;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        let (s, q): (Vec<u8>, Vec<u8>) =
            ((0..blocks * F::SB).map(|_| next()).collect(), (0..blocks * F::BB).map(|_| next()).collect());
        for b in 0..blocks {
            let (sb, qb) = (&s[b * F::SB..][..F::SB], &q[b * F::BB..][..F::BB]);
            let mut all = vec![[0.0f32; G]; F::BS / G];
            got(sb, qb, &mut all);
            for (g, got) in all.iter().enumerate() {
                let mut want = [0.0f32; G];
                F::group(sb, qb, g, &mut want);
                for (l, (x, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        x.to_bits() == e.to_bits() || (x.is_nan() && e.is_nan()),
                        "{ty} block {b} group {g} lane {l}: {x:e} vs {e:e}"
                    );
                }
            }
        }
    }

    /// The AVX-512 groups (`avx512::Group512`: the scales once per block, the 4-bit formats by
    /// table lookup), one at a time and in pairs, are bit for bit [`Format::group`]'s, for
    /// every group of blocks of arbitrary bytes (every kind of f16 scale, every quant value).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_groups_match_the_portable_groups() {
        if !Isa::available().contains(&Isa::Avx512) {
            println!("SKIP avx512 groups: this CPU has no AVX-512");
            return;
        }
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        fn check<F: avx512::Group512>(ty: GgmlType) {
            check_groups::<F>(ty, |sb, qb, out| {
                // SAFETY: AVX-512F and F16C (checked above); the block's bytes are sb and qb;
                // g < BS / 32; two vectors of 16 floats into each group's 32.
                unsafe {
                    let sc = F::scales(sb.as_ptr(), qb.as_ptr());
                    for (g, o) in out.iter_mut().enumerate() {
                        let v = F::group512(&sc, qb.as_ptr(), g);
                        std::arch::x86_64::_mm512_storeu_ps(o.as_mut_ptr(), v[0]);
                        std::arch::x86_64::_mm512_storeu_ps(o.as_mut_ptr().add(16), v[1]);
                    }
                }
            });
            // The groups in pairs (`group512_pair`), where a block has an even count.
            if (F::BS / G).is_multiple_of(2) {
                check_groups::<F>(ty, |sb, qb, out| {
                    // SAFETY: as above; g even and g + 1 < BS / 32; four vectors of 16 floats
                    // into the pair's 64.
                    unsafe {
                        let sc = F::scales(sb.as_ptr(), qb.as_ptr());
                        for (p, o) in out.chunks_exact_mut(2).enumerate() {
                            let v = F::group512_pair(&sc, qb.as_ptr(), 2 * p);
                            for (i, v) in v.into_iter().enumerate() {
                                std::arch::x86_64::_mm512_storeu_ps(o[i / 2].as_mut_ptr().add(16 * (i % 2)), v);
                            }
                        }
                    }
                });
            }
        }
        for ty in GgmlType::QUANTIZED {
            // SAFETY: the CPU has AVX-512F and F16C (Isa::Avx512 is only made where it does).
            with_format!(ty, F => unsafe { check::<F>(ty) }, _ => unreachable!());
        }
    }

    /// The AVX2 groups (`avx2::Group256`) are bit for bit [`Format::group`]'s, as above.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_groups_match_the_portable_groups() {
        if !Isa::available().contains(&Isa::Avx2) {
            println!("SKIP avx2 groups: this CPU has no AVX2");
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        fn check<F: avx2::Group256>(ty: GgmlType) {
            check_groups::<F>(ty, |sb, qb, out| {
                // SAFETY: AVX2, FMA and F16C (checked above); the block's bytes are sb and qb;
                // g < BS / 32; four vectors of 8 floats into each group's 32.
                unsafe {
                    let sc = F::scales(sb.as_ptr(), qb.as_ptr());
                    for (g, o) in out.iter_mut().enumerate() {
                        let v = F::group256(&sc, qb.as_ptr(), g);
                        for (i, v) in v.into_iter().enumerate() {
                            std::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr().add(8 * i), v);
                        }
                    }
                }
            });
        }
        for ty in GgmlType::QUANTIZED {
            // SAFETY: the CPU has AVX2, FMA and F16C (Isa::Avx2 is only made where it does).
            with_format!(ty, F => unsafe { check::<F>(ty) }, _ => unreachable!());
        }
    }

    /// The planes' geometry and each [`Format`]'s constants agree.
    #[test]
    fn formats_match_the_plane_geometry() {
        for ty in GgmlType::QUANTIZED {
            let g = PlaneGeometry::of(ty).unwrap();
            let (bs, sb, bb) = with_format!(ty, F => (F::BS, F::SB, F::BB), _ => unreachable!());
            assert_eq!((bs, sb, bb), (ty.block_size(), g.scale_bytes, g.body_bytes), "{ty}");
        }
    }

    /// Every group, in every instruction set's copy, is bit for bit the host dequantizer's,
    /// over blocks of arbitrary bytes (so the f16 scales take every kind of value: subnormal,
    /// huge, infinite, NaN).
    #[test]
    fn groups_match_the_host_dequantizer() {
        let (n, k) = (40, 512);
        for ty in GgmlType::QUANTIZED {
            let g = PlaneGeometry::of(ty).unwrap();
            let mut seed = 0x2545_F491_4F6C_DD1Du64 ^ ty.block_bytes() as u64;
            let bytes: Vec<u8> = (0..ty.tensor_bytes(&[n, k]).unwrap())
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 24) as u8
                })
                .collect();
            let want = tilekit_kernels::quant::dequantize(ty, &bytes, &[n, k]).unwrap();
            let (s, b) = split_planes(g, ty.block_bytes(), &bytes);
            for isa in Isa::available() {
                for (j0, rows) in [(0, n), (7, 3), (n - 1, 1)] {
                    let mut got = vec![0.0f32; rows * k];
                    dequant_rows(isa, ty, &s, &b, k, j0, &mut got);
                    for (p, (v, e)) in got.iter().zip(&want[j0 * k..]).enumerate() {
                        assert!(
                            v.to_bits() == e.to_bits() || (v.is_nan() && e.is_nan()),
                            "{ty} {isa:?} [{}, {}]: {v:e} vs {e:e}",
                            j0 + p / k,
                            p % k
                        );
                    }
                }
            }
        }
    }
}
