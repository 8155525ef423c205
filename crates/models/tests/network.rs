//! MobileNetV2 end to end on every backend present, against the f64 reference forward pass
//! (`tilekit_models::reference`), from a random torchvision-named safetensors file written here;
//! and the loader's errors.
//!
//! Tolerance: the reference sees the weights and input as the device stores them, so the
//! difference is the rounding of each of the 54 layers' outputs to the storage dtype plus f32
//! accumulation, carried through the network. We bound the largest logit error relative to the
//! largest logit: f32 `1e-5`, f16 `5e-3`, bf16 `4e-2` (about 10·u(dtype) for the half types;
//! measured at 32×40 with seed 13: 1.1e-6, 7.0e-4 and 4.9e-3 — the per-layer roundings add up
//! like a random walk over the layers, far below the order-1
//! error a wrong index or a lost term gives). Measured errors are printed.

#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;
use tilekit::{DType, Layout};
use tilekit_models::{MobileNetV2, ModelError, Weights, reference, synthetic};
use tilekit_tests::backends_for;

const SEED: u64 = 13;
const SIZE: usize = 32;

fn weights() -> &'static Weights {
    static W: OnceLock<Weights> = OnceLock::new();
    W.get_or_init(|| {
        let bytes = synthetic::to_safetensors(&synthetic::state_dict(SEED)).unwrap();
        let dir = std::env::temp_dir().join(format!("tilekit-mnet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mobilenet_v2.safetensors");
        std::fs::write(&path, bytes).unwrap();
        // Through the memory-mapped loader, as the example does.
        let w = Weights::load(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        w
    })
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 5e-3,
        DType::Bf16 => 4e-2,
        other => unimplemented!("{other:?}"),
    }
}

#[test]
fn mobilenet_v2_matches_the_reference_on_every_backend_dtype_batch_and_layout() {
    let w = weights();
    let mut ran = 0;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for batch in [1, 2] {
            // A non-square input checks that H and W are not mixed up.
            let (h, wd) = (SIZE, SIZE + 8);
            let input = synthetic::input(SEED + batch as u64, batch, h, wd);
            let want = reference::forward(w, dtype, [batch, 3, h, wd], &input);
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(scale > 1e-3 && scale.is_finite(), "degenerate reference logits (max {scale})");
            for be in backends_for(dtype) {
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    // Batch 2 runs the blocks fused, batch 1 as the three-op chain: both paths in
                    // every backend, dtype and layout.
                    let fused = batch == 2;
                    let what = format!(
                        "{} {dtype} {} batch {batch} {h}x{wd} {}",
                        be.label,
                        layout.name(),
                        if fused { "fused" } else { "unfused" }
                    );
                    let mut net = MobileNetV2::new(&be.device, w, dtype, layout).unwrap();
                    net.set_fused(fused);
                    let got = net.run(&[batch, 3, h, wd], &input).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(got.len(), batch * 1000, "{what}");
                    let err = got.iter().zip(&want).fold(0.0f64, |m, (g, r)| m.max((*g as f64 - r).abs())) / scale;
                    eprintln!(
                        "{what}: max |logit error| / max |logit| = {err:.3e} (tolerance {:.0e})",
                        tolerance(dtype)
                    );
                    assert!(err <= tolerance(dtype), "{what}: relative logit error {err:.3e}");
                    ran += 1;
                }
            }
        }
    }
    assert!(ran >= 12, "the CPU alone runs 12 cases; ran {ran}");
}

fn load_err(entries: &[synthetic::Entry]) -> String {
    let bytes = synthetic::to_safetensors(entries).unwrap();
    match Weights::from_bytes(&bytes) {
        Ok(_) => panic!("loaded a broken file"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_loader_names_the_tensor_and_shape_it_could_not_use() {
    let dict = synthetic::state_dict(1);
    let name = "features.5.conv.1.0.weight";
    // Missing.
    let missing: Vec<_> = dict.iter().filter(|e| e.0 != name).cloned().collect();
    let e = load_err(&missing);
    assert_eq!(e, format!("missing tensor {name} (expected shape [192, 1, 3, 3])"));
    // Misnamed (a typo in a prefix), so the real name is missing.
    let mut misnamed = dict.clone();
    for e in &mut misnamed {
        if e.0 == "classifier.1.bias" {
            e.0 = "classifier.0.bias".into();
        }
    }
    assert_eq!(load_err(&misnamed), "missing tensor classifier.1.bias (expected shape [1000])");
    // Wrong shape.
    let mut reshaped = dict.clone();
    for e in &mut reshaped {
        if e.0 == "features.18.1.running_var" {
            e.2 = vec![640, 2];
        }
    }
    assert_eq!(load_err(&reshaped), "tensor features.18.1.running_var has shape [640, 2], expected [1280]");
    // Not a float tensor.
    let mut ints = dict.clone();
    for e in &mut ints {
        if e.0 == "features.0.1.weight" {
            e.1 = safetensors::Dtype::I32;
        }
    }
    let e = load_err(&ints);
    assert!(e.starts_with("tensor features.0.1.weight (shape [32]) has dtype I32"), "{e}");
    for e in [&missing, &misnamed, &reshaped, &ints].map(|d| load_err(d)) {
        assert!(!e.contains('\n'), "{e}");
    }
    // Not a safetensors file at all, and a file that does not exist.
    let e = Weights::from_bytes(b"\x93NUMPY not safetensors").unwrap_err();
    assert!(matches!(e, ModelError::NotSafetensors(_)), "{e}");
    assert!(e.to_string().starts_with("not a safetensors file"), "{e}");
    let e = Weights::load(std::path::Path::new("/nonexistent/w.safetensors")).unwrap_err();
    assert!(e.to_string().starts_with("cannot read /nonexistent/w.safetensors"), "{e}");
}

#[test]
fn bad_inputs_are_errors() {
    let dev = tilekit::Device::cpu();
    let net = MobileNetV2::new(&dev, weights(), DType::F32, Layout::Nchw).unwrap();
    for shape in [vec![1, 3, 31, 64], vec![1, 1, 32, 32], vec![3, 32, 32], vec![0, 3, 32, 32]] {
        let n: usize = shape.iter().product();
        let e = net.run(&shape, &vec![0.0; n]).unwrap_err();
        assert!(matches!(e, ModelError::Input(_)), "{shape:?}: {e}");
    }
    let e = net.run(&[1, 3, 32, 32], &[0.0; 5]).unwrap_err();
    assert!(matches!(e, ModelError::Input(_)), "{e}");
}
