//! NCHW 3 × 3 layers at stride 1 or 2 (both ways; dilation 1, any padding, rows of up to 256
//! outputs) on AVX-512: a plane's rows as 16-lane vectors, read where they lie.
//!
//! An output row is cut into vectors of 16 columns. At stride 1, tap `(ky, kx)` of a vector is
//! one load from input row `oy + ky − pad_top` at column offset `kx − pad_left`. At stride 2
//! a vector's three taps of one input row come from the 33 columns from `32·v − pad_left`: two
//! loads and a broadcast of the 33rd column, the even and odd columns split out by two
//! two-source permutes (`kx` = 0 and 1) and the even ones moved down a lane with the 33rd
//! column (`kx` = 2), so the input is read once per use, not once per tap. The loads are
//! unmasked where the vector's columns lie inside the plane (most rows: a lane past its row's
//! end reads the next row there), masked to the columns inside the input row where they do not
//! (the first and last rows); nothing past the plane is read (`taps_stay_inside_the_plane`).
//! A vector with a lane that the row stores and whose tap lies outside the input multiplies
//! and adds masked to the lanes inside: lanes outside keep their sum, as kernels that skip such
//! taps do, so the sums (the bias, then the taps in kernel order, one rounding each) are the
//! band and tile kernels' bits. The other vectors multiply and add unmasked (lanes past the
//! row's end are not stored). There is no padded copy of the input and no transposition.
//!
//! Output rows go [`R`] at a time and a row's vectors two at a time, so `2·R` sums are
//! independent. Where every input row the group reads lies inside the image and every span
//! inside the plane (all groups but the first and last few), [`inner`] runs kernel row by
//! kernel row, each output row's taps of it in turn: all `2·R` sums advance at every step, so
//! consecutive multiply-adds do not wait on each other, and no row needs a check or a masked
//! load. Input rows that two output rows of the group read are loaded (and split) for each.
//! The other groups ([`vectors`]) go input row by input row, each row's tap vectors loaded
//! once for every output row that reads it, rows outside the image skipped. The rows are
//! written out one by one (`unroll_rows!`), so the sums and weights stay in registers over the
//! group; they are stored once, the bias first and ReLU or ReLU6 applied in registers.
//!
//! Loads that cross a cache line (most of these: rows start anywhere) take about 1.25 cycles
//! each on the 2-core AVX-512 Xeon, against 0.5 for aligned ones (a loop of loads and
//! multiply-adds, 8 independent sums); the 33rd column's one-element broadcast never crosses
//! one, where a 16-lane load there did. Against one vector at a time input row by input row,
//! with that load (2 threads, separate processes alternated twice, the same bits): MobileNetV2's
//! 96 × 112² stride 2 0.90 of the time, 144 × 56² stride 2 0.86–0.93, 144 × 56² 0.94, 32 ×
//! 112² 0.81–0.97. Four vectors at a time at stride 1 were level or slower (1.0–1.1×).
//! Before: masked loads everywhere took 1.1–1.4× the time of the unmasked ones; 6- and 8-row
//! groups changed little. Against the kernels the layers took before the rows (same kind of
//! runs): MobileNetV2's 144 × 56² stride 2 took 0.55 of the channel blocks' time (f16 0.77),
//! 192 × 28² stride 2 0.68 (f16 level); 96 × 112² stride 2 0.75–0.8 of the channel-vector
//! tile's (f16 0.58), with the layer's tasks cut one run per thread as well (`in_tasks`).

use std::arch::x86_64::*;
use tilekit_kernels::Conv2dDesc;

/// Lanes per vector (AVX-512).
const L: usize = 16;

/// Output rows per group (independent sums for every tap's input vector).
const R: usize = 4;

/// The fewest outputs per row. On MobileNetV2's 7² layer (7 of 16 lanes used) the
/// channel-vector tile, which puts 8 planes in the lanes, took 0.86 of the time (2-core
/// AVX-512 Xeon, in-process A/B); on its 14² to 112² layers these rows took 0.49–0.68 of the
/// tile's.
const MIN_WIDTH: usize = 8;

/// The most vectors per output row.
const MAX_VECTORS: usize = 16;

