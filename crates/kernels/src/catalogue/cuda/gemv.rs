//! The CUDA GEMV / skinny-GEMM kernels (`shaders/cuda/gemv.cu`, module [`Module::Gemv`]):
//! products with at most [`GEMV_MAX_M_KN`] rows with B stored `[K, N]`, [`GEMV_MAX_M`] with B
//! stored `[N, K]`, and the launch plan that splits K across blocks when the columns alone would
//! leave the GPU under two waves.

use super::{Kernel, MatmulParams, Module, THREADS, k};
use crate::{DType, Precision};

/// Largest M the GEMV kernels take with B stored `[N, K]` (register tiles of 4 or 16 rows).
pub const GEMV_MAX_M: usize = 16;
/// Largest M the GEMV kernels take with B stored `[K, N]` (the shared-memory ring's 32-row tile).
pub const GEMV_MAX_M_KN: usize = 32;
/// Streaming multiprocessors the split-K plan fills: an H100/H200 SXM has 132.
pub const GEMV_TARGET_SMS: usize = 132;
/// Blocks per SM the plan asks for at least (two waves of blocks).
pub const GEMV_MIN_WAVES: usize = 2;
/// Output columns per block with B stored `[N, K]`: 8 warps × 2 columns.
pub const GEMV_NK_COLS: usize = 16;
/// Threads per block.
pub const GEMV_THREADS: u32 = THREADS;

/// The split-K parameter block (`GemvParams` in `gemv.cu`): the matmul's, then the workspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemvParams {
    /// The matmul's parameters.
    pub mm: MatmulParams,
    /// Device address of the f32 workspace `[splits][batch][M][N]` when `splits > 1` (each
    /// split stores its plane, `gemv_finalize_<T>` adds them in split order), else 0.
    pub ws: u64,
    /// Blocks along K (`gridDim.y`).
    pub splits: i32,
    /// K per split.
    pub k_chunk: i32,
}

/// Elements per 16-byte vector of `dtype`.
pub const fn vec_elems(dtype: DType) -> usize {
    16 / dtype.size_bytes()
}

/// Output columns per block: 16 with B stored `[N, K]`, 32 vectors of columns (128 for f32,
/// 256 for f16/bf16) with B stored `[K, N]`.
pub const fn cols_per_block(dtype: DType, trans_b: bool) -> usize {
    if trans_b { GEMV_NK_COLS } else { 32 * vec_elems(dtype) }
}

/// How a GEMV launch covers the product: blocks along N, splits of K, K per split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvPlan {
    /// Blocks along N (`gridDim.x`).
    pub blocks_n: usize,
    /// Blocks along K (`gridDim.y`); 1 = no split, the kernel applies the epilogue itself.
    pub splits: usize,
    /// K per split: a multiple of one warp's step (32 vectors with B `[N, K]`, 8 rows with
    /// B `[K, N]`).
    pub k_chunk: usize,
}

/// The plan for `batch` products of `n` columns and depth `k`: split K until the blocks make
/// [`GEMV_MIN_WAVES`] waves on [`GEMV_TARGET_SMS`], but never into pieces under 4 warp steps.
pub fn gemv_plan(dtype: DType, trans_b: bool, n: usize, k: usize, batch: usize) -> GemvPlan {
    let blocks_n = n.div_ceil(cols_per_block(dtype, trans_b)).max(1);
    let step = if trans_b { 32 * vec_elems(dtype) } else { 8 };
    let want = (GEMV_MIN_WAVES * GEMV_TARGET_SMS).div_ceil(blocks_n * batch.max(1));
    let most = k.div_ceil(4 * step).max(1);
    let splits = want.clamp(1, most);
    let k_chunk = k.div_ceil(splits).div_ceil(step) * step;
    let splits = k.div_ceil(k_chunk.max(1)).max(1);
    GemvPlan { blocks_n, splits, k_chunk: k_chunk.max(step) }
}

/// The GEMV kernel for `m` rows: with B stored `[K, N]` up to [`GEMV_MAX_M_KN`] rows (the
/// register kernel `_kn_m4` for M ≤ 4, the shared-memory ring `_kn_s16` / `_kn_s32` above), with
/// B stored `[N, K]` up to [`GEMV_MAX_M`] (`_nk_m4`, `_nk_m16`); `None` where the tiled kernels
/// apply.
pub fn gemv_kernel(dtype: DType, precision: Precision, m: usize, trans_b: bool) -> Option<Kernel> {
    let shape = match (trans_b, m) {
        (_, 0) => return None,
        (true, 1..=4) => Shape::NkM4,
        (true, 5..=GEMV_MAX_M) => Shape::NkM16,
        (false, 1..=4) => Shape::KnM4,
        (false, 5..=16) => Shape::KnS16,
        (false, 17..=GEMV_MAX_M_KN) => Shape::KnS32,
        _ => return None,
    };
    Some(entry(dtype, precision, shape))
}

/// The register-tile GEMV `_kn_m16` that took `[K, N]` products of 5 to 16 rows before the
/// shared-memory ring (a bench reference: `Device::previous_skinny_matmul`); `None` elsewhere.
pub fn previous_gemv_kernel(dtype: DType, precision: Precision, m: usize, trans_b: bool) -> Option<Kernel> {
    (!trans_b && (5..=16).contains(&m)).then(|| entry(dtype, precision, Shape::KnM16))
}

