//! Pointwise (1×1) convolution on the CPU in one pass: `out = act(W · x + bias + residual)`
//! per pixel, both layouts.
//!
//! The matmul path (`ops/pointwise.rs`) needs, in NCHW with a bias (one per output channel,
//! along the GEMM's rows there), a 1×1 depthwise pass over the output after the GEMM: the
//! output written, read and written again. Here each task takes a block of pixels (one
//! image's columns in NCHW; NHWC images are one run of pixels) and a range of output
//! channels: the block's outputs are set to the bias (plus the residual), one
//! single-threaded `gemm` call adds `W · x` into them, reading `x` and `W`'s rows as stored
//! and writing the outputs where they lie through their strides (NCHW: a row per channel;
//! NHWC: a pixel's channels contiguous), and then the activation runs over the block.
//! Half-precision outputs go through a per-thread f32 stage of at most [`STAGE`] elements,
//! rounded once.
//!
//! With 1 to [`small_k::SMALL_K`] input channels on AVX2 or AVX-512 (MobileNetV2's stem,
//! 27 → 32 over the im2col patches, and block 1's projection, 32 → 16), the block goes through
//! the small-K register tiles instead ([`takes_small_k`]): sums starting at the bias (plus the
//! residual), ReLU and ReLU6 applied in registers, each output stored once. NHWC takes 6
//! pixels × 16 channels (32 on AVX-512) over the weight transposed once per call
//! ([`small_k::conv`]); NCHW 6 channels × 16 pixels (32) of the planes, the weight as stored
//! ([`small_k::conv_planes`]). `gemm`'s
//! per-call packing of such thin operands was most of its time: in-process A/B against the
//! `gemm` path (2 threads, bias + ReLU6, medians of 25 interleaved rounds), NHWC 0.68 of the
//! time on 27 → 32 at 112², 0.73 on 32 → 16 at 112², 0.63 on 16 → 96 at 112², 0.69 on
//! 24 → 144 at 56², 0.85 on 32 → 192 at 28²; NCHW 0.67, 0.77, 0.63, 0.74 and 0.83. The stem's
//! pointwise layer in the whole network (profiled, previous build and this one alternated,
//! three pairs): NHWC 151–152 µs against 201–213, NCHW 167–188 against 230–255.
//!
//! NHWC blocks of a channel split compute their product channel-major (a per-thread buffer,
//! `[channel][pixel]`) and transpose it into the output, adding the bias and residual on the
//! way (`transpose.rs`): `gemm` makes the output's contiguous dimension its `M`, so written
//! where it lies an NHWC product has `W` as its left operand, packed per call through a
//! transposing gather, while channel-major (NCHW's orientation) it reads `W` along its rows
//! where they lie. In-process A/B on MobileNetV2's 7² layers (49 pixels, bias + ReLU6, 2
//! threads of a 2-core AVX-512 Xeon, medians of 31 interleaved rounds): 0.94 of the time on
//! 960 → 160, 0.87 on 320 → 1280, 0.90 on 960 → 320, 0.85 on 160 → 960 (NCHW took
//! 0.76–0.78; what is left is mostly `gemm`'s packing of the input, row-major in NHWC). The
//! head (320 → 1280) in the whole network: 0.77 (profiled, the two interleaved run by run,
//! medians of 21; the model now runs its head as a product with the weight packed at load).
//!
//! How the threads split the work ([`channel_ranges`]): below [`PARALLEL_MIN`] multiply-adds
//! one task per image; with fewer than [`SPLIT_PIXELS`] pixels per thread, or in NCHW with at
//! least [`SPLIT_NCHW_CHANNELS`] output channels per thread, each thread takes one range of
//! output channels over all pixels (its `gemm` call reads only its share of `W`); otherwise
//! each takes one block of the pixels with every channel (every call reads and packs all of
//! `W`).
//!
//! Against the matmul path (MobileNetV2's 1×1 layers with bias + ReLU6, 2 threads), pixel
//! blocks only: NCHW 0.56–0.92 of the time on the eight layers measured (7² to 112²); NHWC
//! 0.60–1.0 on layers of 784 pixels or more, but 1.04–1.17 on the 7² and 14² layers. The
//! channel ranges against the pixel blocks (the two interleaved in one process, medians of
//! 25 rounds): NCHW 0.72–0.97 where `cout ≥ 96` (16 → 96 and 24 → 144 at 112² and 56²,
//! 32 → 192 at 28², 64 → 384 and 96 → 576 at 14², every 7² layer) but 1.05–1.14 on
//! 384 → 64, 192 → 64 and 32 → 16; NHWC 0.82–0.86 of the matmul path on the 7² layers, but
//! 1.13–1.7 at 14² and 28² (those keep the matmul path below [`NHWC_MIN_PIXELS`], or pixel
//! blocks).

