//! `check`: every CUDA op, dtype and kernel variant against the native CPU backend.

use crate::data::{ints, reals, upload};
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::time::Instant;
use tilekit::kernels::tolerance;
use tilekit::{Activation, Conv2dOptions, DType, Device, Layout, MatmulDesc, MatmulOptions, MatrixView, Precision};

/// How far a CUDA result may be from the CPU backend's.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// Equal as values (NaN matches NaN): an op that only moves data.
    Exact,
    /// The tolerance model (`tilekit_kernels::tolerance`) for outputs whose pre-activation
    /// terms sum to at most `magnitude` in absolute value, `k` the reduction length. With
    /// integer inputs every partial sum is exact in f32 and `k` is 0: what is left is the
    /// epilogue, the activation formula and the one rounding to the storage dtype.
    Model { activation: Activation, k: usize, magnitude: f64 },
}

impl Rule {
    /// Integer inputs (exact sums) whose pre-activation values are at most `magnitude`.
    pub fn exact_sums(activation: Activation, magnitude: f64) -> Rule {
        Rule::Model { activation, k: 0, magnitude }
    }

    /// The largest allowed `|got − want|` where `want` is another implementation's result
    /// stored in `want_dtype` and `got` is stored in `dtype`: each is within its bound of the
    /// exact value, so they differ by at most the sum. `want` stands in for the exact value,
    /// moved outwards by its own bound (every term grows with the magnitude).
    pub fn tolerance(self, dtype: DType, want_dtype: DType, want: f64) -> f64 {
        match self {
            Rule::Exact => 0.0,
            Rule::Model { activation, k, magnitude } => {
                let b = |dt: DType, r: f64| tolerance::bound_from_magnitude(dt, activation, k, magnitude, r);
                let r = want.abs() + b(want_dtype, want.abs());
                b(dtype, r) + b(want_dtype, r)
            }
        }
    }
}

/// The largest `|got − want| / tolerance` (≤ 1 passes; NaN matching NaN) and the largest
/// `|got − want|`.
pub fn compare(got: &[f32], want: &[f32], dtype: DType, want_dtype: DType, rule: Rule) -> (f64, f64) {
    let mut worst = 0.0f64;
    let mut max_abs = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        if g.is_nan() && w.is_nan() {
            continue;
        }
        let d = (f64::from(g) - f64::from(w)).abs();
        let ratio = if d == 0.0 {
            0.0
        } else if d.is_nan() {
            f64::INFINITY
        } else {
            d / rule.tolerance(dtype, want_dtype, f64::from(w))
        };
        worst = worst.max(ratio);
        max_abs = max_abs.max(d);
    }
    if got.len() != want.len() {
        worst = f64::INFINITY;
    }
    (worst, max_abs)
}

pub struct Checker {
    pub(crate) cpu: Device,
    passed: usize,
    failed: Vec<String>,
}

impl Checker {
    pub(crate) fn record(
        &mut self,
        name: String,
        got: Result<Vec<f32>>,
        want: Result<Vec<f32>>,
        dtype: DType,
        rule: Rule,
    ) {
        match (got, want) {
            (Ok(g), Ok(w)) => {
                let (worst, max_abs) = compare(&g, &w, dtype, dtype, rule);
                if worst <= 1.0 {
                    self.passed += 1;
                } else {
                    println!("FAIL {name}: max |diff| {max_abs:.3e} ({worst:.1}× the tolerance)");
                    self.failed.push(name);
                }
            }
            (Err(e), Ok(_)) => {
                println!("FAIL {name}: CUDA error: {e:#}");
                self.failed.push(name);
            }
            (Ok(_), Err(e)) => {
                println!("FAIL {name}: the CUDA op ran but the CPU op failed: {e:#}");
                self.failed.push(name);
            }
            (Err(g), Err(w)) => {
                // Both refused: fine when they agree that the input is invalid.
                let kind = |e: &anyhow::Error| e.downcast_ref::<tilekit::Error>().map(std::mem::discriminant);
                if kind(&g).is_some() && kind(&g) == kind(&w) {
                    self.passed += 1;
                } else {
                    println!("FAIL {name}: CUDA error {g:#}, CPU error {w:#}");
                    self.failed.push(name);
                }
            }
        }
    }
}

