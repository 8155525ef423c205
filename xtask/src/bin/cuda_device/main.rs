//! `tilekit-cuda-device`: what `cargo xtask device-check` carries to a GPU machine.
//!
//! - `tilekit-cuda-device check [--json FILE]`: every CUDA op, dtype and kernel variant against
//!   the native CPU backend on edge shapes (sizes around the 128-wide tiles, K = 0, transposes,
//!   strided and misaligned views, batches with broadcast, every epilogue, both conv layouts,
//!   activations with and without bias, in place). Matmul and conv inputs are small integers,
//!   so every partial sum is exact and any correct kernel matches bit for bit before the
//!   activation; the tolerance only covers the activation formulas' last bits and one rounding
//!   of 16-bit storage. Exits non-zero on any mismatch.
//! - `tilekit-cuda-device bench [--json FILE]`: the CUDA figures: matmul 4096³ (f32, f16, bf16,
//!   f32 with bf16 products) against cuBLAS (SGEMM in pedantic, pure-f32 math; GemmEx with f32
//!   compute for f16/bf16), skinny M = 1..32 × 4096 × 4096, MobileNetV2's depthwise layers,
//!   GELU over 256 MiB against the copy kernel. Each figure is checked (against cuBLAS or the CPU
//!   backend) before it is timed. Results are written as JSON after every section, so a
//!   timeout keeps what was measured.
#![allow(clippy::unwrap_used)] // A measurement tool: a failed setup should stop it loudly.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::time::Instant;
use tilekit::{
    Activation, Conv2dOptions, DType, Device, Layout, MatmulDesc, MatmulOptions, MatrixView, Precision, Tensor,
};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    let json_path = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let gpu = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP: no CUDA device: {e}");
            if let Some(p) = &json_path {
                std::fs::write(p, serde_json::to_string_pretty(&json!({"skipped": e.to_string()}))?)?;
            }
            return Ok(());
        }
    };
    println!("device: {}", gpu.description());
    match mode {
        "check" => check(&gpu, json_path.as_deref()),
        "bench" => bench(&gpu, json_path.as_deref()),
        _ => bail!("usage: tilekit-cuda-device check|bench [--json FILE]"),
    }
}

/// Deterministic small integers in [-2, 2] (exact in every dtype, exact partial sums).
fn ints(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 5) as f32 - 2.0
        })
        .collect()
}

/// Deterministic reals in [-lim, lim].
fn reals(n: usize, seed: u64, lim: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * lim
        })
        .collect()
}

/// Largest violation of `|got - want| <= atol + rtol·|want|` (as a ratio; <= 1 passes), NaN
/// matching NaN.
fn compare(got: &[f32], want: &[f32], dtype: DType) -> (f64, f64) {
    let rtol = (2.0 * dtype.unit_roundoff()).max(2e-6);
    let atol = 2e-6;
    let mut worst = 0.0f64;
    let mut max_abs = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        if g.is_nan() && w.is_nan() {
            continue;
        }
        let d = (f64::from(g) - f64::from(w)).abs();
        let ratio = if d.is_nan() { f64::INFINITY } else { d / (atol + rtol * f64::from(w).abs()) };
        worst = worst.max(ratio);
        max_abs = max_abs.max(d);
    }
    if got.len() != want.len() {
        worst = f64::INFINITY;
    }
    (worst, max_abs)
}

struct Checker {
    cpu: Device,
    passed: usize,
    failed: Vec<String>,
}

