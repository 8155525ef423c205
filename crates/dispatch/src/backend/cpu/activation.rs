//! Vectorised activations: GELU (erf and tanh forms), SiLU, ReLU, ReLU6, with an optional bias.
//!
//! GELU's erf form is the CUDA kernels' rational form ([`gelu_erf_first`]). GELU's tanh form
//! is [`Activation::apply_f32`]'s formula step for step; SiLU takes `e^−|x|` and one quotient
//! for both signs ([`silu_last`]) where `apply_f32` takes `e^−x`. Two further changes keep
//! them inside [`Activation::error_bound`] while letting LLVM vectorise them: `exp` is a
//! branch-free Cephes-style polynomial (range reduction by `ln 2` in two parts, degree-6
//! polynomial, one power of two; its argument is clamped so results stay normal, which only
//! ever replaces corrections far below half an ulp of the answer), and where the instruction
//! set has a fused multiply-add the polynomials use it, which only removes roundings. The
//! worst error against the f64 reference over a dense sweep of [−20, 20] is measured by
//! `sweep_stays_inside_the_documented_bound` below, in every instruction set this CPU has.
//!
//! The three transcendental forms run in stages over blocks of 256 elements ([`Staged`]), so
//! that each loop's dependency chain is short enough for the core to overlap its iterations.
//!
//! On AVX-512 the three are written in intrinsics instead ([`avx512`]): each from a table of
//! polynomial pieces of its gate (`Φ`, `σ(2u)`, `σ`), with these formulas (each quotient a
//! refined reciprocal estimate) for the lanes far in the negative tail, and half-precision
//! storage converted as it is loaded and stored. They are what [`map`], [`map_in_place`] and
//! the fused epilogues ([`apply_isa`]) run there; the results are not bit for bit those of the
//! other instruction sets, and are held to the same bound by the same sweep. 512 × 3072 GELU
//! took 0.25 ms against 0.38–0.39 autovectorised (2 threads, separate processes alternated;
//! the module records the rest).
//!
//! NaN and ±Inf give what `apply_f32` gives (tested against it on the special values): every
//! clamp below either keeps a NaN or feeds a NaN `x` into the final product or quotient.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

use super::pool::for_each_chunk_mut;
use super::simd::{Isa, fmax, fmin, madd, multiversion};
use super::{CpuData, Elem, internal, typed};
use crate::Result;
use tilekit_kernels::{Activation, ActivationDesc};

/// `e^x` in f32 over the normal range: `x` is clamped to [−87.33, 88], so below −87.33 the
/// result is e^−87.33 (≈ 2^-126, f32's smallest normal number) rather than a subnormal or 0.
/// Relative error about 1 ulp. Its callers (GELU-tanh, SiLU) use it where a result that small
/// only meets corrections far below half an ulp of the answer.
///
/// The result `y · 2^n` ([`exp_parts`]) is always normal — at n = −126 the clamp leaves
/// r = x − n·ln 2 ≥ 0, so y ≥ 1 — so 2^n is added to `y`'s exponent field as an integer, no
/// multiply: the same bits (`exp_scales_in_the_exponent_field`) in 0.92–0.98 of GELU-tanh's
/// and SiLU's time (512 × 768 and 512 × 4096, in-process A/B, two runs of 300 alternated
/// rounds).
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    let (y, t) = exp_parts::<FMA>(x);
    // `t`'s bits are MAGIC's plus n, and MAGIC's low 9 bits are 0: shifted left by 23 they
    // leave n · 2^23, n in the exponent field.
    f32::from_bits(y.to_bits().wrapping_add(t.to_bits() << 23))
}

/// `e^x = y · 2^n` for `x` clamped to [−87.33, 88]: `y = e^r` (r = x − n·ln 2, |r| ≤ ln 2 / 2)
/// and `t = x·log2 e + 1.5·2^23`, the float whose low mantissa bits hold `n` (in [−126, 127]).
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn exp_parts<const FMA: bool>(x: f32) -> (f32, f32) {
    // Clamped so that n = round(x·log2 e) lies in [−126, 127]: 2^n is one normal number.
    let x = fmin(fmax(x, -87.33), 88.0);
    // Round to nearest by adding 1.5·2^23: the integer lands in the mantissa's low bits.
    let t = madd::<FMA>(x, std::f32::consts::LOG2_E, MAGIC);
    let nf = t - MAGIC;
    // r = x − n·ln 2, with ln 2 in two parts (Cephes' C1 + C2) so the product is exact.
    let r = madd::<FMA>(nf, -0.693_359_375, x);
    let r = madd::<FMA>(nf, 2.121_944_4e-4, r);
    // Cephes expf's minimax polynomial for e^r − 1 − r over |r| ≤ ln2/2.
    let mut p = 1.987_569_15e-4;
    p = madd::<FMA>(p, r, 1.398_199_95e-3);
    p = madd::<FMA>(p, r, 8.333_451_9e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_55e-1);
    p = madd::<FMA>(p, r, 5.000_000_1e-1);
    (madd::<FMA>(p, r * r, r) + 1.0, t)
}

