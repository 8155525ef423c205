//! The CUDA quantized-matmul kernels (`shaders/cuda/qmatmul.cu`, module [`Module::Qmatmul`]):
//! `A · dequant(W)ᵀ` for a GGUF weight `W` `[N, K]` (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) stored as the
//! scale and body planes of `QTensor`, A in f32/f16/bf16, f32 accumulation and the dense
//! matmul's epilogue.
//!
//! - `qgemv_<fmt>_<storage>_m{4,16}` for M ≤ [`QGEMV_MAX_M`]: weights dequantized in registers,
//!   a warp per two output columns, K split across blocks as [`qgemv_plan`] says (partial sums
//!   in an f32 workspace, then `gemv_finalize_<storage>` of the GEMV module).
//! - `qmatmul_<fmt>_<storage>` for larger M: [`QMATMUL_TILE`]² output tiles, each K step's tile
//!   of W dequantized into shared memory.

use super::gemv::{GEMV_MIN_SPLIT_STEPS, GEMV_NK_COLS, GemvParams, wave_chunk};
use super::{Kernel, Module, k};
use crate::DType;
use crate::quant::GgmlType;

/// Largest M the decode kernels take (register tiles of 4 or 16 rows).
pub const QGEMV_MAX_M: usize = 16;
/// Output columns per decode block: 8 warps × 2 columns (as the dense `[N, K]` GEMV).
pub const QGEMV_COLS: usize = GEMV_NK_COLS;
/// Output tile of the tiled kernel (M > 16): the grid is `ceil(N / 64) × ceil(M / 64) × batch`.
pub const QMATMUL_TILE: usize = 64;
/// Weights per run: every kernel reads a row of W in runs of 16 consecutive weights.
pub const RUN: usize = 16;

/// The parameter block (`QuantParams` in `qmatmul.cu`): the GEMV block (`mm.b` unused; `k_chunk`
/// counts quantization blocks), then the device addresses of the two planes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QuantParams {
    /// The matmul's parameters, the workspace and the split: the split-K epilogue
    /// (`gemv_finalize_<storage>`) is launched with this block alone.
    pub gemv: GemvParams,
    /// The scale plane.
    pub scales: u64,
    /// The body plane.
    pub body: u64,
}

/// How a decode launch covers the product: blocks along N, splits of K, quantization blocks of
/// K per split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QgemvPlan {
    /// Blocks along N (`gridDim.x`).
    pub blocks_n: usize,
    /// Blocks along K (`gridDim.y`); 1 = no split, the kernel applies the epilogue itself.
    pub splits: usize,
    /// Quantization blocks (of `ty.block_size()` weights) per split.
    pub kb_chunk: usize,
}

/// The decode plan for `batch` products of `n` columns and depth `k` (a multiple of the block
/// size) on a GPU that holds `slots` blocks of the kernel at once: K is split in whole
/// quantization blocks as [`wave_chunk`] says, never into pieces under 4 warp steps (a warp
/// step is 32 runs of 16 weights).
pub fn qgemv_plan(ty: GgmlType, n: usize, k: usize, batch: usize, slots: usize) -> QgemvPlan {
    let bs = ty.block_size().max(RUN);
    let blocks_k = k / bs;
    let blocks_n = n.div_ceil(QGEMV_COLS).max(1);
    let runs_per_block = bs / RUN;
    // Quantization blocks in 4 warp steps (at least one).
    let min_chunk = (GEMV_MIN_SPLIT_STEPS * 32).div_ceil(runs_per_block).max(1);
    let kb_chunk = wave_chunk(blocks_n * batch.max(1), blocks_k, min_chunk, slots);
    QgemvPlan { blocks_n, splits: blocks_k.div_ceil(kb_chunk).max(1), kb_chunk }
}

/// The format's row in [`ENTRIES`], or `None` for a dense type.
const fn fmt_index(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q8_0 => Some(0),
        GgmlType::Q4_0 => Some(1),
        GgmlType::Q4_1 => Some(2),
        GgmlType::Q4K => Some(3),
        GgmlType::Q6K => Some(4),
        _ => None,
    }
}

const fn dtype_index(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
    }
}

