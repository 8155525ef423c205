//! Host models of the tensor-core pipeline (`shaders/cuda/matmul_mma.cu`, transliterated) as
//! `matmul_f16_bf16_*` runs it: the loaders' thread-to-element map (`cp_operand`), the stage
//! ring's ordering, the `ldmatrix` fragment reads with the per-register f16 → bf16 rounding
//! (`f16x2_to_bf16x2`), and the shared-memory banks of the fragment reads. Each model is checked
//! against what the kernel source says, and each checker is shown to reject a broken plan.

use super::*;
use half::{bf16, f16};

const SRC: &str = include_str!("../../../../../../shaders/cuda/matmul_mma.cu");

/// The value of `#define NAME <int>` in `src`.
fn define(src: &str, name: &str) -> usize {
    let line = src
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
        .unwrap_or_else(|| panic!("no #define {name}"));
    line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

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
    // Which kernels run the pipeline (`PIPE`, the last argument) and which stage through
    // registers.
    for (entry, pipe) in [
        ("TC_ENTRY(matmul_f16_f16, f16, false, 2, 2, true)", true),
        ("TC_ENTRY(matmul_bf16_bf16, bf16, true, 2, 2, true)", true),
        ("TC_ENTRY(matmul_f16_bf16, f16, true, 2, 2, true)", true),
        ("TC_ENTRY(matmul_f32_bf16, float, true, 2, 1, false)", false),
    ] {
        assert!(SRC.contains(entry), "the kernel no longer declares {entry:?} (pipeline: {pipe})");
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
    }
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
/// `off + b·bs + r·ld + c`, and whether the launch sets its `MM_*_VEC` flag (16-byte loads:
/// offset, ld and batch stride multiples of 8 elements).
#[derive(Clone, Copy, Debug)]
struct View {
    off: usize,
    ld: usize,
    bs: usize,
}

impl View {
    fn vec(self) -> bool {
        self.off.is_multiple_of(8) && self.ld.is_multiple_of(8) && self.bs.is_multiple_of(8)
    }
}

/// One cell of a stage's tile after `cp_operand` ran on all 256 threads: the stored bits of
/// an element (by its index in the operand's buffer), zero bits, or nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cell {
    Unwritten,
    Zero,
    Elem(usize),
}

/// The map `cp_operand` applies (transliterated; `vpr` is `S::VECS_PER_ROW`): thread `tid`
/// writes 8 consecutive cells of tile row `r` from column `c`.
fn thread_cells(vpr: usize, tid: usize) -> (usize, usize) {
    (tid / vpr, (tid % vpr) * 8)
}

/// One operand's slice as `cp_operand` sees it: `kc` (K contiguous), the operand's extent
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

/// Replays `cp_operand` on all 256 threads for one slice: returns the tile (the logical rows ×
/// columns, padding left out) and the number of 16-byte copies, and checks that no cell is
/// written twice and that every copy is 16-byte aligned.
fn replay_loader(sl: Slice, vpr: usize) -> (Vec<Cell>, usize) {
    let Slice { kc, extent, kdim, outer, k0, v, bt } = sl;
    let (trows, tcols) = if kc { (BM, BKP) } else { (BKP, BM) };
    let mut tile = vec![Cell::Unwritten; trows * tcols];
    let mut copies = 0;
    let base = v.off + bt * v.bs;
    for tid in 0..THREADS {
        let (r, c) = thread_cells(vpr, tid);
        let (row, col) = if kc { (outer + r, k0 + c) } else { (k0 + r, outer + c) };
        let (rows, cols) = if kc { (extent, kdim) } else { (kdim, extent) };
        let mut put = |i: usize, cell: Cell| {
            let at = r * tcols + c + i;
            assert!(r < trows && c + i < tcols, "thread {tid} writes outside the tile");
            assert_eq!(tile[at], Cell::Unwritten, "cell {r},{} written twice", c + i);
            tile[at] = cell;
        };
        if row >= rows || col >= cols {
            (0..8).for_each(|i| put(i, Cell::Zero));
        } else if v.vec() && col + 7 < cols {
            let e = base + row * v.ld + col;
            assert!(e.is_multiple_of(8), "16-byte copy from element {e}");
            copies += 1;
            (0..8).for_each(|i| put(i, Cell::Elem(e + i)));
        } else {
            for i in 0..8 {
                let ok = row < rows && col + i < cols;
                put(i, if ok { Cell::Elem(base + row * v.ld + col + i) } else { Cell::Zero });
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

/// The shapes: 1, primes, non-multiples of 8, 16 and 128, and exact tiles.
const EXTENTS: [usize; 7] = [1, 7, 16, 17, 127, 128, 131];
const KS: [usize; 7] = [1, 5, 8, 15, 16, 33, 48];

#[test]
fn the_loaders_cover_every_tile_cell_once() {
    let mut copies = 0;
    for kc in [true, false] {
        let vpr = if kc { BKP / 8 } else { BM / 8 };
        for &extent in &EXTENTS {
            for &kdim in &KS {
                let (rows, cols) = if kc { (extent, kdim) } else { (kdim, extent) };
                // Aligned, padded (ld rounded up to 8) and unaligned (offset 3) views; two
                // batches.
                let padded = cols.next_multiple_of(8);
                for v in [
                    View { off: 0, ld: cols, bs: rows * cols },
                    View { off: 8, ld: padded, bs: rows * padded + 8 },
                    View { off: 3, ld: padded, bs: rows * padded },
                ] {
                    for bt in 0..2 {
                        for outer in (0..extent).step_by(BM) {
                            for k0 in (0..kdim).step_by(BKP) {
                                let sl = Slice { kc, extent, kdim, outer, k0, v, bt };
                                let (tile, n) = replay_loader(sl, vpr);
                                check_tile(&tile, sl);
                                copies += n;
                            }
                        }
                    }
                }
            }
        }
    }
    // The vector path is taken (the test is not vacuous about alignment).
    assert!(copies > 1000, "{copies}");
}

#[test]
fn a_broken_loader_map_is_caught() {
    // Rows of the K-contiguous tile computed with the other shape's vectors per row: threads
    // collide or leave cells unwritten.
    let broken = std::panic::catch_unwind(|| {
        let v = View { off: 0, ld: 16, bs: 128 * 16 };
        let sl = Slice { kc: true, extent: 128, kdim: 16, outer: 0, k0: 0, v, bt: 0 };
        let (tile, _) = replay_loader(sl, BM / 8);
        check_tile(&tile, sl);
    });
    assert!(broken.is_err());
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
