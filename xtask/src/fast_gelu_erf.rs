//! The host model of the CUDA erf-form GELU (`gelu_erf` in `shaders/cuda/common.cuh`), and the
//! proof that it meets `tilekit_kernels::activation::gelu_error_bound`.
//!
//! The kernel computes, with `a = min(|x|, 13.3)`, `y = −1 + N(a)·rcp.approx(D(a))` (N of degree
//! 5 with N(0) = 0, D of degree 3 with D(0) = 1, both by Horner with fused multiply-adds),
//! `q = max(ex2.approx(y), 2^-149)` (q ≈ Φ(−a), the normal CDF), then `max(x, 0) + min(x, −a)·q`
//! in one fused multiply-add, every other operation an f32 operation rounded to nearest with no
//! contraction. No GPU runs here, so the two approximate instructions are modelled at their
//! documented worst, as in `fast_gelu.rs` (`sfu.rs`): `ex2.approx.ftz.f32` within a relative 2^-22
//! of 2^y and `rcp.approx.ftz.f32` within 1 ulp (2^-23 relative), both flushing subnormal inputs
//! and results to zero. The tests sweep x densely over [−14, 14] (past the clamp at 13.3 on both
//! sides; beyond it the result is x or at most 4.8e-7 in magnitude), every 64th f32 of
//! 2^-10 ≤ |x| < 16, geometrically over every binade from the subnormals to f32::MAX, and the
//! clamp and cut-off boundaries, with each instruction's error at −max, 0 and +max, and check
//! every result against the f64 reference within the bound; ±Inf, NaN and ±0 keep the scalar
//! form's classes. Once, by hand, the same model (copied into a standalone release build) ran over
//! every f32 of 2^-24 ≤ |x| < 14.5 (4.7·10⁸ values × 9 corners): worst 0.859 of the bound at
//! x = −0.60135037 (ex2 at +2^-22, rcp at −2^-23), a point the sweep here includes. The coefficients came from `fast_gelu_erf_fit.py` (run by hand); a test here
//! checks that common.cuh spells the same ones.

/// The clamp of |x|: past it `ex2.approx.ftz` flushes q (2^y < 2^-126).
#[cfg(test)]
const CLAMP: f32 = 13.3;
/// N(a) = a·(N1 + a·(N2 + a·(N3 + a·(N4 + a·N5)))): `N[k]` is N_{k+1}.
#[cfg(test)]
#[allow(clippy::excessive_precision)] // Nine digits, as common.cuh spells them.
const N: [f32; 5] = [-1.151_103_38, -1.095_756_53, -0.464_242_965, -0.099_625_259_6, -0.009_080_849_59];
/// D(a) = 1 + a·(D1 + a·(D2 + a·D3)): `D[k]` is D_{k+1}.
#[cfg(test)]
#[allow(clippy::excessive_precision)]
const D: [f32; 3] = [0.552_969_098, 0.137_181_506, 0.012_598_881_5];

#[cfg(test)]
mod tests {
    use super::{CLAMP, D, N};
    use crate::sfu::{CORNERS, ex2, rcp, within};
    use tilekit_kernels::Activation;
    use tilekit_kernels::activation::gelu_error_bound;

    /// `max.NaN.f32`: NaN if either operand is.
    fn max_nan(x: f32, y: f32) -> f32 {
        if x.is_nan() || y.is_nan() { f32::NAN } else { x.max(y) }
    }

    /// The kernel's formula, operation for operation (`fminf(NaN, c)` is c, as `f32::min`).
    fn gelu_erf_fast(x: f32, s_ex2: f64, s_rcp: f64) -> f32 {
        let a = x.abs().min(CLAMP);
        let mut n = N[4].mul_add(a, N[3]);
        n = n.mul_add(a, N[2]);
        n = n.mul_add(a, N[1]);
        n = n.mul_add(a, N[0]);
        let n = n * a;
        let mut d = D[2].mul_add(a, D[1]);
        d = d.mul_add(a, D[0]);
        let d = d.mul_add(a, 1.0);
        let y = n.mul_add(rcp(d, s_rcp), -1.0);
        let q = ex2(y, s_ex2).max(f32::from_bits(1));
        x.min(-a).mul_add(q, max_nan(x, 0.0))
    }

    /// The sweep's points (see the module documentation).
    fn points() -> Vec<f32> {
        let mut v = Vec::new();
        // 2^22 + 1 points over [−14, 14].
        let n = 1 << 22;
        v.extend((0..=n).map(|i| (-14.0 + 28.0 * f64::from(i) / f64::from(n)) as f32));
        // Every 64th f32 of [2^-10, 16), both signs.
        let (lo, hi) = (2f32.powi(-10).to_bits(), 16f32.to_bits());
        for bits in (lo..hi).step_by(64) {
            let x = f32::from_bits(bits);
            v.extend([x, -x]);
        }
        // ±2^k·(1 + j/64) over every binade, subnormals included.
        for k in -149..=127 {
            for j in 0..64 {
                let x = (2f64.powi(k) * (1.0 + f64::from(j) / 64.0)) as f32;
                v.extend([x, -x]);
            }
        }
        // The clamp, where |gelu| passes 1e-30 (11.67), f32's extremes, and the worst point of a
        // one-off exhaustive run (see the module documentation), a few ulps either side.
        for c in [CLAMP, 11.674_88, 1.0, f32::MIN_POSITIVE, f32::MAX, 0.601_350_37] {
            for d in -4i32..=4 {
                let x = f32::from_bits(c.to_bits().saturating_add_signed(d));
                if x.is_finite() {
                    v.extend([x, -x]);
                }
            }
        }
        v
    }

