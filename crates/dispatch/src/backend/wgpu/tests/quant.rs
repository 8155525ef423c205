//! The quantized matmul kernels (`qmatmul.wgsl`) on both reductions: the shared device reduces
//! the decode kernel with subgroup operations where the adapter has `SUBGROUP` (lavapipe does),
//! the packed-f16 device is made with `no_subgroups`. Integer weights and activations make
//! every product and sum exact, so each format must match the reference bit for bit (after
//! the one rounding of the store to the output dtype); guard values around the output view
//! must survive. M = 16 and 17 straddle the switch between the decode and the tiled kernel.

use super::*;
use crate::backend::QuantView;
use crate::ops::storage;
use tilekit_kernels::quant::{GgmlType, dequantize};

/// Random GGUF bytes of `ty` for `[n, k]` whose weights are small integers: power-of-two f16
/// scales (1 or 0.5 where the quants are even), so every dequantized weight, every product with
/// an integer activation and every partial sum is exact in f32.
fn integer_weights(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let bytes = ty.tensor_bytes(&[n, k]).unwrap();
    let noise: Vec<u8> = values(bytes, seed).iter().map(|v| ((v + 1.0) * 128.0) as u8).collect();
    let mut out = noise.clone();
    let one = half::f16::from_f32(1.0).to_le_bytes();
    let half_ = half::f16::from_f32(0.5).to_le_bytes();
    let minus3 = half::f16::from_f32(-3.0).to_le_bytes();
    for (blk, r) in out.chunks_exact_mut(ty.block_bytes()).zip(noise.chunks_exact(ty.block_bytes())) {
        match ty {
            GgmlType::Q8_0 => {
                blk[0..2].copy_from_slice(&half_);
                // Even quants in [-40, 40]: halved, still integers.
                for (q, &x) in blk[2..].iter_mut().zip(&r[2..]) {
                    *q = ((i32::from(x % 41) - 20) * 2) as i8 as u8;
                }
            }
            GgmlType::Q4_0 => blk[0..2].copy_from_slice(&one),
            GgmlType::Q4_1 => {
                blk[0..2].copy_from_slice(&one);
                blk[2..4].copy_from_slice(&minus3);
            }
            GgmlType::Q4K => {
                blk[0..2].copy_from_slice(&one);
                blk[2..4].copy_from_slice(&one);
            }
            GgmlType::Q6K => blk[208..210].copy_from_slice(&one),
            _ => unreachable!("a quantized type"),
        }
    }
    out
}

fn ints(n: usize, seed: u64) -> Vec<f32> {
    values(n, seed).iter().map(|v| (v * 3.5).round()).collect()
}

/// `x` rounded to `dtype` (round to nearest even), as the kernels' stores round.
fn round_to(dtype: DType, x: f64) -> f32 {
    let x = x as f32;
    match dtype {
        DType::F32 => x,
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::Bf16 => half::bf16::from_f32(x).to_f32(),
        other => unimplemented!("{other:?}"),
    }
}

/// The kernel a profile of the device saw for the matmul_quant of shape `m, n, k`.
fn st(t: &Tensor) -> &WgpuStorage {
    storage::<WgpuBackend>("test", "t", t).unwrap()
}

/// The kernel a profile sees for `matmul_quant` of an `[m, k]` A with `q` (the backend call of
/// the exact cases bypasses the op layer, which makes the profile records).
fn profiled_kernel(dev: &Device, q: &crate::QTensor, m: usize) -> String {
    let [n, k] = q.shape;
    let a = dev.zeros(&[m, k], DType::F32).unwrap();
    let o = trans_b();
    dev.profile_begin().unwrap();
    dev.matmul_quant(&a, q, &o).unwrap();
    let p = dev.profile_end().unwrap();
    // This op's record (the caller's device is its own: no other test's launches land here).
    let shape = format!("m{m} n{n} k{k}");
    p.records
        .iter()
        .find(|r| r.op == "matmul_quant" && r.shape.contains(&shape))
        .map(|r| r.kernel.clone())
        .unwrap_or_default()
}

/// Options with `trans_b` (built field by field: the options struct is `#[non_exhaustive]` to
/// users).
#[allow(clippy::field_reassign_with_default)]
fn trans_b() -> crate::MatmulOptions<'static> {
    let mut o = crate::MatmulOptions::default();
    o.trans_b = true;
    o
}

