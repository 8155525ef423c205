//! Profiling: per-kernel device times, launch shapes, bytes and FLOPs of a sequence of ops,
//! exported as a Chrome trace.
//!
//! ```
//! use tilekit::{DType, Device, MatmulOptions};
//!
//! let dev = Device::cpu();
//! let a = dev.tensor_from_f32(&[2, 2], DType::F32, &[1., 2., 3., 4.])?;
//! dev.profile_begin()?;
//! let _y = dev.matmul(&a, &a, &MatmulOptions::default())?;
//! let profile = dev.profile_end()?;
//! assert_eq!(profile.records.len(), 1);
//! let trace = profile.to_chrome_trace(); // open in Perfetto or chrome://tracing
//! assert!(trace.contains("traceEvents"));
//! # Ok::<(), tilekit::Error>(())
//! ```
//!
//! - **wgpu**: every compute pass of an open profile writes `TIMESTAMP_QUERY` timestamps at
//!   its start and end; they are resolved and read back by [`Device::profile_end`], so the
//!   times are device times of each launch ([`Timing::Device`]). A device without the feature
//!   waits after each op and records host wall time ([`Timing::Wall`]).
//! - **CPU**: ops are synchronous; each op's wall time ([`Timing::Wall`]).
//! - **CUDA**: each op is followed by a synchronize and timed on the host ([`Timing::Wall`]).
//!
//! While no profile is open an op pays one relaxed atomic load: no timestamps, no allocation.
//! Launches are attributed to the op that recorded them when ops come from one thread; ops
//! issued concurrently from several threads may have their launches attributed to each other.

use crate::backend::{BackendOps, with_backend};
use crate::{BackendKind, Device, Error, Result};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, MatmulDesc};

/// Where a record's times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// GPU timestamps around the kernel's compute pass.
    Device,
    /// Host wall time around the op (after a wait where the backend is asynchronous).
    Wall,
}

/// One kernel launch (or one op, on backends that do not expose launches).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRecord {
    /// The op (`matmul`, `depthwise_conv2d`, `activation`, `copy`, `naive_matmul`).
    pub op: &'static str,
    /// The kernel: module name and tile config on wgpu, the op name elsewhere.
    pub kernel: String,
    /// Storage dtype.
    pub dtype: DType,
    /// The op's shape, e.g. `b1 m64 n64 k64 NN`.
    pub shape: String,
    /// Workgroups (wgpu) launched, when known.
    pub grid: Option<[u32; 3]>,
    /// Workgroup size (wgpu), when known.
    pub workgroup: Option<[u32; 3]>,
    /// Bytes the launch reads and writes at least once (its share of the op's).
    pub bytes: u64,
    /// Floating-point operations (its share of the op's).
    pub flops: u64,
    /// Start, µs from the first record of the profile.
    pub start_us: f64,
    /// Duration, µs.
    pub duration_us: f64,
    /// Where the times come from.
    pub timing: Timing,
}

impl KernelRecord {
    /// Achieved bandwidth, GB/s.
    pub fn gb_per_s(&self) -> f64 {
        if self.duration_us > 0.0 { self.bytes as f64 / self.duration_us / 1e3 } else { 0.0 }
    }

    /// Achieved GFLOP/s.
    pub fn gflop_per_s(&self) -> f64 {
        if self.duration_us > 0.0 { self.flops as f64 / self.duration_us / 1e3 } else { 0.0 }
    }
}

/// What a profile recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The backend.
    pub backend: BackendKind,
    /// The device's description.
    pub device: String,
    /// The launches, in issue order.
    pub records: Vec<KernelRecord>,
}

impl Profile {
    /// Sum of the records' durations, µs.
    pub fn total_us(&self) -> f64 {
        self.records.iter().map(|r| r.duration_us).sum()
    }

    /// Appends `other`'s records after this profile's last one, keeping their own spacing,
    /// so profiles taken one after another (one per bench case, say) make one timeline.
    pub fn append(&mut self, other: Profile) {
        let end = self.records.iter().map(|r| r.start_us + r.duration_us).fold(0.0, f64::max);
        let gap = if self.records.is_empty() { 0.0 } else { 1.0 };
        self.records.extend(other.records.into_iter().map(|mut r| {
            r.start_us += end + gap;
            r
        }));
    }

