//! [`Device`]: one backend, chosen at run time, and the probe that chooses it.

#[cfg(feature = "cuda")]
use crate::backend::cuda;
#[cfg(not(all(feature = "wgpu", feature = "cuda")))]
use crate::backend::not_compiled_in;
#[cfg(feature = "wgpu")]
use crate::backend::wgpu as wgpu_backend;
use crate::backend::{Backend, BackendOps, Storage, cpu, with_backend};
use crate::{Error, Result, Tensor};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tilekit_kernels::DType;

/// Which backend a [`Device`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BackendKind {
    /// The native CPU backend (`gemm` crate + rayon).
    Cpu,
    /// WGSL kernels through wgpu (Vulkan, Metal, DX12, GL).
    Wgpu,
    /// CUDA kernels shipped as PTX, loaded through cudarc.
    Cuda,
}

impl BackendKind {
    /// The order [`Device::auto`] tries them in.
    pub const PROBE_ORDER: [BackendKind; 3] = [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu];

    /// The lower-case name (`cpu`, `wgpu`, `cuda`).
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Parses a backend name; `None` for `auto`, an error for anything unknown.
    pub fn parse(s: &str) -> Result<Option<BackendKind>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "cpu" => Ok(Some(BackendKind::Cpu)),
            "wgpu" => Ok(Some(BackendKind::Wgpu)),
            "cuda" => Ok(Some(BackendKind::Cuda)),
            _ => Err(Error::UnknownBackend(s.to_string())),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How to pick a wgpu adapter.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct WgpuOptions {
    /// Accept a software adapter (lavapipe, llvmpipe, WARP). Off by default: such adapters run
    /// about 100× slower than the native CPU backend. The tests turn it on.
    pub allow_software: bool,
    /// Only adapters whose name contains this (case-insensitive) string.
    pub adapter_name: Option<String>,
    /// Store f16 packed in `u32` words even where the adapter has `SHADER_F16` (the path for
    /// devices without it; the tests force it to cover it everywhere).
    pub force_packed_f16: bool,
    /// Leave out subgroup operations even where the adapter has `SUBGROUP`: the GEMV kernel
    /// then reduces through workgroup memory, as on devices without the feature (the tests
    /// force it to cover that path).
    pub no_subgroups: bool,
    /// Request `wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX` where the adapter has it (set
    /// by [`WgpuOptions::with_experimental_cooperative_matrix`]).
    pub(crate) experimental_cooperative_matrix: bool,
}

impl WgpuOptions {
    /// Options that accept a software adapter (what the tests and CI use).
    pub fn allow_software() -> WgpuOptions {
        WgpuOptions { allow_software: true, ..WgpuOptions::default() }
    }

    /// Request wgpu's experimental cooperative matrices where the adapter has them: f16
    /// matmuls with more than 16 rows then run on them where the adapter reports 16 × 16 × 16
    /// or 8 × 8 × 8 tiles with f16 inputs and f32 accumulators (and a fixed subgroup size).
    /// That kernel is compiled and validated, and matched the reference on an H200 through
    /// NVIDIA's Vulkan driver (16 × 16 tiles); it has not been timed.
    ///
    /// # Safety
    /// wgpu 30's contract for experimental features (`wgpu::ExperimentalFeatures::enabled`):
    /// the implementation may contain bugs with undefined behaviour that otherwise safe calls
    /// can reach. Calling this accepts that contract for the device these options make.
    pub unsafe fn with_experimental_cooperative_matrix(mut self) -> WgpuOptions {
        self.experimental_cooperative_matrix = true;
        self
    }
}

/// One line of a [`ProbeReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeEntry {
    /// The backend probed.
    pub backend: BackendKind,
    /// Whether it could be used.
    pub available: bool,
    /// Whether it was chosen.
    pub chosen: bool,
    /// What was found, or why it is not usable or not chosen.
    pub detail: String,
}

/// What backend selection found, and why it chose what it chose.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// One entry per backend, in probe order.
    pub entries: Vec<ProbeEntry>,
}

impl ProbeReport {
    /// The chosen backend, if any.
    pub fn chosen(&self) -> Option<BackendKind> {
        self.entries.iter().find(|e| e.chosen).map(|e| e.backend)
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            let mark = match (e.chosen, e.available) {
                (true, _) => "chosen   ",
                (false, true) => "available",
                (false, false) => "absent   ",
            };
            writeln!(f, "  {:<5} {mark}  {}", e.backend.name(), e.detail)?;
        }
        Ok(())
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct DeviceInner {
    pub(crate) id: u64,
    pub(crate) backend: Backend,
    pub(crate) report: ProbeReport,
    /// The open profile, if any (`crate::profile`).
    pub(crate) profiler: crate::profile::Profiler,
    /// Bytes of live tensor buffers ([`Device::live_buffer_bytes`]).
    pub(crate) live_bytes: AtomicU64,
}

/// A compute device: one backend, shared cheaply (`Clone` is an `Arc` clone). `Send + Sync`:
/// several threads may issue ops on one device.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("backend", &self.kind()).field("description", &self.description()).finish()
    }
}

