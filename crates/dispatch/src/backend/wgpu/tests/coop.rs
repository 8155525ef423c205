//! The cooperative-matrix matmul where it cannot run: its modules compile to SPIR-V (what the
//! Vulkan backend would hand the driver), and on a device without the feature (lavapipe) the
//! selection falls back, the module is never built and the results are those of the usual
//! kernels. (The selection rule itself is unit-tested in `catalogue::wgsl::coopmat`.)

use super::*;
use tilekit_kernels::catalogue::wgsl::{CoopSize, MatmulSwitches};
use wgpu::naga;

/// The naga capabilities the kernel's features give (`wgpu-naga-bridge`: SHADER_F16 →
/// SHADER_FLOAT16, SUBGROUP → SUBGROUP, EXPERIMENTAL_COOPERATIVE_MATRIX → COOPERATIVE_MATRIX).
fn coop_caps() -> naga::valid::Capabilities {
    use naga::valid::Capabilities as C;
    C::SHADER_FLOAT16 | C::SUBGROUP | C::COOPERATIVE_MATRIX
}

/// The module of `size` with `switches` as SPIR-V 1.6 after `process_overrides` (the steps wgpu
/// runs for a Vulkan pipeline), validated with `caps`.
fn spirv(size: CoopSize, switches: MatmulSwitches, caps: naga::valid::Capabilities) -> Result<Vec<u32>, String> {
    let spec = Spec { wg: 128, switches, ..Spec::DEFAULT };
    spirv_of(&cat::module_with(Kernel::MatmulCoop(size), ElementStorage::F16, spec), caps)
}

fn spirv_of(m: &cat::WgslModule, caps: naga::valid::Capabilities) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(&m.source).map_err(|e| e.emit_to_string(&m.source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(&m.source))?;
    let constants: naga::back::PipelineConstants = m.overrides.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    let stage = Some((naga::ShaderStage::Compute, m.entry_point));
    let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, stage, &constants)
        .map_err(|e| format!("process_overrides: {e}"))?;
    let options = naga::back::spv::Options { lang_version: (1, 6), ..Default::default() };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: m.entry_point.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| format!("spv: {e}"))
}

/// Opcodes of a SPIR-V word stream (after the 5-word header).
fn opcodes(words: &[u32]) -> Vec<u32> {
    let mut ops = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        ops.push(words[i] & 0xffff);
        i += count.max(1);
    }
    ops
}

#[test]
fn coop_modules_compile_to_spirv_with_cooperative_matrix_ops() {
    // SPIR-V opcodes of SPV_KHR_cooperative_matrix (the `spirv` crate's `Op`).
    const LOAD: u32 = 4457;
    const STORE: u32 = 4458;
    const MUL_ADD: u32 = 4459;
    let switch_sets = [
        MatmulSwitches::default(),
        MatmulSwitches { trans_a: true, trans_b: false, bias: true, c: false, act: 1 },
        MatmulSwitches { trans_a: false, trans_b: true, bias: false, c: true, act: 3 },
        MatmulSwitches { trans_a: true, trans_b: true, bias: true, c: true, act: 5 },
    ];
    let mut validator = which_spirv_val();
    let mut validated = 0;
    for size in CoopSize::ALL {
        for switches in switch_sets {
            let words = spirv(size, switches, coop_caps()).unwrap_or_else(|e| panic!("{size:?} {switches:?}: {e}"));
            let ops = opcodes(&words);
            // Four multiply-adds and four A/B loads per k step, four accumulator stores.
            assert_eq!(ops.iter().filter(|&&o| o == MUL_ADD).count(), 4, "{size:?}");
            assert_eq!(ops.iter().filter(|&&o| o == LOAD).count(), 4, "{size:?}");
            assert_eq!(ops.iter().filter(|&&o| o == STORE).count(), 4, "{size:?}");
            if let Some(val) = &validator {
                match spirv_val(val, &words) {
                    Ok(()) => validated += 1,
                    // Capability 6022 is CooperativeMatrixKHR: SPIRV-Tools before mid-2023
                    // (Debian 13's 2023.1) does not know it.
                    Err(e) if e.contains("Invalid capability operand: 6022") => {
                        eprintln!("SKIP spirv-val: {} predates SPV_KHR_cooperative_matrix", val.display());
                        validator = None;
                    }
                    Err(e) => panic!("spirv-val {size:?} {switches:?}: {e}"),
                }
            }
        }
    }
    if validator.is_none() {
        eprintln!("SKIP spirv-val of the cooperative modules: no spirv-val that knows them ({validated} checked)");
    } else {
        eprintln!("spirv-val (vulkan1.3): {validated} cooperative modules valid");
    }
    // The check can fail: without the capability the feature gives, naga refuses the module.
    let without = coop_caps() - naga::valid::Capabilities::COOPERATIVE_MATRIX;
    assert!(spirv(CoopSize::S16, MatmulSwitches::default(), without).is_err());
}

