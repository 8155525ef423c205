//! The fused inverted-residual block on the CPU: the expanded tensor never leaves the caches.
//!
//! A block without expand (MobileNetV2's first) has the input as its hidden tensor: it runs
//! as the depthwise kernel on the input, then the pointwise kernel ([`Block::without_expand`]).
//! Blocks with expand take one of three ways through an image, chosen by its size:
//! - **By channels** (fewer than [`CHANNEL_SPLIT_PIXELS`] pixels per thread, in NCHW of the
//!   output, [`channel_split`]: MobileNetV2's 7 × 7 blocks 15–17 at 224², and block 14
//!   (14 × 14 → 7 × 7) in NCHW): each thread expands and filters one range of hidden
//!   channels for every pixel, then projects every pixel onto one range of output channels
//!   ([`Block::by_channels`]). Each `gemm` call reads its share of a weight; split by rows,
//!   every thread read (and `gemm` packed) all of both weights for 24 or 25 pixels. Blocks
//!   15–17 took 0.80–0.87 of the time in NHWC and 0.90–0.92 in NCHW (whole network,
//!   profiled, the previous build and this one alternated, three pairs on a 2-core Zen 3).
//!   At 14 × 14 the split was mixed (0.90–1.07) and at 28 × 28 slower (up to 1.17). In NHWC
//!   the projection goes into a channel-major buffer and is transposed into the output with
//!   its bias and the residual (as the pointwise kernel's channel ranges, `pointwise.rs`):
//!   block 17 (960 → 320) took 0.91 of the time, blocks 15–16 0.97–1.0 (the network profiled,
//!   the two interleaved run by run).
//! - **Whole** (at most [`WHOLE_IMAGE`] expanded elements, 1 MiB of f32: MobileNetV2's blocks
//!   5–14 at 224²): the image is expanded once, its rows split over the threads, then each
//!   thread takes one band of output rows (depthwise, then projection) reading the expanded
//!   rows it needs, its neighbours' halo rows included, from that tensor. No row is expanded
//!   twice.
//! - **Bands** (larger images): bands of at most 16 output rows, twice as many as threads;
//!   each walks the hidden channels in chunks sized so the chunk's expanded rows fit in
//!   [`chunk_budget`] (a quarter of the core's L2; at least [`MIN_CHUNK`] channels),
//!   expanding the input rows the band needs (its rows and the 3 × 3 halo), filtering them
//!   and adding the chunk's projection onto the band's output.
//!
//! The two 1 × 1 stages are single-threaded calls of the `gemm` crate (the micro-kernels of
//! the matmul op), reading the input and the weights where they are stored (NCHW or NHWC,
//! PyTorch's `[out, in]` weights) and writing the projection straight into the output in its
//! layout (through an f32 staging buffer in the output's layout for f16 and bf16); the
//! per-call packing is the depthwise weights (`[9][hidden]`, for the register tiles). Weights
//! packed ahead of the calls (`crate::PackedBlock`, [`Transposed`]) are read transposed
//! instead: every product through `gemm` reads them along their rows, and the channel split's
//! projection goes pixel-major (straight into an NHWC output, or through the thread's product
//! buffer and a transpose into NCHW planes), with the channels as `gemm`'s `M`. MobileNetV2's
//! 7 × 7 blocks (15–17) took 0.81–0.92 of the time, 14 × 14 (8–14) 0.91–0.96, the rest
//! 0.97–1.0: in-process A/B on a 2-core AVX-512 Zen 4, both layouts, medians of 60 × 10
//! calls, two runs, the same bits. The
//! expand bias and ReLU6 are one pass over the chunk's rows while they are in L2. With at
//! most [`small_k::SMALL_K`] input channels on AVX2 or AVX-512 (MobileNetV2's blocks 2–7),
//! the expansion is instead the small-K register tiles (`small_k.rs`, shared with the
//! pointwise kernel): 6 pixels × 16 hidden channels (32 on AVX-512) over the expand weight
//! transposed once per call (`[C][hidden]`), the sums starting at the bias and stored
//! through ReLU6 (`gemm`'s per-call packing dominated its calls of 16–32 input channels and,
//! in bands, 16–32 hidden channels): 0.74 of the time on block 2, 0.83–0.92 on blocks 3–4 and
//! 0.92–0.97 on blocks 5–7 (in-process A/B, both layouts, 2 threads); with the bound raised
//! to 160, blocks 8–17 were level (0.96–1.0 in that A/B, but 0.91–0.94 of the chain's speed
//! on blocks 8–10 in the bench's table, where they had been 1.01–1.03), so it stays at 32. The
//! depthwise taps go through the NHWC depthwise kernel's register tiles (`depthwise/nhwc3.rs`,
//! AVX2 and FMA: nine weight vectors in registers, 4 pixels a tile, ReLU6 applied in
//! registers), a scalar loop elsewhere. The bands of an image run on the calling thread and
//! the pool's ([`super::pool`]: a helper that wakes late finds no band left, instead of the
//! caller waiting for it), the images one after another.
//!
//! The scratch tensors (an image's expanded tensor, a band's expanded and filtered rows, block
//! 1's filtered input) are per-thread buffers reused from call to call ([`Reused`]), not
//! zeroed allocations: every one is written before it is read. MobileNetV2 at 224² profiled
//! per layer, the two interleaved run by run in one process (2-core AVX-512 Xeon, medians of
//! 61, two runs): the whole network 0.91–0.96 of the time, block 1 0.75–0.87, blocks 5–14
//! 0.69–0.94.
//!
//! Against the previous design (its own 4 × 16 register-tile loops for the 1 × 1 stages,
//! bands for every image, every weight packed per call, bands on rayon's split), MobileNetV2's
//! 17 blocks at 224² on 2 threads (Zen 3 EPYC, separate processes alternated, best of each)
//! took 4.65 ms against 9.94 (NHWC) and 5.01 against 10.84 (NCHW); 0.32–0.73 of the time per
//! block. Against the three-op chain of public ops (matmul, depthwise, matmul; same run) it
//! is now 0.97–1.43× as fast per block in NHWC (4.65 ms against 5.34 over the 17; the previous
//! design was 0.35–0.99×) and 0.86–1.57× in NCHW (block 1, without expand, was the 0.86;
//! it now runs as that chain's two kernels).
//! Measured alternatives: every image in bands (blocks 8–13 1.3× slower), whole images up to 4 MiB (blocks 2–4 1.1× slower), two bands per
//! thread on whole images (1.1–1.3× slower on 14² and 7²), 64–128 KiB more of chunk budget
//! (mixed, within 0.88–1.13×); rayon's split of the bands was bimodal (blocks 15–17 took
//! 0.46 or 0.83 ms from one run of calls to the next, the pool 0.44 every time).

