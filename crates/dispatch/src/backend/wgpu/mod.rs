//! The wgpu backend: tilekit's WGSL kernels on any Vulkan, Metal, DX12 or GL adapter.
//!
//! - One `wgpu::Device`/`Queue` per backend, made here ([`WgpuBackend::new`]) or handed in by
//!   an engine ([`WgpuBackend::from_raw`]).
//! - Storage is one `wgpu::Buffer` (`STORAGE | COPY_SRC | COPY_DST`) sized in bytes rounded up
//!   to 16, so the kernels' vec4 views never reach past its end.
//! - Modules come from the kernel catalogue (`tilekit_kernels::catalogue::wgsl`); pipelines are
//!   built on first use and cached by (kernel, storage variant, shape constants). f16 is stored natively
//!   where the device has `SHADER_F16` (unless [`WgpuOptions::force_packed_f16`]), packed two
//!   per `u32` otherwise; bf16 is always packed.
//! - Ops are recorded without a host sync: each op becomes a command buffer (one compute pass
//!   per launch) queued in `Pending`; the queue is submitted in one `Queue::submit` every
//!   [`MAX_PENDING_OPS`] ops and whenever the host waits (`download`, `synchronize`). Waits
//!   poll with a timeout and return a typed error instead of hanging.
//! - Limits: the device is created with the adapter's own limits (storage binding, buffer size,
//!   workgroups). Grids fold into 2-D (1-D kernels) or split over launches (matmul batches) to
//!   stay within the per-dimension workgroup limit; activations and copies over the
//!   storage-binding limit run in chunks bound as buffer windows; a matmul over it (or over
//!   `u32` indices, or over the grid limit in M or N) runs as blocks of batches, rows and
//!   columns, each binding windows of its operands (`split_matmul`); a depthwise convolution
//!   over it runs as blocks of images, channel planes (NCHW) and output rows (`split_conv`).
//!   What cannot be split (one row of a transposed A or one column of an untransposed B over
//!   the limit, one output row of a convolution over it) is refused with [`Error::Overflow`]
//!   naming it.
//! - A buffer over the device's `max_buffer_size` is [`Error::OutOfMemory`], as a failed
//!   allocation is on every backend; [`Error::Overflow`] is for counts past the integer types.
//! - NaN and Inf, the promise (tested in `tests/tests/nan_inf.rs`): WGSL lets the shader
//!   compiler assume finite math and flush subnormals, so what an output that depends on a
//!   NaN or an infinity holds is not promised. Promised: such
//!   an op returns `Ok` and does not disturb the device; outputs that do not depend on a
//!   non-finite input are bit-identical to a run without it; finite inputs whose results are
//!   finite give finite outputs, huge ones included (the GELU formulas clamp their arguments).
//! - Every wgpu call that can fail runs inside error scopes (validation, out of memory,
//!   internal), so errors come back from the op that caused them as [`Error`] values; a device
//!   made here also installs an uncaptured-error handler as a backstop (wgpu's default handler
//!   panics), and a lost device turns every later call into [`Error::DeviceLost`].
//! - Tuning (`crate::tune`): the matmul and the depthwise convolution take their [`Spec`]
//!   from the autotuner: the default when tuning is off or nothing is cached, else a validated
//!   cached winner, else (mode `on`) the winner of timing every candidate on the op's operands.
//! - Profiling (`crate::profile`): while a profile is open, every compute pass writes
//!   `TIMESTAMP_QUERY` timestamps at its start and end into query sets of [`QUERIES_PER_SET`];
//!   they are resolved and read back when the profile ends. Without the feature the profile
//!   falls back to host wall time per op. Closed, it costs one relaxed atomic load per launch.

use super::BackendOps;
use crate::tune::{CacheEntry, TuneMode, TuneReport, TunedConfig, Tuner};
use crate::{BackendKind, Error, Result, WgpuOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tilekit_kernels::catalogue::wgsl::{
    self as cat, ActivationParams, ConvParams, CopyParams, ElementStorage, Kernel, MatmulParams, MatmulTile, Spec,
    activation_flags, conv_flags, matmul_flags,
};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, Layout, MatmulDesc, MatrixView, Precision};

#[cfg(test)]
mod tests;

const KIND: BackendKind = BackendKind::Wgpu;
/// Ops queued before they are submitted: large enough to amortise the 70–135 µs
/// a submit costs on lavapipe (`shared/FIELD-NOTES.md`), small enough to keep the GPU busy
/// while the host records more.
const MAX_PENDING_OPS: usize = 64;
/// The longest a host wait may take before it is reported as an error. Generous because a
/// software adapter runs big kernels slowly; a real hang still ends.
const WAIT_TIMEOUT: Duration = Duration::from_secs(300);
/// Rounds of timing in a tune (each candidate keeps its best).
const TUNING_ROUNDS: usize = 3;
/// The fraction by which a candidate must beat the default to replace it.
const MIN_TUNING_GAIN: f64 = 0.05;
/// Timestamp queries per query set while profiling (two per pass); wgpu allows 4096.
const QUERIES_PER_SET: u32 = 4096;

/// One adapter the probe saw.
#[derive(Debug, Clone)]
pub(crate) struct AdapterSummary {
    pub(crate) name: String,
    pub(crate) backend: String,
    pub(crate) software: bool,
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    // WGPU_BACKEND and the other wgpu variables still override.
    wgpu::Instance::new(desc.with_env())
}

fn enumerate() -> std::result::Result<Vec<wgpu::Adapter>, String> {
    // wgpu panics only when no backend is compiled in; the catch keeps the probe's promise
    // never to panic even on such a build.
    std::panic::catch_unwind(|| {
        // The primary backends (Vulkan, Metal, DX12) first; GL only where none of them has an
        // adapter: its compute support is the narrowest, and initialising EGL on a headless
        // machine prints errors.
        let primary = new_instance(wgpu::Backends::PRIMARY);
        let adapters = pollster::block_on(primary.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            let secondary = new_instance(wgpu::Backends::SECONDARY);
            pollster::block_on(secondary.enumerate_adapters(wgpu::Backends::all()))
        } else {
            adapters
        }
    })
    .map_err(|_| "wgpu failed to enumerate adapters".to_string())
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// Lists the adapters wgpu can see. Never panics.
pub(crate) fn probe_adapters() -> std::result::Result<Vec<AdapterSummary>, String> {
    Ok(enumerate()?
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary { software: is_software(&info), name: info.name, backend: format!("{:?}", info.backend) }
        })
        .collect())
}

/// Errors the uncaptured-error handler and the device-lost callback saw.
#[derive(Debug, Default)]
struct ErrorLog {
    /// Uncaptured errors so far (all of them, reported or not).
    count: AtomicU64,
    /// The oldest uncaptured error not yet returned to a caller.
    unreported: Mutex<Option<wgpu::Error>>,
    /// Why the device was lost, once it was.
    lost: Mutex<Option<String>>,
}

/// A cached pipeline.
#[derive(Debug)]
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// Module name and spec label, for profiles.
    name: String,
    /// Workgroup size, for profiles.
    workgroup: [u32; 3],
}

/// One launch recorded while a profile is open.
#[derive(Debug, Clone)]
pub(crate) struct LaunchInfo {
    /// Module name and spec label.
    pub(crate) kernel: String,
    pub(crate) grid: [u32; 3],
    pub(crate) workgroup: [u32; 3],
    /// Query set and first of its two query slots (start, end); `None` without timestamps.
    pub(crate) query: Option<(usize, u32)>,
}

/// Profiling state: the flag the hot path reads, and the queries and launches so far.
#[derive(Debug, Default)]
struct ProfState {
    active: AtomicBool,
    inner: Mutex<ProfInner>,
}

#[derive(Debug, Default)]
struct ProfInner {
    sets: Vec<wgpu::QuerySet>,
    /// Queries used in the last set.
    used: u32,
    /// Launches not yet taken by the op that recorded them.
    launches: Vec<LaunchInfo>,
}

/// A pipeline's cache key: kernel, storage variant and shape constants (the module's text and
/// override values follow from them).
type PipelineKey = (Kernel, ElementStorage, Spec);

/// A storage binding: a whole buffer, or a byte window `(offset, size)` of it.
#[derive(Clone, Copy, Debug)]
struct Bind<'a> {
    slot: u32,
    buffer: &'a wgpu::Buffer,
    window: Option<(u64, u64)>,
}

/// `buffer` bound whole at `slot`.
fn whole(slot: u32, buffer: &wgpu::Buffer) -> Bind<'_> {
    Bind { slot, buffer, window: None }
}

/// One dispatch: bindings, parameter block, grid.
#[derive(Debug)]
struct Launch<'a> {
    binds: Vec<Bind<'a>>,
    params: Vec<u8>,
    grid: [u32; 3],
}

/// Work recorded but not yet submitted: one finished command buffer per op. One encoder per
/// op (rather than one shared encoder) keeps a failed op from invalidating the ops recorded
/// before it: its command buffer is never queued, the others are.
#[derive(Debug, Default)]
struct Pending {
    buffers: Vec<wgpu::CommandBuffer>,
}

/// The wgpu backend: a box around its state, so the `Backend` enum stays small.
#[derive(Debug)]
pub(crate) struct WgpuBackend(Box<State>);

impl std::ops::Deref for WgpuBackend {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0
    }
}

