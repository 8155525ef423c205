//! GELU (erf and tanh forms) and SiLU in AVX-512 intrinsics, from tables of polynomials.
//!
//! Each of the three is `x·g(x)` with a gate `g` (Φ, `σ(2u)`, `σ`) for which
//! `g(x) = 1 − g(−x)`, so one table of `g` on `a = −|x| ≤ 0` serves both signs:
//! `act(x) = max(x, 0) + a·g(a)` in one fused multiply-add, which is `x − x·g(−x)` for x ≥ 0
//! and `x·g(x)` below, neither cancelling ([`gated`]). The table ([`Table`]) holds polynomials
//! of degree 6, one per interval of width `w`, each interpolating the f64 reference at
//! Chebyshev nodes; it is built on first use. The GELUs take 32 intervals of width ¼, SiLU 16
//! of width 1 ([`Form::PIECES`]). Per 16 lanes the compiled loop has 19 vector instructions
//! besides the load, the store and register copies (`vpermt2ps` overwrites a table register;
//! read off `perf annotate`):
//!
//! - `a = −min(|x|, (PIECES − 1)·w)`, one `vrangeps`;
//! - the interval, from the low bits of `a + 1.5·2^23·w` (one addition, no conversion), and
//!   the offset in it, one `vreduceps` (exact);
//! - seven coefficient picks and six multiply-adds for the gate: with 32 intervals each pick
//!   is a `vpermt2ps` (one of 32 lanes held in two registers), with 16 a `vpermps` (one of
//!   16 in one register);
//! - `max(0, x)` and one multiply-add for the result, and one comparison for the lanes that
//!   take the formula form (below).
//!
//! A formula form (a rational fit or an `exp`, then a quotient) takes about 30. At 512 × 3072
//! on a 2-core Xeon (2 threads) GELU took 0.25 ms against 0.32–0.33 with the formula form,
//! GELU-tanh 0.25 against 0.36–0.39, SiLU (512 × 4096) 0.33 against 0.41–0.43.
//!
//! On Zen 4, which splits each 512-bit instruction in two halves, `vpermt2ps` and the
//! multiply-adds contend for the same units: eight of each take about 15 cycles, where eight of
//! either take 8. The loop ran at about 16 cycles per 16 lanes (one thread, 512 × 3072), in
//! 0.84 of the time of the 21-instruction loop before it (`vpor` and `vmaxps` for `a`, a
//! multiply-add for the interval, a subtraction and a multiply-add for the offset,
//! `vfixupimmps` for `max(x, 0)`), on one thread and on two, with the same results. A
//! `vpermps` costs less there: the same loop with seven of them ran at 12.5 cycles a vector
//! against 15.5 (L1-resident micro-benchmark), and SiLU, whose gate 16 pieces of width 1 keep
//! inside the bound, takes them: 512 × 4096 in 0.79 of the time on one thread (0.60 against
//! 0.48 ms) and 0.81 on two (separate processes alternated five times). The GELUs keep 32
//! pieces: Φ and `σ(2u)` fall as `e^(−x²/2)`, and 16 pieces of width ½ would need degree 8
//! (then as slow as now) to reach −7.75, or would end at −5.75 with degree 7, which took 0.89
//! of the time on inputs in [−4, 4] but twice the time on inputs spread over [−6, 6].
//!
//! Far in the negative tail the gate falls too fast for a piece to keep its relative error
//! inside the bound, so the lanes below [`Form::FAST_FROM`] (−7.75 for GELU, −6 for its tanh
//! form) take the formula forms instead, in a second pass over the vectors that have such
//! lanes ([`run_form`]); SiLU's lanes take them from |x| ≥ 15, on both sides ([`Form::low`]).
//! Each lane's result depends on its own input alone. Inputs that far out are rare in a
//! network; where nearly every vector has one the second pass costs more than the table
//! saves: inputs spread over [−20, 20] took GELU about 1.8× the formula form's time (0.59
//! against 0.32 ms), and SiLU 2.1× the time of the 32 pieces out to −31 that it took before
//! (1.31 against 0.61 ms at 512 × 4096, one thread).
//!
//! The formula forms (`GeluErf::formula`, `GeluTanh::formula`, `Silu::formula`) are the
//! portable forms of the parent module, with three changes that take work off the vector
//! ports:
//!
//! - **Every quotient is a reciprocal estimate refined once** ([`quotient`]): `vrcp14ps` (at
//!   most 2^-14 relative error) and one Newton step on the quotient, so within about half an
//!   ulp of the correctly rounded one. A `vdivps` on 16 lanes occupies port 0 for about ten
//!   cycles; the refinement is four single-cycle instructions.
//! - **`2^n` is applied by `vscalefps`** after `vrndscaleps` rounded to the nearest integer:
//!   one instruction each where the portable form adds and subtracts 1.5·2^23 and shifts and
//!   adds the integer bits. The result is `v · 2^n` exactly as there (it is always normal).
//! - **`max(x, 0)` keeping NaN, −0 and −∞ is one `vfixupimmps`** ([`positive_part`]: every
//!   finite negative input, subnormal included, to +0; everything else kept) in place of two
//!   comparisons and two masked moves. (The table's loop takes `vmaxps(0, x)`, which gives
//!   +0 for −∞; there −∞ takes the formula form.)
//!
//! Both kinds stay inside [`Activation::error_bound`](tilekit_kernels::Activation::error_bound)
//! (the parent's sweep test). Half-precision storage ([`Io`]: f16 and bf16) is widened as it
//! is loaded and rounded as it is stored, with the instructions and bit operations of
//! `convert.rs` (`vcvtph2ps` / `vcvtps2ph`; bf16's shift and round-to-nearest-even with a NaN
//! made quiet, or `vcvtneps2bf16` where the CPU has AVX512_BF16: [`NativeBf16`]): the bits of
//! the tensor widened, activated in f32 and rounded, in one pass.

