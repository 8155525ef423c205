//! The `f16x2` column: a wgpu f16 matmul row (the f32-compute kernel, `Precision::Highest`)
//! timed again with `Precision::F16`, which runs `matmul_f16x2.wgsl` (products and partial sums
//! of 8 in `vec2<f16>`) where the device has `SHADER_F16` and M > 16, on the same tensors in the
//! same run. The result is checked first against the f64 reference under the policy's own bound
//! (`tolerance::matmul_bound`): a wrong result is reported and not timed.

use super::cases::Case;
use super::measure::{self, Plan, Stats};
use super::workload::{Bound, Host};
use anyhow::{Result, bail};
use tilekit::{BackendKind, DType, MatrixView, Precision};
use tilekit_kernels::{reference, tolerance};

/// Rows of the output checked (all of them for small cases).
const CHECKED_ROWS: usize = 8;

/// Whether `case` gets the column: a wgpu matmul in f16 with more than 16 rows (below, every
/// precision takes the GEMV kernel).
pub fn applies(bound: &Bound, case: &Case, dtype: DType) -> bool {
    matches!(case, Case::Matmul { m: 17.., .. }) && dtype == DType::F16 && bound.device.kind() == BackendKind::Wgpu
}

/// Checks then times the case under `Precision::F16` (`Ok(None)`: not applicable).
pub fn time(bound: &Bound, case: &Case, dtype: DType, host: &Host, plan: Plan) -> Result<Option<Stats>> {
    if !applies(bound, case, dtype) {
        return Ok(None);
    }
    let Some(desc) = case.matmul_desc() else { return Ok(None) };
    let desc = desc.precision(Precision::F16);
    let dev = &bound.device;
    let Some((a, b)) = bound.matmul_operands() else { return Ok(None) };
    let bias = bound.bias();
    let out = dev.zeros(&host.out_shape, dtype)?;
    let run = || -> Result<()> {
        dev.matmul_into(&desc, a, b, bias, None, &out)?;
        dev.synchronize()?;
        Ok(())
    };
    run()?;
    let got = out.to_f32_vec()?;

    // Sampled rows (first, last and between) against the reference under the F16 bound.
    let (m, n) = (desc.m, desc.n);
    let f64s = |i: usize| -> Vec<f64> { host.inputs[i].1.iter().map(|&v| f64::from(v)).collect() };
    let abs = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x.abs()).collect() };
    let (av, bv) = (f64s(0), f64s(1));
    let biasv = (host.inputs.len() > 2).then(|| f64s(2));
    let (a_abs, b_abs, bias_abs) = (abs(&av), abs(&bv), biasv.as_deref().map(abs));
    let mut plain = desc;
    plain.activation = tilekit::Activation::None;
    plain.m = 1;
    plain.out = MatrixView::dense(1, n);
    let mut rows: Vec<usize> =
        (0..CHECKED_ROWS.min(m)).map(|i| i * (m - 1) / (CHECKED_ROWS.min(m) - 1).max(1)).collect();
    rows.dedup();
    let (mut pre, mut mag) = (vec![0.0; n], vec![0.0; n]);
    for r in rows {
        plain.a = desc.a.offset(r * desc.k);
        reference::matmul(&plain, &av, &bv, biasv.as_deref(), None, &mut pre);
        reference::matmul(&plain, &a_abs, &b_abs, bias_abs.as_deref(), None, &mut mag);
        for j in 0..n {
            let want = desc.activation.apply_f64(pre[j]);
            let bound = tolerance::matmul_bound(&desc, dtype, mag[j], pre[j], want);
            let g = got[r * n + j];
            if !tolerance::accepts(dtype, g, want, bound) {
                bail!("f16x2 output ({r}, {j}): got {g}, want {want:.6e} (bound {bound:.3e})");
            }
        }
    }
    Ok(Some(measure::time(plan, run)?))
}
