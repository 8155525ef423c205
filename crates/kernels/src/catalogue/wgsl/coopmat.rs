//! The cooperative-matrix matmul (`shaders/wgsl/matmul_coopmat.wgsl`, [`Kernel::MatmulCoop`]):
//! its tile sizes, the text of its two variants and [`choose`], the pure rule that says where
//! the backends run it.
//!
//! wgpu exposes cooperative matrices as `wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`
//! (Vulkan `VK_KHR_cooperative_matrix`, Metal simdgroup matrices) and lists, per adapter, the
//! `(M, N, K, A/B type, C type)` configurations the driver runs
//! (`wgpu::Adapter::cooperative_matrix_properties`). naga 30's WGSL has square tiles only
//! (`coop_mat8x8`, `coop_mat16x16`), so a configuration is usable when `M = N = K` is 8 or 16;
//! this kernel needs f16 A and B with an f32 accumulator. The kernels crate does not depend on
//! wgpu: the backend copies what the adapter reports into a [`CoopDevice`].
//!
//! The kernel is compiled and validated with naga (tests `naga_validate`), never run: no device
//! tilekit has been tested on exposes the feature.

use super::{ElementStorage, Kernel, MatmulSwitches, Spec, gemv};
use crate::{MatmulDesc, Precision};

/// The edge of the cooperative-matrix tiles a [`Kernel::MatmulCoop`] module is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CoopSize {
    /// `coop_mat8x8` (what Metal's simdgroup matrices give).
    S8,
    /// `coop_mat16x16` (what NVIDIA and AMD drivers report for f16 through Vulkan).
    S16,
}

impl CoopSize {
    /// Both sizes, the preferred one first.
    pub const ALL: [CoopSize; 2] = [CoopSize::S16, CoopSize::S8];

    /// The tile edge S.
    pub const fn edge(self) -> u32 {
        match self {
            CoopSize::S8 => 8,
            CoopSize::S16 => 16,
        }
    }

    /// Rows and columns of a workgroup's output block: 2 × 2 subgroups of 2 × 2 tiles (`BM`,
    /// `BN` in the shader).
    pub const fn block(self) -> u32 {
        4 * self.edge()
    }

    /// Depth of a staged K slab (`BK`): two coop steps per pair of barriers.
    pub const fn slab(self) -> u32 {
        2 * self.edge()
    }

    /// Workgroup storage of the module, bytes: the f16 slabs of A and B and four f32 S × S
    /// accumulator patches (12 KiB for S = 16, 3 KiB for S = 8).
    pub const fn workgroup_bytes(self) -> u32 {
        let s = self.edge();
        2 * (self.block() * self.slab() * 2) + 4 * s * s * 4
    }
}

/// Subgroups per workgroup of the kernel: one per output quadrant.
pub const SUBGROUPS: u32 = 4;

/// A scalar type of a cooperative-matrix configuration (wgpu's `CooperativeScalarType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopScalar {
    /// 16-bit float.
    F16,
    /// 32-bit float.
    F32,
    /// Any other type (integers): never used by tilekit.
    Other,
}

/// One cooperative-matrix configuration an adapter reports (wgpu's
/// `CooperativeMatrixProperties`): `C[M × N] = A[M × K] · B[K × N] + C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopConfig {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Element type of A and B.
    pub ab: CoopScalar,
    /// Element type of C and the result.
    pub cr: CoopScalar,
}

/// What a device offers the cooperative kernel (filled by the backend from wgpu).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoopDevice {
    /// The device was created with `EXPERIMENTAL_COOPERATIVE_MATRIX` enabled.
    pub enabled: bool,
    /// The configurations the adapter reports (empty where unknown: then the kernel is not used).
    pub configs: Vec<CoopConfig>,
    /// The device stores f16 natively (`SHADER_F16`).
    pub native_f16: bool,
    /// The device has subgroup operations (`SUBGROUP`): the kernel reads `subgroup_id`.
    pub subgroups: bool,
    /// The adapter's subgroup size where it has one fixed size (`subgroup_min_size ==
    /// subgroup_max_size`); `None` where it varies.
    pub subgroup_size: Option<u32>,
    /// `max_compute_invocations_per_workgroup` (and along x: the kernel is 1-D).
    pub max_invocations: u32,
    /// `max_compute_workgroup_storage_size`, bytes.
    pub max_workgroup_bytes: u32,
}

