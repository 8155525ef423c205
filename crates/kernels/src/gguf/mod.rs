//! A GGUF reader: header, metadata, tensor infos and memory-mapped tensor data.
//!
//! GGUF is llama.cpp's model file format (versions 2 and 3 read here; both little-endian):
//!
//! ```text
//! "GGUF" | version u32 | tensor count u64 | metadata count u64
//! metadata: key (u64 length + UTF-8) | value type u32 | value      (arrays: type u32, count u64, values)
//! tensor infos: name | n_dims u32 | ne[n_dims] u64 | ggml type u32 | offset u64 (from the data section)
//! padding to `general.alignment` (default 32) | data section: each tensor at an aligned offset
//! ```
//!
//! [`GgufFile::open`] maps the file and validates all of it up front — magic, version, every
//! metadata value, the alignment, every tensor's dimensions, offset alignment and bounds — so
//! a truncated or corrupted file fails there with a typed [`GgufError`], and
//! [`GgufFile::tensor`] then hands out a tensor's name, [`GgmlType`], shape and raw bytes
//! without copying. Shapes are in numpy order: a weight stored with `ne = [K, N]` (GGUF's
//! `ne0` is the contiguous dimension) has shape `[N, K]`.
//!
//! ```no_run
//! use tilekit_kernels::gguf::GgufFile;
//!
//! let file = GgufFile::open("model.gguf")?;
//! let w = file.tensor("blk.0.ffn_up.weight")?;
//! println!("{} {:?} {}: {} bytes", w.name(), w.shape(), w.ggml_type(), w.data().len());
//! let values: Vec<f32> = w.dequantize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why a reader of its own: the GGUF crates on crates.io (evaluated 2026-11: `gguf-rs` 0.1.8,
//! `gguf-rs-lib` 0.3.3, `ggus` 0.5.1, `gguf` 0.1.2; `candle-core`'s `gguf_file`) either pull
//! command-line or framework dependencies into the library, return untyped errors, or do not
//! hand out borrowed tensor bytes from a map; the format needs about 300 lines over `memmap2`.
//!
//! [`GgmlType`]: crate::quant::GgmlType

mod error;
mod file;
mod metadata;
mod parse;

pub use error::GgufError;
pub use file::{GgufFile, GgufTensor, TensorInfo};
pub use metadata::MetadataValue;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the data-section alignment (a `u32`, a power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
