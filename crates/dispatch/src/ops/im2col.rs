//! `im2col`: the patches of a dense convolution as channels, so that the convolution becomes a
//! pointwise (1×1) one — how the MobileNetV2 stem (3×3 stride 2, 3 → 32 channels) runs.
//!
//! Built on the depthwise kernel: a depthwise convolution with channel multiplier `kh·kw` and
//! one-hot filters (output channel `c·kh·kw + i·kw + j` has a single 1 at tap `(i, j)`) copies
//! tap `(i, j)` of input channel `c` to that channel, zero padding included. Multiplying by 1 and
//! adding zeros is exact in f32, so the result is bit-exact in every dtype, on every backend that
//! has the depthwise kernel. The channel order matches PyTorch's `weight.reshape(Cout, Cin·kh·kw)`,
//! so `pointwise_conv2d(im2col(x), weight.reshape([Cout, Cin·kh·kw]))` is `conv2d(x, weight)`.
//! On the CPU the op is that gather itself (`backend/cpu/im2col.rs`: the same elements, copied
//! in the storage type); elsewhere the filter work is `kh·kw` times that of a gather, noise
//! beside a GPU's stem.

use super::storage;
use crate::backend::{BackendOps, with_backend};
use crate::{Conv2dOptions, Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, Conv2dDesc, Layout};

const OP: &str = "im2col";

/// The options of [`Device::im2col`]. `Default`: a 3×3 window, stride 1, no padding, NCHW.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Im2colOptions {
    /// `[kh, kw]`: the window.
    pub kernel: [usize; 2],
    /// `[vertical, horizontal]` stride.
    pub stride: [usize; 2],
    /// `[top, bottom, left, right]` zero padding.
    pub padding: [usize; 4],
    /// `[vertical, horizontal]` dilation.
    pub dilation: [usize; 2],
    /// Layout of input and output.
    pub layout: Layout,
}

impl Default for Im2colOptions {
    fn default() -> Self {
        Im2colOptions { kernel: [3, 3], stride: [1, 1], padding: [0; 4], dilation: [1, 1], layout: Layout::Nchw }
    }
}

impl Device {
    /// The `kh × kw` patches of `input` (`[N, C, H, W]` or `[N, H, W, C]`) as `C·kh·kw`
    /// channels: `[N, C·kh·kw, OH, OW]` (NCHW) or `[N, OH, OW, C·kh·kw]` (NHWC), channel
    /// `c·kh·kw + i·kw + j` holding tap `(i, j)` of channel `c` (zero in the padding).
    pub fn im2col(&self, input: &Tensor, opts: &Im2colOptions) -> Result<Tensor> {
        let [kh, kw] = opts.kernel;
        let taps = kh.checked_mul(kw).filter(|&t| t > 0).ok_or_else(|| Error::InvalidParameter {
            op: OP,
            param: "kernel",
            reason: format!("the window is {kh}x{kw}"),
        })?;
        let c = match (input.shape(), opts.layout) {
            (&[_, c, _, _], Layout::Nchw) | (&[_, _, _, c], Layout::Nhwc) => c,
            _ => return Err(Error::WrongRank { op: OP, tensor: "input", expected: "4", actual: input.shape().len() }),
        };
        let oc = c.checked_mul(taps).ok_or_else(|| Error::Overflow { op: OP, what: "the channel count".into() })?;
        let conv = Conv2dOptions {
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
            layout: opts.layout,
            activation: Activation::None,
        };
        if with_backend!(self, be => be.has_im2col()) {
            // The gather reads no filter: the convolution's descriptor, its weight checks made
            // against the input itself (the same device and dtype by construction).
            let desc = self.conv_desc(input, input, &[oc, 1, kh, kw], None, &conv)?;
            let out = self.output_tensor(&desc.output_shape(), input.dtype())?;
            if !out.is_empty() {
                self.profiled(
                    || crate::profile::OpInfo::im2col(&desc, input.dtype()),
                    || with_backend!(self, be => gather(be, &desc, input, &out)),
                )?;
            }
            return Ok(out);
        }
        let mut one_hot = vec![
            0.0f32;
            oc.checked_mul(taps)
                .ok_or_else(|| Error::Overflow { op: OP, what: "the filter element count".into() })?
        ];
        for ch in 0..oc {
            one_hot[ch * taps + ch % taps] = 1.0;
        }
        self.check_dtype(input.dtype())?;
        let weight = self.tensor_from_f32(&[oc, 1, kh, kw], input.dtype(), &one_hot)?;
        self.depthwise_conv2d(input, &weight, None, &conv)
    }
}

/// The backend's gather into `out`.
fn gather<B: BackendOps>(be: &B, desc: &Conv2dDesc, input: &Tensor, out: &Tensor) -> Result<()> {
    be.im2col(desc, input.dtype(), storage::<B>(OP, "input", input)?, storage::<B>(OP, "out", out)?)
}

option_setters!(Im2colOptions {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    layout: Layout,
});
