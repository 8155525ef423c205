//! Every WGSL module parses and validates with naga.
//!
//! The files under `shaders/wgsl/` are a common prelude and kernel bodies; the kernel catalogue
//! (`tilekit_kernels::catalogue::wgsl::all_modules`) composes them, per storage variant, into
//! the exact sources the device compiles. Those composed modules are what is validated here,
//! every one of them, and every file under `shaders/wgsl/` must be part of at least one of
//! them, so no WGSL escapes the check.

use std::path::{Path, PathBuf};
use tilekit::kernels::catalogue::wgsl::{
    ElementStorage, Kernel, MATMUL_SHORT_TILE_CANDIDATES, MATMUL_TILE_CANDIDATES, MatmulSwitches, Spec, WgslModule,
    all_modules, matmul_candidates, module_with, skinny_candidates,
};
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

/// Every matmul pipeline the backends build (each tuning candidate, in each storage variant,
/// specialised to several sets of switches) validates once its `override` constants are
/// applied with naga's `process_overrides`, the step wgpu runs when it builds a pipeline: the
/// override-sized workgroup arrays, the folded branches and the constant expressions are all
/// checked with the values a device would see.
#[test]
fn every_matmul_specialisation_validates() {
    let switch_sets = [
        MatmulSwitches::default(),
        MatmulSwitches { trans_a: true, trans_b: false, bias: true, c: false, act: 1 },
        MatmulSwitches { trans_a: false, trans_b: true, bias: false, c: true, act: 3 },
        MatmulSwitches { trans_a: true, trans_b: true, bias: true, c: true, act: 4 },
    ];
    let mut checked = 0;
    let mut failures = Vec::new();
    for m in [2, 10, 100] {
        // The tiled and small-M kernels the bench still compares against are built too.
        let (old_kernel, old_candidates) = skinny_candidates(m);
        let (kernel, candidates) = matmul_candidates(m);
        let pairs =
            candidates.into_iter().map(|s| (kernel, s)).chain(old_candidates.into_iter().map(|s| (old_kernel, s)));
        for (kernel, spec) in pairs {
            for switches in switch_sets {
                for storage in ElementStorage::ALL {
                    let module = module_with(kernel, storage, Spec { switches, ..spec });
                    let what = format!("{} {:?} {switches:?}", module.name, spec.tile);
                    if let Err(e) = specialise(&module) {
                        failures.push(format!("{what}: {e}"));
                    }
                    checked += 1;
                }
            }
        }
    }
    eprintln!("naga: {checked} matmul specialisations validated after process_overrides");
    assert!(failures.is_empty(), "{} of {checked} fail:\n{}", failures.len(), failures.join("\n"));
}

/// Every pipeline of the f16-compute kernel (`matmul_f16x2.wgsl`, `Precision::F16`) validates
/// after `process_overrides`: each tuning candidate of the tiled kernel (it takes the same
/// tiles), each activation, every combination of transposes, bias and C.
#[test]
fn every_f16x2_specialisation_validates() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let tiles = MATMUL_TILE_CANDIDATES.iter().chain(&MATMUL_SHORT_TILE_CANDIDATES);
    for &tile in tiles {
        for bits in 0..16u32 {
            for act in [0, 1, 2, 3, 4, 5] {
                // Every switch set with the default tile; a few with the others.
                if tile != MATMUL_TILE_CANDIDATES[0] && (bits % 5 != 0 || act % 2 != 0) {
                    continue;
                }
                let switches = MatmulSwitches {
                    trans_a: bits & 1 != 0,
                    trans_b: bits & 2 != 0,
                    bias: bits & 4 != 0,
                    c: bits & 8 != 0,
                    act,
                };
                let module =
                    module_with(Kernel::MatmulF16x2, ElementStorage::F16, Spec { tile, switches, ..Spec::DEFAULT });
                if let Err(e) = specialise(&module) {
                    failures.push(format!("{} {tile:?} {switches:?}: {e}", module.name));
                }
                checked += 1;
            }
        }
    }
    eprintln!("naga: {checked} f16x2 matmul specialisations validated after process_overrides");
    assert!(failures.is_empty(), "{} of {checked} fail:\n{}", failures.len(), failures.join("\n"));
}

/// Parses, validates and specialises one module with its override values.
fn specialise(m: &WgslModule) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(&m.source).map_err(|e| e.emit_to_string(&m.source))?;
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let info = validator.validate(&module).map_err(|e| e.emit_to_string(&m.source))?;
    let mut constants = naga::back::PipelineConstants::default();
    for &(name, value) in &m.overrides {
        constants.insert(name.to_string(), value);
    }
    let stage = Some((naga::ShaderStage::Compute, m.entry_point));
    naga::back::pipeline_constants::process_overrides(&module, &info, stage, &constants)
        .map_err(|e| format!("process_overrides: {e}"))?;
    Ok(())
}

#[test]
fn validator_rejects_broken_wgsl() {
    // The check itself must be able to fail: a type error and a syntax error.
    assert!(validate("type error", "fn f() -> f32 { return 1u; }").is_err());
    assert!(validate("syntax error", "fn f( {").is_err());
    assert!(validate("fine", "@compute @workgroup_size(1) fn main() {}").is_ok());
}

