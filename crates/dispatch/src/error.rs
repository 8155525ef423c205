//! The one error type of tilekit.

use crate::{BackendKind, DType};
use std::sync::Arc;
use tilekit_kernels::gguf::GgufError;
use tilekit_kernels::quant::{GgmlType, QuantError};

/// Shorthand for `Result<T, tilekit::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a tilekit call. Each variant carries the op and the values
/// that were wrong, so a caller can report or branch on it without parsing a message.
///
/// Following wgpu's rule: what the caller can foresee (a bad shape, a bad parameter) and what
/// it cannot (out of memory, a lost device) are both errors here, never panics.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor does not have the shape the op needs.
    #[error("{op}: {tensor} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The op that was called.
        op: &'static str,
        /// Which argument.
        tensor: &'static str,
        /// The shape the op needed.
        expected: Vec<usize>,
        /// The shape it got.
        actual: Vec<usize>,
    },
    /// A tensor has the wrong number of dimensions.
    #[error("{op}: {tensor} has rank {actual}, expected {expected}")]
    WrongRank {
        /// The op that was called.
        op: &'static str,
        /// Which argument.
        tensor: &'static str,
        /// The ranks the op accepts, in words ("2 or 3").
        expected: &'static str,
        /// The rank it got.
        actual: usize,
    },
    /// A scalar or structural parameter is out of its domain (stride 0, NaN alpha, ...).
    #[error("{op}: invalid {param}: {reason}")]
    InvalidParameter {
        /// The op that was called.
        op: &'static str,
        /// The parameter's name.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Two tensors of one op have different dtypes where the op needs them equal.
    #[error("{op}: {tensor} is {actual}, expected {expected} (one storage dtype per op)")]
    DTypeMismatch {
        /// The op that was called.
        op: &'static str,
        /// Which argument.
        tensor: &'static str,
        /// The op's dtype (that of its first input).
        expected: DType,
        /// The argument's dtype.
        actual: DType,
    },
    /// The device cannot run this dtype (for example f16 without shader support).
    #[error("{op}: dtype {dtype} is not supported on the {backend} backend: {reason}")]
    UnsupportedDType {
        /// The op that was called.
        op: &'static str,
        /// The dtype asked for.
        dtype: DType,
        /// The backend asked.
        backend: BackendKind,
        /// Why not.
        reason: String,
    },
    /// A view reaches past the end of its buffer.
    #[error("{op}: {tensor} needs {needed} elements but its buffer holds {len}")]
    ViewOutOfBounds {
        /// The op that was called.
        op: &'static str,
        /// Which argument.
        tensor: &'static str,
        /// Elements the view touches (one past the last index).
        needed: usize,
        /// Elements in the buffer.
        len: usize,
    },
    /// An element count, byte count or index does not fit the types the op computes in.
    #[error("{op}: {what} overflows")]
    Overflow {
        /// The op that was called.
        op: &'static str,
        /// What overflowed.
        what: String,
    },
    /// The output shares its buffer with an input.
    #[error("{op}: the output aliases {tensor}; pass a separate output buffer")]
    Aliasing {
        /// The op that was called.
        op: &'static str,
        /// The input it aliases.
        tensor: &'static str,
    },
    /// A tensor belongs to another device.
    #[error("{op}: {tensor} lives on another device")]
    DeviceMismatch {
        /// The op that was called.
        op: &'static str,
        /// Which argument.
        tensor: &'static str,
    },
    /// Host data of the wrong length was handed in.
    #[error("host data has {actual} elements, the shape {shape:?} needs {expected}")]
    DataLength {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements handed in.
        actual: usize,
    },
    /// A backend was asked for but cannot be used here.
    #[error("the {backend} backend is not available: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: BackendKind,
        /// Why it is not available.
        reason: String,
    },
    /// `TILEKIT_BACKEND` or a backend name does not name a backend.
    #[error("unknown backend {0:?}: expected auto, cpu, wgpu or cuda")]
    UnknownBackend(String),
    /// The device was lost (driver reset, destroyed device, sticky CUDA error).
    #[error("the {backend} device was lost: {reason}")]
    DeviceLost {
        /// The backend whose device was lost.
        backend: BackendKind,
        /// What the driver said.
        reason: String,
    },
    /// An allocation failed.
    #[error("the {backend} backend is out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The backend that failed.
        backend: BackendKind,
        /// The size of the failed allocation.
        bytes: u64,
    },
    /// An engine's buffer lacks a usage tilekit needs (`Tensor::from_wgpu_buffer`).
    #[error("{op}: the buffer lacks the {usage} usage")]
    BufferUsage {
        /// The call that needed it.
        op: &'static str,
        /// The missing usage, as wgpu names it (`STORAGE`, `COPY_SRC`).
        usage: &'static str,
    },
    /// A byte offset is not a multiple of what the dtype or the device needs.
    #[error("{op}: byte offset {offset} is not a multiple of {align}")]
    MisalignedOffset {
        /// The call that was made.
        op: &'static str,
        /// The offset given, in bytes.
        offset: u64,
        /// The alignment it needs, in bytes.
        align: u64,
    },
    /// Any other error a driver or runtime reported.
    #[error("{backend} backend error: {message}")]
    Backend {
        /// The backend that failed.
        backend: BackendKind,
        /// What it said.
        message: String,
    },
    /// A quantized tensor's bytes or shape do not fit its type (a row length that is not a
    /// multiple of the block size, a byte count that does not match the shape).
    #[error(transparent)]
    Quant(QuantError),
    /// Reading a GGUF file failed (see [`GgufError`], reachable through [`SharedGgufError`]);
    /// [`Error::gguf`] makes one.
    #[error(transparent)]
    Gguf(SharedGgufError),
    /// The backend has no kernel for an op on this quantized type.
    #[error("{op}: {ty} weights are not supported on the {backend} backend: {reason}")]
    UnsupportedQuantType {
        /// The op that was called.
        op: &'static str,
        /// The weight's type.
        ty: GgmlType,
        /// The backend asked.
        backend: BackendKind,
        /// Why not.
        reason: String,
    },
}

/// A [`GgufError`] behind an `Arc`, so that [`Error`] stays `Clone` (an I/O error is not).
/// Two values are equal when they are the same error (one `Arc`).
#[derive(Debug, Clone)]
pub struct SharedGgufError(pub Arc<GgufError>);

impl SharedGgufError {
    /// The GGUF error.
    pub fn get(&self) -> &GgufError {
        &self.0
    }
}

impl PartialEq for SharedGgufError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Display for SharedGgufError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedGgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Display already shows the GGUF error itself; its cause (an I/O error) comes next.
        std::error::Error::source(&*self.0)
    }
}

// There are deliberately no `From<QuantError>` / `From<GgufError>` impls: with only the
// reflexive `From<Error>`, `?` on a closure's `Result<_, _>` infers `Error` inside tilekit (the
// wgpu backend's error scopes rely on it); a second impl makes those calls ambiguous.
impl Error {
    /// [`Error::Gguf`] from a [`GgufError`].
    pub fn gguf(e: GgufError) -> Error {
        Error::Gguf(SharedGgufError(Arc::new(e)))
    }
}
