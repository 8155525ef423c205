//! The wgpu backend's own tests, run on whatever adapter is there (lavapipe on CI) and checked
//! against `tilekit_kernels::reference`. Shapes stay small: lavapipe is ~100x slower than the
//! CPU. Without an adapter each test prints a visible skip line and passes.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::backend::Backend;
use crate::{Device, Tensor};
use std::sync::OnceLock;
use tilekit_kernels::{Activation, MatrixView, reference};

/// The shared test devices: native f16 where the adapter has it, and one forced to the packed
/// f16 path.
fn device(packed_f16: bool) -> Option<&'static Device> {
    static NATIVE: OnceLock<Option<Device>> = OnceLock::new();
    static PACKED: OnceLock<Option<Device>> = OnceLock::new();
    let cell = if packed_f16 { &PACKED } else { &NATIVE };
    cell.get_or_init(|| {
        let opts = WgpuOptions { allow_software: true, adapter_name: None, force_packed_f16: packed_f16 };
        match Device::wgpu(&opts) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("SKIP wgpu backend tests: no adapter ({e})");
                None
            }
        }
    })
    .as_ref()
}

fn backend(dev: &Device) -> &WgpuBackend {
    match &dev.inner.backend {
        Backend::Wgpu(b) => b,
        _ => panic!("not a wgpu device"),
    }
}

/// Every (device, dtype) pair to cover: f32, f16 native, f16 packed, bf16.
fn variants() -> Vec<(&'static Device, DType)> {
    let mut v = Vec::new();
    if let Some(d) = device(false) {
        v.push((d, DType::F32));
        v.push((d, DType::F16));
        v.push((d, DType::Bf16));
    }
    if let Some(d) = device(true) {
        v.push((d, DType::F16));
    }
    v
}

/// Deterministic values in [-1, 1) on a 2^-11 grid: exact in f32, often rounded in f16 and
/// bf16 storage (and by `Precision::Bf16`), so those roundings are exercised.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) % 4096) as f32 / 2048.0 - 1.0
        })
        .collect()
}

fn upload(dev: &Device, dtype: DType, data: &[f32]) -> Tensor {
    dev.tensor_from_f32(&[data.len()], dtype, data).unwrap()
}

fn widen(t: &Tensor) -> Vec<f64> {
    t.to_f32_vec().unwrap().into_iter().map(f64::from).collect()
}

/// Compares `got` with `want`; `mag` is the reference run on absolute values (the scale of the
/// rounding errors), `terms` the number of products summed.
fn assert_close(what: &str, dtype: DType, got: &[f32], want: &[f64], mag: &[f64], terms: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let g = f64::from(g);
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
            continue;
        }
        // f32 accumulation of `terms` products, then one rounding to the storage type (two
        // ulps allowed: the f32 error can move the value across a rounding boundary).
        let tol = 2.0f64.powi(-22) * (terms as f64 + 2.0) * m + 2.0 * dtype.unit_roundoff() * w.abs() + 2e-6;
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w} (tol {tol})");
    }
}

struct MatmulCase {
    desc: MatmulDesc,
    bias: bool,
}

