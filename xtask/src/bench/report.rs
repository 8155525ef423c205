//! The bench's output: one terminal row per case as it finishes, then JSON and CSV files.

use super::cases::Case;
use super::check::CheckResult;
use super::measure::Stats;
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::SystemTime;
use tilekit::{DType, Device};

/// A reference timed in the same run, and how tilekit compares.
#[derive(Debug, Clone, Serialize)]
pub struct Reference {
    pub name: &'static str,
    pub stats: Option<Stats>,
    /// Reference median / tilekit median: above 1, tilekit is faster.
    pub speedup: Option<f64>,
}

impl Reference {
    pub fn new(name: &'static str, stats: Option<Stats>) -> Reference {
        Reference { name, stats, speedup: None }
    }
}

/// One case on one device in one dtype.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub suite: &'static str,
    pub op: &'static str,
    pub shape: String,
    pub dtype: &'static str,
    pub backend: &'static str,
    pub device: String,
    pub check: Option<CheckResult>,
    pub error: Option<String>,
    pub stats: Option<Stats>,
    pub flops: Option<f64>,
    pub bytes: f64,
    pub gflops: Option<f64>,
    pub gbps: Option<f64>,
    /// The copy kernel over the op's bytes: (its stats, the bytes it moved).
    #[serde(skip)]
    pub copy: Option<(Stats, f64)>,
    pub copy_gbps: Option<f64>,
    /// Achieved bytes/s over the copy kernel's bytes/s.
    pub roof_fraction: Option<f64>,
    /// Achieved FLOP/s over the roof the row can reach: the lower of the copy kernel's bandwidth
    /// times the row's FLOP per byte and the device's compute peak (the CPU's measured in the
    /// run, `peak.rs`; a GPU's from the chart's table of known peaks). Rows with FLOPs only.
    pub attainable_fraction: Option<f64>,
    pub references: Vec<Reference>,
    /// Kernel time from GPU timestamps (wgpu), one profiled run per sample: median/min/max
    /// of the sum of the op's launches.
    pub device_time: Option<Stats>,
    /// The same case with autotuning off (default tile configs), on backends that tune.
    pub default_config: Option<Stats>,
    /// The tuned config timed in alternation with the default one (what the ratio divides by).
    pub tuned_paired: Option<Stats>,
    /// Default-config median / tuned median, from the alternating runs: above 1, the tuned
    /// config is faster.
    pub tuned_speedup: Option<f64>,
    /// Whether the caches were flushed before each timed run.
    pub flushed: bool,
    /// FLOPs for the roofline chart: the op's, or for an activation one per element for the
    /// function and one for the bias add (as the profiler counts them).
    pub plot_flops: f64,
}

impl Row {
    pub fn new(suite: &'static str, case: &Case, dtype: DType, dev: &Device) -> Row {
        Row {
            suite,
            op: case.op(),
            shape: case.shape(),
            dtype: dtype.name(),
            backend: dev.kind().name(),
            device: dev.description(),
            check: None,
            error: None,
            stats: None,
            flops: case.flops(),
            bytes: case.bytes(dtype),
            gflops: None,
            gbps: None,
            copy: None,
            copy_gbps: None,
            roof_fraction: None,
            attainable_fraction: None,
            references: Vec::new(),
            device_time: None,
            default_config: None,
            tuned_paired: None,
            tuned_speedup: None,
            flushed: false,
            plot_flops: case.flops().unwrap_or_else(|| match *case {
                Case::Activation { rows, cols, bias, .. } => ((rows * cols) * (1 + usize::from(bias))) as f64,
                _ => 0.0,
            }),
        }
    }

    /// Fills in the derived figures once the timings are in; `peak_gflops` is the device's
    /// compute roof, where known.
    pub fn finish(&mut self, peak_gflops: Option<f64>) {
        let Some(s) = self.stats else { return };
        self.gflops = self.flops.map(|f| f / s.median_s / 1e9);
        self.gbps = Some(self.bytes / s.median_s / 1e9);
        if let Some((c, bytes)) = self.copy {
            let copy_gbps = bytes / c.median_s / 1e9;
            self.copy_gbps = Some(copy_gbps);
            self.roof_fraction = self.gbps.map(|g| g / copy_gbps);
            if let (Some(gflops), Some(flops), Some(peak)) = (self.gflops, self.flops, peak_gflops)
                && self.bytes > 0.0
            {
                self.attainable_fraction = Some(attainable_fraction(gflops, flops, self.bytes, copy_gbps, peak));
            }
        }
        for r in &mut self.references {
            r.speedup = r.stats.map(|rs| rs.median_s / s.median_s);
        }
        let tuned = self.tuned_paired.unwrap_or(s);
        self.tuned_speedup = self.default_config.map(|d| d.median_s / tuned.median_s);
    }

