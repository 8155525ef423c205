//! Pointwise (1×1) convolution on the CPU in one pass: `out = act(W · x + bias + residual)`
//! per pixel, both layouts.
//!
//! The matmul path (`ops/pointwise.rs`) needs, in NCHW with a bias (one per output channel,
//! along the GEMM's rows there), a 1×1 depthwise pass over the output after the GEMM: the
//! output written, read and written again. Here each task takes a block of pixels (one
//! image's columns in NCHW; NHWC images are one run of pixels): the block's outputs are set
//! to the bias (plus the residual), one single-threaded `gemm` call adds `W · x` into them,
//! reading `x` and `W` as stored and writing the outputs where they lie through their
//! strides (NCHW: a row per channel; NHWC: a pixel's channels contiguous), and then the
//! activation runs over the block. Each thread takes one block of the columns of all images
//! (one per image below [`PARALLEL_MIN`] multiply-adds). Half-precision outputs go through a
//! per-thread f32 stage of at most [`STAGE`] elements, rounded once.
//!
//! Against the matmul path (MobileNetV2's 1×1 layers with bias + ReLU6, 2 threads):
//! NCHW 0.56–0.92 of the time on the eight layers measured (7² to 112²); NHWC 0.60–1.0 on
//! layers of 784 pixels or more, but 1.04–1.17 on the 7² and 14² layers, which keep the
//! matmul path (below [`NHWC_MIN_PIXELS`]).

use super::activation::map_in_place;
use super::matmul::{Strided, gemm_f32};
use super::pool::try_for_each_index;
use super::simd::Isa;
use super::{Elem, internal};
use crate::Result;
use crate::backend::PointwiseDesc;
use std::cell::Cell;
use tilekit_kernels::Layout;

/// NHWC pixels (all images) from which the CPU backend takes this kernel.
pub(super) const NHWC_MIN_PIXELS: usize = 512;

/// f32 elements of a half-precision output's stage (256 KiB).
const STAGE: usize = 1 << 16;

/// Below this many multiply-adds the convolution runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 17;

thread_local! {
    /// A thread's f32 block for half-precision outputs, taken out of its slot while in use.
    static STAGE_BUF: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The operands as f32 (widened where stored in half precision).
pub(super) struct Pointwise<'a> {
    pub(super) d: PointwiseDesc,
    pub(super) x: &'a [f32],
    pub(super) w: &'a [f32],
    pub(super) bias: Option<&'a [f32]>,
    pub(super) residual: Option<&'a [f32]>,
}

/// The output, written by tasks at disjoint columns of the same rows.
struct Out<E>(*mut E);
// SAFETY: each task writes only its own block's elements (see `Pointwise::block`), and
// `Pointwise::run` returns only once every task has finished.
unsafe impl<E: Send> Sync for Out<E> {}

