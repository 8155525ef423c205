//! The backends behind [`crate::Device`].
//!
//! Each backend is one module implementing [`BackendOps`] over its own storage type. The
//! public face matches on [`Backend`] once per op (in `device.rs`); adding a backend means a
//! new module and a new arm, nothing else. Ops reach a backend already validated: shapes,
//! views, dtypes, aliasing and devices have been checked, so a backend only reports what it
//! alone can know (out of memory, a lost device, an unsupported dtype).

pub(crate) mod cpu;
pub(crate) mod cuda;
pub(crate) mod wgpu;

use crate::{BackendKind, Result};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, MatmulDesc};

/// What every backend implements. `Storage` is the backend's buffer handle; outputs are
/// written through shared references (the storage has interior mutability or is a GPU
/// buffer), and an activation's input and output may be the same storage (in place).
pub(crate) trait BackendOps {
    /// The backend's buffer type.
    type Storage;

    /// This backend's storage inside the public enum, or `None` if it is another backend's.
    fn storage_of(storage: &Storage) -> Option<&Self::Storage>;
    /// Whether ops in `dtype` can run here; `Err` says why not.
    fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<()>;
    /// A zero-filled buffer of `len` elements.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Self::Storage>;
    /// A buffer holding `bytes`, the little-endian encoding of `bytes.len() / size` elements.
    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<Self::Storage>;
    /// The buffer's contents as little-endian bytes. Waits for queued work.
    fn download(&self, storage: &Self::Storage, dtype: DType) -> Result<Vec<u8>>;
    /// See [`MatmulDesc`].
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &Self::Storage,
        b: &Self::Storage,
        bias: Option<&Self::Storage>,
        c: Option<&Self::Storage>,
        out: &Self::Storage,
    ) -> Result<()>;
    /// See [`Conv2dDesc`].
    fn depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &Self::Storage,
        weight: &Self::Storage,
        bias: Option<&Self::Storage>,
        out: &Self::Storage,
    ) -> Result<()>;
    /// See [`ActivationDesc`]. `x` and `out` may be the same storage.
    fn activation(
        &self,
        desc: &ActivationDesc,
        dtype: DType,
        x: &Self::Storage,
        bias: Option<&Self::Storage>,
        out: &Self::Storage,
    ) -> Result<()>;
    /// Copies `len` elements from `src` to `dst`: the bandwidth roof the bench compares
    /// memory-bound kernels with.
    fn copy(&self, dtype: DType, src: &Self::Storage, dst: &Self::Storage, len: usize) -> Result<()>;
    /// A deliberately naive matmul (one output per invocation, no tiling, no epilogue): a
    /// reference point for the bench. Backends without one return `Ok(false)`.
    fn naive_matmul(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &Self::Storage,
        _b: &Self::Storage,
        _out: &Self::Storage,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;
}

/// Runs `$body` with `$b` bound to the device's backend, whichever it is. The body is
/// compiled once per backend, so it may call generic code over [`BackendOps`].
macro_rules! with_backend {
    ($device:expr, $b:ident => $body:expr) => {
        match &$device.inner.backend {
            $crate::backend::Backend::Cpu($b) => $body,
            $crate::backend::Backend::Wgpu($b) => $body,
            $crate::backend::Backend::Cuda($b) => $body,
        }
    };
}
pub(crate) use with_backend;

/// The backend a device runs on.
#[derive(Debug)]
pub(crate) enum Backend {
    Cpu(cpu::CpuBackend),
    Wgpu(wgpu::WgpuBackend),
    Cuda(cuda::CudaBackend),
}

/// A buffer on one backend.
#[derive(Debug)]
pub(crate) enum Storage {
    Cpu(cpu::CpuStorage),
    Wgpu(wgpu::WgpuStorage),
    Cuda(cuda::CudaStorage),
}

impl Storage {
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Storage::Cpu(_) => BackendKind::Cpu,
            Storage::Wgpu(_) => BackendKind::Wgpu,
            Storage::Cuda(_) => BackendKind::Cuda,
        }
    }
}
