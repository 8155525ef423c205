//! Quantized matmul (`Device::matmul_quant`) on every backend present, against the `f64`
//! reference on the dequantized weights (`tilekit::quant::dequantize`) under the tolerance
//! rule of `tilekit_kernels::tolerance`: the weights are exact f32 values once dequantized, so
//! the bound is the dense matmul's with `B = dequantize(W)`.
//!
//! Every format (Q8_0, Q4_0, Q4_1 quantized from random values by the reference quantizer;
//! Q4_K and Q6_K as random blocks with moderate f16 scales), A in f32, f16 and bf16, M from 1
//! to 70 (both the decode and the tiled paths), K a multiple of the block size, N anything,
//! with and without trans_a, batches, bias, C and every activation. A backend without
//! quantized kernels prints a visible skip line (not the wgpu backend, which has them: there an
//! `UnsupportedQuantType` fails the test). Each wgpu case costs a pipeline or two on lavapipe
//! (~0.5 s): 32 random cases and 30 fixed ones keep the file near a minute there. The wgpu
//! backend's own tests (`crates/dispatch/src/backend/wgpu/tests/quant.rs`) add exact integer
//! cases per format on both reductions, guard values and weights over the binding limit.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::quant::{GgmlType, dequantize, quantize};
use tilekit::{Activation, DType, Device, Error, MatmulDesc, MatmulOptions, MatrixView, Precision};
use tilekit_kernels::reference;
use tilekit_tests::{Rng, backends_for, round_to, skip, tolerance};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() }
}

/// Random GGUF bytes of `ty` for a `[n, k]` weight: quantized random values for the types
/// tilekit quantizes, random blocks with f16 scales in `[2⁻¹⁰, 2⁻⁴)` for the k-quants.
fn weight_bytes(rng: &mut Rng, ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    if matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1) {
        let v: Vec<f32> = (0..n * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
        return quantize(ty, &v, &[n, k]).expect("finite values quantize");
    }
    let bytes = ty.tensor_bytes(&[n, k]).expect("a block multiple");
    let mut out: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    let scale = |rng: &mut Rng| half::f16::from_f32(rng.uniform(1.0, 64.0) / 1024.0).to_le_bytes();
    for blk in out.chunks_exact_mut(ty.block_bytes()) {
        match ty {
            GgmlType::Q4K => {
                blk[0..2].copy_from_slice(&scale(rng));
                blk[2..4].copy_from_slice(&scale(rng));
            }
            _ => blk[208..210].copy_from_slice(&scale(rng)),
        }
    }
    out
}

#[derive(Debug, Clone)]
struct Case {
    ty: GgmlType,
    dtype: DType,
    batch: Option<usize>,
    m: usize,
    n: usize,
    blocks: usize,
    trans_a: bool,
    bias: bool,
    c: bool,
    activation: Activation,
    alpha: f32,
    beta: f32,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let ty = prop::sample::select(GgmlType::QUANTIZED.to_vec());
    let dtype = prop::sample::select(DType::ALL.to_vec());
    let act = prop::sample::select(Activation::ALL.to_vec());
    let m = prop_oneof![3 => 1usize..=16, 2 => 17usize..=70];
    (
        (ty, dtype, prop::option::weighted(0.2, 1usize..=3), m, 1usize..=45, 1usize..=4),
        (any::<bool>(), any::<bool>(), any::<bool>(), act, prop::sample::select(vec![1.0f32, 0.5, -1.25])),
        (prop::sample::select(vec![1.0f32, 0.0, -0.75]), any::<u64>()),
    )
        .prop_map(|((ty, dtype, batch, m, n, blocks), (trans_a, bias, c, activation, alpha), (beta, seed))| {
            // The k-quants' blocks are 256 long: one or two of them keep lavapipe fast.
            let blocks = if ty.block_size() > 32 { blocks.div_ceil(2) } else { blocks * 2 - 1 };
            Case { ty, dtype, batch, m, n, blocks, trans_a, bias, c, activation, alpha, beta, seed }
        })
}

