//! The layers a convolutional network needs besides matmul and depthwise conv, on every backend
//! and dtype against the f64 reference: `pointwise_conv2d` (NCHW and NHWC, bias, residual,
//! activation), `global_avg_pool`, `im2col` (bit-exact), im2col + pointwise as a dense conv, and
//! their bad inputs.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{Activation, DType, Device, Error, Im2colOptions, Layout, MatmulDesc, MatrixView, PointwiseOptions};
use tilekit_kernels::reference;
use tilekit_tests::{Data, Rng, backends_for, tolerance};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 32, failure_persistence: None, ..ProptestConfig::default() }
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// Index of `(n, c, p)` (`p` the pixel `y·W + x`) in a dense tensor of `layout`.
fn index(layout: Layout, c_count: usize, hw: usize, n: usize, c: usize, p: usize) -> usize {
    match layout {
        Layout::Nchw => (n * c_count + c) * hw + p,
        Layout::Nhwc => (n * hw + p) * c_count + c,
        other => unimplemented!("{other:?}"),
    }
}

fn shape(layout: Layout, n: usize, c: usize, h: usize, w: usize) -> Vec<usize> {
    match layout {
        Layout::Nchw => vec![n, c, h, w],
        Layout::Nhwc => vec![n, h, w, c],
        other => unimplemented!("{other:?}"),
    }
}

#[derive(Debug, Clone, Copy)]
struct PwCase {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    layout: Layout,
    bias: bool,
    residual: bool,
    act: Activation,
    exact: bool,
    seed: u64,
}

/// `W·x + bias + residual` before the activation, and the same with every term made positive,
/// through `reference::matmul` (per image `W [Cout, Cin] · x [Cin, HW]` in NCHW, the weight
/// broadcast; `x [N·HW, Cin] · Wᵀ` in NHWC), the bias added per channel.
fn pointwise_reference(c: &PwCase, x: &[f64], wt: &[f64], b: Option<&[f64]>, r: Option<&[f64]>) -> Vec<f64> {
    let hw = c.h * c.w;
    let mut out = vec![0.0; c.n * c.cout * hw];
    match c.layout {
        Layout::Nchw => {
            let per = MatrixView::dense(c.cout, hw);
            let desc = MatmulDesc::new(c.cout, hw, c.cin)
                .batch(c.n)
                .a(MatrixView::new(0, c.cin, 0))
                .b(MatrixView::dense(c.cin, hw))
                .c(r.map(|_| per))
                .out(per)
                .beta(1.0);
            reference::matmul(&desc, wt, x, None, r, &mut out);
            if let Some(b) = b {
                for (i, v) in out.iter_mut().enumerate() {
                    *v += b[(i / hw) % c.cout];
                }
            }
        }
        Layout::Nhwc => {
            let m = c.n * hw;
            let desc = MatmulDesc::new(m, c.cout, c.cin)
                .trans_b(true)
                .b(MatrixView::dense(c.cout, c.cin))
                .c(r.map(|_| MatrixView::dense(m, c.cout)))
                .bias_offset(b.map(|_| 0))
                .beta(1.0);
            reference::matmul(&desc, x, wt, b, r, &mut out);
        }
        other => unimplemented!("{other:?}"),
    }
    out
}