impl Device {
    fn from_backend(backend: Backend, report: ProbeReport) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                id: next_id(),
                backend,
                report,
                profiler: Default::default(),
                live_bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Chooses a backend: `TILEKIT_BACKEND` (`cpu`, `wgpu`, `cuda`, `auto`) when set; else CUDA
    /// where a driver and GPU are present, else a hardware wgpu adapter, else the native CPU.
    /// A software wgpu adapter is never chosen here (the CPU backend is ~100× faster); ask for
    /// it with [`Device::wgpu`]. Never panics; [`Device::probe_report`] says what was found.
    pub fn auto() -> Result<Device> {
        match std::env::var("TILEKIT_BACKEND") {
            Ok(v) => match BackendKind::parse(&v)? {
                Some(kind) => Device::with_backend(kind),
                None => Ok(Device::auto_probe()),
            },
            Err(_) => Ok(Device::auto_probe()),
        }
    }

    /// A device on the named backend (for `wgpu`, software adapters are accepted, since the
    /// caller asked for wgpu by name).
    pub fn with_backend(kind: BackendKind) -> Result<Device> {
        match kind {
            BackendKind::Cpu => Ok(Device::cpu()),
            BackendKind::Wgpu => Device::wgpu(&WgpuOptions::allow_software()),
            BackendKind::Cuda => Device::cuda(0),
        }
    }

    /// The probe: tries each backend in [`BackendKind::PROBE_ORDER`] and records why.
    fn auto_probe() -> Device {
        let mut entries = Vec::new();
        #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_mut))]
        let mut chosen: Option<Backend> = None;

        #[cfg(not(feature = "cuda"))]
        entries.push(not_compiled_in_entry(BackendKind::Cuda));
        #[cfg(feature = "cuda")]
        match cuda::probe() {
            Ok(detail) => match cuda::CudaBackend::new(0) {
                Ok(b) => {
                    entries.push(ProbeEntry { backend: BackendKind::Cuda, available: true, chosen: true, detail });
                    chosen = Some(Backend::Cuda(b));
                }
                Err(e) => entries.push(ProbeEntry {
                    backend: BackendKind::Cuda,
                    available: false,
                    chosen: false,
                    detail: format!("{detail}, but initialisation failed: {e}"),
                }),
            },
            Err(reason) => {
                entries.push(ProbeEntry { backend: BackendKind::Cuda, available: false, chosen: false, detail: reason })
            }
        }

        #[cfg(not(feature = "wgpu"))]
        entries.push(not_compiled_in_entry(BackendKind::Wgpu));
        #[cfg(feature = "wgpu")]
        let wgpu_entry = match wgpu_backend::probe_adapters() {
            Err(reason) => ProbeEntry { backend: BackendKind::Wgpu, available: false, chosen: false, detail: reason },
            Ok(adapters) if adapters.is_empty() => ProbeEntry {
                backend: BackendKind::Wgpu,
                available: false,
                chosen: false,
                detail: "no adapter found (no Vulkan, Metal, DX12 or GL driver)".into(),
            },
            Ok(adapters) => {
                let names: Vec<String> = adapters
                    .iter()
                    .map(|a| format!("{} ({}{})", a.name, a.backend, if a.software { ", software" } else { "" }))
                    .collect();
                let hardware = adapters.iter().any(|a| !a.software);
                if chosen.is_some() {
                    ProbeEntry {
                        backend: BackendKind::Wgpu,
                        available: true,
                        chosen: false,
                        detail: format!("{}; not chosen: CUDA comes first", names.join(", ")),
                    }
                } else if !hardware {
                    ProbeEntry {
                        backend: BackendKind::Wgpu,
                        available: true,
                        chosen: false,
                        detail: format!(
                            "{}; not chosen: software adapters run ~100x slower than the CPU backend (ask for them with TILEKIT_BACKEND=wgpu)",
                            names.join(", ")
                        ),
                    }
                } else {
                    match wgpu_backend::WgpuBackend::new(&WgpuOptions::default()) {
                        Ok(b) => {
                            let detail = b.description();
                            chosen = Some(Backend::Wgpu(b));
                            ProbeEntry { backend: BackendKind::Wgpu, available: true, chosen: true, detail }
                        }
                        Err(e) => ProbeEntry {
                            backend: BackendKind::Wgpu,
                            available: false,
                            chosen: false,
                            detail: format!("{}; device creation failed: {e}", names.join(", ")),
                        },
                    }
                }
            }
        };
        #[cfg(feature = "wgpu")]
        entries.push(wgpu_entry);

        let cpu = cpu::CpuBackend;
        let is_chosen = chosen.is_none();
        entries.push(ProbeEntry {
            backend: BackendKind::Cpu,
            available: true,
            chosen: is_chosen,
            detail: if is_chosen {
                cpu.description()
            } else {
                format!("{}; not chosen: a GPU backend comes first", cpu.description())
            },
        });
        let backend = chosen.unwrap_or(Backend::Cpu(cpu));
        Device::from_backend(backend, ProbeReport { entries })
    }

