//! The host model of the CUDA SiLU form (`silu` in `shaders/cuda/common.cuh`), and the proof
//! that it meets `tilekit_kernels::activation::silu_error_bound`.
//!
//! The kernel computes `e = ex2.approx(min(−x, 88)·log2 e)` and `q = rcp.approx(1 + e)`, then
//! `x − min(x, 88)·e·q` (x ≥ 0), `x·q` (−88 ≤ x < 0) or −0 (below), every other operation an
//! f32 operation rounded to nearest with no contraction. No GPU runs here, so the two
//! approximate instructions are modelled at their documented worst, as in `fast_gelu.rs`:
//! `ex2.approx.ftz.f32` within a relative 2^-22 of 2^y and `rcp.approx.ftz.f32` within 1 ulp
//! (2^-23 relative), both flushing subnormal inputs and results to zero. The tests sweep x densely over [−24, 24], coarsely out to ±100 (past the ±88
//! clamps), geometrically over tiny magnitudes down to the subnormals, with each instruction's
//! error at −max, 0 and +max, and check every result against the f64 reference within the
//! bound; ±Inf, NaN and ±0 keep the scalar form's results.

#[cfg(test)]
mod tests {
    use crate::sfu::{CORNERS, ex2, rcp, within};
    use tilekit_kernels::Activation;
    use tilekit_kernels::activation::{silu_error_bound, silu_f32};

    /// The kernel's formula, operation for operation (`fminf(NaN, 88)` is 88, as `f32::min`).
    fn silu_fast(x: f32, s_ex2: f64, s_rcp: f64) -> f32 {
        // The kernel's 1.44269504f is this f32 (log2 e rounded to f32).
        let e = ex2((-x).min(88.0) * std::f32::consts::LOG2_E, s_ex2);
        let q = rcp(1.0 + e, s_rcp);
        let pos = (-(x.min(88.0) * e)).mul_add(q, x);
        let neg = if x < -88.0 { -0.0 } else { x * q };
        if x >= 0.0 { pos } else { neg }
    }

    /// The sweep's points: dense over [−24, 24], coarse over [−100, 100], and ±2^k·(1 + j/64)
    /// for k in −149..=6.
    fn points() -> Vec<f32> {
        let mut v = Vec::new();
        let n = 1 << 21;
        v.extend((0..=n).map(|i| (-24.0 + 48.0 * f64::from(i) / f64::from(n)) as f32));
        let n = 1 << 18;
        v.extend((0..=n).map(|i| (-100.0 + 200.0 * f64::from(i) / f64::from(n)) as f32));
        for k in -149..=6 {
            for j in 0..64 {
                let x = (2f64.powi(k) * (1.0 + f64::from(j) / 64.0)) as f32;
                v.extend([x, -x]);
            }
        }
        v
    }

    #[test]
    fn the_fast_silu_meets_the_documented_bound() {
        let xs = points();
        let mut worst = (0.0f64, 0.0f32);
        for corner @ (s_ex2, s_rcp) in CORNERS {
            for &x in &xs {
                let want = Activation::Silu.apply_f64(f64::from(x));
                let r = within(x, silu_fast(x, s_ex2, s_rcp), want, silu_error_bound(f64::from(x), want), corner);
                if r > worst.0 {
                    worst = (r, x);
                }
            }
        }
        eprintln!(
            "fast silu: {} points × 9 error corners, worst error {:.3} of the bound (x = {})",
            xs.len(),
            worst.0,
            worst.1
        );
    }

    #[test]
    fn the_fast_silu_keeps_the_special_values() {
        for s in [-1.0, 0.0, 1.0] {
            for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, -f32::MAX, -88.5, 88.5] {
                let (got, want) = (silu_fast(x, s, s), silu_f32(x));
                assert!(
                    got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                    "silu({x}): {got} against the scalar form's {want}"
                );
            }
        }
    }
}