use super::MAGIC;
use half::{bf16, f16};
use std::arch::x86_64::*;
use std::sync::OnceLock;
use tilekit_kernels::Activation;

/// Whether [`run`] computes `act` (the transcendental forms; the exact ones stay with the
/// parent's autovectorised copies, which already run at the speed of memory).
pub(super) fn handles(act: Activation) -> bool {
    matches!(act, Activation::Gelu | Activation::GeluTanh | Activation::Silu)
}

/// `out = act(x + bias)` for an `act` that [`handles`] accepts; `x` is `None` in place (read
/// from `out`). `x` and `bias`, where given, are as long as `out`.
///
/// # Safety
/// The CPU has AVX-512F, AVX-512DQ and F16C (`Isa::Avx512`).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn run<T: Io>(act: Activation, x: Option<&[T]>, bias: Option<&[f32]>, out: &mut [T]) {
    // SAFETY: the caller's promise.
    unsafe { run_any(act, x, bias, out) }
}

/// [`run`] on bf16 storage rounded by `vcvtneps2bf16` ([`NativeBf16`]).
///
/// # Safety
/// The CPU has AVX-512F, AVX-512DQ, F16C and AVX512_BF16 ([`native_bf16`]).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c,avx512bf16")]
pub(super) unsafe fn run_native_bf16(act: Activation, x: Option<&[bf16]>, bias: Option<&[f32]>, out: &mut [bf16]) {
    // SAFETY: `NativeBf16` is a transparent wrapper of `bf16` (same layout); the caller's
    // promise for the rest.
    unsafe {
        let x = x.map(|x| std::slice::from_raw_parts(x.as_ptr().cast::<NativeBf16>(), x.len()));
        let out = std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<NativeBf16>(), out.len());
        run_any(act, x, bias, out)
    }
}

/// Whether this CPU has AVX512_BF16, for [`run_native_bf16`].
pub(super) fn native_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

/// The body of [`run`] and [`run_native_bf16`], compiled into each.
///
/// # Safety
/// As [`run`], and the features `T`'s [`Io`] methods use.
#[inline(always)]
unsafe fn run_any<T: Io>(act: Activation, x: Option<&[T]>, bias: Option<&[f32]>, out: &mut [T]) {
    assert!(x.is_none_or(|x| x.len() == out.len()) && bias.is_none_or(|b| b.len() == out.len()));
    let len = out.len();
    let dst = out.as_mut_ptr();
    let src = Src { x: x.map_or(dst as *const T, <[T]>::as_ptr), bias: bias.map(<[f32]>::as_ptr) };
    // SAFETY: the caller's promise that the CPU has AVX-512F, AVX-512DQ and F16C; `src` and `dst` cover
    // `len` elements (asserted above).
    unsafe {
        match act {
            Activation::Gelu => run_form::<T, GeluErf>(src, dst, len),
            Activation::GeluTanh => run_form::<T, GeluTanh>(src, dst, len),
            Activation::Silu => run_form::<T, Silu>(src, dst, len),
            other => unreachable!("{other:?} has no AVX-512 form"),
        }
    }
}

/// A storage element the forms load as 16 f32 lanes and store from them.
pub(in crate::backend::cpu) trait Io: Copy {
    /// The 16 elements at `p` as f32, or the lanes `m` of them (the others 0; nothing outside
    /// them is read). `m` is all lanes or a tail's (the first few).
    ///
    /// # Safety
    /// AVX-512F and F16C; the lanes `m` at `p` are readable.
    unsafe fn load(p: *const Self, m: __mmask16) -> __m512;
    /// Stores the lanes `m` of `v` at `p`, rounded to this type.
    ///
    /// # Safety
    /// AVX-512F and F16C; the lanes `m` at `p` are writable.
    unsafe fn store(p: *mut Self, m: __mmask16, v: __m512);
}

impl Io for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32, m: __mmask16) -> __m512 {
        // SAFETY: the caller's promises.
        unsafe { if m == !0 { _mm512_loadu_ps(p) } else { _mm512_maskz_loadu_ps(m, p) } }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, m: __mmask16, v: __m512) {
        // SAFETY: the caller's promises.
        unsafe { if m == !0 { _mm512_storeu_ps(p, v) } else { _mm512_mask_storeu_ps(p, m, v) } }
    }
}

/// The 16 halves at `p` (32 bytes), or the first `m.count_ones()` of them in a zero-padded
/// copy (masked 16-bit loads would need AVX-512BW).
///
/// # Safety
/// As [`Io::load`].
#[inline(always)]
unsafe fn load_halves<T: Copy>(p: *const T, m: __mmask16) -> __m256i {
    // SAFETY: the caller's promises; the copy reads only the lanes `m`.
    unsafe {
        if m == !0 {
            _mm256_loadu_si256(p.cast())
        } else {
            let mut tail = [0u16; 16];
            std::ptr::copy_nonoverlapping(p.cast::<u16>(), tail.as_mut_ptr(), m.count_ones() as usize);
            _mm256_loadu_si256(tail.as_ptr().cast())
        }
    }
}

/// Stores the lanes `m` (all, or a tail's) of 16 halves at `p`.
///
/// # Safety
/// As [`Io::store`].
#[inline(always)]
unsafe fn store_halves<T: Copy>(p: *mut T, m: __mmask16, h: __m256i) {
    // SAFETY: the caller's promises; the copy writes only the lanes `m`.
    unsafe {
        if m == !0 {
            _mm256_storeu_si256(p.cast(), h);
        } else {
            let mut tail = [0u16; 16];
            _mm256_storeu_si256(tail.as_mut_ptr().cast(), h);
            std::ptr::copy_nonoverlapping(tail.as_ptr(), p.cast::<u16>(), m.count_ones() as usize);
        }
    }
}

