//! Random op descriptors, valid and invalid, on every backend: every call returns `Ok` (and then
//! the result matches the reference) or a typed `Err`, never a panic, and every backend gives
//! the same verdict (validation is shared, so the variant must agree).
//!
//! Nothing here relies on catching a panic: a panic fails the case, so the property holds under
//! `panic = "abort"` as well. Dimensions are mostly small with a sprinkle of huge values
//! (`usize::MAX`, `usize::MAX / 2`, 2³¹) so overflow paths are walked; buffers are at most a
//! few hundred elements, so any call that validates is cheap.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{
    Activation, Conv2dDesc, Conv2dOptions, DType, Device, Error, Layout, MatmulDesc, MatrixView, Precision, Tensor,
};
use tilekit_tests::{Data, MatmulInputs, Rng, backends_for, run_conv, run_matmul_with};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 128, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() }
}

/// Mostly small, sometimes huge.
fn wild() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 0usize..=9,
        2 => 10usize..=40,
        1 => Just(usize::MAX),
        1 => Just(usize::MAX / 2),
        1 => Just(1usize << 31),
    ]
}

fn view() -> impl Strategy<Value = MatrixView> {
    (wild(), wild(), wild()).prop_map(|(offset, ld, batch_stride)| MatrixView::new(offset, ld, batch_stride))
}

fn scalar() -> impl Strategy<Value = f32> {
    prop_oneof![4 => Just(1.0f32), 2 => Just(-0.5f32), 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => Just(0.0f32)]
}

/// The verdict of one call, comparable across backends.
fn verdict(r: &tilekit::Result<()>) -> String {
    match r {
        Ok(()) => "Ok".into(),
        // The variant and its structured fields; messages may differ between backends only where
        // a backend reports its own limits, which these small buffers never reach.
        // A request the allocator cannot meet is out of memory on every backend; the byte
        // count in it is the backend's own (padding differs).
        Err(Error::OutOfMemory { .. }) => "allocation refused".into(),
        Err(e) => format!("{e:?}"),
    }
}

fn filled(dev: &Device, dtype: DType, len: usize, seed: u64) -> tilekit::Result<Tensor> {
    let v = Data::Uniform.fill(&mut Rng::new(seed), len, dtype);
    dev.tensor_from_f32(&[len], dtype, &v)
}

#[derive(Debug, Clone)]
struct MatmulCall {
    desc: MatmulDesc,
    /// Buffer lengths of a, b, bias, c, out.
    lens: [usize; 5],
    /// Whether bias and c tensors are passed (independently of the desc).
    pass_bias: bool,
    pass_c: bool,
    /// Index of a tensor (0..5) stored in another dtype, if any.
    odd_dtype: Option<usize>,
    seed: u64,
}

fn matmul_call() -> impl Strategy<Value = MatmulCall> {
    (
        (prop_oneof![3 => 0usize..=3, 1 => wild()], wild(), wild(), wild(), any::<bool>(), any::<bool>()),
        (view(), view(), prop::option::of(view()), prop::option::of(wild()), view()),
        (scalar(), scalar(), prop::sample::select(Activation::ALL.to_vec()), any::<bool>()),
        (prop::array::uniform5(0usize..=300), any::<bool>(), any::<bool>(), prop::option::weighted(0.1, 0usize..5)),
        any::<u64>(),
    )
        .prop_map(
            |((batch, m, n, k, trans_a, trans_b), (a, b, c, bias_offset, out), (alpha, beta, act, bf), rest, seed)| {
                let (lens, pass_bias, pass_c, odd_dtype) = rest;
                MatmulCall {
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
                        .activation(act)
                        .precision(if bf { Precision::Bf16 } else { Precision::Highest }),
                    // Mostly pass bias and c exactly when the desc names them.
                    lens,
                    pass_bias: if seed % 7 == 0 { pass_bias } else { bias_offset.is_some() },
                    pass_c: if seed % 11 == 0 { pass_c } else { c.is_some() },
                    odd_dtype,
                    seed,
                }
            },
        )
}

