//! GELU (erf and tanh forms) and SiLU written in AVX-512 intrinsics.
//!
//! The same formulas as the portable forms in the parent module, stage for stage, with four
//! changes that take work off the two vector ports (512-bit arithmetic runs on ports 0 and 5
//! only) without leaving [`Activation::error_bound`](tilekit_kernels::Activation::error_bound):
//!
//! - **Every quotient is a reciprocal estimate refined once** ([`quotient`]): `vrcp14ps` (at
//!   most 2^-14 relative error) and one Newton step on the quotient, so within about half an
//!   ulp of the correctly rounded one. A `vdivps` on 16 lanes occupies port 0 for about ten
//!   cycles; the refinement is four single-cycle instructions.
//! - **`2^n` is applied by `vscalefps`** after `vrndscaleps` rounded to the nearest integer:
//!   one instruction each where the portable form adds and subtracts 1.5·2^23 and shifts and
//!   adds the integer bits. The result is `v · 2^n` exactly as there (it is always normal).
//! - **`max(x, 0)` keeping NaN, −0 and −∞ is one `vfixupimmps`** (every finite negative
//!   input, subnormal included, to +0; everything else kept) in place of two comparisons and
//!   two masked moves.
//! - **The first stage stores what the last one needs** (`|x|` clamped, `max(x, 0)`) next to
//!   its own result, so the last stage reloads them (load ports) instead of recomputing them
//!   (vector ports), and a bias is added once.
//!
//! Each form runs in the parent's blocks of [`STAGE`] elements, one loop per stage (see
//! `Staged` there); the last `len mod 16` elements go through masked loads and stores, so
//! nothing past the slices is read or written.
//!
//! Half-precision storage ([`Io`]: f16 and bf16) is widened as the first stage loads it and
//! rounded as the last stores it, with the instructions and bit operations of
//! `convert.rs` (`vcvtph2ps` / `vcvtps2ph`; bf16's shift and round-to-nearest-even with a
//! NaN made quiet): the bits of the tensor widened, activated in f32 and rounded, in one pass.

use super::{MAGIC, STAGE};
use half::{bf16, f16};
use std::arch::x86_64::*;
use tilekit_kernels::Activation;

/// Whether [`run`] computes `act` (the transcendental forms; the exact ones stay with the
/// parent's autovectorised copies, which already run at the speed of memory).
pub(super) fn handles(act: Activation) -> bool {
    matches!(act, Activation::Gelu | Activation::GeluTanh | Activation::Silu)
}

/// Runs `block::<true>(start)` over the full blocks of `len` elements and `block::<false>`
/// over the last, partial one.
macro_rules! blocks {
    ($len:expr, $block:ident($($arg:expr),*)) => {{
        let full = $len / STAGE * STAGE;
        for start in (0..full).step_by(STAGE) {
            $block::<_, true>($($arg,)* start, STAGE);
        }
        if full < $len {
            $block::<_, false>($($arg,)* full, $len - full);
        }
    }};
}

/// `out = act(x + bias)` for an `act` that [`handles`] accepts; `x` is `None` in place (read
/// from `out`). `x` and `bias`, where given, are as long as `out`.
///
/// # Safety
/// The CPU has AVX-512F and F16C (`Isa::Avx512`).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn run<T: Io>(act: Activation, x: Option<&[T]>, bias: Option<&[f32]>, out: &mut [T]) {
    assert!(x.is_none_or(|x| x.len() == out.len()) && bias.is_none_or(|b| b.len() == out.len()));
    let len = out.len();
    let dst = out.as_mut_ptr();
    let src = Src { x: x.map_or(dst as *const T, <[T]>::as_ptr), bias: bias.map(<[f32]>::as_ptr) };
    // The stages' buffers (GELU's erf form uses three, the others two).
    let mut stages = [[splat(0.0); VECS]; 3];
    // SAFETY: the caller's promise that the CPU has AVX-512F and F16C; `src` and `dst` cover
    // `len` elements (asserted above) and each block lies inside them; each stage of a block
    // reads its inputs before the last writes them, so an in-place `src` (equal to `dst`) is
    // read before it is overwritten.
    unsafe {
        match act {
            Activation::Gelu => blocks!(len, gelu_erf_block(src, dst, &mut stages)),
            Activation::GeluTanh => blocks!(len, gelu_tanh_block(src, dst, &mut stages)),
            Activation::Silu => blocks!(len, silu_block(src, dst, &mut stages)),
            other => unreachable!("{other:?} has no AVX-512 form"),
        }
    }
}

