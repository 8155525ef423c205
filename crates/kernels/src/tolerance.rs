//! The tolerance model: one rule, stated once, used by every comparison with the reference
//! (the differential tests, the wgpu backend's unit tests, the criterion benches, `cargo xtask
//! bench`'s check and the CUDA device checks).
//!
//! # The reference
//! The reference is [`crate::reference`], evaluated in `f64` on the inputs *as they are
//! stored* (each input is rounded to the storage dtype on the host with [`DType::round_f32`],
//! which rounds to nearest even; never through `half`'s `from_f64`, which truncates first). So
//! the only differences a correct kernel may show are the roundings of its own `f32`
//! arithmetic and the one rounding of the result to the storage dtype. Under the bf16-compute
//! policy ([`crate::Precision::Bf16`]) the reference rounds the product inputs to bf16 itself,
//! exactly as the kernels must; products of two bf16 values are exact in `f32` (8 + 8 significant
//! bits), so the same bound applies.
//!
//! # The bound
//! For one output element with exact pre-activation value `p` (what the reference computes
//! before the activation), exact output `r = act(p)`, reduction length `K` and magnitude
//! `S = |alpha|·Σ|a||b| + |bias| + |beta|·|c|` (the same sum with every term made positive):
//!
//! ```text
//! e_pre = RTOL·|p| + C_ACC·(K + 2)·U_ACC·S                    f32 accumulation and epilogue
//! e_act = L(act)·e_pre + U_ACC·|r| + act.error_bound(p, r)     the activation's own error
//! bound = atol(dtype) + e_act + u(dtype)·(|r| + e_act)          one rounding to the storage dtype
//! ```
//!
//! - `U_ACC = 2⁻²⁴`: every kernel accumulates in `f32` whatever the storage dtype.
//! - `C_ACC = 2`: a recursive `f32` sum of `K` products is within `γ_K·Σ|a||b|` of the exact
//!   value (`γ_K = K·u/(1 − K·u)`, Higham, *Accuracy and Stability of Numerical Algorithms*
//!   §3.1); the `+ 2` covers rounding each product and the scaling by `alpha`, and the factor 2
//!   covers `1/(1 − K·u)` and the worst case of a blocked or split-K order (partial sums added
//!   in a tree or in a different order have the same first-order bound). Typical errors grow
//!   like `√K·u`, so a correct kernel sits far inside this; a wrong index or a lost term does
//!   not, because the inputs are of order 1 and such a bug moves the result by order 1.
//! - `RTOL = 4·U_ACC`: the epilogue rounds up to four times in `f32` (`alpha·acc`, `+ bias`,
//!   `+ beta·c`, and the activation's input).
//! - `L(act)`: the Lipschitz constant of the activation, which carries the pre-activation error
//!   through it: 1 for none/relu/relu6; 1.13 for both GELU forms (the largest slope of
//!   `x·Φ(x)` is 1.129 at x ≈ 2.42, and the tanh form stays within 1.13 as well); 1.1 for
//!   SiLU (the largest slope of `x·σ(x)` is 1.0998 at x ≈ 2.40).
//! - [`Activation::error_bound`]: the documented accuracy promise of the `f32` formula
//!   ([`crate::activation`]): 0 for the exact ones, [`crate::activation::gelu_error_bound`] for the GELU forms,
//!   [`crate::activation::silu_error_bound`] (never larger) for SiLU; `U_ACC·|r|` is the
//!   rounding of the activation's `f32` result.
//! - `u(dtype)`: the unit roundoff of the storage dtype (2⁻²⁴, 2⁻¹¹, 2⁻⁸), the one rounding to
//!   nearest even when the result is stored. `(|r| + e_act)` bounds the magnitude of the value
//!   being rounded.
//! - `atol(dtype)`: half the spacing of the storage dtype's subnormals for f16 (2⁻²⁵: relative
//!   rounding does not hold below the normal range), and `f32`'s smallest normal (2⁻¹²⁶) for
//!   f32 and bf16, so a backend that flushes `f32` subnormals to zero (WGSL may) still passes.
//!
//! # The f16-compute policy ([`crate::Precision::F16`])
//! The kernel forms each output's sum in chunks of at most `S =`
//! [`crate::Precision::F16_CHUNK`] `= 8` consecutive products: each chunk starts from zero, its
//! products are rounded to f16 and added in f16 (a `vec2<f16>` `fma`, which may or may not be
//! fused: at most two roundings per product), and the chunk's f16 partial is widened (exactly)
//! and added to the `f32` accumulator. Per chunk (Higham, Lemma 3.1 and §3.1, the dot product
//! of length `S` from zero, every product and addition one rounding with `u16 = 2⁻¹¹`, plus
//! each rounding's underflow error `η = 2⁻²⁵`, half the spacing of f16's subnormals):
//!
//! ```text
//! |ĥ − Σ_chunk a·b| <= γ_S(u16)·Σ_chunk |a·b| + (2S − 1)·η·(1 + γ_S) <= γ_S·Σ_chunk |a·b| + 2S·η
//! ```
//!
//! with `γ_S = S·u16/(1 − S·u16)` (`γ_8 = 0.00392`). Summed over the chunks (at most `K`
//! products, `2η` each) and scaled by `alpha` (applied in `f32` after the sum), the f16 stage
//! adds to `e_pre`
//!
//! ```text
//! e_f16 = γ_S(u16)·S_mag + |alpha|·K·2⁻²⁴                     (S_mag: the magnitude S above)
//! ```
//!
//! and the `f32` stage is the accumulation term above (the chunks are at most `K` terms whose
//! magnitudes sum to `(1 + γ_S)·Σ|a||b|`, inside its factor 2). [`matmul_bound`] adds `e_f16`
//! for a descriptor with this precision. Assumptions, stated: the device keeps f16 subnormals
//! (lavapipe does: a test multiplies into the subnormal range and expects exact results); a
//! device that flushes them to zero adds up to `2⁻¹⁴` per product whose value or partial sum
//! falls below `2⁻¹⁴`. f16 overflow: a product or partial sum above 65504 becomes ±Inf (and an
//! Inf meeting −Inf, NaN); that is sticky through the f16 and f32 sums, so the kernel checks each
//! output's `f32` sum and recomputes a non-finite one in `f32` from the stored inputs: such an
//! output is the [`crate::Precision::Highest`] result (inside the tighter bound; Inf or NaN
//! inputs give what they give there). The backends that do not run the f16 kernel compute at
//! `Highest`, which is inside this bound too.
//!
//! # Quantized weights
//! `matmul_quant` (a GGUF-quantized `B`) is held to the same bound with `B = dequantize(W)`:
//! the dequantized weights are exact `f32` values (`crate::quant`), so the reference takes
//! them as stored inputs and nothing else changes.
//!
//! # Non-finite values
//! A NaN reference needs a NaN result. An infinite result is right only where the exact value,
//! pushed outwards by the bound, overflows the storage dtype (f16 results above 65504 become
//! ±Inf, as IEEE rounding says); otherwise results must be finite and within the bound.