/// A layer's geometry for the kernel: the plane's sizes, the stride and the column masks; or
/// a band of a plane's output rows ([`Rows512::band`]).
#[derive(Clone)]
pub(super) struct Rows512 {
    h: usize,
    w: usize,
    /// The plane's output row that is the band's first (0 for the whole plane).
    row0: usize,
    /// Output rows (of the band).
    oh: usize,
    ow: usize,
    pad_top: usize,
    pad_left: usize,
    /// The stride, both ways: 1 or 2.
    stride: usize,
    /// Vectors per output row.
    vectors: usize,
    /// Per vector and `kx`, the lanes whose output column is in the row and whose tap
    /// column lies inside the input.
    cols: [[u16; 3]; MAX_VECTORS],
    /// At stride 2, per vector, the lanes of its three loads inside the input row: columns
    /// `32·v − pad_left` + (0..16, 16..32, and 32 in lane 0).
    loads: [[u16; 3]; MAX_VECTORS],
    /// Per vector, the lanes inside the output row.
    store: [u16; MAX_VECTORS],
}

impl Rows512 {
    /// The geometry, or `None` where the layer is not an NCHW 3 × 3 layer with dilation 1,
    /// stride 1 or 2 both ways and [`MIN_WIDTH`] to `16 · MAX_VECTORS` outputs per row.
    pub(super) fn new(d: &Conv2dDesc) -> Option<Rows512> {
        let (oh, ow) = (d.out_h()?, d.out_w()?);
        let geometry = (d.kernel_h, d.kernel_w, d.dilation_h, d.dilation_w);
        let stride = d.stride_w;
        if geometry != (3, 3, 1, 1)
            || d.stride_h != stride
            || !(1..=2).contains(&stride)
            || d.height == 0
            || d.width == 0
            || oh == 0
            || ow == 0
        {
            return None;
        }
        let vectors = ow.div_ceil(L);
        if vectors > MAX_VECTORS || ow < MIN_WIDTH {
            return None;
        }
        let (w, pl) = (d.width, d.pad_left);
        // Whether input column `c + pl` (`c` measured from the padded row's start) is inside.
        let inside = |c: usize| (pl..pl + w).contains(&c);
        let mut cols = [[0u16; 3]; MAX_VECTORS];
        let mut loads = [[0u16; 3]; MAX_VECTORS];
        let mut store = [0u16; MAX_VECTORS];
        for v in 0..vectors {
            for lane in (0..L).filter(|l| v * L + l < ow) {
                let x = v * L + lane;
                store[v] |= 1 << lane;
                for (kx, m) in cols[v].iter_mut().enumerate() {
                    if inside(x * stride + kx) {
                        *m |= 1 << lane;
                    }
                }
            }
            for lane in 0..L {
                let first = v * L * stride;
                for (q, m) in loads[v][..2].iter_mut().enumerate() {
                    if inside(first + q * L + lane) {
                        *m |= 1 << lane;
                    }
                }
                if lane == 0 && inside(first + 2 * L) {
                    loads[v][2] = 1;
                }
            }
        }
        Some(Rows512 {
            h: d.height,
            w,
            row0: 0,
            oh,
            ow,
            pad_top: d.pad_top,
            pad_left: pl,
            stride,
            vectors,
            cols,
            loads,
            store,
        })
    }

    /// Output rows per plane (of the band), and outputs per row.
    pub(super) fn shape(&self) -> (usize, usize) {
        (self.oh, self.ow)
    }

    /// Output rows `first..first + rows` of this geometry's rows: [`plane`] with it writes
    /// those rows, reading the whole input plane.
    pub(super) fn band(&self, first: usize, rows: usize) -> Rows512 {
        assert!(first + rows <= self.oh, "a band past the plane's rows");
        Rows512 { row0: self.row0 + first, oh: rows, ..self.clone() }
    }
}

/// One output plane, or a band of its rows: `out` (`oh · ow` elements) from the input plane
/// `x` (`h · w`), the nine weights `wk` and the bias, with the activation `A` (`nhwc3::avx`'s
/// `NONE`, `RELU` or `RELU6`) applied in registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn plane<const A: u8>(g: &Rows512, x: &[f32], wk: &[f32; 9], bias: f32, out: &mut [f32]) {
    assert!(x.len() >= g.h * g.w && out.len() >= g.oh * g.ow, "NCHW 3 x 3 plane past its operands");
    // SAFETY: the CPU has AVX-512F (the caller's promise); the operands are the asserted planes.
    unsafe {
        match g.stride {
            1 => rows::<1, A>(g, x.as_ptr(), wk, bias, out.as_mut_ptr()),
            _ => rows::<2, A>(g, x.as_ptr(), wk, bias, out.as_mut_ptr()),
        }
    }
}

