//! The backends behind [`crate::Device`].
//!
//! Each backend is one module implementing [`BackendOps`] over its own storage type. The
//! public face reaches a backend only through [`with_backend!`], the one `match` over
//! [`Backend`], which calls code generic over `B: BackendOps`; what a backend has nothing to
//! do for (flushing, tuning, profiling launches) has a default method. Adding a backend means
//! a new module, an arm in [`Backend`], [`Storage`] and `with_backend!`, its
//! [`crate::BackendKind`], and a probe entry (`device.rs`). Ops reach a backend already
//! validated: shapes, views, dtypes, aliasing and devices have been checked, so a backend only
//! reports what it alone can know (out of memory, a lost device, an unsupported dtype).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "wgpu")]
pub(crate) mod wgpu;

use crate::profile::LaunchInfo;
use crate::tune::{TuneMode, TuneReport};
use crate::{BackendKind, Error, Result};
use std::path::PathBuf;
use tilekit_kernels::quant::GgmlType;
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, GluDesc, InvertedResidualDesc, MatmulDesc};

/// A quantized weight `[n, k]` as a backend sees it: its type and its two planes (see
/// `quant_tensor.rs` for their layout).
pub(crate) struct QuantView<'a, S> {
    pub(crate) ty: GgmlType,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) scales: &'a S,
    pub(crate) body: &'a S,
}

/// The error of a tuning call on a backend without tunable kernels.
pub(crate) fn nothing_to_tune(backend: BackendKind) -> Error {
    Error::Backend {
        backend,
        message: "autotuning covers the wgpu kernels only; this backend has no tile configurations".into(),
    }
}

/// The operands of [`BackendOps::inverted_residual`] (see `ops/block.rs`), validated.
pub(crate) struct BlockArgs<'s, S> {
    pub(crate) x: &'s S,
    pub(crate) expand: Option<&'s S>,
    pub(crate) expand_bias: Option<&'s S>,
    pub(crate) depthwise: &'s S,
    pub(crate) depthwise_bias: Option<&'s S>,
    pub(crate) project: &'s S,
    pub(crate) project_bias: Option<&'s S>,
    /// The 1 × 1 weights transposed ahead of the call (f32, expand `[C][hidden]`, projection
    /// `[hidden][C']`; `crate::PackedBlock` on the CPU), or `None`. Backends that read the
    /// weights as stored ignore them.
    pub(crate) expand_t: Option<&'s S>,
    pub(crate) project_t: Option<&'s S>,
}

impl<'s, S> BlockArgs<'s, S> {
    /// The tensors as the caller gave them (input, weights, biases), absent ones `None`.
    pub(crate) fn given(&self) -> [Option<&'s S>; 7] {
        let a = self;
        [Some(a.x), a.expand, a.expand_bias, Some(a.depthwise), a.depthwise_bias, Some(a.project), a.project_bias]
    }
}

/// A pointwise (1×1) convolution as [`BackendOps::pointwise`] sees it, validated:
/// `out = act(W · x + bias + residual)` per pixel, `W` `[cout, cin]`, `x` `[batch, cin,
/// pixels]` (NCHW) or `[batch, pixels, cin]` (NHWC), `out` and `residual` likewise with `cout`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PointwiseDesc {
    pub(crate) batch: usize,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) pixels: usize,
    pub(crate) activation: tilekit_kernels::Activation,
    /// NCHW or NHWC.
    pub(crate) layout: tilekit_kernels::Layout,
}

/// A dense 2-D convolution (one group) as [`BackendOps::conv2d`] sees it, validated: `conv`
/// is its geometry with `channels` the input channels and multiplier 1 (so `conv`'s own
/// output channels are not this op's), `cout` the output channels; the weight is PyTorch's
/// `[cout, channels, kh, kw]`, the bias `cout` values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DenseConvDesc {
    pub(crate) conv: Conv2dDesc,
    pub(crate) cout: usize,
}

impl DenseConvDesc {
    /// Multiply-adds per output element: `channels · kh · kw`.
    pub(crate) fn reduction(&self) -> usize {
        self.conv.channels * self.conv.kernel_h * self.conv.kernel_w
    }
}

/// The operands of [`BackendOps::pointwise`].
pub(crate) struct PointwiseArgs<'s, S> {
    pub(crate) x: &'s S,
    pub(crate) weight: &'s S,
    pub(crate) bias: Option<&'s S>,
    pub(crate) residual: Option<&'s S>,
}