impl Io for f16 {
    #[inline(always)]
    unsafe fn load(p: *const f16, m: __mmask16) -> __m512 {
        // SAFETY: the caller's promises.
        unsafe { _mm512_cvtph_ps(load_halves(p, m)) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f16, m: __mmask16, v: __m512) {
        // SAFETY: the caller's promises.
        unsafe { store_halves(p, m, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }
}

impl Io for bf16 {
    /// The bits shifted up 16. `convert.rs` (`bf16_widen_inner`) also makes a signalling NaN
    /// quiet; here each form's arithmetic does (every NaN input reaches the result through
    /// an arithmetic instruction, which returns it quiet): the same bits, one pass shorter.
    #[inline(always)]
    unsafe fn load(p: *const bf16, m: __mmask16) -> __m512 {
        // SAFETY: the caller's promises.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(load_halves(p, m)))) }
    }
    /// Rounded to nearest even, a NaN keeping its high bits made quiet (`convert.rs`'s
    /// `bf16_narrow_inner`): `x + 0x7FFF + (bit 16 of x)` carries into the kept bits exactly
    /// where that rounding goes up.
    #[inline(always)]
    unsafe fn store(p: *mut bf16, m: __mmask16, v: __m512) {
        // SAFETY: the caller's promises.
        unsafe {
            let x = _mm512_castps_si512(v);
            let hi = _mm512_srli_epi32::<16>(x);
            let odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
            let rounded =
                _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), odd));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
            store_halves(p, m, _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet)));
        }
    }
}

/// bf16 storage rounded by `vcvtneps2bf16` (AVX512_BF16: [`run_native_bf16`]): one instruction
/// for [`Io::store`]'s five integer operations, a comparison and a masked move. It gives their
/// bits (round to nearest even; a NaN's high bits with the quiet bit set) for every f32 but
/// the subnormal ones, which it flushes to zero (all 2^32 inputs compared, the CPU of the
/// measurements below); a vector with a subnormal lane is stored by `bf16`'s [`Io::store`]
/// instead (two tests and one predicted branch per vector). GELU at 512 × 3072 in bf16:
/// 0.32–0.33 ms against 0.38–0.39 (2 threads, separate processes alternated).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(super) struct NativeBf16(bf16);

impl Io for NativeBf16 {
    #[inline(always)]
    unsafe fn load(p: *const NativeBf16, m: __mmask16) -> __m512 {
        // SAFETY: the caller's promises; the same layout as `bf16`.
        unsafe { bf16::load(p.cast(), m) }
    }
    /// # Safety
    /// As [`Io::store`], and AVX512_BF16.
    #[inline(always)]
    unsafe fn store(p: *mut NativeBf16, m: __mmask16, v: __m512) {
        // SAFETY: the caller's promises (AVX512_BF16 included); the same layout as `bf16`.
        unsafe {
            let x = _mm512_castps_si512(v);
            // Exponent bits all zero, fraction bits not: subnormal.
            let zero_exp = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7F80_0000));
            let subnormal = _mm512_mask_test_epi32_mask(zero_exp, x, _mm512_set1_epi32(0x007F_FFFF));
            if subnormal == 0 {
                store_halves(p, m, std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)));
            } else {
                bf16::store(p.cast(), m, v);
            }
        }
    }
}

/// The inputs of one call: `x + bias` element by element.
struct Src<T> {
    x: *const T,
    bias: Option<*const f32>,
}

impl<T> Clone for Src<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Src<T> {}

/// The lanes of the vector at element `i` of `len`: all 16, or the tail's.
#[inline(always)]
pub(in crate::backend::cpu) fn lanes(i: usize, len: usize) -> __mmask16 {
    let n = len - i;
    if n >= 16 { !0 } else { ((1u32 << n) - 1) as __mmask16 }
}

impl<T: Io> Src<T> {
    /// `x + bias` at element `i`, lanes `m` (the others 0; nothing outside them is read).
    ///
    /// # Safety
    /// AVX-512F and F16C; the lanes `m` of element `i` are inside the slices.
    #[inline(always)]
    unsafe fn load(self, i: usize, m: __mmask16) -> __m512 {
        // SAFETY: the caller's promises; masked-off lanes are not read.
        unsafe {
            let v = T::load(self.x.add(i), m);
            match self.bias {
                Some(b) => _mm512_add_ps(v, f32::load(b.add(i), m)),
                None => v,
            }
        }
    }
}

#[inline(always)]
fn splat(v: f32) -> __m512 {
    // SAFETY: AVX-512F, which every caller in this module is compiled with.
    unsafe { _mm512_set1_ps(v) }
}

/// `n / d` from `vrcp14ps` refined once: `q0 = n·r`, then `q0 + (n − d·q0)·r`. With `r`
/// within 2^-14 of `1/d`, the refined quotient is within `2^-28` (relative) of the exact
/// one before its last rounding. For a finite `n` and `d` whose quotient is normal.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn quotient(n: __m512, d: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        let r = _mm512_rcp14_ps(d);
        let q0 = _mm512_mul_ps(n, r);
        _mm512_fmadd_ps(_mm512_fnmadd_ps(d, q0, n), r, q0)
    }
}

/// `max(x, 0)` keeping NaN, −0 and −∞ (as `gelu_erf_last`'s `pos`): `vfixupimmps` with
/// every token answered by the input itself except a finite negative value (subnormals
/// included), answered by +0. The table holds one response per token, 4 bits each, token 6
/// (negative value) being 8 (+0) and the others 1 (the input).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn positive_part(x: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { _mm512_fixupimm_ps::<0>(x, x, _mm512_set1_epi32(0x1811_1111)) }
}