    pub fn push_ref(&mut self, r: Reference) {
        self.references.push(r);
    }

    /// Whether the case ran and matched the reference.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.check.as_ref().is_some_and(|c| c.ok)
    }

    fn speedup(&self, name: &str) -> String {
        match self.references.iter().find(|r| r.name == name) {
            Some(Reference { speedup: Some(x), .. }) => format!("{x:.2}x"),
            Some(_) => "err".into(),
            None => "-".into(),
        }
    }
}

/// What a results file says about the run as a whole.
#[derive(Debug, Serialize)]
pub struct Meta {
    pub tool: &'static str,
    pub unix_time: u64,
    pub quick: bool,
    pub host_threads: usize,
    pub devices: Vec<String>,
    pub notes: &'static str,
    /// Whether memory-bound CPU cases flushed the host caches before each timed run.
    pub cache_flush: bool,
    /// The size of the buffer written to flush them, when any case flushed.
    pub cache_flush_bytes: Option<usize>,
    /// Per device: the autotuner's mode and whether a tune cache file was present.
    pub tune: Vec<String>,
    /// The CPU's f32 multiply-add peak, measured in the run (where the CPU was benched).
    pub cpu_peak: Option<super::peak::Peak>,
}

impl Meta {
    pub fn new(quick: bool, devices: &[Device], started: SystemTime) -> Meta {
        Meta {
            tool: "cargo xtask bench",
            unix_time: started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            quick,
            host_threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            devices: devices.iter().map(|d| format!("{}: {}", d.kind(), d.description())).collect(),
            notes: "times are wall-clock seconds per call including a device synchronisation; \
                    speedup = reference median / tilekit median; roof_fraction = achieved bytes/s \
                    over the device copy kernel's bytes/s at the same traffic; attainable_fraction = achieved \
                    GFLOP/s over min(copy GB/s × FLOP per byte, the device's compute peak: the CPU's \
                    multiply-add peak measured in the run, meta.cpu_peak); device_time = kernel time \
                    from GPU timestamps; tuned_speedup = default-config median / tuned median",
            cache_flush: false,
            cache_flush_bytes: None,
            tune: Vec::new(),
            cpu_peak: None,
        }
    }
}

/// `gflops` as a fraction of the rate a case can attain: the lower of the copy kernel's rate
/// times the case's FLOP per byte of least traffic (`flops / bytes`) and the compute peak.
pub fn attainable_fraction(gflops: f64, flops: f64, bytes: f64, copy_gbps: f64, peak_gflops: f64) -> f64 {
    gflops / (copy_gbps * flops / bytes).min(peak_gflops)
}

pub fn print_legend() {
    println!(
        "Times are medians of wall-clock runs ending in a device sync; dev ms = median kernel time from GPU \
         timestamps (wgpu), so wall - dev is launch and sync overhead.\nvs dflt = the same case with autotuning \
         off (default tile configs) / tuned, timed alternately (above 1: tuning pays).\n\
          GB/s counts the least traffic \
         (inputs read once, output written once);\nroof = that rate over the device's copy kernel at the same \
         traffic; att = GFLOP/s over the roof the row can reach, the lower of that copy rate × FLOP per byte \
         and the compute peak (the CPU's measured multiply-add peak, a GPU's known one). Ratios = reference time / tilekit time (above 1: tilekit is faster).\nReferences: gemm = the \
         gemm crate in f32 on the CPU; cpu = tilekit's CPU backend; naive = a naive WGSL matmul on the same \
         device;\nprev = the skinny-M kernel wgpu chose before the GEMV kernel (M <= 16: small-M for M <= 4, 16-row \
         tiles; on CUDA, B [K, N] with 5-32 rows: the register-tile GEMV and SIMT skinny kernels the \
         shared-memory GEMV ring replaced), or for dwconv3x3 the general depthwise kernel the tiled one replaced, same device;\nf64-ref = tilekit's naive f64 CPU reference (small cases only); ort = ONNX Runtime on the CPU (f32 rows \
         of the CPU backend, same shape, 2 intra-op threads; the matmul weight is a constant, which it packs once at \
         session creation, as tilekit's `packed` rows do; its Conv is NCHW only, so nhwc rows compare with its \
         NCHW kernel);\nort-in = ONNX Runtime with the matmul weight a graph input fed at every run (it multiplies \
         the weight as stored, as tilekit's unpacked rows do)."
    );
}

