//! The tensor-core matmuls (`matmul_<storage>_<compute>_<ta><tb>` in
//! `shaders/cuda/matmul_mma.cu`): the geometry of their 16-bit `cp.async` pipeline.
//!
//! A block owns a 128 × 128 output tile (256 threads as 2 × 4 warps of 64 × 32) and walks K in
//! 16-deep slices through a 4-stage ring of shared tiles, one per operand and stage, each
//! keeping the operand's own contiguous dimension contiguous: 128 rows × (16 + 8) elements when
//! K is contiguous (fragments read with `ldmatrix`), 16 rows × (128 + 8) otherwise
//! (`ldmatrix.trans`). `matmul_f16_f16_*`, `matmul_bf16_bf16_*` and `matmul_f16_bf16_*` run it;
//! the last keeps the stored f16 in shared memory and rounds each fragment register to bf16
//! before the MMAs. `matmul_f32_bf16_*` still stages 32-deep slices through registers.
//!
//! The tests (`mma/tests.rs`) read the `TC_*` constants and the conversion from the kernel
//! source and replay the pipeline's loaders, ring, fragment reads (with the rounding) and
//! shared-memory banks on the host.

/// Output rows of a block (`TC_BM`).
pub const BM: usize = 128;
/// Output columns of a block (`TC_BN`).
pub const BN: usize = 128;
/// Depth of a pipeline slice (`TC_BKP`): one `m16n8k16` step.
pub const BKP: usize = 16;
/// Stages of the ring (`TC_STAGES`): three slices in flight while one is multiplied.
pub const STAGES: usize = 4;
/// Elements of padding per shared row (`TC_PAD`): 16 bytes, which puts the 8 row addresses of
/// an `ldmatrix` on 8 distinct 16-byte bank groups (48- and 272-byte strides).
pub const PAD: usize = 8;
/// Threads per block (`TC_THREADS`).
pub const THREADS: usize = 256;

/// Elements per shared row of a tile: `kc` when K is the contiguous dimension.
pub const fn stride(kc: bool) -> usize {
    (if kc { BKP } else { BM }) + PAD
}

/// Elements of one operand's stage: the larger of the two tile shapes (`TileSize<TC_BKP>::N`).
pub const TILE: usize = {
    let a = BM * stride(true);
    let b = BKP * stride(false);
    if a > b { a } else { b }
};

/// Bytes of the ring (static shared memory): both operands' stages, 16-bit elements.
pub const RING_BYTES: usize = STAGES * 2 * TILE * 2;

// The ring is exactly the 48 KiB a kernel may declare statically, and two blocks (plus the
// 1 KiB the driver reserves for each) fit in sm_80's 164 KiB per SM.
const _: () = assert!(RING_BYTES == 48 * 1024);
const _: () = assert!(2 * (RING_BYTES + 1024) <= 164 * 1024);

#[cfg(test)]
mod tests;
