//! `tilekit_kernels::quant` against the `gguf` package's `gguf.quants` (llama.cpp's numpy port
//! of its reference quantizers and dequantizers), bit for bit, on the fixtures that
//! `fixtures/make_quant_fixtures.py` wrote; plus error cases, hand-worked block layouts and
//! round-trip bounds.

use proptest::prelude::*;
use tilekit_kernels::DType;
use tilekit_kernels::quant::blocks::{BlockQ4_0, BlockQ6K, f16_to_f32};
use tilekit_kernels::quant::{GgmlType, QuantError, dequantize, dequantize_into, quantize, quantize_into};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/quant/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (run tests/fixtures/make_quant_fixtures.py)"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Equal bits, or both NaN (NaN payloads are not part of llama.cpp's contract).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The fixture name of a type: `q8_0`, `q4_k`, …
fn stem(ty: GgmlType) -> String {
    ty.name().to_lowercase()
}

#[test]
fn dequantize_matches_gguf_quants_bit_for_bit() {
    for ty in GgmlType::QUANTIZED {
        let blocks = fixture(&format!("{}_dequant_in.bin", stem(ty)));
        let expected = f32s(&fixture(&format!("{}_dequant_out.f32", stem(ty))));
        let n_blocks = blocks.len() / ty.block_bytes();
        assert_eq!(expected.len(), n_blocks * ty.block_size(), "{ty}: fixture sizes");
        let got = dequantize(ty, &blocks, &[n_blocks, ty.block_size()]).expect("valid input");
        for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                same(g, e),
                "{ty} element {i} (block {}): got {g:e} ({:#010x}), gguf.quants {e:e} ({:#010x})",
                i / ty.block_size(),
                g.to_bits(),
                e.to_bits()
            );
        }
        // The fixture is not trivial: its infinite and NaN scales reach the output.
        assert!(expected.iter().any(|x| x.is_nan()), "{ty}: the fixture has no NaN result");
        assert!(expected.iter().any(|x| x.is_infinite()), "{ty}: the fixture has no infinite result");
        // The same through dequantize_into, as one flat row.
        let mut out = vec![0.0; expected.len()];
        dequantize_into(ty, &blocks, &[expected.len()], &mut out).expect("valid input");
        assert!(out.iter().zip(&got).all(|(a, b)| same(*a, *b)), "{ty}: dequantize_into differs");
    }
}

#[test]
fn dequantize_fixtures_cover_extreme_and_subnormal_f16_scales() {
    // Byte offset of each type's main f16 scale `d` in its block.
    for (ty, d_at) in
        [(GgmlType::Q8_0, 0), (GgmlType::Q4_0, 0), (GgmlType::Q4_1, 0), (GgmlType::Q4K, 0), (GgmlType::Q6K, 208)]
    {
        let blocks = fixture(&format!("{}_dequant_in.bin", stem(ty)));
        let scales: Vec<u16> =
            blocks.chunks_exact(ty.block_bytes()).map(|b| u16::from_le_bytes([b[d_at], b[d_at + 1]])).collect();
        // The smallest subnormal, the largest subnormal (negative), the largest finite value,
        // infinity and NaN.
        for special in [0x0001u16, 0x83FF, 0x7BFF, 0x7C00, 0x7E00] {
            assert!(scales.contains(&special), "no {ty} fixture block has the f16 scale {special:#06x}");
        }
    }
}

