//! The quantized rows of the `decode` suite: `Device::matmul_quant` with A `[M, K]` in f32 and
//! a GGUF-quantized weight `[N, K]`, M = 1 and 16, for Q8_0, Q4_0, Q4_K and Q6_K (LLaMA-7B's
//! 4096×4096, 11008×4096 and 4096×11008 projections; 1024×1024 in `--quick`).
//!
//! Each row is checked against the `f64` reference on the dequantized weights (16 sampled
//! output columns, every row of the output, under `tilekit_kernels::tolerance`) before it is
//! timed. Bytes are what the op must move (the quantized weight, A and the output); GB/s is
//! bytes over the median time, and "roof" divides it by the backend's own copy kernel
//! (`Device::copy`) moving the same number of bytes, timed in the same run. "vs f16" is the
//! dense f16 row of the same shape and layout (`MxNxK B[N,K]`, from the same run: pass
//! `--dtype f16` or `all`) over this row's time: above 1 the quantized row is faster; the
//! ideal is the ratio of weight bytes (Q8_0 1.9×, Q4_0 and Q4_K 3.6×, Q6_K 2.6×). Backends
//! without quantized kernels print a SKIP line.

use super::measure::{Flusher, Plan, time_between};
use super::report::{Row, attainable_fraction};
use anyhow::{Context, Result, bail};
use tilekit::quant::{GgmlType, dequantize};
use tilekit::{DType, Device, Error, MatmulOptions, QTensor, Tensor};
use tilekit_kernels::tolerance;

/// The formats the suite times (`Q4_K_M` files mix Q4_K and Q6_K).
const TYPES: [GgmlType; 4] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K];

/// `(M, N, K)` of the rows.
fn shapes(quick: bool) -> Vec<(usize, usize, usize)> {
    let nk: &[(usize, usize)] = if quick { &[(1024, 1024)] } else { &[(4096, 4096), (11008, 4096), (4096, 11008)] };
    [1, 16].iter().flat_map(|&m| nk.iter().map(move |&(n, k)| (m, n, k))).collect()
}

/// A deterministic byte stream (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn unit(&mut self) -> f32 {
        (self.next() & 0xFF_FFFF) as f32 / (1u64 << 24) as f32
    }
}

