//! The gated linear unit (`Device::glu`, SwiGLU's `act(gate) · up`) on every backend and dtype
//! against the `f64` reference, under `tolerance::glu_bound`; bit for bit where the inputs make
//! every step exact (ReLU forms on quarter-integers).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tilekit::{Activation, DType, GluDesc};
use tilekit_kernels::{reference, tolerance};
use tilekit_tests::{Rng, backends_for, round_to};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() }
}

/// Runs one GLU over `h` (`lead × 2F`, rounded to `dtype`) on every backend with `dtype`, both
/// through `glu` and `glu_into`, and checks each output.
fn check(lead: &[usize], f: usize, act: Activation, dtype: DType, h: &[f32]) -> Result<usize, String> {
    let rows: usize = lead.iter().product();
    let h = round_to(dtype, h);
    let desc = GluDesc::new(rows, f, act);
    let h64: Vec<f64> = h.iter().map(|&v| v as f64).collect();
    let mut want = vec![0.0f64; rows * f];
    reference::glu(&desc, &h64, &mut want);
    let mut shape = lead.to_vec();
    shape.push(2 * f);
    let mut out_shape = lead.to_vec();
    out_shape.push(f);
    let mut ran = 0;
    for be in backends_for(dtype) {
        let dev = &be.device;
        let what = format!("{} {dtype} glu {act} rows {rows} f {f}", be.label);
        let err = |e: tilekit::Error| format!("{what}: {e}");
        let ht = dev.tensor_from_f32(&shape, dtype, &h).map_err(err)?;
        let y = dev.glu(&ht, act).map_err(err)?;
        if y.shape() != out_shape.as_slice() {
            return Err(format!("{what}: shape {:?}, want {out_shape:?}", y.shape()));
        }
        let into = dev.tensor_from_f32(&out_shape, dtype, &vec![-7.5; rows * f]).map_err(err)?;
        dev.glu_into(&ht, act, &into).map_err(err)?;
        for (how, t) in [("glu", y), ("glu_into", into)] {
            let got = t.to_f32_vec().map_err(err)?;
            for r in 0..rows {
                for c in 0..f {
                    let (i, gate, up) = (r * f + c, h64[r * 2 * f + c], h64[r * 2 * f + f + c]);
                    let bound = tolerance::glu_bound(dtype, act, gate, up, want[i]);
                    if !tolerance::accepts(dtype, got[i], want[i], bound) {
                        return Err(format!(
                            "{what} {how} [{r}, {c}]: act({gate}) · {up} = {} (want {}, bound {bound:e})",
                            got[i], want[i]
                        ));
                    }
                }
            }
        }
        ran += 1;
    }
    Ok(ran)
}

/// Random values in [−8, 8] (the SiLU and GELU tails and the ReLU6 clamp are all reached).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-8.0, 8.0)).collect()
}

proptest! {
    #![proptest_config(config(24))]

    /// Any leading shape, half widths around the vector widths (1…9, 16, 33, 64), every
    /// activation and dtype.
    #[test]
    fn glu_matches_the_reference(
        lead in prop::collection::vec(1usize..=5, 1..=2),
        f in prop_oneof![1usize..=9, prop::sample::select(vec![16usize, 33, 64])],
        act in prop::sample::select(Activation::ALL.to_vec()),
        dtype in prop::sample::select(DType::ALL.to_vec()),
        seed in any::<u64>(),
    ) {
        let rows: usize = lead.iter().product();
        let h = random(rows * 2 * f, seed);
        check(&lead, f, act, dtype, &h).map_err(TestCaseError::fail)?;
    }
}

/// ReLU forms and the identity on quarter-integers in [−3, 3]: the activation, the product and
/// the store are all exact in every dtype, so every backend must match the reference bit for bit.
#[test]
fn exact_on_integers() {
    let (rows, f) = (3, 12);
    let h: Vec<f32> = (0..rows * 2 * f).map(|i| ((i * 7 % 25) as f32 - 12.0) / 4.0).collect();
    for dtype in DType::ALL {
        for act in [Activation::None, Activation::Relu, Activation::Relu6] {
            let desc = GluDesc::new(rows, f, act);
            let h64: Vec<f64> = h.iter().map(|&v| v as f64).collect();
            let mut want = vec![0.0f64; rows * f];
            reference::glu(&desc, &h64, &mut want);
            for be in backends_for(dtype) {
                let dev = &be.device;
                let t = dev.tensor_from_f32(&[rows, 2 * f], dtype, &h).expect("upload");
                let got = dev.glu(&t, act).and_then(|y| y.to_f32_vec()).expect("glu");
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g as f64, w, "{} {dtype} {act} [{i}]", be.label);
                }
            }
        }
    }
}

/// SwiGLU at a Llama-like width where the vector path runs (F a multiple of 8), and a width
/// just off it (F = 4·k + 1), with one and several rows.
#[test]
fn silu_at_llama_like_widths() {
    for dtype in DType::ALL {
        for (rows, f) in [(1, 344), (5, 344), (2, 345)] {
            let h = random(rows * 2 * f, (rows * f) as u64);
            check(&[rows], f, Activation::Silu, dtype, &h).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// Non-finite inputs and huge ones: on every backend the op returns and the finite rows that do
/// not depend on them are exactly those of a clean run.
#[test]
fn non_finite_inputs_stay_in_their_rows() {
    for dtype in DType::ALL {
        for be in backends_for(dtype) {
            let dev = &be.device;
            let (rows, f) = (3, 8);
            let clean = random(rows * 2 * f, 9);
            let mut dirty = clean.clone();
            dirty[1] = f32::NAN; // row 0, gate
            dirty[2 * f + f + 2] = f32::INFINITY; // row 1, up
            let run = |v: &[f32]| {
                let t = dev.tensor_from_f32(&[rows, 2 * f], dtype, v).expect("upload");
                dev.glu(&t, Activation::Silu).and_then(|y| y.to_f32_vec()).expect("glu")
            };
            let (a, b) = (run(&clean), run(&dirty));
            assert_eq!(a[2 * f..], b[2 * f..], "{} {dtype}: row 2 changed", be.label);
            if matches!(be.label, "cpu" | "cuda") {
                assert!(b[1].is_nan(), "{} {dtype}: silu(NaN) · up = {}", be.label, b[1]);
            }
        }
    }
}
