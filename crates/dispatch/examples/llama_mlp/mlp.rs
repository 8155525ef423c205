//! One Llama MLP block on a tilekit device: `y = x + W_down·(silu(W_gate·x) ⊙ W_up·x)`.
//!
//! Shared by the `llama_mlp` example (`main.rs`) and its test (`crates/dispatch/tests/llama_mlp.rs`),
//! which includes this file as a module.
//!
//! The data flow, three ops on the device:
//! 1. `h = x · [W_gate; W_up]ᵀ`: one matmul against the two weights stacked along N
//!    (`[2F, K]`, GGUF's numpy-order `[N, K]` layout, so `trans_b`), `h` is `[M, 2F]`;
//! 2. `a = glu(h, silu)`: `silu(h[:, ..F]) ⊙ h[:, F..]`, `[M, F]`;
//! 3. `y = a · W_downᵀ + 1·x`: a matmul with the residual fused as its `C` term (`beta = 1`).

use tilekit::gguf::{GgufFile, GgufTensor};
use tilekit::quant::GgmlType;
use tilekit::{Activation, DType, Device, Error, MatmulOptions, QTensor, Tensor};

/// A weight as the B operand of a `trans_b` matmul: dense in the run's dtype, or quantized
/// GGUF blocks on the device (dequantized inside the kernel).
pub enum Operand {
    /// A dense `[N, K]` tensor.
    Dense(Tensor),
    /// A quantized `[N, K]` weight ([`Device::matmul_quant`]).
    Quant(QTensor),
}

impl Operand {
    /// `a · selfᵀ` with `opts` (which must have `trans_b`).
    fn matmul(&self, dev: &Device, a: &Tensor, opts: &MatmulOptions<'_>) -> tilekit::Result<Tensor> {
        match self {
            Operand::Dense(b) => dev.matmul(a, b, opts),
            Operand::Quant(w) => dev.matmul_quant(a, w, opts),
        }
    }

    /// Whether the weight stays quantized on the device (the test asserts it).
    #[allow(dead_code)]
    pub fn is_quantized(&self) -> bool {
        matches!(self, Operand::Quant(_))
    }
}

/// The three weights of block `layer`, on the device, ready for the MLP.
pub struct Mlp {
    /// `[W_gate; W_up]`, `[2F, K]`.
    pub gate_up: Operand,
    /// `W_down`, `[K, F]`.
    pub down: Operand,
    /// The model width K.
    pub k: usize,
    /// The hidden width F.
    pub f: usize,
    /// The dtype the block runs in (see [`run_dtype`]).
    pub dtype: DType,
}

/// The names of block `layer`'s MLP weights: gate, up, down.
pub fn tensor_names(layer: usize) -> [String; 3] {
    ["gate", "up", "down"].map(|w| format!("blk.{layer}.ffn_{w}.weight"))
}

/// The dtype of a dense GGUF type, `None` for the quantized ones.
fn dense_dtype(ty: GgmlType) -> Option<DType> {
    match ty {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::Bf16 => Some(DType::Bf16),
        _ => None,
    }
}

