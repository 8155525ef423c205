//! `llama_mlp`: one Llama MLP block, `y = x + W_down·(silu(W_gate·x) ⊙ W_up·x)`, with the
//! weights of block N of a GGUF file, on any tilekit backend.
//!
//! ```text
//! cargo run --release -p tilekit --example llama_mlp -- --gguf FILE --layer N \
//!     --input X.npy --out Y.npy [--backend auto|cpu|wgpu|cuda]
//! ```
//!
//! - The weights are `blk.N.ffn_gate.weight`, `blk.N.ffn_up.weight` (`[F, K]` in numpy order)
//!   and `blk.N.ffn_down.weight` (`[K, F]`), in any type tilekit reads (F32, F16, BF16, Q8_0,
//!   Q4_0, Q4_1, Q4_K, Q6_K). Dense weights of one type run in that dtype; anything else runs in
//!   f32. Quantized weights stay quantized on the device where it has quantized kernels (CPU
//!   and CUDA today) and are dequantized on the host elsewhere (see `mlp.rs`, `matmul_b_operand`).
//! - `X.npy` is a C-order float32 (or float16) array of shape `[K]` or `[M, K]`; `Y.npy` is
//!   float32 of the same shape.
//! - Any problem is one line on stderr (naming the tensor or file) and exit status 1.

mod mlp;

use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use tilekit::gguf::GgufFile;
use tilekit::{Device, WgpuOptions};

struct Args {
    gguf: PathBuf,
    layer: usize,
    input: PathBuf,
    out: PathBuf,
    backend: String,
}

const USAGE: &str = "usage: llama_mlp --gguf FILE --layer N --input X.npy --out Y.npy [--backend auto|cpu|wgpu|cuda]";

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut gguf, mut layer, mut input, mut out, mut backend) = (None, None, None, None, "auto".to_string());
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value; {USAGE}"));
        match flag.as_str() {
            "--gguf" => gguf = Some(PathBuf::from(value()?)),
            "--layer" => {
                let v = value()?;
                layer = Some(v.parse().map_err(|_| format!("--layer {v:?} is not a block number"))?);
            }
            "--input" => input = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--backend" => backend = value()?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let need = |v: Option<PathBuf>, f: &str| v.ok_or_else(|| format!("{f} is required; {USAGE}"));
    Ok(Args {
        gguf: need(gguf, "--gguf")?,
        layer: layer.ok_or_else(|| format!("--layer is required; {USAGE}"))?,
        input: need(input, "--input")?,
        out: need(out, "--out")?,
        backend,
    })
}

fn device(name: &str) -> Result<Device, String> {
    let dev = match name {
        "auto" => Device::auto(),
        "cpu" => Ok(Device::cpu()),
        // Asked for by name: a software adapter (lavapipe) is accepted too.
        "wgpu" => Device::wgpu(&WgpuOptions::allow_software()),
        "cuda" => Device::cuda(0),
        other => return Err(format!("--backend {other:?}: expected auto, cpu, wgpu or cuda")),
    };
    dev.map_err(|e| format!("backend {name}: {e}"))
}

/// Reads a C-order float32 or float16 `.npy` file.
fn read_npy(path: &Path) -> Result<(Vec<usize>, Vec<f32>), String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {}", path.display(), e.to_string().replace('\n', " "));
    let bytes = std::fs::read(path).map_err(|e| what(&e))?;
    let file = npyz::NpyFile::new(&bytes[..]).map_err(|e| what(&e))?;
    if file.order() == npyz::Order::Fortran {
        return Err(what(&"a Fortran-order array; save a C-order one"));
    }
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let size = match file.dtype() {
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float => ts.size_field() as usize,
        other => return Err(what(&format!("dtype {} is not float32 or float16", other.descr()))),
    };
    // A header may promise more elements than the file holds: refuse before allocating.
    if shape.iter().try_fold(size, |a, &d| a.checked_mul(d)).is_none_or(|n| n > bytes.len()) {
        return Err(what(&format!("shape {shape:?} does not fit the file's {} bytes", bytes.len())));
    }
    let data = match size {
        4 => file.into_vec::<f32>().map_err(|e| what(&e))?,
        2 => file.into_vec::<half::f16>().map_err(|e| what(&e))?.into_iter().map(f32::from).collect(),
        _ => return Err(what(&"only float32 and float16 arrays are read")),
    };
    Ok((shape, data))
}

/// Writes a C-order float32 `.npy` file.
fn write_npy(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut bytes = Vec::new();
    let mut w =
        npyz::WriteOptions::new().default_dtype().shape(&shape).writer(&mut bytes).begin_nd().map_err(|e| what(&e))?;
    w.extend(data.iter().copied()).map_err(|e| what(&e))?;
    w.finish().map_err(|e| what(&e))?;
    std::fs::write(path, bytes).map_err(|e| what(&e))
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let file = GgufFile::open(&args.gguf).map_err(|e| format!("{}: {e}", args.gguf.display()))?;
    let (shape, x) = read_npy(&args.input)?;
    let dev = device(&args.backend)?;
    let block = mlp::Mlp::load(&dev, &file, args.layer)?;
    let y = block.forward(&dev, &shape, &x)?;
    write_npy(&args.out, &shape, &y)?;
    eprintln!(
        "llama_mlp: block {} (K = {}, F = {}, {}) on {}: wrote {}",
        args.layer,
        block.k,
        block.f,
        block.dtype,
        dev.description(),
        args.out.display()
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
