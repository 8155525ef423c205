//! Every WGSL module parses and validates with naga.
//!
//! The files under `shaders/wgsl/` are a common prelude and kernel bodies; the kernel catalogue
//! (`tilekit_kernels::catalogue::wgsl::all_modules`) composes them, per storage variant, into
//! the exact sources the device compiles. Those composed modules are what is validated here,
//! every one of them, and every file under `shaders/wgsl/` must be part of at least one of
//! them, so no WGSL escapes the check.

use std::path::{Path, PathBuf};
use tilekit::kernels::catalogue::wgsl::all_modules;
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

fn wgsl_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("shaders").join("wgsl");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

#[test]
fn every_catalogue_module_validates() {
    let modules = all_modules();
    if modules.is_empty() {
        skip("naga", "the WGSL catalogue lists no modules");
        return;
    }
    let failures: Vec<String> = modules.iter().filter_map(|m| validate(&m.name, &m.source).err()).collect();
    let f16 = modules.iter().filter(|m| m.needs_f16).count();
    eprintln!("naga: {} catalogue modules validated ({f16} with `enable f16`)", modules.len());
    assert!(failures.is_empty(), "{} of {} modules fail:\n{}", failures.len(), modules.len(), failures.join("\n"));
}

#[test]
fn every_wgsl_file_is_in_a_validated_module() {
    let files = wgsl_files();
    if files.is_empty() {
        skip("naga files", "no WGSL files under shaders/wgsl");
        return;
    }
    let modules = all_modules();
    let mut missing = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if !modules.iter().any(|m| m.source.contains(text.trim())) {
            missing.push(path.display().to_string());
        }
    }
    eprintln!("naga: {} WGSL files, each inside a catalogue module", files.len());
    assert!(missing.is_empty(), "WGSL files that no catalogue module includes (so never validated): {missing:?}");
}

#[test]
fn validator_rejects_broken_wgsl() {
    // The check itself must be able to fail: a type error and a syntax error.
    assert!(validate("type error", "fn f() -> f32 { return 1u; }").is_err());
    assert!(validate("syntax error", "fn f( {").is_err());
    assert!(validate("fine", "@compute @workgroup_size(1) fn main() {}").is_ok());
}