    /// The trace as Chrome Trace Event JSON (`{"traceEvents": [...]}` with one complete
    /// event, `ph: "X"`, per record; `ts` and `dur` in µs), which Perfetto and
    /// chrome://tracing open as a timeline.
    pub fn to_chrome_trace(&self) -> String {
        chrome_trace(std::slice::from_ref(self))
    }
}

/// Several profiles (one per device, say) as one Chrome trace: each is a process of its own.
pub fn chrome_trace(profiles: &[Profile]) -> String {
    let mut events = Vec::new();
    for (i, p) in profiles.iter().enumerate() {
        p.push_events(i + 1, &mut events);
    }
    json!({"traceEvents": events, "displayTimeUnit": "ns"}).to_string()
}

impl Profile {
    fn push_events(&self, pid: usize, events: &mut Vec<Value>) {
        events.push(json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": format!("tilekit {} — {}", self.backend.name(), self.device)}}));
        events.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "kernels"}}));
        for r in &self.records {
            let dims = |d: Option<[u32; 3]>| d.map_or(Value::Null, |[x, y, z]| json!(format!("{x}x{y}x{z}")));
            events.push(json!({
                "name": r.kernel,
                "cat": r.op,
                "ph": "X",
                "pid": pid,
                "tid": 1,
                "ts": r.start_us,
                "dur": r.duration_us,
                "args": {
                    "op": r.op,
                    "dtype": r.dtype.name(),
                    "shape": r.shape,
                    "grid": dims(r.grid),
                    "workgroup": dims(r.workgroup),
                    "bytes": r.bytes,
                    "flops": r.flops,
                    "GB/s": r.gb_per_s(),
                    "GFLOP/s": r.gflop_per_s(),
                    "timing": match r.timing { Timing::Device => "device", Timing::Wall => "wall" },
                }
            }));
        }
    }
}

/// Descriptor-level facts of one op, for its records.
#[derive(Debug, Clone)]
pub(crate) struct OpInfo {
    pub(crate) op: &'static str,
    pub(crate) dtype: DType,
    pub(crate) shape: String,
    pub(crate) bytes: u64,
    pub(crate) flops: u64,
}

impl OpInfo {
    /// A matmul: each operand counted once (a broadcast operand once in all), FLOPs 2·B·M·N·K.
    pub(crate) fn matmul(op: &'static str, desc: &MatmulDesc, dtype: DType) -> OpInfo {
        let per = |bs: usize| if bs == 0 { 1 } else { desc.batch };
        let mut elems = per(desc.a.batch_stride) * desc.m * desc.k
            + per(desc.b.batch_stride) * desc.k * desc.n
            + desc.batch * desc.m * desc.n;
        if let Some(c) = desc.c {
            elems += per(c.batch_stride) * desc.m * desc.n;
        }
        if desc.bias_offset.is_some() {
            elems += desc.n;
        }
        OpInfo {
            op,
            dtype,
            shape: format!(
                "b{} m{} n{} k{} {}{}",
                desc.batch,
                desc.m,
                desc.n,
                desc.k,
                if desc.trans_a { 'T' } else { 'N' },
                if desc.trans_b { 'T' } else { 'N' }
            ),
            bytes: (elems * dtype.size_bytes()) as u64,
            flops: desc.flops() as u64,
        }
    }

    /// A depthwise convolution: input, weight, bias and output once; 2 FLOPs per tap.
    pub(crate) fn conv(desc: &Conv2dDesc, dtype: DType) -> OpInfo {
        let prod = |s: [usize; 4]| s.iter().product::<usize>();
        let out = prod(desc.output_shape());
        let elems = prod(desc.input_shape())
            + prod(desc.weight_shape())
            + out
            + if desc.has_bias { desc.out_channels() } else { 0 };
        OpInfo {
            op: "depthwise_conv2d",
            dtype,
            shape: format!(
                "n{} c{} {}x{} m{} k{}x{} s{} {}",
                desc.batch,
                desc.channels,
                desc.height,
                desc.width,
                desc.multiplier,
                desc.kernel_h,
                desc.kernel_w,
                desc.stride_h,
                desc.layout.name()
            ),
            bytes: (elems * dtype.size_bytes()) as u64,
            flops: (2 * out * desc.kernel_h * desc.kernel_w) as u64,
        }
    }