/// Runs one case on every backend present; returns how many ran it.
fn run_case(cs: &Case) -> Result<usize, String> {
    let mut rng = Rng::new(cs.seed);
    let (m, n, dtype) = (cs.m, cs.n, cs.dtype);
    let k = cs.blocks * cs.ty.block_size();
    let batch = cs.batch.unwrap_or(1);
    let wbytes = weight_bytes(&mut rng, cs.ty, n, k);
    let w = dequantize(cs.ty, &wbytes, &[n, k]).map_err(|e| e.to_string())?;
    let a_shape = match (cs.batch, cs.trans_a) {
        (None, false) => vec![m, k],
        (None, true) => vec![k, m],
        (Some(b), false) => vec![b, m, k],
        (Some(b), true) => vec![b, k, m],
    };
    let fill =
        |rng: &mut Rng, len: usize| round_to(dtype, &(0..len).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>());
    let a = fill(&mut rng, batch * m * k);
    let bias = cs.bias.then(|| fill(&mut rng, n));
    let c = cs.c.then(|| fill(&mut rng, batch * m * n));
    let out_shape = if cs.batch.is_some() { vec![batch, m, n] } else { vec![m, n] };
    let (ar, ac) = if cs.trans_a { (k, m) } else { (m, k) };
    let dense = |r: usize, cc: usize| MatrixView::new(0, cc, if cs.batch.is_some_and(|b| b > 1) { r * cc } else { 0 });
    let desc = MatmulDesc::new(m, n, k)
        .batch(batch)
        .trans_a(cs.trans_a)
        .trans_b(true)
        .a(dense(ar, ac))
        .b(MatrixView::new(0, k, 0))
        .c(cs.c.then(|| dense(m, n)))
        .bias_offset(cs.bias.then_some(0))
        .out(MatrixView::new(0, n, m * n))
        .alpha(cs.alpha)
        .beta(cs.beta)
        .activation(Activation::None)
        .precision(Precision::Highest);
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let abs = |v: &[f32]| v.iter().map(|&x| f64::from(x).abs()).collect::<Vec<_>>();
    let mut pre = vec![0.0; batch * m * n];
    let (bias64, c64) = (bias.as_deref().map(wide), c.as_deref().map(wide));
    reference::matmul(&desc, &wide(&a), &wide(&w), bias64.as_deref(), c64.as_deref(), &mut pre);
    let mut mag = vec![0.0; batch * m * n];
    let mut abs_desc = desc;
    abs_desc.alpha = desc.alpha.abs();
    abs_desc.beta = desc.beta.abs();
    let (bias_a, c_a) = (bias.as_deref().map(abs), c.as_deref().map(abs));
    reference::matmul(&abs_desc, &abs(&a), &abs(&w), bias_a.as_deref(), c_a.as_deref(), &mut mag);

    let mut ran = 0;
    for be in backends_for(dtype) {
        let dev: &Device = &be.device;
        let what = format!("{} {dtype} {} matmul_quant {cs:?}", be.label, cs.ty);
        let err = |e: Error| format!("{what}: {e}");
        let qw = dev.quant_tensor(cs.ty, &[n, k], &wbytes).map_err(err)?;
        let at = dev.tensor_from_f32(&a_shape, dtype, &a).map_err(err)?;
        let bt = bias.as_deref().map(|v| dev.tensor_from_f32(&[n], dtype, v)).transpose().map_err(err)?;
        let ct = c.as_deref().map(|v| dev.tensor_from_f32(&out_shape, dtype, v)).transpose().map_err(err)?;
        let opts = MatmulOptions::default()
            .trans_a(cs.trans_a)
            .trans_b(true)
            .alpha(cs.alpha)
            .beta(cs.beta)
            .bias(bt.as_ref())
            .c(ct.as_ref())
            .activation(cs.activation)
            .precision(Precision::Highest);
        let out = match dev.matmul_quant(&at, &qw, &opts) {
            // The wgpu backend has quantized kernels for every format: no skip there.
            Err(e @ Error::UnsupportedQuantType { .. }) if !be.label.starts_with("wgpu") => {
                skip(&format!("{} matmul_quant {}", be.label, cs.ty), &e.to_string());
                continue;
            }
            r => r.map_err(err)?,
        };
        if out.shape() != out_shape {
            return Err(format!("{what}: output shape {:?}", out.shape()));
        }
        let got = out.to_f32_vec().map_err(err)?;
        for (i, &g) in got.iter().enumerate() {
            let r = cs.activation.apply_f64(pre[i]);
            let bound = tolerance::bound(dtype, cs.activation, k, mag[i], pre[i], r);
            if !tolerance::accepts(dtype, g, r, bound) {
                return Err(format!("{what}: element {i}: got {g:e}, reference {r:e}, bound {bound:e}"));
            }
        }
        ran += 1;
    }
    Ok(ran)
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn matmul_quant_matches_the_reference_on_dequantized_weights(cs in case()) {
        run_case(&cs).map_err(TestCaseError::fail)?;
    }
}