/// The dtype the block runs in: the weights' own dtype when all three are stored in the same
/// dense type (they go to the device as they are), f32 otherwise (dense weights widen to it
/// losslessly, quantized ones are dequantized by [`matmul_b_operand`]).
pub fn run_dtype(weights: &[GgufTensor<'_>]) -> DType {
    let mut dtypes = weights.iter().map(|w| dense_dtype(w.ggml_type()));
    match dtypes.next().flatten() {
        Some(d) if dtypes.all(|e| e == Some(d)) => d,
        _ => DType::F32,
    }
}

/// THE step that turns GGUF weights into the B operand of a `trans_b` matmul: `tensors`
/// (each `[N_i, K]` in numpy order) stacked along N into one `[ΣN_i, K]` operand.
///
/// Quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), all of one type, stay quantized: their
/// block bytes are stacked (rows hold whole blocks, so stacking rows is concatenating bytes)
/// into one [`QTensor`] that [`Device::matmul_quant`] dequantizes in registers. Where the
/// device has no quantized kernels (`Error::UnsupportedQuantType`), or
/// the types are mixed, the weights are dequantized on the host into f32 instead, four to
/// eight times the bytes. Dense weights in `dtype` are uploaded as they are stored; other dense
/// types are widened to f32 (exact).
pub fn matmul_b_operand(dev: &Device, tensors: &[GgufTensor<'_>], dtype: DType) -> Result<Operand, String> {
    let k = tensors.first().map_or(0, |t| t.shape()[1]);
    let rows: usize = tensors.iter().map(|t| t.shape()[0]).sum();
    let fail = |t: &GgufTensor<'_>, e: &dyn std::fmt::Display| format!("{}: {e}", t.name());
    let names = || tensors.iter().map(|t| t.name()).collect::<Vec<_>>().join(" + ");
    let ty = tensors.first().map(|t| t.ggml_type());
    if let Some(ty) = ty.filter(|&t| dense_dtype(t).is_none() && tensors.iter().all(|w| w.ggml_type() == t)) {
        let bytes: Vec<u8> = tensors.iter().flat_map(|t| t.data().iter().copied()).collect();
        let w = dev.quant_tensor(ty, &[rows, k], &bytes).map_err(|e| format!("uploading {}: {e}", names()))?;
        // One row through the kernel says whether this backend has it.
        let probe = dev.tensor_from_f32(&[1, k], dtype, &vec![0.0; k]).map_err(|e| e.to_string())?;
        let tb = MatmulOptions::default().trans_b(true);
        match dev.matmul_quant(&probe, &w, &tb) {
            Ok(_) => return Ok(Operand::Quant(w)),
            Err(Error::UnsupportedQuantType { .. }) => {}
            Err(e) => return Err(format!("{}: {e}", names())),
        }
    }
    let all_dense = tensors.iter().all(|t| dense_dtype(t.ggml_type()) == Some(dtype));
    let result = if all_dense && dtype != DType::F32 {
        // f16/bf16 bits as they are stored.
        let bits: Vec<u16> =
            tensors.iter().flat_map(|t| t.data().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]))).collect();
        match dtype {
            DType::F16 => dev.tensor(&[rows, k], &bits.iter().map(|&b| half::f16::from_bits(b)).collect::<Vec<_>>()),
            _ => dev.tensor(&[rows, k], &bits.iter().map(|&b| half::bf16::from_bits(b)).collect::<Vec<_>>()),
        }
    } else {
        let mut values = Vec::with_capacity(rows * k);
        for t in tensors {
            values.extend(t.dequantize().map_err(|e| fail(t, &e))?);
        }
        dev.tensor_from_f32(&[rows, k], dtype, &values)
    };
    result.map(Operand::Dense).map_err(|e| format!("uploading {}: {e}", names()))
}

impl Mlp {
    /// Reads block `layer`'s MLP weights from `file` and puts them on `dev`. Every problem (a
    /// missing tensor, a shape that does not fit the others, an unsupported type) is one line
    /// naming the tensor.
    pub fn load(dev: &Device, file: &GgufFile, layer: usize) -> Result<Mlp, String> {
        let names = tensor_names(layer);
        let mut ws = Vec::new();
        for name in &names {
            let t = file.tensor(name).map_err(|e| format!("{name}: {e}"))?;
            if t.shape().len() != 2 {
                return Err(format!("{name}: shape {:?} is not a matrix", t.shape()));
            }
            ws.push(t);
        }
        let [gate, up, down] = [ws[0], ws[1], ws[2]];
        let (f, k) = (gate.shape()[0], gate.shape()[1]);
        if up.shape() != [f, k] {
            return Err(format!("{}: shape {:?}, expected [{f}, {k}] like {}", up.name(), up.shape(), gate.name()));
        }
        if down.shape() != [k, f] {
            return Err(format!(
                "{}: shape {:?}, expected [{k}, {f}] (the transpose of {}'s)",
                down.name(),
                down.shape(),
                gate.name()
            ));
        }
        let dtype = run_dtype(&ws);
        let gate_up = matmul_b_operand(dev, &[gate, up], dtype)?;
        let down = matmul_b_operand(dev, &[down], dtype)?;
        Ok(Mlp { gate_up, down, k, f, dtype })
    }

    /// `x + W_down·(silu(W_gate·x) ⊙ W_up·x)` for `x` of shape `[K]` or `[M, K]` (f32 values,
    /// rounded to the block's dtype on upload); the result has `x`'s shape, as f32 values.
    pub fn forward(&self, dev: &Device, shape: &[usize], x: &[f32]) -> Result<Vec<f32>, String> {
        let k = self.k;
        let m = match shape {
            [kk] if *kk == k => 1,
            [m, kk] if *kk == k => *m,
            _ => return Err(format!("input: shape {shape:?}, expected [{k}] or [M, {k}] (K = {k} from the weights)")),
        };
        let op = |what: &'static str| move |e: tilekit::Error| format!("{what}: {e}");
        let xt = dev.tensor_from_f32(&[m, k], self.dtype, x).map_err(op("uploading the input"))?;
        let tb = MatmulOptions::default().trans_b(true);
        let h = self.gate_up.matmul(dev, &xt, &tb).map_err(op("x · [W_gate; W_up]"))?;
        let a = dev.glu(&h, Activation::Silu).map_err(op("silu(gate) · up"))?;
        let residual = MatmulOptions::default().trans_b(true).c(Some(&xt)).beta(1.0);
        let y = self.down.matmul(dev, &a, &residual).map_err(op("x + a · W_down"))?;
        y.to_f32_vec().map_err(op("reading the result"))
    }
}
