//! Every WGSL module parses and validates with naga.
//!
//! The style rule is that each file under `shaders/wgsl/` is valid WGSL as it stands (editors
//! and naga can check it), so every file is validated on its own. Once the kernel catalogue
//! lists its modules (`tilekit_kernels::catalogue::wgsl`), those exact sources are the ones the
//! device compiles and are worth validating too.

use std::path::{Path, PathBuf};
use tilekit_tests::skip;

/// Parses and validates one WGSL source with every capability naga knows (f16 included; the
/// device-side feature check is the backend's job, not the shader's).
fn validate(name: &str, source: &str) -> Result<(), String> {
    let module =
        naga::front::wgsl::parse_str(source).map_err(|e| format!("{name}: parse: {}", e.emit_to_string(source)))?;
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    validator.validate(&module).map_err(|e| format!("{name}: validate: {}", e.emit_to_string(source)))?;
    Ok(())
}

fn wgsl_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("shaders").join("wgsl")
}

#[test]
fn every_wgsl_file_validates() {
    let dir = wgsl_dir();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    if files.is_empty() {
        skip("naga", &format!("no WGSL files under {}", dir.display()));
        return;
    }
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match std::fs::read_to_string(path) {
            Ok(source) => {
                if let Err(e) = validate(&name, &source) {
                    failures.push(e);
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!("naga: {} WGSL files checked", files.len());
    assert!(failures.is_empty(), "{} of {} WGSL files fail:\n{}", failures.len(), files.len(), failures.join("\n"));
}

#[test]
fn validator_rejects_broken_wgsl() {
    // The check itself must be able to fail: a type error and a syntax error.
    assert!(validate("type error", "fn f() -> f32 { return 1u; }").is_err());
    assert!(validate("syntax error", "fn f( {").is_err());
    assert!(validate("fine", "@compute @workgroup_size(1) fn main() {}").is_ok());
}
