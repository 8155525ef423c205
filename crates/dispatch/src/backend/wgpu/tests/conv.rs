//! Depthwise convolution against the reference: layouts, strides, dilation, padding,
//! multiplier, half types.

use super::*;
use crate::WgpuOptions;
use tilekit_kernels::catalogue::wgsl::{self as cat, DwTiledPlan, Spec};

pub(super) fn conv_desc(layout: Layout, c: usize, m: usize, hw: (usize, usize), k: (usize, usize)) -> Conv2dDesc {
    Conv2dDesc::new(layout, [2, c, hw.0, hw.1], [k.0, k.1])
        .multiplier(m)
        .stride_h(1)
        .stride_w(1)
        .pad_top(0)
        .pad_bottom(0)
        .pad_left(0)
        .pad_right(0)
        .dilation_h(1)
        .dilation_w(1)
        .has_bias(false)
        .activation(Activation::None)
}

pub(super) fn run_conv_case(dev: &Device, dtype: DType, d: &Conv2dDesc, seed: u64) {
    let input = dev.tensor_from_f32(&d.input_shape(), dtype, &values(d.input_shape().iter().product(), seed)).unwrap();
    let weight =
        dev.tensor_from_f32(&d.weight_shape(), dtype, &values(d.weight_shape().iter().product(), seed + 1)).unwrap();
    let bias = d.has_bias.then(|| upload(dev, dtype, &values(d.out_channels(), seed + 2)));
    let opts = crate::Conv2dOptions::default()
        .stride([d.stride_h, d.stride_w])
        .padding([d.pad_top, d.pad_bottom, d.pad_left, d.pad_right])
        .dilation([d.dilation_h, d.dilation_w])
        .layout(d.layout)
        .activation(d.activation);
    let out = dev.depthwise_conv2d(&input, &weight, bias.as_ref(), &opts).unwrap();
    // The same convolution with the weights pre-packed: the same bytes.
    let packed = dev.pack_depthwise_weights(&weight, d.channels).unwrap();
    let out_packed = dev.depthwise_conv2d_packed(&input, &packed, bias.as_ref(), &opts).unwrap();
    assert_eq!(out_packed.to_bytes().unwrap(), out.to_bytes().unwrap(), "packed vs unpacked {dtype} {d:?}");
    let got = out.to_f32_vec().unwrap();
    let (iw, ww) = (widen(&input), widen(&weight));
    let bw = bias.as_ref().map(widen);
    let mut want = vec![0.0; got.len()];
    reference::depthwise_conv2d(d, &iw, &ww, bw.as_deref(), &mut want);
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut mag = vec![0.0; got.len()];
    let mut dm = *d;
    dm.activation = Activation::None;
    reference::depthwise_conv2d(&dm, &abs(&iw), &abs(&ww), bw.as_deref().map(abs).as_deref(), &mut mag);
    assert_close(&format!("conv {dtype} {d:?}"), dtype, &got, &want, &mag, d.kernel_h * d.kernel_w);
}

#[test]
fn depthwise_conv_layouts_strides_dilation_padding_multiplier() {
    let Some(dev) = device(false) else { return };
    let mut cases = Vec::new();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        // Plain 3x3, odd sizes, no padding.
        cases.push(conv_desc(layout, 3, 1, (5, 7), (3, 3)));
        // Multiplier 2, stride 2, asymmetric padding, bias, relu6.
        let mut d = conv_desc(layout, 3, 2, (9, 6), (3, 3));
        d.stride_h = 2;
        d.stride_w = 2;
        d.pad_top = 1;
        d.pad_bottom = 0;
        d.pad_left = 2;
        d.pad_right = 1;
        d.has_bias = true;
        d.activation = Activation::Relu6;
        cases.push(d);
        // Dilation 2, non-square filter, gelu.
        let mut d = conv_desc(layout, 5, 1, (8, 9), (3, 2));
        d.dilation_h = 2;
        d.dilation_w = 3;
        d.pad_left = 1;
        d.has_bias = true;
        d.activation = Activation::Gelu;
        cases.push(d);
        // Vector paths: OW a multiple of 4 (NCHW) and C a multiple of 4 (NHWC).
        let mut d = conv_desc(layout, 8, 1, (6, 8), (3, 3));
        d.pad_top = 1;
        d.pad_bottom = 1;
        d.pad_left = 1;
        d.pad_right = 1;
        d.has_bias = true;
        d.activation = Activation::GeluTanh;
        cases.push(d);
    }
    for (i, d) in cases.iter().enumerate() {
        run_conv_case(dev, DType::F32, d, 500 + i as u64);
    }
}