    /// The native CPU backend (always available).
    pub fn cpu() -> Device {
        let cpu = cpu::CpuBackend;
        let report = ProbeReport {
            entries: vec![ProbeEntry {
                backend: BackendKind::Cpu,
                available: true,
                chosen: true,
                detail: cpu.description(),
            }],
        };
        Device::from_backend(Backend::Cpu(cpu), report)
    }

    /// A wgpu device on the first adapter `options` accepts (hardware adapters first).
    /// [`Error::BackendUnavailable`] ("not compiled in") without the `wgpu` feature.
    #[cfg(not(feature = "wgpu"))]
    pub fn wgpu(options: &WgpuOptions) -> Result<Device> {
        let _ = options;
        Err(not_compiled_in(BackendKind::Wgpu))
    }

    /// A wgpu device on the first adapter `options` accepts (hardware adapters first).
    #[cfg(feature = "wgpu")]
    pub fn wgpu(options: &WgpuOptions) -> Result<Device> {
        let b = wgpu_backend::WgpuBackend::new(options)?;
        let report = ProbeReport {
            entries: vec![ProbeEntry {
                backend: BackendKind::Wgpu,
                available: true,
                chosen: true,
                detail: b.description(),
            }],
        };
        Ok(Device::from_backend(Backend::Wgpu(b), report))
    }

    /// Wraps a `wgpu::Device` and `wgpu::Queue` the caller already owns (an engine's own), so
    /// tilekit's kernels run on it without copies.
    #[cfg(feature = "wgpu")]
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Result<Device> {
        let b = wgpu_backend::WgpuBackend::from_raw(device, queue)?;
        let report = ProbeReport {
            entries: vec![ProbeEntry {
                backend: BackendKind::Wgpu,
                available: true,
                chosen: true,
                detail: b.description(),
            }],
        };
        Ok(Device::from_backend(Backend::Wgpu(b), report))
    }

