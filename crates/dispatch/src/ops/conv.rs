//! `depthwise_conv2d`: per-channel 2-D convolution with fused bias and activation, with its
//! weights as given (`[C·m, 1, kh, kw]`) or pre-packed once (`[kh, kw, C·m]`,
//! [`PackedDepthwise`]).

use super::{check_bias, check_device, check_operands, check_output, conv_input_dims, storage, validate_conv_desc};
use crate::backend::{BackendOps, with_backend};
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, Conv2dDesc, DType, Layout};

const OP: &str = "depthwise_conv2d";
const PACK_OP: &str = "pack_depthwise_weights";

/// Depthwise weights pre-packed tap-major, `[kh, kw, C·m]`: the taps of neighbouring output
/// channels are neighbours in memory, so a kernel that walks channels (NHWC) reads the taps of
/// 4 channels as one vector. An engine packs each layer's weights once, at load
/// ([`Device::pack_depthwise_weights`]), and passes them to
/// [`Device::depthwise_conv2d_packed`]. The result is bit-identical to
/// [`Device::depthwise_conv2d`] with the unpacked weights on every backend: the WGSL and CUDA
/// kernels read either layout through two strides; on the CPU the NHWC kernels and the
/// small-plane NCHW tile read the packed layout as it is (NHWC skips the per-call
/// transposition the unpacked weights need) and the other NCHW kernels get it transposed once
/// per call into a reused per-thread buffer.
#[derive(Clone, Debug)]
pub struct PackedDepthwise {
    tensor: Tensor,
    channels: usize,
    multiplier: usize,
    kernel: [usize; 2],
}

impl PackedDepthwise {
    /// The packed tensor, shape `[kh, kw, C·m]`.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Input channels `C` of the convolutions it serves.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The channel multiplier `m`.
    pub fn multiplier(&self) -> usize {
        self.multiplier
    }

    /// `[kh, kw]`.
    pub fn kernel_size(&self) -> [usize; 2] {
        self.kernel
    }

    /// The dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// The shape of the unpacked weight, `[C·m, 1, kh, kw]`.
    pub fn unpacked_shape(&self) -> [usize; 4] {
        [self.channels * self.multiplier, 1, self.kernel[0], self.kernel[1]]
    }
}

/// Moves `size`-byte elements from `[oc, taps]` to `[taps, oc]`.
fn pack_taps(bytes: &[u8], size: usize, oc: usize, taps: usize) -> Vec<u8> {
    let mut out = vec![0u8; oc * taps * size];
    for o in 0..oc {
        for t in 0..taps {
            let (src, dst) = (o * taps + t, t * oc + o);
            out[dst * size..(dst + 1) * size].copy_from_slice(&bytes[src * size..(src + 1) * size]);
        }
    }
    out
}

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

impl Conv2dOptions {
    /// The descriptor of a convolution with these options over an input of `[N, C, H, W]`
    /// and a `kernel` (multiplier 1; not yet validated).
    pub(crate) fn geometry(&self, dims: [usize; 4], kernel: [usize; 2], has_bias: bool) -> Conv2dDesc {
        Conv2dDesc::new(self.layout, dims, kernel)
            .stride(self.stride)
            .padding(self.padding)
            .dilation(self.dilation)
            .has_bias(has_bias)
            .activation(self.activation)
    }
}

