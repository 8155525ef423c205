//! The quantized matmul kernels (`shaders/wgsl/qmatmul.wgsl`): `A · dequantize(W)ᵀ` with `W` a
//! GGUF block-quantized weight `[N, K]` in the two-plane storage of `QTensor`, the weights
//! dequantized in registers (M ≤ [`QGEMV_ROWS`]) or into workgroup memory (the tiled kernel).
//!
//! One file gives three kernels per format, the format being the `QTYPE` override constant:
//! [`super::Kernel::QuantGemvSubgroup`] (entry `qgemv_subgroup`, needs
//! `wgpu::Features::SUBGROUP`), [`super::Kernel::QuantGemv`] (entry `qgemv`, the file without
//! the subgroup entry) and [`super::Kernel::QuantMatmul`] (entry `qmatmul`). They take the
//! dense matmul's parameter block ([`super::MatmulParams`]) with B's fields reused for the
//! weight planes (`b_off`: the body plane's first word, `b_bs`: the scale plane's; the `B_VEC`
//! flag: the body offset is a multiple of 4 words, so vec4<u32> loads) and its bindings, the weight's scale plane at
//! binding 1 and its body plane at binding [`BODY_BINDING`].

use super::{Kernel, Spec};
use crate::quant::GgmlType;

/// A block format the WGSL quantized kernels read (the `QTYPE` constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantFormat {
    /// `Q8_0`: 32 `i8` and an f16 scale.
    Q8_0,
    /// `Q4_0`: 32 nibbles and an f16 scale, `(q − 8) · d`.
    Q4_0,
    /// `Q4_1`: 32 nibbles, f16 `d` and `m`, `q · d + m`.
    Q4_1,
    /// `Q4_K`: 256 weights in 8 sub-blocks with 6-bit scales and mins.
    Q4K,
    /// `Q6_K`: 256 weights in 16 sub-blocks with `i8` scales.
    Q6K,
}

impl QuantFormat {
    /// Every format, in `QTYPE` order.
    pub const ALL: [QuantFormat; 5] =
        [QuantFormat::Q8_0, QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q4K, QuantFormat::Q6K];

    /// The format of a quantized GGUF type (`None` for the dense ones).
    pub const fn of(ty: GgmlType) -> Option<QuantFormat> {
        match ty {
            GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
            GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
            GgmlType::Q4K => Some(QuantFormat::Q4K),
            GgmlType::Q6K => Some(QuantFormat::Q6K),
            _ => None,
        }
    }

    /// The value of the `QTYPE` override constant (`QT_*` in the shader).
    pub const fn code(self) -> u32 {
        self as u32
    }
}

/// Products with at most this many rows take the decode kernel (`qgemv`); its register tile
/// holds up to 16 rows × 4 columns per invocation, as the dense GEMV's.
pub const QGEMV_ROWS: usize = 16;
/// Output columns (weight rows) one `qgemv` workgroup owns: N = 4096 gives 1024 workgroups.
pub const QGEMV_COLS: u32 = 4;
/// Invocations per `qgemv` workgroup: 64, two 32-wide subgroups; they split K 32 weights (one
/// unit) at a time, so K = 4096 is two passes.
pub const QGEMV_WG: u32 = 64;
/// The `qmatmul` block: 64 × 64 outputs from 16 × 16 invocations of 4 × 4.
pub const QMATMUL_BLOCK: u32 = 64;
/// The `qmatmul` workgroup.
pub const QMATMUL_WG: [u32; 3] = [16, 16, 1];
/// Workgroup storage of `qmatmul`: the staged 64 × 32 slab of op(A) and of dequantized
/// weights, f32 (exactly the 16 KiB WebGPU minimum).
pub const QMATMUL_WORKGROUP_BYTES: u32 = 2 * 64 * 32 * 4;
/// The binding of the body plane (the parameter block is at 5, the scale plane takes B's 1).
pub const BODY_BINDING: u32 = 6;

/// The markers around the subgroup entry point (the same as `gemv.wgsl`'s).
pub(super) fn text(kernel: Kernel, body: &str) -> String {
    let sg = if matches!(kernel, Kernel::QuantGemvSubgroup(_)) { Kernel::GemvSubgroup } else { Kernel::Gemv };
    super::gemv::text(sg, body)
}

/// The `override` constants of a quantized pipeline besides the switches.
pub(super) fn overrides(kernel: Kernel, spec: Spec) -> Vec<(&'static str, f64)> {
    let (Kernel::QuantGemv(f) | Kernel::QuantGemvSubgroup(f) | Kernel::QuantMatmul(f)) = kernel else {
        return Vec::new();
    };
    let mut o = vec![("QTYPE", f64::from(f.code()))];
    if !matches!(kernel, Kernel::QuantMatmul(_)) {
        o.push(("WG", f64::from(spec.wg)));
        o.push(("GV_ROWS", f64::from(spec.rows)));
    }
    o
}

