//! Property tests of the CPU backend's own kernel paths, on the CPU device only (so the shapes
//! can be large enough to reach its threaded paths without lavapipe's cost): the skinny
//! matmul (M = 1…16, both B layouts), the panel epilogue, the depthwise kernels in both
//! layouts with every padding, stride, dilation and multiplier, and the activations' SIMD
//! remainders, in every dtype. Integer data makes every sum exact, so results must match the
//! f64 reference rounded once to the dtype, bit for bit (GELU: within its promised bound).

use proptest::prelude::*;
use tilekit::{
    Activation, ActivationDesc, Conv2dDesc, Conv2dOptions, DType, Device, Layout, MatmulDesc, MatmulOptions, MatrixView,
};
use tilekit_kernels::reference;
use tilekit_tests::Rng;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() }
}

fn cpu() -> &'static Device {
    static DEV: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    DEV.get_or_init(Device::cpu)
}

fn ints(rng: &mut Rng, n: usize, r: i32) -> Vec<f32> {
    (0..n).map(|_| rng.int(-r, r) as f32).collect()
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn exact_act() -> impl Strategy<Value = Activation> {
    prop::sample::select(vec![Activation::None, Activation::Relu, Activation::Relu6])
}

#[derive(Debug, Clone)]
struct Mm {
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    bias: bool,
    c: bool,
    alpha: f32,
    beta: f32,
    act: Activation,
    dtype: DType,
    seed: u64,
}

fn mm(max_m: usize, max_nk: usize) -> impl Strategy<Value = Mm> {
    (
        (1..=max_m, 1..=max_nk, 0..=max_nk, any::<bool>(), any::<bool>()),
        (
            any::<bool>(),
            any::<bool>(),
            prop::sample::select(vec![1.0f32, 0.5, 2.0]),
            prop::sample::select(vec![1.0f32, -1.0, 2.0]),
        ),
        (exact_act(), dtype(), any::<u64>()),
    )
        .prop_map(|((m, n, k, trans_a, trans_b), (bias, c, alpha, beta), (act, dtype, seed))| Mm {
            m,
            n,
            k,
            trans_a,
            trans_b,
            bias,
            c,
            alpha,
            beta,
            act,
            dtype,
            seed,
        })
}

fn check_mm(t: &Mm) -> Result<(), TestCaseError> {
    let dev = cpu();
    let mut rng = Rng::new(t.seed);
    let a = ints(&mut rng, t.m * t.k, 2);
    let b = ints(&mut rng, t.k * t.n, 2);
    let bias = ints(&mut rng, t.n, 3);
    let c = ints(&mut rng, t.m * t.n, 3);
    let a_shape = if t.trans_a { [t.k, t.m] } else { [t.m, t.k] };
    let b_shape = if t.trans_b { [t.n, t.k] } else { [t.k, t.n] };
    let at = dev.tensor_from_f32(&a_shape, t.dtype, &a).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let bt = dev.tensor_from_f32(&b_shape, t.dtype, &b).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let biast = dev.tensor_from_f32(&[t.n], t.dtype, &bias).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let ct = dev.tensor_from_f32(&[t.m, t.n], t.dtype, &c).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let opts = MatmulOptions::default()
        .trans_a(t.trans_a)
        .trans_b(t.trans_b)
        .alpha(t.alpha)
        .beta(t.beta)
        .bias(t.bias.then_some(&biast))
        .c(t.c.then_some(&ct))
        .activation(t.act);
    let got =
        dev.matmul(&at, &bt, &opts).and_then(|y| y.to_f32_vec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut d = MatmulDesc::new(t.m, t.n, t.k);
    d.trans_a = t.trans_a;
    d.trans_b = t.trans_b;
    d.a = MatrixView::dense(a_shape[0], a_shape[1]);
    d.b = MatrixView::dense(b_shape[0], b_shape[1]);
    d.alpha = t.alpha;
    d.beta = t.beta;
    d.bias_offset = t.bias.then_some(0);
    d.c = t.c.then(|| MatrixView::dense(t.m, t.n));
    d.activation = t.act;
    let mut want = vec![0.0f64; t.m * t.n];
    reference::matmul(
        &d,
        &wide(&a),
        &wide(&b),
        t.bias.then(|| wide(&bias)).as_deref(),
        t.c.then(|| wide(&c)).as_deref(),
        &mut want,
    );
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let w = t.dtype.round_f32(w as f32);
        prop_assert!(g == w, "{t:?}: element {i} is {g}, expected {w}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(48))]

    /// The skinny path, M = 1…16, both layouts, every epilogue, widths up to past a block.
    #[test]
    fn skinny_matmul_matches_the_reference(t in mm(16, 300)) {
        check_mm(&t)?;
    }

    /// Larger shapes: row panels, the plain-gemm path, the threaded splits.
    #[test]
    fn matmul_matches_the_reference(t in mm(120, 160)) {
        check_mm(&t)?;
    }
}

#[derive(Debug, Clone)]
struct Dw {
    d: Conv2dDesc,
    dtype: DType,
    seed: u64,
}

fn dw() -> impl Strategy<Value = Dw> {
    (
        (1usize..=2, 1usize..=40, 1usize..=20, 1usize..=40, 1usize..=3),
        (1usize..=5, 1usize..=5, 1usize..=3, 1usize..=3, 1usize..=2, 1usize..=2),
        (0usize..=3, 0usize..=3, 0usize..=3, 0usize..=3),
        (any::<bool>(), any::<bool>(), exact_act(), dtype(), any::<u64>()),
    )
        .prop_map(
            |(
                (batch, channels, height, width, multiplier),
                (kh, kw, sh, sw, dh, dwl),
                pads,
                (nhwc, has_bias, activation, dtype, seed),
            )| {
                let mut d = Conv2dDesc::new(
                    if nhwc { Layout::Nhwc } else { Layout::Nchw },
                    [batch, channels, height, width],
                    [kh, kw],
                )
                .multiplier(multiplier)
                .stride_h(sh)
                .stride_w(sw)
                .pad_top(pads.0)
                .pad_bottom(pads.1)
                .pad_left(pads.2)
                .pad_right(pads.3)
                .dilation_h(dh)
                .dilation_w(dwl)
                .has_bias(has_bias)
                .activation(activation);
                // Pad up to a non-empty output.
                while d.out_h().is_none_or(|v| v == 0) {
                    d.pad_bottom += 1;
                }
                while d.out_w().is_none_or(|v| v == 0) {
                    d.pad_right += 1;
                }
                Dw { d, dtype, seed }
            },
        )
}

proptest! {
    #![proptest_config(config(64))]

    /// Depthwise conv: both layouts, kernels up to 5×5, strides, dilations, asymmetric padding,
    /// multipliers up to 3, every dtype, bit for bit.
    #[test]
    fn depthwise_matches_the_reference(t in dw()) {
        let d = t.d;
        let dev = cpu();
        let mut rng = Rng::new(t.seed);
        let x = ints(&mut rng, d.input_shape().iter().product(), 3);
        let w = ints(&mut rng, d.weight_shape().iter().product(), 3);
        let bias = ints(&mut rng, d.out_channels(), 5);
        let fail = |e: tilekit::Error| TestCaseError::fail(e.to_string());
        let xt = dev.tensor_from_f32(&d.input_shape(), t.dtype, &x).map_err(fail)?;
        let wt = dev.tensor_from_f32(&d.weight_shape(), t.dtype, &w).map_err(fail)?;
        let bt = dev.tensor_from_f32(&[bias.len()], t.dtype, &bias).map_err(fail)?;
        let opts = Conv2dOptions::default().stride([d.stride_h, d.stride_w]).padding([d.pad_top, d.pad_bottom, d.pad_left, d.pad_right]).dilation([d.dilation_h, d.dilation_w]).layout(d.layout).activation(d.activation);
        let got = dev.depthwise_conv2d(&xt, &wt, d.has_bias.then_some(&bt), &opts).and_then(|y| y.to_f32_vec()).map_err(fail)?;
        let mut want = vec![0.0f64; d.output_shape().iter().product()];
        reference::depthwise_conv2d(&d, &wide(&x), &wide(&w), d.has_bias.then(|| wide(&bias)).as_deref(), &mut want);
        prop_assert_eq!(got.len(), want.len());
        for (i, (&g, &v)) in got.iter().zip(&want).enumerate() {
            let v = t.dtype.round_f32(v as f32);
            prop_assert!(g == v, "{:?} {}: output {} is {}, expected {}", d, t.dtype, i, g, v);
        }
    }

    /// Activations at every length around the SIMD widths and the threading threshold, with a
    /// bias of any period: ReLU forms exact, GELU forms and SiLU within `Activation::error_bound` in f32.
    /// Inputs are quarter-integers in ±12, and every seventh an integer in ±48 (the AVX-512
    /// forms' tails: below −7.75, −6 and −31 they take the formula forms, lane by lane).
    #[test]
    fn activation_matches_the_reference(
        rows in 1usize..=40,
        cols in prop::sample::select(vec![1usize, 3, 15, 16, 17, 31, 33, 769, 1000]),
        bias in any::<bool>(),
        act in prop::sample::select(Activation::ALL.to_vec()),
        dtype in dtype(),
        seed in any::<u64>(),
    ) {
        let dev = cpu();
        let mut rng = Rng::new(seed);
        let len = rows * cols;
        let x: Vec<f32> = ints(&mut rng, len, 48).iter().enumerate().map(|(i, v)| if i % 7 == 3 { *v } else { v / 4.0 }).collect();
        let b: Vec<f32> = ints(&mut rng, cols, 8).iter().map(|v| v / 8.0).collect();
        let fail = |e: tilekit::Error| TestCaseError::fail(e.to_string());
        let xt = dev.tensor_from_f32(&[rows, cols], dtype, &x).map_err(fail)?;
        let bt = dev.tensor_from_f32(&[cols], dtype, &b).map_err(fail)?;
        let got = dev.activation(&xt, bias.then_some(&bt), act).and_then(|y| y.to_f32_vec()).map_err(fail)?;
        let desc = ActivationDesc::new(len, bias.then_some(cols), act);
        let mut want = vec![0.0f64; len];
        reference::activation(&desc, &wide(&x), bias.then(|| wide(&b)).as_deref(), &mut want);
        for i in 0..len {
            let pre = x[i] as f64 + if bias { b[i % cols] as f64 } else { 0.0 };
            if !act.is_exact() {
                // One f32 result within the bound, then one rounding to the dtype.
                let slack = match dtype { DType::F32 => 0.0, DType::F16 => 1.0 / 1024.0, DType::Bf16 => 1.0 / 128.0, other => unimplemented!("{other:?}") };
                // f16 also rounds tiny results to its subnormal grid (6e-8 apart).
                let grid = if dtype == DType::F16 { 6e-8 } else { 0.0 };
                let tol = act.error_bound(pre, want[i]) + slack * want[i].abs() + grid;
                prop_assert!((got[i] as f64 - want[i]).abs() <= tol, "{} {} [{}] at {}: {} vs {}", act, dtype, i, pre, got[i], want[i]);
            } else {
                let w = dtype.round_f32(want[i] as f32);
                prop_assert!(got[i] == w, "{} {} [{}]: {} vs {}", act, dtype, i, got[i], w);
            }
        }
    }
}