use super::activation::map_in_place;
use super::matmul::{Strided, gemm_f32};
use super::pool::try_for_each_index;
use super::simd::Isa;
use super::small_k;
use super::transpose;
use super::{Elem, internal};
use crate::Result;
use crate::backend::PointwiseDesc;
use std::cell::Cell;
use std::ops::Range;
use tilekit_kernels::Layout;

/// NHWC pixels (all images) from which the CPU backend takes this kernel.
pub(super) const NHWC_MIN_PIXELS: usize = 512;

/// Below this many pixels (all images) per thread, the threads split the output channels.
const SPLIT_PIXELS: usize = 64;

/// NCHW outputs with at least this many channels per thread split them over the threads.
const SPLIT_NCHW_CHANNELS: usize = 48;

/// Whether a convolution goes through the small-K register tiles (AVX2 and FMA or AVX-512, 1
/// to [`small_k::SMALL_K`] input channels) instead of `gemm` on outputs set to the bias.
fn takes_small_k(isa: Isa, d: &PointwiseDesc) -> bool {
    (1..=small_k::SMALL_K).contains(&d.cin) && isa != Isa::Portable
}

/// How a block goes through the small-K tiles (never, off x86-64).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Small {
    /// NHWC: [`small_k::conv`] over the weight transposed.
    Rows(small_k::Weights),
    /// NCHW: [`small_k::conv_planes`] over the weight as stored.
    Planes,
}

/// Multiply-adds of a convolution (saturating).
fn work(d: &PointwiseDesc) -> usize {
    [d.cout, d.pixels, d.cin.max(1)].iter().fold(d.batch, |w, &f| w.saturating_mul(f))
}

