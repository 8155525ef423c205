//! The CPU kernels against the f64 reference, bit for bit on integer data (every partial sum
//! is exact in f32, so any summation order gives the reference's value, and rounding it to the
//! storage type once gives the reference rounded once). Each test walks a grid that reaches
//! every path: skinny M = 1…16 in both B layouts, row panels, the plain-gemm path, the
//! parallel splits, SIMD remainders, all paddings, strides, dilations, both layouts, channel
//! multipliers, and every dtype.

use super::Elem;
use super::depthwise::Conv;
use super::matmul::MatmulOperands;
use super::matmul::SKINNY_M;
use super::simd::{Isa, as_each_vendor, in_each_isa};
use super::{F32s, Halves};
use half::{bf16, f16};
use tilekit_kernels::{Activation, ActivationDesc, Conv2dDesc, DType, Layout, MatmulDesc, MatrixView, reference};

/// SplitMix64: deterministic data from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// An integer in `[-r, r]` as f32.
    fn int(&mut self, r: i64) -> f32 {
        ((self.next() % (2 * r as u64 + 1)) as i64 - r) as f32
    }
    fn ints(&mut self, n: usize, r: i64) -> Vec<f32> {
        (0..n).map(|_| self.int(r)).collect()
    }
}

/// Runs `check` for each storage type with its dtype.
fn each_dtype(mut check: impl FnMut(DType, &dyn Fn(&[f32]) -> Vec<f32>)) {
    check(DType::F32, &|v| v.to_vec());
    check(DType::F16, &|v| v.iter().map(|&x| f16::from_f32(x).to_f32()).collect());
    check(DType::Bf16, &|v| v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect());
}

/// Stores `v` as `E`, rounding once.
fn store<E: Elem>(v: &[f32], zero: E) -> Vec<E> {
    let mut out = vec![zero; v.len()];
    E::narrow_into(v, &mut out);
    out
}

fn load<E: Elem>(v: &[E]) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    E::widen_into(v, &mut out);
    out
}

/// A copy of a slice that ends where a page without access begins (Linux): a kernel that
/// reads past the slice's last element faults there, where a read past a `Vec`'s end goes
/// unnoticed. Elsewhere, a plain copy.
pub(super) struct PageEnd<T> {
    #[cfg(target_os = "linux")]
    map: *mut u8,
    #[cfg(target_os = "linux")]
    bytes: usize,
    #[cfg(target_os = "linux")]
    first: *const T,
    #[cfg(target_os = "linux")]
    len: usize,
    #[cfg(not(target_os = "linux"))]
    copy: Vec<T>,
}

impl<T: Copy> PageEnd<T> {
    /// `v` copied to the end of a fresh mapping whose next page is inaccessible.
    #[cfg(target_os = "linux")]
    pub(super) fn new(v: &[T]) -> PageEnd<T> {
        // SAFETY: `sysconf` has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page size");
        let data = size_of_val(v);
        let bytes = (data.div_ceil(page) + 1) * page;
        // SAFETY: a fresh anonymous private mapping, its last page made inaccessible (both calls
        // checked); `v` is copied into the bytes just below that page, which are readable and
        // writable and suitably aligned for `T` (the page boundary is, and `data` is a multiple
        // of `T`'s size).
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            let map = map.cast::<u8>();
            let guard = map.add(bytes - page);
            assert_eq!(libc::mprotect(guard.cast(), page, libc::PROT_NONE), 0, "mprotect");
            let first = guard.sub(data).cast::<T>();
            std::ptr::copy_nonoverlapping(v.as_ptr(), first, v.len());
            PageEnd { map, bytes, first, len: v.len() }
        }
    }

    /// `v`, copied.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn new(v: &[T]) -> PageEnd<T> {
        PageEnd { copy: v.to_vec() }
    }

    /// The copy.
    pub(super) fn get(&self) -> &[T] {
        #[cfg(target_os = "linux")]
        // SAFETY: `len` elements written in `new`, in the mapping this owns until `drop`.
        return unsafe { std::slice::from_raw_parts(self.first, self.len) };
        #[cfg(not(target_os = "linux"))]
        &self.copy
    }
}

#[cfg(target_os = "linux")]
impl<T> Drop for PageEnd<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the slices `get` lent borrow `self`, so none is left.
        assert_eq!(unsafe { libc::munmap(self.map.cast(), self.bytes) }, 0, "munmap");
    }
}

/// What the words of an output outside its view hold before and after a product.
const SENTINEL: f32 = -77.0;

/// Runs a matmul case in every dtype and compares every output word with the reference (and
/// the words outside the view with their sentinel).
fn check_matmul(desc: &MatmulDesc, seed: u64) {
    let mut rng = Rng(seed);
    // Inputs small enough that each product's sums stay exact even in bf16 outputs' rounding.
    let r = 2;
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    let a = rng.ints(desc.a.required_len(desc.batch, ar, ac).unwrap_or(0), r);
    let b = rng.ints(desc.b.required_len(desc.batch, br, bc).unwrap_or(0), r);
    let bias = desc.bias_offset.map(|off| rng.ints(off + desc.n, 3));
    let c = desc.c.map(|cv| rng.ints(cv.required_len(desc.batch, desc.m, desc.n).unwrap_or(0), 3));
    let out_len = desc.out.required_len(desc.batch, desc.m, desc.n).unwrap_or(0) + 4;
    let mut want = vec![SENTINEL as f64; out_len];
    let w = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    reference::matmul(
        desc,
        &w(&a),
        &w(&b),
        bias.as_deref().map(w).as_deref(),
        c.as_deref().map(w).as_deref(),
        &mut want,
    );
    // Where B is one matrix for every batch, the same product with it packed in strips
    // (`PackedMatmul`'s CPU layout), which must give the same words.
    let strips = (desc.batch == 1 || desc.b.batch_stride == 0).then(|| {
        let (k, n) = (desc.k, desc.n);
        let mut s = vec![0.0f32; n.div_ceil(16) * k * 16];
        for q in 0..k {
            for j in 0..n {
                s[(j / 16 * k + q) * 16 + j % 16] = b[desc.b_index(0, q, j)];
            }
        }
        s
    });
    // Each operand ends where a page without access begins: a read past it faults.
    let (a, b) = (PageEnd::new(&a), PageEnd::new(&b));
    let strips = strips.as_deref().map(PageEnd::new);
    let (bias, c) = (bias.as_deref().map(PageEnd::new), c.as_deref().map(PageEnd::new));
    let variants = [Some((b.get(), false)), strips.as_ref().map(|s| (s.get(), true))];
    for (b, strips) in variants.into_iter().flatten() {
        let (bias, c) = (bias.as_ref().map(PageEnd::get), c.as_ref().map(PageEnd::get));
        check_matmul_with(desc, seed, a.get(), b, strips, bias, c, &want, out_len);
    }
}

/// [`check_matmul`] on given operands (`strips`: `b` is packed in strips).
#[allow(clippy::too_many_arguments)]
fn check_matmul_with(
    desc: &MatmulDesc,
    seed: u64,
    a: &[f32],
    b: &[f32],
    strips: bool,
    bias: Option<&[f32]>,
    c: Option<&[f32]>,
    want: &[f64],
    out_len: usize,
) {
    // Where the product is skinny, or B is packed in strips, also with B in f16 and bf16 (the
    // integers are exact in both), which the product widens chunk by chunk.
    let halves = ((strips || desc.m <= SKINNY_M) && desc.k > 0)
        .then(|| (PageEnd::new(&store(b, f16::ZERO)), PageEnd::new(&store(b, bf16::ZERO))));
    let mut sources = vec![None];
    if let Some((h, bh)) = &halves {
        sources.extend([Some(Halves::F16(h.get())), Some(Halves::Bf16(bh.get()))]);
    }
    for b_half in sources {
        check_matmul_from(desc, seed, a, b, b_half, strips, bias, c, want, out_len);
    }
}

/// [`check_matmul_with`] with `B` from `b`, or from `b_half` where that is given.
#[allow(clippy::too_many_arguments)]
fn check_matmul_from(
    desc: &MatmulDesc,
    seed: u64,
    a: &[f32],
    b: &[f32],
    b_half: Option<Halves>,
    strips: bool,
    bias: Option<&[f32]>,
    c: Option<&[f32]>,
    want: &[f64],
    out_len: usize,
) {
    let half = b_half.map(|h| if matches!(h, Halves::F16(_)) { "f16" } else { "bf16" });
    each_dtype(|dtype, round| {
        let ops = MatmulOperands {
            a: F32s::Borrowed(a),
            b: F32s::Borrowed(if b_half.is_some() { &[] } else { b }),
            b_half,
            bias: bias.map(|v| &v[desc.bias_offset.unwrap_or(0)..][..desc.n]),
            c: c.map(F32s::Borrowed),
            strips,
        };
        let init = vec![SENTINEL; out_len];
        let got = match dtype {
            DType::F32 => {
                let mut o = init.clone();
                ops.run(desc, &mut o).expect("run");
                o
            }
            DType::F16 => {
                let mut o = store(&init, f16::ZERO);
                ops.run(desc, &mut o).expect("run");
                load(&o)
            }
            DType::Bf16 => {
                let mut o = store(&init, bf16::ZERO);
                ops.run(desc, &mut o).expect("run");
                load(&o)
            }
            other => unimplemented!("{other:?}"),
        };
        let want32: Vec<f32> = round(&want.iter().map(|&x| x as f32).collect::<Vec<_>>());
        for (i, (&g, &x)) in got.iter().zip(&want32).enumerate() {
            assert!(g == x, "{dtype} {desc:?} seed {seed} strips {strips} B {half:?}: word {i} is {g}, expected {x}");
        }
    });
}

fn matmul_desc(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool, variant: usize) -> MatmulDesc {
    let mut d = MatmulDesc::new(m, n, k);
    d.trans_a = trans_a;
    d.trans_b = trans_b;
    let (ar, ac) = d.a_stored();
    let (br, bc) = d.b_stored();
    // Padded leading dimensions and offsets on odd variants, so no view is dense by accident.
    let pad = variant % 2;
    d.a = MatrixView::new(pad, ac + pad * 3, ar * (ac + pad * 3) + 1);
    d.b = MatrixView::new(2 * pad, bc + pad, br * (bc + pad));
    d.out = MatrixView::new(pad, n + 2 * pad, m * (n + 2 * pad) + pad);
    d.activation = [Activation::None, Activation::Relu, Activation::Relu6, Activation::None][variant % 4];
    if variant % 3 == 1 {
        d.bias_offset = Some(variant % 5);
    }
    if variant % 4 == 2 {
        d.c = Some(MatrixView::new(1, n + 1, m * (n + 1) + 2));
        d.beta = if variant % 8 == 2 { -1.0 } else { 2.0 };
    }
    if variant % 5 == 3 {
        d.alpha = 0.5;
    }
    d
}

/// A skinny product with `B` in f16 or bf16, stored `N × K` or `K × N`, or any product with `B`
/// packed in strips in f16 or bf16 (widened a chunk at a time), gives the bits of the same
/// product with `B` widened whole first, on data whose sums round, in every instruction set: M
/// across the row groups, K across the 16-lane steps and the 256- and 1024-element chunks, N
/// across the 6-row tiles, the column blocks and the groups of strips (fewer than four at K =
/// 5000), `B` with a padded leading dimension and offset. Stored `K × N`: on AVX-512 the direct
/// kernel converting `B` as it loads it (tiles of four strips at 1–2 rows, two at 3–8, one
/// beyond, with strips left over); elsewhere, and on AVX-512 with the direct kernel left out,
/// the groups of rows widened at a time, K across them (32 rows of a block of 2048 or more
/// columns; the sums carried from group to group) through the row-streaming kernel and the
/// panels (14–16 rows); N leaving a tail of 4 columns.
#[test]
fn half_b_products_match_b_widened_first() {
    half_b_cases();
    super::gemv::without_direct(half_b_cases);
}

