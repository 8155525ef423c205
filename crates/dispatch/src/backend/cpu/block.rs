//! The fused inverted-residual block on the CPU: the expanded tensor never exists in full.
//!
//! Work is split into bands of output rows of one image (threads over bands). A band walks the
//! hidden channels in chunks of `HC` (a multiple of 16, sized so the chunk's expanded rows fit
//! in ~128 KiB of L2): it expands the input rows the band needs (its rows plus the 3×3 halo,
//! zero in the padding) for the chunk's channels, filters them depthwise one output row at a
//! time, and adds that row's projection onto the band's f32 accumulator (`[row][x][C']`), so
//! the projection accumulates across chunks. The bias and the residual are added once at the
//! end and the band is stored in the output's layout and dtype.
//!
//! The two 1×1 stages are register-blocked micro-kernels over 4 pixels × 16 channels (a
//! `[[f32; 16]; 4]` accumulator, 8 AVX2 or 4 AVX-512 registers) with the reduction innermost;
//! the depthwise taps are vector multiply-adds over the chunk's channels: on AVX2 and FMA
//! through the NHWC depthwise kernel's register tiles (`depthwise/nhwc3.rs`: the nine weight
//! vectors in registers, 4 pixels a tile; the expanded rows are zero-padded, so every tap is
//! inside), which took 0.48–0.86 of the time on MobileNetV2's blocks 1–6 at 224² (NHWC, 2
//! threads, in-process A/B on a Zen 3 EPYC, same bits), 0.87 of all 17 blocks'. To make that
//! possible the weights are packed per call (`Packed`: expand `[C][H16]`, depthwise
//! `[9][H16]`, projection `[H16][C'16]`, zero-padded to multiples of 16), which costs one pass
//! over the weights.

use super::simd::{Isa, madd, multiversion};
use super::{Elem, internal, scratch};
use crate::Result;
use rayon::prelude::*;
use tilekit_kernels::{InvertedResidualDesc, Layout};

/// The channel block of the micro-kernels.
const VB: usize = 16;
/// Pixels per micro-kernel step.
const PB: usize = 4;
/// The budget of one chunk's expanded rows, f32 elements (128 KiB: half a typical L2).
const E_BUDGET: usize = 32 * 1024;

/// The operands, f32 (widened if stored in half precision).
pub(super) struct Block<'d> {
    pub(super) d: InvertedResidualDesc,
    pub(super) x: &'d [f32],
    pub(super) expand: Option<(&'d [f32], Option<&'d [f32]>)>,
    pub(super) dw: (&'d [f32], Option<&'d [f32]>),
    pub(super) project: (&'d [f32], Option<&'d [f32]>),
}

/// The weights packed for the micro-kernels.
struct Packed {
    /// Hidden channels rounded up to [`VB`].
    hp: usize,
    /// Output channels rounded up to [`VB`].
    cop: usize,
    /// Expand `[C][hp]` (empty without expand) and its bias `[hp]`.
    we: Vec<f32>,
    be: Vec<f32>,
    /// Depthwise `[9][hp]` and bias `[hp]`.
    wd: Vec<f32>,
    bd: Vec<f32>,
    /// Projection `[hp][cop]`.
    wp: Vec<f32>,
}

