//! The public ops: shape-level entry points, their validation, and the hand-off to the
//! backend. Everything a caller controls is checked here, once, for every backend.

mod activation;
mod bench_refs;
mod conv;
mod matmul;

pub use conv::Conv2dOptions;
pub use matmul::MatmulOptions;

use crate::backend::BackendOps;
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::DType;

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

/// The backend's storage of `t`, which has been checked to live on this device.
pub(crate) fn storage<'t, B: BackendOps>(
    op: &'static str,
    name: &'static str,
    t: &'t Tensor,
) -> Result<&'t B::Storage> {
    B::storage_of(&t.buffer.storage).ok_or(Error::DeviceMismatch { op, tensor: name })
}
