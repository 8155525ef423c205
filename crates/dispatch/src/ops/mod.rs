//! The public ops: shape-level entry points, their validation, and the hand-off to the
//! backend. Everything a caller controls is checked here, once, for every backend.

/// `new()` (the `Default`) and one chainable setter per field (`tilekit_kernels::field_setters`)
/// for an option struct. The option structs are `#[non_exhaustive]` (a field added later is not
/// a breaking change), so callers outside tilekit build them as
/// `MatmulOptions::new().trans_b(true).activation(Activation::Gelu)` or by assigning the fields
/// of a `default()` value, not with struct literals.
macro_rules! option_setters {
    ($name:ident $(<$lt:lifetime>)? { $($body:tt)* }) => {
        impl$(<$lt>)? $name$(<$lt>)? {
            /// The default options (as [`Default::default`]).
            pub fn new() -> Self {
                Self::default()
            }
        }
        tilekit_kernels::field_setters!($name$(<$lt>)? { $($body)* });
    };
}

mod activation;
mod bench_refs;
mod block;
mod conv;
mod dense_conv;
mod glu;
mod im2col;
mod matmul;
mod packed_matmul;
mod pointwise;
mod pool;
mod quant;

pub use block::{BlockOptions, BlockWeights, PackedBlock};
pub use conv::{Conv2dOptions, PackedDepthwise};
pub use im2col::Im2colOptions;
pub use matmul::MatmulOptions;
pub use packed_matmul::PackedMatmul;
pub(crate) use packed_matmul::STRIP as MATMUL_STRIP;
pub use pointwise::PointwiseOptions;

use crate::backend::BackendOps;
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Conv2dDesc, DType, Layout, Precision};

/// Checks that `t` lives on `device`.
pub(crate) fn check_device(op: &'static str, device: &Device, name: &'static str, t: &Tensor) -> Result<()> {
    if t.buffer.device.inner.id != device.inner.id {
        return Err(Error::DeviceMismatch { op, tensor: name });
    }
    Ok(())
}

/// Checks that `t` has the op's dtype.
pub(crate) fn check_dtype(op: &'static str, dtype: DType, name: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::DTypeMismatch { op, tensor: name, expected: dtype, actual: t.dtype() });
    }
    Ok(())
}

/// Checks that the output does not share its buffer with an input.
pub(crate) fn check_alias(op: &'static str, out: &Tensor, name: &'static str, input: &Tensor) -> Result<()> {
    if out.shares_buffer(input) {
        return Err(Error::Aliasing { op, tensor: name });
    }
    Ok(())
}