    #[test]
    fn the_fast_gelu_erf_meets_the_documented_bound() {
        let xs = points();
        let want: Vec<f64> = xs.iter().map(|&x| Activation::Gelu.apply_f64(f64::from(x))).collect();
        let mut worst = (0.0f64, 0.0f32, 0.0, 0.0);
        for corner @ (s_ex2, s_rcp) in CORNERS {
            for (&x, &want) in xs.iter().zip(&want) {
                let got = gelu_erf_fast(x, s_ex2, s_rcp);
                let r = within(x, got, want, gelu_error_bound(f64::from(x), want), corner);
                if r > worst.0 {
                    worst = (r, x, s_ex2, s_rcp);
                }
            }
        }
        eprintln!(
            "fast gelu (erf): {} points × 9 error corners, worst error {:.3} of the bound (x = {}, \
             ex2 error {}·2^-22, rcp error {}·2^-23)",
            xs.len(),
            worst.0,
            worst.1,
            worst.2,
            worst.3
        );
    }

    #[test]
    fn the_fast_gelu_erf_keeps_the_special_values() {
        for s_ex2 in [-1.0, 0.0, 1.0] {
            for s_rcp in [-1.0, 0.0, 1.0] {
                let g = |x: f32| gelu_erf_fast(x, s_ex2, s_rcp);
                assert!(g(f32::NAN).is_nan());
                assert!(g(-f32::NAN).is_nan());
                assert_eq!(g(f32::INFINITY), f32::INFINITY);
                // As the scalar form (`Activation::apply_f32`), whose class the nan_inf tests
                // compare with: −Inf·(a positive subnormal) = −Inf.
                assert_eq!(g(f32::NEG_INFINITY), f32::NEG_INFINITY);
                assert_eq!(Activation::Gelu.apply_f32(f32::NEG_INFINITY), f32::NEG_INFINITY);
                assert_eq!(g(0.0), 0.0);
                assert_eq!(g(-0.0), 0.0);
                assert_eq!(g(f32::MAX), f32::MAX);
                // Past the clamp q is flushed and floored: 2^128·2^-149 = 2^-21.
                assert_eq!(g(-f32::MAX), -f32::MAX * f32::from_bits(1));
                assert_eq!(g(-CLAMP), -CLAMP * f32::from_bits(1));
                // Subnormals stay subnormals (no flush in the plain f32 operations).
                let tiny = f32::from_bits(1);
                assert!(g(tiny).abs() <= tiny && g(-tiny).abs() <= tiny);
                let sub = f32::from_bits(0x0040_0000);
                assert!(g(sub) > 0.0 && g(-sub) < 0.0);
            }
        }
    }

    /// What the CUDA comment promises of the form: N's coefficients negative and D's positive
    /// (Horner never cancels for a ≥ 0), and q flushed at the clamp for every error corner.
    #[test]
    fn the_fast_gelu_erf_form_has_its_documented_shape() {
        assert!(N.iter().all(|&c| c < 0.0) && D.iter().all(|&c| c > 0.0));
        for s in [-1.0, 0.0, 1.0] {
            let a = CLAMP;
            let n = N.iter().rev().fold(0.0f32, |acc, &c| acc.mul_add(a, c)) * a;
            let d = D.iter().rev().fold(0.0f32, |acc, &c| acc.mul_add(a, c)).mul_add(a, 1.0);
            let y = n.mul_add(rcp(d, s), -1.0);
            assert!(y < -127.0, "y({a}) = {y}");
            assert_eq!(ex2(y, s), 0.0);
        }
    }

    /// common.cuh's `gelu_erf` spells the model's constants, in the model's order.
    #[test]
    fn the_model_matches_common_cuh() {
        let src = std::fs::read_to_string(crate::util::project_root().join("shaders/cuda/common.cuh"))
            .expect("read shaders/cuda/common.cuh");
        let start = src.find("float gelu_erf(float x) {").expect("gelu_erf in common.cuh");
        let body = &src[start..start + src[start..].find("\n}").expect("the end of gelu_erf")];
        // The f32 literals: runs of digits, '.', 'e', signs that hold a '.' and end in 'f'.
        let mut found = Vec::new();
        let bytes = body.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let is_num = |b: u8| b.is_ascii_digit() || b"+-.e".contains(&b);
            if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric() && bytes[i - 1] != b'_') {
                let begin = if i > 0 && bytes[i - 1] == b'-' { i - 1 } else { i };
                let mut j = i;
                while j < bytes.len() && is_num(bytes[j]) {
                    j += 1;
                }
                let text = &body[begin..j];
                if text.contains('.') && bytes.get(j) == Some(&b'f') {
                    found.push(text.parse::<f32>().unwrap_or_else(|e| panic!("{text}: {e}")));
                }
                i = j;
            } else {
                i += 1;
            }
        }
        let want = [CLAMP, N[4], N[3], N[2], N[1], N[0], D[2], D[1], D[0], 1.0, -1.0, f32::from_bits(1), 0.0];
        assert_eq!(found, want, "the f32 literals of gelu_erf in common.cuh");
    }
}
