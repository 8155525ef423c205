//! The correctness check the bench runs before it times anything: the op's output against
//! tilekit's naive f64 CPU reference (`tilekit_kernels::reference`).
//!
//! Large matmuls are checked on sampled rows (the reference costs `N·K` per row, the whole
//! product `M·N·K`), every other case on every output.
//!
//! The bound per output is the tolerance model of the test suite (`tests/src/tolerance.rs`,
//! which explains each term), restated here so the bench does not depend on the test package:
//!
//! ```text
//! e_pre = 4·2⁻²⁴·|p| + 2·(K + 2)·2⁻²⁴·S        S = Σ|terms| (the magnitude of the sum)
//! e_act = L(act)·e_pre + 2⁻²⁴·|r| + gelu_error_bound(p, r)   (L = 1.13 for GELU, else 1)
//! bound = atol(dtype) + e_act + u(dtype)·(|r| + e_act)
//! ```
//!
//! It is a worst-case bound: a wrong index or a missed tile edge is off by far more.

use super::cases::{Case, conv_desc, matmul_desc};
use super::workload::Host;
use serde::Serialize;
use tilekit::{Activation, ActivationDesc, DType, MatrixView};
use tilekit_kernels::{activation::gelu_error_bound, reference};

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
    let (terms, activation, against);
    match *case {
        Case::Matmul { m, n, k, bias: has_bias, activation: act } => {
            let mut desc = matmul_desc(m, n, k, has_bias, act);
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
                row_desc.a = MatrixView { offset: r * k, ..desc.a };
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
        Case::Activation { cols, activation: act, .. } => {
            let x = f64s(0);
            let bias = (host.inputs.len() > 1).then(|| f64s(1));
            let desc =
                ActivationDesc { len: x.len(), bias_len: bias.as_ref().map(|_| cols), activation: Activation::None };
            pre = vec![0.0; x.len()];
            reference::activation(&desc, &x, bias.as_deref(), &mut pre);
            mag = pre.iter().map(|v| v.abs()).collect();
            idx = (0..x.len()).collect();
            terms = 0;
            activation = act;
            against = format!("all {} outputs", x.len());
        }
    }
    compare(got, &idx, &pre, &mag, terms, activation, dtype, against)
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
    terms: usize,
    activation: Activation,
    dtype: DType,
    against: String,
) -> CheckResult {
    let slope = match activation {
        Activation::Gelu | Activation::GeluTanh => 1.13,
        _ => 1.0,
    };
    let acc_u = DType::F32.unit_roundoff();
    let store_u = dtype.unit_roundoff();
    // Below the normal range relative rounding does not hold: half an f16 subnormal step, and
    // f32's smallest normal for backends that flush f32 subnormals (WGSL may).
    let atol = if dtype == DType::F16 { 2f64.powi(-25) } else { 2f64.powi(-126) };
    let mut res = CheckResult { ok: true, against, max_abs_err: 0.0, worst_err_over_bound: 0.0, first_failure: None };
    for ((&i, &p), &m) in idx.iter().zip(pre).zip(mag) {
        let want = activation.apply_f64(p);
        let Some(&g) = got.get(i) else {
            return failed("the output is shorter than expected");
        };
        let act_err = match activation {
            Activation::Gelu | Activation::GeluTanh => gelu_error_bound(p, want),
            _ => 0.0,
        };
        let e_pre = 4.0 * acc_u * p.abs() + 2.0 * (terms as f64 + 2.0) * acc_u * m;
        let e_act = slope * e_pre + acc_u * want.abs() + act_err;
        let bound = atol + e_act + store_u * (want.abs() + e_act);
        let err = (f64::from(g) - want).abs();
        let ratio = if err.is_nan() { f64::INFINITY } else { err / bound };
        res.max_abs_err = res.max_abs_err.max(if err.is_nan() { f64::INFINITY } else { err });
        res.worst_err_over_bound = res.worst_err_over_bound.max(ratio);
        // A NaN output fails: `err <= bound` is false for NaN.
        let within = err <= bound;
        if !within && res.first_failure.is_none() {
            res.ok = false;
            res.first_failure = Some(format!("output {i}: got {g}, want {want:.9e} (bound {bound:.3e})"));
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilekit::Layout;

    /// The check passes the reference's own values rounded to f32 and fails a perturbed one.
    #[test]
    fn accepts_correct_and_rejects_wrong_outputs() {
        for (case, dtype) in [
            (Case::Matmul { m: 9, n: 7, k: 33, bias: true, activation: Activation::Gelu }, DType::F32),
            (Case::Conv { batch: 1, channels: 3, size: 6, stride: 2, layout: Layout::Nhwc }, DType::Bf16),
            (Case::Activation { rows: 3, cols: 5, bias: true, activation: Activation::GeluTanh }, DType::F16),
        ] {
            let host = Host::new(&case, dtype);
            // The CPU backend's output is a correct one.
            let dev = tilekit::Device::cpu();
            let bound = super::super::workload::Bound::new(&dev, &case, dtype, &host).expect("upload");
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
}
