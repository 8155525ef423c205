//! Cache round trips, invalidation and concurrent writers. No test asserts on a timing.

use super::*;

/// A fresh path under the system temp folder.
pub(crate) fn temp_path(tag: &str) -> PathBuf {
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
