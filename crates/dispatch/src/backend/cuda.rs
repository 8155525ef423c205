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

use super::BackendOps;
use crate::{BackendKind, Error, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, result, sys,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tilekit_kernels::catalogue::cuda::{self as cat, Kernel, Module};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, GluDesc, Layout, MatmulDesc, MatrixView};

mod depthwise;

const KIND: BackendKind = BackendKind::Cuda;

/// Looks for a usable CUDA driver and device without ever panicking. `Ok` describes what was
/// found; `Err` says why CUDA cannot be used.
pub(crate) fn probe() -> std::result::Result<String, String> {
    // SAFETY: `is_culib_present` only tries to open the driver library by its usual names; it
    // calls nothing inside it.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1 / nvcuda.dll) could be loaded".into());
    }
    // From here on the library is loaded, so cudarc's lazily bound driver calls cannot hit its
    // "library not found" panic.
    result::init().map_err(|e| format!("the CUDA driver did not initialise: {}", describe(e)))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
    if count <= 0 {
        return Err("the CUDA driver is installed but reports no device".into());
    }
    let api = driver_api_version().map_err(|e| format!("cuDriverGetVersion failed: {}", describe(e)))?;
    Ok(format!("{count} CUDA device(s), driver API {}", version_string(api)))
}

/// `cuDriverGetVersion`: the newest CUDA version the driver supports, as 1000·major + 10·minor.
fn driver_api_version() -> std::result::Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: the driver library is loaded (the caller checked) and `v` is a valid out pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

fn version_string(api: i32) -> String {
    format!("{}.{}", api / 1000, (api % 1000) / 10)
}

/// The driver's name and message for an error code.
fn describe(e: DriverError) -> String {
    // Asking the driver for the text needs the driver library; without it (an error built by
    // hand, or a machine without CUDA) cudarc would panic, so the number has to do.
    // SAFETY: `is_culib_present` only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return format!("CUDA error {}", e.0 as u32);
    }
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("CUDA error {}", e.0 as u32),
    }
}

/// Errors after which the context can run nothing more (CUDA's "sticky" errors).
fn is_sticky(e: &DriverError) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        e.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | E::CUDA_ERROR_DEINITIALIZED
    )
}

/// Maps a driver error met while doing `what` into tilekit's error.
fn map_err(what: &str, e: DriverError) -> Error {
    use sys::cudaError_enum as E;
    match e.0 {
        E::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory { backend: KIND, bytes: 0 },
        E::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => Error::BackendUnavailable {
            backend: KIND,
            reason: format!(
                "{what}: the NVIDIA driver is too old for tilekit's PTX (ISA {}); it needs driver {} or newer",
                cat::PTX_ISA,
                cat::MIN_DRIVER
            ),
        },
        E::CUDA_ERROR_NO_BINARY_FOR_GPU | E::CUDA_ERROR_INVALID_PTX => Error::BackendUnavailable {
            backend: KIND,
            reason: format!(
                "{what}: the driver could not compile tilekit's PTX for this GPU ({}); the kernels need compute \
                 capability {}.{}+ and driver {}+",
                describe(e),
                cat::MIN_COMPUTE_CAPABILITY.0,
                cat::MIN_COMPUTE_CAPABILITY.1,
                cat::MIN_DRIVER
            ),
        },
        _ if is_sticky(&e) => Error::DeviceLost {
            backend: KIND,
            reason: format!(
                "{what}: {} (a sticky error: this CUDA context can run nothing more; create a new device)",
                describe(e)
            ),
        },
        _ => Error::Backend { backend: KIND, message: format!("{what}: {}", describe(e)) },
    }
}

/// A kernel parameter block passed by value. The blocks are plain `#[repr(C)]` data mirrored
/// in `shaders/cuda/common.cuh`; this wrapper lets cudarc push them as one argument.
#[repr(transparent)]
struct KernelArg<T>(T);

// SAFETY: `T` is `Pod` (no pointers the host owns, no padding), `#[repr(transparent)]` keeps
// its layout, and the catalogue's tests check each block's size against the PTX's declared
// parameter size.
unsafe impl<T: bytemuck::Pod> DeviceRepr for KernelArg<T> {}

