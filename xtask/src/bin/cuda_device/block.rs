//! `check` (fused block): `inverted_residual` on CUDA, fused, against the CPU backend's fused
//! block, every dtype, both layouts, stride 1 (residual) and 2, with and without expand, tiles
//! cut by the image edge, more than 64 output channels, channel counts on and off the 16-byte
//! vector.
//!
//! Inputs and weights are integers in [−2, 2]: every expanded and filtered value is an integer in
//! [0, 6] after its ReLU6 and every sum is exact in f32, so the two backends agree before the
//! output's one rounding to the dtype (`Rule::exact_sums`).

use crate::checks::{Checker, Rule};
use crate::data::{ints, upload};
use anyhow::Result;
use tilekit::{Activation, BlockOptions, BlockWeights, DType, Device, Layout};

// The options are built by assignment: the public option structs are becoming `#[non_exhaustive]`.
#[allow(clippy::field_reassign_with_default)]
pub fn check_block(gpu: &Device, ck: &mut Checker) -> Result<()> {
    // (C, hidden, C', H, W, stride, expand)
    let cases = [
        (16, 96, 24, 9, 11, 2, true),
        (24, 144, 24, 10, 7, 1, true),
        (8, 48, 72, 5, 17, 1, true),
        (32, 32, 16, 13, 6, 1, false),
        (3, 18, 3, 4, 4, 1, true),
        (5, 30, 7, 3, 9, 2, true),
    ];
    let mut seed = 500;
    for (c, hid, co, h, w, stride, expand) in cases {
        for dtype in DType::ALL {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                seed += 10;
                let batch = 2;
                let x_shape = match layout {
                    Layout::Nchw => [batch, c, h, w],
                    Layout::Nhwc => [batch, h, w, c],
                    other => unimplemented!("{other:?}"),
                };
                let x = ints(batch * c * h * w, seed);
                let we = ints(hid * c, seed + 1);
                let be = ints(hid, seed + 2);
                let wd = ints(hid * 9, seed + 3);
                let bd = ints(hid, seed + 4);
                let wp = ints(co * hid, seed + 5);
                let bp = ints(co, seed + 6);
                let run = |dev: &Device| -> Result<Vec<f32>> {
                    let xt = upload(dev, &x_shape, dtype, &x)?;
                    let wet = upload(dev, &[hid, c, 1, 1], dtype, &we)?;
                    let bet = upload(dev, &[hid], dtype, &be)?;
                    let wdt = upload(dev, &[hid, 1, 3, 3], dtype, &wd)?;
                    let bdt = upload(dev, &[hid], dtype, &bd)?;
                    let wpt = upload(dev, &[co, hid, 1, 1], dtype, &wp)?;
                    let bpt = upload(dev, &[co], dtype, &bp)?;
                    let weights = BlockWeights {
                        expand: expand.then_some(&wet),
                        expand_bias: expand.then_some(&bet),
                        depthwise: &wdt,
                        depthwise_bias: Some(&bdt),
                        project: &wpt,
                        project_bias: Some(&bpt),
                    };
                    let mut opts = BlockOptions::default();
                    opts.stride = stride;
                    opts.layout = layout;
                    opts.fused = true;
                    Ok(dev.inverted_residual(&xt, &weights, &opts)?.to_f32_vec()?)
                };
                // |filtered| <= 6, |wp| <= 2, |bias| and |x| <= 2.
                let magnitude = 12.0 * hid as f64 + 4.0;
                let name = format!("inverted_residual fused {c}->{hid}->{co} {h}x{w} s{stride} {dtype} {layout:?}");
                ck.record(name, run(gpu), run(&ck.cpu.clone()), dtype, Rule::exact_sums(Activation::None, magnitude));
            }
        }
    }
    Ok(())
}
