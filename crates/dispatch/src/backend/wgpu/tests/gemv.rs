//! The GEMV kernel (M <= 16) against the reference, on both reductions: the shared device
//! reduces with subgroup operations where the adapter has `SUBGROUP` (lavapipe does), the
//! packed-f16 device is made with `no_subgroups` and reduces through workgroup memory.

use super::*;

/// Both test devices with the GEMV kernel each runs (`gemv_subgroup` or `gemv`).
fn gemv_devices() -> Vec<(&'static Device, &'static str)> {
    let mut v = Vec::new();
    for packed in [false, true] {
        if let Some(dev) = device(packed) {
            let name = if backend(dev).subgroups { "gemv_subgroup" } else { "gemv" };
            v.push((dev, name));
        }
    }
    if v.len() == 2 && v[0].1 == v[1].1 {
        eprintln!("SKIP gemv subgroup path: the adapter has no SUBGROUP (only the workgroup-memory reduction ran)");
    }
    v
}

/// The kernel a matmul with `m` rows runs on `dev` (from a profile of one launch).
fn kernel_of(dev: &Device, m: usize) -> String {
    let a = upload(dev, DType::F32, &values(m * 8, 1));
    let b = upload(dev, DType::F32, &values(8 * 8, 2));
    let out = dev.zeros(&[m * 8], DType::F32).unwrap();
    let mut d = MatmulDesc::new(m, 8, 8);
    d.trans_b = true;
    dev.profile_begin().unwrap();
    dev.matmul_into(&d, &a, &b, None, None, &out).unwrap();
    let p = dev.profile_end().unwrap();
    // Other tests share the device and may record ops meanwhile: take this op's launch.
    let shape = format!("m{m} n8 k8");
    p.records.iter().find(|r| r.shape.contains(&shape)).map(|r| r.kernel.clone()).unwrap_or_default()
}

/// A device of its own with the options of `device(packed)`: a profile on it sees only the
/// launches of the thread that owns it (the shared devices also carry other tests' ops).
pub(super) fn own_reduction_device(packed: bool) -> Option<Device> {
    device(packed)?;
    let opts =
        WgpuOptions { allow_software: true, force_packed_f16: packed, no_subgroups: packed, ..WgpuOptions::default() };
    Device::wgpu(&opts).ok()
}

#[test]
fn gemv_is_chosen_for_up_to_16_rows_with_the_device_reduction() {
    let own: Vec<(Device, &str)> = [false, true]
        .into_iter()
        .filter_map(own_reduction_device)
        .map(|d| {
            let name = if backend(&d).subgroups { "gemv_subgroup" } else { "gemv" };
            (d, name)
        })
        .collect();
    assert_eq!(own.len(), gemv_devices().len(), "a device of its own for every shared test device");
    for (dev, name) in &own {
        let (dev, name) = (dev, *name);
        for m in [1, 16] {
            let k = kernel_of(dev, m);
            assert!(k.starts_with(&format!("{name}_f32 [gemv wg")), "m = {m}: {k}");
        }
        let k = kernel_of(dev, 17);
        assert!(k.starts_with("matmul_f32 ["), "m = 17: {k}");
    }
    // The device made without subgroups must not have them.
    if let Some(dev) = device(true) {
        assert!(!backend(dev).subgroups);
    }
}

/// Row counts 1, 3, 8 and 16 (each M is a pipeline of its own: compiling one per M costs more
/// than it covers), both weight layouts (and transposed A), N and K primes and non-multiples
/// of 4, K = 0 and 1, K over one pass of the workgroup (4 · 64 = 256), guard values around the
/// output; f32 on both reductions. (M = 17, the switch to the tiled kernel, is checked in
/// `gemv_is_chosen_for_up_to_16_rows_with_the_device_reduction` and the matmul tests.)
#[test]
fn gemv_edge_shapes_both_layouts_both_reductions() {
    for (dev, _) in gemv_devices() {
        for (i, m) in [1, 3, 8, 16].into_iter().enumerate() {
            for (j, (ta, tb)) in [(false, false), (false, true), (true, true), (true, false)].into_iter().enumerate() {
                // Transposed A at M = 1 and 16 only; the shapes rotate through the layouts.
                if ta && m != 1 && m != 16 {
                    continue;
                }
                let (n, k) = [(1, 1), (5, 7), (13, 31), (37, 300), (4, 0), (3, 2)][(i + j) % 6];
                run_matmul_case(dev, DType::F32, &dense_case(1, m, n, k, ta, tb), 500 + (4 * i + j) as u64);
            }
        }
        // A long K split over several passes, and N over many workgroups.
        for tb in [false, true] {
            run_matmul_case(dev, DType::F32, &dense_case(2, 3, 67, 1031, false, tb), 560);
            run_matmul_case(dev, DType::F32, &dense_case(1, 16, 129, 517, false, tb), 561);
        }
    }
}