/// The six kernels `GV_ENTRY` defines per storage policy, in its order.
#[derive(Clone, Copy)]
enum Shape {
    NkM4,
    NkM16,
    KnM4,
    KnM16,
    KnS16,
    KnS32,
}

/// `gemv_<storage>[_bf16]_<layout>_<rows>`.
fn entry(dtype: DType, precision: Precision, shape: Shape) -> Kernel {
    macro_rules! row {
        ($s:literal) => {
            [
                concat!("gemv_", $s, "_nk_m4"),
                concat!("gemv_", $s, "_nk_m16"),
                concat!("gemv_", $s, "_kn_m4"),
                concat!("gemv_", $s, "_kn_m16"),
                concat!("gemv_", $s, "_kn_s16"),
                concat!("gemv_", $s, "_kn_s32"),
            ]
        };
    }
    let names = match (dtype, precision) {
        (DType::F32, Precision::Highest | Precision::F16) => row!("f32"),
        (DType::F32, _) => row!("f32_bf16"),
        (DType::F16, Precision::Highest | Precision::F16) => row!("f16"),
        (DType::F16, _) => row!("f16_bf16"),
        (DType::Bf16, _) => row!("bf16"),
    };
    k(Module::Gemv, names[shape as usize])
}

/// The split-K epilogue kernel of `dtype` (one thread per output).
pub fn gemv_finalize_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => k(Module::Gemv, "gemv_finalize_f32"),
        DType::F16 => k(Module::Gemv, "gemv_finalize_f16"),
        DType::Bf16 => k(Module::Gemv, "gemv_finalize_bf16"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ptx_param_size;
    use super::*;

    #[test]
    fn gemv_entries_take_the_gemv_block() {
        assert_eq!(size_of::<GemvParams>(), size_of::<MatmulParams>() + 16);
        for dt in DType::ALL {
            for p in [Precision::Highest, Precision::Bf16] {
                for (m, tb, want) in [
                    (1, false, "_kn_m4"),
                    (4, false, "_kn_m4"),
                    (5, false, "_kn_s16"),
                    (16, false, "_kn_s16"),
                    (17, false, "_kn_s32"),
                    (32, false, "_kn_s32"),
                    (1, true, "_nk_m4"),
                    (4, true, "_nk_m4"),
                    (5, true, "_nk_m16"),
                    (16, true, "_nk_m16"),
                ] {
                    let kern = gemv_kernel(dt, p, m, tb).expect("a gemv kernel");
                    assert!(kern.entry.ends_with(want), "M = {m}: {}", kern.entry);
                    assert_eq!(ptx_param_size(kern), Some(size_of::<GemvParams>()), "{}", kern.entry);
                }
                for m in [5, 16] {
                    let kern = previous_gemv_kernel(dt, p, m, false).expect("the register kernel");
                    assert!(kern.entry.ends_with("_kn_m16"), "{}", kern.entry);
                    assert_eq!(ptx_param_size(kern), Some(size_of::<GemvParams>()), "{}", kern.entry);
                }
                assert_eq!(previous_gemv_kernel(dt, p, 4, false), None);
                assert_eq!(previous_gemv_kernel(dt, p, 17, false), None);
                assert_eq!(previous_gemv_kernel(dt, p, 8, true), None);
                assert_eq!(gemv_kernel(dt, p, 17, true), None);
                assert_eq!(gemv_kernel(dt, p, 33, false), None);
                assert_eq!(gemv_kernel(dt, p, 0, false), None);
            }
            assert_eq!(ptx_param_size(gemv_finalize_kernel(dt)), Some(size_of::<GemvParams>()));
        }
    }

    #[test]
    fn the_plan_fills_two_waves_and_covers_k() {
        // B [N, K], f32, N = 4096: 256 blocks, already about two waves of 132.
        let p = gemv_plan(DType::F32, true, 4096, 4096, 1);
        assert_eq!((p.blocks_n, p.splits), (256, 2));
        // B [K, N], f16, N = 4096: 16 blocks of 256 columns, K split to fill the GPU.
        let p = gemv_plan(DType::F16, false, 4096, 4096, 1);
        assert_eq!(p.blocks_n, 16);
        assert!(p.blocks_n * p.splits >= 2 * 132, "{p:?}");
        // Many columns: no split; a tiny K: no split.
        assert_eq!(gemv_plan(DType::F32, true, 11008, 4096, 1).splits, 1);
        assert_eq!(gemv_plan(DType::F32, false, 64, 3, 1).splits, 1);
        for (dt, tb, n, k, b) in
            [(DType::F32, true, 7, 1000, 1), (DType::Bf16, false, 4096, 11008, 1), (DType::F16, true, 13, 1, 3)]
        {
            let p = gemv_plan(dt, tb, n, k, b);
            assert!(p.splits * p.k_chunk >= k && (p.splits - 1) * p.k_chunk < k.max(1), "{p:?}");
        }
    }
}
