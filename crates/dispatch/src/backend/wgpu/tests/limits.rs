//! Devices with small limits: an engine's own device with a 1 KiB storage-binding limit
//! (chunked and split ops, refused ones), and a narrow grid.

use super::*;
use crate::backend::wgpu::adapter::enumerate;

pub(super) fn own_device(what: &str) -> Option<Device> {
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP {what}: no adapter ({e})");
            None
        }
    }
}

/// An engine's own device (no `SHADER_F16` requested, so f16 takes the packed path) with a
/// 1 KiB storage-binding limit: tilekit runs on it; activations and copies over the limit run
/// in chunks bound as windows; a matmul operand over it is refused with a typed error instead
/// of a wgpu validation panic.
#[test]
fn from_raw_device_and_the_binding_limit() {
    let Some(adapter) = enumerate().ok().and_then(|a| a.into_iter().next()) else {
        eprintln!("SKIP from_raw test: no adapter");
        return;
    };
    let limits = wgpu::Limits { max_storage_buffer_binding_size: 1024, ..adapter.limits() };
    let desc = wgpu::DeviceDescriptor { label: Some("engine"), required_limits: limits, ..Default::default() };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    let dev = Device::from_wgpu(device, queue).unwrap();
    assert!(dev.description().contains("f16 packed"), "{}", dev.description());
    if backend(&dev).limits.max_storage_buffer_binding_size > 1024 {
        eprintln!("SKIP binding-limit checks: the device did not take the lower limit");
        return;
    }
    // 1000 f32 = 4000 bytes: four chunks of 256 elements, the bias row (6) crossing chunks.
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for in_place in [false, true] {
            run_activation_case(&dev, dtype, 1002, Some(6), Activation::Gelu, in_place);
            run_activation_case(&dev, dtype, 1000, Some(8), Activation::Relu, in_place);
        }
        // An odd length of a 16-bit type: the last chunk ends on half a word.
        let len = 999;
        let src = upload(&dev, dtype, &values(len, 3));
        let dst = upload(&dev, dtype, &vec![3.0; len + 1]);
        backend(&dev)
            .copy(
                dtype,
                WgpuBackend::storage_of(&src.buffer.storage).unwrap(),
                WgpuBackend::storage_of(&dst.buffer.storage).unwrap(),
                len,
            )
            .unwrap();
        let got = dst.to_f32_vec().unwrap();
        assert_eq!(&got[..len], &src.to_f32_vec().unwrap()[..], "{dtype}");
        assert_eq!(got[len], 3.0, "{dtype}");
    }
    // A matmul operand over the limit is split by blocks; a non-transposed B whose single
    // column block is still over it cannot be split and is refused with a typed error that
    // says so.
    let a = dev.zeros(&[2, 150], DType::F32).unwrap();
    let b = dev.zeros(&[150, 2], DType::F32).unwrap();
    let err = dev.matmul(&a, &b, &crate::MatmulOptions::default()).unwrap_err();
    assert!(matches!(&err, Error::Overflow { what, .. } if what.contains("transposed")), "{err:?}");
    split_matmuls(&dev);
    split_convs(&dev);
}

/// Depthwise convolutions over a 1 KiB binding limit (`dev`), in every dtype, against the
/// reference: split by batches, by channel planes (NCHW) and by output rows (one output
/// channel in NCHW, one image in NHWC) with padding, stride, dilation, multiplier and bias;
/// a row block wholly in the padding; and one output row over the limit, refused.
pub(super) fn split_convs(dev: &Device) {
    let mut seed = 7000;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        let mut cases = Vec::new();
        // Batches: 8 images of 2 x 6 x 7 (over the limit in every dtype), a few per block.
        let mut d = conv_desc(Layout::Nchw, 2, 1, (6, 7), (3, 3));
        d.batch = 8;
        d.has_bias = true;
        cases.push(d);
        // Channel planes: 9 channels of 6 x 6, multiplier 2.
        let mut d = conv_desc(Layout::Nchw, 9, 2, (6, 6), (3, 3));
        d.pad_top = 1;
        d.pad_left = 1;
        d.pad_right = 1;
        d.pad_bottom = 1;
        d.activation = Activation::Relu6;
        d.has_bias = true;
        cases.push(d);
        // Output rows: of one channel of 20 x 21 planes (NCHW), of one image (NHWC); stride 2, dilation, asymmetric padding.
        for layout in [Layout::Nchw, Layout::Nhwc] {
            // (An NHWC row block reads 5 input rows here: 11 pixels of 2 channels keep them
            // inside the limit.)
            let (c, w) = if layout == Layout::Nhwc { (2, 11) } else { (2, 21) };
            let mut d = conv_desc(layout, c, 1, (20, w), (3, 3));
            d.stride_h = 2;
            d.dilation_h = 2;
            d.pad_top = 2;
            d.pad_bottom = 1;
            d.pad_left = 1;
            d.activation = Activation::Gelu;
            d.has_bias = true;
            cases.push(d);
            // Padding so large that the first and last row blocks see only padding.
            let mut d = conv_desc(layout, c, 2, (18, 9), (2, 3));
            d.pad_top = 9;
            d.pad_bottom = 9;
            cases.push(d);
        }
        for d in &cases {
            run_conv_case(dev, dtype, d, seed);
            seed += 3;
        }
    }
    // NHWC rows of 300 pixels x 4 channels: one output row is over 1 KiB.
    let x = dev.zeros(&[1, 2, 300, 4], DType::F32).unwrap();
    let w = dev.zeros(&[4, 1, 1, 1], DType::F32).unwrap();
    let opts = crate::Conv2dOptions::default().layout(Layout::Nhwc);
    let err = dev.depthwise_conv2d(&x, &w, None, &opts).unwrap_err();
    assert!(matches!(&err, Error::Overflow { what, .. } if what.contains("output row")), "{err:?}");
}