use super::aligned::AlignedBuf;
use super::depthwise::Conv;
use super::matmul::{Strided, gemm_f32};
use super::pointwise::Pointwise;
use super::pool::{for_each_chunk_mut, try_for_each_chunk_mut, try_for_each_index};
use super::simd::{Isa, l2_bytes, madd, multiversion};
use super::small_k;
use super::transpose;
use super::{CHUNK, Elem, internal, scratch};
use crate::backend::PointwiseDesc;
use crate::{BackendKind, Error, Result};
use std::cell::Cell;
use std::ops::Range;
use std::thread::LocalKey;
use tilekit_kernels::{Activation, Conv2dDesc, InvertedResidualDesc, Layout};

/// Hidden channels are padded to a multiple of this (the chunks' width and the register
/// tiles' 8-channel blocks).
const VB: usize = 16;
/// The budget of one chunk's expanded rows in f32 elements, where the core's L2 size is
/// unknown (128 KiB: half a typical L2, measured on a Zen 3 with 512 KiB).
pub(super) const E_BUDGET: usize = 32 * 1024;

/// The budget of one chunk's expanded rows in f32 elements: a quarter of the core's L2
/// ([`l2_bytes`]), from 64 KiB to 1 MiB; [`E_BUDGET`] where the L2 is unknown. That is the
/// 128 KiB that was measured on a Zen 3 (512 KiB of L2), and 512 KiB on a 2-core AVX-512
/// Xeon (2 MiB of L2), where MobileNetV2's blocks 3 and 4 (24 → 144 → 24 at 56², and → 32 at
/// stride 2) then expand all 144 hidden channels of a band at once, not in chunks of 32, and
/// took 0.87–0.92 of the time alone in both layouts; block 2 (16 → 96 → 24 at 112², stride 2)
/// keeps its chunks of 32 (0.96–1.01). A budget of 256 KiB gave 0.96–1.0 on blocks 3–4 there,
/// 768 KiB 0.89–0.92. In the network, in sequence, blocks 3 and 4 took 0.92–0.95 and
/// 0.89–0.96 of the time; the whole network's medians moved within their noise (0.98–1.01).
/// (2 threads, separate processes alternated three times; the same bits: the chunks only
/// regroup the hidden channels, each summed in the same order.)
fn chunk_budget() -> usize {
    #[cfg(test)]
    if let Some(budget) = FORCED_BUDGET.get() {
        return budget;
    }
    budget_for(l2_bytes())
}

/// [`chunk_budget`] for an L2 of `l2` bytes.
pub(super) fn budget_for(l2: Option<usize>) -> usize {
    l2.map_or(E_BUDGET, |l2| (l2 / 4 / size_of::<f32>()).clamp(16 * 1024, 256 * 1024))
}

