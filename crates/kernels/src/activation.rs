//! The fused activations and their scalar formulas.
//!
//! Two implementations live here on purpose:
//! - [`Activation::apply_f64`] is the reference: `f64`, `libm::erf`, written for obviousness.
//! - [`Activation::apply_f32`] is the kernel formula in `f32`, exactly as the WGSL kernels
//!   write it (`shaders/wgsl/common.wgsl`). The CPU backend runs it with a vectorisable `exp`
//!   (`backend/cpu/activation.rs`), except for the erf GELU, where it runs the CUDA kernels'
//!   form with an exact division and a vectorisable `2^x` (half the instructions of the erfc
//!   fit), and on AVX-512 all three from tables of polynomial pieces of their gates
//!   (`backend/cpu/activation/avx512.rs`); the CUDA kernels run both GELUs and SiLU on the GPU's
//!   approximate `ex2`/`rcp` instructions (`shaders/cuda/common.cuh`; the erf form there is a
//!   rational fit of log2 Φ(−|x|), not this module's erfc fit). Those forms are not
//!   bit-identical to this one; each is proven inside the same bound (the CPU's by a sweep test,
//!   CUDA's by host models of the instructions at their worst errors: xtask's `fast_gelu_erf`,
//!   `fast_gelu` and `fast_silu`).
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
//! - `silu` is `x · sigmoid(x)`. With `e = exp(min(−x, 88))` and `v = n / (1 + e)`: for
//!   x ≥ 0 it is `x − min(x, 88) · v` with `n = e` (the correction `x·e/(1 + e)` is at most
//!   x/2 and vanishes as x grows, so large results carry only their own rounding); for
//!   −88 ≤ x < 0 it is `v` with `n = x` (no cancellation in the tail); below x = −88 it is −0,
//!   where the true value (below 6e-37 in magnitude) is already subnormal in f32. `−x` is exact,
//!   so the error does not grow with |x| beyond what `exp` itself does; the clamp keeps `exp`
//!   finite (a GPU may assume finite math). So silu(−Inf) = −0 (the limit), silu(+Inf) = +Inf,
//!   silu(NaN) = NaN. It meets [`silu_error_bound`] against the `f64` reference over
//!   [−20, 20]: relative error at most `4e-7 · (1 + |x|)` wherever |silu(x)| ≥ 1e-30 and
//!   absolute error at most 1e-6 everywhere. The `(1 + |x|)` leaves room for GPU `exp`s whose
//!   error grows with their argument (Vulkan allows `3 + 2|x|` ulp); the scalar form and the
//!   CPU backend's vectorised form measure inside it (`silu_sweep` below, and the CPU
//!   backend's sweep print the worst fraction). The bound is never larger than
//!   [`gelu_error_bound`] at the same point and reference value (`4(1 + a) ≤ 5(1 + a²)` for
//!   every `a`), so a tolerance that covers GELU covers SiLU.
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

/// Relative error coefficient of the `f32` SiLU form: see [`silu_error_bound`].
pub const SILU_REL_BOUND: f64 = 4.0e-7;
/// Absolute error bound of the `f32` SiLU form against the `f64` reference over [−20, 20].
pub const SILU_ABS_BOUND: f64 = 1.0e-6;

/// The largest error the `f32` SiLU form may show at `x` against the `f64` reference value
/// `reference` (see the module documentation).
pub fn silu_error_bound(x: f64, reference: f64) -> f64 {
    if reference.abs() < 1e-30 {
        SILU_ABS_BOUND
    } else {
        SILU_ABS_BOUND.min(SILU_REL_BOUND * (1.0 + x.abs()) * reference.abs())
    }
}

/// Below this input SiLU's `f32` form returns −0 (see the module documentation).
pub const SILU_CUTOFF: f32 = -88.0;

/// √(2/π), the tanh-GELU constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// 1/√2, the erf-GELU argument scale.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;

/// An elementwise function fused into the end of a kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// SiLU (swish), `x · sigmoid(x)` ("silu").
    Silu,
}

impl Activation {
    /// Every activation, in a fixed order (tests iterate over this).
    pub const ALL: [Activation; 6] = [
        Activation::None,
        Activation::Relu,
        Activation::Relu6,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Silu,
    ];

    /// The name used on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Relu6 => "relu6",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu-tanh",
            Activation::Silu => "silu",
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
            Activation::Silu => 5,
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
            // exp(−x) is +inf below x ≈ −709, which gives x/inf = −0, the limit; −Inf gives
            // −Inf/Inf = NaN, so it is spelled out.
            Activation::Silu if x == f64::NEG_INFINITY => -0.0,
            Activation::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// Whether the `f32` formula is exact (every result is the correctly rounded value):
    /// none, ReLU and ReLU6. The others meet [`Activation::error_bound`].
    pub const fn is_exact(self) -> bool {
        matches!(self, Activation::None | Activation::Relu | Activation::Relu6)
    }

