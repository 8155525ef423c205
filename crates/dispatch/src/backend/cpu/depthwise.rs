//! Depthwise 2-D convolution on the CPU, both layouts, any kernel size, stride, dilation,
//! padding and channel multiplier.
//!
//! - NCHW 3 × 3 layers with stride and dilation 1, padding 1 all round, multiplier 1 and rows
//!   of 9 to 16 or 24 to 32 pixels, on AVX-512 ([`roll512`]): each output row one or two
//!   16-lane vectors, each input row loaded once (one load a vector, two shifts for its left
//!   and right columns) and multiplied into the three output rows that read it, whose sums
//!   roll down the plane: 9 multiply-adds and 2 shifts a vector, the sums in kernel order (the
//!   band and tile kernels' bits). Against the flat planes below, which took them before
//!   (bias + ReLU6, 2 threads, separate processes alternated five times, 2-core AVX-512
//!   Xeon): MobileNetV2's 576 × 14² in 0.75 of the time, 384 × 14² 0.77, 192 × 28² 0.85 (one
//!   thread alike; in f16 0.86–0.88). A thread's planes go as one run, through
//!   [`Conv::nchw_flat`] as the flat planes do.
//! - Other NCHW 3 × 3 layers with stride and dilation 1, padding 1 all round, multiplier 1, rows
//!   of at most 8 pixels and planes of at most 256, rows of 17 to 23 and planes of at most
//!   1024, or rows of 33 to 256, on AVX-512 ([`flat512`], which also takes the widths between,
//!   as it did before the rolling rows): each plane as one flat run of pixels, 16 outputs a
//!   vector (rows as vectors would use 7 lanes of 16 at MobileNetV2's 7²), by column sums:
//!   the kernel's three columns summed down the rows at every pixel
//!   (the rows above and below each one shift out of the plane's 16-pixel blocks, or loaded
//!   where they lie from 32 pixels a row), then each pixel's sum plus its left
//!   neighbour's left column and its right neighbour's right column (one `valignd` each, the
//!   row's ends zeroed). That is another order of the sums than the other kernels' (exact
//!   where every partial sum is): against the taps one by one in kernel order, MobileNetV2's
//!   576 × 14² and 384 × 14² took 0.69–0.72 of the time, 192 × 28² 0.66, 960 × 7² 0.86 (one
//!   thread; about 0.7 on two but 960 × 7² 0.85–0.95); rows of 32 to 256 took 0.7–0.91 of
//!   the 16-lane rows' time on planes in cache (32 × 56², 96 × 32², 64 × 33²), 0.97–1.0 on
//!   MobileNetV2's 32 × 112² and 144 × 56². That kernel order had taken 0.77–0.78
//!   of the 16-lane rows' time below at 14², 0.87 at 28², and was level with the channel
//!   blocks at 7². A thread's planes go as one run ([`flat512::planes`]; one call each had
//!   taken 1.1–1.4× the time). Half-precision inputs are widened, and outputs rounded,
//!   [`FLAT_CHUNK`] elements of whole planes at a time through the thread's buffers
//!   ([`Conv::nchw_flat`]): in f16, 576 × 14² took 0.7 of the channel blocks' time below,
//!   384 × 14² 0.75, 960 × 7² 0.83, and 192 × 28² was level with the 16-lane rows (2
//!   threads, separate processes alternated twice, the same sums), before the column sums
//!   (576 × 14² in f16: 0.73 of that).
//! - NCHW 3 × 3 layers at stride 2 both ways with padding 1 at the top and left (at most 1 at
//!   the bottom and right), dilation and multiplier 1 and rows of at least 8 outputs, on
//!   AVX-512 ([`stride2`]): each output row 16 outputs a vector by column sums over the
//!   input's even and odd columns (two loads a row split by two in-lane `vshufps`, in the
//!   flat planes' order of the sums; two output rows at a time share their middle input row).
//!   Against the 16-lane rows below, which took them before (2 threads, separate processes
//!   alternated three times, bias + ReLU6): MobileNetV2's 96 × 112² stride 2 in 0.67 of the
//!   time, 144 × 56² stride 2 0.71, 192 × 28² stride 2 0.78; in f16 0.8 and 0.95 at 28² and
//!   56². A thread's planes go as one run, through [`Conv::nchw_flat`] as the flat planes do.
//! - NCHW 3 × 3 layers (multiplier 1, stride 1 or 2, horizontal dilation 1, no activation,
//!   ReLU or ReLU6) with whole 16-channel blocks and input planes of at most 128 pixels at
//!   stride 1 where the flat planes do not take them, or at stride 2 of at most 64² where the
//!   16-lane rows below do not take them
//!   (rows of fewer than 8 outputs, vertical dilation, unequal strides), on AVX-512
//!   ([`Conv::nchw_blocks`]): 16 planes at a time are transposed into a pixel-major block
//!   (16 × 16 transposes in registers, f16 and bf16 widened there), run through the NHWC
//!   channel blocks' plane kernel below, and transposed back (rounded there). MobileNetV2's
//!   960 × 7² took 0.53–0.60 of the tile kernel's time, its strided 576 × 14² 0.55 in f32, 0.63
//!   in f16 (2 threads, in-process A/B, the same bits).
//! - Other NCHW 3 × 3 layers with dilation 1, stride 1 or 2 both ways and rows of 8 to 256
//!   outputs, on AVX-512 ([`rows512`]): each output row as 16-lane vectors, 4 output rows at a
//!   time so each input row's three tap vectors are read once for all of them (at stride 1
//!   three shifted loads, at stride 2 two loads split into even and odd columns by permutes),
//!   masked where a lane's tap or load lies outside. MobileNetV2's 14² to 112² layers at
//!   stride 1 took 0.49–0.68 of the tile kernel's time below (f32, f16 and packed weights
//!   alike, 2 threads, 2-core AVX-512 Xeon, in-process A/B, the same bits; the flat planes
//!   above take those layers now); its strided 28² to 112² layers 0.55–0.8 of the channel
//!   blocks' or the tile's (the stride-2 column sums above take those with padding 1 now; the
//!   rows keep the other paddings and multipliers).
//! - Other NCHW planes of at most 16 × 16 pixels, 3 × 3 kernels (horizontal dilation 1,
//!   stride 1 or 2) of any size on AVX2 and AVX-512, and strided layers of up to 64 × 64
//!   outputs ([`tile`]): 8 planes at a time are transposed into one zero-padded tile with the planes
//!   as the vector lanes (in bands of rows where the whole padded plane does not fit), each
//!   tap is one vector load at a fixed offset times the tap's weight vector, 8 output pixels
//!   at a time, and the sums are transposed back. On MobileNet's 7² and 14² planes this is
//!   1.5–2.5× the band kernel (band building and row bookkeeping dominated there), and
//!   1.2–4× at stride 2 (112² to 14²). Past 64² outputs (3 × 3 only) the sums go band by
//!   band too: 1.2–1.35× the band kernel at 32 × 112² and 64 × 100², 1.04–1.13× at 16 × 224²
//!   and 24 × 70² (separate processes alternated, 1 and 2 threads, 2-core Zen 3).
//! - Other NCHW layers ([`Band`]): a band of output rows of one plane is computed from a
//!   copy of the input rows it reaches, zero-padded and split by column into the horizontal
//!   stride's phases, so every tap of an 8-wide chunk of outputs is one contiguous load at a
//!   fixed offset with no border test; 4 rows × 8 columns are accumulated in registers over
//!   all taps (one broadcast weight, four loads and four multiply-adds per tap) and stored
//!   once. 3 × 3 kernels with vertical stride 1 or 2 ([`band3`], MobileNet's layers) load
//!   each input row's three shifted vectors once for all the group's output rows that read it
//!   (18 loads per 36 multiply-adds at stride 1). Layers outside the band buffer (more than
//!   64 taps, rows too wide) take the row path: one output row as the vector, each tap's
//!   valid range computed once per plane ([`tap_range`]), 3-wide kernels' three taps fused
//!   where all are valid.
//! - NHWC 3 × 3 layers (multiplier 1, stride 1 or 2, no activation, ReLU or ReLU6) with
//!   input planes of at most 64² pixels (32² in half precision, 112² at stride 2 in f32
//!   16-channel blocks on AMD) and whole 8-channel blocks, on AVX2 and AVX-512
//!   ([`Conv::nhwc_blocks`]; f16 and bf16 on AVX-512 with whole 16-channel blocks): one
//!   channel block of one image at a time, its nine weight vectors loaded once for the whole
//!   plane (taken from the stored `[channel][tap]` weights in the block's task: gathered in
//!   8 lanes, split out of nine loads by permutes in 16, `nhwc3`'s `stored_taps`), the
//!   block's input, three rows at a time, in L1 from one output row to the next; one run of
//!   blocks per thread. MobileNetV2's layers up to 56² took 0.46–0.66 of the time of the rows
//!   below in f32; in f16 (each block's input widened into a buffer and its output rounded
//!   from one, 16 lanes an instruction) 0.57 at 7², 0.64–0.67 at 14² and 28², but 1.1× at 56².
//! - Other NHWC layers: channels are the SIMD axis. Weights are transposed once per call, on the calling
//!   thread, into a buffer laid out `[tap][channel]` (per task, it was a quarter of a 14²
//!   layer's time). 3 × 3 kernels with multiplier 1, horizontal dilation 1, stride 1 or 2 and
//!   whole 8-channel blocks take [`nhwc3`] where the CPU has AVX2 and FMA: the block's nine
//!   weight vectors stay in registers over a row's pixels, each input vector is loaded once
//!   per kernel row for the 4 pixels of a tile that read it. Otherwise, with multiplier 1
//!   and whole 16-channel blocks, the pixels of
//!   a row whose every tap is inside the input go 4 at a time ([`nhwc_pixels`]): each tap's
//!   weight vectors are loaded once for the 4 pixels and the 4 × 16 sums stay in registers
//!   (10 loads per 8 vector multiply-adds, against 4 per 2). The other pixels list their taps
//!   inside the input once and accumulate each 16-channel block over them ([`nhwc_pixel`]).
//!   With a multiplier above 1, each tap's input channel is broadcast over the run of
//!   output channels that read it (im2col's 3 × 9 channels through this path took 3.3 ms at
//!   224² with a division per element, 1.9 ms so; `im2col` is now a gather of its own).
//! - Pre-packed weights (`PackedDepthwise`, `[kh, kw, C·m]`) are read as they are by the NHWC
//!   kernels (no transposition), the NCHW tile and the 16-lane rows; the NCHW band and row
//!   kernels get them moved back to `[channel][tap]` once per call, into the same per-thread
//!   buffer.
//! - A half-precision input of an NHWC layer the 3 × 3 rows take is not widened whole first:
//!   each output row's task widens the (up to) three input rows it reads into its thread's
//!   buffer ([`Conv::nhwc_rows`]). Widened whole, in a parallel pass before the layer, the
//!   input came to each core from the other's cache, and the two passes' hand-offs cost as
//!   much as a small layer: MobileNetV2's eight layers in f16 took 0.50–0.85 of the time
//!   (32 × 112² 0.72, 96 × 112² stride 2 0.50, 960 × 7² 0.77; 2 threads, separate processes
//!   alternated, the same sums). The NCHW tile likewise widens each group's planes
//!   ([`tile::planes`]): the seven layers it takes in 0.65–0.96 of the time (96 × 112²
//!   stride 2 0.66, 384 × 14² 0.81–0.83), and the NCHW band, row and 16-lane row kernels
//!   each input plane ([`PlaneIn`]: 32 × 112² in 0.75–0.85), and the NHWC channel blocks
//!   each block. The other NHWC kernels widen the input whole.
//! - The bias and the activation are applied to the row while it is in L1, and half-precision
//!   outputs are rounded once when the row is stored. f32 outputs are accumulated where they
//!   lie; other dtypes through the thread's row buffer (NHWC) or its band or tile buffers
//!   (NCHW), made once per thread. No call allocates after a thread's first.
//! - Work is split over (image, channel plane) blocks for NCHW and (image, output row) blocks
//!   for NHWC (the channel blocks: (image, channel block), or bands of rows of every block
//!   where the blocks split unevenly between the threads: [`row_bands`]), one run of them per
//!   thread so a layer's planes or rows stay on one core from call to call ([`in_tasks`]),
//!   and only when the layer has enough multiply-adds to pay for the hand-off; the calling
//!   thread works on the blocks from the start, with the pool's threads joining as they wake
//!   ([`for_each_chunk_mut`]).

use super::activation::apply_isa;
use super::aligned::AlignedBuf;
use super::pool::for_each_chunk_mut;
#[cfg(target_arch = "x86_64")]
use super::pool::for_each_index;
use super::simd::{self, Isa, madd, multiversion};
use super::{Elem, Halves, internal};
use crate::Result;
use tilekit_kernels::{Conv2dDesc, Layout};

#[cfg(target_arch = "x86_64")]
mod flat512;
#[cfg(target_arch = "x86_64")]
pub(super) mod nhwc3;
#[cfg(target_arch = "x86_64")]
mod roll512;
#[cfg(target_arch = "x86_64")]
mod rows512;
#[cfg(target_arch = "x86_64")]
mod stride2;
mod tile;

