//! `glu`: the gated linear unit `act(gate) · up` over the two halves of each row, SwiGLU's
//! second step (see [`GluDesc`]).

use super::{check_alias, check_device, check_dtype, storage};
use crate::backend::{BackendOps, with_backend};
use crate::profile::OpInfo;
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, GluDesc};

const OP: &str = "glu";

impl Device {
    /// `out[…, c] = act(h[…, c]) · h[…, F + c]` for `h` of shape `[…, 2F]`: a new tensor of
    /// shape `[…, F]` in `h`'s dtype.
    ///
    /// With [`Activation::Silu`] this is SwiGLU, `silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)`, after one
    /// matmul of `x` against the concatenated `[W_gate; W_up]` (`[2F, K]`, `trans_b`) has
    /// written `h`. The gate's activation and the product are computed in `f32` and rounded
    /// once to the dtype. `h` must have rank at least 1 and an even last dimension.
    pub fn glu(&self, h: &Tensor, activation: Activation) -> Result<Tensor> {
        let (desc, out_shape) = self.glu_desc(h, activation)?;
        let out = self.output_tensor(&out_shape, h.dtype())?;
        self.run_glu(&desc, h, &out)?;
        Ok(out)
    }

    /// [`Device::glu`] into an existing tensor `out` of shape `[…, F]` (not sharing `h`'s
    /// buffer).
    pub fn glu_into(&self, h: &Tensor, activation: Activation, out: &Tensor) -> Result<()> {
        let (desc, out_shape) = self.glu_desc(h, activation)?;
        check_device(OP, self, "out", out)?;
        check_dtype(OP, h.dtype(), "out", out)?;
        check_alias(OP, out, "h", h)?;
        if out.shape() != out_shape.as_slice() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: out_shape,
                actual: out.shape().to_vec(),
            });
        }
        self.run_glu(&desc, h, out)
    }

    fn run_glu(&self, desc: &GluDesc, h: &Tensor, out: &Tensor) -> Result<()> {
        if desc.rows == 0 || desc.f == 0 {
            return Ok(());
        }
        let dtype = h.dtype();
        let info = || {
            let len = desc.rows * desc.f;
            OpInfo {
                op: OP,
                dtype,
                shape: format!("rows {} f {} {:?}", desc.rows, desc.f, desc.activation),
                // h once (2·len) and out once (len).
                bytes: (3 * len * dtype.size_bytes()) as u64,
                flops: len as u64,
            }
        };
        self.profiled(info, || with_backend!(self, be => run(be, desc, h, out)))
    }

    /// The descriptor and output shape of a GLU over `h`.
    fn glu_desc(&self, h: &Tensor, activation: Activation) -> Result<(GluDesc, Vec<usize>)> {
        check_device(OP, self, "h", h)?;
        self.check_dtype(h.dtype())?;
        let Some((&last, lead)) = h.shape().split_last() else {
            return Err(Error::WrongRank { op: OP, tensor: "h", expected: "at least 1", actual: 0 });
        };
        if last % 2 != 0 {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "h",
                reason: format!("the last dimension ({last}) must be even: the gate half, then the up half"),
            });
        }
        let rows = lead.iter().product();
        let mut out_shape = h.shape().to_vec();
        if let Some(l) = out_shape.last_mut() {
            *l = last / 2;
        }
        Ok((GluDesc::new(rows, last / 2, activation), out_shape))
    }
}

fn run<B: BackendOps>(be: &B, desc: &GluDesc, h: &Tensor, out: &Tensor) -> Result<()> {
    be.glu(desc, h.dtype(), storage::<B>(OP, "h", h)?, storage::<B>(OP, "out", out)?)
}
