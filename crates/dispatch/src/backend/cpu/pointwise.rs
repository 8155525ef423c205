//! NCHW pointwise (1×1) convolution on the CPU in one pass: `out[n] = act(W · x[n] + bias·1ᵀ
//! + residual[n])`, the bias along the GEMM's rows (one per output channel).
//!
//! The generic path (`ops/pointwise.rs`) is a batched GEMM and, with a bias, a 1×1 depthwise
//! pass over the output afterwards: the output written, read and written again. Here each
//! task takes one image's block of pixel columns: the block's output rows are set to the bias
//! (plus the residual), one single-threaded `gemm` call adds `W · x[n][:, block]` into them
//! (reading `x` and `W` as stored, writing the output in place through its row stride), and
//! the activation runs over the rows. Each thread takes one block of the columns of all
//! images (one per image below [`PARALLEL_MIN`] multiply-adds). Half-precision outputs go
//! through a per-thread f32 stage of at most [`STAGE`] elements, rounded once.

use super::activation::map_in_place;
use super::pool::try_for_each_index;
use super::simd::Isa;
use super::{Elem, internal};
use crate::Result;
use crate::backend::PointwiseNchw;
use std::cell::Cell;

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
    pub(super) d: PointwiseNchw,
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
        let PointwiseNchw { batch, cin, cout, pixels, .. } = self.d;
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
        let work = batch * plane * cin.max(1);
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
        let PointwiseNchw { cin, cout, pixels, activation, .. } = self.d;
        let jn = cols.min(pixels - j0);
        let first = n * cout * pixels + j0;
        // f32 outputs are computed where they lie (row stride `pixels`), others in the stage.
        let half = E::as_f32_mut(&mut []).is_none();
        let mut stage = if half { STAGE_BUF.take() } else { Vec::new() };
        let (dst, ld): (*mut f32, usize) = if half {
            stage.resize(cout * jn, 0.0);
            (stage.as_mut_ptr(), jn)
        } else {
            // SAFETY: `first` is inside the output (caller's contract), and E is f32 here.
            (unsafe { out.0.add(first) }.cast::<f32>(), pixels)
        };
        // The rows start as bias (+ residual); the product is added to them.
        for i in 0..cout {
            // SAFETY: row `i`'s `jn` elements at `dst + i·ld` are this task's (see above).
            let row = unsafe { std::slice::from_raw_parts_mut(dst.add(i * ld), jn) };
            let b = self.bias.map_or(0.0, |b| b[i]);
            match self.residual {
                Some(r) => {
                    let r = &r[(n * cout + i) * pixels + j0..][..jn];
                    row.iter_mut().zip(r).for_each(|(o, &r)| *o = b + r);
                }
                None => row.fill(b),
            }
        }
        if cin > 0 {
            // SAFETY: dst holds cout rows of jn at stride ld (above); W is cout × cin (checked
            // by `run`); x[n] rows cin of `pixels`, columns j0..j0 + jn read.
            unsafe {
                gemm::gemm(
                    cout,
                    jn,
                    cin,
                    dst,
                    1,
                    ld as isize,
                    true,
                    self.w.as_ptr(),
                    1,
                    cin as isize,
                    self.x.as_ptr().add(n * cin * pixels + j0),
                    1,
                    pixels as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        for i in 0..cout {
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts_mut(dst.add(i * ld), jn) };
            if activation != tilekit_kernels::Activation::None {
                map_in_place(isa, activation, row, None);
            }
            if half {
                // SAFETY: output row `i` of the block, this task's (caller's contract).
                let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(first + i * pixels), jn) };
                E::narrow_into(row, o);
            }
        }
        if half {
            STAGE_BUF.set(stage);
        }
        Ok(())
    }
}