/// The NCHW plane kernels by rolling rows and by column sums ([`Conv::nchw_flat`]). One
/// lives on the stack for a call; boxing the larger would allocate once per call.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::large_enum_variant)]
enum Flat {
    /// 3 × 3 "same" at stride 1 ([`flat512`]).
    Same(flat512::Flat512),
    /// 3 × 3 "same" at stride 1, rows of 9 to 16 or 24 to 32 pixels ([`roll512`]).
    Roll(roll512::Roll512),
    /// 3 × 3 at stride 2 ([`stride2`]).
    Stride2(stride2::Stride2),
}

#[cfg(target_arch = "x86_64")]
impl Flat {
    /// Pixels per input plane and per output plane.
    fn pixels(&self) -> (usize, usize) {
        match self {
            Flat::Same(g) => (g.pixels(), g.pixels()),
            Flat::Roll(g) => (g.pixels(), g.pixels()),
            Flat::Stride2(g) => g.pixels(),
        }
    }
}

/// Below this many multiply-adds a convolution runs on the calling thread (~30 µs of work).
const PARALLEL_MIN: usize = 1 << 17;

/// The most input pixels per plane of an NHWC 3 × 3 layer that runs one channel block at a
/// time ([`Conv::nhwc_blocks`]). MobileNetV2's layers up to 56² took 0.46–0.66 of the row
/// kernel's time that way, its 112² ones 1.3–1.4× (2-core AVX-512 Xeon, in-process A/B): their
/// inputs (1.6–4.8 MB) come from memory, and a block reads one cache line per pixel.
#[cfg(target_arch = "x86_64")]
const BLOCK_PLANE: usize = 64 * 64;

/// [`BLOCK_PLANE`] for f32 16-channel blocks at stride 2 both ways on AMD's cores
/// ([`simd::amd`]): MobileNetV2's 96 × 112² stride-2 layer took 0.72 of the row kernel's time
/// that way (2 threads; 0.72 on one; separate processes alternated three times, 2-core Zen 4),
/// where at stride 1 its 32 × 112² took 1.6× (each output pixel reads a quarter as many new
/// input lines at stride 2). On a 2-core Intel Xeon with AVX-512 (family 6 model 167, KVM) the
/// same layer went the other way: the rows took 0.65 of the blocks' time on 2 threads and 0.57
/// on one (separate processes alternated five times), so other CPUs keep [`BLOCK_PLANE`].
#[cfg(target_arch = "x86_64")]
const BLOCK_PLANE_S2_AMD: usize = 112 * 112;

/// [`BLOCK_PLANE`] for a half-precision input or output, whose block is widened into (and
/// rounded from) the thread's buffer: at 144 × 56² the blocks took 1.09–1.13× the row
/// kernel's time in f16 (stride 1 and 2, in-process A/B), against 0.48–0.57 in f32.
#[cfg(target_arch = "x86_64")]
const BLOCK_PLANE_HALF: usize = 32 * 32;

/// The most input pixels per plane of an NCHW layer with a horizontal stride of 2 that goes 16
/// planes at a time through the channel blocks ([`Conv::nchw_blocks`]) where the 16-lane rows
/// ([`rows512`]) do not take it. Against the channel-vector tile (2 threads, 2-core AVX-512
/// Xeon, in-process A/B, the same bits): MobileNetV2's 576 × 14² 0.55 of the time, 192 × 28²
/// 0.76, 144 × 56² 0.88–0.90, but 96 × 112² 1.13 (the rows now take the last three: 0.55–0.68
/// of the blocks' time at 56² and 28²).
#[cfg(target_arch = "x86_64")]
const NCHW_BLOCK_PLANE: usize = 64 * 64;

/// [`NCHW_BLOCK_PLANE`] at stride 1, where the 16-lane rows take the planes from 8 outputs
/// wide: MobileNetV2's 960 × 7² took 0.53–0.60 of the tile's time (packed weights and not),
/// its 384 × 14² 0.98–0.99 (the rows' time), 192 × 28² 1.31 of the rows'.
#[cfg(target_arch = "x86_64")]
const NCHW_BLOCK_PLANE_S1: usize = 128;

/// 16 planes of `hw` elements (`x`, one after another; f32, or f16 and bf16 widened as
/// `convert.rs` widens them, by `activation::avx512::Io`) as pixels of 16 lanes (`dst`), 16
/// pixels at a time through a 16 × 16 transposition in registers ([`transpose16`]); `dst`
/// holds `hw` rounded up to 16 pixels, the ones past `hw` zero.
///
/// # Safety
/// The CPU has AVX-512F and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn planes_to_pixels<T: super::activation::avx512::Io>(x: &[T], hw: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    assert!(x.len() >= 16 * hw && dst.len() >= 16 * hw.next_multiple_of(16), "planes past their buffers");
    for p0 in (0..hw).step_by(16) {
        let k = super::activation::avx512::lanes(p0, hw);
        // SAFETY: plane `i`'s lanes `j` with `p0 + j < hw` (the mask) read `x[i·hw + p0 + j]`,
        // and the 16 pixels written are `dst[16·p0..16·(p0 + 16)]`: inside the asserted lengths.
        unsafe {
            let mut rows = [_mm512_setzero_ps(); 16];
            for (i, r) in rows.iter_mut().enumerate() {
                *r = T::load(x.as_ptr().add(i * hw + p0), k);
            }
            for (j, v) in transpose16(rows).into_iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add(16 * (p0 + j)), v);
            }
        }
    }
}

/// The reverse of [`planes_to_pixels`]: `ohw` pixels of 16 lanes (`src`, rounded up to 16
/// pixels) into 16 planes of `ohw` elements of `E` from `dst` (rounded to f16 or bf16 as
/// `convert.rs` rounds, by `activation::avx512::Io`).
///
/// # Safety
/// The CPU has AVX-512F and F16C; `dst` covers `16·ohw` elements that nothing else accesses
/// meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn pixels_to_planes<E: Elem>(src: &[f32], ohw: usize, dst: *mut E) {
    use half::{bf16, f16};
    use std::any::TypeId;
    // SAFETY: the caller's promises; `E` is the type each pointer is cast to.
    unsafe {
        if TypeId::of::<E>() == TypeId::of::<f16>() {
            pixels_to_planes_as::<f16>(src, ohw, dst.cast());
        } else if TypeId::of::<E>() == TypeId::of::<bf16>() {
            pixels_to_planes_as::<bf16>(src, ohw, dst.cast());
        } else {
            // The third storage type (`Elem` has no other).
            assert!(is_f32::<E>(), "an output element the depthwise kernels do not store");
            pixels_to_planes_as::<f32>(src, ohw, dst.cast());
        }
    }
}

/// [`pixels_to_planes`] for one storage type.
///
/// # Safety
/// As [`pixels_to_planes`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn pixels_to_planes_as<T: super::activation::avx512::Io>(src: &[f32], ohw: usize, dst: *mut T) {
    use std::arch::x86_64::*;
    assert!(src.len() >= 16 * ohw.next_multiple_of(16), "pixels past their buffer");
    for q0 in (0..ohw).step_by(16) {
        let k = super::activation::avx512::lanes(q0, ohw);
        // SAFETY: the 16 pixels read are `src[16·q0..16·(q0 + 16)]` (asserted); plane `i`'s
        // lanes `j` with `q0 + j < ohw` (the mask) write `dst[i·ohw + q0 + j]`, inside the
        // caller's range.
        unsafe {
            let mut rows = [_mm512_setzero_ps(); 16];
            for (j, r) in rows.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(src.as_ptr().add(16 * (q0 + j)));
            }
            for (i, v) in transpose16(rows).into_iter().enumerate() {
                T::store(dst.add(i * ohw + q0), k, v);
            }
        }
    }
}

/// The 16 × 16 transposition of `r` (`out[j]` lane `i` = `r[i]` lane `j`): unpacks of pairs of
/// floats and of doubles (4 × 4 blocks within each 128-bit lane), then two rounds of 128-bit
/// lane shuffles. (`gemv`'s `N × K` panels use it too.)
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn transpose16(r: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // SAFETY: register operations only; the caller promises AVX-512F. (Plain loops, not
    // closures: a closure does not inherit its caller's target features, so its intrinsics
    // would be calls.)
    unsafe {
        // t[2i] per 128-bit lane L: rows 2i, 2i + 1 at columns 4L, 4L + 1; t[2i + 1] at 4L + 2, 4L + 3.
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4i + k] per 128-bit lane L: rows 4i..4i + 4 at column 4L + k.
        let mut u = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            for h in 0..2 {
                let (a, b) = (_mm512_castps_pd(t[4 * i + h]), _mm512_castps_pd(t[4 * i + 2 + h]));
                u[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
                u[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
            }
        }
        // Column 4L + k: lane L of u[k], u[4 + k], u[8 + k], u[12 + k].
        let mut out = [_mm512_setzero_ps(); 16];
        for k in 0..4 {
            let v01 = _mm512_shuffle_f32x4::<0x44>(u[k], u[4 + k]);
            let w01 = _mm512_shuffle_f32x4::<0x44>(u[8 + k], u[12 + k]);
            let v23 = _mm512_shuffle_f32x4::<0xEE>(u[k], u[4 + k]);
            let w23 = _mm512_shuffle_f32x4::<0xEE>(u[8 + k], u[12 + k]);
            out[k] = _mm512_shuffle_f32x4::<0x88>(v01, w01);
            out[4 + k] = _mm512_shuffle_f32x4::<0xDD>(v01, w01);
            out[8 + k] = _mm512_shuffle_f32x4::<0x88>(v23, w23);
            out[12 + k] = _mm512_shuffle_f32x4::<0xDD>(v23, w23);
        }
        out
    }
}

/// A raw pointer to a layer's output, for tasks that write interleaved but disjoint elements
/// (see the SAFETY note at its use).
#[cfg(target_arch = "x86_64")]
struct Out<E>(*mut E);
// SAFETY: each task writes only its own channel blocks' elements, and the caller waits for
// every task (`for_each_index`).
#[cfg(target_arch = "x86_64")]
unsafe impl<E: Send> Sync for Out<E> {}

/// The work of [`Conv::nhwc_blocks`] or [`Conv::nchw_blocks`] ([`Conv::block_plan`]).
#[cfg(target_arch = "x86_64")]
struct BlockPlan {
    /// Channel blocks per image, and in the layer.
    nblocks: usize,
    units: usize,
    /// Blocks per task.
    per: usize,
    /// The bands of output rows an NHWC layer's tasks take instead, where more than one
    /// ([`row_bands`]; [`Conv::nchw_blocks`] runs whole planes).
    bands: usize,
    g: nhwc3::avx::PlaneGeometry,
    /// The activation as `nhwc3::avx`'s constant.
    act: u8,
    /// Tap `t`, channel `o` at `w[t·wl.0 + o·wl.1]`.
    wl: (usize, usize),
}

/// Whether `E` is f32 (then an output is written in place).
fn is_f32<E: Elem>() -> bool {
    E::as_f32(&[]).is_some()
}

/// Widens `dst.len() / 16` runs of 16 elements of `x`, `ld` apart from `start`, into `dst`
/// (pixels of 16 lanes), by `activation::avx512::Io`: an f16 by `vcvtph2ps`, a bf16's bits
/// shifted up (a signalling NaN is made quiet by the multiply-adds it meets, as `convert.rs`
/// would make it before them: the same bits).
///
/// # Safety
/// The CPU has AVX-512F and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn widen_pixels(x: Halves, start: usize, ld: usize, dst: &mut [f32]) {
    use super::activation::avx512::Io;
    use std::arch::x86_64::_mm512_storeu_ps;
    /// # Safety
    /// As `widen_pixels`'s.
    #[inline(always)]
    unsafe fn each<T: Io>(x: &[T], ld: usize, dst: &mut [f32]) {
        let n = dst.len() / 16;
        assert!(n == 0 || (n - 1) * ld + 16 <= x.len(), "pixels past the input");
        for (p, d) in dst.chunks_exact_mut(16).enumerate() {
            // SAFETY: the caller's promises; 16 elements at `p · ld` (asserted), 16 floats at `d`.
            unsafe { _mm512_storeu_ps(d.as_mut_ptr(), T::load(x.as_ptr().add(p * ld), !0)) };
        }
    }
    // SAFETY: the caller's promises.
    unsafe {
        match x {
            Halves::F16(v) => each(&v[start..], ld, dst),
            Halves::Bf16(v) => each(&v[start..], ld, dst),
        }
    }
}

/// Rounds `src`'s pixels of 16 f32 lanes into 16-element runs `ld` apart from `dst`: f16 or
/// bf16 (by `activation::avx512::Io`, the bits of `convert.rs`), or f32 copied.
///
/// # Safety
/// The CPU has AVX-512F and F16C; `dst` covers `src.len() / 16` runs of 16 elements `ld`
/// apart, and nothing else accesses them meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn narrow_pixels<E: Elem>(src: &[f32], dst: *mut E, ld: usize) {
    use super::activation::avx512::Io;
    use half::{bf16, f16};
    use std::any::TypeId;
    use std::arch::x86_64::_mm512_loadu_ps;
    /// # Safety
    /// As `narrow_pixels`'s, for `T`.
    #[inline(always)]
    unsafe fn each<T: Io>(src: &[f32], dst: *mut T, ld: usize) {
        for (p, s) in src.chunks_exact(16).enumerate() {
            // SAFETY: the caller's promises; `s` holds 16 floats.
            unsafe { T::store(dst.add(p * ld), !0, _mm512_loadu_ps(s.as_ptr())) };
        }
    }
    // SAFETY: the caller's promises; `E` is the type each pointer is cast to.
    unsafe {
        if TypeId::of::<E>() == TypeId::of::<f16>() {
            each::<f16>(src, dst.cast(), ld);
        } else if TypeId::of::<E>() == TypeId::of::<bf16>() {
            each::<bf16>(src, dst.cast(), ld);
        } else {
            // The third storage type (`Elem` has no other).
            assert!(is_f32::<E>(), "an output element the depthwise kernels do not store");
            each::<f32>(src, dst.cast(), ld);
        }
    }
}

