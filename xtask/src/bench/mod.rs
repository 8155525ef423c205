//! `cargo xtask bench`: tilekit's speed, checked and compared.
//!
//! For each case of each suite (see [`cases`]) on each chosen backend and dtype:
//! 1. run the op once on inputs where its arithmetic is exact and compare every output with
//!    the exact result, then once on the deterministic inputs it is timed on and compare with
//!    the naive f64 CPU reference ([`check`]); a wrong result is reported and never timed;
//! 2. time it (warm-up, then at least 20 runs — 5 in `--quick` on a software adapter — each
//!    ending in a device synchronisation): median, min and max wall time;
//! 3. time the references in the same run on the same inputs: the `gemm` crate (f32 on the CPU),
//!    the native CPU backend, the deliberately naive WGSL matmul (`Device::naive_matmul`),
//!    the f64 reference itself (small cases only), and the device's copy kernel moving as many
//!    bytes as the op must (the bandwidth roof);
//! 4. on wgpu, time the op's kernels with GPU timestamps (the profile API) for a device-time
//!    column, and time matmul and conv again with autotuning off for the tuned-vs-default ratio;
//! 5. print a row and, at the end, write JSON, CSV and a roofline chart (SVG) under `results/`
//!    (and, with `--compare BASELINE.json`, the speedup over an earlier run with regressions
//!    flagged; with `--trace FILE`, a Chrome trace of one profiled run of every case).
//!
//! Memory-bound cases on the CPU backend flush the host caches before each timed run
//! (`--no-flush` turns that off): a cold call is what a model sees between layers.
//!
//! The bench must time optimised code, so when the xtask itself was built without
//! optimisations (the `cargo xtask` alias builds it in the dev profile, which keeps
//! `cargo xtask test` from compiling the workspace twice) it rebuilds itself with `--release`
//! and runs that build. With the CPU backend among the devices, that build first audits its own
//! symbol table ([`audit`]): a SIMD intrinsic compiled as a call (a kernel that lost its target
//! features) fails the bench.

mod audit;
mod blocks;
mod cases;
mod chart;
mod check;
mod compare;
mod f16x2;
mod launch;
mod measure;
mod network;
mod ort;
mod peak;
mod quant;
mod report;
mod workload;

use crate::util::{cargo, project_root};
use anyhow::{Context, Result, bail};
use cases::{Case, Entry, Scale};
use indicatif::{ProgressBar, ProgressStyle};
use measure::{Flusher, Plan, Stats};
use report::{Reference, Row};
use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use tilekit::{Activation, BackendKind, DType, Device, Profile, Timing, TuneMode, WgpuOptions};
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
    /// Only these suites (comma-separated: square, decode, mobilenet, transformer, launch).
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Where to write the JSON results (default: results/bench-<time>.json; a CSV goes next to it).
    #[arg(long)]
    json: Option<PathBuf>,
    /// An earlier results JSON: print the speedup per row and flag regressions beyond noise.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of one profiled run of every case.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Do not flush the host caches between timed runs of memory-bound CPU cases.
    #[arg(long)]
    no_flush: bool,
}

/// Set in the environment of the release build this command starts, so it does not start another.
const RELEASE_CHILD: &str = "TILEKIT_XTASK_BENCH_RELEASE";

