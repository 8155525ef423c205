//! The correctness check the bench runs before it times anything, in two runs of the op:
//!
//! 1. **Exact inputs** ([`Host::exact`]): small integers scaled by powers of two, on which every
//!    product and partial sum is exact in `f32`, so a correct kernel's pre-activation values
//!    are exact whatever its summation order. Outputs without a GELU must equal the exact
//!    value rounded once to the storage dtype, bit for bit (as values: +0 and −0 are equal);
//!    GELU outputs must be within the activation's own bound of `gelu(exact)` (the tolerance
//!    model with its accumulation term zero, `tilekit_kernels::tolerance`). Every output is
//!    checked, at every size. This is the check that sees one wrong index: at K = 4096 with
//!    inputs in [−1, 1] the worst-case bound is about 0.5 per output while dropping one
//!    product moves an output by about 0.25 on average, but here any change is a change.
//!    The exact matmul product comes from the `gemm` crate in `f32` (exact on these inputs, in
//!    any order), conv and activation from tilekit's naive f64 reference.
//! 2. **The timed inputs** (random in [−1, 1], [`Host::new`]): the output against the naive
//!    f64 CPU reference (`tilekit_kernels::reference`) within the tolerance model's worst-case
//!    bound (`tilekit_kernels::tolerance::bound`), so the data that is timed gives finite,
//!    sane results too. Large matmuls are checked on sampled rows here (the reference costs
//!    `N·K` per row).

use super::cases::{Case, DenseConv, conv_desc, matmul_desc};
use super::workload::{Bound, Host};
use anyhow::{Result, bail};
use serde::Serialize;
use tilekit::{Activation, ActivationDesc, DType, Device, Layout, MatrixView};
use tilekit_kernels::{reference, tolerance};

/// What the check found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub ok: bool,
    /// What was compared (e.g. "all 4096 outputs" or "8 of 1024 rows").
    pub against: String,
    pub max_abs_err: f64,
    /// The largest `error / bound` seen (≤ 1 passes).
    pub worst_err_over_bound: f64,
    /// The first failing output, if any.
    pub first_failure: Option<String>,
}

/// Above this many multiply-adds a matmul is checked on sampled rows only.
const FULL_CHECK_WORK: f64 = (1u64 << 24) as f64;
/// How many rows a sampled check looks at.
const SAMPLED_ROWS: usize = 8;

