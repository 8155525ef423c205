//! The CUDA backend: the PTX of `tilekit_kernels::catalogue::cuda`, loaded and launched
//! through cudarc's driver API with dynamic loading.
//!
//! - **Probe, never panic.** cudarc panics on the first driver call when `libcuda` cannot be
//!   loaded, so [`probe`] asks `is_culib_present()` first, then `cuInit`, the device count and
//!   the driver version; each failure is a reason string. [`CudaBackend::new`] also refuses a
//!   driver older than the PTX needs and a GPU older than sm_80, with the minimum named.
//! - **One context, one stream.** Every upload, launch and download goes on the backend's own
//!   stream, so work is ordered without host waits; only [`BackendOps::download`] and
//!   [`BackendOps::synchronize`] block. On tilekit's own contexts ([`CudaBackend::new`]),
//!   cudarc's per-buffer event tracking (which exists to order buffers across streams) is
//!   switched off: with one stream it only adds an event record per argument per launch.
//! - **An engine's context and stream** ([`CudaBackend::from_raw`], `Device::from_cuda`): the
//!   same, on the engine's stream; the context is left as the engine set it (event tracking,
//!   the pool's release threshold). Host waits, audited: launches take one parameter block
//!   (no cudarc slice arguments, so no event bookkeeping); allocation and free are
//!   stream-ordered (`cuMemAllocAsync`/`cuMemFreeAsync` on sm_80+, the only GPUs accepted);
//!   error mapping never calls the driver beyond `cuGetErrorName`/`String`. The one wait
//!   outside `download`/`synchronize` is an upload from pageable host memory: CUDA first
//!   waits for the work queued before it on the stream, then returns once the bytes are
//!   staged. That is tensor creation, never an op; an engine that needs uploads without a
//!   wait copies from its own pinned memory into a `CudaSlice` and imports that.
//! - **Engine memory** (`tensor_import.rs`): a buffer is tilekit's own `CudaSlice<u8>` or an
//!   engine's device address, kept alive by the engine's `CudaSlice<T>` moved into it or, for
//!   a raw pointer or a view, by the importer under an `unsafe` contract. Imports are checked
//!   16-byte aligned, as tilekit's allocations (256-byte) always are: the kernels' 16-byte
//!   vector paths assume it of every buffer start.
//! - **Modules loaded lazily, once.** The first launch of a kernel loads its PTX file as a
//!   driver module (the driver JIT-compiles it for the GPU at hand) and caches the module and
//!   the function handle; later launches take both from the caches.
//! - **Buffers** come from `cuMemAllocAsync` (cudarc uses it where the device supports memory
//!   pools, as every sm_80+ GPU does): the driver's stream-ordered pool recycles freed blocks,
//!   and its release threshold is raised so that it keeps them across synchronisations;
//!   repeated allocations of one size do not reach the OS.
//! - **Errors** become [`Error`] values: out of memory, "unsupported PTX version" (naming the
//!   minimum driver), and the sticky errors after which the context is unusable
//!   ([`Error::DeviceLost`]).
//! - **NaN and Inf** (the intended promise, the same as the CPU backend's; not yet checked on a
//!   GPU): an output that depends on a NaN is NaN, infinities follow IEEE arithmetic and
//!   `Activation::apply_f32`. The PTX is compiled without fast math, so denormals are not
//!   flushed (erf-GELU of −Inf relies on that to give −Inf).

//!
//! The module by concern: `driver.rs` (probe, driver and device checks, error mapping),
//! `buffers.rs` (device buffers, tilekit's and engines'), `launch.rs` (module and function
//! caches, launches and their geometry), `ops.rs` (the [`BackendOps`] implementation),
//! `depthwise.rs` (the depthwise convolution's launch), `quant.rs` (`matmul_quant`'s launches),
//! `block.rs` (the fused inverted-residual block).
//!
//! [`BackendOps`]: crate::backend::BackendOps
//! [`BackendOps::download`]: crate::backend::BackendOps::download
//! [`BackendOps::synchronize`]: crate::backend::BackendOps::synchronize

