//! Shared pieces of tilekit's criterion benches (`benches/ops.rs`): the devices to bench on,
//! deterministic inputs, and the correctness check every bench runs before it is timed.
//!
//! The crate also compiles the README's code example as a doc test, so the example there
//! cannot drift from the API.

use tilekit::{Activation, DType, Device, WgpuOptions};
use tilekit_kernels::tolerance;

/// The devices the benches run on: the CPU backend always, and wgpu on whatever adapter is
/// there (lavapipe on CI). A missing wgpu adapter is reported with a printed skip line.
pub fn devices() -> Vec<Device> {
    let mut out = vec![Device::cpu()];
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(d) => out.push(d),
        Err(e) => println!("SKIP wgpu: {e}"),
    }
    out
}

/// `n` deterministic values in `[-1, 1)` (a 64-bit LCG: reproducible, no dependency).
pub fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Compares a kernel's output with the f64 reference under tilekit's tolerance model
/// ([`tilekit_kernels::tolerance`]), in the form that needs no pre-activation values:
/// `magnitude` must bound `Σ|terms|` of every output (the bench inputs are in `[-1, 1)`, so `K`
/// for a matmul, the taps plus one for a conv with bias, 2 for an activation with bias), `k` is
/// the reduction length (0 for an elementwise op).
pub fn matches(
    got: &[f32],
    want: &[f64],
    dtype: DType,
    activation: Activation,
    k: usize,
    magnitude: f64,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tolerance::bound_from_magnitude(dtype, activation, k, magnitude, w);
        if !tolerance::accepts(dtype, g, w, bound) {
            return Err(format!("output {i}: got {g}, want {w} (bound {bound:.3e})"));
        }
    }
    Ok(())
}

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
