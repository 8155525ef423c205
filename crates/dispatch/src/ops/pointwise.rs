//! `pointwise_conv2d`: the 1×1 convolution, `out = act(W·x + bias + residual)` per pixel, on
//! the matmul kernels.
//!
//! - **NHWC** is one plain GEMM: the input `[N·H·W, Cin]` times `Wᵀ` (the weight `[Cout, Cin]`
//!   read transposed), with the bias (one per output column), the residual (`C`, `beta = 1`)
//!   and the activation fused in the matmul epilogue.
//! - **NCHW** is a batched GEMM: per image, `W [Cout, Cin] · x [Cin, H·W]`, the weight broadcast
//!   to every image with `batch_stride = 0`, the residual fused as `C`. The matmul's bias runs
//!   along output columns (here pixels), so a per-channel bias cannot ride in that epilogue:
//!   with a bias, the GEMM (plus residual) writes a temporary and a 1×1 depthwise pass with unit
//!   weights adds the bias and applies the activation — one extra read and write of the output.
//!   Without a bias the NCHW path is the one GEMM with the activation fused.
//! - A backend with a pointwise kernel of its own for the call (`BackendOps::has_pointwise`:
//!   the CPU's `cpu/pointwise.rs`, every NCHW call and NHWC ones of 512 pixels or more) runs
//!   it there instead, bias, residual and activation included, in one pass.

use super::{check_bias, check_operands, check_output, conv_input_dims, storage};
use crate::backend::{BackendOps, PointwiseArgs, PointwiseDesc, with_backend};
use crate::{Conv2dOptions, Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, Layout, MatmulDesc, MatrixView, Precision};

const OP: &str = "pointwise_conv2d";

/// The options of [`Device::pointwise_conv2d`]. `Default`: NCHW, no activation, no residual.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct PointwiseOptions<'a> {
    /// Layout of input, output and residual.
    pub layout: Layout,
    /// Activation applied last (after bias and residual).
    pub activation: Activation,
    /// A tensor of the output's shape added before the activation.
    pub residual: Option<&'a Tensor>,
}

/// The checked geometry of one call.
struct Geometry {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    layout: Layout,
}

impl Geometry {
    fn output_shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Nchw => vec![self.n, self.cout, self.h, self.w],
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            _ => vec![self.n, self.h, self.w, self.cout],
        }
    }
}

impl Device {
    /// 1×1 convolution. `input` is `[N, Cin, H, W]` (NCHW) or `[N, H, W, Cin]` (NHWC); `weight`
    /// is `[Cout, Cin, 1, 1]` (PyTorch's layout) or `[Cout, Cin]`; `bias`, if given, has `Cout`
    /// elements; `opts.residual`, if given, has the output's shape. The output is
    /// `act(W·x + bias + residual)` in the input's layout and dtype.
    pub fn pointwise_conv2d(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &PointwiseOptions<'_>,
    ) -> Result<Tensor> {
        let g = self.pointwise_geometry(input, weight, bias, opts)?;
        let out = self.output_tensor(&g.output_shape(), input.dtype())?;
        self.run_pointwise(&g, input, weight, bias, opts, &out)?;
        Ok(out)
    }

