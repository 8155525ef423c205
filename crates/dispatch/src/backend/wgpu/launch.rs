//! Parameter blocks and launches of the matmul and the depthwise convolution when their
//! operands fit the device's limits (the other case is `split.rs`).

use super::*;

impl WgpuBackend {
    /// Shared part of matmul and the naive matmul: the parameter block of `desc`.
    pub(super) fn matmul_params(&self, op: &'static str, desc: &MatmulDesc) -> Result<MatmulParams> {
        let (ar, _) = desc.a_stored();
        let (br, _) = desc.b_stored();
        // A leading dimension or batch stride is only used when there is a second row or
        // batch; where it is not, it is passed as 0 so a huge unused value cannot overflow.
        let ld = |rows: usize, v: usize, what: &str| if rows <= 1 { Ok(0) } else { to_u32(op, what, v) };
        let bs = |v: usize, what: &str| if desc.batch <= 1 { Ok(0) } else { to_u32(op, what, v) };
        let aligned =
            |off: u32, ld: u32, bs: u32| off.is_multiple_of(4) && ld.is_multiple_of(4) && bs.is_multiple_of(4);
        let mut p = MatmulParams {
            m: to_u32(op, "M", desc.m)?,
            n: to_u32(op, "N", desc.n)?,
            k: to_u32(op, "K", desc.k)?,
            a_off: to_u32(op, "a offset", desc.a.offset)?,
            a_ld: ld(ar, desc.a.ld, "a ld")?,
            a_bs: bs(desc.a.batch_stride, "a batch stride")?,
            trans_a: desc.trans_a as u32,
            b_off: to_u32(op, "b offset", desc.b.offset)?,
            b_ld: ld(br, desc.b.ld, "b ld")?,
            b_bs: bs(desc.b.batch_stride, "b batch stride")?,
            trans_b: desc.trans_b as u32,
            o_off: to_u32(op, "out offset", desc.out.offset)?,
            o_ld: ld(desc.m, desc.out.ld, "out ld")?,
            o_bs: bs(desc.out.batch_stride, "out batch stride")?,
            act: desc.activation.code(),
            alpha: desc.alpha,
            beta: desc.beta,
            ..MatmulParams::default()
        };
        if aligned(p.a_off, p.a_ld, p.a_bs) {
            p.flags |= matmul_flags::A_VEC;
        }
        if aligned(p.b_off, p.b_ld, p.b_bs) {
            p.flags |= matmul_flags::B_VEC;
        }
        if aligned(p.o_off, p.o_ld, p.o_bs) {
            p.flags |= matmul_flags::O_VEC;
        }
        if desc.precision == Precision::Bf16 {
            p.flags |= matmul_flags::PREC_BF16;
        }
        if let Some(off) = desc.bias_offset {
            p.flags |= matmul_flags::HAS_BIAS;
            p.bias_off = to_u32(op, "bias offset", off)?;
        }
        if let Some(c) = desc.c {
            p.flags |= matmul_flags::HAS_C;
            p.c_off = to_u32(op, "c offset", c.offset)?;
            p.c_ld = ld(desc.m, c.ld, "c ld")?;
            p.c_bs = bs(c.batch_stride, "c batch stride")?;
        }
        Ok(p)
    }

    /// Launches over batches, at most the grid limit per launch.
    pub(super) fn batched_launches(
        &self,
        op: &'static str,
        params: MatmulParams,
        batch: usize,
        gx: u32,
        gy: u32,
    ) -> Result<Vec<(Vec<u8>, [u32; 3])>> {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if gx > max || gy > max {
            return Err(Error::Overflow { op, what: format!("a grid of {gx} x {gy} workgroups (limit {max} each)") });
        }
        let batch = to_u32(op, "batch", batch)?;
        let mut launches = Vec::new();
        let mut base = 0u32;
        while base < batch {
            let count = (batch - base).min(max);
            let p = MatmulParams { batch_base: base, ..params };
            launches.push((bytemuck::bytes_of(&p).to_vec(), [gx, gy, count]));
            base += count;
        }
        Ok(launches)
    }

    /// The tiled-kernel launch of a matmul with `spec`: whole buffers where every operand fits
    /// the storage-binding limit and every index fits `u32`, else [`Self::split_matmul`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matmul(
        &self,
        op: &'static str,
        desc: &MatmulDesc,
        dtype: DType,
        storage: ElementStorage,
        kernel: Kernel,
        spec: Spec,
        [a, b, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
    ) -> Result<()> {
        // The pipeline is specialised to this product's transposes, bias, C and activation.
        let spec = spec.normalised(kernel).with_switches(desc);
        let (block_m, block_n) = match kernel {
            Kernel::MatmulSmallM => (spec.rows, spec.wg * cat::SMALL_M_COLS),
            Kernel::Gemv | Kernel::GemvSubgroup => (spec.rows, cat::gemv::GEMV_COLS),
            Kernel::MatmulCoop(size) => (size.block(), size.block()),
            _ => (spec.tile.bm(), spec.tile.bn()),
        };
        let pipeline = self.pipeline(op, kernel, storage, spec)?;
        let limit = self.binding_limit();
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        let fits_whole = [Some(a), Some(b), bias, c, Some(out)].into_iter().flatten().all(|s| s.buffer.size() <= limit)
            && self.matmul_params(op, desc).is_ok()
            && desc.n.div_ceil(block_n as usize) <= max as usize
            && desc.m.div_ceil(block_m as usize) <= max as usize;
        let launches = if fits_whole {
            let params = self.matmul_params(op, desc)?;
            let gx = div_ceil_u32(params.n, block_n);
            let gy = div_ceil_u32(params.m, block_m);
            let bias = bias.map_or(&self.dummy, |s| &s.buffer);
            let c = c.map_or(&self.dummy, |s| &s.buffer);
            let binds =
                vec![whole(0, &a.buffer), whole(1, &b.buffer), whole(2, bias), whole(3, c), whole(4, &out.buffer)];
            self.batched_launches(op, params, desc.batch, gx, gy)?
                .into_iter()
                .map(|(params, grid)| Launch { binds: binds.clone(), params, grid })
                .collect()
        } else {
            self.split_matmul(op, desc, dtype, (block_m, block_n), [a, b, out], bias, c)?
        };
        self.record(op, &pipeline, 5, &launches)
    }

    /// The launch of a depthwise convolution with `spec`.
    pub(super) fn launch_conv(
        &self,
        op: &'static str,
        p: &ConvParams,
        storage: ElementStorage,
        spec: Spec,
        [input, weight, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
    ) -> Result<()> {
        let spec = spec.normalised(Kernel::DepthwiseConv2d);
        let grid = self.grid_1d(op, p.items, spec.wg)?;
        let pipeline = self.pipeline(op, Kernel::DepthwiseConv2d, storage, spec)?;
        let bias = bias.map_or(&self.dummy, |s| &s.buffer);
        let binds = vec![whole(0, &input.buffer), whole(1, &weight.buffer), whole(2, bias), whole(3, &out.buffer)];
        self.record(op, &pipeline, 4, &[Launch { binds, params: bytemuck::bytes_of(p).to_vec(), grid }])
    }

    #[cfg(feature = "bench-refs")]
    pub(super) fn element_count_fits(&self, op: &'static str, what: &str, s: &WgpuStorage) -> Result<()> {
        to_u32(op, what, s.len).map(|_| ())
    }
}