#[test]
fn quantize_matches_the_reference_quantizer_byte_for_byte() {
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        let x = f32s(&fixture(&format!("{}_quantize_in.f32", stem(ty))));
        let expected = fixture(&format!("{}_quantize_out.bin", stem(ty)));
        let got = quantize(ty, &x, &[3, 256]).expect("finite input, scales in range");
        assert_eq!(got.len(), expected.len(), "{ty}");
        for (b, (g, e)) in got.chunks(ty.block_bytes()).zip(expected.chunks(ty.block_bytes())).enumerate() {
            assert_eq!(g, e, "{ty} block {b}: input {:?}", &x[b * 32..b * 32 + 32]);
        }
        // The last block's scale is f16's largest finite value: the edge of ScaleOverflow.
        assert_eq!(&got[got.len() - ty.block_bytes()..][..2], &[0xFF, 0x7B], "{ty}");
        let mut out = vec![0xAA; expected.len()];
        quantize_into(ty, &x, &[768], &mut out).expect("valid input");
        assert_eq!(out, expected, "{ty}: quantize_into");
    }
}

#[test]
fn q4_0_nibbles_hold_element_j_low_and_j_plus_16_high() {
    let mut b = BlockQ4_0 { d: [0x00, 0x3C], qs: [0; 16] }; // d = 1
    for j in 0..16 {
        b.qs[j] = j as u8 | ((15 - j as u8) << 4);
    }
    let y = dequantize(GgmlType::Q4_0, bytemuck::bytes_of(&b), &[32]).expect("one block");
    for j in 0..16 {
        assert_eq!((y[j], y[j + 16]), (j as f32 - 8.0, 7.0 - j as f32), "j = {j}");
    }
}

#[test]
fn q6_k_element_positions() {
    // Every quant 0 (value −32) except element 100 of the first half: l = 4, the fourth
    // group, so its low nibble is ql[36] >> 4, its high bits qh[4] >> 6, its scale scales[6].
    let mut b = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [1; 16], d: [0x00, 0x3C] };
    b.ql[36] = 0xA0;
    b.qh[4] = 0xC0;
    b.scales[6] = -3;
    let y = dequantize(GgmlType::Q6K, bytemuck::bytes_of(&b), &[256]).expect("one block");
    assert_eq!(y[100], -3.0 * (0x3A as f32 - 32.0));
    assert_eq!(y[101], -3.0 * -32.0); // same scale, quant 0
    assert_eq!(y[36], -32.0); // ql[36]'s low nibble belongs to element 36 (scale 2: l = 4, 32 + 4)
    assert_eq!(y[200], -32.0);
}

#[test]
fn bad_shapes_and_lengths_are_typed_errors() {
    let ty = GgmlType::Q8_0;
    assert!(matches!(
        dequantize(ty, &[0; 34 * 3], &[2, 48]),
        Err(QuantError::RowNotBlockMultiple { k: 48, block_size: 32, .. })
    ));
    assert!(matches!(quantize(GgmlType::Q4_0, &[0.0; 96], &[2, 48]), Err(QuantError::RowNotBlockMultiple { .. })));
    assert!(matches!(
        dequantize(GgmlType::Q6K, &[0; 210], &[1, 128]),
        Err(QuantError::RowNotBlockMultiple { k: 128, block_size: 256, .. })
    ));
    assert_eq!(
        dequantize(ty, &[0; 67], &[2, 32]),
        Err(QuantError::ByteCount { ty, shape: vec![2, 32], expected: 68, actual: 67 })
    );
    assert!(matches!(dequantize(ty, &[0; 69], &[2, 32]), Err(QuantError::ByteCount { expected: 68, actual: 69, .. })));
    assert!(matches!(
        dequantize_into(ty, &[0; 68], &[2, 32], &mut [0.0; 63]),
        Err(QuantError::ElementCount { expected: 64, actual: 63, .. })
    ));
    assert!(matches!(quantize(ty, &[0.0; 63], &[2, 32]), Err(QuantError::ElementCount { .. })));
    assert!(matches!(
        quantize_into(ty, &[0.0; 64], &[2, 32], &mut [0; 67]),
        Err(QuantError::ByteCount { expected: 68, actual: 67, .. })
    ));
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        assert_eq!(quantize(ty, &[0.0; 256], &[256]), Err(QuantError::QuantizeUnsupported { ty }));
    }
    assert!(matches!(dequantize(ty, &[], &[usize::MAX, 64]), Err(QuantError::Overflow { .. })));
    // Empty tensors are fine.
    assert_eq!(dequantize(ty, &[], &[0, 64]), Ok(vec![]));
    assert_eq!(quantize(ty, &[], &[3, 0]), Ok(vec![]));
    assert_eq!(dequantize(GgmlType::F32, &1.5f32.to_le_bytes(), &[]), Ok(vec![1.5]));
}

