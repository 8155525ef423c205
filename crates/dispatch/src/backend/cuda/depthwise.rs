//! The tiled depthwise kernels on CUDA (`depthwise_tiled_<dtype>_<layout>` in `depthwise.cu`):
//! their parameter block and launch where [`cat::DwTiledPlan`] covers the convolution.

use super::*;

impl CudaBackend {
    /// Launches the tiled kernel for `desc` and returns `true`, or returns `false` (launching
    /// nothing) where no tiled plan covers it, so the caller runs the general kernels. `packed`:
    /// the weight is `[kh, kw, C·m]` rather than `[C·m, 1, kh, kw]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn depthwise_tiled(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &CudaStorage,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
        packed: bool,
    ) -> Result<bool> {
        const OP: &str = "depthwise_conv2d";
        let Some(plan) = cat::DwTiledPlan::new(desc, dtype) else { return Ok(false) };
        if plan.z_total == 0 {
            return Ok(true);
        }
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else { return Ok(false) };
        let v = cat::dw_vec(dtype);
        let aligned = |s: &CudaStorage| self.ptr(s).is_multiple_of(16);
        let (in_vec, out_vec) = match desc.layout {
            Layout::Nchw => (desc.width.is_multiple_of(v) && aligned(input), ow.is_multiple_of(v) && aligned(out)),
            Layout::Nhwc => {
                let c = desc.channels.is_multiple_of(v);
                (c && aligned(input), c && aligned(out))
            }
        };
        let mut flags = 0;
        if bias.is_some() {
            flags |= cat::dwt_flags::BIAS;
        }
        if in_vec {
            flags |= cat::dwt_flags::IN_VEC;
        }
        if out_vec {
            flags |= cat::dwt_flags::OUT_VEC;
        }
        let taps = desc.kernel_h * desc.kernel_w;
        let i = |what: &str, v: usize| to_i32(OP, what, v);
        let p = cat::DwTiledParams {
            input: self.ptr(input),
            weight: self.ptr(weight),
            bias: bias.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            z_total: to_i64(OP, "blocks along z", plan.z_total)?,
            channels: i("channels", desc.channels)?,
            height: i("height", desc.height)?,
            width: i("width", desc.width)?,
            multiplier: i("multiplier", desc.multiplier)?,
            kh: i("kernel_h", desc.kernel_h)?,
            kw: i("kernel_w", desc.kernel_w)?,
            sh: i("stride_h", desc.stride_h)?,
            sw: i("stride_w", desc.stride_w)?,
            pt: i("pad_top", desc.pad_top)?,
            pl: i("pad_left", desc.pad_left)?,
            dh: i("dilation_h", desc.dilation_h)?,
            dw: i("dilation_w", desc.dilation_w)?,
            oh: i("out_h", oh)?,
            ow: i("out_w", ow)?,
            tile_h: i("tile rows", plan.tile_h)?,
            patch_h: i("patch rows", plan.patch_h)?,
            patch_w: i("patch width", plan.patch_w)?,
            c_blocks: i("channel blocks", plan.c_blocks)?,
            w_tap: i("weight stride", if packed { desc.out_channels() } else { 1 })?,
            w_ch: i("weight stride", if packed { 1 } else { taps })?,
            act: desc.activation.code(),
            flags,
        };
        // Grid z is capped at 65535; the kernels stride over the rest.
        let grid = (plan.grid_xy[0], plan.grid_xy[1], plan.z_total.min(65535) as u32);
        self.launch(cat::depthwise_tiled_kernel(dtype, desc.layout), grid, (cat::DWT_THREADS, 1, 1), p)?;
        Ok(true)
    }
}
