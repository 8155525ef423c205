//! Half-precision storage to and from f32, in vectors: what every CPU kernel on f16 or bf16
//! data widens its inputs with and rounds its outputs with (`Elem::widen_into`,
//! `Elem::narrow_into`).
//!
//! - **f16** on x86-64 with F16C (the AVX2 and AVX-512 instruction sets, [`Isa`]): one
//!   `vcvtph2ps` or `vcvtps2ph` (round to nearest even) per 16 or 8 elements, and the tail
//!   through a padded stack copy. `half`'s slice conversions give the same bits (they run the
//!   same instruction where they detect F16C), but call a function per 8 elements with the
//!   operands copied through arrays: 0.72 ns an element one way, 12 ms for a 4096 × 4096
//!   weight on one core of the 2-core AVX-512 Xeon. Elsewhere (no F16C, aarch64) `half`'s
//!   slice conversions run as they are.
//! - **bf16** in plain Rust that LLVM vectorises in each instruction set (`multiversion!`):
//!   widening is a 16-bit shift, narrowing rounds to nearest even; NaNs are quieted as `half`
//!   quiets them (`half` converts bf16 one element at a time, with branches).
//!
//! Every function gives exactly `half`'s bits for every input: the tests compare them on
//! every 16-bit value and on a stride through all 2^32 f32 bit patterns (all of them in an
//! optimised test build).

use super::simd::{Isa, multiversion};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// `dst = src` widened (same length).
pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "conversion between slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    match Isa::detect() {
        // SAFETY: `Isa::detect` reports AVX-512 and AVX2 only where the CPU has them, with F16C.
        Isa::Avx512 => return unsafe { x86::f16_to_f32_avx512(src, dst) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::f16_to_f32_avx2(src, dst) },
        Isa::Portable => {}
    }
    src.convert_to_f32_slice(dst);
}

/// Rows of a matrix widened: `dst`'s rows of `width` (`dst.len()` a multiple of it) from
/// `src`'s rows `ld` apart, `src[r · ld ..][..width]` into `dst[r · width ..][..width]`. One
/// dispatch for all the rows: the skinny product widens a column block of a half-precision
/// `B` stored `K × N` this way, a few lines from each of thousands of rows.
pub(crate) fn f16_rows_to_f32(src: &[f16], ld: usize, width: usize, dst: &mut [f32]) {
    check_rows(src.len(), ld, width, dst.len());
    if width == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match Isa::detect() {
        // SAFETY: `Isa::detect` reports AVX-512 and AVX2 only where the CPU has them, with F16C;
        // `check_rows` bounds every row.
        Isa::Avx512 => return unsafe { x86::f16_rows_avx512(src, ld, width, dst) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::f16_rows_avx2(src, ld, width, dst) },
        Isa::Portable => {}
    }
    for (r, d) in dst.chunks_exact_mut(width).enumerate() {
        src[r * ld..][..width].convert_to_f32_slice(d);
    }
}

/// [`f16_rows_to_f32`] for bf16.
pub(crate) fn bf16_rows_to_f32(src: &[bf16], ld: usize, width: usize, dst: &mut [f32]) {
    check_rows(src.len(), ld, width, dst.len());
    if width > 0 {
        bf16_rows(Isa::detect(), src, ld, width, dst);
    }
}

/// Panics unless `dst.len()` is a whole number of rows of `width` and each row lies in `src`.
fn check_rows(src: usize, ld: usize, width: usize, dst: usize) {
    let rows = dst.checked_div(width).unwrap_or(0);
    assert!(
        (width == 0 && dst == 0) || (dst.is_multiple_of(width) && (rows == 0 || (rows - 1) * ld + width <= src)),
        "rows of {width} every {ld} past a source of {src} (into {dst})"
    );
}

/// `dst = src` rounded to nearest even (same length).
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "conversion between slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    match Isa::detect() {
        // SAFETY: `Isa::detect` reports AVX-512 and AVX2 only where the CPU has them, with F16C.
        Isa::Avx512 => return unsafe { x86::f32_to_f16_avx512(src, dst) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::f32_to_f16_avx2(src, dst) },
        Isa::Portable => {}
    }
    dst.convert_from_f32_slice(src);
}

/// `dst = src` widened (same length): the bits shifted up 16, a NaN quieted (`half`'s
/// `bf16::to_f32`).
pub(crate) fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "conversion between slices of different lengths");
    bf16_widen(Isa::detect(), src, dst);
}

/// `dst = src` rounded to nearest even (same length), a NaN quieted (`half`'s
/// `bf16::from_f32`).
pub(crate) fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "conversion between slices of different lengths");
    bf16_narrow(Isa::detect(), src, dst);
}

#[inline(always)]
fn bf16_widen_inner<const FMA: bool>(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        let i = u32::from(s.to_bits());
        // A NaN (exponent all ones, mantissa not 0) gets its quiet bit.
        let i = if i & 0x7FFF > 0x7F80 { i | 0x40 } else { i };
        *d = f32::from_bits(i << 16);
    }
}

