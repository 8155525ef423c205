//! The device as a whole: batched submissions, descriptions, every catalogue module, a lost
//! device, uncaptured errors, naga validation, threads, tuning candidates and profiles.

use super::*;

#[test]
fn ops_are_batched_into_few_submissions() {
    // A device of its own: the shared ones see other tests' submissions in parallel.
    let dev = match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP wgpu submission test: no adapter ({e})");
            return;
        }
    };
    let be = backend(&dev);
    let x = dev.tensor_from_f32(&[64], DType::F32, &values(64, 5)).unwrap();
    dev.synchronize().unwrap();
    let before = be.submission_count();
    for _ in 0..20 {
        dev.activation_in_place(&x, None, Activation::Relu).unwrap();
    }
    // Twenty ops recorded, nothing submitted until the host waits.
    assert_eq!(be.submission_count(), before);
    dev.synchronize().unwrap();
    assert_eq!(be.submission_count(), before + 1);
}

#[test]
fn description_names_the_f16_path() {
    if let Some(dev) = device(true) {
        assert!(dev.description().contains("f16 packed"), "{}", dev.description());
    }
    if let Some(dev) = device(false) {
        let d = dev.description();
        assert!(d.contains("f16"), "{d}");
        let adapters = probe_adapters().unwrap();
        assert!(!adapters.is_empty());
    }
}

#[test]
fn every_catalogue_module_builds_a_pipeline() {
    let Some(dev) = device(false) else { return };
    let be = backend(dev);
    for kernel in Kernel::ALL {
        for storage in ElementStorage::ALL {
            // A kernel built for one storage variant only is built once, as that variant.
            if kernel.only_storage().is_some_and(|only| only != storage) {
                continue;
            }
            if storage.needs_f16() && !be.device.features().contains(wgpu::Features::SHADER_F16) {
                continue;
            }
            if kernel.needs_subgroups() && !be.subgroups {
                eprintln!("SKIP {} pipeline: the device has no SUBGROUP", kernel.name());
                continue;
            }
            if kernel.needs_cooperative_matrix() {
                // Never built without the feature (tests/coop.rs); with it, built as chosen.
                continue;
            }
            // The other specs (tiles, small-M rows) are built by the matmul tests.
            be.pipeline("test", kernel, storage, Spec::DEFAULT).unwrap();
        }
    }
}

/// After the device is destroyed every call returns `DeviceLost` (the waits poll with a
/// timeout, so nothing hangs); a new device made afterwards works.
#[test]
fn a_destroyed_device_gives_device_lost_and_a_new_device_works() {
    let Some(dev) = own_device("device-lost test") else { return };
    let x = dev.tensor_from_f32(&[8], DType::F32, &values(8, 1)).unwrap();
    // Work pending at the time of the loss.
    dev.activation_in_place(&x, None, Activation::Relu).unwrap();
    backend(&dev).device.destroy();
    let lost = |r: &crate::Result<()>| matches!(r, Err(Error::DeviceLost { .. }));
    let r = dev.activation_in_place(&x, None, Activation::Relu).and_then(|_| dev.synchronize());
    assert!(lost(&r), "{r:?}");
    let r = x.to_f32_vec().map(|_| ());
    assert!(lost(&r), "{r:?}");
    let r = dev.zeros(&[4], DType::F32).map(|_| ());
    assert!(lost(&r), "{r:?}");
    let r = dev.matmul(&x.reshape(&[2, 4]).unwrap(), &x.reshape(&[4, 2]).unwrap(), &Default::default()).map(|_| ());
    assert!(lost(&r), "{r:?}");
    drop(x);
    drop(dev);
    let Some(fresh) = own_device("device-lost test (second device)") else { return };
    for in_place in [false, true] {
        run_activation_case(&fresh, DType::F32, 35, Some(5), Activation::Gelu, in_place);
    }
    run_matmul_case(&fresh, DType::F32, &dense_case(2, 5, 6, 7, false, true), 77);
}

/// Normal runs raise no uncaptured wgpu error: every op, dtype and path on a device of its
/// own, then the handler's count is read. An error raised outside tilekit's error scopes is
/// counted by the handler and returned by the next op as a typed error, not a panic.
#[test]
fn uncaptured_errors_are_counted_zero_in_normal_runs_and_routed_into_errors() {
    let Some(dev) = own_device("uncaptured-error test") else { return };
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        run_matmul_case(&dev, dtype, &dense_case(2, 9, 10, 11, false, false), 60);
        run_matmul_case(&dev, dtype, &dense_case(1, 2, 10, 11, true, true), 61);
        run_conv_case(&dev, dtype, &conv_desc(Layout::Nchw, 3, 2, (6, 7), (3, 3)), 62);
        run_conv_case(&dev, dtype, &conv_desc(Layout::Nhwc, 4, 1, (5, 5), (3, 3)), 63);
        run_activation_case(&dev, dtype, 20, Some(4), Activation::GeluTanh, true);
        run_activation_case(&dev, dtype, 20, None, Activation::Relu6, false);
    }
    dev.synchronize().unwrap();
    let errors = &backend(&dev).errors;
    assert_eq!(errors.count.load(Ordering::Relaxed), 0, "{:?}", errors.unreported.lock().unwrap());
    // A buffer that may not be both mappable for reading and storage, made outside any scope.
    let _bad = backend(&dev).device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("invalid on purpose"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    assert_eq!(errors.count.load(Ordering::Relaxed), 1);
    let r = dev.zeros(&[4], DType::F32);
    assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
    // Reported once: the device goes on working.
    run_activation_case(&dev, DType::F32, 9, None, Activation::Relu, false);
}