fn run_matmul_case(dev: &Device, dtype: DType, case: &MatmulCase, seed: u64) {
    let d = &case.desc;
    let (ar, ac) = d.a_stored();
    let (br, bc) = d.b_stored();
    let a_len = d.a.required_len(d.batch, ar, ac).unwrap() + 3;
    let b_len = d.b.required_len(d.batch, br, bc).unwrap() + 1;
    let o_len = d.out.required_len(d.batch, d.m, d.n).unwrap() + 5;
    let a = upload(dev, dtype, &values(a_len, seed));
    let b = upload(dev, dtype, &values(b_len, seed + 1));
    let bias = case.bias.then(|| upload(dev, dtype, &values(d.bias_offset.unwrap_or(0) + d.n + 2, seed + 2)));
    let c = d.c.map(|cv| upload(dev, dtype, &values(cv.required_len(d.batch, d.m, d.n).unwrap() + 2, seed + 3)));
    // Guard values everywhere: elements outside the view must come back untouched.
    let out = upload(dev, dtype, &vec![7.0; o_len]);
    dev.matmul_into(d, &a, &b, bias.as_ref(), c.as_ref(), &out).unwrap();
    let got = out.to_f32_vec().unwrap();

    let (aw, bw) = (widen(&a), widen(&b));
    let biasw = bias.as_ref().map(widen);
    let cw = c.as_ref().map(widen);
    let mut want = vec![7.0f64; o_len];
    reference::matmul(d, &aw, &bw, biasw.as_deref(), cw.as_deref(), &mut want);
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut mag = vec![0.0f64; o_len];
    let mut dm = *d;
    dm.alpha = d.alpha.abs();
    dm.beta = d.beta.abs();
    dm.activation = Activation::None;
    reference::matmul(
        &dm,
        &abs(&aw),
        &abs(&bw),
        biasw.as_deref().map(abs).as_deref(),
        cw.as_deref().map(abs).as_deref(),
        &mut mag,
    );
    let what = format!(
        "matmul {dtype} b{} m{} n{} k{} ta{} tb{} {:?}",
        d.batch, d.m, d.n, d.k, d.trans_a, d.trans_b, d.activation
    );
    assert_close(&what, dtype, &got, &want, &mag, d.k);
}

fn dense_case(batch: usize, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulCase {
    let mut desc = MatmulDesc::new(m, n, k);
    desc.batch = batch;
    desc.trans_a = ta;
    desc.trans_b = tb;
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    desc.a = MatrixView::dense(ar, ac);
    desc.b = MatrixView::dense(br, bc);
    MatmulCase { desc, bias: false }
}

#[test]
fn matmul_f32_edge_shapes_and_transposes() {
    let Some(dev) = device(false) else { return };
    let shapes = [(1, 1, 1), (1, 1, 0), (2, 3, 5), (7, 13, 17), (64, 64, 16), (65, 63, 33), (5, 130, 3), (31, 1, 64)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            run_matmul_case(dev, DType::F32, &dense_case(1, m, n, k, ta, tb), i as u64 * 10);
        }
    }
}

#[test]
fn matmul_epilogue_batches_and_strided_views() {
    let Some(dev) = device(false) else { return };
    // M = 9 takes the tiled kernel, M = 3 the small-M one.
    for (i, (act, m)) in Activation::ALL.into_iter().flat_map(|a| [(a, 9), (a, 3)]).enumerate() {
        let (n, k, batch) = (11, 7, 3);
        let mut desc = MatmulDesc::new(m, n, k);
        desc.batch = batch;
        // A with an odd offset and a padded leading dimension; B broadcast to every batch.
        desc.a = MatrixView { offset: 3, ld: k + 2, batch_stride: m * (k + 2) + 1 };
        desc.b = MatrixView { offset: 0, ld: n, batch_stride: 0 };
        desc.c = Some(MatrixView { offset: 1, ld: n + 1, batch_stride: m * (n + 1) });
        desc.out = MatrixView { offset: 2, ld: n + 3, batch_stride: m * (n + 3) + 4 };
        desc.bias_offset = Some(1);
        desc.alpha = 1.5;
        desc.beta = -0.75;
        desc.activation = act;
        run_matmul_case(dev, DType::F32, &MatmulCase { desc, bias: true }, 100 + i as u64);
    }
    // K = 0: the epilogue of zeros (bias + beta C, then the activation); and alpha = 0.
    for (k, alpha) in [(0, 1.0), (5, 0.0)] {
        let mut case = dense_case(2, 6, 9, k, false, true);
        case.desc.c = Some(MatrixView::dense(6, 9));
        case.desc.bias_offset = Some(0);
        case.desc.alpha = alpha;
        case.desc.beta = 2.0;
        case.desc.activation = Activation::GeluTanh;
        case.bias = true;
        run_matmul_case(dev, DType::F32, &case, 150 + k as u64);
    }
    // Aligned views (vec4 fast paths for A, B and the output) with a bias at offset 4.
    let mut desc = MatmulDesc::new(20, 24, 36);
    desc.batch = 2;
    desc.a = MatrixView { offset: 4, ld: 40, batch_stride: 800 };
    desc.b = MatrixView { offset: 8, ld: 28, batch_stride: 36 * 28 };
    desc.out = MatrixView { offset: 4, ld: 24, batch_stride: 480 };
    desc.bias_offset = Some(4);
    desc.activation = Activation::Relu;
    run_matmul_case(dev, DType::F32, &MatmulCase { desc, bias: true }, 200);
}

