//! Autotuning of the wgpu matmul and depthwise convolution, with a persistent cache.
//!
//! # What is tuned
//! Each tunable kernel has a list of candidate [`Spec`]s in the kernel catalogue
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

use crate::backend::Backend;
use crate::{Device, Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use tilekit_kernels::catalogue::wgsl::{Kernel, MatmulTile, Spec};
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

    fn to_u8(self) -> u8 {
        match self {
            TuneMode::Off => 0,
            TuneMode::Cached => 1,
            TuneMode::On => 2,
        }
    }

    fn from_u8(v: u8) -> TuneMode {
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

/// A tuned configuration as stored: the tunable fields of a [`Spec`] (the small-M row count
/// follows from M and is not stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunedConfig {
    /// `WG_X` of the tiled matmul.
    pub wg_x: u32,
    /// `WG_Y` of the tiled matmul.
    pub wg_y: u32,
    /// `BK` of the tiled matmul.
    pub bk: u32,
    /// Workgroup size of the small-M matmul or the convolution.
    pub wg: u32,
}

impl TunedConfig {
    /// The tunable fields of `spec` as `kernel` uses them.
    pub fn of(kernel: Kernel, spec: Spec) -> TunedConfig {
        let s = spec.normalised(kernel);
        TunedConfig { wg_x: s.tile.wg_x, wg_y: s.tile.wg_y, bk: s.tile.bk, wg: s.wg }
    }

    /// The spec with these fields, `rows` for the small-M kernel.
    pub fn spec(self, kernel: Kernel, rows: u32) -> Spec {
        Spec { tile: MatmulTile { wg_x: self.wg_x, wg_y: self.wg_y, bk: self.bk }, rows, wg: self.wg, ..Spec::DEFAULT }
            .normalised(kernel)
    }
}

/// One cached result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// The winner.
    pub config: TunedConfig,
    /// `catalogue::wgsl::source_hash` of the kernel it was tuned with, in hex.
    pub kernel_hash: String,
    /// The winner's time, µs per run.
    pub micros: f64,
    /// The default config's time, µs per run (for "tuned vs default").
    pub default_micros: f64,
    /// Seconds since the Unix epoch when it was tuned.
    pub tuned_at: u64,
}

/// The cache file's contents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheFile {
    /// Format version; a file of another version is ignored (and replaced on the next write).
    pub version: u32,
    /// Entries by key (see the module documentation).
    pub entries: BTreeMap<String, CacheEntry>,
}

/// The current cache format.
pub const CACHE_VERSION: u32 = 1;

impl CacheFile {
    /// Reads `path`; a missing, unreadable, corrupt or other-version file reads as empty
    /// (it is only a cache: the next write replaces it).
    pub fn load(path: &Path) -> CacheFile {
        let empty = CacheFile { version: CACHE_VERSION, entries: BTreeMap::new() };
        match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice::<CacheFile>(&bytes) {
                Ok(f) if f.version == CACHE_VERSION => f,
                _ => empty,
            },
            Err(_) => empty,
        }
    }

    /// Merges `updates` into the file at `path` and removes `removals` (a removal applies only
    /// while the file still holds that same stale entry), atomically: the file is re-read,
    /// changed, written to a temporary file in the same folder and renamed over the old one.
    pub fn merge_into(
        path: &Path,
        updates: &BTreeMap<String, CacheEntry>,
        removals: &[(String, CacheEntry)],
    ) -> Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let io = |what: &str, e: std::io::Error| Error::Backend {
            backend: crate::BackendKind::Wgpu,
            message: format!("tune cache {}: {what}: {e}", path.display()),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("creating its folder", e))?;
        }
        let mut file = CacheFile::load(path);
        for (key, stale) in removals {
            if file.entries.get(key) == Some(stale) {
                file.entries.remove(key);
            }
        }
        for (key, entry) in updates {
            file.entries.insert(key.clone(), entry.clone());
        }
        let text = serde_json::to_vec_pretty(&file).map_err(|e| io("serialising", e.into()))?;
        let name = path.file_name().map_or_else(|| "tune.json".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            use std::io::Write as _;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("writing", e));
        }
        Ok(())
    }
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

/// Hex of a kernel hash as stored.
pub(crate) fn hash_hex(h: u64) -> String {
    format!("{h:016x}")
}

fn bucket(v: usize) -> usize {
    v.max(1).checked_next_power_of_two().unwrap_or(usize::MAX)
}

/// The op, layout and shape-bucket part of a matmul key.
pub(crate) fn matmul_key_tail(desc: &MatmulDesc) -> String {
    format!(
        "matmul|t{}{}|b{}m{}n{}k{}",
        desc.trans_a as u8,
        desc.trans_b as u8,
        bucket(desc.batch),
        bucket(desc.m),
        bucket(desc.n),
        bucket(desc.k)
    )
}

