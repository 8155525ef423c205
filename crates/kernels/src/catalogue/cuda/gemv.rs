//! The CUDA GEMV / skinny-GEMM kernels (`shaders/cuda/gemv.cu`, module [`Module::Gemv`]):
//! products with at most [`GEMV_MAX_M_KN`] rows with B stored `[K, N]`, [`GEMV_MAX_M`] with B
//! stored `[N, K]`, and the launch plan that splits K across blocks so that the grid fills whole
//! waves of the kernel's resident blocks.

use super::{Kernel, MatmulParams, Module, THREADS, k};
use crate::{DType, Precision};

/// Largest M the GEMV kernels take with B stored `[N, K]` (register tiles of 4 or 16 rows).
pub const GEMV_MAX_M: usize = 16;
/// Largest M the GEMV kernels take with B stored `[K, N]` (the shared-memory ring's 32-row tile).
pub const GEMV_MAX_M_KN: usize = 32;
/// Warp steps a split of K holds at least (unless K is shorter).
pub const GEMV_MIN_SPLIT_STEPS: usize = 4;
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

/// The plan for `batch` products of `n` columns and depth `k` on a GPU that holds `slots`
/// blocks of the kernel at once (SMs × resident blocks per SM): K is split as
/// [`wave_chunk`] says, in whole warp steps.
pub fn gemv_plan(dtype: DType, trans_b: bool, n: usize, k: usize, batch: usize, slots: usize) -> GemvPlan {
    let blocks_n = n.div_ceil(cols_per_block(dtype, trans_b)).max(1);
    let step = if trans_b { 32 * vec_elems(dtype) } else { 8 };
    let steps = k.div_ceil(step).max(1);
    let chunk = wave_chunk(blocks_n * batch.max(1), steps, GEMV_MIN_SPLIT_STEPS, slots);
    GemvPlan { blocks_n, splits: steps.div_ceil(chunk), k_chunk: chunk * step }
}

