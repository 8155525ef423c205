//! The depthwise convolution on wgpu: the choice between the tiled kernel
//! ([`Kernel::DepthwiseTiled`], where [`DwTiledPlan`] covers the convolution) and the general
//! one ([`Kernel::DepthwiseConv2d`]: NHWC with a multiplier above 1, patches or filters larger
//! than the tiled kernel's workgroup arrays, and operands over the binding limits), their
//! parameter blocks and the tiled kernel's 3-D launches.

use super::*;
use tilekit_kernels::catalogue::wgsl::DwTiledPlan;

/// The general kernel everywhere, process-wide: the bench's reference point for the tiled
/// kernel (`Device::set_previous_depthwise`, feature `bench-refs`), never set otherwise.
pub(crate) static GENERAL_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn general_only() -> bool {
    GENERAL_ONLY.load(Ordering::Relaxed)
}

/// `spec` for the general kernel: the tiled kernel's stand-in ([`cat::DW_TILED`], which a
/// forced or cached spec may carry where no tiled plan applies) becomes the default workgroup.
fn general(spec: Spec) -> Spec {
    if spec.wg == cat::DW_TILED { Spec { wg: cat::WG_1D, ..spec } } else { spec }
}

impl WgpuBackend {
    /// The depthwise convolution, its spec chosen as `request` says; the report of a tune it
    /// ran. `packed`: the weight is pre-packed `[kh, kw, C·m]` (else `[C·m, 1, kh, kw]`). The
    /// tiled kernel runs wherever [`DwTiledPlan`] covers the convolution and the general one
    /// elsewhere (and over the binding limits, as windowed blocks).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_conv(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &WgpuStorage,
        weight: &WgpuStorage,
        bias: Option<&WgpuStorage>,
        out: &WgpuStorage,
        packed: bool,
        request: TuneRequest,
    ) -> Result<Option<Result<TuneReport>>> {
        let op = "depthwise_conv2d";
        let limit = self.binding_limit();
        let buffers = [Some(input), Some(weight), bias, Some(out)];
        if buffers.into_iter().flatten().any(|s| s.buffer.size() > limit || u32::try_from(s.len).is_err()) {
            // Over the storage-binding limit or past u32 indices: blocks bound as windows.
            let storage = self.storage_variant(dtype);
            let kernel = Kernel::DepthwiseConv2d;
            let candidates = cat::conv_candidates_for(false, desc.layout);
            let run = |spec: Spec| {
                let spec = general(spec);
                let launches = self.split_conv(op, desc, dtype, spec, [input, weight, out], bias, packed)?;
                let pipeline = self.pipeline(op, kernel, storage, spec)?;
                self.record(op, &pipeline, 4, &launches)
            };
            let (spec, report) = self.choose(kernel, storage, &candidates, || conv_key_tail(desc), &run, request)?;
            run(spec)?;
            return Ok(report);
        }
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op, param: "desc", reason: "empty output".into() });
        };
        let oc = desc.out_channels();
        // Padded extents bound every padded coordinate the kernel computes.
        let padded_h = desc.height.checked_add(desc.pad_top).and_then(|v| v.checked_add(desc.pad_bottom));
        let padded_w = desc.width.checked_add(desc.pad_left).and_then(|v| v.checked_add(desc.pad_right));
        to_u32(op, "padded height", padded_h.unwrap_or(usize::MAX))?;
        to_u32(op, "padded width", padded_w.unwrap_or(usize::MAX))?;
        let groups = match desc.layout {
            Layout::Nchw => {
                desc.batch.checked_mul(oc).and_then(|v| v.checked_mul(oh)).and_then(|v| v.checked_mul(ow.div_ceil(4)))
            }
            // NHWC (`Layout` is `#[non_exhaustive]`; the op admits only NCHW and NHWC).
            _ => desc.batch.checked_mul(oh).and_then(|v| v.checked_mul(ow)).and_then(|v| v.checked_mul(oc.div_ceil(4))),
        };
        let items = to_u32(op, "output groups", groups.unwrap_or(usize::MAX))?;
        let mut flags = 0;
        if bias.is_some() {
            flags |= conv_flags::HAS_BIAS;
        }
        // Imported views start at their base; the vector paths need it a multiple of 4.
        let in_off = to_u32(op, "input offset", input.base)?;
        let o_off = to_u32(op, "output offset", out.base)?;
        match desc.layout {
            Layout::Nchw if ow.is_multiple_of(4) && o_off.is_multiple_of(4) => flags |= conv_flags::OUT_VEC,
            Layout::Nhwc if oc.is_multiple_of(4) && o_off.is_multiple_of(4) => flags |= conv_flags::OUT_VEC,
            _ => {}
        }
        if desc.layout == Layout::Nhwc
            && desc.multiplier == 1
            && desc.channels.is_multiple_of(4)
            && in_off.is_multiple_of(4)
        {
            flags |= conv_flags::IN_VEC;
        }
        let p = ConvParams {
            batch: to_u32(op, "batch", desc.batch)?,
            channels: to_u32(op, "channels", desc.channels)?,
            height: to_u32(op, "height", desc.height)?,
            width: to_u32(op, "width", desc.width)?,
            mult: to_u32(op, "multiplier", desc.multiplier)?,
            kh: to_u32(op, "kernel height", desc.kernel_h)?,
            kw: to_u32(op, "kernel width", desc.kernel_w)?,
            stride_h: to_u32(op, "stride", desc.stride_h)?,
            stride_w: to_u32(op, "stride", desc.stride_w)?,
            dil_h: to_u32(op, "dilation", desc.dilation_h)?,
            dil_w: to_u32(op, "dilation", desc.dilation_w)?,
            pad_top: to_u32(op, "padding", desc.pad_top)?,
            pad_left: to_u32(op, "padding", desc.pad_left)?,
            out_h: to_u32(op, "output height", oh)?,
            out_w: to_u32(op, "output width", ow)?,
            out_c: to_u32(op, "output channels", oc)?,
            nhwc: (desc.layout == Layout::Nhwc) as u32,
            flags,
            act: desc.activation.code(),
            items,
            in_off,
            w_off: to_u32(op, "weight offset", weight.base)?,
            b_off: to_u32(op, "bias offset", bias.map_or(0, |b| b.base))?,
            o_off,
            w_tap: to_u32(op, "weight stride", if packed { oc } else { 1 })?,
            w_ch: to_u32(op, "weight stride", if packed { 1 } else { desc.kernel_h * desc.kernel_w })?,
            ..ConvParams::default()
        };
        let storage = self.storage_variant(dtype);
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        // The tiled kernel where its plan covers the convolution: one of the tuner's candidates
        // with the general kernel at each workgroup size (the default in NHWC, see
        // `conv_candidates_for`).
        let plan = DwTiledPlan::new(desc, max).filter(|_| !general_only());
        let mut tiled = p;
        if let Some(plan) = &plan {
            tiled.tile_h = plan.tile_h;
            tiled.patch_h = plan.patch_h;
            tiled.patch_w = plan.patch_w;
            tiled.c_blocks = plan.c_blocks;
            if packed && p.out_c.is_multiple_of(4) && p.w_off.is_multiple_of(4) {
                tiled.flags |= conv_flags::W_VEC;
            }
            if desc.layout == Layout::Nchw && desc.width.is_multiple_of(4) && in_off.is_multiple_of(4) {
                tiled.flags |= conv_flags::IN_VEC;
            }
        }
        let kernel = Kernel::DepthwiseConv2d;
        let candidates = cat::conv_candidates_for(plan.is_some(), desc.layout);
        let run = |spec: Spec| match &plan {
            Some(plan) if spec.wg == cat::DW_TILED => {
                self.launch_tiled_conv(op, &tiled, plan, storage, [input, weight, out], bias)
            }
            _ => self.launch_conv(op, &p, storage, general(spec), [input, weight, out], bias),
        };
        let (spec, report) = self.choose(kernel, storage, &candidates, || conv_key_tail(desc), &run, request)?;
        run(spec)?;
        Ok(report)
    }

    /// The tiled kernel's launches: the plan's x and y tiles, z (images × channels or channel
    /// blocks) split over launches of at most the per-dimension limit, each with its `z_base`.
    fn launch_tiled_conv(
        &self,
        op: &'static str,
        p: &ConvParams,
        plan: &DwTiledPlan,
        storage: ElementStorage,
        [input, weight, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
    ) -> Result<()> {
        let pipeline = self.pipeline(op, Kernel::DepthwiseTiled, storage, Spec::DEFAULT)?;
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        let bias = bias.map_or(&self.dummy, |s| &s.buffer);
        let binds = vec![whole(0, &input.buffer), whole(1, &weight.buffer), whole(2, bias), whole(3, &out.buffer)];
        let mut launches = Vec::new();
        let mut z0 = 0u64;
        while z0 < plan.z {
            let count = (plan.z - z0).min(max);
            let p = ConvParams { z_base: to_u32(op, "workgroups along z", z0 as usize)?, ..*p };
            let grid = [plan.grid_xy[0], plan.grid_xy[1], count as u32];
            launches.push(Launch { binds: binds.clone(), params: bytemuck::bytes_of(&p).to_vec(), grid });
            z0 += count;
        }
        self.record(op, &pipeline, 4, &launches)
    }
}