#[test]
fn matmul_half_types_both_paths() {
    for (dev, dtype) in variants() {
        for (i, &(m, n, k, ta, tb)) in
            [(1, 1, 1, false, false), (5, 7, 9, false, true), (17, 66, 19, true, false), (8, 8, 8, true, true)]
                .iter()
                .enumerate()
        {
            run_matmul_case(dev, dtype, &dense_case(2, m, n, k, ta, tb), 300 + i as u64);
        }
        // Odd offsets and leading dimensions: two invocations write the halves of one word.
        let mut desc = MatmulDesc::new(6, 5, 4);
        desc.a = MatrixView { offset: 1, ld: 5, batch_stride: 0 };
        desc.b = MatrixView { offset: 3, ld: 7, batch_stride: 0 };
        desc.c = Some(MatrixView { offset: 1, ld: 5, batch_stride: 0 });
        desc.out = MatrixView { offset: 1, ld: 5, batch_stride: 0 };
        desc.bias_offset = Some(1);
        desc.beta = 0.5;
        desc.activation = Activation::Gelu;
        run_matmul_case(dev, dtype, &MatmulCase { desc, bias: true }, 400);
        // Precision::Bf16 on half storage (f16 values are rounded to bf16 before the products).
        let mut case = dense_case(1, 7, 10, 12, true, false);
        case.desc.precision = Precision::Bf16;
        run_matmul_case(dev, dtype, &case, 410);
    }
}

#[test]
fn matmul_bf16_precision_rounds_inputs() {
    let Some(dev) = device(false) else { return };
    let mut case = dense_case(1, 13, 9, 21, false, false);
    case.desc.precision = Precision::Bf16;
    // Inputs that bf16 cannot hold exactly, so the rounding matters.
    let d = &case.desc;
    let a: Vec<f32> = values(d.m * d.k, 7).iter().map(|v| v * (1.0 + 1.0 / 1024.0) + 1.0 / 4096.0).collect();
    let b: Vec<f32> = values(d.k * d.n, 8).iter().map(|v| v * (1.0 - 1.0 / 2048.0)).collect();
    let (at, bt) = (upload(dev, DType::F32, &a), upload(dev, DType::F32, &b));
    let out = dev.zeros(&[d.m * d.n], DType::F32).unwrap();
    dev.matmul_into(d, &at, &bt, None, None, &out).unwrap();
    let mut want = vec![0.0; d.m * d.n];
    reference::matmul(d, &widen(&at), &widen(&bt), None, None, &mut want);
    let got = out.to_f32_vec().unwrap();
    let mag: Vec<f64> = want.iter().map(|_| 2.0 * d.k as f64).collect();
    assert_close("matmul bf16 precision", DType::F32, &got, &want, &mag, d.k);
}

fn conv_desc(layout: Layout, c: usize, m: usize, hw: (usize, usize), k: (usize, usize)) -> Conv2dDesc {
    Conv2dDesc {
        batch: 2,
        channels: c,
        height: hw.0,
        width: hw.1,
        multiplier: m,
        kernel_h: k.0,
        kernel_w: k.1,
        stride_h: 1,
        stride_w: 1,
        pad_top: 0,
        pad_bottom: 0,
        pad_left: 0,
        pad_right: 0,
        dilation_h: 1,
        dilation_w: 1,
        layout,
        has_bias: false,
        activation: Activation::None,
    }
}

