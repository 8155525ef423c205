//! The `mobilenet` suite's block table: MobileNetV2's 17 inverted-residual blocks, fused
//! (`BlockOptions::fused`, on weights packed once by `Device::pack_block_weights`, as the
//! network runs them) against the three-op chain in the same run (`vs unfused` = unfused
//! median / fused median, timed interleaved), with the DRAM bytes each path must move at the
//! least (`InvertedResidualDesc::{fused,unfused}_dram_bytes`) beside the times.
//!
//! Every block is checked before it is timed: the three paths' outputs (fused, fused on the
//! packed weights, unfused) against the f64 reference
//! under `tilekit_kernels::block::bounds`. The input is 224×224 (the blocks' own sizes run from
//! 112² down to 7²); `--quick` on a software adapter uses a 56×56 network input.

use super::measure::{Plan, time_interleaved};
use anyhow::{Context, Result, bail};
use tilekit::{BlockOptions, BlockWeights, DType, Device, InvertedResidualDesc, Layout, PackedBlock, Tensor};
use tilekit_kernels::block::{bounds, reference};
use tilekit_kernels::tolerance::accepts;

/// One block's operands on a device, and the host copies the check needs.
struct Bound {
    x: Tensor,
    we: Option<Tensor>,
    be: Option<Tensor>,
    wd: Tensor,
    bd: Tensor,
    wp: Tensor,
    bp: Tensor,
    /// The weights packed once (`Device::pack_block_weights`).
    packed: PackedBlock,
    host: Vec<Vec<f32>>,
}

impl Bound {
    fn new(dev: &Device, d: &InvertedResidualDesc, dtype: DType, seed: u64) -> Result<Bound> {
        let mut state = seed;
        let mut fill = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    // SplitMix64: deterministic data, values in [-scale, scale), stored rounded.
                    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^= z >> 31;
                    let u = (z >> 40) as f32 / (1u64 << 24) as f32;
                    dtype.round_f32((2.0 * u - 1.0) * scale)
                })
                .collect()
        };
        let l = d.checked_lens().context("block lengths")?;
        // Weights scaled like a trained net's (fan-in), so ReLU6 is neither always 0 nor 6.
        let fan = |k: usize| 1.0 / (k as f32).sqrt();
        let x = fill(l.input, 1.0);
        let we = d.expand.then(|| fill(l.expand_weight, fan(d.channels)));
        let be = d.expand.then(|| fill(d.hidden, 0.1));
        let wd = fill(l.dw_weight, fan(9));
        let bd = fill(d.hidden, 0.1);
        let wp = fill(l.project_weight, fan(d.hidden));
        let bp = fill(d.out_channels, 0.1);
        let t = |shape: &[usize], v: &[f32]| dev.tensor_from_f32(shape, dtype, v);
        let (c, h, co) = (d.channels, d.hidden, d.out_channels);
        let (we_t, be_t) =
            (we.as_deref().map(|v| t(&[h, c, 1, 1], v)).transpose()?, be.as_deref().map(|v| t(&[h], v)).transpose()?);
        let (wd_t, bd_t, wp_t, bp_t) = (t(&[h, 1, 3, 3], &wd)?, t(&[h], &bd)?, t(&[co, h, 1, 1], &wp)?, t(&[co], &bp)?);
        let packed = dev.pack_block_weights(&BlockWeights {
            expand: we_t.as_ref(),
            expand_bias: be_t.as_ref(),
            depthwise: &wd_t,
            depthwise_bias: Some(&bd_t),
            project: &wp_t,
            project_bias: Some(&bp_t),
        })?;
        Ok(Bound {
            x: t(&d.input_shape(), &x)?,
            we: we_t,
            be: be_t,
            wd: wd_t,
            bd: bd_t,
            wp: wp_t,
            bp: bp_t,
            packed,
            host: vec![x, we.unwrap_or_default(), be.unwrap_or_default(), wd, bd, wp, bp],
        })
    }

    fn weights(&self) -> BlockWeights<'_> {
        BlockWeights {
            expand: self.we.as_ref(),
            expand_bias: self.be.as_ref(),
            depthwise: &self.wd,
            depthwise_bias: Some(&self.bd),
            project: &self.wp,
            project_bias: Some(&self.bp),
        }
    }

    /// Both paths against the f64 reference.
    fn check(&self, dev: &Device, d: &InvertedResidualDesc, dtype: DType, out: &Tensor) -> Result<()> {
        let w = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
        let h: Vec<Vec<f64>> = self.host.iter().map(|v| w(v)).collect();
        let expand = d.expand.then(|| (h[1].as_slice(), Some(h[2].as_slice())));
        let (dw, pr) = ((h[3].as_slice(), Some(h[4].as_slice())), (h[5].as_slice(), Some(h[6].as_slice())));
        let mut want = vec![0.0; out.len()];
        reference(d, &h[0], expand, dw, pr, &mut want);
        let bound = bounds(d, dtype, &h[0], expand, dw, pr);
        for (fused, packed) in [(true, false), (true, true), (false, false)] {
            let opts = BlockOptions::default().stride(d.stride).layout(d.layout).fused(fused);
            if packed {
                dev.inverted_residual_packed_into(&self.x, &self.packed, &opts, out)?;
            } else {
                dev.inverted_residual_into(&self.x, &self.weights(), &opts, out)?;
            }
            let got = out.to_f32_vec()?;
            if let Some(i) = (0..got.len()).find(|&i| !accepts(dtype, got[i], want[i], bound[i])) {
                bail!(
                    "fused={fused} packed={packed}: element {i} is {}, reference {} (bound {})",
                    got[i],
                    want[i],
                    bound[i]
                );
            }
        }
        Ok(())
    }
}