impl CoopDevice {
    /// The tile size the kernel runs with here, if any: the feature enabled, f16 stored
    /// natively, subgroups with one fixed size (the kernel's workgroup is exactly
    /// [`SUBGROUPS`] subgroups, so `subgroup_id` names a quadrant), the workgroup and its
    /// storage within the limits, and an `S × S × S` configuration with f16 A/B and an f32
    /// accumulator; 16 preferred over 8 (four times the work per operation).
    pub fn size(&self) -> Option<CoopSize> {
        if !(self.enabled && self.native_f16 && self.subgroups) {
            return None;
        }
        let wg = self.workgroup()?;
        CoopSize::ALL.into_iter().find(|s| {
            let e = s.edge();
            wg <= self.max_invocations
                && s.workgroup_bytes() <= self.max_workgroup_bytes
                && self
                    .configs
                    .iter()
                    .any(|c| c.m == e && c.n == e && c.k == e && c.ab == CoopScalar::F16 && c.cr == CoopScalar::F32)
        })
    }

    /// Invocations per workgroup: [`SUBGROUPS`] × the fixed subgroup size.
    pub fn workgroup(&self) -> Option<u32> {
        self.subgroup_size.filter(|&s| s > 0).and_then(|s| s.checked_mul(SUBGROUPS))
    }
}

/// The cooperative kernel and its spec for `desc` in `storage` on `dev`, or `None` where the
/// backend runs its usual kernel. Chosen only where all hold:
/// - the device runs the kernel at all ([`CoopDevice::size`]);
/// - f16 stored natively ([`ElementStorage::F16`]): the staged tiles are f16, exact copies of
///   f16 inputs only (f32 would be rounded, bf16 is another format);
/// - [`Precision::Highest`]: f16 × f16 products are exact in f32 and the accumulators are f32,
///   which is that rule; `Precision::Bf16` asks for inputs rounded to bf16, which this kernel
///   does not do;
/// - M > [`gemv::GEMV_ROWS`]: up to 16 rows the GEMV kernel streams B once and stays;
/// - N and K at least a slab (2S): below that most of each coop tile would multiply zero
///   padding. These bounds are reasoned, not measured: no device with the feature has run it.
pub fn choose(desc: &MatmulDesc, storage: ElementStorage, dev: &CoopDevice) -> Option<(Kernel, Spec)> {
    let size = dev.size()?;
    let slab = size.slab() as usize;
    let fits = storage == ElementStorage::F16
        && desc.precision == Precision::Highest
        && desc.m > gemv::GEMV_ROWS
        && desc.n >= slab
        && desc.k >= slab;
    if !fits {
        return None;
    }
    let wg = dev.workgroup()?;
    Some((Kernel::MatmulCoop(size), Spec { wg, switches: MatmulSwitches::of(desc), ..Spec::DEFAULT }))
}

/// The module text of `kernel` (the shader file as written is the 16 × 16 variant; the 8 × 8
/// one swaps the matrix types and `S`).
pub fn text(size: CoopSize, kernel_text: &str) -> String {
    match size {
        CoopSize::S16 => kernel_text.to_string(),
        CoopSize::S8 => {
            kernel_text.replace("coop_mat16x16<", "coop_mat8x8<").replace("const S: u32 = 16u;", "const S: u32 = 8u;")
        }
    }
}

