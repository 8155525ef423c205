//! `matmul_quant`: the matmul with a quantized weight as `B`.

use super::matmul::{dense_view, dims, epilogue_view};
use super::{check_device, check_dtype, check_finite, check_fits, storage};
use crate::backend::{BackendOps, QuantView, with_backend};
use crate::{Device, Error, MatmulOptions, QTensor, Result, Tensor};
use tilekit_kernels::{MatmulDesc, MatrixView, Precision};

const OP: &str = "matmul_quant";

impl Device {
    /// `act(alpha · op(A) · Wᵀ + bias + beta · C)` with `W` a quantized weight `[N, K]`.
    ///
    /// The options are [`Device::matmul`]'s, with `trans_b` required (`W` is stored `[N, K]`,
    /// as GGUF and `nn.Linear` store weights) and `precision` [`Precision::Highest`]. `A` is
    /// `[M, K]` or `[batch, M, K]` (transposed with `trans_a`) in f32, f16 or bf16 and is not
    /// quantized; the weight is shared by every batch. The result, in `A`'s dtype, is within
    /// the f32-accumulation bound (`tilekit_kernels::tolerance`) of `A · dequantize(W)ᵀ`: each
    /// weight is dequantized exactly as `tilekit::quant::dequantize` does, inside the kernel,
    /// and the fused epilogue is the dense matmul's.
    pub fn matmul_quant(&self, a: &Tensor, w: &QTensor, opts: &MatmulOptions<'_>) -> Result<Tensor> {
        if !opts.trans_b {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "trans_b",
                reason: "a quantized weight is stored [N, K] (GGUF / nn.Linear layout): set trans_b".into(),
            });
        }
        if opts.precision != Precision::Highest {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "precision",
                reason: "quantized weights are multiplied in f32 (Precision::Highest) only".into(),
            });
        }
        let (ab, ar, ac) = dims("a", a)?;
        let (m, k) = if opts.trans_a { (ac, ar) } else { (ar, ac) };
        let [n, wk] = w.shape;
        if wk != k {
            return Err(Error::ShapeMismatch { op: OP, tensor: "w", expected: vec![n, k], actual: w.shape.to_vec() });
        }
        let batch = ab.unwrap_or(1);
        let c_view = epilogue_view(OP, opts, ab.is_some(), batch, m, n)?;
        let desc = MatmulDesc::new(m, n, k)
            .batch(batch)
            .trans_a(opts.trans_a)
            .trans_b(true)
            .a(dense_view(ab, ar, ac))
            .b(MatrixView::new(0, k, 0))
            .c(c_view)
            .bias_offset(opts.bias.map(|_| 0))
            .out(MatrixView::dense(m, n))
            .alpha(opts.alpha)
            .beta(opts.beta)
            .activation(opts.activation)
            .precision(opts.precision);
        let dtype = a.dtype();
        for (name, t) in [("w", Some(&w.scales)), ("bias", opts.bias), ("c", opts.c)] {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
            }
        }
        check_device(OP, self, "a", a)?;
        for (name, t) in [("bias", opts.bias), ("c", opts.c)] {
            if let Some(t) = t {
                check_dtype(OP, dtype, name, t)?;
            }
        }
        check_finite(OP, "alpha", desc.alpha)?;
        check_finite(OP, "beta", desc.beta)?;
        self.check_dtype(dtype)?;
        check_fits(OP, "a", desc.a.required_len(batch, ar, ac), a)?;
        if let (Some(v), Some(c)) = (desc.c, opts.c) {
            check_fits(OP, "c", v.required_len(batch, m, n), c)?;
        }
        let out_shape = if ab.is_some() { vec![batch, m, n] } else { vec![m, n] };
        let out = self.output_tensor(&out_shape, dtype)?;
        if batch == 0 || m == 0 || n == 0 {
            return Ok(out);
        }
        self.profiled(
            || {
                // B is the quantized weight (read once, broadcast over batches): its GGUF bytes,
                // not K·N elements of the dtype.
                let mut info = crate::profile::OpInfo::matmul(OP, &desc, dtype);
                let dense = (n * k * dtype.size_bytes()) as u64;
                let quant = (n * (k / w.ty.block_size()) * w.ty.block_bytes()) as u64;
                info.bytes = info.bytes.saturating_sub(dense) + quant;
                info
            },
            || with_backend!(self, be => run(be, &desc, a, w, opts.bias, opts.c, &out)),
        )?;
        Ok(out)
    }
}

fn run<B: BackendOps>(
    be: &B,
    desc: &MatmulDesc,
    a: &Tensor,
    w: &QTensor,
    bias: Option<&Tensor>,
    c: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let view = QuantView {
        ty: w.ty,
        n: w.shape[0],
        k: w.shape[1],
        scales: storage::<B>(OP, "w", &w.scales)?,
        body: storage::<B>(OP, "w", &w.body)?,
    };
    be.matmul_quant(
        desc,
        a.dtype(),
        storage::<B>(OP, "a", a)?,
        &view,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        c.map(|t| storage::<B>(OP, "c", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}
