//! Quantization: `f32` to the bytes of a [`GgmlType`], as llama.cpp's reference quantizers
//! `quantize_row_{q8_0,q4_0,q4_1}_ref` (the "deterministic creation of model files" path, also
//! what the `gguf` Python package implements), plus the dense conversions.

use bytemuck::cast_slice_mut;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK, f32_to_f16};
use super::types::element_count;
use super::{GgmlType, QuantError};

/// Quantizes `values`, a tensor of `shape` (numpy order; the last dimension is the row, `K`),
/// to `ty`: byte for byte what llama.cpp's reference quantizer writes for `Q8_0`, `Q4_0` and
/// `Q4_1`; round-to-nearest-even for `F16` and `BF16` (NaN kept quiet, as `ggml`); the
/// little-endian bytes for `F32`.
///
/// Errors: the row length is not a multiple of the block size, `values` does not hold
/// `shape`'s element count, `ty` is `Q4_K` or `Q6_K` (no reference quantizer), a value to
/// block-quantize is not finite, or a block's scale (or `Q4_1` minimum) is beyond f16's range.
///
/// ```
/// use tilekit_kernels::quant::{GgmlType, dequantize, quantize};
///
/// let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
/// let q = quantize(GgmlType::Q8_0, &x, &[2, 32])?;
/// assert_eq!(q.len(), 2 * 34);
/// let y = dequantize(GgmlType::Q8_0, &q, &[2, 32])?;
/// assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= 4.0 / 127.0 / 2.0 * 1.01));
/// # Ok::<(), tilekit_kernels::quant::QuantError>(())
/// ```
pub fn quantize(ty: GgmlType, values: &[f32], shape: &[usize]) -> Result<Vec<u8>, QuantError> {
    let bytes = check(ty, values, shape)?;
    let mut out = vec![0u8; bytes];
    run(ty, values, &mut out)?;
    Ok(out)
}

/// [`quantize`] into a caller's buffer of exactly the tensor's byte count. On an error the
/// buffer's contents are unspecified.
pub fn quantize_into(ty: GgmlType, values: &[f32], shape: &[usize], out: &mut [u8]) -> Result<(), QuantError> {
    let bytes = check(ty, values, shape)?;
    if out.len() != bytes {
        return Err(QuantError::ByteCount { ty, shape: shape.to_vec(), expected: bytes, actual: out.len() });
    }
    run(ty, values, out)
}

/// Validates the type, the row length and the element count; returns the byte count.
fn check(ty: GgmlType, values: &[f32], shape: &[usize]) -> Result<usize, QuantError> {
    if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
        return Err(QuantError::QuantizeUnsupported { ty });
    }
    let bytes = ty.tensor_bytes(shape)?;
    let n = element_count(shape).unwrap_or(0); // tensor_bytes succeeded, so it fits
    if values.len() != n {
        return Err(QuantError::ElementCount { shape: shape.to_vec(), expected: n, actual: values.len() });
    }
    Ok(bytes)
}

/// Quantizes validated input: `out` holds exactly `values.len()` elements of `ty`.
fn run(ty: GgmlType, values: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    match ty {
        GgmlType::F32 => {
            for (b, x) in out.chunks_exact_mut(4).zip(values) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (b, &x) in out.chunks_exact_mut(2).zip(values) {
                b.copy_from_slice(&f32_to_f16(x));
            }
        }
        GgmlType::Bf16 => {
            for (b, &x) in out.chunks_exact_mut(2).zip(values) {
                b.copy_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q8_0 => blocks(ty, values, out, q8_0)?,
        GgmlType::Q4_0 => blocks(ty, values, out, q4_0)?,
        GgmlType::Q4_1 => blocks(ty, values, out, q4_1)?,
        GgmlType::Q4K | GgmlType::Q6K => return Err(QuantError::QuantizeUnsupported { ty }),
    }
    Ok(())
}

/// Why a block could not be quantized: which field, and its value.
struct Overflow(&'static str, f32);

/// Applies a per-block quantizer over validated input after checking every value is finite.
/// Every block type has alignment 1 and `out` is a whole number of blocks, so the cast cannot
/// fail.
fn blocks<B: bytemuck::Pod>(
    ty: GgmlType,
    values: &[f32],
    out: &mut [u8],
    f: fn(&[f32], &mut B) -> Result<(), Overflow>,
) -> Result<(), QuantError> {
    if let Some(index) = values.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite { ty, index, value: values[index] });
    }
    let blocks: &mut [B] = cast_slice_mut(out);
    for (block, (b, x)) in blocks.iter_mut().zip(values.chunks_exact(QK)).enumerate() {
        f(x, b).map_err(|Overflow(field, value)| QuantError::ScaleOverflow { ty, block, field, value })?;
    }
    Ok(())
}

/// Rounds a scale to f16, refusing one that becomes infinite.
fn scale_f16(x: f32, field: &'static str) -> Result<[u8; 2], Overflow> {
    let bits = f32_to_f16(x);
    if half::f16::from_bits(u16::from_le_bytes(bits)).is_finite() { Ok(bits) } else { Err(Overflow(field, x)) }
}

/// `quantize_row_q8_0_ref`.
fn q8_0(x: &[f32], y: &mut BlockQ8_0) -> Result<(), Overflow> {
    // amax = MAX(amax, fabsf(v)), MAX(a, b) = a > b ? a : b
    let amax = x.iter().fold(0.0f32, |amax, v| if amax > v.abs() { amax } else { v.abs() });
    let d = amax / 127.0; // amax / ((1 << 7) - 1)
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = scale_f16(d, "scale")?;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        // roundf(x*id), half away from zero; `as` saturates where C's conversion would be
        // undefined (only when 1/d overflowed, and then d is 0 in f16).
        *q = (v * id).round() as i8;
    }
    Ok(())
}

/// `quantize_row_q4_0_ref`.
fn q4_0(x: &[f32], y: &mut BlockQ4_0) -> Result<(), Overflow> {
    // The value of largest magnitude, its first occurrence (a strict `<`).
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = scale_f16(d, "scale")?;
    for j in 0..QK / 2 {
        // MIN(15, (int8_t)(x*id + 8.5f)): truncation toward zero.
        let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let x1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        y.qs[j] = x0 | (x1 << 4);
    }
    Ok(())
}

/// `quantize_row_q4_1_ref`.
fn q4_1(x: &[f32], y: &mut BlockQ4_1) -> Result<(), Overflow> {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0; // (max - min) / ((1 << 4) - 1)
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = scale_f16(d, "scale")?;
    y.m = scale_f16(min, "minimum")?;
    for j in 0..QK / 2 {
        // MIN(15, (int8_t)((x - min)*id + 0.5f))
        let x0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let x1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
        y.qs[j] = x0 | (x1 << 4);
    }
    Ok(())
}
