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