const GUARD: f32 = -777.0;

/// One exact case: `out = act(op(A) · Wᵀ + bias + C)` written into a strided view of a buffer
/// filled with guard values; the outputs must equal the reference rounded once to `dtype`, the
/// guards must be untouched; returns the kernel that ran.
#[allow(clippy::too_many_arguments)]
fn exact_case(
    dev: &Device,
    ty: GgmlType,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    seed: u64,
) -> String {
    let wbytes = integer_weights(ty, n, k, seed);
    let w = dequantize(ty, &wbytes, &[n, k]).unwrap();
    let q = dev.quant_tensor(ty, &[n, k], &wbytes).unwrap();
    let mut desc = MatmulDesc::new(m, n, k);
    desc.trans_a = trans_a;
    desc.trans_b = true;
    let (ar, ac) = desc.a_stored();
    // A one element in, so its rows are not 16-byte aligned (the scalar load path).
    desc.a = MatrixView::new(1, ac, 0);
    desc.b = MatrixView::new(0, k, 0);
    desc.out = MatrixView::new(3, n + 2, 0);
    desc.c = Some(MatrixView::dense(m, n));
    desc.bias_offset = Some(0);
    desc.beta = 1.0;
    desc.activation = Activation::Relu;
    let mut a = vec![0.0];
    a.extend(ints(ar * ac, seed + 1));
    let bias = ints(n, seed + 2);
    let c = ints(m * n, seed + 3);
    let out_len = 3 + m * (n + 2) + 5;
    let at = upload(dev, dtype, &a);
    let bt = upload(dev, dtype, &bias);
    let ct = upload(dev, dtype, &c);
    let ot = upload(dev, dtype, &vec![GUARD; out_len]);
    let be = backend(dev);
    let view = QuantView { ty, n, k, scales: st(&q.scales), body: st(&q.body) };
    be.matmul_quant(&desc, dtype, st(&at), &view, Some(st(&bt)), Some(st(&ct)), st(&ot)).unwrap();
    let kernel = profiled_kernel(dev, &q, m);
    let widen64 = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    // The reference on what the device holds (A, bias and C rounded to dtype on upload).
    let mut want = vec![f64::from(GUARD); out_len];
    reference::matmul(&desc, &widen(&at), &widen64(&w), Some(&widen(&bt)), Some(&widen(&ct)), &mut want);
    let got = ot.to_f32_vec().unwrap();
    for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
        let r = round_to(dtype, r);
        assert_eq!(
            g.to_bits(),
            r.to_bits(),
            "{kernel} {ty} {dtype} m{m} n{n} k{k} ta{trans_a}: element {i}: got {g}, want {r}"
        );
    }
    kernel
}

/// Both reductions, every format, M = 1, 16 (decode) and 17 (tiled), N prime, integer data:
/// bit-exact; the kernel switch at 16 | 17 and the reduction of each device are checked in
/// the profile, on a device of the test's own with the options of `device(packed)`: a profile
/// records every launch on its device, and on the shared one another test's tiled Q4_K
/// launch was once taken for this test's Q8_0 decode kernel.
#[test]
fn quantized_kernels_are_exact_on_integer_data_both_reductions() {
    for packed in [false, true] {
        let Some(own) = super::gemv::own_reduction_device(packed) else { return };
        let dev = &own;
        let sg = backend(dev).subgroups;
        if !packed && !sg {
            eprintln!("SKIP qgemv subgroup path: the adapter has no SUBGROUP");
        }
        for (f, ty) in GgmlType::QUANTIZED.into_iter().enumerate() {
            let k = if ty.block_size() > 32 { 256 } else { 64 };
            for m in [1, 16, 17] {
                let dtypes: &[DType] = if packed { &[DType::F16] } else { &[DType::F32, DType::Bf16] };
                for &dtype in dtypes {
                    let seed = 9000 + (f * 10 + m) as u64;
                    let kernel = exact_case(dev, ty, dtype, m, 37, k, m == 17, seed);
                    let want = match (m <= 16, sg) {
                        (true, true) => "qgemv_subgroup_",
                        (true, false) => "qgemv_",
                        (false, _) => "qmatmul_",
                    };
                    assert!(kernel.starts_with(want), "{ty} m{m}: {kernel}");
                    if m <= 16 && !sg {
                        assert!(!kernel.contains("subgroup"), "{kernel}");
                    }
                }
            }
        }
    }
}

