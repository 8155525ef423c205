//! `global_avg_pool`: the mean over H×W per image and channel, as a matmul with a ones vector.
//!
//! - **NCHW**: the input viewed as `[N·C, H·W]` times a ones column `[H·W, 1]`, scaled by
//!   `alpha = 1/(H·W)`: one GEMM (a GEMV on backends that have one for `N = 1`).
//! - **NHWC**: per image, a ones row `[1, H·W]` (broadcast with `batch_stride = 0`) times the
//!   image `[H·W, C]`, scaled the same way: a batched GEMM whose output rows are the images.
//!
//! Either way the result is `[N, C]` on the device, summed in f32 like every matmul, so a
//! network ends in its classifier without a host round trip.

use super::{check_alias, check_device, check_dtype};
use crate::{Device, Error, Result, Tensor};
use tilekit_kernels::{Layout, MatmulDesc, MatrixView};

const OP: &str = "global_avg_pool";

impl Device {
    /// The mean over the spatial dimensions: `input` `[N, C, H, W]` (NCHW) or `[N, H, W, C]`
    /// (NHWC) gives `[N, C]` in the input's dtype. `H·W` must be at least 1.
    pub fn global_avg_pool(&self, input: &Tensor, layout: Layout) -> Result<Tensor> {
        let (n, c, _) = self.pool_geometry(input, layout)?;
        let out = self.output_tensor(&[n, c], input.dtype())?;
        self.global_avg_pool_into(input, layout, &out)?;
        Ok(out)
    }

    /// [`Device::global_avg_pool`] into an existing `[N, C]` tensor.
    pub fn global_avg_pool_into(&self, input: &Tensor, layout: Layout, out: &Tensor) -> Result<()> {
        let (n, c, hw) = self.pool_geometry(input, layout)?;
        check_device(OP, self, "out", out)?;
        check_dtype(OP, input.dtype(), "out", out)?;
        check_alias(OP, out, "input", input)?;
        if out.shape() != [n, c] {
            return Err(Error::ShapeMismatch {
                op: OP,
                tensor: "out",
                expected: vec![n, c],
                actual: out.shape().to_vec(),
            });
        }
        if n == 0 || c == 0 {
            return Ok(());
        }
        let dtype = input.dtype();
        let ones = self.tensor_from_f32(&[hw], dtype, &vec![1.0; hw])?;
        // 1/(H·W) in f32: the one rounding of the scale, then f32 accumulation as in any matmul.
        let alpha = (1.0 / hw as f64) as f32;
        let desc = match layout {
            Layout::Nchw => MatmulDesc::new(n * c, 1, hw).alpha(alpha),
            // NHWC (`Layout` is `#[non_exhaustive]`; `pool_geometry` admits only the two).
            _ => MatmulDesc::new(1, c, hw)
                .batch(n)
                .a(MatrixView::new(0, hw, 0))
                .b(MatrixView::dense(hw, c))
                .out(MatrixView::dense(1, c))
                .alpha(alpha),
        };
        match layout {
            Layout::Nchw => self.matmul_into(&desc, input, &ones, None, None, out),
            _ => self.matmul_into(&desc, &ones, input, None, None, out),
        }
    }

    fn pool_geometry(&self, input: &Tensor, layout: Layout) -> Result<(usize, usize, usize)> {
        check_device(OP, self, "input", input)?;
        self.check_dtype(input.dtype())?;
        let (n, c, h, w) = match (input.shape(), layout) {
            (&[n, c, h, w], Layout::Nchw) | (&[n, h, w, c], Layout::Nhwc) => (n, c, h, w),
            _ => return Err(Error::WrongRank { op: OP, tensor: "input", expected: "4", actual: input.shape().len() }),
        };
        if h == 0 || w == 0 {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "input",
                reason: format!("the mean over an empty {h}x{w} plane is undefined"),
            });
        }
        Ok((n, c, h * w))
    }
}
