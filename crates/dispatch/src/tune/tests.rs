//! Cache round trips, invalidation, concurrent writers and the device-level modes. No test
//! asserts on a timing.

use super::*;
use crate::{Device, MatmulOptions, WgpuOptions};

/// A fresh path under the system temp folder.
fn temp_path(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tilekit-tune-test-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("nested").join("tune.json")
}

fn entry(wg: u32, hash: &str) -> CacheEntry {
    CacheEntry {
        config: TunedConfig::of(Kernel::DepthwiseConv2d, Spec { wg, ..Spec::DEFAULT }),
        kernel_hash: hash.into(),
        micros: 10.0,
        default_micros: 12.0,
        tuned_at: 1,
    }
}

fn candidates() -> Vec<Spec> {
    tilekit_kernels::catalogue::wgsl::conv_candidates()
}

#[test]
fn cache_round_trips_through_a_file() {
    let path = temp_path("roundtrip");
    let updates = BTreeMap::from([("k1".to_string(), entry(128, "aa")), ("k2".to_string(), entry(256, "bb"))]);
    CacheFile::merge_into(&path, &updates, &[]).unwrap();
    let back = CacheFile::load(&path);
    assert_eq!(back.version, CACHE_VERSION);
    assert_eq!(back.entries, updates);
    // A new tuner (a restart) finds it.
    let t = Tuner::new(TuneMode::Cached, Some(path.clone()));
    let got = t.lookup("k1", || "aa".into(), Kernel::DepthwiseConv2d, &candidates(), |_| true);
    assert_eq!(got, Some(entry(128, "aa").config));
    // A corrupt file reads as empty and is replaced by the next write.
    std::fs::write(&path, b"{ not json").unwrap();
    assert!(CacheFile::load(&path).entries.is_empty());
    CacheFile::merge_into(&path, &BTreeMap::from([("k3".to_string(), entry(64, "cc"))]), &[]).unwrap();
    assert_eq!(CacheFile::load(&path).entries.len(), 1);
}

#[test]
fn a_changed_kernel_hash_drops_the_entry() {
    let path = temp_path("hash");
    CacheFile::merge_into(&path, &BTreeMap::from([("k".to_string(), entry(128, "old"))]), &[]).unwrap();
    let t = Tuner::new(TuneMode::Cached, Some(path.clone()));
    assert_eq!(t.lookup("k", || "new".into(), Kernel::DepthwiseConv2d, &candidates(), |_| true), None);
    assert!(!CacheFile::load(&path).entries.contains_key("k"), "the stale entry is removed from the file");
}

#[test]
fn a_config_over_the_limits_or_outside_the_candidates_is_dropped() {
    let path = temp_path("limits");
    let updates = BTreeMap::from([("big".to_string(), entry(256, "h")), ("alien".to_string(), entry(96, "h"))]);
    CacheFile::merge_into(&path, &updates, &[]).unwrap();
    let t = Tuner::new(TuneMode::Cached, Some(path.clone()));
    // A device that now allows at most 128 invocations.
    let fits = |s: Spec| s.wg <= 128;
    assert_eq!(t.lookup("big", || "h".into(), Kernel::DepthwiseConv2d, &candidates(), fits), None);
    // 96 is not a candidate (any more).
    assert_eq!(t.lookup("alien", || "h".into(), Kernel::DepthwiseConv2d, &candidates(), |_| true), None);
    assert!(CacheFile::load(&path).entries.is_empty());
}

#[test]
fn concurrent_writers_leave_valid_json() {
    let path = temp_path("concurrent");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let key = format!("t{t}-{i}");
                    CacheFile::merge_into(&path, &BTreeMap::from([(key, entry(64, "h"))]), &[]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let file: CacheFile = serde_json::from_str(&text).expect("the file is valid JSON after concurrent writes");
    assert!(!file.entries.is_empty());
    assert!(file.entries.keys().all(|k| k.starts_with('t')));
    // No temporary file is left behind.
    let dir = path.parent().unwrap();
    let leftovers = std::fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().file_name() != "tune.json").count();
    assert_eq!(leftovers, 0);
}

