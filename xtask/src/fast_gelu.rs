//! The host model of the CUDA GELU-tanh form (`gelu_tanh` in `shaders/cuda/common.cuh`), and
//! the proof that it meets `tilekit_kernels::activation::gelu_error_bound`.
//!
//! The kernel computes `e = ex2.approx(t·log2 e)` and `q = rcp.approx(1 + e)`, then
//! `x − xc·e·q` (x ≥ 0) or `x·q` (x < 0), every other operation an f32 operation rounded to
//! nearest with no contraction. No GPU runs here, so the two approximate instructions are
//! modelled at their documented worst: `ex2.approx.ftz.f32` within a relative 2^-22 of 2^y (2
//! ulp, the CUDA programming guide's bound for `exp2f`, which is that instruction) and
//! `rcp.approx.ftz.f32` within 1 ulp (2^-23 relative, PTX ISA), both flushing subnormal inputs
//! and results to zero (`.ftz`). The test sweeps x densely over
//! [−20, 20] and beyond, with each instruction's error at −max, 0 and +max, and checks every
//! result against the f64 reference within the bound.

#[cfg(test)]
mod tests {
    use crate::sfu::{CORNERS, ex2, rcp, within};
    use tilekit_kernels::Activation;
    use tilekit_kernels::activation::gelu_error_bound;

    /// The kernel's formula, operation for operation.
    fn gelu_tanh_fast(x: f32, s_ex2: f64, s_rcp: f64) -> f32 {
        let xc = x.clamp(-20.0, 20.0);
        let xc = if x.is_nan() { -20.0 } else { xc }; // fmaxf(NaN, −20) is −20
        let u = (0.797_884_6 * xc) * (1.0 + (0.044_715 * xc) * xc);
        let t = (-2.0 * u).clamp(-87.0, 87.0);
        // The kernel's 1.44269504f is this f32 (log2 e rounded to f32).
        let e = ex2(t * std::f32::consts::LOG2_E, s_ex2);
        let q = rcp(1.0 + e, s_rcp);
        if x >= 0.0 { (-(xc * e)).mul_add(q, x) } else { x * q }
    }

    #[test]
    fn the_fast_gelu_tanh_meets_the_documented_bound() {
        let mut worst = 0.0f64;
        let mut checked = 0u64;
        for corner @ (s_ex2, s_rcp) in CORNERS {
            // 2^21 + 1 points over [−24, 24]: past the clamps on both sides.
            let n = 1 << 21;
            for i in 0..=n {
                let x = (-24.0 + 48.0 * f64::from(i) / f64::from(n)) as f32;
                let want = Activation::GeluTanh.apply_f64(f64::from(x));
                let got = gelu_tanh_fast(x, s_ex2, s_rcp);
                worst = worst.max(within(x, got, want, gelu_error_bound(f64::from(x), want), corner));
                checked += 1;
            }
        }
        eprintln!("fast gelu-tanh: {checked} points, worst error {:.2} of the bound", worst);
    }

    #[test]
    fn the_fast_gelu_tanh_keeps_nan_and_inf() {
        for s in [-1.0, 0.0, 1.0] {
            assert!(gelu_tanh_fast(f32::NAN, s, s).is_nan());
            assert_eq!(gelu_tanh_fast(f32::INFINITY, s, s), f32::INFINITY);
            assert_eq!(gelu_tanh_fast(f32::NEG_INFINITY, s, s), f32::NEG_INFINITY);
            assert_eq!(gelu_tanh_fast(0.0, s, s), 0.0);
        }
    }
}
