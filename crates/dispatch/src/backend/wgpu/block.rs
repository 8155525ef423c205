//! The fused inverted-residual block on wgpu (`inverted_residual.wgsl`): one dispatch over
//! (output tiles, output-channel blocks, images).

use super::{Launch, WgpuBackend, WgpuStorage, to_u32, whole};
use crate::backend::BlockArgs;
use crate::{Error, Result};
use tilekit_kernels::catalogue::wgsl::{
    BLOCK_OUT_CHANNELS, BLOCK_TILE_H, BLOCK_TILE_W, BlockParams, Kernel, Spec, block_flags,
};
use tilekit_kernels::{DType, InvertedResidualDesc, Layout};

impl WgpuBackend {
    pub(super) fn run_block<'a>(
        &'a self,
        desc: &InvertedResidualDesc,
        dtype: DType,
        a: &BlockArgs<'a, WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        let op = "inverted_residual";
        // Every tensor is bound whole: over the binding limit or past u32 indices is refused.
        let limit = self.binding_limit();
        let [x, e, eb, d, db, p, pb] = a.given();
        let all = [x, e, eb, d, db, p, pb, Some(out)];
        // The kernel indexes every binding from element 0: a tensor over an engine's buffer at
        // an offset (Tensor::from_wgpu_buffer) goes through the unfused chain instead.
        if all.into_iter().flatten().any(|s| s.base != 0) {
            return Err(Error::InvalidParameter {
                op,
                param: "tensors",
                reason: "the fused WGSL block kernel needs tensors that start at element 0 of their buffer; a view \
                         at an offset in an engine's buffer runs with BlockOptions::fused = false"
                    .into(),
            });
        }
        if all.into_iter().flatten().any(|s| s.buffer.size() > limit || u32::try_from(s.len).is_err()) {
            return Err(Error::Overflow { op, what: "a tensor over the storage-binding limit or u32 indices".into() });
        }
        let (oh, ow) = (desc.out_h(), desc.out_w());
        let tiles_w = ow.div_ceil(BLOCK_TILE_W as usize);
        let tiles = tiles_w.checked_mul(oh.div_ceil(BLOCK_TILE_H as usize));
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        let grid = [
            to_u32(op, "output tiles", tiles.unwrap_or(usize::MAX))?,
            to_u32(op, "output-channel blocks", desc.out_channels.div_ceil(BLOCK_OUT_CHANNELS as usize))?,
            to_u32(op, "batch", desc.batch)?,
        ];
        if grid.iter().any(|&g| g > max) {
            return Err(Error::Overflow { op, what: format!("a grid of {grid:?} workgroups") });
        }
        let mut flags = 0;
        for (on, bit) in [
            (a.expand.is_some(), block_flags::EXPAND),
            (a.expand.is_some() && a.expand_bias.is_some(), block_flags::EXPAND_BIAS),
            (a.depthwise_bias.is_some(), block_flags::DW_BIAS),
            (a.project_bias.is_some(), block_flags::PROJECT_BIAS),
            (desc.residual(), block_flags::RESIDUAL),
            (desc.layout == Layout::Nhwc, block_flags::NHWC),
        ] {
            if on {
                flags |= bit;
            }
        }
        // Padded coordinates reach H + 2 and W + 2.
        to_u32(op, "padded height", desc.height.saturating_add(2))?;
        to_u32(op, "padded width", desc.width.saturating_add(2))?;
        let p = BlockParams {
            channels: to_u32(op, "channels", desc.channels)?,
            height: to_u32(op, "height", desc.height)?,
            width: to_u32(op, "width", desc.width)?,
            hidden: to_u32(op, "hidden channels", desc.hidden)?,
            out_c: to_u32(op, "output channels", desc.out_channels)?,
            stride: to_u32(op, "stride", desc.stride)?,
            out_h: to_u32(op, "output height", oh)?,
            out_w: to_u32(op, "output width", ow)?,
            tiles_w: to_u32(op, "tiles", tiles_w)?,
            flags,
            _pad: [0; 2],
        };
        // Specialised to the accumulators an invocation needs for this C' (`ACC`).
        let spec = Spec::block(desc.out_channels);
        let pipeline = self.pipeline(op, Kernel::InvertedResidual, self.storage_variant(dtype), spec)?;
        let dummy = &self.dummy;
        let or_dummy = |s: Option<&'a WgpuStorage>| -> &'a wgpu::Buffer { s.map_or(dummy, |s| &s.buffer) };
        let binds = vec![
            whole(0, &a.x.buffer),
            whole(1, or_dummy(a.expand)),
            whole(2, or_dummy(a.expand_bias)),
            whole(3, &a.depthwise.buffer),
            whole(4, or_dummy(a.depthwise_bias)),
            whole(5, &a.project.buffer),
            whole(6, or_dummy(a.project_bias)),
            whole(7, &out.buffer),
        ];
        self.record(op, &pipeline, 8, &[Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid }])
    }
}