/// [`plane`] at stride `S`, [`R`] output rows a group.
///
/// # Safety
/// As [`group`]'s.
#[inline(always)]
unsafe fn rows<const S: usize, const A: u8>(g: &Rows512, x: *const f32, wk: &[f32; 9], bias: f32, out: *mut f32) {
    let mut oy = 0;
    // SAFETY: passed on from the caller.
    unsafe {
        let mut w = [_mm512_setzero_ps(); 9];
        for (v, &k) in w.iter_mut().zip(wk) {
            *v = _mm512_set1_ps(k);
        }
        let b = _mm512_set1_ps(bias);
        while oy + R <= g.oh {
            group::<R, S, A>(g, x, &w, b, oy, out);
            oy += R;
        }
        match g.oh - oy {
            3 => group::<3, S, A>(g, x, &w, b, oy, out),
            2 => group::<2, S, A>(g, x, &w, b, oy, out),
            1 => group::<1, S, A>(g, x, &w, b, oy, out),
            _ => {}
        }
    }
}

/// `body` once for each listed `k` that meets the condition, each copy with `k` a constant.
macro_rules! unroll_rows {
    ($k:ident in [$($v:literal)*] if $cond:expr => $body:block) => {
        $({
            let $k: usize = $v;
            if $cond $body
        })*
    };
}

/// Output rows `oy..oy + N` of a plane at stride `S`, two vectors at a time (one where a
/// row's count is odd); a pair all of whose lanes have all three taps inside the input
/// multiplies and adds without masks.
///
/// # Safety
/// The CPU has AVX-512F; `x` is an `h · w` input plane and `out` an `oh · ow` output plane;
/// `oy + N ≤ oh`.
#[inline(always)]
unsafe fn group<const N: usize, const S: usize, const A: u8>(
    g: &Rows512,
    x: *const f32,
    w: &[__m512; 9],
    b: __m512,
    oy: usize,
    out: *mut f32,
) {
    // SAFETY: passed on from the caller; `v..v + P` are the row's vectors.
    unsafe {
        let mut v = 0;
        while v + 2 <= g.vectors {
            pair::<N, S, A, 2>(g, x, w, b, oy, v, out);
            v += 2;
        }
        if v < g.vectors {
            pair::<N, S, A, 1>(g, x, w, b, oy, v, out);
        }
    }
}

/// Vectors `v..v + P` of output rows `oy..oy + N`: [`inner`] where every input row the group
/// reads lies inside the image and every tap span inside the plane, else [`vectors`]; with
/// masked multiply-adds where a lane the row stores has a tap outside the input.
///
/// # Safety
/// As [`group`]'s; `v + P ≤ vectors`.
#[inline(always)]
unsafe fn pair<const N: usize, const S: usize, const A: u8, const P: usize>(
    g: &Rows512,
    x: *const f32,
    w: &[__m512; 9],
    b: __m512,
    oy: usize,
    v: usize,
    out: *mut f32,
) {
    // The lanes a multiply-add must keep: those the row stores whose tap lies outside the
    // input are left out; lanes past the row's end are not stored, so they may take any tap.
    let mut e = [[u16::MAX; 3]; P];
    for (p, e) in e.iter_mut().enumerate() {
        for (kx, e) in e.iter_mut().enumerate() {
            *e = g.cols[v + p][kx] | !g.store[v + p];
        }
    }
    let masked = e.iter().flatten().any(|&m| m != u16::MAX);
    let top = (S * (g.row0 + oy)) as isize - g.pad_top as isize;
    let bottom = top + (S * (N - 1) + 2) as isize;
    let first = top * g.w as isize + (v * L * S) as isize - g.pad_left as isize;
    let last = bottom * g.w as isize + ((v + P - 1) * L * S + SPAN[S - 1]) as isize - g.pad_left as isize;
    let inside = top >= 0 && bottom < g.h as isize && first >= 0 && last <= (g.h * g.w) as isize;
    let part = Part { g, w, b, oy, v, e, out };
    // SAFETY: passed on from the caller; `inside` is `inner`'s condition.
    unsafe {
        match (inside, masked) {
            (true, false) => inner::<N, S, A, false, P>(&part, x.offset(first)),
            (true, true) => inner::<N, S, A, true, P>(&part, x.offset(first)),
            (false, false) => vectors::<N, S, A, false, P>(&part, x),
            (false, true) => vectors::<N, S, A, true, P>(&part, x),
        }
    }
}

