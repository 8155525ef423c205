//! The layers a convolutional network needs besides matmul and depthwise conv, on every backend
//! and dtype against the f64 reference: `pointwise_conv2d` (NCHW and NHWC, bias, residual,
//! activation), `global_avg_pool`, `im2col` (bit-exact), im2col + pointwise as a dense conv,
//! `conv2d` (the dense conv itself: the CPU's direct kernel and the composition elsewhere), and
//! their bad inputs.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{
    Activation, Conv2dDesc, Conv2dOptions, DType, Device, Error, Im2colOptions, Layout, MatmulDesc, MatrixView,
    PointwiseOptions,
};
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

/// One dense convolution case (`Device::conv2d`).
#[derive(Debug, Clone, Copy)]
struct DenseCase {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    stride: [usize; 2],
    /// `[top, bottom, left, right]`.
    pad: [usize; 4],
    dil: [usize; 2],
    layout: Layout,
    bias: bool,
    act: Activation,
    exact: bool,
    seed: u64,
}

impl DenseCase {
    fn out_hw(&self) -> Option<(usize, usize)> {
        let span = |k: usize, d: usize| (k - 1) * d + 1;
        let (ph, pw) = (self.h + self.pad[0] + self.pad[1], self.w + self.pad[2] + self.pad[3]);
        let (eh, ew) = (span(self.k[0], self.dil[0]), span(self.k[1], self.dil[1]));
        (ph >= eh && pw >= ew).then(|| ((ph - eh) / self.stride[0] + 1, (pw - ew) / self.stride[1] + 1))
    }

    /// The convolution plus bias in f64 over NCHW-ordered `x` (`[n, cin, h, w]`) and PyTorch's
    /// weight, into NCHW order.
    fn reference(&self, x: &[f64], wt: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let (oh, ow) = self.out_hw().expect("a non-empty output");
        let desc = Conv2dDesc::new(Layout::Nchw, [self.n, self.cin, self.h, self.w], self.k)
            .stride(self.stride)
            .padding(self.pad)
            .dilation(self.dil);
        let mut out = vec![0.0; self.n * self.cout * oh * ow];
        reference::dense_conv2d(&desc, self.cout, x, wt, b, &mut out);
        out
    }
}