/// `[format][storage][m4, m16, tiled]`.
const ENTRIES: [[[&str; 3]; 3]; 5] = [
    [
        ["qgemv_q8_0_f32_m4", "qgemv_q8_0_f32_m16", "qmatmul_q8_0_f32"],
        ["qgemv_q8_0_f16_m4", "qgemv_q8_0_f16_m16", "qmatmul_q8_0_f16"],
        ["qgemv_q8_0_bf16_m4", "qgemv_q8_0_bf16_m16", "qmatmul_q8_0_bf16"],
    ],
    [
        ["qgemv_q4_0_f32_m4", "qgemv_q4_0_f32_m16", "qmatmul_q4_0_f32"],
        ["qgemv_q4_0_f16_m4", "qgemv_q4_0_f16_m16", "qmatmul_q4_0_f16"],
        ["qgemv_q4_0_bf16_m4", "qgemv_q4_0_bf16_m16", "qmatmul_q4_0_bf16"],
    ],
    [
        ["qgemv_q4_1_f32_m4", "qgemv_q4_1_f32_m16", "qmatmul_q4_1_f32"],
        ["qgemv_q4_1_f16_m4", "qgemv_q4_1_f16_m16", "qmatmul_q4_1_f16"],
        ["qgemv_q4_1_bf16_m4", "qgemv_q4_1_bf16_m16", "qmatmul_q4_1_bf16"],
    ],
    [
        ["qgemv_q4k_f32_m4", "qgemv_q4k_f32_m16", "qmatmul_q4k_f32"],
        ["qgemv_q4k_f16_m4", "qgemv_q4k_f16_m16", "qmatmul_q4k_f16"],
        ["qgemv_q4k_bf16_m4", "qgemv_q4k_bf16_m16", "qmatmul_q4k_bf16"],
    ],
    [
        ["qgemv_q6k_f32_m4", "qgemv_q6k_f32_m16", "qmatmul_q6k_f32"],
        ["qgemv_q6k_f16_m4", "qgemv_q6k_f16_m16", "qmatmul_q6k_f16"],
        ["qgemv_q6k_bf16_m4", "qgemv_q6k_bf16_m16", "qmatmul_q6k_bf16"],
    ],
];

/// Which kernel a quantized matmul of `m` rows runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantKernel {
    /// A decode kernel (M ≤ [`QGEMV_MAX_M`]), launched as [`qgemv_plan`] says.
    Gemv(Kernel),
    /// The tiled kernel.
    Tiled(Kernel),
}