/// `TILEKIT_SPIRV_VAL`, else `spirv-val` on PATH.
fn which_spirv_val() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("TILEKIT_SPIRV_VAL") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("spirv-val")).find(|p| p.is_file())
}

/// `words` without the `ArrayStride` decorations of workgroup arrays. naga 30 decorates every
/// array type, and SPIRV-Tools since 2025 rejects an explicit layout in the Workgroup storage
/// class (VUID-StandaloneSpirv-None-10684) for every tilekit module with workgroup arrays
/// (`matmul_f16` as well); dropping those decorations lets the validator check the rest.
fn without_workgroup_strides(words: &[u32]) -> Vec<u32> {
    const OP_DECORATE: u32 = 71;
    const OP_TYPE_POINTER: u32 = 32;
    const ARRAY_STRIDE: u32 = 6;
    const WORKGROUP: u32 = 4;
    let mut insts = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let count = ((words[i] >> 16) as usize).max(1);
        insts.push(&words[i..(i + count).min(words.len())]);
        i += count;
    }
    let workgroup_types: Vec<u32> = insts
        .iter()
        .filter(|w| w[0] & 0xffff == OP_TYPE_POINTER && w.len() == 4 && w[2] == WORKGROUP)
        .map(|w| w[3])
        .collect();
    let mut out = words[..5].to_vec();
    for w in insts {
        let stride_of_workgroup =
            w[0] & 0xffff == OP_DECORATE && w.len() >= 3 && w[2] == ARRAY_STRIDE && workgroup_types.contains(&w[1]);
        if !stride_of_workgroup {
            out.extend_from_slice(w);
        }
    }
    out
}

/// Runs `spirv-val --target-env vulkan1.3` on `words` (see [`without_workgroup_strides`]).
fn spirv_val(val: &std::path::Path, words: &[u32]) -> Result<(), String> {
    let words = &without_workgroup_strides(words);
    let file = std::env::temp_dir().join(format!("tilekit-coop-{}-{}.spv", std::process::id(), words.len()));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&file, bytes).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(val).arg("--target-env").arg("vulkan1.3").arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// A device made with the opt-in, on the first adapter (lavapipe here).
fn opted_in_device() -> Option<&'static Device> {
    static DEV: OnceLock<Option<Device>> = OnceLock::new();
    DEV.get_or_init(|| {
        // SAFETY: a test device; wgpu's experimental-feature contract is accepted for it.
        let opts = unsafe { WgpuOptions::allow_software().with_experimental_cooperative_matrix() };
        Device::wgpu(&opts).map_err(|e| eprintln!("SKIP cooperative-matrix fallback tests: no adapter ({e})")).ok()
    })
    .as_ref()
}

fn has_coop(be: &WgpuBackend) -> bool {
    be.device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
}

fn coop_pipelines(be: &WgpuBackend) -> usize {
    be.pipelines.lock().unwrap().keys().filter(|(k, _, _)| k.needs_cooperative_matrix()).count()
}

#[test]
fn without_the_feature_the_module_is_never_built() {
    let Some(dev) = opted_in_device() else { return };
    let be = backend(dev);
    if has_coop(be) {
        eprintln!("SKIP fallback check: this adapter has cooperative matrices");
        return;
    }
    assert!(!be.coop.enabled);
    assert_eq!(be.coop_size(), None);
    assert!(!dev.description().contains("cooperative"), "{}", dev.description());
    // An adapter without f16 shaders (wgpu's GL backend on llvmpipe) refuses the f16 pipeline
    // for its dtype before it reaches the cooperative-matrix check: a refusal all the same.
    let f16 = be.device.features().contains(wgpu::Features::SHADER_F16);
    if !f16 {
        eprintln!("NOTE fallback check: this adapter has no f16 shaders; the refusal is for the dtype");
    }
    for size in CoopSize::ALL {
        let spec = Spec { wg: 128, ..Spec::DEFAULT };
        match be.pipeline("test", Kernel::MatmulCoop(size), ElementStorage::F16, spec) {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains("EXPERIMENTAL_COOPERATIVE_MATRIX"), "{message}")
            }
            Err(Error::UnsupportedDType { dtype: DType::F16, .. }) if !f16 => {}
            other => panic!("{size:?}: {other:?}"),
        }
    }
    assert_eq!(coop_pipelines(be), 0);
}