    /// An activation: read and write each element once (plus the bias row); one FLOP each
    /// for the bias add and the function (the function costs more, but no count is standard).
    pub(crate) fn activation(desc: &ActivationDesc, dtype: DType) -> OpInfo {
        let bias = desc.bias_len.unwrap_or(0);
        OpInfo {
            op: "activation",
            dtype,
            shape: format!("len {} bias {} {:?}", desc.len, bias, desc.activation),
            bytes: ((2 * desc.len + bias) * dtype.size_bytes()) as u64,
            flops: (desc.len * if bias > 0 { 2 } else { 1 }) as u64,
        }
    }

    /// A pointwise convolution run as one kernel: input, weight, output, bias and residual
    /// each counted once; FLOPs 2·N·Cout·Cin·pixels.
    pub(crate) fn pointwise(d: &crate::backend::PointwiseDesc, dtype: DType, bias: bool, residual: bool) -> OpInfo {
        let elems = (d.batch * d.cin + d.batch * d.cout * (1 + usize::from(residual))) * d.pixels
            + d.cout * d.cin
            + if bias { d.cout } else { 0 };
        OpInfo {
            op: "pointwise_conv2d",
            dtype,
            shape: format!("n{} cin{} cout{} {}px {}", d.batch, d.cin, d.cout, d.pixels, d.layout.name()),
            bytes: (elems * dtype.size_bytes()) as u64,
            flops: (2 * d.batch * d.cout * d.cin * d.pixels) as u64,
        }
    }

    /// A dense convolution: input, weight and bias read once, the output written once.
    pub(crate) fn conv2d(desc: &crate::backend::DenseConvDesc, dtype: DType) -> OpInfo {
        let d = &desc.conv;
        let prod = |s: [usize; 4]| s.iter().product::<usize>();
        let (oh, ow) = (d.out_h().unwrap_or(0), d.out_w().unwrap_or(0));
        let outs = d.batch * desc.cout * oh * ow;
        let elems =
            prod(d.input_shape()) + outs + desc.cout * desc.reduction() + if d.has_bias { desc.cout } else { 0 };
        OpInfo {
            op: "conv2d",
            dtype,
            shape: format!(
                "n{} c{} {}x{} cout{} k{}x{} s{} {}",
                d.batch,
                d.channels,
                d.height,
                d.width,
                desc.cout,
                d.kernel_h,
                d.kernel_w,
                d.stride_h,
                d.layout.name()
            ),
            bytes: (elems * dtype.size_bytes()) as u64,
            flops: (2 * outs * desc.reduction()) as u64,
        }
    }

    /// An `im2col` gather: the input read once, the patches written once; no FLOPs.
    pub(crate) fn im2col(desc: &Conv2dDesc, dtype: DType) -> OpInfo {
        let prod = |s: [usize; 4]| s.iter().product::<usize>();
        OpInfo {
            op: "im2col",
            dtype,
            shape: format!(
                "n{} c{} {}x{} k{}x{} s{} {}",
                desc.batch,
                desc.channels,
                desc.height,
                desc.width,
                desc.kernel_h,
                desc.kernel_w,
                desc.stride_h,
                desc.layout.name()
            ),
            bytes: ((prod(desc.input_shape()) + prod(desc.output_shape())) * dtype.size_bytes()) as u64,
            flops: 0,
        }
    }

    /// A copy of `len` elements.
    pub(crate) fn copy(len: usize, dtype: DType) -> OpInfo {
        OpInfo {
            op: "copy",
            dtype,
            shape: format!("len {len}"),
            bytes: (2 * len * dtype.size_bytes()) as u64,
            flops: 0,
        }
    }
}

/// One kernel launch a backend listed while a profile was open (`BackendOps::profile_take`).
#[derive(Debug, Clone)]
pub(crate) struct LaunchInfo {
    /// Module name and spec label.
    pub(crate) kernel: String,
    pub(crate) grid: [u32; 3],
    pub(crate) workgroup: [u32; 3],
    /// Query set and first of its two query slots (start, end); `None` without timestamps.
    pub(crate) query: Option<(usize, u32)>,
}

/// A record whose device time is resolved when the profile ends.
#[derive(Debug)]
struct Pending {
    record: KernelRecord,
    /// Query set and slot of its start timestamp (end at slot + 1).
    query: Option<(usize, u32)>,
    /// Host start, for wall records.
    host_start: Instant,
}

/// The profiling state of one [`Device`].
#[derive(Debug, Default)]
pub(crate) struct Profiler {
    active: AtomicBool,
    pending: Mutex<Vec<Pending>>,
}

