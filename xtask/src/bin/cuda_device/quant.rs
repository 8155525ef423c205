//! `check` (quantized weights): `matmul_quant` on CUDA against the CPU backend's for every block
//! format, activation dtype and kernel of `qmatmul.cu` (the decode kernels with both register
//! tiles, split K, the tiled kernel), with transposed A, batches and the full epilogue.
//!
//! The weights are random GGUF blocks whose f16 scales are powers of two (d 2⁻³ or 2⁻⁴, mins 2⁻⁴;
//! Q6_K, whose quants reach ±128·32, d 2⁻⁶ or 2⁻⁷ so that f16 outputs stay finite): every
//! dequantized weight is a short binary fraction and, with integer activations in [−2, 2], the
//! sums of the short shapes are exact in f32, so a correct kernel matches the CPU backend to the
//! last bit before the epilogue. The tolerance (`Rule::Model`) counts K, so the long split-K
//! shapes, whose sums may round, are judged by the f32-accumulation bound.

use crate::checks::{Checker, Rule};
use crate::data::{ints, upload};
use anyhow::Result;
use tilekit::quant::{GgmlType, dequantize};
use tilekit::{Activation, DType, Device, MatmulOptions};

/// Random blocks of `ty` for a `[n, k]` weight, scales set to powers of two.
fn weight_bytes(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let bb = ty.block_bytes();
    let blocks = n * k / ty.block_size();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut bytes: Vec<u8> = (0..blocks * bb)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect();
    // f16 bit patterns of 2⁻³, 2⁻⁴, 2⁻⁶ and 2⁻⁷.
    let bits = |v: u16| v.to_le_bytes();
    let (big, small) = if ty == GgmlType::Q6K { (bits(0x2400), bits(0x2000)) } else { (bits(0x3000), bits(0x2C00)) };
    let sixteenth = bits(0x2C00);
    for (b, blk) in bytes.chunks_exact_mut(bb).enumerate() {
        let d = if b % 2 == 0 { big } else { small };
        match ty {
            // Q6_K keeps its f16 d in the block's last two bytes.
            GgmlType::Q6K => blk[bb - 2..].copy_from_slice(&d),
            _ => blk[..2].copy_from_slice(&d),
        }
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q4K) {
            blk[2..4].copy_from_slice(&sixteenth);
        }
    }
    bytes
}

// The options are built by assignment: the public option structs are becoming `#[non_exhaustive]`,
// which rules out struct literals outside tilekit.
#[allow(clippy::field_reassign_with_default)]
pub fn check_quant(gpu: &Device, ck: &mut Checker) -> Result<()> {
    // (M, N, K in blocks, batch): the 4-row and 16-row decode tiles, the tiled kernel at and
    // around its 64-wide tiles, N never a multiple of anything, K = 0, batches.
    let shapes = [
        (1, 7, 1, 1),
        (1, 100, 4, 1),
        (3, 33, 3, 1),
        (4, 130, 2, 1),
        (5, 17, 3, 1),
        (16, 64, 5, 1),
        (2, 9, 0, 1),
        (17, 65, 2, 1),
        (33, 100, 3, 1),
        (70, 129, 3, 1),
        (64, 64, 4, 1),
        (6, 31, 2, 2),
        (40, 23, 2, 2),
    ];
    let mut seed = 100;
    for ty in GgmlType::QUANTIZED {
        let bs = ty.block_size();
        // K split across blocks: few columns and a long K (past the exact range, so the rule
        // counts K).
        let long_k = if bs == 32 { 512 } else { 64 };
        let all_shapes = shapes.iter().copied().chain([(1, 8, long_k, 1), (16, 24, long_k, 1)]);
        for (m, n, kb, batch) in all_shapes {
            let k = kb * bs;
            seed += 1;
            let wbytes = weight_bytes(ty, n, k, seed);
            let wf = dequantize(ty, &wbytes, &[n, k])?;
            let wmax = wf.iter().fold(0.0f32, |acc, v| acc.max(v.abs())) as f64;
            for dtype in DType::ALL {
                for epi in 0..2 {
                    seed += 1;
                    let ta = seed % 3 == 0;
                    let a_shape = match (batch > 1, ta) {
                        (false, false) => vec![m, k],
                        (false, true) => vec![k, m],
                        (true, false) => vec![batch, m, k],
                        (true, true) => vec![batch, k, m],
                    };
                    let a = ints(batch * m * k, seed);
                    let bias = ints(n, seed + 1);
                    let c = ints(batch * m * n, seed + 2);
                    let c_shape = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
                    let activation =
                        if epi == 0 { Activation::None } else { [Activation::Gelu, Activation::Silu][m % 2] };
                    let run = |dev: &Device| -> Result<Vec<f32>> {
                        let at = upload(dev, &a_shape, dtype, &a)?;
                        let w = dev.quant_tensor(ty, &[n, k], &wbytes)?;
                        let biast = upload(dev, &[n], dtype, &bias)?;
                        let ct = upload(dev, &c_shape, dtype, &c)?;
                        let mut opts = MatmulOptions::default();
                        opts.trans_a = ta;
                        opts.trans_b = true;
                        if epi == 1 {
                            opts.alpha = 0.5;
                            opts.beta = -0.25;
                            opts.bias = Some(&biast);
                            opts.c = Some(&ct);
                            opts.activation = activation;
                        }
                        Ok(dev.matmul_quant(&at, &w, &opts)?.to_f32_vec()?)
                    };
                    // |a| <= 2, |w| <= wmax; |bias|, |c| <= 2.
                    let sums = 2.0 * wmax * k as f64;
                    let magnitude = if epi == 0 { sums } else { 0.5 * sums + 2.0 + 0.25 * 2.0 };
                    let rule = Rule::Model { activation, k, magnitude };
                    let name = format!("matmul_quant {ty} {m}x{n}x{k} batch={batch} {dtype} ta={ta} epilogue={epi}");
                    ck.record(name, run(gpu), run(&ck.cpu.clone()), dtype, rule);
                }
            }
        }
    }
    Ok(())
}