/// Compares `got` (the op's output, widened to f32) against the reference.
pub fn check(case: &Case, dtype: DType, host: &Host, got: &[f32]) -> CheckResult {
    let f64s = |i: usize| -> Vec<f64> { host.inputs[i].1.iter().map(|&v| f64::from(v)).collect() };
    let abs = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x.abs()).collect() };
    // (indices of outputs checked, pre-activation reference, magnitude, terms per sum, activation)
    let mut idx = Vec::new();
    let mut pre = Vec::new();
    let mut mag = Vec::new();
    // Per output, an error allowed beyond the tolerance model's (empty: none).
    let mut extra = Vec::new();
    let (terms, activation, against);
    match *case {
        Case::Matmul { m, n, k, bias: has_bias, activation: act, trans_b, .. } => {
            let mut desc = matmul_desc(m, n, k, has_bias, act, trans_b);
            desc.activation = Activation::None;
            let (a, b) = (f64s(0), f64s(1));
            let bias = (host.inputs.len() > 2).then(|| f64s(2));
            let (a_abs, b_abs, bias_abs) = (abs(&a), abs(&b), bias.as_deref().map(abs));
            let rows: Vec<usize> = if case.reference_work() <= FULL_CHECK_WORK || m <= SAMPLED_ROWS {
                (0..m).collect()
            } else {
                // The first and last rows (tile edges) and rows spread between them.
                let mut r: Vec<usize> = (0..SAMPLED_ROWS).map(|i| i * (m - 1) / (SAMPLED_ROWS - 1)).collect();
                r.dedup();
                r
            };
            against =
                if rows.len() == m { format!("all {} outputs", m * n) } else { format!("{} of {m} rows", rows.len()) };
            let mut row_desc = desc;
            row_desc.m = 1;
            row_desc.out = MatrixView::dense(1, n);
            let (mut p, mut q) = (vec![0.0; n], vec![0.0; n]);
            for &r in &rows {
                row_desc.a = desc.a.offset(r * k);
                reference::matmul(&row_desc, &a, &b, bias.as_deref(), None, &mut p);
                reference::matmul(&row_desc, &a_abs, &b_abs, bias_abs.as_deref(), None, &mut q);
                idx.extend((0..n).map(|j| r * n + j));
                pre.extend_from_slice(&p);
                mag.extend_from_slice(&q);
            }
            terms = k;
            activation = act;
        }
        Case::Conv { batch, channels, size, stride, layout } => {
            let mut desc = conv_desc(batch, channels, size, stride, layout);
            activation = desc.activation;
            desc.activation = Activation::None;
            let (x, w, bias) = (f64s(0), f64s(1), f64s(2));
            let len = host.out_shape.iter().product();
            pre = vec![0.0; len];
            mag = vec![0.0; len];
            reference::depthwise_conv2d(&desc, &x, &w, Some(&bias), &mut pre);
            reference::depthwise_conv2d(&desc, &abs(&x), &abs(&w), Some(&abs(&bias)), &mut mag);
            idx = (0..len).collect();
            terms = desc.kernel_h * desc.kernel_w;
            against = format!("all {len} outputs");
        }
        Case::Conv2d { .. } => {
            let Some(mut d) = case.dense_conv() else { return failed("not a dense conv case") };
            activation = d.desc.activation;
            d.desc.activation = Activation::None;
            let (x, w, bias) = (f64s(0), f64s(1), f64s(2));
            let (x_abs, w_abs) = (abs(&x), abs(&w));
            let len = host.out_shape.iter().product();
            pre = vec![0.0; len];
            mag = vec![0.0; len];
            dense_conv2d(&d, &x, &w, Some(&bias), &mut pre);
            dense_conv2d(&d, &x_abs, &w_abs, Some(&abs(&bias)), &mut mag);
            if d.desc.layout == Layout::Nchw {
                // Where a backend has no kernel of its own the op is im2col + the pointwise
                // conv, whose NCHW form stores the sum in the storage dtype before it adds
                // the bias: one more rounding of at most u·|sum| (as tests/network_ops.rs allows).
                extra = vec![0.0; len];
                dense_conv2d(&d, &x_abs, &w_abs, None, &mut extra);
                extra.iter_mut().for_each(|e| *e *= dtype.unit_roundoff());
            }
            idx = (0..len).collect();
            terms = d.reduction();
            against = format!("all {len} outputs");
        }
        Case::Activation { cols, activation: act, .. } => {
            let x = f64s(0);
            let bias = (host.inputs.len() > 1).then(|| f64s(1));
            let desc = ActivationDesc::new(x.len(), bias.as_ref().map(|_| cols), Activation::None);
            pre = vec![0.0; x.len()];
            reference::activation(&desc, &x, bias.as_deref(), &mut pre);
            mag = pre.iter().map(|v| v.abs()).collect();
            idx = (0..x.len()).collect();
            terms = 0;
            activation = act;
            against = format!("all {} outputs", x.len());
        }
    }
    compare(got, &idx, &pre, &mag, &extra, terms, activation, dtype, against)
}

/// The dense convolution of a [`Case::Conv2d`] with bias and activation, in f64
/// (`tilekit_kernels::reference::dense_conv2d`): PyTorch's weight `[Cout, Cin, kh, kw]`, the
/// input and output in the case's layout. Taps in the padding read zero.
///
/// # Panics
/// If the geometry has an empty output or a slice is too short (the bench's cases are valid).
pub fn dense_conv2d(d: &DenseConv, input: &[f64], weight: &[f64], bias: Option<&[f64]>, out: &mut [f64]) {
    reference::dense_conv2d(&d.desc, d.out_channels, input, weight, bias, out);
}

fn failed(why: &str) -> CheckResult {
    CheckResult {
        ok: false,
        against: why.into(),
        max_abs_err: f64::NAN,
        worst_err_over_bound: f64::INFINITY,
        first_failure: Some(why.into()),
    }
}

