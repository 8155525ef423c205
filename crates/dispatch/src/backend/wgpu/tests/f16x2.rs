//! The f16-compute matmul (`Precision::F16`, `matmul_f16x2.wgsl`) against the reference under
//! its own bound (`tolerance::matmul_bound`): edge shapes, transposes, batches and strided views,
//! the epilogue with every activation, exact integer cases, the chunked f16 sums shown to be f16,
//! subnormal products, the overflow guard, non-finite inputs, and which kernel runs where.

use super::*;
use std::sync::{Mutex, MutexGuard, OnceLock};
use tilekit_kernels::tolerance;

/// This module's own native-f16 device, held for the whole test, or a visible skip where the
/// adapter has no `SHADER_F16`. The tests read back which kernels a profile recorded, and a
/// profile records every launch on its device: on the shared test device, launches of tests
/// running in parallel landed in it. A device of its own, used by one test at a time, records
/// only the test's launches.
fn f16_device(what: &str) -> Option<(&'static Device, MutexGuard<'static, ()>)> {
    static DEV: OnceLock<Option<Device>> = OnceLock::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    let dev = DEV
        .get_or_init(|| match Device::wgpu(&options(false)) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("SKIP {what}: no wgpu adapter ({e})");
                None
            }
        })
        .as_ref()?;
    if !backend(dev).native_f16 {
        eprintln!("SKIP {what}: the adapter has no SHADER_F16");
        return None;
    }
    // A test that panicked while holding the lock leaves nothing behind that the next needs.
    Some((dev, SERIAL.lock().unwrap_or_else(|e| e.into_inner())))
}

/// This module's own packed-f16 device (`force_packed_f16`), used only under `f16_device`'s
/// lock: the shared packed test device (`device(true)`) runs other tests' launches (GEMV among
/// them), which a profile on it records too (seen on an H200, where they overlapped).
fn packed_device() -> Option<&'static Device> {
    static DEV: OnceLock<Option<Device>> = OnceLock::new();
    DEV.get_or_init(|| Device::wgpu(&options(true)).ok()).as_ref()
}

/// The kernel names of the launches `f` records.
fn kernels_run(dev: &Device, f: impl FnOnce()) -> Vec<String> {
    let ((), p) = dev
        .profile(|| -> crate::Result<()> {
            f();
            Ok(())
        })
        .unwrap();
    p.records.iter().map(|r| r.kernel.clone()).collect()
}

/// Runs `desc` on f16 tensors holding `a`, `b`, `bias`, `c` (rounded to f16) with guard values
/// around the output view, checks the kernel that ran, every output against the reference under
/// `matmul_bound` (or bit for bit with `exact`) and the guards. Returns the outputs.
#[allow(clippy::too_many_arguments)]
fn check(
    dev: &Device,
    d: &MatmulDesc,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: Option<&[f32]>,
    exact: bool,
    want_kernel: &str,
) -> Vec<f32> {
    let o_len = d.out.required_len(d.batch, d.m, d.n).unwrap() + 5;
    let up = |v: &[f32]| upload(dev, DType::F16, v);
    let (at, bt) = (up(a), up(b));
    let biast = bias.map(up);
    let ct = c.map(up);
    let out = up(&vec![7.0; o_len]);
    let ran = kernels_run(dev, || dev.matmul_into(d, &at, &bt, biast.as_ref(), ct.as_ref(), &out).unwrap());
    assert!(
        !ran.is_empty() && ran.iter().all(|k| k.starts_with(want_kernel)),
        "{d:?}: ran {ran:?}, want {want_kernel}"
    );
    let got = out.to_f32_vec().unwrap();

    let (aw, bw) = (widen(&at), widen(&bt));
    let biasw = biast.as_ref().map(widen);
    let cw = ct.as_ref().map(widen);
    let mut plain = *d;
    plain.activation = Activation::None;
    let mut pre = vec![7.0f64; o_len];
    reference::matmul(&plain, &aw, &bw, biasw.as_deref(), cw.as_deref(), &mut pre);
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut mag = vec![0.0f64; o_len];
    let dm = plain.alpha(d.alpha.abs()).beta(d.beta.abs());
    reference::matmul(
        &dm,
        &abs(&aw),
        &abs(&bw),
        biasw.as_deref().map(abs).as_deref(),
        cw.as_deref().map(abs).as_deref(),
        &mut mag,
    );
    let mut in_view = vec![false; o_len];
    for bt in 0..d.batch {
        for i in 0..d.m {
            for j in 0..d.n {
                in_view[d.out.index(bt, i, j)] = true;
            }
        }
    }
    for (i, &g) in got.iter().enumerate() {
        if !in_view[i] {
            assert_eq!(g, 7.0, "{d:?}: guard {i} changed");
            continue;
        }
        let r = d.activation.apply_f64(pre[i]);
        if exact {
            let want = DType::F16.round_f32(r as f32);
            assert!(g == want || (g.is_nan() && want.is_nan()), "{d:?}[{i}]: got {g}, want exactly {want}");
        } else {
            let bound = tolerance::matmul_bound(d, DType::F16, mag[i], pre[i], r);
            assert!(tolerance::accepts(DType::F16, g, r, bound), "{d:?}[{i}]: got {g}, want {r} (bound {bound})");
        }
    }
    got
}