impl Pointwise<'_> {
    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let PointwiseDesc { batch, cin, cout, pixels, .. } = self.d;
        if self.d.layout == Layout::Nhwc && batch > 1 {
            // NHWC images are one run of pixels.
            let d = PointwiseDesc { batch: 1, pixels: batch * pixels, ..self.d };
            return Pointwise { d, ..*self }.run(out);
        }
        let plane = cout * pixels;
        if self.x.len() < batch * cin * pixels
            || self.w.len() < cout * cin
            || self.bias.is_some_and(|b| b.len() < cout)
            || self.residual.is_some_and(|r| r.len() < batch * plane)
            || out.len() < batch * plane
        {
            return Err(internal("pointwise buffers are shorter than the descriptor".into()));
        }
        if batch * plane == 0 {
            return Ok(());
        }
        let threads = rayon::current_num_threads().max(1);
        let work = (batch * plane).saturating_mul(cin.max(1));
        // Columns per block: the whole image, or its share of one thread's (gemm blocks for
        // the caches inside the call; smaller blocks of our own were up to 1.4× slower on
        // MobileNetV2's expansions), and for half-precision outputs at most a stage of
        // [`STAGE`] elements.
        let half = E::as_f32(&[]).is_none();
        let mut cols = if half { (STAGE / cout).max(16) } else { pixels };
        if work >= PARALLEL_MIN {
            cols = cols.min((batch * pixels).div_ceil(threads).max(16));
        }
        let cols = cols.next_multiple_of(16).min(pixels);
        let blocks = pixels.div_ceil(cols);
        let isa = Isa::detect();
        let o = Out(out.as_mut_ptr());
        // SAFETY (both calls): `out` holds `batch · plane` elements (checked above), and the
        // tasks `0..batch · blocks` write disjoint blocks of it.
        let task = |t: usize| unsafe { self.block(isa, t / blocks, (t % blocks) * cols, cols, &o) };
        if work < PARALLEL_MIN {
            (0..batch * blocks).try_for_each(task)
        } else {
            try_for_each_index(batch * blocks, task)
        }
    }

    /// Image `n`'s output columns `j0..j0 + cols` (clipped to the image).
    ///
    /// # Safety
    /// `out` points at the whole output (`batch · cout · pixels` elements), and no other
    /// thread touches these columns of image `n` meanwhile.
    unsafe fn block<E: Elem>(&self, isa: Isa, n: usize, j0: usize, cols: usize, out: &Out<E>) -> Result<()> {
        let PointwiseDesc { cin, cout, pixels, activation, .. } = self.d;
        let jn = cols.min(pixels - j0);
        let nhwc = self.d.layout == Layout::Nhwc;
        let first = if nhwc { (n * pixels + j0) * cout } else { n * cout * pixels + j0 };
        // f32 outputs are computed where they lie, others in the stage (in the output's layout).
        let half = E::as_f32_mut(&mut []).is_none();
        let mut stage = if half { STAGE_BUF.take() } else { Vec::new() };
        let dst: *mut f32 = if half {
            stage.resize(cout * jn, 0.0);
            stage.as_mut_ptr()
        } else {
            // SAFETY: `first` is inside the output (caller's contract), and E is f32 here.
            unsafe { out.0.add(first) }.cast::<f32>()
        };
        // Strides of the block's (channel, pixel) element: NCHW rows of channels, NHWC pixels.
        let (rs, cs) = match (nhwc, half) {
            (true, _) => (1, cout),
            (false, true) => (jn, 1),
            (false, false) => (pixels, 1),
        };
        if nhwc {
            // SAFETY: the block's jn · cout contiguous elements are this task's.
            let blk = unsafe { std::slice::from_raw_parts_mut(dst, jn * cout) };
            for (j, px) in blk.chunks_exact_mut(cout).enumerate() {
                match (self.bias, self.residual) {
                    (Some(b), Some(r)) => {
                        px.iter_mut().zip(&r[first + j * cout..]).zip(b).for_each(|((o, &r), &b)| *o = b + r)
                    }
                    (Some(b), None) => px.copy_from_slice(&b[..cout]),
                    (None, Some(r)) => px.copy_from_slice(&r[first + j * cout..][..cout]),
                    (None, None) => px.fill(0.0),
                }
            }
        } else {
            // The rows start as bias (+ residual); the product is added to them.
            for i in 0..cout {
                // SAFETY: row `i`'s `jn` elements at `dst + i·rs` are this task's (see above).
                let row = unsafe { std::slice::from_raw_parts_mut(dst.add(i * rs), jn) };
                let b = self.bias.map_or(0.0, |b| b[i]);
                match self.residual {
                    Some(r) => {
                        let r = &r[(n * cout + i) * pixels + j0..][..jn];
                        row.iter_mut().zip(r).for_each(|(o, &r)| *o = b + r);
                    }
                    None => row.fill(b),
                }
            }
        }
        if cin > 0 {
            let (x0, x_rs, x_cs) =
                if nhwc { ((n * pixels + j0) * cin, 1, cin) } else { (n * cin * pixels + j0, pixels, 1) };
            // SAFETY: dst holds the block's cout × jn elements at strides (rs, cs) (above); W
            // is cout × cin (checked by `run`); x's block cin × jn at (x_rs, x_cs).
            unsafe {
                gemm_f32(
                    cout,
                    jn,
                    cin,
                    Strided { ptr: dst, rs, cs },
                    Strided { ptr: self.w.as_ptr(), rs: cin, cs: 1 },
                    Strided { ptr: self.x.as_ptr().add(x0), rs: x_rs, cs: x_cs },
                    true,
                    gemm::Parallelism::None,
                );
            }
        }
        // The activation, and half-precision outputs rounded out of the stage: NHWC's block is
        // one contiguous run, NCHW's a run per channel row.
        let (runs, len, dst_step, out_step) = if nhwc { (1, jn * cout, 0, 0) } else { (cout, jn, rs, pixels) };
        for i in 0..runs {
            // SAFETY: run `i`'s `len` elements at `dst + i·dst_step` are this task's (above).
            let run = unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_step), len) };
            if activation != tilekit_kernels::Activation::None {
                map_in_place(isa, activation, run, None);
            }
            if half {
                // SAFETY: the run's output elements, this task's (caller's contract).
                let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(first + i * out_step), len) };
                E::narrow_into(run, o);
            }
        }
        if half {
            STAGE_BUF.set(stage);
        }
        Ok(())
    }
}
