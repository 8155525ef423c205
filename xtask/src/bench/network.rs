//! The `mobilenet` suite's whole-network rows: MobileNetV2 (random torchvision-named weights,
//! BatchNorm folded) per backend, dtype and layout, latency per image.
//!
//! Each configuration is first checked against the f64 reference forward pass
//! (`tilekit_models::reference`) with the end-to-end test's tolerance, then timed, each forward
//! pass from the uploaded input to the logits read back. The size is 224×224 (the model's), or
//! 64×64 on a software adapter in `--quick` mode. Every configuration runs its blocks fused
//! (`Device::inverted_residual_packed`, the model's path) and as the unfused three-op chain:
//! - `ms/image` (and `images/s`, `GFLOP/s`, `vs f32 nchw`, `vs ort`) is the fused network
//!   alone, the way ONNX Runtime is timed: three warm-up passes, then `runs` back to back;
//! - `unfused ms` and `vs unfused` come from `runs` pairs of one fused and one unfused pass,
//!   interleaved (so drift hits both alike); `vs unfused` is the pairs' unfused median over
//!   their fused median. (The fused passes of the pairs follow an unfused pass each, which has
//!   left its own tensors in the caches: they are not the network's warm latency.)
//!
//! On the CPU, ONNX Runtime runs the same network (`ort_helper.py`'s `mobilenet_v2`: an f32
//! NCHW graph of the same blocks, BatchNorm folded, random weights) right after, and `vs ort`
//! is its median over tilekit's warm fused f32 medians.

use super::ort::Ort;
use anyhow::{Context, Result, anyhow};
use std::time::Instant;
use tilekit::{DType, Device, Layout};
use tilekit_models::{MobileNetV2, Weights, reference, synthetic};

/// Multiply-adds ×2 of MobileNetV2 at `h × w` (convs, pool and classifier), for a GFLOP/s column.
fn flops(h: usize, w: usize) -> f64 {
    let (mut h, mut w) = (h.div_ceil(2), w.div_ceil(2));
    let mut f = 2.0 * (h * w * 32 * 27) as f64;
    for b in tilekit_models::arch::blocks() {
        if b.has_expand() {
            f += 2.0 * (h * w * b.inp * b.hidden) as f64;
        }
        (h, w) = (h.div_ceil(b.stride), w.div_ceil(b.stride));
        f += 2.0 * (h * w * b.hidden * 9) as f64 + 2.0 * (h * w * b.hidden * b.oup) as f64;
    }
    f + 2.0 * (h * w * 320 * 1280) as f64 + 2.0 * 1280.0 * 1000.0
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 5e-3,
        DType::Bf16 => 4e-2,
        other => unimplemented!("{other:?}"),
    }
}