/// f32 elements of the band buffers (32 KiB), and the most of an NHWC half-precision row
/// buffer.
const BUF: usize = 8192;
const _: () = assert!(BUF.is_power_of_two(), "the band kernel masks offsets with BUF − 1");

thread_local! {
    /// The NCHW band buffer and the half-precision row buffer of this thread's tasks, on the
    /// heap, made on the thread's first NCHW convolution (64 KiB on the stack of every task
    /// was a 64 KiB `memset` per task).
    static BAND_BUFS: std::cell::RefCell<LayerBufs> = const { std::cell::RefCell::new(LayerBufs::new()) };
}

thread_local! {
    /// The weights moved to the layout the kernels read (NHWC `[tap][out channel]` from
    /// `[C·m, 1, kh, kw]`, NCHW the reverse from packed weights; made per call on the calling
    /// thread), and a thread's half-precision row buffer: each taken out of its slot while in
    /// use.
    static W_BUF: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static NHWC_ROW: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A thread's widened input of a half-precision layer: NHWC rows ([`Conv::nhwc_rows`]), an
    /// NCHW plane ([`PlaneIn`]) or the NCHW tile's group of planes ([`tile::planes`]).
    pub(super) static HALF_IN: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The input planes one NCHW task of the band and row kernels reads: `Conv::x`'s, or for a
/// half-precision input each one widened into this thread's buffer when the task reaches it
/// (kept while the next output plane reads the same one, as with a channel multiplier above
/// 1). Widened whole before the call instead, in a parallel pass, the input came from the
/// other core's cache, after one more hand-off.
struct PlaneIn {
    buf: Vec<f32>,
    /// The input plane (image · channels + channel) `buf` holds.
    held: Option<usize>,
}

/// What one NCHW task of the band and row kernels works in: the band buffers and the input
/// planes.
struct PlaneScratch<'b> {
    bufs: &'b mut [[f32; BUF + V]; 2],
    xin: PlaneIn,
}

impl PlaneIn {
    fn new(conv: &Conv) -> PlaneIn {
        PlaneIn { buf: if conv.xh.is_some() { HALF_IN.take() } else { Vec::new() }, held: None }
    }

    /// Input plane `index` of `hw` elements. A widened plane starts on a 64-byte boundary of
    /// the buffer, as the planes of an f32 tensor do where its plane size is a multiple of 16
    /// elements. From the allocator's 16-byte one, more of the rows' loads crossed cache lines
    /// and the time swung between runs: f16 MobileNetV2 NCHW 144 × 56² stride 2 took 33–41 µs
    /// from run to run, 30–32 aligned; the eight layers aligned 0.87–0.94 of the time, 960 × 7²
    /// level (2 threads, separate processes alternated twice).
    fn plane<'a>(&'a mut self, conv: &'a Conv, index: usize, hw: usize) -> &'a [f32] {
        let Some(xh) = conv.xh else { return &conv.x[index * hw..][..hw] };
        const SLACK: usize = super::aligned::ALIGN / size_of::<f32>();
        if self.buf.len() < hw + SLACK {
            self.buf.resize(hw + SLACK, 0.0);
            self.held = None;
        }
        let first = self.buf.as_ptr().align_offset(super::aligned::ALIGN).min(SLACK);
        let plane = &mut self.buf[first..][..hw];
        if self.held != Some(index) {
            xh.widen_range(index * hw, plane);
            self.held = Some(index);
        }
        plane
    }
}

impl Drop for PlaneIn {
    fn drop(&mut self) {
        if self.buf.capacity() > 0 {
            HALF_IN.set(std::mem::take(&mut self.buf));
        }
    }
}

/// A thread's buffers for one NCHW kernel (the band or the tile), and the layer whose padding
/// the first was last zeroed for. A kernel writes only its layer's data into that buffer, so
/// the padding stays zero from one call of the layer to the next: it is zeroed again only
/// for another layer (or after a path used the buffer as scratch). The buffers start on a
/// 64-byte boundary, so the tile's pixels (8 lanes, 32 bytes) do not straddle cache lines.
struct LayerBufs {
    data: AlignedBuf<f32>,
    zeroed_for: Option<Conv2dDesc>,
}

impl LayerBufs {
    const fn new() -> LayerBufs {
        LayerBufs { data: AlignedBuf::empty(), zeroed_for: None }
    }

    /// `C` buffers of `N` elements, made on the thread's first call. With `zero = Some((layer,
    /// len))` the first buffer's first `len` elements are zero for `layer` (zeroed here unless
    /// they already were); with `None` the caller uses it as scratch.
    fn get<const N: usize, const C: usize>(&mut self, zero: Option<(&Conv2dDesc, usize)>) -> &mut [[f32; N]; C] {
        if self.data.len() < C * N {
            self.data = AlignedBuf::zeroed(C * N);
            self.zeroed_for = None;
        }
        let (bufs, _) = self.data.as_chunks_mut::<N>();
        let bufs: &mut [[f32; N]; C] = (&mut bufs[..C]).try_into().expect("C buffers were made above");
        match zero {
            Some((d, len)) if self.zeroed_for != Some(*d) => {
                bufs[0][..len].fill(0.0);
                self.zeroed_for = Some(*d);
            }
            Some(_) => {}
            None => self.zeroed_for = None,
        }
        bufs
    }
}

/// Runs `run(first unit, units)` over `out`, cut into whole units of `unit` elements that
/// cost `unit_work` multiply-adds each: on the calling thread below [`PARALLEL_MIN`] in all,
/// else in one run of units per thread, a multiple of `align` units each.
///
/// One run per thread keeps a layer's planes (NCHW) or rows (NHWC) on the same thread from one
/// call to the next, so a layer that fits the two cores' L2 caches finds its half there. Cut
/// in tasks of about 2¹⁶ multiply-adds, taken in turn, MobileNetV2's NCHW 32 × 112² took
/// 1.3× the time, 144 × 56² 1.3×, 192 × 28² 1.1×; its NHWC 32 × 112² 1.6×, 96 × 112²
/// stride 2 1.2× (2 threads, 2-core AVX-512 Xeon, separate processes alternated, the same
/// bits). A thread that has not woken when the caller is done with its run leaves it to the
/// caller ([`for_each_chunk_mut`]).
fn in_tasks<E: Send>(out: &mut [E], unit: usize, unit_work: usize, align: usize, run: impl Fn(usize, &mut [E]) + Sync) {
    let units = out.len() / unit.max(1);
    if units * unit_work < PARALLEL_MIN {
        run(0, out);
    } else {
        let per = units.div_ceil(rayon::current_num_threads().max(1)).next_multiple_of(align);
        for_each_chunk_mut(out, per * unit, |i, dst| run(i * per, dst));
    }
}

/// The bands of output rows [`Conv::nhwc_blocks`] splits a layer into, one per task: `threads`
/// (at most `oh`) where the busiest task then has fewer block rows than with `per` of the
/// `units` blocks each (every row), else 1 (the tasks are runs of blocks).
fn row_bands(units: usize, per: usize, oh: usize, threads: usize) -> usize {
    let bands = threads.min(oh);
    if bands > 1 && per < units && units * oh.div_ceil(bands) < per * oh { bands } else { 1 }
}

/// A depthwise convolution over f32 inputs (widened if stored in half precision).
pub(super) struct Conv<'d> {
    pub(super) d: Conv2dDesc,
    /// The input, or nothing where `xh` holds it.
    pub(super) x: &'d [f32],
    /// A half-precision input left as it is stored: the NHWC 3 × 3 rows widen the input rows
    /// each output row reads on the thread that reads them ([`Conv::nhwc_rows`]), the NCHW
    /// tile each group's planes ([`tile::planes`]), the NCHW bands and rows each input plane
    /// ([`PlaneIn`]); for the other NHWC kernels [`Conv::run_kernel`] widens it whole first.
    pub(super) xh: Option<Halves<'d>>,
    /// `[C·m, 1, kh, kw]`, or `[kh, kw, C·m]` where `packed` (a `PackedDepthwise`'s layout).
    pub(super) w: &'d [f32],
    pub(super) packed: bool,
    pub(super) bias: Option<&'d [f32]>,
}

/// The output positions `o < out_len` whose tap at offset `off` (`k·dilation`) lands inside an
/// input of `len`: `0 ≤ o·stride + off − pad < len`. Returns `lo..hi` (empty if none).
fn tap_range(out_len: usize, len: usize, stride: usize, pad: usize, off: usize) -> (usize, usize) {
    let lo = pad.saturating_sub(off).div_ceil(stride);
    let hi = len.saturating_add(pad).saturating_sub(off).div_ceil(stride);
    let hi = hi.min(out_len);
    (lo.min(hi), hi)
}

