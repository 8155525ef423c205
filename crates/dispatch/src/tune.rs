//! Autotuning of the wgpu matmul and depthwise convolution, with a persistent cache.
//!
//! # What is tuned
//! Each tunable kernel has a list of candidate `Spec`s in the kernel catalogue
//! (`tilekit_kernels::catalogue::wgsl::{matmul_candidates, conv_candidates}`): matmul tiles
//! (64×64, 64×32, 32×64, 128×32, 32×128 blocks, BK 8 or 16), 16-row tiles for 4 < M <= 16,
//! workgroup sizes of the small-M kernel and of the convolution. The first candidate is always
//! the default, so an untuned device runs exactly what it ran before tuning existed. Every
//! candidate computes the same sums with f32 accumulation; only the summation order inside a
//! slab may differ, which the tolerance model already covers.
//!
//! # The key
//! A result is stored under `fingerprint | op | storage variant | layout | shape bucket`:
//! the device fingerprint is the adapter name, backend API, vendor and device ids, driver and
//! driver version; the storage variant is `f32`, `f16`, `f16_packed` or `bf16_packed`; the
//! layout is the transposes (matmul) or NCHW/NHWC, kernel size and stride (conv); the shape
//! bucket rounds each extent up to a power of two. With it the entry stores the hash of the
//! candidate kernel's source (`catalogue::wgsl::source_hash`).
//!
//! # Validation on every hit
//! A cached entry is used only when its kernel hash equals the current source's, its config is
//! one of today's candidates, and it fits the device's limits (workgroup storage, invocations,
//! workgroup size). Anything else is dropped (removed from the file on the next write) and the
//! default runs: a stale entry is never launched.
//!
//! # The file
//! JSON at `$TILEKIT_TUNE_CACHE` when set (an application can ship a pre-built cache this
//! way), else `$XDG_CACHE_HOME/tilekit/tune.json`, else `~/.cache/tilekit/tune.json`. Writes
//! re-read the file, merge their entries into it and replace it by writing a temporary file in
//! the same folder and renaming it over the old one, so concurrent processes never leave a
//! torn file; at worst one of two simultaneous results is lost and tuned again later.
//!
//! # Modes ([`TuneMode`], `TILEKIT_TUNE`)
//! - `off`: the default configs, the cache is neither read nor written (deterministic runs).
//! - `cached` (the default when unset): cached results are used, nothing is timed. Timing on
//!   first use would add seconds of latency at an unpredictable moment and make the chosen
//!   kernels depend on machine load, so it is opt-in; build the cache with `cargo xtask tune`
//!   (or [`Device::tune_matmul`]) or ship one.
//! - `on`: a miss is tuned on first use, on the op's own operands, and written to the cache.

use crate::backend::{BackendOps, with_backend};
use crate::ops::storage;
use crate::{Device, Error, Result, Tensor};
use std::path::PathBuf;
use tilekit_kernels::{Conv2dDesc, DType, MatmulDesc};

/// When the autotuner times candidates and whether it reads its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TuneMode {
    /// Default configs only; the cache is not touched.
    Off,
    /// Cached results are used; nothing is timed (the default).
    #[default]
    Cached,
    /// Misses are tuned on first use and written to the cache.
    On,
}

impl TuneMode {
    /// Parses `off`, `cached` or `on` (also `0`/`false` and `1`/`true`).
    pub fn parse(s: &str) -> Option<TuneMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Some(TuneMode::Off),
            "cached" | "cache" | "" => Some(TuneMode::Cached),
            "on" | "1" | "true" | "yes" => Some(TuneMode::On),
            _ => None,
        }
    }

    /// `TILEKIT_TUNE`, or [`TuneMode::Cached`] when unset or unknown.
    pub fn from_env() -> TuneMode {
        std::env::var("TILEKIT_TUNE").ok().and_then(|v| TuneMode::parse(&v)).unwrap_or_default()
    }

    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))] // The wgpu backend's tuner stores it.
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            TuneMode::Off => 0,
            TuneMode::Cached => 1,
            TuneMode::On => 2,
        }
    }

    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn from_u8(v: u8) -> TuneMode {
        match v {
            0 => TuneMode::Off,
            2 => TuneMode::On,
            _ => TuneMode::Cached,
        }
    }
}

/// The cache file: `TILEKIT_TUNE_CACHE`, else `$XDG_CACHE_HOME/tilekit/tune.json`, else
/// `$HOME/.cache/tilekit/tune.json`; `None` when none of them is set.
pub fn default_cache_path() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("TILEKIT_TUNE_CACHE") {
        return Some(p);
    }
    let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
    Some(base.join("tilekit").join("tune.json"))
}

/// What tuning one key found.
#[derive(Clone, Debug)]
pub struct TuneReport {
    /// The cache key.
    pub key: String,
    /// Each candidate: label, µs per run (`Err` with why it did not run).
    pub candidates: Vec<(String, std::result::Result<f64, String>)>,
    /// The winner's label.
    pub winner: String,
    /// The winner's time, µs per run.
    pub winner_micros: f64,
    /// The default's time, µs per run.
    pub default_micros: f64,
}