/// A device buffer. `bytes` is the size asked for; the allocation may be larger (never empty).
#[derive(Debug)]
pub(crate) struct CudaStorage {
    mem: CudaMem,
    bytes: usize,
}

/// Where a buffer's memory comes from.
enum CudaMem {
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
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned cache only means a panic elsewhere while it was held; the handles in it are
    // still valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unavailable(reason: String) -> Error {
    Error::BackendUnavailable { backend: KIND, reason }
}

fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v} (the CUDA kernels take i32)") })
}

fn to_i64(op: &'static str, what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v}") })
}

/// Blocks for a grid-stride loop over `items` thread work items: enough for every item, capped
/// at 32 blocks per SM (a few full waves; more only adds scheduling overhead).
fn stride_blocks(items: u64, sms: u32) -> u32 {
    let needed = items.div_ceil(u64::from(cat::THREADS)).max(1);
    needed.min(u64::from(sms.max(1)) * 32).min(u64::from(u32::MAX)) as u32
}

/// Lets the device's default memory pool (behind `cuMemAllocAsync`) keep freed memory
/// instead of returning it to the driver at every synchronisation (its default release
/// threshold is 0), so a steady stream of same-sized temporaries is served from the pool.
/// Best effort: on failure the pool simply keeps its default.
fn keep_pool_memory(ctx: &CudaContext) {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver is loaded and initialised (the context exists); `pool` is a valid out
    // pointer and `cu_device` a device of this driver.
    let got = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if got.result().is_err() || pool.is_null() {
        return;
    }
    let mut threshold = u64::MAX;
    // SAFETY: `pool` came from the driver above; the release threshold attribute takes a
    // pointer to a u64, which `threshold` is and which outlives the call.
    let _ = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
}

/// The driver's CUDA API version, refused below what tilekit's PTX needs.
fn checked_driver_api() -> Result<i32> {
    let driver_api = driver_api_version().map_err(|e| map_err("cuDriverGetVersion", e))?;
    if driver_api < cat::MIN_DRIVER_API {
        return Err(unavailable(format!(
            "the NVIDIA driver supports CUDA {}, but tilekit's PTX (ISA {}) needs CUDA {}: driver {} or newer",
            version_string(driver_api),
            cat::PTX_ISA,
            version_string(cat::MIN_DRIVER_API),
            cat::MIN_DRIVER
        )));
    }
    Ok(driver_api)
}