/// Benches the whole network on `dev` for each of `dtypes` and both layouts; prints a table,
/// and below it, where `ort` is given (the CPU device), ONNX Runtime's time for the same
/// network and tilekit's f32 rows against it.
pub fn bench(dev: &Device, dtypes: &[DType], quick: bool, ort: Option<&mut Ort>) -> Result<()> {
    let size = if quick && dev.is_software() { 64 } else { 224 };
    let runs = if quick || dev.is_software() { 3 } else { 10 };
    let bytes = synthetic::to_safetensors(&synthetic::state_dict(2026)).map_err(|e| anyhow!("{e}"))?;
    let weights = Weights::from_bytes(&bytes)?;
    let input = synthetic::input(7, 1, size, size);
    println!(
        "\n   mobilenet_v2 whole network, batch 1, {size}x{size}, {:.2} GFLOP per image, median of {runs} (ms/image: \
         fused alone, warm, back to back; vs unfused: {runs} fused/unfused pairs, interleaved)",
        flops(size, size) / 1e9
    );
    println!(
        "   {:<6} {:<6} {:>12} {:>10} {:>10} {:>14} {:>10} {:>12} {:>10}",
        "dtype", "layout", "ms/image", "images/s", "GFLOP/s", "unfused ms", "vs unfused", "vs f32 nchw", "check"
    );
    let mut base = None;
    let mut f32_rows = Vec::new();
    for &dtype in dtypes {
        if dev.check_dtype(dtype).is_err() {
            continue;
        }
        let want = reference::forward(&weights, dtype, [1, 3, size, size], &input);
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut net = MobileNetV2::new(dev, &weights, dtype, layout)?;
            let got = net.run(&[1, 3, size, size], &input).context("mobilenet_v2")?;
            let err = got.iter().zip(&want).fold(0.0f64, |m, (g, r)| m.max((*g as f64 - r).abs())) / scale;
            if err > tolerance(dtype) {
                println!(
                    "   {:<6} {:<6} FAILED its check: relative logit error {err:.2e}",
                    dtype.to_string(),
                    layout.name()
                );
                continue;
            }
            let x = net.upload_input(&[1, 3, size, size], &input)?;
            // The unfused chain must pass the same check before it is timed.
            net.set_fused(false);
            let got = net.run(&[1, 3, size, size], &input).context("mobilenet_v2 unfused")?;
            let err_u = got.iter().zip(&want).fold(0.0f64, |m, (g, r)| m.max((*g as f64 - r).abs())) / scale;
            if err_u > tolerance(dtype) {
                println!("   {:<6} {:<6} FAILED its unfused check: {err_u:.2e}", dtype.to_string(), layout.name());
                continue;
            }
            let (mut times, mut unfused) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                for (fused, into) in [(true, &mut times), (false, &mut unfused)] {
                    net.set_fused(fused);
                    let t = Instant::now();
                    net.forward(&x)?.to_f32_vec()?;
                    into.push(t.elapsed().as_secs_f64());
                }
            }
            // The fused network alone, warm, back to back (ONNX Runtime's protocol).
            net.set_fused(true);
            for _ in 0..3 {
                net.forward(&x)?.to_f32_vec()?;
            }
            let mut warm = Vec::with_capacity(runs);
            for _ in 0..runs {
                let t = Instant::now();
                net.forward(&x)?.to_f32_vec()?;
                warm.push(t.elapsed().as_secs_f64());
            }
            for v in [&mut times, &mut unfused, &mut warm] {
                v.sort_by(f64::total_cmp);
            }
            let median = warm[warm.len() / 2];
            let paired = times[times.len() / 2];
            let median_u = unfused[unfused.len() / 2];
            if dtype == DType::F32 && layout == Layout::Nchw {
                base = Some(median);
            }
            if dtype == DType::F32 {
                f32_rows.push((layout, median));
            }
            let ratio = base.map(|b| format!("{:.2}x", b / median)).unwrap_or_else(|| "-".into());
            println!(
                "   {:<6} {:<6} {:>12.2} {:>10.1} {:>10.1} {:>14.2} {:>10} {:>12} {:>10}",
                dtype.to_string(),
                layout.name(),
                median * 1e3,
                1.0 / median,
                flops(size, size) / median / 1e9,
                median_u * 1e3,
                format!("{:.2}x", median_u / paired),
                ratio,
                format!("{err:.1e}")
            );
        }
    }
    if let Some(ort) = ort {
        let blocks: Vec<[usize; 4]> =
            tilekit_models::arch::blocks().iter().map(|b| [b.inp, b.hidden, b.oup, b.stride]).collect();
        match ort.time_mobilenet_v2(size, &blocks, runs.max(10), 3) {
            Ok(s) => {
                let vs = f32_rows
                    .iter()
                    .map(|(l, t)| format!("f32 {} {:.2}x", l.name(), s.median_s / t))
                    .collect::<Vec<_>>()
                    .join(", ");
                println!(
                    "   onnxruntime {} (the same network as one ONNX graph, f32 NCHW, 2 intra-op threads, warm, \
                     median of {}): {:.2} ms/image; vs ort (ORT time / tilekit time): {vs}",
                    ort.version,
                    s.runs,
                    s.median_s * 1e3
                );
            }
            Err(e) => println!("   onnxruntime: the network did not run: {e:#}"),
        }
    }
    Ok(())
}
