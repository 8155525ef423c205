//! Host models of the tensor-core pipeline (`shaders/cuda/matmul_mma.cu`, transliterated) as
//! `matmul_f16_bf16_*` runs it: the loaders' thread-to-element map (`cp_operand`), the stage
//! ring's ordering, the `ldmatrix` fragment reads with the per-register f16 → bf16 rounding
//! (`f16x2_to_bf16x2`), and the shared-memory banks of the fragment reads. Each model is checked
//! against what the kernel source says, and each checker is shown to reject a broken plan.

use super::*;
use crate::catalogue::cuda::source_define as define;
use half::{bf16, f16};

const SRC: &str = include_str!("../../../../../../shaders/cuda/matmul_mma.cu");

/// The body of the PTX entry `name`.
fn ptx_entry(name: &str) -> &'static str {
    let ptx = super::super::Module::MatmulMma.ptx();
    let body = &ptx[ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} in the PTX"))..];
    &body[..body.find("\n}\n").expect("the end of the entry")]
}

#[test]
fn the_constants_are_the_kernels() {
    assert_eq!(define(SRC, "TC_BM"), BM);
    assert_eq!(define(SRC, "TC_BN"), BN);
    assert_eq!(define(SRC, "TC_BKP"), BKP);
    assert_eq!(define(SRC, "TC_STAGES"), STAGES);
    assert_eq!(define(SRC, "TC_PAD"), PAD);
    assert_eq!(define(SRC, "TC_THREADS"), THREADS);
    assert_eq!(THREADS as u32, super::super::THREADS);
    assert_eq!((BM, BN), (super::super::MATMUL_TILE_M, super::super::MATMUL_TILE_N));
    assert_eq!(define(SRC, "TC_STAGES32"), F32_STAGES);
    assert_eq!(define(SRC, "TC_PAD32_KC"), F32_PAD_KC);
    assert_eq!(define(SRC, "TC_PAD32_MN"), F32_PAD_MN);
    assert_eq!(define(SRC, "TC_SMEM32_BYTES"), F32_SMEM_BYTES as usize);
    assert_eq!(F32_SMEM_BYTES, 73728);
    // The entry points (storage, bf16 compute), all at two blocks per SM.
    for entry in [
        "TC_ENTRY(matmul_f16_f16, f16, false)",
        "TC_ENTRY(matmul_bf16_bf16, bf16, true)",
        "TC_ENTRY(matmul_f16_bf16, f16, true)",
        "TC_ENTRY(matmul_f32_bf16, float, true)",
        "__launch_bounds__(TC_THREADS, 2) NAME##_tt",
    ] {
        assert!(SRC.contains(entry), "the kernel no longer declares {entry:?}");
    }
    // Launches pass the f32 ring as dynamic shared memory, and only for the f32 kernels.
    for t in ["nn", "nt", "tn", "tt"] {
        for (storage, bytes) in [("f32_bf16", F32_SMEM_BYTES), ("f16_bf16", 0), ("f16_f16", 0), ("bf16_bf16", 0)] {
            let entry = format!("matmul_{storage}_{t}");
            assert_eq!(super::super::entry_dynamic_smem_bytes(&entry), bytes, "{entry}");
        }
    }
    // The ring's schedule and the loader's map as the models below read them.
    for anchor in [
        "cp_async_wait<TC_STAGES - 2>();\n        __syncthreads();\n        if (kt + TC_STAGES - 1 < ktiles) issue(kt + TC_STAGES - 1);",
        "const int st = kt % TC_STAGES;",
        "const int r = tid / S::VECS_PER_ROW, c = (tid % S::VECS_PER_ROW) * 8;",
        "store8_raw<TIn>(dst, load8<TIn>(base, ld, rows, cols, row, col, false));",
        "CvtF16<TIn, BF>::V>(acc, sa(st), sb(st), 0, wm, wn, lane);",
        "template <> struct CvtF16<f16, true> { static constexpr bool V = true; };",
        // `mma_step`'s fragment addresses, as `a_row_addr` and `b_row_addr` transliterate them,
        // and its rounding of every A and B register.
        "ldmatrix_x4(af[mt], ta + (mb + lr + (lj & 1) * 8) * SA + ks + (lj >> 1) * 8);",
        "ldmatrix_x4_trans(af[mt], ta + (ks + lr + (lj >> 1) * 8) * SA + mb + (lj & 1) * 8);",
        "ldmatrix_x4(r, tb + (nb + lr + (lj >> 1) * 8) * SB + ks + (lj & 1) * 8);",
        "ldmatrix_x4_trans(r, tb + (ks + lr + (lj & 1) * 8) * SB + nb + (lj >> 1) * 8);",
        "for (int i = 0; i < 4; i++) af[mt][i] = f16x2_to_bf16x2(af[mt][i]);",
        "for (int i = 0; i < 2; i++) bf[nt][i] = f16x2_to_bf16x2(bf[nt][i]);",
        // The f32 ring, loader and fragment reads (`f32_ring_schedule`, `LOADER32`, `frag32`).
        "cp_async_wait<TC_STAGES32 - 2>();\n        __syncthreads();\n        if (kt + TC_STAGES32 - 1 < ktiles) issue(kt + TC_STAGES32 - 1);",
        "const int st = kt % TC_STAGES32;",
        "const int v = tid + i * TC_THREADS;\n        const int r = v / S::VECS_PER_ROW, c = (v % S::VECS_PER_ROW) * 4;",
        "} else if (vec && col + 3 < cols) {",
        "const float2 x = *(const float2*)(t + i * S + kk);\n        return f32x2_to_bf16x2(x.x, x.y);",
        "return f32x2_to_bf16x2(t[kk * S + i], t[(kk + 1) * S + i]);",
        "af[0] = frag32<A_KC, SA>(ta, m, t2);\n        af[1] = frag32<A_KC, SA>(ta, m + 8, t2);\n        af[2] = frag32<A_KC, SA>(ta, m, t2 + 8);\n        af[3] = frag32<A_KC, SA>(ta, m + 8, t2 + 8);",
        "bf[nt][0] = frag32<B_KC, SB>(tb, n, t2);\n        bf[nt][1] = frag32<B_KC, SB>(tb, n, t2 + 8);",
        "const int g = lane >> 2, t2 = (lane & 3) * 2;",
        "const int m = wm + mt * 16 + g;",
        "const int n = wn + nt * 8 + g;",
    ] {
        assert!(SRC.contains(anchor), "the kernel no longer reads {anchor:?}");
    }
    // The PTX: per 16-deep step the f16 → bf16 kernels round 16 A and 8 B fragment registers
    // (24 packed conversions, 48 f16 → f32) and run bf16 MMAs on the copies of the pipeline;
    // the kernels multiplied as stored convert nothing.
    for t in ["nn", "nt", "tn", "tt"] {
        let body = ptx_entry(&format!("matmul_f16_bf16_{t}"));
        assert_eq!(body.matches("cvt.rn.bf16x2.f32").count(), 24, "matmul_f16_bf16_{t}");
        assert_eq!(body.matches("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32").count(), 16);
        assert_eq!(body.matches("cp.async.cg.shared.global").count(), 2 * 8, "matmul_f16_bf16_{t}");
        assert!(!body.contains("cvt.rn.bf16.f32"), "matmul_f16_bf16_{t} rounds on the way in");
        let same = ptx_entry(&format!("matmul_f16_f16_{t}"));
        assert_eq!(same.matches("cvt.rn.bf16x2.f32").count(), 0);
        // The f32 kernels: the same 24 conversions (from f32 read with 64- or 32-bit shared
        // loads, no `ldmatrix`), the ring in dynamic shared memory, no static array.
        let f32 = ptx_entry(&format!("matmul_f32_bf16_{t}"));
        assert_eq!(f32.matches("cvt.rn.bf16x2.f32").count(), 24, "matmul_f32_bf16_{t}");
        assert_eq!(f32.matches("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32").count(), 16);
        assert!(f32.contains("cp.async.cg.shared.global"), "matmul_f32_bf16_{t}");
        assert!(!f32.contains("ldmatrix") && !f32.contains("cvt.rn.bf16.f32"), "matmul_f32_bf16_{t}");
        assert!(!f32.contains(".shared .align"), "matmul_f32_bf16_{t} declares static shared memory");
    }
    assert!(super::super::Module::MatmulMma.ptx().contains(".extern .shared .align 16 .b8 tc_dyn[];"));
}