/// `2^y` in f32 for `y` in [−126, 127] (held at −126 below; a `y` above 127 or NaN is not
/// allowed: GELU's `y` is below −1): the normal range, where the result is `v · 2^n` with
/// `2^n` one normal power of two and `v ≥ 1` at n = −126, so the result is normal and its
/// exponent field is `v`'s plus `n` — one integer add, no multiply. Relative error below
/// 2^-22 (2 ulp). (Its general form, for `y` down to −150, scaled by two powers of two so
/// that a subnormal result rounds once: GELU's only use keeps `y ≥ −126`, and the single
/// scaling gives the same bits — see `exp2_matches_the_two_scaling_form` — in 0.85–0.87 of
/// GELU's time, 512 × 768…4096, in-process A/B, three runs. The integer add in place of the
/// multiply by 2^n, no upper clamp, and [`gelu_erf_last`] taking −a for its clamped factor:
/// 0.87–0.90 of GELU's time again, the same bits, two runs of 300 alternated rounds.)
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn exp2<const FMA: bool>(y: f32) -> f32 {
    let (v, t) = exp2_rounded::<FMA>(fmax(y, -126.0));
    // `t`'s bits are MAGIC's plus n, and MAGIC's low 9 bits are 0: shifted left by 23 they
    // leave n · 2^23, n in the exponent field.
    f32::from_bits(v.to_bits().wrapping_add(t.to_bits() << 23))
}

/// `2^y = v · 2^n` for `y` in [−150, 127] as `v` and `t = y + 1.5·2^23` (the float whose low
/// mantissa bits hold `n`, the nearest integer to `y`): `v = 2^(y − n)` from Cephes exp2f's
/// polynomial (|y − n| ≤ 1/2).
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn exp2_rounded<const FMA: bool>(y: f32) -> (f32, f32) {
    // Round to nearest by adding 1.5·2^23: the integer lands in the mantissa's low bits.
    let t = y + MAGIC;
    let f = y - (t - MAGIC);
    // Cephes exp2f's minimax polynomial for 2^f − 1 over |f| ≤ 1/2.
    let mut p = 1.535_336_188_319_500e-4;
    p = madd::<FMA>(p, f, 1.339_887_440_266_574e-3);
    p = madd::<FMA>(p, f, 9.618_437_357_674_640e-3);
    p = madd::<FMA>(p, f, 5.550_332_471_162_809e-2);
    p = madd::<FMA>(p, f, 2.402_264_791_363_012e-1);
    p = madd::<FMA>(p, f, 6.931_472_028_550_421e-1);
    (madd::<FMA>(p, f, 1.0), t)
}

/// 1.5·2^23: a float in [2^23, 2^24) whose ulp is 1, so adding it rounds to an integer.
const MAGIC: f32 = 12_582_912.0;

/// `2^y = v · 2^n` for `y` in [−150, 127]: `n` the nearest integer to `y`, `v = 2^(y − n)`
/// ([`exp2_rounded`]).
#[cfg(test)]
fn exp2_parts<const FMA: bool>(y: f32) -> (f32, i32) {
    let (v, t) = exp2_rounded::<FMA>(y);
    (v, t.to_bits() as i32 - MAGIC.to_bits() as i32)
}

/// GELU, erf form, as `x·Φ(x)` with `Φ(−a)` (a = |x|) from a (5, 3) rational fit of
/// `log2 Φ(−a)`: the form of the CUDA kernels (`gelu_erf` in `shaders/cuda/common.cuh`,
/// coefficients from `xtask/src/fast_gelu_erf_fit.py`, proven there with the GPU's
/// approximate `2^x` and reciprocal), here with an exact division and [`exp2`]. No
/// cancellation: `x − a·Φ(−a)` for x ≥ 0 and `x·Φ(−a)` for x < 0, one fused multiply-add.
/// Where Φ(−a) is below the normal range it is held at 2^-126 (the results are then x, or
/// below 2e-37 in magnitude: no subnormal numbers, see [`gelu_erf_last`]); NaN stays NaN, ±Inf
/// gives ±Inf and ±0 keeps its sign.
///
/// In two stages (see [`Staged`]): this one gives `log2 Φ(−a)`, [`gelu_erf_last`] the rest.
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn gelu_erf_first<const FMA: bool>(x: f32) -> f32 {
    // A NaN x gives a = 13.3 here (`fmin` takes the second operand) and NaN from the last step.
    let a = fmin(x.abs(), 13.3);
    let mut n = madd::<FMA>(-0.009_080_849_59, a, -0.099_625_259_6);
    n = madd::<FMA>(n, a, -0.464_242_965);
    n = madd::<FMA>(n, a, -1.095_756_53);
    n = madd::<FMA>(n, a, -1.151_103_38);
    n *= a;
    let mut d = madd::<FMA>(0.012_598_881_5, a, 0.137_181_506);
    d = madd::<FMA>(d, a, 0.552_969_098);
    d = madd::<FMA>(d, a, 1.0);
    n / d - 1.0
}

