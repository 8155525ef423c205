//! [`GgmlType`]: the tensor types tilekit reads from GGUF files, with their block geometry.

use std::fmt;

use super::QuantError;
use crate::DType;

/// A GGUF tensor type tilekit supports: the three dense types and five llama.cpp block
/// quantizations. The discriminants are ggml's `enum ggml_type` values, as stored in GGUF
/// tensor infos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum GgmlType {
    /// IEEE binary32, 4 bytes per element.
    F32 = 0,
    /// IEEE binary16, 2 bytes per element.
    F16 = 1,
    /// 32 elements: an f16 scale `d` and 32 nibbles; `x = (q − 8) · d`. 18 bytes.
    Q4_0 = 2,
    /// 32 elements: f16 `d` and `m` and 32 nibbles; `x = q · d + m`. 20 bytes.
    Q4_1 = 3,
    /// 32 elements: an f16 scale `d` and 32 `i8`; `x = q · d`. 34 bytes.
    Q8_0 = 8,
    /// 256 elements in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit minimum under
    /// the f16 super-scales `d` and `dmin`; 4-bit quants. 144 bytes.
    Q4K = 12,
    /// 256 elements in 16 sub-blocks of 16, each with an `i8` scale under the f16 `d`; 6-bit
    /// quants split into low nibbles and high bit pairs. 210 bytes.
    Q6K = 14,
    /// bfloat16 (the top half of an `f32`), 2 bytes per element.
    Bf16 = 30,
}

impl GgmlType {
    /// Every supported type: the dense ones, then the quantized ones.
    pub const ALL: [GgmlType; 8] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ];

    /// The quantized types (block size above one).
    pub const QUANTIZED: [GgmlType; 5] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K, GgmlType::Q6K];

    /// The type with ggml's id `id` (`enum ggml_type`), if tilekit supports it.
    pub const fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// ggml's id for this type, as stored in a GGUF tensor info.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q4_K`, `Q6_K`.
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q6K => "Q6_K",
        }
    }

    /// Parses [`GgmlType::name`], ignoring ASCII case (`q4_k` works).
    pub fn parse(s: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// Elements per block (1 for the dense types).
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => 32,
            GgmlType::Q4K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per block (bytes per element for the dense types).
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
        }
    }

    /// Whether this is a block quantization (not F32, F16 or BF16).
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The dense storage type this is, if it is one.
    pub const fn dense_dtype(self) -> Option<DType> {
        match self {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::Bf16 => Some(DType::Bf16),
            _ => None,
        }
    }

    /// Bytes taken by a tensor of `shape` (numpy order: the last dimension is the row, GGUF's
    /// `ne0`). A rank-0 shape is one element. Errors when the row length is not a multiple
    /// of the block size, or the size overflows `usize`.
    pub fn tensor_bytes(self, shape: &[usize]) -> Result<usize, QuantError> {
        let k = shape.last().copied().unwrap_or(1);
        if k % self.block_size() != 0 {
            return Err(QuantError::RowNotBlockMultiple {
                ty: self,
                shape: shape.to_vec(),
                k,
                block_size: self.block_size(),
            });
        }
        let overflow = || QuantError::Overflow { ty: self, shape: shape.to_vec() };
        let elements = element_count(shape).ok_or_else(overflow)?;
        (elements / self.block_size()).checked_mul(self.block_bytes()).ok_or_else(overflow)
    }
}

/// The product of `shape`'s dimensions (1 for rank 0), `None` on overflow.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl From<DType> for GgmlType {
    fn from(d: DType) -> GgmlType {
        match d {
            DType::F32 => GgmlType::F32,
            DType::F16 => GgmlType::F16,
            DType::Bf16 => GgmlType::Bf16,
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every `enum ggml_type` id ggml knows, with its name, elements per block and bytes per block
/// (from `ggml.h` and the `gguf` package's `GGML_QUANT_SIZES`). tilekit reads only the
/// [`GgmlType`]s; the rest are here so a GGUF file's other tensors can still be bounds-checked
/// and named in errors.
const GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

/// ggml's name for any `enum ggml_type` id, supported by tilekit or not (for messages about
/// tensors tilekit does not read).
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    GGML_TYPES.iter().find(|t| t.0 == id).map(|t| t.1)
}

/// Elements and bytes per block of any `enum ggml_type` id ggml knows.
pub(crate) fn ggml_block_geometry(id: u32) -> Option<(usize, usize)> {
    GGML_TYPES.iter().find(|t| t.0 == id).map(|t| (t.2, t.3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_parse_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(ggml_type_name(t.id()), Some(t.name()));
            assert_eq!(GgmlType::parse(t.name()), Some(t));
            assert_eq!(GgmlType::parse(&t.name().to_lowercase()), Some(t));
        }
        assert_eq!(GgmlType::from_id(6), None); // Q5_0: known to ggml, not supported here
        assert_eq!(ggml_type_name(6), Some("Q5_0"));
        assert_eq!(ggml_type_name(4), None); // ids 4 and 5 were removed from ggml
    }

    #[test]
    fn the_ggml_table_agrees_with_the_supported_types() {
        for t in GgmlType::ALL {
            assert_eq!(ggml_block_geometry(t.id()), Some((t.block_size(), t.block_bytes())), "{t}");
        }
    }

    #[test]
    fn tensor_bytes_checks_the_row_length() {
        assert_eq!(GgmlType::Q4K.tensor_bytes(&[3, 512]), Ok(3 * 2 * 144));
        assert_eq!(GgmlType::F16.tensor_bytes(&[3, 5]), Ok(30));
        assert_eq!(GgmlType::F32.tensor_bytes(&[]), Ok(4));
        assert_eq!(GgmlType::Q8_0.tensor_bytes(&[0, 64]), Ok(0));
        assert_eq!(GgmlType::Q8_0.tensor_bytes(&[5, 0]), Ok(0));
        assert!(matches!(
            GgmlType::Q8_0.tensor_bytes(&[4, 48]),
            Err(QuantError::RowNotBlockMultiple { k: 48, block_size: 32, .. })
        ));
        assert!(matches!(GgmlType::Q8_0.tensor_bytes(&[]), Err(QuantError::RowNotBlockMultiple { .. })));
        assert!(matches!(GgmlType::Q6K.tensor_bytes(&[usize::MAX / 2, 256]), Err(QuantError::Overflow { .. })));
    }
}