impl Conv<'_> {
    pub(super) fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        self.run_isa(Isa::detect(), out)
    }

    /// [`Conv::run`] in the instruction-set copy `isa` (tests run each one this CPU has).
    pub(super) fn run_isa<E: Elem>(&self, isa: Isa, out: &mut [E]) -> Result<()> {
        self.run_kernel(isa, true, out)
    }

    /// [`Conv::run_isa`] with the small-plane kernels allowed (where the layer suits them) or
    /// not: the NCHW channel-vector tile and the NHWC channel blocks ([`Conv::nhwc_blocks`]).
    /// Tests run the band, row and NHWC row paths on the layers these would take.
    pub(super) fn run_kernel<E: Elem>(&self, isa: Isa, allow_tile: bool, out: &mut [E]) -> Result<()> {
        if let Some(xh) = self.xh
            && !self.reads_half(isa)
        {
            // Widened whole, for the paths that read the input in place.
            let x = super::widen_halves(xh)?;
            return Conv { x: &x, xh: None, ..*self }.kernel(isa, allow_tile, out);
        }
        self.kernel(isa, allow_tile, out)
    }

    /// Whether a small-plane kernel takes the layer in `isa` with an f32, f16 or bf16 output
    /// (NCHW: the channel blocks, the 16-lane rows or the channel-vector tile; NHWC: the channel blocks): the
    /// layers the tests also run with them turned off ([`Conv::run_kernel`]).
    #[cfg(test)]
    pub(super) fn has_small_plane_kernel(&self, isa: Isa) -> bool {
        match self.d.layout {
            Layout::Nchw => {
                #[cfg(target_arch = "x86_64")]
                if isa == Isa::Avx512 && rows512::Rows512::new(&self.d).is_some()
                    || self.nchw_blocks_fit(isa)
                    || self.flat(isa).is_some()
                {
                    return true;
                }
                tile::Tile::new(&self.d, isa).is_some()
            }
            #[cfg(target_arch = "x86_64")]
            _ => self.block_lanes::<f32>(isa).is_some() || self.block_lanes::<half::f16>(isa).is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Whether the layer takes the rolling rows ([`roll512`]) in `isa`.
    #[cfg(test)]
    pub(super) fn takes_rolling_rows(&self, isa: Isa) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(Flat::Roll(_)) = self.flat(isa) {
            return true;
        }
        false
    }

    /// Whether the kernel [`Conv::kernel`] takes reads a half-precision input as stored: every
    /// NCHW one (the tile, the bands, the rows), and the NHWC 3 × 3 rows where every channel
    /// block takes them ([`nhwc3_fits`] with all the channels: the blocks
    /// [`Conv::nhwc_rows`] cuts are multiples of 16, or all of them).
    fn reads_half(&self, isa: Isa) -> bool {
        match self.d.layout {
            Layout::Nchw => true,
            _ => isa != Isa::Portable && nhwc3_fits(&self.d, self.d.out_channels()),
        }
    }

    /// [`Conv::run_kernel`] once a half-precision input is widened or kept.
    fn kernel<E: Elem>(&self, isa: Isa, allow_tile: bool, out: &mut [E]) -> Result<()> {
        let d = &self.d;
        let (oh, ow) = match (d.out_h(), d.out_w()) {
            (Some(h), Some(w)) => (h, w),
            _ => return Err(internal("an empty conv output reached the backend".into())),
        };
        let occ = d.out_channels();
        let (h, w, c) = (d.height, d.width, d.channels);
        let total = d.batch * occ * oh * ow;
        if self.xh.map_or(self.x.len(), |xh| xh.len()) < d.batch * c * h * w
            || self.w.len() < occ * d.kernel_h * d.kernel_w
            || self.bias.is_some_and(|b| b.len() < occ)
            || out.len() < total
            || d.multiplier == 0
        {
            return Err(internal("conv buffers are shorter than the descriptor".into()));
        }
        if total == 0 {
            return Ok(());
        }
        let out = &mut out[..total];
        let taps = d.kernel_h * d.kernel_w;
        // Small NHWC planes go one channel block at a time.
        #[cfg(target_arch = "x86_64")]
        if allow_tile && let Some(lanes) = self.block_lanes::<E>(isa) {
            self.nhwc_blocks(lanes, oh, ow, out);
            return Ok(());
        }
        // Small NCHW "same" planes go through the flat planes on AVX-512.
        #[cfg(target_arch = "x86_64")]
        if allow_tile && let Some(f) = self.flat(isa) {
            self.nchw_flat(&f, out);
            return Ok(());
        }
        // NCHW 3 × 3 layers at stride 1 or 2 go through 16-lane rows on AVX-512 (half-precision
        // outputs through the band buffer, in bands of rows).
        #[cfg(target_arch = "x86_64")]
        let rows16 =
            if d.layout == Layout::Nchw && allow_tile && isa == Isa::Avx512 { rows512::Rows512::new(d) } else { None };
        // Small NCHW planes go 16 planes at a time through the channel blocks; at stride 2
        // only those the rows do not take (rows of fewer than 8 outputs, vertical dilation).
        #[cfg(target_arch = "x86_64")]
        if allow_tile && self.nchw_blocks_fit(isa) && (d.stride_w == 1 || rows16.is_none()) {
            self.nchw_blocks(oh, ow, out);
            return Ok(());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let rows16: Option<()> = None;
        // Small NCHW planes, and strided ones, go through the channel-vector tile.
        let tile =
            if d.layout == Layout::Nchw && allow_tile && rows16.is_none() { tile::Tile::new(d, isa) } else { None };
        // Half-precision outputs go through a narrowing buffer of one group's whole output.
        let tile = tile.filter(|t| is_f32::<E>() || t.whole_output());
        match (d.layout, tile) {
            (Layout::Nchw, Some(t)) => {
                let plane = oh * ow;
                let run = |first: usize, dst: &mut [E]| tile::planes(isa, &t, self, first, dst);
                in_tasks(out, plane, plane * taps.max(1), tile::G, run);
            }
            (Layout::Nchw, None) if self.packed && rows16.is_none() => {
                // The band and row kernels read each plane's taps together: packed weights are
                // moved back to `[out channel][tap]` once per call, in the calling thread's
                // weights buffer (as NHWC's transposition below), and the layer runs on that.
                let mut wc = W_BUF.take();
                wc.resize(taps * occ, 0.0);
                for (oc, ws) in wc.chunks_exact_mut(taps).enumerate() {
                    for (t, v) in ws.iter_mut().enumerate() {
                        *v = self.w[t * occ + oc];
                    }
                }
                let conv = Conv { w: &wc, packed: false, ..*self };
                let done = conv.kernel(isa, allow_tile, out);
                W_BUF.set(wc);
                return done;
            }
            (Layout::Nchw, None) => {
                let plane = oh * ow;
                let band = if rows16.is_some() { None } else { Band::new(d) };
                #[cfg(target_arch = "x86_64")]
                let kernel = match (&rows16, &band) {
                    (Some(f), _) => PlaneKernel::Rows512(f),
                    (None, Some(g)) => PlaneKernel::Band(g),
                    (None, None) => PlaneKernel::Rows,
                };
                #[cfg(not(target_arch = "x86_64"))]
                let kernel = band.as_ref().map_or(PlaneKernel::Rows, PlaneKernel::Band);
                // f32 planes of multiplier 1 through the 16-lane rows: straight from the input
                // to the output, the channel counted along the run, without the per-plane
                // scratch and divisions of `nchw_plane` (MobileNetV2's 144 × 56² stride 2,
                // 32 × 112² and 144 × 56² in 0.93–0.98 of the time, 96 × 112² stride 2 level;
                // 2 threads, separate processes alternated three times, the same sums).
                #[cfg(target_arch = "x86_64")]
                if let Some(f) = rows16.as_ref().filter(|_| is_f32::<E>() && self.xh.is_none() && d.multiplier == 1) {
                    let hw = d.height * d.width;
                    let run = |first: usize, dst: &mut [E]| {
                        let dst = E::as_f32_mut(dst).expect("f32 output");
                        let mut oc = first % occ;
                        for (i, o) in dst.chunks_mut(plane).enumerate() {
                            let bias = self.bias.map_or(0.0, |b| b[oc]);
                            plane512(f, d.activation, &self.x[(first + i) * hw..][..hw], &self.taps9(oc), bias, o);
                            oc = if oc + 1 == occ { 0 } else { oc + 1 };
                        }
                    };
                    in_tasks(out, plane, plane * taps.max(1), 1, run);
                    return Ok(());
                }
                let run = |first: usize, dst: &mut [E]| {
                    BAND_BUFS.with_borrow_mut(|bb| {
                        // The band buffer's rows, zeroed for the layer (not per plane, not per
                        // call: see `LayerBufs`), which is what keeps the band's padding
                        // columns zero for every plane (`Band::phase`). Only the rows the band
                        // uses: zeroing the whole 32 KiB per task cost as much as a small
                        // layer's copies. The row path uses the buffer as scratch.
                        let bufs = bb.get::<{ BUF + V }, 2>(band.as_ref().map(|g| (d, g.in_rows * g.rs)));
                        let mut scratch = PlaneScratch { bufs, xin: PlaneIn::new(self) };
                        for (i, p) in dst.chunks_mut(plane).enumerate() {
                            self.nchw_plane(isa, kernel, first + i, ow, p, &mut scratch);
                        }
                    })
                };
                in_tasks(out, plane, plane * taps.max(1), 1, run);
            }
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            (_, _) => {
                let row = ow * occ;
                // The weights as `[tap][out channel]`: packed weights are that already; others
                // are transposed once per call, into a buffer taken out of the calling
                // thread's slot (a nested call finds it empty and makes its own).
                let mut wt_buf = Vec::new();
                let wt = if self.packed {
                    &self.w[..taps * occ]
                } else {
                    wt_buf = W_BUF.take();
                    wt_buf.resize(taps * occ, 0.0);
                    for t in 0..taps {
                        for (oc, v) in wt_buf[t * occ..][..occ].iter_mut().enumerate() {
                            *v = self.w[oc * taps + t];
                        }
                    }
                    &wt_buf[..]
                };
                let run = |first: usize, dst: &mut [E]| self.nhwc_rows(isa, wt, first, oh, ow, dst);
                in_tasks(out, row, row * taps.max(1), 1, run);
                if !self.packed {
                    W_BUF.set(wt_buf);
                }
            }
        }
        Ok(())
    }

    /// Output channel `oc`'s nine weights of a 3 × 3 layer, in tap order: packed weights
    /// (`[tap][out channel]`) read as they are.
    #[cfg(target_arch = "x86_64")]
    fn taps9(&self, oc: usize) -> [f32; 9] {
        let occ = self.d.out_channels();
        std::array::from_fn(|t| if self.packed { self.w[t * occ + oc] } else { self.w[oc * 9 + t] })
    }

    /// The rolling rows' geometry ([`roll512`]), the flat planes' ([`flat512`]) or the
    /// stride-2 column sums' ([`stride2`]), the first that takes the layer in `isa`: AVX-512
    /// and the kernel's geometry (NCHW 3 × 3 "same", multiplier 1, rows of 9 to 16 or 24 to
    /// 32 pixels; the same with rows of at most 15 pixels or of 17 to 256, planes of at most
    /// 256 or 1024 pixels below 32 a row; or NCHW 3 × 3 at stride 2, padding 1 at the top and
    /// left, at least 8 outputs a row).
    #[cfg(target_arch = "x86_64")]
    fn flat(&self, isa: Isa) -> Option<Flat> {
        if isa != Isa::Avx512 {
            return None;
        }
        let d = &self.d;
        if let Some(g) = roll512::Roll512::new(d) {
            return Some(Flat::Roll(g));
        }
        flat512::Flat512::new(d).map(Flat::Same).or_else(|| stride2::Stride2::new(d).map(Flat::Stride2))
    }

    /// An NCHW layer through the rolling rows ([`roll512::planes`]), the flat planes
    /// ([`flat512::planes`]) or the stride-2 column sums ([`stride2::planes`]), one run of
    /// planes per thread ([`in_tasks`]). ReLU and ReLU6 are applied in registers, other
    /// activations over each plane after it (in L1). An f32 layer runs straight from the
    /// input to the output; a half-precision input is widened, and a half-precision output
    /// rounded, [`FLAT_CHUNK`] elements of whole output planes (and their input planes) at a
    /// time through the thread's buffers.
    #[cfg(target_arch = "x86_64")]
    fn nchw_flat<E: Elem>(&self, f: &Flat, out: &mut [E]) {
        use nhwc3::avx::{NONE, RELU, RELU6};
        use tilekit_kernels::Activation;
        let d = &self.d;
        let (ipl, opl) = f.pixels();
        let act = d.activation;
        // Planes `first ..` from the f32 input planes `x` into the f32 outputs `o`.
        let go = |first: usize, x: &[f32], o: &mut [f32]| {
            let r =
                flat512::Run { x, first, channels: d.out_channels(), w: self.w, packed: self.packed, bias: self.bias };
            let each = |o: &mut [f32]| act_after_registers(act, o);
            // SAFETY: both kernels are chosen only where `isa` is `Isa::Avx512`
            // (`Conv::flat`), which `Isa::detect` reports only where the CPU has AVX-512F,
            // AVX2 and FMA.
            unsafe {
                match (f, act) {
                    (Flat::Same(g), Activation::Relu) => flat512::planes::<RELU>(g, &r, o, each),
                    (Flat::Same(g), Activation::Relu6) => flat512::planes::<RELU6>(g, &r, o, each),
                    (Flat::Same(g), _) => flat512::planes::<NONE>(g, &r, o, each),
                    (Flat::Roll(g), Activation::Relu) => roll512::planes::<RELU>(g, &r, o, each),
                    (Flat::Roll(g), Activation::Relu6) => roll512::planes::<RELU6>(g, &r, o, each),
                    (Flat::Roll(g), _) => roll512::planes::<NONE>(g, &r, o, each),
                    (Flat::Stride2(g), Activation::Relu) => stride2::planes::<RELU>(g, &r, o, each),
                    (Flat::Stride2(g), Activation::Relu6) => stride2::planes::<RELU6>(g, &r, o, each),
                    (Flat::Stride2(g), _) => stride2::planes::<NONE>(g, &r, o, each),
                }
            }
        };
        let run = |first: usize, dst: &mut [E]| {
            if self.xh.is_none()
                && let Some(o) = E::as_f32_mut(dst)
            {
                return go(first, &self.x[first * ipl..], o);
            }
            let mut xbuf = HALF_IN.take();
            let mut obuf = NHWC_ROW.take();
            let planes = (FLAT_CHUNK / opl).max(1);
            xbuf.resize(xbuf.len().max(planes * ipl), 0.0);
            obuf.resize(obuf.len().max(planes * opl), 0.0);
            for (i, dst) in dst.chunks_mut(planes * opl).enumerate() {
                let p0 = first + i * planes;
                let (n, xn) = (dst.len(), dst.len() / opl * ipl);
                let x = match self.xh {
                    Some(xh) => {
                        xh.widen_range(p0 * ipl, &mut xbuf[..xn]);
                        &xbuf[..xn]
                    }
                    None => &self.x[p0 * ipl..][..xn],
                };
                match E::as_f32_mut(dst) {
                    Some(o) => go(p0, x, o),
                    None => {
                        go(p0, x, &mut obuf[..n]);
                        E::narrow_into(&obuf[..n], dst);
                    }
                }
            }
            HALF_IN.set(xbuf);
            NHWC_ROW.set(obuf);
        };
        in_tasks(out, opl, opl * 9, 1, run);
    }

    /// The lanes of [`Conv::nhwc_blocks`]'s channel blocks where it takes the layer: NHWC 3 × 3
    /// rows ([`nhwc3_fits`]) with no activation, ReLU or ReLU6, input planes of at most
    /// [`BLOCK_PLANE`] pixels ([`BLOCK_PLANE_HALF`] in half precision, [`BLOCK_PLANE_S2_AMD`]
    /// for f32 16-channel blocks at stride 2 on AMD), and whole 16-channel blocks (on AVX-512)
    /// or 8-channel ones (f32 only: a half-precision input or output `E` takes 16-lane blocks
    /// only).
    #[cfg(target_arch = "x86_64")]
    fn block_lanes<E: Elem>(&self, isa: Isa) -> Option<usize> {
        use tilekit_kernels::Activation;
        let d = &self.d;
        let c = d.out_channels();
        let act = matches!(d.activation, Activation::None | Activation::Relu | Activation::Relu6);
        let fits = d.layout == Layout::Nhwc && act && isa != Isa::Portable && nhwc3_fits(d, c);
        let lanes = if isa == Isa::Avx512 && c.is_multiple_of(16) { 16 } else { 8 };
        // Half-precision inputs and outputs: 16-lane blocks (AVX-512 with F16C) only.
        let half = self.xh.is_some() || !is_f32::<E>();
        let most = match (half, lanes, d.stride_h, d.stride_w) {
            (true, ..) => BLOCK_PLANE_HALF,
            (false, 16, 2, 2) if simd::amd() => BLOCK_PLANE_S2_AMD,
            _ => BLOCK_PLANE,
        };
        (fits && (1..=most).contains(&(d.height * d.width)) && (lanes == 16 || !half)).then_some(lanes)
    }

    /// What [`Conv::nhwc_blocks`] and [`Conv::nchw_blocks`] share: the layer's blocks of
    /// `lanes` channels, as many per task as give one run per thread (all on the calling thread
    /// below [`PARALLEL_MIN`] multiply-adds), the plane's geometry with input pixels
    /// `pixel_stride` elements apart, the activation and the weights' layout.
    #[cfg(target_arch = "x86_64")]
    fn block_plan(&self, lanes: usize, pixel_stride: usize, oh: usize, ow: usize) -> BlockPlan {
        use nhwc3::avx::{NONE, PlaneGeometry, RELU, RELU6};
        use tilekit_kernels::Activation;
        let d = &self.d;
        let c = d.channels;
        let nblocks = c / lanes;
        let units = d.batch * nblocks;
        let per = if units * oh * ow * 9 * lanes < PARALLEL_MIN {
            units
        } else {
            units.div_ceil(rayon::current_num_threads().max(1))
        };
        let (lo, hi) = interior(d, ow);
        let row = nhwc3::RowGeometry { c: pixel_stride, width: d.width, pad_left: d.pad_left, lo, hi: hi.max(lo), ow };
        let g = PlaneGeometry {
            row,
            stride_w: d.stride_w,
            height: d.height,
            oh,
            stride_h: d.stride_h,
            dilation_h: d.dilation_h,
            pad_top: d.pad_top,
            rows: 0..oh,
        };
        let act = match d.activation {
            Activation::Relu => RELU,
            Activation::Relu6 => RELU6,
            _ => NONE,
        };
        // Tap `t` of channel `o`: `[t][o]` packed, `[o][t]` as stored.
        let wl = if self.packed { (c, 1) } else { (1, 9) };
        let bands = row_bands(units, per, oh, rayon::current_num_threads());
        BlockPlan { nblocks, units, per, bands, g, act, wl }
    }

    /// The lanes of the channel blocks [`Conv::nhwc_blocks`] runs the layer in with `isa` (f32
    /// output), and the bands of output rows it splits the layer into in this thread pool (1:
    /// runs of blocks); `None` where the blocks do not take the layer.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn nhwc_bands(&self, isa: Isa) -> Option<(usize, usize)> {
        let lanes = self.block_lanes::<f32>(isa)?;
        let [_, oh, ow, _] = self.d.output_shape();
        Some((lanes, self.block_plan(lanes, self.d.channels, oh, ow).bands))
    }

    /// An NHWC 3 × 3 layer one channel block (`lanes` channels of one image) at a time: the
    /// block's nine weight vectors and bias are loaded once for the whole plane (packed
    /// weights one vector a tap, stored `[channel][tap]` ones taken apart in the task by
    /// `Vector::stored_taps`: no transposition on the calling thread), and its input, three rows at a time, stays in L1 from one output
    /// row to the next ([`nhwc3::avx::plane_for`]). Where each output row ran every channel,
    /// its input rows came from L2 once per output row that reads them. A half-precision
    /// block is widened into the thread's buffer first ([`widen_pixels`]) and its sums rounded
    /// into the output after ([`narrow_pixels`]), one vector a pixel; through `convert.rs`'s
    /// slice functions, a call per pixel, f16 took 0.97–1.74× the row kernel's time.
    ///
    /// The tasks are one run of blocks per thread: the tasks' outputs interleave (each pixel's
    /// channels are split between them), and every boundary inside a pixel is a cache line both
    /// cores write near. Cut in runs of about 2¹⁶ multiply-adds (4–10 per thread, taken in
    /// turn), MobileNetV2's 14² layer took 1.4–1.6× the time of the row kernel; in one run per
    /// thread, 0.5–0.6× (2-core AVX-512 Xeon, in-process A/B, the same bits).
    ///
    /// Where the blocks do not split evenly between the threads and the rows split better
    /// ([`row_bands`]), each task takes a band of output rows of every block instead: one
    /// thread's output is then one run of pixels. MobileNetV2's 144-channel layers (nine
    /// blocks, five and four on two threads) took 0.79 of the time at 56² and 0.81 at 56²
    /// stride 2, bias + ReLU6, where the blocks' share alone would give 0.9 (2-core Intel Xeon
    /// with AVX-512, 2 threads, separate processes alternated three times, the same bits).
    /// Layers whose blocks split evenly keep them: in bands, 192 × 28² took 1.01× the time,
    /// 576 × 14² 0.98 and 960 × 7² 1.21 (seven rows, four and three). A half-precision input is
    /// widened for the input rows the task's band reads.
    #[cfg(target_arch = "x86_64")]
    fn nhwc_blocks<E: Elem>(&self, lanes: usize, oh: usize, ow: usize, out: &mut [E]) {
        use nhwc3::avx::plane_for;
        let d = &self.d;
        let (h, w, c) = (d.height, d.width, d.channels);
        let BlockPlan { nblocks, units, per, bands, g, act, wl } = self.block_plan(lanes, c, oh, ow);
        let plane_out = oh * ow * c;
        assert!(out.len() >= d.batch * plane_out, "NHWC output shorter than the layer");
        let f32_out = is_f32::<E>();
        let base = Out(out.as_mut_ptr());
        let run = |t: usize| {
            let base = &base;
            // Task t's blocks and output rows: a run of blocks, every row; or a band of rows of
            // every block.
            let (blocks, rows) = match bands {
                1 => (t * per..((t + 1) * per).min(units), 0..oh),
                _ => (0..units, t * oh / bands..(t + 1) * oh / bands),
            };
            // The input rows those output rows read.
            let (sh, reach) = (d.stride_h, 2 * d.dilation_h + 1);
            let input = (rows.start * sh).saturating_sub(d.pad_top).min(h)
                ..((rows.end.max(1) - 1) * sh + reach).saturating_sub(d.pad_top).min(h);
            // A half-precision input block is widened into this thread's buffer (pixels 16
            // lanes apart; the rows the task reads), a half-precision output block computed
            // into its row buffer and rounded into the output after.
            let mut xbuf = if self.xh.is_some() { HALF_IN.take() } else { Vec::new() };
            xbuf.resize(xbuf.len().max(if self.xh.is_some() { h * w * lanes } else { 0 }), 0.0);
            let mut obuf = if f32_out { Vec::new() } else { NHWC_ROW.take() };
            obuf.resize(obuf.len().max(if f32_out { 0 } else { oh * ow * lanes }), 0.0);
            for u in blocks {
                let (n, c0) = (u / nblocks, u % nblocks * lanes);
                let mut g = g.clone();
                g.rows = rows.clone();
                let x = match self.xh {
                    Some(xh) => {
                        g.row.c = lanes;
                        let dst = &mut xbuf[input.start * w * lanes..input.end * w * lanes];
                        // SAFETY: AVX-512F and F16C (every half-precision block is 16 lanes on
                        // `Isa::Avx512`).
                        unsafe { widen_pixels(xh, n * h * w * c + input.start * w * c + c0, c, dst) };
                        &xbuf[..h * w * lanes]
                    }
                    None => &self.x[n * h * w * c + c0..][..(h * w - 1) * c + lanes],
                };
                let wts = if self.packed { &self.w[c0..] } else { &self.w[c0 * 9..] };
                let bias = self.bias.map(|b| &b[c0..c0 + lanes]);
                // SAFETY: `isa` is AVX2 or AVX-512 (`block_lanes`), with FMA, and AVX-512F and
                // F16C where the lanes are 16 (`Isa::Avx512` only), which every half-precision
                // block is; the block's output pixels (`oh·ow` of `lanes` channels, `c` apart,
                // from the image's block start) lie inside `out` (asserted above), and no other
                // task writes the rows `rows` of them; `obuf` holds `oh·ow` pixels of `lanes`.
                unsafe {
                    let o = base.0.add(n * plane_out + c0);
                    if f32_out {
                        plane_for(lanes == 16, act, x, &g, wts, wl, bias, o.cast(), c);
                    } else {
                        plane_for(true, act, x, &g, wts, wl, bias, obuf.as_mut_ptr(), lanes);
                        let done = &obuf[rows.start * ow * lanes..rows.end * ow * lanes];
                        narrow_pixels(done, o.add(rows.start * ow * c), c);
                    }
                }
            }
            if self.xh.is_some() {
                HALF_IN.set(xbuf);
            }
            if !f32_out {
                NHWC_ROW.set(obuf);
            }
        };
        for_each_index(if bands > 1 { bands } else { units.div_ceil(per) }, &run);
    }

    /// Whether [`Conv::nchw_blocks`] takes the layer in `isa`: NCHW on AVX-512 (f32, f16 or
    /// bf16 inputs and outputs), the channel blocks' 3 × 3 geometry ([`nhwc3_fits`]) with whole 16-channel
    /// blocks, no activation, ReLU or ReLU6, and input planes of at most [`NCHW_BLOCK_PLANE`]
    /// pixels ([`NCHW_BLOCK_PLANE_S1`] at stride 1).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn nchw_blocks_fit(&self, isa: Isa) -> bool {
        use tilekit_kernels::Activation;
        let d = &self.d;
        let act = matches!(d.activation, Activation::None | Activation::Relu | Activation::Relu6);
        let most = if d.stride_w == 1 { NCHW_BLOCK_PLANE_S1 } else { NCHW_BLOCK_PLANE };
        d.layout == Layout::Nchw
            && isa == Isa::Avx512
            && act
            && d.channels.is_multiple_of(16)
            && nhwc3_fits(d, d.channels)
            && (1..=most).contains(&(d.height * d.width))
    }

    /// An NCHW 3 × 3 layer 16 planes (one image's 16 channels) at a time, through the NHWC
    /// channel blocks' plane kernel (`nhwc3::avx::plane_for`, the same sums): the 16 input
    /// planes are transposed into the thread's buffer, the planes as the lanes of each pixel
    /// (widened there from f16 or bf16), the block's plane is computed into a second buffer,
    /// bias and activation in registers, and transposed back into the 16 output planes
    /// (rounded there to f16 or bf16): 16 × 16 transposes in registers
    /// ([`planes_to_pixels`], [`pixels_to_planes`]). One run of blocks per thread, as
    /// [`Conv::nhwc_blocks`]. Gathers instead of the transposes (one 16-lane gather a pixel in,
    /// 16 outputs of a plane a gather out) took 0.67 of the tile's time at 960 × 7² against
    /// 0.60, and 1.3–2.6× from 14² up.
    #[cfg(target_arch = "x86_64")]
    fn nchw_blocks<E: Elem>(&self, oh: usize, ow: usize, out: &mut [E]) {
        use nhwc3::avx::plane_for;
        const LANES: usize = 16;
        let d = &self.d;
        let (hw, ohw, c) = (d.height * d.width, oh * ow, d.channels);
        // The block's pixels are its 16 lanes apart in the thread's buffer.
        let BlockPlan { nblocks, units, per, g, act, wl, .. } = self.block_plan(LANES, LANES, oh, ow);
        assert!(
            out.len() >= d.batch * c * ohw && self.xh.map_or(self.x.len(), |x| x.len()) >= d.batch * c * hw,
            "NCHW layer's buffers shorter than the layer"
        );
        let base = Out(out.as_mut_ptr());
        let run = |t: usize| {
            let base = &base;
            let mut xbuf = HALF_IN.take();
            xbuf.resize(xbuf.len().max(hw.next_multiple_of(16) * LANES), 0.0);
            let mut obuf = NHWC_ROW.take();
            obuf.resize(obuf.len().max(ohw.next_multiple_of(16) * LANES), 0.0);
            for u in t * per..((t + 1) * per).min(units) {
                let (n, c0) = (u / nblocks, u % nblocks * LANES);
                let first = (n * c + c0) * hw;
                let planes = first..first + LANES * hw;
                // SAFETY: AVX-512F and F16C (`nchw_blocks_fit`: `Isa::Avx512`); the block's 16
                // input planes lie inside the input (asserted above).
                unsafe {
                    match self.xh {
                        None => planes_to_pixels(&self.x[planes], hw, &mut xbuf),
                        Some(Halves::F16(x)) => planes_to_pixels(&x[planes], hw, &mut xbuf),
                        Some(Halves::Bf16(x)) => planes_to_pixels(&x[planes], hw, &mut xbuf),
                    }
                };
                let wts = if self.packed { &self.w[c0..] } else { &self.w[c0 * 9..] };
                let bias = self.bias.map(|b| &b[c0..c0 + LANES]);
                // SAFETY: AVX-512F, F16C and FMA (`nchw_blocks_fit`: `Isa::Avx512`); `xbuf` holds the
                // block's `h·w` pixels of 16 lanes and `obuf` its `oh·ow`, which nothing else
                // touches; the block's output planes (`16·oh·ow` elements from
                // `(n·c + c0)·oh·ow`) lie inside `out` (asserted above), and no other block
                // writes them.
                unsafe {
                    plane_for(true, act, &xbuf[..hw * LANES], &g, wts, wl, bias, obuf.as_mut_ptr(), LANES);
                    pixels_to_planes(&obuf, ohw, base.0.add((n * c + c0) * ohw));
                }
            }
            HALF_IN.set(xbuf);
            NHWC_ROW.set(obuf);
        };
        for_each_index(units.div_ceil(per), &run);
    }

    /// One NCHW output plane (`plane` = image · out channels + out channel).
    fn nchw_plane<E: Elem>(
        &self,
        isa: Isa,
        kernel: PlaneKernel,
        plane: usize,
        ow: usize,
        dst: &mut [E],
        scratch: &mut PlaneScratch,
    ) {
        let d = &self.d;
        let occ = d.out_channels();
        let (n, oc) = (plane / occ, plane % occ);
        let hw = d.height * d.width;
        let bufs = &mut *scratch.bufs;
        let xp = scratch.xin.plane(self, n * d.channels + oc / d.multiplier, hw);
        let taps = d.kernel_h * d.kernel_w;
        let wk = if self.packed { &[][..] } else { &self.w[oc * taps..][..taps] };
        let bias = self.bias.map_or(0.0, |b| b[oc]);
        #[cfg(target_arch = "x86_64")]
        if let PlaneKernel::Rows512(f) = kernel {
            let wk = self.taps9(oc);
            match E::as_f32_mut(dst) {
                Some(dst) => plane512(f, d.activation, xp, &wk, bias, dst),
                None => {
                    // Half-precision outputs in bands of rows through the thread's buffer.
                    let (oh, ow) = f.shape();
                    let band = (BUF / ow).max(1);
                    for oy in (0..oh).step_by(band) {
                        let rows = band.min(oh - oy);
                        let o = &mut bufs[1][..rows * ow];
                        plane512(&f.band(oy, rows), d.activation, xp, &wk, bias, o);
                        E::narrow_into(o, &mut dst[oy * ow..][..rows * ow]);
                    }
                }
            }
            return;
        }
        if let PlaneKernel::Band(g) = kernel {
            let oh = dst.len() / ow;
            let [buf, obuf] = bufs;
            match E::as_f32_mut(dst) {
                Some(dst) => {
                    for oy0 in (0..oh).step_by(g.rows) {
                        let rows = g.rows.min(oh - oy0);
                        nchw_band(isa, g, xp, wk, bias, oy0, &mut dst[oy0 * ow..][..rows * ow], buf);
                    }
                }
                None => {
                    for oy0 in (0..oh).step_by(g.rows) {
                        let rows = g.rows.min(oh - oy0);
                        let o = &mut obuf[..rows * ow];
                        nchw_band(isa, g, xp, wk, bias, oy0, o, buf);
                        E::narrow_into(o, &mut dst[oy0 * ow..][..rows * ow]);
                    }
                }
            }
            return;
        }
        // Each tap's valid output columns depend only on the layer: computed once per plane
        // here, not per row (the divisions by the stride would dominate narrow rows).
        let mut ranges = [(0usize, 0usize); MAX_KW];
        for (kx, r) in ranges.iter_mut().enumerate().take(d.kernel_w.min(MAX_KW)) {
            *r = tap_range(ow, d.width, d.stride_w, d.pad_left, kx * d.dilation_w);
        }
        let p = RowArgs { d, xp, wk, bias, ow, ranges };
        match E::as_f32_mut(dst) {
            Some(dst) => nchw_plane_f32(isa, &p, dst),
            None => {
                let buf = &mut bufs[0];
                for (oy, row) in dst.chunks_mut(ow).enumerate() {
                    for c0 in (0..ow).step_by(BUF) {
                        let c1 = (c0 + BUF).min(ow);
                        nchw_row(isa, &p, oy, c0, &mut buf[..c1 - c0]);
                        E::narrow_into(&buf[..c1 - c0], &mut row[c0..c1]);
                    }
                }
            }
        }
    }

    /// NHWC output rows `first..` (row = image · out_h + oy) into `dst` (whole rows), with the
    /// weights `wt` laid out `[tap][out channel]`.
    fn nhwc_rows<E: Elem>(&self, isa: Isa, wt: &[f32], first: usize, oh: usize, ow: usize, dst: &mut [E]) {
        let d = &self.d;
        let occ = d.out_channels();
        // f32 rows are accumulated in place, all channels at once. Half-precision rows go
        // through an f32 buffer of at most BUF elements (L1): channel blocks of that many
        // pixels, multiples of 16 so the vectors stay whole.
        let half = !is_f32::<E>();
        let mut cbw = if half { (BUF / ow).clamp(1, occ) } else { occ };
        if cbw >= 16 && cbw < occ {
            cbw -= cbw % 16;
        }
        // The thread's row buffer, taken out of its slot for the call (a nested call on this
        // thread finds the slot empty and makes its own).
        let mut buf = if half { NHWC_ROW.take() } else { Vec::new() };
        if buf.len() < ow * cbw && half {
            buf.resize(ow * cbw, 0.0);
        }
        let rows = dst.len() / (ow * occ);
        // A half-precision input: the (up to) three input rows of each output row widened
        // into this thread's buffer, kernel row `ky`'s at `ky · w · c`.
        let (h, w, c) = (d.height, d.width, d.channels);
        let mut xrows = if self.xh.is_some() { HALF_IN.take() } else { Vec::new() };
        if self.xh.is_some() && xrows.len() < 3 * w * c {
            xrows.resize(3 * w * c, 0.0);
        }
        for cb0 in (0..occ).step_by(cbw) {
            let cb1 = (cb0 + cbw).min(occ);
            let nb = cb1 - cb0;
            for r in 0..rows {
                let row = first + r;
                let (n, oy) = (row / oh, row % oh);
                if let Some(xh) = self.xh {
                    for ky in 0..3 {
                        let py = oy * d.stride_h + ky * d.dilation_h;
                        if py >= d.pad_top && py - d.pad_top < h {
                            xh.widen_range((n * h + py - d.pad_top) * w * c, &mut xrows[ky * w * c..][..w * c]);
                        }
                    }
                }
                let p = PixArgs {
                    d,
                    isa,
                    x: if self.xh.is_some() { &xrows } else { self.x },
                    local: self.xh.is_some(),
                    wt: &wt[cb0..],
                    ws: occ,
                    bias: self.bias.map(|b| &b[cb0..cb1]),
                    n,
                    oy,
                    ow,
                    cb0,
                    nb,
                };
                let dst_row = &mut dst[r * ow * occ..][..ow * occ];
                match E::as_f32_mut(dst_row) {
                    Some(o) => nhwc_row(isa, &p, &mut o[cb0..], occ),
                    // All the channels: the row is one run (one conversion, not one per pixel).
                    None if nb == occ => {
                        nhwc_row(isa, &p, &mut buf[..ow * nb], nb);
                        E::narrow_into(&buf[..ow * nb], dst_row);
                    }
                    None => {
                        nhwc_row(isa, &p, &mut buf[..ow * nb], nb);
                        for ox in 0..ow {
                            E::narrow_into(&buf[ox * nb..][..nb], &mut dst_row[ox * occ + cb0..][..nb]);
                        }
                    }
                }
            }
        }
        if half {
            NHWC_ROW.set(buf);
        }
        if self.xh.is_some() {
            HALF_IN.set(xrows);
        }
    }
}