//! # Using it
//! - [`bound`] and [`accepts`]: one output against the exact reference, knowing its exact
//!   pre-activation value `p` and its magnitude `S`.
//! - [`matmul_bound`]: [`bound`] for a matmul descriptor, with its precision's f16 term
//!   ([`f16_compute_term`]) under [`crate::Precision::F16`]; what the matmul tests call.
//! - [`bound_from_magnitude`]: the same rule where only `S` is at hand: `|p| <= S` always, and
//!   every term grows with `|p|`, so `S` stands in for it. With [`Activation::Gelu`] it bounds
//!   every activation (GELU's terms are the largest), for callers that do not know which ran.
//! - Two implementations that each meet the rule (a kernel against the CPU backend, against
//!   cuBLAS) differ by at most the sum of their two bounds.
//! - Where every product and partial sum is exact in `f32` (small integers scaled by powers of
//!   two), the accumulation term is zero: pass `k = 0` and `magnitude = 0`.

use crate::{Activation, DType, MatmulDesc, Precision};

/// Unit roundoff of the `f32` accumulator (2⁻²⁴).
pub const U_ACC: f64 = 5.960_464_477_539_063e-8;
/// Coefficient of the accumulation term `C_ACC·(K + 2)·U_ACC·S`; see the module docs.
pub const C_ACC: f64 = 2.0;
/// Relative error of the `f32` epilogue (four roundings).
pub const RTOL: f64 = 4.0 * U_ACC;

/// Absolute floor of the bound for results stored in `dtype`; see the module docs.
pub fn atol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-25),
        DType::F32 | DType::Bf16 => 2f64.powi(-126),
    }
}

