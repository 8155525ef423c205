//! [`QTensor`]: a quantized weight matrix `[N, K]` (GGUF / llama.cpp block formats) on a device.
//!
//! # Storage: two planes of 32-bit words
//! A GGUF block is 18, 20, 34, 144 or 210 bytes, so a run of raw blocks cannot be read as
//! aligned `u32` words (WGSL has no byte loads). Every backend therefore stores a quantized
//! tensor the same way, split on upload (once, on the host) into two planes:
//!
//! | type   | scale plane, per block                  | body plane, per block                     |
//! |--------|-----------------------------------------|-------------------------------------------|
//! | `Q8_0` | f16 `d` (2 bytes; two blocks per word)  | 32 × i8 quants (8 words)                  |
//! | `Q4_0` | f16 `d` (2 bytes)                       | 16 bytes of nibbles (4 words)             |
//! | `Q4_1` | f16 `d`, f16 `m` (one word)             | 16 bytes of nibbles (4 words)             |
//! | `Q4_K` | f16 `d`, f16 `dmin` (one word)          | 12 bytes of 6-bit scales + 128 of nibbles (35 words) |
//! | `Q6_K` | f16 `d` (2 bytes)                       | `ql`, `qh`, `scales` (208 bytes, 52 words) |
//!
//! Block `g` (row-major over `[N, K / block_size]`) has its scale bytes at
//! `g · scale_bytes` in the scale plane and its body at `g · body_bytes` in the body plane;
//! both planes hold the bytes in their GGUF order (little-endian), padded with zeros to a whole
//! number of words. Together they take exactly the bytes of the GGUF blocks (plus at most 6
//! bytes of padding). Each plane is an ordinary device buffer of `u32` words (kept as a 4-byte
//! storage type; kernels only ever reinterpret its bits), so allocation, counting of live bytes
//! and device checks work as for [`Tensor`]s.

use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::gguf::GgufTensor;
use tilekit_kernels::quant::{GgmlType, QuantError};

/// How a quantized type's block splits into the two planes: bytes of the scale plane and of the
/// body plane per block, and whether the scales come first in the GGUF block (all but `Q6_K`,
/// whose f16 `d` is its last two bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlaneGeometry {
    pub(crate) scale_bytes: usize,
    pub(crate) body_bytes: usize,
    pub(crate) scales_first: bool,
}

impl PlaneGeometry {
    /// The split of `ty`'s blocks, or `None` for a dense type.
    pub(crate) const fn of(ty: GgmlType) -> Option<PlaneGeometry> {
        let (scale_bytes, body_bytes, scales_first) = match ty {
            GgmlType::Q8_0 => (2, 32, true),
            GgmlType::Q4_0 => (2, 16, true),
            GgmlType::Q4_1 => (4, 16, true),
            GgmlType::Q4K => (4, 140, true),
            GgmlType::Q6K => (2, 208, false),
            _ => return None,
        };
        Some(PlaneGeometry { scale_bytes, body_bytes, scales_first })
    }
}

/// A quantized weight matrix `[N, K]` on a device: the B operand of [`Device::matmul_quant`].
///
/// Made from raw GGUF block bytes ([`Device::quant_tensor`]) or straight from a GGUF file's
/// tensor ([`Device::quant_tensor_from_gguf`]). The shape is in numpy order, as GGUF weights
/// are stored (`ne0 = K` is the contiguous dimension): row `n` holds the `K` weights of output
/// column `n`. `Clone` shares the device buffers.
#[derive(Clone, Debug)]
pub struct QTensor {
    pub(crate) ty: GgmlType,
    pub(crate) shape: [usize; 2],
    pub(crate) scales: Tensor,
    pub(crate) body: Tensor,
}

impl QTensor {
    /// The block format.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// `[N, K]`.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> &Device {
        self.scales.device()
    }

    /// The tensor's GGUF block bytes, reassembled from the device planes (waits for queued
    /// work). `quant_tensor(ty, shape, &q.to_gguf_bytes()?)` gives the same tensor back.
    pub fn to_gguf_bytes(&self) -> Result<Vec<u8>> {
        let g = self.geometry()?;
        let scales = self.scales.to_bytes()?;
        let body = self.body.to_bytes()?;
        let blocks = self.shape[0] * (self.shape[1] / self.ty.block_size());
        let mut out = Vec::with_capacity(blocks * self.ty.block_bytes());
        for b in 0..blocks {
            let s = scales.get(b * g.scale_bytes..(b + 1) * g.scale_bytes);
            let q = body.get(b * g.body_bytes..(b + 1) * g.body_bytes);
            let (Some(s), Some(q)) = (s, q) else {
                return Err(Error::Backend {
                    backend: self.device().kind(),
                    message: "a quantized tensor's planes are shorter than its shape".into(),
                });
            };
            if g.scales_first {
                out.extend_from_slice(s);
                out.extend_from_slice(q);
            } else {
                out.extend_from_slice(q);
                out.extend_from_slice(s);
            }
        }
        Ok(out)
    }

    pub(crate) fn geometry(&self) -> Result<PlaneGeometry> {
        PlaneGeometry::of(self.ty).ok_or_else(|| not_quantized("quant_tensor", self.ty))
    }
}

fn not_quantized(op: &'static str, ty: GgmlType) -> Error {
    Error::InvalidParameter {
        op,
        param: "type",
        reason: format!("{ty} is a dense type: upload it as an ordinary tensor (Device::tensor_from_f32)"),
    }
}

