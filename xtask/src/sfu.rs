//! Host models of the GPU's approximate special-function instructions at their documented worst
//! errors, for the proofs that the CUDA activation forms stay inside their bounds
//! (`fast_gelu_erf.rs`, `fast_gelu.rs`, `fast_silu.rs`): `ex2.approx.ftz.f32` within a relative
//! 2^-22 of 2^y (the CUDA programming guide's 2 ulp for `exp2f`), `rcp.approx.ftz.f32` within
//! 1 ulp (2^-23 relative, PTX ISA), both flushing subnormal inputs and results to zero (`.ftz`).

/// Flushes a subnormal to a zero of its sign, as the `.ftz` instructions do with their inputs
/// and results.
pub(crate) fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE { 0.0f32.copysign(x) } else { x }
}

/// `ex2.approx.ftz.f32` at relative error `s · 2^-22` (s in −1..=1).
pub(crate) fn ex2(y: f32, s: f64) -> f32 {
    ftz((f64::from(ftz(y)).exp2() * (1.0 + s * 2f64.powi(-22))) as f32)
}

/// `rcp.approx.ftz.f32` at relative error `s · 2^-23` (s in −1..=1).
pub(crate) fn rcp(d: f32, s: f64) -> f32 {
    ftz(((1.0 / f64::from(ftz(d))) * (1.0 + s * 2f64.powi(-23))) as f32)
}

/// The error corners the proofs run: each instruction at −max, 0 and +max of its documented
/// error, as (`ex2` factor, `rcp` factor) of 2^-22 and 2^-23.
#[cfg(test)]
pub(crate) const CORNERS: [(f64, f64); 9] =
    [(-1.0, -1.0), (-1.0, 0.0), (-1.0, 1.0), (0.0, -1.0), (0.0, 0.0), (0.0, 1.0), (1.0, -1.0), (1.0, 0.0), (1.0, 1.0)];

/// Asserts that a model's result `got` at `x`, with the instructions' errors at `corner`, is
/// within `bound` of the reference `want`; returns the error as a fraction of the bound.
#[cfg(test)]
pub(crate) fn within(x: f32, got: f32, want: f64, bound: f64, (s_ex2, s_rcp): (f64, f64)) -> f64 {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= bound,
        "x = {x}: {got} against {want}, error {err:e} over the bound {bound:e} \
         (ex2 error {s_ex2}·2^-22, rcp error {s_rcp}·2^-23)"
    );
    err / bound
}