/// What every backend implements. `Storage` is the backend's buffer handle; outputs are
/// written through shared references (the storage has interior mutability or is a GPU
/// buffer), and an activation's input and output may be the same storage (in place).
pub(crate) trait BackendOps {
    /// The backend's buffer type.
    type Storage;
    /// Which backend this is.
    const KIND: BackendKind;

    /// This backend's storage inside the public enum, or `None` if it is another backend's.
    fn storage_of(storage: &Storage) -> Option<&Self::Storage>;
    /// This backend's storage wrapped in the public enum.
    fn wrap(storage: Self::Storage) -> Storage;
    /// A one-line description (adapter name, driver, threads).
    fn description(&self) -> String;
    /// Whether this is a software rasteriser pretending to be a GPU (lavapipe).
    fn is_software(&self) -> bool {
        false
    }
    /// Whether ops in `dtype` can run here; `Err` says why not.
    fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<()>;
    /// A zero-filled buffer of `len` elements.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Self::Storage>;
    /// A buffer of `len` elements for an op's output that the op writes in full: its contents
    /// before the op are unspecified (but never memory the process must not read; a backend
    /// whose zero-fill is free or that cannot skip it returns zeros). Used only where every
    /// element is written before anything can read it.
    fn alloc_output(&self, dtype: DType, len: usize) -> Result<Self::Storage> {
        self.alloc_zeroed(dtype, len)
    }
    /// A buffer holding `bytes`, the little-endian encoding of `bytes.len() / size` elements.
    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<Self::Storage>;
    /// The buffer's contents as little-endian bytes. Waits for queued work.
    fn download(&self, storage: &Self::Storage, dtype: DType) -> Result<Vec<u8>>;
    /// A buffer over host memory its owner hands over (`Device::tensor_from_vec`,
    /// `Device::tensor_from_arc`): adopted without a copy where tensors live in host memory
    /// (the CPU backend), uploaded elsewhere.
    fn adopt_host(&self, data: cpu::CpuData) -> Result<Self::Storage> {
        self.upload(data.dtype(), data.bytes())
    }
    /// Calls `f` on the host memory behind `storage`, without a copy, and returns `true`, where
    /// tensors live in host memory (CPU); `false` elsewhere.
    fn with_host_data(&self, _storage: &Self::Storage, _f: &mut dyn FnMut(&cpu::CpuData)) -> bool {
        false
    }
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
    /// `Device::matmul_packed` with `B` packed in strips (`crate::PackedMatmul` on the CPU:
    /// `[⌈N/16⌉, K, 16]`, zero-padded; `desc.b` and `desc.trans_b` are unused). Only the CPU
    /// packs into strips; the GPU backends keep the weight as given and run
    /// [`BackendOps::matmul`], so they never get this call.
    #[allow(clippy::too_many_arguments)]
    fn matmul_strips(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &Self::Storage,
        _strips: &Self::Storage,
        _bias: Option<&Self::Storage>,
        _c: Option<&Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<()> {
        Err(Error::Backend {
            backend: Self::KIND,
            message: "this backend does not pack matmul weights into strips".into(),
        })
    }
    /// `Device::matmul_quant`: `desc` with `trans_b` and `B` the quantized `w` (`desc.b` is
    /// unused). Backends without kernels for `w.ty` return [`Error::UnsupportedQuantType`].
    #[allow(clippy::too_many_arguments)]
    fn matmul_quant(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &Self::Storage,
        w: &QuantView<'_, Self::Storage>,
        _bias: Option<&Self::Storage>,
        _c: Option<&Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<()> {
        Err(Error::UnsupportedQuantType {
            op: "matmul_quant",
            ty: w.ty,
            backend: Self::KIND,
            reason: "this backend has no quantized matmul kernels yet".into(),
        })
    }
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
    /// [`BackendOps::depthwise_conv2d`] with the weight pre-packed `[kh, kw, C·m]`
    /// (`crate::PackedDepthwise`): the same result bit for bit. Every backend's kernels read
    /// the packed layout themselves (no per-call copy of the weight).
    fn depthwise_conv2d_packed(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &Self::Storage,
        weight: &Self::Storage,
        bias: Option<&Self::Storage>,
        out: &Self::Storage,
    ) -> Result<()>;
    /// Whether the backend runs `im2col` as a gather ([`BackendOps::im2col`]); where it does
    /// not, `Device::im2col` runs the depthwise convolution with one-hot filters it stands for.
    fn has_im2col(&self) -> bool {
        false
    }
    /// `im2col` as a gather (`Device::im2col`): `desc` is the depthwise convolution with
    /// one-hot filters the op stands for (multiplier `kh·kw`), and the result is that
    /// convolution's bit for bit.
    fn im2col(&self, _desc: &Conv2dDesc, _dtype: DType, _input: &Self::Storage, _out: &Self::Storage) -> Result<()> {
        Err(Error::Backend { backend: Self::KIND, message: "no im2col gather on this backend".into() })
    }
    /// Whether the backend runs this dense convolution as one kernel of its own
    /// ([`BackendOps::conv2d`]); where it does not, `Device::conv2d` runs `im2col` and then
    /// the pointwise convolution on the patches.
    fn has_conv2d(&self, _desc: &DenseConvDesc) -> bool {
        false
    }
    /// A dense convolution, bias and activation included, in one pass.
    fn conv2d(
        &self,
        _desc: &DenseConvDesc,
        _dtype: DType,
        _input: &Self::Storage,
        _weight: &Self::Storage,
        _bias: Option<&Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<()> {
        Err(Error::Backend { backend: Self::KIND, message: "no dense convolution kernel on this backend".into() })
    }
    /// Whether the backend runs this pointwise convolution as one kernel of its own
    /// ([`BackendOps::pointwise`]); where it does not, `Device::pointwise_conv2d` runs it on
    /// the matmul (NHWC: one GEMM; NCHW: a batched GEMM, and with a bias, which runs along the
    /// GEMM's rows there, a 1×1 depthwise pass after it).
    fn has_pointwise(&self, _desc: &PointwiseDesc) -> bool {
        false
    }
    /// A pointwise convolution, bias, residual and activation included, in one pass.
    fn pointwise(
        &self,
        _desc: &PointwiseDesc,
        _dtype: DType,
        _args: &PointwiseArgs<'_, Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<()> {
        Err(Error::Backend { backend: Self::KIND, message: "no pointwise kernel on this backend".into() })
    }
    /// See [`ActivationDesc`]. `x` and `out` may be the same storage.
    fn activation(
        &self,
        desc: &ActivationDesc,
        dtype: DType,
        x: &Self::Storage,
        bias: Option<&Self::Storage>,
        out: &Self::Storage,
    ) -> Result<()>;
    /// See [`GluDesc`]: `h` holds `rows · 2F` elements, `out` (never `h`) `rows · F`.
    fn glu(&self, desc: &GluDesc, dtype: DType, h: &Self::Storage, out: &Self::Storage) -> Result<()>;
    /// The fused inverted-residual block (see [`InvertedResidualDesc`]): one kernel, the
    /// expanded tensor kept on chip. Backends without one say so (the unfused chain of public
    /// ops runs everywhere).
    fn inverted_residual(
        &self,
        _desc: &InvertedResidualDesc,
        _dtype: DType,
        _args: &BlockArgs<'_, Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<()> {
        Err(Error::Backend {
            backend: Self::KIND,
            message: "no fused inverted-residual kernel on this backend; run it unfused (BlockOptions::fused = false)"
                .into(),
        })
    }
    /// Copies `len` elements from `src` to `dst`: the bandwidth roof the bench compares
    /// memory-bound kernels with.
    fn copy(&self, dtype: DType, src: &Self::Storage, dst: &Self::Storage, len: usize) -> Result<()>;
    /// A deliberately naive matmul (one output per invocation, no tiling, no epilogue): a
    /// reference point for the bench, behind the `bench-refs` feature. Backends without one
    /// return `Ok(false)`.
    #[cfg(feature = "bench-refs")]
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
    /// The skinny-M matmul the backend chose before its GEMV kernel (the bench compares the
    /// two), behind the `bench-refs` feature. Backends without one return `Ok(false)`.
    #[cfg(feature = "bench-refs")]
    fn previous_skinny_matmul(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &Self::Storage,
        _b: &Self::Storage,
        _out: &Self::Storage,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Hands recorded work to the device without waiting for it. Backends that run ops at
    /// once (CPU) or order them on one stream (CUDA) have nothing to do.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;

    /// The autotuner's mode ([`TuneMode::Off`] where nothing is tunable).
    fn tune_mode(&self) -> TuneMode {
        TuneMode::Off
    }
    /// Sets the autotuner's mode (ignored where nothing is tunable).
    fn set_tune_mode(&self, _mode: TuneMode) {}
    /// The tune cache file this backend reads and writes.
    fn tune_cache_path(&self) -> Option<PathBuf> {
        None
    }
    /// Points the autotuner at another cache file (ignored where nothing is tunable).
    fn set_tune_cache_path(&self, _path: Option<PathBuf>) {}
    /// `Ok` where this backend has tunable kernels; else [`nothing_to_tune`].
    fn check_tunable(&self) -> Result<()> {
        Err(nothing_to_tune(Self::KIND))
    }
    /// Times every candidate config of the matmul `desc` on these operands, stores the winner
    /// and reports. The request travels with this call: ops other threads issue meanwhile
    /// are chosen as their own mode says.
    #[allow(clippy::too_many_arguments)]
    fn tune_matmul(
        &self,
        _desc: &MatmulDesc,
        _dtype: DType,
        _a: &Self::Storage,
        _b: &Self::Storage,
        _bias: Option<&Self::Storage>,
        _c: Option<&Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<TuneReport> {
        Err(nothing_to_tune(Self::KIND))
    }
    /// As [`BackendOps::tune_matmul`], for the depthwise convolution.
    fn tune_depthwise_conv2d(
        &self,
        _desc: &Conv2dDesc,
        _dtype: DType,
        _input: &Self::Storage,
        _weight: &Self::Storage,
        _bias: Option<&Self::Storage>,
        _out: &Self::Storage,
    ) -> Result<TuneReport> {
        Err(nothing_to_tune(Self::KIND))
    }

    /// Opens a profile on the backend's side (timestamp queries, a launch list).
    fn profile_start(&self) -> Result<()> {
        Ok(())
    }
    /// The kernel launches recorded since the last call, or `None` where the backend does not
    /// list launches (then each op is one record timed on the host).
    fn profile_take(&self) -> Option<Vec<LaunchInfo>> {
        None
    }
    /// Whether listed launches carry device timestamps (else the host waits after each op).
    fn has_timestamps(&self) -> bool {
        false
    }
    /// Closes the profile: waits and returns the device timestamps in nanoseconds, by query
    /// set and slot (empty where there are none).
    fn profile_finish(&self) -> Result<Vec<Vec<f64>>> {
        Ok(Vec::new())
    }
}

/// Runs `$body` with `$b` bound to the device's backend, whichever it is. The body is
/// compiled once per backend, so it may call generic code over [`BackendOps`]. This is the
/// one `match` over [`Backend`] outside backend-specific accessors.
macro_rules! with_backend {
    ($device:expr, $b:ident => $body:expr) => {
        match &$device.inner.backend {
            $crate::backend::Backend::Cpu($b) => $body,
            #[cfg(feature = "wgpu")]
            $crate::backend::Backend::Wgpu($b) => $body,
            #[cfg(feature = "cuda")]
            $crate::backend::Backend::Cuda($b) => $body,
        }
    };
}
pub(crate) use with_backend;

/// The backend a device runs on. A backend whose cargo feature is off has no variant (its
/// [`BackendKind`] stays, and asking for it is a "not compiled in" error: `device.rs`).
#[derive(Debug)]
pub(crate) enum Backend {
    Cpu(cpu::CpuBackend),
    #[cfg(feature = "wgpu")]
    Wgpu(wgpu::WgpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaBackend),
}

/// A buffer on one backend.
#[derive(Debug)]
pub(crate) enum Storage {
    Cpu(cpu::CpuStorage),
    #[cfg(feature = "wgpu")]
    Wgpu(wgpu::WgpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaStorage),
}

impl Storage {
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Storage::Cpu(_) => BackendKind::Cpu,
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(_) => BackendKind::Wgpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => BackendKind::Cuda,
        }
    }
}

/// The error for a backend this build of tilekit does not contain.
#[allow(dead_code)] // Unused when every backend is compiled in.
pub(crate) fn not_compiled_in(backend: BackendKind) -> Error {
    Error::BackendUnavailable {
        backend,
        reason: format!(
            "not compiled in: this build of tilekit has no {backend} backend (enable the `{backend}` cargo feature)"
        ),
    }
}

#[cfg(test)]
mod tidy {
    /// The files of the public face. A new file that dispatches on the backend belongs here.
    const FILES: &[(&str, &str)] = &[
        ("device.rs", include_str!("../device.rs")),
        ("profile.rs", include_str!("../profile.rs")),
        ("tune.rs", include_str!("../tune.rs")),
        ("tensor.rs", include_str!("../tensor.rs")),
        ("ops/mod.rs", include_str!("../ops/mod.rs")),
        ("ops/matmul.rs", include_str!("../ops/matmul.rs")),
        ("ops/conv.rs", include_str!("../ops/conv.rs")),
        ("ops/block.rs", include_str!("../ops/block.rs")),
        ("ops/activation.rs", include_str!("../ops/activation.rs")),
        ("ops/glu.rs", include_str!("../ops/glu.rs")),
        ("ops/bench_refs.rs", include_str!("../ops/bench_refs.rs")),
        ("record.rs", include_str!("../record.rs")),
        ("ops/pointwise.rs", include_str!("../ops/pointwise.rs")),
        ("ops/pool.rs", include_str!("../ops/pool.rs")),
        ("ops/im2col.rs", include_str!("../ops/im2col.rs")),
        ("ops/quant.rs", include_str!("../ops/quant.rs")),
        ("quant_tensor.rs", include_str!("../quant_tensor.rs")),
    ];

    /// The wgpu-only accessors (`Device::wgpu_device`, `Tensor::wgpu_buffer`,
    /// `Tensor::wgpu_byte_offset`, and `Device::wgpu_backend` behind the engine interop of
    /// `Tensor::from_wgpu_buffer` and `Device::record`): the only patterns on one backend the
    /// public face may hold.
    const ALLOWED: [&str; 4] = [
        "Backend::Wgpu(b) => Some(b.raw()),",
        "Storage::Wgpu(s) => Some(s.buffer()),",
        "Storage::Wgpu(s) => Some(s.byte_offset()),",
        "Backend::Wgpu(b) => Some(b),",
    ];

    /// Whether `line` holds a pattern naming one backend (before a match arm's `=>`, right
    /// after `let`, or inside `matches!`) or reaches into the device's backend directly.
    pub(super) fn flags(line: &str) -> bool {
        let line = line.trim();
        if line.starts_with("//") || ALLOWED.contains(&line) {
            return false;
        }
        let head = line.split("=>").next().unwrap_or("");
        let is_pattern = ["Backend::", "Storage::"].iter().any(|p| {
            ["Cpu(", "Wgpu(", "Cuda("].iter().any(|b| {
                let name = format!("{p}{b}");
                (line.contains("=>") && head.contains(&name))
                    || line.contains(&format!("let {name}"))
                    || (line.contains("matches!(") && line.contains(&name))
            })
        });
        is_pattern || (line.contains("inner.backend") && line != "match &self.inner.backend {")
    }

    /// "Adding a backend is one module and one arm": outside `with_backend!` the public face
    /// neither matches on the device's backend nor has a pattern naming one backend, except the
    /// wgpu-only accessors. (Constructors such as `Backend::Cuda(b)` in the probe are fine.)
    #[test]
    fn the_public_face_reaches_backends_only_through_with_backend() {
        let mut found = Vec::new();
        for &(file, text) in FILES {
            for (i, line) in text.lines().enumerate() {
                if flags(line) {
                    found.push(format!("{file}:{}: {}", i + 1, line.trim()));
                }
            }
            let matches = text.matches("match &self.inner.backend").count();
            let allowed = usize::from(file == "device.rs" || file == "record.rs");
            assert!(matches <= allowed, "{file}: {matches} matches on the backend outside with_backend!");
        }
        assert!(found.is_empty(), "backend special cases outside with_backend!:\n{}", found.join("\n"));
    }

    /// The check above sees what it looks for: the old hand-written arms would fail it.
    #[test]
    fn the_tidy_check_catches_a_hand_written_arm() {
        for line in [
            "Backend::Cuda(b) => b.synchronize(),",
            "(Backend::Cpu(b), Storage::Cpu(s)) => b.download(s, t.dtype()),",
            "if let Backend::Wgpu(b) = &self.inner.backend {",
            "let Backend::Wgpu(be) = &self.inner.backend else { return Err(untunable(self)) };",
        ] {
            assert!(!ALLOWED.contains(&line));
            assert!(super::tidy::flags(line), "{line}");
        }
        assert!(!super::tidy::flags("let backend = chosen.unwrap_or(Backend::Cpu(cpu));"));
    }
}