/// One `matmul_into` call on every backend: the same verdict everywhere, and where it is `Ok`,
/// the reference's result (guard words included). Returns the verdict.
fn matmul_call_holds(call: &MatmulCall, dtype: DType) -> Result<String, TestCaseError> {
    let mut verdicts = Vec::new();
    for be in backends_for(dtype) {
        let dev = &be.device;
        let dt = |i: usize| {
            if call.odd_dtype == Some(i) {
                DType::ALL[(DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) + 1) % 3]
            } else {
                dtype
            }
        };
        let make = |i: usize| filled(dev, dt(i), call.lens[i], call.seed + i as u64);
        let r = (|| -> tilekit::Result<()> {
            let (a, b, out) = (make(0)?, make(1)?, make(4)?);
            let bias = if call.pass_bias { Some(make(2)?) } else { None };
            let c = if call.pass_c { Some(make(3)?) } else { None };
            dev.matmul_into(&call.desc, &a, &b, bias.as_ref(), c.as_ref(), &out)
        })();
        // A dtype this backend cannot run is a typed error too.
        if let Err(Error::UnsupportedDType { .. }) = r {
            continue;
        }
        verdicts.push((be.label, verdict(&r)));
    }
    let first = verdicts.first().map(|v| v.1.clone()).unwrap_or_default();
    prop_assert!(verdicts.iter().all(|v| v.1 == first), "backends disagree: {verdicts:?}");
    if first == "Ok" && call.odd_dtype.is_none() {
        // It validated: check the result on every backend, guard words included.
        let mut rng = Rng::new(call.seed);
        let fill = |rng: &mut Rng, n: usize| Data::Uniform.fill(rng, n, dtype);
        let inputs = MatmulInputs {
            a: fill(&mut rng, call.lens[0]),
            b: fill(&mut rng, call.lens[1]),
            bias: call.pass_bias.then(|| fill(&mut rng, call.lens[2])),
            c: call.pass_c.then(|| fill(&mut rng, call.lens[3])),
            out_len: call.lens[4],
        };
        run_matmul_with(&call.desc, dtype, false, &inputs).map_err(TestCaseError::fail)?;
    }
    Ok(first)
}

