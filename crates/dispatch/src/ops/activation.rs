//! `activation`: elementwise `act(x + bias)`, the bias broadcast along the last dimension.

use super::{check_alias, check_device, check_dtype, storage};
use crate::backend::{BackendOps, with_backend};
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Activation, ActivationDesc};

const OP: &str = "activation";

impl Device {
    /// `act(x + bias)` into a new tensor; `bias`, if given, has the length of `x`'s last
    /// dimension and is broadcast over the others.
    pub fn activation(&self, x: &Tensor, bias: Option<&Tensor>, activation: Activation) -> Result<Tensor> {
        let desc = self.activation_desc(x, bias, activation)?;
        let out = self.output_tensor(x.shape(), x.dtype())?;
        self.run_activation(&desc, x, bias, &out)?;
        Ok(out)
    }

    /// `x = act(x + bias)` in place.
    pub fn activation_in_place(&self, x: &Tensor, bias: Option<&Tensor>, activation: Activation) -> Result<()> {
        let desc = self.activation_desc(x, bias, activation)?;
        if let Some(bias) = bias {
            check_alias(OP, x, "bias", bias)?;
        }
        self.run_activation(&desc, x, bias, x)
    }

    /// `out = act(x + bias)` into an existing tensor of `x`'s shape (`out` may be `x`).
    pub fn activation_into(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        activation: Activation,
        out: &Tensor,
    ) -> Result<()> {
        let desc = self.activation_desc(x, bias, activation)?;
        check_device(OP, self, "out", out)?;
        check_dtype(OP, x.dtype(), "out", out)?;
        if let Some(bias) = bias {
            check_alias(OP, out, "bias", bias)?;
        }
        if out.shape() != x.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: x.shape().to_vec(),
                actual: out.shape().to_vec(),
            });
        }
        if out.shares_buffer(x) && out.shape() != x.shape() {
            return Err(Error::Aliasing { op: OP, tensor: "x" });
        }
        self.run_activation(&desc, x, bias, out)
    }

    fn run_activation(&self, desc: &ActivationDesc, x: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
        if desc.len == 0 {
            return Ok(());
        }
        self.profiled(
            || crate::profile::OpInfo::activation(desc, x.dtype()),
            || with_backend!(self, be => run(be, desc, x, bias, out)),
        )
    }

    fn activation_desc(&self, x: &Tensor, bias: Option<&Tensor>, activation: Activation) -> Result<ActivationDesc> {
        for (name, t) in [("x", Some(x)), ("bias", bias)] {
            if let Some(t) = t {
                check_device(OP, self, name, t)?;
                check_dtype(OP, x.dtype(), name, t)?;
            }
        }
        self.check_dtype(x.dtype())?;
        let bias_len = match bias {
            None => None,
            Some(bias) => {
                let Some(&last) = x.shape().last() else {
                    return Err(Error::WrongRank {
                        op: OP,
                        tensor: "x",
                        expected: "at least 1 with a bias",
                        actual: 0,
                    });
                };
                if bias.shape() != [last] {
                    return Err(Error::ShapeMismatch {
                        op: OP,
                        tensor: "bias",
                        expected: vec![last],
                        actual: bias.shape().to_vec(),
                    });
                }
                Some(last)
            }
        };
        Ok(ActivationDesc::new(x.len(), bias_len, activation))
    }
}

fn run<B: BackendOps>(be: &B, desc: &ActivationDesc, x: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
    be.activation(
        desc,
        x.dtype(),
        storage::<B>(OP, "x", x)?,
        bias.map(|t| storage::<B>(OP, "bias", t)).transpose()?,
        storage::<B>(OP, "out", out)?,
    )
}
