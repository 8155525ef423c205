//! The quantization error type.

use super::GgmlType;

/// What can go wrong converting between `f32` values and a [`GgmlType`]'s bytes.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The row length (the last dimension, `K`) is not a multiple of the type's block size;
    /// blocks never cross rows.
    #[error(
        "{ty}: the row length K = {k} (last dimension of shape {shape:?}) is not a multiple of the block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor type.
        ty: GgmlType,
        /// The shape, numpy order.
        shape: Vec<usize>,
        /// Its last dimension.
        k: usize,
        /// Elements per block of `ty`.
        block_size: usize,
    },
    /// A byte buffer's length does not match the shape.
    #[error("{ty} tensor of shape {shape:?} takes {expected} bytes, got {actual}")]
    ByteCount {
        /// The tensor type.
        ty: GgmlType,
        /// The shape, numpy order.
        shape: Vec<usize>,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// An `f32` buffer's length does not match the shape.
    #[error("shape {shape:?} has {expected} elements, the f32 buffer has {actual}")]
    ElementCount {
        /// The shape, numpy order.
        shape: Vec<usize>,
        /// Elements the shape has.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// The element or byte count of the shape does not fit in `usize`.
    #[error("{ty} tensor of shape {shape:?}: its size overflows usize")]
    Overflow {
        /// The tensor type.
        ty: GgmlType,
        /// The shape, numpy order.
        shape: Vec<usize>,
    },
    /// tilekit has no quantizer for this type (it dequantizes it; `Q4_K` and `Q6_K` files are
    /// made by llama.cpp's `llama-quantize`, whose importance-weighted search is not a
    /// reference quantizer).
    #[error("quantizing to {ty} is not supported (only Q8_0, Q4_0, Q4_1 and the dense types)")]
    QuantizeUnsupported {
        /// The type asked for.
        ty: GgmlType,
    },
    /// A value to quantize is NaN or infinite.
    #[error("cannot quantize to {ty}: element {index} is {value} (not finite)")]
    NonFinite {
        /// The type asked for.
        ty: GgmlType,
        /// Flat index of the value.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A block's scale (or `Q4_1` minimum) is beyond f16's range (|x| > 65504 after rounding).
    #[error("cannot quantize to {ty}: block {block} needs the {field} {value:e}, beyond f16's range (±65504)")]
    ScaleOverflow {
        /// The type asked for.
        ty: GgmlType,
        /// Flat index of the block.
        block: usize,
        /// `"scale"` or `"minimum"`.
        field: &'static str,
        /// The `f32` value that does not fit.
        value: f32,
    },
}