/// Random blocks of `ty` with f16 scales in `[2⁻¹⁰, 2⁻⁴)`, so every weight is finite.
fn weight_bytes(ty: GgmlType, n: usize, k: usize) -> Result<Vec<u8>> {
    let mut rng = Lcg(0x9e37_79b9);
    let mut out: Vec<u8> = (0..ty.tensor_bytes(&[n, k])?).map(|_| rng.next() as u8).collect();
    let fields: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 => &[0],
        GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => bail!("{ty} is not in the suite"),
    };
    for blk in out.chunks_exact_mut(ty.block_bytes()) {
        for &f in fields {
            let s = half::f16::from_f32((1.0 + 63.0 * rng.unit()) / 1024.0);
            blk[f..f + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
    Ok(out)
}

/// Checks 16 sampled output columns of `y` (`[m, n]`) against the `f64` reference.
fn check(ty: GgmlType, bytes: &[u8], a: &[f32], y: &[f32], (m, n, k): (usize, usize, usize)) -> Result<()> {
    let row_bytes = ty.tensor_bytes(&[1, k])?;
    for s in 0..16 {
        let j = (s * 7919) % n;
        let w = dequantize(ty, &bytes[j * row_bytes..(j + 1) * row_bytes], &[1, k])?;
        for i in 0..m {
            let (mut exact, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let t = f64::from(a[i * k + p]) * f64::from(w[p]);
                exact += t;
                mag += t.abs();
            }
            let got = y[i * n + j];
            let bound = tolerance::bound(DType::F32, tilekit::Activation::None, k, mag, exact, exact);
            if !tolerance::accepts(DType::F32, got, exact, bound) {
                bail!("{ty} {m}x{n}x{k}: output [{i}, {j}] is {got:e}, the reference {exact:e} (bound {bound:e})");
            }
        }
    }
    Ok(())
}

/// One timed row: the op's median seconds and the copy roof's for the same bytes.
/// With `flusher`, the host caches are flushed before every timed run (of the op and of the
/// copy), as for the dense CPU decode rows.
fn row(
    dev: &Device,
    ty: GgmlType,
    shape: (usize, usize, usize),
    quick: bool,
    mut flusher: Option<&mut Flusher>,
) -> Result<Option<(f64, f64, usize)>> {
    let (m, n, k) = shape;
    let bytes = weight_bytes(ty, n, k)?;
    let w: QTensor = dev.quant_tensor(ty, &[n, k], &bytes)?;
    let mut rng = Lcg(0x51ed_270b);
    let a: Vec<f32> = (0..m * k).map(|_| 2.0 * rng.unit() - 1.0).collect();
    let at = dev.tensor_from_f32(&[m, k], DType::F32, &a)?;
    let opts = MatmulOptions::default().trans_b(true);
    let y = match dev.matmul_quant(&at, &w, &opts) {
        Err(e @ Error::UnsupportedQuantType { .. }) => {
            println!("   SKIP {ty} on {}: {e}", dev.kind());
            return Ok(None);
        }
        r => r?,
    };
    check(ty, &bytes, &a, &y.to_f32_vec()?, shape)?;
    let moved = bytes.len() + 4 * (m * k + m * n);
    let plan = Plan::op(quick, dev.is_software());
    let mut flush = || flusher.as_mut().map_or((), |f| f.flush());
    let op = time_between(plan, &mut flush, || {
        let _y = dev.matmul_quant(&at, &w, &opts)?;
        Ok(dev.synchronize()?)
    })?;
    // The copy reads and writes: half the bytes each way moves `moved` bytes in all.
    let words = (moved / 8).max(1);
    let src: Tensor = dev.zeros(&[words], DType::F32)?;
    let dst: Tensor = dev.zeros(&[words], DType::F32)?;
    let copy = time_between(Plan::reference(quick), flush, || {
        dev.copy(&src, &dst)?;
        Ok(dev.synchronize()?)
    })?;
    Ok(Some((op.median_s, copy.median_s, moved)))
}

/// The median seconds of the dense f16 row of `shape` with B stored `[N, K]` on `dev`, if the run has it.
fn f16_row(rows: &[Row], dev: &Device, (m, n, k): (usize, usize, usize)) -> Option<f64> {
    let shape = format!("{m}x{n}x{k} B[N,K]");
    let r = rows.iter().find(|r| {
        r.op == "matmul" && r.shape == shape && r.dtype == DType::F16.name() && r.backend == dev.kind().name()
    })?;
    r.passed().then_some(r.stats?.median_s)
}

/// Runs the quantized decode rows on every device and prints their table (`rows`: the run's
/// dense rows, for the speedup over f16; `flusher`: flush the caches between CPU runs;
/// `peak`: a device's compute roof in GFLOP/s, where known, for the `att` column).
pub fn run(
    devices: &[Device],
    quick: bool,
    rows: &[Row],
    mut flusher: Option<&mut Flusher>,
    peak: &dyn Fn(&Device) -> Option<f64>,
) -> Result<()> {
    println!("\n== decode, quantized weights (A f32 [M, K] · W[N, K]ᵀ; bytes = weight + A + output)");
    println!(
        "   att = GFLOP/s (2·M·N·K) over the lower of copy GB/s × FLOP per byte and the compute peak: at M = 16 the \
         rows do 30-54 FLOP per byte, so the peak is their roof, not the copy"
    );
    println!(
        "   {:<8} {:<6} {:>16} {:>10} {:>9} {:>8} {:>10} {:>6} {:>9} {:>5} {:>8}",
        "backend", "type", "MxNxK", "weight MB", "ms", "GB/s", "copy GB/s", "roof", "GFLOP/s", "att", "vs f16"
    );
    for dev in devices {
        for ty in TYPES {
            for shape in shapes(quick) {
                let (m, n, k) = shape;
                let what = || format!("{} {ty} {m}x{n}x{k}", dev.kind());
                let Some((t, copy, moved)) = row(
                    dev,
                    ty,
                    shape,
                    quick,
                    flusher.as_deref_mut().filter(|_| dev.kind() == tilekit::BackendKind::Cpu),
                )
                .with_context(what)?
                else {
                    break;
                };
                let gbs = moved as f64 / t / 1e9;
                let copy_gbs = moved as f64 / copy / 1e9;
                let flops = 2.0 * (m * n * k) as f64;
                let gflops = flops / t / 1e9;
                let att = peak(dev).map_or("-".into(), |p| {
                    format!("{:.0}%", 100.0 * attainable_fraction(gflops, flops, moved as f64, copy_gbs, p))
                });
                let vs_f16 = f16_row(rows, dev, shape).map_or("-".into(), |f| format!("{:.2}x", f / t));
                println!(
                    "   {:<8} {:<6} {:>16} {:>10.2} {:>9.3} {:>8.2} {:>10.2} {:>5.0}% {:>9.1} {:>5} {:>8}",
                    dev.kind().to_string(),
                    ty.name(),
                    format!("{m}x{n}x{k}"),
                    ty.tensor_bytes(&[n, k])? as f64 / 1e6,
                    t * 1e3,
                    gbs,
                    copy_gbs,
                    100.0 * gbs / copy_gbs,
                    gflops,
                    att,
                    vs_f16
                );
            }
        }
    }
    Ok(())
}
