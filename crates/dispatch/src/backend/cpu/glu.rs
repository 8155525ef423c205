//! The gated linear unit `out[r, c] = act(h[r, c]) · h[r, F + c]` (see `GluDesc`).
//!
//! Each row's two halves go through two L1-sized f32 buffers: the gate is widened and
//! activated by the vectorised activation (`activation::map_in_place`, the same code as
//! `Device::activation`), multiplied by the widened up half, and narrowed into the output.
//! Rows are shared out to the thread pool in tasks of about [`TASK`] outputs.

use super::activation::map_in_place;
use super::pool::for_each_chunk_mut;
use super::simd::Isa;
use super::{Elem, internal};
use crate::Result;
use tilekit_kernels::GluDesc;

/// Outputs per pass through the stack buffers (two × 16 KiB of f32, L1).
const STEP: usize = 4096;

/// Outputs per parallel task (256 KiB of f32 output).
const TASK: usize = 1 << 16;

/// Below this many outputs the op runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// `out = act(h[:, ..F]) · h[:, F..]` for `h` of `rows · 2F` and `out` of `rows · F` elements.
pub(super) fn run<E: Elem>(desc: &GluDesc, h: &[E], out: &mut [E]) -> Result<()> {
    let f = desc.f;
    let (Some(len), Some(h_len)) = (desc.out_len(), desc.h_len()) else {
        return Err(internal("glu element count overflows".into()));
    };
    if out.len() < len || h.len() < h_len || f == 0 {
        return Err(internal("glu buffers shorter than the descriptor".into()));
    }
    let isa = Isa::detect();
    let out = &mut out[..len];
    let row = |(r, o): (usize, &mut [E])| rows(isa, desc, &h[r * 2 * f..], o);
    if len < PARALLEL_MIN {
        row((0, out));
    } else {
        let per = (TASK / f).max(1);
        for_each_chunk_mut(out, per * f, |i, o| row((i * per, o)));
    }
    Ok(())
}

/// Whole rows: `out` holds `n · F` outputs, `h` starts at the first of their `n` input rows.
fn rows<E: Elem>(isa: Isa, desc: &GluDesc, h: &[E], out: &mut [E]) {
    let f = desc.f;
    let mut g = [0.0f32; STEP];
    let mut u = [0.0f32; STEP];
    for (r, o) in out.chunks_mut(f).enumerate() {
        let (gate, up) = h[r * 2 * f..(r + 1) * 2 * f].split_at(f);
        for start in (0..f).step_by(STEP) {
            let end = (start + STEP).min(f);
            let (g, u) = (&mut g[..end - start], &mut u[..end - start]);
            E::widen_into(&gate[start..end], g);
            E::widen_into(&up[start..end], u);
            map_in_place(isa, desc.activation, g, None);
            g.iter_mut().zip(u.iter()).for_each(|(g, &u)| *g *= u);
            E::narrow_into(g, &mut o[start..end]);
        }
    }
}