/// [`half_b_products_match_b_widened_first`]'s cases, in every instruction set.
fn half_b_cases() {
    in_each_isa(|isa| {
        let mut rng = Rng(77);
        let mut float = || (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        let shapes = [
            (1, 7, 33),
            (3, 13, 256),
            (5, 70, 300),
            (16, 64, 517),
            (2, 130, 1024),
            (9, 6, 16),
            (4, 67, 1),
            (2, 9, 1100),
            (6, 11, 2077),
            (20, 100, 70),
            (1, 80, 5000),
        ];
        // (shape, B packed in strips, B stored N × K)
        let kn_shapes = [(1, 4100, 100), (2, 4100, 70), (3, 2100, 97), (9, 4100, 65), (15, 4100, 40), (16, 2050, 99)];
        let cases = shapes.into_iter().flat_map(|s| [(s, false, true), (s, true, true)]);
        for ((m, n, k), strips, nk) in cases.chain(kn_shapes.into_iter().map(|s| (s, false, false))) {
            if !strips && m > SKINNY_M {
                continue;
            }
            let mut d = MatmulDesc::new(m, n, k);
            d.trans_b = nk;
            let (rows, cols) = if nk { (n, k) } else { (k, n) };
            d.b = MatrixView::new(3, cols + 5, rows * (cols + 5));
            let a: Vec<f32> = (0..m * k).map(|_| float()).collect();
            let len = if strips { n.div_ceil(16) * k * 16 } else { 3 + rows * (cols + 5) };
            let b: Vec<f32> = (0..len).map(|_| float()).collect();
            let (h, bh) = (store(&b, f16::ZERO), store(&b, bf16::ZERO));
            for half in [Halves::F16(&h), Halves::Bf16(&bh)] {
                let mut wide = vec![0.0f32; b.len()];
                half.widen_range(0, &mut wide);
                let run = |b_half: Option<Halves>| {
                    let ops = MatmulOperands {
                        a: F32s::Borrowed(&a),
                        b: F32s::Borrowed(if b_half.is_some() { &[] } else { &wide }),
                        b_half,
                        bias: None,
                        c: None,
                        strips,
                    };
                    let mut out = vec![SENTINEL; m * n];
                    ops.run(&d, &mut out).expect("run");
                    out
                };
                let (got, want) = (run(Some(half)), run(None));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let case = format!("{isa:?} {m}x{n}x{k} strips {strips} N x K {nk} word {i}");
                    assert_eq!(g.to_bits(), w.to_bits(), "{case}: {g} against {w}");
                }
            }
        }
    });
}

/// The skinny path: M = 1…16, both B layouts (and A transposed or not), widths around the
/// 16-lane and 512-column block edges, K around the 4-row and 16-lane steps, every epilogue,
/// in every instruction set (the `N × K` tile has its own AVX code).
#[test]
fn skinny_matmul_is_exact() {
    in_each_isa(|_| {
        let mut seed = 1;
        for m in 1..=16 {
            for &(n, k) in &[(1, 1), (3, 5), (17, 19), (33, 64), (70, 31), (513, 7), (65, 67)] {
                for tb in [false, true] {
                    let ta = (m + n) % 2 == 0;
                    let d = matmul_desc(m, n, k, ta, tb, seed as usize);
                    check_matmul(&d, seed);
                    seed += 1;
                }
            }
        }
    });
}

/// The `N × K` skinny kernel's K chunks ([`super::gemv::kc`]: longer with one row group): K
/// across one and two chunk edges with 8-lane and scalar tails, every row-group remainder
/// (M mod 4) and the two-row wide tiles, widths leaving every column-tile remainder (N mod 3,
/// N mod 4), in every instruction set.
#[test]
fn skinny_k_chunks_are_exact() {
    in_each_isa(|_| {
        let mut seed = 900;
        for m in [1, 2, 3, 4, 5, 7, 16] {
            let kc = super::gemv::kc(m);
            for &(n, k) in &[(7, kc + 8), (70, kc + 1), (13, 2 * kc + 13), (66, kc - 3)] {
                let d = matmul_desc(m, n, k, m % 2 == 1, true, seed as usize);
                check_matmul(&d, seed);
                seed += 1;
            }
        }
    });
}

/// `B` stored `N × K` up to 16 rows (on AVX-512 the 16-lane dot products, elsewhere the AVX2
/// and portable tiles): `K` within and across the 256-element chunks with every 16-lane tail
/// (masked loads) and none, every row-group remainder (M mod 4), widths leaving every
/// remainder of the 6-row tiles, within one 64-column block and across blocks, A transposed or
/// not, every epilogue, padded views, rows of `A` 512 and 1024 elements apart (copied further
/// apart from 9 rows, `unalias_rows`), in every instruction set.
#[test]
fn skinny_nk_dot_products_are_exact() {
    in_each_isa(|_| {
        let mut seed = 2100;
        for m in [1, 2, 3, 4, 6, 9, 16] {
            let shapes =
                [(1, 1), (5, 15), (6, 16), (7, 17), (64, 255), (11, 256), (70, 257), (131, 530), (13, 512), (8, 1024)];
            for &(n, k) in &shapes {
                let d = matmul_desc(m, n, k, (m + n) % 2 == 0, true, seed as usize);
                check_matmul(&d, seed);
                seed += 1;
            }
        }
    });
}

/// The panel kernel with `B` stored `K × N` (M ≥ 14 on AVX2; on AVX-512 only with the direct
/// kernel left out, as here, as well as with it): K within one and across 128-row panels with a
/// short last one, widths across 64-column panels with short last panels (of odd and even strip
/// counts) and 1–15 columns left to the row-streaming kernel, every row-group remainder (M mod
/// 6), padded views, in every instruction set.
#[test]
fn skinny_panels_are_exact() {
    let grid = || {
        in_each_isa(|_| {
            let mut seed = 1200;
            for m in [14, 15, 16] {
                for &(n, k) in &[(16, 64), (47, 65), (130, 200), (300, 129), (129, 1), (512, 64), (115, 70)] {
                    for variant in [0, 1] {
                        let d = matmul_desc(m, n, k, m == 15, false, variant);
                        check_matmul(&d, seed);
                        seed += 1;
                    }
                }
            }
        })
    };
    grid();
    super::gemv::without_direct(grid);
}

/// `B` with at least 2^20 elements: up to `PANELS_KN_M` (96) rows take the skinny panels,
/// stored `K × N` where the CPU has AVX2 and FMA (on AVX-512 the direct kernel, and the panels
/// with it left out, as here too), `N × K` on AVX-512 (`gemm` otherwise), with
/// the last `N mod 16` columns (here 6) streamed row by row or as dot products for all rows;
/// `N` a multiple of 16 with `K` not, and the reverse; `K` = 1030, whose second panel of
/// `N × K` (1024 columns of `K` a panel) is 6 columns, all in the masked block; and `K` = 1000,
/// whose one panel ends in 8 columns past the transposed 16-column blocks.
#[test]
fn mid_m_panels_are_exact() {
    // `kn`: only the products with B stored K × N (the first two).
    let grid = |kn: bool| {
        in_each_isa(|_| {
            for (i, &(m, n, k)) in
                [(17, 1024, 1024), (96, 1030, 1020), (17, 1030, 1024), (96, 1024, 1030), (33, 1040, 1000)]
                    .iter()
                    .enumerate()
                    .take(if kn { 2 } else { 5 })
            {
                // From the third with B stored N × K (the AVX-512 transposed panels).
                check_matmul(&matmul_desc(m, n, k, i % 2 == 1, i >= 2, i), 1700 + i as u64);
            }
        })
    };
    grid(false);
    super::gemv::without_direct(|| grid(true));
}

/// Products past the skinny and mid-sized paths (M over 96) into f16 and bf16 outputs as well
/// as f32: `B` too large for each thread to pack (`K · N` over 2^20: one `gemm` call into an
/// f32 buffer, then the epilogue and the rounding in parallel) and small enough (one panel of
/// rows per thread), both `B` layouts, every epilogue variant, padded views.
#[test]
fn large_products_into_half_outputs_are_exact() {
    for (i, &(m, n, k)) in [(97, 1030, 1030), (130, 1100, 1000), (100, 300, 300)].iter().enumerate() {
        let variants = if i == 0 { 0..4 } else { 1..3 };
        for variant in variants {
            check_matmul(
                &matmul_desc(m, n, k, false, (i + variant) % 2 == 1, variant),
                1950 + (4 * i + variant) as u64,
            );
        }
    }
}

/// The direct kernel with `B` stored `K × N` (3–96 rows on AVX-512): `K` across its 32-row
/// passes (up to 16 rows, and rows of `B` over 6144 elements apart) and 64-row passes (17–96
/// rows), all with short last ones; one row group (3–15 rows) and, from 16 rows, groups of up
/// to 8 as equal as can be (16: 8 + 8, 17: 6 + 6 + 5, 24: 3 × 8, 31: 8 + 8 + 8 + 7, 57: 8 +
/// 7 × 7, 96: 12 × 8) on three strips a tile with none, one and two strips left; tiles of two
/// strips (3–8 rows) with an odd strip left and none, widths leaving 1–15 columns to the
/// row-streaming kernel, column blocks of 1024 or 2048 (1–3 threads) whose sums go through
/// rows one strip longer; from 17 rows `B` has 2^20 elements (smaller ones go to `gemm`). In
/// every instruction set.
#[test]
fn direct_kn_is_exact() {
    in_each_isa(|_| {
        let shapes = [
            (3, 40, 97),
            (5, 70, 65),
            (8, 83, 40),
            (5, 4096, 33),
            (16, 2048, 40),
            (13, 33, 64),
            (14, 47, 129),
            (16, 6150, 70),
            (24, 1025, 1100),
            (31, 1040, 1030),
            (17, 2064, 520),
            (16, 97, 33),
            (57, 1040, 1030),
            (96, 1072, 990),
        ];
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            check_matmul(&matmul_desc(m, n, k, m % 2 == 1, false, i), 1800 + i as u64);
        }
    });
}

/// The product `desc` of dense f32 operands (`strips`: `b` packed in strips) with no bias or
/// `C`, checked to write nothing past its `m × n` outputs.
fn run_f32(a: &[f32], b: &[f32], desc: &MatmulDesc, strips: bool) -> Vec<f32> {
    let ops = MatmulOperands { a: F32s::Borrowed(a), b: F32s::Borrowed(b), b_half: None, bias: None, c: None, strips };
    let len = desc.m * desc.n;
    let mut o = vec![SENTINEL; len + 16];
    ops.run(desc, &mut o[..len]).expect("run");
    assert!(o[len..].iter().all(|v| v.to_bits() == SENTINEL.to_bits()), "{desc:?}: wrote past the output");
    o.truncate(len);
    o
}

/// With `B` stored `K × N`, the skinny kernels (row-streaming, direct, panels) sum each output
/// in `K` order, one multiply-add a step, as the packed weight's strips do: on random data
/// (inexact sums) the packed and unpacked products give the same bits, in every instruction
/// set, through every path up to 16 rows, and up to 96 where the CPU has AVX2 and FMA (the
/// portable copy hands more than 16 rows to `gemm`), with the AVX-512 direct kernel and
/// without it (the panels).
#[test]
fn kn_kernels_match_the_strips_bit_for_bit() {
    let grid = || {
        in_each_isa(|isa| {
            let mut rng = Rng(77);
            for &(m, n, k) in &[
                (1, 70, 300),
                (2, 33, 129),
                (5, 1030, 1024),
                (16, 1030, 1030),
                (32, 1024, 1025),
                (40, 1030, 1024),
                (65, 1040, 1030),
            ] {
                if m > 16 && isa == Isa::Portable {
                    continue;
                }
                let desc = MatmulDesc::new(m, n, k);
                let a: Vec<f32> = (0..m * k).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
                let b: Vec<f32> = (0..k * n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
                let mut s = vec![0.0f32; n.div_ceil(16) * k * 16];
                for q in 0..k {
                    for j in 0..n {
                        s[(j / 16 * k + q) * 16 + j % 16] = b[q * n + j];
                    }
                }
                let (plain, packed) = (run_f32(&a, &b, &desc, false), run_f32(&a, &s, &desc, true));
                for (i, (x, y)) in plain.iter().zip(&packed).enumerate() {
                    assert!(x.to_bits() == y.to_bits(), "{isa:?} {m}x{n}x{k}: element {i} is {x} unpacked, {y} packed");
                }
            }
        })
    };
    grid();
    super::gemv::without_direct(grid);
}

/// With `B` stored `N × K` and 13 to 16 rows of `A`, AVX-512 takes the broadcast tiles
/// (`gemv::avx512::cols_bcast`), which sum each output in `K` order, one multiply-add a step:
/// on random data they give the bits of the same product with `B` stored `K × N`, across
/// their 128-element chunks (whole, short, one alone) and 16-row tiles (the block's last one
/// short), and write nothing past the output (`check_matmul` and `parallel_paths_are_exact`
/// hold them to the reference with every epilogue).
#[test]
fn nk_broadcast_tiles_match_kn_bit_for_bit() {
    if !Isa::available().contains(&Isa::Avx512) {
        eprintln!("skipped: the N x K broadcast tiles need AVX-512, which this CPU lacks");
        return;
    }
    in_each_isa(|isa| {
        if isa != Isa::Avx512 {
            return;
        }
        let mut rng = Rng(91);
        let shapes = [(16, 70, 1030), (13, 17, 100), (15, 33, 128), (14, 64, 257), (16, 1, 1), (16, 16, 384)];
        for &(m, n, k) in &shapes {
            let a: Vec<f32> = (0..m * k).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[i % k * n + i / k]).collect();
            let run = |b: &[f32], trans_b: bool| {
                let mut desc = MatmulDesc::new(m, n, k);
                desc.trans_b = trans_b;
                let (br, bc) = desc.b_stored();
                desc.b = MatrixView::new(0, bc, br * bc);
                run_f32(&a, b, &desc, false)
            };
            let (kn, nk) = (run(&b, false), run(&bt, true));
            for (i, (x, y)) in kn.iter().zip(&nk).enumerate() {
                assert!(x.to_bits() == y.to_bits(), "{m}x{n}x{k}: element {i} is {x} with B stored K x N, {y} N x K");
            }
        }
    });
}