/// A storage element the forms load as 16 f32 lanes and store from them.
pub(super) trait Io: Copy {
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

/// Vectors per block.
const VECS: usize = STAGE / 16;

/// The lanes of the vector at element `i` of `len`: all 16 in a full block (`FULL`, known
/// when compiled: no mask is computed, every load and store is a plain one), else all 16 or
/// the tail's.
#[inline(always)]
fn lanes<const FULL: bool>(i: usize, len: usize) -> __mmask16 {
    let n = len - i;
    if FULL || n >= 16 { !0 } else { ((1u32 << n) - 1) as __mmask16 }
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

/// GELU, erf form: `x·Φ(x)` with `log2 Φ(−a)` from the (5, 3) rational fit (the parent's
/// `gelu_erf_first` / `gelu_erf_last`). Stage one keeps `a = min(|x|, 13.3)`, `max(x, 0)` and
/// `t = log2 Φ(−a)`; stage two gives `max(x, 0) − a·2^t`. Over the `n` (at most [`STAGE`];
/// all of it when `FULL`) elements from `start`; `stages` are the stages' buffers.
///
/// # Safety
/// AVX-512F and F16C; `src` readable and `dst` writable for elements `start..start + n`.
#[inline(always)]
#[allow(clippy::excessive_precision)]
unsafe fn gelu_erf_block<T: Io, const FULL: bool>(
    src: Src<T>,
    dst: *mut T,
    stages: &mut [[__m512; VECS]; 3],
    start: usize,
    n: usize,
) {
    let [a, pos, t] = stages;
    let (len, vecs) = (start + n, if FULL { VECS } else { n.div_ceil(16) });
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: AVX-512F (the caller's promise); lanes `lanes(i, len)` of element `i < len`
        // are inside the slices.
        unsafe {
            let p = src.load(i, lanes::<FULL>(i, len));
            // A NaN x gives a = 13.3 here (the second operand) and NaN from `pos`.
            let aj = _mm512_min_ps(_mm512_abs_ps(p), splat(13.3));
            let mut n = _mm512_fmadd_ps(splat(-0.009_080_849_59), aj, splat(-0.099_625_259_6));
            n = _mm512_fmadd_ps(n, aj, splat(-0.464_242_965));
            n = _mm512_fmadd_ps(n, aj, splat(-1.095_756_53));
            n = _mm512_fmadd_ps(n, aj, splat(-1.151_103_38));
            n = _mm512_mul_ps(n, aj);
            let mut d = _mm512_fmadd_ps(splat(0.012_598_881_5), aj, splat(0.137_181_506));
            d = _mm512_fmadd_ps(d, aj, splat(0.552_969_098));
            d = _mm512_fmadd_ps(d, aj, splat(1.0));
            // n / d lies in [−178, 0].
            t[j] = _mm512_sub_ps(quotient(n, d), splat(1.0));
            a[j] = aj;
            pos[j] = positive_part(p);
        }
    }
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: as above (`t` ≤ −1, inside `exp2`'s range); lanes `lanes(i, len)` of `dst`.
        unsafe {
            let q = exp2(t[j]);
            T::store(dst.add(i), lanes::<FULL>(i, len), _mm512_fnmadd_ps(a[j], q, pos[j]));
        }
    }
}

/// GELU, tanh form: `x / (1 + e^−2u)` with `u = √(2/π)·(x + 0.044715x³)` for `x` clamped to
/// [−20, 20] and `−2u` to [−88, 88] (the parent's `gelu_tanh_first`, `exp`, `gelu_tanh_last`).
/// Over `n` elements from `start`, as [`gelu_erf_block`] (two of the three buffers).
///
/// # Safety
/// As [`gelu_erf_block`].
#[inline(always)]
unsafe fn gelu_tanh_block<T: Io, const FULL: bool>(
    src: Src<T>,
    dst: *mut T,
    stages: &mut [[__m512; VECS]; 3],
    start: usize,
    n: usize,
) {
    let [x, e, _] = stages;
    let (len, vecs) = (start + n, if FULL { VECS } else { n.div_ceil(16) });
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: as in `gelu_erf_block`.
        unsafe {
            let p = src.load(i, lanes::<FULL>(i, len));
            // A NaN x is clamped to a number here; the final quotient is NaN.
            let xc = _mm512_min_ps(_mm512_max_ps(p, splat(-20.0)), splat(20.0));
            let c = _mm512_fmadd_ps(_mm512_mul_ps(splat(0.044_715), xc), xc, splat(1.0));
            let u = _mm512_mul_ps(_mm512_mul_ps(splat(0.797_884_6), xc), c);
            e[j] = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(splat(-2.0), u), splat(-88.0)), splat(88.0));
            x[j] = p;
        }
    }
    for ej in e.iter_mut().take(vecs) {
        // SAFETY: AVX-512F.
        *ej = unsafe { exp(*ej) };
    }
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: as in `gelu_erf_block`.
        unsafe { T::store(dst.add(i), lanes::<FULL>(i, len), tanh_quotient(x[j], e[j])) };
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