fn run_pointwise(c: PwCase) -> Result<usize, String> {
    let mut ran = 0;
    let hw = c.h * c.w;
    let in_shape = shape(c.layout, c.n, c.cin, c.h, c.w);
    let out_shape = shape(c.layout, c.n, c.cout, c.h, c.w);
    let out_len = c.n * c.cout * hw;
    for dtype in DTYPES {
        let mut rng = Rng::new(c.seed);
        let data = if c.exact { Data::Integers(2) } else { Data::Uniform };
        let x = data.fill(&mut rng, c.n * c.cin * hw, dtype);
        let wt = data.fill(&mut rng, c.cout * c.cin, dtype);
        let b = c.bias.then(|| data.fill(&mut rng, c.cout, dtype));
        let r = c.residual.then(|| data.fill(&mut rng, out_len, dtype));
        let w64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let a64 = |v: &[f32]| v.iter().map(|&x| (x as f64).abs()).collect::<Vec<f64>>();
        let (b64, r64) = (b.as_deref().map(w64), r.as_deref().map(w64));
        let pre = pointwise_reference(&c, &w64(&x), &w64(&wt), b64.as_deref(), r64.as_deref());
        let (ba, ra) = (b.as_deref().map(a64), r.as_deref().map(a64));
        let mag = pointwise_reference(&c, &a64(&x), &a64(&wt), ba.as_deref(), ra.as_deref());
        // NCHW with a bias rounds `W·x + residual` to the dtype before the bias pass: one more
        // rounding of that partial sum (at most its magnitude times u(dtype)).
        let partial = (c.layout == Layout::Nchw && c.bias).then(|| {
            let mut nb = c;
            nb.bias = false;
            pointwise_reference(&nb, &a64(&x), &a64(&wt), None, ra.as_deref())
        });
        for be in backends_for(dtype) {
            let what = format!("{} {dtype} pointwise_conv2d {c:?}", be.label);
            let dev = &be.device;
            let err = |e: Error| format!("{what}: {e}");
            let xt = dev.tensor_from_f32(&in_shape, dtype, &x).map_err(err)?;
            let wshape = if c.seed.is_multiple_of(2) { vec![c.cout, c.cin, 1, 1] } else { vec![c.cout, c.cin] };
            let wtt = dev.tensor_from_f32(&wshape, dtype, &wt).map_err(err)?;
            let bt = b.as_deref().map(|b| dev.tensor_from_f32(&[c.cout], dtype, b)).transpose().map_err(err)?;
            let rt = r.as_deref().map(|r| dev.tensor_from_f32(&out_shape, dtype, r)).transpose().map_err(err)?;
            let opts = PointwiseOptions::default().layout(c.layout).activation(c.act).residual(rt.as_ref());
            let out = dev.pointwise_conv2d(&xt, &wtt, bt.as_ref(), &opts).map_err(err)?;
            if out.shape() != out_shape {
                return Err(format!("{what}: shape {:?}, expected {out_shape:?}", out.shape()));
            }
            let got = out.to_f32_vec().map_err(err)?;
            for i in 0..out_len {
                let want = c.act.apply_f64(pre[i]);
                let ok = if c.exact {
                    got[i] == dtype.round_f32(want as f32)
                } else {
                    let extra = partial.as_ref().map_or(0.0, |p| dtype.unit_roundoff() * p[i]);
                    let bound = tolerance::bound(dtype, c.act, c.cin, mag[i], pre[i], want) + extra;
                    tolerance::accepts(dtype, got[i], want, bound)
                };
                if !ok {
                    return Err(format!("{what}: element {i}: got {:e}, expected {want:e}", got[i]));
                }
            }
            ran += 1;
        }
    }
    Ok(ran)
}

fn small() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=8, 1 => prop::sample::select(vec![13usize, 16, 17, 31, 33])]
}

fn layout() -> impl Strategy<Value = Layout> {
    prop::sample::select(vec![Layout::Nchw, Layout::Nhwc])
}

