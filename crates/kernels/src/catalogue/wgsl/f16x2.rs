//! The f16-compute tiled matmul (`shaders/wgsl/matmul_f16x2.wgsl`, [`Kernel::MatmulF16x2`](super::Kernel::MatmulF16x2)):
//! [`crate::Precision::F16`] on f16 storage, products and partial sums of up to [`CHUNK`]
//! products in `vec2<f16>`, added to f32 accumulators.
//!
//! The kernel is `matmul.wgsl`'s tiled kernel with f16 arithmetic and f16 staging: the same
//! [`MatmulTile`]s (and tuning candidates), switches, parameter block and epilogue. It exists for
//! one storage variant only ([`Kernel::only_storage`](super::Kernel::only_storage): native f16, `enable f16`), and the file
//! starts with its `enable f16;` so that it is valid WGSL as it stands ([`text`] drops it, since
//! the catalogue writes the directive itself).
//!
//! Which products take it is [`applies`]: the caller asked for [`crate::Precision::F16`], the
//! storage is native f16, and M is above the GEMV kernel's rows (up to
//! [`super::gemv::GEMV_ROWS`] rows the GEMV kernel at f32 runs, as for every precision: it is
//! inside the same bound and memory-bound there anyway).
//!
//! # Workgroup memory
//! The slabs are staged as `vec4<f16>` with the index formulas of `matmul.wgsl` (mirrored in
//! [`super::layout`]), so the staging uses half the bytes ([`workgroup_bytes`]). The bank model
//! of [`super::layout`] applies with each access narrowed to f16: a `vec4<f16>` is 8 bytes
//! (2 words, served in phases of 16 invocations) and a scalar f16 store writes half of one word
//! (stores to the two halves of one word in one pass are modelled as one access: the hardware
//! merges sub-word stores to a word). [`worst_conflict`] checks every candidate tile.

use super::layout::{self, Access, Operand};
use super::{ElementStorage, MatmulTile};
use crate::{MatmulDesc, Precision};

/// Products per f16 partial sum before it is added to the f32 accumulators (`CHUNK` in the
/// shader): [`Precision::F16_CHUNK`].
pub const CHUNK: u32 = Precision::F16_CHUNK as u32;

/// The kernel text without the file's leading `enable f16;` (the catalogue prepends it).
pub(super) fn text(body: &str) -> &str {
    body.strip_prefix("enable f16;\n\n").unwrap_or(body)
}

/// The shape `override` constants of a pipeline with `tile`: those of [`Kernel::Matmul`](super::Kernel::Matmul).
pub(super) fn tile_overrides(tile: MatmulTile) -> Vec<(&'static str, f64)> {
    let (warp_x, warp_y) = tile.warp();
    vec![
        ("WG_X", f64::from(tile.wg_x)),
        ("WG_Y", f64::from(tile.wg_y)),
        ("BK", f64::from(tile.bk)),
        ("WARP_X", f64::from(warp_x)),
        ("WARP_Y", f64::from(warp_y)),
    ]
}

/// Workgroup storage of the two staged slabs in f16, bytes: half of
/// [`MatmulTile::workgroup_bytes`].
pub const fn workgroup_bytes(tile: MatmulTile) -> u32 {
    8 * tile.bk * (tile.row_a4() + tile.row_b4())
}

/// Whether the product `desc` in `storage` takes [`Kernel::MatmulF16x2`](super::Kernel::MatmulF16x2): precision
/// [`Precision::F16`], native f16 storage, more than [`super::gemv::GEMV_ROWS`] rows.
pub fn applies(desc: &MatmulDesc, storage: ElementStorage) -> bool {
    desc.precision == Precision::F16 && storage == ElementStorage::F16 && desc.m > super::gemv::GEMV_ROWS
}

/// An access of the f32 layout ([`layout::Access`], words of 4 bytes) as the same element
/// access in the f16 layout: scalar element `e` is in word `e / 2`; a vec4 at element `4i`
/// is 2 words from word `2i`.
pub fn narrow(a: Access) -> Access {
    match a.words {
        4 => Access { word: a.word / 2, words: 2 },
        _ => Access { word: a.word / 2, words: 1 },
    }
}