/// Lipschitz constant of an activation: how much it can amplify an error in its input.
pub fn lipschitz(act: Activation) -> f64 {
    match act {
        Activation::Gelu | Activation::GeluTanh => 1.13,
        Activation::Silu => 1.1,
        Activation::None | Activation::Relu | Activation::Relu6 => 1.0,
    }
}

/// The largest allowed `|got − r|` for one output element; see the module docs.
///
/// `k` is the reduction length (0 for an elementwise op), `magnitude` the sum of the absolute
/// values of every term (`S`), `pre` the exact pre-activation value and `reference` the exact
/// output `act(pre)`.
pub fn bound(dtype: DType, act: Activation, k: usize, magnitude: f64, pre: f64, reference: f64) -> f64 {
    let e_pre = RTOL * pre.abs() + C_ACC * (k as f64 + 2.0) * U_ACC * magnitude;
    let e_act = lipschitz(act) * e_pre + U_ACC * reference.abs() + act.error_bound(pre, reference);
    atol(dtype) + e_act + dtype.unit_roundoff() * (reference.abs() + e_act)
}

/// Unit roundoff of f16 (2⁻¹¹), the arithmetic of [`Precision::F16`]'s partial sums.
pub const U_F16: f64 = 4.882_812_5e-4;

/// The f16 stage's share of the bound under [`Precision::F16`] (see the module docs):
/// `γ_S(u16)·magnitude + |alpha|·K·2⁻²⁴` with `S = Precision::F16_CHUNK`; 0 for the other
/// precisions.
pub fn f16_compute_term(precision: Precision, alpha: f32, k: usize, magnitude: f64) -> f64 {
    match precision {
        Precision::F16 => {
            let s = Precision::F16_CHUNK as f64;
            let gamma = s * U_F16 / (1.0 - s * U_F16);
            gamma * magnitude + f64::from(alpha).abs() * k as f64 * 2f64.powi(-24)
        }
        _ => 0.0,
    }
}

/// The largest allowed `|got − r|` for one output of the matmul `desc` (its precision, `alpha`,
/// `K` and activation): [`bound`], with the f16 stage's term ([`f16_compute_term`]) added to
/// the pre-activation error under [`Precision::F16`]. For the other precisions it is [`bound`].
pub fn matmul_bound(desc: &MatmulDesc, dtype: DType, magnitude: f64, pre: f64, reference: f64) -> f64 {
    let act = desc.activation;
    let extra = f16_compute_term(desc.precision, desc.alpha, desc.k, magnitude);
    let e_pre = RTOL * pre.abs() + C_ACC * (desc.k as f64 + 2.0) * U_ACC * magnitude + extra;
    let e_act = lipschitz(act) * e_pre + U_ACC * reference.abs() + act.error_bound(pre, reference);
    atol(dtype) + e_act + dtype.unit_roundoff() * (reference.abs() + e_act)
}

/// The largest allowed `|got − r|` for one output of a gated linear unit
/// ([`crate::GluDesc`]): `r = act(gate)·up` from the stored `gate` and `up`. The `f32` kernel
/// forms `a = act(gate)` (its own error, [`Activation::error_bound`], and one rounding), the
/// product (one rounding) and the store (one rounding to `dtype`); the inputs are exact.
pub fn glu_bound(dtype: DType, act: Activation, gate: f64, up: f64, reference: f64) -> f64 {
    let a = act.apply_f64(gate);
    let e = up.abs() * (act.error_bound(gate, a) + U_ACC * a.abs()) + U_ACC * reference.abs();
    atol(dtype) + e + dtype.unit_roundoff() * (reference.abs() + e)
}

/// [`bound`] with the magnitude standing in for the pre-activation value (`|pre| <= magnitude`),
/// for callers that have the output and its magnitude but not the value before the activation;
/// see "Using it" in the module docs. Never smaller than [`bound`] for any `pre` with
/// `|pre| <= magnitude`.
pub fn bound_from_magnitude(dtype: DType, act: Activation, k: usize, magnitude: f64, reference: f64) -> f64 {
    bound(dtype, act, k, magnitude, magnitude, reference)
}

