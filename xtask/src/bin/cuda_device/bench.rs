//! `bench`: the CUDA figures, each checked before it is timed, against cuBLAS and the CPU
//! backend.

use crate::checks::{Rule, compare};
use crate::cublas::Blas;
use crate::data::{eighths, ints, reals};
use crate::timing::time;
use anyhow::Result;
use serde_json::{Value, json};
use tilekit::{Activation, Conv2dOptions, DType, Device, Layout, MatmulDesc, Precision};

fn save(path: Option<&str>, v: &Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(v)?)?;
    }
    Ok(())
}

pub fn bench(gpu: &Device, json_path: Option<&str>) -> Result<()> {
    let mut out = json!({"device": gpu.description(), "matmul": [], "skinny": [], "depthwise": [], "elementwise": []});
    let blas = Blas::new();
    match &blas {
        Ok(b) => {
            println!("cuBLAS: math mode {} for every timed call", b.math_mode());
            out["cublas_math_mode"] = json!(b.math_mode());
        }
        Err(e) => {
            println!("cuBLAS: not available ({e:#}); tilekit figures only");
            out["cublas"] = json!(format!("unavailable: {e:#}"));
        }
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
    // Under one wave of 128 × 128 tiles (16 blocks): the tensor-core kernels split K
    // (`catalogue::cuda::splitk`, 9 splits of 480 here) and reduce in a second launch.
    for dtype in [DType::F16, DType::Bf16] {
        let r = bench_matmul(gpu, blas.as_ref(), 512, 512, 4096, dtype, Precision::Highest, 50);
        let v = r.unwrap_or_else(|e| json!({"dtype": dtype.to_string(), "error": format!("{e:#}")}));
        println!("matmul 512×512×4096 (split K) {dtype}: {v}");
        out["matmul"].as_array_mut().unwrap().push(v);
        save(json_path, &out)?;
    }
    // Skinny.
    for dtype in [DType::F32, DType::Bf16] {
        for m in [1usize, 2, 4, 8, 16, 24, 32] {
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
    blas: Option<&Blas>,
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
    let desc = MatmulDesc::new(m, n, k).precision(precision);
    let flops = desc.flops();
    let secs = time(gpu, 2, reps, || Ok(gpu.matmul_into(&desc, &at, &bt, None, None, &out)?))?;
    let mut v = json!({
        "m": m, "n": n, "k": k, "dtype": dtype.to_string(), "precision": format!("{precision:?}"),
        "tilekit_ms": secs * 1e3, "tilekit_tflops": flops / secs / 1e12,
    });
    // cuBLAS: timed in its default math mode on the same inputs, rounded the same way (for the
    // bf16 policy, to bf16 by the bf16 GEMM). Agreement is checked through the pedantic handle
    // on exact inputs (multiples of 1/8 in [-1, 1], exact in bf16 too): there both sums are
    // exact in f32, so the results differ only by their roundings to the storage dtypes; on
    // random inputs the worst-case bound at K = 4096 is too wide to see a wrong index.
    if let Some(blas) = blas {
        let blas_dtype = if precision == Precision::Bf16 { DType::Bf16 } else { dtype };
        let (_, bsecs) = blas.gemm(m, n, k, blas_dtype, &at.to_f32_vec()?, &bt.to_f32_vec()?, reps)?;
        let (ea, eb) = (eighths(m * k, 3), eighths(k * n, 4));
        let (eat, ebt) = (gpu.tensor_from_f32(&[m, k], dtype, &ea)?, gpu.tensor_from_f32(&[k, n], dtype, &eb)?);
        gpu.matmul_into(&desc, &eat, &ebt, None, None, &out)?;
        let ours = out.to_f32_vec()?;
        let theirs = blas.gemm_pedantic(m, n, k, blas_dtype, &ea, &eb)?;
        let rule = Rule::exact_sums(Activation::None, k as f64);
        let (worst, max_abs) = compare(&ours, &theirs, dtype, blas_dtype, rule);
        v["cublas_ms"] = json!(bsecs * 1e3);
        v["cublas_tflops"] = json!(flops / bsecs / 1e12);
        v["cublas_math_mode"] = json!(blas.math_mode());
        v["agreement_checked_in"] = json!(crate::cublas::Mode::Pedantic.name());
        v["ratio_vs_cublas"] = json!(bsecs / secs);
        v["agrees_with_cublas"] = json!(worst <= 1.0);
        v["worst_diff_over_tolerance"] = json!(worst);
        v["max_abs_diff"] = json!(max_abs);
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
        other => unimplemented!("{other:?}"),
    };
    let x = ints(batch * c * hw * hw, 3);
    let w = ints(c * 9, 4);
    let bias = ints(c, 5);
    let opts =
        Conv2dOptions::default().stride([s, s]).padding([1, 1, 1, 1]).layout(layout).activation(Activation::Relu6);
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
    // Integer inputs: exact sums, |pre| <= 9·4 + 2.
    let rule = Rule::exact_sums(Activation::Relu6, 38.0);
    let (worst, _) = compare(&out.to_f32_vec()?, &want, dtype, dtype, rule);
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
    let rule = Rule::Model { activation: Activation::Gelu, k: 0, magnitude: 6.0 };
    let (worst, _) = compare(&got[..n], &want, dtype, dtype, rule);
    let moved = 2.0 * bytes as f64;
    Ok(json!({
        "dtype": dtype.to_string(), "bytes": bytes, "correct": worst <= 1.0,
        "gelu_ms": gelu_secs * 1e3, "gelu_gbps": moved / gelu_secs / 1e9,
        "copy_ms": copy_secs * 1e3, "copy_gbps": moved / copy_secs / 1e9,
        "gelu_over_copy": copy_secs / gelu_secs,
    }))
}