/// GELU's erf form from `x` and `t = log2 Φ(−|x|)` ([`gelu_erf_first`]).
#[inline(always)]
fn gelu_erf_last<const FMA: bool>(x: f32, t: f32) -> f32 {
    let a = fmin(x.abs(), 13.3);
    // No subnormal number anywhere below for a normal x: on x86 each subnormal result costs a
    // microcode assist (about 100 cycles; with Φ(−a) held at 2^-149 instead, GELU of inputs
    // spread on [−20, 20] ran 11× slower than on [−12, 12]). So Φ(−a) below the normal range
    // (a > 13.0) is held at 2^-126, the smallest normal number, and below −13.3 (where a is
    // clamped) the product takes −13.3 for x: the result is then at most 1.6e-37 in
    // magnitude, inside `gelu_error_bound`'s absolute floor. −∞ keeps −∞, as `apply_f32`.
    let q = exp2::<FMA>(t);
    // max(x, 0) keeping NaN and −0, and −∞ (which the product below cannot make).
    let pos = if x >= 0.0 || x.is_nan() || x == f32::NEG_INFINITY { x } else { 0.0 };
    // −a is x for x < 0 (down to −13.3) and −x for x ≥ 0; −13.3 for NaN and ±∞ (`fmin` took
    // the second operand), where `pos` gives the result.
    madd::<FMA>(-a, q, pos)
}

/// GELU, tanh form: `x · sigmoid(2u)` as in `apply_f32`, in three stages (see [`Staged`]):
/// this one gives the clamped exponent `−2u`, then [`exp`], then [`gelu_tanh_last`].
#[inline(always)]
fn gelu_tanh_first<const FMA: bool>(x: f32) -> f32 {
    // A NaN x is clamped to a number here; the final quotient is NaN.
    let xc = fmin(fmax(x, -20.0), 20.0);
    let u = 0.797_884_6 * xc * madd::<FMA>(0.044_715 * xc, xc, 1.0);
    fmin(fmax(-2.0 * u, -88.0), 88.0)
}

/// GELU's tanh form from `x` and `e = e^−2u`.
#[inline(always)]
fn gelu_tanh_last(x: f32, e: f32) -> f32 {
    x / (1.0 + e)
}

/// SiLU, `x·σ(x)`, in two stages (see [`Staged`]): `e = e^−|x|` (so `1 + e` lies in [1, 2]),
/// then [`silu_last`].
#[inline(always)]
fn silu_first<const FMA: bool>(x: f32) -> f32 {
    // A NaN x gives a number here (the clamps in `exp` take their second operand).
    exp::<FMA>(-x.abs())
}

/// SiLU from `x` and `e = e^−|x|`, with one quotient `v = e / (1 + e)`: `x − x·v` for x ≥ 0
/// (`x·v` is at most x/2, so its rounding is halved; `min(x, 88)` keeps +Inf from meeting a
/// 0 `v`, and −0 gives +0, as `apply_f32`), `x·v` for x < 0, and −0 below
/// [`SILU_CUTOFF`](tilekit_kernels::activation::SILU_CUTOFF). NaN takes the negative side (every
/// comparison is false) and gives NaN.
#[inline(always)]
fn silu_last<const FMA: bool>(x: f32, e: f32) -> f32 {
    let v = e / (1.0 + e);
    let pos = madd::<FMA>(-fmin(x, 88.0), v, x);
    let neg = if x < tilekit_kernels::activation::SILU_CUTOFF { -0.0 } else { x * v };
    if x >= 0.0 { pos } else { neg }
}

/// `max(x, 0)`, NaN kept, −0 → +0 (as `apply_f32`).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x <= 0.0 { 0.0 } else { x }
}

/// `clamp(x, 0, 6)`, NaN kept, −0 kept (as `f32::clamp`).
#[inline(always)]
fn relu6(x: f32) -> f32 {
    let y = if x < 0.0 { 0.0 } else { x };
    if y > 6.0 { 6.0 } else { y }
}

/// `out = f(x + bias)` elementwise for the exact forms (no add without a bias); `x` is `None`
/// in place (read from `out`).
#[inline(always)]
fn map_exact<F: Fn(f32) -> f32>(f: F, x: Option<&[f32]>, bias: Option<&[f32]>, out: &mut [f32]) {
    match (x, bias) {
        (Some(x), Some(b)) => out.iter_mut().zip(x).zip(b).for_each(|((o, &x), &b)| *o = f(x + b)),
        (Some(x), None) => out.iter_mut().zip(x).for_each(|(o, &x)| *o = f(x)),
        (None, Some(b)) => out.iter_mut().zip(b).for_each(|(v, &b)| *v = f(*v + b)),
        (None, None) => out.iter_mut().for_each(|v| *v = f(*v)),
    }
}

/// Elements per block of a [`Staged`] activation (1 KiB of f32 per buffer, in L1).
const STAGE: usize = 256;

/// A transcendental activation computed block by block in stages, each stage one loop over
/// the block: `first(pre)`, then `mid` over those values (if any), then `last(pre, value)`,
/// where `pre` is the input plus its bias. Each stage's dependency chain is short (a
/// polynomial, an `exp`, a quotient), so the out-of-order core overlaps many iterations of
/// one loop; fused into one loop, the 60–100 cycles from an input to its result kept too
/// few iterations in flight. In-process A/B against the same stages fused into one loop (AVX2,
/// 2 threads, 512 × 3072): GELU 0.90 → 0.66 ms, GELU (tanh) 0.75 → 0.61, SiLU 0.62 → 0.47.
struct Staged<F, M, L> {
    first: F,
    mid: Option<M>,
    last: L,
}

