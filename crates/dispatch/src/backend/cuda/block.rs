//! The fused inverted-residual block on CUDA (`inverted_residual.cu`): one launch over (output
//! tiles, output-channel blocks, images), more launches only past the grid's 65535 images.

use super::launch::to_i32;
use super::{CudaBackend, CudaStorage};
use crate::backend::BlockArgs;
use crate::{Error, Result};
use tilekit_kernels::catalogue::cuda::block::{
    BLOCK_OUT_CHANNELS, BLOCK_TILE_H, BLOCK_TILE_W, BlockParams, block_flags, inverted_residual_kernel,
};
use tilekit_kernels::catalogue::cuda::{self as cat};
use tilekit_kernels::{DType, InvertedResidualDesc, Layout};

const OP: &str = "inverted_residual";

/// Which optional operands a block launch has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct BlockOperands {
    pub(super) expand: bool,
    pub(super) expand_bias: bool,
    pub(super) dw_bias: bool,
    pub(super) project_bias: bool,
}

/// The parameter block without its pointers and `n0`, and the grid's x (output tiles) and y
/// (output-channel blocks), for `desc` in `dtype`: every size checked to fit the kernel's i32
/// arithmetic, the vector flags set where rows are whole 16-byte vectors.
pub(super) fn block_geometry(
    desc: &InvertedResidualDesc,
    dtype: DType,
    ops: BlockOperands,
) -> Result<(BlockParams, (u32, u32))> {
    let (oh, ow) = (desc.out_h(), desc.out_w());
    let tiles_w = ow.div_ceil(BLOCK_TILE_W);
    let tiles = tiles_w
        .checked_mul(oh.div_ceil(BLOCK_TILE_H))
        .filter(|&t| t <= i32::MAX as usize)
        .ok_or_else(|| Error::Overflow { op: OP, what: format!("{ow} × {oh} output pixels in one grid") })?;
    let cblocks = desc.out_channels.div_ceil(BLOCK_OUT_CHANNELS);
    if cblocks > cat::MAX_GRID_Y {
        return Err(Error::Overflow { op: OP, what: format!("{} output channels", desc.out_channels) });
    }
    // Padded coordinates reach H + 2 and W + 2.
    to_i32(OP, "padded height", desc.height.saturating_add(2))?;
    to_i32(OP, "padded width", desc.width.saturating_add(2))?;
    // A chunk's hidden index reaches hidden + 16.
    to_i32(OP, "hidden channels", desc.hidden.saturating_add(16))?;
    let v = 16 / dtype.size_bytes();
    let mut flags = 0;
    for (on, bit) in [
        (ops.expand, block_flags::EXPAND),
        (ops.expand && ops.expand_bias, block_flags::EXPAND_BIAS),
        (ops.dw_bias, block_flags::DW_BIAS),
        (ops.project_bias, block_flags::PROJECT_BIAS),
        (desc.residual(), block_flags::RESIDUAL),
        (desc.layout == Layout::Nhwc, block_flags::NHWC),
        (ops.expand && desc.channels.is_multiple_of(v), block_flags::WE_VEC),
        (desc.hidden.is_multiple_of(v), block_flags::WP_VEC),
        (desc.layout == Layout::Nhwc && desc.channels.is_multiple_of(v), block_flags::X_VEC),
    ] {
        if on {
            flags |= bit;
        }
    }
    let p = BlockParams {
        channels: to_i32(OP, "channels", desc.channels)?,
        height: to_i32(OP, "height", desc.height)?,
        width: to_i32(OP, "width", desc.width)?,
        hidden: to_i32(OP, "hidden channels", desc.hidden)?,
        out_c: to_i32(OP, "output channels", desc.out_channels)?,
        stride: to_i32(OP, "stride", desc.stride)?,
        out_h: to_i32(OP, "output height", oh)?,
        out_w: to_i32(OP, "output width", ow)?,
        tiles_w: to_i32(OP, "output tiles", tiles_w)?,
        flags,
        ..Default::default()
    };
    Ok((p, (tiles as u32, cblocks as u32)))
}

impl CudaBackend {
    /// See [`crate::backend::BackendOps::inverted_residual`].
    pub(super) fn run_block(
        &self,
        desc: &InvertedResidualDesc,
        dtype: DType,
        a: &BlockArgs<'_, CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        if !matches!(desc.stride, 1 | 2) {
            return Err(Error::InvalidParameter { op: OP, param: "stride", reason: "1 or 2".into() });
        }
        let ops = BlockOperands {
            expand: a.expand.is_some(),
            expand_bias: a.expand_bias.is_some(),
            dw_bias: a.depthwise_bias.is_some(),
            project_bias: a.project_bias.is_some(),
        };
        let (mut p, (gx, gy)) = block_geometry(desc, dtype, ops)?;
        let ptr = |s: Option<&CudaStorage>| s.map_or(0, |s| self.ptr(s));
        p.x = self.ptr(a.x);
        p.we = ptr(a.expand);
        p.be = ptr(a.expand_bias);
        p.wd = self.ptr(a.depthwise);
        p.bd = ptr(a.depthwise_bias);
        p.wp = self.ptr(a.project);
        p.bp = ptr(a.project_bias);
        p.out = self.ptr(out);
        if gx == 0 || gy == 0 {
            return Ok(());
        }
        let kernel = inverted_residual_kernel(dtype);
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            p.n0 = to_i32(OP, "batch index", start)?;
            self.launch(kernel, (gx, gy, count as u32), (cat::THREADS, 1, 1), p)?;
            start += count;
        }
        Ok(())
    }
}
