//! `cargo xtask test`: the whole suite, with the backends it exercised and the skips it saw.
//!
//! 1. Makes sure a Vulkan driver is there for wgpu: on Debian/Ubuntu as root, installs lavapipe
//!    (`mesa-vulkan-drivers`) and the loader (`libvulkan1`); elsewhere prints the command.
//! 2. Prints the backend probe and which backends the suite will run on.
//! 3. Runs `cargo test --workspace --no-fail-fast` (extra arguments forwarded) with
//!    `TILEKIT_SKIP_LOG` pointing at a file where the test harness appends `SKIP <backend>:
//!    <reason>` lines and `TILEKIT_TUNE_CACHE` at an empty tune cache of this run's own (and
//!    `TILEKIT_TUNE` unset: the default configs, whatever the shell says), and
//!    prints a summary: tests per binary, skips, backends that ran, every failed test by name.
//!
//! A missing driver or GPU is a visible skip, never a crash of this command.

use crate::util::{cargo, project_root};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;
use tilekit::{Device, WgpuOptions};

/// Arguments of `cargo xtask test`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Never install packages, only say what is missing.
    #[arg(long)]
    no_install: bool,
    /// Extra arguments for `cargo test` (after `--`, e.g. `-- -p tilekit-tests -- gelu`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    cargo_args: Vec<String>,
}

/// The packages that give wgpu a software Vulkan device on Debian/Ubuntu.
const VULKAN_PACKAGES: [&str; 2] = ["mesa-vulkan-drivers", "libvulkan1"];

pub fn run(args: Args) -> Result<()> {
    let start = Instant::now();
    ensure_vulkan(args.no_install);
    let exercised = probe();

    // Files of this run only (named by process id): a second suite running at the same time
    // in the same checkout must neither reset this one's skip log nor share its tune cache.
    let dir = project_root().join("target").join("xtask");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let skip_log = dir.join(format!("skip-log-{}.txt", std::process::id()));
    std::fs::write(&skip_log, "").with_context(|| format!("resetting {}", skip_log.display()))?;
    // The suite's devices run in the default (cached) tune mode; without this they would read,
    // and prune stale entries from, the user's own cache (~/.cache/tilekit/tune.json), which
    // other processes (`cargo xtask tune`, benches, other checkouts) write at any time. An
    // empty cache of its own makes every test launch the default configs.
    let tune_cache = dir.join(format!("tune-cache-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&tune_cache);

    println!("\n== cargo test --workspace --no-fail-fast {}", args.cargo_args.join(" "));
    let ran = run_cargo_test(&args.cargo_args, &skip_log, &tune_cache);
    let skips = std::fs::read_to_string(&skip_log).unwrap_or_default();
    let _ = std::fs::remove_file(&skip_log);
    let _ = std::fs::remove_file(&tune_cache);
    let (status, results) = ran?;
    let failed = summarise(&results, &skips, &exercised, start);

    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    if !status.success() {
        bail!("cargo test exited with {status} (a build error or a crashed test binary; see above)");
    }
    Ok(())
}

/// Whether a Vulkan loader and the lavapipe driver are present.
fn vulkan_status() -> (bool, bool) {
    let icd_dir = Path::new("/usr/share/vulkan/icd.d");
    let lavapipe = std::fs::read_dir(icd_dir)
        .map(|dir| dir.flatten().any(|e| e.file_name().to_string_lossy().starts_with("lvp_icd")))
        .unwrap_or(false);
    // `ldconfig` lives in /sbin, which is not always on a non-root PATH.
    let loader = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"].iter().any(|exe| {
        Command::new(exe)
            .arg("-p")
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("libvulkan.so.1"))
            .unwrap_or(false)
    });
    (loader, lavapipe)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// Installs lavapipe where that is possible and wanted; otherwise says how.
fn ensure_vulkan(no_install: bool) {
    let (loader, lavapipe) = vulkan_status();
    if loader && lavapipe {
        println!("== Vulkan: loader (libvulkan.so.1) and lavapipe present");
        return;
    }
    let missing = match (loader, lavapipe) {
        (false, false) => "the Vulkan loader (libvulkan.so.1) and lavapipe",
        (false, true) => "the Vulkan loader (libvulkan.so.1)",
        _ => "lavapipe (no lvp_icd*.json in /usr/share/vulkan/icd.d)",
    };
    let command = format!("apt-get install -y --no-install-recommends {}", VULKAN_PACKAGES.join(" "));
    let debian = Path::new("/etc/debian_version").exists();
    if no_install || !debian || !is_root() {
        println!("== Vulkan: {missing} missing; the wgpu tests will be skipped.");
        if cfg!(target_os = "linux") {
            println!("   To run them on the software Vulkan device: sudo apt-get update && sudo {command}");
        }
        return;
    }
    println!("== Vulkan: {missing} missing; installing {}", VULKAN_PACKAGES.join(" "));
    // Waits up to 10 minutes for dpkg's lock, which another apt-get (a fresh machine's own
    // updates) may hold: without the wait the install fails at once.
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let ok =
        apt(&["update"]) && apt(&[&["install", "-y", "--no-install-recommends"][..], &VULKAN_PACKAGES[..]].concat());
    if !ok {
        println!("== Vulkan: the install failed; the wgpu tests will be skipped. Try: {command}");
    }
}

