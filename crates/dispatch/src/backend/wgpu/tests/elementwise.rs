//! Activations, the f16/bf16 packing (every bit pattern, rounding on store), the copy and
//! the naive matmul.

use super::*;

pub(super) fn run_activation_case(
    dev: &Device,
    dtype: DType,
    len: usize,
    bias_len: Option<usize>,
    act: Activation,
    in_place: bool,
) {
    let last = bias_len.unwrap_or(len);
    let shape = [len / last, last];
    let xv: Vec<f32> = values(len, len as u64 + 9).iter().map(|v| v * 6.0).collect();
    let x = dev.tensor_from_f32(&shape, dtype, &xv).unwrap();
    let bias = bias_len.map(|bl| upload(dev, dtype, &values(bl, 77)));
    let xw = widen(&x);
    let out = if in_place {
        dev.activation_in_place(&x, bias.as_ref(), act).unwrap();
        x.clone()
    } else {
        dev.activation(&x, bias.as_ref(), act).unwrap()
    };
    let got = out.to_f32_vec().unwrap();
    let desc = ActivationDesc::new(len, bias_len, act);
    let bw = bias.as_ref().map(widen);
    let mut want = vec![0.0; len];
    reference::activation(&desc, &xw, bw.as_deref(), &mut want);
    let mag: Vec<f64> = want.iter().map(|w| w.abs() + 8.0).collect();
    assert_close(&format!("activation {dtype} {act} len {len} in place {in_place}"), dtype, &got, &want, &mag, 1);
}

#[test]
fn activation_all_functions_bias_and_in_place() {
    for (dev, dtype) in variants() {
        for act in Activation::ALL {
            for (len, bias_len) in [(1, None), (3, Some(3)), (4, Some(4)), (7, None), (30, Some(5)), (1000, Some(8))] {
                run_activation_case(dev, dtype, len, bias_len, act, false);
            }
            run_activation_case(dev, dtype, 35, Some(7), act, true);
            run_activation_case(dev, dtype, 36, Some(4), act, true);
        }
    }
}

/// Every f16 and bf16 bit pattern through device unpack/pack: `activation(None)` is an exact
/// copy on the packed paths (NaNs keep their bits too); the native f16 path keeps every value
/// and every NaN a NaN.
#[test]
fn every_half_bit_pattern_round_trips() {
    for (dev, dtype) in variants() {
        if dtype == DType::F32 {
            continue;
        }
        let native = dtype == DType::F16 && backend(dev).native_f16;
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let x = match dtype {
            DType::F16 => dev.tensor(&[bits.len()], &bits.iter().map(|&b| half::f16::from_bits(b)).collect::<Vec<_>>()),
            _ => dev.tensor(&[bits.len()], &bits.iter().map(|&b| half::bf16::from_bits(b)).collect::<Vec<_>>()),
        }
        .unwrap();
        let out = dev.activation(&x, None, Activation::None).unwrap();
        let got: Vec<u16> = bytemuck::cast_slice::<u8, u16>(&out.to_bytes().unwrap()).to_vec();
        for (&want, &g) in bits.iter().zip(&got) {
            let nan = if dtype == DType::F16 {
                half::f16::from_bits(want).is_nan()
            } else {
                half::bf16::from_bits(want).is_nan()
            };
            if native && nan {
                assert!(half::f16::from_bits(g).is_nan(), "{dtype}: {want:#06x} came back as {g:#06x}");
            } else {
                assert_eq!(g, want, "{dtype} (native {native}): {want:#06x} came back as {g:#06x}");
            }
        }
    }
}

#[test]
fn rounding_on_store_is_nearest_even() {
    for (dev, dtype) in variants() {
        if dtype == DType::F32 {
            continue;
        }
        // x + bias is exact in f32 and lands between two neighbours of the storage type:
        // ties (to even, both directions), above ties, negative, overflow and subnormals.
        let e = dtype.unit_roundoff() as f32;
        let pairs: Vec<(f32, f32)> = vec![
            (1.0, e),
            (1.0 + 2.0 * e, e),
            (1.0, e * (1.0 + 1.0 / 16.0)),
            (-1.0, -e * (1.0 + 1.0 / 16.0)),
            (1.0, e * (1.0 - 1.0 / 16.0)),
            (65504.0, 16.0),
            (65504.0, 8.0),
            (65504.0, 15.0),
            (3.0e38, 3.0e38),
            (2f32.powi(-14), -2f32.powi(-24) * 3.0),
            (2f32.powi(-24), 2f32.powi(-26)),
            (f32::INFINITY, 1.0),
            (f32::NAN, 0.0),
        ];
        let xs: Vec<f32> = pairs.iter().map(|p| p.0).collect();
        let bs: Vec<f32> = pairs.iter().map(|p| p.1).collect();
        let x = dev.tensor_from_f32(&[1, xs.len()], dtype, &xs).unwrap();
        let bias = dev.tensor_from_f32(&[bs.len()], dtype, &bs).unwrap();
        let out = dev.activation(&x, Some(&bias), Activation::None).unwrap();
        let (xr, br) = (x.to_f32_vec().unwrap(), bias.to_f32_vec().unwrap());
        let got = out.to_f32_vec().unwrap();
        for i in 0..xs.len() {
            let w = dtype.round_f32(xr[i] + br[i]);
            let g = got[i];
            assert!(g == w || (g.is_nan() && w.is_nan()), "{dtype}: {} + {} -> {g}, want {w}", xr[i], br[i]);
        }
    }
}

#[test]
fn copy_moves_raw_words_and_respects_odd_lengths() {
    for (dev, dtype) in variants() {
        for len in [1usize, 2, 5, 8, 9, 17, 1001] {
            let src = upload(dev, dtype, &values(len, len as u64));
            let dst = upload(dev, dtype, &vec![3.0; len + 1]);
            let src_view = src.clone();
            // Device::copy copies src.len() elements into the first elements of dst.
            let dst_view = dst.clone();
            backend(dev)
                .copy(
                    dtype,
                    WgpuBackend::storage_of(&src_view.buffer.storage).unwrap(),
                    WgpuBackend::storage_of(&dst_view.buffer.storage).unwrap(),
                    len,
                )
                .unwrap();
            let got = dst.to_f32_vec().unwrap();
            assert_eq!(&got[..len], &src.to_f32_vec().unwrap()[..], "{dtype} len {len}");
            assert_eq!(got[len], 3.0, "{dtype} len {len}: the element after the copy changed");
        }
    }
}

#[test]
#[cfg(feature = "bench-refs")]
fn naive_matmul_matches_the_reference() {
    let Some(dev) = device(false) else { return };
    for (m, n, k) in [(1, 1, 1), (17, 5, 9), (3, 33, 0)] {
        let a = dev.tensor_from_f32(&[m, k], DType::F32, &values(m * k, 1)).unwrap();
        let b = dev.tensor_from_f32(&[k, n], DType::F32, &values(k * n, 2)).unwrap();
        let out = dev.naive_matmul(&a, &b).unwrap().unwrap();
        let mut want = vec![0.0; m * n];
        reference::matmul(&MatmulDesc::new(m, n, k), &widen(&a), &widen(&b), None, None, &mut want);
        let mag = vec![k as f64; m * n];
        assert_close("naive matmul", DType::F32, &out.to_f32_vec().unwrap(), &want, &mag, k);
    }
}