/// Every dtype (f32, native f16, packed f16, bf16) on both reductions with the whole epilogue
/// (alpha, bias, beta·C, each activation once) and strided, unaligned views, each dtype in both
/// weight layouts; aligned views (vec4 paths) and bf16 precision in each dtype, both layouts.
#[test]
fn gemv_every_dtype_with_the_epilogue_and_strided_views() {
    let dtypes = [DType::F32, DType::F16, DType::Bf16];
    for (dev, _) in gemv_devices() {
        // f16 is native on the first device where the adapter has SHADER_F16, packed on the second.
        // Activation i runs in dtype i mod 3 and layout (i / 3) mod 2: with six activations each
        // (dtype, layout) pair runs once.
        for (i, act) in Activation::ALL.into_iter().enumerate() {
            let dtype = dtypes[i % 3];
            let tb = (i / 3) % 2 == 1;
            let (m, n, k) = ([1, 4, 9, 16, 2, 13][i % 6], 11, 21);
            let mut desc = MatmulDesc::new(m, n, k);
            desc.batch = 2;
            desc.trans_b = tb;
            let (br, bc) = desc.b_stored();
            desc.a = MatrixView::new(3, k + 2, m * (k + 2) + 1);
            desc.b = MatrixView::new(1, bc + 1, br * (bc + 1));
            desc.c = Some(MatrixView::new(1, n + 1, m * (n + 1)));
            desc.out = MatrixView::new(2, n + 3, m * (n + 3) + 4);
            desc.bias_offset = Some(1);
            desc.alpha = 1.5;
            desc.beta = -0.75;
            desc.activation = act;
            run_matmul_case(dev, dtype, &MatmulCase { desc, bias: true }, 600 + i as u64);
        }
        for (d_i, dtype) in dtypes.into_iter().enumerate() {
            // Aligned views: vec4 loads of A and B along K or N, vec4 stores; then bf16
            // precision in the other layout.
            let tb = d_i % 2 == 0;
            let mut case = dense_case(1, 5, 24, 40, false, tb);
            case.desc.bias_offset = Some(4);
            case.bias = true;
            case.desc.activation = Activation::Relu;
            run_matmul_case(dev, dtype, &case, 650);
            let mut case = dense_case(1, 3, 10, 19, false, !tb);
            case.desc.precision = Precision::Bf16;
            run_matmul_case(dev, dtype, &case, 660);
        }
    }
}

/// Integer inputs make every sum exact: both reductions match the reference bit for bit, in
/// every dtype, both layouts (two shapes per dtype), with bias, C and relu.
#[test]
fn gemv_integer_inputs_match_bit_for_bit() {
    let ints = |n: usize, seed: u64| -> Vec<f32> { values(n, seed).iter().map(|v| (v * 2.5).round()).collect() };
    for (dev, kernel) in gemv_devices() {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            // Two shapes per dtype, one per layout; f32 takes M = 1 and 16.
            let shapes = [(1, 9, 300, true), (16, 7, 13, false), (5, 70, 64, true), (2, 5, 11, false)];
            let first = if dtype == DType::F32 { 0 } else { 2 };
            for (i, &(m, n, k, tb)) in shapes[first..first + 2].iter().enumerate() {
                let mut d = dense_case(1, m, n, k, false, tb).desc;
                d.c = Some(MatrixView::dense(m, n));
                d.bias_offset = Some(0);
                d.activation = Activation::Relu;
                let (br, bc) = d.b_stored();
                let seed = 3000 + i as u64;
                let a = dev.tensor_from_f32(&[m * k], dtype, &ints(m * k, seed)).unwrap();
                let b = dev.tensor_from_f32(&[br * bc], dtype, &ints(br * bc, seed + 1)).unwrap();
                let bias = dev.tensor_from_f32(&[n], dtype, &ints(n, seed + 2)).unwrap();
                let c = dev.tensor_from_f32(&[m * n], dtype, &ints(m * n, seed + 3)).unwrap();
                let out = dev.zeros(&[m * n], dtype).unwrap();
                dev.matmul_into(&d, &a, &b, Some(&bias), Some(&c), &out).unwrap();
                let mut want = vec![0.0; m * n];
                reference::matmul(&d, &widen(&a), &widen(&b), Some(&widen(&bias)), Some(&widen(&c)), &mut want);
                assert_eq!(widen(&out), want, "{kernel} {dtype} m{m} n{n} k{k} tb{tb}");
            }
        }
    }
}

/// Every workgroup-size candidate of the GEMV kernel is correct (forced through the op path).
#[test]
fn every_gemv_candidate_is_correct() {
    let Some(dev) = own_device("gemv candidates") else { return };
    let be = backend(&dev);
    for spec in cat::matmul_candidates(3).1 {
        *be.force_spec.lock().unwrap() = Some(spec);
        for tb in [false, true] {
            run_matmul_case(&dev, DType::F32, &dense_case(1, 3, 9, 1100, false, tb), 700);
        }
    }
    *be.force_spec.lock().unwrap() = None;
}
