//! What each backend promises about NaN and infinities, tested exactly.
//!
//! - CPU and CUDA propagate: an output that depends on a NaN is NaN; an activation of a
//!   non-finite value is what the kernel formula (`Activation::apply_f32`) gives for it (NaN
//!   stays NaN through every activation; +Inf stays +Inf through None, ReLU and both GELUs;
//!   ReLU6 clamps infinities to 0 and 6).
//! - wgpu: WGSL lets a compiler assume finite math and flush subnormals, so what an output
//!   that depends on a NaN or an infinity holds is not promised. What is promised: the op
//!   returns `Ok` (no crash, no device loss), outputs that do not depend on a non-finite input
//!   are bit-identical to a run without it, and finite inputs give finite outputs, including
//!   huge finite inputs to the activations (the GELU formulas clamp their arguments).
//!
//! Every backend present runs the part of the promise that applies to it.

use tilekit::{Activation, Conv2dOptions, DType, Device, Layout, MatmulOptions, Tensor};
use tilekit_tests::{Rng, TestBackend, backends_for};

fn ok<T>(what: &str, r: tilekit::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Whether the backend promises to propagate NaN and infinities.
fn propagates(be: &TestBackend) -> bool {
    matches!(be.label, "cpu" | "cuda")
}

fn upload(dev: &Device, dtype: DType, shape: &[usize], v: &[f32]) -> Tensor {
    ok("upload", dev.tensor_from_f32(shape, dtype, v))
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// The class of a value the promises talk about.
fn class(v: f32) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v == f32::INFINITY {
        "+Inf"
    } else if v == f32::NEG_INFINITY {
        "-Inf"
    } else {
        "finite"
    }
}

#[test]
fn activations_of_non_finite_and_huge_inputs() {
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            // Huge finite values only where the dtype holds them (f16 tops out at 65504).
            let huge = if dtype == DType::F16 { 6.0e4 } else { 1.0e30 };
            let x = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, -huge, huge, 0.0, -2.5];
            let xt = upload(dev, dtype, &[x.len()], &x);
            for act in Activation::ALL {
                let got = ok("activation", dev.activation(&xt, None, act).and_then(|t| t.to_f32_vec()));
                for (&xi, &g) in x.iter().zip(&got) {
                    let what = format!("{} {dtype} {act}({xi})", be.label);
                    let want = act.apply_f32(xi);
                    if !xi.is_finite() {
                        if propagates(be) {
                            assert_eq!(class(g), class(want), "{what}: got {g}, the kernel formula gives {want}");
                        }
                    } else if want.is_finite() && dtype.round_f32(want).is_finite() {
                        // Finite in, finite out, on every backend.
                        assert!(g.is_finite(), "{what}: got {g}, want {want}");
                    }
                }
            }
        }
    }
}

/// A NaN in one row of A (or of C) and an infinity in another: on CPU and CUDA those rows
/// come out non-finite (NaN for the NaN row), on every backend the other rows are exactly
/// those of a run without them.
#[test]
fn matmul_rows_with_and_without_non_finite_inputs() {
    let (m, n, k) = (6, 5, 7);
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            let clean = random(m * k, 1);
            let b_host = random(k * n, 2);
            let b = upload(dev, dtype, &[k, n], &b_host);
            let bias = upload(dev, dtype, &[n], &random(n, 3));
            let c_clean = random(m * n, 4);
            let mut poisoned = clean.clone();
            poisoned[k + 3] = f32::NAN; // row 1
            poisoned[3 * k] = f32::INFINITY; // row 3
            let mut c_poisoned = c_clean.clone();
            c_poisoned[4 * n + 2] = f32::NAN; // row 4, column 2
            for act in Activation::ALL {
                let run = |a: &[f32], c: &[f32]| {
                    let a = upload(dev, dtype, &[m, k], a);
                    let c = upload(dev, dtype, &[m, n], c);
                    let opts = MatmulOptions::default().bias(Some(&bias)).c(Some(&c)).beta(0.5).activation(act);
                    ok("matmul", dev.matmul(&a, &b, &opts).and_then(|t| t.to_f32_vec()))
                };
                let want = run(&clean, &c_clean);
                let got = run(&poisoned, &c_poisoned);
                for i in 0..m {
                    for j in 0..n {
                        let (g, w) = (got[i * n + j], want[i * n + j]);
                        let what = format!("{} {dtype} {act} out[{i}][{j}]", be.label);
                        match (i, j) {
                            (1, _) | (4, 2) if propagates(be) => assert!(g.is_nan(), "{what}: got {g}, want NaN"),
                            (3, _) if propagates(be) => {
                                // +Inf times B[0][j] (finite, non-zero) is an infinity of B's
                                // sign; the activation then does to it what its formula does.
                                let inf = f32::INFINITY.copysign(b_host[j]);
                                let want = act.apply_f32(inf);
                                assert_eq!(class(g), class(want), "{what}: got {g}, {act}({inf}) is {want}");
                            }
                            (1, _) | (3, _) | (4, 2) => {}
                            _ => assert_eq!(g.to_bits(), w.to_bits(), "{what}: got {g}, want {w} as without NaN"),
                        }
                    }
                }
            }
        }
    }
}

/// A NaN at one input pixel of a depthwise convolution: on CPU and CUDA exactly the outputs
/// whose window covers it (in its channel) are NaN; on every backend the others are
/// bit-identical to a run without it.
#[test]
fn conv_outputs_inside_and_outside_the_reach_of_a_nan() {
    let (c, h, w) = (2, 6, 7);
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let (shape, at) = match layout {
                    // Channel 1, row 2, column 3.
                    Layout::Nchw => (vec![1, c, h, w], (h + 2) * w + 3),
                    Layout::Nhwc => (vec![1, h, w, c], (2 * w + 3) * c + 1),
                    other => unimplemented!("{other:?}"),
                };
                let clean = random(c * h * w, 5);
                let mut poisoned = clean.clone();
                poisoned[at] = f32::NAN;
                let weight = upload(dev, dtype, &[c, 1, 3, 3], &random(c * 9, 6));
                let opts = Conv2dOptions::default().layout(layout).padding([1; 4]).activation(Activation::Gelu);
                let run = |x: &[f32]| {
                    let x = upload(dev, dtype, &shape, x);
                    ok("conv", dev.depthwise_conv2d(&x, &weight, None, &opts).and_then(|t| t.to_f32_vec()))
                };
                let (want, got) = (run(&clean), run(&poisoned));
                for ch in 0..c {
                    for y in 0..h {
                        for xx in 0..w {
                            let i = match layout {
                                Layout::Nchw => (ch * h + y) * w + xx,
                                Layout::Nhwc => (y * w + xx) * c + ch,
                                other => unimplemented!("{other:?}"),
                            };
                            let reached = ch == 1 && y.abs_diff(2) <= 1 && xx.abs_diff(3) <= 1;
                            let what = format!("{} {dtype} {layout:?} out[{ch}][{y}][{xx}]", be.label);
                            if !reached {
                                assert_eq!(
                                    got[i].to_bits(),
                                    want[i].to_bits(),
                                    "{what}: changed by a NaN it cannot see"
                                );
                            } else if propagates(be) {
                                assert!(got[i].is_nan(), "{what}: got {}, want NaN", got[i]);
                            }
                        }
                    }
                }
            }
        }
    }
}
