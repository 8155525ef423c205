//! Quantized matmul on the CPU: `act(alpha · op(A) · dequantize(W)ᵀ + bias + beta · C)`.
//!
//! The weight `W` `[N, K]` stays quantized in memory (the two planes of `quant_tensor.rs`);
//! it is dequantized in pieces of at most [`CH`] elements of one row into a stack buffer, by
//! reassembling the GGUF blocks there and calling `tilekit_kernels::quant::dequantize_into`
//! (so every weight is bit for bit what the host dequantizer gives), and used at once:
//! - **Decode** (`M ≤ 16`): threads over blocks of output columns; each piece of a weight row is
//!   dotted with the same `K`-range of every row of `op(A)` (densified to f32 once, `M × K`)
//!   with eight-lane accumulators, compiled per instruction set (`simd.rs`). `W` streams once.
//! - **Larger M**: threads over panels of [`panel_cols`] weight rows; each panel is dequantized
//!   into an L2-sized f32 scratch (`cols × K`), then one single-threaded `gemm` call multiplies
//!   `op(A)` by it. Only a panel, never the whole weight, is ever dequantized.
//!
//! Both write f32 sums column-major into an `N × M` scratch; the epilogue (`matmul.rs`'s, so
//! bias, beta·C and the activation are exactly the dense matmul's) then runs row by row and
//! rounds once into the output's storage type.

use super::matmul::{Epilogue, SKINNY_M, epilogue_rows};
use super::simd::{Isa, madd, multiversion};
use super::{Elem, internal, scratch};
use crate::Result;
use crate::quant_tensor::PlaneGeometry;
use rayon::prelude::*;
use tilekit_kernels::MatmulDesc;
use tilekit_kernels::quant::{GgmlType, dequantize_into};

/// Elements of one dequantized piece of a weight row: one k-quant super-block, eight 32-element
/// blocks (1 KiB of f32, in L1 next to the `M` rows of `A` it meets).
pub(super) const CH: usize = 256;

/// Bytes of the reassembled GGUF blocks of one piece: eight `Q8_0` blocks are the most.
const RAW: usize = 8 * 34;

/// Below this many multiply-adds the work runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 20;

/// f32 elements of one panel of dequantized weight rows (256 KiB: L2-resident).
const PANEL: usize = 1 << 16;

/// A quantized weight `[n, k]`: its type and the bytes of its two planes.
#[derive(Clone, Copy)]
pub(super) struct QWeights<'d> {
    pub(super) ty: GgmlType,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) scales: &'d [u8],
    pub(super) body: &'d [u8],
}

impl QWeights<'_> {
    /// Checks that the planes hold `n · k / block_size` blocks.
    pub(super) fn check(&self) -> Result<PlaneGeometry> {
        let g = PlaneGeometry::of(self.ty).ok_or_else(|| internal(format!("{} is not quantized", self.ty)))?;
        let bs = self.ty.block_size();
        let blocks = self.n.checked_mul(self.k / bs).ok_or_else(|| internal("block count overflows".into()))?;
        if !self.k.is_multiple_of(bs)
            || blocks.checked_mul(g.scale_bytes).is_none_or(|b| b > self.scales.len())
            || blocks.checked_mul(g.body_bytes).is_none_or(|b| b > self.body.len())
        {
            return Err(internal(format!("{} planes too short for [{}, {}]", self.ty, self.n, self.k)));
        }
        Ok(g)
    }

    /// Dequantizes row `j`, elements `k0 .. k0 + dst.len()` (whole blocks, at most [`CH`]).
    #[inline]
    fn dequant(&self, g: PlaneGeometry, j: usize, k0: usize, dst: &mut [f32]) -> Result<()> {
        let bs = self.ty.block_size();
        let nb = dst.len() / bs;
        let bb = g.scale_bytes + g.body_bytes;
        let g0 = j * (self.k / bs) + k0 / bs;
        let mut raw = [0u8; RAW];
        for (i, blk) in raw[..nb * bb].chunks_exact_mut(bb).enumerate() {
            let s = &self.scales[(g0 + i) * g.scale_bytes..][..g.scale_bytes];
            let q = &self.body[(g0 + i) * g.body_bytes..][..g.body_bytes];
            if g.scales_first {
                blk[..g.scale_bytes].copy_from_slice(s);
                blk[g.scale_bytes..].copy_from_slice(q);
            } else {
                blk[..g.body_bytes].copy_from_slice(q);
                blk[g.body_bytes..].copy_from_slice(s);
            }
        }
        dequantize_into(self.ty, &raw[..nb * bb], &[1, dst.len()], dst).map_err(|e| internal(e.to_string()))
    }
}