#[test]
fn non_finite_values_and_out_of_range_scales_are_refused() {
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.5; 64];
            x[37] = bad;
            match quantize(ty, &x, &[2, 32]) {
                Err(QuantError::NonFinite { index: 37, value, .. }) => assert!(same(value, bad)),
                other => panic!("{ty} with {bad}: {other:?}"),
            }
        }
    }
    // Q8_0: amax / 127 = 65520 rounds to f16 infinity; 65504 · 127 is the largest that fits.
    let mut x = vec![1.0; 64];
    x[40] = 65520.0 * 127.0;
    assert!(matches!(
        quantize(GgmlType::Q8_0, &x, &[64]),
        Err(QuantError::ScaleOverflow { block: 1, field: "scale", .. })
    ));
    x[40] = 65504.0 * 127.0;
    assert!(quantize(GgmlType::Q8_0, &x, &[64]).is_ok());
    // Q4_1 stores its minimum in f16 as well.
    let mut x = vec![-70000.0; 32];
    x[0] = -69990.0;
    assert!(matches!(
        quantize(GgmlType::Q4_1, &x, &[32]),
        Err(QuantError::ScaleOverflow { block: 0, field: "minimum", .. })
    ));
    // Q4_0: |max| / 8 past f16's range.
    assert!(matches!(
        quantize(GgmlType::Q4_0, &[1e6; 32], &[32]),
        Err(QuantError::ScaleOverflow { field: "scale", .. })
    ));
}

#[test]
fn f32_subnormal_blocks_quantize_to_zero_scales() {
    // 1/d overflows f32 here (undefined behaviour in the C reference); the f16 scale is 0, so
    // the block dequantizes to zeros whatever its quants are.
    let x: Vec<f32> = (0..32).map(|i| f32::from_bits(1 + i * 1000) * if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        let q = quantize(ty, &x, &[32]).expect("finite input");
        let y = dequantize(ty, &q, &[32]).expect("valid blocks");
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: {y:?}");
    }
}

#[test]
fn dense_types_round_to_nearest_even_and_widen_exactly() {
    let x = [0.0, -0.0, 1.0, 1.0 + 2f32.powi(-11), 65519.0, 65520.0, 1e-8, -3.3e38, f32::INFINITY, f32::MIN_POSITIVE];
    for d in DType::ALL {
        let ty = GgmlType::from(d);
        let bytes = quantize(ty, &x, &[x.len()]).expect("dense types take any value");
        assert_eq!(bytes.len(), x.len() * d.size_bytes());
        let y = dequantize(ty, &bytes, &[x.len()]).expect("valid");
        for (a, b) in x.iter().zip(&y) {
            assert!(same(d.round_f32(*a), *b), "{d}: {a:e} became {b:e}");
        }
    }
    // NaN stays NaN, quiet, in every dense type.
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
        let y = dequantize(ty, &quantize(ty, &[f32::NAN], &[1]).expect("dense"), &[1]).expect("valid");
        assert!(y[0].is_nan(), "{ty}");
    }
    assert_eq!(f16_to_f32([0x00, 0x7C]), f32::INFINITY);
}