/// Checks that each operand given lives on `device` and has `dtype`, in order (device first).
pub(crate) fn check_operands(
    op: &'static str,
    device: &Device,
    dtype: DType,
    operands: &[(&'static str, Option<&Tensor>)],
) -> Result<()> {
    for &(name, t) in operands {
        if let Some(t) = t {
            check_device(op, device, name, t)?;
            check_dtype(op, dtype, name, t)?;
        }
    }
    Ok(())
}

/// Checks that `out` lives on `device`, has `dtype` and shares no buffer with an operand.
pub(crate) fn check_output(
    op: &'static str,
    device: &Device,
    dtype: DType,
    out: &Tensor,
    operands: &[(&'static str, Option<&Tensor>)],
) -> Result<()> {
    check_device(op, device, "out", out)?;
    check_dtype(op, dtype, "out", out)?;
    for &(name, t) in operands {
        if let Some(t) = t {
            check_alias(op, out, name, t)?;
        }
    }
    Ok(())
}

/// A convolution input's `[N, C, H, W]`, read in `layout`; anything but rank 4 is `WrongRank`.
pub(crate) fn conv_input_dims(op: &'static str, input: &Tensor, layout: Layout) -> Result<[usize; 4]> {
    match (input.shape(), layout) {
        (&[n, c, h, w], Layout::Nchw) => Ok([n, c, h, w]),
        (&[n, h, w, c], Layout::Nhwc) => Ok([n, c, h, w]),
        _ => Err(Error::WrongRank { op, tensor: "input", expected: "4", actual: input.shape().len() }),
    }
}

/// Checks that a bias, if given, is `[n]`.
pub(crate) fn check_bias(op: &'static str, bias: Option<&Tensor>, n: usize) -> Result<()> {
    match bias {
        Some(b) if b.shape() != [n] => {
            Err(Error::ShapeMismatch { op, tensor: "bias", expected: vec![n], actual: b.shape().to_vec() })
        }
        _ => Ok(()),
    }
}

/// Checks that a view needing `needed` elements (or overflowing) fits `t`'s buffer.
pub(crate) fn check_fits(op: &'static str, name: &'static str, needed: Option<usize>, t: &Tensor) -> Result<()> {
    match needed {
        None => Err(Error::Overflow { op, what: format!("the extent of {name}'s view") }),
        Some(n) if n > t.buffer_len() => {
            Err(Error::ViewOutOfBounds { op, tensor: name, needed: n, len: t.buffer_len() })
        }
        Some(_) => Ok(()),
    }
}

/// Checks that a scalar parameter is finite.
pub(crate) fn check_finite(op: &'static str, param: &'static str, v: f32) -> Result<()> {
    if !v.is_finite() {
        return Err(Error::InvalidParameter { op, param, reason: format!("{v} is not finite") });
    }
    Ok(())
}

/// Checks that a matmul's precision fits its dtype: [`Precision::F16`] multiplies f16 storage
/// only.
pub(crate) fn check_precision(op: &'static str, precision: Precision, dtype: DType) -> Result<()> {
    if precision == Precision::F16 && dtype != DType::F16 {
        return Err(Error::InvalidParameter {
            op,
            param: "precision",
            reason: format!("Precision::F16 multiplies f16 storage only, not {dtype}"),
        });
    }
    Ok(())
}

/// The backend's storage of `t`, which has been checked to live on this device.
pub(crate) fn storage<'t, B: BackendOps>(
    op: &'static str,
    name: &'static str,
    t: &'t Tensor,
) -> Result<&'t B::Storage> {
    B::storage_of(&t.buffer.storage).ok_or(Error::DeviceMismatch { op, tensor: name })
}

/// The checks of a convolution descriptor on its own, shared by [`Device::depthwise_conv2d`]
/// (after it has built the descriptor from checked shapes) and
/// [`Device::tune_depthwise_conv2d`] (which takes a caller's descriptor): a non-empty filter,
/// a channel multiplier of at least 1, no zero stride or dilation, a non-empty output, and
/// element counts of input, weight and output that fit `usize`.
pub(crate) fn validate_conv_desc(op: &'static str, desc: &Conv2dDesc) -> Result<()> {
    let (kh, kw) = (desc.kernel_h, desc.kernel_w);
    if kh == 0 || kw == 0 {
        return Err(Error::InvalidParameter { op, param: "weight", reason: format!("the filter is {kh}x{kw}") });
    }
    if desc.multiplier == 0 {
        return Err(Error::InvalidParameter { op, param: "multiplier", reason: "the channel multiplier is 0".into() });
    }
    let stride = [desc.stride_h, desc.stride_w];
    let dilation = [desc.dilation_h, desc.dilation_w];
    for (param, v) in [("stride", stride), ("dilation", dilation)] {
        if v.contains(&0) {
            return Err(Error::InvalidParameter { op, param, reason: format!("{v:?} has a zero") });
        }
    }
    let count = |dims: [Option<usize>; 4]| dims.into_iter().try_fold(1usize, |a, d| a.checked_mul(d?));
    let (n, c, h, w) = (desc.batch, desc.channels, desc.height, desc.width);
    let out_c = c.checked_mul(desc.multiplier);
    if count([Some(n), Some(c), Some(h), Some(w)]).is_none() {
        return Err(Error::Overflow { op, what: "the input element count".into() });
    }
    if count([out_c, Some(1), Some(kh), Some(kw)]).is_none() {
        return Err(Error::Overflow { op, what: "the weight element count".into() });
    }
    let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
        let padding = [desc.pad_top, desc.pad_bottom, desc.pad_left, desc.pad_right];
        return Err(Error::InvalidParameter {
            op,
            param: "padding",
            reason: format!(
                "the output would be empty: a {kh}x{kw} filter dilated by {dilation:?} does not fit the {h}x{w} input padded by {padding:?}"
            ),
        });
    };
    // The output's element count must be representable.
    if count([Some(n), out_c, Some(oh), Some(ow)]).is_none() {
        return Err(Error::Overflow { op, what: "the output element count".into() });
    }
    Ok(())
}