/// The kernel for weights of type `ty`, A (and the output) stored as `dtype`, and `m ≥ 1` rows;
/// `None` for a dense `ty` (dense weights go through the ordinary matmul).
pub fn quant_kernel(ty: GgmlType, dtype: DType, m: usize) -> Option<QuantKernel> {
    let names = ENTRIES[fmt_index(ty)?][dtype_index(dtype)];
    Some(if m <= 4 {
        QuantKernel::Gemv(k(Module::Qmatmul, names[0]))
    } else if m <= QGEMV_MAX_M {
        QuantKernel::Gemv(k(Module::Qmatmul, names[1]))
    } else {
        QuantKernel::Tiled(k(Module::Qmatmul, names[2]))
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::ptx_param_size;
    use super::*;

    #[test]
    fn every_entry_takes_the_quant_block() {
        assert_eq!(size_of::<QuantParams>(), size_of::<GemvParams>() + 16);
        for ty in GgmlType::QUANTIZED {
            for dt in DType::ALL {
                for m in [1, 4, 5, 16, 17, 70] {
                    let kern = match quant_kernel(ty, dt, m).expect("a quantized kernel") {
                        QuantKernel::Gemv(kern) => {
                            assert!(m <= QGEMV_MAX_M);
                            kern
                        }
                        QuantKernel::Tiled(kern) => {
                            assert!(m > QGEMV_MAX_M);
                            kern
                        }
                    };
                    assert_eq!(ptx_param_size(kern), Some(size_of::<QuantParams>()), "{}", kern.entry);
                }
            }
        }
        assert_eq!(quant_kernel(GgmlType::F16, DType::F32, 1), None);
    }

    /// A host transliteration of `qraw_load` + `qraw_dequant` in `qmatmul.cu`: run `r` of block
    /// `g` from the two planes, read as the kernel reads them (aligned 16-byte vectors, 32-bit
    /// words, the Q4_K select of two vectors, the Q6_K scale byte's word and shift).
    fn kernel_run(ty: GgmlType, sc: &[u8], body: &[u8], g: usize, r: usize) -> [f32; 16] {
        let vec16 = |off: usize| -> [u32; 4] {
            assert_eq!(off % 16, 0, "an unaligned 16-byte load");
            std::array::from_fn(|i| {
                let b = &body[off + 4 * i..];
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            })
        };
        let ld32 = |p: &[u8], off: usize| {
            assert_eq!(off % 4, 0, "an unaligned 32-bit load");
            u32::from_le_bytes([p[off], p[off + 1], p[off + 2], p[off + 3]])
        };
        let ld16 = |g: usize| u32::from(u16::from_le_bytes([sc[2 * g], sc[2 * g + 1]]));
        let h2f = |b: u32| half::f16::from_bits(b as u16).to_f32();
        let byte_of = |v: &[u32; 4], i: usize| (v[i >> 2] >> (8 * (i & 3))) & 0xff;
        let mut w = [0.0f32; 16];
        match ty {
            GgmlType::Q8_0 => {
                let (v, d) = (vec16(g * 32 + 16 * r), h2f(ld16(g)));
                for (i, w) in w.iter_mut().enumerate() {
                    *w = f32::from(byte_of(&v, i) as u8 as i8) * d;
                }
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let v = vec16(g * 16);
                let bits = if ty == GgmlType::Q4_0 { ld16(g) } else { ld32(sc, 4 * g) };
                let (d, m) = (h2f(bits), h2f(bits >> 16));
                for (i, w) in w.iter_mut().enumerate() {
                    let nib = (byte_of(&v, i) >> (4 * r)) & 15;
                    *w = if ty == GgmlType::Q4_0 { (nib as i32 - 8) as f32 * d } else { nib as f32 * d + m };
                }
            }
            GgmlType::Q4K => {
                let base = g * 140;
                let q = [ld32(body, base), ld32(body, base + 4), ld32(body, base + 8)];
                let b12 = |i: usize| (q[i / 4] >> (8 * (i & 3))) & 0xff;
                let off = base + 12 + 32 * (r >> 2) + 16 * (r & 1);
                let al = off & !15;
                let v0 = vec16(al);
                let v1 = if off != al { vec16(al + 16) } else { [0; 4] };
                let bits = ld32(sc, 4 * g);
                let (d, dmin) = (h2f(bits), h2f(bits >> 16));
                let s = r >> 1;
                let (scv, mv) = if s < 4 {
                    (b12(s) & 63, b12(s + 4) & 63)
                } else {
                    ((b12(s + 4) & 15) | ((b12(s - 4) >> 6) << 4), (b12(s + 4) >> 4) | ((b12(s) >> 6) << 4))
                };
                let (d1, m1) = (d * scv as f32, dmin * mv as f32);
                let wsh = (3 * (g + 1)) & 3;
                assert_eq!(4 * wsh, off - al, "the kernel's word shift");
                let words = [v0[0], v0[1], v0[2], v0[3], v1[0], v1[1], v1[2], v1[3]];
                for (i, w) in w.iter_mut().enumerate() {
                    let nib = (words[i / 4 + wsh] >> (8 * (i % 4) + 4 * ((r >> 1) & 1))) & 15;
                    *w = d1 * nib as f32 - m1;
                }
            }
            GgmlType::Q6K => {
                let base = g * 208;
                let (h, t, j) = (r >> 3, (r & 7) >> 1, r & 1);
                let v0 = vec16(base + 64 * h + 32 * (t & 1) + 16 * j);
                let v1 = vec16(base + 128 + 32 * h + 16 * j);
                let so = base + 192 + 8 * h + j + 2 * t;
                let scale = ((ld32(body, so & !3) >> (8 * (so & 3))) & 0xff) as u8 as i8;
                let ds = h2f(ld16(g)) * f32::from(scale);
                for (i, w) in w.iter_mut().enumerate() {
                    let lo = (byte_of(&v0, i) >> (4 * (t >> 1))) & 15;
                    let hb = (byte_of(&v1, i) >> (2 * t)) & 3;
                    *w = ds * ((lo | (hb << 4)) as i32 - 32) as f32;
                }
            }
            _ => unreachable!("a dense type"),
        }
        w
    }

    /// The kernels' run decomposition reproduces `quant::dequantize` bit for bit on random
    /// blocks of every format (every Q4_K alignment of its 140-byte bodies included), reading
    /// the planes only with the aligned loads the kernels use. This checks the index and bit
    /// arithmetic `qmatmul.cu` mirrors; the CUDA code itself runs only on a GPU
    /// (`cargo xtask device-check`).
    #[test]
    fn the_run_decomposition_reproduces_the_reference() {
        for ty in GgmlType::QUANTIZED {
            let (sb, bb, first) = match ty {
                GgmlType::Q8_0 => (2, 32, true),
                GgmlType::Q4_0 => (2, 16, true),
                GgmlType::Q4_1 => (4, 16, true),
                GgmlType::Q4K => (4, 140, true),
                _ => (2, 208, false),
            };
            let blocks = 13;
            let mut s = 0x9e3779b97f4a7c15u64 ^ ty.block_bytes() as u64;
            let data: Vec<u8> = (0..blocks * ty.block_bytes())
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (s >> 56) as u8
                })
                .collect();
            // The planes as `quant_tensor.rs` splits them, padded to whole 16-byte vectors as
            // tilekit's allocations are.
            let (mut sc, mut body) = (Vec::new(), Vec::new());
            for blk in data.chunks_exact(ty.block_bytes()) {
                let (a, b) = if first { blk.split_at(sb) } else { (&blk[bb..], &blk[..bb]) };
                sc.extend_from_slice(a);
                body.extend_from_slice(b);
            }
            sc.resize(sc.len().div_ceil(16) * 16 + 16, 0);
            body.resize(body.len().div_ceil(16) * 16 + 16, 0);
            let bs = ty.block_size();
            let want = crate::quant::dequantize(ty, &data, &[1, blocks * bs]).expect("valid blocks");
            for g in 0..blocks {
                for r in 0..bs / RUN {
                    let got = kernel_run(ty, &sc, &body, g, r);
                    let w = &want[g * bs + r * RUN..][..RUN];
                    for i in 0..RUN {
                        assert_eq!(got[i].to_bits(), w[i].to_bits(), "{ty} block {g} run {r} weight {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_plan_covers_k_in_whole_blocks_and_fills_whole_waves() {
        for ty in GgmlType::QUANTIZED {
            let bs = ty.block_size();
            for (n, k, batch, slots) in [
                (4096, 4096, 1, 1056),
                (11008, 4096, 1, 1056),
                (4096, 11008, 1, 264),
                (7, 32 * bs, 1, 1056),
                (13, 0, 2, 1056),
                (64, 65536, 1, 0),
            ] {
                let p = qgemv_plan(ty, n, k, batch, slots);
                let blocks_k = k / bs;
                assert_eq!(p.blocks_n, n.div_ceil(QGEMV_COLS), "{ty} {p:?}");
                // Every block of K is in exactly one split, and no split is empty.
                assert!(p.splits * p.kb_chunk >= blocks_k, "{ty} {n}x{k}: {p:?}");
                assert!(blocks_k == 0 && p.splits == 1 || (p.splits - 1) * p.kb_chunk < blocks_k, "{ty} {p:?}");
                // A split holds at least 4 warp steps of runs unless K is shorter than that.
                if p.splits > 1 {
                    assert!(p.kb_chunk * (bs / RUN) >= 4 * 32, "{ty} {p:?}");
                }
            }
            // N = 4096 gives 256 blocks: at 8 an SM on 132 SMs, 4 splits fill 1024 of 1056
            // places (K = 4096 has 8 warp steps: at most 2 splits).
            let steps = 4096 / bs * (bs / RUN) / 32;
            assert_eq!(qgemv_plan(ty, 4096, 4096, 1, 1056).splits, 4.min(steps / 4), "{ty}");
            // N = 11008 gives 688 blocks, more than a wave of 264: no split.
            assert_eq!(qgemv_plan(ty, 11008, 4096, 1, 264).splits, 1, "{ty}");
            // Few columns and a long K: split until the pieces reach 4 warp steps.
            let p = qgemv_plan(ty, 64, 65536, 1, 1056);
            assert_eq!(p.kb_chunk * (bs / RUN), 4 * 32, "{ty} {p:?}");
        }
    }
}
