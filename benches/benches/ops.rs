//! Criterion benches of tilekit's three ops on the CPU backend and on wgpu (lavapipe where there
//! is no hardware adapter; a printed skip line where there is no adapter at all), at small sizes.
//!
//! `cargo bench -p tilekit-benches` runs them; `cargo xtask bench` is the full comparative bench.
//!
//! Throughput, as criterion reports it:
//! - matmul and depthwise conv: `ElementsAndBytes`, where **elements are floating-point
//!   operations** (2 per multiply-add: criterion's "elem/s" reads as FLOP/s) and bytes are the
//!   least memory traffic (every input read once, the output written once);
//! - activation: `Bytes` only (it is memory-bound; its FLOPs say nothing).
//!
//! Every bench checks its output against tilekit's f64 CPU reference before it is timed, and
//! each iteration ends with a device synchronisation, so the time is the op's as a caller
//! waiting for it sees it.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use tilekit::{Activation, ActivationDesc, Conv2dOptions, DType, Device, Layout, MatmulDesc, Tensor};
use tilekit_benches::{devices, inputs, matches};
use tilekit_kernels::reference;

const DTYPE: DType = DType::F32;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Uploads `data`, or prints why the bench is skipped.
fn upload(dev: &Device, shape: &[usize], data: &[f32]) -> Option<Tensor> {
    dev.tensor_from_f32(shape, DTYPE, data).map_err(|e| println!("SKIP {}: upload failed: {e}", dev.kind())).ok()
}

/// What a check needs besides the reference: the activation, the reduction length and a bound
/// on every output's `Σ|terms|` (see [`matches`]).
struct Rule {
    activation: Activation,
    k: usize,
    magnitude: f64,
}

/// Runs `op` once and checks it against `want`; prints and returns false when it does not match.
fn checked(name: &str, dev: &Device, op: &dyn Fn() -> tilekit::Result<Tensor>, want: &[f64], rule: Rule) -> bool {
    let got = op().and_then(|t| t.to_f32_vec());
    let Rule { activation, k, magnitude } = rule;
    match got.map_err(|e| e.to_string()).and_then(|g| matches(&g, want, DTYPE, activation, k, magnitude)) {
        Ok(()) => true,
        Err(e) => {
            println!("SKIP {name} on {}: output does not match the reference ({e})", dev.kind());
            false
        }
    }
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    for dev in devices() {
        for &s in &[64usize, 128] {
            let (a, b, out) = (inputs(s * s, 1), inputs(s * s, 2), dev.zeros(&[s, s], DTYPE));
            let (Some(ta), Some(tb), Ok(out)) = (upload(&dev, &[s, s], &a), upload(&dev, &[s, s], &b), out) else {
                continue;
            };
            let desc = MatmulDesc::new(s, s, s);
            let mut want = vec![0.0; s * s];
            reference::matmul(&desc, &f64s(&a), &f64s(&b), None, None, &mut want);
            let run = || dev.matmul_into(&desc, &ta, &tb, None, None, &out).map(|()| out.clone());
            // Inputs in [-1, 1): Σ|a||b| < K.
            if !checked("matmul", &dev, &run, &want, Rule { activation: Activation::None, k: s, magnitude: s as f64 }) {
                continue;
            }
            group.throughput(Throughput::ElementsAndBytes {
                elements: desc.flops() as u64, // FLOPs, not elements of a tensor
                bytes: (3 * s * s * DTYPE.size_bytes()) as u64,
            });
            group.bench_function(BenchmarkId::new(dev.kind().name(), format!("{s}x{s}x{s}")), |bench| {
                bench.iter(|| {
                    let r = dev.matmul_into(&desc, &ta, &tb, None, None, &out).and_then(|()| dev.synchronize());
                    if let Err(e) = r {
                        println!("matmul failed while timing: {e}");
                    }
                })
            });
        }
    }
    group.finish();
}