/// Matmuls over a 1 KiB binding limit (`dev`), split into blocks of batches, rows and
/// columns with windows at aligned offsets, in every dtype, against the reference: batches
/// with broadcast B, strided views with odd offsets, bias and C, both transposes, K = 0.
pub(super) fn split_matmuls(dev: &Device) {
    let before = backend(dev).submission_count();
    let mut seed = 5000;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for (ta, tb) in [(false, false), (true, true), (false, true), (true, false)] {
            // 3 batches of 40 x 24 x 30: every operand (2.4-4.8 KB in f32) is over the limit.
            // A transposed A (K x M) splits by rows only down to K rows of it, a non-transposed
            // B likewise by columns: there K stays small enough for one such block to fit.
            let k = if !ta && tb { 30 } else { 4 };
            let mut case = dense_case(3, 40, 24, k, ta, tb);
            case.desc.bias_offset = Some(3);
            case.bias = true;
            let d = &mut case.desc;
            d.c = Some(MatrixView::new(1, d.n + 1, d.m * (d.n + 1)));
            d.out = MatrixView::new(5, d.n + 2, d.m * (d.n + 2) + 3);
            d.alpha = 0.5;
            d.beta = -1.25;
            d.activation = Activation::Gelu;
            run_matmul_case(dev, dtype, &case, seed);
            seed += 1;
        }
        // B broadcast to every batch, M = 2 (the small-M kernel), an offset A.
        let mut case = dense_case(5, 2, 70, 9, false, true);
        case.desc.b.batch_stride = 0;
        case.desc.a = MatrixView::new(7, 11, 23);
        run_matmul_case(dev, dtype, &case, seed);
        // K = 0: only the epilogue, over windows of C and the output.
        let mut case = dense_case(2, 30, 20, 0, false, false);
        case.desc.c = Some(MatrixView::dense(30, 20));
        case.desc.beta = 2.0;
        run_matmul_case(dev, dtype, &case, seed + 1);
        seed += 2;
    }
    assert!(backend(dev).submission_count() > before);
}

/// An engine device that allows only 8 workgroups per grid dimension, so batch splitting and
/// grid folding run on small, quick shapes, and 128 invocations per workgroup, as downlevel
/// devices do.
pub(super) fn narrow_grid_device() -> Option<Device> {
    let adapter = enumerate().ok().and_then(|a| a.into_iter().next())?;
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 8,
        max_compute_invocations_per_workgroup: 128,
        ..adapter.limits()
    };
    let desc = wgpu::DeviceDescriptor { label: Some("narrow grid"), required_limits: limits, ..Default::default() };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).ok()?;
    let dev = Device::from_wgpu(device, queue).ok()?;
    let l = &backend(&dev).limits;
    (l.max_compute_workgroups_per_dimension == 8 && l.max_compute_invocations_per_workgroup == 128).then_some(dev)
}

#[test]
fn grid_limits_split_batches_rows_and_columns_fold_1d_grids_and_refuse_the_rest() {
    let Some(dev) = narrow_grid_device() else {
        eprintln!("SKIP grid test: no adapter, or it did not take the lower grid limit");
        return;
    };
    // 20 batches of a 3x5x2 product with B broadcast: launches of 8, 8 and 4 batches.
    let mut case = dense_case(20, 3, 5, 2, false, false);
    case.desc.b.batch_stride = 0;
    case.desc.bias_offset = Some(0);
    case.bias = true;
    run_matmul_case(&dev, DType::F32, &case, 900);
    run_matmul_case(&dev, DType::Bf16, &case, 901);
    // M = 40 would take the 256-invocation tile: the device allows 128, so the 16 x 128 one runs.
    run_matmul_case(&dev, DType::F32, &dense_case(1, 40, 33, 20, true, true), 903);
    // 3000 elements = 750 invocations = 12 workgroups of 64: folded into an 8 x 2 grid.
    for in_place in [false, true] {
        run_activation_case(&dev, DType::F32, 3000, Some(6), Activation::Gelu, in_place);
    }
    let mut d = conv_desc(Layout::Nhwc, 8, 1, (9, 9), (3, 3));
    d.pad_top = 1;
    d.pad_left = 1;
    run_conv_case(&dev, DType::F16, &d, 902);
    // M = 1 takes the small-M kernel, 256 columns per workgroup: N = 256 * 8 + 1 needs 9
    // column blocks, more than the grid dimension holds, so it runs as two launches over
    // column windows. M = 300 with 16-row short tiles needs 19 row blocks: three launches.
    let n = (cat::SMALL_M_WG * cat::SMALL_M_COLS) as usize * 8 + 1;
    run_matmul_case(&dev, DType::F32, &dense_case(1, 1, n, 3, false, false), 904);
    run_matmul_case(&dev, DType::F16, &dense_case(2, 300, 5, 3, false, true), 905);
    // 64 * 4 * 8 * 8 + 1 elements need 65 workgroups: more than an 8 x 8 grid.
    let x = dev.zeros(&[64 * 4 * 64 + 1], DType::F32).unwrap();
    let err = dev.activation(&x, None, Activation::Relu).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err:?}");
}
