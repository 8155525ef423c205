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

use super::gemv::{GEMV_MIN_WAVES, GEMV_NK_COLS, GEMV_TARGET_SMS, GemvParams};
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
/// size): split K until the blocks make two waves on 132 SMs, but never into pieces under 4
/// warp steps (a warp step is 32 runs of 16 weights).
pub fn qgemv_plan(ty: GgmlType, n: usize, k: usize, batch: usize) -> QgemvPlan {
    let bs = ty.block_size().max(RUN);
    let blocks_k = k / bs;
    let blocks_n = n.div_ceil(QGEMV_COLS).max(1);
    let runs_per_block = bs / RUN;
    // Quantization blocks in 4 warp steps (at least one).
    let min_chunk = (4 * 32usize).div_ceil(runs_per_block).max(1);
    let want = (GEMV_MIN_WAVES * GEMV_TARGET_SMS).div_ceil(blocks_n * batch.max(1));
    let most = blocks_k.div_ceil(min_chunk).max(1);
    let splits = want.clamp(1, most);
    let kb_chunk = blocks_k.div_ceil(splits).max(1);
    let splits = blocks_k.div_ceil(kb_chunk).max(1);
    QgemvPlan { blocks_n, splits, kb_chunk }
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

    #[test]
    fn the_plan_covers_k_in_whole_blocks_and_fills_two_waves() {
        for ty in GgmlType::QUANTIZED {
            let bs = ty.block_size();
            for (n, k, batch) in [(4096, 4096, 1), (11008, 4096, 1), (4096, 11008, 1), (7, 32 * bs, 1), (13, 0, 2)] {
                let p = qgemv_plan(ty, n, k, batch);
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
            // N = 4096 gives 256 blocks, just under two waves of 132: at most one more split.
            assert!(qgemv_plan(ty, 4096, 4096, 1).splits <= 2, "{ty}");
            // N = 11008 gives 688 blocks: no split.
            assert_eq!(qgemv_plan(ty, 11008, 4096, 1).splits, 1, "{ty}");
            // Few columns and a long K: split until two waves or the minimum piece.
            let p = qgemv_plan(ty, 64, 65536, 1);
            assert!(p.splits > 1, "{ty} {p:?}");
            assert!(p.blocks_n * p.splits >= 2 * 132 || p.kb_chunk * (bs / RUN) <= 4 * 32 + bs / RUN, "{ty} {p:?}");
        }
    }
}
