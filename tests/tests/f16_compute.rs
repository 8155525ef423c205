//! `Precision::F16` (f16 products and partial sums of up to 8 products, summed in f32) on every
//! backend that has f16 storage, against the `f64` reference under `tolerance::matmul_bound`
//! (the looser bound of that policy): the wgpu backend runs `matmul_f16x2.wgsl` for M > 16 on a
//! device with `SHADER_F16`, the other backends and shapes the `Highest` path, which is inside the
//! same bound. Exact-integer cases must match bit for bit everywhere; f32 and bf16 storage are
//! refused with a typed error.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{Activation, DType, Error, MatmulDesc, MatrixView, Precision};
use tilekit_tests::{Data, backends_for, run_matmul};

/// Mostly above the GEMV kernel's 16 rows, so the f16 kernel runs: primes and the tile edges.
fn rows() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => 1usize..=16,
        3 => prop::sample::select(vec![17usize, 19, 31, 33, 47, 64, 65, 127, 129]),
    ]
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => 1usize..=9,
        2 => prop::sample::select(vec![13usize, 16, 17, 31, 33, 64, 65, 70]),
    ]
}

/// A view of a `rows × cols` operand: offset, leading-dimension padding, dense, padded or
/// broadcast batches.
fn view(rows: usize, cols: usize, batch: usize, allow_broadcast: bool) -> impl Strategy<Value = MatrixView> {
    (0usize..=5, 0usize..=3, 0usize..=4, any::<bool>()).prop_map(move |(offset, pad, extra, bcast)| {
        let ld = cols + pad;
        let dense = rows.saturating_sub(1) * ld + cols;
        let batch_stride = if allow_broadcast && bcast && batch > 1 { 0 } else { dense + extra };
        MatrixView::new(offset, ld, batch_stride)
    })
}

fn f16_case() -> impl Strategy<Value = (MatmulDesc, u64)> {
    let k = prop_oneof![1 => Just(0usize), 12 => dim()];
    (rows(), dim(), k, 1usize..=3, any::<bool>(), any::<bool>())
        .prop_flat_map(|(m, n, k, batch, trans_a, trans_b)| {
            let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
            let (br, bc) = if trans_b { (n, k) } else { (k, n) };
            (
                (Just((m, n, k, batch, trans_a, trans_b)), view(ar, ac, batch, true), view(br, bc, batch, true)),
                (prop::option::of(view(m, n, batch, true)), prop::option::of(0usize..=3), view(m, n, batch, false)),
                (
                    prop::sample::select(vec![1.0f32, -0.5, 2.0, 0.0]),
                    prop::sample::select(vec![1.0f32, 0.5, -1.0, 0.0]),
                    prop::sample::select(Activation::ALL.to_vec()),
                    any::<u64>(),
                ),
            )
        })
        .prop_map(|((shape, a, b), (c, bias_offset, out), (alpha, beta, activation, seed))| {
            let (m, n, k, batch, trans_a, trans_b) = shape;
            let desc = MatmulDesc::new(m, n, k)
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
                .precision(Precision::F16);
            (desc, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Strided, batched, transposed f16-compute matmuls with every epilogue on every backend
    /// with f16 storage, guard words around the output view.
    #[test]
    fn f16_compute_matmul_matches_reference((desc, seed) in f16_case()) {
        run_matmul(&desc, DType::F16, Data::Uniform, seed).map_err(TestCaseError::fail)?;
    }

    /// Small integers (|x| <= 2, K <= 70: partial sums <= 280, results <= 2·(280 + 2) + 2, all
    /// exact in f16) with the exact activations: bit for bit.
    #[test]
    fn f16_compute_integers_are_exact((desc, seed) in f16_case()) {
        let act = [Activation::None, Activation::Relu, Activation::Relu6][(seed % 3) as usize];
        run_matmul(&desc.activation(act), DType::F16, Data::Integers(2), seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn f16_compute_refuses_other_storage() {
    for dtype in [DType::F32, DType::Bf16] {
        for be in backends_for(dtype) {
            let dev = &be.device;
            let x = dev.zeros(&[6], dtype).expect("a tensor");
            let out = dev.zeros(&[4], dtype).expect("a tensor");
            let d = MatmulDesc::new(2, 2, 3).precision(Precision::F16);
            let e = dev.matmul_into(&d, &x, &x, None, None, &out).expect_err("refused");
            assert!(matches!(e, Error::InvalidParameter { param: "precision", .. }), "{}: {e}", be.label);
        }
    }
}
