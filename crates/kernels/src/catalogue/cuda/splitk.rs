//! Split-K for the CUDA tensor-core matmuls (`matmul_<storage>_<compute>_<ta><tb>` in
//! `shaders/cuda/matmul_mma.cu`): shapes whose 128 × 128 tiles give under one wave of blocks
//! (512 × 512 outputs are 16 blocks on 132 SMs) split K across blocks. Each split multiplies its
//! K range into its own plane of an f32 workspace `[splits][batch][M][ld]` (`ld` = N rounded up
//! to 4), and `matmul_splitk_reduce_<storage>` sums the planes in split order (the same order on
//! every run: no atomics) and applies the fused epilogue once.

use super::{Kernel, MATMUL_TILE_M, MATMUL_TILE_N, MatmulParams, Module, k};
use crate::DType;

/// Streaming multiprocessors a split plan fills: an H100/H200 SXM has 132.
pub const SPLITK_TARGET_SMS: usize = 132;
/// The fewest K elements a split gets: 16 of the pipelines' 16-deep slices, so its prologue
/// and the partial sums' round trip stay small next to its multiply.
pub const SPLITK_MIN_CHUNK: usize = 256;
/// The most splits: the workspace traffic (4 bytes per output per split, written and read
/// once) grows with them.
pub const SPLITK_MAX_SPLITS: usize = 16;
/// K per split is a multiple of this: twice the pipelines' slice depth (the slice depth of the
/// register-staged kernels there were; kept, so plans are unchanged), which also keeps every
/// split's operand starts 16-byte aligned.
pub const SPLITK_CHUNK_UNIT: usize = 32;

/// The tensor-core kernels' parameter block (`SplitKParams` in `matmul_mma.cu`): the matmul's,
/// then the workspace. With `splits` 1 the kernel applies the epilogue itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SplitKParams {
    /// The matmul's parameters.
    pub mm: MatmulParams,
    /// Device address of the f32 workspace when `splits > 1`, else 0.
    pub ws: u64,
    /// K splits: the grid's z is `batch · splits`.
    pub splits: i32,
    /// K per split (a multiple of [`SPLITK_CHUNK_UNIT`]); K itself when `splits` is 1.
    pub k_chunk: i32,
}

/// How a tensor-core launch covers K: `splits` ranges of `k_chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitKPlan {
    /// Blocks along K (1: no split, no workspace).
    pub splits: usize,
    /// K per split.
    pub k_chunk: usize,
}

impl SplitKPlan {
    /// Elements of the f32 workspace for `batch` products of `m × n` (`None` on overflow or
    /// without a split).
    pub fn workspace_len(&self, batch: usize, m: usize, n: usize) -> Option<usize> {
        if self.splits <= 1 {
            return None;
        }
        self.splits.checked_mul(batch)?.checked_mul(m)?.checked_mul(workspace_ld(n))
    }
}