#[test]
fn modes_parse() {
    assert_eq!(TuneMode::parse("off"), Some(TuneMode::Off));
    assert_eq!(TuneMode::parse("ON"), Some(TuneMode::On));
    assert_eq!(TuneMode::parse("cached"), Some(TuneMode::Cached));
    assert_eq!(TuneMode::parse("sometimes"), None);
    assert_eq!(TuneMode::default(), TuneMode::Cached);
}

fn wgpu_device() -> Option<Device> {
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("no wgpu adapter ({e}): skipped");
            None
        }
    }
}

fn matmul_inputs(dev: &Device, m: usize, n: usize, k: usize) -> (crate::Tensor, crate::Tensor, Vec<f32>) {
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    let ta = dev.tensor_from_f32(&[m, k], DType::F32, &a).unwrap();
    let tb = dev.tensor_from_f32(&[k, n], DType::F32, &b).unwrap();
    (ta, tb, want)
}

#[test]
fn off_mode_neither_reads_nor_writes_the_cache() {
    let Some(dev) = wgpu_device() else { return };
    let path = temp_path("off");
    dev.set_tune_cache_path(Some(path.clone()));
    dev.set_tune_mode(TuneMode::Off);
    let (a, b, want) = matmul_inputs(&dev, 20, 24, 8);
    let y = dev.matmul(&a, &b, &MatmulOptions::default()).unwrap();
    // Small integers: exact in any summation order.
    assert_eq!(y.to_f32_vec().unwrap(), want);
    assert!(!path.exists());
    assert!(dev.tune_matmul(&MatmulDesc::new(20, 24, 8), DType::F32).is_ok(), "an explicit tune still runs");
    assert!(path.exists());
}

#[test]
fn tuning_on_first_use_persists_and_a_restart_uses_it() {
    let Some(dev) = wgpu_device() else { return };
    let path = temp_path("on");
    dev.set_tune_cache_path(Some(path.clone()));
    dev.set_tune_mode(TuneMode::On);
    let (a, b, want) = matmul_inputs(&dev, 20, 24, 8);
    let (y, profile) = dev.profile(|| dev.matmul(&a, &b, &MatmulOptions::default())).unwrap();
    assert_eq!(y.to_f32_vec().unwrap(), want, "the tuned result is correct");
    // The tuning launches are not in the caller's profile.
    assert_eq!(profile.records.len(), 1);
    let file = CacheFile::load(&path);
    assert_eq!(file.entries.len(), 1);
    let (key, e) = file.entries.iter().next().unwrap();
    assert!(key.contains("|f32|matmul|t00|b1m32n32k8"), "{key}");
    // A new device (a restart) in the default mode uses the cached winner.
    let again = wgpu_device().unwrap();
    again.set_tune_cache_path(Some(path.clone()));
    again.set_tune_mode(TuneMode::Cached);
    let (a2, b2, _) = matmul_inputs(&again, 20, 24, 8);
    let (y2, p2) = again.profile(|| again.matmul(&a2, &b2, &MatmulOptions::default())).unwrap();
    assert_eq!(y2.to_f32_vec().unwrap(), want);
    let spec = e.config.spec(Kernel::Matmul, 4);
    assert!(p2.records[0].kernel.contains(&spec.label(Kernel::Matmul)), "{} vs {spec:?}", p2.records[0].kernel);
}

#[test]
fn explicit_tune_reports_every_candidate() {
    let Some(dev) = wgpu_device() else { return };
    let path = temp_path("explicit");
    dev.set_tune_cache_path(Some(path.clone()));
    let desc = crate::Conv2dDesc::mobilenet_v2_block(1, 8, 9, 1, crate::Layout::Nchw);
    let report = dev.tune_depthwise_conv2d(&desc, DType::F32).unwrap();
    assert_eq!(report.candidates.len(), candidates().len());
    assert!(report.candidates.iter().any(|(l, _)| *l == report.winner));
    assert!(CacheFile::load(&path).entries.contains_key(&report.key));
    assert!(Device::cpu().tune_depthwise_conv2d(&desc, DType::F32).is_err());
}