#[cfg(test)]
thread_local! {
    /// What [`chunk_budget`] gives on this thread, where a test has set it.
    pub(super) static FORCED_BUDGET: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Hidden channels per chunk of a band whose expanded rows are `erows` rows of `w` pixels:
/// as many as `budget` f32 elements hold ([`chunk_budget`]), at least [`MIN_CHUNK`], a
/// multiple of [`VB`], at most the padded hidden width `hp`.
pub(super) fn chunk_channels(budget: usize, erows: usize, w: usize, hp: usize) -> usize {
    ((budget / (erows * w).max(1)).max(MIN_CHUNK) / VB * VB).min(hp)
}

/// The fewest hidden channels of a band's chunk, whatever the budget allows: each chunk's
/// projection is one `gemm` call with the chunk's channels as its `K`, and at `K` = 16 the
/// call's packing weighed as much as its multiply-adds. MobileNetV2's block 2 (16 → 96 → 24
/// at 112², stride 2: bands of 29 expanded rows of 112 pixels, 16 channels within the budget)
/// took 0.80–0.87 of the time alone with chunks of 32 (48: 0.79–0.83, 64 and 96 no better), in
/// both layouts, and 0.85–0.88 in the network (2 threads, alternated run by run, 2-core
/// AVX-512 Xeon, then with a 128 KiB budget). The chunk's rows then take 406 KiB of L2, not
/// 128. The other blocks' chunks at 224² are at least this wide already.
const MIN_CHUNK: usize = 2 * VB;
/// Images of fewer than this many pixels per thread split their channels over the threads
/// ([`Block::by_channels`]), not their rows.
const CHANNEL_SPLIT_PIXELS: usize = 64;

/// NCHW blocks of at most this many output channels (MobileNetV2's blocks 2–13), in whole
/// images and in bands, compute each band's projection pixel-major (summed over the chunks of
/// hidden channels in a per-thread buffer) and transpose it into the output planes. `gemm`
/// makes the output's contiguous dimension its `M`: written into the planes, the pixels are
/// its `M` and the depthwise output (pixels × hidden, the larger operand) is packed through a
/// transposing gather; pixel-major, the channels are and the weight is gathered instead, as
/// in NHWC. The network profiled, the two interleaved run by run (2-core AVX-512 Xeon,
/// medians of 21): 0.79–0.83 of the time on blocks 5–6 (32 channels), 0.96 on block 7,
/// 0.89–0.91 on 8–10 (64), 0.96–1.0 on 11–13 (96); 1.05 on block 14 (160). The bands of blocks
/// 2–4 were level then (0.95–1.04); with the aligned buffers and the AVX transposes since, on a
/// 2-core Zen 3 (the block alone, separate processes alternated, three rounds), they took 0.75–0.78
/// of the time on block 3 (24 → 144 → 24 at 56²), 0.83–0.97 on blocks 2 and 4, where `gemm`'s
/// transposing gather of the depthwise output had been 15% of block 3's profile.
const NCHW_PIXEL_MAJOR_MAX_CO: usize = 96;

/// Images whose expanded tensor (hidden channels padded to [`VB`]) has at most this many f32
/// elements (1 MiB) are expanded whole.
const WHOLE_IMAGE: usize = 256 * 1024;

/// Reused buffers larger than this many f32 elements (4 MiB) are freed when given back: a
/// thread keeps at most three such buffers, 12 MiB, between calls.
const KEEP_MAX: usize = 1 << 20;

thread_local! {
    /// A thread's buffers for an image's expanded (or, without expand, filtered) tensor, a
    /// band's expanded rows and its filtered rows: each taken out of its slot while in use
    /// ([`Reused`]).
    static IMAGE_BUF: Cell<AlignedBuf<f32>> = const { Cell::new(AlignedBuf::empty()) };
    static ROWS_BUF: Cell<AlignedBuf<f32>> = const { Cell::new(AlignedBuf::empty()) };
    static FILTERED_BUF: Cell<AlignedBuf<f32>> = const { Cell::new(AlignedBuf::empty()) };
}

/// An f32 buffer from one of this thread's slots, reused from call to call, given back when
/// dropped: the block's expanded and filtered rows are written before they are read, so a
/// buffer is zeroed only when it is allocated (it was every call: a pass over up to 1 MiB
/// per image, `memset` 5% of the whole network's profile). Its contents are whatever the
/// last user left. It starts on a 64-byte boundary ([`AlignedBuf`]).
struct Reused {
    slot: &'static LocalKey<Cell<AlignedBuf<f32>>>,
    buf: AlignedBuf<f32>,
}

impl Reused {
    /// At least `len` elements.
    fn take(slot: &'static LocalKey<Cell<AlignedBuf<f32>>>, len: usize) -> Result<Reused> {
        let mut buf = slot.take();
        if buf.len() < len {
            drop(buf);
            buf = AlignedBuf::try_zeroed(len)
                .ok_or(Error::OutOfMemory { backend: BackendKind::Cpu, bytes: (len as u64) * 4 })?;
        }
        // Tests see a buffer of NaNs: a read before a write shows in the output.
        #[cfg(test)]
        buf.fill(f32::NAN);
        Ok(Reused { slot, buf })
    }

    /// Its first `len` elements (from a 64-byte boundary).
    fn aligned(&mut self, len: usize) -> &mut [f32] {
        &mut self.buf[..len]
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.len() <= KEEP_MAX {
            self.slot.set(buf);
        }
    }
}

/// The ranges [`Split::Auto`] splits an image's channels into (one per thread), or `None` to
/// split its rows: by channels below [`CHANNEL_SPLIT_PIXELS`] pixels per thread, counted on
/// the input, or in NCHW on the output. MobileNetV2's block 14 (96 → 576 → 160, stride 2,
/// 14 × 14 → 7 × 7) is the one block that counts differently: by channels it took 0.87 of the
/// time in NCHW (0.147 ms against 0.169; one thread 0.95) and 1.06× in NHWC (0.148 against
/// 0.139), so NHWC keeps the input's count (2-core AVX-512 Xeon, 2 threads, separate processes
/// alternated five times, medians of 400 calls each; the same bits either way).
pub(super) fn channel_split(d: &InvertedResidualDesc, threads: usize) -> Option<usize> {
    let pixels = match d.layout {
        Layout::Nhwc => d.height * d.width,
        _ => d.out_h() * d.out_w(),
    };
    (pixels < CHANNEL_SPLIT_PIXELS * threads).then_some(threads)
}

/// How [`Block::run_with`] splits an image over the threads (`Never` and `Tasks`: the tests').
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub(super) enum Split {
    /// By channels ([`Block::by_channels`]) below [`CHANNEL_SPLIT_PIXELS`] pixels per thread,
    /// else by rows ([`channel_split`]).
    Auto,
    /// By rows.
    Never,
    /// By channels, into this many ranges.
    Tasks(usize),
}

/// The operands, f32 (widened if stored in half precision).
pub(super) struct Block<'d> {
    pub(super) d: InvertedResidualDesc,
    pub(super) x: &'d [f32],
    pub(super) expand: Option<(&'d [f32], Option<&'d [f32]>)>,
    pub(super) dw: (&'d [f32], Option<&'d [f32]>),
    pub(super) project: (&'d [f32], Option<&'d [f32]>),
    /// The 1 × 1 weights transposed once, ahead of the calls (`crate::PackedBlock`): expand
    /// `[C][hidden]` and projection `[hidden][C']`, or `None` to read them as stored.
    pub(super) transposed: Option<Transposed<'d>>,
}

/// A block's 1 × 1 weights transposed, channel by channel of their output: expand
/// `[C][hidden]` (absent without expand), projection `[hidden][C']`. `gemm` lays a product out
/// with the output's contiguous dimension as its `M` and packs its left operand along `M` per
/// call; stored as PyTorch stores them (`[out][in]`), these weights are that operand read
/// across its rows, a transposing gather each call, and the small blocks' products run with
/// the pixels as `M` (49 at 7 × 7: on AVX-512, `gemm`'s 64-row tiles a quarter empty).
#[derive(Clone, Copy)]
pub(super) struct Transposed<'d> {
    pub(super) expand: Option<&'d [f32]>,
    pub(super) project: &'d [f32],
}

/// The depthwise weights packed for its register tiles, and the expand bias, zero-padded to
/// [`VB`] channels.
struct Packed {
    /// Hidden channels rounded up to [`VB`].
    hp: usize,
    /// The expand bias `[hp]` (zero without one).
    be: Vec<f32>,
    /// Depthwise `[9][hp]` and bias `[hp]`.
    wd: Vec<f32>,
    bd: Vec<f32>,
    /// The expand weight transposed for the small-K tiles, where [`takes_small_k`]
    /// holds.
    wet: Option<small_k::Weights>,
    /// The bands' chunk budget, f32 elements ([`chunk_budget`], or a test's).
    budget: usize,
}

/// Whether the expansion goes through the small-K register tiles ([`small_k::conv`]: AVX2
/// and FMA, at most [`small_k::SMALL_K`] input channels) instead of `gemm` and a pass for the
/// bias and ReLU6.
fn takes_small_k(isa: Isa, d: &InvertedResidualDesc) -> bool {
    d.expand && d.channels <= small_k::SMALL_K && isa != Isa::Portable
}