impl<F: Fn(f32) -> f32, M: Fn(f32) -> f32, L: Fn(f32, f32) -> f32> Staged<F, M, L> {
    /// `out = act(x + bias)`; `x` is `None` in place (read from `out`).
    #[inline(always)]
    fn run(&self, x: Option<&[f32]>, bias: Option<&[f32]>, out: &mut [f32]) {
        let mut t = [0.0f32; STAGE];
        for start in (0..out.len()).step_by(STAGE) {
            let end = (start + STAGE).min(out.len());
            let (o, t) = (&mut out[start..end], &mut t[..end - start]);
            let (x, b) = (x.map(|x| &x[start..end]), bias.map(|b| &b[start..end]));
            // Stage one from the inputs (plus bias) into `t`.
            let first = &self.first;
            match (x, b) {
                (Some(x), None) => t.iter_mut().zip(x).for_each(|(t, &p)| *t = first(p)),
                (Some(x), Some(b)) => t.iter_mut().zip(x).zip(b).for_each(|((t, &p), &b)| *t = first(p + b)),
                (None, None) => t.iter_mut().zip(o.iter()).for_each(|(t, &p)| *t = first(p)),
                (None, Some(b)) => t.iter_mut().zip(o.iter()).zip(b).for_each(|((t, &p), &b)| *t = first(p + b)),
            }
            if let Some(mid) = &self.mid {
                t.iter_mut().for_each(|t| *t = mid(*t));
            }
            // The last stage from the inputs (plus bias, added again) and `t` into `out`.
            let last = &self.last;
            match (x, b) {
                (Some(x), None) => o.iter_mut().zip(x).zip(t.iter()).for_each(|((o, &p), &t)| *o = last(p, t)),
                (Some(x), Some(b)) => {
                    o.iter_mut().zip(x).zip(b).zip(t.iter()).for_each(|(((o, &p), &b), &t)| *o = last(p + b, t))
                }
                (None, None) => o.iter_mut().zip(t.iter()).for_each(|(o, &t)| *o = last(*o, t)),
                (None, Some(b)) => o.iter_mut().zip(b).zip(t.iter()).for_each(|((o, &b), &t)| *o = last(*o + b, t)),
            }
        }
    }
}

/// No middle stage.
type NoMid = fn(f32) -> f32;

/// `out = act(x + bias)` elementwise; `x` is `None` in place (read from `out`).
#[inline(always)]
fn map_any<const FMA: bool>(act: Activation, x: Option<&[f32]>, bias: Option<&[f32]>, out: &mut [f32]) {
    match act {
        Activation::None => map_exact(|x| x, x, bias, out),
        Activation::Relu => map_exact(relu, x, bias, out),
        Activation::Relu6 => map_exact(relu6, x, bias, out),
        Activation::Gelu => {
            Staged { first: gelu_erf_first::<FMA>, mid: None::<NoMid>, last: gelu_erf_last::<FMA> }.run(x, bias, out)
        }
        Activation::GeluTanh => {
            Staged { first: gelu_tanh_first::<FMA>, mid: Some(exp::<FMA>), last: gelu_tanh_last }.run(x, bias, out)
        }
        Activation::Silu => {
            Staged { first: silu_first::<FMA>, mid: None::<NoMid>, last: silu_last::<FMA> }.run(x, bias, out)
        }
        // Every variant there is is matched above; the arm exists because `Activation` is
        // `#[non_exhaustive]`. A variant added without a CPU kernel fails the `Activation::ALL` tests.
        other => unreachable!("{other:?} reached the CPU activation kernel"),
    }
}

#[inline(always)]
fn map_inner<const FMA: bool>(act: Activation, x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    map_any::<FMA>(act, Some(x), bias, out);
}

#[inline(always)]
fn map_in_place_inner<const FMA: bool>(act: Activation, v: &mut [f32], bias: Option<&[f32]>) {
    map_any::<FMA>(act, None, bias, v);
}

multiversion! {
    /// `out = act(x + bias)` elementwise in the autovectorised forms.
    fn map_auto(act: Activation, x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) => map_inner
}

multiversion! {
    /// `v = act(v + bias)` elementwise in place in the autovectorised forms.
    fn map_in_place_auto(act: Activation, v: &mut [f32], bias: Option<&[f32]>) => map_in_place_inner
}

/// `out = act(x + bias)` elementwise (`x`, `bias`, `out` of one length): the transcendental
/// forms in AVX-512 intrinsics where `isa` is AVX-512 (see [`avx512`]), everything else
/// autovectorised for `isa`.
pub(crate) fn map(isa: Isa, act: Activation, x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && avx512::handles(act) {
        // SAFETY: `Isa::Avx512` is only made after the CPU reported AVX-512F and AVX-512DQ
        // (and AVX2, FMA and F16C: `simd.rs`).
        return unsafe { avx512::run(act, Some(x), bias, out) };
    }
    map_auto(isa, act, x, bias, out);
}

/// `v = act(v + bias)` elementwise in place (`bias` as long as `v`), as [`map`].
pub(crate) fn map_in_place(isa: Isa, act: Activation, v: &mut [f32], bias: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && avx512::handles(act) {
        // SAFETY: as in `map`.
        return unsafe { avx512::run(act, None, bias, v) };
    }
    map_in_place_auto(isa, act, v, bias);
}

/// Below this many elements an activation runs on the calling thread: at ~0.3 ns per element
/// it is then done in the few µs a hand-off to the thread pool would cost.
const PARALLEL_MIN: usize = 1 << 15;

