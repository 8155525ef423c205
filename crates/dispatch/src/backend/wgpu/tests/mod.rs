//! The wgpu backend's own tests, run on whatever adapter is there (lavapipe on CI) and checked
//! against `tilekit_kernels::reference`. Shapes stay small: lavapipe is ~100x slower than the
//! CPU. Without an adapter each test prints a visible skip line and passes.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::backend::Backend;
use crate::{Device, Tensor};
use std::sync::OnceLock;
use tilekit_kernels::{Activation, MatrixView, reference};

mod conv;
mod coop;
mod device;
mod elementwise;
mod f16x2;
mod gemv;
mod limits;
mod matmul;
mod quant;

use conv::*;
use elementwise::*;
use limits::*;
use matmul::*;

/// The test devices' options: any adapter, software ones too; with `packed_f16`, f16 packed in
/// `u32` and no subgroup kernels.
pub(super) fn options(packed_f16: bool) -> WgpuOptions {
    WgpuOptions {
        allow_software: true,
        adapter_name: None,
        force_packed_f16: packed_f16,
        no_subgroups: packed_f16,
        ..WgpuOptions::default()
    }
}

/// The shared test devices: native f16 and subgroups where the adapter has them, and one
/// forced to the packed f16 path and the workgroup-memory reductions.
pub(super) fn device(packed_f16: bool) -> Option<&'static Device> {
    static NATIVE: OnceLock<Option<Device>> = OnceLock::new();
    static PACKED: OnceLock<Option<Device>> = OnceLock::new();
    let cell = if packed_f16 { &PACKED } else { &NATIVE };
    cell.get_or_init(|| match Device::wgpu(&options(packed_f16)) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP wgpu backend tests: no adapter ({e})");
            None
        }
    })
    .as_ref()
}

pub(super) fn backend(dev: &Device) -> &WgpuBackend {
    match &dev.inner.backend {
        Backend::Wgpu(b) => b,
        _ => panic!("not a wgpu device"),
    }
}

/// Every (device, dtype) pair to cover: f32, f16 native, f16 packed, bf16.
pub(super) fn variants() -> Vec<(&'static Device, DType)> {
    let mut v = Vec::new();
    if let Some(d) = device(false) {
        v.push((d, DType::F32));
        v.push((d, DType::F16));
        v.push((d, DType::Bf16));
    }
    if let Some(d) = device(true) {
        v.push((d, DType::F16));
    }
    v
}

/// Deterministic values in [-1, 1) on a 2^-11 grid: exact in f32, often rounded in f16 and
/// bf16 storage (and by `Precision::Bf16`), so those roundings are exercised.
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) % 4096) as f32 / 2048.0 - 1.0
        })
        .collect()
}

pub(super) fn upload(dev: &Device, dtype: DType, data: &[f32]) -> Tensor {
    dev.tensor_from_f32(&[data.len()], dtype, data).unwrap()
}

pub(super) fn widen(t: &Tensor) -> Vec<f64> {
    t.to_f32_vec().unwrap().into_iter().map(f64::from).collect()
}

/// Compares `got` with `want`; `mag` is the reference run on absolute values (the scale of the
/// rounding errors), `terms` the number of products summed.
pub(super) fn assert_close(what: &str, dtype: DType, got: &[f32], want: &[f64], mag: &[f64], terms: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let g = f64::from(g);
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
            continue;
        }
        // The tolerance model, in the form that needs no pre-activation value (`m` bounds it)
        // and covers every activation (GELU's is the loosest; the activation is not passed).
        let tol = tilekit_kernels::tolerance::bound_from_magnitude(dtype, Activation::Gelu, terms, m, w);
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w} (tol {tol})");
    }
}