/// `2^t` for `t` in [−126, 127] as the portable `exp2` computes it: `t` held at −126 below,
/// `n` the nearest integer, Cephes exp2f's polynomial for `2^(t − n)`, then scaled by `2^n`
/// (one normal power of two; the product is normal).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
#[allow(clippy::excessive_precision)]
unsafe fn exp2(t: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        let t = _mm512_max_ps(t, splat(-126.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm512_sub_ps(t, n);
        let mut p = splat(1.535_336_188_319_500e-4);
        p = _mm512_fmadd_ps(p, f, splat(1.339_887_440_266_574e-3));
        p = _mm512_fmadd_ps(p, f, splat(9.618_437_357_674_640e-3));
        p = _mm512_fmadd_ps(p, f, splat(5.550_332_471_162_809e-2));
        p = _mm512_fmadd_ps(p, f, splat(2.402_264_791_363_012e-1));
        p = _mm512_fmadd_ps(p, f, splat(6.931_472_028_550_421e-1));
        _mm512_scalef_ps(_mm512_fmadd_ps(p, f, splat(1.0)), n)
    }
}

/// `e^x` for `x` clamped to [−87.33, 88] as the portable `exp` computes it (the same
/// operations; `2^n` applied by `vscalefps`, the same bits).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
#[allow(clippy::excessive_precision)]
unsafe fn exp(x: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { exp_of::<true>(x) }
}

/// [`exp`], with the upper clamp only where `UPPER` (an `x` known to be at most 88, or NaN,
/// needs none: the same result).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
#[allow(clippy::excessive_precision)]
unsafe fn exp_of<const UPPER: bool>(x: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        // `max` first, as the portable form: a NaN becomes −87.33.
        let x = _mm512_max_ps(x, splat(-87.33));
        let x = if UPPER { _mm512_min_ps(x, splat(88.0)) } else { x };
        // Round to nearest by adding 1.5·2^23 (the product rounded once, as the portable form).
        let n = _mm512_sub_ps(_mm512_fmadd_ps(x, splat(std::f32::consts::LOG2_E), splat(MAGIC)), splat(MAGIC));
        let r = _mm512_fmadd_ps(n, splat(-0.693_359_375), x);
        let r = _mm512_fmadd_ps(n, splat(2.121_944_4e-4), r);
        let mut p = splat(1.987_569_15e-4);
        p = _mm512_fmadd_ps(p, r, splat(1.398_199_95e-3));
        p = _mm512_fmadd_ps(p, r, splat(8.333_451_9e-3));
        p = _mm512_fmadd_ps(p, r, splat(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, splat(1.666_666_55e-1));
        p = _mm512_fmadd_ps(p, r, splat(5.000_000_1e-1));
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), splat(1.0));
        _mm512_scalef_ps(y, n)
    }
}

/// Degree of the gates' polynomials.
const DEG: usize = 6;

/// The most intervals a table holds: one `vpermt2ps` selects among 32 lanes of two registers.
const MAX_PIECES: usize = 32;

/// A form's gate `g(a)` on `a ≤ 0` (`act(a) = a·g(a)`: Φ(a) for GELU, `σ(2u(a))` for its
/// tanh form, `σ(a)` for SiLU) as `F::PIECES` polynomials of degree [`DEG`] in `r = a − k·w`,
/// one per interval `k` of width `w` ([`Form`]). Slot `s` holds interval `k ≡ s (mod PIECES)`,
/// the index `vpermt2ps` (or `vpermps`) takes from the low five (four) bits of
/// `a/w + 1.5·2^23`.
#[repr(C, align(64))]
struct Table {
    /// `c[d][s]`: the coefficient of `r^d` in slot `s` (0 past the form's pieces).
    c: [[f32; MAX_PIECES]; DEG + 1],
}

impl Table {
    /// The table of `act`'s gate in `pieces` intervals of width `w`: each piece interpolates
    /// the `f64` reference ([`Activation::apply_f64`]`(a) / a`) at the [`DEG`] + 1 Chebyshev
    /// nodes of its interval (within a small factor of the best polynomial of its degree),
    /// rounded to f32.
    fn new(act: Activation, w: f64, pieces: usize) -> Table {
        assert!(pieces <= MAX_PIECES, "table past its arrays");
        let gate = |a: f64| if a == 0.0 { 0.5 } else { act.apply_f64(a) / a };
        let piece = |s: usize| {
            let k = if s == 0 { 0.0 } else { s as f64 - pieces as f64 };
            interpolate(gate, k * w, w / 2.0)
        };
        let pieces: Vec<[f64; DEG + 1]> = (0..pieces).map(piece).collect();
        let c = std::array::from_fn(|d| std::array::from_fn(|s| pieces.get(s).map_or(0.0, |p| p[d] as f32)));
        Table { c }
    }

    /// The table of `F`'s gate.
    fn of<F: Form>(act: Activation) -> Table {
        Table::new(act, F::WIDTH as f64, F::PIECES)
    }
}

/// The coefficients of `(a − centre)^d` of the polynomial of degree [`DEG`] through `g` at the
/// Chebyshev nodes of `[centre − h, centre + h]`, in f64: its Chebyshev series (`b_k`, from the
/// values at the nodes), turned into powers of `t = (a − centre)/h` by `T_{k+1} = 2t·T_k − T_{k−1}`,
/// then of `a − centre`.
fn interpolate(g: impl Fn(f64) -> f64, centre: f64, h: f64) -> [f64; DEG + 1] {
    const N: usize = DEG + 1;
    let angle = |j: usize| (2 * j + 1) as f64 * std::f64::consts::PI / (2 * N) as f64;
    let values: [f64; N] = std::array::from_fn(|j| g(centre + h * angle(j).cos()));
    let b: [f64; N] = std::array::from_fn(|k| {
        let sum: f64 = (0..N).map(|j| values[j] * (k as f64 * angle(j)).cos()).sum();
        sum * if k == 0 { 1.0 } else { 2.0 } / N as f64
    });
    let (mut prev, mut cur) = ([0.0; N], [0.0; N]);
    prev[0] = 1.0;
    cur[1] = 1.0;
    let mut powers = [0.0; N];
    powers[0] = b[0];
    powers[1] = b[1];
    for bk in &b[2..] {
        let mut next = [0.0; N];
        for d in 0..N {
            next[d] = if d > 0 { 2.0 * cur[d - 1] } else { 0.0 } - prev[d];
        }
        for d in 0..N {
            powers[d] += bk * next[d];
        }
        (prev, cur) = (cur, next);
    }
    let mut scale = 1.0;
    powers.map(|p| {
        let v = p / scale;
        scale *= h;
        v
    })
}