/// The worst conflict of any workgroup-memory instruction of the f16 kernel with `tile`
/// (staging stores of both operands with and without transposes, the inner-loop reads) over
/// every group of `group` consecutive invocations: [`layout::worst_conflict`] with every
/// access narrowed ([`narrow`]). 1 means no bank conflicts.
pub fn worst_conflict(tile: MatmulTile, group: u32) -> u32 {
    let threads = tile.invocations();
    let mut worst = 1;
    for start in (0..threads).step_by(group as usize) {
        let members: Vec<u32> = (start..(start + group).min(threads)).collect();
        for operand in [Operand::A, Operand::B] {
            let total = layout::staged_vec4s(tile, operand);
            for transposed in [false, true] {
                for l in 0..total.div_ceil(threads) {
                    let stores: Vec<Option<Vec<Access>>> = members
                        .iter()
                        .map(|&f| {
                            let v = f + l * threads;
                            (v < total).then(|| {
                                layout::stage_stores(tile, operand, transposed, v).into_iter().map(narrow).collect()
                            })
                        })
                        .collect();
                    let instructions = stores.iter().flatten().map(Vec::len).max().unwrap_or(0);
                    for i in 0..instructions {
                        let lanes: Vec<Option<Access>> =
                            stores.iter().map(|s| s.as_ref().and_then(|s| s.get(i).copied())).collect();
                        worst = worst.max(layout::conflict_ways(&lanes));
                    }
                }
            }
        }
        for kk in 0..tile.bk {
            for i in 0..4 {
                let lanes: Vec<Option<Access>> =
                    members.iter().map(|&f| Some(narrow(layout::inner_reads(tile, f, kk)[i].1))).collect();
                worst = worst.max(layout::conflict_ways(&lanes));
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::wgsl::{
        Kernel, MATMUL_F16X2, MATMUL_SHORT_TILE_CANDIDATES, MATMUL_TILE_CANDIDATES, generated_block, module,
        split_generated,
    };

    fn tiles() -> Vec<MatmulTile> {
        MATMUL_TILE_CANDIDATES.iter().chain(&MATMUL_SHORT_TILE_CANDIDATES).copied().collect()
    }

    /// Every candidate tile stages and reads its f16 slabs without a bank conflict, for
    /// 32-wide and 8-wide groups of invocations; and every one fits in half the f32 kernel's
    /// workgroup memory.
    #[test]
    fn every_candidate_f16_layout_is_free_of_bank_conflicts() {
        for t in tiles() {
            for group in [32, 8] {
                assert_eq!(worst_conflict(t, group), 1, "{t:?}, groups of {group}");
            }
            assert_eq!(2 * workgroup_bytes(t), t.workgroup_bytes());
        }
    }

    /// The narrowed model still sees conflicts: 16 invocations reading 16 different 8-byte
    /// vectors 32 words apart are 16-way; consecutive ones are free; two f16 stores to one
    /// word are one access.
    #[test]
    fn the_narrowed_model_finds_conflicts() {
        let column: Vec<Option<Access>> = (0..16).map(|i| Some(Access { word: i * 32, words: 2 })).collect();
        assert_eq!(layout::conflict_ways(&column), 16);
        let row: Vec<Option<Access>> = (0..32).map(|i| Some(Access { word: 2 * i, words: 2 })).collect();
        assert_eq!(layout::conflict_ways(&row), 1);
        let halves: Vec<Option<Access>> = (0..32).map(|i| Some(narrow(Access { word: i, words: 1 }))).collect();
        assert_eq!(layout::conflict_ways(&halves), 1);
        // Without the rotation of the scattered stores, the short tile's two k groups would
        // write rows 4 words apart... in the f16 layout they are 8 words apart, still free;
        // a column of halves 64 elements apart is not.
        let strided: Vec<Option<Access>> = (0..32).map(|i| Some(narrow(Access { word: i * 64, words: 1 }))).collect();
        assert_eq!(layout::conflict_ways(&strided), 32);
    }

    /// The shader holds the index expressions of `matmul.wgsl` that the layout model mirrors,
    /// its chunk length, and the f16 staging.
    #[test]
    fn the_shader_uses_the_mirrored_formulas() {
        let src = MATMUL_F16X2;
        for line in [
            "let lane = flat % warp_size;",
            "let tx = (warp % warps_x) * WARP_X + lane % WARP_X;",
            "let ty = (warp / warps_x) * WARP_Y + lane / WARP_X;",
            "let e = (j + g) % 4u;",
            "As[(c + e) * ROW_A4 + m / 4u][m % 4u] = x[e];",
            "As[r * ROW_A4 + c4] = x;",
            "Bs[r * ROW_B4 + c4] = x;",
            "Bs[(c + e) * ROW_B4 + n / 4u][n % 4u] = x[e];",
            "let a0 = As[kk * ROW_A4 + ty];",
            "let a1 = As[kk * ROW_A4 + WG_Y + ty];",
            "let b0 = Bs[kk * ROW_B4 + tx];",
            "let b1 = Bs[kk * ROW_B4 + WG_X + tx];",
            "override ROW_A4: u32 = BM / 4u;",
            "override ROW_B4: u32 = BN / 4u;",
            "var<workgroup> As: array<vec4<f16>, AS_LEN>;",
            "var<workgroup> Bs: array<vec4<f16>, BS_LEN>;",
            &format!("const CHUNK: u32 = {CHUNK}u;"),
        ] {
            assert!(src.contains(line), "matmul_f16x2.wgsl no longer contains `{line}`");
        }
        assert_eq!(src.matches("let m = v % BM;").count(), 2);
        assert_eq!(src.matches("let n = v % BN;").count(), 2);
        // 32 vec2<f16> FMAs per k step: every partial once.
        for i in 0..32 {
            assert_eq!(src.matches(&format!("ph[{i}] = fma(")).count(), 1, "ph[{i}]");
        }
        assert!(src.starts_with("enable f16;\n"));
    }

    /// The file ends with its current f16 generated block (`TILEKIT_BLESS=1` rewrites it), and
    /// the module is built for f16 storage whatever is asked.
    #[test]
    fn the_file_carries_its_f16_block_and_the_module_is_f16_only() {
        let (body, block) = split_generated(MATMUL_F16X2);
        let want = format!("{}\n", generated_block(Kernel::MatmulF16x2, ElementStorage::F16));
        if block != want {
            if std::env::var_os("TILEKIT_BLESS").is_some() {
                let path =
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders/wgsl/matmul_f16x2.wgsl");
                std::fs::write(path, format!("{body}{want}")).expect("rewrite the shader file");
            } else {
                panic!("shaders/wgsl/matmul_f16x2.wgsl: the generated block is stale; rerun with TILEKIT_BLESS=1");
            }
        }
        for storage in ElementStorage::ALL {
            let m = module(Kernel::MatmulF16x2, storage);
            assert_eq!(m.storage, Some(ElementStorage::F16));
            assert_eq!(m.name, "matmul_f16x2_f16");
            assert!(m.needs_f16 && m.source.starts_with("enable f16;\n"));
            assert_eq!(m.source.matches("enable f16;").count(), 1);
            assert_eq!(m.workgroup_bytes, workgroup_bytes(MatmulTile::DEFAULT));
        }
    }

    #[test]
    fn only_f16_precision_on_native_f16_above_the_gemv_rows_applies() {
        let d = MatmulDesc::new(17, 8, 8).precision(Precision::F16);
        assert!(applies(&d, ElementStorage::F16));
        assert!(!applies(&d, ElementStorage::F16Packed));
        assert!(!applies(&d, ElementStorage::F32));
        assert!(!applies(&d.m(16), ElementStorage::F16));
        assert!(!applies(&d.precision(Precision::Highest), ElementStorage::F16));
        assert!(!applies(&d.precision(Precision::Bf16), ElementStorage::F16));
    }
}