    /// The documented error of the `f32` formula at `x` against the `f64` reference value
    /// `reference`: 0 for the exact ones, [`gelu_error_bound`] for the GELU forms,
    /// [`silu_error_bound`] for SiLU.
    pub fn error_bound(self, x: f64, reference: f64) -> f64 {
        match self {
            Activation::None | Activation::Relu | Activation::Relu6 => 0.0,
            Activation::Gelu | Activation::GeluTanh => gelu_error_bound(x, reference),
            Activation::Silu => silu_error_bound(x, reference),
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
            Activation::Silu => silu_f32(x),
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A gated linear unit over rows of `h`: `out[r, c] = act(h[r, c]) · h[r, F + c]` for `h` of
/// shape `[rows, 2F]` (gate half first, then the up half) and `out` of shape `[rows, F]`.
///
/// SwiGLU, the MLP of Llama-style models, is `silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)`: one matmul of `x`
/// against the concatenated `[W_gate; W_up]` (`[2F, K]`, used with `trans_b`) gives `h`, and
/// this op with [`Activation::Silu`] gives the gated product. Every backend computes it in
/// `f32` as `apply_f32(gate) · up` (one rounding of the product), then rounds once to the
/// storage dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GluDesc {
    /// Rows of `h` and `out` (the product of all but the last dimension).
    pub rows: usize,
    /// The width `F` of each half (the output's last dimension; `h`'s is `2F`).
    pub f: usize,
    /// The activation of the gate half.
    pub activation: Activation,
}

impl GluDesc {
    /// Elements of `out` (`rows · F`), `None` on overflow.
    pub fn out_len(&self) -> Option<usize> {
        self.rows.checked_mul(self.f)
    }

    /// Elements of `h` (`rows · 2F`), `None` on overflow.
    pub fn h_len(&self) -> Option<usize> {
        self.out_len()?.checked_mul(2)
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

/// SiLU in `f32` (see the module documentation for the form and its tails).
#[inline]
pub fn silu_f32(x: f32) -> f32 {
    let e = (-x).min(88.0).exp();
    let pos = x >= 0.0;
    let v = if pos { e } else { x } / (1.0 + e);
    // x.min(88): +Inf · 0 would be NaN, and beyond 88 the correction is 0.
    if pos {
        x - x.min(88.0) * v
    } else if x < SILU_CUTOFF {
        -0.0
    } else {
        v
    }
}

impl GluDesc {
    /// `rows` rows of `h` (`2F` wide) into `rows × F` outputs, the gate half through
    /// `activation`.
    pub const fn new(rows: usize, f: usize, activation: Activation) -> GluDesc {
        GluDesc { rows, f, activation }
    }
}

crate::field_setters!(GluDesc { rows: usize, f: usize, activation: Activation });
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
    fn silu_limits() {
        assert_eq!(silu_f32(f32::NEG_INFINITY).to_bits(), (-0.0f32).to_bits());
        assert_eq!(silu_f32(f32::INFINITY), f32::INFINITY);
        assert!(silu_f32(f32::NAN).is_nan());
        assert_eq!(silu_f32(f32::MAX), f32::MAX);
        assert_eq!(silu_f32(-f32::MAX).to_bits(), (-0.0f32).to_bits());
        assert_eq!(Activation::Silu.apply_f64(f64::NEG_INFINITY), 0.0);
        assert_eq!(silu_f32(0.0), 0.0);
    }

    /// The scalar SiLU over [−20, 20] (every 2^-12) inside `silu_error_bound`, which is
    /// never above `gelu_error_bound`.
    #[test]
    fn silu_sweep() {
        let mut worst = (0.0f64, 0.0f32);
        for i in -(20 << 12)..=(20 << 12) {
            let x = i as f32 / 4096.0;
            let r = Activation::Silu.apply_f64(x as f64);
            let bound = silu_error_bound(x as f64, r);
            assert!(bound <= gelu_error_bound(x as f64, r));
            let err = (silu_f32(x) as f64 - r).abs();
            assert!(err <= bound, "silu({x}): {} vs {r}", silu_f32(x));
            if err / bound > worst.0 {
                worst = (err / bound, x);
            }
        }
        eprintln!("silu: worst error {:.3} of the bound at x = {}", worst.0, worst.1);
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
