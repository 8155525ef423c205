//! The `tilekit` crate's cargo features shape its dependency tree: `--no-default-features`
//! is a CPU-only tilekit with neither wgpu nor cudarc, and each GPU feature brings only its own
//! runtime (for the host target, offline, over the workspace's lock file).

use std::process::Command;

/// The package names in `tilekit`'s normal dependency tree under `features` (cargo flags).
fn tilekit_dependencies(features: &[&str]) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-p", "tilekit", "-e", "normal"])
        .args(features)
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Which GPU runtimes a tree holds: (any `wgpu*` crate, any `cudarc` crate).
fn runtimes(features: &[&str]) -> (bool, bool) {
    let deps = tilekit_dependencies(features);
    assert!(deps.iter().any(|d| d == "gemm"), "the tree should hold the CPU backend's dependencies: {deps:?}");
    (deps.iter().any(|d| d.starts_with("wgpu")), deps.iter().any(|d| d == "cudarc"))
}

#[test]
fn each_feature_brings_only_its_own_runtime() {
    assert_eq!(runtimes(&["--no-default-features"]), (false, false), "a CPU-only tilekit pulls in a GPU runtime");
    assert_eq!(runtimes(&["--no-default-features", "--features", "wgpu"]), (true, false));
    assert_eq!(runtimes(&["--no-default-features", "--features", "cuda"]), (false, true));
    // The default has both: the same query sees them where they are.
    assert_eq!(runtimes(&[]), (true, true));
}
