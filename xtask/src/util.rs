//! Small helpers the subcommands share.

use std::path::PathBuf;
use std::process::Command;

/// The workspace root (the folder holding the top-level `Cargo.toml`).
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// A `cargo` command: the cargo that runs the xtask when there is one (`cargo run` sets
/// `CARGO`), else the one on `PATH`, started in the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(project_root());
    cmd
}

/// `s` on one line: each line break and the indentation around it become one space (some
/// dependencies' errors, such as npyz's header parser, span several lines).
pub fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}