/// A block of 32 values of magnitude below 2^e, e in -20..15 (every scale fits f16).
fn block() -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec(-1.0f32..1.0, 32), -20i32..15).prop_map(|(v, e)| {
        let s = 2f32.powi(e);
        v.into_iter().map(|x| x * s).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Quantizing then dequantizing stays within the format's resolution: half a step for the
    /// rounding quantizers, one step for Q4_0 (whose far end is clamped to +7), plus the
    /// rounding of the scale (and Q4_1's minimum) to f16.
    #[test]
    fn round_trips_stay_within_one_quantization_step(x in block()) {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let (min, max) = x.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let f16_u = 2f32.powi(-11);
        let f16_sub = 2f32.powi(-25); // half the smallest f16 subnormal: absolute rounding of tiny scales
        for (ty, d, steps, levels, offset) in [
            (GgmlType::Q8_0, amax / 127.0, 0.5, 127.0, 0.0),
            (GgmlType::Q4_0, amax / 8.0, 1.0, 8.0, 0.0),
            (GgmlType::Q4_1, (max - min) / 15.0, 0.5, 15.0, min.abs()),
        ] {
            let q = quantize(ty, &x, &[32]).expect("finite, in range");
            let y = dequantize(ty, &q, &[32]).expect("valid");
            let d16 = f16_to_f32([q[0], q[1]]).abs();
            let bound = steps * d + levels * (d * f16_u + f16_sub) + offset * f16_u + f16_sub + 1e-6 * amax;
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                prop_assert!((a - b).abs() <= bound, "{} element {}: {} -> {} (d = {}, d16 = {}, bound {})", ty, i, a, b, d, d16, bound);
            }
        }
    }

    /// Each dequantized element is one correctly rounded operation on exact values: the product
    /// q · d equals its f64 value, and Q4_1's q · d + m is the same with a fused multiply-add.
    #[test]
    fn dequantization_rounds_once(d in any::<u16>(), m in any::<u16>(), qs in prop::collection::vec(any::<u8>(), 32)) {
        let (df, mf) = (f16_to_f32(d.to_le_bytes()), f16_to_f32(m.to_le_bytes()));
        prop_assume!(df.is_finite() && mf.is_finite());
        let mut q8 = d.to_le_bytes().to_vec();
        q8.extend(&qs);
        let y = dequantize(GgmlType::Q8_0, &q8, &[32]).expect("one block");
        for j in 0..32 {
            prop_assert_eq!(y[j].to_bits(), ((qs[j] as i8 as f64 * df as f64) as f32).to_bits());
        }
        let mut q4 = d.to_le_bytes().to_vec();
        q4.extend(&qs[..16]);
        let y = dequantize(GgmlType::Q4_0, &q4, &[32]).expect("one block");
        for j in 0..16 {
            let (lo, hi) = ((qs[j] & 0xF) as f64 - 8.0, (qs[j] >> 4) as f64 - 8.0);
            prop_assert_eq!(y[j].to_bits(), ((lo * df as f64) as f32).to_bits());
            prop_assert_eq!(y[j + 16].to_bits(), ((hi * df as f64) as f32).to_bits());
        }
        let mut q41 = d.to_le_bytes().to_vec();
        q41.extend(m.to_le_bytes());
        q41.extend(&qs[..16]);
        let y = dequantize(GgmlType::Q4_1, &q41, &[32]).expect("one block");
        for j in 0..16 {
            let (lo, hi) = (f32::from(qs[j] & 0xF), f32::from(qs[j] >> 4));
            prop_assert!(same(y[j], lo.mul_add(df, mf)) && same(y[j + 16], hi.mul_add(df, mf)));
        }
    }

    /// Dequantization never panics on any bytes, and is a pure function of them.
    #[test]
    fn any_bytes_dequantize(bytes in prop::collection::vec(any::<u8>(), 210 * 2)) {
        for ty in GgmlType::QUANTIZED {
            let n = bytes.len() / ty.block_bytes();
            let data = &bytes[..n * ty.block_bytes()];
            let a = dequantize(ty, data, &[n * ty.block_size()]).expect("whole blocks");
            let b = dequantize(ty, data, &[n, ty.block_size()]).expect("whole blocks");
            prop_assert!(a.iter().zip(&b).all(|(x, y)| same(*x, *y)));
        }
    }
}
