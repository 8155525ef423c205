//! Differential tests: every op × every dtype × every backend present, against the `f64`
//! reference under the tolerance model of `tilekit_tests::tolerance` (or bit for bit with
//! exact-integer inputs).
//!
//! Case counts are kept small (a few dozen per property, shapes mostly ≤ 70) because wgpu runs
//! on lavapipe in CI, about 100× slower than native code.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{Activation, DType, Layout, MatmulDesc, MatmulOptions, MatrixView, Precision};
use tilekit_tests::{
    ActMode, Data, Rng, backends_for, conv_desc, report_guard_words, run_activation, run_conv, run_matmul,
};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Shrinking reruns every backend; a bounded number of steps keeps a failure on lavapipe
        // from running for minutes while still giving a small case.
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A matrix dimension: mostly small, sometimes prime or around the 16/64 tile edges.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1usize..=8,
        2 => 9usize..=40,
        2 => prop::sample::select(vec![13usize, 16, 17, 31, 33, 47, 63, 64, 65, 70]),
    ]
}

fn activation() -> impl Strategy<Value = Activation> {
    prop::sample::select(Activation::ALL.to_vec())
}

/// A view of a `rows × cols` operand: offset, extra leading-dimension padding, and a batch
/// stride that is dense, padded, or 0 (broadcast).
fn view(rows: usize, cols: usize, batch: usize, allow_broadcast: bool) -> impl Strategy<Value = MatrixView> {
    (0usize..=5, 0usize..=3, 0usize..=4, any::<bool>()).prop_map(move |(offset, pad, extra, bcast)| {
        let ld = cols + pad;
        let dense = rows.saturating_sub(1) * ld + cols;
        let batch_stride = if allow_broadcast && bcast && batch > 1 { 0 } else { dense + extra };
        MatrixView::new(offset, ld, batch_stride)
    })
}

#[derive(Debug, Clone)]
struct MatmulCase {
    desc: MatmulDesc,
    seed: u64,
}

fn matmul_case() -> impl Strategy<Value = MatmulCase> {
    let k = prop_oneof![1 => Just(0usize), 12 => dim()];
    (dim(), dim(), k, 1usize..=3, any::<bool>(), any::<bool>())
        .prop_flat_map(|(m, n, k, batch, trans_a, trans_b)| {
            let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
            let (br, bc) = if trans_b { (n, k) } else { (k, n) };
            (
                (Just((m, n, k, batch, trans_a, trans_b)), view(ar, ac, batch, true), view(br, bc, batch, true)),
                (prop::option::of(view(m, n, batch, true)), prop::option::of(0usize..=3), view(m, n, batch, false)),
                (
                    prop::sample::select(vec![1.0f32, -0.5, 2.0, 0.0]),
                    prop::sample::select(vec![1.0f32, 0.5, -1.0, 0.0]),
                    activation(),
                    prop::sample::select(vec![Precision::Highest, Precision::Bf16]),
                    any::<u64>(),
                ),
            )
        })
        .prop_map(|((shape, a, b), (c, bias_offset, out), (alpha, beta, activation, precision, seed))| {
            let (m, n, k, batch, trans_a, trans_b) = shape;
            MatmulCase {
                desc: MatmulDesc::new(m, n, k)
                    .batch(batch)
                    .trans_a(trans_a)
                    .trans_b(trans_b)
                    .a(a)
                    .b(b)
                    .c(c)
                    .bias_offset(bias_offset)
                    .out(out)
                    .alpha(alpha)
                    .beta(beta)
                    .activation(activation)
                    .precision(precision),
                seed,
            }
        })
}

