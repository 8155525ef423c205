//! `cargo xtask tune`: times every candidate tile configuration of the wgpu matmul and
//! depthwise convolution on the bench's shapes and writes the winners to the tune cache.
//!
//! The shapes mirror `cargo xtask bench`'s `square`, `decode` and `mobilenet` suites (the
//! activations have nothing to tune). The cache is the one the library reads
//! (`TILEKIT_TUNE_CACHE`, else the user's cache folder; `--cache` overrides); with
//! `TILEKIT_TUNE` unset the library uses its entries from then on, and an application can ship
//! the file and point `TILEKIT_TUNE_CACHE` at it.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use tilekit::{Activation, Conv2dDesc, DType, Device, Layout, MatmulDesc, TuneReport, WgpuOptions};

/// Arguments of `cargo xtask tune`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// f32, f16, bf16 or all.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// The small `--quick` bench sizes (what a software adapter finishes in a minute or two).
    #[arg(long)]
    quick: bool,
    /// Only these suites (comma-separated: square, decode, mobilenet).
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Only adapters whose name contains this (case-insensitive).
    #[arg(long)]
    adapter: Option<String>,
    /// The cache file to write (default: `TILEKIT_TUNE_CACHE`, else the user's cache folder).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// After tuning, run every shape once with its winner under the profiler and write the
    /// Chrome trace here (open it in Perfetto or chrome://tracing).
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// The suites with something to tune.
const SUITES: [&str; 3] = ["square", "decode", "mobilenet"];

/// One shape to tune.
#[derive(Debug, Clone)]
enum Shape {
    Matmul(MatmulDesc),
    Conv(Conv2dDesc),
}

fn matmul(m: usize, n: usize, k: usize, bias: bool, activation: Activation) -> Shape {
    let mut d = MatmulDesc::new(m, n, k);
    d.bias_offset = bias.then_some(0);
    d.activation = activation;
    Shape::Matmul(d)
}

/// MobileNetV2's depthwise block: 3×3, padding 1, bias, ReLU6 (as in the bench).
fn conv(batch: usize, channels: usize, size: usize, stride: usize, layout: Layout) -> Shape {
    Shape::Conv(Conv2dDesc::mobilenet_v2_block(batch, channels, size, stride, layout))
}