/// What sets one form apart.
trait Form {
    /// Interval width of the table: a power of two, so `a − k·w` is exact.
    const WIDTH: f32;
    /// Intervals in the table, centred on `k·w` for `k` = `1 − PIECES ..= 0`: 32, each
    /// coefficient picked by one `vpermt2ps` from two registers, or 16, by one `vpermps` from
    /// one. On Zen 4 a `vpermt2ps` among the multiply-adds costs about 0.43 cycles more than
    /// a `vpermps` (seven of each with six multiply-adds: 15.5 cycles a vector against 12.5,
    /// L1-resident micro-benchmark).
    const PIECES: usize;
    /// Where `a` is clamped, `−min(|x|, (PIECES − 1)·w)`: the lowest interval's centre.
    const CLAMP: f32 = (1.0 - Self::PIECES as f32) * Self::WIDTH;
    /// `a − k·w` for the `k` nearest `a/w` (ties to even, as adding `1.5·2^23·w` rounds):
    /// `vreduceps` keeping `log2(1/w)` fraction bits (immediate bits 7–4), rounding to
    /// nearest (bits 1–0). Exact: at most `w/2` and a multiple of `a`'s ulp.
    ///
    /// # Safety
    /// AVX-512DQ.
    unsafe fn offset(a: __m512) -> __m512;
    /// Inputs below this take [`Form::formula`]: there the gate falls too fast for one piece of
    /// degree [`DEG`] to keep its relative error inside the bound. At least [`Form::CLAMP`].
    const FAST_FROM: f32;
    /// The lanes that take [`Form::formula`], from the input `x` and `a` (`−min(|x|, −CLAMP)`):
    /// `x < FAST_FROM`.
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn low(x: __m512, a: __m512) -> __mmask16 {
        let _ = a;
        // SAFETY: the caller's promise.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(Self::FAST_FROM)) }
    }
    /// The table, built on first use.
    fn table() -> &'static Table;
    /// The form without the table, for the lanes [`Form::low`] picks (−∞ among them).
    ///
    /// # Safety
    /// AVX-512F.
    unsafe fn formula(x: __m512) -> __m512;
}

/// GELU, erf form.
struct GeluErf;
/// GELU, tanh form.
struct GeluTanh;
/// SiLU.
struct Silu;

impl Form for GeluErf {
    const WIDTH: f32 = 0.25;
    const PIECES: usize = 32;
    #[inline(always)]
    unsafe fn offset(a: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_reduce_ps::<0x20>(a) }
    }
    /// The whole table: its pieces measure inside the bound down to −7.75 (the sweep's worst
    /// is then the formula form's, 0.373 of the bound at −11.66).
    const FAST_FROM: f32 = Self::CLAMP;
    fn table() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| Table::of::<Self>(Activation::Gelu))
    }
    /// GELU, erf form, without the table: `x·Φ(x)` with `log2 Φ(−a)` from the (5, 3) rational
    /// fit (the parent's `gelu_erf_first` / `gelu_erf_last`): `a = min(|x|, 13.3)`,
    /// `t = log2 Φ(−a)`, then `max(x, 0) − a·2^t`.
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    #[allow(clippy::excessive_precision)]
    unsafe fn formula(p: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe {
            // A NaN x gives a = 13.3 here (the second operand) and NaN from `pos`.
            let a = _mm512_min_ps(_mm512_abs_ps(p), splat(13.3));
            let mut n = _mm512_fmadd_ps(splat(-0.009_080_849_59), a, splat(-0.099_625_259_6));
            n = _mm512_fmadd_ps(n, a, splat(-0.464_242_965));
            n = _mm512_fmadd_ps(n, a, splat(-1.095_756_53));
            n = _mm512_fmadd_ps(n, a, splat(-1.151_103_38));
            n = _mm512_mul_ps(n, a);
            let mut d = _mm512_fmadd_ps(splat(0.012_598_881_5), a, splat(0.137_181_506));
            d = _mm512_fmadd_ps(d, a, splat(0.552_969_098));
            d = _mm512_fmadd_ps(d, a, splat(1.0));
            // n / d lies in [−178, 0], so t ≤ −1, inside `exp2`'s range.
            let t = _mm512_sub_ps(quotient(n, d), splat(1.0));
            _mm512_fnmadd_ps(a, exp2(t), positive_part(p))
        }
    }
}

