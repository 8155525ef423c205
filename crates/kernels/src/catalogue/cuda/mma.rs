//! The tensor-core matmuls (`matmul_<storage>_<compute>_<ta><tb>` in
//! `shaders/cuda/matmul_mma.cu`): the geometry of their 16-bit `cp.async` pipeline.
//!
//! A block owns a 128 × 128 output tile (256 threads as 2 × 4 warps of 64 × 32) and walks K in
//! 16-deep slices through a ring of shared tiles filled by `cp.async`, one per operand and
//! stage, each keeping the operand's own contiguous dimension contiguous.
//! - 16-bit storage (`matmul_f16_f16_*`, `matmul_bf16_bf16_*`, `matmul_f16_bf16_*`): 4 stages of
//!   128 rows × (16 + 8) elements when K is contiguous (fragments read with `ldmatrix`), 16 rows
//!   × (128 + 8) otherwise (`ldmatrix.trans`), 48 KiB of static shared memory.
//!   `matmul_f16_bf16_*` keeps the stored f16 and rounds each fragment register to bf16.
//! - f32 storage (`matmul_f32_bf16_*`): 3 stages of raw f32, 128 rows × (16 + 8) floats or 16
//!   rows × (128 + 4), in 72 KiB of dynamic shared memory ([`F32_SMEM_BYTES`]); each fragment
//!   register is read in the m16n8k16 layout with one 64-bit load (K contiguous) or two 32-bit
//!   loads, and rounded to bf16x2.
//!
//! The tests (`mma/tests.rs`) read the `TC_*` constants and the conversions from the kernel
//! source and replay the loaders, rings, fragment reads (with the rounding) and shared-memory
//! banks on the host.

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

/// Stages of the f32 ring (`TC_STAGES32`): two slices in flight while one is multiplied.
pub const F32_STAGES: usize = 3;
/// Floats of padding per row of a K-contiguous f32 tile (`TC_PAD32_KC`): a 96-byte stride puts
/// the 64-bit fragment reads of each half-warp (rows g = 0..3, K pairs t = 0..3) on 16
/// distinct bank pairs (24 ≡ 8 mod 32 words: rows 8 banks apart).
pub const F32_PAD_KC: usize = 8;
/// Floats of padding per row of an M/N-contiguous f32 tile (`TC_PAD32_MN`): a 528-byte stride
/// puts the 32-bit reads of a warp (columns g = 0..7, K rows 2t or 2t + 1) on 32 distinct
/// banks (two rows are 264 ≡ 8 mod 32 words apart).
pub const F32_PAD_MN: usize = 4;

/// Floats per row of an f32 tile: `kc` when K is the contiguous dimension.
pub const fn f32_stride(kc: bool) -> usize {
    if kc { BKP + F32_PAD_KC } else { BM + F32_PAD_MN }
}

/// Floats of one operand's f32 stage: the larger of the two shapes (`TC_TILE32`).
pub const F32_TILE: usize = {
    let a = BM * f32_stride(true);
    let b = BKP * f32_stride(false);
    if a > b { a } else { b }
};

/// The dynamic shared memory of a `matmul_f32_bf16_*` launch (`TC_SMEM32_BYTES`): the f32 ring.
pub const F32_SMEM_BYTES: u32 = (F32_STAGES * 2 * F32_TILE * 4) as u32;

/// Entry points that take [`F32_SMEM_BYTES`] of dynamic shared memory.
pub const F32_ENTRY_PREFIX: &str = "matmul_f32_bf16_";

// Over the static limit (hence dynamic), and two blocks (plus the driver's 1 KiB each) fit in
// sm_80's 164 KiB and sm_90's 228 KiB per SM; the epilogue's 33 KiB slab fits in it.
const _: () = assert!(F32_SMEM_BYTES > super::simt::DEFAULT_SMEM_LIMIT);
const _: () = assert!(2 * (F32_SMEM_BYTES as usize + 1024) <= 164 * 1024);
const _: () = assert!(F32_SMEM_BYTES as usize >= 64 * (128 + 4) * 4);

#[cfg(test)]
mod tests;