#[test]
fn depthwise_conv_half_types() {
    for (dev, dtype) in variants() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut d = conv_desc(layout, 3, 2, (5, 5), (3, 3));
            d.pad_top = 1;
            d.pad_left = 1;
            d.has_bias = true;
            d.activation = Activation::Relu;
            run_conv_case(dev, dtype, &d, 600);
            let mut d = conv_desc(layout, 4, 1, (4, 8), (3, 3));
            d.pad_top = 1;
            d.pad_bottom = 1;
            d.pad_left = 1;
            d.pad_right = 1;
            run_conv_case(dev, dtype, &d, 610);
        }
    }
}

/// A descriptor with padding `[top, bottom, left, right]`, stride and dilation set.
fn with(mut d: Conv2dDesc, pad: [usize; 4], stride: usize, dil: (usize, usize)) -> Conv2dDesc {
    [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right] = pad;
    d.stride_h = stride;
    d.stride_w = stride;
    d.dilation_h = dil.0;
    d.dilation_w = dil.1;
    d
}

/// The tiled kernel's edges: sizes of 1, primes, non-multiples of the tiles (8 x 32 NCHW,
/// 8 x 8 x 16 channels NHWC), inputs smaller than the halo, every padding pattern, stride 2,
/// dilation, multiplier 2 (NCHW), several tiles along each axis, bias and activations. Each
/// case is checked to take the tiled kernel, against the reference, and packed vs unpacked.
fn tiled_cases(layout: Layout) -> Vec<Conv2dDesc> {
    let c = |ch: usize| if layout == Layout::Nhwc { ch } else { ch.min(3) };
    let mut v = vec![
        with(conv_desc(layout, c(1), 1, (1, 1), (3, 3)), [1, 1, 1, 1], 1, (1, 1)),
        with(conv_desc(layout, c(5), 1, (2, 3), (3, 3)), [1, 1, 1, 1], 2, (1, 1)),
        with(conv_desc(layout, c(17), 1, (7, 13), (3, 3)), [2, 0, 1, 3], 1, (1, 1)),
        with(conv_desc(layout, c(16), 1, (11, 33), (3, 2)), [0, 2, 3, 0], 1, (2, 3)),
        with(conv_desc(layout, c(20), 1, (5, 8), (5, 5)), [2, 2, 2, 2], 1, (1, 1)),
        with(conv_desc(layout, c(33), 1, (17, 67), (3, 3)), [1, 1, 1, 1], 1, (1, 1)),
        with(conv_desc(layout, c(4), 1, (19, 40), (3, 3)), [0, 1, 0, 1], 2, (1, 1)),
    ];
    if layout == Layout::Nchw {
        v.push(with(conv_desc(layout, 3, 2, (9, 37), (3, 3)), [1, 1, 1, 1], 2, (1, 1)));
    }
    for (i, d) in v.iter_mut().enumerate() {
        d.has_bias = i % 2 == 0;
        d.activation = [Activation::Relu6, Activation::None, Activation::Gelu][i % 3];
    }
    v
}

/// Devices of these tests' own (native f16, and f16 packed in u32) with the tiled kernel forced
/// (NCHW does not take it by default), and the dtypes to run on each.
fn tiled_devices(what: &str) -> Vec<(Device, Vec<DType>)> {
    let mut v = Vec::new();
    for packed in [false, true] {
        let opts = WgpuOptions { allow_software: true, force_packed_f16: packed, ..WgpuOptions::default() };
        match Device::wgpu(&opts) {
            Ok(dev) => {
                *backend(&dev).force_spec.lock().unwrap() = Some(Spec { wg: cat::DW_TILED, ..Spec::DEFAULT });
                let dtypes = if packed { vec![DType::F16] } else { vec![DType::F32, DType::F16, DType::Bf16] };
                v.push((dev, dtypes));
            }
            Err(e) => eprintln!("SKIP {what}: no adapter ({e})"),
        }
    }
    v
}

