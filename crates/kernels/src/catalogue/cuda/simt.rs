//! The SIMT f32 matmul (`matmul_f32` in `shaders/cuda/matmul_simt.cu`): its tile, its
//! shared-memory ring and the dynamic shared memory a launch must ask for.
//!
//! A block owns a 128 × 128 output tile (256 threads, 8 × 8 outputs each) and walks K in
//! 16-deep slices through a 3-stage ring of K-major shared tiles `[16][128 + 4]` of op(A) and
//! op(B). The ring (49.5 KiB) is over the 48 KiB a kernel may declare statically, so it is
//! dynamic shared memory: the launch passes [`SMEM_BYTES`] and, once per function, raises the
//! function's `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to it
//! ([`super::Kernel::dynamic_smem_bytes`]).
//!
//! The tests (`simt/tests.rs`) read the `SG_*` constants from the kernel source and replay the
//! kernel's loaders, stage ring, shared-memory banks and block swizzle on the host.

use super::{Kernel, Module, k};

/// The kernel.
pub const MATMUL_F32: Kernel = k(Module::MatmulSimt, "matmul_f32");
/// Output rows of a block (`SG_BM`).
pub const BM: usize = 128;
/// Output columns of a block (`SG_BN`).
pub const BN: usize = 128;
/// Depth of a K slice (`SG_BK`).
pub const BK: usize = 16;
/// Floats of padding per shared row (`SG_PAD`): keeps rows 16-byte aligned and shifts
/// consecutive K rows by 4 banks, which makes the transposing stores conflict-free.
pub const PAD: usize = 4;
/// Stages of the shared-memory ring (`SG_STAGES`): two slices in flight while one is
/// multiplied.
pub const STAGES: usize = 3;
/// Threads per block (`SG_THREADS`).
pub const THREADS: usize = 256;
/// Rows × stride of the epilogue's accumulator slab (`EPI_ROWS`, `EPI_STRIDE` in
/// `common.cuh`), which reuses the ring's memory.
const EPI_FLOATS: usize = 64 * (128 + 4);

/// Bytes of the ring: both operands' stages.
pub const RING_BYTES: usize = STAGES * BK * ((BM + PAD) + (BN + PAD)) * 4;

/// The dynamic shared memory of a `matmul_f32` launch (`SG_SMEM_BYTES`): the ring, or the
/// epilogue's slab if that were larger.
pub const SMEM_BYTES: u32 = {
    let slab = EPI_FLOATS * 4;
    (if RING_BYTES > slab { RING_BYTES } else { slab }) as u32
};

/// Shared memory a kernel may use without raising its dynamic limit (48 KiB).
pub const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

// The ring is over the static limit (hence dynamic shared memory), and two blocks (plus the
// 1 KiB the driver reserves for each) fit in sm_80's 164 KiB and sm_90's 228 KiB per SM.
// (sm_86 and sm_89 have 100 KiB per SM: one block there.)
const _: () = assert!(SMEM_BYTES > DEFAULT_SMEM_LIMIT);
const _: () = assert!(2 * (SMEM_BYTES + 1024) <= 164 * 1024);

#[cfg(test)]
mod tests;
