//! Random MobileNetV2 weights under torchvision's state_dict names and shapes, as a safetensors
//! file — what `safetensors.torch.save_file(mobilenet_v2().state_dict(), path)` writes, with
//! made-up values. Tests and benches use it instead of downloading the real weights.
//!
//! The values keep activations of order 1 through all 52 layers: conv weights uniform with
//! He's variance `2/fan_in`, BatchNorm `γ ∈ [0.5, 1.0]`, `β, mean ∈ [-0.1, 0.1]`,
//! `var ∈ [0.5, 1.5]`.

use crate::arch::{self, HEAD_CHANNELS, NUM_CLASSES};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        lo + (hi - lo) * ((z >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// One state_dict entry: name, dtype, shape, little-endian bytes.
pub type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

/// The full torchvision state_dict with random values (f32, plus the int64
/// `num_batches_tracked` scalars torch saves).
pub fn state_dict(seed: u64) -> Vec<Entry> {
    let mut rng = Rng::new(seed);
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut out = Vec::new();
    for (conv, shape, bn) in arch::conv_layers() {
        let fan_in = shape[1] * shape[2] * shape[3];
        let a = (6.0 / fan_in as f32).sqrt();
        out.push((format!("{conv}.weight"), Dtype::F32, shape.to_vec(), f32s(rng.vec(shape.iter().product(), -a, a))));
        let c = shape[0];
        for (what, lo, hi) in
            [("weight", 0.5, 1.0), ("bias", -0.1, 0.1), ("running_mean", -0.1, 0.1), ("running_var", 0.5, 1.5)]
        {
            out.push((format!("{bn}.{what}"), Dtype::F32, vec![c], f32s(rng.vec(c, lo, hi))));
        }
        out.push((format!("{bn}.num_batches_tracked"), Dtype::I64, vec![], 0i64.to_le_bytes().to_vec()));
    }
    let a = (3.0 / HEAD_CHANNELS as f32).sqrt();
    out.push((
        "classifier.1.weight".into(),
        Dtype::F32,
        vec![NUM_CLASSES, HEAD_CHANNELS],
        f32s(rng.vec(NUM_CLASSES * HEAD_CHANNELS, -a, a)),
    ));
    out.push(("classifier.1.bias".into(), Dtype::F32, vec![NUM_CLASSES], f32s(rng.vec(NUM_CLASSES, -0.1, 0.1))));
    out
}

/// Serialises entries as a safetensors file's bytes.
pub fn to_safetensors(entries: &[Entry]) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let views = entries
        .iter()
        .map(|(name, dtype, shape, bytes)| Ok((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize(views, None)
}

/// A random NCHW input `[n, 3, h, w]` in `[-2, 2)` (an already-normalised image's range).
pub fn input(seed: u64, n: usize, h: usize, w: usize) -> Vec<f32> {
    Rng::new(seed ^ 0x5eed).vec(n * 3 * h * w, -2.0, 2.0)
}