/// `B` packed in strips (every case above runs it too, through [`check_matmul`]) on the strip
/// kernel's own edges: K within and across its passes (256 rows; 1024 on AVX-512), M across its
/// 6-row groups (8 on AVX-512) and 64-row tasks, N around the strips (the last one zero-padded) and the
/// AVX-512 tiles' three strips (4 and 5 strips: a last tile of one and of two), A transposed
/// or not, every epilogue, in every instruction set.
#[test]
fn strips_are_exact() {
    in_each_isa(|_| {
        let mut seed = 1500;
        for &(m, n, k) in &[
            (1, 17, 300),
            (6, 16, 257),
            (17, 33, 513),
            (64, 15, 40),
            (65, 47, 256),
            (130, 31, 20),
            (3, 64, 257),
            (9, 70, 300),
            (20, 40, 1030),
        ] {
            for variant in 0..4 {
                check_matmul(&matmul_desc(m, n, k, variant % 2 == 1, variant == 2, variant), seed);
                seed += 1;
            }
        }
    });
}

/// Large enough to split across threads: the skinny columns blocks (at 16 × 8213 more blocks
/// than threads, the last one short), and the row panels.
#[test]
fn parallel_paths_are_exact() {
    let mut seed = 100;
    let shapes =
        [(1, 1100, 600), (16, 700, 300), (16, 8213, 5), (5, 1030, 257), (40, 300, 200), (97, 140, 150), (200, 64, 90)];
    for &(m, n, k) in &shapes {
        for tb in [false, true] {
            for variant in [0, 1, 2, 5] {
                let mut d = matmul_desc(m, n, k, false, tb, variant);
                if variant == 5 {
                    d.batch = 2;
                    d.a.batch_stride = d.a.batch_stride.max(1);
                }
                check_matmul(&d, seed);
                seed += 1;
            }
        }
    }
}

/// `B` stored `[N, K]` and large enough (`N·K ≥ 2^19`) for the products of at most 256 rows a
/// call to be computed channel-major and transposed into the output (`ORIENT_MAX_ROWS`):
/// row tails past the 8 × 8 transpose blocks, both sides of the row bound per call, every
/// epilogue, padded views, A transposed (which keeps the direct path).
#[test]
fn linear_layout_products_through_the_transpose_are_exact() {
    let mut seed = 700;
    for &(m, n, k, ta) in
        &[(33, 1031, 517, false), (150, 1100, 480, false), (600, 1030, 520, false), (40, 1030, 520, true)]
    {
        for variant in [0, 1, 2, 3, 4] {
            check_matmul(&matmul_desc(m, n, k, ta, true, variant), seed);
            seed += 1;
        }
    }
}

/// f32 outputs on either side of the one-call limit (`CACHED_OUT`, 2^18 elements): one `gemm`
/// then the epilogue below it, row panels above it; every epilogue, both B layouts.
#[test]
fn fused_outputs_on_both_sides_of_the_one_call_limit_are_exact() {
    let mut seed = 500;
    for &(m, n, k) in &[(17, 300, 9), (512, 512, 3), (520, 509, 4)] {
        for tb in [false, true] {
            for variant in [1, 2, 3, 4] {
                check_matmul(&matmul_desc(m, n, k, false, tb, variant), seed);
                seed += 1;
            }
        }
    }
}

/// The plain-gemm path and the panels around it, small and odd: M past the skinny limit,
/// K = 0 (only the epilogue), batches.
#[test]
fn general_matmul_is_exact() {
    let mut seed = 500;
    for &(m, n, k) in &[(17, 1, 1), (17, 9, 0), (23, 31, 8), (64, 64, 64), (33, 70, 3)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for variant in 0..8 {
                let mut d = matmul_desc(m, n, k, ta, tb, variant);
                d.batch = 1 + variant % 3;
                check_matmul(&d, seed);
                seed += 1;
            }
        }
    }
}

/// Elements past a depthwise layer's output that [`check_conv`] checks are left alone.
const GUARD: usize = 19;

fn check_conv(d: &Conv2dDesc, seed: u64) {
    let mut rng = Rng(seed);
    let [a, b, c, e] = d.input_shape();
    let x = rng.ints(a * b * c * e, 3);
    let w = rng.ints(d.out_channels() * d.kernel_h * d.kernel_w, 3);
    let bias = d.has_bias.then(|| rng.ints(d.out_channels(), 5));
    let out_len: usize = d.output_shape().iter().product();
    let mut want = vec![0.0f64; out_len];
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    reference::depthwise_conv2d(d, &f(&x), &f(&w), bias.as_deref().map(f).as_deref(), &mut want);
    // Layers that a small-plane kernel takes (NCHW's 16-lane rows and channel-vector tile,
    // NHWC's channel blocks) also run with those turned off, so the band, row and NHWC row
    // paths stay checked on their planes.
    let small = |isa| Conv { d: *d, x: &x, xh: None, w: &w, packed: false, bias: None }.has_small_plane_kernel(isa);
    // The same weights pre-packed `[kh, kw, C·m]` (as `PackedDepthwise` holds them).
    let (occ, taps) = (d.out_channels(), d.kernel_h * d.kernel_w);
    let wp: Vec<f32> = (0..taps * occ).map(|i| w[(i % occ) * taps + i / occ]).collect();
    // The input also in half precision (integers, exact), kept as stored: the NHWC 3 × 3 rows
    // widen it row by row, every other path whole first.
    let xf16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let xbf16: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    // The operands the kernels read end where a page without access begins: a read past an
    // input's or a weight's last element faults.
    let (xf16, xbf16) = (PageEnd::new(&xf16), PageEnd::new(&xbf16));
    let (xg, wg, wpg) = (PageEnd::new(&x), PageEnd::new(&w), PageEnd::new(&wp));
    let bg = bias.as_deref().map(PageEnd::new);
    let (x, w, wp, bias) = (xg.get(), wg.get(), wpg.get(), bg.as_ref().map(PageEnd::get));
    let inputs = [None, Some(Halves::F16(xf16.get())), Some(Halves::Bf16(xbf16.get()))];
    for (isa, xh) in Isa::available().into_iter().flat_map(|isa| inputs.map(|xh| (isa, xh))) {
        let tiles: &[bool] = if small(isa) { &[true, false] } else { &[true] };
        for (&tile, packed) in tiles.iter().flat_map(|t| [(t, false), (t, true)]) {
            each_dtype(|dtype, round| {
                let w = if packed { wp } else { w };
                let x: &[f32] = if xh.is_some() { &[] } else { x };
                let conv = Conv { d: *d, x, xh, w, packed, bias };
                // NaN where the output goes, the sentinel in a guard band past it.
                let fill = |i: usize| if i < out_len { f32::NAN } else { SENTINEL };
                let mut got = match dtype {
                    DType::F32 => {
                        let mut o: Vec<f32> = (0..out_len + GUARD).map(fill).collect();
                        conv.run_kernel(isa, tile, &mut o).expect("run");
                        o
                    }
                    DType::F16 => {
                        let mut o: Vec<f16> = (0..out_len + GUARD).map(|i| f16::from_f32(fill(i))).collect();
                        conv.run_kernel(isa, tile, &mut o).expect("run");
                        load(&o)
                    }
                    DType::Bf16 => {
                        let mut o: Vec<bf16> = (0..out_len + GUARD).map(|i| bf16::from_f32(fill(i))).collect();
                        conv.run_kernel(isa, tile, &mut o).expect("run");
                        load(&o)
                    }
                    other => unimplemented!("{other:?}"),
                };
                assert!(
                    got.drain(out_len..).all(|v| v == SENTINEL),
                    "{isa:?} tile {tile} packed {packed} {dtype} {d:?} seed {seed}: wrote past the output"
                );
                let want32 = round(&want.iter().map(|&x| x as f32).collect::<Vec<_>>());
                for (i, (&g, &x)) in got.iter().zip(&want32).enumerate() {
                    assert!(
                        g == x,
                        "{isa:?} tile {tile} packed {packed} {dtype} half input {} {d:?} seed {seed}: output {i} is {g}, expected {x}",
                        xh.is_some()
                    );
                }
            });
        }
    }
}

/// Depthwise conv over a grid of shapes: both layouts, kernels 1×1…5×5 (3-wide fused and
/// not), strides 1–3, dilations 1–2, asymmetric paddings up to past the kernel, multipliers
/// 1–3, widths around the SIMD lanes, bias and activations.
#[test]
fn depthwise_is_exact() {
    let mut seed = 1000;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &(kh, kw) in &[(3, 3), (1, 1), (2, 3), (5, 5), (3, 1)] {
            for &(h, w) in &[(1, 1), (5, 7), (9, 17), (12, 33)] {
                for variant in 0..6usize {
                    let mut d =
                        Conv2dDesc::new(layout, [1 + variant % 2, [1, 3, 17, 5, 16, 2][variant], h, w], [kh, kw])
                            .multiplier([1, 1, 1, 2, 1, 3][variant])
                            .stride_h(1 + variant % 3)
                            .stride_w(1 + (variant / 2) % 2)
                            .pad_top(variant % 3)
                            .pad_bottom((variant + 1) % 3)
                            .pad_left([0, 1, 2, 1, 4, 0][variant])
                            .pad_right([0, 1, 0, 3, 1, 2][variant])
                            .dilation_h(1 + variant % 2)
                            .dilation_w(1 + (variant / 3) % 2)
                            .has_bias(variant % 2 == 0)
                            .activation([Activation::Relu6, Activation::None, Activation::Relu][variant % 3]);
                    if d.out_h().is_none_or(|v| v == 0) || d.out_w().is_none_or(|v| v == 0) {
                        d.pad_top = kh;
                        d.pad_bottom = kh;
                        d.pad_left = kw;
                        d.pad_right = kw;
                    }
                    check_conv(&d, seed);
                    seed += 1;
                }
            }
        }
    }
}

/// A depthwise layer of `shape` and kernel `k` with strides `[h, w]`, dilations `[h, w]` and
/// paddings `[top, bottom, left, right]`.
fn conv_geometry(
    layout: Layout,
    shape: [usize; 4],
    k: [usize; 2],
    [sh, sw]: [usize; 2],
    [dh, dw]: [usize; 2],
    [pt, pb, pl, pr]: [usize; 4],
) -> Conv2dDesc {
    Conv2dDesc::new(layout, shape, k)
        .stride_h(sh)
        .stride_w(sw)
        .dilation_h(dh)
        .dilation_w(dw)
        .pad_top(pt)
        .pad_bottom(pb)
        .pad_left(pl)
        .pad_right(pr)
}

/// The layer of `geometry` with a multiplier, bias and activation picked by `seed`, or
/// `None` where its output is empty.
fn varied_layer(geometry: Conv2dDesc, multipliers: &[usize], seed: u64) -> Option<Conv2dDesc> {
    let d = geometry
        .multiplier(multipliers[seed as usize % multipliers.len()])
        .has_bias(!seed.is_multiple_of(3))
        .activation([Activation::Relu6, Activation::None, Activation::Relu][seed as usize % 3]);
    (d.out_h().is_some_and(|v| v > 0) && d.out_w().is_some_and(|v| v > 0)).then_some(d)
}

/// The NCHW band kernel's limits: planes that take several bands (tall, and wide enough that a
/// band holds few rows), rows too wide for any band and kernels of more than 64 taps (both
/// take the row path), strides and dilations that make the phase rows uneven, and MobileNetV2's
/// small planes (7², 14²) whose rows are shorter than one chunk.
#[test]
fn depthwise_band_limits_are_exact() {
    let mut seed = 7000;
    type Case = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 4]);
    let cases: &[Case] = &[
        // [n, c, h, w], [kh, kw], [stride h, w], [dilation h, w], [pad t, b, l, r]
        ([1, 2, 200, 40], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 2, 37, 700], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 2, 9, 1500], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        ([1, 3, 12, 12], [9, 9], [1, 1], [1, 1], [4, 4, 4, 4]),
        ([1, 3, 13, 29], [5, 7], [3, 3], [2, 2], [2, 5, 6, 1]),
        ([2, 5, 7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 4, 14, 14], [3, 3], [2, 2], [1, 1], [0, 1, 0, 1]),
        ([1, 3, 11, 23], [4, 2], [2, 3], [1, 3], [0, 2, 3, 0]),
    ];
    for &([n, c, h, w], k, [sh, sw], [dh, dw], [pt, pb, pl, pr]) in cases {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let d = conv_geometry(layout, [n, c, h, w], k, [sh, sw], [dh, dw], [pt, pb, pl, pr])
                .multiplier(1 + seed as usize % 2)
                .has_bias(true)
                .activation(Activation::Relu6);
            check_conv(&d, seed);
            seed += 1;
        }
    }
}