/// The kernel [`Conv::nchw_plane`] runs a plane with.
#[derive(Clone, Copy)]
enum PlaneKernel<'g> {
    Band(&'g Band),
    #[cfg(target_arch = "x86_64")]
    Rows512(&'g rows512::Rows512),
    Rows,
}

/// One NCHW plane through the 16-lane rows ([`rows512`]), `dst` all its outputs: ReLU and
/// ReLU6 applied in registers, other activations over the plane after it (in L1).
#[cfg(target_arch = "x86_64")]
fn plane512(
    f: &rows512::Rows512,
    act: tilekit_kernels::Activation,
    x: &[f32],
    wk: &[f32; 9],
    bias: f32,
    dst: &mut [f32],
) {
    use nhwc3::avx::{NONE, RELU, RELU6};
    use tilekit_kernels::Activation;
    // SAFETY: the rows are chosen only where `isa` is `Isa::Avx512` (`Conv::kernel`), which
    // `Isa::detect` reports only where the CPU has AVX-512F, AVX2 and FMA.
    unsafe {
        match act {
            Activation::Relu => rows512::plane::<RELU>(f, x, wk, bias, dst),
            Activation::Relu6 => rows512::plane::<RELU6>(f, x, wk, bias, dst),
            _ => rows512::plane::<NONE>(f, x, wk, bias, dst),
        }
    }
    act_after_registers(act, dst);
}

/// The activation over an AVX-512 plane kernel's outputs `dst` where the kernel did not apply
/// it in registers (those apply ReLU and ReLU6 there).
#[cfg(target_arch = "x86_64")]
fn act_after_registers(act: tilekit_kernels::Activation, dst: &mut [f32]) {
    use tilekit_kernels::Activation;
    if !matches!(act, Activation::None | Activation::Relu | Activation::Relu6) {
        super::activation::map_in_place(Isa::Avx512, act, dst, None);
    }
}

/// Lanes of the NCHW band kernel's column chunks (one AVX2 vector; half an AVX-512 one).
const V: usize = 8;
/// Output rows the NCHW band kernel computes together: `RB` independent accumulator vectors
/// per tap, so the multiply-adds of one chunk do not wait on each other.
const RB: usize = 4;
/// Taps whose offsets the band kernel keeps (larger kernels take the row path).
const MAX_TAPS: usize = 64;

/// The geometry of the NCHW band kernel for one layer: a band of output rows is computed
/// from a copy of the input rows it reaches, padded with zeros and split by column into the
/// `stride_w` phases (phase `p` holds padded columns `p, p + s, p + 2s, …`). Every tap of an
/// output chunk is then one contiguous `V`-wide load at a fixed offset, with no border checks:
/// the padding is materialised once per band instead of being tested per tap and row. Rows
/// and chunks past the output are computed from zeros or neighbouring data and not stored.
struct Band {
    /// The layer.
    d: Conv2dDesc,
    /// Output width and its `V`-wide chunks.
    ow: usize,
    chunks: usize,
    /// Width of one phase row, and of one padded row (`stride_w` phases).
    wq: usize,
    rs: usize,
    /// Output rows per band (a multiple of `RB`), and padded input rows it reads.
    rows: usize,
    in_rows: usize,
    /// Per tap (`ky·kw + kx`): its offset in the band buffer from a chunk's first element.
    offs: [usize; MAX_TAPS],
    /// Whether a band holds a whole plane (then every plane puts its padding rows in the same
    /// buffer rows, which stay zero).
    one_band: bool,
    /// Per phase: the columns `lo..hi` of its row that come from the input (the rest are
    /// padding). The same for every row and plane of the layer, so the padding columns are
    /// never written: the buffer, zeroed for the layer (`LayerBufs`), stays zero there.
    phase: [(usize, usize); MAX_STRIDE],
}

/// Elements of whole planes the flat planes widen or round at a time (16 KiB of f32, L1).
#[cfg(target_arch = "x86_64")]
const FLAT_CHUNK: usize = 4096;

/// The widest horizontal stride the band kernel takes.
const MAX_STRIDE: usize = 8;

impl Band {
    /// The band geometry, or `None` where the layer is outside what it covers (more than
    /// [`MAX_TAPS`] taps, or a padded row too wide for a band of `RB` rows in [`BUF`]).
    fn new(d: &Conv2dDesc) -> Option<Band> {
        let (kh, kw) = (d.kernel_h, d.kernel_w);
        let (s, sh) = (d.stride_w, d.stride_h);
        let (oh, ow) = (d.out_h()?, d.out_w()?);
        if kh * kw > MAX_TAPS || kh == 0 || kw == 0 || s == 0 || s > MAX_STRIDE || sh == 0 || ow == 0 || oh == 0 {
            return None;
        }
        let chunks = ow.div_ceil(V);
        let wq = chunks * V + (kw - 1) * d.dilation_w / s;
        let rs = s.checked_mul(wq)?;
        let in_rows = |rows: usize| (rows - 1) * sh + (kh - 1) * d.dilation_h + 1;
        // As many rows as fit the buffer (and, for half-precision outputs, the row buffer),
        // no more than the plane needs.
        let mut rows = oh.next_multiple_of(RB);
        while rows > RB && (in_rows(rows) * rs > BUF || rows * ow > BUF) {
            rows -= RB;
        }
        if in_rows(rows) * rs > BUF || rows * ow > BUF {
            return None;
        }
        let mut offs = [0usize; MAX_TAPS];
        for ky in 0..kh {
            for kx in 0..kw {
                let (p, q) = ((kx * d.dilation_w) % s, (kx * d.dilation_w) / s);
                offs[ky * kw + kx] = ky * d.dilation_h * rs + p * wq + q;
            }
        }
        let mut phase = [(0, 0); MAX_STRIDE];
        for (p, r) in phase.iter_mut().enumerate().take(s) {
            *r = tap_range(wq, d.width, s, d.pad_left, p);
        }
        Some(Band { d: *d, ow, chunks, wq, rs, rows, in_rows: in_rows(rows), one_band: rows >= oh, offs, phase })
    }
}

/// Output rows `oy0..oy0 + out.len() / ow` of one NCHW plane into `out` (bias and activation
/// included), through the band buffer `buf`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nchw_band_inner<const FMA: bool>(
    g: &Band,
    xp: &[f32],
    wk: &[f32],
    bias: f32,
    oy0: usize,
    out: &mut [f32],
    buf: &mut [f32],
) {
    let d = &g.d;
    let (s, sh, w) = (d.stride_w, d.stride_h, d.width);
    let pr0 = oy0 * sh;
    // The padded input rows pr0.. split into phases.
    for i in 0..g.in_rows {
        let row = &mut buf[i * g.rs..][..g.rs];
        let pr = pr0 + i;
        if pr < d.pad_top || pr - d.pad_top >= d.height {
            // A padding row. With one band per plane it is the same buffer row in every plane
            // and never holds data, so it is still zero since the buffer was zeroed for the
            // layer (`LayerBufs`).
            if !g.one_band {
                row.fill(0.0);
            }
            continue;
        }
        let src = &xp[(pr - d.pad_top) * w..][..w];
        if s == 2 {
            deinterleave2(g, src, row);
            continue;
        }
        // Phase rows by index, not `chunks_exact_mut`, whose length is a division per row.
        for (p, &(lo, hi)) in g.phase[..s].iter().enumerate() {
            let dst = &mut row[p * g.wq..][..g.wq];
            // Columns outside lo..hi are padding: zero since the buffer was made (see `phase`).
            if lo < hi {
                let first = lo * s + p - d.pad_left;
                let n = hi - lo;
                if s == 1 {
                    // V-wide pieces and a scalar tail: a row of a small plane is a few dozen
                    // elements, and a `memcpy` call per row cost more than the copy.
                    let (dst, src) = (&mut dst[lo..hi], &src[first..first + n]);
                    let mut d8 = dst.chunks_exact_mut(V);
                    let mut s8 = src.chunks_exact(V);
                    for (o, x) in (&mut d8).zip(&mut s8) {
                        let x: &[f32; V] = x.try_into().expect("V lanes");
                        o.copy_from_slice(x);
                    }
                    copy_tail(d8.into_remainder(), s8.remainder());
                } else {
                    for (o, &x) in dst[lo..hi].iter_mut().zip(src[first..].iter().step_by(s)) {
                        *o = x;
                    }
                }
            }
        }
    }
    let taps = d.kernel_h * d.kernel_w;
    let offs = &g.offs[..taps];
    let rows = out.len() / g.ow;
    let row_step = sh * g.rs;
    // Every window read below starts inside the band's BUF elements (`Band::new`); masking
    // its start with BUF − 1 (a power of two) changes nothing and lets the compiler see that
    // the V elements from there are inside the BUF + V array: no bounds check per tap.
    let win: &[f32; BUF + V] = (&buf[..BUF + V]).try_into().expect("band buffer of BUF + V");
    if d.kernel_h == 3 && d.kernel_w == 3 && d.dilation_h == 1 {
        match sh {
            1 => return band3::<FMA, 1>(g, wk, bias, rows, out, win),
            2 => return band3::<FMA, 2>(g, wk, bias, rows, out, win),
            _ => {}
        }
    }
    for r0 in (0..rows).step_by(RB) {
        for c in 0..g.chunks {
            let mut acc = [[bias; V]; RB];
            let base = r0 * row_step + c * V;
            for (&wv, &off) in wk.iter().zip(offs) {
                for (r, a) in acc.iter_mut().enumerate() {
                    debug_assert!(base + r * row_step + off + V <= BUF, "band window past the buffer");
                    let i = (base + r * row_step + off) & (BUF - 1);
                    let x: &[f32; V] = win[i..i + V].try_into().expect("V lanes");
                    for (a, &x) in a.iter_mut().zip(x) {
                        *a = madd::<FMA>(wv, x, *a);
                    }
                }
            }
            let (c0, n) = (c * V, V.min(g.ow - c * V));
            for (r, a) in acc.iter().enumerate().take(rows - r0) {
                store_chunk(&mut out[(r0 + r) * g.ow + c0..], a, n);
            }
        }
    }
    apply_isa::<FMA>(d.activation, out);
}