fn inputs(d: &MatmulDesc, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (ar, ac) = d.a_stored();
    let (br, bc) = d.b_stored();
    let a_len = d.a.required_len(d.batch, ar, ac).unwrap() + 3;
    let b_len = d.b.required_len(d.batch, br, bc).unwrap() + 1;
    (values(a_len, seed), values(b_len, seed + 1))
}

fn f16_case(batch: usize, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulDesc {
    dense_case(batch, m, n, k, ta, tb).desc.precision(Precision::F16)
}

const KERNEL: &str = "matmul_f16x2_f16";

#[test]
fn f16x2_edge_shapes_transposes_and_batches() {
    let Some((dev, _serial)) = f16_device("f16x2 edge shapes") else { return };
    // M > 16 (the kernel's range): primes, tile edges (128, 129), N and K of 1, K of 0, K
    // around the chunk (7, 8, 9) and the slab.
    let shapes = [
        (17, 1, 1),
        (17, 3, 0),
        (31, 13, 7),
        (37, 5, 8),
        (64, 64, 9),
        (129, 67, 33),
        (128, 128, 16),
        (23, 130, 100),
        (200, 7, 257),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let batch = if i % 3 == 0 { 3 } else { 1 };
            let d = f16_case(batch, m, n, k, ta, tb);
            let (a, b) = inputs(&d, 5000 + i as u64 * 10);
            check(dev, &d, &a, &b, None, None, false, KERNEL);
        }
    }
}

#[test]
fn f16x2_epilogue_every_activation_and_strided_views() {
    let Some((dev, _serial)) = f16_device("f16x2 epilogue") else { return };
    for (i, act) in Activation::ALL.into_iter().enumerate() {
        let (m, n, k, batch) = (19, 11, 21, 2);
        let mut d = MatmulDesc::new(m, n, k).batch(batch).precision(Precision::F16);
        // A with an odd offset and a padded leading dimension (scalar loads); B broadcast.
        d.a = MatrixView::new(3, k + 2, m * (k + 2) + 1);
        d.b = MatrixView::new(0, n, 0);
        d.c = Some(MatrixView::new(1, n + 1, m * (n + 1)));
        d.out = MatrixView::new(2, n + 3, m * (n + 3) + 4);
        d.bias_offset = Some(1);
        d.alpha = 1.5;
        d.beta = -0.75;
        d.activation = act;
        d.trans_b = i % 2 == 1;
        if d.trans_b {
            d.b = MatrixView::new(0, k, 0);
        }
        let (a, b) = inputs(&d, 6000 + i as u64);
        let bias = values(n + 3, 6100 + i as u64);
        let c = values(d.c.unwrap().required_len(batch, m, n).unwrap() + 2, 6200 + i as u64);
        check(dev, &d, &a, &b, Some(&bias), Some(&c), false, KERNEL);
    }
    // Aligned views (vec4 loads and stores) with a bias at offset 4 and K = 0 (the epilogue of
    // zeros).
    for k in [0, 36] {
        let mut d = MatmulDesc::new(20, 24, k).batch(2).precision(Precision::F16);
        d.a = MatrixView::new(4, 40, 800);
        d.b = MatrixView::new(8, 28, 40 * 28);
        d.out = MatrixView::new(4, 24, 480);
        d.bias_offset = Some(4);
        d.activation = Activation::Relu;
        let (a, b) = inputs(&d, 6300 + k as u64);
        let bias = values(32, 6400);
        check(dev, &d, &a, &b, Some(&bias), None, false, KERNEL);
    }
}