fn depthwise_conv(c: &mut Criterion) {
    let mut group = c.benchmark_group("depthwise_conv2d");
    // A MobileNetV2 block at a small size: 3×3, padding 1, bias, ReLU6, both layouts.
    let (n, ch, hw) = (1usize, 32usize, 28usize);
    for dev in devices() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let shape = match layout {
                Layout::Nchw => [n, ch, hw, hw],
                Layout::Nhwc => [n, hw, hw, ch],
                other => unimplemented!("{other:?}"),
            };
            let (x, w, bias) = (inputs(n * ch * hw * hw, 3), inputs(ch * 9, 4), inputs(ch, 5));
            let (Some(tx), Some(tw), Some(tb)) =
                (upload(&dev, &shape, &x), upload(&dev, &[ch, 1, 3, 3], &w), upload(&dev, &[ch], &bias))
            else {
                continue;
            };
            let opts = Conv2dOptions::default().padding([1; 4]).layout(layout).activation(Activation::Relu6);
            let Ok(out) = dev.depthwise_conv2d(&tx, &tw, Some(&tb), &opts) else {
                println!("SKIP depthwise_conv2d on {}: the op failed", dev.kind());
                continue;
            };
            let desc = tilekit::Conv2dDesc::mobilenet_v2_block(n, ch, hw, 1, layout);
            let mut want = vec![0.0; out.len()];
            reference::depthwise_conv2d(&desc, &f64s(&x), &f64s(&w), Some(&f64s(&bias)), &mut want);
            let run = || dev.depthwise_conv2d_into(&tx, &tw, Some(&tb), &opts, &out).map(|()| out.clone());
            // Nine taps and a bias, all in [-1, 1).
            let rule = Rule { activation: Activation::Relu6, k: 9, magnitude: 10.0 };
            if !checked("depthwise_conv2d", &dev, &run, &want, rule) {
                continue;
            }
            let traffic = (2 * x.len() + w.len() + bias.len()) * DTYPE.size_bytes();
            group.throughput(Throughput::ElementsAndBytes { elements: desc.flops() as u64, bytes: traffic as u64 });
            let name = format!("{n}x{ch}x{hw}x{hw} {}", if layout == Layout::Nchw { "nchw" } else { "nhwc" });
            group.bench_function(BenchmarkId::new(dev.kind().name(), name), |bench| {
                bench.iter(|| {
                    let r =
                        dev.depthwise_conv2d_into(&tx, &tw, Some(&tb), &opts, &out).and_then(|()| dev.synchronize());
                    if let Err(e) = r {
                        println!("depthwise_conv2d failed while timing: {e}");
                    }
                })
            });
        }
    }
    group.finish();
}

fn activation(c: &mut Criterion) {
    let mut group = c.benchmark_group("activation");
    // GPT-2's hidden size over 64 tokens, with the bias of the preceding linear layer.
    let (rows, cols) = (64usize, 768usize);
    for dev in devices() {
        for act in [Activation::Gelu, Activation::GeluTanh] {
            let (x, bias) = (inputs(rows * cols, 6), inputs(cols, 7));
            let (Some(tx), Some(tb), Ok(out)) =
                (upload(&dev, &[rows, cols], &x), upload(&dev, &[cols], &bias), dev.zeros(&[rows, cols], DTYPE))
            else {
                continue;
            };
            let desc = ActivationDesc::new(rows * cols, Some(cols), act);
            let mut want = vec![0.0; rows * cols];
            reference::activation(&desc, &f64s(&x), Some(&f64s(&bias)), &mut want);
            let run = || dev.activation_into(&tx, Some(&tb), act, &out).map(|()| out.clone());
            // x and the bias in [-1, 1).
            if !checked("activation", &dev, &run, &want, Rule { activation: act, k: 0, magnitude: 2.0 }) {
                continue;
            }
            // Read x and bias, write out: bytes only, the op is memory-bound.
            group.throughput(Throughput::Bytes(((2 * rows * cols + cols) * DTYPE.size_bytes()) as u64));
            group.bench_function(
                BenchmarkId::new(dev.kind().name(), format!("{rows}x{cols} bias+{}", act.name())),
                |bench| {
                    bench.iter(|| {
                        let r = dev.activation_into(&tx, Some(&tb), act, &out).and_then(|()| dev.synchronize());
                        if let Err(e) = r {
                            println!("activation failed while timing: {e}");
                        }
                    })
                },
            );
        }
    }
    group.finish();
}

fn config() -> Criterion {
    // Short runs: lavapipe is ~100x slower than native code, and CI has two cores.
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = matmul, depthwise_conv, activation
}
criterion_main!(benches);