/// Benchmarks the 17 blocks on `dev` in `dtype` and prints the table.
pub fn run(dev: &Device, dtype: DType, quick: bool) -> Result<()> {
    let slow = dev.is_software();
    let size = if quick && slow { 56 } else { 224 };
    let layouts: &[Layout] = if quick { &[Layout::Nhwc] } else { &[Layout::Nhwc, Layout::Nchw] };
    println!(
        "\n   inverted-residual blocks, {size}x{size} input, {dtype} ({}): fused (weights packed) vs the three-op chain, timed interleaved",
        dev.kind()
    );
    println!(
        "   {:>3} {:>5} {:>4} {:>5} {:>4} {:>2} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "blk", "lay", "C", "hid", "C'", "s", "HxW", "fused ms", "unfused ms", "vs unfused", "fused MB", "unfus MB"
    );
    for &layout in layouts {
        for (i, d) in InvertedResidualDesc::mobilenet_v2_blocks(1, size, layout).iter().enumerate() {
            let b = Bound::new(dev, d, dtype, 0xb10c + i as u64)?;
            let out = dev.zeros(&d.output_shape(), dtype)?;
            b.check(dev, d, dtype, &out).with_context(|| format!("block {i} {d:?} on {} in {dtype}", dev.kind()))?;
            let run = |fused: bool| {
                let opts = BlockOptions::default().stride(d.stride).layout(layout).fused(fused);
                let (b, out) = (&b, &out);
                move || -> Result<()> {
                    if fused {
                        dev.inverted_residual_packed_into(&b.x, &b.packed, &opts, out)?;
                    } else {
                        dev.inverted_residual_into(&b.x, &b.weights(), &opts, out)?;
                    }
                    dev.synchronize()?;
                    Ok(())
                }
            };
            let (f, u) = time_interleaved(Plan::op(quick, slow), run(true), run(false))?;
            let mb = |v: Option<u64>| v.map_or(f64::NAN, |v| v as f64 / 1e6);
            println!(
                "   {:>3} {:>5} {:>4} {:>5} {:>4} {:>2} {:>8} {:>10.3} {:>10.3} {:>9.2}x {:>9.2} {:>9.2}",
                i + 1,
                if layout == Layout::Nhwc { "nhwc" } else { "nchw" },
                d.channels,
                d.hidden,
                d.out_channels,
                d.stride,
                format!("{}x{}", d.height, d.width),
                f.median_s * 1e3,
                u.median_s * 1e3,
                u.median_s / f.median_s,
                mb(d.fused_dram_bytes(dtype)),
                mb(d.unfused_dram_bytes(dtype)),
            );
        }
    }
    Ok(())
}
