//! `cargo xtask run`: one op on `.npy` files.
//!
//! This command line is a contract (issue 2): scripts in other languages call it to check
//! tilekit against their own framework, so flags are only ever added, never renamed.
//!
//! ```text
//! cargo xtask run matmul --a A.npy --b B.npy [--bias BIAS.npy] [--c C.npy] [--alpha F] [--beta F]
//!     [--transpose-a] [--transpose-b] [--activation none|relu|relu6|gelu|gelu-tanh|silu]
//!     [--dtype f32|f16|bf16] [--backend auto|cpu|wgpu|cuda] --out OUT.npy
//! cargo xtask run depthwise-conv2d --input X.npy --weight W.npy [--bias B.npy] [--stride SH,SW]
//!     [--padding TOP,BOTTOM,LEFT,RIGHT] [--dilation DH,DW] [--layout nchw|nhwc] [--activation ...]
//!     [--dtype ...] [--backend ...] --out Y.npy
//! cargo xtask run activation --input X.npy [--bias B.npy] --activation ... [--dtype ...]
//!     [--backend ...] --out Y.npy
//! ```
//!
//! Inputs are C-order float32 (or float16) arrays; `--dtype` is the storage precision on the
//! device (inputs are rounded to nearest even); the output is always float32.
//!
//! `matmul --b FILE.gguf:TENSOR_NAME` reads B from a GGUF file instead (memory-mapped). Its
//! numpy-order shape is `[N, K]` (GGUF's `ne0 = K`), so it goes with `--transpose-b`. A dense
//! F32, F16 or BF16 tensor is converted losslessly to `--dtype`, which must be at least as wide
//! (f32 takes all three; f16 and bf16 take only themselves); a quantized one (Q8_0, Q4_0, Q4_1,
//! Q4_K, Q6_K) stays quantized and runs through `Device::matmul_quant`, with A in `--dtype`.

use crate::npy;
use anyhow::{Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use std::path::{Path, PathBuf};
use tilekit::gguf::GgufFile;
use tilekit::{Activation, BackendKind, Conv2dOptions, DType, Device, Layout, MatmulOptions, QTensor, Tensor};

/// Arguments of `cargo xtask run`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    op: Op,
}

#[derive(Subcommand, Debug)]
enum Op {
    /// out = act(alpha · op(A) · op(B) + bias + beta · C).
    Matmul(MatmulArgs),
    /// Depthwise 2-D convolution with optional bias and fused activation.
    #[command(name = "depthwise-conv2d")]
    DepthwiseConv2d(ConvArgs),
    /// out = act(x + bias), the bias broadcast along the last dimension.
    Activation(ActivationArgs),
}

/// The flags every op shares.
#[derive(ClapArgs, Debug)]
struct Common {
    /// Storage precision on the device: f32, f16 or bf16 (inputs are rounded to nearest even).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Backend: auto (the probe of `Device::auto`, honouring TILEKIT_BACKEND), cpu, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Where to write the result (float32 .npy).
    #[arg(long)]
    out: PathBuf,
}

#[derive(ClapArgs, Debug)]
struct MatmulArgs {
    /// A: [M, K] or [batch, M, K] ([K, M] / [batch, K, M] with --transpose-a).
    #[arg(long)]
    a: PathBuf,
    /// B: [K, N] or [batch, K, N] ([N, K] / [batch, N, K] with --transpose-b), or
    /// FILE.gguf:TENSOR_NAME, a GGUF tensor [N, K] (with --transpose-b).
    #[arg(long)]
    b: PathBuf,
    /// A bias of N elements, added to every row.
    #[arg(long)]
    bias: Option<PathBuf>,
    /// A residual C: [M, N] or [batch, M, N].
    #[arg(long)]
    c: Option<PathBuf>,
    /// Scale of the product.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    alpha: f32,
    /// Scale of the residual C.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    beta: f32,
    /// A is stored transposed.
    #[arg(long)]
    transpose_a: bool,
    /// B is stored transposed.
    #[arg(long)]
    transpose_b: bool,
    /// none, relu, relu6, gelu (erf form), gelu-tanh or silu.
    #[arg(long, default_value = "none", value_parser = parse_activation)]
    activation: Activation,
    #[command(flatten)]
    common: Common,
}