impl Block<'_> {
    fn pack(&self, isa: Isa) -> Result<Packed> {
        let hid = self.d.hidden;
        let hp = hid.div_ceil(VB) * VB;
        let mut p =
            Packed { hp, be: scratch(hp)?, wd: scratch(9 * hp)?, bd: scratch(hp)?, wet: None, budget: chunk_budget() };
        if let Some((_, Some(be))) = self.expand {
            p.be[..hid].copy_from_slice(&be[..hid]);
        }
        if let (true, Some((we, be))) = (takes_small_k(isa, &self.d), self.expand) {
            p.wet = Some(small_k::Weights::new(we, self.d.channels, hid, be)?);
        }
        for (j, taps) in self.dw.0.chunks_exact(9).take(hid).enumerate() {
            for (k, t) in taps.iter().enumerate() {
                p.wd[k * hp + j] = *t;
            }
        }
        if let Some(bd) = self.dw.1 {
            p.bd[..hid].copy_from_slice(&bd[..hid]);
        }
        Ok(p)
    }

    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        self.run_with(out, WHOLE_IMAGE, Split::Auto)
    }

    /// [`Self::run`], expanding images of at most `whole_max` expanded elements whole, their
    /// channels split as `split` says.
    pub(super) fn run_with<E: Elem>(&self, out: &mut [E], whole_max: usize, split: Split) -> Result<()> {
        let d = &self.d;
        let lens = d.checked_lens().ok_or_else(|| internal("block lengths overflow".into()))?;
        let short = |len: usize, need: usize| len < need;
        if short(self.x.len(), lens.input)
            || short(out.len(), lens.output)
            || short(self.dw.0.len(), lens.dw_weight)
            || short(self.project.0.len(), lens.project_weight)
            || self.expand.is_some_and(|(w, _)| short(w.len(), lens.expand_weight))
            || self.expand.is_some() != d.expand
            || self.transposed.is_some_and(|t| {
                short(t.project.len(), lens.project_weight)
                    || t.expand.is_some() != d.expand
                    || t.expand.is_some_and(|w| short(w.len(), lens.expand_weight))
            })
            || !matches!(d.stride, 1 | 2)
        {
            return Err(internal("block buffers are shorter than the descriptor".into()));
        }
        if lens.output == 0 {
            return Ok(());
        }
        if !d.expand {
            return self.without_expand(out);
        }
        let isa = Isa::detect();
        let p = self.pack(isa)?;
        let oh = d.out_h();
        let threads = rayon::current_num_threads().max(1);
        // Images whose expanded tensor fits in WHOLE_IMAGE are expanded whole first (no halo
        // rows computed twice), then one band per thread; larger ones go in bands of at most
        // 16 rows, enough for every thread twice over (halo rows cost 2/band_rows of the
        // expand work at stride 1), each expanding the rows it needs.
        let whole = p.hp * d.height * d.width <= whole_max;
        // Small images split their channels over the threads instead of their rows.
        let by_channels = match split {
            Split::Auto => channel_split(d, threads),
            Split::Never => None,
            Split::Tasks(t) => Some(t.max(1)),
        };
        let band = if whole { oh.div_ceil(threads) } else { oh.div_ceil(2 * threads).clamp(4.min(oh), 16) };
        // Images one after another, the bands of each on the calling thread and the pool's.
        let run_all = |dst: &mut [f32]| -> Result<()> {
            if dst.len() < lens.output {
                return Err(internal("a block's output is shorter than the descriptor".into()));
            }
            let out = Out(dst.as_mut_ptr());
            for n in 0..d.batch {
                if let Some(tasks) = by_channels {
                    // SAFETY: `dst` holds the whole output (checked above) and stays borrowed
                    // for the loop; the images run one after another.
                    unsafe { self.by_channels(isa, &p, n, tasks, &out)? };
                    continue;
                }
                let mut image = match whole {
                    true => Some(self.expand_image(isa, &p, n)?),
                    false => None,
                };
                let image = image.as_mut().map(|b| &*b.aligned(p.hp * d.height * d.width));
                try_for_each_index(oh.div_ceil(band), |b| {
                    let oy0 = b * band;
                    // SAFETY: `dst` holds the whole output (checked above) and stays borrowed
                    // for the loop; band b writes only output rows oy0..oy0 + rows of image n,
                    // which no other band touches.
                    unsafe { self.band(isa, &p, n, oy0, band.min(oh - oy0), &out, image) }
                })?;
            }
            Ok(())
        };
        // f32 output: written in place. Otherwise through an f32 staging buffer in the
        // output's layout, narrowed afterwards.
        if let Some(o) = E::as_f32_mut(out) {
            return run_all(&mut o[..lens.output]);
        }
        let mut stage = scratch(lens.output)?;
        run_all(&mut stage)?;
        for_each_chunk_mut(&mut out[..lens.output], CHUNK, |i, o| E::narrow_into(&stage[i * CHUNK..][..o.len()], o));
        Ok(())
    }

    /// op(X)'s first element for image `n`'s row `iy` and its strides (pixel, channel).
    fn x_view(&self, n: usize, iy: usize) -> (usize, usize, usize) {
        let d = &self.d;
        let x0 = d.input_index(n, 0, iy, 0);
        match d.layout {
            Layout::Nhwc => (x0, d.channels, 1),
            _ => (x0, 1, d.height * d.width),
        }
    }

    /// Image `n`'s rows `rows`, hidden channels `j0..j0 + jc` (of which `jr` are real) into
    /// `dst` (`[pixel][jc]`), with the bias and ReLU6, the channels past `jr` zero.
    #[allow(clippy::too_many_arguments)]
    fn expand_act(
        &self,
        isa: Isa,
        p: &Packed,
        n: usize,
        rows: Range<usize>,
        j0: usize,
        jc: usize,
        jr: usize,
        dst: &mut [f32],
    ) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if let Some(w) = &p.wet {
            let (x0, x_rs, x_cs) = self.x_view(n, rows.start);
            let x = Strided { ptr: self.x, rs: x_rs, cs: x_cs };
            let pixels = rows.len() * self.d.width;
            if !jc.is_multiple_of(VB) || dst.len() < pixels * jc {
                return Err(internal("a block's expansion past its buffers".into()));
            }
            // SAFETY: `pack` makes `wet` only where `takes_small_k` holds, which needs AVX2 and
            // FMA; dst holds `pixels` rows of `jc` (checked above) and is this thread's.
            return unsafe {
                small_k::conv(isa, x, x0, w, j0, jc, None, dst.as_mut_ptr(), jc, pixels, small_k::Act::Relu6)
            };
        }
        self.expand_rows(n, rows, j0..j0 + jr, dst, jc)?;
        activate(isa, &self.d, p, j0, jc, jr, dst);
        Ok(())
    }

    /// Image `n`'s rows `rows`, hidden channels `ch`, expanded into `dst`
    /// (`[pixel][ld]`), before the bias and ReLU6.
    fn expand_rows(&self, n: usize, rows: Range<usize>, ch: Range<usize>, dst: &mut [f32], ld: usize) -> Result<()> {
        let (iy0, nrows, j0, jr) = (rows.start, rows.len(), ch.start, ch.len());
        let (c, w) = (self.d.channels, self.d.width);
        let pixels = nrows * w;
        if pixels == 0 {
            return Ok(());
        }
        let (x0, x_rs, x_cs) = self.x_view(n, iy0);
        if x0 + (pixels - 1) * x_rs + (c - 1) * x_cs >= self.x.len() || (pixels - 1) * ld + jr > dst.len() {
            return Err(internal("block rows past their buffers".into()));
        }
        let Some((we, _)) = self.expand else {
            return Err(internal("a block without expand reached the expand step".into()));
        };
        // The weight as `gemm`'s right operand, `[C][hidden]` with the hidden channels
        // contiguous: transposed ahead of the call where given, else read across its rows.
        let hid = self.d.hidden;
        let w = match self.transposed.and_then(|t| t.expand) {
            // SAFETY (both arms): `we` and the transposed weight hold hidden × c (checked by
            // `run_with`); columns (rows of `we`) j0..j0 + jr are read.
            Some(wt) => Strided { ptr: unsafe { wt.as_ptr().add(j0) }, rs: hid, cs: 1 },
            None => Strided { ptr: unsafe { we.as_ptr().add(j0 * c) }, rs: 1, cs: c },
        };
        // SAFETY: op(X)'s pixels × c elements and dst's pixels rows of jr were checked above;
        // `w` is the weight's channels j0..j0 + jr (above).
        unsafe {
            gemm_f32(
                pixels,
                jr,
                c,
                Strided { ptr: dst.as_mut_ptr(), rs: ld, cs: 1 },
                Strided { ptr: self.x.as_ptr().add(x0), rs: x_rs, cs: x_cs },
                w,
                false,
                gemm::Parallelism::None,
            );
        }
        Ok(())
    }

    /// Image `n`'s whole expanded tensor (`[y][x][hp]`, bias and ReLU6 applied), its rows
    /// split over the threads.
    fn expand_image(&self, isa: Isa, p: &Packed, n: usize) -> Result<Reused> {
        let d = &self.d;
        let (h, w, hp) = (d.height, d.width, p.hp);
        let mut e_buf = Reused::take(&IMAGE_BUF, h * w * hp)?;
        let group = h.div_ceil(rayon::current_num_threads().max(1));
        let e = e_buf.aligned(h * w * hp);
        try_for_each_chunk_mut(e, group * w * hp, |g, part| {
            let nrows = part.len() / (w * hp);
            self.expand_act(isa, p, n, g * group..g * group + nrows, 0, hp, d.hidden, part)?;
            Ok(())
        })?;
        Ok(e_buf)
    }

    /// One band: output rows `oy0..oy0 + rows` of image `n` into `dst` (`[row][x][C']`, f32).
    /// With `image` (the image's expanded tensor from [`Self::expand_image`]) the band reads
    /// its rows from there; without, it expands the rows it needs itself, chunk by chunk of
    /// hidden channels.
    ///
    /// # Safety
    /// `out` points to the whole output (every image, in the descriptor's layout), and no
    /// other thread reads or writes the band's rows while this runs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn band(
        &self,
        isa: Isa,
        p: &Packed,
        n: usize,
        oy0: usize,
        rows: usize,
        out: &Out,
        image: Option<&[f32]>,
    ) -> Result<()> {
        let d = &self.d;
        let (h, w, s, hid) = (d.height, d.width, d.stride, d.hidden);
        let (ow, co) = (d.out_w(), d.out_channels);
        // Expanded rows the band needs: image rows oy0·s − 1 ..= (oy0 + rows − 1)·s + 1; those
        // inside the image are r_lo..r_hi.
        let erows = (rows - 1) * s + 3;
        let r_lo = usize::from(oy0 == 0);
        let r_hi = erows.min(h + 1 - oy0 * s);
        let iy0 = oy0 * s + r_lo - 1;
        // The band's first output element and the output's strides (pixel, channel).
        // SAFETY: the caller's contract: `out` points to the whole output.
        let dst = unsafe { out.0.add(d.output_index(n, 0, oy0, 0)) };
        let (o_rs, o_cs) = match d.layout {
            Layout::Nhwc => (co, 1),
            _ => (1, d.out_h() * ow),
        };
        let hc = match image {
            Some(_) => p.hp,
            None => chunk_channels(p.budget, erows, w, p.hp),
        };
        let own_len = if image.is_some() { 0 } else { erows * w * hc };
        let mut own_buf = Reused::take(&ROWS_BUF, own_len)?;
        let mut f_buf = Reused::take(&FILTERED_BUF, rows * ow * hc)?;
        let f = f_buf.aligned(rows * ow * hc);
        let own = own_buf.aligned(own_len);
        // The chunks of hidden channels, their projections into `pd` at strides (p_rs, p_cs),
        // added to what is there from the first chunk on where `preset`.
        let mut chunks = |pd: *mut f32, p_rs: usize, p_cs: usize, preset: bool| -> Result<()> {
            let mut j0 = 0;
            while j0 < hid {
                let jc = hc.min(p.hp - j0);
                let jr = jc.min(hid - j0);
                let a = ChunkArgs { d, p, isa, r_lo, r_hi, rows, j0, jc };
                // 1. The expanded rows inside the image, [r][x][jc] from row r_lo on.
                let e = match image {
                    Some(img) => &img[iy0 * w * jc..],
                    None => {
                        let er = &mut own[..(r_hi - r_lo) * w * jc];
                        self.expand_act(isa, p, n, iy0..iy0 + r_hi - r_lo, j0, jc, jr, er)?;
                        &own[..]
                    }
                };
                // 2. The depthwise rows into f.
                depthwise(isa, &a, e, f);
                // 3. f's projection onto the band's output: dst (+)= f · Wpᵀ.
                if f.len() < rows * ow * jc {
                    return Err(internal("a block band past its buffers".into()));
                }
                // SAFETY: f holds rows·ow pixels of jc channels (jr read); the band's rows·ow
                // pixels of co channels lie inside the output at dst with these strides (the
                // caller's contract), or in the product buffer (opix × co); the projection
                // weight holds co × hid (checked by `run`), columns j0..j0 + jr read (rows of
                // the transposed weight, `[hidden][C']`, where given).
                unsafe {
                    let w = match self.transposed {
                        Some(t) => Strided { ptr: t.project.as_ptr().add(j0 * co), rs: co, cs: 1 },
                        None => Strided { ptr: self.project.0.as_ptr().add(j0), rs: 1, cs: hid },
                    };
                    gemm_f32(
                        rows * ow,
                        co,
                        jr,
                        Strided { ptr: pd, rs: p_rs, cs: p_cs },
                        Strided { ptr: f.as_ptr(), rs: jc, cs: 1 },
                        w,
                        j0 > 0 || preset,
                        gemm::Parallelism::None,
                    );
                }
                j0 += jc;
            }
            Ok(())
        };
        // NCHW with few output channels: the projection pixel-major into this thread's product
        // buffer (`[pixel][co]`, starting at the bias), then transposed into the planes with
        // the residual (see [`NCHW_PIXEL_MAJOR_MAX_CO`]).
        let opix = rows * ow;
        if d.layout == Layout::Nchw && co <= NCHW_PIXEL_MAJOR_MAX_CO {
            let (x0, _, _) = self.x_view(n, oy0);
            let plane = d.out_h() * ow;
            let add = transpose::Add { bias: None, res: d.residual().then(|| (&self.x[x0..], d.height * d.width)) };
            return transpose::with_product(co * opix, |t| {
                if let Some(bp) = self.project.1 {
                    for r in t.chunks_exact_mut(co) {
                        r.copy_from_slice(&bp[..co]);
                    }
                }
                chunks(t.as_mut_ptr(), co, 1, self.project.1.is_some())?;
                // SAFETY: t holds opix × co; the band's opix pixels of the co planes lie
                // inside the output at dst, `plane` apart (the caller's contract), and the
                // residual (the input's, stride 1 only, where the planes are as large) at x0,
                // as many apart.
                unsafe { transpose::transpose(isa, opix, co, t.as_ptr(), co, dst, plane, add) };
                Ok(())
            })?;
        }
        chunks(dst, o_rs, o_cs, false)?;
        // SAFETY: the band's rows·ow pixels of co channels lie inside the output at dst.
        unsafe { self.finish(isa, n, oy0, rows * ow, 0..co, dst, o_rs, o_cs) };
        Ok(())
    }

    /// A block without expand (MobileNetV2's first): its hidden tensor is the input, so it
    /// runs as the depthwise kernel on the input in its layout (into an f32 buffer) and then
    /// the pointwise kernel with the projection's bias and the residual. Expanding it into
    /// the fused paths' `[pixel][channel]` rows was a copy (a transpose in NCHW) that took
    /// this 1.37–1.47× the time (MobileNetV2's block 1 at 112², in-process against the
    /// chain of public ops, both layouts).
    fn without_expand<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let d = &self.d;
        let mut dw = Conv2dDesc::mobilenet_v2_block(d.batch, d.hidden, d.height, d.stride, d.layout);
        dw.width = d.width;
        dw.has_bias = self.dw.1.is_some();
        let pixels = d.out_h() * d.out_w();
        let len = d.batch * d.hidden * pixels;
        let mut f_buf = Reused::take(&IMAGE_BUF, len)?;
        let f = f_buf.aligned(len);
        Conv { d: dw, x: self.x, xh: None, w: self.dw.0, packed: false, bias: self.dw.1 }.run(f)?;
        let pd = PointwiseDesc {
            batch: d.batch,
            cin: d.hidden,
            cout: d.out_channels,
            pixels,
            activation: Activation::None,
            layout: d.layout,
        };
        let residual = d.residual().then_some(self.x);
        Pointwise { d: pd, x: f, w: self.project.0, bias: self.project.1, residual }.run(out)
    }

    /// The projection bias and the residual added onto `pixels` output pixels from row `oy0`
    /// of image `n` (at `dst`, strides `o_rs` per pixel and `o_cs` per channel), channels
    /// `ch`: channel by channel in NCHW (`o_rs` = 1), pixel by pixel in NHWC (`o_cs` = 1), each
    /// a contiguous run of the output and of the input ([`finish_run`], vectorised). Element
    /// by element through the strides (scalar code), NHWC MobileNetV2's residual blocks took
    /// 1.06–1.1× the time and the whole network 1.03× (profiled per op, two runs of each
    /// build alternated, the same sums); NCHW, whose projection mostly adds them in its
    /// transposes, was level.
    ///
    /// # Safety
    /// Those pixels' channels `ch` lie inside the output at `dst`, and no other thread reads
    /// or writes them while this runs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn finish(
        &self,
        isa: Isa,
        n: usize,
        oy0: usize,
        pixels: usize,
        ch: Range<usize>,
        dst: *mut f32,
        o_rs: usize,
        o_cs: usize,
    ) {
        let d = &self.d;
        let (x0, x_rs, x_cs) = self.x_view(n, oy0);
        let nchw = o_rs == 1;
        // The input's runs are contiguous along the same axis as the output's.
        debug_assert!(if nchw { x_rs == 1 } else { o_cs == 1 && x_cs == 1 });
        let (outer, inner) = if nchw { (ch.len(), pixels) } else { (pixels, ch.len()) };
        for i in 0..outer {
            let (at, x_at, bias) = if nchw {
                let o = ch.start + i;
                (o * o_cs, x0 + o * x_cs, self.project.1.map(|b| RunBias::One(b[o])))
            } else {
                (i * o_rs + ch.start, x0 + i * x_rs + ch.start, self.project.1.map(|b| RunBias::Each(&b[ch.clone()])))
            };
            // SAFETY: the run's `inner` elements are those pixels' channels `ch` (the
            // caller's contract), no other slice of them alive.
            let v = unsafe { std::slice::from_raw_parts_mut(dst.add(at), inner) };
            let x = d.residual().then(|| &self.x[x_at..][..inner]);
            finish_run(isa, v, bias, x);
        }
    }

    /// Image `n` of a small block, its channels split over `tasks` tasks: first each task
    /// expands and filters one range of hidden channels (every pixel, into its own part of an
    /// f32 buffer `[range][pixel][channel]`), then each projects every pixel onto one range
    /// of output channels. Each `gemm` call then reads only its share of a weight; split by
    /// rows, every thread reads and packs all of both weights for a few pixels.
    ///
    /// # Safety
    /// `out` points to the whole output (every image, in the descriptor's layout), and no
    /// other thread reads or writes image `n`'s part of it while this runs.
    unsafe fn by_channels(&self, isa: Isa, p: &Packed, n: usize, tasks: usize, out: &Out) -> Result<()> {
        let d = &self.d;
        let (h, w, hid) = (d.height, d.width, d.hidden);
        let (oh, ow, co) = (d.out_h(), d.out_w(), d.out_channels);
        let opix = oh * ow;
        // Hidden channels per task, a multiple of VB; the last range may be shorter.
        let jb = (p.hp / VB).div_ceil(tasks).max(1) * VB;
        let mut f_buf = Reused::take(&FILTERED_BUF, opix * p.hp)?;
        let f_all = f_buf.aligned(opix * p.hp);
        try_for_each_chunk_mut(f_all, opix * jb, |q, f| {
            let (j0, jc) = (q * jb, f.len() / opix.max(1));
            let jr = jc.min(hid - j0);
            let mut e_buf = Reused::take(&ROWS_BUF, h * w * jc)?;
            let e = e_buf.aligned(h * w * jc);
            self.expand_act(isa, p, n, 0..h, j0, jc, jr, e)?;
            // The whole image as one band: expanded rows 1..=h are image rows 0..h.
            let a = ChunkArgs { d, p, isa, r_lo: 1, r_hi: h + 1, rows: oh, j0, jc };
            depthwise(isa, &a, e, f);
            Ok(())
        })?;
        let f_all = &*f_all;
        let (o_rs, o_cs) = match d.layout {
            Layout::Nhwc => (co, 1),
            _ => (1, opix),
        };
        let ob = co.div_ceil(tasks).max(1);
        // NHWC: the projection into a channel-major buffer (`gemm`'s NCHW orientation, the
        // weight read along its rows; see `transpose.rs`), then transposed into the output.
        let orient = d.layout == Layout::Nhwc;
        try_for_each_index(co.div_ceil(ob), |t| {
            let (o0, on) = (t * ob, ob.min(co - t * ob));
            // SAFETY: the caller's contract: `out` points to the whole output.
            let dst = unsafe { out.0.add(d.output_index(n, 0, 0, 0)) };
            // The projection into `pd` at strides (p_rs, p_cs): this thread's product buffer
            // (channel-major), or the output's channels o0...
            let project = |pd: *mut f32, p_rs: usize, p_cs: usize| {
                let mut j0 = 0;
                while j0 < hid {
                    let jc = jb.min(p.hp - j0);
                    let jr = jc.min(hid - j0);
                    let f = &f_all[j0 * opix..][..jc * opix];
                    // SAFETY: f holds opix pixels of jc channels (jr read); the image's opix
                    // pixels of output channels o0..o0 + on lie inside the output at dst with
                    // these strides (the caller's contract), and no other task writes those
                    // channels (or in the product buffer, on × opix); the projection weight
                    // holds co × hid (checked by `run`), rows o0..o0 + on and columns
                    // j0..j0 + jr read.
                    // The transposed weight, where given, `[hidden][C']`, holds the same.
                    unsafe {
                        let w = match self.transposed {
                            Some(t) => Strided { ptr: t.project.as_ptr().add(j0 * co + o0), rs: co, cs: 1 },
                            None => Strided { ptr: self.project.0.as_ptr().add(o0 * hid + j0), rs: 1, cs: hid },
                        };
                        gemm_f32(
                            opix,
                            on,
                            jr,
                            Strided { ptr: pd, rs: p_rs, cs: p_cs },
                            Strided { ptr: f.as_ptr(), rs: jc, cs: 1 },
                            w,
                            j0 > 0,
                            gemm::Parallelism::None,
                        );
                    }
                    j0 += jc;
                }
            };
            // With the weight transposed, the products are pixel-major (the output channels
            // contiguous, `gemm`'s `M`, and the weight read along its rows): straight into an
            // NHWC output; for NCHW into this thread's product buffer, then transposed into the
            // planes. The bias and the residual follow (`finish`).
            if self.transposed.is_some() {
                if d.layout == Layout::Nhwc {
                    // SAFETY: as below, with the NHWC output's strides.
                    project(unsafe { dst.add(o0) }, co, 1);
                } else {
                    transpose::with_product(opix * on, |t| {
                        project(t.as_mut_ptr(), on, 1);
                        // SAFETY: t holds opix × on; channels o0..o0 + on of the image's
                        // planes (opix each, at dst + o0 · opix) are this task's (as below).
                        unsafe {
                            transpose::transpose(
                                isa,
                                opix,
                                on,
                                t.as_ptr(),
                                on,
                                dst.add(o0 * opix),
                                opix,
                                transpose::Add::default(),
                            )
                        };
                    })?;
                }
                // SAFETY: as for the projection.
                unsafe { self.finish(isa, n, 0, opix, o0..o0 + on, dst, o_rs, o_cs) };
                return Ok(());
            }
            if orient {
                let (x0, _, _) = self.x_view(n, 0);
                let add = transpose::Add {
                    bias: self.project.1.map(|b| &b[o0..o0 + on]),
                    res: d.residual().then(|| (&self.x[x0 + o0..], d.channels)),
                };
                return transpose::with_product(on * opix, |t| {
                    project(t.as_mut_ptr(), 1, opix);
                    // SAFETY: t holds on × opix; the output's opix pixels of channels
                    // o0..o0 + on at dst + o0, `co` apart, are this task's (as above).
                    unsafe { transpose::transpose(isa, on, opix, t.as_ptr(), opix, dst.add(o0), co, add) };
                });
            }
            // SAFETY: those channels lie inside the output (the caller's contract).
            project(unsafe { dst.add(o0 * o_cs) }, o_rs, o_cs);
            // SAFETY: as for the projection.
            unsafe { self.finish(isa, n, 0, opix, o0..o0 + on, dst, o_rs, o_cs) };
            Ok(())
        })
    }
}