// ---------------------------------------------------------------------------------------------
// The rounding: `f16x2_to_bf16x2` as the source writes it.

/// Which input half (0: low, 1: high) each output half (low, high) of `f16x2_to_bf16x2` is
/// converted from, read from the kernel's `asm` block: `mov.b32 {lo, hi}, %1` unpacks (low half
/// first), `cvt.f32.f16 f, h` widens, `cvt.rn.bf16x2.f32 %0, a, b` packs `a` into the upper
/// half and `b` into the lower.
fn conversion_halves(src: &str) -> [usize; 2] {
    let body = &src[src.find("u32 f16x2_to_bf16x2(u32 x)").expect("f16x2_to_bf16x2")..];
    let body = &body[..body.find("\n}\n").expect("its end")];
    let operands = |op: &str| -> Vec<String> {
        let at = body.find(op).unwrap_or_else(|| panic!("no {op} in f16x2_to_bf16x2"));
        let rest = &body[at + op.len()..];
        let rest = &rest[..rest.find(';').expect("an instruction ends")];
        rest.split(|c: char| c == ',' || c == '{' || c == '}' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let unpack = operands("mov.b32");
    assert_eq!(unpack.len(), 3, "{unpack:?}");
    let half_of = |name: &str| unpack[..2].iter().position(|u| u == name).expect("an unpacked half");
    // Each `cvt.f32.f16 f, h`: the f32 register f holds input half `half_of(h)`.
    let mut widened = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find("cvt.f32.f16") {
        let line = &rest[at + "cvt.f32.f16".len()..];
        let line = &line[..line.find(';').expect("an instruction ends")];
        let ops: Vec<&str> = line.split([',', ' ', '\t']).filter(|s| !s.is_empty()).collect();
        widened.push((ops[0].to_string(), half_of(ops[1])));
        rest = &rest[at + 1..];
    }
    let from = |f: &str| widened.iter().find(|(w, _)| w == f).expect("a widened half").1;
    let pack = operands("cvt.rn.bf16x2.f32");
    assert_eq!((pack.len(), pack[0].as_str()), (3, "%0"), "{pack:?}");
    // Output low half from operand b, high half from operand a.
    [from(&pack[2]), from(&pack[1])]
}

/// `cvt.rn.bf16.f32` (and each half of `cvt.rn.bf16x2.f32`): nearest even; NaN stays NaN.
fn cvt_rn_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// The kernel's fragment rounding, as the source's operand order makes it.
fn f16x2_to_bf16x2(x: u32, halves: [usize; 2]) -> u32 {
    let h = [x as u16, (x >> 16) as u16];
    let r = |i: usize| cvt_rn_bf16(f16::from_bits(h[halves[i]]).to_f32()) as u32;
    r(0) | (r(1) << 16)
}

/// What the register-staged kernel stored for an f16 input: `mma_bits<f16, true>`, that is
/// `f32_to_bf16_bits(to_f32(x))`.
fn staged_bits(x: u16) -> u16 {
    cvt_rn_bf16(f16::from_bits(x).to_f32())
}

/// Nearest-even bf16 of an exactly known value, from the definition: the two neighbouring
/// bf16 and the distance to each (f64 holds every distance exactly at these magnitudes).
fn rne_bf16_of_exact(v: f64) -> u16 {
    let lo = bf16::from_bits(bf16::from_f64(v).to_bits());
    // `from_f64` truncates through f32 here: step to the neighbours explicitly.
    let (mut a, mut b) = (lo, lo);
    while a.to_f64() > v {
        a = bf16::from_bits(if a.to_f64() > 0.0 { a.to_bits() - 1 } else { a.to_bits() + 1 });
    }
    while b.to_f64() < v {
        b = bf16::from_bits(if b.to_f64() >= 0.0 { b.to_bits() + 1 } else { b.to_bits() - 1 });
    }
    let (da, db) = (v - a.to_f64(), b.to_f64() - v);
    if da < db || (da == db && a.to_bits() & 1 == 0) { a.to_bits() } else { b.to_bits() }
}

#[test]
fn rounding_fragments_is_rounding_on_the_way_in() {
    let halves = conversion_halves(SRC);
    assert_eq!(halves, [0, 1], "the conversion must keep each value in its half");
    // Every f16 pattern in both halves (paired with a different partner each time).
    for x in 0..=u16::MAX {
        let y = x.rotate_left(7) ^ 0x5a5a;
        for (lo, hi) in [(x, y), (y, x)] {
            let packed = lo as u32 | (hi as u32) << 16;
            let staged = staged_bits(lo) as u32 | (staged_bits(hi) as u32) << 16;
            assert_eq!(f16x2_to_bf16x2(packed, halves), staged, "{lo:#06x} {hi:#06x}");
        }
    }
    // The argument: f16 → f32 is exact for every non-NaN f16 (subnormals included), so the one
    // rounding is the nearest-even bf16 of the f16 value itself, which is also what the CPU
    // reference of the policy computes (`DType::Bf16.round_f32` of the input as f32).
    for x in 0..=u16::MAX {
        let h = f16::from_bits(x);
        if h.is_nan() {
            assert!(bf16::from_bits(staged_bits(x)).is_nan());
            continue;
        }
        let exact = h.to_f64();
        assert_eq!(h.to_f32() as f64, exact, "{x:#06x}");
        assert_eq!(staged_bits(x), rne_bf16_of_exact(exact), "{x:#06x}");
        assert_eq!(bf16::from_bits(staged_bits(x)).to_f32(), crate::DType::Bf16.round_f32(exact as f32), "{x:#06x}");
    }
}

#[test]
fn a_swapped_conversion_is_caught() {
    let swapped = SRC.replace("cvt.rn.bf16x2.f32 %0, fhi, flo;", "cvt.rn.bf16x2.f32 %0, flo, fhi;");
    assert_ne!(swapped, SRC);
    assert_eq!(conversion_halves(&swapped), [1, 0]);
    let x = 0x3c00_u32 | 0x4000 << 16; // 1.0 low, 2.0 high
    assert_ne!(f16x2_to_bf16x2(x, [1, 0]), staged_bits(0x3c00) as u32 | (staged_bits(0x4000) as u32) << 16);
}

// ---------------------------------------------------------------------------------------------
// The loaders: `cp_operand` over edge shapes, transposes, views and batches.

/// One operand as the kernel sees it: stored `rows × cols` per batch at
/// `off + b·bs + r·ld + c` (in elements).
#[derive(Clone, Copy, Debug)]
struct View {
    off: usize,
    ld: usize,
    bs: usize,
}

impl View {
    /// Whether the launch sets the operand's `MM_*_VEC` flag (`matmul_params`): offset, ld and
    /// batch stride multiples of one 16-byte vector of `w` elements.
    fn vec(self, w: usize) -> bool {
        self.off.is_multiple_of(w) && self.ld.is_multiple_of(w) && self.bs.is_multiple_of(w)
    }
}

/// One cell of a stage's tile after the loader ran on all 256 threads: the stored bits of
/// an element (by its index in the operand's buffer), zero bits, or nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cell {
    Unwritten,
    Zero,
    Elem(usize),
}

/// A loader's geometry: `w` elements per 16-byte vector, `per_thread` vectors a thread.
/// `cp_operand` (16-bit): 8 and 1; `cp_operand32` (f32): 4 and 2.
#[derive(Clone, Copy, Debug)]
struct Loader {
    w: usize,
    per_thread: usize,
}

const LOADER16: Loader = Loader { w: 8, per_thread: 1 };
const LOADER32: Loader = Loader { w: 4, per_thread: 2 };

/// The map both loaders apply (transliterated; `vpr` is `S::VECS_PER_ROW`, the tile's
/// columns over `w`): vector `v` covers `w` consecutive cells of tile row `r` from column `c`.
fn vector_cells(ld: Loader, vpr: usize, v: usize) -> (usize, usize) {
    (v / vpr, (v % vpr) * ld.w)
}

/// One operand's slice as a loader sees it: `kc` (K contiguous), the operand's extent
/// along M or N and its K, the tile's first row or column `outer`, the slice's `k0`, the view
/// and the batch `bt`.
#[derive(Clone, Copy, Debug)]
struct Slice {
    kc: bool,
    extent: usize,
    kdim: usize,
    outer: usize,
    k0: usize,
    v: View,
    bt: usize,
}

/// Replays a loader on all 256 threads for one slice: returns the tile (the logical rows ×
/// columns, padding left out) and the number of 16-byte copies, and checks that no cell is
/// written twice and that every copy is 16-byte aligned.
fn replay_loader(ld: Loader, sl: Slice, vpr: usize) -> (Vec<Cell>, usize) {
    let Slice { kc, extent, kdim, outer, k0, v, bt } = sl;
    let (trows, tcols) = if kc { (BM, BKP) } else { (BKP, BM) };
    let mut tile = vec![Cell::Unwritten; trows * tcols];
    let mut copies = 0;
    let base = v.off + bt * v.bs;
    for tid in 0..THREADS {
        for i in 0..ld.per_thread {
            let (r, c) = vector_cells(ld, vpr, tid + i * THREADS);
            let (row, col) = if kc { (outer + r, k0 + c) } else { (k0 + r, outer + c) };
            let (rows, cols) = if kc { (extent, kdim) } else { (kdim, extent) };
            let mut put = |j: usize, cell: Cell| {
                assert!(r < trows && c + j < tcols, "thread {tid} writes outside the tile");
                let at = r * tcols + c + j;
                assert_eq!(tile[at], Cell::Unwritten, "cell {r},{} written twice", c + j);
                tile[at] = cell;
            };
            if row >= rows || col >= cols {
                (0..ld.w).for_each(|j| put(j, Cell::Zero));
            } else if v.vec(ld.w) && col + ld.w - 1 < cols {
                let e = base + row * v.ld + col;
                assert!(e.is_multiple_of(ld.w), "16-byte copy from element {e}");
                copies += 1;
                (0..ld.w).for_each(|j| put(j, Cell::Elem(e + j)));
            } else {
                for j in 0..ld.w {
                    let ok = row < rows && col + j < cols;
                    put(j, if ok { Cell::Elem(base + row * v.ld + col + j) } else { Cell::Zero });
                }
            }
        }
    }
    (tile, copies)
}

/// Checks a replayed tile against the operand: each cell holds its element inside the matrix
/// and zero outside.
fn check_tile(tile: &[Cell], sl: Slice) {
    let Slice { kc, extent, kdim, outer, k0, v, bt } = sl;
    let (trows, tcols) = if kc { (BM, BKP) } else { (BKP, BM) };
    let (rows, cols) = if kc { (extent, kdim) } else { (kdim, extent) };
    for r in 0..trows {
        for c in 0..tcols {
            let (row, col) = if kc { (outer + r, k0 + c) } else { (k0 + r, outer + c) };
            let want =
                if row < rows && col < cols { Cell::Elem(v.off + bt * v.bs + row * v.ld + col) } else { Cell::Zero };
            assert_eq!(tile[r * tcols + c], want, "cell {r},{c}");
        }
    }
}

/// The shapes: 1, primes, non-multiples of 4, 8, 16 and 128, and exact tiles.
const EXTENTS: [usize; 8] = [1, 6, 7, 16, 17, 127, 128, 131];
const KS: [usize; 8] = [1, 5, 6, 8, 15, 16, 33, 48];

/// Replays `ld` over every shape, transpose, view and batch; returns the 16-byte copies.
fn loader_coverage(ld: Loader) -> usize {
    let mut copies = 0;
    for kc in [true, false] {
        let vpr = if kc { BKP / ld.w } else { BM / ld.w };
        for &extent in &EXTENTS {
            for &kdim in &KS {
                let (rows, cols) = if kc { (extent, kdim) } else { (kdim, extent) };
                // Aligned, padded (ld rounded up to 8) and unaligned (offset 3, or 2 for f32
                // storage's half-vector) views; two batches.
                let padded = cols.next_multiple_of(8);
                for v in [
                    View { off: 0, ld: cols, bs: rows * cols },
                    View { off: 8, ld: padded, bs: rows * padded + 8 },
                    View { off: 3, ld: padded, bs: rows * padded },
                    View { off: 2, ld: padded, bs: rows * padded },
                ] {
                    for bt in 0..2 {
                        for outer in (0..extent).step_by(BM) {
                            for k0 in (0..kdim).step_by(BKP) {
                                let sl = Slice { kc, extent, kdim, outer, k0, v, bt };
                                let (tile, n) = replay_loader(ld, sl, vpr);
                                check_tile(&tile, sl);
                                copies += n;
                            }
                        }
                    }
                }
            }
        }
    }
    copies
}

#[test]
fn the_loaders_cover_every_tile_cell_once() {
    // The vector paths are taken (the test is not vacuous about alignment).
    let copies = loader_coverage(LOADER16);
    assert!(copies > 1000, "{copies}");
    let copies = loader_coverage(LOADER32);
    assert!(copies > 2000, "{copies}");
}

#[test]
fn a_broken_loader_map_is_caught() {
    // Rows of the K-contiguous tile computed with the other shape's vectors per row: threads
    // collide or leave cells unwritten.
    for (ld, wrong_vpr) in [(LOADER16, BM / 8), (LOADER32, BM / 4)] {
        let broken = std::panic::catch_unwind(|| {
            let v = View { off: 0, ld: 16, bs: 128 * 16 };
            let sl = Slice { kc: true, extent: 128, kdim: 16, outer: 0, k0: 0, v, bt: 0 };
            let (tile, _) = replay_loader(ld, sl, wrong_vpr);
            check_tile(&tile, sl);
        });
        assert!(broken.is_err());
    }
}

// ---------------------------------------------------------------------------------------------
// The ring: `mainloop_cp_async`'s commit groups, waits and barriers.

/// Replays the schedule for `ktiles` slices with `stages` stages and the wait depth `pending`
/// (`cp_async_wait<pending>`): returns an error if a slice is multiplied before its group
/// completed or a stage is refilled while a warp may still read it.
fn ring_schedule(ktiles: usize, stages: usize, pending: usize, ahead: usize) -> Result<(), String> {
    // Group g holds slice g (empty past the end); one group is committed per prologue step and
    // per iteration. `ahead`: slices in flight (`TC_STAGES - 1` in the kernel).
    let mut committed = 0;
    let mut stage_slice: Vec<Option<usize>> = vec![None; stages];
    for kt in 0..ahead {
        if kt < ktiles {
            stage_slice[kt % stages] = Some(kt);
        }
        committed += 1;
    }
    // The slice each stage was last multiplied from, by iterations before the current barrier.
    let mut read_before_barrier: Vec<Option<usize>> = vec![None; stages];
    for kt in 0..ktiles {
        // `cp_async_wait<pending>`: all but the `pending` most recent groups are complete.
        let complete = committed - pending.min(committed);
        if kt >= complete {
            return Err(format!("slice {kt} multiplied before its copies completed"));
        }
        // `__syncthreads()`: every warp finished the iterations before this one.
        let next = kt + ahead;
        if next < ktiles {
            let st = next % stages;
            if let Some(old) = stage_slice[st]
                && old >= kt
            {
                return Err(format!("stage {st} refilled with slice {next} while slice {old} is unread"));
            }
            if let Some(old) = stage_slice[st] {
                assert_eq!(read_before_barrier[st], Some(old));
            }
            stage_slice[st] = Some(next);
        }
        committed += 1;
        let st = kt % stages;
        if stage_slice[st] != Some(kt) {
            return Err(format!("slice {kt} is not in stage {st}"));
        }
        read_before_barrier[st] = Some(kt);
    }
    Ok(())
}

#[test]
fn the_ring_waits_before_it_reads_and_refills_after() {
    for ktiles in 1..40 {
        ring_schedule(ktiles, STAGES, STAGES - 2, STAGES - 1).unwrap_or_else(|e| panic!("ktiles {ktiles}: {e}"));
    }
    // Broken: waiting for one group fewer reads slice kt too early; as many slices ahead as
    // stages refills the stage about to be read.
    let early = ring_schedule(8, STAGES, STAGES - 1, STAGES - 1).expect_err("an early read");
    assert!(early.contains("before its copies completed"), "{early}");
    let refill = ring_schedule(8, STAGES, STAGES - 1, STAGES).expect_err("an early refill");
    assert!(refill.contains("refilled"), "{refill}");
    // The f32 ring: three stages, two slices ahead, `cp_async_wait<TC_STAGES32 - 2>`.
    for ktiles in 1..40 {
        ring_schedule(ktiles, F32_STAGES, F32_STAGES - 2, F32_STAGES - 1)
            .unwrap_or_else(|e| panic!("f32, ktiles {ktiles}: {e}"));
    }
    assert!(ring_schedule(8, F32_STAGES, F32_STAGES - 2, F32_STAGES).is_err());
}

// ---------------------------------------------------------------------------------------------
// The fragment reads: `mma_step`'s `ldmatrix` addresses, the matrices they load, the rounding
// and the banks.

/// `ldmatrix.x4` (`trans` or not) on a tile of 16-bit cells (`stride` elements per row), with
/// lane `l` giving the row address `addr(l)` (an element index): register j of lane l.
fn ldmatrix_x4(tile: &[u16], addr: impl Fn(usize) -> usize, trans: bool) -> [[u32; 4]; 32] {
    let mut out = [[0u32; 4]; 32];
    for (l, regs) in out.iter_mut().enumerate() {
        for (j, reg) in regs.iter_mut().enumerate() {
            // Matrix j: rows from lanes 8j..8j+7. Non-transposed: lane l gets row l/4,
            // elements 2(l%4), 2(l%4)+1; transposed: column l/4 of rows 2(l%4), 2(l%4)+1.
            let (e0, e1) = if trans {
                let (r0, c) = (2 * (l % 4), l / 4);
                (addr(8 * j + r0) + c, addr(8 * j + r0 + 1) + c)
            } else {
                let (r, c0) = (l / 4, 2 * (l % 4));
                (addr(8 * j + r) + c0, addr(8 * j + r) + c0 + 1)
            };
            *reg = tile[e0] as u32 | (tile[e1] as u32) << 16;
        }
    }
    out
}

/// The A and B fragments one warp reads for a step (`mma_step`, transliterated): for warp
/// offsets `wm`, `wn` and tile strides `sa`, `sb`; the tiles hold (M or N, K) coordinates
/// encoded by `enc`.
struct Frags {
    a: Vec<[[u32; 4]; 32]>,
    b: Vec<[[u32; 2]; 32]>,
}

/// The row address (element index in the tile) lane `l` gives an A `ldmatrix` of the
/// 16-row block at `mb` (`mma_step`, `ks` = 0): `lj = l >> 3`, `lr = l & 7`.
fn a_row_addr(kc: bool, stride: usize, mb: usize, l: usize) -> usize {
    let (lj, lr) = (l >> 3, l & 7);
    if kc {
        (mb + lr + (lj & 1) * 8) * stride + (lj >> 1) * 8
    } else {
        (lr + (lj >> 1) * 8) * stride + mb + (lj & 1) * 8
    }
}

/// The same for B's 16-column block at `nb`.
fn b_row_addr(kc: bool, stride: usize, nb: usize, l: usize) -> usize {
    let (lj, lr) = (l >> 3, l & 7);
    if kc {
        (nb + lr + (lj >> 1) * 8) * stride + (lj & 1) * 8
    } else {
        (lr + (lj & 1) * 8) * stride + nb + (lj >> 1) * 8
    }
}

fn read_frags(ta: &[u16], tb: &[u16], a_kc: bool, b_kc: bool, wm: usize, wn: usize, pad: usize) -> Frags {
    let sa = (if a_kc { BKP } else { BM }) + pad;
    let sb = (if b_kc { BKP } else { BN }) + pad;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for mt in 0..4 {
        let mb = wm + mt * 16;
        a.push(ldmatrix_x4(ta, |l| a_row_addr(a_kc, sa, mb, l), !a_kc));
    }
    for np in 0..2 {
        let nb = wn + np * 16;
        let r = ldmatrix_x4(tb, |l| b_row_addr(b_kc, sb, nb, l), !b_kc);
        b.push(std::array::from_fn(|l| [r[l][0], r[l][1]]));
        b.push(std::array::from_fn(|l| [r[l][2], r[l][3]]));
    }
    Frags { a, b }
}

/// A tile whose cell at (outer i, k) holds the f16 pattern `val(i, k)`, in the layout `kc`.
fn tile_of(kc: bool, pad: usize, val: impl Fn(usize, usize) -> u16) -> Vec<u16> {
    let (rows, cols) = if kc { (BM, BKP) } else { (BKP, BM) };
    let stride = cols + pad;
    let mut t = vec![0xffffu16; rows * stride];
    for r in 0..rows {
        for c in 0..cols {
            let (i, k) = if kc { (r, c) } else { (c, r) };
            t[r * stride + c] = val(i, k);
        }
    }
    t
}

#[test]
fn fragments_hold_the_rounded_mma_operands() {
    let halves = conversion_halves(SRC);
    // Distinct f16 patterns per cell and operand (every pattern appears across the seeds).
    for seed in 0..16u32 {
        let av = |m: usize, k: usize| ((m * 16 + k) as u32 * 2 + seed * 4096) as u16;
        let bv = |n: usize, k: usize| ((n * 16 + k) as u32 * 2 + 1 + seed * 4096) as u16;
        for (a_kc, b_kc) in [(true, false), (true, true), (false, false), (false, true)] {
            let ta = tile_of(a_kc, PAD, av);
            let tb = tile_of(b_kc, PAD, bv);
            for warp in 0..8 {
                let (wm, wn) = ((warp >> 2) * 64, (warp & 3) * 32);
                let f = read_frags(&ta, &tb, a_kc, b_kc, wm, wn, PAD);
                for l in 0..32 {
                    let (g, t) = (l / 4, l % 4);
                    let pair = |x: u16, y: u16| staged_bits(x) as u32 | (staged_bits(y) as u32) << 16;
                    for mt in 0..4 {
                        let m = wm + mt * 16;
                        // m16n8k16 A fragment: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8).
                        let want = [(g, 0), (g + 8, 0), (g, 8), (g + 8, 8)]
                            .map(|(r, k)| pair(av(m + r, 2 * t + k), av(m + r, 2 * t + k + 1)));
                        let got = f.a[mt][l].map(|x| f16x2_to_bf16x2(x, halves));
                        assert_eq!(got, want, "A kc {a_kc} warp {warp} lane {l} mt {mt}");
                    }
                    for nt in 0..4 {
                        let n = wn + nt * 8 + g;
                        // B fragment: b0 (k 2t, 2t+1; n g), b1 (k 2t+8, 2t+9).
                        let want = [0, 8].map(|k| pair(bv(n, 2 * t + k), bv(n, 2 * t + k + 1)));
                        let got = f.b[nt][l].map(|x| f16x2_to_bf16x2(x, halves));
                        assert_eq!(got, want, "B kc {b_kc} warp {warp} lane {l} nt {nt}");
                    }
                }
            }
        }
    }
}

/// The worst bank-conflict degree of one step's `ldmatrix` reads of a tile (`kc`: K
/// contiguous; `a`: A's or B's addresses) at element `stage_base` of shared memory: each
/// 8-lane phase reads 8 rows of 16 bytes, conflict-free when they fall on 8 distinct 16-byte
/// bank groups.
fn ldmatrix_conflicts(a: bool, kc: bool, pad: usize, stage_base: usize) -> usize {
    let stride = (if kc { BKP } else { BM }) + pad;
    let mut worst = 1;
    for warp in 0..8 {
        let (wm, wn) = ((warp >> 2) * 64, (warp & 3) * 32);
        let blocks: Vec<usize> = if a { (0..4).map(|mt| wm + mt * 16).collect() } else { vec![wn, wn + 16] };
        for outer in blocks {
            for j in 0..4 {
                let mut groups = [0usize; 8];
                for l in 8 * j..8 * j + 8 {
                    let e = if a { a_row_addr(kc, stride, outer, l) } else { b_row_addr(kc, stride, outer, l) };
                    let byte = (stage_base + e) * 2;
                    assert!(byte.is_multiple_of(16), "ldmatrix rows are 16-byte aligned");
                    groups[(byte / 16) % 8] += 1;
                }
                worst = worst.max(*groups.iter().max().expect("8 groups"));
            }
        }
    }
    worst
}

#[test]
fn fragment_reads_are_conflict_free() {
    for st in 0..STAGES {
        for op in 0..2 {
            // Stage `st` of A, then of B (`sa(st)`, `sb(st)`).
            let base = (st * 2 + op) * TILE;
            for kc in [true, false] {
                assert_eq!(ldmatrix_conflicts(op == 0, kc, PAD, base), 1, "operand {op}, kc {kc}, stage {st}");
            }
        }
    }
    // Without the padding the 32-byte rows of the K-contiguous tile repeat every 4 rows
    // (2-way) and the 256-byte rows of the other all land on one group (8-way).
    for a in [true, false] {
        assert_eq!(ldmatrix_conflicts(a, true, 0, 0), 2);
        assert_eq!(ldmatrix_conflicts(a, false, 0, 0), 8);
    }
}

// ---------------------------------------------------------------------------------------------
// The f32 ring's fragment reads: `frag32` and `mma_step32`, and their banks.

/// `f32x2_to_bf16x2(lo, hi)`: `asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo))`,
/// `%1` to the upper half. Returns which argument (0: `lo`, 1: `hi`) lands in the upper half,
/// read from the source.
fn f32_conversion_upper(src: &str) -> usize {
    let body = &src[src.find("u32 f32x2_to_bf16x2(float lo, float hi)").expect("f32x2_to_bf16x2")..];
    let body = &body[..body.find("\n}\n").expect("its end")];
    assert!(body.contains(r#"asm("cvt.rn.bf16x2.f32 %0, %1, %2;""#), "{body}");
    let inputs = &body[body.find(r#": "=r"(r) :"#).expect("the operands")..];
    let (hi, lo) = (inputs.find(r#""f"(hi)"#).expect("hi"), inputs.find(r#""f"(lo)"#).expect("lo"));
    // `%1` is the first input: the upper half.
    if hi < lo { 1 } else { 0 }
}

/// The kernel's f32 pair rounding as the source's operand order makes it.
fn f32x2_to_bf16x2(lo: f32, hi: f32, upper: usize) -> u32 {
    let (u, l) = if upper == 1 { (hi, lo) } else { (lo, hi) };
    cvt_rn_bf16(l) as u32 | (cvt_rn_bf16(u) as u32) << 16
}

#[test]
fn f32_pairs_round_like_the_staged_kernel() {
    let upper = f32_conversion_upper(SRC);
    assert_eq!(upper, 1, "the higher K index must go to the upper half");
    // The register-staged kernel stored `f32_to_bf16_bits(x)` per element, packed low-first:
    // the same `cvt.rn.bf16.f32` per value. Ties, subnormals, infinities, NaN, bf16 overflow.
    let xs = [
        0.0f32,
        -0.0,
        1.0,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -1.0 - 2f32.powi(-8),
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 / 3.0,
        -65504.0,
    ];
    for &lo in &xs {
        for &hi in &xs {
            let staged = cvt_rn_bf16(lo) as u32 | (cvt_rn_bf16(hi) as u32) << 16;
            assert_eq!(f32x2_to_bf16x2(lo, hi, upper), staged, "{lo} {hi}");
        }
    }
    let swapped = SRC.replace(r#": "f"(hi), "f"(lo));"#, r#": "f"(lo), "f"(hi));"#);
    assert_ne!(swapped, SRC);
    assert_eq!(f32_conversion_upper(&swapped), 0);
    assert_ne!(f32x2_to_bf16x2(1.0, 2.0, 0), f32x2_to_bf16x2(1.0, 2.0, 1));
}

/// The two tile cells (float indices) `frag32<KC, S>(t, i, kk)` reads: K offsets kk and kk + 1
/// of outer index i.
fn frag32_cells(kc: bool, stride: usize, i: usize, kk: usize) -> [usize; 2] {
    if kc { [i * stride + kk, i * stride + kk + 1] } else { [kk * stride + i, (kk + 1) * stride + i] }
}

/// One warp's fragment reads of a step (`mma_step32`): per fragment register, (the outer
/// index and K of its low half, the cells read). `a`: A's four per 16-row block, else B's two
/// per 8 columns.
fn step32_reads(a: bool, kc: bool, stride: usize, warp: usize, lane: usize) -> Vec<((usize, usize), [usize; 2])> {
    let (wm, wn) = ((warp >> 2) * 64, (warp & 3) * 32);
    let (g, t2) = (lane >> 2, (lane & 3) * 2);
    let mut out = Vec::new();
    if a {
        for mt in 0..4 {
            let m = wm + mt * 16 + g;
            for (i, kk) in [(m, t2), (m + 8, t2), (m, t2 + 8), (m + 8, t2 + 8)] {
                out.push(((i, kk), frag32_cells(kc, stride, i, kk)));
            }
        }
    } else {
        for nt in 0..4 {
            let n = wn + nt * 8 + g;
            for (i, kk) in [(n, t2), (n, t2 + 8)] {
                out.push(((i, kk), frag32_cells(kc, stride, i, kk)));
            }
        }
    }
    out
}

#[test]
fn f32_fragments_are_the_mma_operands() {
    // The loader's layout (cell (r, c) of the logical tile at r·stride + c, outer index and K
    // as `check_tile` places them) composed with `frag32`: each register's halves are the
    // m16n8k16 operand's elements (A: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8),
    // a3 (g + 8, 2t + 8); B: b0 (2t, g), b1 (2t + 8, g)), K in the low half first.
    for a in [true, false] {
        for kc in [true, false] {
            let stride = f32_stride(kc);
            let cell_of = |i: usize, k: usize| if kc { i * stride + k } else { k * stride + i };
            for warp in 0..8 {
                let (wm, wn) = ((warp >> 2) * 64, (warp & 3) * 32);
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    let want: Vec<(usize, usize)> = if a {
                        (0..4)
                            .flat_map(|mt| {
                                let m = wm + mt * 16;
                                [(m + g, 2 * t), (m + g + 8, 2 * t), (m + g, 2 * t + 8), (m + g + 8, 2 * t + 8)]
                            })
                            .collect()
                    } else {
                        (0..4).flat_map(|nt| [(wn + nt * 8 + g, 2 * t), (wn + nt * 8 + g, 2 * t + 8)]).collect()
                    };
                    let got = step32_reads(a, kc, stride, warp, lane);
                    assert_eq!(got.len(), want.len());
                    for (((i, k), cells), &(wi, wk)) in got.iter().zip(&want) {
                        assert_eq!((*i, *k), (wi, wk), "a {a} kc {kc} warp {warp} lane {lane}");
                        assert_eq!(*cells, [cell_of(wi, wk), cell_of(wi, wk + 1)], "a {a} kc {kc} lane {lane}");
                        // Inside the logical tile, never the padding.
                        assert!(wk + 1 < BKP && wi < BM);
                    }
                }
            }
        }
    }
}

/// The worst bank-conflict degree of one step's f32 fragment reads of a tile at float
/// `stage_base`: K-contiguous tiles are read with 64-bit loads (two phases of 16 lanes; a
/// phase is conflict-free when its distinct 8-byte words cover distinct bank pairs), the others
/// with 32-bit loads (32 lanes, distinct words on distinct banks). Each instruction is one
/// fragment register (and, for 32-bit, one of its two halves) across the warp.
fn f32_conflicts(a: bool, kc: bool, stride: usize, stage_base: usize) -> usize {
    let mut worst = 1;
    for warp in 0..8 {
        let reads: Vec<_> = (0..32).map(|l| step32_reads(a, kc, stride, warp, l)).collect();
        let registers = reads[0].len();
        for reg in 0..registers {
            let halves: &[usize] = if kc { &[0] } else { &[0, 1] };
            for &h in halves {
                // Lanes per phase: 16 for 64-bit loads, 32 for 32-bit ones.
                let per_phase = if kc { 16 } else { 32 };
                for phase in reads.chunks(per_phase) {
                    let mut words: Vec<usize> = phase.iter().map(|r| stage_base + r[reg].1[h]).collect();
                    if kc {
                        assert!(words.iter().all(|w| w.is_multiple_of(2)), "64-bit reads are 8-byte aligned");
                    }
                    words.sort_unstable();
                    words.dedup();
                    let mut banks = [0usize; 32];
                    for w in words {
                        banks[w % 32] += 1;
                        if kc {
                            banks[(w + 1) % 32] += 1;
                        }
                    }
                    worst = worst.max(*banks.iter().max().expect("32 banks"));
                }
            }
        }
    }
    worst
}

#[test]
fn f32_fragment_reads_are_conflict_free() {
    for st in 0..F32_STAGES {
        for op in 0..2 {
            // Stage `st` of A, then of B (`sa(st)`, `sb(st)` of `mainloop_f32`).
            let base = (st * 2 + op) * F32_TILE;
            for kc in [true, false] {
                assert_eq!(f32_conflicts(op == 0, kc, f32_stride(kc), base), 1, "operand {op}, kc {kc}, stage {st}");
            }
        }
    }
    // The padding is what makes them so: unpadded, the 64-bit reads are 2-way (rows 16 words
    // apart) and the 32-bit ones 4-way (K rows 128 words apart); half the K-contiguous padding
    // (20-word rows) still overlaps rows 0 and 3 of a half-warp.
    for a in [true, false] {
        assert_eq!(f32_conflicts(a, true, BKP, 0), 2);
        assert_eq!(f32_conflicts(a, false, BM, 0), 4);
        assert_eq!(f32_conflicts(a, true, BKP + 4, 0), 2);
    }
}