const HEADER: &str = "suite       op          shape                       dtype  check  median ms  min-max ms             dev ms    GFLOP/s     GB/s   roof    att  vs dflt   vs gemm   vs cpu  vs naive   vs prev  vs f64-ref    vs ort  vs ort-in  vs f16x2";

pub fn print_header() {
    println!("{HEADER}");
}

/// Prints a row as soon as its case has been measured (it doubles as progress).
pub fn print_row(row: &Row) {
    let mut line = format!("{:<11} {:<11} {:<27} {:<6}", row.suite, row.op, row.shape, row.dtype);
    let Some(s) = row.stats else {
        let why = match (&row.error, &row.check) {
            (Some(e), _) => format!("ERROR  {e}"),
            (None, Some(c)) => {
                format!("FAILED vs f64 reference ({}): {}", c.against, c.first_failure.as_deref().unwrap_or("?"))
            }
            (None, None) => "not run".into(),
        };
        println!("{line} {why}");
        return;
    };
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    let _ = write!(
        line,
        " ok{}    {:>9.3}  {:>8.3}-{:<9.3}  {:>9}  {:>9}  {:>7}  {:>5}  {:>5}  {:>7}  {:>8}  {:>7}  {:>8}  {:>8}  {:>10}  {:>8}  {:>9}  {:>8}",
        if row.flushed { "*" } else { " " },
        s.median_s * 1e3,
        s.min_s * 1e3,
        s.max_s * 1e3,
        opt(row.device_time.map(|d| d.median_s * 1e3), 3),
        opt(row.gflops, 2),
        opt(row.gbps, 2),
        row.roof_fraction.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0)),
        row.attainable_fraction.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0)),
        row.tuned_speedup.map_or("-".to_string(), |x| format!("{x:.2}x")),
        row.speedup("gemm"),
        row.speedup("cpu"),
        row.speedup("naive"),
        row.speedup("prev"),
        row.speedup("f64-ref"),
        row.speedup("ort"),
        row.speedup("ort-in"),
        row.speedup("f16x2"),
    );
    println!("{line}");
}

/// The geometric mean of tuned-over-default speedups per device, dtype and suite.
pub fn print_tune_summary(rows: &[Row]) {
    // (backend, dtype, suite) and the ratios, in the order the rows ran.
    type Group<'a> = ((&'a str, &'a str, &'a str), Vec<f64>);
    let mut groups: Vec<Group> = Vec::new();
    for r in rows {
        let Some(x) = r.tuned_speedup.filter(|x| x.is_finite() && *x > 0.0) else { continue };
        let key = (r.backend, r.dtype, r.suite);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(x),
            None => groups.push((key, vec![x])),
        }
    }
    if groups.is_empty() {
        return;
    }
    println!("\n== Tuned vs default tile configs (geometric mean of default time / tuned time; above 1: tuning pays)");
    for ((backend, dtype, suite), v) in groups {
        let geo = (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!("   {backend:<5} {dtype:<5} {suite:<11} {geo:.2}x over {} case(s) (range {lo:.2}x-{hi:.2}x)", v.len());
    }
}