/// Vectors `v..v + P` of output rows `oy..oy + N` of a plane: where [`inner`] and [`vectors`]
/// write, with what.
struct Part<'a, const P: usize> {
    g: &'a Rows512,
    /// The nine weights, broadcast.
    w: &'a [__m512; 9],
    /// The bias, broadcast.
    b: __m512,
    oy: usize,
    v: usize,
    /// Per vector and `kx`, the lanes whose multiply-add must run (masked where `M`).
    e: [[u16; 3]; P],
    /// The output plane.
    out: *mut f32,
}

/// `s + w · x`, on the lanes of `m` only where `M` (the others keep `s`).
#[inline(always)]
unsafe fn fma<const M: bool>(w: __m512, x: __m512, s: __m512, m: u16) -> __m512 {
    // SAFETY: register arithmetic (the caller has AVX-512F).
    unsafe { if M { _mm512_mask3_fmadd_ps(w, x, s, m) } else { _mm512_fmadd_ps(w, x, s) } }
}

/// The multiply-adds of one input row (`xs`, the three tap vectors of each of the `P`
/// vectors), `k` rows below the group's first: tap by tap, every sum that reads the tap in
/// turn. The `P` vectors' sums and the output rows' are independent, so consecutive
/// multiply-adds do not wait on each other (a sum's nine taps are one chain of dependent
/// multiply-adds, in kernel order).
#[inline(always)]
unsafe fn row_taps<const N: usize, const S: usize, const M: bool, const P: usize>(
    k: usize,
    xs: &[[__m512; 3]; P],
    w: &[__m512; 9],
    e: &[[u16; 3]; P],
    s: &mut [[__m512; P]; N],
) {
    // SAFETY: register arithmetic (the caller has AVX-512F).
    unsafe {
        // Output row `i` of the group reads this input row through kernel row `k − S·i`.
        for kx in 0..3 {
            for (i, s) in s.iter_mut().enumerate() {
                if let Some(ky) = k.checked_sub(S * i).filter(|&ky| ky < 3) {
                    for (p, s) in s.iter_mut().enumerate() {
                        *s = fma::<M>(w[ky * 3 + kx], xs[p][kx], *s, e[p][kx]);
                    }
                }
            }
        }
    }
}

/// The part's sums, activated and stored.
#[inline(always)]
unsafe fn store<const N: usize, const A: u8, const P: usize>(t: &Part<P>, s: &[[__m512; P]; N]) {
    use super::nhwc3::avx::finish512;
    // SAFETY: stores are masked to the row's `ow` outputs, rows below `oh` (the caller's).
    unsafe {
        for (i, s) in s.iter().enumerate() {
            for (p, s) in s.iter().enumerate() {
                let o = t.out.add((t.oy + i) * t.g.ow + (t.v + p) * L);
                if t.g.store[t.v + p] == u16::MAX {
                    _mm512_storeu_ps(o, finish512::<A>(*s));
                } else {
                    _mm512_mask_storeu_ps(o, t.g.store[t.v + p], finish512::<A>(*s));
                }
            }
        }
    }
}

