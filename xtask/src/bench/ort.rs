//! ONNX Runtime as a reference for the CPU rows: what an engine author would run instead.
//!
//! A Python helper (`ort_helper.py`, embedded in the xtask and run with `python3 -c`, or the
//! interpreter in `TILEKIT_BENCH_PYTHON`) builds a one-op ONNX graph for each case — MatMul
//! (Gemm with `transB` for B stored `[N, K]`; + Add + Gelu for the fused epilogue), Conv
//! with `group = C` + Clip(0, 6) (depthwise), Conv with `group = 1` + Clip(0, 6) (dense: the
//! stem), Add + Gelu/Relu/Clip — and times it with 2 intra-op threads on f32 inputs of the same shape,
//! warm, or with the caches flushed before each run exactly when the tilekit row is (each
//! session closed before the helper answers: ONNX Runtime's intra-op threads spin after a run,
//! and while they did, tilekit's next row shared the two cores with them — 128³ took 0.048–0.067
//! ms against 0.024 with no helper running, 0.026 once the session was closed); and the
//! whole MobileNetV2 graph for the network table (`network.rs`). Nothing is
//! downloaded: without `python3`, `onnxruntime` or `onnx` the bench prints a note and the
//! column stays empty.

use super::cases::Case;
use super::measure::{Stats, summarise};
use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use tilekit::Layout;

const HELPER: &str = include_str!("ort_helper.py");

/// A running helper process.
pub struct Ort {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The onnxruntime version the helper imported.
    pub version: String,
}

impl Ort {
    /// Starts the helper; `Err` carries the reason ONNX Runtime is not available here.
    pub fn start() -> std::result::Result<Ort, String> {
        let python = std::env::var("TILEKIT_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .args(["-c", HELPER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {python}: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err("no pipes to the helper".into());
        };
        let mut ort = Ort { child, stdin, stdout: BufReader::new(stdout), version: String::new() };
        match ort.read_line() {
            Ok(v) if v["ok"] == true => {
                ort.version = v["version"].as_str().unwrap_or("?").to_string();
                Ok(ort)
            }
            Ok(v) => Err(v["error"].as_str().unwrap_or("the helper failed").to_string()),
            Err(e) => Err(format!("{e:#}")),
        }
    }

    fn read_line(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the ONNX Runtime helper exited");
        }
        serde_json::from_str(&line).context("reading the ONNX Runtime helper's answer")
    }

    /// Times `case` in ONNX Runtime (f32): `runs` timed runs after `warmup`, each after writing
    /// `flush_bytes` of memory when that is not 0. `weight_input` (matmul only): the weight is a
    /// graph input fed at every run instead of a constant ONNX Runtime packs at session creation.
    pub fn time(
        &mut self,
        case: &Case,
        runs: usize,
        warmup: usize,
        flush_bytes: usize,
        weight_input: bool,
    ) -> Result<Stats> {
        let mut req = match *case {
            Case::Matmul { m, n, k, bias, activation, trans_b, .. } => serde_json::json!({
                "op": "matmul", "m": m, "n": n, "k": k, "bias": bias, "activation": activation.name(),
                "trans_b": trans_b, "weight_input": weight_input,
            }),
            Case::Conv { batch, channels, size, stride, layout } => serde_json::json!({
                "op": "conv", "batch": batch, "channels": channels, "size": size, "stride": stride,
                "layout": if layout == Layout::Nhwc { "nhwc" } else { "nchw" },
            }),
            // Like the depthwise rows, an NHWC row times ONNX Runtime's NCHW Conv on the same
            // shape (its CPU Conv is NCHW only; the helper ignores the layout).
            Case::Conv2d { batch, in_channels, out_channels, size, stride, layout } => serde_json::json!({
                "op": "conv2d", "batch": batch, "in_channels": in_channels, "out_channels": out_channels,
                "size": size, "stride": stride, "layout": layout.name(),
            }),
            Case::Activation { rows, cols, bias, activation } => serde_json::json!({
                "op": "activation", "rows": rows, "cols": cols, "bias": bias, "activation": activation.name(),
            }),
        };
        req["flush_bytes"] = flush_bytes.into();
        self.request(req, runs, warmup)
    }

    /// Times MobileNetV2 (f32, NCHW, batch 1, `size`², BatchNorm folded) as one ONNX graph of
    /// the same blocks ([in, hidden, out, stride] each), warm: `runs` timed runs after `warmup`.
    pub fn time_mobilenet_v2(
        &mut self,
        size: usize,
        blocks: &[[usize; 4]],
        runs: usize,
        warmup: usize,
    ) -> Result<Stats> {
        let req = serde_json::json!({
            "op": "mobilenet_v2", "size": size, "blocks": blocks,
            "stem": tilekit_models::arch::STEM_CHANNELS, "head": tilekit_models::arch::HEAD_CHANNELS,
            "classes": tilekit_models::arch::NUM_CLASSES,
        });
        self.request(req, runs, warmup)
    }

    /// Sends one request and summarises the samples it answers with.
    fn request(&mut self, mut req: serde_json::Value, runs: usize, warmup: usize) -> Result<Stats> {
        req["runs"] = runs.into();
        req["warmup"] = warmup.into();
        writeln!(self.stdin, "{req}")?;
        self.stdin.flush()?;
        let v = self.read_line()?;
        if v["ok"] != true {
            bail!("ONNX Runtime: {}", v["error"].as_str().unwrap_or("failed"));
        }
        let mut samples: Vec<f64> =
            v["samples"].as_array().context("no samples")?.iter().filter_map(|s| s.as_f64()).collect();
        if samples.is_empty() {
            bail!("ONNX Runtime returned no samples");
        }
        Ok(summarise(&mut samples))
    }
}

impl Drop for Ort {
    fn drop(&mut self) {
        // Killed rather than asked to stop (it may be mid-run after an error), and waited for so
        // no zombie is left.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The geometric mean of ONNX Runtime time / tilekit time over the rows that have both.
pub fn geomean(ratios: &[f64]) -> Option<f64> {
    (!ratios.is_empty()).then(|| (ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len() as f64).exp())
}
