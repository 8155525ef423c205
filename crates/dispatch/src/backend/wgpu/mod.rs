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
//! - Ops are recorded without a host sync: the ops of a batch go into one shared command
//!   encoder (one compute pass per launch) held in `Pending`, finished and submitted in one
//!   `Queue::submit` every [`MAX_PENDING_OPS`] ops and whenever the host waits (`download`,
//!   `synchronize`). Waits poll with a timeout and return a typed error instead of hanging.
//! - Per-op host cost: each launch's parameter block goes to a slot of a uniform ring (the
//!   slots of a submission written in one `write_buffer` just before it), bound with a dynamic
//!   offset; pipelines have explicit bind-group layouts (read from the module's declarations)
//!   and bind groups are cached by (pipeline, buffers, windows), leaving the cache when their
//!   buffers' storages drop. A chain of ops on the same buffers creates no wgpu objects.
//! - Engine interop (`interop.rs`): storages over an engine's buffer at a base element offset
//!   (every op adds it to its kernel offsets and binding windows), and recording into an
//!   engine's encoder for `Device::record` (parameter buffers of their own there).
//! - Limits: the device is created with the adapter's own limits (storage binding, buffer size,
//!   workgroups). Grids fold into 2-D (1-D kernels) or split over launches (matmul batches) to
//!   stay within the per-dimension workgroup limit; activations and copies over the
//!   storage-binding limit run in chunks bound as buffer windows; a matmul over it (or over
//!   `u32` indices, or over the grid limit in M or N) runs as blocks of batches, rows and
//!   columns, each binding windows of its operands (`split_matmul`, `split.rs`); a depthwise convolution
//!   over it runs as blocks of images, channel planes (NCHW) and output rows (`split_conv`).
//!   A GLU runs as one launch: an `h` over the storage-binding limit (or 2^30 elements) is
//!   refused with [`Error::Overflow`] (a decode step's `h` is a few hundred KiB).
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
//! - Errors come back as [`Error`] values (`health.rs`). An op records its passes into the
//!   batch's shared encoder (wgpu reports encoding errors when the batch is finished, inside
//!   the batch's error scopes with its `write_buffer` and `submit`); what an op creates (its
//!   output, a bind group on a cache miss) is checked where it is made: through tilekit's own
//!   uncaptured-error handler's count on a device made here (no scopes), inside error scopes
//!   (validation, out of memory, internal) on an engine's device, whose handler is the
//!   engine's. Pipeline creation and the other rare calls run inside error scopes. A lost
//!   device turns every later call into [`Error::DeviceLost`].
//! - Tuning (`tuning.rs`, cache in `cache.rs`; behaviour documented on `crate::tune`): the
//!   matmul and the depthwise convolution take their [`Spec`]
//!   from the autotuner: the default when tuning is off or nothing is cached, else a validated
//!   cached winner, else (mode `on`) the winner of timing every candidate on the op's operands.
//! - Profiling (`crate::profile`): while a profile is open, every compute pass writes
//!   `TIMESTAMP_QUERY` timestamps at its start and end into query sets of [`QUERIES_PER_SET`];
//!   they are resolved and read back when the profile ends. Without the feature the profile
//!   falls back to host wall time per op. Closed, it costs one relaxed atomic load per launch.