fn poisoned() -> Error {
    Error::Backend { backend: BackendKind::Cpu, message: "the profile lock was poisoned".into() }
}

impl Device {
    /// Opens a profile: every op from now until [`Device::profile_end`] is recorded. Opening
    /// one while one is open discards the first.
    pub fn profile_begin(&self) -> Result<()> {
        let p = &self.inner.profiler;
        p.pending.lock().map_err(|_| poisoned())?.clear();
        with_backend!(self, be => be.profile_start())?;
        p.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Closes the profile, waits for the device and returns what it recorded. Without an
    /// open profile the result is empty.
    pub fn profile_end(&self) -> Result<Profile> {
        let p = &self.inner.profiler;
        let was_active = p.active.swap(false, Ordering::AcqRel);
        let pending = std::mem::take(&mut *p.pending.lock().map_err(|_| poisoned())?);
        let stamps = if was_active { with_backend!(self, be => be.profile_finish())? } else { Vec::new() };
        let origin_host = pending.iter().map(|q| q.host_start).min();
        let stamp = |(set, slot): (usize, u32)| {
            let s = stamps.get(set)?;
            Some((*s.get(slot as usize)?, *s.get(slot as usize + 1)?))
        };
        let origin_dev =
            pending.iter().filter_map(|q| q.query.and_then(stamp)).map(|(s, _)| s).fold(f64::INFINITY, f64::min);
        let records = pending
            .into_iter()
            .map(|q| {
                let mut r = q.record;
                match q.query.and_then(stamp) {
                    Some((s, e)) => {
                        r.start_us = (s - origin_dev) / 1e3;
                        r.duration_us = (e - s).max(0.0) / 1e3;
                        r.timing = Timing::Device;
                    }
                    None => {
                        r.start_us = origin_host.map_or(0.0, |o| q.host_start.duration_since(o).as_secs_f64() * 1e6);
                    }
                }
                r
            })
            .collect();
        Ok(Profile { backend: self.kind(), device: self.description(), records })
    }

    /// Runs `f` inside a profile and returns its value and the profile.
    pub fn profile<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(R, Profile)> {
        self.profile_begin()?;
        let value = f();
        let profile = self.profile_end()?;
        Ok((value?, profile))
    }

    /// The profiling hook of every op: `f` runs the op; `info` describes it and is only
    /// evaluated while a profile is open.
    pub(crate) fn profiled(&self, info: impl FnOnce() -> OpInfo, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if !self.inner.profiler.active.load(Ordering::Relaxed) {
            return f();
        }
        self.profiled_slow(info(), f)
    }

    fn profiled_slow(&self, info: OpInfo, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let host_start = Instant::now();
        let base = |kernel: String, share: f64| KernelRecord {
            op: info.op,
            kernel,
            dtype: info.dtype,
            shape: info.shape.clone(),
            grid: None,
            workgroup: None,
            bytes: (info.bytes as f64 * share).round() as u64,
            flops: (info.flops as f64 * share).round() as u64,
            start_us: 0.0,
            duration_us: 0.0,
            timing: Timing::Wall,
        };
        let ran = f();
        let launches = with_backend!(self, be => be.profile_take());
        ran?;
        let mut new = Vec::new();
        match launches {
            Some(launches) => {
                let wall = if with_backend!(self, be => be.has_timestamps()) {
                    0.0
                } else {
                    // No timestamps: wait, so the host time covers the op's kernels.
                    self.synchronize()?;
                    host_start.elapsed().as_secs_f64() * 1e6
                };
                let volume = |g: [u32; 3]| g.iter().map(|&v| f64::from(v)).product::<f64>();
                let total: f64 = launches.iter().map(|l| volume(l.grid)).sum::<f64>().max(1.0);
                let count = launches.len().max(1) as f64;
                for l in launches {
                    let mut r = base(l.kernel, volume(l.grid) / total);
                    r.grid = Some(l.grid);
                    r.workgroup = Some(l.workgroup);
                    r.duration_us = wall / count;
                    new.push(Pending { record: r, query: l.query, host_start });
                }
            }
            None => {
                // A backend that lists no launches: one record per op. Asynchronous backends
                // (CUDA) are waited for so the wall time covers the kernels; on the CPU the
                // wait returns at once.
                self.synchronize()?;
                let mut r = base(info.op.to_string(), 1.0);
                r.duration_us = host_start.elapsed().as_secs_f64() * 1e6;
                new.push(Pending { record: r, query: None, host_start });
            }
        }
        self.inner.profiler.pending.lock().map_err(|_| poisoned())?.extend(new);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::{DType, Device, MatmulOptions, Timing, WgpuOptions};

    fn check_trace(trace: &str, n: usize) {
        let v: serde_json::Value = serde_json::from_str(trace).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), n);
        for e in x {
            assert!(e["ts"].as_f64().unwrap() >= 0.0);
            assert!(e["dur"].as_f64().unwrap() >= 0.0);
            assert!(e["name"].is_string());
            assert!(e["args"]["bytes"].as_u64().unwrap() > 0);
        }
    }

