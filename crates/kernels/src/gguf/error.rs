//! The GGUF error type.

use std::path::PathBuf;

use crate::quant::QuantError;

/// What can go wrong reading a GGUF file. Offsets are byte offsets into the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, measured or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: it starts with {found:02x?}, not \"GGUF\"")]
    BadMagic {
        /// The first bytes (up to four).
        found: Vec<u8>,
    },
    /// A GGUF version other than 2 or 3 (or a big-endian file).
    #[error("GGUF version {version} is not supported (only little-endian versions 2 and 3){hint}")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
        /// An explanation where one is known.
        hint: &'static str,
    },
    /// The file ends before something it declares.
    #[error("truncated GGUF file: {what} needs bytes {offset}..{end}, the file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Where it would end.
        end: u64,
        /// The file's length.
        len: u64,
    },
    /// A field has a value the format does not allow (an unknown value type, a bool that is
    /// neither 0 nor 1, a key or tensor name that is not UTF-8, arrays nested too deep).
    #[error("malformed GGUF file at byte {offset}: {what}")]
    Malformed {
        /// What is wrong.
        what: String,
        /// Where.
        offset: u64,
    },
    /// `general.alignment` is not a non-zero power-of-two `u32`.
    #[error("general.alignment must be a non-zero power of two stored as u32, found {found}")]
    BadAlignment {
        /// The value found, as text.
        found: String,
    },
    /// The same metadata key appears twice.
    #[error("metadata key {key:?} appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// Two tensors share a name.
    #[error("tensor name {name:?} appears twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor has more than [`MAX_DIMS`](super::MAX_DIMS) dimensions.
    #[error("tensor {name:?} has {n_dims} dimensions; ggml tensors have at most 4")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// Its dimension count.
        n_dims: u32,
    },
    /// A tensor's offset is not a multiple of the file's alignment.
    #[error("tensor {name:?} starts at data offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        name: String,
        /// Its offset from the start of the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's shape does not fit its type: a row length that is not a multiple of the
    /// block size, a dimension or size beyond `usize`.
    #[error("tensor {name:?}: {source}")]
    BadShape {
        /// The tensor.
        name: String,
        /// Why.
        #[source]
        source: QuantError,
    },
    /// The tensor is stored in a type tilekit does not read.
    #[error(
        "tensor {name:?} is stored as {} (ggml type {type_id}); tilekit reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K",
        type_name.unwrap_or("an unknown type")
    )]
    UnsupportedTensorType {
        /// The tensor.
        name: String,
        /// Its ggml type id.
        type_id: u32,
        /// ggml's name for that id, if it is one ggml knows.
        type_name: Option<&'static str>,
    },
    /// No tensor has this name.
    #[error("the GGUF file has no tensor named {name:?}")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
}
