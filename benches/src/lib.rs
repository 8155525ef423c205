//! Shared pieces of tilekit's criterion benches (`benches/ops.rs`): the devices to bench on,
//! deterministic inputs, and the correctness check every bench runs before it is timed.
//!
//! The crate also compiles the README's code example as a doc test, so the example there
//! cannot drift from the API.

use tilekit::{DType, Device, WgpuOptions};

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

/// Compares a kernel's output with the f64 reference: every element within `tol` times the
/// reference's magnitude scale (`1 + |want|`). A loose check on purpose — the test suite holds
/// the exact tolerance rule; this only keeps a broken kernel from being timed.
pub fn matches(got: &[f32], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        // NaN fails: the comparison is false.
        let within = err <= tol * (1.0 + w.abs());
        if !within {
            return Err(format!("output {i}: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// The check tolerance for outputs stored in `dtype` (a few units in the last place of the
/// storage, plus f32 accumulation over a few hundred terms).
pub fn tolerance(dtype: DType) -> f64 {
    4.0 * dtype.unit_roundoff() + 1e-5
}

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