/// The NCHW 3 × 3 band kernel (`band3`, vertical dilation 1, vertical stride 1 or 2): heights
/// that leave every remainder of the 4-row groups (and several bands), widths from 1 to past
/// two chunks, every horizontal stride and dilation it takes through the phase offsets, the
/// paddings that make the group's first and last input rows padding, multiplier 2; vertical
/// stride 3 and dilation 2 beside them take the general loop.
#[test]
fn depthwise_3x3_band_kernel_is_exact() {
    let mut seed = 9000;
    for &(sh, dh) in &[(1, 1), (2, 1), (3, 1), (1, 2)] {
        for &h in &[1, 2, 3, 5, 6, 8, 11, 14] {
            for &w in &[1, 7, 8, 9, 14, 17] {
                for &(sw, dw, pt, pb, pl, pr) in
                    &[(1, 1, 1, 1, 1, 1), (2, 1, 0, 1, 0, 1), (1, 2, 2, 0, 2, 2), (3, 1, 1, 2, 1, 0)]
                {
                    let g = conv_geometry(Layout::Nchw, [1, 3, h, w], [3, 3], [sh, sw], [dh, dw], [pt, pb, pl, pr]);
                    if let Some(d) = varied_layer(g, &[1, 2], seed) {
                        check_conv(&d, seed);
                        seed += 1;
                    }
                }
            }
        }
    }
}

/// The thread's band and tile buffers keep their zero padding from one call of a layer to the
/// next and are zeroed again for another layer: layers whose data columns and rows fall where
/// the others have padding, alternated on one thread, with the row path (half-precision
/// scratch in the band buffer) between them. 7² planes take the tile (and the band, with the
/// tile off), 20² planes at stride 1 the band.
#[test]
fn depthwise_band_buffers_between_layers_are_exact() {
    for s in [7, 20] {
        let padded =
            Conv2dDesc::new(Layout::Nchw, [1, 2, s, s], [3, 3]).pad_top(1).pad_bottom(1).pad_left(1).pad_right(1);
        let unpadded = Conv2dDesc::new(Layout::Nchw, [1, 2, s + 2, s + 2], [3, 3]);
        let strided = padded.stride_h(2).stride_w(2).pad_left(2);
        let row_path =
            Conv2dDesc::new(Layout::Nchw, [1, 2, 5, 5], [9, 9]).pad_top(4).pad_bottom(4).pad_left(4).pad_right(4);
        let layers = [padded, unpadded, padded, strided, padded, row_path, padded, unpadded, strided];
        for (seed, d) in (9500..).zip(layers) {
            check_conv(&d.has_bias(true).activation(Activation::None), seed);
        }
    }
}

/// The NCHW channel-vector tile (`depthwise/tile.rs`): plane counts around its 8-plane groups
/// (the last group short, groups across images), widths around its 8- and 4-pixel blocks,
/// heights 1 to 16, strides 1–3, dilation 2, kernels 1 × 1 to 5 × 5, paddings on one side
/// only and past the kernel, multipliers 2 and 3 (lanes that share an input plane), and
/// strided planes up to the largest whole-plane tile and past it, in bands of rows.
#[test]
fn depthwise_channel_tile_is_exact() {
    let mut seed = 12_000;
    type Case = ([usize; 2], [usize; 2], [usize; 2], [usize; 4]);
    let cases: &[Case] = &[
        // [kh, kw], [stride h, w], [dilation h, w], [pad t, b, l, r]
        ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([3, 3], [2, 2], [1, 1], [0, 1, 0, 1]),
        ([3, 3], [1, 2], [2, 1], [2, 0, 3, 1]),
        ([5, 5], [3, 3], [1, 2], [4, 4, 0, 6]),
        ([1, 1], [1, 1], [1, 1], [0, 0, 0, 0]),
        ([2, 3], [2, 1], [1, 1], [0, 1, 2, 0]),
    ];
    for &(n, c) in &[(1, 1), (1, 3), (1, 8), (1, 9), (2, 7), (3, 17)] {
        for &(h, w) in &[(1, 1), (7, 7), (3, 8), (5, 12), (16, 16), (2, 17)] {
            for &(k, [sh, sw], [dh, dw], pads) in cases {
                let g = conv_geometry(Layout::Nchw, [n, c, h, w], k, [sh, sw], [dh, dw], pads);
                if let Some(d) = varied_layer(g, &[1, 1, 2, 3], seed) {
                    check_conv(&d, seed);
                    seed += 1;
                }
            }
        }
    }
    // Stride 2 up to the largest whole-plane tile (61² with padding 1 is a 63² tile and
    // fits, 63² does not), then in bands of output rows (63²: 31 and 1 rows, 100²: 19, 19
    // and 12) up to 128² (64² outputs, as many as the sums hold) and past it (130²: in
    // AVX2 and AVX-512 the sums go band by band, elsewhere the band kernel takes it); 3 × 3
    // at stride 1 with the whole padded plane in the tile (with padding 1, up to 62²), then
    // in bands of rows (63², 65²), with the sums band by band past 64² outputs (70²: 33, 33
    // and 4 rows; 112²: 35 rows a band but the last).
    for &(s, stride) in &[
        (40, 2),
        (61, 2),
        (63, 2),
        (100, 2),
        (128, 2),
        (130, 2),
        (16, 1),
        (17, 1),
        (45, 1),
        (62, 1),
        (63, 1),
        (65, 1),
        (70, 1),
        (112, 1),
    ] {
        let d = conv_geometry(Layout::Nchw, [1, 9, s, s], [3, 3], [stride, stride], [1, 1], [1, 1, 1, 1])
            .has_bias(true)
            .activation(Activation::Relu6);
        check_conv(&d, seed);
        seed += 1;
    }
    // Bands with a 5 × 5 kernel, dilation, uneven strides and paddings, a multiplier, and
    // padding rows at both ends of the plane.
    type Banded = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 4]);
    let banded: &[Banded] = &[
        ([2, 5, 90, 70], [5, 5], [2, 3], [2, 1], [4, 3, 2, 0]),
        ([1, 3, 120, 97], [3, 3], [3, 2], [1, 1], [0, 2, 1, 1]),
        ([1, 4, 99, 99], [2, 3], [2, 2], [1, 2], [1, 0, 0, 3]),
        // 64² outputs of 25 taps: a plane is more multiply-adds than a task's share, so
        // every task takes one group of 8 planes.
        ([1, 9, 128, 128], [5, 5], [2, 2], [1, 1], [2, 1, 2, 1]),
        // 3 × 3 at stride 1 with the sums band by band: uneven sides and paddings, a
        // multiplier, vertical dilation and stride 2 down the rows only.
        ([1, 11, 97, 83], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([2, 3, 90, 75], [3, 3], [1, 1], [2, 1], [0, 2, 1, 0]),
        ([1, 5, 150, 66], [3, 3], [2, 1], [1, 1], [1, 1, 1, 1]),
    ];
    for &(shape, k, st, dil, pads) in banded {
        if let Some(d) = varied_layer(conv_geometry(Layout::Nchw, shape, k, st, dil, pads), &[1, 2], seed) {
            check_conv(&d, seed);
            seed += 1;
        }
    }
}

/// The NHWC pixel tiles (multiplier 1, whole 16-channel blocks): rows whose interior holds
/// no tile, one, several and leftover pixels, with every stride, dilation, kernel width and
/// left/right padding mix that moves the interior's ends; multiplier 2 and a channel count
/// off the block take the one-pixel path beside them.
#[test]
fn depthwise_nhwc_pixel_tiles_are_exact() {
    let mut seed = 8000;
    for &c in &[16, 48, 24] {
        for &w in &[1, 3, 4, 6, 9, 13, 21] {
            for &(kw, sw, dw, pl, pr) in
                &[(3, 1, 1, 1, 1), (3, 2, 1, 1, 0), (5, 1, 2, 0, 4), (1, 3, 1, 0, 0), (3, 1, 3, 3, 2), (7, 2, 1, 3, 3)]
            {
                let d = Conv2dDesc::new(Layout::Nhwc, [1, c, 3, w], [3, kw])
                    .stride_w(sw)
                    .dilation_w(dw)
                    .pad_top(1)
                    .pad_bottom(1)
                    .pad_left(pl)
                    .pad_right(pr)
                    .multiplier(if c == 48 && w == 9 { 2 } else { 1 })
                    .has_bias(seed % 2 == 0)
                    .activation([Activation::Relu6, Activation::None, Activation::Relu][seed as usize % 3]);
                if d.out_w().is_none_or(|v| v == 0) {
                    continue;
                }
                check_conv(&d, seed);
                seed += 1;
            }
        }
    }
}

/// The NHWC 3 × 3 row kernel (`depthwise/nhwc3.rs`: multiplier 1, horizontal dilation 1,
/// stride 1 or 2, whole 8-channel blocks; 16-lane rows on AVX-512 where the block is whole
/// 16-channel vectors, as 16, 48 and 256 are): channel counts of odd and even 8-channel blocks,
/// widths from 1 (no interior pixel) past several 4-pixel tiles and their remainders, and at
/// 256 channels past one segment of pixels; left and right paddings 0–4 (border pixels with
/// none to three taps inside the row), kernel rows outside the image at the top and
/// bottom with vertical strides and dilations, two images; a multiplier of 2 beside them
/// takes the tap-list path.
#[test]
fn depthwise_nhwc_3x3_rows_are_exact() {
    let mut seed = 8500;
    for &(c, widths) in &[
        (8, &[1usize, 2, 3, 5, 7, 9, 14][..]),
        (24, &[1, 4, 6, 13, 17][..]),
        (16, &[2, 8, 11][..]),
        (48, &[3, 10][..]),
        (256, &[40, 70][..]),
    ] {
        for &w in widths {
            for &(sw, pl, pr) in
                &[(1, 1, 1), (2, 1, 1), (1, 0, 0), (2, 0, 1), (1, 2, 0), (2, 2, 2), (1, 0, 2), (1, 3, 1), (2, 4, 3)]
            {
                for &(sh, dh, pt, pb) in &[(1, 1, 1, 1), (2, 2, 2, 0)] {
                    let g = conv_geometry(
                        Layout::Nhwc,
                        [1 + seed as usize % 2, c, 5, w],
                        [3, 3],
                        [sh, sw],
                        [dh, 1],
                        [pt, pb, pl, pr],
                    );
                    let m = if c == 24 && w == 6 { &[2][..] } else { &[1][..] };
                    if let Some(d) = varied_layer(g, m, seed) {
                        check_conv(&d, seed);
                    }
                    seed += 1;
                }
            }
        }
    }
}

/// The NCHW 16-lane rows (`depthwise::rows512`: 3 × 3, stride and dilation 1, AVX-512): rows
/// of 8 outputs (the fewest it takes) to 256 (the most) and one past, around one and two
/// vectors; plane heights that leave every remainder of the 4-row groups; paddings from none
/// (the output narrower than the input) to 2 on one side only, top and bottom unequal; a
/// multiplier; and a plane of more outputs than the band buffer (half-precision outputs go
/// through it in two bands of rows there).
#[test]
fn depthwise_nchw_rows512_are_exact() {
    // `check_conv` runs the band and row kernels on the layers the 16-lane rows take (a 20-wide
    // plane: the tile takes it on AVX2 too, not without).
    let d = conv_geometry(Layout::Nchw, [1, 1, 20, 20], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 400], vec![0.0; 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert_eq!(conv.has_small_plane_kernel(isa), isa != Isa::Portable, "{isa:?}");
    }
    let shapes = [(1, 8), (2, 15), (3, 16), (5, 17), (6, 31), (7, 33), (9, 10), (4, 256), (3, 257), (40, 240)];
    check_nchw_3x3_layers(1, &shapes, 8700);
}

