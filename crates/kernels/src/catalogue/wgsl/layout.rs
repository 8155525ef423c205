//! The workgroup-memory layout of the tiled matmul (`shaders/wgsl/matmul.wgsl`, entry
//! `matmul`), index formula for index formula, and a bank model that checks it.
//!
//! The functions here mirror the shader's `put_a`, `put_b`, the warp-tile arrangement and the
//! inner-loop reads; a test keeps the shader text holding the same expressions. The bank model
//! is the one of NVIDIA and AMD shared memory (the stricter of the two where they differ):
//! 32 banks of 4 bytes; a 32-bit access of a group of invocations is served in one pass when
//! no two *different* words share a bank (equal words broadcast); a 128-bit access is served
//! in phases of 8 invocations (128 bytes each), and a phase is conflict-free when no two
//! different 16-byte vectors in it share a bank. Groups are 32 consecutive invocations (a
//! subgroup on NVIDIA and most AMD/Intel GPUs) and 8 (lavapipe's subgroup).

use super::MatmulTile;

/// Banks of workgroup memory, each one 32-bit word wide.
pub const BANKS: u32 = 32;

/// One workgroup-memory access: the first 32-bit word and the width in words (1 or 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Word address inside its array (both arrays start 16-byte aligned; one instruction
    /// touches one array, so where the array starts shifts every bank alike).
    pub word: u32,
    /// Width in words: 1 (scalar) or 4 (vec4).
    pub words: u32,
}

/// The operand a staging store writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// `As`, the slab of op(A), `As[k][m]`.
    A,
    /// `Bs`, the slab of op(B), `Bs[k][n]`.
    B,
}

/// `(tx, ty)` of invocation `flat` (`local_invocation_index`): lane `flat % WARP` of warp tile
/// `flat / WARP`, the warp tiles covering the `WG_X × WG_Y` grid row by row.
pub fn invocation(tile: MatmulTile, flat: u32) -> (u32, u32) {
    let (wx, wy) = tile.warp();
    let lane = flat % (wx * wy);
    let warp = flat / (wx * wy);
    let warps_x = tile.wg_x / wx;
    ((warp % warps_x) * wx + lane % wx, (warp / warps_x) * wy + lane / wx)
}

/// The stores `put_a` / `put_b` make for staged vec4 number `v` of `operand`, stored
/// transposed or not, one per store instruction (4 scalar stores or one vec4 store).
pub fn stage_stores(tile: MatmulTile, operand: Operand, transposed: bool, v: u32) -> Vec<Access> {
    // Untransposed A and transposed B scatter 4 elements along k over 4 staged rows;
    // the other two cases store one vec4 along m or n.
    let (len, row4) = match operand {
        Operand::A => (tile.bm(), tile.row_a4()),
        Operand::B => (tile.bn(), tile.row_b4()),
    };
    let scatter = matches!((operand, transposed), (Operand::A, false) | (Operand::B, true));
    if scatter {
        // `let m = v % BM; let g = v / BM; let c = g * 4u;` and store j writes element
        // `e = (j + g) % 4u` to `As[(c + e) * ROW_A4 + m / 4u][m % 4u]`.
        let m = v % len;
        let g = v / len;
        let c = g * 4;
        (0..4)
            .map(|j| {
                let e = (j + g) % 4;
                Access { word: ((c + e) * row4 + m / 4) * 4 + m % 4, words: 1 }
            })
            .collect()
    } else {
        // `let r = v / (BM / 4u); let c4 = v % (BM / 4u);  As[r * ROW_A4 + c4]`
        let r = v / (len / 4);
        let c4 = v % (len / 4);
        vec![Access { word: (r * row4 + c4) * 4, words: 4 }]
    }
}

/// Vec4s of `operand` staged per slab (`na`, `nb` in the shader).
pub fn staged_vec4s(tile: MatmulTile, operand: Operand) -> u32 {
    match operand {
        Operand::A => tile.bm() * tile.bk / 4,
        Operand::B => tile.bn() * tile.bk / 4,
    }
}