proptest! {
    #![proptest_config(config(48))]

    /// Strided, batched, transposed matmul with every epilogue, in every dtype on every backend,
    /// with the output view inside a buffer of guard words.
    #[test]
    fn matmul_matches_reference(case in matmul_case()) {
        for dtype in DType::ALL {
            run_matmul(&case.desc, dtype, Data::Uniform, case.seed).map_err(TestCaseError::fail)?;
        }
    }

    /// Depthwise conv over layouts, kernel sizes, strides, dilations, asymmetric padding,
    /// multipliers, bias on/off and every activation.
    #[test]
    fn conv_matches_reference(
        (batch, channels, h, w) in (1usize..=2, 1usize..=5, 1usize..=13, 1usize..=13),
        (kh, kw, multiplier) in (1usize..=5, 1usize..=5, 1usize..=3),
        (sh, sw, dh, dw) in (1usize..=3, 1usize..=3, 1usize..=2, 1usize..=2),
        pads in prop::array::uniform4(0usize..=3),
        nhwc in any::<bool>(),
        has_bias in any::<bool>(),
        act in activation(),
        into in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = if nhwc { Layout::Nhwc } else { Layout::Nchw };
        let mut d = conv_desc(batch, channels, h, w, kh, kw, layout);
        d.multiplier = multiplier;
        (d.stride_h, d.stride_w, d.dilation_h, d.dilation_w) = (sh, sw, dh, dw);
        [d.pad_top, d.pad_bottom, d.pad_left, d.pad_right] = pads;
        d.has_bias = has_bias;
        d.activation = act;
        // A filter that does not fit is a validation error (tested in bad_inputs); here widen
        // the bottom/right padding until it fits.
        while d.out_h().is_none() { d.pad_bottom += 1; }
        while d.out_w().is_none() { d.pad_right += 1; }
        for dtype in DType::ALL {
            run_conv(&d, dtype, Data::Uniform, seed, into).map_err(TestCaseError::fail)?;
        }
    }

    /// Elementwise activations with and without bias, new tensor, in place and into, over a
    /// range wide enough to reach relu6's clamp and the GELU tails.
    #[test]
    fn activation_matches_reference(
        shape in prop::collection::vec(1usize..=9, 1..=4),
        last in prop_oneof![Just(None), (1usize..=70).prop_map(Some)],
        with_bias in any::<bool>(),
        act in activation(),
        mode in prop::sample::select(vec![ActMode::New, ActMode::InPlace, ActMode::Into, ActMode::IntoSelf]),
        seed in any::<u64>(),
    ) {
        let mut shape = shape;
        if let (Some(l), Some(s)) = (last, shape.last_mut()) { *s = l; }
        let mut rng = Rng::new(seed);
        let x: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.uniform(-10.0, 10.0)).collect();
        for dtype in DType::ALL {
            run_activation(&shape, with_bias, act, mode, dtype, Data::Uniform, seed, Some(&x))
                .map_err(TestCaseError::fail)?;
        }
    }
}

/// The edge-shape table: dims 0, 1, small primes and the 16/64 tile edges, each varied with the
/// other two fixed, plus cubes and a few long or skinny shapes. Every row runs with a bias, a
/// residual and an activation (cycled), so K = 0 checks the epilogue of zeros and M or N = 0
/// checks that nothing is written.
#[test]
fn matmul_edge_shapes() {
    const EDGES: [usize; 12] = [0, 1, 2, 3, 5, 7, 16, 17, 63, 64, 65, 129];
    let mut shapes = Vec::new();
    for &x in &EDGES {
        shapes.push((x, 17, 16));
        shapes.push((17, x, 16));
        shapes.push((16, 17, x));
        if x <= 65 {
            shapes.push((x, x, x));
        }
    }
    shapes.extend([(1, 1, 1000), (130, 3, 7), (3, 130, 7), (65, 63, 129), (1, 65, 64), (64, 1, 65)]);
    let (mut rows, mut guards) = (0, 0);
    for (row, &(m, n, k)) in shapes.iter().enumerate() {
        let mut d = MatmulDesc::new(m, n, k);
        d.trans_a = row % 2 == 1;
        d.trans_b = row % 4 >= 2;
        let (ar, ac) = d.a_stored();
        let (br, bc) = d.b_stored();
        d.a = MatrixView::dense(ar, ac);
        d.b = MatrixView::dense(br, bc);
        d.bias_offset = Some(0);
        d.c = Some(MatrixView::dense(m, n));
        d.beta = 0.5;
        d.activation = Activation::ALL[row % Activation::ALL.len()];
        for dtype in DType::ALL {
            match run_matmul(&d, dtype, Data::Uniform, row as u64) {
                Ok(g) => guards += g,
                Err(e) => panic!("edge-shape row {row} ({m}x{n}x{k}): {e}"),
            }
            rows += 1;
        }
    }
    eprintln!("matmul_edge_shapes: {rows} (shape, dtype) rows, {guards} guard words checked");
    report_guard_words("matmul_edge_shapes");
}