/// What one chunk of hidden channels of one band needs.
struct ChunkArgs<'a> {
    d: &'a InvertedResidualDesc,
    p: &'a Packed,
    /// The instruction set the depthwise rows run in.
    isa: Isa,
    /// The expanded rows inside the image.
    r_lo: usize,
    r_hi: usize,
    /// Output rows.
    rows: usize,
    /// The chunk's first hidden channel and its width (a multiple of [`VB`]).
    j0: usize,
    jc: usize,
}

/// The output, shared by the bands (each writes only its own rows).
struct Out(*mut f32);
// SAFETY: the bands write disjoint elements (see `Block::band`), and the caller waits for them.
unsafe impl Sync for Out {}

#[inline(always)]
fn relu6(v: f32) -> f32 {
    v.clamp(0.0, 6.0)
}

/// Bias and ReLU6 on expanded pixels (`e`, `[pixel][jc]`, hidden channels `j0..j0 + jr`; the
/// channels `jr..jc` zeroed).
#[inline(always)]
fn activate_inner<const FMA: bool>(
    d: &InvertedResidualDesc,
    p: &Packed,
    j0: usize,
    jc: usize,
    jr: usize,
    e: &mut [f32],
) {
    let be = &p.be[j0..j0 + jr];
    for ev in e.chunks_exact_mut(jc) {
        let (real, pad) = ev.split_at_mut(jr);
        if d.expand {
            for (v, b) in real.iter_mut().zip(be) {
                *v = relu6(*v + b);
            }
        }
        pad.fill(0.0);
    }
}