impl Form for GeluTanh {
    const WIDTH: f32 = 0.25;
    const PIECES: usize = 32;
    #[inline(always)]
    unsafe fn offset(a: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_reduce_ps::<0x20>(a) }
    }
    /// `σ(2u)` falls faster than Φ (`u` is cubic): the sweep measured 1.04 of the bound at
    /// −6.37 with the piece below −6.125 in use, 0.351 at worst with none below −6. Above −6
    /// the pieces below it serve x ≥ 6 only, where `x·g(−x)` is far below half an ulp of x.
    const FAST_FROM: f32 = -6.0;
    fn table() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| Table::of::<Self>(Activation::GeluTanh))
    }
    /// GELU, tanh form, without the table: `x / (1 + e^−2u)` with `u = √(2/π)·(x + 0.044715x³)`
    /// for `x` clamped to [−20, 20] and `−2u` to [−88, 88] (the parent's `gelu_tanh_first`,
    /// `exp`, `gelu_tanh_last`).
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn formula(p: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe {
            // A NaN x is clamped to a number here; the final quotient is NaN.
            let xc = _mm512_min_ps(_mm512_max_ps(p, splat(-20.0)), splat(20.0));
            let c = _mm512_fmadd_ps(_mm512_mul_ps(splat(0.044_715), xc), xc, splat(1.0));
            let u = _mm512_mul_ps(_mm512_mul_ps(splat(0.797_884_6), xc), c);
            let e = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(splat(-2.0), u), splat(-88.0)), splat(88.0));
            tanh_quotient(p, exp(e))
        }
    }
}

impl Form for Silu {
    /// `σ` falls only as `e^a`: 16 pieces of width 1 and degree 6 keep it, out to −15.
    const WIDTH: f32 = 1.0;
    const PIECES: usize = 16;
    #[inline(always)]
    unsafe fn offset(a: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_reduce_ps::<0>(a) }
    }
    const FAST_FROM: f32 = Self::CLAMP;
    /// Both sides from `|x| ≥ 15` (`a` clamped): below −15 the pieces end, and above 15 the
    /// correction `x·σ(−x)` (4.6e-6 at 15) stays more than half an ulp of x up to about 17.3,
    /// so `a` held at −15 would give the wrong one. Inputs that large are rare in a network.
    #[inline(always)]
    unsafe fn low(x: __m512, a: __m512) -> __mmask16 {
        let _ = x;
        // SAFETY: the caller's promise.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, splat(Self::CLAMP)) }
    }
    fn table() -> &'static Table {
        static TABLE: OnceLock<Table> = OnceLock::new();
        TABLE.get_or_init(|| Table::of::<Self>(Activation::Silu))
    }
    /// SiLU without the table, `x·σ(x)` (the parent's `silu_first` / `silu_last`):
    /// `e = e^−|x|`, `v = e / (1 + e)`, then `x − min(x, 88)·v` for x ≥ 0, `x·v` for x < 0, and −0
    /// below the cutoff.
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn formula(p: __m512) -> __m512 {
        // SAFETY: the caller's promise; `e` lies in (0, 1], so `v` is in (0, 1/2] and normal.
        unsafe {
            // −|x| as the sign bit set (at most 0, so `exp`'s upper clamp is left out). A NaN x
            // gives a number here (the lower clamp takes its second operand).
            let minus_abs = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(p), _mm512_set1_epi32(i32::MIN)));
            let e = exp_of::<false>(minus_abs);
            let v = quotient(e, _mm512_add_ps(splat(1.0), e));
            let pos = _mm512_fnmadd_ps(_mm512_min_ps(p, splat(88.0)), v, p);
            // x·v, or −0 below the cutoff (NaN is not below it: NaN).
            let above = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(p, splat(tilekit_kernels::activation::SILU_CUTOFF));
            let neg = _mm512_mask_mul_ps(splat(-0.0), above, p, v);
            // x ≥ 0 takes `pos`; NaN (unordered) takes the negative side.
            _mm512_mask_mov_ps(neg, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(p, splat(0.0)), pos)
        }
    }
}

/// A [`Table`] in registers: `lo[d]` holds slots 0–15 of `c[d]`, `hi[d]` slots 16–31 (where
/// the form has 32 pieces).
struct Coeffs {
    lo: [__m512; DEG + 1],
    hi: [__m512; DEG + 1],
}

impl Coeffs {
    /// `F`'s table (`hi` 0 with 16 pieces).
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn load<F: Form>() -> Coeffs {
        let t = F::table();
        // SAFETY: the caller's promise; each row is 32 f32, 64-byte aligned.
        unsafe {
            let row = |d: usize, half: usize| {
                if half == 0 || F::PIECES > 16 {
                    _mm512_load_ps(t.c[d].as_ptr().add(16 * half))
                } else {
                    _mm512_setzero_ps()
                }
            };
            Coeffs { lo: std::array::from_fn(|d| row(d, 0)), hi: std::array::from_fn(|d| row(d, 1)) }
        }
    }

    /// The coefficients of `r^d` of the pieces `slot` picks (its low five bits, or four with
    /// 16 pieces).
    ///
    /// # Safety
    /// AVX-512F.
    #[inline(always)]
    unsafe fn pick<F: Form>(&self, slot: __m512i, d: usize) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe {
            if F::PIECES == 16 {
                _mm512_permutexvar_ps(slot, self.lo[d])
            } else {
                _mm512_permutex2var_ps(self.lo[d], slot, self.hi[d])
            }
        }
    }
}