proptest! {
    // Each case runs 3 dtypes on every backend (lavapipe twice in CI): a few minutes at 24 cases,
    // so 12 here; the exact-integer and tolerance halves still both get cases.
    #![proptest_config(config(12))]
    #[test]
    fn pointwise_conv2d_matches_the_reference(
        n in 1usize..=3, cin in small(), cout in small(), h in 1usize..=7, w in 1usize..=7,
        layout in layout(), bias: bool, residual: bool,
        act in prop::sample::select(Activation::ALL.to_vec()), exact: bool, seed: u64,
    ) {
        // Integer inputs in [-2, 2] with at most 16 input channels keep every sum below 2^8:
        // exact in bf16 too, so every backend must match bit for bit.
        // GELU is not exact in f32 on any input, so those cases use the tolerance model.
        let exact = exact && matches!(act, Activation::None | Activation::Relu | Activation::Relu6);
        let cin = if exact { cin.min(16) } else { cin };
        let case = PwCase { n, cin, cout, h, w, layout, bias, residual, act, exact, seed };
        let ran = run_pointwise(case).map_err(TestCaseError::fail)?;
        prop_assert!(ran >= 3);
    }

    #[test]
    fn global_avg_pool_matches_the_reference(
        n in 1usize..=3, c in small(), h in 1usize..=9, w in 1usize..=9, layout in layout(), seed: u64,
    ) {
        let hw = h * w;
        for dtype in DTYPES {
            let x = Data::Uniform.fill(&mut Rng::new(seed), n * c * hw, dtype);
            for be in backends_for(dtype) {
                let what = format!("{} {dtype} global_avg_pool {n}x{c}x{h}x{w} {}", be.label, layout.name());
                let xt = be.device.tensor_from_f32(&shape(layout, n, c, h, w), dtype, &x).unwrap();
                let out = be.device.global_avg_pool(&xt, layout).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                prop_assert_eq!(out.shape(), &[n, c][..], "{}", what);
                let got = out.to_f32_vec().unwrap();
                for b in 0..n {
                    for ch in 0..c {
                        let vals = (0..hw).map(|p| x[index(layout, c, hw, b, ch, p)] as f64);
                        let want = vals.clone().sum::<f64>() / hw as f64;
                        let mag = vals.map(f64::abs).sum::<f64>() / hw as f64;
                        // The scale 1/(H·W) is rounded to f32 once: a relative error of 2^-24.
                        let bound = tolerance::bound(dtype, Activation::None, hw, mag, want, want) + mag * 2f64.powi(-24);
                        let g = got[b * c + ch];
                        prop_assert!(tolerance::accepts(dtype, g, want, bound), "{}: [{},{}] got {} expected {}", what, b, ch, g, want);
                    }
                }
            }
        }
    }

    #[test]
    fn im2col_is_exact(
        n in 1usize..=2, c in 1usize..=5, h in 1usize..=9, w in 1usize..=9, kh in 1usize..=3, kw in 1usize..=3,
        stride in 1usize..=3, pad in 0usize..=2, dil in 1usize..=2, layout in layout(), seed: u64,
    ) {
        let (eh, ew) = ((kh - 1) * dil + 1, (kw - 1) * dil + 1);
        prop_assume!(h + 2 * pad >= eh && w + 2 * pad >= ew);
        let (oh, ow) = ((h + 2 * pad - eh) / stride + 1, (w + 2 * pad - ew) / stride + 1);
        let taps = kh * kw;
        for dtype in DTYPES {
            let x = Data::Uniform.fill(&mut Rng::new(seed), n * c * h * w, dtype);
            for be in backends_for(dtype) {
                let what = format!("{} {dtype} im2col {n}x{c}x{h}x{w} k{kh}x{kw} s{stride} p{pad} d{dil} {}", be.label, layout.name());
                let xt = be.device.tensor_from_f32(&shape(layout, n, c, h, w), dtype, &x).unwrap();
                let opts = Im2colOptions::default().kernel([kh, kw]).stride([stride; 2]).padding([pad; 4]).dilation([dil; 2]).layout(layout);
                let out = be.device.im2col(&xt, &opts).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                prop_assert_eq!(out.shape(), &shape(layout, n, c * taps, oh, ow)[..], "{}", what);
                let got = out.to_f32_vec().unwrap();
                for b in 0..n {
                    for ch in 0..c {
                        for (i, j) in (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j))) {
                            for (oy, ox) in (0..oh).flat_map(|y| (0..ow).map(move |x| (y, x))) {
                                let (py, px) = (oy * stride + i * dil, ox * stride + j * dil);
                                let inside = py >= pad && px >= pad && py - pad < h && px - pad < w;
                                let want = if inside { x[index(layout, c, h * w, b, ch, (py - pad) * w + px - pad)] } else { 0.0 };
                                let k = index(layout, c * taps, oh * ow, b, ch * taps + i * kw + j, oy * ow + ox);
                                prop_assert!(got[k] == want, "{}: tap ({},{}) of channel {} at ({},{}): got {} expected {}", what, i, j, ch, oy, ox, got[k], want);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Pointwise layers large enough for the CPU's one-pass kernel in both layouts (NHWC takes it
/// from 512 pixels, or below 64 pixels per thread with enough work to split its output
/// channels; the proptest's images are smaller) and for its parallel splits (pixel blocks,
/// output-channel ranges): exact on integer data with bias, residual and each exact
/// activation, on every backend.
#[test]
fn large_pointwise_layers_are_exact() {
    let mut seed = 77;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        // The last two take the CPU kernel's output-channel ranges: few pixels per thread,
        // and (NCHW) many output channels.
        for &(n, cin, cout, h, w) in
            &[(2, 16, 24, 24, 23), (1, 9, 40, 37, 30), (1, 160, 300, 7, 7), (1, 24, 200, 20, 19)]
        {
            for act in [Activation::None, Activation::Relu6, Activation::Relu] {
                let case =
                    PwCase { n, cin, cout, h, w, layout, bias: true, residual: seed % 2 == 0, act, exact: true, seed };
                let ran = run_pointwise(case).unwrap();
                assert!(ran >= 3, "{ran} backend runs");
                seed += 1;
            }
        }
    }
}

/// im2col + pointwise is the dense 3×3 stride-2 conv of MobileNetV2's stem (3 -> 32 channels,
/// PyTorch's weight `[32, 3, 3, 3]` reshaped to `[32, 27]`), against a direct f64 convolution.
#[test]
fn im2col_then_pointwise_is_the_stem_convolution() {
    let (n, h, w, co) = (2, 11, 9, 32);
    let (oh, ow) = ((h - 1) / 2 + 1, (w - 1) / 2 + 1);
    let mut rng = Rng::new(5);
    let x = Data::Integers(3).fill(&mut rng, n * 3 * h * w, DType::F32);
    let wt = Data::Integers(2).fill(&mut rng, co * 27, DType::F32);
    let mut want = vec![0.0f32; n * co * oh * ow];
    for b in 0..n {
        for o in 0..co {
            for (oy, ox) in (0..oh).flat_map(|y| (0..ow).map(move |x| (y, x))) {
                let mut acc = 0.0f64;
                for (ci, i, j) in (0..3).flat_map(|c| (0..9).map(move |t| (c, t / 3, t % 3))) {
                    let (py, px) = ((oy * 2 + i) as isize - 1, (ox * 2 + j) as isize - 1);
                    if py >= 0 && px >= 0 && (py as usize) < h && (px as usize) < w {
                        let v = x[((b * 3 + ci) * h + py as usize) * w + px as usize] as f64;
                        acc += v * wt[((o * 3 + ci) * 3 + i) * 3 + j] as f64;
                    }
                }
                want[((b * co + o) * oh + oy) * ow + ox] = acc as f32;
            }
        }
    }
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for dtype in DTYPES {
            for be in backends_for(dtype) {
                let dev = &be.device;
                let mut xl = vec![0.0f32; x.len()];
                for (i, &v) in x.iter().enumerate() {
                    let (b, c, p) = (i / (3 * h * w), i / (h * w) % 3, i % (h * w));
                    xl[index(layout, 3, h * w, b, c, p)] = v;
                }
                let xt = dev.tensor_from_f32(&shape(layout, n, 3, h, w), dtype, &xl).unwrap();
                let opts = Im2colOptions::default().stride([2, 2]).padding([1; 4]).layout(layout);
                let patches = dev.im2col(&xt, &opts).unwrap();
                let wtt = dev.tensor_from_f32(&[co, 27], dtype, &wt).unwrap();
                let pw = PointwiseOptions::default().layout(layout);
                let got = dev.pointwise_conv2d(&patches, &wtt, None, &pw).unwrap().to_f32_vec().unwrap();
                for b in 0..n {
                    for o in 0..co {
                        for p in 0..oh * ow {
                            let (g, e) = (got[index(layout, co, oh * ow, b, o, p)], want[(b * co + o) * oh * ow + p]);
                            assert_eq!(g, dtype.round_f32(e), "{} {dtype} {}: [{b},{o},{p}]", be.label, layout.name());
                        }
                    }
                }
            }
        }
    }
}

fn expect_err(what: &str, r: Result<impl std::fmt::Debug, Error>, want: impl Fn(&Error) -> bool) {
    match r {
        Err(e) if want(&e) => {}
        other => panic!("{what}: got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let dev = Device::cpu();
    let other = Device::cpu();
    let t = |s: &[usize]| dev.zeros(s, DType::F32).unwrap();
    let x = t(&[2, 4, 3, 3]);
    let w = t(&[5, 4, 1, 1]);
    let nchw = PointwiseOptions::default();
    let shape_err =
        |tensor: &'static str| move |e: &Error| matches!(e, Error::ShapeMismatch { tensor: t, .. } if *t == tensor);
    let rank_err =
        |tensor: &'static str| move |e: &Error| matches!(e, Error::WrongRank { tensor: t, .. } if *t == tensor);
    expect_err("input rank", dev.pointwise_conv2d(&t(&[4, 3, 3]), &w, None, &nchw), rank_err("input"));
    expect_err("weight cin", dev.pointwise_conv2d(&x, &t(&[5, 3, 1, 1]), None, &nchw), shape_err("weight"));
    expect_err("weight 3x3", dev.pointwise_conv2d(&x, &t(&[5, 4, 3, 3]), None, &nchw), shape_err("weight"));
    expect_err("weight 2-D cin", dev.pointwise_conv2d(&x, &t(&[5, 3]), None, &nchw), shape_err("weight"));
    expect_err("weight rank", dev.pointwise_conv2d(&x, &t(&[5, 4, 1]), None, &nchw), rank_err("weight"));
    expect_err("bias", dev.pointwise_conv2d(&x, &w, Some(&t(&[4])), &nchw), shape_err("bias"));
    let bad_res = t(&[2, 5, 3, 4]);
    let opts = nchw.residual(Some(&bad_res));
    expect_err("residual", dev.pointwise_conv2d(&x, &w, None, &opts), shape_err("residual"));
    let half = dev.zeros(&[5, 4, 1, 1], DType::F16).unwrap();
    expect_err("dtype", dev.pointwise_conv2d(&x, &half, None, &nchw), |e| matches!(e, Error::DTypeMismatch { .. }));
    let foreign = other.zeros(&[5, 4, 1, 1], DType::F32).unwrap();
    expect_err("device", dev.pointwise_conv2d(&x, &foreign, None, &nchw), |e| {
        matches!(e, Error::DeviceMismatch { .. })
    });
    let out = t(&[2, 5, 3, 3]);
    let res = t(&[2, 5, 3, 3]);
    let opts = nchw.residual(Some(&out));
    expect_err("alias", dev.pointwise_conv2d_into(&x, &w, None, &opts, &out), |e| matches!(e, Error::Aliasing { .. }));
    let opts = nchw.residual(Some(&res));
    expect_err("out shape", dev.pointwise_conv2d_into(&x, &w, None, &opts, &t(&[2, 5, 3, 2])), shape_err("out"));
    // The layout is honoured: an NHWC reading of the same tensor has 3 input channels.
    let nhwc = nchw.layout(Layout::Nhwc);
    expect_err("nhwc channels", dev.pointwise_conv2d(&x, &w, None, &nhwc), shape_err("weight"));
    // Empty outputs are not errors.
    assert_eq!(dev.pointwise_conv2d(&t(&[0, 4, 3, 3]), &w, None, &nchw).unwrap().shape(), &[0, 5, 3, 3]);

    expect_err("pool rank", dev.global_avg_pool(&t(&[2, 3]), Layout::Nchw), rank_err("input"));
    expect_err("pool empty plane", dev.global_avg_pool(&t(&[1, 2, 0, 3]), Layout::Nchw), |e| {
        matches!(e, Error::InvalidParameter { .. })
    });
    expect_err("pool out", dev.global_avg_pool_into(&x, Layout::Nchw, &t(&[2, 3])), shape_err("out"));
    expect_err("pool alias", dev.global_avg_pool_into(&x, Layout::Nchw, &x.reshape(&[2, 36]).unwrap()), |e| {
        matches!(e, Error::ShapeMismatch { .. } | Error::Aliasing { .. })
    });

    let opts = Im2colOptions::default().kernel([0, 3]);
    expect_err("im2col window", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
    expect_err("im2col rank", dev.im2col(&t(&[3, 3]), &Im2colOptions::default()), rank_err("input"));
    let opts = Im2colOptions::default().kernel([5, 5]);
    expect_err("im2col too big", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
    let opts = Im2colOptions::default().stride([0, 1]);
    expect_err("im2col stride", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
}