/// Small integers: every product and partial sum is exact in f16 (|a|, |b| <= 2, so a chunk
/// of 8 sums to at most 32 and a K of 300 to at most 1200 < 2048), so the results must be exact.
#[test]
fn f16x2_integer_inputs_are_exact() {
    let Some((dev, _serial)) = f16_device("f16x2 integers") else { return };
    let ints = |n: usize, seed: u64| -> Vec<f32> { values(n, seed).iter().map(|v| (v * 2.4).round()).collect() };
    for (i, &(m, n, k, ta, tb)) in
        [(17, 9, 16, false, false), (20, 7, 13, true, false), (133, 70, 300, false, true), (29, 5, 11, true, true)]
            .iter()
            .enumerate()
    {
        let mut d = f16_case(2, m, n, k, ta, tb);
        d.c = Some(MatrixView::dense(m, n));
        d.bias_offset = Some(0);
        d.activation = Activation::Relu;
        let (ar, ac) = d.a_stored();
        let (br, bc) = d.b_stored();
        let seed = 7000 + i as u64;
        let (a, b) = (ints(2 * ar * ac, seed), ints(2 * br * bc, seed + 1));
        let (bias, c) = (ints(n, seed + 2), ints(2 * m * n, seed + 3));
        check(dev, &d, &a, &b, Some(&bias), Some(&c), true, KERNEL);
    }
}

/// The partial sums really are f16, of 8 products each: 2048 + 1 rounds back to 2048 in f16
/// (ties to even), so a row `[2048, 1, 1, ...]` times ones loses the ones of its first chunk of
/// 8 and keeps those of the next chunk (8, exact). The f32 kernel gives 2063, stored as 2064.
#[test]
fn f16x2_sums_eight_products_in_f16() {
    let Some((dev, _serial)) = f16_device("f16x2 chunks") else { return };
    let (m, n, k) = (17, 4, 16);
    let mut a = vec![1.0f32; m * k];
    for r in 0..m {
        a[r * k] = 2048.0;
    }
    let b = vec![1.0f32; k * n];
    let d = f16_case(1, m, n, k, false, false);
    let got = check(dev, &d, &a, &b, None, None, false, KERNEL);
    assert!(got[..m * n].iter().all(|&v| v == 2056.0), "{:?}", &got[..8]);
    let hi = d.precision(Precision::Highest);
    let got = check(dev, &hi, &a, &b, None, None, false, "matmul_f16");
    assert!(got[..m * n].iter().all(|&v| v == 2064.0), "{:?}", &got[..8]);
}

/// Products in f16's subnormal range are kept (the bound assumes it): 2⁻¹⁰ · 2⁻¹⁰ = 2⁻²⁰, and 8
/// of them sum to 2⁻¹⁷, both subnormal in f16; alpha 2¹⁰ brings the result to 2⁻⁷, exactly.
#[test]
fn f16x2_keeps_subnormal_products() {
    let Some((dev, _serial)) = f16_device("f16x2 subnormals") else { return };
    let (m, n, k) = (18, 5, 8);
    let a = vec![2f32.powi(-10); m * k];
    let b = vec![2f32.powi(-10); k * n];
    let d = f16_case(1, m, n, k, false, false).alpha(1024.0);
    let got = check(dev, &d, &a, &b, None, None, true, KERNEL);
    assert!(got[..m * n].iter().all(|&v| v == 2f32.powi(-7)), "{:?}", &got[..8]);
}