/// Elements per parallel task above [`PARALLEL_MIN`] (256 KiB of f32: enough work to amortise
/// the pool's per-task cost many times over).
const TASK: usize = 1 << 16;

/// Elements per pass through the stack buffer of half-precision storage (16 KiB of f32, L1).
const HALF_CHUNK: usize = 4096;

/// An elementwise activation with an optional bias broadcast along the last dimension.
pub(super) struct Act<'d> {
    pub(super) desc: ActivationDesc,
    pub(super) bias: Option<&'d [f32]>,
}

impl Act<'_> {
    /// `out = act(x + bias)`; `x` is `None` in place (read from `out`).
    pub(super) fn run<E: Elem>(&self, x: Option<&CpuData>, out: &mut [E]) -> Result<()> {
        let len = self.desc.len;
        let x = x.map(|x| typed::<E>(x, "x")).transpose()?;
        let bias = match (self.desc.bias_len, self.bias) {
            (Some(bl), Some(b)) if bl > 0 && b.len() >= bl => Some(&b[..bl]),
            (None, _) => None,
            _ => return Err(internal("activation bias shorter than its length".into())),
        };
        if out.len() < len || x.is_some_and(|x| x.len() < len) {
            return Err(internal("activation buffers shorter than the descriptor".into()));
        }
        let isa = Isa::detect();
        let act = self.desc.activation;
        let out = &mut out[..len];
        let x = x.map(|x| &x[..len]);
        if len < PARALLEL_MIN {
            chunk(isa, act, x, bias, out, 0);
        } else {
            let f = |i: usize, o: &mut [E]| {
                let base = i * TASK;
                chunk(isa, act, x.map(|x| &x[base..base + o.len()]), bias, o, base);
            };
            for_each_chunk_mut(out, TASK, f);
        }
        Ok(())
    }
}

/// One contiguous piece of an activation: `out` (and `x`) start at element `base` of the
/// tensor, which fixes the bias phase.
fn chunk<E: Elem>(isa: Isa, act: Activation, x: Option<&[E]>, bias: Option<&[f32]>, out: &mut [E], base: usize) {
    // f32 storage is computed where it lies; half precision through a stack buffer.
    if let Some(o) = E::as_f32_mut(out) {
        let x = x.and_then(E::as_f32);
        segments(o.len(), base, bias, |r, b| match x {
            Some(x) => map(isa, act, &x[r.clone()], b, &mut o[r]),
            None => map_in_place(isa, act, &mut o[r], b),
        });
        return;
    }
    // On AVX-512 the transcendental forms convert as they load and store (one pass).
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && avx512::handles(act) {
        /// The forms over `out`, split at the bias period.
        fn forms<T: avx512::Io>(act: Activation, x: Option<&[T]>, bias: Option<&[f32]>, out: &mut [T], base: usize) {
            // SAFETY: `Isa::Avx512` (checked by the caller) is only made after the CPU reported
            // AVX-512F, AVX-512DQ and F16C.
            segments(out.len(), base, bias, |r, b| unsafe {
                avx512::run(act, x.map(|x| &x[r.clone()]), b, &mut out[r])
            });
        }
        const SAME: &str = "x and out are of one type";
        if let Some(o) = E::as_f16_mut(out) {
            return forms(act, x.map(|x| E::as_f16(x).expect(SAME)), bias, o, base);
        }
        if let Some(o) = E::as_bf16_mut(out) {
            let x = x.map(|x| E::as_bf16(x).expect(SAME));
            if avx512::native_bf16() {
                // SAFETY: as above, and the CPU reported AVX512_BF16.
                return segments(o.len(), base, bias, |r, b| unsafe {
                    avx512::run_native_bf16(act, x.map(|x| &x[r.clone()]), b, &mut o[r])
                });
            }
            return forms(act, x, bias, o, base);
        }
    }
    let mut buf = [0.0f32; HALF_CHUNK];
    for start in (0..out.len()).step_by(HALF_CHUNK) {
        let end = (start + HALF_CHUNK).min(out.len());
        let buf = &mut buf[..end - start];
        match x {
            Some(x) => E::widen_into(&x[start..end], buf),
            None => E::widen_into(&out[start..end], buf),
        }
        segments(buf.len(), base + start, bias, |r, b| map_in_place(isa, act, &mut buf[r], b));
        E::narrow_into(buf, &mut out[start..end]);
    }
}

/// Splits `0..len` (elements `base..base + len` of the tensor) at the bias period and calls
/// `f(range, bias slice of that range)`; one call for all of it without a bias.
fn segments(len: usize, base: usize, bias: Option<&[f32]>, mut f: impl FnMut(std::ops::Range<usize>, Option<&[f32]>)) {
    let Some(b) = bias else { return f(0..len, None) };
    let mut j = base % b.len();
    let mut i = 0;
    while i < len {
        let n = (b.len() - j).min(len - i);
        f(i..i + n, Some(&b[j..j + n]));
        i += n;
        j = 0;
    }
}

