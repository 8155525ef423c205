//! The fused activations and their scalar formulas.
//!
//! Two implementations live here on purpose:
//! - [`Activation::apply_f64`] is the reference: `f64`, `libm::erf`, written for obviousness.
//! - [`Activation::apply_f32`] is the kernel formula in `f32`, exactly as the WGSL and CUDA
//!   kernels write it (`shaders/wgsl/common.wgsl`), and as the CPU backend runs it.
//!
//! # Accuracy of the `f32` forms
//! - `gelu` (erf form) evaluates `erfc` with the Chebyshev fit of Numerical Recipes §6.2
//!   (`erfcc`, fractional error below 1.2e-7 everywhere), so the negative tail keeps its
//!   relative accuracy instead of cancelling in `1 + erf(x)`.
//! - `gelu-tanh` is rewritten as `x · sigmoid(2u)` with `u = √(2/π)(x + 0.044715x³)`, which
//!   is algebraically `0.5x(1 + tanh u)` but neither overflows (a naive `tanh` gives NaN once
//!   its argument passes ~88.7 in f32, x ≈ −13) nor cancels in the negative tail. `2u` is
//!   clamped to ±88, where `exp` is still finite in f32 and the true value is below 1e-36.
//! - Both GELU forms meet [`gelu_error_bound`] against the `f64` reference over [−20, 20]:
//!   relative error at most `5e-7 · (1 + x²)` wherever |gelu(x)| ≥ 1e-30 (the `x²` is the
//!   conditioning of `exp(−x²/2)` and `exp(−2u)` to the rounding of their argument: 3.4e-7 and
//!   1.5e-7 times `1 + x²` were measured), and absolute error at most 1e-6 everywhere (3.7e-7
//!   and 5.1e-7 measured). Below 1e-30 the result is in or near `f32`'s subnormal range,
//!   where only the absolute bound is promised.
//! - `relu` is `max(x, 0)`, `relu6` is `min(max(x, 0), 6)`.

use std::fmt;

/// Relative error coefficient of the `f32` GELU forms: see [`gelu_error_bound`].
pub const GELU_REL_BOUND: f64 = 5.0e-7;
/// Absolute error bound of the `f32` GELU forms against the `f64` reference over [−20, 20].
pub const GELU_ABS_BOUND: f64 = 1.0e-6;

/// The largest error the `f32` GELU forms (either) may show at `x` against the `f64`
/// reference value `reference` (see the module documentation for where it comes from).
pub fn gelu_error_bound(x: f64, reference: f64) -> f64 {
    if reference.abs() < 1e-30 {
        GELU_ABS_BOUND
    } else {
        GELU_ABS_BOUND.min(GELU_REL_BOUND * (1.0 + x * x) * reference.abs())
    }
}

/// √(2/π), the tanh-GELU constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// 1/√2, the erf-GELU argument scale.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;

/// An elementwise function fused into the end of a kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// The exact GELU, `0.5x(1 + erf(x/√2))` ("gelu" everywhere in tilekit).
    Gelu,
    /// The tanh approximation, `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))` ("gelu-tanh").
    GeluTanh,
}

impl Activation {
    /// Every activation, in a fixed order (tests iterate over this).
    pub const ALL: [Activation; 5] =
        [Activation::None, Activation::Relu, Activation::Relu6, Activation::Gelu, Activation::GeluTanh];

    /// The name used on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Relu6 => "relu6",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu-tanh",
        }
    }

    /// The code the kernels receive in their parameter block (`ACT_*` in `common.wgsl`).
    pub const fn code(self) -> u32 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::Relu6 => 2,
            Activation::Gelu => 3,
            Activation::GeluTanh => 4,
        }
    }

    /// Parses the names printed by [`Activation::name`].
    pub fn parse(s: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The reference formula in `f64`.
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            Activation::None => x,
            Activation::Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            Activation::Relu6 => x.clamp(0.0, 6.0),
            Activation::Gelu => 0.5 * x * libm::erfc(-x * FRAC_1_SQRT_2),
            Activation::GeluTanh => {
                let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
                // 0.5x(1 + tanh u) = x·sigmoid(2u); exp of a large positive argument is +inf
                // in f64, which gives x/inf = ±0, the right limit.
                x / (1.0 + (-2.0 * u).exp())
            }
        }
    }

    /// The kernel formula in `f32` (what every backend computes).
    #[inline]
    pub fn apply_f32(self, x: f32) -> f32 {
        match self {
            Activation::None => x,
            // NaN propagates (as in the reference): `f32::max` would turn it into 0.
            Activation::Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            Activation::Relu6 => x.clamp(0.0, 6.0),
            Activation::Gelu => gelu_erf_f32(x),
            Activation::GeluTanh => gelu_tanh_f32(x),
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `erfc(z)` for `z ≥ 0` by the Chebyshev fit of Numerical Recipes §6.2 (fractional error
/// below 1.2e-7). `z` is clamped to 10, where `erfc` (2e-45) is already below `f32`'s
/// smallest normal number.
#[inline]
#[allow(clippy::excessive_precision)] // The coefficients as Numerical Recipes prints them.
pub fn erfc_nonneg_f32(z: f32) -> f32 {
    let z = z.min(10.0);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    t * (p - z * z).exp()
}

/// GELU, erf form, in `f32`.
#[inline]
pub fn gelu_erf_f32(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let e = erfc_nonneg_f32(z);
    // For x ≥ 0, 1 + erf(x/√2) = 2 − erfc(z); for x < 0 it is erfc(z), with no cancellation.
    if x >= 0.0 { 0.5 * x * (2.0 - e) } else { 0.5 * x * e }
}

/// GELU, tanh form, in `f32`: `x · sigmoid(2u)`.
#[inline]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    // x is clamped inside u only: beyond ±20 the sigmoid has saturated and x³ could overflow.
    let xc = x.clamp(-20.0, 20.0);
    let u = 0.797_884_6 * xc * (1.0 + 0.044_715 * xc * xc);
    let t = (-2.0 * u).clamp(-88.0, 88.0);
    x / (1.0 + t.exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Activation::ALL {
            assert_eq!(Activation::parse(a.name()), Some(a));
        }
    }

    #[test]
    fn tanh_form_has_no_nan_in_the_tail() {
        for x in [-13.1f32, -20.0, -1e4, -1e30, -f32::MAX, 1e4, f32::MAX] {
            let y = gelu_tanh_f32(x);
            assert!(!y.is_nan(), "gelu-tanh({x}) = {y}");
            assert!(!gelu_erf_f32(x).is_nan(), "gelu({x})");
        }
    }

    #[test]
    fn f32_forms_track_the_reference() {
        for i in -20_000..=20_000 {
            let x = (i as f32) * 1e-3;
            for a in [Activation::Gelu, Activation::GeluTanh] {
                let r = a.apply_f64(x as f64);
                let got = a.apply_f32(x) as f64;
                let err = (got - r).abs();
                assert!(err <= gelu_error_bound(x as f64, r), "{a} at {x}: {got} vs {r}");
            }
        }
    }
}