#[allow(clippy::too_many_arguments)]
fn compare(
    got: &[f32],
    idx: &[usize],
    pre: &[f64],
    mag: &[f64],
    extra: &[f64],
    terms: usize,
    activation: Activation,
    dtype: DType,
    against: String,
) -> CheckResult {
    let mut res = CheckResult { ok: true, against, max_abs_err: 0.0, worst_err_over_bound: 0.0, first_failure: None };
    for (j, ((&i, &p), &m)) in idx.iter().zip(pre).zip(mag).enumerate() {
        let want = activation.apply_f64(p);
        let Some(&g) = got.get(i) else {
            return failed("the output is shorter than expected");
        };
        let bound = tolerance::bound(dtype, activation, terms, m, p, want) + extra.get(j).copied().unwrap_or(0.0);
        // A NaN output fails (accepts wants a NaN only where the reference is NaN).
        let within = tolerance::accepts(dtype, g, want, bound);
        note(&mut res, i, g, want, bound, within);
    }
    res
}

/// Records one compared output in `res`.
fn note(res: &mut CheckResult, i: usize, got: f32, want: f64, bound: f64, within: bool) {
    let err = (f64::from(got) - want).abs();
    let err = if err.is_nan() { f64::INFINITY } else { err };
    // An accepted output counts at most 1 (an accepted f16 overflow has an infinite error), a
    // rejected one at least 1 (a bound of 0 gives infinity).
    let ratio = if err == 0.0 { 0.0 } else { err / bound };
    let ratio = if within { ratio.min(1.0) } else { ratio.max(1.0) };
    res.max_abs_err = res.max_abs_err.max(err);
    res.worst_err_over_bound = res.worst_err_over_bound.max(ratio);
    if !within {
        res.ok = false;
        if res.first_failure.is_none() {
            res.first_failure = Some(format!("output {i}: got {got}, want {want:.9e} (bound {bound:.3e})"));
        }
    }
}

/// The activation a case applies.
fn activation_of(case: &Case) -> Activation {
    match *case {
        Case::Matmul { activation, .. } | Case::Activation { activation, .. } => activation,
        Case::Conv { batch, channels, size, stride, layout } => {
            conv_desc(batch, channels, size, stride, layout).activation
        }
        Case::Conv2d { .. } => case.dense_conv().map_or(Activation::None, |d| d.desc.activation),
    }
}

/// The exact pre-activation values of `case` on [`Host::exact`]'s inputs, every output.
fn exact_pre(case: &Case, host: &Host) -> Result<Vec<f64>> {
    let f64s = |i: usize| -> Vec<f64> { host.inputs[i].1.iter().map(|&v| f64::from(v)).collect() };
    match *case {
        Case::Matmul { m, n, k, trans_b, .. } => {
            let ((_, a), (_, b)) = (&host.inputs[0], &host.inputs[1]);
            if a.len() != m * k || b.len() != k * n {
                bail!("matmul operands of the wrong length");
            }
            let mut c = vec![0.0f32; m * n];
            // B's (column, row) strides: stored [K, N] row-major, or [N, K] (`trans_b`).
            let (b_cs, b_rs) = if trans_b { (k as isize, 1) } else { (1, n as isize) };
            // SAFETY: `a` is m×k, `b` is k×n (stored k×n or n×k, strides to match) and `c` is
            // m×n, all row-major (column stride 1, row stride = columns), checked above; gemm
            // reads and writes only inside them, and `c` does not alias the inputs.
            // `read_dst = false`, so `c` is only written.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    b_cs,
                    b_rs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                );
            }
            let bias = host.inputs.get(2).map(|(_, v)| v.as_slice());
            Ok(c.iter().enumerate().map(|(i, &v)| f64::from(v) + bias.map_or(0.0, |b| f64::from(b[i % n]))).collect())
        }
        Case::Conv { batch, channels, size, stride, layout } => {
            let mut desc = conv_desc(batch, channels, size, stride, layout);
            desc.activation = Activation::None;
            let mut pre = vec![0.0; host.out_shape.iter().product()];
            reference::depthwise_conv2d(&desc, &f64s(0), &f64s(1), Some(&f64s(2)), &mut pre);
            Ok(pre)
        }
        Case::Conv2d { .. } => {
            let Some(mut d) = case.dense_conv() else { bail!("not a dense conv case") };
            d.desc.activation = Activation::None;
            let mut pre = vec![0.0; host.out_shape.iter().product()];
            dense_conv2d(&d, &f64s(0), &f64s(1), Some(&f64s(2)), &mut pre);
            Ok(pre)
        }
        Case::Activation { cols, .. } => {
            let x = f64s(0);
            let bias = (host.inputs.len() > 1).then(|| f64s(1));
            let desc = ActivationDesc::new(x.len(), bias.as_ref().map(|_| cols), Activation::None);
            let mut pre = vec![0.0; x.len()];
            reference::activation(&desc, &x, bias.as_deref(), &mut pre);
            Ok(pre)
        }
    }
}