fn run_conv_case(dev: &Device, dtype: DType, d: &Conv2dDesc, seed: u64) {
    let input = dev.tensor_from_f32(&d.input_shape(), dtype, &values(d.input_shape().iter().product(), seed)).unwrap();
    let weight =
        dev.tensor_from_f32(&d.weight_shape(), dtype, &values(d.weight_shape().iter().product(), seed + 1)).unwrap();
    let bias = d.has_bias.then(|| upload(dev, dtype, &values(d.out_channels(), seed + 2)));
    let opts = crate::Conv2dOptions {
        stride: [d.stride_h, d.stride_w],
        padding: [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right],
        dilation: [d.dilation_h, d.dilation_w],
        layout: d.layout,
        activation: d.activation,
    };
    let out = dev.depthwise_conv2d(&input, &weight, bias.as_ref(), &opts).unwrap();
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

fn run_activation_case(
    dev: &Device,
    dtype: DType,
    len: usize,
    bias_len: Option<usize>,
    act: Activation,
    in_place: bool,
) {
    let last = bias_len.unwrap_or(len);
    let shape = [len / last, last];
    let xv: Vec<f32> = values(len, len as u64 + 9).iter().map(|v| v * 6.0).collect();
    let x = dev.tensor_from_f32(&shape, dtype, &xv).unwrap();
    let bias = bias_len.map(|bl| upload(dev, dtype, &values(bl, 77)));
    let xw = widen(&x);
    let out = if in_place {
        dev.activation_in_place(&x, bias.as_ref(), act).unwrap();
        x.clone()
    } else {
        dev.activation(&x, bias.as_ref(), act).unwrap()
    };
    let got = out.to_f32_vec().unwrap();
    let desc = ActivationDesc { len, bias_len, activation: act };
    let bw = bias.as_ref().map(widen);
    let mut want = vec![0.0; len];
    reference::activation(&desc, &xw, bw.as_deref(), &mut want);
    let mag: Vec<f64> = want.iter().map(|w| w.abs() + 8.0).collect();
    assert_close(&format!("activation {dtype} {act} len {len} in place {in_place}"), dtype, &got, &want, &mag, 1);
}

#[test]
fn activation_all_functions_bias_and_in_place() {
    for (dev, dtype) in variants() {
        for act in Activation::ALL {
            for (len, bias_len) in [(1, None), (3, Some(3)), (4, Some(4)), (7, None), (30, Some(5)), (1000, Some(8))] {
                run_activation_case(dev, dtype, len, bias_len, act, false);
            }
            run_activation_case(dev, dtype, 35, Some(7), act, true);
            run_activation_case(dev, dtype, 36, Some(4), act, true);
        }
    }
}

/// Every f16 and bf16 bit pattern through device unpack/pack: `activation(None)` is an exact
/// copy on the packed paths (NaNs keep their bits too); the native f16 path keeps every value
/// and every NaN a NaN.
#[test]
fn every_half_bit_pattern_round_trips() {
    for (dev, dtype) in variants() {
        if dtype == DType::F32 {
            continue;
        }
        let native = dtype == DType::F16 && backend(dev).native_f16;
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let x = match dtype {
            DType::F16 => dev.tensor(&[bits.len()], &bits.iter().map(|&b| half::f16::from_bits(b)).collect::<Vec<_>>()),
            _ => dev.tensor(&[bits.len()], &bits.iter().map(|&b| half::bf16::from_bits(b)).collect::<Vec<_>>()),
        }
        .unwrap();
        let out = dev.activation(&x, None, Activation::None).unwrap();
        let got: Vec<u16> = bytemuck::cast_slice::<u8, u16>(&out.to_bytes().unwrap()).to_vec();
        for (&want, &g) in bits.iter().zip(&got) {
            let nan = if dtype == DType::F16 {
                half::f16::from_bits(want).is_nan()
            } else {
                half::bf16::from_bits(want).is_nan()
            };
            if native && nan {
                assert!(half::f16::from_bits(g).is_nan(), "{dtype}: {want:#06x} came back as {g:#06x}");
            } else {
                assert_eq!(g, want, "{dtype} (native {native}): {want:#06x} came back as {g:#06x}");
            }
        }
    }
}

#[test]
fn rounding_on_store_is_nearest_even() {
    for (dev, dtype) in variants() {
        if dtype == DType::F32 {
            continue;
        }
        // x + bias is exact in f32 and lands between two neighbours of the storage type:
        // ties (to even, both directions), above ties, negative, overflow and subnormals.
        let e = dtype.unit_roundoff() as f32;
        let pairs: Vec<(f32, f32)> = vec![
            (1.0, e),
            (1.0 + 2.0 * e, e),
            (1.0, e * (1.0 + 1.0 / 16.0)),
            (-1.0, -e * (1.0 + 1.0 / 16.0)),
            (1.0, e * (1.0 - 1.0 / 16.0)),
            (65504.0, 16.0),
            (65504.0, 8.0),
            (65504.0, 15.0),
            (3.0e38, 3.0e38),
            (2f32.powi(-14), -2f32.powi(-24) * 3.0),
            (2f32.powi(-24), 2f32.powi(-26)),
            (f32::INFINITY, 1.0),
            (f32::NAN, 0.0),
        ];
        let xs: Vec<f32> = pairs.iter().map(|p| p.0).collect();
        let bs: Vec<f32> = pairs.iter().map(|p| p.1).collect();
        let x = dev.tensor_from_f32(&[1, xs.len()], dtype, &xs).unwrap();
        let bias = dev.tensor_from_f32(&[bs.len()], dtype, &bs).unwrap();
        let out = dev.activation(&x, Some(&bias), Activation::None).unwrap();
        let (xr, br) = (x.to_f32_vec().unwrap(), bias.to_f32_vec().unwrap());
        let got = out.to_f32_vec().unwrap();
        for i in 0..xs.len() {
            let w = dtype.round_f32(xr[i] + br[i]);
            let g = got[i];
            assert!(g == w || (g.is_nan() && w.is_nan()), "{dtype}: {} + {} -> {g}, want {w}", xr[i], br[i]);
        }
    }
}

#[test]
fn copy_moves_raw_words_and_respects_odd_lengths() {
    for (dev, dtype) in variants() {
        for len in [1usize, 2, 5, 8, 9, 17, 1001] {
            let src = upload(dev, dtype, &values(len, len as u64));
            let dst = upload(dev, dtype, &vec![3.0; len + 1]);
            let src_view = src.clone();
            // Device::copy copies src.len() elements into the first elements of dst.
            let dst_view = dst.clone();
            backend(dev)
                .copy(
                    dtype,
                    WgpuBackend::storage_of(&src_view.buffer.storage).unwrap(),
                    WgpuBackend::storage_of(&dst_view.buffer.storage).unwrap(),
                    len,
                )
                .unwrap();
            let got = dst.to_f32_vec().unwrap();
            assert_eq!(&got[..len], &src.to_f32_vec().unwrap()[..], "{dtype} len {len}");
            assert_eq!(got[len], 3.0, "{dtype} len {len}: the element after the copy changed");
        }
    }
}

#[test]
fn naive_matmul_matches_the_reference() {
    let Some(dev) = device(false) else { return };
    for (m, n, k) in [(1, 1, 1), (17, 5, 9), (3, 33, 0)] {
        let a = dev.tensor_from_f32(&[m, k], DType::F32, &values(m * k, 1)).unwrap();
        let b = dev.tensor_from_f32(&[k, n], DType::F32, &values(k * n, 2)).unwrap();
        let out = dev.naive_matmul(&a, &b).unwrap().unwrap();
        let mut want = vec![0.0; m * n];
        reference::matmul(&MatmulDesc::new(m, n, k), &widen(&a), &widen(&b), None, None, &mut want);
        let mag = vec![k as f64; m * n];
        assert_close("naive matmul", DType::F32, &out.to_f32_vec().unwrap(), &want, &mag, k);
    }
}

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
            if storage.needs_f16() && !be.device.features().contains(wgpu::Features::SHADER_F16) {
                continue;
            }
            // The other specs (tiles, small-M rows) are built by the matmul tests.
            be.pipeline("test", kernel, storage, Spec::DEFAULT).unwrap();
        }
    }
}