/// The four vec4 reads of invocation `flat` at depth `kk` of a slab, in the shader's order
/// `a0, a1` (array `As`) and `b0, b1` (array `Bs`).
pub fn inner_reads(tile: MatmulTile, flat: u32, kk: u32) -> [(Operand, Access); 4] {
    let (tx, ty) = invocation(tile, flat);
    let a = |i: u32| (Operand::A, Access { word: (kk * tile.row_a4() + i) * 4, words: 4 });
    let b = |i: u32| (Operand::B, Access { word: (kk * tile.row_b4() + i) * 4, words: 4 });
    [a(ty), a(tile.wg_y + ty), b(tx), b(tile.wg_x + tx)]
}

/// How many passes one instruction needs beyond the minimum for its width: 1 when it is free
/// of bank conflicts, `n` for an `n`-way conflict. `lanes[i]` is the access of the `i`-th
/// invocation of the group, `None` where it is inactive. Every access of one instruction has
/// the same width.
pub fn conflict_ways(lanes: &[Option<Access>]) -> u32 {
    let width = lanes.iter().flatten().map(|a| a.words).next().unwrap_or(1);
    let per_phase = (BANKS / width).max(1) as usize;
    let mut worst = 1;
    for phase in lanes.chunks(per_phase) {
        let mut distinct: Vec<u32> = phase.iter().flatten().map(|a| a.word).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let mut per_bank = [0u32; BANKS as usize];
        for w in distinct {
            for i in 0..width {
                per_bank[((w + i) % BANKS) as usize] += 1;
            }
        }
        worst = worst.max(per_bank.iter().copied().max().unwrap_or(1));
    }
    worst
}