/// `act(x)` for 16 lanes from the gate's table, and the lanes [`Form::low`] picks (whose
/// results [`finish`] replaces): `a = −|x|` (held at the lowest interval's centre), `g = g(a)`
/// by the piece of `a`'s interval, then `max(x, 0) + a·g` in one rounding: `x − x·g(−x)` for
/// x ≥ 0 (no cancellation: `g ≤ 1/2`), `x·g(x)` below (the gate's symmetry,
/// `g(x) = 1 − g(−x)`).
///
/// NaN gives NaN (`a` is NaN, and `max(0, x)` keeps the NaN), +∞ gives +∞ (`a` is
/// clamped; SiLU's is a formula lane), −∞ is a formula lane, ±0 keeps its sign (`a` is −0,
/// `max(0, x)` keeps −0).
///
/// # Safety
/// AVX-512F and AVX-512DQ.
#[inline(always)]
unsafe fn gated<F: Form>(x: __m512, c: &Coeffs) -> (__m512, __mmask16) {
    // SAFETY: the caller's promise.
    unsafe {
        // `vrangeps` 0b1110: of x and the bound, the one of smaller magnitude, sign bit set
        // (−min(|x|, −CLAMP)). NaN gives NaN.
        let a = _mm512_range_ps::<0b1110>(x, splat(-F::CLAMP));
        // Adding 1.5·2^23·w rounds `a` to the nearest multiple k·w (the sum's ulp is w), and
        // the sum's bits are 1.5·2^23·w's (low five bits 0) plus k: its low five bits are k's
        // (two's complement), the slot (`vpermps` reads the low four).
        let u = _mm512_add_ps(a, splat(MAGIC * F::WIDTH));
        let r = F::offset(a);
        let slot = _mm512_castps_si512(u);
        let mut g = c.pick::<F>(slot, DEG);
        for d in (0..DEG).rev() {
            g = _mm512_fmadd_ps(g, r, c.pick::<F>(slot, d));
        }
        // `a` is x for x < 0 and −x for 0 ≤ x ≤ −CLAMP; above, `a·g` is far below half an ulp of
        // x for the GELUs (SiLU's lanes there take the formula form).
        // `max(0, x)`: `vmaxps` returns its second operand where either is NaN, or both are zero
        // (−0 stays −0); −∞ gives +0, but is a formula lane.
        let y = _mm512_fmadd_ps(a, g, _mm512_max_ps(splat(0.0), x));
        (y, F::low(x, a))
    }
}

/// Replaces the lanes `low` of the 16 results at `dst` (lanes `m` of them stored by
/// [`gated`]) with [`Form::formula`] of their inputs `x`. The stored lanes are reloaded: for
/// half-precision storage they are the rounded results, which round to themselves again.
///
/// # Safety
/// AVX-512F and F16C; the lanes `m` at `dst` are readable and writable.
#[inline(always)]
unsafe fn finish<T: Io, F: Form>(dst: *mut T, m: __mmask16, low: __mmask16, x: __m512) {
    // SAFETY: the caller's promises.
    unsafe {
        let y = T::load(dst, m);
        T::store(dst, m, _mm512_mask_mov_ps(y, low, F::formula(x)));
    }
}

/// Vectors per pass of [`run_form`].
const PASS: usize = 16;

/// `out = act(x + bias)` over `len` elements, in passes of [`PASS`] vectors: [`gated`] over
/// each vector, then [`finish`] over those with lanes below [`Form::FAST_FROM`] (their inputs
/// kept aside), so the formula form's long dependency chains overlap one another instead of
/// stalling the table's loop (spread over [−20, 20], where nearly every vector has such a
/// lane, GELU took 0.90 ms at 512 × 3072 with the formula form inside the loop). The last
/// `len mod 16` elements go through masked loads and stores, so nothing past the slices is
/// read or written.
///
/// # Safety
/// AVX-512F, AVX-512DQ and F16C; `src` readable and `dst` writable for `len` elements.
#[inline(always)]
unsafe fn run_form<T: Io, F: Form>(src: Src<T>, dst: *mut T, len: usize) {
    // SAFETY: the caller's promises; every vector's lanes lie inside `len`, and each vector is
    // read before it is written (in place, `src.x` equals `dst`); `finish` reads the inputs
    // kept aside, not `src`.
    unsafe {
        let c = Coeffs::load::<F>();
        let mut aside = [(0usize, 0 as __mmask16, splat(0.0)); PASS];
        let full = len / 16 * 16;
        for start in (0..full).step_by(16 * PASS) {
            let mut n = 0;
            for i in (start..full.min(start + 16 * PASS)).step_by(16) {
                let x = src.load(i, !0);
                let (y, low) = gated::<F>(x, &c);
                T::store(dst.add(i), !0, y);
                if low != 0 {
                    aside[n] = (i, low, x);
                    n += 1;
                }
            }
            for &(i, low, x) in &aside[..n] {
                finish::<T, F>(dst.add(i), !0, low, x);
            }
        }
        if full < len {
            let m = lanes(full, len);
            let x = src.load(full, m);
            let (y, low) = gated::<F>(x, &c);
            T::store(dst.add(full), m, y);
            if low != 0 {
                finish::<T, F>(dst.add(full), m, low, x);
            }
        }
    }
}