/// What a [`WgpuBackend`] holds.
#[derive(Debug)]
pub(crate) struct State {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    native_f16: bool,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    pending: Mutex<Pending>,
    errors: Arc<ErrorLog>,
    /// Bound where an op has no bias or no C (every binding of a module must be bound).
    dummy: wgpu::Buffer,
    /// Submissions so far (the tests check that ops are batched).
    submissions: AtomicU64,
    /// Whether the device was created with `TIMESTAMP_QUERY`.
    timestamps: bool,
    prof: ProfState,
    tuner: Tuner,
    /// What identifies this device and driver in the tune cache (made once).
    fingerprint: String,
    /// Set by an explicit tune ([`WgpuBackend::tune_matmul_now`]): the next choice times every
    /// candidate whatever the cache holds, and leaves its report here. (An op another thread
    /// issues on this device meanwhile is tuned too; its results are as correct as any.)
    forced: Mutex<Option<Option<Result<TuneReport>>>>,
    /// Serialises explicit tunes.
    forcing: Mutex<()>,
    /// Tests run every candidate through the whole op path by forcing its spec here.
    #[cfg(test)]
    force_spec: Mutex<Option<Spec>>,
}

/// A buffer on the wgpu backend.
#[derive(Debug)]
pub(crate) struct WgpuStorage {
    buffer: wgpu::Buffer,
    len: usize,
    dtype: DType,
}

impl WgpuStorage {
    /// The raw buffer, for engines that bind it themselves.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

/// Bytes of a buffer of `len` elements: rounded up to 16 (vec4 views), at least 16.
fn padded_bytes(dtype: DType, len: usize) -> Option<u64> {
    let bytes = len.checked_mul(dtype.size_bytes())?;
    let padded = bytes.checked_add(15)? / 16 * 16;
    u64::try_from(padded.max(16)).ok()
}

fn map_wgpu_error(e: wgpu::Error, bytes: u64) -> Error {
    match e {
        wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory { backend: KIND, bytes },
        other => Error::Backend { backend: KIND, message: other.to_string() },
    }
}

/// A buffer holding `contents` (zero-padded to a multiple of 4 bytes). wgpu's own
/// `create_buffer_init` panics when the mapping fails, as it does on a lost device; this
/// returns [`Error::DeviceLost`] (or the mapping error) instead.
fn buffer_with(device: &wgpu::Device, label: &str, contents: &[u8], usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
    let size = (contents.len().div_ceil(4) * 4).max(4) as u64;
    let buffer =
        device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: true });
    {
        let mut view = buffer.slice(..).get_mapped_range_mut().map_err(|e| Error::DeviceLost {
            backend: KIND,
            reason: format!("a new buffer could not be mapped for writing ({e})"),
        })?;
        view.slice(..contents.len()).copy_from_slice(contents);
    }
    buffer.unmap();
    Ok(buffer)
}

fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v} (kernel indices are u32)") })
}

fn div_ceil_u32(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}