/// [`vectors`] where every input row the group reads lies inside the image and every tap
/// span inside the plane: no checks per row, unmasked loads; `x` points at the group's first
/// input row's column `S·16·v − pad_left`. The multiply-adds go kernel row by kernel row,
/// each output row's three taps of it in turn: every one of the `N · P` sums advances at
/// each kernel row, so `N · P` independent chains of multiply-adds are interleaved, where
/// going input row by input row advanced only the one or two output rows that read it. That
/// gained less than the chains suggest: 0.90–0.97 of the input-row order's time with one
/// plane in L1, level on the whole 144 × 56² stride-2 layer (1.01–1.02×, pairs and the
/// broadcast in both). A vector of a row still takes about 18 cycles at stride 2 in L1,
/// where the ports would allow about 8, and what holds it is not known. Input rows that two
/// output rows read (`S·i + 2 = S·(i + 1)` at stride 2, more at stride 1) are loaded, and at
/// stride 2 split, once for each.
///
/// # Safety
/// As [`vectors`]'s, and the condition above.
// Written out whole in optimised builds; in unoptimised ones (tests) a call of its own, so
// that `plane`'s frame does not hold every variant's registers at once (2 MiB of stack).
#[cfg_attr(not(debug_assertions), inline(always))]
#[cfg_attr(debug_assertions, inline(never))]
unsafe fn inner<const N: usize, const S: usize, const A: u8, const M: bool, const P: usize>(
    t: &Part<P>,
    x: *const f32,
) {
    let mut s = [[t.b; P]; N];
    // SAFETY: the caller's promise: the rows and spans read lie inside the plane.
    unsafe {
        unroll_rows!(ky in [0 1 2] if true => {
            unroll_rows!(i in [0 1 2 3] if i < N => {
                let row = x.add((S * i + ky) * t.g.w);
                let mut xs = [[_mm512_setzero_ps(); 3]; P];
                for (p, xs) in xs.iter_mut().enumerate() {
                    *xs = taps::<S, false>(t.g, t.v + p, row.add(p * L * S));
                }
                for (kx, &wk) in t.w[ky * 3..][..3].iter().enumerate() {
                    for (p, s) in s[i].iter_mut().enumerate() {
                        *s = fma::<M>(wk, xs[p][kx], *s, t.e[p][kx]);
                    }
                }
            });
        });
        store::<N, A, P>(t, &s);
    }
}

/// Vectors `v..v + P` of output rows `oy..oy + N`, input row by input row: the rows from
/// `S·oy − pad_top` to 2 past `S·(oy + N − 1) − pad_top` that lie inside the image, each loaded
/// once as the three tap vectors of each of the `P` vectors ([`taps`]; masked where the span
/// leaves the plane) and met by every sum that reads it ([`row_taps`]); the multiply-adds
/// masked to `e` where `M`.
///
/// # Safety
/// As [`group`]'s; `v + P ≤ vectors`, and without `M` every lane the `P` vectors store has its
/// three taps inside the input.
// Written out whole in optimised builds; in unoptimised ones (tests) a call of its own, so
// that `plane`'s frame does not hold every variant's registers at once (2 MiB of stack).
#[cfg_attr(not(debug_assertions), inline(always))]
#[cfg_attr(debug_assertions, inline(never))]
unsafe fn vectors<const N: usize, const S: usize, const A: u8, const M: bool, const P: usize>(
    t: &Part<P>,
    x: *const f32,
) {
    let (g, v) = (t.g, t.v);
    let mut s = [[t.b; P]; N];
    // SAFETY: `taps` reads only lanes inside input row `iy`, which lies in `0..h` (rows
    // outside are skipped); stores are masked to the row's `ow` outputs, rows below `oh`.
    unsafe {
        // Written out for every `k` (at most 9 input rows, 2·3 + 3 at stride 2), so the sums
        // and weights stay in registers: as a loop the compiler kept it rolled.
        unroll_rows!(k in [0 1 2 3 4 5 6 7 8] if k < S * (N - 1) + 3 => {
            let iy = (S * (g.row0 + t.oy) + k) as isize - g.pad_top as isize;
            if iy >= 0 && iy < g.h as isize {
                let mut xs = [[_mm512_setzero_ps(); 3]; P];
                for (p, xs) in xs.iter_mut().enumerate() {
                    let first = iy * g.w as isize + ((v + p) * L * S) as isize - g.pad_left as isize;
                    let row = x.wrapping_offset(first);
                    // Where the vector's whole span lies inside the plane, unmasked loads: a
                    // lane whose tap column is outside the input row reads a neighbouring row's
                    // element there, and its multiply-add is masked off (`M`) or its output not
                    // stored.
                    *xs = if first >= 0 && first as usize + SPAN[S - 1] <= g.h * g.w {
                        taps::<S, false>(g, v + p, row)
                    } else {
                        taps::<S, true>(g, v + p, row)
                    };
                }
                row_taps::<N, S, M, P>(k, &xs, t.w, &t.e, &mut s);
            }
        });
        store::<N, A, P>(t, &s);
    }
}