/// Compares `got` (the op's output on [`Host::exact`]'s inputs, widened to f32) with the exact
/// result: bit for bit where the activation is exact (none, ReLU, ReLU6), within the GELU
/// formulas' own bound otherwise. Every output.
pub fn check_exact(case: &Case, dtype: DType, host: &Host, got: &[f32]) -> CheckResult {
    if !Host::exact_is_exact(case) {
        return failed("the exact inputs are not exact for this case (K too large)");
    }
    let pre = match exact_pre(case, host) {
        Ok(p) => p,
        Err(e) => return failed(&format!("{e:#}")),
    };
    if got.len() != pre.len() {
        return failed("the output has the wrong length");
    }
    let activation = activation_of(case);
    let exact_fn = matches!(activation, Activation::None | Activation::Relu | Activation::Relu6);
    let against = if exact_fn {
        format!("all {} outputs bit for bit on exact inputs", got.len())
    } else {
        format!("all {} outputs on exact inputs, within the {activation} bound", got.len())
    };
    let mut res = CheckResult { ok: true, against, max_abs_err: 0.0, worst_err_over_bound: 0.0, first_failure: None };
    for (i, (&g, &p)) in got.iter().zip(&pre).enumerate() {
        let r = activation.apply_f64(p);
        if exact_fn {
            // `p` is exact in f32 and these activations are exact functions of it: the one
            // rounding left is to the storage dtype.
            let want = dtype.round_f32(r as f32);
            note(&mut res, i, g, f64::from(want), 0.0, g == want);
        } else {
            // No accumulation error (k = 0, magnitude 0): only the epilogue and the activation.
            let bound = tolerance::bound(dtype, activation, 0, 0.0, p, r);
            note(&mut res, i, g, r, bound, tolerance::accepts(dtype, g, r, bound));
        }
    }
    res
}

/// Both halves of the check (see the module docs): the op on exact inputs (a second upload,
/// freed before timing), then `timed`, the case on the inputs that will be timed. The result
/// fails if either does.
pub fn check_case(dev: &Device, case: &Case, dtype: DType, timed: &Bound, host: &Host) -> Result<CheckResult> {
    let exact_host = Host::exact(case, dtype);
    let exact = {
        let bound = Bound::new(dev, case, dtype, &exact_host)?;
        bound.run_synced()?;
        check_exact(case, dtype, &exact_host, &bound.output()?)
    };
    timed.run_synced()?;
    let random = check(case, dtype, host, &timed.output()?);
    Ok(merge(exact, random))
}

