//! NCHW 3 × 3 layers at stride 1 (dilation 1, any padding, rows of up to 256 outputs) on
//! AVX-512: a plane's rows as 16-lane vectors, read where they lie.
//!
//! An output row is cut into vectors of 16 columns. Tap `(ky, kx)` of a vector is one load
//! from input row `oy + ky − pad_top` at column offset `kx − pad_left`, masked to the lanes
//! whose column lies inside the input (and inside the output row), and one multiply-add
//! masked the same way: lanes outside keep their sum, as kernels that skip such taps do, so
//! the sums (the bias, then the taps in kernel order, one rounding each) are the band and
//! tile kernels' bits. There is no padded copy of the input and no transposition.
//!
//! Output rows go [`R`] at a time: each input row's three shifted vectors are loaded once
//! and meet every output row of the group that reads them, so a group of 4 rows takes 18
//! loads for 36 multiply-adds (9 per 9 one row at a time). Input rows outside the image are
//! skipped per row (no masks); the sums stay in registers over the group and are stored
//! once, the bias first and ReLU or ReLU6 applied in registers.
//!
//! With its planes in L1 (28², a few channels) the kernel runs at about one multiply-add a
//! cycle. Merge-masked `vfmadd231ps` runs at half the unmasked rate on the 2-core AVX-512
//! Xeon measured (a loop of 12 independent sums), yet dropping every mask saved only
//! 10–14%; aligned loads, unmasked stores, two vectors per group and fully unrolled input
//! rows changed nothing, 2-row groups took 1.1×, 8-row groups 1.8× (spills).

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

/// A layer's geometry for the kernel: the plane's sizes and the column masks.
pub(super) struct Rows512 {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    pad_top: usize,
    pad_left: usize,
    /// Vectors per output row.
    vectors: usize,
    /// Per vector and `kx`, the lanes whose output column is in the row and whose tap
    /// column lies inside the input.
    cols: [[u16; 3]; MAX_VECTORS],
    /// Per vector, the lanes inside the output row.
    store: [u16; MAX_VECTORS],
}

impl Rows512 {
    /// The geometry, or `None` where the layer is not an NCHW 3 × 3 layer with stride and
    /// dilation 1 and [`MIN_WIDTH`] to `16 · MAX_VECTORS` outputs per row.
    pub(super) fn new(d: &Conv2dDesc) -> Option<Rows512> {
        let (oh, ow) = (d.out_h()?, d.out_w()?);
        let geometry = (d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w);
        if geometry != (3, 3, 1, 1, 1, 1) || d.height == 0 || d.width == 0 || oh == 0 || ow == 0 {
            return None;
        }
        let vectors = ow.div_ceil(L);
        if vectors > MAX_VECTORS || ow < MIN_WIDTH {
            return None;
        }
        let (w, pl) = (d.width, d.pad_left);
        let mut cols = [[0u16; 3]; MAX_VECTORS];
        let mut store = [0u16; MAX_VECTORS];
        for v in 0..vectors {
            for lane in (0..L).filter(|l| v * L + l < ow) {
                let x = v * L + lane;
                store[v] |= 1 << lane;
                for (kx, m) in cols[v].iter_mut().enumerate() {
                    if (pl..pl + w).contains(&(x + kx)) {
                        *m |= 1 << lane;
                    }
                }
            }
        }
        Some(Rows512 { h: d.height, w, oh, ow, pad_top: d.pad_top, pad_left: pl, vectors, cols, store })
    }

    /// Outputs per plane.
    pub(super) fn outputs(&self) -> usize {
        self.oh * self.ow
    }
}

/// One output plane: `out` (`oh · ow` elements) from the input plane `x` (`h · w`), the nine
/// weights `wk` and the bias, with the activation `A` (`nhwc3::avx`'s `NONE`, `RELU` or
/// `RELU6`) applied in registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn plane<const A: u8>(g: &Rows512, x: &[f32], wk: &[f32; 9], bias: f32, out: &mut [f32]) {
    assert!(x.len() >= g.h * g.w && out.len() >= g.oh * g.ow, "NCHW 3 x 3 plane past its operands");
    let w: [__m512; 9] = std::array::from_fn(|t| _mm512_set1_ps(wk[t]));
    let b = _mm512_set1_ps(bias);
    let mut oy = 0;
    // SAFETY: the CPU has AVX-512F (the caller's promise); `group`'s operands are the
    // asserted planes.
    unsafe {
        while oy + R <= g.oh {
            group::<R, A>(g, x.as_ptr(), &w, b, oy, out.as_mut_ptr());
            oy += R;
        }
        match g.oh - oy {
            3 => group::<3, A>(g, x.as_ptr(), &w, b, oy, out.as_mut_ptr()),
            2 => group::<2, A>(g, x.as_ptr(), &w, b, oy, out.as_mut_ptr()),
            1 => group::<1, A>(g, x.as_ptr(), &w, b, oy, out.as_mut_ptr()),
            _ => {}
        }
    }
}

/// Output rows `oy..oy + N` of a plane, vector by vector: input rows `oy − pad_top …
/// oy + N + 1 − pad_top` (those inside the image) loaded once each, three shifted vectors a
/// row, into the `N` sums that read them.
///
/// # Safety
/// The CPU has AVX-512F; `x` is an `h · w` input plane and `out` an `oh · ow` output plane;
/// `oy + N ≤ oh`.
#[inline(always)]
unsafe fn group<const N: usize, const A: u8>(
    g: &Rows512,
    x: *const f32,
    w: &[__m512; 9],
    b: __m512,
    oy: usize,
    out: *mut f32,
) {
    use super::nhwc3::avx::finish512;
    // SAFETY: a lane is loaded only where its mask is set: its column `x + kx − pad_left`
    // lies in `0..w` and its row in `0..h` (rows outside are skipped), so the element is
    // inside the input plane; the masked-off lanes' addresses may fall outside it, hence
    // `wrapping_offset`. Stores are masked to the row's `ow` outputs, rows below `oh`.
    unsafe {
        for v in 0..g.vectors {
            let m = g.cols[v];
            let mut s = [b; N];
            for k in 0..N + 2 {
                let iy = (oy + k) as isize - g.pad_top as isize;
                if iy < 0 || iy >= g.h as isize {
                    continue;
                }
                let row = x.wrapping_offset(iy * g.w as isize + (v * L) as isize - g.pad_left as isize);
                let xs: [__m512; 3] = std::array::from_fn(|kx| _mm512_maskz_loadu_ps(m[kx], row.wrapping_add(kx)));
                // Output row `i` of the group reads this input row through kernel row `k − i`.
                for (i, s) in s.iter_mut().enumerate() {
                    if let Some(ky) = k.checked_sub(i).filter(|&ky| ky < 3) {
                        for kx in 0..3 {
                            *s = _mm512_mask3_fmadd_ps(w[ky * 3 + kx], xs[kx], *s, m[kx]);
                        }
                    }
                }
            }
            for (i, s) in s.iter().enumerate() {
                let o = out.add((oy + i) * g.ow + v * L);
                _mm512_mask_storeu_ps(o, g.store[v], finish512::<A>(*s));
            }
        }
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
        assert_eq!((g.vectors, g.outputs()), (1, 81));
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
        assert!(Rows512::new(&d.dilation_h(2)).is_none());
        assert!(Rows512::new(&Conv2dDesc::new(Layout::Nchw, [1, 1, 5, 300], [3, 3])).is_none());
        assert!(Rows512::new(&Conv2dDesc::new(Layout::Nchw, [1, 1, 5, 20], [5, 5])).is_none());
    }
}