/// Every format and dtype on the decode (M = 1 or 16) and the tiled (M = 17 or 70) path, with
/// a prime N and the full epilogue, whatever the random cases drew; the four row counts
/// alternate over the (format, dtype) pairs.
#[test]
fn every_format_and_dtype_on_both_paths() {
    let mut seed = 1;
    for (f, ty) in GgmlType::QUANTIZED.into_iter().enumerate() {
        for (d, dtype) in [DType::F32, DType::F16, DType::Bf16].into_iter().enumerate() {
            let rows = if (f + d) % 2 == 0 { [1, 17] } else { [16, 70] };
            for m in rows {
                seed += 1;
                let cs = Case {
                    ty,
                    dtype,
                    batch: None,
                    m,
                    n: 37,
                    blocks: if ty.block_size() > 32 { 2 } else { 9 },
                    trans_a: m == 17,
                    bias: true,
                    c: true,
                    activation: Activation::Gelu,
                    alpha: 0.5,
                    beta: -0.75,
                    seed,
                };
                run_case(&cs).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// Bad calls are typed errors on every backend.
#[test]
fn bad_quantized_calls_are_typed_errors() {
    for be in tilekit_tests::backends() {
        let dev = &be.device;
        let ty = GgmlType::Q8_0;
        let bytes = quantize(ty, &[0.5; 3 * 64], &[3, 64]).expect("quantizes");
        let w = dev.quant_tensor(ty, &[3, 64], &bytes).expect("uploads");
        let a = dev.tensor_from_f32(&[2, 64], DType::F32, &[1.0; 128]).expect("uploads");
        let t = MatmulOptions::default().trans_b(true);
        assert!(matches!(
            dev.matmul_quant(&a, &w, &MatmulOptions::default()),
            Err(Error::InvalidParameter { param: "trans_b", .. })
        ));
        let short = dev.tensor_from_f32(&[2, 32], DType::F32, &[1.0; 64]).expect("uploads");
        assert!(matches!(dev.matmul_quant(&short, &w, &t), Err(Error::ShapeMismatch { tensor: "w", .. })));
        let bias = dev.tensor_from_f32(&[4], DType::F32, &[0.0; 4]).expect("uploads");
        let with_bias = t.bias(Some(&bias));
        assert!(matches!(dev.matmul_quant(&a, &w, &with_bias), Err(Error::ShapeMismatch { tensor: "bias", .. })));
        let bf = t.precision(Precision::Bf16);
        assert!(matches!(dev.matmul_quant(&a, &w, &bf), Err(Error::InvalidParameter { param: "precision", .. })));
        // K not a block multiple, a byte count that does not match the shape.
        assert!(matches!(dev.quant_tensor(ty, &[3, 48], &bytes[..102]), Err(Error::Quant(_))));
        assert!(matches!(dev.quant_tensor(ty, &[3, 64], &bytes[..200]), Err(Error::Quant(_))));
        assert!(matches!(dev.quant_tensor(ty, &[2, 3, 64], &bytes), Err(Error::WrongRank { .. })));
        // A weight from another device.
        let other = Device::cpu();
        let w2 = other.quant_tensor(ty, &[3, 64], &bytes).expect("uploads");
        assert!(matches!(dev.matmul_quant(&a, &w2, &t), Err(Error::DeviceMismatch { .. })));
    }
}
