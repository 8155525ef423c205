//! f32 transposes in 8 × 8 blocks of AVX registers (24 shuffles per 64 elements, against 64
//! scalar loads and stores), with a bias per source row and a residual added on the way.
//!
//! `gemm` lays its problems out so that the output's contiguous dimension is its `M`
//! (`gemm-0.19`'s `do_transpose`), and packs its left operand per call; where that operand
//! is stored along `K`, the packing is a transposing gather. Several products are therefore
//! computed with the other dimension contiguous, into a buffer, and transposed into the
//! output here:
//! - the pointwise kernel's NHWC channel ranges (few pixels: MobileNetV2's 7² layers), whose
//!   weight would be that operand (`pointwise.rs`);
//! - the fused block's NHWC channel-split projection and its NCHW whole-image projection of
//!   few output channels (`block.rs`);
//! - matmuls with `B` stored `[N, K]` of at most 256 rows a call (`matmul.rs`).
//!
//! The depthwise kernel's small-plane tile (`depthwise/tile.rs`) uses [`avx::t8`] too.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::scratch;
use super::simd::Isa;
use crate::Result;
use std::cell::Cell;

thread_local! {
    /// This thread's buffer for a product before its transpose, kept between calls (taken
    /// out of its slot while in use, so a nested call allocates its own).
    static PRODUCT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `f` on this thread's product buffer of `len` elements, whose contents are left over from
/// earlier calls: the product written into it must overwrite every element it later reads.
/// An allocation failure is `Error::OutOfMemory`.
pub(super) fn with_product<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    let mut buf = PRODUCT.take();
    if buf.len() < len {
        buf = scratch(len)?;
    }
    let r = f(&mut buf[..len]);
    PRODUCT.set(buf);
    Ok(r)
}

/// What the transpose adds on the way: `bias[i]` to every element of source row `i`, and
/// the residual `res[j·ldr + i]` (laid out as the destination).
#[derive(Clone, Copy, Default)]
pub(super) struct Add<'a> {
    pub(super) bias: Option<&'a [f32]>,
    pub(super) res: Option<(&'a [f32], usize)>,
}

/// `dst[j·ldd + i] = src[i·lds + j] + add` for `i < rows`, `j < cols`.
///
/// # Safety
/// `src` holds `rows` rows of `cols` elements, `lds` apart; `dst` holds `cols` rows of `rows`
/// elements, `ldd` apart, overlapping neither `src` nor `add`'s slices; `add.bias` holds
/// `rows` elements and `add.res` `cols` rows of `rows`, `ldr` apart.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn transpose(
    isa: Isa,
    rows: usize,
    cols: usize,
    src: *const f32,
    lds: usize,
    dst: *mut f32,
    ldd: usize,
    add: Add<'_>,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    #[allow(unused_mut)]
    let (mut r8, mut c8) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
        // SAFETY: AVX2 is present (not `Portable`); the blocks lie inside the caller's bounds.
        unsafe { avx::blocks(r8, c8, src, lds, dst, ldd, add) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    // The edges the blocks left: rows past r8 for every column, columns past c8 for the rest.
    let one = |i: usize, j: usize| {
        // SAFETY: i < rows, j < cols (the callers below), the caller's bounds.
        unsafe {
            let mut v = *src.add(i * lds + j);
            if let Some(b) = add.bias {
                v += b[i];
            }
            if let Some((r, ldr)) = add.res {
                v += r[j * ldr + i];
            }
            *dst.add(j * ldd + i) = v;
        }
    };
    for j in 0..cols {
        for i in r8..rows {
            one(i, j);
        }
    }
    for j in c8..cols {
        for i in 0..r8 {
            one(i, j);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx {
    use super::Add;
    use std::arch::x86_64::*;

    /// `out[j]` lane `i` = `r[i]` lane `j`.
    #[inline]
    #[target_feature(enable = "avx")]
    pub(in crate::backend::cpu) fn t8(r: [__m256; 8]) -> [__m256; 8] {
        let a0 = _mm256_unpacklo_ps(r[0], r[1]);
        let a1 = _mm256_unpackhi_ps(r[0], r[1]);
        let a2 = _mm256_unpacklo_ps(r[2], r[3]);
        let a3 = _mm256_unpackhi_ps(r[2], r[3]);
        let a4 = _mm256_unpacklo_ps(r[4], r[5]);
        let a5 = _mm256_unpackhi_ps(r[4], r[5]);
        let a6 = _mm256_unpacklo_ps(r[6], r[7]);
        let a7 = _mm256_unpackhi_ps(r[6], r[7]);
        let b0 = _mm256_shuffle_ps::<0x44>(a0, a2);
        let b1 = _mm256_shuffle_ps::<0xEE>(a0, a2);
        let b2 = _mm256_shuffle_ps::<0x44>(a1, a3);
        let b3 = _mm256_shuffle_ps::<0xEE>(a1, a3);
        let b4 = _mm256_shuffle_ps::<0x44>(a4, a6);
        let b5 = _mm256_shuffle_ps::<0xEE>(a4, a6);
        let b6 = _mm256_shuffle_ps::<0x44>(a5, a7);
        let b7 = _mm256_shuffle_ps::<0xEE>(a5, a7);
        [
            _mm256_permute2f128_ps::<0x20>(b0, b4),
            _mm256_permute2f128_ps::<0x20>(b1, b5),
            _mm256_permute2f128_ps::<0x20>(b2, b6),
            _mm256_permute2f128_ps::<0x20>(b3, b7),
            _mm256_permute2f128_ps::<0x31>(b0, b4),
            _mm256_permute2f128_ps::<0x31>(b1, b5),
            _mm256_permute2f128_ps::<0x31>(b2, b6),
            _mm256_permute2f128_ps::<0x31>(b3, b7),
        ]
    }

    /// [`super::transpose`] over the first `r8` rows and `c8` columns (multiples of 8).
    ///
    /// # Safety
    /// AVX2 is present, and [`super::transpose`]'s bounds hold for `r8` rows and `c8` columns.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn blocks(
        r8: usize,
        c8: usize,
        src: *const f32,
        lds: usize,
        dst: *mut f32,
        ldd: usize,
        add: Add<'_>,
    ) {
        for i0 in (0..r8).step_by(8) {
            // SAFETY: 8 elements, bounds-checked by the slicing.
            let bias = add.bias.map(|b| unsafe { _mm256_loadu_ps(b[i0..i0 + 8].as_ptr()) });
            for j0 in (0..c8).step_by(8) {
                // SAFETY (loads and stores): rows i0..i0 + 8 of columns j0..j0 + 8 and the
                // transposed block lie inside the caller's bounds.
                let r: [__m256; 8] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(src.add((i0 + k) * lds + j0)) });
                for (k, mut v) in t8(r).into_iter().enumerate() {
                    let j = j0 + k;
                    if let Some(b) = bias {
                        v = _mm256_add_ps(v, b);
                    }
                    if let Some((res, ldr)) = add.res {
                        // SAFETY: 8 elements, bounds-checked by the slicing.
                        v = _mm256_add_ps(v, unsafe { _mm256_loadu_ps(res[j * ldr + i0..][..8].as_ptr()) });
                    }
                    unsafe { _mm256_storeu_ps(dst.add(j * ldd + i0), v) };
                }
            }
        }
    }
}