/// Integer range and largest K per dtype such that every partial sum is exact in f32 and
/// `|alpha|·r²·K + r + |beta|·r` is an integer the storage dtype represents exactly (2²⁴, 2048,
/// 256), so results must match the reference bit for bit.
fn exact_limits(dtype: DType) -> (i32, usize) {
    match dtype {
        DType::F32 => (8, 130),
        DType::F16 => (4, 60),
        DType::Bf16 => (2, 30),
        other => unimplemented!("{other:?}"),
    }
}

/// Exact-integer matmul over strided views in guard-word buffers: every output element must match
/// bit for bit (the last in-bounds one included), and no word outside the output view may change.
#[test]
fn matmul_exact_integers_with_guard_bands() {
    let shapes = [(1, 1, 1), (2, 3, 5), (7, 5, 3), (16, 16, 16), (17, 13, 29), (33, 65, 30), (64, 17, 1), (65, 64, 2)];
    let (mut rows, mut guards) = (0, 0);
    for dtype in DType::ALL {
        let (r, kmax) = exact_limits(dtype);
        for (row, &(m, n, k)) in shapes.iter().enumerate() {
            let k = k.min(kmax);
            for batch in [1usize, 3] {
                let mut d = MatmulDesc::new(m, n, k);
                d.batch = batch;
                d.trans_a = row % 2 == 0;
                d.trans_b = row % 3 == 0;
                let (_, ac) = d.a_stored();
                let (br, bc) = d.b_stored();
                // A broadcast (batch stride 0), B padded; the output strided with gaps between rows
                // and batches, so guard words sit on every side of it.
                d.a = MatrixView::new(3, ac + 1, 0);
                d.b = MatrixView::new(1, bc + 2, br.saturating_sub(1) * (bc + 2) + bc + 3);
                let out_ld = n + 3;
                d.out = MatrixView::new(4, out_ld, m * out_ld + 5);
                d.c = (row % 2 == 1).then_some(MatrixView::new(2, n, m * n));
                d.bias_offset = (row % 3 != 2).then_some(1);
                d.alpha = [1.0, 2.0, -1.0][row % 3];
                d.beta = [1.0, -2.0][row % 2];
                d.activation = [Activation::None, Activation::Relu, Activation::Relu6][row % 3];
                d.precision = if row % 4 == 3 { Precision::Bf16 } else { Precision::Highest };
                match run_matmul(&d, dtype, Data::Integers(r), 1000 + row as u64) {
                    Ok(g) => guards += g,
                    Err(e) => panic!("exact row {row} batch {batch}: {e}"),
                }
                rows += 1;
            }
        }
    }
    eprintln!("matmul_exact_integers_with_guard_bands: {rows} rows bit-exact, {guards} guard words checked");
    assert!(guards > 0, "no guard words were checked");
    report_guard_words("matmul_exact_integers_with_guard_bands");
}