/// The worst conflict of any workgroup-memory instruction of `tile` (staging stores of both
/// operands, with and without transposes, and the inner-loop reads) over every group of
/// `group` consecutive invocations. 1 means the layout is free of bank conflicts.
pub fn worst_conflict(tile: MatmulTile, group: u32) -> u32 {
    let threads = tile.invocations();
    let mut worst = 1;
    for start in (0..threads).step_by(group as usize) {
        let members: Vec<u32> = (start..(start + group).min(threads)).collect();
        for operand in [Operand::A, Operand::B] {
            let total = staged_vec4s(tile, operand);
            for transposed in [false, true] {
                // Load round l: invocation flat stages vec4 `flat + l * threads` if it exists.
                for l in 0..total.div_ceil(threads) {
                    let stores: Vec<Option<Vec<Access>>> = members
                        .iter()
                        .map(|&f| {
                            let v = f + l * threads;
                            (v < total).then(|| stage_stores(tile, operand, transposed, v))
                        })
                        .collect();
                    let instructions = stores.iter().flatten().map(Vec::len).max().unwrap_or(0);
                    for i in 0..instructions {
                        let lanes: Vec<Option<Access>> =
                            stores.iter().map(|s| s.as_ref().and_then(|s| s.get(i).copied())).collect();
                        worst = worst.max(conflict_ways(&lanes));
                    }
                }
            }
        }
        for kk in 0..tile.bk {
            for i in 0..4 {
                let lanes: Vec<Option<Access>> = members.iter().map(|&f| Some(inner_reads(tile, f, kk)[i].1)).collect();
                worst = worst.max(conflict_ways(&lanes));
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::wgsl::{MATMUL_SHORT_TILE_CANDIDATES, MATMUL_TILE_CANDIDATES};

    fn tiles() -> Vec<MatmulTile> {
        MATMUL_TILE_CANDIDATES.iter().chain(&MATMUL_SHORT_TILE_CANDIDATES).copied().collect()
    }

    /// Every candidate tile stages and reads without a bank conflict, for 32-wide and 8-wide
    /// groups of invocations.
    #[test]
    fn every_candidate_layout_is_free_of_bank_conflicts() {
        for t in tiles() {
            for group in [32, 8] {
                assert_eq!(worst_conflict(t, group), 1, "{t:?}, groups of {group}");
            }
        }
    }

    /// The model sees conflicts where they are: the staging of the previous 4 × 4 kernel
    /// (vec4 along k per invocation, scattered, rows padded to 17 vec4s) is 2-way with
    /// BK = 16; 32 invocations reading 32 different vec4s of one column are 8-way per phase.
    #[test]
    fn the_bank_model_finds_conflicts() {
        let (bk, row_a4) = (16u32, 17u32);
        let old = |v: u32, j: u32| {
            let r = v / (bk / 4);
            let c = (v % (bk / 4)) * 4;
            Access { word: ((c + j) * row_a4 + r / 4) * 4 + r % 4, words: 1 }
        };
        let lanes: Vec<Option<Access>> = (0..32).map(|v| Some(old(v, 0))).collect();
        assert_eq!(conflict_ways(&lanes), 2);
        let column: Vec<Option<Access>> = (0..32).map(|i| Some(Access { word: i * 32, words: 1 })).collect();
        assert_eq!(conflict_ways(&column), 32);
        let vec_column: Vec<Option<Access>> = (0..32).map(|i| Some(Access { word: i * 32, words: 4 })).collect();
        assert_eq!(conflict_ways(&vec_column), 8);
        // Broadcasts and consecutive vectors are free.
        let same: Vec<Option<Access>> = (0..32).map(|_| Some(Access { word: 12, words: 4 })).collect();
        assert_eq!(conflict_ways(&same), 1);
        let row: Vec<Option<Access>> = (0..32).map(|i| Some(Access { word: 4 * i, words: 4 })).collect();
        assert_eq!(conflict_ways(&row), 1);
        // Without the rotation of the scattered stores, the 16-row short tile's two k groups
        // collide; with a padded row its vec4 stores do.
        let t = MatmulTile::SHORT;
        let unrotated: Vec<Option<Access>> = (0..32)
            .map(|v| {
                let (m, c) = (v % t.bm(), (v / t.bm()) * 4);
                Some(Access { word: c * t.bm() + m, words: 1 })
            })
            .collect();
        assert_eq!(conflict_ways(&unrotated), 2);
        let padded: Vec<Option<Access>> =
            (0..8).map(|v| Some(Access { word: ((v / 4) * (t.bm() / 4 + 1) + v % 4) * 4, words: 4 })).collect();
        assert_eq!(conflict_ways(&padded), 2);
        let rotated: Vec<Option<Access>> = (0..32).map(|v| Some(stage_stores(t, Operand::A, false, v)[0])).collect();
        assert_eq!(conflict_ways(&rotated), 1);
    }

    /// Each invocation owns a distinct (tx, ty), so the warp tiles cover the workgroup once.
    #[test]
    fn warp_tiles_cover_the_workgroup_once() {
        for t in tiles() {
            let mut seen = vec![false; t.invocations() as usize];
            for f in 0..t.invocations() {
                let (tx, ty) = invocation(t, f);
                assert!(tx < t.wg_x && ty < t.wg_y, "{t:?}");
                let slot = &mut seen[(ty * t.wg_x + tx) as usize];
                assert!(!*slot, "{t:?}: ({tx}, {ty}) twice");
                *slot = true;
            }
        }
    }

    /// The staging stores cover each staged element exactly once and stay inside the arrays.
    #[test]
    fn staging_fills_each_slab_element_once() {
        for t in tiles() {
            for (operand, len, row4) in [(Operand::A, t.bm(), t.row_a4()), (Operand::B, t.bn(), t.row_b4())] {
                for transposed in [false, true] {
                    let mut hit = vec![0u32; (t.bk * row4 * 4) as usize];
                    for v in 0..staged_vec4s(t, operand) {
                        for a in stage_stores(t, operand, transposed, v) {
                            for w in a.word..a.word + a.words {
                                hit[w as usize] += 1;
                            }
                        }
                    }
                    for k in 0..t.bk {
                        for i in 0..len {
                            assert_eq!(hit[(k * row4 * 4 + i) as usize], 1, "{t:?} {operand:?} {transposed}");
                        }
                    }
                }
            }
        }
    }

    /// The shader holds the index expressions this module mirrors.
    #[test]
    fn the_shader_uses_these_formulas() {
        let src = super::super::MATMUL;
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
        ] {
            assert!(src.contains(line), "matmul.wgsl no longer contains `{line}`");
        }
        assert_eq!(src.matches("let m = v % BM;").count(), 2);
        assert_eq!(src.matches("let n = v % BN;").count(), 2);
    }
}