/// The kernel and spec of a product with `m` rows in `format` (`subgroups`: the device has
/// `SUBGROUP`): the decode kernel up to [`QGEMV_ROWS`] rows, else the tiled one.
pub fn choose(format: QuantFormat, m: usize, subgroups: bool) -> (Kernel, Spec) {
    if m <= QGEMV_ROWS {
        let kernel = if subgroups { Kernel::QuantGemvSubgroup(format) } else { Kernel::QuantGemv(format) };
        // Rows rounded up to a power of two: five pipelines per format and switch set instead
        // of sixteen (each costs a shader compile); the extra rows read zeros and are not stored.
        let rows = m.clamp(1, QGEMV_ROWS).next_power_of_two() as u32;
        (kernel, Spec { rows, wg: QGEMV_WG, ..Spec::DEFAULT })
    } else {
        (Kernel::QuantMatmul(format), Spec::DEFAULT)
    }
}

/// The module name stem of a quantized kernel.
pub(super) const fn name(kernel: Kernel) -> &'static str {
    use QuantFormat as F;
    match kernel {
        Kernel::QuantGemv(F::Q8_0) => "qgemv_q8_0",
        Kernel::QuantGemv(F::Q4_0) => "qgemv_q4_0",
        Kernel::QuantGemv(F::Q4_1) => "qgemv_q4_1",
        Kernel::QuantGemv(F::Q4K) => "qgemv_q4_k",
        Kernel::QuantGemv(F::Q6K) => "qgemv_q6_k",
        Kernel::QuantGemvSubgroup(F::Q8_0) => "qgemv_subgroup_q8_0",
        Kernel::QuantGemvSubgroup(F::Q4_0) => "qgemv_subgroup_q4_0",
        Kernel::QuantGemvSubgroup(F::Q4_1) => "qgemv_subgroup_q4_1",
        Kernel::QuantGemvSubgroup(F::Q4K) => "qgemv_subgroup_q4_k",
        Kernel::QuantGemvSubgroup(F::Q6K) => "qgemv_subgroup_q6_k",
        Kernel::QuantMatmul(F::Q8_0) => "qmatmul_q8_0",
        Kernel::QuantMatmul(F::Q4_0) => "qmatmul_q4_0",
        Kernel::QuantMatmul(F::Q4_1) => "qmatmul_q4_1",
        Kernel::QuantMatmul(F::Q4K) => "qmatmul_q4_k",
        Kernel::QuantMatmul(F::Q6K) => "qmatmul_q6_k",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ElementStorage, module};
    use super::*;

    #[test]
    fn every_format_has_three_modules_with_its_qtype() {
        for f in QuantFormat::ALL {
            assert_eq!(QuantFormat::of(GgmlType::QUANTIZED[f.code() as usize]), Some(f));
            for kernel in [Kernel::QuantGemv(f), Kernel::QuantGemvSubgroup(f), Kernel::QuantMatmul(f)] {
                let m = module(kernel, ElementStorage::Bf16Packed);
                assert!(m.overrides.contains(&("QTYPE", f64::from(f.code()))), "{}", m.name);
                assert!(m.source.contains(&format!("fn {}(", m.entry_point)), "{}", m.name);
                let sg = m.source.lines().any(|l| !l.trim_start().starts_with("//") && l.contains("subgroupAdd"));
                assert_eq!(sg, kernel.needs_subgroups(), "{}", m.name);
                assert!(m.workgroup_bytes <= 16 * 1024, "{}", m.name);
            }
        }
        assert_eq!(QuantFormat::of(GgmlType::F16), None);
        assert_eq!(choose(QuantFormat::Q4K, 16, true).0, Kernel::QuantGemvSubgroup(QuantFormat::Q4K));
        assert_eq!(choose(QuantFormat::Q4K, 16, false).0, Kernel::QuantGemv(QuantFormat::Q4K));
        assert_eq!(choose(QuantFormat::Q4K, 17, true).0, Kernel::QuantMatmul(QuantFormat::Q4K));
        assert_eq!(choose(QuantFormat::Q8_0, 1, true).1.rows, 1);
        assert_eq!(choose(QuantFormat::Q8_0, 5, true).1.rows, 8);
        assert_eq!(choose(QuantFormat::Q8_0, 16, true).1.rows, 16);
        assert_eq!(module(Kernel::QuantMatmul(QuantFormat::Q8_0), ElementStorage::F32).workgroup_size, QMATMUL_WG);
    }
}