#[derive(ClapArgs, Debug)]
struct ConvArgs {
    /// Input: [N, C, H, W] (nchw) or [N, H, W, C] (nhwc).
    #[arg(long)]
    input: PathBuf,
    /// Weight: [C·m, 1, kh, kw] in both layouts (m is the channel multiplier).
    #[arg(long)]
    weight: PathBuf,
    /// A bias of C·m elements.
    #[arg(long)]
    bias: Option<PathBuf>,
    /// Stride SH,SW (one number sets both).
    #[arg(long, default_value = "1,1", value_parser = parse_pair)]
    stride: [usize; 2],
    /// Zero padding TOP,BOTTOM,LEFT,RIGHT (one number sets all four).
    #[arg(long, default_value = "0,0,0,0", value_parser = parse_quad)]
    padding: [usize; 4],
    /// Dilation DH,DW (one number sets both).
    #[arg(long, default_value = "1,1", value_parser = parse_pair)]
    dilation: [usize; 2],
    /// nchw or nhwc (the output has the input's layout).
    #[arg(long, default_value = "nchw", value_parser = parse_layout)]
    layout: Layout,
    /// none, relu, relu6, gelu (erf form), gelu-tanh or silu.
    #[arg(long, default_value = "none", value_parser = parse_activation)]
    activation: Activation,
    #[command(flatten)]
    common: Common,
}

#[derive(ClapArgs, Debug)]
struct ActivationArgs {
    /// Input of any shape.
    #[arg(long)]
    input: PathBuf,
    /// A bias as long as the input's last dimension.
    #[arg(long)]
    bias: Option<PathBuf>,
    /// none, relu, relu6, gelu (erf form), gelu-tanh or silu.
    #[arg(long, value_parser = parse_activation)]
    activation: Activation,
    #[command(flatten)]
    common: Common,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| format!("unknown dtype {s:?} (expected f32, f16 or bf16)"))
}

fn parse_activation(s: &str) -> Result<Activation, String> {
    Activation::parse(s)
        .ok_or_else(|| format!("unknown activation {s:?} (expected none, relu, relu6, gelu, gelu-tanh, silu)"))
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    Layout::parse(s).ok_or_else(|| format!("unknown layout {s:?} (expected nchw or nhwc)"))
}

/// Comma-separated non-negative integers; a single number is repeated `N` times.
fn parse_list<const N: usize>(s: &str) -> Result<[usize; N], String> {
    let parts: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|_| format!("{p:?} in {s:?} is not a non-negative integer")))
        .collect::<Result<_, _>>()?;
    match parts.len() {
        1 => Ok([parts[0]; N]),
        n if n == N => {
            let mut out = [0; N];
            out.copy_from_slice(&parts);
            Ok(out)
        }
        n => Err(format!("{s:?} has {n} numbers; expected {N} (or one for all)")),
    }
}

fn parse_pair(s: &str) -> Result<[usize; 2], String> {
    parse_list::<2>(s)
}

fn parse_quad(s: &str) -> Result<[usize; 4], String> {
    parse_list::<4>(s)
}

/// The device `--backend` names, ready for `dtype`.
fn device(backend: &str, dtype: DType) -> Result<Device> {
    let dev = match BackendKind::parse(backend)? {
        None => Device::auto()?,
        Some(kind) => Device::with_backend(kind)?,
    };
    dev.check_dtype(dtype).with_context(|| format!("--dtype {dtype} on the {} backend", dev.kind()))?;
    Ok(dev)
}

/// Reads `path` and uploads it in `dtype`.
fn load(dev: &Device, dtype: DType, flag: &str, path: &Path) -> Result<Tensor> {
    let arr = npy::read(path).with_context(|| format!("--{flag}"))?;
    dev.tensor_from_f32(&arr.shape, dtype, &arr.data).with_context(|| format!("--{flag} {}", path.display()))
}

/// The B operand of `run matmul`: dense, or a quantized GGUF tensor.
enum B {
    Dense(Tensor),
    Quant(QTensor),
}

/// `FILE.gguf:TENSOR_NAME` split at the colon after `.gguf`, if `path` has that form.
fn gguf_spec(path: &Path) -> Option<(PathBuf, String)> {
    let s = path.to_str()?;
    let at = s.to_ascii_lowercase().rfind(".gguf:")?;
    let (file, name) = (&s[..at + 5], &s[at + 6..]);
    Some((PathBuf::from(file), name.to_string()))
}