/// The bench's shapes per suite, at the bench's scale for this device.
fn shapes(quick: bool, gpu: bool) -> Vec<(&'static str, String, Shape)> {
    let mut out = Vec::new();
    let squares: &[usize] = match (quick, gpu) {
        (true, _) => &[64, 128, 256],
        (false, false) => &[64, 128, 256, 512, 1024],
        (false, true) => &[256, 512, 1024, 2048, 4096],
    };
    for &s in squares {
        out.push(("square", format!("{s}x{s}x{s}"), matmul(s, s, s, false, Activation::None)));
    }
    out.push(("square", "256x256x256 +bias gelu".into(), matmul(256, 256, 256, true, Activation::Gelu)));
    let decode: &[(usize, usize, usize)] = match (quick, gpu) {
        (true, _) => &[(1, 1024, 1024), (16, 1024, 1024)],
        (false, false) => &[(1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096)],
        (false, true) => &[(1, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (1, 11008, 4096)],
    };
    for &(m, n, k) in decode {
        out.push(("decode", format!("{m}x{n}x{k}"), matmul(m, n, k, false, Activation::None)));
    }
    let layers: &[(usize, usize, usize)] = if quick {
        &[(56, 144, 1), (28, 192, 2), (14, 576, 1), (7, 960, 1)]
    } else {
        &[(112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (14, 384, 1), (14, 576, 1), (7, 960, 1)]
    };
    let batches: &[usize] = if gpu && !quick { &[1, 32] } else { &[1] };
    let layouts: &[Layout] = if quick { &[Layout::Nhwc, Layout::Nchw] } else { &[Layout::Nchw, Layout::Nhwc] };
    for &batch in batches {
        for &layout in layouts {
            for &(size, channels, stride) in layers {
                let name = format!("{batch}x{channels}x{size}² s{stride} {}", layout.name());
                out.push(("mobilenet", name, conv(batch, channels, size, stride, layout)));
            }
        }
    }
    out
}

fn parse_dtypes(s: &str) -> Result<Vec<DType>> {
    if s == "all" {
        return Ok(vec![DType::F32, DType::F16, DType::Bf16]);
    }
    s.split(',')
        .map(|d| {
            DType::parse(d.trim()).with_context(|| format!("unknown dtype {d:?} (expected f32, f16, bf16 or all)"))
        })
        .collect()
}

pub fn run(args: Args) -> Result<()> {
    let dtypes = parse_dtypes(&args.dtype)?;
    for s in &args.suite {
        if !SUITES.contains(&s.as_str()) {
            bail!("unknown suite {s:?} (expected {})", SUITES.join(", "));
        }
    }
    let mut opts = WgpuOptions::allow_software();
    opts.adapter_name = args.adapter.clone();
    let dev = Device::wgpu(&opts).context("autotuning needs a wgpu adapter")?;
    if let Some(path) = &args.cache {
        dev.set_tune_cache_path(Some(path.clone()));
    }
    let cache = dev.tune_cache_path().context("no cache file: set TILEKIT_TUNE_CACHE, HOME or pass --cache")?;
    println!("== tuning on {}", dev.description());
    println!("   cache: {}", cache.display());
    let gpu = !dev.is_software();
    let mut summary = Vec::new();
    let mut ran = Vec::new();
    for &dtype in &dtypes {
        if let Err(e) = dev.check_dtype(dtype) {
            println!("   SKIP {dtype}: {e}");
            continue;
        }
        for (suite, name, shape) in shapes(args.quick, gpu) {
            if !args.suite.is_empty() && !args.suite.iter().any(|s| s == suite) {
                continue;
            }
            let report = match &shape {
                Shape::Matmul(d) => dev.tune_matmul(d, dtype),
                Shape::Conv(d) => dev.tune_depthwise_conv2d(d, dtype),
            };
            match report {
                Ok(r) => {
                    print_report(suite, &name, dtype, &r);
                    summary.push((suite, name, dtype, r));
                    ran.push((shape, dtype));
                }
                Err(e) => println!("\n-- {suite} {name} {dtype}: FAILED: {e}"),
            }
        }
    }
    println!("\n== winners ({} keys written to {})", summary.len(), cache.display());
    println!(
        "{:<10} {:<26} {:<5} {:<28} {:>12} {:>12} {:>8}",
        "suite", "shape", "dtype", "winner", "µs", "default µs", "speedup"
    );
    for (suite, name, dtype, r) in &summary {
        println!(
            "{:<10} {:<26} {:<5} {:<28} {:>12.1} {:>12.1} {:>7.2}x",
            suite,
            name,
            dtype.name(),
            r.winner,
            r.winner_micros,
            r.default_micros,
            r.default_micros / r.winner_micros.max(1e-9)
        );
    }
    if let Some(path) = &args.trace {
        write_trace(&dev, &ran, path)?;
    }
    Ok(())
}

/// Runs each tuned shape once (with the cached winner) inside a profile and writes the trace.
fn write_trace(dev: &Device, shapes: &[(Shape, DType)], path: &std::path::Path) -> Result<()> {
    dev.set_tune_mode(tilekit::TuneMode::Cached);
    let (_, profile) = dev.profile(|| {
        for (shape, dtype) in shapes {
            match shape {
                Shape::Matmul(d) => {
                    let a = dev.zeros(&[d.m, d.k], *dtype)?;
                    let b = dev.zeros(&[d.k, d.n], *dtype)?;
                    let bias = d.bias_offset.map(|_| dev.zeros(&[d.n], *dtype)).transpose()?;
                    let out = dev.zeros(&[d.m, d.n], *dtype)?;
                    dev.matmul_into(d, &a, &b, bias.as_ref(), None, &out)?;
                }
                Shape::Conv(d) => {
                    let input = dev.zeros(&d.input_shape(), *dtype)?;
                    let weight = dev.zeros(&d.weight_shape(), *dtype)?;
                    let bias = dev.zeros(&[d.out_channels()], *dtype)?;
                    let opts = tilekit::Conv2dOptions::default()
                        .stride([d.stride_h, d.stride_w])
                        .padding([d.pad_top, d.pad_bottom, d.pad_left, d.pad_right])
                        .dilation([d.dilation_h, d.dilation_w])
                        .layout(d.layout)
                        .activation(d.activation);
                    dev.depthwise_conv2d(&input, &weight, Some(&bias), &opts)?;
                }
            }
        }
        Ok(())
    })?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, profile.to_chrome_trace()).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "\nwrote {} ({} kernel launches, {:.1} ms of kernel time)",
        path.display(),
        profile.records.len(),
        profile.total_us() / 1e3
    );
    Ok(())
}

fn print_report(suite: &str, name: &str, dtype: DType, r: &TuneReport) {
    println!("\n-- {suite} {name} {dtype}");
    println!("   key: {}", r.key);
    for (i, (label, t)) in r.candidates.iter().enumerate() {
        let mark = if *label == r.winner { "*" } else { " " };
        let default = if i == 0 { " (default)" } else { "" };
        match t {
            Ok(us) => println!("   {mark} {label:<28} {us:>12.1} µs{default}"),
            Err(e) => println!("   {mark} {label:<28} {:>12}   {e}{default}", "-"),
        }
    }
}