/// Elements a vector's three tap vectors span from its first load, at stride 1 and 2.
const SPAN: [usize; 2] = [L + 2, 2 * L + 1];

/// The three tap vectors (`kx` = 0, 1, 2) of vector `v` from one input row, `row` pointing at
/// its column `S·16·v − pad_left`; where `MASKED`, lanes outside the input row zero. At stride
/// 1, three loads at offsets 0, 1 and 2; at stride 2, the 32 columns from `row` and the one
/// after in two loads and a one-lane load, split into the even and odd columns by two
/// two-source permutes (`kx` = 0 and 1), the even ones moved down a lane with the 33rd column
/// (`kx` = 2).
///
/// # Safety
/// The CPU has AVX-512F; where `MASKED`, the lanes [`Rows512`]'s masks admit lie inside the
/// input plane; else the [`SPAN`] elements from `row` do.
#[inline(always)]
unsafe fn taps<const S: usize, const MASKED: bool>(g: &Rows512, v: usize, row: *const f32) -> [__m512; 3] {
    // SAFETY: masked-off lanes are not read (and may lie outside the plane, hence
    // `wrapping_add`); the caller's promise covers the others.
    unsafe {
        // A macro, not a closure: a closure is compiled without the caller's target features,
        // and the intrinsics in it are then calls.
        macro_rules! load {
            ($m:expr, $at:expr) => {
                if MASKED {
                    _mm512_maskz_loadu_ps($m, row.wrapping_add($at))
                } else {
                    _mm512_loadu_ps(row.wrapping_add($at))
                }
            };
        }
        if S == 1 {
            let m = g.cols[v];
            return [load!(m[0], 0), load!(m[1], 1), load!(m[2], 2)];
        }
        let m = g.loads[v];
        // The 33rd column alone: a broadcast where unmasked (a load of one element, which
        // never crosses a cache line; a 16-lane load there read 15 elements past the span).
        let next = if MASKED {
            _mm512_maskz_loadu_ps(m[2], row.wrapping_add(2 * L))
        } else {
            _mm512_set1_ps(row.add(2 * L).read_unaligned())
        };
        let (lo, hi) = (load!(m[0], 0), load!(m[1], L));
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let e0 = _mm512_permutex2var_ps(lo, even, hi);
        let o1 = _mm512_permutex2var_ps(lo, odd, hi);
        let e2 = _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(_mm512_castps_si512(next), _mm512_castps_si512(e0)));
        [e0, o1, e2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilekit_kernels::Layout;

    /// The column masks of a 9² same-padded layer and of a 20-wide unpadded one (two vectors, the
    /// second partly past the row), and the layers the kernel does not take.
    #[test]
    fn column_masks() {
        let d = Conv2dDesc::new(Layout::Nchw, [1, 1, 9, 9], [3, 3]).pad_top(1).pad_bottom(1).pad_left(1).pad_right(1);
        let g = Rows512::new(&d).expect("rows");
        assert_eq!((g.vectors, g.shape()), (1, (9, 9)));
        // Output x reads input x + kx − 1: no left tap at x = 0, no right tap at x = 8.
        assert_eq!(g.cols[0], [0x1fe, 0x1ff, 0xff]);
        assert_eq!(g.store[0], 0x1ff);
        // MobileNet's 7² rows use 7 lanes of 16: the tile takes them.
        assert!(Rows512::new(&d.height(7).width(7)).is_none());
        let d = Conv2dDesc::new(Layout::Nchw, [1, 1, 5, 20], [3, 3]);
        let g = Rows512::new(&d).expect("rows");
        assert_eq!((g.vectors, g.ow), (2, 18));
        assert_eq!(g.cols[..2], [[0xffff; 3], [0x3; 3]]);
        assert_eq!(g.store[..2], [0xffff, 0x3]);
        assert!(Rows512::new(&d.stride_w(2)).is_none());
        // Stride 2, unpadded: 9 outputs, every tap inside; the loads' lanes are input columns
        // 0..16 (all inside), 16..32 (16..20 inside) and 32 (outside).
        let g = Rows512::new(&d.stride_h(2).stride_w(2)).expect("rows");
        assert_eq!((g.vectors, g.ow, g.oh), (1, 9, 2));
        assert_eq!((g.cols[0], g.store[0]), ([0x1ff; 3], 0x1ff));
        assert_eq!(g.loads[0], [0xffff, 0xf, 0]);
        // Padded by 1: 10 outputs, no left tap at x = 0; the loads start at column −1.
        let g = Rows512::new(&d.stride_h(2).stride_w(2).pad_left(1).pad_right(1)).expect("rows");
        assert_eq!((g.vectors, g.ow), (1, 10));
        assert_eq!(g.cols[0], [0x3fe, 0x3ff, 0x3ff]);
        assert_eq!(g.loads[0], [0xfffe, 0x1f, 0]);
        // Two vectors: the second's loads start at column 31 (lane 0 of its first load).
        let g = Rows512::new(&Conv2dDesc::new(Layout::Nchw, [1, 1, 3, 60], [3, 3]).stride_h(2).stride_w(2).pad_left(1))
            .expect("rows");
        assert_eq!((g.vectors, g.ow), (2, 30));
        assert_eq!(g.loads[1], [0xffff, 0x1fff, 0]);
        assert_eq!(g.cols[1], [0x3fff; 3]);
        assert!(Rows512::new(&d.dilation_h(2)).is_none());
        assert!(Rows512::new(&Conv2dDesc::new(Layout::Nchw, [1, 1, 5, 300], [3, 3])).is_none());
        assert!(Rows512::new(&Conv2dDesc::new(Layout::Nchw, [1, 1, 5, 20], [5, 5])).is_none());
    }

    /// The plane's taps read nothing past its last element: each input plane ends where a
    /// page without access begins ([`PageEnd`]), so a load past its end faults. Rows of 8 to
    /// 48 pixels at stride 1 and 2, padding 1 and 0, every output against the sum in kernel
    /// order (the bias, then each tap inside the input, one fused multiply-add each), bit for
    /// bit. (A full 16-lane load of the 33rd column at stride 2 read up to 15 elements past the
    /// plane on rows of 32 to 46 pixels.)
    #[test]
    fn taps_stay_inside_the_plane() {
        use super::super::super::simd::Isa;
        use super::super::super::tests::PageEnd;
        if Isa::detect() != Isa::Avx512 {
            println!("SKIP taps_stay_inside_the_plane: this CPU has no AVX-512F");
            return;
        }
        let wk = [0.5f32, -1.25, 2.0, 0.75, -0.5, 1.5, -2.25, 1.0, 0.25];
        let bias = 0.125f32;
        for stride in [1, 2] {
            for pad in [1, 0] {
                for w in 8..=48 {
                    let h = 13;
                    let d = Conv2dDesc::new(Layout::Nchw, [1, 1, h, w], [3, 3])
                        .stride_h(stride)
                        .stride_w(stride)
                        .pad_top(pad)
                        .pad_bottom(pad)
                        .pad_left(pad)
                        .pad_right(pad);
                    let Some(g) = Rows512::new(&d) else { continue };
                    let (oh, ow) = g.shape();
                    let input: Vec<f32> = (0..h * w).map(|i| (i % 23) as f32 * 0.25 - 2.5).collect();
                    let guarded = PageEnd::new(&input);
                    let x = guarded.get();
                    let mut out = vec![0.0f32; oh * ow];
                    // SAFETY: AVX-512F was detected above.
                    unsafe { plane::<{ super::super::nhwc3::avx::NONE }>(&g, x, &wk, bias, &mut out) };
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut s = bias;
                            for (t, &k) in wk.iter().enumerate() {
                                let iy = (oy * stride + t / 3) as isize - pad as isize;
                                let ix = (ox * stride + t % 3) as isize - pad as isize;
                                if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                                    s = k.mul_add(x[iy as usize * w + ix as usize], s);
                                }
                            }
                            let at = format!("stride {stride}, pad {pad}, {h} x {w}: ({oy}, {ox})");
                            assert_eq!(out[oy * ow + ox].to_bits(), s.to_bits(), "{at}");
                        }
                    }
                }
            }
        }
    }
}
