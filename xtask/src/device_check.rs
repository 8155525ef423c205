//! `cargo xtask device-check`: builds the folder a GPU machine runs.
//!
//! The GPU machines we borrow are x86-64 Linux like this one but have no Rust toolchain and no
//! network, so everything is built here in release mode and carried over:
//!
//! ```text
//! target/device-check/
//!   run.sh                  the runner (bash; needs nothing but coreutils' `timeout`)
//!   tilekit-cuda-device     CUDA checks against the CPU backend, and the CUDA bench
//!   tests/<name>            the test binaries of tilekit, tilekit-kernels, tilekit-tests and
//!                           tilekit-models (the whole MobileNetV2 on every backend)
//!   examples/mobilenet_v2   the example `tests/mobilenet_example-test` runs (it looks for it
//!                           beside its own folder, as in `target/<profile>/`)
//!   results/                written by run.sh: JSON and logs
//! ```
//!
//! `run.sh` runs, each step under its own time limit so the whole stays inside ten minutes:
//! 1. `tilekit-cuda-device check`: every CUDA op, dtype and kernel variant on edge shapes
//!    against the native CPU backend (`results/check.json`);
//! 2. every test binary, side by side (each tests every backend it can create: CPU, wgpu on
//!    the NVIDIA Vulkan driver, CUDA; skips go to `results/skips.log`)
//!    (`results/tests-<name>.log`); among them, in tilekit's unit tests,
//!    `coop_kernel_matches_the_reference_where_the_device_has_it` runs the cooperative-matrix
//!    WGSL matmul against the reference where wgpu's Vulkan adapter reports cooperative
//!    matrices (the NVIDIA driver's `VK_KHR_cooperative_matrix` with 16×16×16 f16→f32), and
//!    prints a SKIP line naming the adapter where it does not;
//! 3. `tilekit-cuda-device bench`: matmul 4096³ f32/f16/bf16 (and f32 with bf16 products)
//!    against cuBLAS, skinny M = 1..32 × 4096 × 4096, MobileNetV2's depthwise layers in both
//!    layouts, GELU over 256 MiB against the copy kernel (`results/bench.json`);
//! 4. `results/summary.json`: the exit status and duration of every step.

use anyhow::{Context, Result, ensure};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Arguments of `cargo xtask device-check`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to put the folder (default: `target/device-check`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Test packages whose binaries the runner executes.
const TEST_PACKAGES: [&str; 4] = ["tilekit", "tilekit-kernels", "tilekit-tests", "tilekit-models"];

const RUNNER: &str = r#"#!/usr/bin/env bash
# tilekit device check: run on a machine with an NVIDIA GPU (built by `cargo xtask device-check`).
# Every step has its own time limit; the whole stays under ten minutes.
set -u
cd "$(dirname "$0")"
mkdir -p results
summary=results/summary.json
echo "{" > "$summary"
first=1

# cuBLAS is not on the default library path on most machines: add the toolkit's folder and
# PyTorch's wheel folder when they exist.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export RUST_BACKTRACE=1

# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND with a time limit, logs to results/NAME.log
# and records the exit status and duration in summary.json.
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s.%N)
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=5 "$limit" "$@" > "results/$name.log" 2>&1
    local rc=$?
    local t1=$(date +%s.%N)
    tail -n 5 "results/$name.log"
    echo "   -> exit $rc"
    [ $first -eq 1 ] || echo "," >> "$summary"
    first=0
    printf '  "%s": {"exit": %d, "seconds": %s}' "$name" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" >> "$summary"
}

nvidia-smi > results/nvidia-smi.txt 2>&1 || true

step check 150 ./tilekit-cuda-device check --json results/check.json

# The test binaries test every backend they find (CPU, wgpu, CUDA) and print a SKIP line for
# each one they cannot create. They run side by side, each under its own limit, so the whole
# suite costs the time of the slowest binary. `--show-output` keeps what passing tests print
# (which adapter ran, NOTE and SKIP lines of single tests) in the logs.
export TILEKIT_SKIP_LOG=results/skips.log
echo "== tests (each binary limited to 150s, all at once)"
for t in tests/*; do
    n=$(basename "$t")
    (
        t0=$(date +%s.%N)
        timeout --kill-after=5 150 "$t" --show-output > "results/tests-$n.log" 2>&1
        echo "$? $(awk "BEGIN{print $(date +%s.%N) - $t0}")" > "results/tests-$n.rc"
    ) &
done
wait
for t in tests/*; do
    n=$(basename "$t")
    read -r rc secs < "results/tests-$n.rc"
    echo "   tests-$n -> exit $rc ($(grep -E '^test result' "results/tests-$n.log" | tail -n 1))"
    [ $first -eq 1 ] || echo "," >> "$summary"
    first=0
    printf '  "tests-%s": {"exit": %d, "seconds": %s}' "$n" "$rc" "$secs" >> "$summary"
done
step bench 240 ./tilekit-cuda-device bench --json results/bench.json

echo "" >> "$summary"
echo "}" >> "$summary"
echo "results in $(pwd)/results"
"#;

pub fn run(args: Args) -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).context("workspace root")?;
    let out = args.out.unwrap_or_else(|| root.join("target/device-check"));
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))?;

    // The device binary, and the example a test binary runs.
    release_build(&root, &["-p", "xtask", "--bin", "tilekit-cuda-device"])?;
    copy_stripped(&root.join("target/release/tilekit-cuda-device"), &out.join("tilekit-cuda-device"))?;
    release_build(&root, &["-p", "tilekit", "--example", "mobilenet_v2"])?;
    std::fs::create_dir_all(out.join("examples"))?;
    copy_stripped(&root.join("target/release/examples/mobilenet_v2"), &out.join("examples/mobilenet_v2"))?;

    // The test binaries: cargo prints each one's path in its JSON messages.
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(&root).args(["test", "--release", "--no-run", "--message-format=json"]);
    for p in TEST_PACKAGES {
        cmd.args(["-p", p]);
    }
    let output = cmd.stderr(Stdio::inherit()).output().context("running cargo test --no-run")?;
    ensure!(output.status.success(), "building the test binaries failed");
    let mut count = 0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str()) else { continue };
        if msg["profile"]["test"].as_bool() != Some(true) {
            continue;
        }
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
        copy_stripped(Path::new(exe), &out.join("tests").join(format!("{name}-{kind}")))?;
        count += 1;
    }

    let runner = out.join("run.sh");
    std::fs::write(&runner, RUNNER)?;
    set_executable(&runner)?;
    println!(
        "device-check: {} with {count} test binaries; run `bash {}/run.sh` on the GPU machine",
        out.display(),
        out.display()
    );
    Ok(())
}

/// `cargo build --release` with `args` in the workspace at `root`.
fn release_build(root: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["build", "--release"])
        .args(args)
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build --release {} failed", args.join(" "));
    Ok(())
}

/// Copies a binary, dropping its debug information and symbol table when `strip` is present:
/// the folder has to travel (the device tool carries at most 64 MiB). Stripped, the folder
/// still comes to about 380 MB (24 test binaries, the example, the device binary): compressed
/// with `xz -9` (their code is largely the same) it took 13–17 MB. Panics still print their
/// messages; only backtraces lose function names.
fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    // `strip` is optional: without it the binary is only larger.
    let _ = Command::new("strip").arg("--strip-all").arg(to).status();
    set_executable(to)
}

#[cfg(unix)]
fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm)?;
    Ok(())
}

#[cfg(not(unix))]
fn set_executable(_p: &Path) -> Result<()> {
    Ok(())
}