/// [`check_conv`] on NCHW 3 × 3 layers of `stride` (both ways) and each `(height, width)`, with
/// paddings from none to 2 on one side only and unequal, one or two images, one to three
/// channels, a multiplier of 2 on a third of them, bias and activations varied.
fn check_nchw_3x3_layers(stride: usize, shapes: &[(usize, usize)], mut seed: u64) {
    for &(h, w) in shapes {
        for &pads in &[[1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 2, 0], [0, 2, 0, 2], [1, 2, 1, 1], [1, 2, 0, 1]] {
            let g = conv_geometry(
                Layout::Nchw,
                [1 + seed as usize % 2, 1 + seed as usize % 3, h, w],
                [3, 3],
                [stride, stride],
                [1, 1],
                pads,
            );
            if let Some(d) = varied_layer(g, &[1, 1, 2], seed) {
                check_conv(&d, seed);
            }
            seed += 1;
        }
    }
}

/// The NCHW flat planes (`depthwise::flat512`: 3 × 3, stride and dilation 1, padding 1 all
/// round, rows of at most 15 pixels and planes of at most 256, rows of 17 to 31 and planes
/// of at most 1024, or rows of 32 to 256, on AVX-512; their own order of the sums, exact on
/// these integers): every row width from 1 to 31, plane heights of one to several vectors and
/// a last vector of one pixel (7², 16 × 1), wide rows of 32 to 256 and 257 (the rows take it),
/// the largest planes and one past them (the rows take those), rows of 16 (the rows too),
/// planes of MobileNetV2's sizes in other shapes (49 × 1, 28 × 7, whose shifts are not the
/// square planes' compiled in), several images and channels, no activation, ReLU and ReLU6,
/// the f16 and bf16 storages beside them (widened and rounded a chunk of planes at a time),
/// and layers of more planes than one chunk.
#[test]
fn depthwise_nchw_flat_planes_are_exact() {
    let d = conv_geometry(Layout::Nchw, [1, 1, 7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 49], vec![0.0; 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert!(conv.has_small_plane_kernel(isa), "{isa:?}");
    }
    // MobileNetV2's plane sizes in other shapes (49 × 1; 28 × 7, 49 × 4 and 98 × 2, 196
    // pixels): the shifts compiled in for 7² and 14² are not theirs.
    let other = [(49, 1), (28, 7), (49, 4), (98, 2)];
    let near = (1..=15)
        .map(|w| (1 + (w * 7) % 17, w))
        .chain([(7, 7), (14, 14), (16, 1), (17, 15), (18, 15), (4, 4)])
        .chain(other);
    let far = (17..=31).map(|w| (1 + (w * 5) % 13, w)).chain([(28, 28), (33, 31), (34, 31), (5, 16)]);
    // Wide rows (32 to 256 pixels, any height) and one past them (the rows take it).
    let wide = [(3, 32), (1, 33), (4, 40), (2, 56), (5, 112), (2, 200), (1, 256), (2, 257)];
    let shapes = near.chain(far).chain(wide);
    for (seed, (h, w)) in (8600u64..).zip(shapes) {
        let g = conv_geometry(
            Layout::Nchw,
            [1 + seed as usize % 3, 1 + seed as usize % 4, h, w],
            [3, 3],
            [1, 1],
            [1, 1],
            [1; 4],
        );
        let d = g
            .has_bias(!seed.is_multiple_of(3))
            .activation([Activation::Relu6, Activation::None, Activation::Relu][seed as usize % 3]);
        check_conv(&d, seed);
    }
    // More planes than one chunk of the half-precision buffers (`FLAT_CHUNK`, 4096 elements:
    // 83 planes of 7², 5 of 28²), so later chunks start at their own planes and channels.
    for (seed, shape) in (8690u64..).zip([[2, 50, 7, 7], [1, 7, 28, 28], [3, 2, 14, 14]]) {
        let d = conv_geometry(Layout::Nchw, shape, [3, 3], [1, 1], [1, 1], [1; 4]);
        check_conv(&d.has_bias(true).activation(Activation::Relu6), seed);
    }
}

/// The NCHW rolling rows (`depthwise::roll512`: 3 × 3, stride and dilation 1, padding 1 all
/// round, rows of 9 to 16 and 24 to 32 pixels, on AVX-512; the taps in kernel order, exact
/// on these integers) against the reference: the fewest and most pixels a row of one and of
/// two vectors, MobileNetV2's 14² and 28² (their sizes compiled in), planes of one to 33
/// rows, several images and channels, no activation, ReLU and ReLU6, bias or none; the f16
/// and bf16 storages beside them (widened and rounded a chunk of planes at a time), and
/// layers of more planes than one chunk. (The activations applied after each plane:
/// `depthwise_nchw_flat_planes_other_activations`.)
#[test]
fn depthwise_nchw_rolling_rows_are_exact() {
    let shapes = [(14, 14), (28, 28), (1, 9), (2, 9), (3, 16), (33, 12), (1, 24), (4, 24), (5, 31), (2, 32), (9, 15)];
    let acts = [Activation::Relu6, Activation::None, Activation::Relu];
    for (seed, (h, w)) in (8750u64..).zip(shapes) {
        let g = conv_geometry(
            Layout::Nchw,
            [1 + seed as usize % 2, 1 + seed as usize % 3, h, w],
            [3, 3],
            [1, 1],
            [1, 1],
            [1; 4],
        );
        let d = g.has_bias(seed % 4 != 1).activation(acts[seed as usize % 3]);
        let (x, wk) = (vec![0.0; h * w], vec![0.0; 9]);
        let conv = Conv { d, x: &x, xh: None, w: &wk, packed: false, bias: None };
        assert_eq!(conv.takes_rolling_rows(Isa::Avx512), Isa::available().contains(&Isa::Avx512), "{d:?}");
        check_conv(&d, seed);
    }
    if !Isa::available().contains(&Isa::Avx512) {
        eprintln!("skipped: the rolling rows need AVX-512, which this CPU lacks (the layers ran)");
    }
    // More planes than one chunk of the half-precision buffers (`FLAT_CHUNK`, 4096 elements:
    // 20 planes of 14², 5 of 28²).
    for (seed, shape) in (8770u64..).zip([[2, 23, 14, 14], [1, 7, 28, 28]]) {
        let d = conv_geometry(Layout::Nchw, shape, [3, 3], [1, 1], [1, 1], [1; 4]);
        check_conv(&d.has_bias(true).activation(Activation::Relu6), seed);
    }
}

/// The NCHW flat planes and rolling rows with an activation they do not apply in registers
/// (GELU, its tanh form, SiLU: over each plane after it is stored) give the bits of the band
/// kernel, which applies it over its rows (integer inputs: the sums are exact in either
/// kernel's order), on MobileNetV2's plane sizes (7² the flat planes', 14² and 28² the
/// rolling rows') and others (5 × 9 the rolling rows', 9 × 20 the flat planes'), several
/// channels and images, packed weights or not; and write nothing past the output.
#[test]
fn depthwise_nchw_flat_planes_other_activations() {
    if !Isa::available().contains(&Isa::Avx512) {
        eprintln!("skipped: the flat planes need AVX-512, which this CPU lacks");
        return;
    }
    let acts = [Activation::Gelu, Activation::GeluTanh, Activation::Silu];
    for (seed, (h, w)) in (8700u64..).zip([(7, 7), (14, 14), (28, 28), (5, 9), (9, 20)]) {
        let d = conv_geometry(Layout::Nchw, [2, 3, h, w], [3, 3], [1, 1], [1, 1], [1; 4])
            .has_bias(seed % 2 == 0)
            .activation(acts[seed as usize % 3]);
        let mut rng = Rng(seed);
        let x = rng.ints(2 * 3 * h * w, 3);
        let wk = rng.ints(3 * 9, 3);
        let wp: Vec<f32> = (0..27).map(|i| wk[(i % 3) * 9 + i / 3]).collect();
        let bias = rng.ints(3, 5);
        let bias = d.has_bias.then_some(&bias[..]);
        let out_len = 2 * 3 * h * w;
        for (w, packed) in [(&wk, false), (&wp, true)] {
            let conv = Conv { d, x: &x, xh: None, w, packed, bias };
            assert!(conv.has_small_plane_kernel(Isa::Avx512), "{d:?}");
            let run = |tile: bool| {
                let mut o = vec![SENTINEL; out_len + GUARD];
                conv.run_kernel(Isa::Avx512, tile, &mut o).expect("run");
                o
            };
            let (flat, band) = (run(true), run(false));
            assert!(flat[out_len..].iter().all(|&v| v == SENTINEL), "{d:?}: wrote past the output");
            for (i, (f, b)) in flat.iter().zip(&band).enumerate() {
                assert!(f.to_bits() == b.to_bits(), "{d:?} packed {packed}: output {i} is {f}, the band's {b}");
            }
        }
    }
}

/// The NCHW 16-lane rows at stride 2 (`depthwise::rows512`: both strides 2, dilation 1): rows of
/// 8 outputs (the fewest) to 256 (the most) and one past, each vector's 33 input columns
/// inside the row, past its end (odd and even widths, so the 33rd column is there or not) or
/// before its start (left paddings 0–2); plane heights that leave every remainder of the 4-row
/// groups, with top and bottom paddings that put the first and last kernel rows outside; the
/// first and last rows' vectors whose span leaves the plane take masked loads, the others
/// not; a multiplier; a plane of more outputs than the band buffer (half-precision outputs in
/// two bands of rows); and MobileNetV2's 144 × 56² layer's geometry on a few channels. (With
/// padding 1 at the top and left and at most 1 at the bottom and right, multiplier 1, the
/// stride-2 column sums take the layer where AVX-512 is, and the rows where it is turned off.)
#[test]
fn depthwise_nchw_rows512_stride2_is_exact() {
    let d = conv_geometry(Layout::Nchw, [1, 1, 33, 33], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 33 * 33], vec![0.0; 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert!(conv.has_small_plane_kernel(isa), "{isa:?}");
    }
    let shapes = [
        (2, 15),
        (3, 16),
        (5, 17),
        (8, 31),
        (9, 33),
        (7, 34),
        (12, 63),
        (6, 65),
        (4, 512),
        (3, 515),
        (30, 56),
        (130, 300),
    ];
    check_nchw_3x3_layers(2, &shapes, 8800);
    let d = conv_geometry(Layout::Nchw, [1, 3, 56, 56], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]);
    check_conv(&d.has_bias(true).activation(Activation::Relu6), 8899);
}

/// The NCHW stride-2 column sums (`depthwise::stride2`: 3 × 3, both strides 2, padding 1 at
/// the top and left and 0 or 1 at the bottom and right, multiplier 1, rows of 8 outputs or
/// more, on AVX-512; their own order of the sums, exact on these integers): rows of 8 outputs
/// (the fewest) to several vectors, whose last vector's 32 input columns lie inside the row,
/// end at it or pass it (odd and even widths, 15 to 130 columns), heights of one input row to
/// several (odd heights end in a padding row below, or not without padding), MobileNetV2's
/// 112², 56² and 28² planes, several images and channels, no activation, ReLU and ReLU6, the
/// f16 and bf16 storages (widened and rounded a chunk of planes at a time), and a layer of
/// more planes than one chunk.
#[test]
fn depthwise_nchw_stride2_column_sums_are_exact() {
    let d = conv_geometry(Layout::Nchw, [1, 1, 28, 28], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 28 * 28], vec![0.0; 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert!(conv.has_small_plane_kernel(isa), "{isa:?}");
    }
    let shapes = [
        (1, 15),
        (2, 16),
        (3, 17),
        (4, 31),
        (5, 32),
        (6, 33),
        (9, 47),
        (7, 63),
        (8, 64),
        (3, 65),
        (2, 66),
        (5, 97),
        (3, 130),
    ];
    let shapes = shapes.into_iter().chain([(112, 112), (56, 56), (28, 28)]);
    for (seed, (h, w)) in (8900u64..).zip(shapes) {
        for (i, [pb, pr]) in [[1, 1], [0, 0], [1, 0], [0, 1]].into_iter().enumerate() {
            let seed = seed * 4 + i as u64;
            let n = if h > 50 { [1, 2] } else { [1 + seed as usize % 3, 1 + seed as usize % 4] };
            let g = conv_geometry(Layout::Nchw, [n[0], n[1], h, w], [3, 3], [2, 2], [1, 1], [1, pb, 1, pr]);
            if g.out_h().is_none() {
                continue;
            }
            let d = g
                .has_bias(!seed.is_multiple_of(3))
                .activation([Activation::Relu6, Activation::None, Activation::Relu][seed as usize % 3]);
            check_conv(&d, seed);
        }
    }
    // More planes than one chunk of the half-precision buffers (`FLAT_CHUNK`, 4096 output
    // elements: 20 planes of 14²), so later chunks start at their own planes and channels.
    let d = conv_geometry(Layout::Nchw, [2, 23, 28, 28], [3, 3], [2, 2], [1, 1], [1; 4]);
    check_conv(&d.has_bias(true).activation(Activation::Relu6), 8990);
}