/// `Σ x[i]·y[i]` with eight independent accumulators (vectorised; the order differs from a
/// left-to-right sum, which the tolerance rule allows).
#[inline(always)]
fn dot<const FMA: bool>(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] = madd::<FMA>(a[l], b[l], acc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (a, b) in xr.iter().zip(yr) {
        s = madd::<FMA>(*a, *b, s);
    }
    s
}

/// The decode kernel over one block of columns `j0 ..`: `acc[jj·m + i] = op(A)[i] · W[j0 + jj]`.
#[inline(always)]
fn decode_cols_inner<const FMA: bool>(
    w: &QWeights,
    g: PlaneGeometry,
    a: &[f32],
    m: usize,
    j0: usize,
    acc: &mut [f32],
) -> Result<()> {
    let k = w.k;
    let mut buf = [0.0f32; CH];
    for (jj, col) in acc.chunks_exact_mut(m).enumerate() {
        let mut sums = [0.0f32; SKINNY_M];
        let mut k0 = 0;
        while k0 < k {
            let len = CH.min(k - k0);
            w.dequant(g, j0 + jj, k0, &mut buf[..len])?;
            for (i, s) in sums.iter_mut().enumerate().take(m) {
                *s += dot::<FMA>(&a[i * k + k0..][..len], &buf[..len]);
            }
            k0 += len;
        }
        col.copy_from_slice(&sums[..m]);
    }
    Ok(())
}

multiversion! {
    /// [`decode_cols_inner`] for the detected instruction set.
    fn decode_cols(w: &QWeights, g: PlaneGeometry, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) -> Result<()> => decode_cols_inner
}

/// Weight rows per panel of the larger-M path: an L2-sized slab of `K` dequantized values per
/// row, at least 8 and at most 256 rows.
fn panel_cols(k: usize) -> usize {
    (PANEL / k.max(1)).clamp(8, 256)
}