/// The context's device name, compute capability (refused below tilekit's minimum) and
/// multiprocessor count.
fn device_facts(ctx: &CudaContext) -> Result<(String, (i32, i32), u32)> {
    let cc = ctx.compute_capability().map_err(|e| map_err("cuDeviceGetAttribute", e))?;
    let name = ctx.name().map_err(|e| map_err("cuDeviceGetName", e))?;
    if cc < cat::MIN_COMPUTE_CAPABILITY {
        return Err(unavailable(format!(
            "{name} has compute capability {}.{}; tilekit's CUDA kernels need {}.{} or newer",
            cc.0,
            cc.1,
            cat::MIN_COMPUTE_CAPABILITY.0,
            cat::MIN_COMPUTE_CAPABILITY.1
        )));
    }
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| map_err("cuDeviceGetAttribute", e))?;
    Ok((name, cc, u32::try_from(sms).unwrap_or(1)))
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

    /// The function handle of `kernel`, loading its module on first use.
    fn function(&self, kernel: Kernel) -> Result<CudaFunction> {
        if let Some(f) = lock(&self.functions).get(kernel.entry) {
            return Ok(f.clone());
        }
        let module = self.module(kernel.module)?;
        let f =
            module.load_function(kernel.entry).map_err(|e| map_err(&format!("loading kernel {}", kernel.entry), e))?;
        lock(&self.functions).insert(kernel.entry, f.clone());
        Ok(f)
    }

    fn module(&self, m: Module) -> Result<Arc<CudaModule>> {
        // The lock is held across the load so that two threads never JIT the same module twice.
        let mut modules = lock(&self.modules);
        if let Some(module) = &modules[m.index()] {
            return Ok(module.clone());
        }
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(m.ptx()))
            .map_err(|e| map_err(&format!("loading PTX module {}", m.name()), e))?;
        modules[m.index()] = Some(module.clone());
        Ok(module)
    }

    /// The device address of a buffer.
    fn ptr(&self, s: &CudaStorage) -> u64 {
        // On tilekit's own contexts event tracking is off, so the guard records nothing. On an
        // engine's context with tracking on, taking the address makes the stream wait (on the
        // GPU, not the host) for the buffer's last write, and dropping the guard records a read
        // event: cudarc's own cross-stream ordering, which costs no host wait.
        s.device_address(&self.stream)
    }

    /// Launches `kernel` on the backend's stream with one parameter block.
    fn launch<P: bytemuck::Pod>(
        &self,
        kernel: Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: P,
    ) -> Result<()> {
        let f = self.function(kernel)?;
        let arg = KernelArg(params);
        let cfg = LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: 0 };
        let mut builder = self.stream.launch_builder(&f);
        builder.arg(&arg);
        // SAFETY: the kernel takes exactly one parameter block of this type by value (checked
        // against the PTX by the catalogue's tests). Its device addresses belong to live
        // buffers of this context whose extents the ops layer has checked against the
        // descriptor, and they stay alive until the launch has run: buffers are freed on this
        // same stream, after the work queued before them.
        unsafe { builder.launch(cfg) }.map_err(|e| map_err(&format!("launching {}", kernel.entry), e))?;
        Ok(())
    }

    /// Launches a matmul-shaped kernel (`tile_m × tile_n` outputs per block) for every batch,
    /// splitting batches past the grid's z limit into several launches by moving the offsets.
    #[allow(clippy::too_many_arguments)]
    fn launch_matmul(
        &self,
        kernel: Kernel,
        desc: &MatmulDesc,
        mut p: cat::MatmulParams,
        tile_m: usize,
        tile_n: usize,
        block: (u32, u32, u32),
    ) -> Result<()> {
        const OP: &str = "matmul";
        let gy = desc.m.div_ceil(tile_m);
        if gy > cat::MAX_GRID_Y {
            return Err(Error::Overflow {
                op: OP,
                what: format!("M = {} (the CUDA grid covers at most {} rows)", desc.m, cat::MAX_GRID_Y * tile_m),
            });
        }
        let gx = u32::try_from(desc.n.div_ceil(tile_n))
            .map_err(|_| Error::Overflow { op: OP, what: format!("N = {}", desc.n) })?;
        let base = p;
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            let s = to_i64(OP, "batch index", start)?;
            let shift = |off: i64, bs: i64| -> Result<i64> {
                bs.checked_mul(s)
                    .and_then(|d| off.checked_add(d))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "a batch offset".into() })
            };
            p.a_off = shift(base.a_off, base.a_bs)?;
            p.b_off = shift(base.b_off, base.b_bs)?;
            p.c_off = shift(base.c_off, base.c_bs)?;
            p.o_off = shift(base.o_off, base.o_bs)?;
            p.batch = to_i32(OP, "batch", count)?;
            self.launch(kernel, (gx, gy as u32, count as u32), block, p)?;
            start += count;
        }
        Ok(())
    }

    /// Launches a GEMV kernel for every batch (at most the grid's z limit per launch), with K
    /// split across blocks as `cat::gemv::gemv_plan` says; a split launch adds into a zeroed
    /// f32 workspace and `gemv_finalize_<dtype>` applies the epilogue.
    fn launch_gemv(&self, kernel: Kernel, desc: &MatmulDesc, dtype: DType, base: cat::MatmulParams) -> Result<()> {
        const OP: &str = "matmul";
        let block = (cat::gemv::GEMV_THREADS, 1, 1);
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            let s = to_i64(OP, "batch index", start)?;
            let shift = |off: i64, bs: i64| -> Result<i64> {
                bs.checked_mul(s)
                    .and_then(|d| off.checked_add(d))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "a batch offset".into() })
            };
            let mut mm = base;
            mm.a_off = shift(base.a_off, base.a_bs)?;
            mm.b_off = shift(base.b_off, base.b_bs)?;
            mm.c_off = shift(base.c_off, base.c_bs)?;
            mm.o_off = shift(base.o_off, base.o_bs)?;
            mm.batch = to_i32(OP, "batch", count)?;
            let plan = cat::gemv::gemv_plan(dtype, desc.trans_b, desc.n, desc.k, count);
            let grid = |v: usize, what: &str| {
                u32::try_from(v).map_err(|_| Error::Overflow { op: OP, what: format!("{what} = {v}") })
            };
            let (gx, gy) = (grid(plan.blocks_n, "GEMV blocks")?, grid(plan.splits, "GEMV splits")?);
            let mut g = cat::gemv::GemvParams {
                mm,
                ws: 0,
                splits: to_i32(OP, "splits", plan.splits)?,
                k_chunk: to_i32(OP, "K per split", plan.k_chunk)?,
            };
            if plan.splits == 1 {
                self.launch(kernel, (gx, gy, count as u32), block, g)?;
            } else {
                let outputs = count
                    .checked_mul(desc.m)
                    .and_then(|v| v.checked_mul(desc.n))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "the split-K workspace".into() })?;
                // Freed on this stream after the two launches that use it.
                let ws = self.alloc_zeroed(DType::F32, outputs)?;
                g.ws = self.ptr(&ws);
                self.launch(kernel, (gx, gy, count as u32), block, g)?;
                let blocks = grid(outputs.div_ceil(cat::gemv::GEMV_THREADS as usize), "GEMV epilogue blocks")?;
                self.launch(cat::gemv::gemv_finalize_kernel(dtype), (blocks, 1, 1), block, g)?;
            }
            start += count;
        }
        Ok(())
    }

    /// The parameter block of a matmul (pointers, views, sizes, epilogue and flags).
    #[allow(clippy::too_many_arguments)]
    fn matmul_params(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<cat::MatmulParams> {
        const OP: &str = "matmul";
        let view = |v: &MatrixView| -> Result<(i64, i64, i64)> {
            Ok((to_i64(OP, "offset", v.offset)?, to_i64(OP, "ld", v.ld)?, to_i64(OP, "batch stride", v.batch_stride)?))
        };
        // Elements per 16 bytes, and whether a view keeps every row start on such a boundary.
        let per16 = 16 / dtype.size_bytes();
        let aligned = |v: &MatrixView, unit: usize| {
            v.offset.is_multiple_of(unit) && v.ld.is_multiple_of(unit) && v.batch_stride.is_multiple_of(unit)
        };
        let (a_off, a_ld, a_bs) = view(&desc.a)?;
        let (b_off, b_ld, b_bs) = view(&desc.b)?;
        let (o_off, o_ld, o_bs) = view(&desc.out)?;
        let (c_off, c_ld, c_bs) = match (&desc.c, c) {
            (Some(v), Some(_)) => view(v)?,
            _ => (0, 0, 0),
        };
        let mut flags = 0;
        if desc.trans_a {
            flags |= cat::MM_TRANS_A;
        }
        if desc.trans_b {
            flags |= cat::MM_TRANS_B;
        }
        if bias.is_some() {
            flags |= cat::MM_HAS_BIAS;
        }
        if c.is_some() && desc.c.is_some() {
            flags |= cat::MM_HAS_C;
        }
        // Every buffer start is 16-byte aligned: tilekit's allocations are 256-byte aligned and
        // imports are checked (`IMPORT_ALIGN`).
        if aligned(&desc.a, per16) {
            flags |= cat::MM_A_VEC;
        }
        if aligned(&desc.b, per16) {
            flags |= cat::MM_B_VEC;
        }
        if aligned(&desc.out, 4) {
            flags |= cat::MM_OUT_VEC;
        }
        Ok(cat::MatmulParams {
            a: self.ptr(a),
            b: self.ptr(b),
            bias: bias.map_or(0, |s| self.ptr(s)),
            c: c.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            a_off,
            a_ld,
            a_bs,
            b_off,
            b_ld,
            b_bs,
            c_off,
            c_ld,
            c_bs,
            o_off,
            o_ld,
            o_bs,
            bias_off: to_i64(OP, "bias offset", desc.bias_offset.unwrap_or(0))?,
            m: to_i32(OP, "M", desc.m)?,
            n: to_i32(OP, "N", desc.n)?,
            k: to_i32(OP, "K", desc.k)?,
            batch: to_i32(OP, "batch", desc.batch.min(cat::MAX_GRID_Z))?,
            alpha: desc.alpha,
            beta: desc.beta,
            act: desc.activation.code(),
            flags,
        })
    }
}

