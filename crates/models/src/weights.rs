//! Loading torchvision's `mobilenet_v2` state_dict from a safetensors file and folding each
//! BatchNorm (eval mode, `eps = 1e-5`) into the conv before it.
//!
//! The file is memory-mapped and parsed in place by the `safetensors` crate; each tensor is
//! read once from the mapping into its folded f32 form (no second copy of the file).
//! Folding, in f64: `s = γ / √(var + eps)`, `W' = W · s` per output channel,
//! `b' = β − mean · s`.

use crate::ModelError;
use crate::arch::{self, BN_EPS, HEAD_CHANNELS, NUM_CLASSES};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// A conv with its BatchNorm folded in: `weight` in PyTorch's `[Cout, Cin/groups, kh, kw]`
/// order, `bias` `[Cout]`.
#[derive(Clone, Debug, PartialEq)]
pub struct FoldedConv {
    /// The state_dict prefix of the conv (`features.3.conv.1.0`).
    pub name: String,
    /// `[Cout, Cin/groups, kh, kw]`.
    pub shape: [usize; 4],
    /// The folded weight.
    pub weight: Vec<f32>,
    /// The folded bias.
    pub bias: Vec<f32>,
}

/// All of MobileNetV2's parameters, folded, in f32 on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    /// The 52 convs in network order (`arch::conv_layers`).
    pub convs: Vec<FoldedConv>,
    /// `classifier.1.weight`, `[1000, 1280]`.
    pub fc_weight: Vec<f32>,
    /// `classifier.1.bias`, `[1000]`.
    pub fc_bias: Vec<f32>,
}

impl Weights {
    /// Loads and folds the weights in `path` (a safetensors file with torchvision's names).
    pub fn load(path: &Path) -> Result<Weights, ModelError> {
        let file = std::fs::File::open(path)
            .map_err(|e| ModelError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        // SAFETY: the mapping is read-only and lives only inside this call; a file changed by
        // another process while it is mapped can give wrong values but not unsoundness in the
        // safetensors parser, which bounds-checks every offset against the mapping's length.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| ModelError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        Weights::from_bytes(&map)
    }

    /// Parses and folds a safetensors file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Weights, ModelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::NotSafetensors(e.to_string()))?;
        let mut convs = Vec::new();
        for (conv, shape, bn) in arch::conv_layers() {
            let w = read(&st, &format!("{conv}.weight"), &shape)?;
            let c = shape[0];
            let gamma = read(&st, &format!("{bn}.weight"), &[c])?;
            let beta = read(&st, &format!("{bn}.bias"), &[c])?;
            let mean = read(&st, &format!("{bn}.running_mean"), &[c])?;
            let var = read(&st, &format!("{bn}.running_var"), &[c])?;
            let per_out = w.len() / c;
            let mut weight = vec![0.0f32; w.len()];
            let mut bias = vec![0.0f32; c];
            for o in 0..c {
                let s = gamma[o] / (var[o] + BN_EPS).sqrt();
                for i in 0..per_out {
                    weight[o * per_out + i] = (w[o * per_out + i] * s) as f32;
                }
                bias[o] = (beta[o] - mean[o] * s) as f32;
            }
            convs.push(FoldedConv { name: conv, shape, weight, bias });
        }
        let to32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let fc_weight = to32(read(&st, "classifier.1.weight", &[NUM_CLASSES, HEAD_CHANNELS])?);
        let fc_bias = to32(read(&st, "classifier.1.bias", &[NUM_CLASSES])?);
        Ok(Weights { convs, fc_weight, fc_bias })
    }
}

/// One tensor as f64, checked for name, shape and a float dtype.
fn read(st: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Result<Vec<f64>, ModelError> {
    let t = st.tensor(name).map_err(|_| ModelError::Missing { name: name.into(), expected: shape.to_vec() })?;
    if t.shape() != shape {
        return Err(ModelError::Shape { name: name.into(), expected: shape.to_vec(), actual: t.shape().to_vec() });
    }
    let data = t.data();
    let v: Vec<f64> = match t.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        Dtype::F64 => data.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect(),
        other => {
            return Err(ModelError::DType { name: name.into(), expected: shape.to_vec(), dtype: format!("{other:?}") });
        }
    };
    Ok(v)
}