/// Steps of K per split for `units` blocks along the columns and batches, `steps` steps of K,
/// pieces of at least `min_steps` (unless K is shorter) and `slots` blocks resident at once.
///
/// A decode launch streams its weights once; a block's time is about its piece of K plus a
/// fixed cost (its prologue, filling its pipeline, storing its sums — counted as `min_steps`
/// steps), and blocks run in waves of `slots`. So the plan takes the split count whose
/// waves × (steps per split + `min_steps`) is least — a grid of whole waves, and no deeper
/// split than pays for its blocks' fixed cost — and of equals the fewest splits (each split
/// adds a plane of partial sums to write and add). Before, K was split until the blocks made
/// two waves of 132 whatever the kernel's residency: with the ring's two blocks per SM that
/// made 288 blocks (f32, N = 4096) for 264 places, a second wave of 24.
pub fn wave_chunk(units: usize, steps: usize, min_steps: usize, slots: usize) -> usize {
    let (units, steps, slots) = (units.max(1), steps.max(1), slots.max(1));
    let most = steps.div_ceil(min_steps.max(1)).max(1);
    let mut best = (usize::MAX, steps);
    for s in 1..=most {
        let waves = (units * s).div_ceil(slots);
        // Waves only grow with `s` and a chunk is at least one step: no larger split can
        // beat the best so far (the loop stays short however long K is).
        if waves * (1 + min_steps) >= best.0 {
            break;
        }
        let chunk = steps.div_ceil(s);
        // Splits this chunk makes (a larger `s` can round to the same chunk).
        let splits = steps.div_ceil(chunk);
        if splits != s {
            continue;
        }
        let cost = waves * (chunk + min_steps);
        if cost < best.0 {
            best = (cost, chunk);
        }
    }
    best.1
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
    use super::super::source_define as define;
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

    const SRC: &str = include_str!("../../../../../shaders/cuda/gemv.cu");

    /// The shared-memory ring's plan (`gemv_kn_smem`), transliterated: which thread queues each
    /// 16-byte vector of B and each element of op(A) in a stage, which warp multiplies each
    /// (row of the tile, row of the stage) pair, and which warps park each tile row.
    struct RingPlan {
        kc: usize,
        warps: usize,
        mt: usize,
        v: usize,
        /// Warp groups (each a share of the tile's rows) and warps per group.
        g: usize,
        w: usize,
    }

    impl RingPlan {
        fn kernel(mt: usize, v: usize) -> Self {
            let (kc, warps) = (define(SRC, "GS_KC"), define(SRC, "GV_WARPS"));
            let g = mt * v / 64;
            RingPlan { kc, warps, mt, v, g, w: warps / g }
        }

        /// Every vector of the stage's B tile (`kc` rows × 32 vectors) and every element of
        /// its op(A) tile (`kc × mt`, both mappings) queued exactly once; every (tile row,
        /// stage row) product taken by exactly one warp; every tile row parked by `w` warps of
        /// one group, the first of them storing.
        fn check(&self) -> Result<(), String> {
            let threads = self.warps * 32;
            let (mr, rpw) = (self.mt / self.g, self.kc / self.w);
            if self.g * mr != self.mt || self.g * self.w != self.warps || self.w * rpw != self.kc || mr % 4 != 0 {
                return Err(format!("{} rows in {} groups of {} warps do not tile", self.mt, self.g, self.w));
            }
            if mr * self.v > 64 {
                return Err(format!("{} accumulators a lane", mr * self.v));
            }
            let once = |what: &str, cells: &mut dyn Iterator<Item = (usize, usize)>, rows: usize, cols: usize| {
                let mut seen = vec![0u32; rows * cols];
                for (r, c) in cells {
                    if r >= rows || c >= cols {
                        return Err(format!("{what}: ({r}, {c}) is outside the {rows} x {cols} tile"));
                    }
                    seen[r * cols + c] += 1;
                }
                match seen.iter().position(|&n| n != 1) {
                    Some(i) => Err(format!("{what}: cell {i} taken {} times", seen[i])),
                    None => Ok(()),
                }
            };
            // B: `v = tid + i·threads`, row `v >> 5`, vector `v & 31`.
            let bvecs = self.kc * 32 / threads;
            once(
                "B",
                &mut (0..threads).flat_map(|t| (0..bvecs).map(move |i| t + i * threads)).map(|v| (v >> 5, v & 31)),
                self.kc,
                32,
            )?;
            // op(A): `e = tid + i·threads`; stored A^T walks M first, A walks K first.
            let ae = self.kc * self.mt / threads;
            let elems = || (0..threads).flat_map(move |t| (0..ae).map(move |i| t + i * threads));
            once("A^T", &mut elems().map(|e| (e / self.mt, e % self.mt)), self.kc, self.mt)?;
            once("A", &mut elems().map(|e| (e % self.kc, e / self.kc)), self.kc, self.mt)?;
            // The FMAs: warp (group, wi) takes tile rows group·mr.. and stage rows wi + i·w.
            let products = (0..self.warps).flat_map(|warp| {
                let (grp, wi) = (warp / self.w, warp % self.w);
                (0..rpw).flat_map(move |i| (0..mr).map(move |m| (grp * mr + m, wi + i * self.w)))
            });
            once("FMA", &mut products.collect::<Vec<_>>().into_iter(), self.mt, self.kc)?;
            // The meeting: each tile row parked once per warp of its group, first by wi = 0.
            let parks =
                (0..self.w).flat_map(|wi| (0..self.g).flat_map(move |grp| (0..mr).map(move |m| (grp * mr + m, wi))));
            once("park", &mut parks.collect::<Vec<_>>().into_iter(), self.mt, self.w)
        }
    }

    /// The ring's plan as the kernel source states it, for both tiles and both vector widths.
    #[test]
    fn the_ring_takes_every_product_once() {
        assert_eq!((define(SRC, "GS_KC"), define(SRC, "GS_STAGES"), define(SRC, "GV_WARPS")), (16, 4, 8));
        for anchor in [
            "constexpr int G = MT * V / 64, MR = MT / G, W = GV_WARPS / G, RPW = GS_KC / W;",
            "const int v = tid + i * GV_WARPS * 32, r = v >> 5, c = (v & 31) * V;",
            "const int e = tid + i * GV_WARPS * 32;",
            "r = e / MT;\n            m = e % MT;",
            "r = e % GS_KC;\n            m = e / GS_KC;",
            "const int r = wi + i * W;",
            "gv_park<MR, V, BCOLS>(sm.red, acc, grp * MR, p.m, lane, w == 0);",
            // The schedule: stage s waited for with GS_STAGES - 2 groups pending (one commit
            // group a stage, GS_STAGES - 1 queued ahead), the refill of the slot read at s - 1
            // queued after the barrier, op(A)'s stores after this stage's FMAs.
            "cp_async_wait<GS_STAGES - 2>();\n        __syncthreads();\n        const int next = s + GS_STAGES - 1;",
            "if (next < stages) store_a(next, an);",
        ] {
            assert!(SRC.contains(anchor), "gemv_kn_smem no longer reads {anchor:?}");
        }
        for (mt, v) in [(16, 4), (32, 4), (16, 8), (32, 8)] {
            RingPlan::kernel(mt, v).check().unwrap_or_else(|e| panic!("MT = {mt}, V = {v}: {e}"));
        }
        // The shared memory the PTX declares for each instance: the ring (512 bytes of B and
        // MT f32 of op(A) a stage row), which the meeting buffer (MT × 32 vectors of f32 sums)
        // reuses.
        let ptx = Module::Gemv.ptx();
        let decls: Vec<&str> = ptx.lines().filter(|l| l.contains("gemv_kn_smem") && l.contains(".shared")).collect();
        assert_eq!(decls.len(), 10, "five storage policies × two tiles");
        for d in decls {
            let (mt, v) = (if d.contains("Li32E") { 32 } else { 16 }, if d.contains("IfLb") { 4 } else { 8 });
            let ring = define(SRC, "GS_STAGES") * define(SRC, "GS_KC") * (512 + mt * 4);
            assert!(mt * 32 * v * 4 <= ring, "{d}");
            assert!(d.ends_with(&format!("sm[{ring}];")), "{d}");
        }
    }

    /// The checker rejects broken plans: too many accumulators, groups that do not tile the rows,
    /// a stage split that leaves rows out, a stage whose op(A) the threads do not cover.
    #[test]
    fn the_ring_checker_rejects_broken_plans() {
        assert!(RingPlan::kernel(32, 8).check().is_ok());
        assert!(RingPlan { g: 1, w: 8, ..RingPlan::kernel(32, 8) }.check().is_err());
        assert!(RingPlan { g: 2, w: 2, ..RingPlan::kernel(16, 8) }.check().is_err());
        assert!(RingPlan { kc: 12, ..RingPlan::kernel(16, 4) }.check().is_err());
        // 24 rows a stage tile the warps, but 384 elements of op(A) over 256 threads leave
        // half of them unloaded.
        let e = RingPlan { kc: 24, ..RingPlan::kernel(16, 4) }.check().expect_err("A is half loaded");
        assert!(e.starts_with("A^T: cell"), "{e}");
    }

    #[test]
    fn the_plan_fills_whole_waves_and_covers_k() {
        // The ring (B [K, N], f32, N = 4096: 32 blocks of 128 columns) at 2 blocks on each of
        // 132 SMs: 8 splits make 256 blocks, one wave (9 made 288, a second wave of 24).
        let p = gemv_plan(DType::F32, false, 4096, 4096, 1, 264);
        assert_eq!((p.blocks_n, p.splits, p.k_chunk), (32, 8, 512));
        // bf16: 16 blocks of 256 columns, 16 splits fill 256 of the 264 places.
        let p = gemv_plan(DType::Bf16, false, 4096, 4096, 1, 264);
        assert_eq!((p.blocks_n, p.splits), (16, 16));
        // B [N, K], f32, N = 4096: 256 blocks of 16 columns; at 8 blocks an SM, 4 splits fill
        // 1024 of 1056 places; at 2 an SM the columns alone already fill a wave.
        assert_eq!(gemv_plan(DType::F32, true, 4096, 4096, 1, 1056).splits, 4);
        assert_eq!(gemv_plan(DType::F32, true, 4096, 4096, 1, 264).splits, 1);
        // Columns past a wave: the split that rounds the grid to whole waves (688 blocks in
        // 1056 places: three splits make 2064 blocks, two waves of a third of K each).
        assert_eq!(gemv_plan(DType::F32, true, 11008, 4096, 1, 1056).splits, 3);
        // No split where K is one piece of 4 warp steps or less, or the columns fill the waves.
        assert_eq!(gemv_plan(DType::F32, false, 64, 3, 1, 264).splits, 1);
        assert_eq!(gemv_plan(DType::F32, false, 64, 24, 1, 264).splits, 1);
        assert_eq!(gemv_plan(DType::F32, false, 33792, 4096, 1, 264).splits, 1);
        for (dt, tb, n, k, b, slots) in [
            (DType::F32, true, 7, 1000, 1, 1056),
            (DType::Bf16, false, 4096, 11008, 1, 264),
            (DType::F16, true, 13, 1, 3, 8),
            (DType::F32, false, 100, 4097, 2, 1),
            (DType::F16, false, 4096, 4096, 1, 0),
        ] {
            let p = gemv_plan(dt, tb, n, k, b, slots);
            let step = if tb { 32 * vec_elems(dt) } else { 8 };
            assert!(p.k_chunk.is_multiple_of(step) && p.k_chunk > 0, "{p:?}");
            // Every K in exactly one split, none empty, none under 4 steps unless K is.
            assert!(p.splits * p.k_chunk >= k && (p.splits - 1) * p.k_chunk < k.max(1), "{p:?}");
            assert!(p.splits == 1 || p.k_chunk >= GEMV_MIN_SPLIT_STEPS * step, "{p:?}");
        }
    }

    #[test]
    fn wave_chunk_takes_the_least_waves_times_steps() {
        // Against every split count: waves × (steps per split + the minimum piece) is least,
        // and of equals the fewest splits.
        for (units, steps, min, slots) in [
            (32usize, 512usize, 4usize, 264usize),
            (16, 512, 4, 264),
            (256, 128, 4, 1056),
            (688, 128, 4, 1056),
            (3, 1, 4, 8),
            (5, 97, 1, 7),
            (32, 1 << 18, 4, 264),
        ] {
            let cost = |chunk: usize| (units * steps.div_ceil(chunk)).div_ceil(slots) * (chunk + min);
            let got = wave_chunk(units, steps, min, slots);
            let splits = steps.div_ceil(got);
            for s in 1..=steps.div_ceil(min) {
                let chunk = steps.div_ceil(s);
                assert!(cost(got) <= cost(chunk), "{units} {steps} {slots}: {got} against {chunk}");
                assert!(cost(got) < cost(chunk) || steps.div_ceil(chunk) >= splits, "{units} {steps} {slots}");
            }
        }
    }
}