    #[test]
    fn cpu_profile_records_each_op() {
        let dev = Device::cpu();
        let a = dev.tensor_from_f32(&[8, 8], DType::F32, &[1.0; 64]).unwrap();
        let (_, profile) = dev
            .profile(|| {
                let y = dev.matmul(&a, &a, &MatmulOptions::default())?;
                dev.activation(&y, None, crate::Activation::Gelu)
            })
            .unwrap();
        assert_eq!(profile.records.len(), 2);
        assert_eq!(profile.records[0].op, "matmul");
        assert_eq!(profile.records[0].flops, 2 * 8 * 8 * 8);
        assert_eq!(profile.records[0].bytes, 3 * 64 * 4);
        assert!(profile.records.iter().all(|r| r.timing == Timing::Wall));
        check_trace(&profile.to_chrome_trace(), 2);
        let mut joined = profile.clone();
        joined.append(profile.clone());
        assert_eq!(joined.records.len(), 4);
        assert!(joined.records[2].start_us > joined.records[1].start_us);
        check_trace(&super::chrome_trace(&[profile.clone(), joined]), 6);
        // Closed: nothing more is recorded.
        dev.matmul(&a, &a, &MatmulOptions::default()).unwrap();
        assert!(dev.profile_end().unwrap().records.is_empty());
    }

    /// A quantized matmul counts its weight as the GGUF bytes it reads, not K·N elements.
    #[test]
    fn cpu_profile_counts_a_quantized_weight_by_its_blocks() {
        use tilekit_kernels::quant::{GgmlType, quantize};
        let dev = Device::cpu();
        let (m, n, k) = (2, 3, 64);
        let a = dev.tensor_from_f32(&[m, k], DType::F32, &[0.5; 2 * 64]).unwrap();
        let blocks = quantize(GgmlType::Q8_0, &[1.0; 3 * 64], &[n, k]).unwrap();
        let w = dev.quant_tensor(GgmlType::Q8_0, &[n, k], &blocks).unwrap();
        let (_, profile) = dev.profile(|| dev.matmul_quant(&a, &w, &MatmulOptions::new().trans_b(true))).unwrap();
        assert_eq!(profile.records.len(), 1);
        // A and the output in f32, the weight as 3 rows x 2 blocks of 34 bytes.
        assert_eq!(profile.records[0].bytes, ((m * k + m * n) * 4 + blocks.len()) as u64);
        assert_eq!(blocks.len(), 3 * 2 * 34);
        assert_eq!(profile.records[0].flops, (2 * m * n * k) as u64);
    }

    #[test]
    fn wgpu_profile_has_device_times_and_launch_shapes() {
        let Ok(dev) = Device::wgpu(&WgpuOptions::allow_software()) else {
            eprintln!("no wgpu adapter: skipped");
            return;
        };
        let a = dev.tensor_from_f32(&[32, 32], DType::F32, &[0.5; 1024]).unwrap();
        let (y, profile) = dev
            .profile(|| {
                let y = dev.matmul(&a, &a, &MatmulOptions::default())?;
                dev.activation_in_place(&y, None, crate::Activation::Relu)?;
                Ok(y)
            })
            .unwrap();
        assert_eq!(y.to_f32_vec().unwrap()[0], 8.0);
        assert_eq!(profile.records.len(), 2);
        let mm = &profile.records[0];
        assert!(mm.kernel.starts_with("matmul_f32"), "{}", mm.kernel);
        assert!(mm.grid.is_some() && mm.workgroup.is_some());
        assert_eq!(mm.flops, 2 * 32 * 32 * 32);
        check_trace(&profile.to_chrome_trace(), 2);
        // The second launch starts no earlier than the first on the device timeline.
        assert!(profile.records[1].start_us >= profile.records[0].start_us);
    }
}
