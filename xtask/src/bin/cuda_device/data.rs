//! The inputs: deterministic small integers (exact arithmetic) and reals, and uploads.

use anyhow::Result;
use tilekit::{DType, Device, Tensor};

/// Deterministic small integers in [-2, 2] (exact in every dtype, exact partial sums).
pub fn ints(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 5) as f32 - 2.0
        })
        .collect()
}

/// Deterministic multiples of 1/8 in [-1, 1] (exact in every dtype and in bf16 products; a
/// sum of K products is a multiple of 2⁻⁶ below K in magnitude, exact in f32 for K < 2¹⁸).
pub fn eighths(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((s >> 33) % 17) as f32 - 8.0) / 8.0
        })
        .collect()
}

/// Deterministic reals in [-lim, lim].
pub fn reals(n: usize, seed: u64, lim: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * lim
        })
        .collect()
}

pub fn upload(dev: &Device, shape: &[usize], dtype: DType, data: &[f32]) -> Result<Tensor> {
    Ok(dev.tensor_from_f32(shape, dtype, data)?)
}