use super::{BackendOps, BlockArgs};
use crate::tune::{TuneMode, TuneReport};
use crate::{BackendKind, Error, Result, WgpuOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tilekit_kernels::catalogue::wgsl::{
    self as cat, ActivationParams, ConvParams, CopyParams, ElementStorage, GluParams, Kernel, MatmulParams, MatmulTile,
    Spec, activation_flags, conv_flags, glu_flags, matmul_flags,
};
use tilekit_kernels::{
    ActivationDesc, Conv2dDesc, DType, GluDesc, InvertedResidualDesc, Layout, MatmulDesc, MatrixView, Precision,
};

mod adapter;
mod block;
mod buffers;
pub(crate) mod cache;
mod coop;
pub(crate) mod depthwise;
mod health;
mod interop;
mod launch;
mod pipelines;
mod profile;
mod quant;
mod queue;
mod split;
mod tuning;

use crate::profile::LaunchInfo;
use adapter::is_software;
pub(crate) use adapter::probe_adapters;
use buffers::{buffer_with, padded_bytes};
use cache::{CacheEntry, TunedConfig, Tuner, conv_key_tail, matmul_key_tail};
use health::ErrorLog;
use pipelines::{Pipeline, PipelineKey};
use profile::ProfState;
use queue::{Bind, Launch, Pending, whole};
use tuning::TuneRequest;

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
    /// Whether the device has `SUBGROUP` (the GEMV kernel reduces with subgroup operations).
    subgroups: bool,
    /// What the device offers the cooperative-matrix matmul (`coop.rs`).
    coop: cat::coopmat::CoopDevice,
    prof: ProfState,
    tuner: Tuner,
    /// What identifies this device and driver in the tune cache (made once).
    fingerprint: String,
    /// Serialises explicit tunes, so one tune's timings are not disturbed by another's. (The
    /// request to tune travels with the call, [`TuneRequest`]: ops other threads issue
    /// meanwhile are chosen as the mode says.)
    forcing: Mutex<()>,
    /// The uniform ring: parameter blocks of pending launches, `ring_stride` bytes apart,
    /// bound with dynamic offsets (`queue.rs`).
    ring: wgpu::Buffer,
    ring_stride: u64,
    /// Bind groups by pipeline and bindings.
    bind_groups: Mutex<queue::BindGroupCache>,
    /// Whether launches use the ring and the bind-group cache (the bench turns it off to time
    /// a parameter buffer and a bind group made per launch, in the same run).
    reuse: AtomicBool,
    /// Buffers of dropped storages, whose bind groups leave the cache at the next launch.
    graveyard: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// The engine's encoder while `Device::record` runs, and the thread recording into it.
    capture: Mutex<Option<(std::thread::ThreadId, wgpu::CommandEncoder)>>,
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
    /// The element index in `buffer` of the tensor's first element: 0 for tilekit's own
    /// buffers, the import offset for an engine's (`Tensor::from_wgpu_buffer`).
    base: usize,
    /// Where the buffer goes when this storage drops, so cached bind groups release it.
    graveyard: Arc<Mutex<Vec<wgpu::Buffer>>>,
}

impl Drop for WgpuStorage {
    fn drop(&mut self) {
        if let Ok(mut g) = self.graveyard.lock() {
            g.push(self.buffer.clone());
        }
    }
}

impl WgpuStorage {
    /// The raw buffer, for engines that bind it themselves.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Where the tensor's first element sits in [`Self::buffer`].
    pub(crate) fn byte_offset(&self) -> u64 {
        (self.base * self.dtype.size_bytes()) as u64
    }
}

fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v} (kernel indices are u32)") })
}

fn div_ceil_u32(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}

impl WgpuBackend {
    fn storage_variant(&self, dtype: DType) -> ElementStorage {
        ElementStorage::for_dtype(dtype, self.native_f16)
    }
}