impl Block<'_> {
    fn pack(&self) -> Result<Packed> {
        let d = &self.d;
        let (c, hid, co) = (d.channels, d.hidden, d.out_channels);
        let hp = hid.div_ceil(VB) * VB;
        let cop = co.div_ceil(VB) * VB;
        let mut p = Packed {
            hp,
            cop,
            we: scratch(if d.expand { c * hp } else { 0 })?,
            be: scratch(hp)?,
            wd: scratch(9 * hp)?,
            bd: scratch(hp)?,
            wp: scratch(hp * cop)?,
        };
        if let Some((we, be)) = self.expand {
            for j in 0..hid {
                for ci in 0..c {
                    p.we[ci * hp + j] = we[j * c + ci];
                }
            }
            if let Some(be) = be {
                p.be[..hid].copy_from_slice(&be[..hid]);
            }
        }
        for j in 0..hid {
            for k in 0..9 {
                p.wd[k * hp + j] = self.dw.0[j * 9 + k];
            }
        }
        if let Some(bd) = self.dw.1 {
            p.bd[..hid].copy_from_slice(&bd[..hid]);
        }
        for o in 0..co {
            for j in 0..hid {
                p.wp[j * cop + o] = self.project.0[o * hid + j];
            }
        }
        Ok(p)
    }

    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let d = &self.d;
        let lens = d.checked_lens().ok_or_else(|| internal("block lengths overflow".into()))?;
        let short = |len: usize, need: usize| len < need;
        if short(self.x.len(), lens.input)
            || short(out.len(), lens.output)
            || short(self.dw.0.len(), lens.dw_weight)
            || short(self.project.0.len(), lens.project_weight)
            || self.expand.is_some_and(|(w, _)| short(w.len(), lens.expand_weight))
            || self.expand.is_some() != d.expand
            || !matches!(d.stride, 1 | 2)
        {
            return Err(internal("block buffers are shorter than the descriptor".into()));
        }
        if lens.output == 0 {
            return Ok(());
        }
        let p = self.pack()?;
        let (oh, ow, co) = (d.out_h(), d.out_w(), d.out_channels);
        // Bands: enough for every thread twice over, at most 16 rows (halo rows cost
        // 2/band_rows of the expand work at stride 1).
        let threads = rayon::current_num_threads().max(1);
        let per_image = (2 * threads).div_ceil(d.batch).max(1);
        let band = oh.div_ceil(per_image).clamp(4.min(oh), 16);
        let band_len = band * ow * co;
        let image = oh * ow * co;
        let isa = Isa::detect();
        // Images, then bands of rows inside each (the last band of an image may be shorter).
        let run_all = |dst: &mut [f32]| -> Result<()> {
            dst.par_chunks_mut(image).enumerate().try_for_each(|(n, img)| {
                img.par_chunks_mut(band_len).enumerate().try_for_each(|(b, part)| {
                    let oy0 = b * band;
                    let rows = band.min(oh - oy0);
                    if part.len() != rows * ow * co {
                        return Err(internal("a block band does not match its rows".into()));
                    }
                    self.band(isa, &p, n, oy0, rows, part)
                })
            })
        };
        // f32 NHWC output: bands are contiguous, written in place. Otherwise through an f32
        // NHWC staging buffer, stored in the output's layout and dtype afterwards.
        if d.layout == Layout::Nhwc
            && let Some(o) = E::as_f32_mut(out)
        {
            return run_all(&mut o[..lens.output]);
        }
        let mut stage = scratch(lens.output)?;
        run_all(&mut stage)?;
        out[..lens.output].par_chunks_mut(image).zip(stage.par_chunks(image)).for_each(|(o, s)| match d.layout {
            Layout::Nhwc => E::narrow_into(s, o),
            // NCHW (`Layout` is `#[non_exhaustive]`; `ops::layout_dims` admits only the two).
            _ => {
                // Transposed through a stack buffer (no allocation per image).
                let mut buf = [0.0f32; 1024];
                for c in 0..co {
                    let plane = &mut o[c * oh * ow..(c + 1) * oh * ow];
                    for (k, piece) in plane.chunks_mut(buf.len()).enumerate() {
                        let first = k * buf.len();
                        for (i, v) in buf[..piece.len()].iter_mut().enumerate() {
                            *v = s[(first + i) * co + c];
                        }
                        E::narrow_into(&buf[..piece.len()], piece);
                    }
                }
            }
        });
        Ok(())
    }

    /// One band: output rows `oy0..oy0 + rows` of image `n` into `dst` (`[row][x][C']`, f32).
    fn band(&self, isa: Isa, p: &Packed, n: usize, oy0: usize, rows: usize, dst: &mut [f32]) -> Result<()> {
        let d = &self.d;
        let (c, h, w, s) = (d.channels, d.height, d.width, d.stride);
        let (ow, co, cop) = (d.out_w(), d.out_channels, p.cop);
        // Expanded rows the band needs: image rows oy0·s − 1 ..= (oy0 + rows − 1)·s + 1.
        let erows = (rows - 1) * s + 3;
        let ew = w + 2;
        let hc = (E_BUDGET / (erows * ew)).max(VB) / VB * VB;
        let hc = hc.min(p.hp);
        // The band's input rows, gathered as [row][x][C] (zero outside the image).
        let mut xin = scratch(erows * w * c)?;
        for r in 0..erows {
            let Some(iy) = (oy0 * s + r).checked_sub(1).filter(|&iy| iy < h) else { continue };
            for x in 0..w {
                for ci in 0..c {
                    xin[(r * w + x) * c + ci] = self.x[d.input_index(n, ci, iy, x)];
                }
            }
        }
        let mut e = scratch(erows * ew * hc)?;
        let mut f = scratch(ow * hc)?;
        let mut acc = scratch(rows * ow * cop)?;
        let mut j0 = 0;
        while j0 < d.hidden {
            let jc = hc.min(p.hp - j0);
            let a = ChunkArgs { d, p, xin: &xin, oy0, erows, j0, jc };
            chunk(isa, &a, &mut e, &mut f, &mut acc);
            j0 += jc;
        }
        // Bias, residual, and the band into `dst` without the channel padding.
        for ly in 0..rows {
            for ox in 0..ow {
                let src = &acc[(ly * ow + ox) * cop..][..co];
                let out = &mut dst[(ly * ow + ox) * co..][..co];
                for (o, (v, a)) in out.iter_mut().zip(src).enumerate() {
                    let mut y = *a;
                    if let Some(bp) = self.project.1 {
                        y += bp[o];
                    }
                    if d.residual() {
                        y += self.x[d.input_index(n, o, oy0 + ly, ox)];
                    }
                    *v = y;
                }
            }
        }
        Ok(())
    }
}