/// Cases the property found: fields no element index reads (an empty `A`'s offset with
/// `K = 0`, a one-row view's `ld`, a one-batch view's batch stride) pass validation whatever
/// their value, and must not trip a backend's narrower index type.
#[test]
fn unread_view_fields_do_not_split_the_backends() {
    let huge = [usize::MAX, usize::MAX / 2, 1usize << 31];
    let mut calls = Vec::new();
    for &h in &huge {
        let v = MatrixView::new(h, h, h);
        // K = 0: A and B are empty, the output is the epilogue of zeros (beta · C).
        let k0 = MatmulDesc::new(1, 1, 0).a(v).b(v).c(Some(MatrixView::new(3, 1, 0))).beta(1.0);
        calls.push((k0, [0, 0, 0, 8, 4], false, true));
        calls.push((
            k0.trans_a(true).trans_b(true).m(2).n(2).out(MatrixView::new(0, 2, 0)).c(Some(MatrixView::new(0, 2, 0))),
            [0, 0, 0, 8, 8],
            false,
            true,
        ));
        // One row and one batch: ld and batch stride unused.
        let one = MatmulDesc::new(1, 3, 2)
            .a(MatrixView::new(1, h, h))
            .b(MatrixView::new(0, 3, h))
            .out(MatrixView::new(2, h, h))
            .bias_offset(Some(1));
        calls.push((one, [4, 6, 5, 0, 7], true, false));
        calls.push((one.trans_b(true).b(MatrixView::new(0, 2, h)), [4, 6, 5, 0, 7], true, false));
    }
    for (desc, lens, pass_bias, pass_c) in calls {
        let call = MatmulCall { desc, lens, pass_bias, pass_c, odd_dtype: None, seed: 7 };
        for dtype in DType::ALL {
            match matmul_call_holds(&call, dtype) {
                Ok(v) => assert_eq!(v, "Ok", "{dtype} {call:?}"),
                Err(e) => panic!("{dtype} {call:?}: {e}"),
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn matmul_into_never_panics(call in matmul_call(), dtype in prop::sample::select(DType::ALL.to_vec())) {
        matmul_call_holds(&call, dtype)?;
    }

    #[test]
    fn depthwise_conv2d_never_panics(
        input in prop::collection::vec(0usize..=6, 3..=5),
        weight in prop::collection::vec(0usize..=4, 3..=5),
        bias in prop::option::of(0usize..=8),
        stride in prop::array::uniform2(prop_oneof![4 => 1usize..=3, 1 => Just(0usize), 1 => wild()]),
        dilation in prop::array::uniform2(prop_oneof![4 => 1usize..=2, 1 => Just(0usize), 1 => wild()]),
        // Huge paddings overflow (an error); 2^31 would validate and ask for an output of
        // billions of elements, a legitimate request this test has no memory for.
        padding in prop::array::uniform4(prop_oneof![4 => 0usize..=2, 1 => Just(usize::MAX), 1 => Just(usize::MAX / 2)]),
        nhwc in any::<bool>(),
        act in prop::sample::select(Activation::ALL.to_vec()),
        dtype in prop::sample::select(DType::ALL.to_vec()),
        seed in any::<u64>(),
    ) {
        let layout = if nhwc { Layout::Nhwc } else { Layout::Nchw };
        let opts = Conv2dOptions::default().stride(stride).padding(padding).dilation(dilation).layout(layout).activation(act);
        let mut verdicts = Vec::new();
        for be in backends_for(dtype) {
            let dev = &be.device;
            let t = |shape: &[usize], s: u64| {
                let n: usize = shape.iter().product();
                dev.tensor_from_f32(shape, dtype, &Data::Uniform.fill(&mut Rng::new(s), n, dtype))
            };
            let r = (|| -> tilekit::Result<()> {
                let (x, w) = (t(&input, seed)?, t(&weight, seed + 1)?);
                let b = bias.map(|n| t(&[n], seed + 2)).transpose()?;
                dev.depthwise_conv2d(&x, &w, b.as_ref(), &opts).map(|_| ())
            })();
            verdicts.push((be.label, verdict(&r)));
        }
        let first = verdicts.first().map(|v| v.1.clone()).unwrap_or_default();
        prop_assert!(verdicts.iter().all(|v| v.1 == first), "backends disagree: {verdicts:?}");
        if first == "Ok" && input.iter().product::<usize>() > 0 {
            // It validated, so the shapes are a depthwise conv: check it against the reference.
            let [n, c, h, w] = match (layout, input.as_slice()) {
                (Layout::Nchw, &[n, c, h, w]) => [n, c, h, w],
                (Layout::Nhwc, &[n, h, w, c]) => [n, c, h, w],
                _ => return Err(TestCaseError::fail(format!("{input:?} validated as a {layout:?} input"))),
            };
            let desc = Conv2dDesc::new(layout, [n, c, h, w], [weight[2], weight[3]]).multiplier(weight[0] / c).stride_h(stride[0]).stride_w(stride[1]).pad_top(padding[0]).pad_bottom(padding[1]).pad_left(padding[2]).pad_right(padding[3]).dilation_h(dilation[0]).dilation_w(dilation[1]).has_bias(bias.is_some()).activation(act);
            // Huge paddings can validate with a tiny input; only check outputs of sane size.
            if desc.output_shape().iter().product::<usize>() <= 1 << 16 {
                run_conv(&desc, dtype, Data::Uniform, seed, false).map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn activation_never_panics(
        shape in prop::collection::vec(0usize..=6, 0..=4),
        bias in prop::option::of(0usize..=7),
        mode in 0u8..3,
        act in prop::sample::select(Activation::ALL.to_vec()),
        dtype in prop::sample::select(DType::ALL.to_vec()),
        out_shape in prop::option::of(prop::collection::vec(0usize..=6, 0..=4)),
    ) {
        let mut verdicts = Vec::new();
        for be in backends_for(dtype) {
            let dev = &be.device;
            let t = |shape: &[usize]| {
                let n: usize = shape.iter().product();
                dev.tensor_from_f32(shape, dtype, &Data::Uniform.fill(&mut Rng::new(n as u64), n, dtype))
            };
            let r = (|| -> tilekit::Result<()> {
                let x = t(&shape)?;
                let b = bias.map(|n| t(&[n])).transpose()?;
                match mode {
                    0 => dev.activation(&x, b.as_ref(), act).map(|_| ()),
                    1 => dev.activation_in_place(&x, b.as_ref(), act),
                    _ => {
                        let out = t(out_shape.as_deref().unwrap_or(&shape))?;
                        dev.activation_into(&x, b.as_ref(), act, &out)
                    }
                }
            })();
            verdicts.push((be.label, verdict(&r)));
        }
        let first = verdicts.first().map(|v| v.1.clone()).unwrap_or_default();
        prop_assert!(verdicts.iter().all(|v| v.1 == first), "backends disagree: {verdicts:?}");
    }
}