/// The op, layout and shape-bucket part of a depthwise-conv key.
pub(crate) fn conv_key_tail(desc: &Conv2dDesc) -> String {
    let oh = desc.out_h().unwrap_or(0);
    let ow = desc.out_w().unwrap_or(0);
    format!(
        "depthwise_conv2d|{}|k{}x{}s{}x{}m{}|n{}c{}hw{}",
        desc.layout.name(),
        desc.kernel_h,
        desc.kernel_w,
        desc.stride_h,
        desc.stride_w,
        desc.multiplier.min(2),
        bucket(desc.batch),
        bucket(desc.out_channels()),
        bucket(oh.saturating_mul(ow))
    )
}

/// The autotuner state of one wgpu device.
#[derive(Debug)]
pub(crate) struct Tuner {
    mode: AtomicU8,
    path: Mutex<Option<PathBuf>>,
    state: Mutex<TunerState>,
}

#[derive(Debug, Default)]
struct TunerState {
    /// The file as read at first use (`None` until then).
    file: Option<CacheFile>,
    /// Validated decisions by key, so each key is looked up once per process.
    memo: HashMap<String, TunedConfig>,
}

impl Tuner {
    pub(crate) fn new(mode: TuneMode, path: Option<PathBuf>) -> Tuner {
        Tuner { mode: AtomicU8::new(mode.to_u8()), path: Mutex::new(path), state: Mutex::new(TunerState::default()) }
    }

    pub(crate) fn from_env() -> Tuner {
        Tuner::new(TuneMode::from_env(), default_cache_path())
    }

