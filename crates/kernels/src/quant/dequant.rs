//! Dequantization: bytes of a [`GgmlType`] to `f32`, as llama.cpp's `dequantize_row_*`.
//!
//! Each function below performs the `f32` operations of its C counterpart in the same order
//! (Rust never contracts `a * b + c` into a fused multiply-add), so the results are the same
//! bits. The comments name the C expression each line mirrors.

use bytemuck::cast_slice;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ6K, BlockQ8_0, QK, QK_K, f16_to_f32};
use super::types::element_count;
use super::{GgmlType, QuantError};

/// Dequantizes a tensor of `shape` (numpy order; the last dimension is the row, `K`) stored
/// as `ty` into a new `Vec<f32>`.
///
/// ```
/// use tilekit_kernels::quant::{GgmlType, dequantize};
///
/// // One Q8_0 block: d = 0.5 (f16 0x3800), quants 0, 1, 2, …, 31.
/// let mut block = vec![0x00, 0x38];
/// block.extend(0..32u8);
/// let x = dequantize(GgmlType::Q8_0, &block, &[1, 32])?;
/// assert_eq!(x[3], 1.5);
/// # Ok::<(), tilekit_kernels::quant::QuantError>(())
/// ```
pub fn dequantize(ty: GgmlType, data: &[u8], shape: &[usize]) -> Result<Vec<f32>, QuantError> {
    let n = check(ty, data, shape)?;
    let mut out = vec![0.0; n];
    run(ty, data, &mut out);
    Ok(out)
}

/// [`dequantize`] into a caller's buffer of exactly `shape`'s element count.
pub fn dequantize_into(ty: GgmlType, data: &[u8], shape: &[usize], out: &mut [f32]) -> Result<(), QuantError> {
    let n = check(ty, data, shape)?;
    if out.len() != n {
        return Err(QuantError::ElementCount { shape: shape.to_vec(), expected: n, actual: out.len() });
    }
    run(ty, data, out);
    Ok(())
}

/// Validates the row length and the byte count; returns the element count.
fn check(ty: GgmlType, data: &[u8], shape: &[usize]) -> Result<usize, QuantError> {
    let expected = ty.tensor_bytes(shape)?;
    if data.len() != expected {
        return Err(QuantError::ByteCount { ty, shape: shape.to_vec(), expected, actual: data.len() });
    }
    // tensor_bytes succeeded, so the element count fits.
    Ok(element_count(shape).unwrap_or(0))
}

/// Dequantizes validated input: `data` holds exactly `out.len()` elements of `ty`.
fn run(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *y = f16_to_f32([b[0], b[1]]);
            }
        }
        GgmlType::Bf16 => {
            for (y, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *y = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::Q8_0 => blocks(data, out, QK, q8_0),
        GgmlType::Q4_0 => blocks(data, out, QK, q4_0),
        GgmlType::Q4_1 => blocks(data, out, QK, q4_1),
        GgmlType::Q4K => blocks(data, out, QK_K, q4_k),
        GgmlType::Q6K => blocks(data, out, QK_K, q6_k),
    }
}

/// Applies a per-block dequantizer over validated input. Every block type has alignment 1,
/// and `data` is a whole number of blocks, so the cast cannot fail.
fn blocks<B: bytemuck::Pod>(data: &[u8], out: &mut [f32], block_size: usize, f: fn(&B, &mut [f32])) {
    let blocks: &[B] = cast_slice(data);
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(block_size)) {
        f(b, y);
    }
}

fn q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = f32::from(q) * d; // x[i].qs[j]*d
    }
}

fn q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for (j, &q) in b.qs.iter().enumerate() {
        lo[j] = (i32::from(q & 0x0F) - 8) as f32 * d; // x0*d, x0 = (qs[j] & 0x0F) - 8
        hi[j] = (i32::from(q >> 4) - 8) as f32 * d; // x1*d, x1 = (qs[j] >> 4) - 8
    }
}

fn q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for (j, &q) in b.qs.iter().enumerate() {
        lo[j] = f32::from(q & 0x0F) * d + m; // x0*d + m
        hi[j] = f32::from(q >> 4) * d + m; // x1*d + m
    }
}

fn q4_k(b: &BlockQ4K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    // Four chunks of 64 elements, each from 32 bytes of qs: low nibbles are sub-block 2c,
    // high nibbles sub-block 2c + 1.
    for (c, (q, y)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = b.scale_min(2 * c);
        let (sc2, m2) = b.scale_min(2 * c + 1);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1)); // d1 = d * sc; m1 = min * m
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * f32::from(q[l] & 0xF) - m1; // d1 * (q[l] & 0xF) - m1
            hi[l] = d2 * f32::from(q[l] >> 4) - m2; // d2 * (q[l] >> 4) - m2
        }
    }
}

fn q6_k(b: &BlockQ6K, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    // Two halves of 128 elements: 64 bytes of ql, 32 of qh and 8 scales each.
    for (h, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b.ql[64 * h..64 * h + 64];
        let qh = &b.qh[32 * h..32 * h + 32];
        let sc = &b.scales[8 * h..8 * h + 8];
        for l in 0..32 {
            let is = l / 16;
            // q = (int8_t)(low4 | high2 << 4) - 32
            let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) - 32;
            // d * sc[is + k] * q, evaluated left to right in f32.
            y[l] = d * f32::from(sc[is]) * q1 as f32;
            y[l + 32] = d * f32::from(sc[is + 2]) * q2 as f32;
            y[l + 64] = d * f32::from(sc[is + 4]) * q3 as f32;
            y[l + 96] = d * f32::from(sc[is + 6]) * q4 as f32;
        }
    }
}