/// Every GEMV pipeline validates after `process_overrides`: both reductions (workgroup memory
/// and subgroups), every row count 1 to 16, every workgroup-size candidate, each storage
/// variant, several sets of switches.
#[test]
fn every_gemv_specialisation_validates() {
    let switch_sets = [
        MatmulSwitches::default(),
        MatmulSwitches { trans_a: false, trans_b: true, bias: true, c: false, act: 1 },
        MatmulSwitches { trans_a: true, trans_b: false, bias: false, c: true, act: 3 },
        MatmulSwitches { trans_a: true, trans_b: true, bias: true, c: true, act: 4 },
    ];
    let mut checked = 0;
    let mut failures = Vec::new();
    for kernel in [Kernel::Gemv, Kernel::GemvSubgroup] {
        for m in 1..=16 {
            for spec in matmul_candidates(m).1 {
                // Every row count with the default workgroup, every workgroup at 1 and 16 rows.
                if spec.wg != matmul_candidates(m).1[0].wg && m != 1 && m != 16 {
                    continue;
                }
                for switches in switch_sets {
                    for storage in ElementStorage::ALL {
                        let module = module_with(kernel, storage, Spec { switches, ..spec });
                        if let Err(e) = specialise(&module) {
                            failures.push(format!("{} rows {m} wg {} {switches:?}: {e}", module.name, spec.wg));
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("naga: {checked} gemv specialisations validated after process_overrides");
    assert!(checked >= 2 * 16 * 4 * 4);
    assert!(failures.is_empty(), "{} of {checked} fail:\n{}", failures.len(), failures.join("\n"));
}

/// Every quantized-matmul pipeline validates after `process_overrides`: each format, the decode
/// kernel (both reductions, rows 1, 5 and 16) and the tiled kernel, each storage variant of A.
/// (Their switches are parameters, not overrides: the switch sets must all give one module.)
#[test]
fn every_quant_specialisation_validates() {
    use tilekit::kernels::catalogue::wgsl::{QuantFormat, qmatmul};
    let switch_sets = [
        MatmulSwitches { trans_b: true, ..MatmulSwitches::default() },
        MatmulSwitches { trans_a: true, trans_b: true, bias: true, c: false, act: 1 },
        MatmulSwitches { trans_a: false, trans_b: true, bias: true, c: true, act: 5 },
    ];
    let mut checked = 0;
    let mut failures = Vec::new();
    for format in QuantFormat::ALL {
        for (m, subgroups) in [(1, true), (5, false), (16, true), (16, false), (17, true)] {
            let (kernel, spec) = qmatmul::choose(format, m, subgroups);
            for switches in switch_sets {
                for storage in ElementStorage::ALL {
                    let module = module_with(kernel, storage, Spec { switches, ..spec });
                    assert_eq!(module, module_with(kernel, storage, spec), "{}", module.name);
                    if let Err(e) = specialise(&module) {
                        failures.push(format!("{} rows {m} {switches:?}: {e}", module.name));
                    }
                    checked += 1;
                }
            }
        }
    }
    eprintln!("naga: {checked} quantized matmul specialisations validated after process_overrides");
    assert!(checked >= 5 * 5 * 3 * 4);
    assert!(failures.is_empty(), "{} of {checked} fail:\n{}", failures.len(), failures.join("\n"));
}

/// Every cooperative-matrix pipeline validates after `process_overrides`: both tile sizes, the
/// workgroups of subgroups of 8, 32 and 64 (4 subgroups each), several sets of switches. (Only
/// native f16 storage exists for it; `backend/wgpu/tests/coop.rs` also turns them into SPIR-V.)
#[test]
fn every_coop_specialisation_validates() {
    use tilekit::kernels::catalogue::wgsl::CoopSize;
    let switch_sets = [
        MatmulSwitches::default(),
        MatmulSwitches { trans_a: true, trans_b: false, bias: true, c: false, act: 2 },
        MatmulSwitches { trans_a: false, trans_b: true, bias: false, c: true, act: 4 },
        MatmulSwitches { trans_a: true, trans_b: true, bias: true, c: true, act: 5 },
    ];
    let mut checked = 0;
    let mut failures = Vec::new();
    for size in CoopSize::ALL {
        let kernel = Kernel::MatmulCoop(size);
        assert_eq!(kernel.storages(), &[ElementStorage::F16]);
        for wg in [32, 128, 256] {
            for switches in switch_sets {
                let module = module_with(kernel, ElementStorage::F16, Spec { wg, switches, ..Spec::DEFAULT });
                assert!(module.needs_f16 && module.source.contains("enable wgpu_cooperative_matrix;"));
                if let Err(e) = specialise(&module) {
                    failures.push(format!("{} wg {wg} {switches:?}: {e}", module.name));
                }
                checked += 1;
            }
        }
    }
    eprintln!("naga: {checked} cooperative-matrix specialisations validated after process_overrides");
    assert_eq!(checked, 2 * 3 * 4);
    assert!(failures.is_empty(), "{} of {checked} fail:\n{}", failures.len(), failures.join("\n"));
}
