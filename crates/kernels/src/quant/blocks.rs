//! The block layouts, byte for byte as `ggml-common.h` declares them.
//!
//! Every field is a byte array, so each block has alignment 1 and a slice of blocks can be
//! viewed in any byte buffer (a memory-mapped GGUF file, an upload staging buffer) with
//! `bytemuck::cast_slice`, whatever its address. f16 fields are little-endian bit patterns;
//! [`f16_to_f32`] widens them exactly.

use bytemuck::{Pod, Zeroable};

/// Elements per `Q8_0`, `Q4_0` and `Q4_1` block (`QK8_0`, `QK4_0`, `QK4_1`).
pub const QK: usize = 32;
/// Elements per k-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and minimums in a `Q4_K` block (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// Widens a little-endian f16 bit pattern to `f32` (exact: every f16, subnormals, infinities
/// and NaN payloads included, has an `f32` equal to it). This is `GGML_FP16_TO_FP32`.
#[inline]
pub fn f16_to_f32(bits: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bits)).to_f32()
}

/// Rounds an `f32` to the nearest-even f16 and returns its little-endian bits. This is
/// `GGML_FP32_TO_FP16` (and numpy's `astype(np.float16)`).
#[inline]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// `block_q8_0`: `y[j] = qs[j] · d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// The scale, f16.
    pub d: [u8; 2],
    /// The quants.
    pub qs: [i8; QK],
}

/// `block_q4_0`: `qs[j]` holds element `j` in its low nibble and element `j + 16` in its high
/// nibble; `y = (nibble − 8) · d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// The scale, f16.
    pub d: [u8; 2],
    /// The nibbles.
    pub qs: [u8; QK / 2],
}

/// `block_q4_1`: nibbles as in [`BlockQ4_0`]; `y = nibble · d + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// The scale, f16.
    pub d: [u8; 2],
    /// The minimum, f16.
    pub m: [u8; 2],
    /// The nibbles.
    pub qs: [u8; QK / 2],
}

/// `block_q4_K`: 8 sub-blocks of 32 elements. Sub-block `s` has a 6-bit scale `sc[s]` and a
/// 6-bit minimum `m[s]` packed in `scales` (see [`BlockQ4K::scale_min`]); its elements are
/// `d · sc[s] · q − dmin · m[s]`. Bytes `qs[32c .. 32c + 32]` hold sub-block `2c` in their low
/// nibbles and sub-block `2c + 1` in their high nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// The super-scale of the scales, f16.
    pub d: [u8; 2],
    /// The super-scale of the minimums, f16.
    pub dmin: [u8; 2],
    /// Packed 6-bit scales and minimums.
    pub scales: [u8; K_SCALE_SIZE],
    /// The nibbles.
    pub qs: [u8; QK_K / 2],
}

impl BlockQ4K {
    /// The 6-bit scale and minimum of sub-block `j` (0..8): `get_scale_min_k4`. Bytes 0–3 hold
    /// scales 0–3 in their low six bits, bytes 4–7 minimums 0–3; scales and minimums 4–7 keep
    /// their low four bits in the nibbles of bytes 8–11 and their top two bits in the top bits
    /// of bytes 0–3 (scales) and 4–7 (minimums).
    #[inline]
    pub fn scale_min(&self, j: usize) -> (u8, u8) {
        let q = &self.scales;
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
        }
    }
}

/// `block_q6_K`: 16 sub-blocks of 16 elements, each with an `i8` scale; the elements are
/// `d · scales[s] · (q − 32)` with 6-bit `q`. For each half `h` (128 elements) and `l` in
/// 0..32, with `ql = ql[64h..]`, `qh = qh[32h..]`:
/// element `l` is `ql[l] & 0xF | (qh[l] & 3) << 4`, `l + 32` is `ql[l + 32] & 0xF | (qh[l] >> 2
/// & 3) << 4`, `l + 64` is `ql[l] >> 4 | (qh[l] >> 4 & 3) << 4`, `l + 96` is `ql[l + 32] >> 4 |
/// (qh[l] >> 6) << 4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low four bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High two bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// The sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// The super-scale, f16.
    pub d: [u8; 2],
}

// The sizes ggml-common.h asserts with static_assert.
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ6K>() == 210);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;
    use std::mem::offset_of;

    #[test]
    fn layouts_match_ggml_common() {
        assert_eq!(size_of::<BlockQ8_0>(), GgmlType::Q8_0.block_bytes());
        assert_eq!(size_of::<BlockQ4_0>(), GgmlType::Q4_0.block_bytes());
        assert_eq!(size_of::<BlockQ4_1>(), GgmlType::Q4_1.block_bytes());
        assert_eq!(size_of::<BlockQ4K>(), GgmlType::Q4K.block_bytes());
        assert_eq!(size_of::<BlockQ6K>(), GgmlType::Q6K.block_bytes());
        assert_eq!((offset_of!(BlockQ4_1, m), offset_of!(BlockQ4_1, qs)), (2, 4));
        assert_eq!((offset_of!(BlockQ4K, dmin), offset_of!(BlockQ4K, scales), offset_of!(BlockQ4K, qs)), (2, 4, 16));
        assert_eq!((offset_of!(BlockQ6K, qh), offset_of!(BlockQ6K, scales), offset_of!(BlockQ6K, d)), (128, 192, 208));
        assert_eq!(align_of::<BlockQ6K>(), 1);
    }

    #[test]
    fn q4k_scale_min_unpacks_six_bits() {
        // Scales s0..s7 = 1..=8 | 0x30 on the odd ones, minimums m_j = 63 - scale.
        let sc: [u8; 8] = [1, 0x32, 3, 0x34, 5, 0x36, 7, 0x38];
        let mut packed = [0u8; 12];
        for j in 0..8 {
            let (s, m) = (sc[j], 63 - sc[j]);
            if j < 4 {
                packed[j] |= s & 63;
                packed[j + 4] |= m & 63;
            } else {
                packed[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
                packed[j - 4] |= (s >> 4) << 6;
                packed[j] |= (m >> 4) << 6;
            }
        }
        let b = BlockQ4K { d: [0; 2], dmin: [0; 2], scales: packed, qs: [0; 128] };
        for (j, &s) in sc.iter().enumerate() {
            assert_eq!(b.scale_min(j), (s, 63 - s), "sub-block {j}");
        }
    }

    #[test]
    fn f16_helpers_are_exact() {
        assert_eq!(f16_to_f32([0x01, 0x00]), 2f32.powi(-24));
        assert_eq!(f16_to_f32([0xFF, 0x7B]), 65504.0);
        assert_eq!(f32_to_f16(65504.0), [0xFF, 0x7B]);
        assert_eq!(f32_to_f16(65520.0), [0x00, 0x7C]); // the first value that rounds to inf
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), [0x00, 0x3C]); // tie to even
    }
}