pub fn run(args: Args) -> Result<()> {
    if cfg!(debug_assertions) && std::env::var_os(RELEASE_CHILD).is_none() {
        return rerun_in_release();
    }
    let dtypes = parse_dtypes(&args.dtype)?;
    for s in &args.suite {
        if !cases::SUITES.contains(&s.as_str()) && s != "launch" {
            bail!("unknown suite {s:?} (expected {}, launch)", cases::SUITES.join(", "));
        }
    }
    let devices = devices(&args.backend)?;
    if devices.is_empty() {
        println!("nothing to bench: the backend asked for is not available here (see the SKIP line above)");
        return Ok(());
    }
    // The launch suite times host cost per op (its own table, `launch.rs`); only on request.
    if args.suite.iter().any(|s| s == "launch") {
        launch::run(&devices, args.quick)?;
        if args.suite.iter().all(|s| s == "launch") {
            return Ok(());
        }
    }

    let started = std::time::SystemTime::now();
    let mut refs = SharedRefs::default();
    let mut rows = Vec::new();
    let mut ctx = Ctx { quick: args.quick, flush: !args.no_flush, flusher: None, ort: None, cpu_peak: None };
    if devices.iter().any(|d| d.kind() == BackendKind::Cpu) {
        // The CPU's compute roof, before any case (nothing else runs meanwhile): each row's
        // `att` column divides by it.
        let p = peak::cpu(args.quick);
        println!("cpu compute roof: {:.1} GFLOP/s f32 multiply-add peak ({}), measured in this run", p.gflops, p.how);
        ctx.cpu_peak = Some(p);
        match ort::Ort::start() {
            Ok(o) => {
                println!(
                    "ONNX Runtime reference (vs ort, and vs ort-in for unpacked matmul rows; CPU f32 rows): \
                     onnxruntime {} through a python3 helper, 2 intra-op threads, f32, cache flushing as the row's",
                    o.version
                );
                ctx.ort = Some(o);
            }
            Err(e) => println!(
                "NOTE: no ONNX Runtime reference ({e}); the vs ort column stays empty \
                 (pip install onnxruntime onnx numpy to add it)"
            ),
        }
    }
    let mut profiles = Vec::new();
    let mut block_failures: Vec<String> = Vec::new();
    if devices.iter().any(|d| d.kind() == BackendKind::Cpu) {
        match audit::audit_self() {
            Ok(a) if a.kernel_copies == 0 => println!(
                "SKIP CPU intrinsics audit: this executable's symbol table shows no AVX2/AVX-512 kernel copies \
                 (stripped?), so it cannot tell whether their intrinsics were inlined"
            ),
            Ok(a) if a.out_of_line.is_empty() => println!(
                "CPU intrinsics audit: no core::arch SIMD intrinsic is compiled out of line in this executable \
                 ({} AVX2/AVX-512 kernel copies seen)",
                a.kernel_copies
            ),
            Ok(a) => {
                println!(
                    "FAILED CPU intrinsics audit: {} core::arch SIMD intrinsic(s) compiled as calls (a kernel \
                     lost its target features): {}",
                    a.out_of_line.len(),
                    a.out_of_line.join(", ")
                );
                block_failures.push("CPU intrinsics audit".into());
            }
            Err(e) => println!("SKIP CPU intrinsics audit: {e:#}"),
        }
    }
    let mut tune_notes = Vec::new();
    let selected = |entry: &Entry| args.suite.is_empty() || args.suite.iter().any(|s| s == entry.suite);
    let total: usize = devices
        .iter()
        .map(|d| {
            dtypes.iter().filter(|&&t| d.check_dtype(t).is_ok()).count()
                * cases::entries(scale_of(d, args.quick)).iter().filter(|e| selected(e)).count()
        })
        .sum();
    let progress = progress_bar(total as u64);
    report::print_legend();
    println!(
        "Cache flushing between timed runs (memory-bound cases on the CPU backend, marked ok*): {}",
        if ctx.flush { "on (--no-flush turns it off)" } else { "off (--no-flush)" }
    );
    for dev in &devices {
        let slow = dev.is_software();
        let scale = scale_of(dev, args.quick);
        println!("\n== {} — {}{}", dev.kind(), dev.description(), if slow { " (software adapter)" } else { "" });
        if dev.kind() == BackendKind::Wgpu {
            let note = tune_note(dev);
            println!("   autotuning: {note}");
            tune_notes.push(format!("{}: {note}", dev.kind()));
        }
        report::print_header();
        let mut trace = args.trace.as_ref().map(|_| Profile {
            backend: dev.kind(),
            device: dev.description(),
            records: Vec::new(),
        });
        for &dtype in &dtypes {
            if let Err(e) = dev.check_dtype(dtype) {
                progress.suspend(|| println!("   SKIP {dtype} on {}: {e}", dev.kind()));
                continue;
            }
            for entry in cases::entries(scale) {
                if !selected(&entry) {
                    continue;
                }
                progress.set_message(format!("{} {} {} {dtype}", dev.kind(), entry.suite, entry.case.shape()));
                let row = bench_case(dev, &entry, dtype, &mut ctx, &mut refs, trace.as_mut());
                progress.suspend(|| report::print_row(&row));
                progress.inc(1);
                rows.push(row);
            }
        }
        profiles.extend(trace);
        if args.suite.is_empty() || args.suite.iter().any(|s| s == "mobilenet") {
            // The inverted-residual blocks fused vs unfused: a table of their own (blocks.rs).
            for &dtype in dtypes.iter().filter(|&&t| dev.check_dtype(t).is_ok()) {
                if let Err(e) = progress.suspend(|| blocks::run(dev, dtype, args.quick)) {
                    println!("   FAILED inverted-residual blocks: {e:#}");
                    block_failures.push(format!("inverted_residual {} {dtype}", dev.kind()));
                }
            }
            // The whole network per image (network.rs).
            let ort = ctx.ort.as_mut().filter(|_| dev.kind() == BackendKind::Cpu);
            progress.suspend(|| network::bench(dev, &dtypes, args.quick, ort))?;
        }
    }
    progress.finish_and_clear();
    // The compute roof again, now that every case has run: the first measurement takes a few
    // hundred ms, and on a shared machine a neighbour can take a core for all of them (a run
    // on the 2-core VM measured 176 GFLOP/s where the CPU reaches 327–344, which put the M = 16
    // rows at 115–145% of it). The roof is the best the CPU did; the rows' att is recomputed
    // with it for the summaries and the results file.
    if let Some(first) = ctx.cpu_peak.clone() {
        let again = peak::cpu(args.quick);
        if again.gflops > first.gflops {
            println!(
                "cpu compute roof measured again after the cases: {:.1} GFLOP/s (first {:.1}); the summaries and the \
                 results file take the higher",
                again.gflops, first.gflops
            );
            let cpu = BackendKind::Cpu.name();
            rows.iter_mut().filter(|r| r.backend == cpu).for_each(|r| r.finish(Some(again.gflops)));
            ctx.cpu_peak = Some(again);
        }
    }
    if args.suite.is_empty() || args.suite.iter().any(|s| s == "decode") {
        let flusher = if ctx.flush { Some(ctx.flusher.get_or_insert_with(Flusher::new)) } else { None };
        let cpu_peak = ctx.cpu_peak.as_ref().map(|p| p.gflops);
        quant::run(&devices, args.quick, &rows, flusher, &|dev| device_peak(dev, cpu_peak))?;
    }
    report::print_tune_summary(&rows);
    report::print_f16x2_summary(&rows);
    report::print_ort_summary(&rows);

    let json = match args.json {
        Some(p) => p,
        None => {
            let secs = started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            project_root().join("results").join(format!("bench-{secs}.json"))
        }
    };
    let mut meta = report::Meta::new(args.quick, &devices, started);
    meta.cache_flush = ctx.flush;
    meta.cache_flush_bytes = ctx.flusher.as_ref().map(Flusher::bytes);
    if let Some(bytes) = meta.cache_flush_bytes {
        println!("\ncases marked ok* ran after writing a {} MiB buffer to flush the host caches", bytes >> 20);
    }
    meta.tune = tune_notes;
    meta.cpu_peak = ctx.cpu_peak.clone();
    report::write(&json, &meta, &rows)?;
    let svg = json.with_extension("svg");
    std::fs::write(&svg, chart::roofline(&rows, meta.cpu_peak.as_ref()))
        .with_context(|| format!("writing {}", svg.display()))?;
    println!("\nwrote {}, {} and {}", json.display(), json.with_extension("csv").display(), svg.display());
    if let Some(path) = &args.trace {
        let events: usize = profiles.iter().map(|p| p.records.len()).sum();
        std::fs::write(path, tilekit::profile::chrome_trace(&profiles))
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "wrote {} ({events} kernel events; open it in https://ui.perfetto.dev or chrome://tracing)",
            path.display()
        );
    }

    // Regressions are flagged, not fatal: on a shared CI machine the load of other jobs moves
    // wall times by more than any fixed noise threshold.
    if let Some(base) = &args.compare {
        compare::compare(base, &rows)?;
    }

    let mut failed: Vec<String> =
        rows.iter().filter(|r| !r.passed()).map(|r| format!("{} {}", r.op, r.shape)).collect();
    failed.extend(block_failures);
    if !failed.is_empty() {
        bail!("{} case(s) failed their correctness check or could not run: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

/// What the run's options and shared buffers are, for every case.
struct Ctx {
    quick: bool,
    /// Whether memory-bound CPU cases flush the caches between runs.
    flush: bool,
    /// Allocated on first use (it is twice the last-level cache).
    flusher: Option<Flusher>,
    /// The ONNX Runtime helper, when it could be started (CPU runs only).
    ort: Option<ort::Ort>,
    /// The CPU's compute roof, measured before the first case (CPU runs only).
    cpu_peak: Option<peak::Peak>,
}

fn scale_of(dev: &Device, quick: bool) -> Scale {
    Scale { quick, gpu: matches!(dev.kind(), BackendKind::Wgpu | BackendKind::Cuda) && !dev.is_software() }
}

/// A progress bar on stderr when stdout is a terminal; hidden otherwise (CI logs, pipes),
/// where the rows printed as they finish are the progress.
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} cases, {elapsed} elapsed, ~{eta} left  {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// Whether `dev` may launch configs other than the defaults: tuning on, or a cache to read.
fn tunes(dev: &Device) -> bool {
    match dev.tune_mode() {
        TuneMode::Off => false,
        TuneMode::On => true,
        TuneMode::Cached => dev.tune_cache_path().is_some_and(|p| p.exists()),
    }
}

/// The autotuner's mode on `dev` and whether its cache file is there.
fn tune_note(dev: &Device) -> String {
    let mode = match dev.tune_mode() {
        TuneMode::Off => "off (TILEKIT_TUNE=off: default configs only, vs dflt is not measured)",
        TuneMode::Cached => "cached configs",
        TuneMode::On => "on (misses are tuned on first use)",
    };
    let cache = match dev.tune_cache_path() {
        Some(p) if p.exists() => format!("cache {} present", p.display()),
        Some(p) => format!(
            "no cache at {} (tuned = default configs, so vs dflt is not measured; run `cargo xtask tune` first)",
            p.display()
        ),
        None => "no cache path (neither TILEKIT_TUNE_CACHE, XDG_CACHE_HOME nor HOME is set)".to_string(),
    };
    format!("{mode}; {cache}")
}

/// Rebuilds the xtask with optimisations and runs the same command line in it.
fn rerun_in_release() -> Result<()> {
    eprintln!("== cargo xtask bench times optimised code: building and running it with --release");
    let status = cargo()
        .args(["run", "--release", "--quiet", "--package", "xtask", "--bin", "xtask", "--"])
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

/// The devices `--backend` names; an absent backend is a printed skip, not an error.
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
        Some(kind) => match Device::with_backend(kind) {
            Ok(d) => d,
            // A backend this machine lacks is a visible skip, as in the test suite.
            Err(e) => {
                println!("   SKIP {kind}: {e}");
                return Ok(Vec::new());
            }
        },
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

fn bench_case(
    dev: &Device,
    entry: &Entry,
    dtype: DType,
    ctx: &mut Ctx,
    refs: &mut SharedRefs,
    trace: Option<&mut Profile>,
) -> Row {
    let mut row = measure_case(dev, entry, dtype, ctx, refs, trace);
    row.finish(device_peak(dev, ctx.cpu_peak.as_ref().map(|p| p.gflops)));
    row
}

/// The compute roof of `dev` in GFLOP/s, where known: the CPU's as measured in this run
/// (`cpu_peak`), a GPU's from its known peak.
fn device_peak(dev: &Device, cpu_peak: Option<f64>) -> Option<f64> {
    match dev.kind() {
        BackendKind::Cpu => cpu_peak,
        _ => chart::known_peak(&dev.description()),
    }
}

/// Below this many FLOPs per byte of least traffic a case is memory-bound on any CPU.
const MEMORY_BOUND_INTENSITY: f64 = 8.0;

fn measure_case(
    dev: &Device,
    entry: &Entry,
    dtype: DType,
    ctx: &mut Ctx,
    refs: &mut SharedRefs,
    trace: Option<&mut Profile>,
) -> Row {
    let quick = ctx.quick;
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

    // Correctness first, on exact inputs and on the timed ones: a wrong kernel is reported,
    // not timed.
    match check::check_case(dev, case, dtype, &bound, &host) {
        Ok(c) => row.check = Some(c),
        Err(e) => {
            row.error = Some(format!("{e:#}"));
            return row;
        }
    }
    if !row.check.as_ref().is_some_and(|c| c.ok) {
        return row;
    }

    let plan = Plan::op(quick, dev.is_software());
    let memory_bound = case.flops().is_none_or(|f| f / case.bytes(dtype) < MEMORY_BOUND_INTENSITY);
    row.flushed = ctx.flush && memory_bound && dev.kind() == BackendKind::Cpu;
    let timed = if row.flushed {
        let flusher = ctx.flusher.get_or_insert_with(Flusher::new);
        measure::time_between(plan, || flusher.flush(), || bound.run_synced())
    } else {
        measure::time(plan, || bound.run_synced())
    };
    match timed {
        Ok(s) => row.stats = Some(s),
        Err(e) => {
            row.error = Some(format!("timing: {e:#}"));
            return row;
        }
    }

    // Device time: GPU timestamps around the op's passes, one profile per run, so launch and
    // synchronisation overhead (wall - device) is told apart from kernel time.
    if dev.kind() == BackendKind::Wgpu {
        let runs = row.stats.map_or(0, |s| s.runs).min(if quick { 5 } else { 20 });
        row.device_time = device_time(dev, &bound, runs);
    }

    // Tuned vs default: the same case with the autotuner off picks the default tile configs.
    // Without a cache (or with tuning off) both would launch the same configs, and the ratio
    // would only measure noise, so it is not timed. (The dense conv runs on wgpu as im2col,
    // a depthwise kernel, and the pointwise conv's matmul: both tuned.)
    if dev.kind() == BackendKind::Wgpu
        && tunes(dev)
        && matches!(case, Case::Matmul { .. } | Case::Conv { .. } | Case::Conv2d { .. })
    {
        let mode = dev.tune_mode();
        let pair = measure::time_interleaved(
            plan,
            || {
                dev.set_tune_mode(TuneMode::Off);
                let ran = bound.run_synced();
                dev.set_tune_mode(mode);
                ran
            },
            || bound.run_synced(),
        );
        // Whatever happened, the device keeps the mode it had.
        dev.set_tune_mode(mode);
        if let Ok((default, tuned)) = pair {
            row.default_config = Some(default);
            row.tuned_paired = Some(tuned);
        }
    }

    // The trace: one profiled run of the case, after the timings so its pipelines are warm.
    if let Some(trace) = trace {
        // A case that cannot be profiled is missing from the trace, not a failed row.
        if let Ok(p) = profiled_run(dev, &bound) {
            trace.append(p);
        }
    }

    // The bandwidth roof: the device's copy kernel moving as many bytes as the op must.
    // (Flushed the same way as the op, so the fraction compares like with like.)
    let flusher = if row.flushed { ctx.flusher.as_mut() } else { None };
    row.copy = time_copy(dev, case, dtype, quick, flusher).ok();

    let key = case.shape();
    let ref_plan = Plan::reference(quick);
    let fast_plan = Plan::op(quick, false);
    if let Case::Matmul { trans_b, .. } = *case {
        let gemm = refs.gemm.entry(key.clone()).or_insert_with(|| time_gemm(&host, trans_b, fast_plan).ok()).as_ref();
        row.push_ref(Reference::new("gemm", gemm.copied()));
    }
    if dev.kind() == BackendKind::Cpu
        && dtype == DType::F32
        && let Some(o) = ctx.ort.as_mut()
    {
        // The same number of runs as tilekit's own row (bounded), flushed when the row is.
        let runs = row.stats.map_or(20, |s| s.runs).clamp(10, 100);
        let flush_bytes = if row.flushed { ctx.flusher.as_ref().map_or(0, Flusher::bytes) } else { 0 };
        row.push_ref(Reference::new("ort", o.time(case, runs, 3, flush_bytes, false).ok()));
        // Rows that multiply the weight as stored at every call also get ONNX Runtime doing
        // the same (the weight a graph input, packed within each run): the like-for-like
        // reference, next to the pre-packed one an exported model gets.
        if let Case::Matmul { packed: false, .. } = *case {
            row.push_ref(Reference::new("ort-in", o.time(case, runs, 3, flush_bytes, true).ok()));
        }
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
    if let Case::Matmul { m: ..=32, bias: false, activation: Activation::None, trans_b, packed: false, .. } = *case
        && let Some((a, b)) = bound.matmul_operands()
    {
        // The skinny-M kernel the GEMV kernel replaced; `Ok(None)` where the backend has none.
        if let Ok(Some(_)) = dev.previous_skinny_matmul(a, b, trans_b) {
            let s = measure::time(ref_plan, || {
                dev.previous_skinny_matmul(a, b, trans_b)?;
                dev.synchronize()?;
                Ok(())
            });
            row.push_ref(Reference::new("prev", s.ok()));
        }
    }
    if f16x2::applies(&bound, case, dtype) {
        // The same f16 product under Precision::F16 (the vec2<f16> kernel), checked, then timed.
        let s = f16x2::time(&bound, case, dtype, &host, plan).unwrap_or_else(|e| {
            row.error.get_or_insert(format!("{e:#}"));
            None
        });
        row.push_ref(Reference::new("f16x2", s));
    }
    if let Case::Conv { .. } = case
        && dev.set_previous_depthwise(true)
    {
        // The general depthwise kernel the tiled one replaced (wgpu), same device and tensors.
        let s = measure::time(plan, || bound.run_synced());
        dev.set_previous_depthwise(false);
        row.push_ref(Reference::new("prev", s.ok()));
    }
    if case.reference_work() <= F64_REF_TIMING_WORK {
        let f64_ref =
            refs.f64_ref.entry(key).or_insert_with(|| time_f64_reference(case, &host, ref_plan).ok()).as_ref();
        row.push_ref(Reference::new("f64-ref", f64_ref.copied()));
    }
    row
}

/// One synced run of the case inside a profile.
fn profiled_run(dev: &Device, bound: &Bound) -> Result<Profile> {
    dev.profile_begin()?;
    let ran = bound.run_synced();
    // The profile is closed whether or not the run worked, so the next op is not recorded.
    let profile = dev.profile_end()?;
    ran.map(|()| profile)
}

/// Median/min/max of the op's device time over `runs` profiled runs; `None` when the backend
/// records no GPU timestamps (no `TIMESTAMP_QUERY`) or a run fails.
fn device_time(dev: &Device, bound: &Bound, runs: usize) -> Option<Stats> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let p = profiled_run(dev, bound).ok()?;
        if p.records.is_empty() || p.records.iter().any(|r| r.timing != Timing::Device) {
            return None;
        }
        samples.push(p.total_us() * 1e-6);
    }
    (!samples.is_empty()).then(|| measure::summarise(&mut samples))
}

/// Times the device's copy kernel over as many bytes as `case` must move in `dtype`.
fn time_copy(
    dev: &Device,
    case: &Case,
    dtype: DType,
    quick: bool,
    mut flusher: Option<&mut Flusher>,
) -> Result<(Stats, f64)> {
    // A copy reads and writes each element, so half the op's traffic in elements.
    let len = ((case.bytes(dtype) / 2.0 / dtype.size_bytes() as f64).round() as usize).max(1);
    // The source holds data, not zeros: a CPU buffer that was only ever zeroed may still be
    // unmapped pages (calloc), and copying from those depended on how the allocator served it
    // (1 572 865 f32: 4.6 GB/s from zeros, 54 GB/s from the same length filled), so the roof of
    // rows of nearly equal size differed up to 8×.
    let src = dev.tensor_from_f32(&[len], dtype, &vec![1.0f32; len])?;
    let dst = dev.zeros(&[len], dtype)?;
    let flush = || {
        if let Some(f) = flusher.as_mut() {
            f.flush();
        }
    };
    let stats = measure::time_between(Plan::op(quick, dev.is_software()), flush, || {
        dev.copy(&src, &dst)?;
        dev.synchronize()?;
        Ok(())
    })?;
    Ok((stats, (2 * len * dtype.size_bytes()) as f64))
}

/// Times the `gemm` crate on the case's (dtype-rounded) operands in f32.
fn time_gemm(host: &Host, trans_b: bool, plan: Plan) -> Result<Stats> {
    let ((a_shape, a), (_, b)) = (&host.inputs[0], &host.inputs[1]);
    let (m, k) = (a_shape[0], a_shape[1]);
    let n = host.out_shape[1];
    if a.len() != m * k || b.len() != k * n {
        bail!("matmul operands of the wrong length");
    }
    let mut dst = vec![0.0f32; m * n];
    // B's (column, row) strides: stored [K, N] row-major, or [N, K] (`trans_b`).
    let (b_cs, b_rs) = if trans_b { (k as isize, 1) } else { (1, n as isize) };
    measure::time(plan, || {
        // SAFETY: `a` is m×k, `b` is k×n (stored k×n or n×k, strides to match) and `dst` is
        // m×n, all row-major (column stride 1, row stride = columns), checked above; gemm
        // reads and writes only inside them, and `dst` does not alias the inputs.
        // `read_dst = false`, so `dst` is only written.
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
                b_cs,
                b_rs,
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
    let kernels = tilekit_kernels::reference::matmul;
    match *case {
        Case::Matmul { m, n, k, bias, activation, trans_b, .. } => {
            let desc = cases::matmul_desc(m, n, k, bias, activation, trans_b);
            measure::time(plan, || {
                kernels(&desc, &inputs[0], &inputs[1], inputs.get(2).map(Vec::as_slice), None, &mut out);
                Ok(())
            })
        }
        Case::Conv { batch, channels, size, stride, layout } => {
            let desc = cases::conv_desc(batch, channels, size, stride, layout);
            measure::time(plan, || {
                tilekit_kernels::reference::depthwise_conv2d(&desc, &inputs[0], &inputs[1], Some(&inputs[2]), &mut out);
                Ok(())
            })
        }
        Case::Conv2d { .. } => {
            let d = case.dense_conv().context("not a dense conv case")?;
            measure::time(plan, || {
                check::dense_conv2d(&d, &inputs[0], &inputs[1], Some(&inputs[2]), &mut out);
                Ok(())
            })
        }
        Case::Activation { cols, bias, activation, .. } => {
            let desc = tilekit::ActivationDesc::new(out.len(), bias.then_some(cols), activation);
            measure::time(plan, || {
                tilekit_kernels::reference::activation(&desc, &inputs[0], inputs.get(1).map(Vec::as_slice), &mut out);
                Ok(())
            })
        }
    }
}