/// What one chunk of hidden channels of one band needs.
struct ChunkArgs<'a> {
    d: &'a InvertedResidualDesc,
    p: &'a Packed,
    xin: &'a [f32],
    oy0: usize,
    erows: usize,
    j0: usize,
    jc: usize,
}

#[inline(always)]
fn relu6(v: f32) -> f32 {
    v.clamp(0.0, 6.0)
}

/// Expand (or copy), depthwise and project one chunk of hidden channels into `acc`.
#[inline(always)]
fn chunk_inner<const FMA: bool>(a: &ChunkArgs, e: &mut [f32], f: &mut [f32], acc: &mut [f32]) {
    let (d, p) = (a.d, a.p);
    let (c, h, w, s, hp) = (d.channels, d.height, d.width, d.stride, p.hp);
    let (ow, cop, jc, j0) = (d.out_w(), p.cop, a.jc, a.j0);
    let ew = w + 2;
    let rows = (a.erows - 3) / s + 1;
    // 1. The expanded rows, [r][x + 1][jc], zero in the padding.
    e[..a.erows * ew * jc].fill(0.0);
    for r in 0..a.erows {
        let in_image = (a.oy0 * s + r).checked_sub(1).is_some_and(|iy| iy < h);
        if !in_image {
            continue;
        }
        let xrow = &a.xin[r * w * c..][..w * c];
        let erow = &mut e[r * ew * jc..][..ew * jc];
        if !d.expand {
            for x in 0..w {
                for jj in 0..jc {
                    let j = j0 + jj;
                    erow[(x + 1) * jc + jj] = if j < c { xrow[x * c + j] } else { 0.0 };
                }
            }
            continue;
        }
        for x0 in (0..w).step_by(PB) {
            for jb in (0..jc).step_by(VB) {
                let mut t = [[0.0f32; VB]; PB];
                let bias = &p.be[j0 + jb..][..VB];
                for row in t.iter_mut() {
                    row.copy_from_slice(bias);
                }
                // Pixels past the row's end repeat its last pixel (their results are dropped).
                let px: [usize; PB] = std::array::from_fn(|i| (x0 + i).min(w - 1) * c);
                for ci in 0..c {
                    let wv = &p.we[ci * hp + j0 + jb..][..VB];
                    for (i, row) in t.iter_mut().enumerate() {
                        let xv = xrow[px[i] + ci];
                        for (acc, wk) in row.iter_mut().zip(wv) {
                            *acc = madd::<FMA>(xv, *wk, *acc);
                        }
                    }
                }
                for (i, row) in t.iter().enumerate().take(w - x0) {
                    let dst = &mut erow[(x0 + i + 1) * jc + jb..][..VB];
                    for (o, v) in dst.iter_mut().zip(row) {
                        *o = relu6(*v);
                    }
                }
            }
        }
    }
    // 2. and 3. Per output row: depthwise into f, then f's projection onto acc.
    for ly in 0..rows {
        // On AVX2 and FMA, the NHWC depthwise kernel's register tiles.
        let fast = FMA && cfg!(target_arch = "x86_64");
        #[cfg(target_arch = "x86_64")]
        if fast {
            use super::depthwise::nhwc3::{
                RowGeometry,
                avx::{NONE, row},
            };
            // The expanded rows are zero-padded: every pixel's taps are inside them.
            let g = RowGeometry { c: jc, width: ew, pad_left: 0, lo: 0, hi: ow, ow };
            let er = std::array::from_fn(|ky| Some((ly * s + ky) * ew * jc));
            let (wd, bd) = (&p.wd[j0..], Some(&p.bd[j0..j0 + jc]));
            // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
            // `multiversion!`, which run only where the CPU reported AVX2 and FMA.
            unsafe {
                if s == 1 {
                    row::<1, NONE>(e, er, &g, wd, hp, bd, jc, f, jc);
                } else {
                    row::<2, NONE>(e, er, &g, wd, hp, bd, jc, f, jc);
                }
            }
            for v in f[..ow * jc].iter_mut() {
                *v = relu6(*v);
            }
        }
        for ox in (0..ow).filter(|_| !fast) {
            let fr = &mut f[ox * jc..][..jc];
            fr.copy_from_slice(&p.bd[j0..j0 + jc]);
            for ky in 0..3 {
                let erow = &e[(ly * s + ky) * ew * jc..][..ew * jc];
                for kx in 0..3 {
                    let ev = &erow[(ox * s + kx) * jc..][..jc];
                    let wv = &p.wd[(ky * 3 + kx) * hp + j0..][..jc];
                    for ((o, x), wk) in fr.iter_mut().zip(ev).zip(wv) {
                        *o = madd::<FMA>(*x, *wk, *o);
                    }
                }
            }
            for v in fr.iter_mut() {
                *v = relu6(*v);
            }
        }
        let arow = &mut acc[ly * ow * cop..][..ow * cop];
        for x0 in (0..ow).step_by(PB) {
            let px: [usize; PB] = std::array::from_fn(|i| (x0 + i).min(ow - 1) * jc);
            for ob in (0..cop).step_by(VB) {
                let mut t = [[0.0f32; VB]; PB];
                for (i, row) in t.iter_mut().enumerate().take(ow - x0) {
                    row.copy_from_slice(&arow[(x0 + i) * cop + ob..][..VB]);
                }
                for jj in 0..jc {
                    let wv = &p.wp[(j0 + jj) * cop + ob..][..VB];
                    for (i, row) in t.iter_mut().enumerate() {
                        let fv = f[px[i] + jj];
                        for (acc, wk) in row.iter_mut().zip(wv) {
                            *acc = madd::<FMA>(fv, *wk, *acc);
                        }
                    }
                }
                for (i, row) in t.iter().enumerate().take(ow - x0) {
                    arow[(x0 + i) * cop + ob..][..VB].copy_from_slice(row);
                }
            }
        }
    }
}

multiversion! {
    fn chunk(a: &ChunkArgs, e: &mut [f32], f: &mut [f32], acc: &mut [f32]) => chunk_inner
}
