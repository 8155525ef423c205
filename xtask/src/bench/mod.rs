//! `cargo xtask bench`: tilekit's speed, checked and compared.
//!
//! For each case of each suite (see [`cases`]) on each chosen backend and dtype:
//! 1. upload deterministic inputs and run the op once; compare it with the naive f64 CPU
//!    reference ([`check`]); a wrong result is reported and never timed;
//! 2. time it (warm-up, then at least 20 runs — 5 in `--quick` on a software adapter — each
//!    ending in a device synchronisation): median, min and max wall time;
//! 3. time the references in the same run on the same inputs: the `gemm` crate (f32 on the CPU),
//!    the native CPU backend, the deliberately naive WGSL matmul (`Device::naive_matmul`),
//!    the f64 reference itself (small cases only), and the device's copy kernel moving as many
//!    bytes as the op must (the bandwidth roof);
//! 4. print a row and, at the end, write JSON and CSV under `results/`.
//!
//! The bench must time optimised code, so when the xtask itself was built without
//! optimisations (the `cargo xtask` alias builds it in the dev profile, which keeps
//! `cargo xtask test` from compiling the workspace twice) it rebuilds itself with `--release`
//! and runs that build.

mod cases;
mod check;
mod measure;
mod report;
mod workload;

use crate::util::{cargo, project_root};
use anyhow::{Context, Result, bail};
use cases::{Case, Entry, Scale};
use measure::{Plan, Stats};
use report::{Reference, Row};
use std::collections::HashMap;
use std::path::PathBuf;
use tilekit::{BackendKind, DType, Device, WgpuOptions};
use workload::{Bound, Host};

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// auto (what `Device::auto` picks), cpu, wgpu, cuda, or all (every backend present).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// f32, f16, bf16 or all.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Small sizes and fewer runs: a few minutes on a 2-core machine with lavapipe.
    #[arg(long)]
    quick: bool,
    /// Only these suites (comma-separated: square, decode, mobilenet, transformer).
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Where to write the JSON results (default: results/bench-<time>.json; a CSV goes next to it).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Set in the environment of the release build this command starts, so it does not start another.
const RELEASE_CHILD: &str = "TILEKIT_XTASK_BENCH_RELEASE";