    /// [`Device::pointwise_conv2d`] into an existing output tensor of the right shape, which may
    /// not share a buffer with any input.
    pub fn pointwise_conv2d_into(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &PointwiseOptions<'_>,
        out: &Tensor,
    ) -> Result<()> {
        let g = self.pointwise_geometry(input, weight, bias, opts)?;
        let operands = [("input", Some(input)), ("weight", Some(weight)), ("bias", bias), ("residual", opts.residual)];
        check_output(OP, self, input.dtype(), out, &operands)?;
        if out.shape() != g.output_shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: g.output_shape(),
                actual: out.shape().to_vec(),
            });
        }
        self.run_pointwise(&g, input, weight, bias, opts, out)
    }

    fn pointwise_geometry(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &PointwiseOptions<'_>,
    ) -> Result<Geometry> {
        let dtype = input.dtype();
        let operands = [("input", Some(input)), ("weight", Some(weight)), ("bias", bias), ("residual", opts.residual)];
        check_operands(OP, self, dtype, &operands)?;
        self.check_dtype(dtype)?;
        let [n, cin, h, w] = conv_input_dims(OP, input, opts.layout)?;
        let cout = match *weight.shape() {
            [o, i, 1, 1] | [o, i] if i == cin => o,
            [o, ..] if matches!(weight.shape().len(), 2 | 4) => {
                let expected = if weight.shape().len() == 2 { vec![o, cin] } else { vec![o, cin, 1, 1] };
                return Err(Error::ShapeMismatch {
                    op: OP,
                    tensor: "weight",
                    expected,
                    actual: weight.shape().to_vec(),
                });
            }
            _ => {
                return Err(Error::WrongRank {
                    op: OP,
                    tensor: "weight",
                    expected: "4 ([Cout, Cin, 1, 1]) or 2 ([Cout, Cin])",
                    actual: weight.shape().len(),
                });
            }
        };
        check_bias(OP, bias, cout)?;
        let g = Geometry { n, cin, cout, h, w, layout: opts.layout };
        if let Some(r) = opts.residual
            && r.shape() != g.output_shape()
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "residual",
                expected: g.output_shape(),
                actual: r.shape().to_vec(),
            });
        }
        // Every count the GEMM forms must be representable.
        let count = |dims: &[usize]| dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        for (what, dims) in [("the input element count", [n, cin, h, w]), ("the output element count", [n, cout, h, w])]
        {
            count(&dims).ok_or_else(|| Error::Overflow { op: OP, what: what.into() })?;
        }
        Ok(g)
    }

    fn run_pointwise(
        &self,
        g: &Geometry,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &PointwiseOptions<'_>,
        out: &Tensor,
    ) -> Result<()> {
        let hw = g.h * g.w;
        if g.n * hw == 0 || g.cout == 0 {
            return Ok(()); // An empty output: nothing to launch.
        }
        let residual = opts.residual;
        let desc = PointwiseDesc {
            batch: g.n,
            cin: g.cin,
            cout: g.cout,
            pixels: hw,
            activation: opts.activation,
            layout: g.layout,
        };
        if with_backend!(self, be => be.has_pointwise(&desc)) {
            let info = || crate::profile::OpInfo::pointwise(&desc, input.dtype(), bias.is_some(), residual.is_some());
            return self
                .profiled(info, || with_backend!(self, be => kernel(be, &desc, input, weight, bias, residual, out)));
        }
        match g.layout {
            Layout::Nhwc => {
                let m = g.n * hw;
                let desc = MatmulDesc::new(m, g.cout, g.cin)
                    .trans_b(true)
                    .a(MatrixView::dense(m, g.cin))
                    .b(MatrixView::dense(g.cout, g.cin))
                    .c(residual.map(|_| MatrixView::dense(m, g.cout)))
                    .bias_offset(bias.map(|_| 0))
                    .beta(1.0)
                    .activation(opts.activation);
                self.matmul_into(&desc, input, weight, bias, residual, out)
            }
            // NCHW.
            _ => {
                let per_image = MatrixView::dense(g.cout, hw);
                let desc = MatmulDesc::new(g.cout, hw, g.cin)
                    .batch(g.n)
                    .trans_a(false)
                    .trans_b(false)
                    .a(MatrixView::new(0, g.cin, 0))
                    .b(MatrixView::dense(g.cin, hw))
                    .c(residual.map(|_| per_image))
                    .bias_offset(None)
                    .out(per_image)
                    .alpha(1.0)
                    .beta(1.0)
                    .activation(if bias.is_some() { Activation::None } else { opts.activation })
                    .precision(Precision::Highest);
                let Some(bias) = bias else {
                    return self.matmul_into(&desc, weight, input, None, residual, out);
                };
                let tmp = self.output_tensor(out.shape(), out.dtype())?;
                self.matmul_into(&desc, weight, input, None, residual, &tmp)?;
                // Per-channel bias and activation: a 1×1 depthwise pass with unit weights (exact).
                let ones = self.tensor_from_f32(&[g.cout, 1, 1, 1], out.dtype(), &vec![1.0; g.cout])?;
                let conv = Conv2dOptions::default().layout(Layout::Nchw).activation(opts.activation);
                self.depthwise_conv2d_into(&tmp, &ones, Some(bias), &conv, out)
            }
        }
    }
}

/// The backend's one-pass kernel.
fn kernel<B: BackendOps>(
    be: &B,
    desc: &PointwiseDesc,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let args = PointwiseArgs {
        x: storage::<B>(OP, "input", input)?,
        weight: storage::<B>(OP, "weight", weight)?,
        bias: bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        residual: residual.map(|t| storage::<B>(OP, "residual", t)).transpose()?,
    };
    be.pointwise(desc, input.dtype(), &args, storage::<B>(OP, "out", out)?)
}

option_setters!(PointwiseOptions<'a> {
    layout: Layout,
    activation: Activation,
    residual: Option<&'a Tensor>,
});
