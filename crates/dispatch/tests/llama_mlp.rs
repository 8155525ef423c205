//! The `llama_mlp` example's logic (`examples/llama_mlp/mlp.rs`, included here) on small GGUF
//! files this test writes, in every weight type tilekit reads and on every backend present,
//! against an `f64` reference; and its one-line errors for a missing tensor and a wrong shape.

#[path = "../examples/llama_mlp/mlp.rs"]
#[allow(dead_code)]
mod mlp;

use tilekit::gguf::GgufFile;
use tilekit::kernels::tolerance;
use tilekit::quant::{self, GgmlType};
use tilekit::{Activation, Device, WgpuOptions};

/// A minimal GGUF (version 3) writer: no metadata, default alignment (32), tensors given as
/// (name, numpy-order shape, type, raw bytes).
fn gguf_bytes(tensors: &[(String, Vec<usize>, GgmlType, Vec<u8>)]) -> Vec<u8> {
    const ALIGN: usize = 32;
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    let mut offset = 0usize;
    for (name, shape, ty, data) in tensors {
        b.extend_from_slice(&(name.len() as u64).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        // GGUF lists dimensions innermost first (ne0 = K for a [N, K] weight).
        for &d in shape.iter().rev() {
            b.extend_from_slice(&(d as u64).to_le_bytes());
        }
        b.extend_from_slice(&ty.id().to_le_bytes());
        b.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = (offset + data.len()).next_multiple_of(ALIGN);
    }
    b.resize(b.len().next_multiple_of(ALIGN), 0);
    for (_, _, _, data) in tensors {
        b.extend_from_slice(data);
        b.resize(b.len().next_multiple_of(ALIGN), 0);
    }
    b
}

/// SplitMix64 in [−1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The bytes of a `[n, k]` weight of type `ty` with values of about `scale`.
fn weight(ty: GgmlType, n: usize, k: usize, scale: f32, rng: &mut Rng) -> Vec<u8> {
    let values: Vec<f32> = (0..n * k).map(|_| rng.uniform() * scale).collect();
    match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        GgmlType::Bf16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        GgmlType::Q4K | GgmlType::Q6K => {
            // No reference quantizer for the K-quants: random blocks with small finite scales
            // (any bit pattern of the quants and sub-block scales is a valid block).
            let bb = ty.block_bytes();
            let mut out: Vec<u8> = (0..n * k / ty.block_size() * bb).map(|_| rng.next() as u8).collect();
            for block in out.chunks_exact_mut(bb) {
                let d = half::f16::from_f32(scale / 64.0).to_le_bytes();
                if ty == GgmlType::Q4K {
                    block[..2].copy_from_slice(&d);
                    block[2..4].copy_from_slice(&half::f16::from_f32(scale / 128.0).to_le_bytes());
                } else {
                    block[bb - 2..].copy_from_slice(&d);
                }
            }
            out
        }
        _ => quant::quantize(ty, &values, &[n, k]).expect("quantize"),
    }
}

/// Every backend present, created once (with a visible skip line for the others).
fn devices() -> &'static [(&'static str, Device)] {
    static DEVICES: std::sync::OnceLock<Vec<(&'static str, Device)>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut v = vec![("cpu", Device::cpu())];
        match Device::wgpu(&WgpuOptions::allow_software()) {
            Ok(d) => v.push(("wgpu", d)),
            Err(e) => eprintln!("SKIP llama_mlp wgpu: {e}"),
        }
        match Device::cuda(0) {
            Ok(d) => v.push(("cuda", d)),
            Err(e) => eprintln!("SKIP llama_mlp cuda: {e}"),
        }
        v
    })
}