/// Reads `--b`: a `.npy` file, or a tensor of a GGUF file (see the module documentation).
fn load_b(dev: &Device, dtype: DType, path: &Path) -> Result<B> {
    let Some((file, name)) = gguf_spec(path) else {
        return load(dev, dtype, "b", path).map(B::Dense);
    };
    let ctx = || format!("--b {}", path.display());
    let gguf = GgufFile::open(&file).with_context(ctx)?;
    let t = gguf.tensor(&name).with_context(ctx)?;
    let ty = t.ggml_type();
    if ty.is_quantized() {
        return Ok(B::Quant(dev.quant_tensor_from_gguf(&t).with_context(ctx)?));
    }
    let stored = ty.dense_dtype().with_context(|| format!("{}: {ty} is neither dense nor quantized", ctx()))?;
    // Lossless only into a type at least as wide: f32 holds every f16 and bf16; f16 and bf16
    // hold only themselves.
    if stored != dtype && dtype != DType::F32 {
        anyhow::bail!(
            "{}: tensor {name:?} is stored as {ty}; --dtype {dtype} cannot hold it exactly (use --dtype f32{})",
            ctx(),
            if stored == DType::F32 { "" } else { " or the stored type" }
        );
    }
    let values = t.dequantize().with_context(ctx)?;
    Ok(B::Dense(dev.tensor_from_f32(t.shape(), dtype, &values).with_context(ctx)?))
}

fn load_opt(dev: &Device, dtype: DType, flag: &str, path: Option<&PathBuf>) -> Result<Option<Tensor>> {
    path.map(|p| load(dev, dtype, flag, p)).transpose()
}

fn save(out: &Path, t: &Tensor) -> Result<()> {
    let data = t.to_f32_vec().context("reading the result back")?;
    npy::write(out, t.shape(), &data)
}