    pub(crate) fn mode(&self) -> TuneMode {
        TuneMode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    pub(crate) fn set_mode(&self, mode: TuneMode) {
        self.mode.store(mode.to_u8(), Ordering::Relaxed);
        // Decisions made under the old mode (defaults remembered for misses) no longer hold.
        if let Ok(mut s) = self.state.lock() {
            s.memo.clear();
        }
    }

    pub(crate) fn path(&self) -> Option<PathBuf> {
        self.path.lock().ok().and_then(|p| p.clone())
    }

    /// Points the tuner at another file and forgets what it read.
    pub(crate) fn set_path(&self, path: Option<PathBuf>) {
        if let Ok(mut p) = self.path.lock() {
            *p = path;
        }
        if let Ok(mut s) = self.state.lock() {
            *s = TunerState::default();
        }
    }

    /// The validated decision for `key`: the memo, else the file's entry when its hash
    /// matches `hash`, its config is one of `candidates` and `fits` it. An entry failing a
    /// check is dropped from the memory copy and from the file (best effort).
    pub(crate) fn lookup(
        &self,
        key: &str,
        hash: impl FnOnce() -> String,
        kernel: Kernel,
        candidates: &[Spec],
        fits: impl Fn(Spec) -> bool,
    ) -> Option<TunedConfig> {
        let path = self.path();
        let mut state = self.state.lock().ok()?;
        if let Some(c) = state.memo.get(key) {
            return Some(*c);
        }
        if state.file.is_none() {
            state.file = Some(path.as_deref().map(CacheFile::load).unwrap_or_default());
        }
        let entry = state.file.as_ref().and_then(|f| f.entries.get(key)).cloned()?;
        let valid = entry.kernel_hash == hash()
            && candidates.iter().any(|&c| TunedConfig::of(kernel, c) == entry.config)
            && fits(entry.config.spec(kernel, candidates.first().map_or(4, |c| c.rows)));
        if valid {
            state.memo.insert(key.to_string(), entry.config);
            return Some(entry.config);
        }
        if let Some(f) = state.file.as_mut() {
            f.entries.remove(key);
        }
        drop(state);
        if let Some(p) = path {
            // Dropping the stale entry on disk is only tidying: a failure changes nothing.
            let _ = CacheFile::merge_into(&p, &BTreeMap::new(), &[(key.to_string(), entry)]);
        }
        None
    }

    /// Records a decision in memory (also for "no entry": the default, so the file is not
    /// consulted again for this key).
    pub(crate) fn remember(&self, key: &str, config: TunedConfig) {
        if let Ok(mut s) = self.state.lock() {
            s.memo.insert(key.to_string(), config);
        }
    }

    /// Stores a tuned result in memory and in the file.
    pub(crate) fn store(&self, key: &str, entry: CacheEntry) -> Result<()> {
        if let Ok(mut s) = self.state.lock() {
            s.memo.insert(key.to_string(), entry.config);
            if let Some(f) = s.file.as_mut() {
                f.entries.insert(key.to_string(), entry.clone());
            }
        }
        match self.path() {
            Some(p) => CacheFile::merge_into(&p, &BTreeMap::from([(key.to_string(), entry)]), &[]),
            None => Ok(()),
        }
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn wgpu_storage<'t>(op: &'static str, t: &'t crate::Tensor) -> Result<&'t crate::backend::wgpu::WgpuStorage> {
    match &t.buffer.storage {
        crate::backend::Storage::Wgpu(s) => Ok(s),
        #[allow(unreachable_patterns)]
        _ => Err(Error::DeviceMismatch { op, tensor: "operand" }),
    }
}

fn untunable(device: &Device) -> Error {
    Error::Backend {
        backend: device.kind(),
        message: "autotuning covers the wgpu kernels only; this backend has no tile configurations".into(),
    }
}

impl Device {
    /// The autotuner's mode (always [`TuneMode::Off`] on backends without tunable kernels).
    pub fn tune_mode(&self) -> TuneMode {
        match &self.inner.backend {
            Backend::Wgpu(b) => b.tuner().mode(),
            _ => TuneMode::Off,
        }
    }

    /// Sets the autotuner's mode for this device (overrides `TILEKIT_TUNE`).
    pub fn set_tune_mode(&self, mode: TuneMode) {
        if let Backend::Wgpu(b) = &self.inner.backend {
            b.tuner().set_mode(mode);
        }
    }

    /// The tune cache file this device reads and writes.
    pub fn tune_cache_path(&self) -> Option<PathBuf> {
        match &self.inner.backend {
            Backend::Wgpu(b) => b.tuner().path(),
            _ => None,
        }
    }

    /// Points this device's autotuner at another cache file (overrides `TILEKIT_TUNE_CACHE`);
    /// `None` keeps results in memory only.
    pub fn set_tune_cache_path(&self, path: Option<PathBuf>) {
        if let Backend::Wgpu(b) = &self.inner.backend {
            b.tuner().set_path(path);
        }
    }

    /// Times every candidate config for `desc` in `dtype` on zero-filled operands, stores
    /// the winner in the cache (whatever the mode) and reports the timings.
    pub fn tune_matmul(&self, desc: &MatmulDesc, dtype: DType) -> Result<TuneReport> {
        let Backend::Wgpu(_) = &self.inner.backend else { return Err(untunable(self)) };
        let len = |v: crate::MatrixView, rows: usize, cols: usize, what: &'static str| {
            v.required_len(desc.batch, rows, cols)
                .ok_or_else(|| Error::Overflow { op: "tune_matmul", what: format!("the extent of {what}") })
        };
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let a = self.zeros(&[len(desc.a, ar, ac, "a")?.max(1)], dtype)?;
        let b = self.zeros(&[len(desc.b, br, bc, "b")?.max(1)], dtype)?;
        let out = self.zeros(&[len(desc.out, desc.m, desc.n, "out")?.max(1)], dtype)?;
        let bias = desc.bias_offset.map(|o| self.zeros(&[o + desc.n], dtype)).transpose()?;
        let c = desc.c.map(|v| len(v, desc.m, desc.n, "c").and_then(|l| self.zeros(&[l.max(1)], dtype))).transpose()?;
        self.validate_matmul(desc, &a, &b, bias.as_ref(), c.as_ref(), Some(&out))?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Err(Error::InvalidParameter { op: "tune_matmul", param: "desc", reason: "empty output".into() });
        }
        let Backend::Wgpu(be) = &self.inner.backend else { return Err(untunable(self)) };
        let s = |t| wgpu_storage("tune_matmul", t);
        let bias_s = bias.as_ref().map(s).transpose()?;
        let c_s = c.as_ref().map(s).transpose()?;
        be.tune_matmul_now(desc, dtype, s(&a)?, s(&b)?, bias_s, c_s, s(&out)?)
    }

    /// Times every candidate config for `desc` in `dtype` on zero-filled tensors, stores the
    /// winner in the cache (whatever the mode) and reports the timings.
    pub fn tune_depthwise_conv2d(&self, desc: &Conv2dDesc, dtype: DType) -> Result<TuneReport> {
        let Backend::Wgpu(be) = &self.inner.backend else { return Err(untunable(self)) };
        let input = self.zeros(&desc.input_shape(), dtype)?;
        let weight = self.zeros(&desc.weight_shape(), dtype)?;
        let out = self.zeros(&desc.output_shape(), dtype)?;
        let bias = desc.has_bias.then(|| self.zeros(&[desc.out_channels()], dtype)).transpose()?;
        if out.is_empty() {
            return Err(Error::InvalidParameter {
                op: "tune_depthwise_conv2d",
                param: "desc",
                reason: "empty output".into(),
            });
        }
        let s = |t| wgpu_storage("tune_depthwise_conv2d", t);
        let bias_s = bias.as_ref().map(s).transpose()?;
        be.tune_conv_now(desc, dtype, s(&input)?, s(&weight)?, bias_s, s(&out)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