/// Splits validated GGUF blocks into the scale and body planes, each padded to whole words.
pub(crate) fn split_planes(g: PlaneGeometry, block_bytes: usize, bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let blocks = bytes.len() / block_bytes;
    let words = |n: usize| n.div_ceil(4).max(1) * 4;
    let mut scales = Vec::with_capacity(words(blocks * g.scale_bytes));
    let mut body = Vec::with_capacity(words(blocks * g.body_bytes));
    for blk in bytes.chunks_exact(block_bytes) {
        let (s, q) = if g.scales_first {
            (&blk[..g.scale_bytes], &blk[g.scale_bytes..])
        } else {
            (&blk[g.body_bytes..], &blk[..g.body_bytes])
        };
        scales.extend_from_slice(s);
        body.extend_from_slice(q);
    }
    scales.resize(words(scales.len()), 0);
    body.resize(words(body.len()), 0);
    (scales, body)
}

impl Device {
    /// Uploads a quantized weight matrix of `shape = [N, K]` from its GGUF block bytes
    /// (`N · K / block_size` blocks, row after row, as in a GGUF file).
    ///
    /// Errors: a dense `ty` ([`Error::InvalidParameter`]), a shape that is not rank 2
    /// ([`Error::WrongRank`]), `K` not a multiple of the block size or a byte count that does
    /// not match the shape ([`Error::Quant`]).
    ///
    /// ```
    /// use tilekit::quant::{GgmlType, quantize};
    /// use tilekit::{DType, Device, MatmulOptions};
    ///
    /// let dev = Device::cpu();
    /// let w: Vec<f32> = (0..3 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
    /// let q = dev.quant_tensor(GgmlType::Q8_0, &[3, 64], &quantize(GgmlType::Q8_0, &w, &[3, 64])?)?;
    /// let x = dev.tensor_from_f32(&[1, 64], DType::F32, &[1.0; 64])?;
    /// let y = dev.matmul_quant(&x, &q, &MatmulOptions::default().trans_b(true))?;
    /// assert_eq!(y.shape(), &[1, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quant_tensor(&self, ty: GgmlType, shape: &[usize], bytes: &[u8]) -> Result<QTensor> {
        let Some(g) = PlaneGeometry::of(ty) else {
            return Err(not_quantized("quant_tensor", ty));
        };
        let &[n, k] = shape else {
            return Err(Error::WrongRank { op: "quant_tensor", tensor: "shape", expected: "2", actual: shape.len() });
        };
        let expected = ty.tensor_bytes(shape).map_err(Error::Quant)?;
        if bytes.len() != expected {
            return Err(Error::Quant(QuantError::ByteCount {
                ty,
                shape: shape.to_vec(),
                expected,
                actual: bytes.len(),
            }));
        }
        let (s, q) = split_planes(g, ty.block_bytes(), bytes);
        let to_words = |v: &[u8]| bytemuck::pod_collect_to_vec::<u8, f32>(v);
        let scales = self.tensor(&[s.len() / 4], &to_words(&s))?;
        let body = self.tensor(&[q.len() / 4], &to_words(&q))?;
        Ok(QTensor { ty, shape: [n, k], scales, body })
    }

    /// [`Device::quant_tensor`] from a tensor of a GGUF file (which must be quantized and of
    /// rank 2; dense GGUF tensors are ordinary [`Tensor`]s).
    pub fn quant_tensor_from_gguf(&self, t: &GgufTensor<'_>) -> Result<QTensor> {
        if t.shape().len() != 2 {
            return Err(Error::WrongRank {
                op: "quant_tensor_from_gguf",
                tensor: "the GGUF tensor",
                expected: "2",
                actual: t.shape().len(),
            });
        }
        self.quant_tensor(t.ggml_type(), t.shape(), t.data())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn planes_hold_every_block_byte_once() {
        for ty in GgmlType::QUANTIZED {
            let g = PlaneGeometry::of(ty).unwrap();
            assert_eq!(g.scale_bytes + g.body_bytes, ty.block_bytes(), "{ty}");
            assert_eq!(g.body_bytes % 4, 0, "{ty}: the body must be whole words");
            let bytes: Vec<u8> = (0..3 * ty.block_bytes()).map(|i| (i * 7 + 3) as u8).collect();
            let dev = Device::cpu();
            let shape = [3, ty.block_size()];
            let q = dev.quant_tensor(ty, &shape, &bytes).unwrap();
            assert_eq!(q.to_gguf_bytes().unwrap(), bytes, "{ty}");
        }
    }

    #[test]
    fn bad_quantized_inputs_are_typed_errors() {
        let dev = Device::cpu();
        let ty = GgmlType::Q4_0;
        assert!(matches!(
            dev.quant_tensor(ty, &[2, 48], &[0; 54]),
            Err(Error::Quant(QuantError::RowNotBlockMultiple { k: 48, .. }))
        ));
        assert!(matches!(
            dev.quant_tensor(ty, &[2, 64], &[0; 71]),
            Err(Error::Quant(QuantError::ByteCount { expected: 72, actual: 71, .. }))
        ));
        assert!(matches!(dev.quant_tensor(ty, &[64], &[0; 36]), Err(Error::WrongRank { .. })));
        assert!(matches!(dev.quant_tensor(GgmlType::F16, &[2, 2], &[0; 8]), Err(Error::InvalidParameter { .. })));
    }
}
