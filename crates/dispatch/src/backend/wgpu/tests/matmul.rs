//! Matmul against the reference: edge shapes, transposes, the epilogue, batches and strided
//! views, f16/bf16 on both paths, bf16 precision, integer inputs bit for bit.

use super::*;

pub(super) struct MatmulCase {
    pub(super) desc: MatmulDesc,
    pub(super) bias: bool,
}

pub(super) fn run_matmul_case(dev: &Device, dtype: DType, case: &MatmulCase, seed: u64) {
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

pub(super) fn dense_case(batch: usize, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulCase {
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
        desc.a = MatrixView::new(3, k + 2, m * (k + 2) + 1);
        desc.b = MatrixView::new(0, n, 0);
        desc.c = Some(MatrixView::new(1, n + 1, m * (n + 1)));
        desc.out = MatrixView::new(2, n + 3, m * (n + 3) + 4);
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
    desc.a = MatrixView::new(4, 40, 800);
    desc.b = MatrixView::new(8, 28, 36 * 28);
    desc.out = MatrixView::new(4, 24, 480);
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
        desc.a = MatrixView::new(1, 5, 0);
        desc.b = MatrixView::new(3, 7, 0);
        desc.c = Some(MatrixView::new(1, 5, 0));
        desc.out = MatrixView::new(1, 5, 0);
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