/// One result from the exact and the timed-input check.
fn merge(exact: CheckResult, timed: CheckResult) -> CheckResult {
    CheckResult {
        ok: exact.ok && timed.ok,
        against: format!("{}; timed inputs: {}", exact.against, timed.against),
        max_abs_err: timed.max_abs_err.max(exact.max_abs_err),
        worst_err_over_bound: timed.worst_err_over_bound.max(exact.worst_err_over_bound),
        first_failure: exact
            .first_failure
            .map(|f| format!("exact inputs: {f}"))
            .or(timed.first_failure.map(|f| format!("timed inputs: {f}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check passes the reference's own values rounded to f32 and fails a perturbed one.
    #[test]
    fn accepts_correct_and_rejects_wrong_outputs() {
        for (case, dtype) in [
            (
                Case::Matmul {
                    m: 9,
                    n: 7,
                    k: 33,
                    bias: true,
                    activation: Activation::Gelu,
                    trans_b: false,
                    packed: false,
                },
                DType::F32,
            ),
            (Case::Conv { batch: 1, channels: 3, size: 6, stride: 2, layout: Layout::Nhwc }, DType::Bf16),
            (
                Case::Conv2d { batch: 1, in_channels: 3, out_channels: 5, size: 7, stride: 2, layout: Layout::Nchw },
                DType::F32,
            ),
            (
                Case::Conv2d { batch: 2, in_channels: 3, out_channels: 4, size: 6, stride: 1, layout: Layout::Nhwc },
                DType::Bf16,
            ),
            // 45 terms: beyond the CPU's dense kernel, so im2col + the pointwise conv.
            (
                Case::Conv2d { batch: 1, in_channels: 5, out_channels: 4, size: 6, stride: 2, layout: Layout::Nchw },
                DType::Bf16,
            ),
            (Case::Activation { rows: 3, cols: 5, bias: true, activation: Activation::GeluTanh }, DType::F16),
        ] {
            let host = Host::new(&case, dtype);
            // The CPU backend's output is a correct one.
            let dev = tilekit::Device::cpu();
            let bound = Bound::new(&dev, &case, dtype, &host).expect("upload");
            bound.run_synced().expect("run");
            let mut out = bound.output().expect("download");
            let r = check(&case, dtype, &host, &out);
            assert!(r.ok, "{case:?}: {r:?}");
            out[2] += 0.25;
            assert!(!check(&case, dtype, &host, &out).ok, "{case:?} perturbed");
            out[2] = f32::NAN;
            assert!(!check(&case, dtype, &host, &out).ok, "{case:?} NaN");
        }
    }

    /// The CPU backend's output on the exact inputs passes the exact check, for every kind of
    /// case and dtype; one output moved by one step of the exact grid fails it.
    #[test]
    fn exact_check_accepts_correct_outputs_and_rejects_one_step_off() {
        for (case, dtype) in [
            (
                Case::Matmul {
                    m: 9,
                    n: 7,
                    k: 33,
                    bias: true,
                    activation: Activation::Gelu,
                    trans_b: false,
                    packed: false,
                },
                DType::F32,
            ),
            (
                Case::Matmul {
                    m: 5,
                    n: 6,
                    k: 300,
                    bias: true,
                    activation: Activation::None,
                    trans_b: true,
                    packed: false,
                },
                DType::F16,
            ),
            (
                Case::Matmul {
                    m: 17,
                    n: 4,
                    k: 64,
                    bias: false,
                    activation: Activation::None,
                    trans_b: false,
                    packed: false,
                },
                DType::Bf16,
            ),
            (
                Case::Matmul {
                    m: 20,
                    n: 37,
                    k: 300,
                    bias: true,
                    activation: Activation::Relu,
                    trans_b: false,
                    packed: true,
                },
                DType::F32,
            ),
            (Case::Conv { batch: 1, channels: 3, size: 6, stride: 2, layout: Layout::Nhwc }, DType::Bf16),
            (Case::Conv { batch: 2, channels: 4, size: 5, stride: 1, layout: Layout::Nchw }, DType::F16),
            (
                Case::Conv2d { batch: 1, in_channels: 3, out_channels: 32, size: 9, stride: 2, layout: Layout::Nhwc },
                DType::F32,
            ),
            (
                Case::Conv2d { batch: 2, in_channels: 3, out_channels: 5, size: 6, stride: 1, layout: Layout::Nchw },
                DType::Bf16,
            ),
            (
                Case::Conv2d { batch: 1, in_channels: 2, out_channels: 7, size: 5, stride: 2, layout: Layout::Nchw },
                DType::F16,
            ),
            // 63 terms: beyond the CPU's dense kernel, so im2col + the pointwise conv (on wgpu
            // its NCHW form stores the sum before it adds the bias: exact on these inputs, in
            // bf16 as well; see `Host::exact`).
            (
                Case::Conv2d { batch: 2, in_channels: 7, out_channels: 6, size: 7, stride: 1, layout: Layout::Nchw },
                DType::Bf16,
            ),
            (
                Case::Conv2d { batch: 1, in_channels: 7, out_channels: 9, size: 8, stride: 2, layout: Layout::Nhwc },
                DType::Bf16,
            ),
            (Case::Activation { rows: 3, cols: 5, bias: true, activation: Activation::GeluTanh }, DType::F16),
            (Case::Activation { rows: 4, cols: 8, bias: false, activation: Activation::Gelu }, DType::F32),
        ] {
            let host = Host::exact(&case, dtype);
            let mut out = cpu_output(&case, dtype, &host);
            let r = check_exact(&case, dtype, &host, &out);
            assert!(r.ok, "{case:?} {dtype}: {r:?}");
            // The smallest move of a result that is not rounded away: one step of the grid at
            // an output small enough to hold it in every dtype (plus one to stay off ReLU6's
            // flat parts).
            let i = out.iter().position(|v| v.abs() < 1.0).expect("a small output");
            out[i] += 1.0 / 64.0;
            assert!(!check_exact(&case, dtype, &host, &out).ok, "{case:?} {dtype}: one step off passed");
        }
    }

    /// The dense conv reference by hand: on a 1×1 image only the filter's centre tap meets
    /// the input, so each output is `relu6(Σ_c x[c]·w[o, c, 1, 1] + b[o])`; and on a larger
    /// image both layouts give the same values, each in its own order.
    #[test]
    fn dense_conv_reference_by_hand_and_across_layouts() {
        let d = DenseConv::new(1, 2, 3, 1, 1, Layout::Nchw);
        let x = [1.5, -2.0];
        // w[o, c, ky, kx] = 100 off the centre, so a wrong tap shows.
        let mut w = vec![100.0; 3 * 2 * 9];
        for (o, c, v) in [(0, 0, 1.0), (0, 1, 0.5), (1, 0, -1.0), (1, 1, 0.25), (2, 0, 4.0), (2, 1, -0.5)] {
            w[(o * 2 + c) * 9 + 4] = v;
        }
        let mut out = [0.0; 3];
        dense_conv2d(&d, &x, &w, Some(&[0.25, 0.0, 1.0]), &mut out);
        // 1.5 - 1 + 0.25; -1.5 - 0.5 (ReLU6: 0); 6 + 1 + 1 (ReLU6: 6).
        assert_eq!(out, [0.75, 0.0, 6.0]);

        let (n, cin, cout, size, stride) = (2, 3, 4, 5, 2);
        let nchw = DenseConv::new(n, cin, cout, size, stride, Layout::Nchw);
        let nhwc = DenseConv::new(n, cin, cout, size, stride, Layout::Nhwc);
        let o = nchw.desc.out_h().expect("an output");
        let x: Vec<f64> = (0..n * cin * size * size).map(|i| ((i * 7 % 11) as f64 - 5.0) / 8.0).collect();
        let w: Vec<f64> = (0..cout * cin * 9).map(|i| ((i * 5 % 9) as f64 - 4.0) / 4.0).collect();
        let b = [0.5, -0.25, 0.0, 1.0];
        // `x` in NHWC order.
        let mut x_nhwc = vec![0.0; x.len()];
        for (i, &v) in x.iter().enumerate() {
            let (img, c, p) = (i / (cin * size * size), i / (size * size) % cin, i % (size * size));
            x_nhwc[(img * size * size + p) * cin + c] = v;
        }
        let (mut a, mut h) = (vec![0.0; n * cout * o * o], vec![0.0; n * cout * o * o]);
        dense_conv2d(&nchw, &x, &w, Some(&b), &mut a);
        dense_conv2d(&nhwc, &x_nhwc, &w, Some(&b), &mut h);
        for (i, &v) in a.iter().enumerate() {
            let (img, c, p) = (i / (cout * o * o), i / (o * o) % cout, i % (o * o));
            assert_eq!(h[(img * o * o + p) * cout + c], v, "output {i}");
        }
        assert!(a.iter().any(|&v| v > 0.0 && v < 6.0), "some outputs off ReLU6's flat parts");
    }

    /// An NCHW dense conv allows the composition's one more rounding (the sum stored in the
    /// dtype before the bias is added): an output that far off passes in NCHW, not in NHWC.
    #[test]
    fn nchw_dense_conv_allows_the_stored_sum_rounding() {
        let dtype = DType::Bf16;
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let case = Case::Conv2d { batch: 1, in_channels: 3, out_channels: 4, size: 6, stride: 1, layout };
            let host = Host::new(&case, dtype);
            let mut out = cpu_output(&case, dtype, &host);
            assert!(check(&case, dtype, &host, &out).ok, "{layout:?}");
            let mut d = case.dense_conv().expect("a dense conv");
            d.desc.activation = Activation::None;
            let f64s = |i: usize, abs: bool| -> Vec<f64> {
                host.inputs[i].1.iter().map(|&v| if abs { f64::from(v).abs() } else { f64::from(v) }).collect()
            };
            let len = out.len();
            let (mut pre, mut mag, mut sum) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
            dense_conv2d(&d, &f64s(0, false), &f64s(1, false), Some(&f64s(2, false)), &mut pre);
            dense_conv2d(&d, &f64s(0, true), &f64s(1, true), Some(&f64s(2, true)), &mut mag);
            dense_conv2d(&d, &f64s(0, true), &f64s(1, true), None, &mut sum);
            // An output off ReLU6's flat parts whose stored sum's rounding is the larger term.
            let (i, want, base, extra) = (0..len)
                .filter_map(|i| {
                    let want = Activation::Relu6.apply_f64(pre[i]);
                    let base = tolerance::bound(dtype, Activation::Relu6, d.reduction(), mag[i], pre[i], want);
                    let extra = dtype.unit_roundoff() * sum[i];
                    (want > 0.5 && want < 5.5 && extra > 2.0 * base).then_some((i, want, base, extra))
                })
                .next()
                .expect("an output whose stored sum is large");
            out[i] = (want + base + extra / 2.0) as f32;
            let r = check(&case, dtype, &host, &out);
            assert_eq!(r.ok, layout == Layout::Nchw, "{layout:?}: {r:?}");
        }
    }

    fn cpu_output(case: &Case, dtype: DType, host: &Host) -> Vec<f32> {
        let dev = tilekit::Device::cpu();
        let bound = Bound::new(&dev, case, dtype, host).expect("upload");
        bound.run_synced().expect("run");
        bound.output().expect("download")
    }

    /// The issue the exact check exists for: at the bench's sizes one wrong index — one product
    /// dropped from one output, or one step of K reading the next row of B — fails the check,
    /// at 1×4096×4096 and 1024³. On the random inputs in [−1, 1] the worst-case bound of an
    /// output at K = 4096 is wider than the average product (1/4), so there it cannot.
    #[test]
    fn one_wrong_index_fails_the_check_at_bench_sizes() {
        let random = Host::new(
            &Case::Matmul {
                m: 1,
                n: 4096,
                k: 4096,
                bias: false,
                activation: Activation::None,
                trans_b: false,
                packed: false,
            },
            DType::F32,
        );
        let (a, b) = (&random.inputs[0].1, &random.inputs[1].1);
        let s: f64 = (0..4096).map(|p| f64::from(a[p].abs()) * f64::from(b[p * 4096].abs())).sum();
        let p: f64 = (0..4096).map(|p| f64::from(a[p]) * f64::from(b[p * 4096])).sum();
        let wide = tolerance::bound(DType::F32, Activation::None, 4096, s, p, p);
        assert!(wide > 0.25, "the worst-case bound at K = 4096 is {wide}");

        for (m, n, k) in [(1, 4096, 4096), (1024, 1024, 1024)] {
            let case =
                Case::Matmul { m, n, k, bias: false, activation: Activation::None, trans_b: false, packed: false };
            let host = Host::exact(&case, DType::F32);
            let (a, b) = (&host.inputs[0].1, &host.inputs[1].1);
            let good = cpu_output(&case, DType::F32, &host);
            let r = check_exact(&case, DType::F32, &host, &good);
            assert!(r.ok, "{m}x{n}x{k}: the correct output fails: {r:?}");

            // One product missing from one output (the middle one).
            let (i, j) = (m / 2, n / 2);
            let p = (0..k).find(|&p| a[i * k + p] * b[p * n + j] != 0.0).expect("a non-zero product");
            let mut dropped = good.clone();
            dropped[i * n + j] -= a[i * k + p] * b[p * n + j];
            let r = check_exact(&case, DType::F32, &host, &dropped);
            assert!(!r.ok, "{m}x{n}x{k}: a dropped product passed");
            assert!(r.first_failure.as_deref().is_some_and(|f| f.contains(&format!("output {}", i * n + j))), "{r:?}");

            // An off-by-one in K: one step `p` reads B's row `p + 1` (mod K) instead of row `p`
            // (the last step where row 0 of A is non-zero, so the fault is visible in row 0).
            let p = (0..k).rev().find(|&p| a[p] != 0.0).expect("a non-zero element in A's row 0");
            let q = (p + 1) % k;
            let mut shifted = good.clone();
            for i in 0..m {
                for j in 0..n {
                    shifted[i * n + j] += a[i * k + p] * (b[q * n + j] - b[p * n + j]);
                }
            }
            assert!(shifted != good, "the injected fault changes the output");
            assert!(!check_exact(&case, DType::F32, &host, &shifted).ok, "{m}x{n}x{k}: an off-by-one passed");
        }
    }

    #[test]
    fn every_bench_case_has_exact_inputs() {
        for quick in [true, false] {
            for gpu in [true, false] {
                for e in super::super::cases::entries(super::super::cases::Scale { quick, gpu }) {
                    assert!(Host::exact_is_exact(&e.case), "{:?}", e.case);
                }
            }
        }
    }
}