/// One panel of the larger-M path: dequantizes weight rows `j0 .. j0 + cols` and multiplies.
fn panel(w: &QWeights, g: PlaneGeometry, a: &[f32], m: usize, j0: usize, acc: &mut [f32]) -> Result<()> {
    let k = w.k;
    let cols = acc.len() / m;
    let mut wp = scratch(cols * k)?;
    for (jj, row) in wp.chunks_exact_mut(k).enumerate() {
        for (p, piece) in row.chunks_mut(CH).enumerate() {
            w.dequant(g, j0 + jj, p * CH, piece)?;
        }
    }
    // SAFETY: dst is `acc`, m × cols column-major (element (i, jj) at jj·m + i), exclusively
    // borrowed; lhs is `a`, m × k row-major, and rhs(p, jj) = wp[jj·k + p]: every index gemm
    // forms lies inside those three slices, which do not overlap. read_dst is false.
    unsafe {
        gemm::gemm(
            m,
            cols,
            k,
            acc.as_mut_ptr(),
            m as isize,
            1,
            false,
            a.as_ptr(),
            1,
            k as isize,
            wp.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}

/// The operands of one quantized matmul, as f32 (but the weight).
pub(super) struct QuantOperands<'d> {
    pub(super) a: &'d [f32],
    pub(super) w: QWeights<'d>,
    pub(super) bias: Option<&'d [f32]>,
    pub(super) c: Option<&'d [f32]>,
}

impl QuantOperands<'_> {
    /// Runs the matmul into `out` (the output buffer, in its storage type).
    pub(super) fn run<E: Elem>(&self, desc: &MatmulDesc, out: &mut [E]) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        if self.w.n != n || self.w.k != k {
            return Err(internal("the weight's shape does not match the descriptor".into()));
        }
        let g = self.w.check()?;
        let (ar, ac) = desc.a_stored();
        if desc.a.required_len(desc.batch, ar, ac).is_none_or(|need| need > self.a.len()) {
            return Err(internal("a's view is out of bounds".into()));
        }
        if let (Some(cv), Some(c)) = (desc.c, self.c)
            && cv.required_len(desc.batch, m, n).is_none_or(|need| need > c.len())
        {
            return Err(internal("c's view is out of bounds".into()));
        }
        if desc.out.required_len(desc.batch, m, n).is_none_or(|need| need > out.len()) {
            return Err(internal("the output view is out of bounds".into()));
        }
        if self.bias.is_some_and(|b| b.len() < n) {
            return Err(internal("bias shorter than N".into()));
        }
        let isa = Isa::detect();
        let parallel = m * n * k >= PARALLEL_MIN;
        let mut a = scratch(m * k)?;
        let mut acc = scratch(n * m)?;
        let mut row = scratch(n)?;
        for bt in 0..desc.batch {
            // op(A) of this batch, dense row-major m × k.
            let a0 = desc.a.offset + bt * desc.a.batch_stride;
            let (rs, cs) = if desc.trans_a { (1, desc.a.ld) } else { (desc.a.ld, 1) };
            for (i, dst) in a.chunks_exact_mut(k.max(1)).enumerate().take(m) {
                for (p, x) in dst.iter_mut().enumerate() {
                    *x = self.a[a0 + i * rs + p * cs];
                }
            }
            if k > 0 {
                let (a, w) = (&a[..], &self.w);
                if m <= SKINNY_M {
                    let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
                    let cols = n.div_ceil(4 * threads).max(8);
                    let task = |(b, chunk): (usize, &mut [f32])| decode_cols(isa, w, g, a, m, b * cols, chunk);
                    if parallel {
                        acc.par_chunks_mut(cols * m).enumerate().try_for_each(task)?;
                    } else {
                        acc.chunks_mut(cols * m).enumerate().try_for_each(task)?;
                    }
                } else {
                    let cols = panel_cols(k);
                    let task = |(b, chunk): (usize, &mut [f32])| panel(w, g, a, m, b * cols, chunk);
                    if parallel {
                        acc.par_chunks_mut(cols * m).enumerate().try_for_each(task)?;
                    } else {
                        acc.chunks_mut(cols * m).enumerate().try_for_each(task)?;
                    }
                }
            } else {
                acc.fill(0.0);
            }
            let epi = Epilogue::new(
                desc.alpha,
                self.bias.map(|b| &b[..n]),
                match (desc.c, self.c) {
                    (Some(cv), Some(c)) => Some((c, cv, desc.beta)),
                    _ => None,
                },
                desc.activation,
                bt,
            );
            for i in 0..m {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = acc[j * m + i];
                }
                epilogue_rows(isa, &epi, i, 0, n, &mut row);
                let o = desc.out.index(bt, i, 0);
                E::narrow_into(&row, &mut out[o..o + n]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::quant_tensor::split_planes;

    /// Each piece the kernels dequantize is bit for bit the host dequantizer's, for every
    /// type, at every piece offset of a row.
    #[test]
    fn pieces_match_the_host_dequantizer() {
        let (n, k) = (3, 512);
        for ty in GgmlType::QUANTIZED {
            let g = PlaneGeometry::of(ty).unwrap();
            let bytes: Vec<u8> = (0..ty.tensor_bytes(&[n, k]).unwrap()).map(|i| ((i * 131 + 17) % 251) as u8).collect();
            // Keep the f16 scales finite and moderate: their high bytes are below 0x7C.
            let want = tilekit_kernels::quant::dequantize(ty, &bytes, &[n, k]).unwrap();
            let (s, b) = split_planes(g, ty.block_bytes(), &bytes);
            let w = QWeights { ty, n, k, scales: &s, body: &b };
            w.check().unwrap();
            for j in 0..n {
                for k0 in (0..k).step_by(CH) {
                    let mut buf = [0.0f32; CH];
                    w.dequant(g, j, k0, &mut buf).unwrap();
                    for (p, v) in buf.iter().enumerate() {
                        let e = want[j * k + k0 + p];
                        assert!(v.to_bits() == e.to_bits() || (v.is_nan() && e.is_nan()), "{ty} [{j}, {}]", k0 + p);
                    }
                }
            }
        }
    }
}