/// Prints the probe and returns the backends the suite will exercise.
fn probe() -> Vec<String> {
    println!("\n== Backend probe (Device::auto)");
    match Device::auto() {
        Ok(dev) => print!("{}", dev.probe_report()),
        Err(e) => println!("  Device::auto failed: {e}"),
    }
    let mut exercised = vec!["cpu".to_string()];
    println!("== What the suite asks for");
    println!("  cpu   always");
    match Device::wgpu(&WgpuOptions::allow_software()) {
        Ok(dev) => {
            let kind = if dev.is_software() { "software adapter" } else { "hardware adapter" };
            println!("  wgpu  {} ({kind})", dev.description());
            exercised.push("wgpu".into());
        }
        Err(e) => println!("  wgpu  skipped: {e}"),
    }
    match Device::cuda(0) {
        Ok(dev) => {
            println!("  cuda  {}", dev.description());
            exercised.push("cuda".into());
        }
        Err(e) => println!("  cuda  skipped: {e}"),
    }
    println!("== The suite will exercise: {}", exercised.join(", "));
    exercised
}

/// Counts of one test binary, and the names of its failed tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct BinaryResult {
    name: String,
    passed: u64,
    failed: u64,
    ignored: u64,
    /// The tests libtest reported as `test NAME ... FAILED`.
    failures: Vec<String>,
}

/// Runs `cargo test`, echoing its output, and collects the `test result:` lines.
fn run_cargo_test(
    extra: &[String],
    skip_log: &Path,
    tune_cache: &Path,
) -> Result<(std::process::ExitStatus, Vec<BinaryResult>)> {
    // One pipe for stdout and stderr keeps cargo's `Running ...` lines (stderr) in order with
    // the test binaries' `test result:` lines (stdout).
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-fail-fast"])
        .args(extra)
        .env("TILEKIT_SKIP_LOG", skip_log)
        .env("TILEKIT_TUNE_CACHE", tune_cache)
        .env_remove("TILEKIT_TUNE")
        .stdout(writer.try_clone().context("duplicating a pipe")?)
        .stderr(writer);
    let mut child = cmd.spawn().context("starting cargo test")?;
    // The command holds the write ends; drop it so the pipe closes when cargo exits.
    drop(cmd);

    let mut parser = ResultParser::default();
    let stdout = std::io::stdout();
    for line in BufReader::new(reader).lines() {
        let line = line.context("reading cargo test's output")?;
        let mut out = stdout.lock();
        // A closed terminal must not stop the suite; the summary is best effort then.
        let _ = writeln!(out, "{line}");
        parser.line(&line);
    }
    let status = child.wait().context("waiting for cargo test")?;
    Ok((status, parser.finish()))
}

/// Turns cargo test's output into per-binary counts and failed test names.
#[derive(Debug, Default)]
struct ResultParser {
    current: Option<String>,
    /// Failed tests of the current binary, before its `test result:` line.
    failures: Vec<String>,
    results: Vec<BinaryResult>,
}

impl ResultParser {
    fn line(&mut self, line: &str) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Running ") {
            self.binary_ended_without_result();
            self.current = Some(binary_name(rest));
        } else if let Some(rest) = t.strip_prefix("Doc-tests ") {
            self.binary_ended_without_result();
            self.current = Some(format!("doc-tests {}", rest.trim()));
        } else if let Some(name) = t.strip_prefix("test ").and_then(|r| r.strip_suffix(" ... FAILED")) {
            self.failures.push(name.trim().to_string());
        } else if let Some(rest) = t.strip_prefix("test result: ") {
            let mut r = BinaryResult {
                name: self.current.take().unwrap_or_else(|| "?".into()),
                failures: std::mem::take(&mut self.failures),
                ..Default::default()
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(label), Some(count)) = (words.next(), words.next()) else { continue };
                let Ok(count) = count.parse::<u64>() else { continue };
                match label {
                    "passed" => r.passed = count,
                    "failed" => r.failed = count,
                    "ignored" => r.ignored = count,
                    _ => {}
                }
            }
            self.results.push(r);
        }
    }

    /// A binary that reported failed tests but no `test result:` line (it crashed or was
    /// killed): its failures still count.
    fn binary_ended_without_result(&mut self) {
        if !self.failures.is_empty() {
            let name = format!("{} (no result line)", self.current.take().unwrap_or_else(|| "?".into()));
            let failures = std::mem::take(&mut self.failures);
            self.results.push(BinaryResult { name, failed: failures.len() as u64, failures, ..Default::default() });
        }
    }

    /// The results, including a last binary that ended without a result line.
    fn finish(mut self) -> Vec<BinaryResult> {
        self.binary_ended_without_result();
        self.results
    }
}