/// `x / (1 + e)` for `e` in [0, e^88] and any `x`: [`quotient`] of the halves `x/2` and
/// `1/2 + e/2`, except where `x` is ±∞ or NaN (the refinement would make ∞ − ∞), where it is
/// the estimate `x/2 · r`: ±∞ and NaN, as the quotient gives.
///
/// The halves keep the reciprocal normal: `1 + e` reaches 1.7e38, whose reciprocal is below
/// f32's smallest normal number, and a subnormal operand costs a microcode assist on every
/// instruction it meets (GELU-tanh of inputs spread on [−20, 20] ran 15× slower with the
/// whole quotient). Halving is exact and commutes with rounding, so the quotient is the one
/// of `x` and `1 + e` (for a subnormal `x`, `x/2` may round: the result is then subnormal
/// and within a subnormal ulp).
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn tanh_quotient(x: __m512, e: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        let n = _mm512_mul_ps(x, splat(0.5));
        let d = _mm512_fmadd_ps(e, splat(0.5), splat(0.5));
        let r = _mm512_rcp14_ps(d);
        let q0 = _mm512_mul_ps(n, r);
        let q = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, q0, n), r, q0);
        // |x| < ∞ is false for ±∞ and NaN: they keep q0.
        let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(x), splat(f32::INFINITY));
        _mm512_mask_mov_ps(q0, finite, q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interpolant of a polynomial of degree [`DEG`] is that polynomial: its coefficients
    /// come back in powers of `a − centre`, whatever the centre and half-width.
    #[test]
    fn interpolation_reproduces_a_polynomial_of_its_degree() {
        let want = [0.5, -1.25, 0.75, 2.0, -0.125, 0.0625, -0.03125];
        for (centre, h) in [(0.0, 0.125), (-7.75, 0.125), (-15.0, 0.5), (-31.0, 0.5), (3.0, 2.0)] {
            let p = |a: f64| want.iter().rev().fold(0.0, |acc, &c| acc * (a - centre) + c);
            let got = interpolate(p, centre, h);
            for (d, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()) / h.powi(d as i32).min(1.0), "c{d}: {g} vs {w}");
            }
        }
    }

    /// Every slot holds the interval whose low five bits it is (four with 16 pieces: the bits
    /// `vpermps` reads), the slots past the form's pieces are 0,
    /// and every piece of every table,
    /// evaluated in f64 from its f32 coefficients across its interval (down to where the form
    /// uses it), gives `a·g(a)` within half of [`Activation::error_bound`]: the other half is
    /// left to the f32 evaluation (the sweep in the parent module measures the whole).
    #[test]
    fn tables_hold_each_interval_in_its_slot() {
        fn check<F: Form>(act: Activation) {
            let t = F::table();
            let w = F::WIDTH as f64;
            let mut worst = (0.0f64, 0.0);
            let n = F::PIECES;
            assert!(n == 16 || n == 32, "{act}: {n} pieces");
            assert_eq!(F::CLAMP, (1 - n as i32) as f32 * F::WIDTH, "{act}: clamp at the lowest centre");
            assert!(F::FAST_FROM >= F::CLAMP, "{act}: the pieces used end at the clamp");
            for (d, row) in t.c.iter().enumerate() {
                for (s, &v) in row.iter().enumerate() {
                    assert!(v == 0.0 || s < n, "{act}: c[{d}][{s}] = {v} outside the table");
                }
            }
            for s in 0..n {
                let k = if s == 0 { 0 } else { s as i32 - n as i32 };
                assert_eq!(((k as f32 + MAGIC).to_bits() as usize) & (n - 1), s, "slot of interval {k}");
                for j in 0..=64 {
                    let r = (j as f64 / 32.0 - 1.0) * w / 2.0;
                    let a = k as f64 * w + r;
                    if a >= 0.0 || a < F::FAST_FROM as f64 {
                        continue;
                    }
                    let g = (0..=DEG).rev().fold(0.0, |acc, d| acc * r + t.c[d][s] as f64);
                    let want = act.apply_f64(a);
                    let frac = (a * g - want).abs() / act.error_bound(a, want);
                    assert!(frac <= 0.5, "{act} piece {k} at {a}: {:e} vs {want:e}, {frac:.3} of the bound", a * g);
                    if frac > worst.0 {
                        worst = (frac, a);
                    }
                }
            }
            eprintln!("{act}: the pieces' worst error {:.3} of the bound, at {}", worst.0, worst.1);
        }
        check::<GeluErf>(Activation::Gelu);
        check::<GeluTanh>(Activation::GeluTanh);
        check::<Silu>(Activation::Silu);
    }

    /// `vcvtneps2bf16`'s stores ([`NativeBf16`]) give the integer rounding's bits (`bf16`'s
    /// [`Io::store`], which the parent's half-storage test holds to `convert.rs`): on 2^20
    /// bit patterns spread over all of f32 (every sign, exponent and the rounding bits),
    /// every subnormal boundary, ±0, ±∞ and NaNs, 16 lanes a store and in masked tails;
    /// and through every form, on inputs that round.
    #[test]
    fn native_bf16_stores_give_the_integer_rounding() {
        if !(crate::backend::cpu::simd::Isa::detect() == crate::backend::cpu::simd::Isa::Avx512 && native_bf16()) {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        #[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c,avx512bf16")]
        unsafe fn both(v: &[u32; 16], m: __mmask16) -> ([u16; 16], [u16; 16]) {
            let (mut a, mut b) = ([0u16; 16], [0u16; 16]);
            // SAFETY: AVX-512F, AVX-512DQ, F16C and AVX512_BF16 (checked above); 16 elements each.
            unsafe {
                let x = _mm512_loadu_ps(v.as_ptr().cast());
                NativeBf16::store(a.as_mut_ptr().cast(), m, x);
                bf16::store(b.as_mut_ptr().cast(), m, x);
            }
            (a, b)
        }
        let mut bits: Vec<u32> = (0..1u32 << 20).map(|i| i.wrapping_mul(4093) ^ (i << 12)).collect();
        for e in [0u32, 1, 0xFE, 0xFF] {
            for f in [0, 1, 0x7FFF, 0x8000, 0x8001, 0x1_7FFF, 0x1_8000, 0x7F_7FFF, 0x7F_8000, 0x7F_FFFF] {
                bits.extend([(e << 23) | f, 0x8000_0000 | (e << 23) | f]);
            }
        }
        for (n, chunk) in bits.chunks(16).enumerate() {
            let mut v = [0u32; 16];
            v[..chunk.len()].copy_from_slice(chunk);
            let m = if n % 3 == 2 { 0x7FFF >> (n % 15) } else { 0xFFFF };
            // SAFETY: the CPU's features, checked above.
            let (a, b) = unsafe { both(&v, m) };
            assert_eq!(a, b, "{v:08x?} lanes {m:016b}");
        }
        for act in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
            let x: Vec<bf16> = (0..1000).map(|i| bf16::from_f32((i as f32 * 0.731).sin() * 12.0)).collect();
            let (mut a, mut b) = (vec![bf16::ZERO; x.len()], vec![bf16::ZERO; x.len()]);
            // SAFETY: the CPU's features, checked above.
            unsafe {
                run_native_bf16(act, Some(&x), None, &mut a);
                run(act, Some(&x), None, &mut b);
            }
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{act}");
        }
    }
}