/// One input row into the two phase rows of a horizontal stride of 2 (phase `p`, column `t`
/// holds input column `2t + p − pad_left`), both phases in one pass over the row's pairs, so
/// LLVM loads each pair once and deinterleaves with vector shuffles (per phase, the pairs'
/// one used element was a scalar loop that cost more than the convolution). Writes only each
/// phase's input columns `lo..hi`.
#[inline(always)]
fn deinterleave2(g: &Band, src: &[f32], row: &mut [f32]) {
    let pl = g.d.pad_left;
    let ((lo0, hi0), (lo1, hi1)) = (g.phase[0], g.phase[1]);
    let (ph0, ph1) = row[..2 * g.wq].split_at_mut(g.wq);
    // Columns both phases take: pairs (2t − pl, 2t + 1 − pl) of the input.
    let (t0, t1) = (lo0.max(lo1), hi0.min(hi1));
    if t0 >= t1 {
        // No column in common (rows of one or two elements).
        (lo0..hi0).for_each(|t| ph0[t] = src[2 * t - pl]);
        (lo1..hi1).for_each(|t| ph1[t] = src[2 * t + 1 - pl]);
        return;
    }
    let pairs = src[2 * t0 - pl..2 * t1 - pl].chunks_exact(2);
    for ((a, b), pair) in ph0[t0..t1].iter_mut().zip(&mut ph1[t0..t1]).zip(pairs) {
        *a = pair[0];
        *b = pair[1];
    }
    // The ends one phase takes and the other does not (at most one column each side).
    (lo0..t0).chain(t1..hi0).for_each(|t| ph0[t] = src[2 * t - pl]);
    (lo1..t0).chain(t1..hi1).for_each(|t| ph1[t] = src[2 * t + 1 - pl]);
}