/// `unittests src/lib.rs (target/debug/deps/tilekit-0123abcd)` → `tilekit unittests src/lib.rs`.
fn binary_name(running: &str) -> String {
    let running = running.trim();
    let Some((what, path)) = running.rsplit_once(" (") else { return running.to_string() };
    let file = path.trim_end_matches(')').rsplit('/').next().unwrap_or(path);
    // Cargo names test binaries `<crate>-<16 hex digits>`.
    let krate = match file.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => name,
        _ => file,
    };
    format!("{krate} {what}")
}

/// Prints the summary; returns the number of failed tests.
fn summarise(results: &[BinaryResult], skips: &str, exercised: &[String], start: Instant) -> u64 {
    println!("\n== Summary");
    let width = results.iter().map(|r| r.name.len()).max().unwrap_or(0).max(10);
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for r in results {
        let flag = if r.failed > 0 { "  <-- FAILED" } else { "" };
        println!(
            "  {:<width$}  {:>5} passed  {:>3} failed  {:>3} ignored{flag}",
            r.name, r.passed, r.failed, r.ignored
        );
        passed += r.passed;
        failed += r.failed;
        ignored += r.ignored;
    }
    println!(
        "  {:<width$}  {passed:>5} passed  {failed:>3} failed  {ignored:>3} ignored  ({} binaries)",
        "total",
        results.len()
    );

    // Identical skip lines (one per test that met the same missing backend) are counted once.
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for line in skips.lines().map(str::trim).filter(|l| !l.is_empty()) {
        *counts.entry(line).or_default() += 1;
    }
    let total: usize = counts.values().sum();
    println!("  skips: {total}");
    for (line, n) in &counts {
        println!("    {n:>4} x {line}");
    }
    let skipped: Vec<&str> = counts
        .keys()
        .filter_map(|l| l.strip_prefix("SKIP ").and_then(|r| r.split(':').next()))
        .map(str::trim)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!("  backends exercised: {}", exercised.join(", "));
    if !skipped.is_empty() {
        println!("  backends with skipped cases: {}", skipped.join(", "));
    }
    println!("  time: {:.0} s", start.elapsed().as_secs_f64());
    // Every failed test by name, so a red log says which ones without scrolling.
    let failures: Vec<(&str, &str)> =
        results.iter().flat_map(|r| r.failures.iter().map(move |f| (r.name.as_str(), f.as_str()))).collect();
    if !failures.is_empty() {
        println!("  failed tests:");
        for (binary, test) in &failures {
            println!("    FAILED {test}  ({binary})");
        }
    }
    let unnamed = failed.saturating_sub(failures.len() as u64);
    if unnamed > 0 {
        println!("  ({unnamed} failed test(s) without a `test ... FAILED` line; see the output above)");
    }
    // The plain closing line CI systems read: tests run, failed, and skip lines counted.
    println!("tests: {passed} passed, {failed} failed, {total} skipped");
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cargo_test_output() {
        let mut p = ResultParser::default();
        for line in [
            "     Running unittests src/lib.rs (target/debug/deps/tilekit-0123456789abcdef)",
            "running 3 tests",
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "     Running tests/ops.rs (target/debug/deps/ops-fedcba9876543210)",
            "test ops::matmul_edges ... FAILED",
            "test ops::activation ... ok",
            "test load::memory_is_flat ... FAILED",
            "test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.5s",
            "   Doc-tests tilekit",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.3s",
        ] {
            p.line(line);
        }
        let results = p.finish();
        let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["tilekit unittests src/lib.rs", "ops tests/ops.rs", "doc-tests tilekit"]);
        assert_eq!((results[0].passed, results[0].ignored), (3, 1));
        assert_eq!((results[1].passed, results[1].failed), (10, 2));
        assert_eq!(results[1].failures, ["ops::matmul_edges", "load::memory_is_flat"]);
        assert!(results[0].failures.is_empty() && results[2].failures.is_empty());
    }

    #[test]
    fn a_binary_without_a_result_line_keeps_its_failures() {
        let mut p = ResultParser::default();
        for line in [
            "     Running tests/a.rs (target/debug/deps/a-0123456789abcdef)",
            "test one ... FAILED",
            "error: test failed, to rerun pass `--test a`",
            "     Running tests/b.rs (target/debug/deps/b-0123456789abcdef)",
            "test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s",
        ] {
            p.line(line);
        }
        let results = p.finish();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].name, "a tests/a.rs (no result line)");
        assert_eq!((results[0].failed, results[0].failures.clone()), (1, vec!["one".to_string()]));
        assert_eq!(results[1].passed, 4);
    }
}