/// `v = act(v)` in place, for kernels already compiled for an instruction set (`FMA` as
/// theirs). The transcendental forms go through [`map_in_place`] for the instruction set
/// this thread detects (one call, not inlined: AVX-512 where the CPU has it); the exact ones
/// are inlined into the caller's copy.
#[inline(always)]
pub(super) fn apply_isa<const FMA: bool>(act: Activation, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if FMA && avx512::handles(act) {
        return map_in_place(Isa::detect(), act, v, None);
    }
    map_in_place_inner::<FMA>(act, v, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::tests::PageEnd;

    /// The f32 values at which each form is checked against `apply_f32` bit for bit in what
    /// it promises for non-finite inputs.
    const SPECIAL: [f32; 12] =
        [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, -f32::MAX, 1e-40, -1e-40, -13.1, -89.0, 6.0];

    /// Both GELU forms and SiLU over a dense sweep of [−20, 20] (every 2^-12, ~164k points, plus the
    /// neighbourhood of 0 in a geometric sweep) in every instruction set this CPU has: the
    /// worst error against the f64 reference, as a fraction of `gelu_error_bound`, is printed
    /// and must stay at most 1 (`Activation::error_bound`).
    #[test]
    fn sweep_stays_inside_the_documented_bound() {
        let mut xs: Vec<f32> = (-(20 << 12)..=(20 << 12)).map(|i| i as f32 / 4096.0).collect();
        xs.extend((0..200).flat_map(|i| {
            let v = 1e-30f32 * 1.5f32.powi(i);
            [v, -v]
        }));
        // Every multiple of 1/8 over [−32, 32] and its two neighbours: the AVX-512 tables'
        // interval edges (width ¼ for the GELUs, out to ±7.875, and 1 for SiLU, out to ±15.5)
        // and the inputs where their lanes go over to the formula forms (−7.75, −6, ±15).
        xs.extend((-256..=256).flat_map(|i| {
            let v = i as f32 / 8.0;
            [v.next_down(), v, v.next_up()]
        }));
        for isa in Isa::available() {
            for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
                let mut out = vec![0.0f32; xs.len()];
                map(isa, act, &xs, None, &mut out);
                let mut worst = (0.0f64, 0.0f32);
                for (&x, &g) in xs.iter().zip(&out) {
                    let r = act.apply_f64(x as f64);
                    let bound = act.error_bound(x as f64, r);
                    let err = (g as f64 - r).abs();
                    assert!(err <= bound, "{isa:?} {act}({x}): {g:e} vs {r:e}, error {err:e} > {bound:e}");
                    if err / bound > worst.0 {
                        worst = (err / bound, x);
                    }
                }
                eprintln!("{isa:?} {act}: worst error {:.3} of the bound, at x = {}", worst.0, worst.1);
            }
        }
    }

    /// `exp2` (one scaling by 2^n) gives the bits of the general form (2^n as two powers of two,
    /// so that a subnormal result rounds once) over its whole range, every 2^-12 from −126 to
    /// 127 and the ends, with and without fused multiply-adds.
    #[test]
    fn exp2_matches_the_two_scaling_form() {
        fn two_scalings<const FMA: bool>(y: f32) -> f32 {
            let (v, n) = exp2_parts::<FMA>(y);
            let (n1, n2) = (n >> 1, n - (n >> 1));
            v * f32::from_bits(((n1 + 127) as u32) << 23) * f32::from_bits(((n2 + 127) as u32) << 23)
        }
        let ys = (-(126 << 12)..=(127 << 12)).map(|i| i as f32 / 4096.0).chain([-126.0, 127.0, -125.999_99]);
        for y in ys {
            assert_eq!(exp2::<true>(y).to_bits(), two_scalings::<true>(y).to_bits(), "2^{y}");
            assert_eq!(exp2::<false>(y).to_bits(), two_scalings::<false>(y).to_bits(), "2^{y}");
            assert!(exp2::<true>(y).is_normal(), "2^{y}");
        }
        // Below the range it is held at 2^-126, NaN too.
        assert_eq!(exp2::<true>(-200.0), f32::MIN_POSITIVE);
        assert_eq!(exp2::<true>(f32::NAN), f32::MIN_POSITIVE);
    }

    /// `exp` (2^n added to the exponent field) gives the bits of `y · 2^n` multiplied out, every
    /// 2^-10 over [−100, 100] and the clamps' ends, with and without fused multiply-adds; and
    /// every result is normal.
    #[test]
    fn exp_scales_in_the_exponent_field() {
        fn multiplied<const FMA: bool>(x: f32) -> f32 {
            let (y, t) = exp_parts::<FMA>(x);
            let n = t.to_bits() as i32 - MAGIC.to_bits() as i32;
            y * f32::from_bits(((n + 127) as u32) << 23)
        }
        let xs = (-(100 << 10)..=(100 << 10)).map(|i| i as f32 / 1024.0).chain([-87.33, -87.329_99, 88.0, -1e30, 1e30]);
        for x in xs {
            assert_eq!(exp::<true>(x).to_bits(), multiplied::<true>(x).to_bits(), "e^{x}");
            assert_eq!(exp::<false>(x).to_bits(), multiplied::<false>(x).to_bits(), "e^{x}");
            assert!(exp::<true>(x).is_normal() && exp::<false>(x).is_normal(), "e^{x}");
        }
    }

    /// No subnormal result for a normal input of magnitude 1e-30 or more, in every form and
    /// instruction set: each one would cost a microcode assist on x86 (see [`gelu_erf_last`]).
    /// Inputs every 2^-6 over [−100, 100] and out to ±f32::MAX.
    #[test]
    fn results_are_never_subnormal() {
        let mut xs: Vec<f32> = (-(100 << 6)..=(100 << 6)).map(|i| i as f32 / 64.0).filter(|x| *x != 0.0).collect();
        xs.extend((0..60).flat_map(|i| {
            let v = 1e-30f32 * 10f32.powi(i);
            [v, -v]
        }));
        xs.extend([f32::MAX, -f32::MAX]);
        for isa in Isa::available() {
            for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
                let mut out = vec![0.0f32; xs.len()];
                map(isa, act, &xs, None, &mut out);
                for (&x, &g) in xs.iter().zip(&out) {
                    assert!(!g.is_subnormal(), "{isa:?} {act}({x}) = {g:e} is subnormal");
                }
            }
        }
    }

    /// Non-finite and extreme inputs give exactly what `apply_f32` gives (NaN for NaN).
    #[test]
    fn special_values_match_the_scalar_formula() {
        for isa in Isa::available() {
            for act in Activation::ALL {
                let mut out = vec![0.0f32; SPECIAL.len()];
                map(isa, act, &SPECIAL, None, &mut out);
                for (&x, &g) in SPECIAL.iter().zip(&out) {
                    let want = act.apply_f32(x);
                    let same = (want.is_nan() && g.is_nan())
                        || want == g && want.is_sign_negative() == g.is_sign_negative()
                        || (!act.is_exact() && x.is_finite() && (g - want).abs() <= 1e-6);
                    assert!(same, "{isa:?} {act}({x}) = {g:e}, apply_f32 gives {want:e}");
                }
            }
        }
    }

    /// ReLU and ReLU6 with a bias equal `apply_f32(x + b)` exactly, at every length from 0 to
    /// 70 (every SIMD remainder) and in place.
    #[test]
    fn relu_forms_are_exact_at_every_remainder() {
        for isa in Isa::available() {
            for act in [Activation::None, Activation::Relu, Activation::Relu6] {
                for len in 0..70 {
                    let x: Vec<f32> = (0..len).map(|i| (i as f32 - 30.0) * 0.37).collect();
                    let b: Vec<f32> = (0..len).map(|i| (i % 7) as f32 - 3.0).collect();
                    let mut out = vec![0.0f32; len];
                    // The operands end at an inaccessible page: a read past them faults.
                    let (xg, bg) = (PageEnd::new(&x), PageEnd::new(&b));
                    map(isa, act, xg.get(), Some(bg.get()), &mut out);
                    let mut inplace = x.clone();
                    map_in_place(isa, act, &mut inplace, Some(bg.get()));
                    for i in 0..len {
                        let want = act.apply_f32(x[i] + b[i]);
                        assert_eq!(out[i].to_bits(), want.to_bits(), "{isa:?} {act} len {len} at {i}");
                        assert_eq!(inplace[i].to_bits(), want.to_bits(), "{isa:?} {act} in place");
                    }
                }
            }
        }
    }

    /// The staged forms equal their stages composed element by element, bit for bit, at
    /// lengths around the block edges, with and without a bias, in place and not. The
    /// AVX-512 forms (intrinsics: tables, and a reciprocal estimate with no scalar model) are
    /// held to themselves one element at a time instead: each element alone in a masked tail
    /// gives the bits it gets in a full vector, a full block, a partial block, with a bias
    /// added before or in place, next to lanes that take the table or the formula form.
    #[test]
    fn staged_forms_match_their_stages_at_every_block_edge() {
        for isa in Isa::available() {
            for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
                for len in [0, 1, 7, 8, 9, STAGE - 1, STAGE, STAGE + 1, 2 * STAGE + 5, 5 * STAGE - 3] {
                    let x: Vec<f32> = (0..len).map(spread).collect();
                    let b: Vec<f32> = (0..len).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
                    // The operands end at an inaccessible page: a read past them faults.
                    let (xg, bg) = (PageEnd::new(&x), PageEnd::new(&b));
                    for bias in [None, Some(bg.get())] {
                        let pre: Vec<f32> =
                            x.iter().enumerate().map(|(i, &v)| v + bias.map_or(0.0, |b| b[i])).collect();
                        let mut want = vec![0.0f32; len];
                        if intrinsics(isa, act) {
                            for (w, p) in want.chunks_mut(1).zip(pre.chunks(1)) {
                                map(isa, act, p, None, w);
                            }
                        } else {
                            composed(isa, act, &pre, &mut want);
                        }
                        let mut out = vec![0.0f32; len];
                        map(isa, act, xg.get(), bias, &mut out);
                        let mut inplace = x.clone();
                        map_in_place(isa, act, &mut inplace, bias);
                        for i in 0..len {
                            let w = want[i].to_bits();
                            assert_eq!(out[i].to_bits(), w, "{isa:?} {act} len {len} bias {} at {i}", bias.is_some());
                            assert_eq!(inplace[i].to_bits(), w, "{isa:?} {act} len {len} in place at {i}");
                        }
                    }
                }
            }
        }
    }

    /// Test input `i`: within ±9 (every form's table and the GELUs' negative tails), and
    /// every eleventh within ±36 (SiLU's tail).
    fn spread(i: usize) -> f32 {
        (i as f32 * 0.731).sin() * if i % 11 == 3 { 36.0 } else { 9.0 }
    }

    /// Whether `map` computes `act` in `isa` with the AVX-512 intrinsics.
    fn intrinsics(isa: Isa, act: Activation) -> bool {
        #[cfg(target_arch = "x86_64")]
        return isa == Isa::Avx512 && avx512::handles(act);
        #[cfg(not(target_arch = "x86_64"))]
        return false;
    }

    /// On AVX-512, half-precision storage is converted as the forms load and store it
    /// (`chunk`): the bits of the tensor widened, activated in f32 and rounded (`convert.rs`),
    /// at lengths around the block edges, with a bias of the whole length, a bias period
    /// shorter than it (starting mid-period), and none, in place and not, on values that
    /// round and on ±0, ±∞, quiet and signalling NaNs and subnormals.
    #[test]
    fn half_storage_converted_in_the_forms_matches_widening_first() {
        if !intrinsics(Isa::detect(), Activation::Gelu) {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        fn check<E: Elem + std::fmt::Debug>(specials: &[E], from: impl Fn(f32) -> E, bits: impl Fn(E) -> u16) {
            let isa = Isa::detect();
            for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
                for len in [1, 5, 16, 17, STAGE - 1, STAGE, STAGE + 3, 3 * STAGE + 21] {
                    let mut x: Vec<E> = (0..len).map(|i| from(spread(i))).collect();
                    for (i, &v) in specials.iter().enumerate() {
                        if i * 7 < len {
                            x[i * 7] = v;
                        }
                    }
                    let mut wide = vec![0.0f32; len];
                    E::widen_into(&x, &mut wide);
                    let whole: Vec<f32> = (0..len).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
                    let period: Vec<f32> = (0..37).map(|i| (i % 3) as f32 * 0.5 - 0.5).collect();
                    for (bias, base) in [(None, 0), (Some(&whole[..]), 0), (Some(&period[..]), 5)] {
                        let pre: Vec<f32> =
                            (0..len).map(|i| bias.map_or(wide[i], |b| wide[i] + b[(base + i) % b.len()])).collect();
                        let mut act32 = vec![0.0f32; len];
                        map(isa, act, &pre, None, &mut act32);
                        let mut want = x.clone();
                        E::narrow_into(&act32, &mut want);
                        let mut out = x.clone();
                        chunk(isa, act, Some(&x), bias, &mut out, base);
                        let mut inplace = x.clone();
                        chunk(isa, act, None, bias, &mut inplace, base);
                        for i in 0..len {
                            let w = bits(want[i]);
                            assert_eq!(bits(out[i]), w, "{act} len {len} bias {} at {i}: {:?}", bias.is_some(), x[i]);
                            assert_eq!(bits(inplace[i]), w, "{act} len {len} in place at {i}: {:?}", x[i]);
                        }
                    }
                }
            }
        }
        use half::{bf16, f16};
        let f16s = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFD55, 0x8000, 0x0000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF];
        check(&f16s.map(f16::from_bits), f16::from_f32, f16::to_bits);
        let bf16s = [0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFA5, 0x8000, 0x0000, 0x0001, 0x807F, 0x7F7F, 0xFF7F];
        check(&bf16s.map(bf16::from_bits), bf16::from_f32, bf16::to_bits);
    }

    /// Each transcendental form's stages composed in one loop (the order `Staged` runs them).
    #[inline(always)]
    fn composed_inner<const FMA: bool>(act: Activation, x: &[f32], out: &mut [f32]) {
        let f = |p: f32| match act {
            Activation::Gelu => gelu_erf_last::<FMA>(p, gelu_erf_first::<FMA>(p)),
            Activation::GeluTanh => gelu_tanh_last(p, exp::<FMA>(gelu_tanh_first::<FMA>(p))),
            Activation::Silu => silu_last::<FMA>(p, silu_first::<FMA>(p)),
            other => unreachable!("{other:?} has no stages"),
        };
        out.iter_mut().zip(x).for_each(|(o, &p)| *o = f(p));
    }

    multiversion! {
        fn composed(act: Activation, x: &[f32], out: &mut [f32]) => composed_inner
    }

    /// `exp` against f64 over its range: within 2 ulp where the result is normal, and held
    /// at e^−87.33 (normal, within 2 ulp of it) below.
    #[test]
    fn exp_is_accurate() {
        for isa in Isa::available() {
            let xs: Vec<f32> = (-1000..=879).map(|i| i as f32 / 10.0 + 0.0123).collect();
            let mut out = vec![0.0f32; xs.len()];
            // exp through the tanh form is not separable; check it directly per instruction set.
            exp_slice(isa, &xs, &mut out);
            let floor = f64::from(-87.33f32).exp();
            for (&x, &g) in xs.iter().zip(&out) {
                let r = if x < -87.33 { floor } else { (x as f64).exp() };
                assert!(r > f32::MIN_POSITIVE as f64, "the clamp keeps results normal");
                assert!(((g as f64 - r) / r).abs() < 2.5e-7, "{isa:?} exp({x}) = {g:e} vs {r:e}");
            }
        }
    }

    #[inline(always)]
    fn exp_inner<const FMA: bool>(x: &[f32], out: &mut [f32]) {
        out.iter_mut().zip(x).for_each(|(o, &x)| *o = exp::<FMA>(x));
    }

    multiversion! {
        fn exp_slice(x: &[f32], out: &mut [f32]) => exp_inner
    }
}