#[test]
fn f16_products_the_rule_would_take_fall_back_with_unchanged_results() {
    let Some(dev) = opted_in_device() else { return };
    let Some(plain) = device(false) else { return };
    let be = backend(dev);
    if has_coop(be) {
        eprintln!("SKIP fallback check: this adapter has cooperative matrices");
        return;
    }
    // Shapes the rule takes on a device with the feature (M > 16, N and K at least a slab),
    // non-multiples of the 64 x 64 block and of the 32-deep slab included, with the epilogue.
    let mut cases = vec![
        dense_case(1, 64, 64, 64, false, false),
        dense_case(2, 100, 96, 45, true, false),
        dense_case(1, 17, 33, 67, false, true),
        dense_case(1, 131, 70, 32, true, true),
    ];
    let mut full = dense_case(1, 37, 41, 53, false, true);
    full.desc.c = Some(MatrixView::dense(37, 41));
    full.desc.beta = 0.5;
    full.desc.alpha = 1.5;
    full.desc.bias_offset = Some(0);
    full.desc.activation = Activation::Gelu;
    full.bias = true;
    cases.push(full);
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(be.coop_choice(&case.desc, ElementStorage::F16), None);
        run_matmul_case(dev, DType::F16, case, 900 + i as u64);
        // Bit for bit what a device without the opt-in computes.
        let d = &case.desc;
        let run = |dev: &Device| {
            let (ar, ac) = d.a_stored();
            let (br, bc) = d.b_stored();
            let a = upload(dev, DType::F16, &values(d.a.required_len(d.batch, ar, ac).unwrap(), 950 + i as u64));
            let b = upload(dev, DType::F16, &values(d.b.required_len(d.batch, br, bc).unwrap(), 960 + i as u64));
            let bias = case.bias.then(|| upload(dev, DType::F16, &values(d.n, 970)));
            let c = d.c.map(|v| upload(dev, DType::F16, &values(v.required_len(d.batch, d.m, d.n).unwrap(), 980)));
            let out = upload(dev, DType::F16, &vec![7.0; d.out.required_len(d.batch, d.m, d.n).unwrap()]);
            dev.matmul_into(d, &a, &b, bias.as_ref(), c.as_ref(), &out).unwrap();
            out.to_f32_vec().unwrap()
        };
        let (got, want) = (run(dev), run(plain));
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "case {i}");
    }
    assert_eq!(coop_pipelines(be), 0);
}

/// Where the adapter has cooperative matrices (a GPU machine of `cargo xtask device-check`),
/// the kernel runs the products the rule takes and matches the reference: edge shapes
/// (non-multiples of the block and slab, primes, 17 rows), transposes, the full epilogue,
/// guard values around the outputs, and small integers bit for bit.
#[test]
fn coop_kernel_matches_the_reference_where_the_device_has_it() {
    let Some(dev) = opted_in_device() else { return };
    let be = backend(dev);
    let Some(size) = be.coop_size() else {
        eprintln!("SKIP cooperative-matrix kernel run: {} has no usable configuration", dev.description());
        return;
    };
    let mut cases = vec![
        dense_case(1, 64, 64, 64, false, false),
        dense_case(2, 100, 96, 45, true, false),
        dense_case(1, 17, 33, 67, false, true),
        dense_case(1, 131, 70, 32, true, true),
        dense_case(3, 257, 263, 269, false, false),
    ];
    let mut full = dense_case(2, 37, 41, 53, false, true);
    full.desc.c = Some(MatrixView::dense(37, 41));
    full.desc.beta = 0.5;
    full.desc.alpha = 1.5;
    full.desc.bias_offset = Some(0);
    full.desc.activation = Activation::Gelu;
    full.bias = true;
    cases.push(full);
    for (i, case) in cases.iter().enumerate() {
        assert!(be.coop_choice(&case.desc, ElementStorage::F16).is_some(), "case {i}");
        run_matmul_case(dev, DType::F16, case, 1000 + i as u64);
    }
    // Small integers: every product and sum is exact, so the output is the reference's exactly.
    let d = dense_case(1, 70, 72, 96, false, false).desc;
    let ints = |n: usize, s: u64| values(n, s).iter().map(|v| (v * 4.0).round()).collect::<Vec<f32>>();
    let (av, bv) = (ints(70 * 96, 1100), ints(96 * 72, 1101));
    let a = upload(dev, DType::F16, &av);
    let b = upload(dev, DType::F16, &bv);
    let out = upload(dev, DType::F16, &vec![7.0; 70 * 72]);
    dev.matmul_into(&d, &a, &b, None, None, &out).unwrap();
    let mut want = vec![7.0f64; 70 * 72];
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    reference::matmul(&d, &widen(&av), &widen(&bv), None, None, &mut want);
    let got = out.to_f32_vec().unwrap();
    assert!(got.iter().zip(&want).all(|(g, w)| f64::from(*g) == *w), "integer product, {size:?}");
    assert!(coop_pipelines(be) > 0, "the cooperative kernel did not run");
    eprintln!("cooperative-matrix kernel ({0}x{0}) matched the reference on {1}", size.edge(), dev.description());
}