pub fn run(args: Args) -> Result<()> {
    if cfg!(debug_assertions) && std::env::var_os(RELEASE_CHILD).is_none() {
        return rerun_in_release();
    }
    let dtypes = parse_dtypes(&args.dtype)?;
    for s in &args.suite {
        if !cases::SUITES.contains(&s.as_str()) {
            bail!("unknown suite {s:?} (expected {})", cases::SUITES.join(", "));
        }
    }
    let devices = devices(&args.backend)?;
    if devices.is_empty() {
        bail!("no backend to bench (see the lines above)");
    }

    let started = std::time::SystemTime::now();
    let mut refs = SharedRefs::default();
    let mut rows = Vec::new();
    report::print_legend();
    for dev in &devices {
        let slow = dev.is_software();
        let scale =
            Scale { quick: args.quick, gpu: matches!(dev.kind(), BackendKind::Wgpu | BackendKind::Cuda) && !slow };
        println!("\n== {} — {}{}", dev.kind(), dev.description(), if slow { " (software adapter)" } else { "" });
        report::print_header();
        for &dtype in &dtypes {
            if let Err(e) = dev.check_dtype(dtype) {
                println!("   SKIP {dtype} on {}: {e}", dev.kind());
                continue;
            }
            for entry in cases::entries(scale) {
                if !args.suite.is_empty() && !args.suite.iter().any(|s| s == entry.suite) {
                    continue;
                }
                let row = bench_case(dev, &entry, dtype, args.quick, &mut refs);
                report::print_row(&row);
                rows.push(row);
            }
        }
    }

    let json = match args.json {
        Some(p) => p,
        None => {
            let secs = started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            project_root().join("results").join(format!("bench-{secs}.json"))
        }
    };
    let meta = report::Meta::new(args.quick, &devices, started);
    report::write(&json, &meta, &rows)?;
    println!("\nwrote {} and {}", json.display(), json.with_extension("csv").display());

    let failed: Vec<String> = rows.iter().filter(|r| !r.passed()).map(|r| format!("{} {}", r.op, r.shape)).collect();
    if !failed.is_empty() {
        bail!("{} case(s) failed their correctness check or could not run: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// Rebuilds the xtask with optimisations and runs the same command line in it.
fn rerun_in_release() -> Result<()> {
    eprintln!("== cargo xtask bench times optimised code: building and running it with --release");
    let status = cargo()
        .args(["run", "--release", "--quiet", "--package", "xtask", "--"])
        .args(std::env::args_os().skip(1))
        .env(RELEASE_CHILD, "1")
        .status()
        .context("starting the release build of the xtask")?;
    // The release run printed its own report and errors; pass its verdict on.
    std::process::exit(status.code().unwrap_or(1))
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

/// The devices `--backend` names; an absent backend is a printed skip, not an error, unless it
/// was the only one asked for.
fn devices(backend: &str) -> Result<Vec<Device>> {
    println!("== Backends");
    if backend == "all" {
        let mut out = vec![Device::cpu()];
        for (name, dev) in [("wgpu", Device::wgpu(&WgpuOptions::allow_software())), ("cuda", Device::cuda(0))] {
            match dev {
                Ok(d) => out.push(d),
                Err(e) => println!("   SKIP {name}: {e}"),
            }
        }
        for d in &out {
            println!("   {:<5} {}", d.kind(), d.description());
        }
        return Ok(out);
    }
    let dev = match BackendKind::parse(backend)? {
        None => {
            let d = Device::auto()?;
            print!("{}", d.probe_report());
            d
        }
        Some(kind) => Device::with_backend(kind).with_context(|| format!("--backend {kind}"))?,
    };
    println!("   benching {}: {}", dev.kind(), dev.description());
    Ok(vec![dev])
}

/// References that do not depend on the device under test, measured once per run.
#[derive(Default)]
struct SharedRefs {
    /// The `gemm` crate, keyed by the case's shape (always f32).
    gemm: HashMap<String, Option<Stats>>,
    /// The native CPU backend, keyed by shape and dtype.
    cpu: HashMap<(String, DType), Option<Stats>>,
    /// The naive f64 reference, keyed by shape.
    f64_ref: HashMap<String, Option<Stats>>,
}

/// Above this many multiply-adds the f64 reference is not timed (it runs ~1 GFLOP/s).
const F64_REF_TIMING_WORK: f64 = (1u64 << 22) as f64;

fn bench_case(dev: &Device, entry: &Entry, dtype: DType, quick: bool, refs: &mut SharedRefs) -> Row {
    let mut row = measure_case(dev, entry, dtype, quick, refs);
    row.finish();
    row
}

fn measure_case(dev: &Device, entry: &Entry, dtype: DType, quick: bool, refs: &mut SharedRefs) -> Row {
    let case = &entry.case;
    let mut row = Row::new(entry.suite, case, dtype, dev);
    let host = Host::new(case, dtype);
    let bound = match Bound::new(dev, case, dtype, &host) {
        Ok(b) => b,
        Err(e) => {
            row.error = Some(format!("{e:#}"));
            return row;
        }
    };

    // Correctness first: a wrong kernel is reported, not timed.
    let out = bound.run_synced().and_then(|()| bound.output());
    match out {
        Ok(out) => row.check = Some(check::check(case, dtype, &host, &out)),
        Err(e) => {
            row.error = Some(format!("{e:#}"));
            return row;
        }
    }
    if !row.check.as_ref().is_some_and(|c| c.ok) {
        return row;
    }

    match measure::time(Plan::op(quick, dev.is_software()), || bound.run_synced()) {
        Ok(s) => row.stats = Some(s),
        Err(e) => {
            row.error = Some(format!("timing: {e:#}"));
            return row;
        }
    }

    // The bandwidth roof: the device's copy kernel moving as many bytes as the op must.
    row.copy = time_copy(dev, case, dtype, quick).ok();

    let key = case.shape();
    let ref_plan = Plan::reference(quick);
    let fast_plan = Plan::op(quick, false);
    if let Case::Matmul { .. } = case {
        let gemm = refs.gemm.entry(key.clone()).or_insert_with(|| time_gemm(&host, fast_plan).ok()).as_ref();
        row.push_ref(Reference::new("gemm", gemm.copied()));
    }
    if dev.kind() != BackendKind::Cpu {
        let cpu = refs
            .cpu
            .entry((key.clone(), dtype))
            .or_insert_with(|| {
                let cpu = Device::cpu();
                Bound::new(&cpu, case, dtype, &host).and_then(|b| measure::time(fast_plan, || b.run_synced())).ok()
            })
            .as_ref();
        row.push_ref(Reference::new("cpu", cpu.copied()));
    }
    if case.plain_matmul().is_some()
        && let Some((a, b)) = bound.matmul_operands()
    {
        // `Ok(None)`: this backend has no naive kernel; the column stays empty.
        if let Ok(Some(_)) = dev.naive_matmul(a, b) {
            let s = measure::time(ref_plan, || {
                dev.naive_matmul(a, b)?;
                dev.synchronize()?;
                Ok(())
            });
            row.push_ref(Reference::new("naive", s.ok()));
        }
    }
    if case.reference_work() <= F64_REF_TIMING_WORK {
        let f64_ref =
            refs.f64_ref.entry(key).or_insert_with(|| time_f64_reference(case, &host, ref_plan).ok()).as_ref();
        row.push_ref(Reference::new("f64-ref", f64_ref.copied()));
    }
    row
}

/// Times the device's copy kernel over as many bytes as `case` must move in `dtype`.
fn time_copy(dev: &Device, case: &Case, dtype: DType, quick: bool) -> Result<(Stats, f64)> {
    // A copy reads and writes each element, so half the op's traffic in elements.
    let len = ((case.bytes(dtype) / 2.0 / dtype.size_bytes() as f64).round() as usize).max(1);
    let src = dev.zeros(&[len], dtype)?;
    let dst = dev.zeros(&[len], dtype)?;
    let stats = measure::time(Plan::op(quick, dev.is_software()), || {
        dev.copy(&src, &dst)?;
        dev.synchronize()?;
        Ok(())
    })?;
    Ok((stats, (2 * len * dtype.size_bytes()) as f64))
}

/// Times the `gemm` crate on the case's (dtype-rounded) operands in f32.
fn time_gemm(host: &Host, plan: Plan) -> Result<Stats> {
    let ((a_shape, a), (_, b)) = (&host.inputs[0], &host.inputs[1]);
    let (m, k) = (a_shape[0], a_shape[1]);
    let n = host.out_shape[1];
    if a.len() != m * k || b.len() != k * n {
        bail!("matmul operands of the wrong length");
    }
    let mut dst = vec![0.0f32; m * n];
    measure::time(plan, || {
        // SAFETY: `a` is m×k, `b` is k×n and `dst` is m×n, all row-major (column stride 1,
        // row stride = columns), checked above; gemm reads and writes only inside them, and
        // `dst` does not alias the inputs. `read_dst = false`, so `dst` is only written.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            );
        }
        Ok(())
    })
}

/// Times tilekit's naive f64 reference on the case (inputs widened outside the timing).
fn time_f64_reference(case: &Case, host: &Host, plan: Plan) -> Result<Stats> {
    let inputs: Vec<Vec<f64>> = host.inputs.iter().map(|(_, d)| d.iter().map(|&v| f64::from(v)).collect()).collect();
    let mut out = vec![0.0f64; host.out_shape.iter().product()];
    let kernels = tilekit::kernels::reference::matmul;
    match *case {
        Case::Matmul { m, n, k, bias, activation } => {
            let desc = cases::matmul_desc(m, n, k, bias, activation);
            measure::time(plan, || {
                kernels(&desc, &inputs[0], &inputs[1], inputs.get(2).map(Vec::as_slice), None, &mut out);
                Ok(())
            })
        }
        Case::Conv { batch, channels, size, stride, layout } => {
            let desc = cases::conv_desc(batch, channels, size, stride, layout);
            measure::time(plan, || {
                tilekit::kernels::reference::depthwise_conv2d(
                    &desc,
                    &inputs[0],
                    &inputs[1],
                    Some(&inputs[2]),
                    &mut out,
                );
                Ok(())
            })
        }
        Case::Activation { cols, bias, activation, .. } => {
            let desc = tilekit::ActivationDesc { len: out.len(), bias_len: bias.then_some(cols), activation };
            measure::time(plan, || {
                tilekit::kernels::reference::activation(&desc, &inputs[0], inputs.get(1).map(Vec::as_slice), &mut out);
                Ok(())
            })
        }
    }
}