multiversion! {
    fn activate(d: &InvertedResidualDesc, p: &Packed, j0: usize, jc: usize, jr: usize, e: &mut [f32]) => activate_inner
}

/// The projection bias of a run of the output ([`Block::finish`]): one channel's (NCHW), or
/// each element's own (NHWC, a pixel's channels).
#[derive(Clone, Copy)]
enum RunBias<'a> {
    One(f32),
    Each(&'a [f32]),
}

/// `v += bias`, then `v += x`, element by element (the bits of the two additions in turn).
#[inline(always)]
fn finish_run_inner<const FMA: bool>(v: &mut [f32], bias: Option<RunBias>, x: Option<&[f32]>) {
    match bias {
        Some(RunBias::One(b)) => v.iter_mut().for_each(|e| *e += b),
        Some(RunBias::Each(b)) => v.iter_mut().zip(b).for_each(|(e, b)| *e += b),
        None => {}
    }
    if let Some(x) = x {
        v.iter_mut().zip(x).for_each(|(e, x)| *e += x);
    }
}

multiversion! {
    fn finish_run(v: &mut [f32], bias: Option<RunBias>, x: Option<&[f32]>) => finish_run_inner
}

/// One chunk's depthwise rows into `f` (`[row][x][jc]`, ReLU6 applied) from its expanded rows
/// (`e`: `[r][x][jc]` from row `r_lo` on).
#[inline(always)]
fn depthwise_inner<const FMA: bool>(a: &ChunkArgs, e: &[f32], f: &mut [f32]) {
    let (d, p) = (a.d, a.p);
    let (w, s, hp, ow) = (d.width, d.stride, p.hp, d.out_w());
    let (jc, j0) = (a.jc, a.j0);
    let bd = &p.bd[j0..j0 + jc];
    // Expanded row r's offset in e, None outside the image.
    let erow = |r: usize| (a.r_lo..a.r_hi).contains(&r).then(|| (r - a.r_lo) * w * jc);
    for ly in 0..a.rows {
        let fr = &mut f[ly * ow * jc..][..ow * jc];
        let er: [Option<usize>; 3] = std::array::from_fn(|ky| erow(ly * s + ky));
        // On AVX2 and FMA, the NHWC depthwise kernel's register tiles.
        #[cfg(target_arch = "x86_64")]
        if FMA {
            use super::depthwise::nhwc3::{
                RowGeometry,
                avx::{RELU6, row_for},
            };
            // Pixels lo..hi have all three taps inside the row (padding 1 on each side).
            let lo = 1.min(ow);
            let hi = if w > 1 { ((w - 2) / s + 1).min(ow) } else { 0 }.max(lo);
            let g = RowGeometry { c: jc, width: w, pad_left: 1, lo, hi, ow };
            let wd = &p.wd[j0..];
            // On AVX-512, 16-channel vectors (`jc` is a multiple of VB = 16).
            let wide = a.isa == Isa::Avx512 && jc.is_multiple_of(16);
            // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
            // `multiversion!`, which run only where the CPU reported AVX2 and FMA; `a.isa` is
            // `Isa::Avx512` only where it also reported AVX-512F.
            unsafe { row_for(wide, s, RELU6, e, er, &g, wd, hp, Some(bd), jc, fr, jc) };
            continue;
        }
        for ox in 0..ow {
            let fv = &mut fr[ox * jc..][..jc];
            fv.copy_from_slice(bd);
            for (ky, r) in er.iter().enumerate() {
                let Some(r) = *r else { continue };
                for kx in 0..3 {
                    let Some(ix) = (ox * s + kx).checked_sub(1).filter(|&ix| ix < w) else { continue };
                    let ev = &e[r + ix * jc..][..jc];
                    let wv = &p.wd[(ky * 3 + kx) * hp + j0..][..jc];
                    for ((o, x), wk) in fv.iter_mut().zip(ev).zip(wv) {
                        *o = madd::<FMA>(*x, *wk, *o);
                    }
                }
            }
            for v in fv.iter_mut() {
                *v = relu6(*v);
            }
        }
    }
}

multiversion! {
    fn depthwise(a: &ChunkArgs, e: &[f32], f: &mut [f32]) => depthwise_inner
}