#[test]
fn tiled_depthwise_edges_both_layouts() {
    for (dev, _) in tiled_devices("tiled depthwise edges").iter().take(1) {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for (i, d) in tiled_cases(layout).iter().enumerate() {
                assert!(DwTiledPlan::new(d, 65535).is_some(), "not tiled: {d:?}");
                run_conv_case(dev, DType::F32, d, 700 + i as u64);
            }
        }
    }
}

#[test]
fn tiled_depthwise_half_types() {
    for (dev, dtypes) in &tiled_devices("tiled depthwise half types") {
        for &dtype in dtypes.iter().filter(|&&t| t != DType::F32) {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for (i, d) in tiled_cases(layout).iter().enumerate().filter(|(i, _)| matches!(i, 2 | 4 | 6)) {
                    run_conv_case(dev, dtype, d, 800 + i as u64);
                }
            }
        }
    }
}

/// Where the tiled kernel does not apply the general one runs, with packed weights too: NHWC
/// with a multiplier, a patch over the workgroup arrays (large dilation), more taps than the
/// staged taps hold.
#[test]
fn depthwise_outside_the_tiled_kernel() {
    let Some(dev) = device(false) else { return };
    let mut cases = vec![conv_desc(Layout::Nhwc, 4, 3, (6, 7), (3, 3))];
    cases.push(with(conv_desc(Layout::Nhwc, 4, 1, (9, 40), (3, 3)), [0; 4], 1, (4, 16)));
    cases.push(with(conv_desc(Layout::Nchw, 2, 1, (20, 140), (3, 3)), [0; 4], 1, (8, 64)));
    cases.push(conv_desc(Layout::Nhwc, 4, 1, (9, 9), (9, 9)));
    for (i, d) in cases.iter().enumerate() {
        assert!(DwTiledPlan::new(d, 65535).is_none(), "tiled: {d:?}");
        run_conv_case(dev, DType::F32, d, 900 + i as u64);
    }
}

/// Guard bands: the output is a window at an odd element offset of a larger engine buffer
/// whose other elements hold a sentinel; the tiled kernel's overhanging tiles must leave
/// them alone (a clamped out-of-bounds store would land on the last element).
#[test]
// Options built field by field: the form that keeps compiling once `Conv2dOptions` is
// `#[non_exhaustive]`.
#[allow(clippy::field_reassign_with_default)]
fn tiled_depthwise_keeps_guard_bands() {
    let devices = tiled_devices("tiled depthwise guard bands");
    let Some((dev, _)) = devices.first() else { return };
    let (wdev, queue) = dev.wgpu_device().unwrap();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let d = with(conv_desc(layout, 5, 1, (9, 13), (3, 3)), [1, 1, 1, 1], 2, (1, 1));
        let input =
            dev.tensor_from_f32(&d.input_shape(), DType::F32, &values(d.input_shape().iter().product(), 41)).unwrap();
        let weight = dev.tensor_from_f32(&d.weight_shape(), DType::F32, &values(45, 42)).unwrap();
        let mut opts = crate::Conv2dOptions::default();
        opts.stride = [2, 2];
        opts.padding = [1; 4];
        opts.layout = layout;
        let want = dev.depthwise_conv2d(&input, &weight, None, &opts).unwrap().to_f32_vec().unwrap();
        let (front, back) = (3usize, 7usize);
        let total = front + want.len() + back;
        let buffer = wdev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("guarded output"),
            size: (total * 4).div_ceil(16) as u64 * 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let sentinel = vec![-7.25f32; (total * 4).div_ceil(16) * 4];
        queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&sentinel));
        let out =
            Tensor::from_wgpu_buffer(dev, buffer.clone(), (front * 4) as u64, &d.output_shape(), DType::F32).unwrap();
        dev.depthwise_conv2d_into(&input, &weight, None, &opts, &out).unwrap();
        let all = Tensor::from_wgpu_buffer(dev, buffer, 0, &[total], DType::F32).unwrap().to_f32_vec().unwrap();
        assert!(all[..front].iter().chain(&all[front + want.len()..]).all(|&v| v == -7.25), "guard band {layout:?}");
        assert_eq!(&all[front..front + want.len()], &want[..], "{layout:?}");
    }
}