impl WgpuBackend {
    /// A device on the first adapter `opts` accepts: hardware adapters first (discrete, then
    /// integrated, virtual, other), software ones only with `allow_software`.
    pub(crate) fn new(opts: &WgpuOptions) -> Result<WgpuBackend> {
        let unavailable = |reason: String| Error::BackendUnavailable { backend: KIND, reason };
        let mut adapters: Vec<(wgpu::Adapter, wgpu::AdapterInfo)> = enumerate()
            .map_err(unavailable)?
            .into_iter()
            .map(|a| {
                let info = a.get_info();
                (a, info)
            })
            .collect();
        if adapters.is_empty() {
            return Err(unavailable("no adapter found (no Vulkan, Metal, DX12 or GL driver)".into()));
        }
        let seen: Vec<String> = adapters.iter().map(|(_, i)| format!("{} ({:?})", i.name, i.backend)).collect();
        if let Some(filter) = &opts.adapter_name {
            let f = filter.to_lowercase();
            adapters.retain(|(_, i)| i.name.to_lowercase().contains(&f));
        }
        if !opts.allow_software {
            adapters.retain(|(_, i)| !is_software(i));
        }
        let rank = |i: &wgpu::AdapterInfo| {
            let ty = match i.device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            // GL comes last: its compute support is the narrowest.
            (ty, i.backend == wgpu::Backend::Gl)
        };
        adapters.sort_by_key(|(_, i)| rank(i));
        if adapters.is_empty() {
            return Err(unavailable(format!(
                "no adapter matches (software {}, name filter {:?}); found: {}",
                if opts.allow_software { "allowed" } else { "not allowed" },
                opts.adapter_name,
                seen.join(", ")
            )));
        }
        let mut failures = Vec::new();
        for (adapter, info) in adapters {
            let mut features = wgpu::Features::empty();
            if adapter.features().contains(wgpu::Features::SHADER_F16) {
                features |= wgpu::Features::SHADER_F16;
            }
            // Profiles read device time from timestamps written at the start and end of
            // each compute pass; asked for only where the adapter has it.
            if adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
                features |= wgpu::Features::TIMESTAMP_QUERY;
            }
            let desc = wgpu::DeviceDescriptor {
                label: Some("tilekit"),
                required_features: features,
                // The adapter's own limits: the largest bindings and workgroup storage it has.
                required_limits: adapter.limits(),
                ..Default::default()
            };
            match pollster::block_on(adapter.request_device(&desc)) {
                Ok((device, queue)) => {
                    let errors = Arc::new(ErrorLog::default());
                    let log = errors.clone();
                    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                        log.count.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut slot) = log.unreported.lock() {
                            slot.get_or_insert(e);
                        }
                    }));
                    let native = features.contains(wgpu::Features::SHADER_F16) && !opts.force_packed_f16;
                    return Ok(WgpuBackend::assemble(device, queue, info, native, errors));
                }
                Err(e) => failures.push(format!("{}: {e}", info.name)),
            }
        }
        Err(unavailable(format!("device creation failed: {}", failures.join("; "))))
    }

    /// Wraps an engine's own device and queue. The engine's uncaptured-error handler is left
    /// alone: tilekit's calls run inside error scopes and report their errors themselves.
    pub(crate) fn from_raw(device: wgpu::Device, queue: wgpu::Queue) -> Result<WgpuBackend> {
        let info = device.adapter_info();
        let native = device.features().contains(wgpu::Features::SHADER_F16);
        Ok(WgpuBackend::assemble(device, queue, info, native, Arc::new(ErrorLog::default())))
    }

    fn assemble(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        native_f16: bool,
        errors: Arc<ErrorLog>,
    ) -> WgpuBackend {
        let log = errors.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut lost) = log.lost.lock() {
                lost.get_or_insert(format!("{reason:?}: {message}"));
            }
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tilekit dummy binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let limits = device.limits();
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let fingerprint = format!(
            "{} ({:?}, {:04x}:{:04x}, {} {})",
            info.name, info.backend, info.vendor, info.device, info.driver, info.driver_info
        );
        WgpuBackend(Box::new(State {
            fingerprint,
            timestamps,
            prof: ProfState::default(),
            tuner: Tuner::from_env(),
            forced: Mutex::new(None),
            forcing: Mutex::new(()),
            #[cfg(test)]
            force_spec: Mutex::new(None),
            device,
            queue,
            info,
            limits,
            native_f16,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
            errors,
            dummy,
            submissions: AtomicU64::new(0),
        }))
    }

    /// Adapter name, backend, driver and the active f16 path.
    pub(crate) fn description(&self) -> String {
        let i = &self.info;
        let driver = match (i.driver.is_empty(), i.driver_info.is_empty()) {
            (true, _) => String::new(),
            (false, true) => format!(", driver {}", i.driver),
            (false, false) => format!(", driver {} {}", i.driver, i.driver_info),
        };
        let f16 = if self.native_f16 { "f16 native (shader-f16)" } else { "f16 packed in u32" };
        format!(
            "{} ({:?}{}{}); {f16}, bf16 packed in u32",
            i.name,
            i.backend,
            if is_software(i) { ", software" } else { "" },
            driver
        )
    }

    pub(crate) fn is_software(&self) -> bool {
        is_software(&self.info)
    }

    /// Submissions so far.
    #[cfg(test)]
    fn submission_count(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    fn storage_variant(&self, dtype: DType) -> ElementStorage {
        ElementStorage::for_dtype(dtype, self.native_f16)
    }

    /// Fails if the device was lost or an uncaptured error is waiting to be reported.
    fn check_health(&self) -> Result<()> {
        if let Some(reason) = self.errors.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::DeviceLost { backend: KIND, reason });
        }
        if let Some(e) = self.errors.unreported.lock().ok().and_then(|mut u| u.take()) {
            return Err(map_wgpu_error(e, 0));
        }
        Ok(())
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns what they
    /// caught into an [`Error`] (`bytes` is the allocation size reported on OOM).
    fn scoped<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = f();
        let caught =
            [pollster::block_on(internal.pop()), pollster::block_on(validation.pop()), pollster::block_on(oom.pop())];
        if caught.iter().any(Option::is_some) {
            // A destroyed device makes every object invalid, but its lost callback runs only
            // when the device is polled: poll once so the error is reported as the loss.
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        self.check_health()?;
        match caught.into_iter().flatten().next() {
            Some(e) => Err(map_wgpu_error(e, bytes)),
            None => Ok(value),
        }
    }

    fn create_buffer(&self, bytes: u64, contents: Option<&[u8]>) -> Result<wgpu::Buffer> {
        // A size the device cannot hold is the same verdict as an allocation the driver
        // refuses: out of memory (as on the CPU and CUDA backends). `Overflow` is kept for
        // counts that do not fit the integer types (elements times bytes past `usize`).
        if bytes > self.limits.max_buffer_size {
            return Err(Error::OutOfMemory { backend: KIND, bytes });
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        self.scoped(bytes, || match contents {
            Some(data) => buffer_with(&self.device, "tilekit tensor", data, usage),
            // wgpu zero-fills new buffers.
            None => Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tilekit tensor"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })),
        })?
    }

    /// The cached pipeline of `kernel` in `storage` specialised by `spec`, built on first use.
    fn pipeline(&self, op: &'static str, kernel: Kernel, storage: ElementStorage, spec: Spec) -> Result<Arc<Pipeline>> {
        // The copy is dtype-free and each kernel uses only its own part of the spec: normalise
        // the key so each distinct pipeline is built once.
        let storage = if kernel.is_typed() { storage } else { ElementStorage::F32 };
        let spec = spec.normalised(kernel);
        let key = (kernel, storage, spec);
        if let Some(p) = self.pipelines.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(p);
        }
        let module = cat::module_with(kernel, storage, spec);
        if module.needs_f16 && !self.device.features().contains(wgpu::Features::SHADER_F16) {
            return Err(Error::UnsupportedDType {
                op,
                dtype: DType::F16,
                backend: KIND,
                reason: "the device lacks SHADER_F16".into(),
            });
        }
        // wgpu does not check workgroup storage against the limit (gfx-rs/wgpu #8946): do it here.
        let l = &self.limits;
        if module.workgroup_bytes > l.max_compute_workgroup_storage_size {
            return Err(Error::Backend {
                backend: KIND,
                message: format!(
                    "{} needs {} bytes of workgroup storage, the device has {}",
                    module.name, module.workgroup_bytes, l.max_compute_workgroup_storage_size
                ),
            });
        }
        let [x, y, z] = module.workgroup_size;
        if x * y * z > l.max_compute_invocations_per_workgroup
            || x > l.max_compute_workgroup_size_x
            || y > l.max_compute_workgroup_size_y
            || z > l.max_compute_workgroup_size_z
        {
            return Err(Error::Backend {
                backend: KIND,
                message: format!(
                    "{} needs a {x} x {y} x {z} workgroup, the device allows {} invocations ({} x {} x {})",
                    module.name,
                    l.max_compute_invocations_per_workgroup,
                    l.max_compute_workgroup_size_x,
                    l.max_compute_workgroup_size_y,
                    l.max_compute_workgroup_size_z
                ),
            });
        }
        let pipeline = self.scoped(0, || {
            let shader = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&module.name),
                source: wgpu::ShaderSource::Wgsl(module.source.as_str().into()),
            });
            self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&module.name),
                layout: None,
                module: &shader,
                entry_point: Some(module.entry_point),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &module.overrides,
                    // Every kernel writes its workgroup arrays before reading them.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })?;
        let layout = self.scoped(0, || pipeline.get_bind_group_layout(0))?;
        let name = match kernel {
            Kernel::Matmul | Kernel::MatmulSmallM | Kernel::DepthwiseConv2d => {
                format!("{} [{}]", module.name, spec.label(kernel))
            }
            _ => module.name.clone(),
        };
        let p = Arc::new(Pipeline { pipeline, layout, name, workgroup: module.workgroup_size });
        if let Ok(mut cache) = self.pipelines.lock() {
            cache.insert(key, p.clone());
        }
        Ok(p)
    }

    /// Checks that a binding of `bytes` fits the device's storage-binding limit.
    fn check_binding(&self, op: &'static str, bytes: u64) -> Result<()> {
        let limit = self.limits.max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::Overflow {
                op,
                what: format!("a binding of {bytes} bytes (the device's storage-binding limit is {limit})"),
            });
        }
        Ok(())
    }

    /// A 1-D launch of `items` invocations folded into a 2-D grid.
    fn grid_1d(&self, op: &'static str, items: u32, per_group: u32) -> Result<[u32; 3]> {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        let groups = div_ceil_u32(items, per_group).max(1);
        let x = groups.min(max);
        let y = div_ceil_u32(groups, x);
        if y > max {
            return Err(Error::Overflow { op, what: format!("a grid of {groups} workgroups") });
        }
        Ok([x, y, 1])
    }

    /// Records `launches` of `pipeline` (one compute pass each) as one pending command buffer;
    /// each launch brings its bindings, its parameter block (bound at `uniform_slot`) and its
    /// grid. Nothing waits: the buffer is submitted with the next [`MAX_PENDING_OPS`] or when
    /// the host waits.
    fn record(&self, op: &'static str, pipeline: &Pipeline, uniform_slot: u32, launches: &[Launch<'_>]) -> Result<()> {
        for launch in launches {
            for bind in &launch.binds {
                self.check_binding(op, bind.window.map_or(bind.buffer.size(), |w| w.1))?;
            }
        }
        self.check_health()?;
        // Only while a profile is open: one query pair per pass.
        let queries = if self.prof.active.load(Ordering::Relaxed) {
            self.profile_queries(pipeline, launches)?
        } else {
            Vec::new()
        };
        let commands = self.scoped(0, || {
            let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
            for (i, launch) in launches.iter().enumerate() {
                let uniform = buffer_with(&self.device, op, &launch.params, wgpu::BufferUsages::UNIFORM)?;
                let mut entries: Vec<wgpu::BindGroupEntry<'_>> = launch
                    .binds
                    .iter()
                    .map(|b| wgpu::BindGroupEntry {
                        binding: b.slot,
                        resource: match b.window {
                            None => b.buffer.as_entire_binding(),
                            Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: b.buffer,
                                offset,
                                size: wgpu::BufferSize::new(size),
                            }),
                        },
                    })
                    .collect();
                entries.push(wgpu::BindGroupEntry { binding: uniform_slot, resource: uniform.as_entire_binding() });
                let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(op),
                    layout: &pipeline.layout,
                    entries: &entries,
                });
                let timestamp_writes =
                    queries.get(i).and_then(|q| q.as_ref()).map(|(set, slot)| wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(*slot),
                        end_of_pass_write_index: Some(*slot + 1),
                    });
                let mut pass =
                    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(op), timestamp_writes });
                pass.set_pipeline(&pipeline.pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                let [x, y, z] = launch.grid;
                pass.dispatch_workgroups(x, y, z);
            }
            Ok(encoder.finish())
        })??;
        let mut pending = self.lock_pending()?;
        pending.buffers.push(commands);
        if pending.buffers.len() >= MAX_PENDING_OPS {
            self.submit(&mut pending, None)?;
        }
        Ok(())
    }

    /// Splits `len` elements of `size` bytes into chunks `(first, count)` whose bindings fit
    /// the device's storage-binding limit. Chunks start at multiples of the storage offset
    /// alignment (256 bytes on most devices), so each starts on a whole vec4 and, for packed
    /// 16-bit types, on a whole word.
    fn chunks(&self, op: &'static str, len: usize, size: usize) -> Result<Vec<(usize, usize)>> {
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        // Element indices inside a chunk are u32; 2^30 elements keep `4 * items` in range too.
        let limit = self.limits.max_storage_buffer_binding_size.min((1 << 30) * size as u64);
        let per = usize::try_from(limit / align * align / size as u64).unwrap_or(usize::MAX);
        if per == 0 {
            return Err(Error::Overflow { op, what: format!("a chunk of the storage-binding limit ({limit} bytes)") });
        }
        Ok((0..len).step_by(per).map(|first| (first, per.min(len - first))).collect())
    }

    /// Submits the pending command buffers (plus `extra`, after them) in one submission and
    /// returns its index.
    fn submit(
        &self,
        pending: &mut Pending,
        extra: Option<wgpu::CommandBuffer>,
    ) -> Result<Option<wgpu::SubmissionIndex>> {
        let mut buffers = std::mem::take(&mut pending.buffers);
        buffers.extend(extra);
        if buffers.is_empty() {
            return Ok(None);
        }
        let index = self.scoped(0, || self.queue.submit(buffers))?;
        self.submissions.fetch_add(1, Ordering::Relaxed);
        Ok(Some(index))
    }

    /// Blocks until `index` (or everything submitted) has finished, with a timeout.
    fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let poll = self.device.poll(wgpu::PollType::Wait { submission_index: index, timeout: Some(WAIT_TIMEOUT) });
        self.check_health()?;
        match poll {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(Error::Backend {
                backend: KIND,
                message: format!("the device did not finish within {} s", WAIT_TIMEOUT.as_secs()),
            }),
            Err(e) => Err(Error::Backend { backend: KIND, message: e.to_string() }),
        }
    }

    fn lock_pending(&self) -> Result<std::sync::MutexGuard<'_, Pending>> {
        self.pending
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the pending-work lock was poisoned".into() })
    }

    /// Shared part of matmul and the naive matmul: the parameter block of `desc`.
    fn matmul_params(&self, op: &'static str, desc: &MatmulDesc) -> Result<MatmulParams> {
        let (ar, _) = desc.a_stored();
        let (br, _) = desc.b_stored();
        // A leading dimension or batch stride is only used when there is a second row or
        // batch; where it is not, it is passed as 0 so a huge unused value cannot overflow.
        let ld = |rows: usize, v: usize, what: &str| if rows <= 1 { Ok(0) } else { to_u32(op, what, v) };
        let bs = |v: usize, what: &str| if desc.batch <= 1 { Ok(0) } else { to_u32(op, what, v) };
        let aligned =
            |off: u32, ld: u32, bs: u32| off.is_multiple_of(4) && ld.is_multiple_of(4) && bs.is_multiple_of(4);
        let mut p = MatmulParams {
            m: to_u32(op, "M", desc.m)?,
            n: to_u32(op, "N", desc.n)?,
            k: to_u32(op, "K", desc.k)?,
            a_off: to_u32(op, "a offset", desc.a.offset)?,
            a_ld: ld(ar, desc.a.ld, "a ld")?,
            a_bs: bs(desc.a.batch_stride, "a batch stride")?,
            trans_a: desc.trans_a as u32,
            b_off: to_u32(op, "b offset", desc.b.offset)?,
            b_ld: ld(br, desc.b.ld, "b ld")?,
            b_bs: bs(desc.b.batch_stride, "b batch stride")?,
            trans_b: desc.trans_b as u32,
            o_off: to_u32(op, "out offset", desc.out.offset)?,
            o_ld: ld(desc.m, desc.out.ld, "out ld")?,
            o_bs: bs(desc.out.batch_stride, "out batch stride")?,
            act: desc.activation.code(),
            alpha: desc.alpha,
            beta: desc.beta,
            ..MatmulParams::default()
        };
        if aligned(p.a_off, p.a_ld, p.a_bs) {
            p.flags |= matmul_flags::A_VEC;
        }
        if aligned(p.b_off, p.b_ld, p.b_bs) {
            p.flags |= matmul_flags::B_VEC;
        }
        if aligned(p.o_off, p.o_ld, p.o_bs) {
            p.flags |= matmul_flags::O_VEC;
        }
        if desc.precision == Precision::Bf16 {
            p.flags |= matmul_flags::PREC_BF16;
        }
        if let Some(off) = desc.bias_offset {
            p.flags |= matmul_flags::HAS_BIAS;
            p.bias_off = to_u32(op, "bias offset", off)?;
        }
        if let Some(c) = desc.c {
            p.flags |= matmul_flags::HAS_C;
            p.c_off = to_u32(op, "c offset", c.offset)?;
            p.c_ld = ld(desc.m, c.ld, "c ld")?;
            p.c_bs = bs(c.batch_stride, "c batch stride")?;
        }
        Ok(p)
    }

    /// Launches over batches, at most the grid limit per launch.
    fn batched_launches(
        &self,
        op: &'static str,
        params: MatmulParams,
        batch: usize,
        gx: u32,
        gy: u32,
    ) -> Result<Vec<(Vec<u8>, [u32; 3])>> {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if gx > max || gy > max {
            return Err(Error::Overflow { op, what: format!("a grid of {gx} x {gy} workgroups (limit {max} each)") });
        }
        let batch = to_u32(op, "batch", batch)?;
        let mut launches = Vec::new();
        let mut base = 0u32;
        while base < batch {
            let count = (batch - base).min(max);
            let p = MatmulParams { batch_base: base, ..params };
            launches.push((bytemuck::bytes_of(&p).to_vec(), [gx, gy, count]));
            base += count;
        }
        Ok(launches)
    }

    /// The tiled-kernel launch of a matmul with `spec`: whole buffers where every operand fits
    /// the storage-binding limit and every index fits `u32`, else [`Self::split_matmul`].
    #[allow(clippy::too_many_arguments)]
    fn launch_matmul(
        &self,
        op: &'static str,
        desc: &MatmulDesc,
        dtype: DType,
        storage: ElementStorage,
        kernel: Kernel,
        spec: Spec,
        [a, b, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
    ) -> Result<()> {
        // The pipeline is specialised to this product's transposes, bias, C and activation.
        let spec = spec.normalised(kernel).with_switches(desc);
        let (block_m, block_n) = match kernel {
            Kernel::MatmulSmallM => (spec.rows, spec.wg * cat::SMALL_M_COLS),
            _ => (spec.tile.bm(), spec.tile.bn()),
        };
        let pipeline = self.pipeline(op, kernel, storage, spec)?;
        let limit = self.binding_limit();
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        let fits_whole = [Some(a), Some(b), bias, c, Some(out)].into_iter().flatten().all(|s| s.buffer.size() <= limit)
            && self.matmul_params(op, desc).is_ok()
            && desc.n.div_ceil(block_n as usize) <= max as usize
            && desc.m.div_ceil(block_m as usize) <= max as usize;
        let launches = if fits_whole {
            let params = self.matmul_params(op, desc)?;
            let gx = div_ceil_u32(params.n, block_n);
            let gy = div_ceil_u32(params.m, block_m);
            let bias = bias.map_or(&self.dummy, |s| &s.buffer);
            let c = c.map_or(&self.dummy, |s| &s.buffer);
            let binds =
                vec![whole(0, &a.buffer), whole(1, &b.buffer), whole(2, bias), whole(3, c), whole(4, &out.buffer)];
            self.batched_launches(op, params, desc.batch, gx, gy)?
                .into_iter()
                .map(|(params, grid)| Launch { binds: binds.clone(), params, grid })
                .collect()
        } else {
            self.split_matmul(op, desc, dtype, (block_m, block_n), [a, b, out], bias, c)?
        };
        self.record(op, &pipeline, 5, &launches)
    }

    /// The largest binding a split op uses: the device's storage-binding limit, capped at
    /// 2^31 bytes so every element index inside a window (at most 2^30 16-bit elements, two
    /// per word where packed) stays far inside `u32`.
    fn binding_limit(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(1 << 31)
    }

    /// A matmul whose operands exceed the storage-binding limit (or whose indices would pass
    /// `u32`, or whose grid would pass the per-dimension limit), as launches over blocks of
    /// (batches, output rows, output columns). Each block binds, per operand, the byte window
    /// that holds what the block reads or writes, starting at a multiple of the storage offset
    /// alignment, and runs with offsets relative to it. Blocks shrink per operand that does
    /// not fit: batches first, then rows (A, C, out) or columns (B, bias, C, out), which helps
    /// B only when it is stored transposed (N x K rows are contiguous) and A only when it is
    /// not (its M x K rows are contiguous). A single row or column
    /// still over the limit cannot be split and is an [`Error::Overflow`] that names it.
    #[allow(clippy::too_many_arguments)]
    fn split_matmul<'a>(
        &'a self,
        op: &'static str,
        desc: &MatmulDesc,
        dtype: DType,
        (block_m, block_n): (u32, u32),
        [a, b, out]: [&'a WgpuStorage; 3],
        bias: Option<&'a WgpuStorage>,
        c: Option<&'a WgpuStorage>,
    ) -> Result<Vec<Launch<'a>>> {
        let size = dtype.size_bytes();
        let limit = self.binding_limit();
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let max = self.limits.max_compute_workgroups_per_dimension.max(1) as usize;
        let k = desc.k;
        // Bytes of a window over `(batches, rows, cols)` of a view: its span plus the most the
        // aligned start can add.
        let span = |v: &MatrixView, nb: usize, rows: usize, cols: usize| -> u64 {
            let elems = (nb.saturating_sub(1) as u128) * v.batch_stride as u128
                + (rows.saturating_sub(1) as u128) * v.ld as u128
                + cols as u128;
            let bytes = elems * size as u128 + u128::from(align) + 16;
            u64::try_from(bytes).unwrap_or(u64::MAX)
        };
        let (mut nb, mut rm, mut cn) = (desc.batch, desc.m, desc.n.min(max * block_n as usize));
        rm = rm.min(max * block_m as usize);
        loop {
            // Which shrink each operand asks for, in order of preference.
            let (ar, ac) = if desc.trans_a { (k, rm) } else { (rm, k) };
            let (br, bc) = if desc.trans_b { (cn, k) } else { (k, cn) };
            let mut over: Vec<(&str, bool, bool, bool)> = Vec::new();
            if k > 0 && span(&desc.a, nb, ar, ac) > limit {
                over.push(("a", true, true, false));
            }
            if k > 0 && span(&desc.b, nb, br, bc) > limit {
                over.push(("b", true, false, true));
            }
            if desc.bias_offset.is_some() && span(&MatrixView::default(), 1, 1, cn) > limit {
                over.push(("bias", false, false, true));
            }
            if let Some(cv) = &desc.c
                && span(cv, nb, rm, cn) > limit
            {
                over.push(("c", true, true, true));
            }
            if span(&desc.out, nb, rm, cn) > limit {
                over.push(("out", true, true, true));
            }
            let Some(&(what, by_batch, by_rows, by_cols)) = over.first() else { break };
            if by_batch && nb > 1 {
                nb = nb.div_ceil(2);
            } else if by_rows && rm > 1 {
                rm = rm.div_ceil(2);
            } else if by_cols && cn > 1 {
                cn = cn.div_ceil(2);
            } else {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "operand {what}: a single row or column of it is over the storage-binding limit \
                         ({limit} bytes) and cannot be split further{}",
                        match what {
                            "a" if desc.trans_a => "; store A untransposed (M x K) to split it by rows",
                            "b" if !desc.trans_b => "; store B transposed (N x K) to split it by columns",
                            _ => "",
                        }
                    ),
                });
            }
        }
        // One window of a view: `(binding window, element offset inside it)`.
        let window = |v: &MatrixView, b0: usize, r0: usize, c0: usize, nb: usize, rows: usize, cols: usize| {
            let first = v.offset + b0 * v.batch_stride + r0 * v.ld + c0;
            let last = first + (nb - 1) * v.batch_stride + (rows - 1) * v.ld + (cols - 1);
            let start = (first * size) as u64 / align * align;
            let end = ((last + 1) * size) as u64;
            ((start, end.div_ceil(16) * 16 - start), first - start as usize / size)
        };
        let mut launches = Vec::new();
        for b0 in (0..desc.batch).step_by(nb) {
            let nb = nb.min(desc.batch - b0);
            for r0 in (0..desc.m).step_by(rm) {
                let nr = rm.min(desc.m - r0);
                for c0 in (0..desc.n).step_by(cn) {
                    let nc = cn.min(desc.n - c0);
                    let mut sub = MatmulDesc { batch: nb, m: nr, n: nc, ..*desc };
                    let mut binds = Vec::with_capacity(5);
                    if k == 0 {
                        // Nothing of A or B is read.
                        binds.push(whole(0, &self.dummy));
                        binds.push(whole(1, &self.dummy));
                    } else {
                        let (ar0, ac0, ar, ac) = if desc.trans_a { (0, r0, k, nr) } else { (r0, 0, nr, k) };
                        let (w, off) = window(&desc.a, b0, ar0, ac0, nb, ar, ac);
                        binds.push(Bind { slot: 0, buffer: &a.buffer, window: Some(w) });
                        sub.a.offset = off;
                        let (br0, bc0, br, bc) = if desc.trans_b { (c0, 0, nc, k) } else { (0, c0, k, nc) };
                        let (w, off) = window(&desc.b, b0, br0, bc0, nb, br, bc);
                        binds.push(Bind { slot: 1, buffer: &b.buffer, window: Some(w) });
                        sub.b.offset = off;
                    }
                    match (desc.bias_offset, bias) {
                        (Some(bo), Some(bs)) => {
                            let v = MatrixView { offset: bo, ld: 0, batch_stride: 0 };
                            let (w, off) = window(&v, 0, 0, c0, 1, 1, nc);
                            binds.push(Bind { slot: 2, buffer: &bs.buffer, window: Some(w) });
                            sub.bias_offset = Some(off);
                        }
                        _ => binds.push(whole(2, &self.dummy)),
                    }
                    match (desc.c, c) {
                        (Some(cv), Some(cs)) => {
                            let (w, off) = window(&cv, b0, r0, c0, nb, nr, nc);
                            binds.push(Bind { slot: 3, buffer: &cs.buffer, window: Some(w) });
                            sub.c = Some(MatrixView { offset: off, ..cv });
                        }
                        _ => binds.push(whole(3, &self.dummy)),
                    }
                    let (w, off) = window(&desc.out, b0, r0, c0, nb, nr, nc);
                    binds.push(Bind { slot: 4, buffer: &out.buffer, window: Some(w) });
                    sub.out.offset = off;
                    // Offsets of later batches are in the window: the block's batches run
                    // from 0 with the strides unchanged.
                    let params = self.matmul_params(op, &sub)?;
                    let gx = div_ceil_u32(params.n, block_n);
                    let gy = div_ceil_u32(params.m, block_m);
                    for (params, grid) in self.batched_launches(op, params, nb, gx, gy)? {
                        launches.push(Launch { binds: binds.clone(), params, grid });
                    }
                }
            }
        }
        Ok(launches)
    }

    /// The launch of a depthwise convolution with `spec`.
    fn launch_conv(
        &self,
        op: &'static str,
        p: &ConvParams,
        storage: ElementStorage,
        spec: Spec,
        [input, weight, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
    ) -> Result<()> {
        let spec = spec.normalised(Kernel::DepthwiseConv2d);
        let grid = self.grid_1d(op, p.items, spec.wg)?;
        let pipeline = self.pipeline(op, Kernel::DepthwiseConv2d, storage, spec)?;
        let bias = bias.map_or(&self.dummy, |s| &s.buffer);
        let binds = vec![whole(0, &input.buffer), whole(1, &weight.buffer), whole(2, bias), whole(3, &out.buffer)];
        self.record(op, &pipeline, 4, &[Launch { binds, params: bytemuck::bytes_of(p).to_vec(), grid }])
    }

    /// A depthwise convolution whose buffers exceed the storage-binding limit (or `u32`
    /// indices), as launches over blocks, each binding windows of its buffers at aligned
    /// offsets with the offsets inside them in the parameter block. The blocks are the first
    /// of these whose windows all fit: batches (halved until they fit); then, in NCHW, input
    /// channels with all their output channels (whole planes), then single output channels by
    /// output rows; in NHWC, output rows of one image (whole pixels). A row block reads the
    /// input rows its taps reach and runs with the top padding shifted to match. What still
    /// does not fit (a single output row, or NHWC weights over the limit) is
    /// [`Error::Overflow`].
    fn split_conv<'a>(
        &'a self,
        op: &'static str,
        desc: &Conv2dDesc,
        dtype: DType,
        spec: Spec,
        [input, weight, out]: [&'a WgpuStorage; 3],
        bias: Option<&'a WgpuStorage>,
    ) -> Result<Vec<Launch<'a>>> {
        let size = dtype.size_bytes();
        let limit = self.binding_limit();
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op, param: "desc", reason: "empty output".into() });
        };
        let (c, h, w, m) = (desc.channels, desc.height, desc.width, desc.multiplier);
        let oc = desc.out_channels();
        let kk = desc.kernel_h * desc.kernel_w;
        let nhwc = desc.layout == Layout::Nhwc;
        // The window holding elements [first, first + len) and the offset of `first` in it,
        // or None when it is over the limit.
        let window = |first: usize, len: usize| -> Option<((u64, u64), u32)> {
            let start = (first * size) as u64 / align * align;
            let end = ((first + len.max(1)) * size) as u64;
            let bytes = end.div_ceil(16) * 16 - start;
            let off = u32::try_from(first - start as usize / size).ok()?;
            (bytes <= limit).then_some(((start, bytes), off))
        };
        // One block: images [n0, n0 + nb), input channels [c0, c0 + nc) (NCHW), or a single
        // output channel `one_oc` (NCHW), output rows [oy0, oy0 + nr).
        struct Block {
            n0: usize,
            nb: usize,
            c0: usize,
            nc: usize,
            one_oc: Option<usize>,
            oy0: usize,
            nr: usize,
        }
        let block = |b: &Block| -> Result<Option<Launch<'a>>> {
            // Input rows the block's taps reach, and the top padding that maps them.
            let (sh, dh, pt) = (desc.stride_h, desc.dilation_h, desc.pad_top);
            let reach_lo = b.oy0 * sh; // padded coordinates
            let reach_hi = (b.oy0 + b.nr - 1) * sh + (desc.kernel_h - 1) * dh;
            let (lo, rows, pad) = if b.nr == oh {
                (0, h, pt as u64)
            } else if reach_lo >= pt + h || reach_hi < pt {
                // Every tap is in the padding: no input row is read.
                (0, 1, u64::from(u32::MAX))
            } else {
                let lo = reach_lo.saturating_sub(pt);
                let hi = (reach_hi - pt).min(h - 1);
                (lo, hi - lo + 1, (lo + pt - reach_lo) as u64)
            };
            let (channels, mult, out_c, in_first, in_len, w_first, w_len, o_first, o_len, b_first, b_len) = if nhwc {
                let in_first = (b.n0 * h + lo) * w * c;
                let o_first = (b.n0 * oh + b.oy0) * ow * oc;
                (c, m, oc, in_first, b.nb * rows * w * c, 0, oc * kk, o_first, b.nb * b.nr * ow * oc, 0, oc)
            } else if let Some(o) = b.one_oc {
                let in_first = (b.n0 * c + o / m) * h * w + lo * w;
                let o_first = ((b.n0 * oc + o) * oh + b.oy0) * ow;
                (1, 1, 1, in_first, rows * w, o * kk, kk, o_first, b.nr * ow, o, 1)
            } else {
                let in_first = (b.n0 * c + b.c0) * h * w;
                let o_first = (b.n0 * oc + b.c0 * m) * oh * ow;
                let ocs = b.nc * m;
                (
                    b.nc,
                    m,
                    ocs,
                    in_first,
                    b.nb * b.nc * h * w,
                    b.c0 * m * kk,
                    ocs * kk,
                    o_first,
                    b.nb * ocs * oh * ow,
                    b.c0 * m,
                    ocs,
                )
            };
            let (Some((wi, in_off)), Some((ww, w_off)), Some((wo, o_off))) =
                (window(in_first, in_len), window(w_first, w_len), window(o_first, o_len))
            else {
                return Ok(None);
            };
            let mut binds = vec![
                Bind { slot: 0, buffer: &input.buffer, window: Some(wi) },
                Bind { slot: 1, buffer: &weight.buffer, window: Some(ww) },
                Bind { slot: 3, buffer: &out.buffer, window: Some(wo) },
            ];
            let mut b_off = 0;
            match bias {
                Some(bs) => {
                    let Some((wb, off)) = window(b_first, b_len) else { return Ok(None) };
                    binds.push(Bind { slot: 2, buffer: &bs.buffer, window: Some(wb) });
                    b_off = off;
                }
                None => binds.push(whole(2, &self.dummy)),
            }
            let groups = if nhwc { b.nb * b.nr * ow * oc.div_ceil(4) } else { b.nb * out_c * b.nr * ow.div_ceil(4) };
            let mut flags = 0;
            if bias.is_some() {
                flags |= conv_flags::HAS_BIAS;
            }
            let out_vec = if nhwc { out_c.is_multiple_of(4) } else { ow.is_multiple_of(4) };
            if out_vec && o_off.is_multiple_of(4) {
                flags |= conv_flags::OUT_VEC;
            }
            if nhwc && mult == 1 && channels.is_multiple_of(4) && in_off.is_multiple_of(4) {
                flags |= conv_flags::IN_VEC;
            }
            let p = ConvParams {
                batch: to_u32(op, "batch", b.nb)?,
                channels: to_u32(op, "channels", channels)?,
                height: to_u32(op, "height", rows)?,
                width: to_u32(op, "width", w)?,
                mult: to_u32(op, "multiplier", mult)?,
                kh: to_u32(op, "kernel height", desc.kernel_h)?,
                kw: to_u32(op, "kernel width", desc.kernel_w)?,
                stride_h: to_u32(op, "stride", desc.stride_h)?,
                stride_w: to_u32(op, "stride", desc.stride_w)?,
                dil_h: to_u32(op, "dilation", desc.dilation_h)?,
                dil_w: to_u32(op, "dilation", desc.dilation_w)?,
                pad_top: u32::try_from(pad).unwrap_or(u32::MAX),
                pad_left: to_u32(op, "padding", desc.pad_left)?,
                out_h: to_u32(op, "output height", b.nr)?,
                out_w: to_u32(op, "output width", ow)?,
                out_c: to_u32(op, "output channels", out_c)?,
                nhwc: nhwc as u32,
                flags,
                act: desc.activation.code(),
                items: to_u32(op, "output groups", groups)?,
                in_off,
                w_off,
                b_off,
                o_off,
            };
            let grid = self.grid_1d(op, p.items, spec.normalised(Kernel::DepthwiseConv2d).wg)?;
            Ok(Some(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid }))
        };
        let all = |blocks: Vec<Block>| -> Result<Option<Vec<Launch<'a>>>> {
            let mut launches = Vec::with_capacity(blocks.len());
            for b in &blocks {
                match block(b)? {
                    Some(l) => launches.push(l),
                    None => return Ok(None),
                }
            }
            Ok(Some(launches))
        };
        let full = |n0: usize, nb: usize| Block { n0, nb, c0: 0, nc: c, one_oc: None, oy0: 0, nr: oh };
        // Batches.
        let mut nb = desc.batch;
        loop {
            let blocks = (0..desc.batch).step_by(nb).map(|n0| full(n0, nb.min(desc.batch - n0))).collect();
            if let Some(l) = all(blocks)? {
                return Ok(l);
            }
            if nb == 1 {
                break;
            }
            nb = nb.div_ceil(2);
        }
        // NCHW: input channels with all their output channels.
        if !nhwc {
            let mut nc = c.div_ceil(2);
            while nc >= 1 {
                let blocks = (0..desc.batch)
                    .flat_map(|n0| (0..c).step_by(nc).map(move |c0| (n0, c0)))
                    .map(|(n0, c0)| Block { nc: nc.min(c - c0), c0, ..full(n0, 1) })
                    .collect();
                if let Some(l) = all(blocks)? {
                    return Ok(l);
                }
                if nc == 1 {
                    break;
                }
                nc = nc.div_ceil(2);
            }
        }
        // Output rows (of one output channel in NCHW).
        let mut nr = oh.div_ceil(2).max(1);
        loop {
            let units: Vec<(usize, Option<usize>)> = if nhwc {
                (0..desc.batch).map(|n| (n, None)).collect()
            } else {
                (0..desc.batch).flat_map(|n| (0..oc).map(move |o| (n, Some(o)))).collect()
            };
            let blocks = units
                .into_iter()
                .flat_map(|(n0, one_oc)| (0..oh).step_by(nr).map(move |oy0| (n0, one_oc, oy0)))
                .map(|(n0, one_oc, oy0)| Block { one_oc, oy0, nr: nr.min(oh - oy0), ..full(n0, 1) })
                .collect();
            if let Some(l) = all(blocks)? {
                return Ok(l);
            }
            if nr == 1 {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "one output row of the convolution needs bindings over the storage-binding limit ({limit} bytes)"
                    ),
                });
            }
            nr = nr.div_ceil(2);
        }
    }

    /// The autotuner of this device.
    pub(crate) fn tuner(&self) -> &Tuner {
        &self.tuner
    }

    /// What identifies this device and driver in the tune cache: adapter name, API, vendor
    /// and device ids, driver and driver version.
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether `spec` of `kernel` fits this device's limits.
    fn spec_fits(&self, kernel: Kernel, spec: Spec) -> bool {
        let s = spec.normalised(kernel);
        let (wg, bytes) = match kernel {
            Kernel::Matmul => ([s.tile.wg_x, s.tile.wg_y, 1], s.tile.workgroup_bytes()),
            _ => ([s.wg, 1, 1], 0),
        };
        let l = &self.limits;
        bytes <= l.max_compute_workgroup_storage_size
            && wg[0] * wg[1] * wg[2] <= l.max_compute_invocations_per_workgroup
            && wg[0] <= l.max_compute_workgroup_size_x
            && wg[1] <= l.max_compute_workgroup_size_y
    }

    /// The untuned choice: the first candidate; for the tiled matmul on a device allowing
    /// fewer than 256 invocations (GL, some mobile GPUs), the 128-invocation short tile.
    fn default_spec(&self, kernel: Kernel, candidates: &[Spec]) -> Spec {
        let first = candidates.first().copied().unwrap_or(Spec::DEFAULT);
        if kernel == Kernel::Matmul && !self.spec_fits(kernel, first) {
            return Spec { tile: MatmulTile::SHORT, ..first };
        }
        first
    }

    /// The spec an op runs with (see the module documentation and `crate::tune`). `run`
    /// records the op with a given spec; tuning calls it for each candidate.
    fn choose(
        &self,
        kernel: Kernel,
        storage: ElementStorage,
        candidates: &[Spec],
        key_tail: impl FnOnce() -> String,
        run: &dyn Fn(Spec) -> Result<()>,
    ) -> Result<Spec> {
        #[cfg(test)]
        if let Some(spec) = self.force_spec.lock().ok().and_then(|f| *f) {
            return Ok(Spec { rows: candidates.first().map_or(spec.rows, |c| c.rows), ..spec });
        }
        let default = self.default_spec(kernel, candidates);
        let forced = self.forced.lock().map(|f| f.is_some()).unwrap_or(false);
        let mode = self.tuner.mode();
        if mode == TuneMode::Off && !forced {
            return Ok(default);
        }
        let key = format!("{}|{}|{}", self.fingerprint(), storage.name(), key_tail());
        let hash = || crate::tune::hash_hex(cat::source_hash(kernel, storage));
        let rows = default.rows;
        if !forced && let Some(cfg) = self.tuner.lookup(&key, hash, kernel, candidates, |s| self.spec_fits(kernel, s)) {
            return Ok(cfg.spec(kernel, rows));
        }
        if forced || mode == TuneMode::On {
            let mark = self.profile_mark();
            let tuned = self.tune_candidates(kernel, candidates, &key, &hash(), run);
            // Tuning launches are not part of the caller's profile.
            self.profile_truncate(mark);
            let spec = tuned.as_ref().ok().map(|(_, spec)| *spec);
            if forced && let Ok(mut f) = self.forced.lock() {
                *f = Some(Some(tuned.map(|(report, _)| report)));
            }
            // A tuning that failed outright leaves the default.
            return Ok(spec.unwrap_or(default));
        }
        self.tuner.remember(&key, TunedConfig::of(kernel, default));
        Ok(default)
    }

    /// Times each candidate (wall time over whole submissions, best of three batches after a
    /// warm-up that also builds the pipeline), stores the winner and reports.
    fn tune_candidates(
        &self,
        kernel: Kernel,
        candidates: &[Spec],
        key: &str,
        hash: &str,
        run: &dyn Fn(Spec) -> Result<()>,
    ) -> Result<(TuneReport, Spec)> {
        // Each candidate is warmed up (which also builds its pipeline) and sized to a batch of
        // about 50 ms; then TUNING_ROUNDS rounds time one batch of every candidate in turn and
        // each keeps its best round, so a change in the machine's load hits all candidates
        // alike instead of whichever ran during it.
        let mut state: Vec<std::result::Result<(usize, f64), String>> = candidates
            .iter()
            .map(|&spec| {
                if !self.spec_fits(kernel, spec) {
                    return Err("exceeds the device's limits".to_string());
                }
                self.warm_up(run, spec).map(|reps| (reps, f64::MAX)).map_err(|e| e.to_string())
            })
            .collect();
        for _ in 0..TUNING_ROUNDS {
            for (slot, &spec) in state.iter_mut().zip(candidates) {
                if let Ok((reps, best)) = slot {
                    match self.time_batch(run, spec, *reps) {
                        Ok(us) => *best = best.min(us),
                        Err(e) => *slot = Err(e.to_string()),
                    }
                }
            }
        }
        let mut results = Vec::new();
        let mut best: Option<(f64, Spec)> = None;
        for (slot, &spec) in state.into_iter().zip(candidates) {
            let timed = slot.map(|(_, us)| us);
            if let Ok(us) = timed
                && best.is_none_or(|(b, _)| us < b)
            {
                best = Some((us, spec));
            }
            results.push((spec.label(kernel), timed));
        }
        let Some((mut micros, mut spec)) = best else {
            return Err(Error::Backend { backend: KIND, message: format!("no candidate ran for {key}") });
        };
        let default_micros = results.first().and_then(|(_, r)| r.as_ref().ok().copied()).unwrap_or(micros);
        // The default keeps its place unless another candidate beats it clearly: a win inside
        // the timing noise would only make the choice depend on the machine's load.
        if let (Some(&first), Some((_, Ok(_)))) = (candidates.first(), results.first())
            && micros > default_micros * (1.0 - MIN_TUNING_GAIN)
        {
            (micros, spec) = (default_micros, first);
        }
        let entry = CacheEntry {
            config: TunedConfig::of(kernel, spec),
            kernel_hash: hash.to_string(),
            micros,
            default_micros,
            tuned_at: crate::tune::now_secs(),
        };
        let stored = self.tuner.store(key, entry);
        let report = TuneReport {
            key: key.to_string(),
            candidates: results,
            winner: spec.label(kernel),
            winner_micros: micros,
            default_micros,
        };
        stored.map(|()| (report, spec))
    }

    /// Runs `spec` twice (the first builds the pipeline) and returns how many runs make a
    /// batch of about 50 ms (1 to 20).
    fn warm_up(&self, run: &dyn Fn(Spec) -> Result<()>, spec: Spec) -> Result<usize> {
        run(spec)?;
        self.synchronize()?;
        let t = Instant::now();
        run(spec)?;
        self.synchronize()?;
        let once = t.elapsed().as_secs_f64().max(1e-6);
        Ok((0.05 / once).clamp(1.0, 20.0) as usize)
    }

    /// µs per run of a batch of `reps` runs of `spec` (wall time over one wait).
    fn time_batch(&self, run: &dyn Fn(Spec) -> Result<()>, spec: Spec, reps: usize) -> Result<f64> {
        let t = Instant::now();
        for _ in 0..reps {
            run(spec)?;
        }
        self.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
    }

    /// Runs `op` with every choice forced to a full tune, and returns the tune's report.
    fn forced_tune(&self, op: impl FnOnce() -> Result<()>) -> Result<TuneReport> {
        let _one =
            self.forcing.lock().map_err(|_| Error::Backend { backend: KIND, message: "tune lock poisoned".into() })?;
        if let Ok(mut f) = self.forced.lock() {
            *f = Some(None);
        }
        let ran = op();
        let report = self.forced.lock().ok().and_then(|mut f| f.take()).flatten();
        ran?;
        report
            .unwrap_or_else(|| Err(Error::Backend { backend: KIND, message: "the op did not reach the tuner".into() }))
    }

    /// Tunes `desc` on these operands whatever the mode and cache (`Device::tune_matmul`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tune_matmul_now(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<TuneReport> {
        self.forced_tune(|| self.matmul(desc, dtype, a, b, bias, c, out))
    }

    /// Tunes `desc` on these tensors whatever the mode and cache (`Device::tune_depthwise_conv2d`).
    pub(crate) fn tune_conv_now(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &WgpuStorage,
        weight: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<TuneReport> {
        self.forced_tune(|| self.depthwise_conv2d(desc, dtype, input, weight, bias, out))
    }

    /// Whether profiles get device time from timestamps.
    pub(crate) fn has_timestamps(&self) -> bool {
        self.timestamps
    }

    fn lock_prof(&self) -> Result<std::sync::MutexGuard<'_, ProfInner>> {
        self.prof
            .inner
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the profile lock was poisoned".into() })
    }

    /// Opens a profile: from now on every pass writes timestamps (where the device has them)
    /// and every launch is listed.
    pub(crate) fn profile_start(&self) -> Result<()> {
        *self.lock_prof()? = ProfInner::default();
        self.prof.active.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The launches recorded since the last call.
    pub(crate) fn profile_take(&self) -> Vec<LaunchInfo> {
        self.lock_prof().map(|mut p| std::mem::take(&mut p.launches)).unwrap_or_default()
    }

    fn profile_mark(&self) -> usize {
        self.lock_prof().map(|p| p.launches.len()).unwrap_or(0)
    }

    fn profile_truncate(&self, mark: usize) {
        if let Ok(mut p) = self.lock_prof() {
            p.launches.truncate(mark);
        }
    }

    /// A query pair per launch (where the device has timestamps), and the launches listed.
    fn profile_queries(
        &self,
        pipeline: &Pipeline,
        launches: &[Launch<'_>],
    ) -> Result<Vec<Option<(wgpu::QuerySet, u32)>>> {
        let mut inner = self.lock_prof()?;
        let mut out = Vec::with_capacity(launches.len());
        for launch in launches {
            let query = if self.timestamps {
                if inner.sets.is_empty() || inner.used + 2 > QUERIES_PER_SET {
                    let set = self.scoped(0, || {
                        self.device.create_query_set(&wgpu::QuerySetDescriptor {
                            label: Some("tilekit profile"),
                            ty: wgpu::QueryType::Timestamp,
                            count: QUERIES_PER_SET,
                        })
                    })?;
                    inner.sets.push(set);
                    inner.used = 0;
                }
                let slot = inner.used;
                inner.used += 2;
                Some((inner.sets.len() - 1, slot))
            } else {
                None
            };
            inner.launches.push(LaunchInfo {
                kernel: pipeline.name.clone(),
                grid: launch.grid,
                workgroup: pipeline.workgroup,
                query,
            });
            out.push(query.map(|(i, slot)| (inner.sets[i].clone(), slot)));
        }
        Ok(out)
    }

    /// Closes the profile: waits for the device, resolves every timestamp and returns them in
    /// nanoseconds, by query set and slot.
    pub(crate) fn profile_finish(&self) -> Result<Vec<Vec<f64>>> {
        self.prof.active.store(false, Ordering::Relaxed);
        let (sets, used) = {
            let mut p = self.lock_prof()?;
            (std::mem::take(&mut p.sets), p.used)
        };
        self.synchronize()?;
        let period = f64::from(self.queue.get_timestamp_period());
        let last = sets.len().saturating_sub(1);
        let mut all = Vec::with_capacity(sets.len());
        for (i, set) in sets.iter().enumerate() {
            let n = if i == last { used } else { QUERIES_PER_SET };
            if n == 0 {
                all.push(Vec::new());
                continue;
            }
            let bytes = u64::from(n) * 8;
            let make = |usage, label| {
                self.scoped(bytes, || {
                    self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size: bytes,
                        usage,
                        mapped_at_creation: false,
                    })
                })
            };
            let resolve = make(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, "tilekit resolve")?;
            let staging = make(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "tilekit timestamps")?;
            let index = {
                let mut pending = self.lock_pending()?;
                let cmd = self.scoped(0, || {
                    let mut enc = self
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tilekit resolve") });
                    enc.resolve_query_set(set, 0..n, &resolve, 0);
                    enc.copy_buffer_to_buffer(&resolve, 0, &staging, 0, bytes);
                    enc.finish()
                })?;
                self.submit(&mut pending, Some(cmd))?
            };
            let raw = self.read_staging(&staging, index)?;
            all.push(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64 * period)
                    .collect(),
            );
        }
        Ok(all)
    }

    /// Maps `staging` once submission `index` is done and copies it out.
    fn read_staging(&self, staging: &wgpu::Buffer, index: Option<wgpu::SubmissionIndex>) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.scoped(0, || {
            staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            })
        })?;
        self.wait(index)?;
        match rx.recv_timeout(WAIT_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Backend { backend: KIND, message: format!("mapping failed: {e}") }),
            Err(_) => return Err(Error::Backend { backend: KIND, message: "the read-back never completed".into() }),
        }
        let out = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Backend { backend: KIND, message: format!("mapping failed: {e}") })?
            .to_vec();
        staging.unmap();
        Ok(out)
    }

    fn element_count_fits(&self, op: &'static str, what: &str, s: &WgpuStorage) -> Result<()> {
        to_u32(op, what, s.len).map(|_| ())
    }
}