impl Device {
    /// Packs a depthwise weight `[C·m, 1, kh, kw]` for convolutions over `channels` (= C)
    /// input channels into a [`PackedDepthwise`] (`[kh, kw, C·m]`, same dtype, on this
    /// device). A one-time transform: it reads the weight back to the host, reorders it and
    /// uploads the result (waiting for queued work). Errors: a weight from another device, not
    /// of rank 4, with a second dimension other than 1, or whose first is not a positive
    /// multiple of `channels` (`channels` 0 takes only an empty weight).
    pub fn pack_depthwise_weights(&self, weight: &Tensor, channels: usize) -> Result<PackedDepthwise> {
        check_device(PACK_OP, self, "weight", weight)?;
        self.check_dtype(weight.dtype())?;
        let [oc, one, kh, kw] = match *weight.shape() {
            [a, b, c, d] => [a, b, c, d],
            _ => {
                return Err(Error::WrongRank {
                    op: PACK_OP,
                    tensor: "weight",
                    expected: "4",
                    actual: weight.shape().len(),
                });
            }
        };
        let multiplier = oc.checked_div(channels).unwrap_or(0);
        let fits = if channels == 0 { oc == 0 } else { oc > 0 && oc.is_multiple_of(channels) };
        if one != 1 || !fits {
            return Err(Error::ShapeMismatch {
                op: PACK_OP,
                tensor: "weight",
                expected: vec![channels * multiplier.max(1), 1, kh, kw],
                actual: weight.shape().to_vec(),
            });
        }
        let size = weight.dtype().size_bytes();
        let taps = kh.checked_mul(kw).ok_or_else(|| Error::Overflow { op: PACK_OP, what: "the taps".into() })?;
        let bytes = weight.to_bytes()?;
        let need = weight.len() * size;
        if bytes.len() < need {
            return Err(Error::Overflow { op: PACK_OP, what: "the weight's buffer".into() });
        }
        let packed = pack_taps(&bytes[..need], size, oc, taps);
        let shape = [kh, kw, oc];
        let tensor = match weight.dtype() {
            DType::F32 => self.tensor::<f32>(&shape, &bytemuck::pod_collect_to_vec(&packed))?,
            DType::F16 => self.tensor::<half::f16>(&shape, &bytemuck::pod_collect_to_vec(&packed))?,
            DType::Bf16 => self.tensor::<half::bf16>(&shape, &bytemuck::pod_collect_to_vec(&packed))?,
            other => {
                let reason = format!("{other} weights cannot be packed");
                return Err(Error::InvalidParameter { op: PACK_OP, param: "weight", reason });
            }
        };
        Ok(PackedDepthwise { tensor, channels, multiplier: multiplier.max(1), kernel: [kh, kw] })
    }

    /// [`Device::depthwise_conv2d`] with weights packed by [`Device::pack_depthwise_weights`]:
    /// the same result, bit for bit. Errors as there, and [`Error::ShapeMismatch`] (tensor
    /// `weight`) when the packed weights were made for another channel count than the input's.
    pub fn depthwise_conv2d_packed(
        &self,
        input: &Tensor,
        weight: &PackedDepthwise,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Tensor> {
        let desc = self.packed_desc(input, weight, bias, opts)?;
        let out = self.output_tensor(&desc.output_shape(), input.dtype())?;
        self.run_conv(&desc, input, &weight.tensor, bias, &out, true)?;
        Ok(out)
    }

    /// [`Device::depthwise_conv2d_packed`] into an existing output tensor of the right shape.
    pub fn depthwise_conv2d_packed_into(
        &self,
        input: &Tensor,
        weight: &PackedDepthwise,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        out: &Tensor,
    ) -> Result<()> {
        let desc = self.packed_desc(input, weight, bias, opts)?;
        self.check_out(&desc, input, &weight.tensor, bias, out)?;
        self.run_conv(&desc, input, &weight.tensor, bias, out, true)
    }

    fn packed_desc(
        &self,
        input: &Tensor,
        weight: &PackedDepthwise,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Conv2dDesc> {
        let c = match (input.shape(), opts.layout) {
            (&[_, c, _, _], Layout::Nchw) | (&[_, _, _, c], Layout::Nhwc) => c,
            _ => return Err(Error::WrongRank { op: OP, tensor: "input", expected: "4", actual: input.shape().len() }),
        };
        if c != weight.channels {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "weight",
                expected: vec![weight.kernel[0], weight.kernel[1], c * weight.multiplier],
                actual: weight.tensor.shape().to_vec(),
            });
        }
        self.conv_desc(input, &weight.tensor, &weight.unpacked_shape(), bias, opts)
    }

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
        let desc = self.conv_desc(input, weight, weight.shape(), bias, opts)?;
        let out = self.output_tensor(&desc.output_shape(), input.dtype())?;
        self.run_conv(&desc, input, weight, bias, &out, false)?;
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
        let desc = self.conv_desc(input, weight, weight.shape(), bias, opts)?;
        self.check_out(&desc, input, weight, bias, out)?;
        self.run_conv(&desc, input, weight, bias, out, false)
    }

    /// The checks of an `_into` call's output: device, dtype, aliasing, shape.
    fn check_out(
        &self,
        desc: &Conv2dDesc,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        check_output(
            OP,
            self,
            input.dtype(),
            out,
            &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)],
        )?;
        if out.shape() != desc.output_shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: desc.output_shape().to_vec(),
                actual: out.shape().to_vec(),
            });
        }
        Ok(())
    }

    /// Runs a checked convolution; `packed`: `weight` is a `PackedDepthwise`'s `[kh, kw, C·m]`
    /// tensor.
    fn run_conv(
        &self,
        desc: &Conv2dDesc,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        packed: bool,
    ) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.profiled(
            || crate::profile::OpInfo::conv(desc, input.dtype()),
            || with_backend!(self, be => run(be, desc, input, weight, bias, out, packed)),
        )
    }

    /// Validates the call and builds its descriptor; `weight_shape` is the (unpacked) shape the
    /// weight stands for.
    pub(super) fn conv_desc(
        &self,
        input: &Tensor,
        weight: &Tensor,
        weight_shape: &[usize],
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Conv2dDesc> {
        let dtype = input.dtype();
        check_operands(OP, self, dtype, &[("input", Some(input)), ("weight", Some(weight)), ("bias", bias)])?;
        self.check_dtype(dtype)?;
        let [n, c, h, w] = conv_input_dims(OP, input, opts.layout)?;
        let [oc, one, kh, kw] = match *weight_shape {
            [a, b, c, d] => [a, b, c, d],
            _ => {
                return Err(Error::WrongRank { op: OP, tensor: "weight", expected: "4", actual: weight_shape.len() });
            }
        };
        let multiplier = oc.checked_div(c).unwrap_or(1);
        if one != 1 || (c > 0 && (oc == 0 || oc % c != 0)) || (c == 0 && oc != 0) {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "weight",
                expected: vec![c * multiplier.max(1), 1, kh, kw],
                actual: weight_shape.to_vec(),
            });
        }
        let desc = opts.geometry([n, c, h, w], [kh, kw], bias.is_some()).multiplier(multiplier);
        validate_conv_desc(OP, &desc)?;
        check_bias(OP, bias, oc)?;
        // The output's element count must be representable.
        desc.checked_lens().ok_or_else(|| Error::Overflow { op: OP, what: "the output element count".into() })?;
        Ok(desc)
    }
}