#[inline(always)]
fn bf16_narrow_inner<const FMA: bool>(src: &[f32], dst: &mut [bf16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        let x = s.to_bits();
        let hi = x >> 16;
        // Round up where the first dropped bit is set and either another dropped bit or the
        // kept lowest bit is (nearest, ties to even); a NaN keeps its high bits, made quiet.
        let up = u32::from(x & 0x8000 != 0 && x & 0x1_7FFF != 0);
        let v = if x & 0x7FFF_FFFF > 0x7F80_0000 { hi | 0x40 } else { hi + up };
        *d = bf16::from_bits(v as u16);
    }
}

#[inline(always)]
fn bf16_rows_inner<const FMA: bool>(src: &[bf16], ld: usize, width: usize, dst: &mut [f32]) {
    for (r, d) in dst.chunks_exact_mut(width).enumerate() {
        bf16_widen_inner::<FMA>(&src[r * ld..][..width], d);
    }
}

multiversion! {
    fn bf16_rows(src: &[bf16], ld: usize, width: usize, dst: &mut [f32]) => bf16_rows_inner
}

multiversion! {
    fn bf16_widen(src: &[bf16], dst: &mut [f32]) => bf16_widen_inner
}

multiversion! {
    fn bf16_narrow(src: &[f32], dst: &mut [bf16]) => bf16_narrow_inner
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// Rounding of `vcvtps2ph`: to nearest even, as `half` asks for it.
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;

    /// # Safety
    /// The CPU has AVX-512F and F16C; `src` and `dst` of one length.
    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub(super) unsafe fn f16_to_f32_avx512(src: &[f16], dst: &mut [f32]) {
        let full = src.len() / 16 * 16;
        for (s, d) in src[..full].chunks_exact(16).zip(dst[..full].chunks_exact_mut(16)) {
            // SAFETY: 16 halves (32 bytes) at s, 16 floats at d.
            unsafe { _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast()))) };
        }
        // SAFETY: the caller's promise.
        unsafe { f16_to_f32_avx2(&src[full..], &mut dst[full..]) };
    }

    /// [`super::f16_rows_to_f32`] in 16 lanes.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C; `width > 0`, `dst` whole rows of `width`, each row of
    /// `src` in bounds (`check_rows`).
    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub(super) unsafe fn f16_rows_avx512(src: &[f16], ld: usize, width: usize, dst: &mut [f32]) {
        for (r, d) in dst.chunks_exact_mut(width).enumerate() {
            // SAFETY: the caller's promises.
            unsafe { f16_to_f32_avx512(&src[r * ld..][..width], d) };
        }
    }

    /// [`super::f16_rows_to_f32`] in 8 lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; as [`f16_rows_avx512`] otherwise.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_rows_avx2(src: &[f16], ld: usize, width: usize, dst: &mut [f32]) {
        for (r, d) in dst.chunks_exact_mut(width).enumerate() {
            // SAFETY: the caller's promises.
            unsafe { f16_to_f32_avx2(&src[r * ld..][..width], d) };
        }
    }

    /// # Safety
    /// The CPU has AVX2 and F16C; `src` and `dst` of one length.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_to_f32_avx2(src: &[f16], dst: &mut [f32]) {
        let full = src.len() / 8 * 8;
        for (s, d) in src[..full].chunks_exact(8).zip(dst[..full].chunks_exact_mut(8)) {
            // SAFETY: 8 halves (16 bytes) at s, 8 floats at d.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) };
        }
        let rest = src.len() - full;
        if rest > 0 {
            // The last 1–7 through a zero-padded copy.
            let mut s = [0u16; 8];
            let mut d = [0.0f32; 8];
            for (t, h) in s.iter_mut().zip(&src[full..]) {
                *t = h.to_bits();
            }
            // SAFETY: 8 halves in s, 8 floats in d.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) };
            dst[full..].copy_from_slice(&d[..rest]);
        }
    }

    /// # Safety
    /// The CPU has AVX-512F and F16C; `src` and `dst` of one length.
    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub(super) unsafe fn f32_to_f16_avx512(src: &[f32], dst: &mut [f16]) {
        let full = src.len() / 16 * 16;
        for (s, d) in src[..full].chunks_exact(16).zip(dst[..full].chunks_exact_mut(16)) {
            // SAFETY: 16 floats at s, 16 halves (32 bytes) at d.
            unsafe {
                let h = _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(s.as_ptr()));
                _mm256_storeu_si256(d.as_mut_ptr().cast(), h);
            }
        }
        // SAFETY: the caller's promise.
        unsafe { f32_to_f16_avx2(&src[full..], &mut dst[full..]) };
    }

    /// # Safety
    /// The CPU has AVX2 and F16C; `src` and `dst` of one length.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f32_to_f16_avx2(src: &[f32], dst: &mut [f16]) {
        let full = src.len() / 8 * 8;
        for (s, d) in src[..full].chunks_exact(8).zip(dst[..full].chunks_exact_mut(8)) {
            // SAFETY: 8 floats at s, 8 halves (16 bytes) at d.
            unsafe {
                let h = _mm256_cvtps_ph::<NEAREST>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast(), h);
            }
        }
        let rest = src.len() - full;
        if rest > 0 {
            // The last 1–7 through a zero-padded copy.
            let mut s = [0.0f32; 8];
            let mut d = [0u16; 8];
            s[..rest].copy_from_slice(&src[full..]);
            // SAFETY: 8 floats in s, 8 halves in d.
            unsafe { _mm_storeu_si128(d.as_mut_ptr().cast(), _mm256_cvtps_ph::<NEAREST>(_mm256_loadu_ps(s.as_ptr()))) };
            for (t, &b) in dst[full..].iter_mut().zip(&d) {
                *t = f16::from_bits(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::in_each_isa;
    use super::*;

    /// Lengths around the vectors' widths (8 and 16), for the tails.
    const LENGTHS: [usize; 9] = [0, 1, 7, 8, 9, 15, 16, 17, 39];

    /// Every 16-bit pattern.
    fn all_halves() -> Vec<u16> {
        (0..=u16::MAX).collect()
    }

    /// Calls `f` on f32 bit patterns, a million or so at a time: a stride through all 2^32
    /// (every one in an optimised build), then the neighbourhoods of ±0, of the smallest
    /// normal and subnormal f16 and f32, of the largest finite f16 and f32, of the
    /// infinities and of the quiet NaN.
    fn for_f32_patterns(mut f: impl FnMut(&[f32])) {
        let step: u64 = if cfg!(debug_assertions) { 4099 } else { 1 };
        let mut at = 0u64;
        let mut buf = Vec::with_capacity(1 << 20);
        while at <= u64::from(u32::MAX) {
            buf.clear();
            while buf.len() < 1 << 20 && at <= u64::from(u32::MAX) {
                buf.push(f32::from_bits(at as u32));
                at += step;
            }
            f(&buf);
        }
        for base in [0u32, 0x3880_0000, 0x3380_0000, 0x477F_E000, 0x7F7F_FFFF, 0x7F80_0000, 0x7FC0_0000, 0x0080_0000] {
            buf.clear();
            for d in 0..=0x2_0000u32 {
                for sign in [0, 0x8000_0000] {
                    buf.push(f32::from_bits(base.wrapping_add(d).wrapping_sub(0x1_0000) | sign));
                }
            }
            f(&buf);
        }
    }

    /// Runs `check` over `items` in pieces of every length in [`LENGTHS`], then the rest in
    /// one slice, so the patterns meet both the vectors and the tails.
    fn in_pieces<T>(items: &[T], mut check: impl FnMut(&[T])) {
        let mut at = 0;
        for &len in LENGTHS.iter().cycle().take(64) {
            if at + len > items.len() {
                break;
            }
            check(&items[at..at + len]);
            at += len;
        }
        check(&items[at..]);
    }

    #[test]
    fn f16_conversions_give_halfs_bits() {
        in_each_isa(|isa| {
            let halves: Vec<f16> = all_halves().into_iter().map(f16::from_bits).collect();
            in_pieces(&halves, |src| {
                let mut got = vec![f32::NAN; src.len()];
                f16_to_f32(src, &mut got);
                for (h, g) in src.iter().zip(&got) {
                    assert_eq!(g.to_bits(), h.to_f32().to_bits(), "{isa:?} widening {:#06x}", h.to_bits());
                }
            });
            for_f32_patterns(|floats| {
                in_pieces(floats, |src| {
                    let mut got = vec![f16::from_bits(0x1234); src.len()];
                    f32_to_f16(src, &mut got);
                    for (f, g) in src.iter().zip(&got) {
                        let want = f16::from_f32(*f).to_bits();
                        assert_eq!(g.to_bits(), want, "{isa:?} rounding {:#010x}", f.to_bits());
                    }
                })
            });
        });
    }

    #[test]
    fn bf16_conversions_give_halfs_bits() {
        in_each_isa(|isa| {
            let halves: Vec<bf16> = all_halves().into_iter().map(bf16::from_bits).collect();
            in_pieces(&halves, |src| {
                let mut got = vec![f32::NAN; src.len()];
                bf16_to_f32(src, &mut got);
                for (h, g) in src.iter().zip(&got) {
                    assert_eq!(g.to_bits(), h.to_f32().to_bits(), "{isa:?} widening {:#06x}", h.to_bits());
                }
            });
            for_f32_patterns(|floats| {
                in_pieces(floats, |src| {
                    let mut got = vec![bf16::from_bits(0x1234); src.len()];
                    f32_to_bf16(src, &mut got);
                    for (f, g) in src.iter().zip(&got) {
                        let want = bf16::from_f32(*f).to_bits();
                        assert_eq!(g.to_bits(), want, "{isa:?} rounding {:#010x}", f.to_bits());
                    }
                })
            });
        });
    }
}