/// Runs a dense convolution case on every backend and dtype against the f64 reference (bit for
/// bit on integer data, else under the tolerance model with the reduction `Cin·kh·kw`), and
/// checks that `conv2d_into` writes the same bytes into an output filled with a sentinel.
/// Returns the number of backend runs.
fn run_dense(c: DenseCase) -> Result<usize, String> {
    let (oh, ow) = c.out_hw().ok_or("the case's output is empty")?;
    let [kh, kw] = c.k;
    let kk = c.cin * kh * kw;
    let (hw, ohw) = (c.h * c.w, oh * ow);
    let out_shape = shape(c.layout, c.n, c.cout, oh, ow);
    let mut ran = 0;
    for dtype in DTYPES {
        let mut rng = Rng::new(c.seed);
        let data = if c.exact { Data::Integers(2) } else { Data::Uniform };
        // `x` in NCHW order; laid out in the case's layout for the device.
        let x = data.fill(&mut rng, c.n * c.cin * hw, dtype);
        let wt = data.fill(&mut rng, c.cout * kk, dtype);
        let b = c.bias.then(|| data.fill(&mut rng, c.cout, dtype));
        let w64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let a64 = |v: &[f32]| v.iter().map(|&x| (x as f64).abs()).collect::<Vec<f64>>();
        let pre = c.reference(&w64(&x), &w64(&wt), b.as_deref().map(w64).as_deref());
        let mag = c.reference(&a64(&x), &a64(&wt), b.as_deref().map(a64).as_deref());
        // Without a kernel of its own a backend composes im2col and the pointwise conv, whose
        // NCHW form with a bias rounds the sum before adding the bias: one more rounding.
        let partial = (c.layout == Layout::Nchw && c.bias).then(|| c.reference(&a64(&x), &a64(&wt), None));
        let mut xl = vec![0.0f32; x.len()];
        for (i, &v) in x.iter().enumerate() {
            xl[index(c.layout, c.cin, hw, i / (c.cin * hw), i / hw % c.cin, i % hw)] = v;
        }
        for be in backends_for(dtype) {
            let what = format!("{} {dtype} conv2d {c:?}", be.label);
            let dev = &be.device;
            let err = |e: Error| format!("{what}: {e}");
            let xt = dev.tensor_from_f32(&shape(c.layout, c.n, c.cin, c.h, c.w), dtype, &xl).map_err(err)?;
            let wtt = dev.tensor_from_f32(&[c.cout, c.cin, kh, kw], dtype, &wt).map_err(err)?;
            let bt = b.as_deref().map(|b| dev.tensor_from_f32(&[c.cout], dtype, b)).transpose().map_err(err)?;
            let opts = Conv2dOptions::default()
                .stride(c.stride)
                .padding(c.pad)
                .dilation(c.dil)
                .layout(c.layout)
                .activation(c.act);
            let out = dev.conv2d(&xt, &wtt, bt.as_ref(), &opts).map_err(err)?;
            if out.shape() != out_shape {
                return Err(format!("{what}: shape {:?}, expected {out_shape:?}", out.shape()));
            }
            let into = dev.tensor_from_f32(&out_shape, dtype, &vec![-77.0; out_shape.iter().product()]).map_err(err)?;
            dev.conv2d_into(&xt, &wtt, bt.as_ref(), &opts, &into).map_err(err)?;
            if into.to_bytes().map_err(err)? != out.to_bytes().map_err(err)? {
                return Err(format!("{what}: conv2d_into wrote other bytes than conv2d"));
            }
            let got = out.to_f32_vec().map_err(err)?;
            for i in 0..pre.len() {
                let (img, co, p) = (i / (c.cout * ohw), i / ohw % c.cout, i % ohw);
                let g = got[index(c.layout, c.cout, ohw, img, co, p)];
                let want = c.act.apply_f64(pre[i]);
                let ok = if c.exact {
                    g == dtype.round_f32(want as f32)
                } else {
                    let extra = partial.as_ref().map_or(0.0, |p| dtype.unit_roundoff() * p[i]);
                    let bound = tolerance::bound(dtype, c.act, kk, mag[i], pre[i], want) + extra;
                    tolerance::accepts(dtype, g, want, bound)
                };
                if !ok {
                    return Err(format!("{what}: [{img},{co},{p}]: got {g:e}, expected {want:e}"));
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
    fn conv2d_matches_the_reference(
        n in 1usize..=2, cin in 1usize..=5, cout in small(), h in 1usize..=9, w in 1usize..=9,
        kh in 1usize..=3, kw in 1usize..=3, sh in 1usize..=3, sw in 1usize..=3,
        pad in prop::array::uniform4(0usize..=2), dh in 1usize..=2, dw in 1usize..=2,
        layout in layout(), bias: bool,
        act in prop::sample::select(Activation::ALL.to_vec()), exact: bool, seed: u64,
    ) {
        // Integers in [-2, 2] and at most 45 products keep every sum below 2^8 (exact in
        // bf16); GELU and SiLU are not exact on any input, so they take the tolerance model.
        // Reductions up to 32 take the CPU's kernel, larger ones the composition.
        let exact = exact && matches!(act, Activation::None | Activation::Relu | Activation::Relu6);
        let case = DenseCase {
            n, cin, cout, h, w, k: [kh, kw], stride: [sh, sw], pad, dil: [dh, dw], layout, bias, act, exact, seed,
        };
        prop_assume!(case.out_hw().is_some());
        let ran = run_dense(case).map_err(TestCaseError::fail)?;
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

/// im2col + pointwise, and `conv2d`, are the dense 3×3 stride-2 conv of MobileNetV2's stem (3 ->
/// 32 channels, PyTorch's weight `[32, 3, 3, 3]`, reshaped to `[32, 27]` for the pointwise conv),
/// against a direct f64 convolution.
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
                // And the dense conv op itself, on the weight as PyTorch stores it.
                let w4 = dev.tensor_from_f32(&[co, 3, 3, 3], dtype, &wt).unwrap();
                let copts = Conv2dOptions::default().stride([2, 2]).padding([1; 4]).layout(layout);
                let direct = dev.conv2d(&xt, &w4, None, &copts).unwrap().to_f32_vec().unwrap();
                for b in 0..n {
                    for o in 0..co {
                        for p in 0..oh * ow {
                            let i = index(layout, co, oh * ow, b, o, p);
                            let e = dtype.round_f32(want[(b * co + o) * oh * ow + p]);
                            assert_eq!(got[i], e, "{} {dtype} {}: [{b},{o},{p}]", be.label, layout.name());
                            assert_eq!(direct[i], e, "{} {dtype} {} conv2d: [{b},{o},{p}]", be.label, layout.name());
                        }
                    }
                }
            }
        }
    }
}

/// Dense convolutions large enough for the CPU kernel's row blocks and parallel split (the
/// stem at 96², a 64 × 60 stride-1 layer of 3 → 40 channels), one past its reduction bound
/// (the composition), exact on integer data in both layouts on every backend.
#[test]
fn large_conv2d_layers_are_exact() {
    let mut seed = 91;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &(cin, cout, h, w, k, s, act) in &[
            (3, 32, 96, 96, 3, 2, Activation::Relu6),
            (3, 40, 64, 60, 3, 1, Activation::None),
            (4, 24, 30, 33, 3, 1, Activation::Relu),
        ] {
            let case = DenseCase {
                n: 2,
                cin,
                cout,
                h,
                w,
                k: [k, k],
                stride: [s, s],
                pad: [1; 4],
                dil: [1, 1],
                layout,
                bias: true,
                act,
                exact: true,
                seed,
            };
            let ran = run_dense(case).unwrap();
            assert!(ran >= 3, "{ran} backend runs");
            seed += 1;
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

    let copts = Conv2dOptions::default();
    let w3 = t(&[5, 4, 3, 3]);
    expect_err("conv2d input rank", dev.conv2d(&t(&[4, 3, 3]), &w3, None, &copts), rank_err("input"));
    expect_err("conv2d weight rank", dev.conv2d(&x, &t(&[5, 36]), None, &copts), rank_err("weight"));
    expect_err("conv2d weight cin", dev.conv2d(&x, &t(&[5, 3, 3, 3]), None, &copts), shape_err("weight"));
    expect_err("conv2d no outputs", dev.conv2d(&x, &t(&[0, 4, 3, 3]), None, &copts), shape_err("weight"));
    expect_err("conv2d bias", dev.conv2d(&x, &w3, Some(&t(&[4])), &copts), shape_err("bias"));
    expect_err("conv2d window", dev.conv2d(&x, &t(&[5, 4, 4, 3]), None, &copts), |e| {
        matches!(e, Error::InvalidParameter { .. })
    });
    expect_err("conv2d stride", dev.conv2d(&x, &w3, None, &copts.stride([1, 0])), |e| {
        matches!(e, Error::InvalidParameter { .. })
    });
    expect_err("conv2d dtype", dev.conv2d(&x, &dev.zeros(&[5, 4, 3, 3], DType::F16).unwrap(), None, &copts), |e| {
        matches!(e, Error::DTypeMismatch { .. })
    });
    expect_err("conv2d device", dev.conv2d(&x, &other.zeros(&[5, 4, 3, 3], DType::F32).unwrap(), None, &copts), |e| {
        matches!(e, Error::DeviceMismatch { .. })
    });
    expect_err("conv2d out shape", dev.conv2d_into(&x, &w3, None, &copts, &t(&[2, 5, 2, 1])), shape_err("out"));
    expect_err("conv2d out alias", dev.conv2d_into(&x, &w3, None, &copts, &x.reshape(&[2, 4, 3, 3]).unwrap()), |e| {
        matches!(e, Error::Aliasing { .. } | Error::ShapeMismatch { .. })
    });
    // NHWC reads the input's last dimension as its channels: 3 here, not the weight's 4.
    expect_err("conv2d nhwc channels", dev.conv2d(&x, &w3, None, &copts.layout(Layout::Nhwc)), shape_err("weight"));
    assert_eq!(dev.conv2d(&t(&[0, 4, 3, 3]), &w3, None, &copts).unwrap().shape(), &[0, 5, 1, 1]);

    let opts = Im2colOptions::default().kernel([0, 3]);
    expect_err("im2col window", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
    expect_err("im2col rank", dev.im2col(&t(&[3, 3]), &Im2colOptions::default()), rank_err("input"));
    let opts = Im2colOptions::default().kernel([5, 5]);
    expect_err("im2col too big", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
    let opts = Im2colOptions::default().stride([0, 1]);
    expect_err("im2col stride", dev.im2col(&x, &opts), |e| matches!(e, Error::InvalidParameter { .. }));
}