/// How many ranges of output channels the threads take (1: they split the pixels instead).
/// Few pixels per thread, or NCHW with many output channels: each `gemm` call then reads its
/// share of W, where split by pixels every thread reads and packs all of W for its pixels.
pub(super) fn channel_ranges(d: &PointwiseDesc, threads: usize) -> usize {
    let few = d.batch.saturating_mul(d.pixels) < SPLIT_PIXELS * threads;
    let wide = d.layout == Layout::Nchw && d.cout >= SPLIT_NCHW_CHANNELS * threads;
    if threads > 1 && work(d) >= PARALLEL_MIN && (few || wide) { threads } else { 1 }
}

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
        self.run_with(out, None)
    }

    /// [`Self::run`], with `ranges` ranges of output channels where given (else as
    /// [`channel_ranges`] says).
    pub(super) fn run_with<E: Elem>(&self, out: &mut [E], ranges: Option<usize>) -> Result<()> {
        let PointwiseDesc { batch, cin, cout, pixels, .. } = self.d;
        if self.d.layout == Layout::Nhwc && batch > 1 {
            // NHWC images are one run of pixels.
            let d = PointwiseDesc { batch: 1, pixels: batch * pixels, ..self.d };
            return Pointwise { d, ..*self }.run_with(out, ranges);
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
        let parallel = work(&self.d) >= PARALLEL_MIN;
        let ranges = ranges.unwrap_or_else(|| channel_ranges(&self.d, threads)).clamp(1, cout);
        let cb = cout.div_ceil(ranges);
        let ranges = cout.div_ceil(cb);
        // Columns per block: the whole image, or its share of one thread's (gemm blocks for
        // the caches inside the call; smaller blocks of our own were up to 1.4× slower on
        // MobileNetV2's expansions), and for half-precision outputs at most a stage of
        // [`STAGE`] elements.
        let half = E::as_f32(&[]).is_none();
        let mut cols = if half { (STAGE / cb).max(16) } else { pixels };
        if parallel && ranges == 1 {
            cols = cols.min((batch * pixels).div_ceil(threads).max(16));
        }
        let cols = cols.next_multiple_of(16).min(pixels);
        let blocks = pixels.div_ceil(cols);
        let isa = Isa::detect();
        let small = match (takes_small_k(isa, &self.d), self.d.layout) {
            (false, _) => None,
            (true, Layout::Nchw) => Some(Small::Planes),
            (true, _) => Some(Small::Rows(small_k::Weights::new(self.w, cin, cout, self.bias)?)),
        };
        // NHWC blocks of a channel split take gemm's NCHW orientation (see [`Self::block`]).
        let orient = self.d.layout == Layout::Nhwc && ranges > 1 && small.is_none() && cin > 0;
        let o = Out(out.as_mut_ptr());
        // SAFETY (both calls): `out` holds `batch · plane` elements (checked above), and the
        // tasks `0..batch · blocks · ranges` write disjoint blocks of it.
        let task = |t: usize| {
            let (n, b, r) = (t / (blocks * ranges), t / ranges % blocks, t % ranges);
            let ch = r * cb..(r * cb + cb).min(cout);
            unsafe { self.block(isa, small.as_ref(), orient, n, b * cols, cols, ch, &o) }
        };
        if parallel {
            try_for_each_index(batch * blocks * ranges, task)
        } else {
            (0..batch * blocks * ranges).try_for_each(task)
        }
    }

    /// Image `n`'s output columns `j0..j0 + cols` (clipped to the image), channels `ch`;
    /// through the small-K register tiles where `small` is given ([`takes_small_k`]). `orient`
    /// (NHWC only): `gemm` lays out its problem so that the output's contiguous dimension is
    /// its `M`, which for NHWC makes `W` its left operand, packed per call through a
    /// transposing gather; with the product written channel-major instead (the NCHW
    /// orientation), `W` is its right operand, read along its rows where they lie.
    ///
    /// # Safety
    /// `out` points at the whole output (`batch · cout · pixels` elements), and no other
    /// thread touches these channels of these columns of image `n` meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<E: Elem>(
        &self,
        isa: Isa,
        small: Option<&Small>,
        orient: bool,
        n: usize,
        j0: usize,
        cols: usize,
        ch: Range<usize>,
        out: &Out<E>,
    ) -> Result<()> {
        let PointwiseDesc { cin, cout, pixels, activation, .. } = self.d;
        let (jn, c0, cn) = (cols.min(pixels - j0), ch.start, ch.len());
        let nhwc = self.d.layout == Layout::Nhwc;
        // The output index of the block's first element, and its strides (channel, pixel).
        let (first, o_rs, o_cs) =
            if nhwc { ((n * pixels + j0) * cout + c0, 1, cout) } else { ((n * cout + c0) * pixels + j0, pixels, 1) };
        // f32 outputs are computed where they lie, others in the stage (in the output's layout).
        let half = E::as_f32_mut(&mut []).is_none();
        let mut stage = if half { STAGE_BUF.take() } else { Vec::new() };
        let (dst, rs, cs): (*mut f32, usize, usize) = if half {
            stage.resize(cn * jn, 0.0);
            (stage.as_mut_ptr(), if nhwc { 1 } else { jn }, if nhwc { cn } else { 1 })
        } else {
            // SAFETY: `first` is inside the output (caller's contract), and E is f32 here.
            (unsafe { out.0.add(first) }.cast::<f32>(), o_rs, o_cs)
        };
        let (runs, len, step, o_step) = if nhwc { (jn, cn, cs, o_cs) } else { (cn, jn, rs, o_rs) };
        // `orient`: the product into this thread's product buffer (channel-major), then
        // transposed into the block with the bias and residual (see `transpose.rs`).
        if orient {
            let x0 = (n * pixels + j0) * cin;
            // SAFETY: t holds cn × jn at (jn, 1); W is cout × cin (checked by `run`), rows
            // c0..c0 + cn read; x holds the block's jn pixels of cin channels from x0. Then
            // dst holds the block's jn pixels of cn channels, `cs` apart (above), and the
            // residual, where given, the output's.
            transpose::with_product(cn * jn, |t| unsafe {
                gemm_f32(
                    cn,
                    jn,
                    cin,
                    Strided { ptr: t.as_mut_ptr(), rs: jn, cs: 1 },
                    Strided { ptr: self.w.as_ptr().add(c0 * cin), rs: cin, cs: 1 },
                    Strided { ptr: self.x.as_ptr().add(x0), rs: 1, cs: cin },
                    false,
                    gemm::Parallelism::None,
                );
                let add = transpose::Add {
                    bias: self.bias.map(|b| &b[c0..c0 + cn]),
                    res: self.residual.map(|r| (&r[first..], cout)),
                };
                transpose::transpose(isa, cn, jn, t.as_ptr(), jn, dst, cs, add);
            })?;
        }
        // The activation in the small-K tiles' registers, where they take the block and it is
        // one they have.
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut in_tiles = false;
        #[cfg(target_arch = "x86_64")]
        if let Some(small) = small {
            use tilekit_kernels::Activation as A;
            let act = match activation {
                A::Relu => small_k::Act::Relu,
                A::Relu6 => small_k::Act::Relu6,
                _ => small_k::Act::None,
            };
            in_tiles = act != small_k::Act::None || activation == A::None;
            // SAFETY (both): `small` is made only where `takes_small_k` holds (AVX2 and FMA);
            // dst holds this task's `cn` channels of `jn` pixels at strides (rs, cs) (above).
            match small {
                Small::Rows(w) => {
                    let x = Strided { ptr: self.x, rs: cin, cs: 1 };
                    let res = self.residual.map(|r| (&r[first..], cout));
                    unsafe { small_k::conv(isa, x, (n * pixels + j0) * cin, w, c0, cn, res, dst, cs, jn, act)? };
                }
                Small::Planes => {
                    let x = &self.x[n * cin * pixels + j0..];
                    let (w, bias) = (&self.w[c0 * cin..], self.bias.map(|b| &b[c0..]));
                    let res = self.residual.map(|r| (&r[first..], pixels));
                    unsafe { small_k::conv_planes(isa, x, pixels, w, cin, bias, cn, res, dst, rs, jn, act)? };
                }
            }
        }
        // Else the outputs start as bias (+ residual); the product is added to them. NHWC: a
        // run of channels per pixel; NCHW: a run of pixels per channel.
        for i in (0..runs).filter(|_| small.is_none() && !orient) {
            // SAFETY: run `i`'s `len` elements at `dst + i·step` are this task's (see above).
            let run = unsafe { std::slice::from_raw_parts_mut(dst.add(i * step), len) };
            let res = self.residual.map(|r| &r[first + i * o_step..][..len]);
            match (nhwc, self.bias, res) {
                (true, Some(b), Some(r)) => run.iter_mut().zip(r).zip(&b[c0..]).for_each(|((o, &r), &b)| *o = b + r),
                (true, Some(b), None) => run.copy_from_slice(&b[c0..c0 + cn]),
                (false, b, Some(r)) => {
                    let b = b.map_or(0.0, |b| b[c0 + i]);
                    run.iter_mut().zip(r).for_each(|(o, &r)| *o = b + r)
                }
                (false, Some(b), None) => run.fill(b[c0 + i]),
                (_, None, Some(r)) => run.copy_from_slice(r),
                (_, None, None) => run.fill(0.0),
            }
        }
        if cin > 0 && small.is_none() && !orient {
            let (x0, x_rs, x_cs) =
                if nhwc { ((n * pixels + j0) * cin, 1, cin) } else { (n * cin * pixels + j0, pixels, 1) };
            // SAFETY: dst holds the block's cn × jn elements at strides (rs, cs) (above); W
            // is cout × cin (checked by `run`), rows c0..c0 + cn read; x's block cin × jn at
            // (x_rs, x_cs).
            unsafe {
                gemm_f32(
                    cn,
                    jn,
                    cin,
                    Strided { ptr: dst, rs, cs },
                    Strided { ptr: self.w.as_ptr().add(c0 * cin), rs: cin, cs: 1 },
                    Strided { ptr: self.x.as_ptr().add(x0), rs: x_rs, cs: x_cs },
                    true,
                    gemm::Parallelism::None,
                );
            }
        }
        // The activation, and half-precision outputs rounded out of the stage, run by run (NHWC
        // all channels: the block is one run).
        let (runs, len) = if nhwc && cn == cout { (1, jn * cout) } else { (runs, len) };
        for i in 0..runs {
            // SAFETY: run `i`'s `len` elements at `dst + i·step` are this task's (above).
            let run = unsafe { std::slice::from_raw_parts_mut(dst.add(i * step), len) };
            if !in_tiles && activation != tilekit_kernels::Activation::None {
                map_in_place(isa, activation, run, None);
            }
            if half {
                // SAFETY: the run's output elements, this task's (caller's contract).
                let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(first + i * o_step), len) };
                E::narrow_into(run, o);
            }
        }
        if half {
            STAGE_BUF.set(stage);
        }
        Ok(())
    }
}
