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

/// Gives Mesa a runtime folder when the environment has none (CI containers, `sudo`), so
/// lavapipe does not print "error: XDG_RUNTIME_DIR is invalid" on every device it opens —
/// harmless, but it reads like a failure in the test and bench logs.
pub fn ensure_xdg_runtime_dir() {
    if !cfg!(target_os = "linux") || std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("tilekit-xdg-runtime");
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Mesa wants the folder private to the user, as the XDG spec says.
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    // SAFETY: called first thing in `main`, before the xtask starts any thread, so nothing
    // can read the environment concurrently.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
}
