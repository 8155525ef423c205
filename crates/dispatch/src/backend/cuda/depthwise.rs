//! The depthwise convolution's launches: the tiled kernels (`depthwise_tiled_<dtype>_<layout>`
//! in `depthwise.cu`) where [`cat::DwTiledPlan`] covers the convolution, else the general
//! kernels (when they may use 16-byte vectors, and their parameter block).

use super::launch::{stride_blocks, to_i32, to_i64};
use super::{CudaBackend, CudaStorage};
use crate::{Error, Result};
use tilekit_kernels::catalogue::cuda as cat;
use tilekit_kernels::{Conv2dDesc, DType, Layout};

impl CudaBackend {
    /// See [`super::super::BackendOps::depthwise_conv2d`]; `packed`: the weight is
    /// `[kh, kw, C·m]` rather than `[C·m, 1, kh, kw]` (every kernel reads either through two
    /// strides).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn depthwise(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &CudaStorage,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
        packed: bool,
    ) -> Result<()> {
        const OP: &str = "depthwise_conv2d";
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op: OP, param: "desc", reason: "empty output".into() });
        };
        let occ = desc.out_channels();
        let work = match desc.layout {
            Layout::Nchw => [desc.batch, occ, oh, ow.div_ceil(cat::dw_vec(dtype))],
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            _ => [desc.batch, oh, ow.div_ceil(cat::DW_NHWC_X), occ.div_ceil(cat::dw_vec(dtype))],
        }
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Overflow { op: OP, what: "work items".into() })?;
        if work == 0 || self.depthwise_tiled(desc, dtype, input, weight, bias, out, packed)? {
            return Ok(());
        }
        // When the kernels may use 16-byte vectors (see `ConvParams::vec`).
        let v = cat::dw_vec(dtype);
        let aligned = |s: &CudaStorage| self.ptr(s).is_multiple_of(16);
        let vec = match desc.layout {
            Layout::Nhwc => desc.multiplier == 1 && desc.channels.is_multiple_of(v) && aligned(input) && aligned(out),
            // NCHW.
            _ => {
                desc.kernel_w == 3
                    && desc.pad_left == 1
                    && desc.dilation_w == 1
                    && matches!(desc.stride_w, 1 | 2)
                    && desc.width.is_multiple_of(v)
                    && aligned(input)
            }
        };
        let i = |what: &str, v: usize| to_i32(OP, what, v);
        let (w_tap, w_ch) = weight_strides(desc, packed);
        // The kernels index whole tensors in i64 but take every single dimension as i32, and
        // index the weight in i32.
        i("channels × multiplier", occ)?;
        i("weight elements", occ * desc.kernel_h * desc.kernel_w)?;
        let p = cat::ConvParams {
            input: self.ptr(input),
            weight: self.ptr(weight),
            bias: bias.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            work: to_i64(OP, "work items", work)?,
            batch: i("batch", desc.batch)?,
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
            w_tap: i("weight stride", w_tap)?,
            w_ch: i("weight stride", w_ch)?,
            act: desc.activation.code(),
            has_bias: u32::from(desc.has_bias && bias.is_some()),
            vec: u32::from(vec),
        };
        let blocks = stride_blocks(work as u64, self.sms);
        self.launch(cat::depthwise_kernel(dtype, desc.layout), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }
}

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
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            _ => {
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
        let i = |what: &str, v: usize| to_i32(OP, what, v);
        let (w_tap, w_ch) = weight_strides(desc, packed);
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
            w_tap: i("weight stride", w_tap)?,
            w_ch: i("weight stride", w_ch)?,
            act: desc.activation.code(),
            flags,
        };
        // Grid z is capped at 65535; the kernels stride over the rest.
        let grid = (plan.grid_xy[0], plan.grid_xy[1], plan.z_total.min(65535) as u32);
        self.launch(cat::depthwise_tiled_kernel(dtype, desc.layout), grid, (cat::DWT_THREADS, 1, 1), p)?;
        Ok(true)
    }
}

/// The weight's strides `(per tap, per output channel)` in elements: `[C·m, 1, kh, kw]`
/// (`packed` false) or `[kh, kw, C·m]` (`packed`), as the kernels' `w_tap` and `w_ch` take them.
fn weight_strides(desc: &Conv2dDesc, packed: bool) -> (usize, usize) {
    if packed { (desc.out_channels(), 1) } else { (1, desc.kernel_h * desc.kernel_w) }
}