/// The f16 rows timed both ways in one run: the f32-compute kernel (`Precision::Highest`, the
/// row) and the `vec2<f16>` kernel (`Precision::F16`, the `f16x2` reference).
pub fn print_f16x2_summary(rows: &[Row]) {
    let pairs: Vec<(&Row, f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            let f = r.references.iter().find(|x| x.name == "f16x2")?.stats?;
            Some((r, r.stats?.median_s, f.median_s))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!("\n== f16 matmul: f32 compute (Precision::Highest) vs vec2<f16> compute (Precision::F16), same run");
    for (r, hi, f16) in pairs {
        println!(
            "   {:<5} {:<27} f32-compute {:>9.3} ms  f16x2 {:>9.3} ms  f32/f16x2 {:.2}x",
            r.backend,
            r.shape,
            hi * 1e3,
            f16 * 1e3,
            hi / f16
        );
    }
}

/// The geometric mean of ONNX Runtime time / tilekit time per backend and dtype, with the
/// lowest row: the headline figure for the CPU backend. Twice: against ONNX Runtime with every
/// matmul weight pre-packed (`ort`), and like for like (`ort-in` where the row has it: tilekit's
/// unpacked matmul rows against ONNX Runtime multiplying the weight as stored).
pub fn print_ort_summary(rows: &[Row]) {
    let speedup = |r: &Row, name: &str| {
        r.references.iter().find(|x| x.name == name).and_then(|x| x.speedup).filter(|x| x.is_finite() && *x > 0.0)
    };
    // Each summary and the references it takes, the first one a row has.
    let kinds = [
        ("vs ort (ORT's weights pre-packed)", &["ort"][..]),
        ("like for like (vs ort-in where present)", &["ort-in", "ort"][..]),
    ];
    let mut printed = false;
    for (what, names) in kinds {
        let pick = |r: &Row| names.iter().find_map(|n| speedup(r, n));
        /// (backend, dtype) and its rows' (speedup, row name).
        type Group<'r> = ((&'r str, &'r str), Vec<(f64, String)>);
        let mut groups: Vec<Group> = Vec::new();
        for r in rows {
            let Some(x) = pick(r) else { continue };
            let key = (r.backend, r.dtype);
            let item = (x, format!("{} {}", r.op, r.shape));
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(item),
                None => groups.push((key, vec![item])),
            }
        }
        if groups.is_empty() {
            continue;
        }
        if !printed {
            println!(
                "\n== tilekit vs ONNX Runtime (geometric mean of ORT time / tilekit time; above 1: tilekit is faster)"
            );
            printed = true;
        }
        for ((backend, dtype), v) in groups {
            let ratios: Vec<f64> = v.iter().map(|(x, _)| *x).collect();
            let geo = super::ort::geomean(&ratios).unwrap_or(f64::NAN);
            let (lo, lo_case) =
                v.iter().fold((f64::INFINITY, ""), |acc, (x, c)| if *x < acc.0 { (*x, c) } else { acc });
            println!(
                "   {backend:<5} {dtype:<5} {what}: {geo:.2}x over {} row(s); lowest {lo:.2}x ({lo_case})",
                v.len()
            );
        }
    }
}

#[derive(Serialize)]
struct File<'a> {
    meta: &'a Meta,
    rows: &'a [Row],
}

/// Writes `path` (JSON) and the same rows as CSV next to it.
pub fn write(path: &Path, meta: &Meta, rows: &[Row]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(&File { meta, rows })?;
    std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    let csv_path = path.with_extension("csv");
    std::fs::write(&csv_path, csv(rows)).with_context(|| format!("writing {}", csv_path.display()))
}

fn csv(rows: &[Row]) -> String {
    let refs = ["gemm", "cpu", "naive", "prev", "f64-ref", "ort", "ort-in", "f16x2"];
    let mut out = String::from(
        "suite,op,shape,dtype,backend,ok,median_ms,min_ms,max_ms,runs,device_median_ms,default_config_median_ms,\
         tuned_speedup,flushed,gflops,gbps,copy_gbps,roof_fraction,attainable_fraction",
    );
    for r in refs {
        let _ = write!(out, ",{r}_median_ms,{r}_speedup");
    }
    out.push('\n');
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
    for row in rows {
        let s = row.stats;
        let _ = write!(
            out,
            "{},{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            row.suite,
            row.op,
            row.shape,
            row.dtype,
            row.backend,
            row.passed(),
            f(s.map(|s| s.median_s * 1e3)),
            f(s.map(|s| s.min_s * 1e3)),
            f(s.map(|s| s.max_s * 1e3)),
            s.map_or(0, |s| s.runs),
            f(row.device_time.map(|d| d.median_s * 1e3)),
            f(row.default_config.map(|d| d.median_s * 1e3)),
            f(row.tuned_speedup),
            row.flushed,
            f(row.gflops),
            f(row.gbps),
            f(row.copy_gbps),
            f(row.roof_fraction),
            f(row.attainable_fraction),
        );
        for name in refs {
            let r = row.references.iter().find(|r| r.name == name);
            let _ = write!(
                out,
                ",{},{}",
                f(r.and_then(|r| r.stats).map(|s| s.median_s * 1e3)),
                f(r.and_then(|r| r.speedup))
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::attainable_fraction;

    #[test]
    fn the_attainable_rate_is_the_lower_roof() {
        // 1 FLOP per byte at 50 GB/s: the memory roof (50 GFLOP/s) is below a 300 GFLOP/s peak.
        assert!((attainable_fraction(25.0, 1e9, 1e9, 50.0, 300.0) - 0.5).abs() < 1e-12);
        // 54 FLOP per byte (a 4-bit weight at M = 16, N = K = 4096): the peak is the roof.
        assert!((attainable_fraction(150.0, 54e9, 1e9, 50.0, 300.0) - 0.5).abs() < 1e-12);
    }
}
