//! `conv2d`: the dense 2-D convolution (one group), `out = act(conv(x, W) + bias)`, with
//! PyTorch's weight `[Cout, Cin, kh, kw]` — a network's first layer (MobileNetV2's stem: 3×3
//! stride 2, 3 → 32 channels) and any other small-`Cin` convolution.
//!
//! - A backend with a kernel of its own for the call (`BackendOps::has_conv2d`: the CPU's
//!   `cpu/dense_conv.rs`, for reductions `Cin·kh·kw` up to its bound) runs it there, bias and
//!   activation included, in one pass over the output.
//! - Everywhere else it is the composition it stands for: [`Device::im2col`] and then
//!   [`Device::pointwise_conv2d`] on the patches, with the weight read as `[Cout, Cin·kh·kw]`
//!   (PyTorch's `weight.reshape(Cout, -1)`; im2col's channel order is that reshape's). The
//!   patches are a temporary of `kh·kw` times the input's channels.

use super::{check_bias, check_operands, check_output, conv_input_dims, storage, validate_conv_desc};
use crate::backend::{BackendOps, DenseConvDesc, with_backend};
use crate::{Conv2dOptions, Device, Error, Im2colOptions, PointwiseOptions, Result, Tensor};
use tilekit_kernels::Layout;

const OP: &str = "conv2d";

impl Device {
    /// Dense 2-D convolution (one group). `input` is `[N, Cin, H, W]` (NCHW) or `[N, H, W,
    /// Cin]` (NHWC); `weight` is `[Cout, Cin, kh, kw]` (PyTorch's layout, whatever the
    /// input's); `bias`, if given, has `Cout` elements. The output is `act(conv + bias)`,
    /// `[N, Cout, OH, OW]` or `[N, OH, OW, Cout]`, in the input's dtype, with `opts`' stride,
    /// padding (zeros), dilation and activation.
    ///
    /// Errors: tensors of another device or dtype, an input or weight not of rank 4, a weight
    /// whose second dimension is not `Cin` or whose first is 0, a bias of another length, a
    /// zero stride or dilation, or a filter that does not fit the padded input.
    pub fn conv2d(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Tensor> {
        let desc = self.dense_desc(input, weight, bias, opts)?;
        let out = self.output_tensor(&output_shape(&desc), input.dtype())?;
        self.run_dense(&desc, input, weight, bias, opts, &out)?;
        Ok(out)
    }

    /// [`Device::conv2d`] into an existing output tensor of the right shape, which may not
    /// share a buffer with any input.
    pub fn conv2d_into(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        out: &Tensor,
    ) -> Result<()> {
        let desc = self.dense_desc(input, weight, bias, opts)?;
        check_output(
            OP,
            self,
            input.dtype(),
            out,
            &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)],
        )?;
        let want = output_shape(&desc);
        if out.shape() != want {
            return Err(Error::ShapeMismatch { op: OP, tensor: "out", expected: want, actual: out.shape().to_vec() });
        }
        self.run_dense(&desc, input, weight, bias, opts, out)
    }

    fn dense_desc(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<DenseConvDesc> {
        let dtype = input.dtype();
        check_operands(OP, self, dtype, &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)])?;
        self.check_dtype(dtype)?;
        let [n, c, h, w] = conv_input_dims(OP, input, opts.layout)?;
        let [cout, cin, kh, kw] = match *weight.shape() {
            [a, b, c, d] => [a, b, c, d],
            _ => {
                return Err(Error::WrongRank {
                    op: OP,
                    tensor: "weight",
                    expected: "4 ([Cout, Cin, kh, kw])",
                    actual: weight.shape().len(),
                });
            }
        };
        if cin != c || cout == 0 {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "weight",
                expected: vec![cout.max(1), c, kh, kw],
                actual: weight.shape().to_vec(),
            });
        }
        check_bias(OP, bias, cout)?;
        // The geometry as a depthwise descriptor of multiplier 1 (the input's checks, the
        // output's size); the output channels are `cout`.
        let conv = opts.geometry([n, c, h, w], [kh, kw], bias.is_some());
        validate_conv_desc(OP, &conv)?;
        let (oh, ow) = (conv.out_h().unwrap_or(0), conv.out_w().unwrap_or(0));
        [n, cout, oh, ow]
            .into_iter()
            .try_fold(1usize, |a, d| a.checked_mul(d))
            .and_then(|_| cout.checked_mul(c)?.checked_mul(kh)?.checked_mul(kw))
            .ok_or_else(|| Error::Overflow { op: OP, what: "the output or weight element count".into() })?;
        Ok(DenseConvDesc { conv, cout })
    }

    fn run_dense(
        &self,
        desc: &DenseConvDesc,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        out: &Tensor,
    ) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        if with_backend!(self, be => be.has_conv2d(desc)) {
            return self.profiled(
                || crate::profile::OpInfo::conv2d(desc, input.dtype()),
                || with_backend!(self, be => run(be, desc, input, weight, bias, out)),
            );
        }
        // im2col + pointwise: the composition the op stands for.
        let d = &desc.conv;
        let im2col = Im2colOptions::default()
            .kernel([d.kernel_h, d.kernel_w])
            .stride(opts.stride)
            .padding(opts.padding)
            .dilation(opts.dilation)
            .layout(opts.layout);
        let patches = self.im2col(input, &im2col)?;
        let w2 = weight.reshape(&[desc.cout, desc.reduction()])?;
        let pw = PointwiseOptions::default().layout(opts.layout).activation(opts.activation);
        self.pointwise_conv2d_into(&patches, &w2, bias, &pw, out)
    }
}

/// `[N, Cout, OH, OW]` (NCHW) or `[N, OH, OW, Cout]`.
fn output_shape(desc: &DenseConvDesc) -> Vec<usize> {
    let d = &desc.conv;
    let (oh, ow) = (d.out_h().unwrap_or(0), d.out_w().unwrap_or(0));
    match d.layout {
        Layout::Nchw => vec![d.batch, desc.cout, oh, ow],
        _ => vec![d.batch, oh, ow, desc.cout],
    }
}

/// Hands a checked convolution to the backend's kernel.
fn run<B: BackendOps>(
    be: &B,
    desc: &DenseConvDesc,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let (x, w, o) =
        (storage::<B>(OP, "input", input)?, storage::<B>(OP, "weight", weight)?, storage::<B>(OP, "out", out)?);
    let b = bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?;
    be.conv2d(desc, input.dtype(), x, w, b, o)
}