    /// A CUDA device on GPU `ordinal`, with its own context and stream.
    /// [`Error::BackendUnavailable`] ("not compiled in") without the `cuda` feature.
    #[cfg(not(feature = "cuda"))]
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let _ = ordinal;
        Err(not_compiled_in(BackendKind::Cuda))
    }

    /// A CUDA device on GPU `ordinal`, with its own context and stream.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Ok(Device::from_cuda_backend(cuda::CudaBackend::new(ordinal)?))
    }

    /// Wraps a CUDA context and stream the caller already owns (an engine's own): every
    /// tilekit launch, allocation and upload on this device is queued on `stream`, and no op
    /// waits for the GPU (only [`Tensor::to_vec`] and friends, and [`Device::synchronize`],
    /// do). The engine orders its own work against tilekit's by using the same stream, or by
    /// events it records on it. `stream` must belong to `ctx`.
    ///
    /// The context's event tracking is left as the engine set it: with it on, cudarc orders
    /// tilekit's use of engine slices against other streams; with it off (what tilekit's own
    /// devices do), the engine orders them itself.
    ///
    /// Errors: [`Error::BackendUnavailable`] for a stream of another context, a GPU older than
    /// the kernels need (sm_80) or a driver too old for the PTX.
    #[cfg(feature = "cuda")]
    pub fn from_cuda(
        ctx: std::sync::Arc<cudarc::driver::CudaContext>,
        stream: std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Result<Device> {
        Ok(Device::from_cuda_backend(cuda::CudaBackend::from_raw(ctx, stream)?))
    }

    #[cfg(feature = "cuda")]
    fn from_cuda_backend(b: cuda::CudaBackend) -> Device {
        let report = ProbeReport {
            entries: vec![ProbeEntry {
                backend: BackendKind::Cuda,
                available: true,
                chosen: true,
                detail: b.description(),
            }],
        };
        Device::from_backend(Backend::Cuda(b), report)
    }

    /// What the backend probe found when this device was made.
    pub fn probe_report(&self) -> &ProbeReport {
        &self.inner.report
    }

    /// The backend this device runs on.
    pub fn kind(&self) -> BackendKind {
        with_backend!(self, be => kind_of(be))
    }

    /// A one-line description (adapter name, driver, threads).
    pub fn description(&self) -> String {
        with_backend!(self, be => be.description())
    }

    /// Whether this device is a software rasteriser pretending to be a GPU (lavapipe).
    pub fn is_software(&self) -> bool {
        with_backend!(self, be => be.is_software())
    }

    /// Whether ops in `dtype` can run on this device; the error says why not.
    pub fn check_dtype(&self, dtype: DType) -> Result<()> {
        with_backend!(self, be => be.check_dtype("alloc", dtype))
    }

    /// The `wgpu::Device` and `wgpu::Queue` this device runs on (`None` on other backends), for
    /// engines that record their own passes around tilekit's ops. See [`Tensor::wgpu_buffer`].
    /// (A wgpu-only accessor: the one place outside `with_backend!` that names a backend.)
    #[cfg(feature = "wgpu")]
    pub fn wgpu_device(&self) -> Option<(&wgpu::Device, &wgpu::Queue)> {
        match &self.inner.backend {
            Backend::Wgpu(b) => Some(b.raw()),
            _ => None,
        }
    }

    /// Hands every recorded op to the device without waiting for it. On wgpu, ops are batched
    /// into few submissions; an engine that submits its own work reading tilekit's outputs to
    /// the same queue calls this first. The CPU runs ops at once and CUDA orders them on its
    /// stream, so there it does nothing.
    pub fn flush(&self) -> Result<()> {
        with_backend!(self, be => be.flush())
    }

    /// Waits until every queued op has finished.
    pub fn synchronize(&self) -> Result<()> {
        with_backend!(self, be => be.synchronize())
    }

    /// Bytes of device memory held by this device's live tensor buffers (every tensor made on
    /// it and not yet dropped, counted once per buffer however many tensors share it): a
    /// diagnostic for leak checks. It counts the elements asked for, not the backend's
    /// padding or its internal temporaries (uniform blocks, staging buffers, pools; on the CPU,
    /// the freed buffers of 64 KiB or more it keeps for later ops' outputs, up to 64 MiB per
    /// element type for the process).
    pub fn live_buffer_bytes(&self) -> u64 {
        self.inner.live_bytes.load(Ordering::Relaxed)
    }

    /// A zero-filled buffer of `len` elements.
    pub(crate) fn alloc_storage(&self, dtype: DType, len: usize) -> Result<Storage> {
        with_backend!(self, be => be.alloc_zeroed(dtype, len).map(wrap_of(be)))
    }

    /// A buffer of `len` elements an op is about to write in full (contents unspecified until
    /// then; see `BackendOps::alloc_output`).
    pub(crate) fn alloc_output_storage(&self, dtype: DType, len: usize) -> Result<Storage> {
        with_backend!(self, be => be.alloc_output(dtype, len).map(wrap_of(be)))
    }

    pub(crate) fn upload_storage(&self, dtype: DType, bytes: &[u8]) -> Result<Storage> {
        with_backend!(self, be => be.upload(dtype, bytes).map(wrap_of(be)))
    }

    pub(crate) fn download_storage(&self, t: &Tensor) -> Result<Vec<u8>> {
        with_backend!(self, be => download(be, t))
    }
}

/// The probe's line for a backend this build does not contain.
#[cfg(not(all(feature = "wgpu", feature = "cuda")))]
fn not_compiled_in_entry(backend: BackendKind) -> ProbeEntry {
    let detail = match not_compiled_in(backend) {
        Error::BackendUnavailable { reason, .. } => reason,
        other => other.to_string(),
    };
    ProbeEntry { backend, available: false, chosen: false, detail }
}

fn kind_of<B: BackendOps>(_: &B) -> BackendKind {
    B::KIND
}

fn wrap_of<B: BackendOps>(_: &B) -> fn(B::Storage) -> Storage {
    B::wrap
}

fn download<B: BackendOps>(be: &B, t: &Tensor) -> Result<Vec<u8>> {
    let s = B::storage_of(&t.buffer.storage).ok_or(Error::DeviceMismatch { op: "download", tensor: "tensor" })?;
    be.download(s, t.dtype())
}

// The public face promises `Send + Sync`; this fails to compile if a backend breaks it.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Device>();
    assert_send_sync::<Tensor>();
};