fn own_device(what: &str) -> Option<Device> {
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
fn split_convs(dev: &Device) {
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
    let opts = crate::Conv2dOptions { layout: Layout::Nhwc, ..Default::default() };
    let err = dev.depthwise_conv2d(&x, &w, None, &opts).unwrap_err();
    assert!(matches!(&err, Error::Overflow { what, .. } if what.contains("output row")), "{err:?}");
}

/// Matmuls over a 1 KiB binding limit (`dev`), split into blocks of batches, rows and
/// columns with windows at aligned offsets, in every dtype, against the reference: batches
/// with broadcast B, strided views with odd offsets, bias and C, both transposes, K = 0.
fn split_matmuls(dev: &Device) {
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
            d.c = Some(MatrixView { offset: 1, ld: d.n + 1, batch_stride: d.m * (d.n + 1) });
            d.out = MatrixView { offset: 5, ld: d.n + 2, batch_stride: d.m * (d.n + 2) + 3 };
            d.alpha = 0.5;
            d.beta = -1.25;
            d.activation = Activation::Gelu;
            run_matmul_case(dev, dtype, &case, seed);
            seed += 1;
        }
        // B broadcast to every batch, M = 2 (the small-M kernel), an offset A.
        let mut case = dense_case(5, 2, 70, 9, false, true);
        case.desc.b.batch_stride = 0;
        case.desc.a = MatrixView { offset: 7, ld: 11, batch_stride: 23 };
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
fn narrow_grid_device() -> Option<Device> {
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
    // column windows. M = 300 with the 16 x 128 tile needs 19 row blocks: three launches.
    let n = (cat::SMALL_M_WG * cat::SMALL_M_COLS) as usize * 8 + 1;
    run_matmul_case(&dev, DType::F32, &dense_case(1, 1, n, 3, false, false), 904);
    run_matmul_case(&dev, DType::F16, &dense_case(2, 300, 5, 3, false, true), 905);
    // 64 * 4 * 8 * 8 + 1 elements need 65 workgroups: more than an 8 x 8 grid.
    let x = dev.zeros(&[64 * 4 * 64 + 1], DType::F32).unwrap();
    let err = dev.activation(&x, None, Activation::Relu).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err:?}");
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

/// Integer inputs in a small range make every partial sum exact in f32 and the results exact
/// in every storage type, so any correct kernel matches the reference bit for bit (the CUTLASS
/// unit-test trick): tiled, small-M and both transposes, with bias, C and relu.
#[test]
fn integer_inputs_match_bit_for_bit() {
    let ints = |n: usize, seed: u64| -> Vec<f32> { values(n, seed).iter().map(|v| (v * 2.5).round()).collect() };
    for (dev, dtype) in variants() {
        for (i, &(m, n, k, ta, tb)) in
            [(3, 9, 16, false, false), (20, 7, 13, true, false), (33, 70, 16, false, true), (2, 5, 11, true, true)]
                .iter()
                .enumerate()
        {
            let mut d = dense_case(2, m, n, k, ta, tb).desc;
            d.c = Some(MatrixView::dense(m, n));
            d.bias_offset = Some(0);
            d.activation = Activation::Relu;
            let (ar, ac) = d.a_stored();
            let (br, bc) = d.b_stored();
            let seed = 2000 + i as u64;
            let a = dev.tensor_from_f32(&[2 * ar * ac], dtype, &ints(2 * ar * ac, seed)).unwrap();
            let b = dev.tensor_from_f32(&[2 * br * bc], dtype, &ints(2 * br * bc, seed + 1)).unwrap();
            let bias = dev.tensor_from_f32(&[n], dtype, &ints(n, seed + 2)).unwrap();
            let c = dev.tensor_from_f32(&[2 * m * n], dtype, &ints(2 * m * n, seed + 3)).unwrap();
            let out = dev.zeros(&[2 * m * n], dtype).unwrap();
            dev.matmul_into(&d, &a, &b, Some(&bias), Some(&c), &out).unwrap();
            let mut want = vec![0.0; 2 * m * n];
            reference::matmul(&d, &widen(&a), &widen(&b), Some(&widen(&bias)), Some(&widen(&c)), &mut want);
            let got = widen(&out);
            assert_eq!(got, want, "{dtype} m{m} n{n} k{k} ta{ta} tb{tb}");
        }
    }
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
