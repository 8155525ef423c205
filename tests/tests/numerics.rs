//! Numerics on every backend: GELU accuracy, tanh-GELU without NaN, f16 overflow to ±Inf, and
//! round trips of every f16 and bf16 bit pattern.

use half::{bf16, f16};
use tilekit::{Activation, Conv2dOptions, DType, Device, MatmulDesc, MatmulOptions, Tensor};
use tilekit_tests::{ActMode, Data, backends_for, run_activation, run_matmul};

fn ok<T>(what: &str, r: tilekit::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Both GELU forms and SiLU over [−20, 20] (step 1/64, plus the endpoints' neighbours) in f32
/// on every backend, against the f64 reference with the documented promise
/// (`Activation::error_bound`: `gelu_error_bound`, `silu_error_bound`).
#[test]
fn gelu_accuracy_over_minus_20_to_20() {
    let mut xs: Vec<f32> = (-1280..=1280).map(|i| i as f32 / 64.0).collect();
    xs.extend([-19.999_998, 19.999_998, -1e-7, 1e-7, -0.1, 0.1, -5.5, -13.1]);
    for be in backends_for(DType::F32) {
        let dev = &be.device;
        let x = ok("upload", dev.tensor(&[xs.len()], &xs));
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
            let y = ok("activation", dev.activation(&x, None, act));
            let got = ok("download", y.to_vec::<f32>());
            let mut worst = (0.0f64, 0.0f32);
            for (&xi, &g) in xs.iter().zip(&got) {
                let r = act.apply_f64(xi as f64);
                let bound = act.error_bound(xi as f64, r);
                let err = (g as f64 - r).abs();
                assert!(
                    err <= bound,
                    "{} {act}({xi}): got {g:e}, expected {r:e}, error {err:e} over the bound {bound:e}",
                    be.label
                );
                if bound > 0.0 && err / bound > worst.0 {
                    worst = (err / bound, xi);
                }
            }
            eprintln!("{} {act}: worst error {:.3} of the bound, at x = {}", be.label, worst.0, worst.1);
        }
    }
}

/// tanh-GELU never gives NaN: x = −13.1, −20, −1e4 (where a naive tanh overflows in f32) in every
/// dtype, and |x| ≈ 5.7 in f16 (where a naive f16 tanh argument overflows), within the tolerance
/// model, through the activation op and the matmul epilogue.
#[test]
fn gelu_tanh_gives_no_nan() {
    let mut xs = vec![-13.1f32, -20.0, -1e4, 1e4, -88.0, -89.0, 13.1, 20.0, -65504.0, 65504.0, 0.0, -0.0];
    xs.extend((0..=64).map(|i| 5.5 + i as f32 / 128.0));
    xs.extend((0..=64).map(|i| -5.5 - i as f32 / 128.0));
    for dtype in DType::ALL {
        for act in [Activation::GeluTanh, Activation::Gelu] {
            let r = run_activation(&[xs.len()], false, act, ActMode::New, dtype, Data::Uniform, 0, Some(&xs));
            r.unwrap_or_else(|e| panic!("{e}"));
        }
        // The matmul epilogue: a 1×1 product per x (x · 1) with a tanh-GELU.
        for be in backends_for(dtype) {
            let dev = &be.device;
            let a = ok("a", dev.tensor_from_f32(&[xs.len(), 1], dtype, &xs));
            let b = ok("b", dev.tensor_from_f32(&[1, 1], dtype, &[1.0]));
            let opts = MatmulOptions::default().activation(Activation::GeluTanh);
            let y = ok("matmul", dev.matmul(&a, &b, &opts));
            for (x, g) in xs.iter().zip(ok("download", y.to_f32_vec())) {
                assert!(!g.is_nan(), "{} {dtype} matmul epilogue gelu-tanh({x}) is NaN", be.label);
            }
        }
    }
}

fn f16_values(t: &Tensor) -> Vec<f32> {
    ok("download", t.to_f32_vec())
}

/// f16 results above 65504 become ±Inf (IEEE rounding: 65520 and above round to Inf, below it
/// to 65504), on every backend and through every op.
#[test]
fn f16_overflow_gives_infinity() {
    let dt = DType::F16;
    for be in backends_for(dt) {
        let dev: &Device = &be.device;
        let label = be.label;
        // Activation: x + bias past the range; 65504 + 8 rounds back to 65504, + 16 is a tie that
        // rounds to even, which is Inf.
        let x = ok("x", dev.tensor_from_f32(&[6], dt, &[60000.0, -60000.0, 65504.0, 65504.0, 30000.0, -65504.0]));
        let bias = ok("bias", dev.tensor_from_f32(&[6], dt, &[10000.0, -10000.0, 8.0, 16.0, 1.0, -16.0]));
        let y = ok("activation", dev.activation(&x, Some(&bias), Activation::None));
        let want = [f32::INFINITY, f32::NEG_INFINITY, 65504.0, f32::INFINITY, 30000.0, f32::NEG_INFINITY];
        assert_eq!(f16_values(&y), want, "{label} f16 activation overflow");
        let y = ok("relu", dev.activation(&x, Some(&bias), Activation::Relu));
        assert_eq!(f16_values(&y), [f32::INFINITY, 0.0, 65504.0, f32::INFINITY, 30000.0, 0.0], "{label} relu");
        // Matmul: 300·300 = 90000; a sum of products 256·256 + ... past the range; -Inf too.
        let a = ok("a", dev.tensor_from_f32(&[2, 2], dt, &[300.0, 0.0, -256.0, -256.0]));
        let b = ok("b", dev.tensor_from_f32(&[2, 2], dt, &[300.0, 1.0, 256.0, 1.0]));
        let y = ok("matmul", dev.matmul(&a, &b, &MatmulOptions::default()));
        assert_eq!(f16_values(&y), [f32::INFINITY, 300.0, f32::NEG_INFINITY, -512.0], "{label} f16 matmul overflow");
        // Conv: a 2×2 filter of 200s over 100s is 80000.
        let x = ok("x", dev.tensor_from_f32(&[1, 1, 2, 2], dt, &[100.0; 4]));
        let w = ok(
            "w",
            dev.tensor_from_f32(&[2, 1, 2, 2], dt, &[200.0, 200.0, 200.0, 200.0, -200.0, -200.0, -200.0, -200.0]),
        );
        let y = ok("conv", dev.depthwise_conv2d(&x, &w, None, &Conv2dOptions::default()));
        assert_eq!(f16_values(&y), [f32::INFINITY, f32::NEG_INFINITY], "{label} f16 conv overflow");
    }
    // The matmul path with the tolerance model as well (values near the threshold).
    let mut d = MatmulDesc::new(3, 4, 2);
    d.alpha = 2000.0;
    run_matmul(&d, dt, Data::Integers(8), 3).unwrap_or_else(|e| panic!("{e}"));
}

/// Every bit pattern of a 16-bit dtype, as raw words.
fn all_bits() -> Vec<u16> {
    (0..=u16::MAX).collect()
}

/// A rank-1 tensor of 16-bit words in `dtype` (f16 or bf16).
fn from_bits(dev: &Device, dtype: DType, bits: &[u16]) -> tilekit::Result<Tensor> {
    match dtype {
        DType::F16 => dev.tensor(&[bits.len()], &bits.iter().map(|&b| f16::from_bits(b)).collect::<Vec<_>>()),
        _ => dev.tensor(&[bits.len()], &bits.iter().map(|&b| bf16::from_bits(b)).collect::<Vec<_>>()),
    }
}

/// Uploads every f16 and bf16 bit pattern (NaNs, ±Inf, subnormals, ±0 included), runs
/// `activation(None)` (the device reads, widens, narrows and stores each value) and checks the
/// result equals the input bit for bit; NaNs only need to stay NaN. A plain upload/download round
/// trip must be bit-exact for every pattern, NaN payloads included.
#[test]
fn every_half_bit_pattern_round_trips() {
    let bits = all_bits();
    for dtype in [DType::F16, DType::Bf16] {
        for be in backends_for(dtype) {
            let dev = &be.device;
            let x = ok("upload", from_bits(dev, dtype, &bits));
            let raw = ok("download", x.to_bytes());
            let raw: Vec<u16> = raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
            assert_eq!(raw, bits, "{} {dtype}: upload/download changed bits", be.label);
            for mode in [ActMode::New, ActMode::InPlace] {
                let y = match mode {
                    ActMode::InPlace => {
                        let y = ok("upload", from_bits(dev, dtype, &bits));
                        ok("activation_in_place", dev.activation_in_place(&y, None, Activation::None));
                        y
                    }
                    _ => ok("activation", dev.activation(&x, None, Activation::None)),
                };
                let got = ok("download", y.to_bytes());
                let mut bad = Vec::new();
                for (i, c) in got.chunks_exact(2).enumerate() {
                    let g = u16::from_le_bytes([c[0], c[1]]);
                    let want = bits[i];
                    let is_nan = |b: u16| match dtype {
                        DType::F16 => f16::from_bits(b).is_nan(),
                        _ => bf16::from_bits(b).is_nan(),
                    };
                    let same = g == want || (is_nan(want) && is_nan(g));
                    if !same {
                        bad.push((want, g));
                    }
                }
                assert!(
                    bad.is_empty(),
                    "{} {dtype} {mode:?}: {} of 65536 patterns changed; first (in, out) = {:04x?}",
                    be.label,
                    bad.len(),
                    &bad[..bad.len().min(8)]
                );
            }
        }
    }
}