impl BackendOps for CudaBackend {
    type Storage = CudaStorage;
    const KIND: BackendKind = KIND;

    fn wrap(storage: CudaStorage) -> super::Storage {
        super::Storage::Cuda(storage)
    }

    fn description(&self) -> String {
        format!(
            "{} (CUDA device {}, sm_{}{}, {} SMs, driver API {})",
            self.name,
            self.ctx.ordinal(),
            self.cc.0,
            self.cc.1,
            self.sms,
            version_string(self.driver_api)
        )
    }

    /// Device memory without the memset: the op writes every element before anything reads
    /// the buffer, and device memory is never host memory the process could read unset.
    fn alloc_output(&self, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let alloc = bytes.max(16).div_ceil(16) * 16;
        // SAFETY: the memory is unset; `alloc_output` is called only for outputs an op writes
        // in full before they are read (`Device::output_tensor`), and device memory is only
        // ever read back by copies, never dereferenced on the host.
        let buf = unsafe { self.stream.alloc::<u8>(alloc) }.map_err(|e| match map_err("alloc", e) {
            Error::OutOfMemory { backend, .. } => Error::OutOfMemory { backend, bytes: alloc as u64 },
            other => other,
        })?;
        Ok(CudaStorage { mem: CudaMem::Own(buf), bytes })
    }

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Cuda(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        // Every dtype runs on every GPU this backend accepts (sm_80+ has f16 and bf16 tensor
        // cores and conversions).
        Ok(())
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        // Never an empty allocation (the driver rejects size 0), and whole 16-byte vectors.
        let alloc = bytes.max(16).div_ceil(16) * 16;
        let buf = self.stream.alloc_zeros::<u8>(alloc).map_err(|e| match map_err("alloc", e) {
            Error::OutOfMemory { backend, .. } => Error::OutOfMemory { backend, bytes: alloc as u64 },
            other => other,
        })?;
        Ok(CudaStorage { mem: CudaMem::Own(buf), bytes })
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<CudaStorage> {
        let mut s = self.alloc_zeroed(dtype, bytes.len() / dtype.size_bytes())?;
        if !bytes.is_empty()
            && let CudaMem::Own(buf) = &mut s.mem
        {
            let mut view = buf.slice_mut(0..bytes.len());
            // From pageable host memory CUDA waits for the stream's earlier work, then copies
            // through a staging buffer and returns once `bytes` has been read: the one host wait
            // outside `download` and `synchronize` (an upload, never an op; see the module
            // documentation).
            self.stream.memcpy_htod(bytes, &mut view).map_err(|e| map_err("upload", e))?;
        }
        s.bytes = bytes.len();
        Ok(s)
    }

    fn download(&self, s: &CudaStorage, _dtype: DType) -> Result<Vec<u8>> {
        if s.bytes == 0 {
            return Ok(Vec::new());
        }
        let v = match &s.mem {
            CudaMem::Own(buf) => {
                let view = buf.slice(0..s.bytes);
                self.stream.clone_dtoh(&view).map_err(|e| map_err("download", e))?
            }
            CudaMem::Engine { ptr, .. } => {
                let mut v = vec![0u8; s.bytes];
                self.ctx.bind_to_thread().map_err(|e| map_err("download", e))?;
                // SAFETY: `ptr` addresses at least `s.bytes` bytes of live device memory of this
                // context (checked at import, or the importer's `unsafe` contract); `v` is a
                // host buffer of that size that stays in place until the synchronisation below.
                unsafe { result::memcpy_dtoh_async(&mut v, *ptr, self.stream.cu_stream()) }
                    .map_err(|e| map_err("download", e))?;
                v
            }
        };
        // `clone_dtoh` copies on the stream; waiting here makes the bytes final.
        self.stream.synchronize().map_err(|e| map_err("download", e))?;
        Ok(v)
    }

    fn matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        let p = self.matmul_params(desc, dtype, a, b, bias, c, out)?;
        let block = (cat::THREADS, 1, 1);
        // M <= 16, either layout of B: the GEMV kernels; 16 < M <= 32 with B [K, N]: the skinny
        // kernel; the rest: the tiled kernels.
        if let Some(kernel) = cat::gemv::gemv_kernel(dtype, desc.precision, desc.m, desc.trans_b) {
            return self.launch_gemv(kernel, desc, dtype, p);
        }
        match cat::skinny_matmul_kernel(dtype, desc.precision, desc.m, desc.trans_b) {
            Some(kernel) => self.launch_matmul(kernel, desc, p, cat::SKINNY_MAX_M, cat::SKINNY_COLS, block),
            None => {
                let kernel = cat::matmul_kernel(dtype, desc.precision, desc.trans_a, desc.trans_b);
                self.launch_matmul(kernel, desc, p, cat::MATMUL_TILE_M, cat::MATMUL_TILE_N, block)
            }
        }
    }