/// `dst[..n] = src[..n]` for `n < V` (`n` = the shorter length), lane by lane over a fixed
/// `V`: a plain copy loop of a runtime length compiles to a `memcpy` call, which for the few
/// elements of a short row's tail cost more than the copy.
#[inline(always)]
fn copy_tail(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len()).min(V);
    for l in 0..V {
        if l < n {
            dst[l] = src[l];
        }
    }
}

/// Stores the first `n ≤ V` lanes of `a` at the start of `dst` (see [`copy_tail`]).
#[inline(always)]
fn store_chunk(dst: &mut [f32], a: &[f32; V], n: usize) {
    if n == V {
        dst[..V].copy_from_slice(a);
    } else {
        copy_tail(&mut dst[..n], a);
    }
}

/// The band kernel for 3 × 3 kernels with vertical dilation 1 and vertical stride `SH`
/// (MobileNet's layers): the same sums as the general loop, in the same order, but each
/// input row's three shifted vectors are loaded once and used for every output row of the
/// group that reads them (18 loads per 36 multiply-adds at `SH` = 1, against 36). Ends with
/// the activation, like its caller.
#[inline(always)]
fn band3<const FMA: bool, const SH: usize>(
    g: &Band,
    wk: &[f32],
    bias: f32,
    rows: usize,
    out: &mut [f32],
    win: &[f32; BUF + V],
) {
    // Input rows a group of RB output rows reads.
    let in_rows = (RB - 1) * SH + 3;
    let rs = g.rs;
    // Tap (ky, kx) is at ky·rs + h[kx] (vertical dilation 1).
    let h = [g.offs[0], g.offs[1], g.offs[2]];
    let w: &[f32; 9] = wk[..9].try_into().expect("3 × 3 weights");
    for r0 in (0..rows).step_by(RB) {
        for c in 0..g.chunks {
            let mut acc = [[bias; V]; RB];
            let base = r0 * SH * rs + c * V;
            // Input row i of the group: its three shifted vectors, then every output row that
            // reads it (with kernel row i − r·SH). A loop over i, not unrolled: fully unrolled,
            // LLVM split the 8-lane sums into 4-, 2- and 1-lane pieces.
            for i in 0..in_rows {
                let x: [&[f32; V]; 3] = std::array::from_fn(|kx| {
                    debug_assert!(base + i * rs + h[kx] + V <= BUF, "band window past the buffer");
                    let j = (base + i * rs + h[kx]) & (BUF - 1);
                    win[j..j + V].try_into().expect("V lanes")
                });
                for (r, a) in acc.iter_mut().enumerate() {
                    let ky = i.wrapping_sub(r * SH);
                    if ky < 3 {
                        let wr: &[f32; 3] = w[ky * 3..ky * 3 + 3].try_into().expect("3 weights");
                        for (&wv, x) in wr.iter().zip(&x) {
                            for (a, &x) in a.iter_mut().zip(x.iter()) {
                                *a = madd::<FMA>(wv, x, *a);
                            }
                        }
                    }
                }
            }
            let (c0, n) = (c * V, V.min(g.ow - c * V));
            for (r, a) in acc.iter().enumerate().take(rows - r0) {
                store_chunk(&mut out[(r0 + r) * g.ow + c0..], a, n);
            }
        }
    }
    apply_isa::<FMA>(g.d.activation, out);
}

multiversion! {
    fn nchw_band(g: &Band, xp: &[f32], wk: &[f32], bias: f32, oy0: usize, out: &mut [f32], buf: &mut [f32]) => nchw_band_inner
}

/// What one NCHW output row needs.
struct RowArgs<'a> {
    d: &'a Conv2dDesc,
    /// The input plane.
    xp: &'a [f32],
    /// The plane's `kh × kw` weights.
    wk: &'a [f32],
    bias: f32,
    ow: usize,
    /// `tap_range` of the first `MAX_KW` kernel columns.
    ranges: [(usize, usize); MAX_KW],
}

/// Kernel columns whose tap ranges are precomputed per plane (wider kernels compute the rest
/// per row).
const MAX_KW: usize = 8;

/// `acc[i] += w · x[first + stride·i]` over `acc`.
#[inline(always)]
fn tap<const FMA: bool>(acc: &mut [f32], x: &[f32], first: usize, stride: usize, w: f32) {
    if stride == 1 {
        let x = &x[first..first + acc.len()];
        acc.iter_mut().zip(x).for_each(|(a, &x)| *a = madd::<FMA>(w, x, *a));
    } else {
        let x = &x[first..];
        acc.iter_mut().zip(x.iter().step_by(stride)).for_each(|(a, &x)| *a = madd::<FMA>(w, x, *a));
    }
}

/// Three taps (`x` offsets 0, `dil`, 2·`dil` from `first`) in one pass over `acc`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tap3<const FMA: bool>(acc: &mut [f32], x: &[f32], first: usize, stride: usize, dil: usize, w: [f32; 3]) {
    let n = acc.len();
    if n == 0 {
        return;
    }
    let span = (n - 1) * stride + 1;
    let x0 = &x[first..first + span];
    let x1 = &x[first + dil..first + dil + span];
    let x2 = &x[first + 2 * dil..first + 2 * dil + span];
    if stride == 1 {
        for (i, a) in acc.iter_mut().enumerate() {
            let s = madd::<FMA>(w[0], x0[i], *a);
            let s = madd::<FMA>(w[1], x1[i], s);
            *a = madd::<FMA>(w[2], x2[i], s);
        }
    } else {
        for (i, a) in acc.iter_mut().enumerate() {
            let j = i * stride;
            let s = madd::<FMA>(w[0], x0[j], *a);
            let s = madd::<FMA>(w[1], x1[j], s);
            *a = madd::<FMA>(w[2], x2[j], s);
        }
    }
}

/// Output row `oy`, columns `c0..c0 + acc.len()`, of one NCHW plane into `acc` (bias and
/// activation included).
#[inline(always)]
fn nchw_row_inner<const FMA: bool>(p: &RowArgs, oy: usize, c0: usize, acc: &mut [f32]) {
    let d = p.d;
    let c1 = c0 + acc.len();
    acc.fill(p.bias);
    for ky in 0..d.kernel_h {
        let py = oy * d.stride_h + ky * d.dilation_h;
        if py < d.pad_top || py - d.pad_top >= d.height {
            continue;
        }
        let xrow = &p.xp[(py - d.pad_top) * d.width..][..d.width];
        let wrow = &p.wk[ky * d.kernel_w..][..d.kernel_w];
        // Each tap's valid output columns, clipped to this piece.
        let range = |kx: usize| {
            let (lo, hi) = if kx < MAX_KW {
                p.ranges[kx]
            } else {
                tap_range(p.ow, d.width, d.stride_w, d.pad_left, kx * d.dilation_w)
            };
            (lo.max(c0), hi.min(c1).max(lo.max(c0)))
        };
        let first = |kx: usize, o: usize| o * d.stride_w + kx * d.dilation_w - d.pad_left;
        let mut done_inner = (0, 0);
        if d.kernel_w == 3 {
            // Columns where all three taps are valid: one fused pass.
            let (l0, h0) = range(0);
            let (l1, h1) = range(1);
            let (l2, h2) = range(2);
            let (lo, hi) = (l0.max(l1).max(l2), h0.min(h1).min(h2));
            if lo < hi {
                let w = [wrow[0], wrow[1], wrow[2]];
                tap3::<FMA>(&mut acc[lo - c0..hi - c0], xrow, first(0, lo), d.stride_w, d.dilation_w, w);
                done_inner = (lo, hi);
            }
        }
        let (fl, fh) = done_inner;
        for (kx, &wv) in wrow.iter().enumerate() {
            let (lo, hi) = range(kx);
            // The part outside the fused columns (all of it when nothing was fused; the fused
            // columns lie inside every tap's range).
            let parts = if fl < fh { [(lo, hi.min(fl)), (lo.max(fh), hi)] } else { [(lo, hi), (0, 0)] };
            for (a, b) in parts {
                if a < b {
                    tap::<FMA>(&mut acc[a - c0..b - c0], xrow, first(kx, a), d.stride_w, wv);
                }
            }
        }
    }
    apply_isa::<FMA>(d.activation, acc);
}

multiversion! {
    fn nchw_row(p: &RowArgs, oy: usize, c0: usize, acc: &mut [f32]) => nchw_row_inner
}

/// A whole f32 output plane, row by row, inside one instruction-set copy (no call per row).
#[inline(always)]
fn nchw_plane_inner<const FMA: bool>(p: &RowArgs, dst: &mut [f32]) {
    for (oy, row) in dst.chunks_mut(p.ow).enumerate() {
        nchw_row_inner::<FMA>(p, oy, 0, row);
    }
}

multiversion! {
    fn nchw_plane_f32(p: &RowArgs, dst: &mut [f32]) => nchw_plane_inner
}