/// The `override` values of a module: the workgroup size (`WG`) and the switches.
pub(super) fn overrides(spec: Spec) -> Vec<(&'static str, f64)> {
    let mut o = vec![("WG", f64::from(spec.wg))];
    o.extend(spec.switches.overrides());
    o
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::DType;

    const F16_F32_16: CoopConfig = CoopConfig { m: 16, n: 16, k: 16, ab: CoopScalar::F16, cr: CoopScalar::F32 };
    const F16_F32_8: CoopConfig = CoopConfig { m: 8, n: 8, k: 8, ab: CoopScalar::F16, cr: CoopScalar::F32 };

    /// What an H100/H200-class NVIDIA adapter would offer (Vulkan, subgroups of 32).
    fn nvidia_like() -> CoopDevice {
        CoopDevice {
            enabled: true,
            configs: vec![
                CoopConfig { m: 16, n: 16, k: 16, ab: CoopScalar::F16, cr: CoopScalar::F16 },
                F16_F32_16,
                CoopConfig { m: 16, n: 8, k: 16, ab: CoopScalar::F16, cr: CoopScalar::F32 },
            ],
            native_f16: true,
            subgroups: true,
            subgroup_size: Some(32),
            max_invocations: 1024,
            max_workgroup_bytes: 48 * 1024,
        }
    }

    fn desc(m: usize, n: usize, k: usize) -> MatmulDesc {
        MatmulDesc::new(m, n, k)
    }

    fn pick(d: &MatmulDesc, s: ElementStorage, dev: &CoopDevice) -> Option<Kernel> {
        choose(d, s, dev).map(|(k, _)| k)
    }

    #[test]
    fn chosen_where_the_device_has_the_shape_and_the_product_fits() {
        let dev = nvidia_like();
        let (kernel, spec) = choose(&desc(100, 96, 64), ElementStorage::F16, &dev).unwrap();
        assert_eq!(kernel, Kernel::MatmulCoop(CoopSize::S16));
        assert_eq!(spec.wg, 128);
        // The switches travel with the spec (the pipeline is specialised to them).
        let mut d = desc(100, 96, 64);
        d.trans_b = true;
        assert!(choose(&d, ElementStorage::F16, &dev).unwrap().1.switches.trans_b);
        // Only 8 x 8 (Metal): the 8 x 8 variant, smaller slabs.
        let metal = CoopDevice { configs: vec![F16_F32_8], ..nvidia_like() };
        assert_eq!(pick(&desc(17, 16, 16), ElementStorage::F16, &metal), Some(Kernel::MatmulCoop(CoopSize::S8)));
        // Both: 16 preferred.
        let both = CoopDevice { configs: vec![F16_F32_8, F16_F32_16], ..nvidia_like() };
        assert_eq!(pick(&desc(64, 64, 64), ElementStorage::F16, &both), Some(Kernel::MatmulCoop(CoopSize::S16)));
    }

    #[test]
    fn not_chosen_without_the_feature_or_the_shape() {
        let d = desc(256, 256, 256);
        let s = ElementStorage::F16;
        // Feature absent (the default device, lavapipe).
        assert_eq!(pick(&d, s, &CoopDevice::default()), None);
        assert_eq!(pick(&d, s, &CoopDevice { enabled: false, ..nvidia_like() }), None);
        // Enabled, but no configuration known (an engine's device) or none usable: f16
        // accumulators only, f32 inputs only, a non-square shape.
        assert_eq!(pick(&d, s, &CoopDevice { configs: vec![], ..nvidia_like() }), None);
        for c in [
            CoopConfig { cr: CoopScalar::F16, ..F16_F32_16 },
            CoopConfig { ab: CoopScalar::F32, ..F16_F32_16 },
            CoopConfig { ab: CoopScalar::Other, cr: CoopScalar::Other, ..F16_F32_16 },
            CoopConfig { n: 8, ..F16_F32_16 },
            CoopConfig { m: 8, n: 16, k: 16, ..F16_F32_16 },
        ] {
            assert_eq!(pick(&d, s, &CoopDevice { configs: vec![c], ..nvidia_like() }), None, "{c:?}");
        }
        // No native f16, no subgroups, a varying subgroup size, limits too small.
        assert_eq!(pick(&d, s, &CoopDevice { native_f16: false, ..nvidia_like() }), None);
        assert_eq!(pick(&d, s, &CoopDevice { subgroups: false, ..nvidia_like() }), None);
        assert_eq!(pick(&d, s, &CoopDevice { subgroup_size: None, ..nvidia_like() }), None);
        assert_eq!(pick(&d, s, &CoopDevice { subgroup_size: Some(0), ..nvidia_like() }), None);
        assert_eq!(pick(&d, s, &CoopDevice { max_invocations: 64, ..nvidia_like() }), None);
        assert_eq!(pick(&d, s, &CoopDevice { max_workgroup_bytes: 4096, ..nvidia_like() }), None);
    }

    #[test]
    fn other_dtypes_precisions_and_small_products_keep_the_usual_kernel() {
        let dev = nvidia_like();
        let d = desc(256, 256, 256);
        for dtype in DType::ALL {
            for native in [true, false] {
                let s = ElementStorage::for_dtype(dtype, native);
                let want = (s == ElementStorage::F16).then_some(Kernel::MatmulCoop(CoopSize::S16));
                assert_eq!(pick(&d, s, &dev), want, "{dtype:?} native {native}");
            }
        }
        let mut bf = desc(256, 256, 256);
        bf.precision = Precision::Bf16;
        assert_eq!(pick(&bf, ElementStorage::F16, &dev), None);
        // M <= 16: the GEMV path, unchanged; 17 rows: the cooperative kernel.
        for m in [1, 4, 16] {
            assert_eq!(pick(&desc(m, 4096, 4096), ElementStorage::F16, &dev), None, "M = {m}");
        }
        assert!(pick(&desc(17, 4096, 4096), ElementStorage::F16, &dev).is_some());
        // N or K under one slab (32 with 16 x 16 tiles).
        assert_eq!(pick(&desc(256, 31, 256), ElementStorage::F16, &dev), None);
        assert_eq!(pick(&desc(256, 256, 31), ElementStorage::F16, &dev), None);
        assert!(pick(&desc(256, 32, 32), ElementStorage::F16, &dev).is_some());
    }

    /// Vulkan (VUID-RuntimeSpirv-OpCooperativeMatrixLoadKHR-08986) wants the pointer and the
    /// stride of every cooperative load and store aligned to the lesser of 16 bytes and one
    /// row of the matrix. The offsets and strides `matmul_coopmat.wgsl` uses, for every
    /// subgroup and k step, mirrored here: A at `(qm + i S) BK + kk` with stride BK (f16), B at
    /// `kk BN + qn + j S` with stride BN (f16), the patches at `g S²` with stride S (f32).
    #[test]
    fn every_cooperative_access_is_aligned() {
        for size in CoopSize::ALL {
            let (s, bm, bn, bk) = (size.edge(), size.block(), size.block(), size.slab());
            assert_eq!((bm, bn), (4 * s, 4 * s));
            let ok = |offset: u32, stride: u32, elem: u32| {
                let need = (s * elem).min(16);
                (offset * elem).is_multiple_of(need) && (stride * elem).is_multiple_of(need)
            };
            for g in 0..SUBGROUPS {
                let (qm, qn) = ((g / 2) * 2 * s, (g % 2) * 2 * s);
                assert!(ok(g * s * s, s, 4), "{size:?} patch {g}");
                for kk in (0..bk).step_by(s as usize) {
                    for i in 0..2 {
                        assert!(ok((qm + i * s) * bk + kk, bk, 2), "{size:?} A g{g} kk{kk}");
                        assert!(ok(kk * bn + qn + i * s, bn, 2), "{size:?} B g{g} kk{kk}");
                        assert!(qm + i * s + s <= bm && qn + i * s + s <= bn);
                    }
                }
            }
        }
    }

    #[test]
    fn sizes_and_text() {
        assert_eq!(CoopSize::S16.block(), 64);
        assert_eq!(CoopSize::S16.slab(), 32);
        assert_eq!(CoopSize::S16.workgroup_bytes(), 12 * 1024);
        assert_eq!(CoopSize::S8.workgroup_bytes(), 3 * 1024);
        let t = text(CoopSize::S8, super::super::MATMUL_COOPMAT);
        assert!(!t.contains("coop_mat16x16<") && t.contains("coop_mat8x8<"));
        assert!(t.contains("const S: u32 = 8u;"));
        assert_eq!(text(CoopSize::S16, "x"), "x");
    }
}