/// The NCHW channel blocks (`Conv::nchw_blocks`: 16 planes at a time transposed into
/// and out of pixel-major blocks, input planes of up to 128 pixels at stride 1 and 64² at
/// stride 2, on AVX-512): planes from 1 × 1 to each limit and one past it (the tile or the
/// rows take those), pixel counts that leave every remainder of the 16-pixel transpositions,
/// both strides, vertical dilation, paddings past the kernel, 16 to 48 channels, 1–3 images;
/// f32, f16 and bf16 inputs and outputs (`check_conv`'s storages). At stride 2 the 16-lane
/// rows take the planes of 8 outputs a row or more, so the blocks there have the narrower
/// planes and, with vertical dilation 2, every size.
#[test]
fn depthwise_nchw_channel_blocks_are_exact() {
    // `check_conv` runs the tile and the rows on the layers the blocks take: it must see that
    // they do.
    let d = conv_geometry(Layout::Nchw, [1, 16, 7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 16 * 49], vec![0.0; 16 * 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert!(conv.has_small_plane_kernel(isa), "{isa:?}");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(conv.nchw_blocks_fit(isa), isa == Isa::Avx512, "{isa:?}");
    }
    let mut seed = 8900;
    let cases = [
        (16, 1, 1, 1),
        (16, 2, 3, 1),
        (32, 7, 7, 1),
        (16, 11, 11, 1),
        (48, 8, 16, 1),
        (16, 9, 15, 1),
        (16, 3, 17, 2),
        (32, 14, 14, 2),
        (16, 29, 27, 2),
        (16, 64, 64, 2),
        (16, 65, 63, 2),
        (16, 65, 64, 2),
    ];
    for &(c, h, w, s) in &cases {
        for &(dh, pads) in &[(1, [1, 1, 1, 1]), (2, [0, 2, 2, 0]), (1, [3, 0, 0, 3])] {
            let batch = if h * w > 1000 { 1 } else { 1 + seed as usize % 3 };
            let g = conv_geometry(Layout::Nchw, [batch, c, h, w], [3, 3], [s, s], [dh, 1], pads);
            if let Some(d) = varied_layer(g, &[1], seed) {
                check_conv(&d, seed);
            }
            seed += 1;
        }
    }
}

/// The NHWC channel blocks (`Conv::nhwc_blocks`: 3 × 3 layers with planes of up to 64²
/// pixels, 112² for f32 16-lane blocks at stride 2 on AMD, f16 and bf16 through 16-lane
/// blocks): 8- and 16-channel blocks (24 and 40 channels take 8-lane vectors on AVX-512 too,
/// and half-precision layers the row kernels), planes from one pixel to the limit and one past
/// it, rows of 2 to 17 pixels around one and two tiles of 4 and 8 (padded by one, whole rows
/// go in tiles), both strides, vertical dilation, paddings from none to past the kernel, one
/// to three images; `check_conv` also runs them through the row kernels and checks the words
/// past the output.
#[test]
fn depthwise_nhwc_channel_blocks_are_exact() {
    // `check_conv` runs the row kernels on the layers the blocks take: it must see that they do.
    let d = conv_geometry(Layout::Nhwc, [1, 16, 7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]);
    let (x, w) = (vec![0.0; 16 * 49], vec![0.0; 16 * 9]);
    let conv = Conv { d, x: &x, xh: None, w: &w, packed: false, bias: None };
    for isa in Isa::available() {
        assert_eq!(conv.has_small_plane_kernel(isa), isa != Isa::Portable, "{isa:?}");
    }
    let mut seed = 8800;
    let planes = [(8, 1, 1), (16, 2, 3), (24, 7, 7), (32, 14, 5), (40, 3, 17), (16, 64, 64), (16, 65, 63), (160, 9, 4)];
    for &(c, h, w) in planes.iter().chain(&[(16, 3, 2), (32, 4, 8), (16, 2, 9), (48, 3, 16)]) {
        for &(s, dh, pads) in &[(1, 1, [1, 1, 1, 1]), (2, 1, [1, 1, 1, 1]), (1, 2, [0, 2, 2, 0]), (2, 1, [3, 0, 0, 3])]
        {
            let batch = if h * w > 1000 { 1 } else { 1 + seed as usize % 3 };
            let g = conv_geometry(Layout::Nhwc, [batch, c, h, w], [3, 3], [s, s], [dh, 1], pads);
            if let Some(d) = varied_layer(g, &[1], seed) {
                check_conv(&d, seed);
            }
            seed += 1;
        }
    }
    // At stride 2 (f32, 16-channel blocks) the blocks take planes up to 112² on AMD (64²
    // elsewhere, as at stride 1), and the rows one past it: both limits run on every CPU.
    as_each_vendor(|amd| {
        let (most, planes) = if amd { (112, [(112, 112), (113, 112)]) } else { (64, [(64, 64), (65, 64)]) };
        for (seed, (h, w)) in (8890 + 2 * amd as u64..).zip(planes) {
            let d = conv_geometry(Layout::Nhwc, [1, 16, h, w], [3, 3], [2, 2], [1, 1], [1; 4]);
            if Isa::available().contains(&Isa::Avx512) {
                let (x, wk) = (vec![0.0; 16 * h * w], vec![0.0; 16 * 9]);
                let conv = Conv { d, x: &x, xh: None, w: &wk, packed: false, bias: None };
                assert_eq!(conv.has_small_plane_kernel(Isa::Avx512), h * w <= most * most, "{h} x {w}, amd {amd}");
            }
            check_conv(&d.has_bias(true).activation(Activation::Relu6), seed);
        }
    });
}

/// The NHWC channel blocks with the output rows split into bands between the threads instead
/// of the blocks, where the blocks do not split evenly (`row_bands`), in pools of one, two and
/// three threads: the rows of each band and none past them written (`check_conv` fills the
/// output with NaN), the input rows a band reads widened from f16 and bf16 (vertical dilation
/// and a top padding past the kernel move them), more than one image, both strides, 16- and
/// 8-channel blocks; and the layers whose blocks split evenly, or that run on one thread, left
/// in runs of blocks. The lanes and bands asserted are the kernel's own choice for each
/// instruction set.
#[cfg(target_arch = "x86_64")]
#[test]
fn depthwise_nhwc_row_bands_are_exact() {
    // (batch, channels, height, width, stride, vertical dilation, paddings), the instruction
    // set whose blocks are asserted, their lanes, and the bands on one, two and three threads.
    let layers = [
        ((1, 144, 12, 12, 1, 1, [1, 1, 1, 1]), Isa::Avx512, 16, [1, 2, 1]),
        ((1, 80, 32, 32, 2, 1, [1, 1, 1, 1]), Isa::Avx512, 16, [1, 2, 3]),
        ((1, 48, 13, 30, 1, 2, [3, 0, 2, 0]), Isa::Avx512, 16, [1, 2, 1]),
        ((3, 16, 20, 20, 1, 1, [1, 1, 1, 1]), Isa::Avx512, 16, [1, 2, 1]),
        ((1, 192, 10, 10, 1, 1, [1, 1, 1, 1]), Isa::Avx512, 16, [1, 1, 1]),
        ((1, 40, 20, 20, 1, 1, [1, 1, 1, 1]), Isa::Avx2, 8, [1, 2, 3]),
    ];
    let mut seed = 9100;
    for threads in 1..=3 {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
        pool.install(|| {
            for &((n, c, h, w, s, dh, pads), isa, lanes, bands) in &layers {
                let d = conv_geometry(Layout::Nhwc, [n, c, h, w], [3, 3], [s, s], [dh, 1], pads);
                if !Isa::available().contains(&isa) {
                    println!("SKIP depthwise_nhwc_row_bands_are_exact {c} x {h} x {w}: this CPU has no {isa:?}");
                    continue;
                }
                for d in [d, d.has_bias(true).activation(Activation::Relu6)] {
                    let (x, wk) = (vec![0.0; n * c * h * w], vec![0.0; c * 9]);
                    let conv = Conv { d, x: &x, xh: None, w: &wk, packed: false, bias: None };
                    let want = Some((lanes, bands[threads - 1]));
                    assert_eq!(conv.nhwc_bands(isa), want, "{isa:?}, {threads} threads, {d:?}");
                    check_conv(&d, seed);
                    seed += 1;
                }
            }
        });
    }
}

/// NHWC layers with a channel multiplier, wide enough that half-precision rows go through
/// the row buffer in several channel blocks, one starting inside a run of channels that share
/// an input channel (48 = 16 × 3 channels in blocks of 32 and 16; 27 = 3 × 9 in blocks of 16
/// and 11, im2col's shape).
#[test]
fn depthwise_nhwc_multiplier_channel_blocks_are_exact() {
    let mut seed = 8800;
    for &(c, m, w, k, s) in &[(16, 3, 200, 3, 1), (3, 9, 500, 3, 2), (5, 2, 130, 2, 1), (3, 9, 7, 3, 1)] {
        let d = conv_geometry(Layout::Nhwc, [1, c, 3, w], [k, k], [1, s], [1, 1], [1, 0, 1, 2]).multiplier(m);
        for d in [d, d.has_bias(true).activation(Activation::Relu6)] {
            check_conv(&d, seed);
            seed += 1;
        }
    }
}

/// The im2col gather (`cpu/im2col.rs`) against what it stands for, the depthwise convolution
/// with one-hot filters, bit for bit in every dtype: both layouts, kernels 1×1 to 3×3 and
/// non-square, unequal strides and dilations, asymmetric paddings (some past the kernel, so
/// whole output rows and columns are padding), images small and large enough for the
/// parallel split; the words past the output keep their sentinel.
#[test]
fn im2col_gather_is_the_one_hot_convolution() {
    let mut seed = 9100;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &([n, c, h, w], [kh, kw], [sh, sw], [dh, dw], pads) in &[
            ([1, 3, 224, 224], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            ([2, 3, 9, 11], [3, 3], [1, 2], [2, 1], [0, 3, 2, 0]),
            ([1, 5, 6, 5], [2, 3], [3, 1], [1, 2], [4, 0, 1, 5]),
            ([2, 1, 1, 1], [1, 1], [1, 1], [1, 1], [0, 0, 0, 0]),
            ([1, 2, 7, 4], [3, 1], [2, 3], [1, 1], [1, 2, 0, 1]),
            ([3, 4, 40, 37], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            // One output column, and odd widths at horizontal stride 2 (the paired copy).
            ([1, 2, 3, 2], [1, 1], [1, 2], [1, 1], [0, 0, 0, 0]),
            ([2, 3, 5, 9], [3, 3], [2, 2], [1, 1], [1, 0, 0, 1]),
        ] {
            let d = conv_geometry(layout, [n, c, h, w], [kh, kw], [sh, sw], [dh, dw], pads).multiplier(kh * kw);
            let taps = kh * kw;
            let total: usize = d.output_shape().iter().product();
            let mut rng = Rng(seed);
            seed += 1;
            let x = rng.ints(n * c * h * w, 100);
            let one_hot: Vec<f32> =
                (0..c * taps * taps).map(|i| if i / taps % taps == i % taps { 1.0 } else { 0.0 }).collect();
            let mut want = vec![f32::NAN; total];
            Conv { d, x: &x, xh: None, w: &one_hot, packed: false, bias: None }.run(&mut want).expect("conv");
            let guard = 7;
            each_dtype(|dtype, round| {
                let want = round(&want);
                let got = match dtype {
                    DType::F32 => {
                        let mut o = vec![SENTINEL; total + guard];
                        super::im2col::gather(&d, &x, 0.0, &mut o).expect("gather");
                        o
                    }
                    DType::F16 => {
                        let mut o = vec![f16::from_f32(SENTINEL); total + guard];
                        super::im2col::gather(&d, &store(&x, f16::ZERO), f16::ZERO, &mut o).expect("gather");
                        load(&o)
                    }
                    DType::Bf16 => {
                        let mut o = vec![bf16::from_f32(SENTINEL); total + guard];
                        super::im2col::gather(&d, &store(&x, bf16::ZERO), bf16::ZERO, &mut o).expect("gather");
                        load(&o)
                    }
                    other => unimplemented!("{other:?}"),
                };
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(g.to_bits() == e.to_bits(), "{dtype} {d:?}: output {i} is {g}, expected {e}");
                }
                assert!(got[total..].iter().all(|&v| v == SENTINEL), "{dtype} {d:?}: wrote past the output");
            });
            // The f32 gather compiled for each instruction set.
            in_each_isa(|isa| {
                let mut o = vec![SENTINEL; total + guard];
                super::im2col::gather_f32(&d, &x, &mut o).expect("gather");
                for (i, (&g, &e)) in o.iter().zip(&want).enumerate() {
                    assert!(g.to_bits() == e.to_bits(), "{isa:?} {d:?}: output {i} is {g}, expected {e}");
                }
                assert!(o[total..].iter().all(|&v| v == SENTINEL), "{isa:?} {d:?}: wrote past the output");
            });
        }
    }
}

/// The one-pass pointwise convolution (`cpu/pointwise.rs`) against an f64 reference, bit for
/// bit on integer data in every dtype, both layouts: one and several images, no input
/// channel (the bias alone), one output channel and counts off the vector width, a pixel, a
/// few, and images large enough for the parallel split and several half-precision stages
/// (with a remainder block); with and without bias and residual, each exact activation; the
/// words past the output keep their sentinel.
#[test]
fn pointwise_kernel_is_exact() {
    use super::pointwise::Pointwise;
    use crate::backend::PointwiseDesc;
    let mut seed = 9500;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &(batch, cin, cout, pixels) in &[
            (1, 3, 5, 1),
            (2, 16, 17, 15),
            (1, 0, 4, 9),
            (3, 7, 1, 33),
            (1, 16, 96, 3000),
            (2, 27, 32, 1111),
            (1, 32, 1280, 49),
            (2, 40, 333, 37),
            (3, 9, 24, 700),
            (1, 72, 10, 9),
            (1, 20, 48, 29),
            (2, 32, 40, 47),
        ] {
            for variant in 0..4usize {
                let (has_bias, has_res) = (variant % 2 == 0, variant / 2 == 1);
                let activation = [Activation::None, Activation::Relu6, Activation::Relu][(seed % 3) as usize];
                let d = PointwiseDesc { batch, cin, cout, pixels, activation, layout };
                let mut rng = Rng(seed);
                seed += 1;
                let x = rng.ints(batch * cin * pixels, 3);
                let w = rng.ints(cout * cin, 3);
                let bias = has_bias.then(|| rng.ints(cout, 20));
                let residual = has_res.then(|| rng.ints(batch * cout * pixels, 20));
                // Element (image, channel, pixel) of a tensor of `c` channels.
                let at = |n: usize, ch: usize, p: usize, c: usize| match layout {
                    Layout::Nchw => (n * c + ch) * pixels + p,
                    _ => (n * pixels + p) * c + ch,
                };
                let total = batch * cout * pixels;
                let mut want = vec![0.0f32; total];
                for n in 0..batch {
                    for o in 0..cout {
                        for p in 0..pixels {
                            let mut acc = bias.as_ref().map_or(0.0, |b| b[o] as f64);
                            acc += residual.as_ref().map_or(0.0, |r| r[at(n, o, p, cout)] as f64);
                            for k in 0..cin {
                                acc += w[o * cin + k] as f64 * x[at(n, k, p, cin)] as f64;
                            }
                            want[at(n, o, p, cout)] = activation.apply_f64(acc) as f32;
                        }
                    }
                }
                let pw = Pointwise { d, x: &x, w: &w, bias: bias.as_deref(), residual: residual.as_deref() };
                let guard = 5;
                // As the kernel chooses, and with the output channels in 3 ranges, in every
                // instruction set (layers of 1 to 32 input channels take the small-K register
                // tiles on AVX2 and AVX-512, both layouts; `gemm` elsewhere).
                for ranges in [None, Some(3)] {
                    in_each_isa(|isa| {
                        each_dtype(|dtype, round| {
                            let want = round(&want);
                            let got = match dtype {
                                DType::F32 => {
                                    let mut o = vec![SENTINEL; total + guard];
                                    pw.run_with(&mut o, ranges).expect("run");
                                    o
                                }
                                DType::F16 => {
                                    let mut o = vec![f16::from_f32(SENTINEL); total + guard];
                                    pw.run_with(&mut o, ranges).expect("run");
                                    load(&o)
                                }
                                DType::Bf16 => {
                                    let mut o = vec![bf16::from_f32(SENTINEL); total + guard];
                                    pw.run_with(&mut o, ranges).expect("run");
                                    load(&o)
                                }
                                other => unimplemented!("{other:?}"),
                            };
                            for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                                assert!(
                                    g == e,
                                    "{isa:?} {dtype} {d:?} {ranges:?} bias {has_bias} residual {has_res}: output {i} is {g}, expected {e}"
                                );
                            }
                            let past = got[total..].iter().all(|&v| v == SENTINEL);
                            assert!(past, "{isa:?} {dtype} {d:?} {ranges:?}: wrote past the output");
                        })
                    });
                }
            }
        }
    }
}