/// K = 0: the result is the epilogue applied to zeros, `act(bias + beta·C)`, exactly.
#[test]
fn k_zero_gives_the_epilogue_of_zeros() {
    for dtype in DType::ALL {
        for act in [Activation::None, Activation::Relu, Activation::Relu6] {
            let mut d = MatmulDesc::new(5, 7, 0);
            d.batch = 2;
            d.a = MatrixView::dense(5, 0);
            d.b = MatrixView::dense(0, 7);
            d.bias_offset = Some(0);
            d.c = Some(MatrixView::dense(5, 7));
            d.beta = 2.0;
            d.out = MatrixView::new(2, 8, 41);
            d.activation = act;
            run_matmul(&d, dtype, Data::Integers(3), 7).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The dense entry point (`Device::matmul`, with rank-2 operands broadcast over batches) gives
/// bit for bit what `matmul_into` gives on the equivalent descriptor.
#[test]
fn dense_api_matches_strided_api() {
    /// (batch of a, batch of b, M, N, K); `None` is a rank-2 operand.
    type Case = (Option<usize>, Option<usize>, usize, usize, usize);
    let cases: [Case; 5] = [
        (None, None, 5, 7, 3),
        (Some(3), None, 4, 6, 9),
        (None, Some(2), 17, 3, 16),
        (Some(2), Some(2), 1, 65, 7),
        (Some(1), Some(3), 6, 6, 6),
    ];
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            for (row, &(ba, bb, m, n, k)) in cases.iter().enumerate() {
                let mut rng = Rng::new(row as u64);
                let trans_a = row % 2 == 1;
                let trans_b = row % 3 == 1;
                let a_mat = if trans_a { [k, m] } else { [m, k] };
                let b_mat = if trans_b { [n, k] } else { [k, n] };
                let shape = |b: Option<usize>, mat: [usize; 2]| match b {
                    Some(b) => vec![b, mat[0], mat[1]],
                    None => mat.to_vec(),
                };
                let (sa, sb) = (shape(ba, a_mat), shape(bb, b_mat));
                let batch = ba.unwrap_or(1).max(bb.unwrap_or(1));
                let fill = |rng: &mut Rng, s: &[usize]| Data::Uniform.fill(rng, s.iter().product(), dtype);
                let (av, bv) = (fill(&mut rng, &sa), fill(&mut rng, &sb));
                let biasv = fill(&mut rng, &[n]);
                let cv = fill(&mut rng, &[m, n]);
                let t = |s: &[usize], v: &[f32]| dev.tensor_from_f32(s, dtype, v).unwrap_or_else(|e| panic!("{e}"));
                let (a, b, bias, c) = (t(&sa, &av), t(&sb, &bv), t(&[n], &biasv), t(&[m, n], &cv));
                let opts = MatmulOptions::default()
                    .trans_a(trans_a)
                    .trans_b(trans_b)
                    .alpha(0.5)
                    .beta(-1.0)
                    .bias(Some(&bias))
                    .c(Some(&c))
                    .activation(Activation::Gelu)
                    .precision(Precision::Highest);
                let dense = dev.matmul(&a, &b, &opts).unwrap_or_else(|e| panic!("{} {dtype} row {row}: {e}", be.label));
                let batched = ba.is_some() || bb.is_some();
                let want_shape = if batched { vec![batch, m, n] } else { vec![m, n] };
                assert_eq!(dense.shape(), want_shape, "{} {dtype} row {row}", be.label);
                let view = |b: Option<usize>, mat: [usize; 2]| {
                    MatrixView::new(0, mat[1], if b.unwrap_or(1) > 1 { mat[0] * mat[1] } else { 0 })
                };
                let mut d = MatmulDesc::new(m, n, k);
                d.batch = batch;
                (d.trans_a, d.trans_b) = (trans_a, trans_b);
                (d.a, d.b) = (view(ba, a_mat), view(bb, b_mat));
                d.c = Some(MatrixView::new(0, n, 0));
                d.bias_offset = Some(0);
                (d.alpha, d.beta, d.activation) = (0.5, -1.0, Activation::Gelu);
                let out = dev.zeros(&want_shape, dtype).unwrap_or_else(|e| panic!("{e}"));
                dev.matmul_into(&d, &a, &b, Some(&bias), Some(&c), &out).unwrap_or_else(|e| panic!("{e}"));
                let (x, y) = (dense.to_bytes(), out.to_bytes());
                assert_eq!(x, y, "{} {dtype} row {row}: dense and strided entry points differ", be.label);
                // And both agree with the reference.
                run_matmul(&d, dtype, Data::Uniform, row as u64).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// A weight packed by `pack_matmul_weights` through `matmul_packed`, on every path of the
/// CPU's strip kernel (`M` from 1 to past its 64-row tasks, one to three rows over several strips
/// at once, `K` past its 256-row passes, `N`
/// around the 16-column strips, one task and many in parallel) and on every other backend
/// present: exact-integer data, so every product must be exact, and the same bits as
/// `matmul` with the weight unpacked where the docs promise it (every GPU backend; the CPU
/// from a `[K, N]` weight for `M ≤ 16`).
#[test]
fn packed_weights_are_exact_on_every_path() {
    // (M, N, K); the CPU runs all of them, the GPU backends the first four.
    let cases = [
        (1, 17, 5),
        (6, 16, 300),
        (17, 33, 40),
        (3, 1, 513),
        (16, 47, 600),
        (13, 200, 257),
        (64, 31, 70),
        (65, 100, 300),
        (130, 18, 33),
        (7, 4099, 130),
        // One to three rows: several strips side by side, the last pass of K partial, strips
        // left over past the last whole group of four or two, one task and many.
        (1, 117, 300),
        (2, 83, 513),
        (3, 50, 257),
        (1, 2000, 700),
        (2, 3000, 200),
    ];
    for be in backends_for(DType::F32) {
        let dev = &be.device;
        let cases = if be.label == "cpu" { &cases[..] } else { &cases[..4] };
        for (row, &(m, n, k)) in cases.iter().enumerate() {
            for trans_b in [false, true] {
                let mut rng = Rng::new(row as u64 * 2 + trans_b as u64);
                let av: Vec<f32> = (0..m * k).map(|_| rng.int(-3, 3) as f32).collect();
                let bv: Vec<f32> = (0..k * n).map(|_| rng.int(-3, 3) as f32).collect();
                let biasv: Vec<f32> = (0..n).map(|_| rng.int(-9, 9) as f32).collect();
                let t = |s: &[usize], v: &[f32]| dev.tensor(s, v).unwrap_or_else(|e| panic!("{e}"));
                let b_shape = if trans_b { [n, k] } else { [k, n] };
                let (a, b, bias) = (t(&[m, k], &av), t(&b_shape, &bv), t(&[n], &biasv));
                let what = format!("{} {m}x{n}x{k} trans_b {trans_b}", be.label);
                let packed = dev.pack_matmul_weights(&b, trans_b).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!((packed.k(), packed.n()), (k, n), "{what}");
                assert_eq!(packed.is_strips(), be.label == "cpu", "{what}");
                let opts = MatmulOptions::new().bias(Some(&bias)).activation(Activation::Relu);
                let got = dev.matmul_packed(&a, &packed, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.shape(), [m, n], "{what}");
                let got = got.to_f32_vec().unwrap_or_else(|e| panic!("{what}: {e}"));
                for i in 0..m {
                    for j in 0..n {
                        let bj = |q: usize| if trans_b { bv[j * k + q] } else { bv[q * n + j] };
                        let sum: f32 = (0..k).map(|q| av[i * k + q] * bj(q)).sum::<f32>() + biasv[j];
                        assert_eq!(got[i * n + j], sum.max(0.0), "{what}: element ({i}, {j})");
                    }
                }
                if be.label != "cpu" || (m <= 16 && !trans_b) {
                    let plain = dev
                        .matmul(&a, &b, &opts.trans_b(trans_b))
                        .and_then(|t| t.to_f32_vec())
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&plain), "{what}: packed and unpacked differ");
                }
            }
        }
    }
}

/// `matmul_packed`'s own errors: `trans_b` set (the packed weight has its layout), a `K` that
/// is not the weight's, a dtype that is not the weight's, a batched weight to pack.
#[test]
fn packed_weights_reject_bad_calls() {
    for be in backends_for(DType::F32) {
        let dev = &be.device;
        let t = |s: &[usize]| dev.zeros(s, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let packed = dev.pack_matmul_weights(&t(&[8, 5]), false).unwrap_or_else(|e| panic!("{e}"));
        let bad = [
            (dev.matmul_packed(&t(&[2, 8]), &packed, &MatmulOptions::new().trans_b(true)), "trans_b"),
            (dev.matmul_packed(&t(&[2, 7]), &packed, &MatmulOptions::new()), "K"),
            (dev.matmul_packed(&dev.zeros(&[2, 8], DType::F16).expect("f16"), &packed, &MatmulOptions::new()), "dtype"),
        ];
        for (result, what) in bad {
            assert!(result.is_err(), "{}: a bad {what} was accepted", be.label);
        }
        assert!(
            matches!(dev.pack_matmul_weights(&t(&[2, 8, 5]), false), Err(tilekit::Error::WrongRank { .. })),
            "{}: a batched weight was packed",
            be.label
        );
    }
}

/// Exact-integer depthwise conv: small integer inputs and weights with few taps make every sum
/// exact, so every backend must match bit for bit.
#[test]
fn conv_exact_integers() {
    let mut rows = 0;
    for dtype in DType::ALL {
        let r = match dtype {
            DType::Bf16 => 3, // 9 taps of |3·3| + 3 = 84 < 256
            _ => 4,
        };
        for (row, layout) in [Layout::Nchw, Layout::Nhwc].into_iter().enumerate() {
            for (kh, kw, s, dil, m) in
                [(3, 3, 1, 1, 1), (3, 3, 2, 1, 2), (1, 1, 1, 1, 3), (3, 1, 1, 2, 1), (2, 3, 3, 1, 1)]
            {
                let mut d = conv_desc(2, 3, 9, 8, kh, kw, layout);
                (d.stride_h, d.stride_w, d.dilation_h, d.dilation_w, d.multiplier) = (s, s, dil, dil, m);
                (d.pad_top, d.pad_bottom, d.pad_left, d.pad_right) = (1, 0, 2, 1);
                d.has_bias = true;
                d.activation = [Activation::None, Activation::Relu, Activation::Relu6][rows % 3];
                run_conv(&d, dtype, Data::Integers(r), rows as u64, row == 1).unwrap_or_else(|e| panic!("{e}"));
                rows += 1;
            }
        }
    }
    eprintln!("conv_exact_integers: {rows} rows, bit-exact");
}

/// Exact-integer activations (none, relu, relu6 are exact on integers), every mode.
#[test]
fn activation_exact_integers() {
    for dtype in DType::ALL {
        for (i, act) in [Activation::None, Activation::Relu, Activation::Relu6].into_iter().enumerate() {
            for mode in [ActMode::New, ActMode::InPlace, ActMode::Into, ActMode::IntoSelf] {
                for with_bias in [false, true] {
                    run_activation(&[3, 5, 7], with_bias, act, mode, dtype, Data::Integers(9), i as u64, None)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

/// Half-precision outputs packed two per 32-bit word: with odd N, odd leading dimensions and odd
/// offsets, adjacent outputs written by different invocations share a word, so a store that is
/// not confined to its own 16 bits loses a neighbour (or clobbers a guard word). Exact integers,
/// several repeats, since a lost update is a race.
#[test]
fn packed_half_outputs_keep_their_neighbours() {
    let mut guards = 0;
    for dtype in [DType::F16, DType::Bf16] {
        let (r, kmax) = exact_limits(dtype);
        for (row, &(m, n, ld, offset)) in
            [(130, 63, 63, 0), (67, 33, 35, 1), (5, 129, 131, 3), (64, 1, 1, 1)].iter().enumerate()
        {
            let mut d = MatmulDesc::new(m, n, 9.min(kmax));
            d.out = MatrixView::new(offset, ld, m * ld + 1);
            d.batch = 2;
            (d.a.batch_stride, d.b.batch_stride) = (0, 0);
            d.bias_offset = Some(0);
            for repeat in 0..3 {
                match run_matmul(&d, dtype, Data::Integers(r), (row * 10 + repeat) as u64) {
                    Ok(g) => guards += g,
                    Err(e) => panic!("row {row} repeat {repeat}: {e}"),
                }
            }
        }
        for shape in [[1usize, 3, 7, 9], [2, 5, 1, 3]] {
            // Odd output widths; padding 1 on every side keeps the 3-tap filters inside.
            let mut d = conv_desc(shape[0], shape[1], shape[2], shape[3], 3, 1, Layout::Nhwc);
            (d.pad_top, d.pad_bottom, d.pad_left, d.pad_right) = (1, 1, 1, 1);
            run_conv(&d, dtype, Data::Integers(3), 4, true).unwrap_or_else(|e| panic!("{e}"));
            let mut d = conv_desc(shape[0], shape[1], shape[2], shape[3], 1, 3, Layout::Nchw);
            (d.pad_top, d.pad_bottom, d.pad_left, d.pad_right) = (1, 1, 1, 1);
            run_conv(&d, dtype, Data::Integers(3), 5, false).unwrap_or_else(|e| panic!("{e}"));
        }
        run_activation(&[7, 13], true, Activation::Relu, ActMode::Into, dtype, Data::Integers(9), 6, None)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!("packed_half_outputs_keep_their_neighbours: {guards} guard words checked");
}