/// One block in types `[gate, up, down]` at K = F = 256 (a multiple of every block size) and
/// M = 3, on every backend, against the f64 reference with an error bound carried through the
/// three steps (each from `tilekit::kernels::tolerance`).
fn check(types: [GgmlType; 3], seed: u64) {
    let (k, f, m, layer) = (256, 256, 3, 2);
    let mut rng = Rng(seed);
    let names = mlp::tensor_names(layer);
    let shapes = [vec![f, k], vec![f, k], vec![k, f]];
    let mut tensors = Vec::new();
    for ((name, shape), ty) in names.iter().zip(&shapes).zip(types) {
        tensors.push((name.clone(), shape.clone(), ty, weight(ty, shape[0], shape[1], 0.25, &mut rng)));
    }
    // A decoy block, so that the layer number matters.
    tensors.push((
        "blk.0.ffn_gate.weight".into(),
        vec![f, k],
        GgmlType::F32,
        weight(GgmlType::F32, f, k, 1.0, &mut rng),
    ));
    let file = GgufFile::from_bytes(gguf_bytes(&tensors)).expect("the written GGUF parses");
    let w: Vec<Vec<f64>> = tensors[..3]
        .iter()
        .map(|(_, shape, ty, data)| {
            quant::dequantize(*ty, data, shape).expect("dequantize").iter().map(|&v| v as f64).collect()
        })
        .collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform() * 2.0).collect();
    for (label, dev) in devices() {
        let (label, dev) = (*label, dev);
        let block = mlp::Mlp::load(dev, &file, layer).unwrap_or_else(|e| panic!("{label}: {e}"));
        // One quantized type for gate and up: the CPU keeps them quantized (matmul_quant).
        let quant = |t: GgmlType| !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16);
        if dev.kind() == tilekit::BackendKind::Cpu {
            let gate_up = types[0] == types[1] && quant(types[0]);
            assert_eq!(block.gate_up.is_quantized(), gate_up, "{label}: {types:?} gate/up on the device");
            assert_eq!(block.down.is_quantized(), quant(types[2]), "{label}: {types:?} down on the device");
        }
        let dtype = block.dtype;
        if dev.check_dtype(dtype).is_err() {
            eprintln!("SKIP llama_mlp {label} {dtype}: not supported there");
            continue;
        }
        let got = block.forward(dev, &[m, k], &x).unwrap_or_else(|e| panic!("{label}: {e}"));
        // The reference on x as stored in the run's dtype.
        let xs: Vec<f64> = x.iter().map(|&v| dtype.round_f32(v) as f64).collect();
        for r in 0..m {
            let xr = &xs[r * k..(r + 1) * k];
            // h = x · [W_gate; W_up]ᵀ with its bound; then a = silu(g) · u with its own.
            let mut a = vec![0.0f64; f];
            let mut a_err = vec![0.0f64; f];
            for j in 0..f {
                let dot = |wm: &[f64]| -> (f64, f64) {
                    let row = &wm[j * k..(j + 1) * k];
                    (row.iter().zip(xr).map(|(w, x)| w * x).sum(), row.iter().zip(xr).map(|(w, x)| (w * x).abs()).sum())
                };
                let ((g, gs), (u, us)) = (dot(&w[0]), dot(&w[1]));
                let ge = tolerance::bound_from_magnitude(dtype, Activation::None, k, gs, g);
                let ue = tolerance::bound_from_magnitude(dtype, Activation::None, k, us, u);
                let s = Activation::Silu.apply_f64(g);
                a[j] = s * u;
                // Propagated (silu's slope is at most 1.1) plus the op's own error, with room for
                // g and u being off by their bounds inside glu_bound's magnitude terms.
                a_err[j] = 1.1 * ge * (u.abs() + ue)
                    + s.abs() * ue
                    + tolerance::glu_bound(
                        dtype,
                        Activation::Silu,
                        g.abs() + ge,
                        u.abs() + ue,
                        s.abs() * u.abs() + 1.1 * ge * (u.abs() + ue) + s.abs() * ue,
                    );
            }
            for i in 0..k {
                let row = &w[2][i * f..(i + 1) * f];
                let want: f64 = xr[i] + row.iter().zip(&a).map(|(w, a)| w * a).sum::<f64>();
                let mag: f64 = xr[i].abs() + row.iter().zip(&a).map(|(w, a)| (w * a).abs()).sum::<f64>();
                let carried: f64 = row.iter().zip(&a_err).map(|(w, e)| w.abs() * e).sum();
                let bound = carried + tolerance::bound_from_magnitude(dtype, Activation::None, f, mag, want);
                let g = got[r * k + i];
                assert!(
                    (g as f64 - want).abs() <= bound,
                    "{label} {types:?} ({dtype}) y[{r}, {i}] = {g}, want {want} (bound {bound:e})"
                );
            }
        }
        eprintln!("llama_mlp {label}: {types:?} in {dtype} matches the f64 reference");
    }
}

#[test]
fn dense_weights_run_in_their_dtype() {
    for (i, ty) in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16].into_iter().enumerate() {
        check([ty; 3], 10 + i as u64);
    }
}

#[test]
fn quantized_weights_stay_quantized_where_the_backend_has_kernels() {
    for (i, ty) in
        [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K, GgmlType::Q6K].into_iter().enumerate()
    {
        check([ty; 3], 20 + i as u64);
    }
    // Mixed types (as Q4_K_M files mix Q4_K and Q6_K) run in f32; W_down stays quantized alone.
    check([GgmlType::Q4K, GgmlType::F16, GgmlType::Q6K], 30);
}

#[test]
fn errors_name_the_tensor() {
    let (k, f) = (32, 64);
    let mut rng = Rng(5);
    let ok = |shape: Vec<usize>, name: &str, rng: &mut Rng| {
        (name.to_string(), shape.clone(), GgmlType::F32, weight(GgmlType::F32, shape[0], shape[1], 1.0, rng))
    };
    let good = vec![
        ok(vec![f, k], "blk.0.ffn_gate.weight", &mut rng),
        ok(vec![f, k], "blk.0.ffn_up.weight", &mut rng),
        ok(vec![k, f], "blk.0.ffn_down.weight", &mut rng),
    ];
    let dev = Device::cpu();
    let file = GgufFile::from_bytes(gguf_bytes(&good)).expect("parses");
    let Err(e) = mlp::Mlp::load(&dev, &file, 1) else { panic!("layer 1 does not exist") };
    assert!(e.starts_with("blk.1.ffn_gate.weight:") && !e.contains('\n'), "{e}");
    let block = mlp::Mlp::load(&dev, &file, 0).expect("layer 0 loads");
    let Err(e) = block.forward(&dev, &[2, k + 1], &vec![0.0; 2 * (k + 1)]) else { panic!("wrong input width") };
    assert!(e.starts_with("input:"), "{e}");
    // W_down with the shape of W_gate.
    let mut bad = good.clone();
    bad[2] = ok(vec![f, k], "blk.0.ffn_down.weight", &mut rng);
    let file = GgufFile::from_bytes(gguf_bytes(&bad)).expect("parses");
    let Err(e) = mlp::Mlp::load(&dev, &file, 0) else { panic!("a wrong W_down shape") };
    assert!(e.starts_with("blk.0.ffn_down.weight: shape [64, 32]"), "{e}");
    // W_up of another width.
    let mut bad = good;
    bad[1] = ok(vec![f + 1, k], "blk.0.ffn_up.weight", &mut rng);
    let file = GgufFile::from_bytes(gguf_bytes(&bad)).expect("parses");
    let Err(e) = mlp::Mlp::load(&dev, &file, 0) else { panic!("a wrong W_up shape") };
    assert!(e.starts_with("blk.0.ffn_up.weight:"), "{e}");
}