/// Row stride of the workspace: `n` rounded up to 4 (16-byte rows).
pub const fn workspace_ld(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// The split for `batch` products of `m × n × k` on the 128 × 128 tiles: none when the tiles
/// alone make a wave on [`SPLITK_TARGET_SMS`]; otherwise enough splits to fill one, at most
/// [`SPLITK_MAX_SPLITS`] and none under [`SPLITK_MIN_CHUNK`] deep.
pub fn splitk_plan(m: usize, n: usize, k: usize, batch: usize) -> SplitKPlan {
    let none = SplitKPlan { splits: 1, k_chunk: k };
    let blocks = m.div_ceil(MATMUL_TILE_M).saturating_mul(n.div_ceil(MATMUL_TILE_N)).saturating_mul(batch);
    if blocks == 0 || blocks >= SPLITK_TARGET_SMS {
        return none;
    }
    let want = SPLITK_TARGET_SMS.div_ceil(blocks);
    let splits = want.min(SPLITK_MAX_SPLITS).min(k / SPLITK_MIN_CHUNK);
    if splits <= 1 {
        return none;
    }
    let k_chunk = k.div_ceil(splits).div_ceil(SPLITK_CHUNK_UNIT) * SPLITK_CHUNK_UNIT;
    SplitKPlan { splits: k.div_ceil(k_chunk), k_chunk }
}

/// The split-K reduction and epilogue of `dtype` (4 outputs per thread step).
pub fn splitk_reduce_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => k(Module::MatmulMma, "matmul_splitk_reduce_f32"),
        DType::F16 => k(Module::MatmulMma, "matmul_splitk_reduce_f16"),
        DType::Bf16 => k(Module::MatmulMma, "matmul_splitk_reduce_bf16"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ptx_param_size;
    use super::*;

    #[test]
    fn the_reduction_takes_the_split_block() {
        assert_eq!(size_of::<SplitKParams>(), size_of::<MatmulParams>() + 16);
        for dt in DType::ALL {
            assert_eq!(ptx_param_size(splitk_reduce_kernel(dt)), Some(size_of::<SplitKParams>()));
        }
    }

    #[test]
    fn under_one_wave_k_is_split() {
        // 512 × 512 × 4096: 16 blocks; 9 splits of 480 make 144 blocks, over one wave of 132.
        let p = splitk_plan(512, 512, 4096, 1);
        assert_eq!(p, SplitKPlan { splits: 9, k_chunk: 480 });
        assert_eq!(p.workspace_len(1, 512, 512), Some(9 * 512 * 512));
        // One block, deep K: the most splits.
        assert_eq!(splitk_plan(100, 100, 1 << 16, 1).splits, SPLITK_MAX_SPLITS);
        // A full wave already, or too little K to share: no split.
        assert_eq!(splitk_plan(4096, 4096, 4096, 1), SplitKPlan { splits: 1, k_chunk: 4096 });
        assert_eq!(splitk_plan(1536, 1408, 8192, 1).splits, 1);
        assert_eq!(splitk_plan(512, 512, 4096, 9).splits, 1);
        assert_eq!(splitk_plan(512, 512, 511, 1).splits, 1);
        assert_eq!(splitk_plan(512, 512, 0, 1).splits, 1);
        assert_eq!(splitk_plan(0, 512, 4096, 1).splits, 1);
        assert_eq!(splitk_plan(512, 512, 0, 1).workspace_len(1, 512, 512), None);
    }

    /// A host model of the kernels' workspace indices (`splitk_park_slab` and `splitk_reduce`
    /// in `matmul_mma.cu`, transliterated): every element the reduction reads was written by a
    /// split, and every write lands inside the workspace. The workspace is not cleared, so a
    /// read of an unwritten element would be a silent wrong result on the GPU.
    #[test]
    fn the_reduction_reads_only_what_the_splits_wrote() {
        for &(batch, m, n, k) in &[
            (1usize, 512usize, 512usize, 4096usize),
            (1, 129, 131, 1031),
            (3, 70, 90, 1100),
            (2, 67, 45, 600),
            (1, 1, 1, 600),
        ] {
            let p = splitk_plan(m, n, k, batch);
            assert!(p.splits > 1, "{batch}×{m}×{n}×{k}: {p:?}");
            let ld = workspace_ld(n);
            let len = p.workspace_len(batch, m, n).expect("a workspace");
            let mut written = vec![false; len];
            let (gx, gy) = (n.div_ceil(MATMUL_TILE_N), m.div_ceil(MATMUL_TILE_M));
            // The split kernel: grid (gx, gy, batch · splits), two 64-row halves of 64 × 128
            // slab elements, four columns per element.
            for z in 0..batch * p.splits {
                let (split, bt) = (z % p.splits, z / p.splits);
                // Every split has K left to multiply.
                assert!(split * p.k_chunk < k);
                let plane = (split * batch + bt) * m * ld;
                for (ty, tx) in (0..gy).flat_map(|y| (0..gx).map(move |x| (y, x))) {
                    for h in 0..2 {
                        for e in 0..64 * 128 / 4 {
                            let (lr, c4) = (e / 32, (e % 32) * 4);
                            let (row, col) = (ty * 128 + h * 64 + lr, tx * 128 + c4);
                            if row >= m || col >= n {
                                continue;
                            }
                            for j in 0..4 {
                                written[plane + row * ld + col + j] = true;
                            }
                        }
                    }
                }
            }
            // The reduction: 4 outputs per thread step over batch · M rows of ld / 4 steps.
            let per_row = ld / 4;
            let plane = batch * m * ld;
            for e in 0..batch * m * per_row {
                let (r, col) = (e / per_row, (e % per_row) * 4);
                if col >= n {
                    continue;
                }
                for s in 0..p.splits {
                    for j in 0..4 {
                        assert!(
                            written[s * plane + r * ld + col + j],
                            "{batch}×{m}×{n}×{k}: split {s}, row {r}, col {col}"
                        );
                    }
                }
            }
        }
    }

    /// Every plan covers K exactly once with chunks of whole 32-deep units, never leaves an
    /// empty split, respects the limits and never asks for more blocks than it needs.
    #[test]
    fn every_plan_covers_k() {
        let sizes = [1, 7, 31, 32, 33, 127, 128, 129, 255, 256, 257, 500, 512, 1000, 1024, 3000, 4096, 12288, 65536];
        for &m in &[1usize, 17, 128, 300, 512, 1024, 2000] {
            for &n in &[1usize, 5, 128, 384, 512, 1100] {
                for &k in &sizes {
                    for batch in [1usize, 2, 3] {
                        let p = splitk_plan(m, n, k, batch);
                        if p.splits == 1 {
                            assert_eq!(p.k_chunk, k);
                            continue;
                        }
                        assert!(p.splits <= SPLITK_MAX_SPLITS, "{m}×{n}×{k}: {p:?}");
                        assert!(p.k_chunk.is_multiple_of(SPLITK_CHUNK_UNIT), "{m}×{n}×{k}: {p:?}");
                        assert!(p.k_chunk >= SPLITK_MIN_CHUNK, "{m}×{n}×{k}: {p:?}");
                        assert!(p.splits * p.k_chunk >= k && (p.splits - 1) * p.k_chunk < k, "{m}×{n}×{k}: {p:?}");
                        let blocks = m.div_ceil(128) * n.div_ceil(128) * batch;
                        assert!(blocks < SPLITK_TARGET_SMS, "{m}×{n}×{k}×{batch}: {p:?}");
                        // Grid z and the reduction's 32-bit indices.
                        assert!(batch * p.splits <= super::super::MAX_GRID_Z);
                        assert!(p.workspace_len(batch, m, n).is_some_and(|l| l < 1 << 31));
                    }
                }
            }
        }
    }
}
