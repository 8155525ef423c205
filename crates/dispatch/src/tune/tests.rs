//! The device-level tuning calls: modes, the cache through ops, explicit tunes, and tune
//! requests that travel with their call (two threads). No test asserts on a timing.

use super::*;
use crate::backend::wgpu::cache::CacheFile;
use crate::backend::wgpu::cache::tests::temp_path;
use crate::{MatmulOptions, WgpuOptions};
use tilekit_kernels::catalogue::wgsl::Kernel;

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
    assert_eq!(report.candidates.len(), tilekit_kernels::catalogue::wgsl::conv_candidates().len());
    assert!(report.candidates.iter().any(|(l, _)| *l == report.winner));
    assert!(CacheFile::load(&path).entries.contains_key(&report.key));
    assert!(Device::cpu().tune_depthwise_conv2d(&desc, DType::F32).is_err());
}

/// A tune request travels with its call: while two threads tune (a matmul and a convolution),
/// a third thread's matmuls under `TuneMode::Off` are neither tuned nor cached, and each tuner
/// gets the report of its own op.
#[test]
fn explicit_tunes_leave_other_threads_ops_alone_and_keep_their_own_reports() {
    let Some(dev) = wgpu_device() else { return };
    let path = temp_path("threads");
    dev.set_tune_cache_path(Some(path.clone()));
    dev.set_tune_mode(TuneMode::Off);
    // 3 x 40 x 8: the small-M class, key bucket m4n64k8, unlike either tune's.
    let (a, b, want) = matmul_inputs(&dev, 3, 40, 8);
    let conv = crate::Conv2dDesc::mobilenet_v2_block(1, 8, 9, 1, crate::Layout::Nhwc);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mm_report, conv_report, others) = std::thread::scope(|s| {
        let other = s.spawn(|| {
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) || n < 3 {
                let y = dev.matmul(&a, &b, &MatmulOptions::default()).unwrap();
                assert_eq!(y.to_f32_vec().unwrap(), want);
                n += 1;
            }
            n
        });
        let mm = s.spawn(|| dev.tune_matmul(&MatmulDesc::new(20, 24, 8), DType::F32));
        let cv = s.spawn(|| dev.tune_depthwise_conv2d(&conv, DType::F32));
        let mm = mm.join().unwrap().unwrap();
        let cv = cv.join().unwrap().unwrap();
        done.store(true, std::sync::atomic::Ordering::Release);
        (mm, cv, other.join().unwrap())
    });
    assert!(others >= 3);
    assert!(mm_report.key.contains("|matmul|t00|b1m32n32k8"), "{}", mm_report.key);
    assert!(conv_report.key.contains("|depthwise_conv2d|nhwc"), "{}", conv_report.key);
    assert_eq!(mm_report.candidates.len(), tilekit_kernels::catalogue::wgsl::matmul_candidates(20).1.len());
    assert_eq!(conv_report.candidates.len(), tilekit_kernels::catalogue::wgsl::conv_candidates().len());
    let file = CacheFile::load(&path);
    let keys: Vec<&String> = file.entries.keys().collect();
    assert_eq!(keys, {
        let mut k = vec![&mm_report.key, &conv_report.key];
        k.sort();
        k
    });
    assert!(keys.iter().all(|k| !k.contains("m4n64k8")), "the untuned thread's op was tuned: {keys:?}");
}

/// `tune_depthwise_conv2d` validates a caller's descriptor as the op does: typed errors, no
/// panic, nothing allocated for a descriptor the op would refuse.
#[test]
fn tune_depthwise_conv2d_validates_its_descriptor() {
    let Some(dev) = wgpu_device() else { return };
    let good = crate::Conv2dDesc::mobilenet_v2_block(1, 8, 9, 1, crate::Layout::Nchw);
    let cases = [good.stride_h(0), good.dilation_w(0), good.kernel_h(0), good.multiplier(0), good.kernel_w(50)];
    for d in cases {
        let e = dev.tune_depthwise_conv2d(&d, DType::F32).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { op: "tune_depthwise_conv2d", .. }), "{d:?}: {e:?}");
    }
    for d in [good.multiplier(usize::MAX), good.channels(usize::MAX / 2).height(4)] {
        let e = dev.tune_depthwise_conv2d(&d, DType::F32).unwrap_err();
        assert!(matches!(e, Error::Overflow { op: "tune_depthwise_conv2d", .. }), "{d:?}: {e:?}");
    }
}
