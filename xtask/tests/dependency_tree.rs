//! The kernels crate stays runtime-free: no wgpu and no cudarc anywhere in its normal
//! dependency tree (for the host target: `--target all` would need every platform's crates
//! downloaded, and this test runs offline). (ARCHITECTURE.md's invariant; an engine with its own device
//! takes just this crate.)

use std::process::Command;

/// The package names in `package`'s normal (non-dev, non-build) dependency tree, from
/// `cargo tree` over the workspace's lock file.
fn normal_dependencies(package: &str) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-p", package, "-e", "normal"])
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

fn runtimes(deps: &[String]) -> Vec<&String> {
    deps.iter().filter(|d| d.starts_with("wgpu") || d.starts_with("cudarc")).collect()
}

#[test]
fn the_kernels_crate_depends_on_no_gpu_runtime() {
    let deps = normal_dependencies("tilekit-kernels");
    assert!(deps.iter().any(|d| d == "tilekit-kernels"), "cargo tree listed nothing: {deps:?}");
    assert!(deps.iter().any(|d| d == "half"), "the tree should hold the kernels' own dependencies: {deps:?}");
    assert!(runtimes(&deps).is_empty(), "tilekit-kernels pulls in a GPU runtime: {:?}", runtimes(&deps));
}

/// The same query sees the runtimes where they are: the check above can fail.
#[test]
fn the_dispatch_crate_does_depend_on_them() {
    let deps = normal_dependencies("tilekit");
    assert!(deps.iter().any(|d| d == "wgpu"), "{deps:?}");
    assert!(deps.iter().any(|d| d == "cudarc"), "{deps:?}");
}