/// `matmul_quant` of a `[batch, m, k]` A in `dtype` with an integer-valued weight, within the
/// f32-accumulation bound of the reference.
#[allow(clippy::too_many_arguments)]
fn check_close(dev: &Device, ty: GgmlType, dtype: DType, batch: usize, m: usize, n: usize, k: usize, seed: u64) {
    let wbytes = integer_weights(ty, n, k, seed);
    let w: Vec<f64> = dequantize(ty, &wbytes, &[n, k]).unwrap().into_iter().map(f64::from).collect();
    let q = dev.quant_tensor(ty, &[n, k], &wbytes).unwrap();
    let at = dev.tensor_from_f32(&[batch, m, k], dtype, &values(batch * m * k, seed + 1)).unwrap();
    let o = trans_b();
    let out = dev.matmul_quant(&at, &q, &o).unwrap();
    let mut desc = MatmulDesc::new(m, n, k);
    desc.batch = batch;
    desc.trans_b = true;
    desc.a.batch_stride = m * k;
    desc.b = MatrixView::new(0, k, 0);
    desc.out.batch_stride = m * n;
    let a64 = widen(&at);
    let mut want = vec![0.0; batch * m * n];
    reference::matmul(&desc, &a64, &w, None, None, &mut want);
    let mut mag = vec![0.0; batch * m * n];
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    reference::matmul(&desc, &abs(&a64), &abs(&w), None, None, &mut mag);
    let got = out.to_f32_vec().unwrap();
    assert_close(&format!("{ty} {dtype} {batch}x{m}x{n}x{k}"), dtype, &got, &want, &mag, k);
}

/// A longer K (several passes of the decode workgroup over the units, several slabs of the
/// tiled kernel), M and N over one tiled block, a batch of two: within the f32-accumulation
/// bound of the reference, on both reductions.
#[test]
fn quantized_kernels_long_k_and_batches() {
    for packed in [false, true] {
        let Some(dev) = device(packed) else { return };
        check_close(dev, GgmlType::Q4_0, DType::F32, 2, 3, 67, 32 * 130, 9500);
        check_close(dev, GgmlType::Q6K, DType::F32, 2, 2, 5, 256 * 9, 9501);
        check_close(dev, GgmlType::Q4K, DType::F32, 2, 70, 66, 512, 9502);
    }
}

/// An engine's device with a 2304-byte storage-binding limit: a weight whose planes are over it
/// runs as blocks of rows bound as windows (decode and tiled kernels, planes starting mid-word
/// and mid-window); A or an output over it is refused with a typed error.
#[test]
fn a_weight_over_the_binding_limit_runs_in_blocks() {
    let Some(adapter) = crate::backend::wgpu::adapter::enumerate().ok().and_then(|a| a.into_iter().next()) else {
        eprintln!("SKIP quantized binding-limit test: no adapter");
        return;
    };
    let limits = wgpu::Limits { max_storage_buffer_binding_size: 2304, ..adapter.limits() };
    let desc = wgpu::DeviceDescriptor { label: Some("engine"), required_limits: limits, ..Default::default() };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    let dev = Device::from_wgpu(device, queue).unwrap();
    if backend(&dev).limits.max_storage_buffer_binding_size > 2304 {
        eprintln!("SKIP quantized binding-limit checks: the device did not take the lower limit");
        return;
    }
    // Body planes of 2368, 3840, 2704 and 2800 bytes.
    check_close(&dev, GgmlType::Q8_0, DType::F32, 1, 2, 37, 64, 9600);
    check_close(&dev, GgmlType::Q8_0, DType::Bf16, 1, 17, 60, 64, 9601);
    check_close(&dev, GgmlType::Q6K, DType::F32, 1, 1, 13, 256, 9602);
    check_close(&dev, GgmlType::Q4K, DType::F32, 1, 2, 20, 256, 9603);
    let ty = GgmlType::Q4_0;
    let q = dev.quant_tensor(ty, &[4, 32 * 20], &integer_weights(ty, 4, 32 * 20, 1)).unwrap();
    let a = dev.zeros(&[1, 32 * 20], DType::F32).unwrap();
    let o = trans_b();
    assert!(matches!(dev.matmul_quant(&a, &q, &o), Err(Error::Overflow { .. })));
}