/// What one NHWC output row (one channel block of it) needs.
struct PixArgs<'a> {
    d: &'a Conv2dDesc,
    /// The instruction set the row runs in (its `multiversion!` copy's).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
    /// The whole input, or where `local` the three input rows of this output row (kernel
    /// row `ky`'s at `ky · width · channels`, those outside the image not written).
    x: &'a [f32],
    local: bool,
    /// The weights from the block's first channel, `[tap][channel]`: tap `t`'s are at
    /// `t · ws`.
    wt: &'a [f32],
    ws: usize,
    /// The block's bias.
    bias: Option<&'a [f32]>,
    n: usize,
    oy: usize,
    ow: usize,
    /// The block's first channel and width.
    cb0: usize,
    nb: usize,
}

/// One NHWC output row's channel block: pixel `ox`'s channels are `acc[ox·stride..][..nb]`.
#[inline(always)]
fn nhwc_row_inner<const FMA: bool>(p: &PixArgs, acc: &mut [f32], stride: usize) {
    let d = p.d;
    let (h, w, c, m) = (d.height, d.width, d.channels, d.multiplier);
    let nb = p.nb;
    // 3 × 3 kernels (multiplier 1, whole 8-channel blocks) on AVX2 and FMA: the whole row.
    #[cfg(target_arch = "x86_64")]
    if FMA && nhwc3_fits(d, nb) {
        let (lo, hi) = interior(d, p.ow);
        let g = nhwc3::RowGeometry { c, width: w, pad_left: d.pad_left, lo, hi: hi.max(lo), ow: p.ow };
        let rows = std::array::from_fn(|ky| {
            let py = p.oy * d.stride_h + ky * d.dilation_h;
            (py >= d.pad_top && py - d.pad_top < h).then(|| (p.n * h + py - d.pad_top) * w * c + p.cb0)
        });
        // Where `x` holds only this output row's input rows, kernel row `ky`'s is at `ky·w·c`.
        let rows = if p.local { std::array::from_fn(|ky| rows[ky].map(|_| ky * w * c + p.cb0)) } else { rows };
        use nhwc3::avx::{NONE, RELU, RELU6, row_for};
        use tilekit_kernels::Activation;
        // ReLU and ReLU6 are applied in registers; the other activations after the row.
        let (relu, relu6) = (d.activation == Activation::Relu, d.activation == Activation::Relu6);
        let act = if relu {
            RELU
        } else if relu6 {
            RELU6
        } else {
            NONE
        };
        // On AVX-512 with whole 16-channel blocks, 16-lane vectors.
        let wide = p.isa == Isa::Avx512 && nb.is_multiple_of(16);
        // SAFETY: on x86-64, `FMA` is true only in the AVX2 and AVX-512 copies made by
        // `multiversion!`, which run only where the CPU reported AVX2 and FMA; `p.isa` is
        // `Isa::Avx512` only where it also reported AVX-512F.
        unsafe { row_for(wide, d.stride_w, act, p.x, rows, &g, p.wt, p.ws, p.bias, nb, acc, stride) };
        if !(relu || relu6 || d.activation == Activation::None) {
            if stride == nb {
                apply_isa::<FMA>(d.activation, &mut acc[..p.ow * nb]);
            } else {
                for j in 0..p.ow {
                    apply_isa::<FMA>(d.activation, &mut acc[j * stride..][..nb]);
                }
            }
        }
        return;
    }
    assert!(!p.local, "a half-precision input's rows reached a path that reads the whole input");
    // Multiplier 1 with whole channel blocks: the pixels whose every tap is inside the row,
    // PX at a time ([`nhwc_pixels`]); the others (and the rest) one by one below.
    let (mut lo, mut hi) = (0, 0);
    if m == 1 && nb.is_multiple_of(CB) && d.kernel_h * d.kernel_w <= MAX_TAPS {
        (lo, hi) = interior(d, p.ow);
        // Every tap inside the input rows, as (weight offset, input offset at pixel `lo`): pixel
        // `ox` reads `(ox − lo)·stride_w·c` further on. (`lo < hi` keeps `lo`'s leftmost tap
        // inside the row.)
        let mut taps = [(0usize, 0usize); MAX_TAPS];
        let mut nt = 0;
        for ky in (0..d.kernel_h).filter(|_| lo < hi) {
            let py = p.oy * d.stride_h + ky * d.dilation_h;
            if py < d.pad_top || py - d.pad_top >= h {
                continue;
            }
            let xrow = (p.n * h + py - d.pad_top) * w;
            for kx in 0..d.kernel_w {
                let px = xrow + lo * d.stride_w + kx * d.dilation_w - d.pad_left;
                taps[nt] = ((ky * d.kernel_w + kx) * p.ws, px * c + p.cb0);
                nt += 1;
            }
        }
        let mut ox = lo;
        while ox + PX <= hi {
            nhwc_pixels::<FMA>(p, ox, (ox - lo) * d.stride_w * c, &taps[..nt], acc, stride);
            for j in ox..ox + PX {
                apply_isa::<FMA>(d.activation, &mut acc[j * stride..][..nb]);
            }
            ox += PX;
        }
        hi = ox;
    }
    for ox in (0..p.ow).filter(|&ox| ox < lo || ox >= hi) {
        let a = &mut acc[ox * stride..][..nb];
        if m == 1 && d.kernel_h * d.kernel_w <= MAX_TAPS {
            nhwc_pixel::<FMA>(p, ox, a);
            apply_isa::<FMA>(d.activation, a);
            continue;
        }
        match p.bias {
            Some(b) => a.copy_from_slice(b),
            None => a.fill(0.0),
        }
        for ky in 0..d.kernel_h {
            let py = p.oy * d.stride_h + ky * d.dilation_h;
            if py < d.pad_top || py - d.pad_top >= h {
                continue;
            }
            let xrow = &p.x[(p.n * h + py - d.pad_top) * w * c..][..w * c];
            for kx in 0..d.kernel_w {
                let px = ox * d.stride_w + kx * d.dilation_w;
                if px < d.pad_left || px - d.pad_left >= w {
                    continue;
                }
                let wk = &p.wt[(ky * d.kernel_w + kx) * p.ws..][..nb];
                let xpix = &xrow[(px - d.pad_left) * c..][..c];
                if m == 1 {
                    let xs = &xpix[p.cb0..][..nb];
                    a.iter_mut().zip(xs).zip(wk).for_each(|((a, &x), &wv)| *a = madd::<FMA>(wv, x, *a));
                } else {
                    // Output channel `o` reads input channel `o / m`: runs of up to `m`
                    // channels share one input value (no division per element).
                    let (mut i, mut ci, mut j) = (0, p.cb0 / m, p.cb0 % m);
                    while i < nb {
                        let run = (m - j).min(nb - i);
                        let xv = xpix[ci];
                        a[i..i + run].iter_mut().zip(&wk[i..i + run]).for_each(|(a, &wv)| *a = madd::<FMA>(wv, xv, *a));
                        (i, ci, j) = (i + run, ci + 1, 0);
                    }
                }
            }
        }
        apply_isa::<FMA>(d.activation, a);
    }
}

/// The output pixels `lo..hi` of a row whose every tap lies inside the input row (`hi` may be
/// below `lo` when none does).
fn interior(d: &Conv2dDesc, ow: usize) -> (usize, usize) {
    let reach = (d.kernel_w - 1) * d.dilation_w;
    let lo = d.pad_left.div_ceil(d.stride_w).min(ow);
    // The last pixel whose rightmost tap lands at w − 1 or before.
    let w = d.width;
    let hi = if w + d.pad_left > reach { ((w + d.pad_left - reach - 1) / d.stride_w + 1).min(ow) } else { 0 };
    (lo, hi)
}

/// Whether a layer's rows have the geometry of [`nhwc3`]'s register tiles: a 3 × 3 kernel with
/// horizontal dilation 1 and stride 1 or 2 (the NHWC kernel and the NCHW channel-vector tile
/// take them where the CPU has AVX2 and FMA).
fn rows_3x3(d: &Conv2dDesc) -> bool {
    (d.kernel_h, d.kernel_w, d.dilation_w) == (3, 3, 1) && (1..=2).contains(&d.stride_w)
}

/// Whether [`nhwc3`]'s kernel takes a layer's NHWC rows: [`rows_3x3`], multiplier 1 and whole
/// 8-channel blocks.
#[cfg(target_arch = "x86_64")]
fn nhwc3_fits(d: &Conv2dDesc, nb: usize) -> bool {
    d.multiplier == 1 && rows_3x3(d) && nb.is_multiple_of(nhwc3::LANES)
}

/// Channels of one register block of [`nhwc_pixel`] (two AVX2 vectors, one AVX-512 vector).
const CB: usize = 16;

/// Output pixels per register tile of [`nhwc_pixels`].
const PX: usize = 4;

/// Output pixels `ox..ox + PX` of the row, every tap inside the input (multiplier 1, whole
/// `CB`-channel blocks), bias included: each channel block's `PX × CB` sums stay in registers
/// over all taps, and each tap's weights are loaded once for the `PX` pixels (`2 + 2·PX`
/// loads per `2·PX` vector multiply-adds, against 4 per 2 one pixel at a time). `taps` holds
/// (weight offset, input offset) of each tap for the row's first such pixel; these pixels'
/// inputs are `shift` elements further on. Listed once per row, the taps leave the loop over
/// them only the loads and multiply-adds: computing each tap's offset from the layer's
/// geometry there (a product and a subtraction per tap and channel block) took 1.1–1.3× the
/// time (one core of a Zen 3 EPYC, in-process A/B on four MobileNetV2 layers, the same bits).
#[inline(always)]
fn nhwc_pixels<const FMA: bool>(
    p: &PixArgs,
    ox: usize,
    shift: usize,
    taps: &[(usize, usize)],
    acc: &mut [f32],
    stride: usize,
) {
    let d = p.d;
    let (c, nb) = (d.channels, p.nb);
    let step = d.stride_w * c;
    for c0 in (0..nb).step_by(CB) {
        let mut v = [[0.0f32; CB]; PX];
        if let Some(b) = p.bias {
            for v in v.iter_mut() {
                v.copy_from_slice(&b[c0..c0 + CB]);
            }
        }
        for &(wo, xo) in taps {
            let wv: &[f32; CB] = p.wt[wo + c0..][..CB].try_into().expect("CB lanes");
            let x0 = &p.x[xo + shift + c0..][..(PX - 1) * step + CB];
            let mut xs = x0;
            for v in v.iter_mut() {
                let xv: &[f32; CB] = xs[..CB].try_into().expect("CB lanes");
                for ((v, &wv), &xv) in v.iter_mut().zip(wv).zip(xv) {
                    *v = madd::<FMA>(wv, xv, *v);
                }
                xs = &xs[step.min(xs.len())..];
            }
        }
        for (j, v) in v.iter().enumerate() {
            acc[(ox + j) * stride + c0..][..CB].copy_from_slice(v);
        }
    }
}

/// One output pixel's channel block (multiplier 1) into `a`, bias included: the taps inside
/// the input are listed once, then each `CB`-channel block is accumulated in registers over
/// all of them (one load of input and weights and one multiply-add per tap and vector, the
/// sum stored once); the last `nb % CB` channels take the same taps as slices.
#[inline(always)]
fn nhwc_pixel<const FMA: bool>(p: &PixArgs, ox: usize, a: &mut [f32]) {
    let d = p.d;
    let (h, w, c) = (d.height, d.width, d.channels);
    let nb = p.nb;
    // (weight offset, input offset) of every tap that lands inside the input.
    let mut taps = [(0usize, 0usize); MAX_TAPS];
    let mut nt = 0;
    for ky in 0..d.kernel_h {
        let py = p.oy * d.stride_h + ky * d.dilation_h;
        if py < d.pad_top || py - d.pad_top >= h {
            continue;
        }
        let row = (p.n * h + py - d.pad_top) * w;
        for kx in 0..d.kernel_w {
            let px = ox * d.stride_w + kx * d.dilation_w;
            if px < d.pad_left || px - d.pad_left >= w {
                continue;
            }
            taps[nt] = ((ky * d.kernel_w + kx) * p.ws, (row + px - d.pad_left) * c + p.cb0);
            nt += 1;
        }
    }
    let taps = &taps[..nt];
    let full = nb - nb % CB;
    for c0 in (0..full).step_by(CB) {
        let mut v = [0.0f32; CB];
        if let Some(b) = p.bias {
            v.copy_from_slice(&b[c0..c0 + CB]);
        }
        for &(wo, xo) in taps {
            let wv: &[f32; CB] = p.wt[wo + c0..][..CB].try_into().expect("CB lanes");
            let xv: &[f32; CB] = p.x[xo + c0..][..CB].try_into().expect("CB lanes");
            for ((v, &wv), &xv) in v.iter_mut().zip(wv).zip(xv) {
                *v = madd::<FMA>(wv, xv, *v);
            }
        }
        a[c0..c0 + CB].copy_from_slice(&v);
    }
    if full < nb {
        let rest = &mut a[full..];
        match p.bias {
            Some(b) => rest.copy_from_slice(&b[full..]),
            None => rest.fill(0.0),
        }
        for &(wo, xo) in taps {
            let wv = &p.wt[wo + full..wo + nb];
            let xv = &p.x[xo + full..xo + nb];
            rest.iter_mut().zip(wv).zip(xv).for_each(|((v, &wv), &xv)| *v = madd::<FMA>(wv, xv, *v));
        }
    }
}

multiversion! {
    fn nhwc_row(p: &PixArgs, acc: &mut [f32], stride: usize) => nhwc_row_inner
}