impl BackendOps for WgpuBackend {
    type Storage = WgpuStorage;
    const KIND: BackendKind = KIND;

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Wgpu(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn wrap(storage: WgpuStorage) -> super::Storage {
        super::Storage::Wgpu(storage)
    }

    fn description(&self) -> String {
        self.describe()
    }

    fn is_software(&self) -> bool {
        is_software(&self.info)
    }

    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        // Every dtype runs: f16 natively or packed, bf16 packed.
        Ok(())
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<WgpuStorage> {
        let bytes = padded_bytes(dtype, len)
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        Ok(WgpuStorage {
            buffer: self.create_buffer(bytes, None)?,
            len,
            dtype,
            base: 0,
            graveyard: self.graveyard.clone(),
        })
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<WgpuStorage> {
        let len = bytes.len() / dtype.size_bytes();
        let padded = padded_bytes(dtype, len)
            .ok_or_else(|| Error::Overflow { op: "upload", what: format!("{len} elements of {dtype}") })?;
        let mut data = Vec::new();
        data.try_reserve_exact(padded as usize).map_err(|_| Error::OutOfMemory { backend: KIND, bytes: padded })?;
        data.extend_from_slice(bytes);
        data.resize(padded as usize, 0);
        Ok(WgpuStorage {
            buffer: self.create_buffer(padded, Some(&data))?,
            len,
            dtype,
            base: 0,
            graveyard: self.graveyard.clone(),
        })
    }

    fn download(&self, s: &WgpuStorage, dtype: DType) -> Result<Vec<u8>> {
        let _ = dtype; // The storage knows its own dtype.
        self.check_not_capturing("download")?;
        if !s.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::BufferUsage { op: "download", usage: "COPY_SRC" });
        }
        let bytes = s.len * s.dtype.size_bytes();
        // Whole words around the view (copies move multiples of 4 bytes from multiples of 4).
        let first = (s.base * s.dtype.size_bytes()) as u64;
        let lo = first / 4 * 4;
        let size = ((first + bytes as u64).div_ceil(4) * 4 - lo).max(4).min(s.buffer.size() - lo);
        let skip = (first - lo) as usize;
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
                enc.copy_buffer_to_buffer(&s.buffer, lo, &staging, 0, size);
                enc.finish()
            })?;
            self.submit(&mut pending, Some(copy))?
        };
        let mut out = self.read_staging(&staging, index)?;
        out.truncate(skip + bytes);
        out.drain(..skip);
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
        let desc = &Self::rebased(desc, [a, b, out], bias, c)?;
        Self::check_engine_alias("matmul", out, &[("a", Some(a)), ("b", Some(b)), ("bias", bias), ("c", c)])?;
        self.run_matmul(desc, dtype, a, b, bias, c, out, TuneRequest::AsConfigured).map(drop)
    }

    fn matmul_quant(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        w: &super::QuantView<'_, WgpuStorage>,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        self.run_matmul_quant(desc, dtype, a, w, bias, c, out)
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
        Self::check_engine_alias(
            "depthwise_conv2d",
            out,
            &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)],
        )?;
        self.run_conv(desc, dtype, input, weight, bias, out, false, TuneRequest::AsConfigured).map(drop)
    }

    fn depthwise_conv2d_packed(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &WgpuStorage,
        weight: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        Self::check_engine_alias(
            "depthwise_conv2d",
            out,
            &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)],
        )?;
        // The kernels read the packed layout directly (weight strides in the parameters).
        self.run_conv(desc, dtype, input, weight, bias, out, true, TuneRequest::AsConfigured).map(drop)
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
        let in_place = std::ptr::eq(x, out) || (x.buffer == out.buffer && x.base == out.base);
        if !in_place {
            Self::check_engine_alias(op, out, &[("x", Some(x)), ("bias", bias)])?;
        }
        let kernel = if in_place { Kernel::ActivationInPlace } else { Kernel::Activation };
        let pipeline = self.pipeline(op, kernel, self.storage_variant(dtype), Spec::DEFAULT)?;
        let size = dtype.size_bytes();
        // The bias (one row) bound as a window at its base; its offset inside it in `b_off`.
        let (bias_bind, b_off) = match (desc.bias_len, bias) {
            (Some(bl), Some(s)) => {
                let (w, off) = self.window_of(s, 0, bl, size)?;
                (Bind { slot: 1, buffer: &s.buffer, window: Some(w) }, off)
            }
            _ => (whole(1, &self.dummy), 0),
        };
        // Tensors over the storage-binding limit run in chunks, each bound as a window (with
        // room for the alignment of an imported view's start).
        let mut launches = Vec::new();
        for (first, count) in self.chunks(op, desc.len, size)? {
            let len = to_u32(op, "len", count)?;
            let (ow, o_off) = self.window_of(out, first, count, size)?;
            let (xw, x_off) = self.window_of(x, first, count, size)?;
            let mut p = ActivationParams {
                len,
                act: desc.activation.code(),
                items: len.div_ceil(4),
                x_off: if in_place { o_off } else { x_off },
                o_off,
                b_off,
                ..ActivationParams::default()
            };
            if let (Some(bl), Some(_)) = (desc.bias_len, bias) {
                p.bias_len = to_u32(op, "bias length", bl)?.max(1);
                // Where this chunk starts in the bias row.
                p.bias_phase = to_u32(op, "bias phase", first % bl.max(1))?;
                p.flags |= activation_flags::HAS_BIAS;
                if bl.is_multiple_of(4) && b_off.is_multiple_of(4) {
                    p.flags |= activation_flags::BIAS_VEC;
                }
            }
            let grid = self.grid_1d(op, p.items, cat::WG_1D)?;
            let mut binds = vec![bias_bind, Bind { slot: 2, buffer: &out.buffer, window: Some(ow) }];
            if !in_place {
                binds.push(Bind { slot: 0, buffer: &x.buffer, window: Some(xw) });
            }
            launches.push(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid });
        }
        self.record(op, &pipeline, 3, &launches)
    }

    fn glu(&self, desc: &GluDesc, dtype: DType, h: &WgpuStorage, out: &WgpuStorage) -> Result<()> {
        let op = "glu";
        let h_len = desc.h_len().ok_or_else(|| Error::Overflow { op, what: "the element count of h".into() })?;
        let limit = self.limits.max_storage_buffer_binding_size.min(1 << 30);
        if ((h.base + h_len) * dtype.size_bytes()) as u64 > limit || h_len as u64 > 1 << 30 {
            return Err(Error::Overflow {
                op,
                what: format!("h of {h_len} elements (one binding of at most {limit} bytes and 2^30 elements)"),
            });
        }
        let pipeline = self.pipeline(op, Kernel::Glu, self.storage_variant(dtype), Spec::DEFAULT)?;
        let len = to_u32(op, "len", desc.rows * desc.f)?;
        // Imported tensors start at their base inside the bound buffer.
        let h_off = to_u32(op, "h offset", h.base)?;
        let o_off = to_u32(op, "output offset", out.base)?;
        to_u32(op, "h end", h.base + h_len)?;
        to_u32(op, "output end", out.base + desc.rows * desc.f)?;
        let vec = desc.f.is_multiple_of(4) && h_off.is_multiple_of(4) && o_off.is_multiple_of(4);
        let p = GluParams {
            len,
            f: to_u32(op, "f", desc.f)?,
            act: desc.activation.code(),
            flags: if vec { glu_flags::VEC } else { 0 },
            items: len.div_ceil(4),
            h_off,
            o_off,
            _pad: 0,
        };
        let grid = self.grid_1d(op, p.items, cat::WG_1D)?;
        let binds = vec![whole(0, &h.buffer), whole(1, &out.buffer)];
        self.record(op, &pipeline, 2, &[Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid }])
    }

    fn inverted_residual(
        &self,
        desc: &InvertedResidualDesc,
        dtype: DType,
        args: &BlockArgs<'_, WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        self.run_block(desc, dtype, args, out)
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
            let (sw, s_off) = self.window_of(src, first, count, size)?;
            let (dw, d_off) = self.window_of(dst, first, count, size)?;
            if s_off != 0 || d_off != 0 {
                return Err(Error::InvalidParameter {
                    op,
                    param: "view",
                    reason: "the word copy needs views at the device's binding alignment".into(),
                });
            }
            let binds = vec![
                Bind { slot: 0, buffer: &src.buffer, window: Some(sw) },
                Bind { slot: 1, buffer: &dst.buffer, window: Some(dw) },
            ];
            launches.push(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid });
        }
        self.record(op, &pipeline, 2, &launches)
    }

    #[cfg(feature = "bench-refs")]
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
        let desc = &Self::rebased(desc, [a, b, out], None, None)?;
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

    #[cfg(feature = "bench-refs")]
    fn previous_skinny_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        out: &WgpuStorage,
    ) -> Result<bool> {
        let (kernel, candidates) = cat::skinny_candidates(desc.m);
        let spec = self.default_spec(kernel, &candidates);
        let storage = self.storage_variant(dtype);
        self.launch_matmul("previous_skinny_matmul", desc, dtype, storage, kernel, spec, [a, b, out], None, None)?;
        Ok(true)
    }

    /// Submits the recorded ops without waiting for them, so work the caller submits to the
    /// same queue afterwards is ordered after them.
    fn flush(&self) -> Result<()> {
        let mut pending = self.lock_pending()?;
        self.submit(&mut pending, None).map(drop)
    }

    fn synchronize(&self) -> Result<()> {
        self.check_not_capturing("synchronize")?;
        let index = {
            let mut pending = self.lock_pending()?;
            self.submit(&mut pending, None)?
        };
        self.wait(index)
    }

    fn tune_mode(&self) -> TuneMode {
        self.tuner.mode()
    }

    fn set_tune_mode(&self, mode: TuneMode) {
        self.tuner.set_mode(mode);
    }

    fn tune_cache_path(&self) -> Option<std::path::PathBuf> {
        self.tuner.path()
    }

    fn set_tune_cache_path(&self, path: Option<std::path::PathBuf>) {
        self.tuner.set_path(path);
    }

    fn check_tunable(&self) -> Result<()> {
        Ok(())
    }

    fn tune_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<TuneReport> {
        let desc = &Self::rebased(desc, [a, b, out], bias, c)?;
        Self::check_engine_alias("matmul", out, &[("a", Some(a)), ("b", Some(b)), ("bias", bias), ("c", c)])?;
        self.tune_now(|| self.run_matmul(desc, dtype, a, b, bias, c, out, TuneRequest::Now))
    }

    fn tune_depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &WgpuStorage,
        weight: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<TuneReport> {
        self.tune_now(|| self.run_conv(desc, dtype, input, weight, bias, out, false, TuneRequest::Now))
    }

    fn profile_start(&self) -> Result<()> {
        self.start_profile()
    }

    fn profile_take(&self) -> Option<Vec<LaunchInfo>> {
        Some(self.take_launches())
    }

    fn has_timestamps(&self) -> bool {
        self.timestamps
    }

    fn profile_finish(&self) -> Result<Vec<Vec<f64>>> {
        self.finish_profile()
    }
}

