//! The wgpu autotuner's persistent cache and its keys (the behaviour is documented on
//! [`crate::tune`]): the file format, atomic merges, the key of an op, and the per-device
//! [`Tuner`] that validates every hit.

use crate::tune::{TuneMode, default_cache_path};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use tilekit_kernels::catalogue::wgsl::{Kernel, MatmulTile, Spec};
use tilekit_kernels::{Conv2dDesc, MatmulDesc};

/// A tuned configuration as stored: the tunable fields of a [`Spec`] (the small-M row count
/// follows from M and is not stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TunedConfig {
    /// `WG_X` of the tiled matmul.
    pub(crate) wg_x: u32,
    /// `WG_Y` of the tiled matmul.
    pub(crate) wg_y: u32,
    /// `BK` of the tiled matmul.
    pub(crate) bk: u32,
    /// Workgroup size of the small-M matmul or the convolution.
    pub(crate) wg: u32,
}

impl TunedConfig {
    /// The tunable fields of `spec` as `kernel` uses them.
    pub(crate) fn of(kernel: Kernel, spec: Spec) -> TunedConfig {
        let s = spec.normalised(kernel);
        TunedConfig { wg_x: s.tile.wg_x, wg_y: s.tile.wg_y, bk: s.tile.bk, wg: s.wg }
    }

    /// The spec with these fields, `rows` for the small-M kernel.
    pub(crate) fn spec(self, kernel: Kernel, rows: u32) -> Spec {
        Spec { tile: MatmulTile { wg_x: self.wg_x, wg_y: self.wg_y, bk: self.bk }, rows, wg: self.wg, ..Spec::DEFAULT }
            .normalised(kernel)
    }
}

/// One cached result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct CacheEntry {
    /// The winner.
    pub(crate) config: TunedConfig,
    /// `catalogue::wgsl::source_hash` of the kernel it was tuned with, in hex.
    pub(crate) kernel_hash: String,
    /// The winner's time, µs per run.
    pub(crate) micros: f64,
    /// The default config's time, µs per run (for "tuned vs default").
    pub(crate) default_micros: f64,
    /// Seconds since the Unix epoch when it was tuned.
    pub(crate) tuned_at: u64,
}

/// The cache file's contents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CacheFile {
    /// Format version; a file of another version is ignored (and replaced on the next write).
    pub(crate) version: u32,
    /// Entries by key (see the module documentation).
    pub(crate) entries: BTreeMap<String, CacheEntry>,
}

/// The current cache format.
pub(crate) const CACHE_VERSION: u32 = 1;

impl CacheFile {
    /// Reads `path`; a missing, unreadable, corrupt or other-version file reads as empty
    /// (it is only a cache: the next write replaces it).
    pub(crate) fn load(path: &Path) -> CacheFile {
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
    pub(crate) fn merge_into(
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;