/// The small-K register tiles' activations on −0 and NaN sums, bit for bit
/// `Activation::apply_f32` (ReLU makes −0 +0, ReLU6 and none keep it; NaN stays NaN), both
/// layouts, in the AVX2 and AVX-512 tiles: their sums start at the bias, so a bias of −0 and
/// zero weights over negative inputs sum to −0, and a NaN input pixel to NaN. (`gemm`, the
/// portable path, adds its product to the bias: +0 there.) Channel and pixel counts past one
/// 16-lane vector take the tiles' partial lanes.
#[test]
fn pointwise_activations_keep_signed_zeros_and_nan() {
    use super::pointwise::Pointwise;
    use crate::backend::PointwiseDesc;
    if Isa::available() == [Isa::Portable] {
        println!("SKIP pointwise_activations_keep_signed_zeros_and_nan: no register tiles (AVX2) on this CPU");
        return;
    }
    let (cin, cout, pixels) = (5, 21, 37);
    let mut x = vec![-3.0f32; cin * pixels];
    x[7] = f32::NAN;
    let w = vec![0.0f32; cout * cin];
    let bias = vec![-0.0f32; cout];
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for activation in [Activation::None, Activation::Relu, Activation::Relu6] {
            let d = PointwiseDesc { batch: 1, cin, cout, pixels, activation, layout };
            // The pixel whose input holds the NaN (element 7 of x).
            let nan_px = match layout {
                Layout::Nchw => 7,
                _ => 7 / cin,
            };
            let pw = Pointwise { d, x: &x, w: &w, bias: Some(&bias), residual: None };
            in_each_isa(|isa| {
                if isa == Isa::Portable {
                    return;
                }
                let mut o = vec![SENTINEL; cout * pixels];
                pw.run_with(&mut o, None).expect("run");
                for (i, &g) in o.iter().enumerate() {
                    let px = match layout {
                        Layout::Nchw => i % pixels,
                        _ => i / cout,
                    };
                    let want = activation.apply_f32(if px == nan_px { f32::NAN } else { -0.0 });
                    let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                    assert!(same, "{isa:?} {layout:?} {activation:?}: output {i} is {g:?}, expected {want:?}");
                }
            });
        }
    }
}

/// MobileNetV2-like layers big enough to split across threads, both layouts, f16 outputs
/// through the row buffers.
#[test]
fn depthwise_parallel_is_exact() {
    let mut seed = 5000;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        // Two images, and MobileNetV2's 7² and 28² stride-2 layers at one (split by channel
        // blocks in NHWC).
        for &(n, c, s, stride) in
            &[(2, 32, 40, 1), (2, 96, 41, 2), (2, 200, 9, 1), (2, 8, 130, 1), (1, 960, 7, 1), (1, 144, 28, 2)]
        {
            let d = Conv2dDesc::mobilenet_v2_block(n, c, s, stride, layout);
            check_conv(&d, seed);
            seed += 1;
        }
    }
}

/// The activation op through the storage types: every length 0…40 and a few large ones
/// (parallel), with and without a bias whose period does not divide the chunk sizes, in place
/// and not; ReLU forms exactly, GELU forms within the promised bound.
#[test]
fn activation_op_in_every_dtype() {
    use super::CpuData;
    use super::activation::Act;
    let lens: Vec<usize> = (0..40).chain([4097, 70_001, 200_003]).collect();
    for &len in &lens {
        for act in Activation::ALL {
            for bias_len in [None, Some(1), Some(7), Some(769)] {
                if bias_len.is_some_and(|b| len % b != 0) {
                    continue;
                }
                let mut rng = Rng(len as u64 * 31 + act.code() as u64);
                let x: Vec<f32> = rng.ints(len, 40).iter().map(|v| v / 4.0).collect();
                let b: Vec<f32> = bias_len.map_or(Vec::new(), |bl| rng.ints(bl, 8).iter().map(|v| v / 8.0).collect());
                let desc = ActivationDesc::new(len, bias_len, act);
                let a = Act { desc, bias: bias_len.map(|_| &b[..]) };
                each_dtype(|dtype, round| {
                    let xr = round(&x);
                    let want: Vec<f32> = xr
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| {
                            let pre = v + bias_len.map_or(0.0, |bl| round(&[b[i % bl]])[0]);
                            round(&[act.apply_f32(pre)])[0]
                        })
                        .collect();
                    let (got, got_in_place) = match dtype {
                        DType::F32 => {
                            let data = CpuData::F32(xr.clone().into());
                            let mut o = vec![0.0f32; len];
                            a.run(Some(&data), &mut o).expect("run");
                            let mut ip = xr.clone();
                            a.run::<f32>(None, &mut ip).expect("run");
                            (o, ip)
                        }
                        DType::F16 => {
                            let data = CpuData::F16(store(&xr, f16::ZERO).into());
                            let mut o = vec![f16::ZERO; len];
                            a.run(Some(&data), &mut o).expect("run");
                            let mut ip = store(&xr, f16::ZERO);
                            a.run::<f16>(None, &mut ip).expect("run");
                            (load(&o), load(&ip))
                        }
                        DType::Bf16 => {
                            let data = CpuData::Bf16(store(&xr, bf16::ZERO).into());
                            let mut o = vec![bf16::ZERO; len];
                            a.run(Some(&data), &mut o).expect("run");
                            let mut ip = store(&xr, bf16::ZERO);
                            a.run::<bf16>(None, &mut ip).expect("run");
                            (load(&o), load(&ip))
                        }
                        other => unimplemented!("{other:?}"),
                    };
                    for i in 0..len {
                        for (what, g) in [("out", got[i]), ("in place", got_in_place[i])] {
                            let ok = if !act.is_exact() {
                                // One f32 result within 1e-6 of apply_f32's, then one rounding.
                                let tol = 1e-6 + want[i].abs() * dtype_eps(dtype);
                                (g - want[i]).abs() <= tol
                            } else {
                                g == want[i]
                            };
                            assert!(ok, "{dtype} {act} len {len} bias {bias_len:?} {what} [{i}]: {g} vs {}", want[i]);
                        }
                    }
                });
            }
        }
    }
}

/// Which images [`Split::Auto`](super::block::Split) splits by channels: MobileNetV2's 7 × 7
/// blocks in both layouts, its 14 × 14 → 7 × 7 stride-2 block in NCHW only (the output's
/// pixels), the 14 × 14 blocks in neither; on one thread the same rule at 64 pixels.
#[test]
fn inverted_residual_channel_split_rule() {
    use super::block::channel_split;
    use tilekit_kernels::InvertedResidualDesc;
    // (C, H·W, hidden, C', stride, threads, NCHW, NHWC)
    let cases = [
        (160, 7, 960, 160, 1, 2, Some(2), Some(2)),
        (96, 14, 576, 160, 2, 2, Some(2), None),
        (96, 14, 576, 96, 1, 2, None, None),
        (64, 28, 384, 96, 2, 2, None, None),
        (96, 14, 576, 160, 2, 1, Some(1), None),
        (160, 7, 960, 320, 1, 1, Some(1), Some(1)),
        (64, 28, 384, 96, 2, 4, Some(4), None),
    ];
    for (c, hw, hidden, co, stride, threads, nchw, nhwc) in cases {
        for (layout, want) in [(Layout::Nchw, nchw), (Layout::Nhwc, nhwc)] {
            let d = InvertedResidualDesc::new(layout, [1, c, hw, hw], co).hidden(hidden).stride(stride);
            assert_eq!(
                channel_split(&d, threads),
                want,
                "{c} → {hidden} → {co} at {hw}², stride {stride}, {threads} threads, {layout:?}"
            );
        }
    }
}