pub fn run(args: Args) -> Result<()> {
    match args.op {
        Op::Matmul(a) => {
            let c = &a.common;
            let dev = device(&c.backend, c.dtype)?;
            let ta = load(&dev, c.dtype, "a", &a.a)?;
            let tb = load_b(&dev, c.dtype, &a.b)?;
            let bias = load_opt(&dev, c.dtype, "bias", a.bias.as_ref())?;
            let cc = load_opt(&dev, c.dtype, "c", a.c.as_ref())?;
            let opts = MatmulOptions::default()
                .trans_a(a.transpose_a)
                .trans_b(a.transpose_b)
                .alpha(a.alpha)
                .beta(a.beta)
                .bias(bias.as_ref())
                .c(cc.as_ref())
                .activation(a.activation);
            let y = match &tb {
                B::Dense(tb) => dev.matmul(&ta, tb, &opts)?,
                B::Quant(qw) => dev.matmul_quant(&ta, qw, &opts)?,
            };
            save(&c.out, &y)
        }
        Op::DepthwiseConv2d(a) => {
            let c = &a.common;
            let dev = device(&c.backend, c.dtype)?;
            let x = load(&dev, c.dtype, "input", &a.input)?;
            let w = load(&dev, c.dtype, "weight", &a.weight)?;
            let bias = load_opt(&dev, c.dtype, "bias", a.bias.as_ref())?;
            let opts = Conv2dOptions::default()
                .stride(a.stride)
                .padding(a.padding)
                .dilation(a.dilation)
                .layout(a.layout)
                .activation(a.activation);
            let y = dev.depthwise_conv2d(&x, &w, bias.as_ref(), &opts)?;
            save(&c.out, &y)
        }
        Op::Activation(a) => {
            let c = &a.common;
            let dev = device(&c.backend, c.dtype)?;
            let x = load(&dev, c.dtype, "input", &a.input)?;
            let bias = load_opt(&dev, c.dtype, "bias", a.bias.as_ref())?;
            let y = dev.activation(&x, bias.as_ref(), a.activation)?;
            save(&c.out, &y)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        op: Op,
    }

    /// A scratch folder in the temp dir, unique per process and test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tilekit-xtask-run-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn cli(args: &[&str]) -> Result<()> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))?;
        run(Args { op: cli.op })
    }

    #[test]
    fn matmul_end_to_end_with_epilogue() {
        let d = scratch("matmul");
        let p = |n: &str| d.join(n).to_string_lossy().into_owned();
        // A stored transposed: [K=3, M=2]; B [K=3, N=2].
        npy::write(Path::new(&p("a.npy")), &[3, 2], &[1., 4., 2., 5., 3., 6.]).unwrap();
        npy::write(Path::new(&p("b.npy")), &[3, 2], &[1., 0., 0., 1., 1., -1.]).unwrap();
        npy::write(Path::new(&p("bias.npy")), &[2], &[0.5, -10.]).unwrap();
        npy::write(Path::new(&p("c.npy")), &[2, 2], &[1., 1., 1., 1.]).unwrap();
        let args = [
            "matmul",
            "--a",
            &p("a.npy"),
            "--b",
            &p("b.npy"),
            "--bias",
            &p("bias.npy"),
            "--c",
            &p("c.npy"),
            "--alpha",
            "2",
            "--beta",
            "-1",
            "--transpose-a",
            "--activation",
            "relu",
            "--backend",
            "cpu",
            "--out",
            &p("y.npy"),
        ];
        cli(&args).unwrap();
        let y = npy::read(Path::new(&p("y.npy"))).unwrap();
        // op(A) = [[1,2,3],[4,5,6]]; op(A)·B = [[4,-1],[10,-1]]; ·2 + bias - 1, then relu.
        assert_eq!(y.shape, vec![2, 2]);
        assert_eq!(y.data, vec![7.5, 0.0, 19.5, 0.0]);
    }

    #[test]
    fn conv_and_activation_end_to_end() {
        let d = scratch("conv");
        let p = |n: &str| d.join(n).to_string_lossy().into_owned();
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        npy::write(Path::new(&p("x.npy")), &[1, 1, 4, 4], &x).unwrap();
        npy::write(Path::new(&p("w.npy")), &[1, 1, 2, 2], &[1., 1., 1., 1.]).unwrap();
        let conv = ["depthwise-conv2d", "--input", &p("x.npy"), "--weight", &p("w.npy"), "--stride", "2,2"];
        cli(&[&conv[..], &["--backend", "cpu", "--dtype", "bf16", "--out", &p("y.npy")]].concat()).unwrap();
        let y = npy::read(Path::new(&p("y.npy"))).unwrap();
        assert_eq!(y.shape, vec![1, 1, 2, 2]);
        assert_eq!(y.data, vec![10., 18., 42., 50.]);

        npy::write(Path::new(&p("v.npy")), &[2, 2], &[-1., 2., 3., -4.]).unwrap();
        npy::write(Path::new(&p("bias.npy")), &[2], &[0., 5.]).unwrap();
        let act = ["activation", "--input", &p("v.npy"), "--bias", &p("bias.npy"), "--activation", "relu6"];
        cli(&[&act[..], &["--backend", "cpu", "--out", &p("z.npy")]].concat()).unwrap();
        assert_eq!(npy::read(Path::new(&p("z.npy"))).unwrap().data, vec![0., 6., 3., 1.]);
    }

    #[test]
    fn errors_are_one_line_messages() {
        let d = scratch("errors");
        let p = |n: &str| d.join(n).to_string_lossy().into_owned();
        npy::write(Path::new(&p("a.npy")), &[2, 3], &[0.0; 6]).unwrap();
        npy::write(Path::new(&p("b.npy")), &[2, 2], &[0.0; 4]).unwrap();
        std::fs::write(p("bad.npy"), b"\x93NUMPY garbage").unwrap();
        let cases: Vec<Vec<String>> = vec![
            // K mismatch.
            vec!["matmul", "--a", &p("a.npy"), "--b", &p("b.npy")],
            // Missing and malformed files.
            vec!["matmul", "--a", &p("missing.npy"), "--b", &p("b.npy")],
            vec!["activation", "--input", &p("bad.npy"), "--activation", "gelu"],
            // Bad conv parameters.
            vec!["depthwise-conv2d", "--input", &p("a.npy"), "--weight", &p("b.npy")],
            vec!["depthwise-conv2d", "--input", &p("a.npy"), "--weight", &p("b.npy"), "--stride", "1,2,3"],
            // Unknown names.
            vec!["activation", "--input", &p("a.npy"), "--activation", "swish"],
            vec!["activation", "--input", &p("a.npy"), "--activation", "gelu", "--backend", "tpu"],
            vec!["activation", "--input", &p("a.npy"), "--activation", "gelu", "--dtype", "f8"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
        for case in cases {
            let mut args: Vec<&str> = case.iter().map(String::as_str).collect();
            let out = p("out.npy");
            args.extend(["--out", &out]);
            if !args.contains(&"--backend") {
                args.extend(["--backend", "cpu"]);
            }
            let err = cli(&args).expect_err("must fail");
            // Usage errors are clap's own (with a hint line); everything else is one line.
            if err.downcast_ref::<clap::Error>().is_none() {
                let msg = format!("{err:#}");
                assert!(!msg.contains('\n'), "{args:?}: {msg}");
            }
        }
    }

    /// A GGUF v3 file with the given tensors `(name, numpy shape, ggml type id, data)`.
    fn write_gguf(path: &Path, tensors: &[(&str, &[usize], u32, Vec<u8>)]) {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend((tensors.len() as u64).to_le_bytes());
        f.extend(0u64.to_le_bytes());
        let mut data = Vec::new();
        for (name, shape, ty, bytes) in tensors {
            f.extend((name.len() as u64).to_le_bytes());
            f.extend(name.as_bytes());
            f.extend((shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                f.extend((*d as u64).to_le_bytes());
            }
            f.extend(ty.to_le_bytes());
            f.extend((data.len() as u64).to_le_bytes());
            data.extend(bytes);
            data.resize(data.len().next_multiple_of(32), 0);
        }
        f.resize(f.len().next_multiple_of(32), 0);
        f.extend(data);
        std::fs::write(path, f).unwrap();
    }

    #[test]
    fn matmul_reads_b_from_a_gguf_file() {
        use tilekit::quant::{GgmlType, dequantize, quantize};
        let d = scratch("gguf");
        let p = |n: &str| d.join(n).to_string_lossy().into_owned();
        let (n, k) = (3, 64);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
        let q8 = quantize(GgmlType::Q8_0, &w, &[n, k]).unwrap();
        let w16: Vec<u8> = w.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        let file = p("w.gguf");
        write_gguf(
            Path::new(&file),
            &[("q", &[n, k], GgmlType::Q8_0.id(), q8.clone()), ("h", &[n, k], GgmlType::F16.id(), w16)],
        );
        let a: Vec<f32> = (0..2 * k).map(|i| (i % 3) as f32 - 1.0).collect();
        npy::write(Path::new(&p("a.npy")), &[2, k], &a).unwrap();
        // The F16 weights are quarter steps, so those sums are exact in f32 and compared exactly;
        // the Q8_0 ones are multiples of an arbitrary f16 scale, compared within 1e-5 of the
        // row's magnitude (far below one quantization step).
        let expect = |w: &[f32]| -> Vec<f32> {
            let mut y = Vec::new();
            for i in 0..2 {
                for j in 0..n {
                    y.push((0..k).map(|p| a[i * k + p] * w[j * k + p]).sum());
                }
            }
            y
        };
        let wq = dequantize(GgmlType::Q8_0, &q8, &[n, k]).unwrap();
        for (spec, dtype, want) in [
            (format!("{file}:q"), "f32", expect(&wq)),
            (format!("{file}:q"), "bf16", vec![]),
            (format!("{file}:h"), "f32", expect(&w)),
            (format!("{file}:h"), "f16", expect(&w)),
        ] {
            let args = ["matmul", "--a", &p("a.npy"), "--b", &spec, "--transpose-b", "--dtype", dtype];
            cli(&[&args[..], &["--backend", "cpu", "--out", &p("y.npy")]].concat()).unwrap();
            let y = npy::read(Path::new(&p("y.npy"))).unwrap();
            assert_eq!(y.shape, vec![2, n], "{spec} {dtype}");
            if spec.ends_with(":h") {
                assert_eq!(y.data, want, "{spec} {dtype}");
            } else if !want.is_empty() {
                for (g, e) in y.data.iter().zip(&want) {
                    assert!((g - e).abs() <= 1e-5 * k as f32, "{spec} {dtype}: {g} vs {e}");
                }
            }
        }
        // An F16 tensor does not fit bf16 losslessly; a missing name, a missing --transpose-b
        // and a missing file are one-line errors.
        for args in [
            vec!["--b", &format!("{file}:h"), "--transpose-b", "--dtype", "bf16"],
            vec!["--b", &format!("{file}:nope"), "--transpose-b"],
            vec!["--b", &format!("{file}:q")],
            vec!["--b", &format!("{}:q", p("missing.gguf")), "--transpose-b"],
        ] {
            let out = p("y.npy");
            let a_path = p("a.npy");
            let full = [&["matmul", "--a", &a_path][..], &args, &["--backend", "cpu", "--out", &out]].concat();
            let err = cli(&full).expect_err("must fail");
            let msg = format!("{err:#}");
            assert!(!msg.contains('\n'), "{full:?}: {msg}");
        }
    }
}