impl BackendOps for WgpuBackend {
    type Storage = WgpuStorage;

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Wgpu(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        // Every dtype runs: f16 natively or packed, bf16 packed.
        Ok(())
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<WgpuStorage> {
        let bytes = padded_bytes(dtype, len)
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        Ok(WgpuStorage { buffer: self.create_buffer(bytes, None)?, len, dtype })
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<WgpuStorage> {
        let len = bytes.len() / dtype.size_bytes();
        let padded = padded_bytes(dtype, len)
            .ok_or_else(|| Error::Overflow { op: "upload", what: format!("{len} elements of {dtype}") })?;
        let mut data = Vec::new();
        data.try_reserve_exact(padded as usize).map_err(|_| Error::OutOfMemory { backend: KIND, bytes: padded })?;
        data.extend_from_slice(bytes);
        data.resize(padded as usize, 0);
        Ok(WgpuStorage { buffer: self.create_buffer(padded, Some(&data))?, len, dtype })
    }

    fn download(&self, s: &WgpuStorage, dtype: DType) -> Result<Vec<u8>> {
        let _ = dtype; // The storage knows its own dtype.
        let bytes = s.len * s.dtype.size_bytes();
        let size = s.buffer.size();
        let staging = self.scoped(size, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tilekit download"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let index = {
            let mut pending = self.lock_pending()?;
            let copy = self.scoped(0, || {
                let mut enc = self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tilekit download") });
                enc.copy_buffer_to_buffer(&s.buffer, 0, &staging, 0, size);
                enc.finish()
            })?;
            self.submit(&mut pending, Some(copy))?
        };
        let mut out = self.read_staging(&staging, index)?;
        out.truncate(bytes);
        Ok(out)
    }

    fn matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        let op = "matmul";
        let storage = self.storage_variant(dtype);
        // A few rows take the kernel without workgroup memory; the others the tiled kernel
        // with a tile of their row class; the tuner picks among the candidates.
        let (kernel, candidates) = cat::matmul_candidates(desc.m);
        let run = |spec: Spec| self.launch_matmul(op, desc, dtype, storage, kernel, spec, [a, b, out], bias, c);
        let spec = self.choose(kernel, storage, &candidates, || crate::tune::matmul_key_tail(desc), &run)?;
        run(spec)
    }

    fn depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &WgpuStorage,
        weight: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        let op = "depthwise_conv2d";
        let limit = self.binding_limit();
        let buffers = [Some(input), Some(weight), bias, Some(out)];
        if buffers.into_iter().flatten().any(|s| s.buffer.size() > limit || u32::try_from(s.len).is_err()) {
            // Over the storage-binding limit or past u32 indices: blocks bound as windows.
            let storage = self.storage_variant(dtype);
            let kernel = Kernel::DepthwiseConv2d;
            let candidates = cat::conv_candidates();
            let run = |spec: Spec| {
                let launches = self.split_conv(op, desc, dtype, spec, [input, weight, out], bias)?;
                let pipeline = self.pipeline(op, kernel, storage, spec)?;
                self.record(op, &pipeline, 4, &launches)
            };
            let spec = self.choose(kernel, storage, &candidates, || crate::tune::conv_key_tail(desc), &run)?;
            return run(spec);
        }
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op, param: "desc", reason: "empty output".into() });
        };
        let oc = desc.out_channels();
        // Padded extents bound every padded coordinate the kernel computes.
        let padded_h = desc.height.checked_add(desc.pad_top).and_then(|v| v.checked_add(desc.pad_bottom));
        let padded_w = desc.width.checked_add(desc.pad_left).and_then(|v| v.checked_add(desc.pad_right));
        to_u32(op, "padded height", padded_h.unwrap_or(usize::MAX))?;
        to_u32(op, "padded width", padded_w.unwrap_or(usize::MAX))?;
        let groups = match desc.layout {
            Layout::Nchw => {
                desc.batch.checked_mul(oc).and_then(|v| v.checked_mul(oh)).and_then(|v| v.checked_mul(ow.div_ceil(4)))
            }
            Layout::Nhwc => {
                desc.batch.checked_mul(oh).and_then(|v| v.checked_mul(ow)).and_then(|v| v.checked_mul(oc.div_ceil(4)))
            }
        };
        let items = to_u32(op, "output groups", groups.unwrap_or(usize::MAX))?;
        let mut flags = 0;
        if bias.is_some() {
            flags |= conv_flags::HAS_BIAS;
        }
        match desc.layout {
            Layout::Nchw if ow.is_multiple_of(4) => flags |= conv_flags::OUT_VEC,
            Layout::Nhwc if oc.is_multiple_of(4) => flags |= conv_flags::OUT_VEC,
            _ => {}
        }
        if desc.layout == Layout::Nhwc && desc.multiplier == 1 && desc.channels.is_multiple_of(4) {
            flags |= conv_flags::IN_VEC;
        }
        let p = ConvParams {
            batch: to_u32(op, "batch", desc.batch)?,
            channels: to_u32(op, "channels", desc.channels)?,
            height: to_u32(op, "height", desc.height)?,
            width: to_u32(op, "width", desc.width)?,
            mult: to_u32(op, "multiplier", desc.multiplier)?,
            kh: to_u32(op, "kernel height", desc.kernel_h)?,
            kw: to_u32(op, "kernel width", desc.kernel_w)?,
            stride_h: to_u32(op, "stride", desc.stride_h)?,
            stride_w: to_u32(op, "stride", desc.stride_w)?,
            dil_h: to_u32(op, "dilation", desc.dilation_h)?,
            dil_w: to_u32(op, "dilation", desc.dilation_w)?,
            pad_top: to_u32(op, "padding", desc.pad_top)?,
            pad_left: to_u32(op, "padding", desc.pad_left)?,
            out_h: to_u32(op, "output height", oh)?,
            out_w: to_u32(op, "output width", ow)?,
            out_c: to_u32(op, "output channels", oc)?,
            nhwc: (desc.layout == Layout::Nhwc) as u32,
            flags,
            act: desc.activation.code(),
            items,
            ..ConvParams::default()
        };
        let storage = self.storage_variant(dtype);
        let kernel = Kernel::DepthwiseConv2d;
        let candidates = cat::conv_candidates();
        let run = |spec: Spec| self.launch_conv(op, &p, storage, spec, [input, weight, out], bias);
        let spec = self.choose(kernel, storage, &candidates, || crate::tune::conv_key_tail(desc), &run)?;
        run(spec)
    }

    fn activation(
        &self,
        desc: &ActivationDesc,
        dtype: DType,
        x: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        let op = "activation";
        let in_place = std::ptr::eq(x, out) || x.buffer == out.buffer;
        let kernel = if in_place { Kernel::ActivationInPlace } else { Kernel::Activation };
        let pipeline = self.pipeline(op, kernel, self.storage_variant(dtype), Spec::DEFAULT)?;
        let bias_buffer = bias.map_or(&self.dummy, |s| &s.buffer);
        let size = dtype.size_bytes();
        // Tensors over the storage-binding limit run in chunks, each bound as a window.
        let mut launches = Vec::new();
        for (first, count) in self.chunks(op, desc.len, size)? {
            let len = to_u32(op, "len", count)?;
            let mut p = ActivationParams {
                len,
                act: desc.activation.code(),
                items: len.div_ceil(4),
                ..ActivationParams::default()
            };
            if let (Some(bl), Some(_)) = (desc.bias_len, bias) {
                p.bias_len = to_u32(op, "bias length", bl)?.max(1);
                // Where this chunk starts in the bias row.
                p.bias_phase = to_u32(op, "bias phase", first % bl.max(1))?;
                p.flags |= activation_flags::HAS_BIAS;
                if bl.is_multiple_of(4) {
                    p.flags |= activation_flags::BIAS_VEC;
                }
            }
            let grid = self.grid_1d(op, p.items, cat::WG_1D)?;
            let offset = (first * size) as u64;
            let window = Some((offset, ((count * size) as u64).div_ceil(16) * 16));
            let mut binds = vec![whole(1, bias_buffer), Bind { slot: 2, buffer: &out.buffer, window }];
            if !in_place {
                binds.push(Bind { slot: 0, buffer: &x.buffer, window });
            }
            launches.push(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid });
        }
        self.record(op, &pipeline, 3, &launches)
    }

    fn copy(&self, dtype: DType, src: &WgpuStorage, dst: &WgpuStorage, len: usize) -> Result<()> {
        let op = "copy";
        let size = dtype.size_bytes();
        let pipeline = self.pipeline(op, Kernel::Copy, ElementStorage::F32, Spec::DEFAULT)?;
        let mut launches = Vec::new();
        for (first, count) in self.chunks(op, len, size)? {
            let bytes = count * size;
            let words = to_u32(op, "words", bytes / 4)?;
            let tail_half = (!bytes.is_multiple_of(4)) as u32;
            let items = (words as u64 + tail_half as u64).div_ceil(4) as u32;
            let p = CopyParams { words, tail_half, items, _pad: 0 };
            let grid = self.grid_1d(op, items, cat::WG_1D)?;
            let window = Some(((first * size) as u64, (bytes as u64).div_ceil(16) * 16));
            let binds =
                vec![Bind { slot: 0, buffer: &src.buffer, window }, Bind { slot: 1, buffer: &dst.buffer, window }];
            launches.push(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid });
        }
        self.record(op, &pipeline, 2, &launches)
    }

    fn naive_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        out: &WgpuStorage,
    ) -> Result<bool> {
        let op = "naive_matmul";
        for (what, s) in [("a", a), ("b", b), ("out", out)] {
            self.element_count_fits(op, what, s)?;
        }
        let params = self.matmul_params(op, desc)?;
        let gx = div_ceil_u32(params.n, cat::NAIVE_WG);
        let gy = div_ceil_u32(params.m, cat::NAIVE_WG);
        let launches = self.batched_launches(op, params, desc.batch, gx, gy)?;
        let pipeline = self.pipeline(op, Kernel::MatmulNaive, self.storage_variant(dtype), Spec::DEFAULT)?;
        let binds = vec![whole(0, &a.buffer), whole(1, &b.buffer), whole(2, &out.buffer)];
        let launches: Vec<Launch<'_>> =
            launches.into_iter().map(|(params, grid)| Launch { binds: binds.clone(), params, grid }).collect();
        self.record(op, &pipeline, 3, &launches)?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        let index = {
            let mut pending = self.lock_pending()?;
            self.submit(&mut pending, None)?
        };
        self.wait(index)
    }
}

/// Engine interop: what `Device::wgpu_device` and `Device::flush` hand out.
impl WgpuBackend {
    /// The device and queue, for engines that encode their own passes around tilekit's.
    pub(crate) fn raw(&self) -> (&wgpu::Device, &wgpu::Queue) {
        (&self.device, &self.queue)
    }

    /// Submits the recorded ops without waiting for them, so work the caller submits to the
    /// same queue afterwards is ordered after them.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut pending = self.lock_pending()?;
        self.submit(&mut pending, None).map(drop)
    }
}
