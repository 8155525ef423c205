//! `depthwise_conv2d`: per-channel 2-D convolution with fused bias and activation.

use super::{check_alias, check_device, check_dtype, storage, validate_conv_desc};
use crate::backend::{BackendOps, with_backend};
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, Conv2dDesc, Layout};

const OP: &str = "depthwise_conv2d";

/// The options of [`Device::depthwise_conv2d`]. `Default`: stride 1, no padding, dilation 1,
/// NCHW, no activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conv2dOptions {
    /// `[vertical, horizontal]` stride.
    pub stride: [usize; 2],
    /// `[top, bottom, left, right]` zero padding.
    pub padding: [usize; 4],
    /// `[vertical, horizontal]` dilation.
    pub dilation: [usize; 2],
    /// Layout of input and output.
    pub layout: Layout,
    /// Activation applied after the bias.
    pub activation: Activation,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            layout: Layout::Nchw,
            activation: Activation::None,
        }
    }
}

impl Device {
    /// Depthwise 2-D convolution. `input` is `[N, C, H, W]` (NCHW) or `[N, H, W, C]` (NHWC);
    /// `weight` is `[C·m, 1, kh, kw]` in both layouts (`m` is the channel multiplier); `bias`,
    /// if given, has `C·m` elements. The output is in the input's layout and dtype.
    pub fn depthwise_conv2d(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Tensor> {
        let desc = self.conv_desc(input, weight, bias, opts)?;
        let out = self.output_tensor(&desc.output_shape(), input.dtype())?;
        self.run_conv(&desc, input, weight, bias, &out)?;
        Ok(out)
    }

    /// [`Device::depthwise_conv2d`] into an existing output tensor of the right shape.
    pub fn depthwise_conv2d_into(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        out: &Tensor,
    ) -> Result<()> {
        let desc = self.conv_desc(input, weight, bias, opts)?;
        check_device(OP, self, "out", out)?;
        check_dtype(OP, input.dtype(), "out", out)?;
        for (name, t) in [("input", Some(input)), ("weight", Some(weight)), ("bias", bias)] {
            if let Some(t) = t {
                check_alias(OP, out, name, t)?;
            }
        }
        if out.shape() != desc.output_shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: desc.output_shape().to_vec(),
                actual: out.shape().to_vec(),
            });
        }
        self.run_conv(&desc, input, weight, bias, out)
    }

    fn run_conv(
        &self,
        desc: &Conv2dDesc,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.profiled(
            || crate::profile::OpInfo::conv(desc, input.dtype()),
            || with_backend!(self, be => run(be, desc, input, weight, bias, out)),
        )
    }

    /// Validates the call and builds its descriptor.
    fn conv_desc(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Conv2dDesc> {
        let dtype = input.dtype();
        for (name, t) in [("input", Some(input)), ("weight", Some(weight)), ("bias", bias)] {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, dtype, name, t)?;
            }
        }
        self.check_dtype(dtype)?;
        let [n, c, h, w] = match (input.shape(), opts.layout) {
            (&[n, c, h, w], Layout::Nchw) => [n, c, h, w],
            (&[n, h, w, c], Layout::Nhwc) => [n, c, h, w],
            _ => return Err(Error::WrongRank { op: OP, tensor: "input", expected: "4", actual: input.shape().len() }),
        };
        let [oc, one, kh, kw] = match *weight.shape() {
            [a, b, c, d] => [a, b, c, d],
            _ => {
                return Err(Error::WrongRank { op: OP, tensor: "weight", expected: "4", actual: weight.shape().len() });
            }
        };
        let multiplier = oc.checked_div(c).unwrap_or(1);
        if one != 1 || (c > 0 && (oc == 0 || oc % c != 0)) || (c == 0 && oc != 0) {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "weight",
                expected: vec![c * multiplier.max(1), 1, kh, kw],
                actual: weight.shape().to_vec(),
            });
        }
        let desc = Conv2dDesc {
            batch: n,
            channels: c,
            height: h,
            width: w,
            multiplier,
            kernel_h: kh,
            kernel_w: kw,
            stride_h: opts.stride[0],
            stride_w: opts.stride[1],
            pad_top: opts.padding[0],
            pad_bottom: opts.padding[1],
            pad_left: opts.padding[2],
            pad_right: opts.padding[3],
            dilation_h: opts.dilation[0],
            dilation_w: opts.dilation[1],
            layout: opts.layout,
            has_bias: bias.is_some(),
            activation: opts.activation,
        };
        validate_conv_desc(OP, &desc)?;
        if let Some(bias) = bias
            && bias.shape() != [oc]
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "bias",
                expected: vec![oc],
                actual: bias.shape().to_vec(),
            });
        }
        // The output's element count must be representable.
        desc.checked_lens().ok_or_else(|| Error::Overflow { op: OP, what: "the output element count".into() })?;
        Ok(desc)
    }
}

fn run<B: BackendOps>(
    be: &B,
    desc: &Conv2dDesc,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    be.depthwise_conv2d(
        desc,
        input.dtype(),
        storage::<B>(OP, "input", input)?,
        storage::<B>(OP, "weight", weight)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}

option_setters!(Conv2dOptions {
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    layout: Layout,
    activation: Activation,
});
