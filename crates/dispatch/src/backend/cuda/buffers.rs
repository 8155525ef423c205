//! Device buffers: tilekit's own allocations and engines' memory.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// A device buffer. `bytes` is the size asked for; the allocation may be larger (never empty).
#[derive(Debug)]
pub(crate) struct CudaStorage {
    pub(super) mem: CudaMem,
    pub(super) bytes: usize,
}

/// Where a buffer's memory comes from.
pub(super) enum CudaMem {
    /// Allocated by tilekit on the backend's stream.
    Own(CudaSlice<u8>),
    /// An engine's memory: `ptr` is its device address (16-byte aligned, checked at import).
    /// `keep` holds the engine's `CudaSlice<T>` when it was handed over by value (so it is freed
    /// with the tensor, on its own stream, or given back by `take_engine_slice`); `None` for a
    /// raw pointer or a view, whose owner keeps the memory alive (the `unsafe` contract).
    Engine { ptr: u64, keep: Option<Box<dyn std::any::Any + Send + Sync>> },
}

impl std::fmt::Debug for CudaMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaMem::Own(b) => f.debug_tuple("Own").field(&b.len()).finish(),
            CudaMem::Engine { ptr, keep } => f
                .debug_struct("Engine")
                .field("ptr", &format_args!("{ptr:#x}"))
                .field("owned", &keep.is_some())
                .finish(),
        }
    }
}

/// The alignment tilekit's kernels assume of every buffer start (16-byte vector loads).
pub(crate) const IMPORT_ALIGN: u64 = 16;

impl CudaStorage {
    /// A buffer over an engine's device memory: `bytes` at `ptr`, kept alive by `keep` or by
    /// the caller (see [`CudaMem::Engine`]).
    pub(crate) fn engine(ptr: u64, bytes: usize, keep: Option<Box<dyn std::any::Any + Send + Sync>>) -> CudaStorage {
        CudaStorage { mem: CudaMem::Engine { ptr, keep }, bytes }
    }

    /// The engine's `CudaSlice<T>` this buffer was made from, handed back (`None` when it was
    /// not made from a `CudaSlice<T>` of this `T`, or was already taken).
    pub(crate) fn take_engine_slice<T: 'static>(&mut self) -> Option<CudaSlice<T>> {
        let CudaMem::Engine { keep, .. } = &mut self.mem else { return None };
        if !keep.as_ref().is_some_and(|k| k.is::<CudaSlice<T>>()) {
            return None;
        }
        keep.take().and_then(|k| k.downcast::<CudaSlice<T>>().ok()).map(|b| *b)
    }

    /// The device address of the first element, for engines.
    pub(crate) fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        match &self.mem {
            CudaMem::Own(b) => b.device_ptr(stream).0,
            CudaMem::Engine { ptr, .. } => *ptr,
        }
    }
}