impl Device {
    /// The autotuner's mode (always [`TuneMode::Off`] on backends without tunable kernels).
    pub fn tune_mode(&self) -> TuneMode {
        with_backend!(self, be => be.tune_mode())
    }

    /// Sets the autotuner's mode for this device (overrides `TILEKIT_TUNE`).
    pub fn set_tune_mode(&self, mode: TuneMode) {
        with_backend!(self, be => be.set_tune_mode(mode))
    }

    /// The tune cache file this device reads and writes.
    pub fn tune_cache_path(&self) -> Option<PathBuf> {
        with_backend!(self, be => be.tune_cache_path())
    }

    /// Points this device's autotuner at another cache file (overrides `TILEKIT_TUNE_CACHE`);
    /// `None` keeps results in memory only.
    pub fn set_tune_cache_path(&self, path: Option<PathBuf>) {
        with_backend!(self, be => be.set_tune_cache_path(path))
    }

    /// Times every candidate config for `desc` in `dtype` on zero-filled operands, stores
    /// the winner in the cache (whatever the mode) and reports the timings. Other threads'
    /// ops on this device meanwhile run as the mode says; they are not tuned by this call.
    pub fn tune_matmul(&self, desc: &MatmulDesc, dtype: DType) -> Result<TuneReport> {
        const OP: &str = "tune_matmul";
        with_backend!(self, be => be.check_tunable())?;
        let len = |v: crate::MatrixView, rows: usize, cols: usize, what: &'static str| {
            v.required_len(desc.batch, rows, cols)
                .ok_or_else(|| Error::Overflow { op: OP, what: format!("the extent of {what}") })
        };
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let a = self.zeros(&[len(desc.a, ar, ac, "a")?.max(1)], dtype)?;
        let b = self.zeros(&[len(desc.b, br, bc, "b")?.max(1)], dtype)?;
        let out = self.zeros(&[len(desc.out, desc.m, desc.n, "out")?.max(1)], dtype)?;
        let bias_len = desc
            .bias_offset
            .map(|o| o.checked_add(desc.n).ok_or_else(|| Error::Overflow { op: OP, what: "the extent of bias".into() }))
            .transpose()?;
        let bias = bias_len.map(|l| self.zeros(&[l], dtype)).transpose()?;
        let c = desc.c.map(|v| len(v, desc.m, desc.n, "c").and_then(|l| self.zeros(&[l.max(1)], dtype))).transpose()?;
        self.validate_matmul(desc, &a, &b, bias.as_ref(), c.as_ref(), Some(&out))?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Err(Error::InvalidParameter { op: OP, param: "desc", reason: "empty output".into() });
        }
        with_backend!(self, be => tune_matmul_on(be, desc, dtype, [&a, &b, &out], bias.as_ref(), c.as_ref()))
    }

    /// Times every candidate config for `desc` in `dtype` on zero-filled tensors, stores the
    /// winner in the cache (whatever the mode) and reports the timings. `desc` is validated
    /// as [`Device::depthwise_conv2d`] validates the descriptor it builds.
    pub fn tune_depthwise_conv2d(&self, desc: &Conv2dDesc, dtype: DType) -> Result<TuneReport> {
        const OP: &str = "tune_depthwise_conv2d";
        with_backend!(self, be => be.check_tunable())?;
        crate::ops::validate_conv_desc(OP, desc)?;
        let input = self.zeros(&desc.input_shape(), dtype)?;
        let weight = self.zeros(&desc.weight_shape(), dtype)?;
        let out = self.zeros(&desc.output_shape(), dtype)?;
        let bias = desc.has_bias.then(|| self.zeros(&[desc.out_channels()], dtype)).transpose()?;
        if out.is_empty() {
            return Err(Error::InvalidParameter { op: OP, param: "desc", reason: "empty output".into() });
        }
        with_backend!(self, be => tune_conv_on(be, desc, dtype, [&input, &weight, &out], bias.as_ref()))
    }
}

fn tune_matmul_on<B: BackendOps>(
    be: &B,
    desc: &MatmulDesc,
    dtype: DType,
    [a, b, out]: [&Tensor; 3],
    bias: Option<&Tensor>,
    c: Option<&Tensor>,
) -> Result<TuneReport> {
    const OP: &str = "tune_matmul";
    be.tune_matmul(
        desc,
        dtype,
        storage::<B>(OP, "a", a)?,
        storage::<B>(OP, "b", b)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        c.map(|t| storage::<B>(OP, "c", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}

fn tune_conv_on<B: BackendOps>(
    be: &B,
    desc: &Conv2dDesc,
    dtype: DType,
    [input, weight, out]: [&Tensor; 3],
    bias: Option<&Tensor>,
) -> Result<TuneReport> {
    const OP: &str = "tune_depthwise_conv2d";
    be.tune_depthwise_conv2d(
        desc,
        dtype,
        storage::<B>(OP, "input", input)?,
        storage::<B>(OP, "weight", weight)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}

#[cfg(all(test, feature = "wgpu"))]
#[allow(clippy::unwrap_used)]
mod tests;
