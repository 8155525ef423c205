//! MobileNetV2 on tilekit: torchvision weights from a safetensors file, an image batch from a
//! `.npy` file, logits to a `.npy` file.
//!
//! ```text
//! cargo run --release -p tilekit --example mobilenet_v2 -- --weights W.safetensors --input X.npy \
//!     --out LOGITS.npy [--backend auto|cpu|wgpu|cuda] [--dtype f32|f16|bf16] [--layout nchw|nhwc] \
//!     [--unfused] [--top 5]
//! ```
//!
//! - `W.safetensors`: `safetensors.torch.save_file(torchvision.models.mobilenet_v2(weights=...)
//!   .state_dict(), "W.safetensors")`. BatchNorm is folded into the convs at load.
//! - `X.npy`: `[N, 3, H, W]` float32, already normalised, `H, W >= 32`.
//! - `LOGITS.npy`: `[N, 1000]` float32. `--top k` prints the k best classes per image.
//!
//! Any problem (a missing or misshapen tensor, a file that is not safetensors, a bad input) is
//! one line on stderr and a non-zero exit status. The model lives in the `tilekit-models` crate.

use std::path::PathBuf;
use std::process::ExitCode;
use tilekit::{BackendKind, DType, Device, Layout, WgpuOptions};
use tilekit_models::{MobileNetV2, Weights, npy};

const USAGE: &str = "usage: mobilenet_v2 --weights W.safetensors --input X.npy --out LOGITS.npy \
[--backend auto|cpu|wgpu|cuda] [--dtype f32|f16|bf16] [--layout nchw|nhwc] [--unfused] [--top K]";

#[derive(Debug)]
struct Args {
    weights: PathBuf,
    input: PathBuf,
    out: PathBuf,
    backend: String,
    dtype: DType,
    layout: Layout,
    unfused: bool,
    top: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut weights, mut input, mut out) = (None, None, None);
    let (mut backend, mut dtype, mut layout, mut unfused, mut top) =
        ("auto".to_string(), DType::F32, Layout::Nchw, false, 0usize);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value; {USAGE}"));
        match flag.as_str() {
            "--weights" => weights = Some(PathBuf::from(value()?)),
            "--input" => input = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--backend" => backend = value()?,
            "--dtype" => {
                let v = value()?;
                dtype = DType::parse(&v).ok_or_else(|| format!("--dtype {v}: expected f32, f16 or bf16"))?;
            }
            "--layout" => {
                let v = value()?;
                layout = Layout::parse(&v).ok_or_else(|| format!("--layout {v}: expected nchw or nhwc"))?;
            }
            "--unfused" => unfused = true,
            "--top" => {
                let v = value()?;
                top = v.parse().map_err(|_| format!("--top {v}: expected a count"))?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    let need = |v: Option<PathBuf>, name: &str| v.ok_or_else(|| format!("{name} is required; {USAGE}"));
    Ok(Args {
        weights: need(weights, "--weights")?,
        input: need(input, "--input")?,
        out: need(out, "--out")?,
        backend,
        dtype,
        layout,
        unfused,
        top,
    })
}

fn device(name: &str) -> Result<Device, String> {
    let r = match name {
        "auto" => Device::auto(),
        "cpu" => Ok(Device::cpu()),
        // Software adapters (lavapipe) are accepted when asked for by name.
        "wgpu" => Device::wgpu(&WgpuOptions::allow_software()),
        "cuda" => Device::with_backend(BackendKind::Cuda),
        other => return Err(format!("--backend {other}: expected auto, cpu, wgpu or cuda")),
    };
    r.map_err(|e| format!("backend {name}: {e}"))
}

fn run(args: &Args) -> Result<(), String> {
    let dev = device(&args.backend)?;
    let weights = Weights::load(&args.weights).map_err(|e| format!("{}: {e}", args.weights.display()))?;
    let (shape, data) = npy::read(&args.input).map_err(|e| e.to_string())?;
    let mut net = MobileNetV2::new(&dev, &weights, args.dtype, args.layout).map_err(|e| e.to_string())?;
    // Each block is one fused op unless `--unfused` asks for the three-op chain.
    net.set_fused(!args.unfused);
    let logits = net.run(&shape, &data).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let classes = tilekit_models::arch::NUM_CLASSES;
    npy::write(&args.out, &[shape[0], classes], &logits).map_err(|e| e.to_string())?;
    eprintln!(
        "mobilenet_v2: {} image(s) {}x{} on {} ({}, {}) -> {}",
        shape[0],
        shape[2],
        shape[3],
        dev.description(),
        args.dtype,
        args.layout.name(),
        args.out.display()
    );
    if args.top > 0 {
        for (i, row) in logits.chunks(classes).enumerate() {
            let mut idx: Vec<usize> = (0..classes).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let best: Vec<String> = idx.iter().take(args.top).map(|&c| format!("{c}:{:.4}", row[c])).collect();
            println!("image {i}: {}", best.join(" "));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
