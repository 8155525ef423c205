//! Cooperative matrices: whether the device is asked for `EXPERIMENTAL_COOPERATIVE_MATRIX`,
//! what the adapter reports about it ([`CoopDevice`]), and the matmul's choice of the
//! cooperative kernel (`catalogue::wgsl::coopmat::choose`, a pure function of that report).
//!
//! The feature is experimental in wgpu 30: requesting it takes
//! `wgpu::ExperimentalFeatures::enabled()`, an `unsafe` acknowledgement that wgpu's
//! implementation may have bugs with undefined behaviour. tilekit does not give that
//! acknowledgement on a caller's behalf: a device made by tilekit requests the feature only
//! with [`WgpuOptions::with_experimental_cooperative_matrix`] (itself `unsafe`) and where the
//! adapter has it. An engine's device (`Device::from_wgpu`) is used with cooperative matrices
//! only if the engine enabled the feature, and only where the configurations are known without
//! the adapter: on Metal, where wgpu-hal's list is fixed (8 × 8 × 8 f16 → f32 among them);
//! a Vulkan device's list lives on its adapter, which a `wgpu::Device` does not expose.

use super::*;
use tilekit_kernels::catalogue::wgsl::coopmat::{CoopConfig, CoopDevice, CoopScalar};

/// Whether a device made for `opts` on `adapter` requests the feature.
pub(super) fn wanted(adapter: &wgpu::Adapter, opts: &WgpuOptions) -> bool {
    opts.experimental_cooperative_matrix && adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
}

/// wgpu's configurations as the catalogue's plain data.
pub(super) fn configs(props: &[wgpu::CooperativeMatrixProperties]) -> Vec<CoopConfig> {
    let scalar = |t: wgpu::CooperativeScalarType| match t {
        wgpu::CooperativeScalarType::F16 => CoopScalar::F16,
        wgpu::CooperativeScalarType::F32 => CoopScalar::F32,
        _ => CoopScalar::Other,
    };
    props
        .iter()
        .map(|p| CoopConfig { m: p.m_size, n: p.n_size, k: p.k_size, ab: scalar(p.ab_type), cr: scalar(p.cr_type) })
        .collect()
}

/// The configurations of an engine's device, where they follow from the device alone (see the
/// module documentation): Metal's fixed list with the feature on, else none.
pub(super) fn engine_configs(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Vec<CoopConfig> {
    let on = device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
    if !on || info.backend != wgpu::Backend::Metal {
        return Vec::new();
    }
    let c = |ab, cr| CoopConfig { m: 8, n: 8, k: 8, ab, cr };
    vec![c(CoopScalar::F32, CoopScalar::F32), c(CoopScalar::F16, CoopScalar::F16), c(CoopScalar::F16, CoopScalar::F32)]
}

/// What the cooperative kernel needs to know about `device`.
pub(super) fn coop_device(
    device: &wgpu::Device,
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
    native_f16: bool,
    subgroups: bool,
    configs: Vec<CoopConfig>,
) -> CoopDevice {
    CoopDevice {
        enabled: device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        configs,
        native_f16,
        subgroups,
        subgroup_size: (info.subgroup_min_size == info.subgroup_max_size).then_some(info.subgroup_min_size),
        max_invocations: limits.max_compute_invocations_per_workgroup.min(limits.max_compute_workgroup_size_x),
        max_workgroup_bytes: limits.max_compute_workgroup_storage_size,
    }
}

impl WgpuBackend {
    /// The cooperative kernel and its spec for this product, where the device runs it and the
    /// product fits its rule (`coopmat::choose`); `None` means the usual kernels.
    pub(super) fn coop_choice(&self, desc: &MatmulDesc, storage: ElementStorage) -> Option<(Kernel, Spec)> {
        cat::coopmat::choose(desc, storage, &self.coop)
    }

    /// The tile size the cooperative kernel runs with on this device, if any (for the
    /// description and the tests).
    pub(crate) fn coop_size(&self) -> Option<cat::CoopSize> {
        self.coop.size()
    }
}