/// Hands a checked convolution to the backend; `packed`: the weight is a `PackedDepthwise`'s
/// `[kh, kw, C·m]` tensor.
#[allow(clippy::too_many_arguments)]
fn run<B: BackendOps>(
    be: &B,
    desc: &Conv2dDesc,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    packed: bool,
) -> Result<()> {
    let (dtype, x, w, o) = (
        input.dtype(),
        storage::<B>(OP, "input", input)?,
        storage::<B>(OP, "weight", weight)?,
        storage::<B>(OP, "out", out)?,
    );
    let b = bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?;
    if packed {
        be.depthwise_conv2d_packed(desc, dtype, x, w, b, o)
    } else {
        be.depthwise_conv2d(desc, dtype, x, w, b, o)
    }
}

option_setters!(Conv2dOptions {
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    layout: Layout,
    activation: Activation,
});

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::{Activation, Conv2dOptions, DType, Device, Error, Layout};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32 * 37 + seed * 11) % 23) as f32 - 11.0).collect()
    }

    /// On the CPU backend, every dtype and both layouts, with a multiplier:
    /// packed and unpacked weights give the same bytes, and the packed tensor is `[kh, kw, C·m]`
    /// with element (tap, oc) = weight (oc, tap).
    #[test]
    // Options built field by field: the form that keeps compiling once `Conv2dOptions` is
    // `#[non_exhaustive]`.
    #[allow(clippy::field_reassign_with_default)]
    fn packed_weights_give_the_same_bytes_on_the_cpu() {
        let dev = Device::cpu();
        let (c, m, kh, kw) = (3, 2, 3, 2);
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let shape = if layout == Layout::Nchw { [2, c, 5, 7] } else { [2, 5, 7, c] };
                let x = dev.tensor_from_f32(&shape, dtype, &values(2 * c * 35, 1)).unwrap();
                let w = dev.tensor_from_f32(&[c * m, 1, kh, kw], dtype, &values(c * m * kh * kw, 2)).unwrap();
                let b = dev.tensor_from_f32(&[c * m], dtype, &values(c * m, 3)).unwrap();
                let packed = dev.pack_depthwise_weights(&w, c).unwrap();
                assert_eq!(packed.tensor().shape(), [kh, kw, c * m]);
                assert_eq!((packed.channels(), packed.multiplier(), packed.kernel_size()), (c, m, [kh, kw]));
                let (wv, pv) = (w.to_f32_vec().unwrap(), packed.tensor().to_f32_vec().unwrap());
                for oc in 0..c * m {
                    for t in 0..kh * kw {
                        assert_eq!(pv[t * c * m + oc].to_bits(), wv[oc * kh * kw + t].to_bits());
                    }
                }
                let mut o = Conv2dOptions::default();
                o.stride = [2, 1];
                o.padding = [1, 0, 1, 1];
                o.layout = layout;
                o.activation = Activation::Relu6;
                let want = dev.depthwise_conv2d(&x, &w, Some(&b), &o).unwrap();
                let got = dev.depthwise_conv2d_packed(&x, &packed, Some(&b), &o).unwrap();
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{dtype} {layout:?}");
                let into = dev.zeros(want.shape(), dtype).unwrap();
                dev.depthwise_conv2d_packed_into(&x, &packed, Some(&b), &o, &into).unwrap();
                assert_eq!(into.to_bytes().unwrap(), want.to_bytes().unwrap());
            }
        }
    }

    #[test]
    fn packing_and_packed_calls_refuse_bad_input() {
        let dev = Device::cpu();
        let w = dev.tensor_from_f32(&[6, 1, 3, 3], DType::F32, &values(54, 4)).unwrap();
        // Weight shapes pack_depthwise_weights refuses.
        let bad = |shape: &[usize], c: usize| {
            let t = dev.zeros(shape, DType::F32).unwrap();
            dev.pack_depthwise_weights(&t, c).unwrap_err()
        };
        assert!(matches!(bad(&[6, 3, 3], 3), Error::WrongRank { .. }));
        assert!(matches!(bad(&[6, 2, 3, 3], 3), Error::ShapeMismatch { .. }));
        assert!(matches!(bad(&[6, 1, 3, 3], 4), Error::ShapeMismatch { .. }));
        assert!(matches!(bad(&[6, 1, 3, 3], 0), Error::ShapeMismatch { .. }));
        let other = Device::cpu();
        assert!(matches!(other.pack_depthwise_weights(&w, 3).unwrap_err(), Error::DeviceMismatch { .. }));
        let packed = dev.pack_depthwise_weights(&w, 3).unwrap();
        let o = Conv2dOptions::default();
        // An input with another channel count than the packing was made for.
        let x4 = dev.zeros(&[1, 6, 5, 5], DType::F32).unwrap();
        let e = dev.depthwise_conv2d_packed(&x4, &packed, None, &o).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { tensor: "weight", .. }), "{e:?}");
        // Another dtype.
        let xh = dev.zeros(&[1, 3, 5, 5], DType::F16).unwrap();
        assert!(matches!(
            dev.depthwise_conv2d_packed(&xh, &packed, None, &o).unwrap_err(),
            Error::DTypeMismatch { .. }
        ));
        // Another device.
        let xo = other.zeros(&[1, 3, 5, 5], DType::F32).unwrap();
        assert!(matches!(
            other.depthwise_conv2d_packed(&xo, &packed, None, &o).unwrap_err(),
            Error::DeviceMismatch { .. }
        ));
        // A wrong rank and a wrong output shape.
        let x3 = dev.zeros(&[3, 5, 5], DType::F32).unwrap();
        assert!(matches!(dev.depthwise_conv2d_packed(&x3, &packed, None, &o).unwrap_err(), Error::WrongRank { .. }));
        let x = dev.zeros(&[1, 3, 5, 5], DType::F32).unwrap();
        let out = dev.zeros(&[1, 6, 3, 4], DType::F32).unwrap();
        assert!(matches!(
            dev.depthwise_conv2d_packed_into(&x, &packed, None, &o, &out).unwrap_err(),
            Error::ShapeMismatch { tensor: "out", .. }
        ));
        // The output aliasing the packed weights.
        let e = dev.depthwise_conv2d_packed_into(&x, &packed, None, &o, packed.tensor()).unwrap_err();
        assert!(matches!(e, Error::Aliasing { .. }), "{e:?}");
    }
}