pub fn check(gpu: &Device, json_path: Option<&str>) -> Result<()> {
    let mut ck = Checker { cpu: Device::cpu(), passed: 0, failed: Vec::new() };
    let before = crate::memory("before the checks");
    let t0 = Instant::now();
    check_matmul(gpu, &mut ck)?;
    crate::quant::check_quant(gpu, &mut ck)?;
    crate::block::check_block(gpu, &mut ck)?;
    check_conv(gpu, &mut ck)?;
    check_activation(gpu, &mut ck)?;
    check_refs(gpu, &mut ck)?;
    crate::interop::check_interop(&mut ck)?;
    let secs = t0.elapsed().as_secs_f64();
    println!("check: {} passed, {} failed ({secs:.1} s)", ck.passed, ck.failed.len());
    // The tensors of every check are dropped by now: free memory should be back where it was.
    let after = crate::memory("after the checks");
    if let Some(p) = json_path {
        let v = json!({
            "device": gpu.description(), "passed": ck.passed, "failed": ck.failed, "seconds": secs,
            "device_memory_before": before, "device_memory_after": after,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    if !ck.failed.is_empty() {
        bail!("{} CUDA checks failed", ck.failed.len());
    }
    Ok(())
}

fn check_matmul(gpu: &Device, ck: &mut Checker) -> Result<()> {
    let shapes = [
        (1, 1, 1),
        (7, 5, 3),
        (5, 6, 0),
        (63, 65, 17),
        (128, 128, 8),
        (129, 131, 33),
        (256, 128, 64),
        (1, 300, 257),
        (300, 1, 40),
        (130, 260, 96),
        (8, 70, 300),
        (9, 33, 64),
        (32, 129, 65),
        (33, 40, 20),
        // Split K on the tensor cores (`catalogue::cuda::splitk::splitk_plan`: grids under one
        // wave): 4 splits with a short last one (K not a multiple of 32, N of 4), 16 splits of
        // one block, 3 splits over 2 × 3 blocks.
        (129, 131, 1031),
        (64, 70, 4096),
        (200, 384, 777),
        // matmul_f32's 3-stage ring of 16-deep slices (`catalogue::cuda::simt`): K of 3 and 2
        // slices with a partial last one (K not a multiple of 16, nor of 4), and 9 tile rows
        // (the block swizzle's last band is one row).
        (130, 131, 47),
        (65, 260, 18),
        (1100, 140, 50),
        // The GEMV kernels (M <= 16; with B [K, N] from 5 rows, the ring): K split across
        // blocks (few columns, long K), both row-tile heights, K = 1, and N over many blocks
        // without a split.
        (16, 17, 1031),
        (4, 64, 4100),
        (13, 37, 1),
        (1, 2048, 1000),
        // The shared-memory GEMV ring (B [K, N], 4 < M <= 32): K split across blocks with a
        // partial last stage (K not a multiple of 16), N not a multiple of the 16-byte vector
        // and over several blocks, 5, 20 and 24 rows (rows past M in the tile), K under one stage.
        (24, 300, 1031),
        (5, 515, 2053),
        (20, 131, 7),
    ];
    let policies = [
        (DType::F32, Precision::Highest),
        (DType::F32, Precision::Bf16),
        (DType::F16, Precision::Highest),
        (DType::F16, Precision::Bf16),
        (DType::Bf16, Precision::Highest),
    ];
    let mut seed = 1;
    for &(m, n, k) in &shapes {
        for &(dtype, precision) in &policies {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for epi in 0..3 {
                    seed += 1;
                    let a_shape = if ta { [k, m] } else { [m, k] };
                    let b_shape = if tb { [n, k] } else { [k, n] };
                    let a = ints(m * k, seed);
                    let b = ints(k * n, seed + 1000);
                    let bias = ints(n, seed + 2000);
                    let c = ints(m * n, seed + 3000);
                    let activation = [Activation::None, Activation::Gelu, Activation::Relu][epi];
                    let run = |dev: &Device| -> Result<Vec<f32>> {
                        let at = upload(dev, &a_shape, dtype, &a)?;
                        let bt = upload(dev, &b_shape, dtype, &b)?;
                        let biast = upload(dev, &[n], dtype, &bias)?;
                        let ct = upload(dev, &[m, n], dtype, &c)?;
                        let mut opts = MatmulOptions::default().trans_a(ta).trans_b(tb).precision(precision);
                        if epi > 0 {
                            opts.alpha = if epi == 1 { 0.5 } else { 2.0 };
                            opts.beta = if epi == 1 { 0.25 } else { -1.0 };
                            opts.bias = Some(&biast);
                            opts.c = Some(&ct);
                            opts.activation = activation;
                        }
                        Ok(dev.matmul(&at, &bt, &opts)?.to_f32_vec()?)
                    };
                    let name = format!("matmul {m}x{n}x{k} {dtype} {precision:?} ta={ta} tb={tb} epilogue={epi}");
                    // |a|, |b|, |bias|, |c| <= 2: |alpha|·4K + 2 + |beta|·2 bounds every sum.
                    let magnitude = match epi {
                        0 => 4.0 * k as f64,
                        1 => 0.5 * 4.0 * k as f64 + 2.0 + 0.25 * 2.0,
                        _ => 2.0 * 4.0 * k as f64 + 2.0 + 2.0,
                    };
                    let rule = Rule::exact_sums(if epi == 0 { Activation::None } else { activation }, magnitude);
                    ck.record(name, run(gpu), run(&ck.cpu.clone()), dtype, rule);
                }
            }
        }
    }
    // Batches (with a broadcast B and a batch larger than one grid layer is not practical here)
    // and strided, misaligned views through `matmul_into`.
    for &(dtype, precision) in &policies {
        let (batch, m, n, k) = (3, 70, 90, 50);
        let a = ints(batch * m * k, 7);
        let b = ints(k * n, 8);
        let run = |dev: &Device| -> Result<Vec<f32>> {
            let at = upload(dev, &[batch, m, k], dtype, &a)?;
            let bt = upload(dev, &[k, n], dtype, &b)?;
            Ok(dev.matmul(&at, &bt, &MatmulOptions::default().precision(precision))?.to_f32_vec()?)
        };
        let rule = Rule::exact_sums(Activation::None, 4.0 * k as f64);
        ck.record(
            format!("matmul batch=3 broadcast B {dtype} {precision:?}"),
            run(gpu),
            run(&ck.cpu.clone()),
            dtype,
            rule,
        );

        // More batches than one grid has layers (65535): the launches are split and the
        // offsets of A, C and the output moved; B is broadcast.
        let (batch, m, n, k) = (65535 + 70, 2, 3, 5);
        let a = ints(batch * m * k, 17);
        let b = ints(k * n, 18);
        let c = ints(batch * m * n, 19);
        let run = |dev: &Device| -> Result<Vec<f32>> {
            let at = upload(dev, &[batch, m, k], dtype, &a)?;
            let bt = upload(dev, &[k, n], dtype, &b)?;
            let ct = upload(dev, &[batch, m, n], dtype, &c)?;
            let opts = MatmulOptions::default().precision(precision).c(Some(&ct)).beta(0.5);
            Ok(dev.matmul(&at, &bt, &opts)?.to_f32_vec()?)
        };
        let rule = Rule::exact_sums(Activation::None, 4.0 * k as f64 + 0.5 * 2.0);
        ck.record(format!("matmul batch={batch} {dtype} {precision:?}"), run(gpu), run(&ck.cpu.clone()), dtype, rule);

        // Split K with batches, bias, C and SiLU through `matmul_into` views: aligned, and
        // misaligned (no vector flags) with padded rows; then A aligned with rows padded to 52
        // while K = 47, so matmul_f32's 16-byte loads of A meet the K edge inside the row (B at
        // an odd offset).
        for &(batch, m, n, k, off, pad) in
            &[(3usize, 70usize, 90usize, 1100usize, 0usize, 0usize), (2, 67, 45, 600, 1, 3), (2, 130, 136, 47, 4, 5)]
        {
            let (lda, ldb, ldo) = (k + pad, n + pad, n + pad + 1);
            let mut desc = MatmulDesc::new(m, n, k);
            desc.batch = batch;
            desc.a = MatrixView::new(off, lda, m * lda);
            desc.b = MatrixView::new(off + 1, ldb, k * ldb);
            desc.out = MatrixView::new(off, ldo, m * ldo);
            desc.c = Some(MatrixView::new(0, n, m * n));
            desc.bias_offset = Some(0);
            desc.precision = precision;
            desc.alpha = 0.5;
            desc.beta = 0.25;
            desc.activation = Activation::Silu;
            let a = ints(off + batch * m * lda, 21);
            let b = ints(off + 1 + batch * k * ldb, 22);
            let c = ints(batch * m * n, 23);
            let bias = ints(n, 24);
            let out_len = off + batch * m * ldo;
            let run = |dev: &Device| -> Result<Vec<f32>> {
                let at = upload(dev, &[a.len()], dtype, &a)?;
                let bt = upload(dev, &[b.len()], dtype, &b)?;
                let ct = upload(dev, &[c.len()], dtype, &c)?;
                let biast = upload(dev, &[n], dtype, &bias)?;
                let ot = dev.zeros(&[out_len], dtype)?;
                dev.matmul_into(&desc, &at, &bt, Some(&biast), Some(&ct), &ot)?;
                Ok(ot.to_f32_vec()?)
            };
            ck.record(
                format!("matmul_into views batch={batch} {m}x{n}x{k} offset={off} pad={pad} {dtype} {precision:?}"),
                run(gpu),
                run(&ck.cpu.clone()),
                dtype,
                Rule::exact_sums(Activation::Silu, 0.5 * 4.0 * k as f64 + 2.0 + 0.25 * 2.0),
            );
        }

        for (off, pad) in [(1usize, 3usize), (8, 8), (3, 0)] {
            let (m, n, k) = (67, 45, 29);
            let a_view = MatrixView::new(off, k + pad, 0);
            let b_view = MatrixView::new(off + 1, n + pad, 0);
            let o_view = MatrixView::new(off, n + pad + 1, 0);
            let a = ints(off + m * (k + pad), 11);
            let b = ints(off + 1 + k * (n + pad), 12);
            let mut desc = MatmulDesc::new(m, n, k);
            desc.a = a_view;
            desc.b = b_view;
            desc.out = o_view;
            desc.precision = precision;
            desc.alpha = 1.5;
            desc.activation = Activation::GeluTanh;
            let out_len = off + m * (n + pad + 1);
            let run = |dev: &Device| -> Result<Vec<f32>> {
                let at = upload(dev, &[a.len()], dtype, &a)?;
                let bt = upload(dev, &[b.len()], dtype, &b)?;
                let ot = dev.zeros(&[out_len], dtype)?;
                dev.matmul_into(&desc, &at, &bt, None, None, &ot)?;
                Ok(ot.to_f32_vec()?)
            };
            ck.record(
                format!("matmul_into offset={off} pad={pad} {dtype} {precision:?}"),
                run(gpu),
                run(&ck.cpu.clone()),
                dtype,
                Rule::exact_sums(Activation::GeluTanh, 1.5 * 4.0 * k as f64),
            );
        }
    }
    Ok(())
}

fn check_conv(gpu: &Device, ck: &mut Checker) -> Result<()> {
    let mut seed = 500;
    for dtype in DType::ALL {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for &(n, c, h, w, mult, kh, kw, stride, pad, dil) in &[
                (2usize, 8usize, 9usize, 11usize, 1usize, 3usize, 3usize, 1usize, 1usize, 1usize),
                (1, 6, 10, 7, 2, 3, 3, 2, 1, 1),
                (1, 5, 13, 13, 1, 5, 3, 1, 2, 2),
                (3, 33, 8, 8, 1, 3, 3, 2, 0, 1),
                (1, 3, 4, 4, 3, 1, 1, 1, 0, 1),
            ] {
                for activation in [Activation::Relu6, Activation::Gelu] {
                    seed += 1;
                    let in_shape = match layout {
                        Layout::Nchw => [n, c, h, w],
                        Layout::Nhwc => [n, h, w, c],
                        other => unimplemented!("{other:?}"),
                    };
                    let x = ints(n * c * h * w, seed);
                    let wt = ints(c * mult * kh * kw, seed + 1);
                    let bias = ints(c * mult, seed + 2);
                    let opts = Conv2dOptions::default()
                        .stride([stride, stride])
                        .padding([pad, pad, pad, pad])
                        .dilation([dil, dil])
                        .layout(layout)
                        .activation(activation);
                    let run = |dev: &Device| -> Result<Vec<f32>> {
                        let xt = upload(dev, &in_shape, dtype, &x)?;
                        let wtt = upload(dev, &[c * mult, 1, kh, kw], dtype, &wt)?;
                        let bt = upload(dev, &[c * mult], dtype, &bias)?;
                        Ok(dev.depthwise_conv2d(&xt, &wtt, Some(&bt), &opts)?.to_f32_vec()?)
                    };
                    ck.record(
                        format!("conv {layout:?} {dtype} n{n} c{c} {h}x{w} m{mult} k{kh}x{kw} s{stride} p{pad} d{dil} {activation}"),
                        run(gpu),
                        run(&ck.cpu.clone()),
                        dtype,
                        Rule::exact_sums(activation, 4.0 * (kh * kw) as f64 + 2.0),
                    );
                }
            }
        }
    }
    Ok(())
}

fn check_activation(gpu: &Device, ck: &mut Checker) -> Result<()> {
    let mut seed = 900;
    for dtype in DType::ALL {
        for &len in &[1usize, 7, 8, 4099, (1 << 20) + 3] {
            for bias_len in [None, Some(1usize), Some(64)] {
                let bias_len = bias_len.filter(|b| len % b == 0);
                for activation in Activation::ALL {
                    seed += 1;
                    let x = reals(len, seed, 8.0);
                    let b = bias_len.map(|bl| reals(bl, seed + 1, 1.0));
                    let shape = match bias_len {
                        Some(bl) => vec![len / bl, bl],
                        None => vec![len],
                    };
                    let in_place = seed % 2 == 0;
                    let run = |dev: &Device| -> Result<Vec<f32>> {
                        let xt = upload(dev, &shape, dtype, &x)?;
                        let bt = match (&b, bias_len) {
                            (Some(b), Some(bl)) => Some(upload(dev, &[bl], dtype, b)?),
                            _ => None,
                        };
                        if in_place {
                            dev.activation_in_place(&xt, bt.as_ref(), activation)?;
                            Ok(xt.to_f32_vec()?)
                        } else {
                            Ok(dev.activation(&xt, bt.as_ref(), activation)?.to_f32_vec()?)
                        }
                    };
                    ck.record(
                        format!("activation {activation} {dtype} len={len} bias={bias_len:?} in_place={in_place}"),
                        run(gpu),
                        run(&ck.cpu.clone()),
                        dtype,
                        // |x| <= 8, |bias| <= 1; x + bias rounds once in f32.
                        Rule::Model { activation, k: 0, magnitude: 9.0 },
                    );
                }
            }
        }
    }
    Ok(())
}

fn check_refs(gpu: &Device, ck: &mut Checker) -> Result<()> {
    for dtype in DType::ALL {
        for &len in &[1usize, 15, 16, 17, 1000003] {
            let x = reals(len, len as u64, 100.0);
            let run = |dev: &Device| -> Result<Vec<f32>> {
                let s = upload(dev, &[len], dtype, &x)?;
                let d = dev.zeros(&[len], dtype)?;
                dev.copy(&s, &d)?;
                Ok(d.to_f32_vec()?)
            };
            ck.record(format!("copy {dtype} len={len}"), run(gpu), run(&ck.cpu.clone()), dtype, Rule::Exact);
        }
        let (m, n, k) = (33, 47, 29);
        let a = ints(m * k, 1);
        let b = ints(k * n, 2);
        let got = (|| -> Result<Vec<f32>> {
            let r = gpu.naive_matmul(&upload(gpu, &[m, k], dtype, &a)?, &upload(gpu, &[k, n], dtype, &b)?)?;
            Ok(r.context("the CUDA backend has a naive matmul")?.to_f32_vec()?)
        })();
        let cpu = ck.cpu.clone();
        let want = (|| -> Result<Vec<f32>> {
            let (at, bt) = (upload(&cpu, &[m, k], dtype, &a)?, upload(&cpu, &[k, n], dtype, &b)?);
            Ok(cpu.matmul(&at, &bt, &MatmulOptions::default())?.to_f32_vec()?)
        })();
        ck.record(
            format!("naive_matmul {dtype}"),
            got,
            want,
            dtype,
            Rule::exact_sums(Activation::None, 4.0 * k as f64),
        );
    }
    Ok(())
}