/// SiLU, `x·σ(x)` (the parent's `silu_first` / `silu_last`): `e = e^−|x|`, `v = e / (1 + e)`,
/// then `x − min(x, 88)·v` for x ≥ 0, `x·v` for x < 0, and −0 below the cutoff.
/// Over `n` elements from `start`, as [`gelu_erf_block`] (two of the three buffers).
///
/// # Safety
/// As [`gelu_erf_block`].
#[inline(always)]
unsafe fn silu_block<T: Io, const FULL: bool>(
    src: Src<T>,
    dst: *mut T,
    stages: &mut [[__m512; VECS]; 3],
    start: usize,
    n: usize,
) {
    let [x, e, _] = stages;
    let (len, vecs) = (start + n, if FULL { VECS } else { n.div_ceil(16) });
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: as in `gelu_erf_block`.
        unsafe {
            let p = src.load(i, lanes::<FULL>(i, len));
            // −|x| as the sign bit set (at most 0, so `exp`'s upper clamp is left out). A NaN
            // x gives a number here (the lower clamp takes its second operand).
            let minus_abs = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(p), _mm512_set1_epi32(i32::MIN)));
            e[j] = exp_of::<false>(minus_abs);
            x[j] = p;
        }
    }
    for j in 0..vecs {
        let i = start + 16 * j;
        // SAFETY: as in `gelu_erf_block`; `e` lies in (0, 1], so `v` is in (0, 1/2] and normal.
        unsafe {
            let (p, ej) = (x[j], e[j]);
            let v = quotient(ej, _mm512_add_ps(splat(1.0), ej));
            let pos = _mm512_fnmadd_ps(_mm512_min_ps(p, splat(88.0)), v, p);
            // x·v, or −0 below the cutoff (NaN is not below it: NaN).
            let above = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(p, splat(tilekit_kernels::activation::SILU_CUTOFF));
            let neg = _mm512_mask_mul_ps(splat(-0.0), above, p, v);
            // x ≥ 0 takes `pos`; NaN (unordered) takes the negative side.
            let r = _mm512_mask_mov_ps(neg, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(p, splat(0.0)), pos);
            T::store(dst.add(i), lanes::<FULL>(i, len), r);
        }
    }
}