impl Checker {
    fn record(&mut self, name: String, got: Result<Vec<f32>>, want: Result<Vec<f32>>, dtype: DType) {
        match (got, want) {
            (Ok(g), Ok(w)) => {
                let (worst, max_abs) = compare(&g, &w, dtype);
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

fn check(gpu: &Device, json_path: Option<&str>) -> Result<()> {
    let mut ck = Checker { cpu: Device::cpu(), passed: 0, failed: Vec::new() };
    let t0 = Instant::now();
    check_matmul(gpu, &mut ck)?;
    check_conv(gpu, &mut ck)?;
    check_activation(gpu, &mut ck)?;
    check_refs(gpu, &mut ck)?;
    let secs = t0.elapsed().as_secs_f64();
    println!("check: {} passed, {} failed ({secs:.1} s)", ck.passed, ck.failed.len());
    if let Some(p) = json_path {
        let v = json!({"device": gpu.description(), "passed": ck.passed, "failed": ck.failed, "seconds": secs});
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    if !ck.failed.is_empty() {
        bail!("{} CUDA checks failed", ck.failed.len());
    }
    Ok(())
}

fn upload(dev: &Device, shape: &[usize], dtype: DType, data: &[f32]) -> Result<Tensor> {
    Ok(dev.tensor_from_f32(shape, dtype, data)?)
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
                        let mut opts = MatmulOptions { trans_a: ta, trans_b: tb, precision, ..Default::default() };
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
                    ck.record(name, run(gpu), run(&ck.cpu.clone()), dtype);
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
            Ok(dev.matmul(&at, &bt, &MatmulOptions { precision, ..Default::default() })?.to_f32_vec()?)
        };
        ck.record(format!("matmul batch=3 broadcast B {dtype} {precision:?}"), run(gpu), run(&ck.cpu.clone()), dtype);

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
            let opts = MatmulOptions { precision, c: Some(&ct), beta: 0.5, ..Default::default() };
            Ok(dev.matmul(&at, &bt, &opts)?.to_f32_vec()?)
        };
        ck.record(format!("matmul batch={batch} {dtype} {precision:?}"), run(gpu), run(&ck.cpu.clone()), dtype);

        for (off, pad) in [(1usize, 3usize), (8, 8), (3, 0)] {
            let (m, n, k) = (67, 45, 29);
            let a_view = MatrixView { offset: off, ld: k + pad, batch_stride: 0 };
            let b_view = MatrixView { offset: off + 1, ld: n + pad, batch_stride: 0 };
            let o_view = MatrixView { offset: off, ld: n + pad + 1, batch_stride: 0 };
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
                    };
                    let x = ints(n * c * h * w, seed);
                    let wt = ints(c * mult * kh * kw, seed + 1);
                    let bias = ints(c * mult, seed + 2);
                    let opts = Conv2dOptions {
                        stride: [stride, stride],
                        padding: [pad, pad, pad, pad],
                        dilation: [dil, dil],
                        layout,
                        activation,
                    };
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
            ck.record(format!("copy {dtype} len={len}"), run(gpu), run(&ck.cpu.clone()), dtype);
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
        ck.record(format!("naive_matmul {dtype}"), got, want, dtype);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Bench.

/// Seconds per call of `f`, from `reps` back-to-back calls after `warm` warm-up calls (one
/// synchronisation per batch, so launch latency overlaps as it does in a real graph). The
/// median of 3 batches.
fn time(dev: &Device, warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    dev.synchronize()?;
    let mut v = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        dev.synchronize()?;
        v.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[1])
}

fn save(path: Option<&str>, v: &Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(v)?)?;
    }
    Ok(())
}

fn bench(gpu: &Device, json_path: Option<&str>) -> Result<()> {
    let mut out = json!({"device": gpu.description(), "matmul": [], "skinny": [], "depthwise": [], "elementwise": []});
    let blas = cublas::Blas::new();
    if let Err(e) = &blas {
        println!("cuBLAS: not available ({e:#}); tilekit figures only");
        out["cublas"] = json!(format!("unavailable: {e:#}"));
    }
    let blas = blas.ok();
    save(json_path, &out)?;

    // Matmul 4096³.
    for (dtype, precision) in [
        (DType::F32, Precision::Highest),
        (DType::F16, Precision::Highest),
        (DType::Bf16, Precision::Highest),
        (DType::F32, Precision::Bf16),
    ] {
        let r = bench_matmul(gpu, blas.as_ref(), 4096, 4096, 4096, dtype, precision, 10);
        let v = r.unwrap_or_else(|e| json!({"dtype": dtype.to_string(), "error": format!("{e:#}")}));
        println!("matmul 4096³ {dtype} {precision:?}: {v}");
        out["matmul"].as_array_mut().unwrap().push(v);
        save(json_path, &out)?;
    }
    // Skinny.
    for dtype in [DType::F32, DType::Bf16] {
        for m in [1usize, 2, 4, 8, 16, 32] {
            let r = bench_matmul(gpu, blas.as_ref(), m, 4096, 4096, dtype, Precision::Highest, 50);
            let v = r.unwrap_or_else(|e| json!({"m": m, "dtype": dtype.to_string(), "error": format!("{e:#}")}));
            println!("skinny M={m} {dtype}: {v}");
            out["skinny"].as_array_mut().unwrap().push(v);
            save(json_path, &out)?;
        }
    }
    // MobileNetV2 depthwise layers (3×3, pad 1), batch 8, bias + ReLU6.
    let layers = [
        (112usize, 32usize, 1usize),
        (112, 96, 2),
        (56, 144, 1),
        (56, 144, 2),
        (28, 192, 1),
        (28, 192, 2),
        (14, 384, 1),
        (14, 576, 1),
        (14, 576, 2),
        (7, 960, 1),
    ];
    for dtype in [DType::F32, DType::F16] {
        for layout in [Layout::Nhwc, Layout::Nchw] {
            for &(hw, c, s) in &layers {
                let r = bench_conv(gpu, 8, hw, c, s, layout, dtype);
                let v = r.unwrap_or_else(|e| json!({"hw": hw, "c": c, "error": format!("{e:#}")}));
                println!("depthwise {hw}²×{c} s{s} {layout:?} {dtype}: {v}");
                out["depthwise"].as_array_mut().unwrap().push(v);
            }
            save(json_path, &out)?;
        }
    }
    // GELU over 256 MiB against the copy kernel.
    for dtype in [DType::F32, DType::Bf16] {
        let r = bench_elementwise(gpu, 256 << 20, dtype);
        let v = r.unwrap_or_else(|e| json!({"dtype": dtype.to_string(), "error": format!("{e:#}")}));
        println!("gelu 256 MiB {dtype}: {v}");
        out["elementwise"].as_array_mut().unwrap().push(v);
        save(json_path, &out)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench_matmul(
    gpu: &Device,
    blas: Option<&cublas::Blas>,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    precision: Precision,
    reps: usize,
) -> Result<Value> {
    let a = reals(m * k, 1, 1.0);
    let b = reals(k * n, 2, 1.0);
    let at = gpu.tensor_from_f32(&[m, k], dtype, &a)?;
    let bt = gpu.tensor_from_f32(&[k, n], dtype, &b)?;
    let out = gpu.zeros(&[m, n], dtype)?;
    let desc = MatmulDesc { precision, ..MatmulDesc::new(m, n, k) };
    let flops = desc.flops();
    gpu.matmul_into(&desc, &at, &bt, None, None, &out)?;
    let ours = out.to_f32_vec()?;
    let secs = time(gpu, 2, reps, || Ok(gpu.matmul_into(&desc, &at, &bt, None, None, &out)?))?;
    let mut v = json!({
        "m": m, "n": n, "k": k, "dtype": dtype.to_string(), "precision": format!("{precision:?}"),
        "tilekit_ms": secs * 1e3, "tilekit_tflops": flops / secs / 1e12,
    });
    // cuBLAS: the same inputs, rounded the same way (for the bf16 policy, to bf16 first).
    if let Some(blas) = blas {
        let (blas_dtype, a_r, b_r) = if precision == Precision::Bf16 {
            (DType::Bf16, at.to_f32_vec()?, bt.to_f32_vec()?)
        } else {
            (dtype, at.to_f32_vec()?, bt.to_f32_vec()?)
        };
        let (theirs, bsecs) = blas.gemm(m, n, k, blas_dtype, &a_r, &b_r, reps)?;
        // Both sum the same exactly-rounded products in f32 in different orders: the results
        // agree to a few f32 ulps of the sum of |products| (≤ k·max|a|·max|b| = k here).
        let scale = (k as f64).sqrt() * 1e-5 + 2.0 * blas_dtype.unit_roundoff();
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs() / (scale * (1.0 + f64::from(y).abs())))
            .fold(0.0f64, f64::max);
        v["cublas_ms"] = json!(bsecs * 1e3);
        v["cublas_tflops"] = json!(flops / bsecs / 1e12);
        v["ratio_vs_cublas"] = json!(bsecs / secs);
        v["agrees_with_cublas"] = json!(worst <= 1.0);
        v["worst_diff_over_tolerance"] = json!(worst);
    }
    Ok(v)
}

fn bench_conv(
    gpu: &Device,
    batch: usize,
    hw: usize,
    c: usize,
    s: usize,
    layout: Layout,
    dtype: DType,
) -> Result<Value> {
    let in_shape = match layout {
        Layout::Nchw => [batch, c, hw, hw],
        Layout::Nhwc => [batch, hw, hw, c],
    };
    let x = ints(batch * c * hw * hw, 3);
    let w = ints(c * 9, 4);
    let bias = ints(c, 5);
    let opts = Conv2dOptions {
        stride: [s, s],
        padding: [1, 1, 1, 1],
        layout,
        activation: Activation::Relu6,
        ..Default::default()
    };
    let xt = gpu.tensor_from_f32(&in_shape, dtype, &x)?;
    let wt = gpu.tensor_from_f32(&[c, 1, 3, 3], dtype, &w)?;
    let bt = gpu.tensor_from_f32(&[c], dtype, &bias)?;
    let out = gpu.depthwise_conv2d(&xt, &wt, Some(&bt), &opts)?;
    // Check once against the CPU backend before timing.
    let cpu = Device::cpu();
    let want = cpu
        .depthwise_conv2d(
            &cpu.tensor_from_f32(&in_shape, dtype, &x)?,
            &cpu.tensor_from_f32(&[c, 1, 3, 3], dtype, &w)?,
            Some(&cpu.tensor_from_f32(&[c], dtype, &bias)?),
            &opts,
        )?
        .to_f32_vec()?;
    let (worst, _) = compare(&out.to_f32_vec()?, &want, dtype);
    let secs = time(gpu, 3, 50, || Ok(gpu.depthwise_conv2d_into(&xt, &wt, Some(&bt), &opts, &out)?))?;
    let bytes = ((xt.len() + out.len() + wt.len()) * dtype.size_bytes()) as f64;
    Ok(json!({
        "batch": batch, "hw": hw, "c": c, "stride": s, "layout": format!("{layout:?}"), "dtype": dtype.to_string(),
        "correct": worst <= 1.0, "us": secs * 1e6, "gbps": bytes / secs / 1e9,
    }))
}

fn bench_elementwise(gpu: &Device, bytes: usize, dtype: DType) -> Result<Value> {
    let len = bytes / dtype.size_bytes();
    let x = reals(len, 9, 6.0);
    let src = gpu.tensor_from_f32(&[len], dtype, &x)?;
    let dst = gpu.zeros(&[len], dtype)?;
    let gelu_secs = time(gpu, 2, 10, || Ok(gpu.activation_into(&src, None, Activation::Gelu, &dst)?))?;
    let copy_secs = time(gpu, 2, 10, || Ok(gpu.copy(&src, &dst)?))?;
    // Correctness of the GELU output on a sample, against the CPU backend.
    gpu.activation_into(&src, None, Activation::Gelu, &dst)?;
    let got = dst.to_f32_vec()?;
    let cpu = Device::cpu();
    let n = len.min(1 << 20);
    let want = cpu.activation(&cpu.tensor_from_f32(&[n], dtype, &x[..n])?, None, Activation::Gelu)?.to_f32_vec()?;
    let (worst, _) = compare(&got[..n], &want, dtype);
    let moved = 2.0 * bytes as f64;
    Ok(json!({
        "dtype": dtype.to_string(), "bytes": bytes, "correct": worst <= 1.0,
        "gelu_ms": gelu_secs * 1e3, "gelu_gbps": moved / gelu_secs / 1e9,
        "copy_ms": copy_secs * 1e3, "copy_gbps": moved / copy_secs / 1e9,
        "gelu_over_copy": copy_secs / gelu_secs,
    }))
}

/// cuBLAS through cudarc, on its own stream of the device's primary context.
mod cublas {
    use anyhow::{Context, Result, bail};
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys};
    use cudarc::driver::{CudaContext, CudaStream};
    use half::{bf16, f16};
    use std::sync::Arc;
    use std::time::Instant;
    use tilekit::DType;

    pub struct Blas {
        stream: Arc<CudaStream>,
        blas: CudaBlas,
    }

    impl Blas {
        pub fn new() -> Result<Blas> {
            // SAFETY: only tries to open the library.
            if !unsafe { sys::is_culib_present() } {
                bail!("libcublas could not be loaded (add its folder to LD_LIBRARY_PATH)");
            }
            let ctx = CudaContext::new(0).context("CUDA context")?;
            let stream = ctx.new_stream().context("CUDA stream")?;
            let blas = CudaBlas::new(stream.clone()).context("cublasCreate")?;
            // Pure f32 SGEMM: no TF32 tensor-core shortcut.
            // SAFETY: the handle is live; the call only sets a mode on it.
            unsafe { sys::cublasSetMathMode(*blas.handle(), sys::cublasMath_t::CUBLAS_PEDANTIC_MATH) }
                .result()
                .context("cublasSetMathMode")?;
            Ok(Blas { stream, blas })
        }

        /// Row-major `[m, k] · [k, n]`, as `Cᵀ = Bᵀ·Aᵀ` in cuBLAS's column-major terms. Returns
        /// the result and the seconds per call.
        #[allow(clippy::too_many_arguments)]
        pub fn gemm(
            &self,
            m: usize,
            n: usize,
            k: usize,
            dtype: DType,
            a: &[f32],
            b: &[f32],
            reps: usize,
        ) -> Result<(Vec<f32>, f64)> {
            match dtype {
                DType::F32 => self.run::<f32>(m, n, k, a, b, reps, |x| x, |x| x),
                DType::F16 => self.run::<f16>(m, n, k, a, b, reps, f16::from_f32, f16::to_f32),
                DType::Bf16 => self.run::<bf16>(m, n, k, a, b, reps, bf16::from_f32, bf16::to_f32),
            }
        }

        #[allow(clippy::too_many_arguments)]
        fn run<T>(
            &self,
            m: usize,
            n: usize,
            k: usize,
            a: &[f32],
            b: &[f32],
            reps: usize,
            from: fn(f32) -> T,
            to: fn(T) -> f32,
        ) -> Result<(Vec<f32>, f64)>
        where
            T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default,
            CudaBlas: Gemm<T>,
        {
            let ah: Vec<T> = a.iter().map(|&x| from(x)).collect();
            let bh: Vec<T> = b.iter().map(|&x| from(x)).collect();
            let ad = self.stream.clone_htod(&ah)?;
            let bd = self.stream.clone_htod(&bh)?;
            let mut cd = self.stream.alloc_zeros::<T>(m * n)?;
            let cfg = GemmConfig {
                transa: sys::cublasOperation_t::CUBLAS_OP_N,
                transb: sys::cublasOperation_t::CUBLAS_OP_N,
                m: n as i32,
                n: m as i32,
                k: k as i32,
                alpha: from(1.0),
                lda: n as i32,
                ldb: k as i32,
                beta: from(0.0),
                ldc: n as i32,
            };
            let call = |cd: &mut cudarc::driver::CudaSlice<T>| -> Result<()> {
                // SAFETY: the buffers hold n·k, k·m and n·m elements as the config says.
                unsafe { self.blas.gemm(cfg, &bd, &ad, cd) }.context("cublas gemm")?;
                Ok(())
            };
            for _ in 0..2 {
                call(&mut cd)?;
            }
            self.stream.synchronize()?;
            let mut times = Vec::new();
            for _ in 0..3 {
                let t = Instant::now();
                for _ in 0..reps {
                    call(&mut cd)?;
                }
                self.stream.synchronize()?;
                times.push(t.elapsed().as_secs_f64() / reps as f64);
            }
            times.sort_by(f64::total_cmp);
            let c: Vec<T> = self.stream.clone_dtoh(&cd)?;
            Ok((c.into_iter().map(to).collect(), times[1]))
        }
    }
}
