//! The GEMV / skinny-GEMM kernel (`shaders/wgsl/gemv.wgsl`): products with at most
//! [`GEMV_ROWS`] rows, both weight layouts, K split across the invocations of a workgroup.
//!
//! Two modules come from the one file: [`super::Kernel::GemvSubgroup`] (entry
//! `gemv_subgroup`, the file as it stands, for devices with `wgpu::Features::SUBGROUP`; naga 30
//! takes subgroup operations without an `enable` directive) and [`super::Kernel::Gemv`] (entry
//! `gemv`, the file without the subgroup entry, so it compiles everywhere).

use super::{Kernel, Spec};

/// Products with at most this many rows take the GEMV kernel: its register tile holds
/// `GEMV_ROWS` rows × 4 columns per invocation (sixteen vec4 accumulators at most).
pub const GEMV_ROWS: usize = 16;
/// Output columns one workgroup owns (one vec4 per row): N = 4096 gives 1024 workgroups, over
/// four per compute unit on the largest GPUs.
pub const GEMV_COLS: u32 = 4;
/// Invocations per workgroup (`WG`): 64, two 32-wide subgroups; they split K four elements at
/// a time. Tunable among [`GEMV_WG_CANDIDATES`].
pub const GEMV_WG: u32 = 64;
/// Workgroup sizes the autotuner tries for the GEMV kernel; the first is the default. Powers
/// of two (the reduction tree halves them).
pub const GEMV_WG_CANDIDATES: [u32; 3] = [GEMV_WG, 128, 256];

/// The markers around the subgroup entry point in `gemv.wgsl`.
const SUBGROUP_BEGIN: &str = "// ---- BEGIN SUBGROUP ENTRY";
const SUBGROUP_END: &str = "// ---- END SUBGROUP ENTRY ----\n";

/// The kernel text of `kernel` (one of the two GEMV kernels) from the file's kernel part.
pub(super) fn text(kernel: Kernel, body: &str) -> String {
    if kernel == Kernel::GemvSubgroup {
        return body.to_string();
    }
    match (body.find(SUBGROUP_BEGIN), body.find(SUBGROUP_END)) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &body[..a], &body[b + SUBGROUP_END.len()..]),
        _ => body.to_string(),
    }
}

/// The `override` constants of a GEMV pipeline (besides the switches): `WG` and `GV_ROWS`.
pub(super) fn overrides(spec: Spec) -> Vec<(&'static str, f64)> {
    vec![("WG", f64::from(spec.wg)), ("GV_ROWS", f64::from(spec.rows))]
}

/// Workgroup storage of a GEMV pipeline, bytes: `4 · WG` vec4s.
pub const fn workgroup_bytes(wg: u32) -> u32 {
    4 * wg * 16
}

/// The candidate specs (default first) of a product with `m` rows (1 to [`GEMV_ROWS`]).
pub fn candidates(m: usize) -> Vec<Spec> {
    let rows = m.clamp(1, GEMV_ROWS) as u32;
    GEMV_WG_CANDIDATES.iter().map(|&wg| Spec { rows, wg, ..Spec::DEFAULT }).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{ElementStorage, module, module_with};
    use super::*;

    #[test]
    fn the_plain_module_has_no_subgroup_operations() {
        let plain = module(Kernel::Gemv, ElementStorage::F32);
        let code: Vec<&str> = plain.source.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        for word in ["subgroupAdd", "@builtin(subgroup", "fn gemv_subgroup"] {
            assert!(!code.iter().any(|l| l.contains(word)), "gemv without subgroups still has {word}");
        }
        assert!(plain.source.contains("fn gemv("));
        let sg = module(Kernel::GemvSubgroup, ElementStorage::F16);
        assert!(sg.source.contains("subgroupAdd(") && sg.source.contains("fn gemv_subgroup("));
        assert!(sg.source.starts_with("enable f16;"));
        // The reduction scratch fits the WebGPU minimum of 16 KiB for every candidate.
        for wg in GEMV_WG_CANDIDATES {
            assert!(wg.is_power_of_two() && wg <= 256);
            let m = module_with(Kernel::Gemv, ElementStorage::F32, Spec { wg, rows: 16, ..Spec::DEFAULT });
            assert_eq!(m.workgroup_bytes, workgroup_bytes(wg));
            assert!(m.workgroup_bytes <= 16 * 1024);
            assert_eq!(m.workgroup_size, [wg, 1, 1]);
        }
        assert_eq!(candidates(40)[0].rows, 16);
        assert_eq!(candidates(0)[0].rows, 1);
        assert_eq!(candidates(3)[0].wg, GEMV_WG);
    }
}