/// The fused inverted-residual block, bit for bit the reference on integer data, through its
/// three paths (images expanded whole, bands that expand their own rows chunk by chunk of
/// hidden channels, and images split by channels into 1–3 ranges), in every instruction set:
/// both layouts, strides 1 and 2, with and without expand and residual, hidden widths around
/// the 16-channel blocks, rows of 1–300 pixels, several chunks per band (down to the least
/// chunk on the widest rows), images of several bands, batches, every output dtype.
#[test]
fn inverted_residual_bands_and_whole_images_are_exact() {
    use super::block::{Block, E_BUDGET, FORCED_BUDGET, Split, Transposed, budget_for};
    use tilekit_kernels::InvertedResidualDesc;
    use tilekit_kernels::block::reference as block_reference;
    // (N, C, H, W, hidden or 0 for no expand, C', stride)
    let cases = [
        (1, 3, 5, 7, 18, 3, 1),
        (2, 5, 4, 3, 30, 7, 2),
        (1, 4, 6, 5, 0, 4, 1),
        (1, 8, 1, 1, 48, 5, 1),
        (1, 7, 9, 2, 42, 7, 2),
        (1, 3, 13, 67, 40, 3, 1),
        (1, 16, 40, 9, 32, 16, 1),
        (2, 6, 35, 21, 17, 6, 2),
        (1, 24, 3, 1, 0, 24, 1),
        (2, 12, 9, 30, 0, 12, 1),
        (1, 9, 20, 13, 0, 5, 2),
        (1, 4, 10, 67, 100, 5, 1),
        (1, 3, 11, 70, 130, 4, 2),
        // Rows so wide that the chunk budget holds fewer than `MIN_CHUNK` channels: chunks of
        // 32, then one of 16 with 4 or 8 real channels.
        (1, 5, 6, 260, 36, 5, 1),
        (1, 3, 9, 300, 40, 3, 2),
        // More input channels than the small-K expansion takes (gemm, then bias and ReLU6).
        (1, 70, 6, 5, 24, 70, 1),
        (1, 66, 4, 9, 20, 8, 2),
    ];
    let mut rng = Rng(0xb10c);
    for (case, &(batch, c, h, w, hidden, co, stride)) in cases.iter().enumerate() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let d = InvertedResidualDesc::new(layout, [batch, c, h, w], co)
                .hidden(if hidden == 0 { c } else { hidden })
                .stride(stride)
                .expand(hidden != 0)
                .expand_bias(hidden != 0 && case % 2 == 0)
                .dw_bias(case % 3 != 1)
                .project_bias(case % 2 == 1);
            let lens = d.checked_lens().expect("lengths");
            let x = rng.ints(lens.input, 1);
            let we = rng.ints(lens.expand_weight, 1);
            let be = rng.ints(d.hidden, 2);
            let wd = rng.ints(lens.dw_weight, 1);
            let bd = rng.ints(d.hidden, 2);
            let wp = rng.ints(lens.project_weight, 1);
            let bp = rng.ints(co, 2);
            let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let mut want = vec![0.0f64; lens.output];
            let (xf, wef, bef, wdf, bdf, wpf, bpf) = (f(&x), f(&we), f(&be), f(&wd), f(&bd), f(&wp), f(&bp));
            block_reference(
                &d,
                &xf,
                d.expand.then_some((&wef[..], d.expand_bias.then_some(&bef[..]))),
                (&wdf, d.dw_bias.then_some(&bdf[..])),
                (&wpf, d.project_bias.then_some(&bpf[..])),
                &mut want,
            );
            // The 1 × 1 weights transposed, as `Device::pack_block_weights` stores them.
            let (hid, cin) = (d.hidden, c);
            let mut wet = vec![0.0f32; we.len()];
            for (i, &v) in we.iter().enumerate() {
                wet[(i % cin) * hid + i / cin] = v;
            }
            let mut wpt = vec![0.0f32; wp.len()];
            for (i, &v) in wp.iter().enumerate() {
                wpt[(i % hid) * co + i / hid] = v;
            }
            let transposed = Transposed { expand: d.expand.then_some(&wet[..]), project: &wpt };
            let block = Block {
                d,
                x: &x,
                expand: d.expand.then_some((&we[..], d.expand_bias.then_some(&be[..]))),
                dw: (&wd, d.dw_bias.then_some(&bd[..])),
                project: (&wp, d.project_bias.then_some(&bp[..])),
                transposed: None,
            };
            let packed = Block { transposed: Some(transposed), ..block };
            // Bands (`whole_max` 0) under three chunk budgets: the least chunk always (0), the
            // budget where the L2 is unknown, and the largest (every case's hidden channels in
            // one chunk); then this CPU's budget (`None`) on every path.
            let paths = [
                (0, Split::Never, Some(0)),
                (0, Split::Never, Some(E_BUDGET)),
                (0, Split::Never, Some(budget_for(Some(usize::MAX)))),
                (0, Split::Never, None),
                (usize::MAX, Split::Never, None),
                (usize::MAX, Split::Tasks(1), None),
                (usize::MAX, Split::Tasks(2), None),
                (usize::MAX, Split::Tasks(3), None),
                (usize::MAX, Split::Auto, None),
            ];
            in_each_isa(|isa| {
                for ((whole_max, split, budget), (block, t)) in
                    paths.into_iter().flat_map(|p| [(p, (&block, "")), (p, (&packed, " transposed"))])
                {
                    FORCED_BUDGET.set(budget);
                    let what =
                        format!("case {case} {layout:?} {isa:?} whole_max {whole_max} {split:?} budget {budget:?}{t}");
                    let mut o32 = vec![SENTINEL; lens.output + 16];
                    block.run_with(&mut o32, whole_max, split).expect("f32");
                    assert!(
                        o32[lens.output..].iter().all(|v| v.to_bits() == SENTINEL.to_bits()),
                        "{what}: guard words"
                    );
                    let mut o16 = vec![f16::ZERO; lens.output];
                    block.run_with(&mut o16, whole_max, split).expect("f16");
                    let mut ob16 = vec![bf16::ZERO; lens.output];
                    block.run_with(&mut ob16, whole_max, split).expect("bf16");
                    for (i, &r) in want.iter().enumerate() {
                        assert_eq!(o32[i] as f64, r, "{what} f32 [{i}]");
                        assert_eq!(o16[i].to_f64(), f16::from_f64(r).to_f64(), "{what} f16 [{i}]");
                        assert_eq!(ob16[i].to_f64(), bf16::from_f64(r).to_f64(), "{what} bf16 [{i}]");
                    }
                    FORCED_BUDGET.set(None);
                }
            });
        }
    }
}

/// The bands' chunk budget and widths: a quarter of the L2 (clamped), 128 KiB where it is
/// unknown; MobileNetV2's blocks 2–4 at 224² in one chunk or in chunks of 32 as measured.
#[test]
fn inverted_residual_chunk_budget() {
    use super::block::{E_BUDGET, budget_for, chunk_channels};
    let kib = |n: usize| n * 1024;
    assert_eq!(budget_for(None), E_BUDGET);
    assert_eq!(budget_for(Some(kib(512))), kib(128) / 4);
    assert_eq!(budget_for(Some(kib(2048))), kib(512) / 4);
    assert_eq!(budget_for(Some(kib(128))), kib(64) / 4);
    assert_eq!(budget_for(Some(kib(32 * 1024))), kib(1024) / 4);
    // (budget's L2 in KiB, expanded rows of a band, width, padded hidden, channels a chunk)
    let cases = [
        // Block 3 (24 → 144 → 24, 56²: bands of 14 rows, 16 expanded) and block 4 (→ 32,
        // stride 2: bands of 7 rows, 15 expanded): all 144 channels with 2 MiB, 32 with 512 KiB.
        (2048, 16, 56, 144, 144),
        (2048, 15, 56, 144, 144),
        (512, 16, 56, 144, 32),
        (512, 15, 56, 144, 32),
        // Block 2 (16 → 96 → 24, 112², stride 2: 29 expanded rows): 32 either way.
        (2048, 29, 112, 96, 32),
        (512, 29, 112, 96, 32),
        // Wider chunks where the budget holds them, a multiple of 16.
        (2048, 6, 260, 48, 48),
        (512, 6, 260, 48, 32),
        (2048, 9, 300, 64, 48),
    ];
    for (l2, erows, w, hp, want) in cases {
        let got = chunk_channels(budget_for(Some(kib(l2))), erows, w, hp);
        assert_eq!(got, want, "L2 {l2} KiB, {erows} rows of {w}, {hp} hidden");
    }
}

fn dtype_eps(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 4.0 * f32::EPSILON,
        DType::F16 => 2.0 * 0.000_977,
        DType::Bf16 => 2.0 * 0.007_81,
        other => unimplemented!("{other:?}"),
    }
}

/// The dense convolution's kernel (`dense_conv.rs`: NCHW the gathered patches through the
/// small-K plane tiles, NHWC the direct strips) in every instruction set that takes it (AVX2
/// and AVX-512; the portable copy is not taken, `Device::conv2d` composes im2col and the
/// pointwise kernel there), bit for bit against the f64 reference on integer data, with
/// guard words on both sides of the output, in every storage type. The grid reaches
/// reductions of 1 to 32, output channels that fill no tile, part of one and several (the
/// NHWC strips' 16 and 32 lanes), rows shorter than a strip and than a vector, left and right
/// edges at every padding, strides to 3, dilation 2, several images and row blocks, NHWC
/// sums stored through the row buffer and straight into the output.
#[test]
fn dense_conv_is_exact_in_every_isa() {
    use super::dense_conv::{DenseConv, takes};
    use crate::backend::DenseConvDesc;
    let mut seed = 9400;
    let mut ran = 0;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for &([n, c, h, w], [kh, kw], [sh, sw], [dh, dw], pads, cout, act) in &[
            ([1, 3, 224, 224], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], 32, Activation::Relu6),
            ([2, 3, 9, 11], [3, 3], [1, 2], [2, 1], [0, 3, 2, 0], 17, Activation::None),
            ([1, 1, 5, 4], [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 1, Activation::Relu),
            ([1, 2, 13, 12], [4, 4], [3, 1], [1, 2], [4, 0, 1, 5], 33, Activation::Relu6),
            ([2, 4, 7, 30], [2, 3], [1, 1], [1, 1], [1, 1, 1, 1], 48, Activation::None),
            ([1, 3, 40, 37], [3, 3], [1, 3], [1, 1], [2, 1, 0, 2], 70, Activation::Relu),
            ([3, 1, 3, 2], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 5, Activation::Relu6),
            ([1, 32, 6, 9], [1, 1], [1, 1], [1, 1], [0, 0, 0, 0], 16, Activation::None),
            // NHWC strips straight into the output (Cout a whole number of 32- and 16-lane
            // strips) with ReLU in registers.
            ([2, 3, 10, 23], [3, 3], [2, 1], [1, 1], [1, 2, 1, 0], 64, Activation::Relu),
        ] {
            let d =
                conv_geometry(layout, [n, c, h, w], [kh, kw], [sh, sw], [dh, dw], pads).has_bias(true).activation(act);
            let dd = DenseConvDesc { conv: d, cout };
            let (oh, ow) = (d.out_h().expect("rows"), d.out_w().expect("columns"));
            let k = c * kh * kw;
            let total = n * cout * oh * ow;
            let mut rng = Rng(seed);
            seed += 1;
            let x = rng.ints(n * c * h * w, 8);
            let wt = rng.ints(cout * k, 8);
            let bias = rng.ints(cout, 50);
            // The reference: the convolution in f64, bias, activation.
            let f64s = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            let mut want = vec![0.0; total];
            tilekit_kernels::reference::dense_conv2d(&d, cout, &f64s(&x), &f64s(&wt), Some(&f64s(&bias)), &mut want);
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            let conv = DenseConv { d: dd, x: &x, w: &wt, bias: Some(&bias) };
            in_each_isa(|isa| {
                if !takes(&dd) {
                    assert!(isa == Isa::Portable || k > 32, "{isa:?} {d:?}: not taken");
                    return;
                }
                ran += 1;
                let g = 16;
                each_dtype(|dtype, round| {
                    let want = round(&want);
                    let got = match dtype {
                        DType::F32 => {
                            let mut o = vec![SENTINEL; total + 2 * g];
                            conv.run(&mut o[g..g + total]).expect("conv2d");
                            o
                        }
                        DType::F16 => {
                            let mut o = vec![f16::from_f32(SENTINEL); total + 2 * g];
                            conv.run(&mut o[g..g + total]).expect("conv2d");
                            load(&o)
                        }
                        DType::Bf16 => {
                            let mut o = vec![bf16::from_f32(SENTINEL); total + 2 * g];
                            conv.run(&mut o[g..g + total]).expect("conv2d");
                            load(&o)
                        }
                        other => unimplemented!("{other:?}"),
                    };
                    for (i, (&gv, &e)) in got[g..g + total].iter().zip(&want).enumerate() {
                        assert!(gv == e, "{isa:?} {dtype} {d:?} cout {cout}: output {i} is {gv}, expected {e}");
                    }
                    assert!(
                        got[..g].iter().chain(&got[g + total..]).all(|&v| v == SENTINEL),
                        "{isa:?} {dtype} {d:?}: wrote outside the output"
                    );
                });
            });
        }
    }
    if ran == 0 {
        eprintln!("SKIP dense_conv_is_exact_in_every_isa: this CPU has no AVX2 and FMA, so no call takes the kernel");
    }
}