/// An op's encoding and allocation run without error scopes on a device tilekit made (its own
/// uncaptured-error handler counts every error) and the error still comes back from the call
/// that raised it; on an engine's device, whose handler is not tilekit's, the same call runs
/// inside error scopes, so nothing reaches any handler.
#[test]
fn errors_raised_by_an_op_come_back_from_it_with_and_without_scopes() {
    let Some(dev) = own_device("per-op error test") else { return };
    let be = backend(&dev);
    let invalid = |device: &wgpu::Device| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("invalid on purpose"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    assert!(be.errors.own_handler);
    let r = be.op_checked(64, || invalid(&be.device)).map(|_| ());
    assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
    // It went through the handler (no scope) and was reported once, by the call that raised it.
    assert_eq!(be.errors.count.load(Ordering::Relaxed), 1);
    assert!(be.errors.unreported.lock().unwrap().is_none());
    run_activation_case(&dev, DType::F32, 9, None, Activation::Relu, false);

    let (device, queue) = dev.wgpu_device().unwrap();
    let engine = Device::from_wgpu(device.clone(), queue.clone()).unwrap();
    let engine_be = backend(&engine);
    assert!(!engine_be.errors.own_handler);
    let r = engine_be.op_checked(64, || invalid(&engine_be.device)).map(|_| ());
    assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
    // Caught by the scopes: the handler on the device (tilekit's, here) saw nothing new.
    assert_eq!(be.errors.count.load(Ordering::Relaxed), 1);
    run_activation_case(&engine, DType::F32, 9, None, Activation::Relu, false);
}

/// Every module of the catalogue parses and validates with naga (wgpu's own copy), with or
/// without an adapter on the machine.
#[test]
fn every_catalogue_module_validates_with_naga() {
    use wgpu::naga;
    for m in cat::all_modules() {
        let module = naga::front::wgsl::parse_str(&m.source)
            .unwrap_or_else(|e| panic!("{}: {}", m.name, e.emit_to_string(&m.source)));
        let mut caps = naga::valid::Capabilities::default();
        if m.needs_f16 {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16;
        }
        // Only the subgroup GEMV module may need subgroups: the plain one validates without.
        if m.kernel.needs_subgroups() {
            caps |= naga::valid::Capabilities::SUBGROUP;
        }
        if m.kernel.needs_cooperative_matrix() {
            caps |= naga::valid::Capabilities::COOPERATIVE_MATRIX;
        }
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", m.name, e.emit_to_string(&m.source)));
        assert!(module.entry_points.iter().any(|e| e.name == m.entry_point), "{}", m.name);
    }
}

/// Several threads recording ops on one device at once (the device is `Send + Sync`).
#[test]
fn ops_from_several_threads() {
    let Some(dev) = device(false) else { return };
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            scope.spawn(move || {
                for i in 0..5 {
                    let (m, n, k) = (3 + t as usize, 5 + i, 4);
                    run_matmul_case(
                        dev,
                        DType::F32,
                        &dense_case(1, m, n, k, i % 2 == 0, false),
                        1000 + t * 10 + i as u64,
                    );
                    run_activation_case(dev, DType::Bf16, 37 + i, None, Activation::Relu6, i % 2 == 1);
                }
            });
        }
    });
}

/// Every tuning candidate computes the op correctly: each spec is forced through the whole op
/// path (small-M, 16-row and general matmul classes with ragged edges, f32 and bf16; the
/// convolution in both layouts).
#[test]
fn every_tuning_candidate_is_correct() {
    let Some(dev) = own_device("tuning candidates") else { return };
    let be = backend(&dev);
    let force = |spec: Option<Spec>| *be.force_spec.lock().unwrap() = spec;
    for (m, n, k) in [(3, 37, 9), (13, 70, 21), (37, 70, 21)] {
        let (kernel, candidates) = cat::matmul_candidates(m);
        for spec in candidates {
            if !be.spec_fits(kernel, spec) {
                continue;
            }
            force(Some(spec));
            for dtype in [DType::F32, DType::Bf16] {
                let mut case = dense_case(2, m, n, k, false, true);
                case.desc.activation = Activation::Gelu;
                run_matmul_case(&dev, dtype, &case, 11);
            }
        }
    }
    for spec in cat::conv_candidates() {
        force(Some(spec));
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut d = conv_desc(layout, 12, 1, (9, 11), (3, 3));
            d.has_bias = true;
            d.stride_h = 2;
            run_conv_case(&dev, DType::F32, &d, 5);
        }
    }
    force(None);
}

/// A closed profile leaves the hot path alone: no launches are listed, no query sets made.
#[test]
fn closed_profile_records_nothing() {
    let Some(dev) = own_device("closed profile") else { return };
    let be = backend(&dev);
    let a = upload(&dev, DType::F32, &values(64, 3));
    dev.profile_begin().unwrap();
    dev.activation(&a, None, Activation::Relu).unwrap();
    let p = dev.profile_end().unwrap();
    assert_eq!(p.records.len(), 1);
    assert_eq!(p.records[0].timing == crate::Timing::Device, be.has_timestamps());
    dev.activation(&a, None, Activation::Relu).unwrap();
    let inner = be.prof.inner.lock().unwrap();
    assert!(inner.launches.is_empty() && inner.sets.is_empty());
}