    fn depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &CudaStorage,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        const OP: &str = "depthwise_conv2d";
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op: OP, param: "desc", reason: "empty output".into() });
        };
        let occ = desc.out_channels();
        let work = match desc.layout {
            Layout::Nchw => [desc.batch, occ, oh, ow.div_ceil(cat::dw_vec(dtype))],
            Layout::Nhwc => [desc.batch, oh, ow.div_ceil(cat::DW_NHWC_X), occ.div_ceil(cat::dw_vec(dtype))],
        }
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Overflow { op: OP, what: "work items".into() })?;
        if work == 0 || self.depthwise_tiled(desc, dtype, input, weight, bias, out, false)? {
            return Ok(());
        }
        // When the kernels may use 16-byte vectors (see `ConvParams::vec`).
        let v = cat::dw_vec(dtype);
        let aligned = |s: &CudaStorage| self.ptr(s).is_multiple_of(16);
        let vec = match desc.layout {
            Layout::Nhwc => desc.multiplier == 1 && desc.channels.is_multiple_of(v) && aligned(input) && aligned(out),
            Layout::Nchw => {
                desc.kernel_w == 3
                    && desc.pad_left == 1
                    && desc.dilation_w == 1
                    && matches!(desc.stride_w, 1 | 2)
                    && desc.width.is_multiple_of(v)
                    && aligned(input)
            }
        };
        let i = |what: &str, v: usize| to_i32(OP, what, v);
        // The kernels index whole tensors in i64 but take every single dimension as i32.
        i("channels × multiplier", occ)?;
        let p = cat::ConvParams {
            input: self.ptr(input),
            weight: self.ptr(weight),
            bias: bias.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            work: to_i64(OP, "work items", work)?,
            batch: i("batch", desc.batch)?,
            channels: i("channels", desc.channels)?,
            height: i("height", desc.height)?,
            width: i("width", desc.width)?,
            multiplier: i("multiplier", desc.multiplier)?,
            kh: i("kernel_h", desc.kernel_h)?,
            kw: i("kernel_w", desc.kernel_w)?,
            sh: i("stride_h", desc.stride_h)?,
            sw: i("stride_w", desc.stride_w)?,
            pt: i("pad_top", desc.pad_top)?,
            pl: i("pad_left", desc.pad_left)?,
            dh: i("dilation_h", desc.dilation_h)?,
            dw: i("dilation_w", desc.dilation_w)?,
            oh: i("out_h", oh)?,
            ow: i("out_w", ow)?,
            act: desc.activation.code(),
            has_bias: u32::from(desc.has_bias && bias.is_some()),
            vec: u32::from(vec),
        };
        let blocks = stride_blocks(work as u64, self.sms);
        self.launch(cat::depthwise_kernel(dtype, desc.layout), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    fn activation(
        &self,
        desc: &ActivationDesc,
        dtype: DType,
        x: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        const OP: &str = "activation";
        if desc.len == 0 {
            return Ok(());
        }
        let bias_len = match (desc.bias_len, bias) {
            (Some(l), Some(_)) => l,
            _ => 0,
        };
        let p = cat::ActParams {
            x: self.ptr(x),
            bias: bias.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            len: to_i64(OP, "len", desc.len)?,
            bias_len: to_i64(OP, "bias_len", bias_len)?,
            act: desc.activation.code(),
            pad0: 0,
        };
        let per_thread = (16 / dtype.size_bytes()) as u64;
        let blocks = stride_blocks((desc.len as u64).div_ceil(per_thread), self.sms);
        self.launch(cat::activation_kernel(dtype), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    fn glu(&self, desc: &GluDesc, dtype: DType, h: &CudaStorage, out: &CudaStorage) -> Result<()> {
        const OP: &str = "glu";
        let len = desc.out_len().ok_or_else(|| Error::Overflow { op: OP, what: "the output element count".into() })?;
        if len == 0 {
            return Ok(());
        }
        let per_thread = 16 / dtype.size_bytes();
        let p = cat::GluParams {
            h: self.ptr(h),
            out: self.ptr(out),
            rows: to_i64(OP, "rows", desc.rows)?,
            f: to_i64(OP, "f", desc.f)?,
            act: desc.activation.code(),
            vec: desc.f.is_multiple_of(per_thread) as u32,
        };
        let blocks = stride_blocks((len as u64).div_ceil(per_thread as u64), self.sms);
        self.launch(cat::glu_kernel(dtype), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    fn copy(&self, dtype: DType, src: &CudaStorage, dst: &CudaStorage, len: usize) -> Result<()> {
        const OP: &str = "copy";
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: OP, what: format!("{len} elements") })?;
        if bytes == 0 {
            return Ok(());
        }
        let p = cat::CopyParams { src: self.ptr(src), dst: self.ptr(dst), bytes: to_i64(OP, "bytes", bytes)? };
        let blocks = stride_blocks((bytes as u64).div_ceil(16), self.sms);
        self.launch(cat::COPY, (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    #[cfg(feature = "bench-refs")]
    fn naive_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        out: &CudaStorage,
    ) -> Result<bool> {
        let plain = MatmulDesc { c: None, bias_offset: None, ..*desc };
        let p = self.matmul_params(&plain, dtype, a, b, None, None, out)?;
        let t = cat::NAIVE_TILE as u32;
        self.launch_matmul(cat::naive_matmul_kernel(dtype), desc, p, cat::NAIVE_TILE, cat::NAIVE_TILE, (t, t, 1))?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| map_err("synchronize", e))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a CUDA driver (CI) the probe and the constructor must say why,
    /// without panicking; on a machine with one they must agree with each other.
    #[test]
    fn probe_reports_instead_of_panicking() {
        match probe() {
            Err(reason) => {
                assert!(!reason.is_empty());
                match CudaBackend::new(0) {
                    Err(Error::BackendUnavailable { backend: BackendKind::Cuda, reason: r }) => assert_eq!(r, reason),
                    other => panic!("expected BackendUnavailable, got {other:?}"),
                }
                println!("cuda: not available: {reason}");
            }
            Ok(found) => println!("cuda: {found}"),
        }
    }

    #[test]
    fn sticky_errors_are_device_lost() {
        let e = map_err("launch", DriverError(sys::cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(matches!(e, Error::DeviceLost { backend: BackendKind::Cuda, .. }), "{e:?}");
        let e = map_err("load", DriverError(sys::cudaError_enum::CUDA_ERROR_UNSUPPORTED_PTX_VERSION));
        match e {
            Error::BackendUnavailable { reason, .. } => assert!(reason.contains(cat::MIN_DRIVER), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn grid_stride_blocks_are_capped() {
        assert_eq!(stride_blocks(0, 132), 1);
        assert_eq!(stride_blocks(256, 132), 1);
        assert_eq!(stride_blocks(257, 132), 2);
        assert_eq!(stride_blocks(u64::MAX, 132), 132 * 32);
    }
}