/// f16 overflow never shows: products above 65504 (300 · 300), partial sums above it (two
/// products of 51200) and +Inf meeting −Inf in one partial (300·300 − 300·300) are recomputed
/// in f32, and the results are the f32 path's (alpha brings them back into f16's range).
#[test]
fn f16x2_overflowing_sums_are_recomputed_in_f32() {
    let Some((dev, _serial)) = f16_device("f16x2 overflow") else { return };
    let (m, n, k) = (20, 6, 3);
    for (i, (av, bv, alpha)) in [(300.0f32, 300.0f32, 1.0 / 16.0), (256.0, 200.0, 1.0 / 8.0)].into_iter().enumerate() {
        let mut a = values(m * k, 8000 + i as u64);
        let mut b = values(k * n, 8100 + i as u64);
        // Row 0 and 5 and column 2 and 3 meet the large values; the other outputs stay small.
        for r in [0, 5] {
            for p in 0..k {
                a[r * k + p] = av;
            }
        }
        for p in 0..k {
            b[p * n + 2] = bv;
            b[p * n + 3] = if p % 2 == 0 { bv } else { -bv };
        }
        let d = f16_case(1, m, n, k, false, false).alpha(alpha);
        let got = check(dev, &d, &a, &b, None, None, false, KERNEL);
        let want = f64::from(alpha) * f64::from(av) * f64::from(bv);
        assert_eq!(f64::from(got[2]), DType::F16.round_f32((3.0 * want) as f32) as f64);
        assert_eq!(f64::from(got[5 * n + 3]), DType::F16.round_f32(want as f32) as f64);
        assert!(got.iter().all(|v| v.is_finite()), "{got:?}");
    }
}

/// Inf and NaN inputs give what the f32 path gives (the recomputation reads them as stored).
#[test]
fn f16x2_non_finite_inputs_match_the_reference() {
    let Some((dev, _serial)) = f16_device("f16x2 non-finite") else { return };
    let (m, n, k) = (24, 8, 12);
    let mut a = values(m * k, 8200);
    let b = values(k * n, 8201);
    a[3 * k + 4] = f32::INFINITY;
    a[7 * k] = f32::NAN;
    a[9 * k + 11] = f32::NEG_INFINITY;
    let d = f16_case(1, m, n, k, false, false);
    let got = check(dev, &d, &a, &b, None, None, false, KERNEL);
    assert!(got[3 * n..4 * n].iter().all(|v| v.is_infinite() || v.is_nan()), "{:?}", &got[3 * n..4 * n]);
    assert!(got[7 * n..8 * n].iter().all(|v| v.is_nan()));
}

/// Which kernel runs: the f16 kernel only for Precision::F16 on native f16 storage above 16
/// rows; up to 16 rows the GEMV kernel; on packed f16 (no SHADER_F16) the f32 tiled kernel, all
/// inside the F16 bound; other storage is refused with a typed error.
#[test]
fn f16x2_is_chosen_only_where_it_applies() {
    let Some((dev, _serial)) = f16_device("f16x2 selection") else { return };
    let gemv = if backend(dev).subgroups { "gemv_subgroup_f16" } else { "gemv_f16" };
    for m in [1, 16] {
        let d = f16_case(1, m, 9, 20, false, true);
        let (a, b) = inputs(&d, 9000 + m as u64);
        check(dev, &d, &a, &b, None, None, false, gemv);
    }
    let d = f16_case(1, 40, 9, 20, false, false).precision(Precision::Highest);
    let (a, b) = inputs(&d, 9100);
    check(dev, &d, &a, &b, None, None, false, "matmul_f16 ");
    if let Some(packed) = packed_device() {
        let d = f16_case(1, 40, 9, 20, true, false);
        let (a, b) = inputs(&d, 9200);
        check(packed, &d, &a, &b, None, None, false, "matmul_f16_packed");
    }
    for dtype in [DType::F32, DType::Bf16] {
        let x = dev.zeros(&[40 * 20], dtype).unwrap();
        let out = dev.zeros(&[40 * 40], dtype).unwrap();
        let d = f16_case(1, 40, 40, 20, false, true);
        let e = dev.matmul_into(&d, &x, &x, None, None, &out).unwrap_err();
        assert!(matches!(e, crate::Error::InvalidParameter { param: "precision", .. }), "{e}");
    }
}
