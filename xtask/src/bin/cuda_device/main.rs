//! `tilekit-cuda-device`: what `cargo xtask device-check` carries to a GPU machine.
//!
//! - `tilekit-cuda-device check [--json FILE]`: every CUDA op, dtype and kernel variant against
//!   the native CPU backend on edge shapes (sizes around the 128-wide tiles, K = 0, transposes,
//!   strided and misaligned views, batches with broadcast, every epilogue, split K on the tensor
//!   cores (with batches, views, bias, C and SiLU), both conv layouts,
//!   activations with and without bias, in place). Matmul and conv inputs are small integers,
//!   so every partial sum is exact and any correct kernel matches bit for bit before the
//!   activation; the tolerance (`tilekit_kernels::tolerance`, its accumulation term zero)
//!   only covers the epilogue, the activation formulas' last bits and one rounding of 16-bit
//!   storage. `matmul_quant` with every GGUF block format (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) is
//!   checked against the CPU backend's on the decode, split-K and tiled paths, and the fused
//!   inverted-residual block against the CPU backend's fused block. Device memory
//!   (`cuMemGetInfo`) is reported before and after. Exits non-zero on any mismatch.
//! - `tilekit-cuda-device bench [--json FILE]`: the CUDA figures: matmul 4096³ (f32, f16, bf16,
//!   f32 with bf16 products) and 512 × 512 × 4096 (f16, bf16: split K) against cuBLAS in its
//!   default math mode (SGEMM; GemmEx with f32 compute for f16/bf16), skinny M = 1..32 × 4096 ×
//!   4096, MobileNetV2's depthwise layers,
//!   GELU over 256 MiB against the copy kernel. Each figure is checked against cuBLAS (a
//!   pedantic-mode handle, on exact inputs) or the CPU backend. Results are written as JSON
//!   after every section, so a timeout keeps what was measured.
//!
//!   The check mode ends with the engine-interop check (`interop`): an engine's own context,
//!   stream and `CudaSlice`s, a tilekit matmul and ReLU on them, the result read back by the
//!   engine on its stream.
//!
//! Modules: `data` (inputs), `checks` (the check mode and the comparison rule), `quant` (the
//! quantized-matmul checks), `block` (the fused inverted-residual block), `interop`, `bench`,
//! `timing`, `cublas` (the baseline's two handles).
#![allow(clippy::unwrap_used)] // A measurement tool: a failed setup should stop it loudly.

mod bench;
mod block;
mod checks;
mod cublas;
mod data;
mod interop;
mod quant;
mod timing;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use tilekit::Device;

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
        "check" => checks::check(&gpu, json_path.as_deref()),
        "bench" => bench::bench(&gpu, json_path.as_deref()),
        _ => bail!("usage: tilekit-cuda-device check|bench [--json FILE]"),
    }
}

/// Free and total memory of CUDA device 0 (`cuMemGetInfo` in its primary context, the one
/// tilekit uses), printed with `when` and returned as JSON (an error as a string).
fn memory(when: &str) -> Value {
    let info = cudarc::driver::CudaContext::new(0).and_then(|ctx| ctx.mem_get_info());
    match info {
        Ok((free, total)) => {
            let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
            println!("device memory {when}: {:.0} MiB free of {:.0} MiB", mib(free), mib(total));
            json!({"free_bytes": free, "total_bytes": total})
        }
        Err(e) => {
            println!("device memory {when}: cuMemGetInfo failed: {e}");
            json!(format!("cuMemGetInfo failed: {e}"))
        }
    }
}