mod block;
mod buffers;
mod depthwise;
mod driver;
mod launch;
mod ops;
mod quant;
#[cfg(test)]
mod tests;

pub(crate) use buffers::{CudaStorage, IMPORT_ALIGN};
pub(crate) use driver::probe;

use crate::{BackendKind, Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, result};
use driver::{checked_driver_api, device_facts, keep_pool_memory, map_err};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tilekit_kernels::catalogue::cuda as cat;

const KIND: BackendKind = BackendKind::Cuda;

/// The CUDA backend on one device.
#[derive(Debug)]
pub(crate) struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    cc: (i32, i32),
    sms: u32,
    driver_api: i32,
    modules: Mutex<[Option<Arc<CudaModule>>; cat::Module::ALL.len()]>,
    /// Each loaded kernel's handle, and once asked for, the blocks of it the whole GPU holds
    /// at once (SMs × the driver's occupancy at [`cat::THREADS`] threads and the kernel's
    /// dynamic shared memory): the decode plans' wave size.
    functions: Mutex<HashMap<&'static str, (CudaFunction, Option<usize>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned cache only means a panic elsewhere while it was held; the handles in it are
    // still valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(reason: String) -> Error {
    Error::BackendUnavailable { backend: KIND, reason }
}

impl CudaBackend {
    pub(crate) fn new(ordinal: usize) -> Result<CudaBackend> {
        let found = probe().map_err(unavailable)?;
        let count = result::device::get_count().map_err(|e| map_err("cuDeviceGetCount", e))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(unavailable(format!("no CUDA device {ordinal} ({found})")));
        }
        let driver_api = checked_driver_api()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| map_err("creating the CUDA context", e))?;
        let (name, cc, sms) = device_facts(&ctx)?;
        if ctx.has_async_alloc() {
            keep_pool_memory(&ctx);
        }
        // SAFETY: every buffer of this backend is created and used on `stream` alone, so the
        // cross-stream ordering that event tracking provides is never needed (see the module
        // documentation).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| map_err("creating a CUDA stream", e))?;
        Ok(CudaBackend {
            ctx,
            stream,
            name,
            cc,
            sms,
            driver_api,
            modules: Mutex::new(Default::default()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// A backend on an engine's context and stream (`Device::from_cuda`). Unlike
    /// [`CudaBackend::new`] it changes nothing about the context (event tracking, the memory
    /// pool's release threshold stay as the engine set them).
    pub(crate) fn from_raw(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<CudaBackend> {
        if !Arc::ptr_eq(stream.context(), &ctx) {
            return Err(unavailable("the CUDA stream belongs to another context than the one handed in".into()));
        }
        // A context exists, so the driver library is loaded and initialised.
        let driver_api = checked_driver_api()?;
        let (name, cc, sms) = device_facts(&ctx)?;
        Ok(CudaBackend {
            ctx,
            stream,
            name,
            cc,
            sms,
            driver_api,
            modules: Mutex::new(Default::default()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The context this backend runs in.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch, allocation and copy of this backend goes on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// The context and stream of a CUDA device (`None` on other backends).
pub(crate) fn parts(backend: &super::Backend) -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    match backend {
        super::Backend::Cuda(b) => Some((b.context().clone(), b.stream().clone())),
        _ => None,
    }
}

/// The device address of a tensor's buffer on a CUDA device (`None` elsewhere).
pub(crate) fn address_of(device: &crate::Device, storage: &super::Storage) -> Option<u64> {
    match (&device.inner.backend, storage) {
        (super::Backend::Cuda(b), super::Storage::Cuda(s)) => Some(s.device_address(b.stream())),
        _ => None,
    }
}

/// The engine's `CudaSlice<T>` behind a buffer, taken out of it (see
/// [`CudaStorage::take_engine_slice`]).
pub(crate) fn take_slice<T: 'static>(storage: &mut super::Storage) -> Option<CudaSlice<T>> {
    match storage {
        super::Storage::Cuda(s) => s.take_engine_slice::<T>(),
        _ => None,
    }
}