/// Whether `got` (a stored result widened to `f32`) is acceptable for the exact value
/// `reference` under `bound`; see "Non-finite values" in the module docs.
pub fn accepts(dtype: DType, got: f32, reference: f64, bound: f64) -> bool {
    if reference.is_nan() {
        return got.is_nan();
    }
    if got.is_nan() {
        return false;
    }
    if got.is_infinite() {
        // The value furthest out in got's direction that the bound allows, rounded as the
        // kernel rounds it: Inf is right only if that overflows the storage dtype.
        let furthest = reference + bound.copysign(got as f64);
        return dtype.round_f32(furthest as f32) == got;
    }
    if reference.is_infinite() {
        return false;
    }
    (got as f64 - reference).abs() <= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_overflow_is_accepted_only_past_the_threshold() {
        // 65520 is the first value that rounds to +Inf in f16.
        assert!(accepts(DType::F16, f32::INFINITY, 70000.0, 1.0));
        assert!(!accepts(DType::F16, f32::INFINITY, 65000.0, 1.0));
        assert!(accepts(DType::F16, 65504.0, 65504.0, 1.0));
        assert!(!accepts(DType::F16, 65504.0, 70000.0, 1.0));
        assert!(accepts(DType::F32, f32::NAN, f64::NAN, 0.0));
        assert!(!accepts(DType::F32, 0.0, f64::NAN, 1.0));
    }

    #[test]
    fn bound_grows_with_k_and_storage_precision() {
        let b1 = bound(DType::F32, Activation::None, 10, 1.0, 1.0, 1.0);
        let b2 = bound(DType::F32, Activation::None, 1000, 1.0, 1.0, 1.0);
        assert!(b2 > b1);
        assert!(bound(DType::Bf16, Activation::None, 10, 1.0, 1.0, 1.0) > 2f64.powi(-8));
    }

    #[test]
    fn the_rule_has_the_documented_value() {
        // f32, no activation, K = 4096, S = 1024, p = r = 1: the accumulation term dominates.
        let u = 2f64.powi(-24);
        let e_pre = 4.0 * u + 2.0 * 4098.0 * u * 1024.0;
        let e_act = e_pre + u;
        let want = 2f64.powi(-126) + e_act + u * (1.0 + e_act);
        assert_eq!(bound(DType::F32, Activation::None, 4096, 1024.0, 1.0, 1.0), want);
    }

    #[test]
    fn the_f16_policy_adds_its_documented_term_and_nothing_else() {
        let mut d = MatmulDesc::new(4, 4, 64).alpha(-2.0).activation(Activation::Silu);
        for dtype in DType::ALL {
            for (s, pre) in [(0.0, 0.0), (3.0, 1.5), (1000.0, -20.0)] {
                let r = d.activation.apply_f64(pre);
                let plain = bound(dtype, d.activation, 64, s, pre, r);
                d.precision = Precision::Highest;
                assert_eq!(matmul_bound(&d, dtype, s, pre, r), plain);
                d.precision = Precision::Bf16;
                assert_eq!(matmul_bound(&d, dtype, s, pre, r), plain);
                d.precision = Precision::F16;
                let loose = matmul_bound(&d, dtype, s, pre, r);
                // γ_8 = 8u/(1 − 8u) with u = 2⁻¹¹, and |alpha|·K·2⁻²⁴ = 2·64·2⁻²⁴.
                let u = 2f64.powi(-11);
                let term = 8.0 * u / (1.0 - 8.0 * u) * s + 2.0 * 64.0 * 2f64.powi(-24);
                assert_eq!(f16_compute_term(Precision::F16, -2.0, 64, s), term);
                // The term enters before the activation (times its Lipschitz constant 1.1)
                // and the storage rounding.
                let ratio = (loose - plain) / (1.1 * term);
                assert!(ratio > 1.0 - 1e-9 && ratio < 1.0 + dtype.unit_roundoff() + 1e-9, "{dtype} {s}: {ratio}");
            }
        }
        assert_eq!(U_F16, 2f64.powi(-11));
    }

    #[test]
    fn the_magnitude_form_covers_every_pre_activation_value_and_activation() {
        for dtype in DType::ALL {
            for act in Activation::ALL {
                for (k, s) in [(0usize, 0.5f64), (3, 2.0), (4096, 1024.0)] {
                    for pre in [-s, -s / 3.0, 0.0, s / 7.0, s] {
                        let r = act.apply_f64(pre);
                        let loosest = bound_from_magnitude(dtype, Activation::Gelu, k, s, r);
                        assert!(bound_from_magnitude(dtype, act, k, s, r) >= bound(dtype, act, k, s, pre, r));
                        assert!(loosest >= bound(dtype, act, k, s, pre, r), "{dtype} {act} {pre}");
                    }
                }
            }
        }
    }
}