/// The ops whose spec the tuner chooses, with the tune request passed down the call.
impl WgpuBackend {
    /// The matmul, its spec chosen as `request` says; the report of a tune it ran.
    #[allow(clippy::too_many_arguments)]
    fn run_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        b: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
        request: TuneRequest,
    ) -> Result<Option<Result<TuneReport>>> {
        let op = "matmul";
        let storage = self.storage_variant(dtype);
        // Up to 16 rows take the GEMV kernel (its subgroup reduction where the device has
        // subgroups); the others the tiled kernel; the tuner picks among the candidates.
        // The cooperative-matrix kernel where the device has it and the product fits its rule
        // (`coop.rs`); it has one spec per device, so an explicit tune times the usual kernels.
        if request == TuneRequest::AsConfigured
            && let Some((kernel, spec)) = self.coop_choice(desc, storage)
        {
            self.launch_matmul(op, desc, dtype, storage, kernel, spec, [a, b, out], bias, c)?;
            return Ok(None);
        }
        let (kernel, candidates) = cat::matmul_candidates(desc.m);
        let kernel = if kernel == Kernel::Gemv && self.subgroups { Kernel::GemvSubgroup } else { kernel };
        // Precision::F16 on native f16 storage above the GEMV rows: the vec2<f16> kernel, with
        // the tiled kernel's candidates (elsewhere the f32 kernels, inside the same bound).
        let kernel = if cat::f16x2::applies(desc, storage) { Kernel::MatmulF16x2 } else { kernel };
        let run = |spec: Spec| self.launch_matmul(op, desc, dtype, storage, kernel, spec, [a, b, out], bias, c);
        // The f16 kernel's winners are kept apart from the f32 kernel's for the same shapes.
        let key_tail = || {
            let tail = matmul_key_tail(desc);
            if kernel == Kernel::MatmulF16x2 { format!("{tail}|f16x2") } else { tail }
        };
        let (spec, report) = self.choose(kernel, storage, &candidates, key_tail, &run, request)?;
        run(spec)?;
        Ok(report)
    }
}

/// Engine interop: what `Device::wgpu_device` hands out.
impl WgpuBackend {
    /// The device and queue, for engines that encode their own passes around tilekit's.
    pub(crate) fn raw(&self) -> (&wgpu::Device, &wgpu::Queue) {
        (&self.device, &self.queue)
    }
}
