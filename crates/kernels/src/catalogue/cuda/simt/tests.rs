//! Host models of `matmul_f32`'s index plans (`shaders/cuda/matmul_simt.cu`, transliterated):
//! the loaders' thread-to-element maps, the stage ring's ordering, the shared-memory banks of
//! every store and float4 read, and the block swizzle. Each model is checked against the
//! constants the kernel source defines, and each checker is shown to reject a broken plan.

use super::*;
use crate::catalogue::cuda::source_define as define;
use std::collections::HashMap;

const SRC: &str = include_str!("../../../../../../shaders/cuda/matmul_simt.cu");
const COMMON: &str = include_str!("../../../../../../shaders/cuda/common.cuh");
/// Floats per shared row of either operand's tile.
const ROW: usize = BM + PAD;

#[test]
fn the_constants_are_the_kernels() {
    assert_eq!(define(SRC, "SG_BM"), BM);
    assert_eq!(define(SRC, "SG_BN"), BN);
    assert_eq!(define(SRC, "SG_BK"), BK);
    assert_eq!(define(SRC, "SG_PAD"), PAD);
    assert_eq!(define(SRC, "SG_STAGES"), STAGES);
    assert_eq!(define(SRC, "SG_THREADS"), THREADS);
    assert_eq!(define(SRC, "SG_SMEM_BYTES"), SMEM_BYTES as usize);
    assert_eq!(define(COMMON, "EPI_ROWS") * (define(COMMON, "EPI_COLS") + 4), EPI_FLOATS);
    assert_eq!(THREADS as u32, super::super::THREADS);
    assert_eq!((BM, BN), (super::super::MATMUL_TILE_M, super::super::MATMUL_TILE_N));
    // The ring is what the kernel declares (the limits are `const` assertions in simt.rs).
    assert_eq!(SMEM_BYTES, 50688);
    assert_eq!(MATMUL_F32.dynamic_smem_bytes(), SMEM_BYTES);
    assert_eq!(super::super::naive_matmul_kernel(crate::DType::F32).dynamic_smem_bytes(), 0);
    // The PTX takes its ring as dynamic shared memory and declares no static array.
    let ptx = MATMUL_F32.module.ptx();
    let body = &ptx[ptx.find(".entry matmul_f32(").expect("matmul_f32 in the PTX")..];
    let body = &body[..body.find("\n}\n").expect("the end of matmul_f32")];
    assert!(ptx.contains(".extern .shared .align 16 .b8 sg_dyn[];"));
    assert!(!body.contains(".shared .align"), "matmul_f32 declares static shared memory");
    // The ring's schedule as `ring_schedule` models it.
    for anchor in [
        "cp_async_wait<SG_STAGES - 2>();\n            __syncthreads();",
        "const int next = kt + SG_STAGES - 1, next_stage = next % SG_STAGES;",
        "if (fetch && a_regs) sgemm_sts_a(t, next_stage, tid, ra);",
    ] {
        assert!(SRC.contains(anchor), "the kernel no longer reads {anchor:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The loaders.

/// One operand as the kernel sees it: stored `rows × cols` per batch at
/// `off + b·bs + r·ld + c`, and whether the launch sets its `MM_*_VEC` flag.
#[derive(Clone, Copy, Debug)]
struct View {
    off: usize,
    ld: usize,
    bs: usize,
    vec: bool,
}

impl View {
    /// As `matmul_params` sets it: vector loads where offset, ld and batch stride are
    /// multiples of 4 floats.
    fn new(off: usize, ld: usize, bs: usize) -> View {
        View { off, ld, bs, vec: off.is_multiple_of(4) && ld.is_multiple_of(4) && bs.is_multiple_of(4) }
    }
}

/// A matmul launch: sizes, transposes and views.
#[derive(Clone, Copy, Debug)]
struct Mm {
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    a: View,
    b: View,
}

/// What lands in a shared cell: a global element (its address) or a zero fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Elem(usize),
    Zero,
}

/// The global reads and shared writes of one slice's loads, for one block and batch.
#[derive(Default)]
struct Slice {
    /// (operand 0 = A / 1 = B, shared word index within the stage, value).
    writes: Vec<(usize, usize, Val)>,
    /// (operand, first address, width in floats).
    reads: Vec<(usize, usize, usize)>,
    /// Shared-store instructions, per (thread, instruction number): operand and word index
    /// of each 4-byte store (or the first word of a 16-byte copy, with width 4).
    stores: Vec<(usize, usize, usize, usize, usize)>,
}

impl Mm {
    /// Address of A(gm, gk) = op(A)[gm][gk] in batch `bt`.
    fn a_at(&self, bt: usize, gm: usize, gk: usize) -> usize {
        let (r, c) = if self.ta { (gk, gm) } else { (gm, gk) };
        self.a.off + bt * self.a.bs + r * self.a.ld + c
    }
    /// Address of op(B)[gk][gn] in batch `bt`.
    fn b_at(&self, bt: usize, gk: usize, gn: usize) -> usize {
        let (r, c) = if self.tb { (gn, gk) } else { (gk, gn) };
        self.b.off + bt * self.b.bs + r * self.b.ld + c
    }

    /// `sgemm_fetch` (and, for A stored M×K, `sgemm_sts_a`) of slice `kt` for one block.
    fn load_slice(&self, bt: usize, m0: usize, n0: usize, kt: usize) -> Slice {
        let mut s = Slice::default();
        let k0 = kt * BK;
        for tid in 0..THREADS {
            let mut ins = 0;
            let mut store = |s: &mut Slice, op: usize, word: usize, width: usize| {
                s.stores.push((tid, ins, op, word, width));
                ins += 1;
            };
            if !self.ta {
                // sgemm_ldg_a: row tid/2, quads (tid % 2) + 2j; then sgemm_sts_a.
                let (row, gm) = (tid >> 1, m0 + (tid >> 1));
                let mut r = [[Val::Zero; 4]; 2];
                for (j, rj) in r.iter_mut().enumerate() {
                    let kq = ((tid & 1) + 2 * j) * 4;
                    let gk = k0 + kq;
                    if self.a.vec && gm < self.m && gk + 3 < self.k {
                        let at = self.a_at(bt, gm, gk);
                        s.reads.push((0, at, 4));
                        for (i, v) in rj.iter_mut().enumerate() {
                            *v = Val::Elem(at + i);
                        }
                    } else {
                        for (i, v) in rj.iter_mut().enumerate() {
                            if gm < self.m && gk + i < self.k {
                                let at = self.a_at(bt, gm, gk + i);
                                s.reads.push((0, at, 1));
                                *v = Val::Elem(at);
                            }
                        }
                    }
                }
                for (j, rj) in r.iter().enumerate() {
                    let kq = ((tid & 1) + 2 * j) * 4;
                    for (i, &v) in rj.iter().enumerate() {
                        let word = (kq + i) * ROW + row;
                        s.writes.push((0, word, v));
                        store(&mut s, 0, word, 1);
                    }
                }
            } else {
                self.cp_rows(&mut s, &mut store, 0, bt, k0, m0, tid);
            }
            if !self.tb {
                self.cp_rows(&mut s, &mut store, 1, bt, k0, n0, tid);
            } else {
                // sgemm_cp_bt: column tid/2, quads (tid % 2) + 2j, 4-byte copies.
                let (col, gn) = (tid >> 1, n0 + (tid >> 1));
                for j in 0..2 {
                    let kq = ((tid & 1) + 2 * j) * 4;
                    for i in 0..4 {
                        let word = (kq + i) * ROW + col;
                        let v = if gn < self.n && k0 + kq + i < self.k {
                            let at = self.b_at(bt, k0 + kq + i, gn);
                            s.reads.push((1, at, 1));
                            Val::Elem(at)
                        } else {
                            Val::Zero
                        };
                        s.writes.push((1, word, v));
                        store(&mut s, 1, word, 1);
                    }
                }
            }
        }
        s
    }

    /// `sgemm_cp_rows`: rows tid/32 and tid/32 + 8 of the slice, 4 elements from column
    /// 4·(tid % 32), one 16-byte copy where the view allows it.
    #[allow(clippy::too_many_arguments)]
    fn cp_rows(
        &self,
        s: &mut Slice,
        store: &mut impl FnMut(&mut Slice, usize, usize, usize),
        op: usize,
        bt: usize,
        k0: usize,
        c0: usize,
        tid: usize,
    ) {
        let (cmax, vec) = if op == 0 { (self.m, self.a.vec) } else { (self.n, self.b.vec) };
        let at = |gk: usize, gc: usize| if op == 0 { self.a_at(bt, gc, gk) } else { self.b_at(bt, gk, gc) };
        let cs = (tid & 31) * 4;
        let gc = c0 + cs;
        for j in 0..2 {
            let kr = (tid >> 5) + 8 * j;
            let gk = k0 + kr;
            if vec && gk < self.k && gc + 3 < cmax {
                let a = at(gk, gc);
                s.reads.push((op, a, 4));
                for i in 0..4 {
                    s.writes.push((op, kr * ROW + cs + i, Val::Elem(a + i)));
                }
                store(s, op, kr * ROW + cs, 4);
            } else {
                for i in 0..4 {
                    let v = if gk < self.k && gc + i < cmax {
                        let a = at(gk, gc + i);
                        s.reads.push((op, a, 1));
                        Val::Elem(a)
                    } else {
                        Val::Zero
                    };
                    s.writes.push((op, kr * ROW + cs + i, v));
                    store(s, op, kr * ROW + cs + i, 1);
                }
            }
        }
    }

    /// The stored extents (rows, cols) of A and B.
    fn stored(&self, op: usize) -> (usize, usize) {
        match (op, self.ta, self.tb) {
            (0, false, _) => (self.m, self.k),
            (0, true, _) => (self.k, self.m),
            (_, _, false) => (self.k, self.n),
            (_, _, true) => (self.n, self.k),
        }
    }

    /// Every check of one slice's loads; `Err` names the first failure.
    fn check_slice(&self, bt: usize, m0: usize, n0: usize, kt: usize) -> Result<(), String> {
        self.check_loaded(&self.load_slice(bt, m0, n0, kt), bt, m0, n0, kt)
    }

    /// The checks of `check_slice` on given loads (the tests tamper with them).
    fn check_loaded(&self, s: &Slice, bt: usize, m0: usize, n0: usize, kt: usize) -> Result<(), String> {
        let k0 = kt * BK;
        // Reads: inside the stored matrix (no element of another row, batch or buffer) and,
        // for 16-byte loads, aligned (every buffer start is 16-byte aligned) and within a row.
        for &(op, at, width) in &s.reads {
            let v = if op == 0 { self.a } else { self.b };
            let (rows, cols) = self.stored(op);
            let rel = at.checked_sub(v.off).ok_or("read before the view")?;
            let (bt_, rem) = (rel / v.bs, rel % v.bs);
            let (r, c) = (rem / v.ld, rem % v.ld);
            if bt_ != bt || r >= rows || c + width > cols {
                return Err(format!("{self:?}: operand {op} read {at} (+{width}) outside the matrix"));
            }
            if width == 4 && at % 4 != 0 {
                return Err(format!("{self:?}: operand {op}: unaligned 16-byte load at {at}"));
            }
        }
        // Writes: every cell of the 16 × 128 tile exactly once, with its element or zero, and
        // nothing in the pad.
        let mut seen: HashMap<(usize, usize), Val> = HashMap::new();
        for &(op, word, v) in &s.writes {
            let (kk, c) = (word / ROW, word % ROW);
            if kk >= BK || c >= BM {
                return Err(format!("{self:?}: operand {op} wrote word {word} outside the tile (pad or beyond)"));
            }
            if seen.insert((op, word), v).is_some() {
                return Err(format!("{self:?}: operand {op}, cell ({kk}, {c}) written twice"));
            }
            let want = match op {
                0 if m0 + c < self.m && k0 + kk < self.k => Val::Elem(self.a_at(bt, m0 + c, k0 + kk)),
                1 if n0 + c < self.n && k0 + kk < self.k => Val::Elem(self.b_at(bt, k0 + kk, n0 + c)),
                _ => Val::Zero,
            };
            if v != want {
                return Err(format!("{self:?}: operand {op}, cell ({kk}, {c}) holds {v:?}, not {want:?}"));
            }
        }
        if seen.len() != 2 * BK * BM {
            return Err(format!("{self:?}: {} of {} cells written", seen.len(), 2 * BK * BM));
        }
        Ok(())
    }

    /// Every slice of every block and batch.
    fn check(&self, batch: usize) -> Result<(), String> {
        for bt in 0..batch {
            for m0 in (0..self.m).step_by(BM) {
                for n0 in (0..self.n).step_by(BN) {
                    for kt in 0..self.k.div_ceil(BK) {
                        self.check_slice(bt, m0, n0, kt)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The launches of a shape: all four transposes, each with contiguous views (16-byte loads
/// where the widths allow), with aligned views whose rows are padded to a multiple of 4 plus 4
/// (16-byte loads wherever a vector lies inside the matrix, so the edge guards decide), and
/// with views off by one element (4-byte copies and scalar loads throughout).
fn launches(m: usize, n: usize, k: usize) -> Vec<Mm> {
    let mut v = Vec::new();
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        v.push(Mm { m, n, k, ta, tb, a: View::new(0, ac, ar * ac), b: View::new(0, bc, br * bc) });
        let (la, lb) = (ac.next_multiple_of(4) + 4, bc.next_multiple_of(4) + 4);
        v.push(Mm { m, n, k, ta, tb, a: View::new(4, la, ar * la), b: View::new(8, lb, br * lb) });
        v.push(Mm { m, n, k, ta, tb, a: View::new(1, ac + 3, ar * (ac + 3)), b: View::new(5, bc + 1, br * (bc + 1)) });
    }
    v
}

/// Edge shapes: 1, primes, multiples of 128 and 16 and their neighbours.
const SHAPES: [(usize, usize, usize); 12] = [
    (1, 1, 1),
    (1, 5, 16),
    (7, 13, 3),
    (127, 131, 17),
    (128, 128, 16),
    (129, 127, 33),
    (131, 257, 47),
    (256, 128, 64),
    (200, 70, 100),
    (5, 300, 31),
    (300, 3, 49),
    (64, 137, 15),
];

#[test]
fn every_tile_cell_is_loaded_once_with_its_element_or_zero() {
    for &(m, n, k) in &SHAPES {
        for mm in launches(m, n, k) {
            mm.check(2).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    // The contiguous views of a multiple-of-4 shape take 16-byte loads for every operand,
    // the shifted ones none.
    let l = launches(128, 128, 16);
    assert!(l[0].a.vec && l[0].b.vec && l[1].a.vec && l[1].b.vec && !l[2].a.vec && !l[2].b.vec);
    let widths = |mm: &Mm| mm.load_slice(0, 0, 0, 0).reads.iter().map(|r| r.2).collect::<Vec<_>>();
    assert!(widths(&l[0]).iter().all(|&w| w == 4));
    assert!(widths(&l[2]).iter().all(|&w| w == 1));
    // Padded aligned rows of A (M×K) with K = 33: the last slice's A vectors hold 1 element of
    // K each, so they fall back to scalar loads; the first slices' are 16-byte loads.
    let l = launches(129, 131, 33);
    assert!(l[1].a.vec && widths(&l[1]).contains(&4));
    assert!(l[1].load_slice(0, 0, 0, 2).reads.iter().filter(|r| r.0 == 0).all(|r| r.2 == 1));
}

/// The load checker rejects broken loads: a cell written twice (and one never), a wrong
/// element, a missing zero fill past K, a read past the row.
#[test]
fn the_load_checker_rejects_broken_loads() {
    let mm = Mm {
        m: 129,
        n: 131,
        k: 33,
        ta: false,
        tb: false,
        a: View::new(0, 36, 129 * 36),
        b: View::new(0, 132, 33 * 132),
    };
    let last = mm.k.div_ceil(BK) - 1;
    assert!(mm.check(1).is_ok());
    let mut s = mm.load_slice(0, 0, 0, 0);
    s.writes[0].1 += ROW;
    assert!(mm.check_loaded(&s, 0, 0, 0, 0).is_err());
    let mut s = mm.load_slice(0, 0, 0, 0);
    let Val::Elem(a) = s.writes[0].2 else { panic!("cell (0, 0) of A is an element") };
    s.writes[0].2 = Val::Elem(a + 1);
    assert!(mm.check_loaded(&s, 0, 0, 0, 0).is_err());
    // Slice 2 holds k = 32 only: cell (1, 0) of A is a zero fill.
    let mut s = mm.load_slice(0, 0, 0, last);
    let cell = s.writes.iter().position(|w| w.0 == 0 && w.1 == ROW).expect("cell (1, 0) of A");
    assert_eq!(s.writes[cell].2, Val::Zero);
    s.writes[cell].2 = Val::Elem(mm.a_at(0, 0, 33));
    assert!(mm.check_loaded(&s, 0, 0, 0, last).is_err());
    let mut s = mm.load_slice(0, 0, 0, last);
    s.reads.push((0, mm.a_at(0, 0, 32), 4));
    assert!(mm.check_loaded(&s, 0, 0, 0, last).is_err());
}

// ---------------------------------------------------------------------------------------------
// The stage ring.

/// A schedule of the ring: stages, the `cp.async.wait_group` argument before each slice's
/// barrier, how many slices ahead the fetch runs, and whether A's register stores come after
/// the multiply (the kernel) or before it.
#[derive(Clone, Copy, Debug)]
struct Ring {
    stages: usize,
    wait_pending: usize,
    ahead: usize,
    sts_after_compute: bool,
}

/// The kernel's schedule: `cp_async_wait<SG_STAGES - 2>`, `next = kt + SG_STAGES - 1`, A's
/// register stores after the multiply (anchored in the source by `the_constants_are_the_kernels`).
const KERNEL_RING: Ring = Ring { stages: STAGES, wait_pending: STAGES - 2, ahead: STAGES - 1, sts_after_compute: true };

/// When a stage's copy of a slice is complete for every thread: after the wait that retires
/// its `cp.async` group (and the barrier after it), or after the phase of its register stores.
#[derive(Clone, Copy, Debug)]
enum Ready {
    Group(usize),
    Phase(usize),
}

/// Replays `ktiles` slices of the main loop for A through registers (`a_regs`, A stored M×K) or
/// `cp.async`, with B always by `cp.async`. Phases are the stretches between barriers: 0 is the
/// prologue, phase kt + 1 runs from iteration kt's barrier to iteration kt + 1's. Threads may
/// be anywhere inside one phase, never in two, so a stage is safe to write in a phase if the
/// slice it held was multiplied in an earlier phase, and safe to read if every copy of the
/// slice completed before the phase began. `Err` names the first hazard.
fn ring_schedule(r: Ring, a_regs: bool, ktiles: usize) -> Result<(), String> {
    let mut content: Vec<[Option<(usize, Ready)>; 2]> = vec![[None; 2]; r.stages];
    let mut consumed: Vec<Option<usize>> = vec![None; ktiles];
    let mut groups = 0usize;
    let mut done = 0usize;
    let write = |content: &mut Vec<[Option<(usize, Ready)>; 2]>,
                 consumed: &Vec<Option<usize>>,
                 op: usize,
                 slice: usize,
                 ready: Ready,
                 phase: usize|
     -> Result<(), String> {
        if slice >= ktiles {
            return Err(format!("{r:?}: fetch of slice {slice} of {ktiles}"));
        }
        let stage = slice % r.stages;
        if let Some((old, _)) = content[stage][op] {
            match consumed[old] {
                Some(p) if p < phase => {}
                _ => {
                    return Err(format!(
                        "{r:?}: phase {phase} overwrites slice {old} in stage {stage} before it is multiplied"
                    ));
                }
            }
        }
        content[stage][op] = Some((slice, ready));
        Ok(())
    };
    // Each fetch: B (and A without registers) by cp.async in the group being built; A's
    // registers are stored in `phase` (now, or after the multiply).
    let fetch_async = |content: &mut Vec<_>, consumed: &Vec<_>, slice, group, phase| -> Result<(), String> {
        write(content, consumed, 1, slice, Ready::Group(group), phase)?;
        if !a_regs {
            write(content, consumed, 0, slice, Ready::Group(group), phase)?;
        }
        Ok(())
    };
    // Prologue: slices 0 .. ahead - 1, one group each.
    for s in 0..r.ahead {
        if s < ktiles {
            fetch_async(&mut content, &consumed, s, groups, 0)?;
            if a_regs {
                write(&mut content, &consumed, 0, s, Ready::Phase(0), 0)?;
            }
        }
        groups += 1;
    }
    for kt in 0..ktiles {
        done = done.max(groups.saturating_sub(r.wait_pending));
        let phase = kt + 1;
        let next = kt + r.ahead;
        let fetch = next < ktiles;
        if fetch {
            fetch_async(&mut content, &consumed, next, groups, phase)?;
            if a_regs && !r.sts_after_compute {
                write(&mut content, &consumed, 0, next, Ready::Phase(phase), phase)?;
            }
        }
        groups += 1;
        // The multiply reads slice kt from its stage.
        let stage = kt % r.stages;
        for &slot in &content[stage] {
            let ok = match slot {
                Some((s, Ready::Group(g))) => s == kt && g < done,
                Some((s, Ready::Phase(p))) => s == kt && p < phase,
                None => false,
            };
            if !ok {
                return Err(format!(
                    "{r:?}: phase {phase} multiplies slice {kt} from stage {stage}, which holds {slot:?}"
                ));
            }
        }
        consumed[kt] = Some(phase);
        if fetch && a_regs && r.sts_after_compute {
            write(&mut content, &consumed, 0, next, Ready::Phase(phase), phase)?;
        }
    }
    // The epilogue's slab reuses the ring after `cp_async_wait_all` and a barrier: every
    // group is retired, and the last multiply was in an earlier phase.
    Ok(())
}

#[test]
fn the_ring_never_reads_early_or_overwrites_a_live_stage() {
    for ktiles in 0..12 {
        for a_regs in [true, false] {
            ring_schedule(KERNEL_RING, a_regs, ktiles).unwrap_or_else(|e| panic!("{e}"));
            // A's stores could go before the multiply too; after it they hide the loads' latency.
            let before = Ring { sts_after_compute: false, ..KERNEL_RING };
            ring_schedule(before, a_regs, ktiles).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The ring checker rejects broken schedules: waiting for one group too few (slice kt still
/// in flight when it is multiplied), fetching one slice too far ahead or with one stage too
/// few (the stage being multiplied is refilled), and a third stage with a two-stage wait.
#[test]
fn the_ring_checker_rejects_broken_schedules() {
    for a_regs in [true, false] {
        let bad = [
            Ring { wait_pending: STAGES - 1, ..KERNEL_RING },
            Ring { ahead: STAGES, ..KERNEL_RING },
            Ring { stages: STAGES - 1, ..KERNEL_RING },
        ];
        for r in bad {
            assert!(ring_schedule(r, a_regs, 4).is_err(), "{r:?} passed");
        }
    }
    // With A through registers, a 2-slice lead into a 2-stage ring fails even when B waits right.
    assert!(ring_schedule(Ring { stages: 2, wait_pending: 0, ahead: 2, sts_after_compute: true }, true, 4).is_err());
    // The previous kernel's schedule (2 stages, wait_group 1 after committing the next slice,
    // one slice ahead) passes the same checker.
    assert!(ring_schedule(Ring { stages: 2, wait_pending: 0, ahead: 1, sts_after_compute: true }, true, 4).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Shared-memory banks.

/// Shared-memory wavefronts beyond the minimum in one warp-wide access: 4-byte accesses need
/// the 32 lanes' words in 32 distinct banks (or the same word); 16-byte ones need each
/// quarter-warp's distinct vectors in distinct groups of 4 banks.
fn excess_wavefronts(words: &[usize], width: usize) -> usize {
    let mut worst = 0;
    let lanes_per_phase = if width == 4 { 8 } else { 32 };
    for phase in words.chunks(lanes_per_phase) {
        let mut distinct: Vec<usize> = phase.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let mut per_bank = HashMap::new();
        for &w in &distinct {
            let bank = if width == 4 { (w / 4) % 8 } else { w % 32 };
            *per_bank.entry(bank).or_insert(0usize) += 1;
        }
        worst = worst.max(per_bank.values().copied().max().unwrap_or(1) - 1);
    }
    worst
}

#[test]
fn shared_stores_and_reads_are_free_of_bank_conflicts() {
    // An interior block, so every thread of a warp takes the same path: 16-byte paths with the
    // contiguous views, 4-byte ones with the shifted views.
    for mm in launches(256, 256, 64) {
        let s = mm.load_slice(0, 0, 0, 1);
        let mut by_ins: HashMap<(usize, usize, usize), Vec<(usize, usize)>> = HashMap::new();
        for &(tid, ins, op, word, width) in &s.stores {
            by_ins.entry((tid / 32, ins, op)).or_default().push((word, width));
        }
        assert!(!by_ins.is_empty());
        for (key, v) in by_ins {
            assert_eq!(v.len(), 32, "{mm:?}: {key:?}");
            let words: Vec<usize> = v.iter().map(|x| x.0).collect();
            // The one exception: the 4-byte fallback of the row copies (A stored K×M, B stored
            // K×N, an unaligned view or a vector cut by the edge) keeps the 16-byte path's
            // element ownership, 4 consecutive floats per lane, so its stores are 4-way
            // conflicted (lanes 8 apart share a bank). It only serves views without 16-byte
            // alignment, whose 4-byte global loads cost more than the shared stores.
            let rows_copy = (key.2 == 0 && mm.ta) || (key.2 == 1 && !mm.tb);
            let allowed = if rows_copy && v[0].1 == 1 { 3 } else { 0 };
            let excess = excess_wavefronts(&words, v[0].1);
            assert_eq!(excess, allowed, "{mm:?}: warp {}, store {} of operand {}: {words:?}", key.0, key.1, key.2);
        }
    }
    // The multiply's float4 reads: a0, a1 at [kk][r0], [kk][r0 + 16]; b0, b1 at [kk][c0],
    // [kk][c0 + 32].
    for warp in 0..THREADS / 32 {
        let r0 = |l: usize| (warp >> 1) * 32 + (l >> 3) * 4;
        let c0 = |l: usize| (warp & 1) * 64 + (l & 7) * 4;
        for kk in 0..BK {
            for (name, base, off) in [("a0", true, 0), ("a1", true, 16), ("b0", false, 0), ("b1", false, 32)] {
                let words: Vec<usize> = (0..32).map(|l| kk * ROW + if base { r0(l) } else { c0(l) } + off).collect();
                assert!(words.iter().all(|w| w % 4 == 0));
                assert_eq!(excess_wavefronts(&words, 4), 0, "warp {warp}, k {kk}, {name}");
            }
        }
    }
    // The checker sees conflicts: rows of 128 floats (no pad) put the two quads' scalar stores
    // on the same banks, and 8 lanes reading 8 float4s 128 floats apart share one bank group.
    let unpadded: Vec<usize> = (0..32).map(|l| ((l & 1) * 4) * BM + (l >> 1)).collect();
    assert_eq!(excess_wavefronts(&unpadded, 1), 1);
    let strided: Vec<usize> = (0..32).map(|l| (l % 8) * BM).collect();
    assert_eq!(excess_wavefronts(&strided, 4), 7);
}

// ---------------------------------------------------------------------------------------------
// The block swizzle.

/// `swizzled_tile<TILE_BAND>` in `common.cuh`: (tile row, tile column) of block (bx, by).
fn swizzled_tile(band_rows: usize, bx: usize, by: usize, gx: usize, gy: usize) -> (usize, usize) {
    let lin = by * gx + bx;
    let (band, rem) = (lin / (band_rows * gx), lin % (band_rows * gx));
    let rows = (gy - band * band_rows).min(band_rows);
    (band * band_rows + rem % rows, rem / rows)
}

/// The swizzle is a bijection on the grid (each output tile is written by exactly one block),
/// and within a full band eight consecutive blocks share one column tile of B.
#[test]
fn the_swizzle_is_a_bijection_that_groups_blocks_along_m() {
    let band = define(COMMON, "TILE_BAND");
    assert_eq!(band, 8);
    for gx in 1..=20 {
        for gy in (1..=20).chain([31, 64, 65]) {
            let mut hit = vec![false; gx * gy];
            for by in 0..gy {
                for bx in 0..gx {
                    let (r, c) = swizzled_tile(band, bx, by, gx, gy);
                    assert!(r < gy && c < gx, "{gx}×{gy}: ({bx}, {by}) -> ({r}, {c})");
                    assert!(!std::mem::replace(&mut hit[r * gx + c], true), "{gx}×{gy}: ({r}, {c}) twice");
                }
            }
            if gy >= band {
                let cols: Vec<usize> = (0..band).map(|x| swizzled_tile(band, x % gx, x / gx, gx, gy).1).collect();
                assert!(cols.iter().all(|&c| c == 0), "{gx}×{gy}: {cols:?}");
            }
        }
    }
}
