//! GGUF / llama.cpp quantized block formats on the host: the block layouts, dequantization
//! of every supported type, and llama.cpp's reference quantizers.
//!
//! A quantized tensor is a sequence of fixed-size blocks, each holding `block_size()`
//! consecutive elements of one row together with the scale(s) they share. Blocks never cross a
//! row, so a `[N, K]` weight (numpy order; GGUF's `ne0 = K`) needs `K` to be a multiple of
//! the block size and takes `N · K / block_size · block_bytes` bytes.
//!
//! | type   | elements per block | bytes | layout (see [`blocks`])                                   |
//! |--------|-------------------:|------:|------------------------------------------------------------|
//! | `Q8_0` |  32 |  34 | f16 `d`, 32 × i8: `x = q · d`                                         |
//! | `Q4_0` |  32 |  18 | f16 `d`, 16 bytes: value `j` low nibble, `j + 16` high; `x = (q − 8) · d` |
//! | `Q4_1` |  32 |  20 | f16 `d`, f16 `m`, nibbles as `Q4_0`; `x = q · d + m`                  |
//! | `Q4_K` | 256 | 144 | f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles |
//! | `Q6_K` | 256 | 210 | 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d` |
//!
//! Dense `F32`, `F16` and `BF16` tensors are [`GgmlType`]s too (block size 1).
//!
//! # Bit-exactness
//! [`dequantize`] computes every element with the same `f32` operations in the same order as
//! llama.cpp's `dequantize_row_*` and the `gguf` Python package's `gguf.quants` (the f16
//! scales widened to `f32` first, no fused multiply-add), and [`quantize`] follows
//! `quantize_row_{q8_0,q4_0,q4_1}_ref` step for step. `crates/kernels/tests/quant.rs` checks
//! both bit for bit against fixtures made with `gguf.quants`, llama.cpp's own numpy port of
//! those functions (`tests/fixtures/make_quant_fixtures.py`), including subnormal, extreme and
//! non-finite f16 scales. Each element is rounded at most once: the intermediate products (an
//! 11-bit f16 significand times integers of at most 8 bits) are exact in `f32`, so the result
//! does not depend on evaluation order or on fused multiply-adds — `tests/quant.rs` checks
//! this for Q8_0, Q4_0 and Q4_1 against an `f64` evaluation and `mul_add`.
//!
//! Where the reference has no useful answer tilekit returns an error instead:
//! quantizing a NaN or an infinity ([`QuantError::NonFinite`]), or a block whose scale (or
//! `Q4_1` minimum) does not fit in f16 ([`QuantError::ScaleOverflow`]; llama.cpp would store an
//! infinite scale that dequantizes to infinities and NaNs). Blocks of `f32` subnormals so small
//! that `1 / d` overflows have no defined result in llama.cpp (their f16 scale is zero, so they
//! dequantize to zeros whatever the quants hold); tilekit stores saturated quants there.

pub mod blocks;
mod dequant;
mod error;
mod quantize;
pub(crate) mod types;

pub use dequant::{dequantize, dequantize_into};
pub use error::QuantError;
pub use quantize::{quantize, quantize_into};
pub use types::{GgmlType, ggml_type_name};
