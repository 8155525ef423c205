//! The split-over-limits paths: a matmul or depthwise convolution whose operands exceed the
//! storage-binding limit (or `u32` indices, or the per-dimension grid limit) runs as blocks,
//! each binding aligned windows of its buffers.

use super::*;

impl WgpuBackend {
    /// The largest binding a split op uses: the device's storage-binding limit, capped at
    /// 2^31 bytes so every element index inside a window (at most 2^30 16-bit elements, two
    /// per word where packed) stays far inside `u32`.
    pub(super) fn binding_limit(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(1 << 31)
    }

    /// A matmul whose operands exceed the storage-binding limit (or whose indices would pass
    /// `u32`, or whose grid would pass the per-dimension limit), as launches over blocks of
    /// (batches, output rows, output columns). Each block binds, per operand, the byte window
    /// that holds what the block reads or writes, starting at a multiple of the storage offset
    /// alignment, and runs with offsets relative to it. Blocks shrink per operand that does
    /// not fit: batches first, then rows (A, C, out) or columns (B, bias, C, out), which helps
    /// B only when it is stored transposed (N x K rows are contiguous) and A only when it is
    /// not (its M x K rows are contiguous). A single row or column
    /// still over the limit cannot be split and is an [`Error::Overflow`] that names it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_matmul<'a>(
        &'a self,
        op: &'static str,
        desc: &MatmulDesc,
        dtype: DType,
        (block_m, block_n): (u32, u32),
        [a, b, out]: [&'a WgpuStorage; 3],
        bias: Option<&'a WgpuStorage>,
        c: Option<&'a WgpuStorage>,
    ) -> Result<Vec<Launch<'a>>> {
        let size = dtype.size_bytes();
        let limit = self.binding_limit();
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let max = self.limits.max_compute_workgroups_per_dimension.max(1) as usize;
        let k = desc.k;
        // Bytes of a window over `(batches, rows, cols)` of a view: its span plus the most the
        // aligned start can add.
        let span = |v: &MatrixView, nb: usize, rows: usize, cols: usize| -> u64 {
            let elems = (nb.saturating_sub(1) as u128) * v.batch_stride as u128
                + (rows.saturating_sub(1) as u128) * v.ld as u128
                + cols as u128;
            let bytes = elems * size as u128 + u128::from(align) + 16;
            u64::try_from(bytes).unwrap_or(u64::MAX)
        };
        let (mut nb, mut rm, mut cn) = (desc.batch, desc.m, desc.n.min(max * block_n as usize));
        rm = rm.min(max * block_m as usize);
        loop {
            // Which shrink each operand asks for, in order of preference.
            let (ar, ac) = if desc.trans_a { (k, rm) } else { (rm, k) };
            let (br, bc) = if desc.trans_b { (cn, k) } else { (k, cn) };
            let mut over: Vec<(&str, bool, bool, bool)> = Vec::new();
            if k > 0 && span(&desc.a, nb, ar, ac) > limit {
                over.push(("a", true, true, false));
            }
            if k > 0 && span(&desc.b, nb, br, bc) > limit {
                over.push(("b", true, false, true));
            }
            if desc.bias_offset.is_some() && span(&MatrixView::default(), 1, 1, cn) > limit {
                over.push(("bias", false, false, true));
            }
            if let Some(cv) = &desc.c
                && span(cv, nb, rm, cn) > limit
            {
                over.push(("c", true, true, true));
            }
            if span(&desc.out, nb, rm, cn) > limit {
                over.push(("out", true, true, true));
            }
            let Some(&(what, by_batch, by_rows, by_cols)) = over.first() else { break };
            if by_batch && nb > 1 {
                nb = nb.div_ceil(2);
            } else if by_rows && rm > 1 {
                rm = rm.div_ceil(2);
            } else if by_cols && cn > 1 {
                cn = cn.div_ceil(2);
            } else {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "operand {what}: a single row or column of it is over the storage-binding limit \
                         ({limit} bytes) and cannot be split further{}",
                        match what {
                            "a" if desc.trans_a => "; store A untransposed (M x K) to split it by rows",
                            "b" if !desc.trans_b => "; store B transposed (N x K) to split it by columns",
                            _ => "",
                        }
                    ),
                });
            }
        }
        // One window of a view: `(binding window, element offset inside it)`.
        let window = |v: &MatrixView, b0: usize, r0: usize, c0: usize, nb: usize, rows: usize, cols: usize| {
            let first = v.offset + b0 * v.batch_stride + r0 * v.ld + c0;
            let last = first + (nb - 1) * v.batch_stride + (rows - 1) * v.ld + (cols - 1);
            let start = (first * size) as u64 / align * align;
            let end = ((last + 1) * size) as u64;
            ((start, end.div_ceil(16) * 16 - start), first - start as usize / size)
        };
        let mut launches = Vec::new();
        for b0 in (0..desc.batch).step_by(nb) {
            let nb = nb.min(desc.batch - b0);
            for r0 in (0..desc.m).step_by(rm) {
                let nr = rm.min(desc.m - r0);
                for c0 in (0..desc.n).step_by(cn) {
                    let nc = cn.min(desc.n - c0);
                    let mut sub = desc.batch(nb).m(nr).n(nc);
                    let mut binds = Vec::with_capacity(5);
                    if k == 0 {
                        // Nothing of A or B is read.
                        binds.push(whole(0, &self.dummy));
                        binds.push(whole(1, &self.dummy));
                    } else {
                        let (ar0, ac0, ar, ac) = if desc.trans_a { (0, r0, k, nr) } else { (r0, 0, nr, k) };
                        let (w, off) = window(&desc.a, b0, ar0, ac0, nb, ar, ac);
                        binds.push(Bind { slot: 0, buffer: &a.buffer, window: Some(w) });
                        sub.a.offset = off;
                        let (br0, bc0, br, bc) = if desc.trans_b { (c0, 0, nc, k) } else { (0, c0, k, nc) };
                        let (w, off) = window(&desc.b, b0, br0, bc0, nb, br, bc);
                        binds.push(Bind { slot: 1, buffer: &b.buffer, window: Some(w) });
                        sub.b.offset = off;
                    }
                    match (desc.bias_offset, bias) {
                        (Some(bo), Some(bs)) => {
                            let v = MatrixView::new(bo, 0, 0);
                            let (w, off) = window(&v, 0, 0, c0, 1, 1, nc);
                            binds.push(Bind { slot: 2, buffer: &bs.buffer, window: Some(w) });
                            sub.bias_offset = Some(off);
                        }
                        _ => binds.push(whole(2, &self.dummy)),
                    }
                    match (desc.c, c) {
                        (Some(cv), Some(cs)) => {
                            let (w, off) = window(&cv, b0, r0, c0, nb, nr, nc);
                            binds.push(Bind { slot: 3, buffer: &cs.buffer, window: Some(w) });
                            sub.c = Some(cv.offset(off));
                        }
                        _ => binds.push(whole(3, &self.dummy)),
                    }
                    let (w, off) = window(&desc.out, b0, r0, c0, nb, nr, nc);
                    binds.push(Bind { slot: 4, buffer: &out.buffer, window: Some(w) });
                    sub.out.offset = off;
                    // Offsets of later batches are in the window: the block's batches run
                    // from 0 with the strides unchanged.
                    let params = self.matmul_params(op, &sub)?;
                    let gx = div_ceil_u32(params.n, block_n);
                    let gy = div_ceil_u32(params.m, block_m);
                    for (params, grid) in self.batched_launches(op, params, nb, gx, gy)? {
                        launches.push(Launch { binds: binds.clone(), params, grid });
                    }
                }
            }
        }
        Ok(launches)
    }

    /// A depthwise convolution whose buffers exceed the storage-binding limit (or `u32`
    /// indices), as launches over blocks, each binding windows of its buffers at aligned
    /// offsets with the offsets inside them in the parameter block. The blocks are the first
    /// of these whose windows all fit: batches (halved until they fit); then, in NCHW, input
    /// channels with all their output channels (whole planes), then single output channels by
    /// output rows; in NHWC, output rows of one image (whole pixels). A row block reads the
    /// input rows its taps reach and runs with the top padding shifted to match. What still
    /// does not fit (a single output row, or NHWC weights over the limit) is
    /// [`Error::Overflow`]. With `packed` weights (`[kh, kw, C·m]`) a block binds the window
    /// from its first output channel's first tap to its last channel's last tap.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_conv<'a>(
        &'a self,
        op: &'static str,
        desc: &Conv2dDesc,
        dtype: DType,
        spec: Spec,
        [input, weight, out]: [&'a WgpuStorage; 3],
        bias: Option<&'a WgpuStorage>,
        packed: bool,
    ) -> Result<Vec<Launch<'a>>> {
        let size = dtype.size_bytes();
        let limit = self.binding_limit();
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let (Some(oh), Some(ow)) = (desc.out_h(), desc.out_w()) else {
            return Err(Error::InvalidParameter { op, param: "desc", reason: "empty output".into() });
        };
        let (c, h, w, m) = (desc.channels, desc.height, desc.width, desc.multiplier);
        let oc = desc.out_channels();
        let kk = desc.kernel_h * desc.kernel_w;
        let nhwc = desc.layout == Layout::Nhwc;
        // The window holding elements [first, first + len) and the offset of `first` in it,
        // or None when it is over the limit.
        let window = |first: usize, len: usize| -> Option<((u64, u64), u32)> {
            let start = (first * size) as u64 / align * align;
            let end = ((first + len.max(1)) * size) as u64;
            let bytes = end.div_ceil(16) * 16 - start;
            let off = u32::try_from(first - start as usize / size).ok()?;
            (bytes <= limit).then_some(((start, bytes), off))
        };
        // One block: images [n0, n0 + nb), input channels [c0, c0 + nc) (NCHW), or a single
        // output channel `one_oc` (NCHW), output rows [oy0, oy0 + nr).
        struct Block {
            n0: usize,
            nb: usize,
            c0: usize,
            nc: usize,
            one_oc: Option<usize>,
            oy0: usize,
            nr: usize,
        }
        let block = |b: &Block| -> Result<Option<Launch<'a>>> {
            // Input rows the block's taps reach, and the top padding that maps them.
            let (sh, dh, pt) = (desc.stride_h, desc.dilation_h, desc.pad_top);
            let reach_lo = b.oy0 * sh; // padded coordinates
            let reach_hi = (b.oy0 + b.nr - 1) * sh + (desc.kernel_h - 1) * dh;
            let (lo, rows, pad) = if b.nr == oh {
                (0, h, pt as u64)
            } else if reach_lo >= pt + h || reach_hi < pt {
                // Every tap is in the padding: no input row is read.
                (0, 1, u64::from(u32::MAX))
            } else {
                let lo = reach_lo.saturating_sub(pt);
                let hi = (reach_hi - pt).min(h - 1);
                (lo, hi - lo + 1, (lo + pt - reach_lo) as u64)
            };
            let (channels, mult, out_c, in_first, in_len, w_first, w_len, o_first, o_len, b_first, b_len) = if nhwc {
                let in_first = (b.n0 * h + lo) * w * c;
                let o_first = (b.n0 * oh + b.oy0) * ow * oc;
                (c, m, oc, in_first, b.nb * rows * w * c, 0, oc * kk, o_first, b.nb * b.nr * ow * oc, 0, oc)
            } else if let Some(o) = b.one_oc {
                let in_first = (b.n0 * c + o / m) * h * w + lo * w;
                let o_first = ((b.n0 * oc + o) * oh + b.oy0) * ow;
                (1, 1, 1, in_first, rows * w, o * kk, kk, o_first, b.nr * ow, o, 1)
            } else {
                let in_first = (b.n0 * c + b.c0) * h * w;
                let o_first = (b.n0 * oc + b.c0 * m) * oh * ow;
                let ocs = b.nc * m;
                (
                    b.nc,
                    m,
                    ocs,
                    in_first,
                    b.nb * b.nc * h * w,
                    b.c0 * m * kk,
                    ocs * kk,
                    o_first,
                    b.nb * ocs * oh * ow,
                    b.c0 * m,
                    ocs,
                )
            };
            // Pre-packed weights: the block's output channels [w_first / kk, + w_len / kk) at
            // every tap, strided by the full C·m.
            let (w_first, w_len) = if packed { (w_first / kk, (kk - 1) * oc + w_len / kk) } else { (w_first, w_len) };
            // Imported views start at their base.
            let (Some((wi, in_off)), Some((ww, w_off)), Some((wo, o_off))) = (
                window(input.base + in_first, in_len),
                window(weight.base + w_first, w_len),
                window(out.base + o_first, o_len),
            ) else {
                return Ok(None);
            };
            let mut binds = vec![
                Bind { slot: 0, buffer: &input.buffer, window: Some(wi) },
                Bind { slot: 1, buffer: &weight.buffer, window: Some(ww) },
                Bind { slot: 3, buffer: &out.buffer, window: Some(wo) },
            ];
            let mut b_off = 0;
            match bias {
                Some(bs) => {
                    let Some((wb, off)) = window(bs.base + b_first, b_len) else { return Ok(None) };
                    binds.push(Bind { slot: 2, buffer: &bs.buffer, window: Some(wb) });
                    b_off = off;
                }
                None => binds.push(whole(2, &self.dummy)),
            }
            let groups = if nhwc { b.nb * b.nr * ow * oc.div_ceil(4) } else { b.nb * out_c * b.nr * ow.div_ceil(4) };
            let mut flags = 0;
            if bias.is_some() {
                flags |= conv_flags::HAS_BIAS;
            }
            let out_vec = if nhwc { out_c.is_multiple_of(4) } else { ow.is_multiple_of(4) };
            if out_vec && o_off.is_multiple_of(4) {
                flags |= conv_flags::OUT_VEC;
            }
            if nhwc && mult == 1 && channels.is_multiple_of(4) && in_off.is_multiple_of(4) {
                flags |= conv_flags::IN_VEC;
            }
            let p = ConvParams {
                batch: to_u32(op, "batch", b.nb)?,
                channels: to_u32(op, "channels", channels)?,
                height: to_u32(op, "height", rows)?,
                width: to_u32(op, "width", w)?,
                mult: to_u32(op, "multiplier", mult)?,
                kh: to_u32(op, "kernel height", desc.kernel_h)?,
                kw: to_u32(op, "kernel width", desc.kernel_w)?,
                stride_h: to_u32(op, "stride", desc.stride_h)?,
                stride_w: to_u32(op, "stride", desc.stride_w)?,
                dil_h: to_u32(op, "dilation", desc.dilation_h)?,
                dil_w: to_u32(op, "dilation", desc.dilation_w)?,
                pad_top: u32::try_from(pad).unwrap_or(u32::MAX),
                pad_left: to_u32(op, "padding", desc.pad_left)?,
                out_h: to_u32(op, "output height", b.nr)?,
                out_w: to_u32(op, "output width", ow)?,
                out_c: to_u32(op, "output channels", out_c)?,
                nhwc: nhwc as u32,
                flags,
                act: desc.activation.code(),
                items: to_u32(op, "output groups", groups)?,
                in_off,
                w_off,
                b_off,
                o_off,
                w_tap: to_u32(op, "weight stride", if packed { oc } else { 1 })?,
                w_ch: to_u32(op, "weight stride", if packed { 1 } else { kk })?,
                ..ConvParams::default()
            };
            let grid = self.grid_1d(op, p.items, spec.normalised(Kernel::DepthwiseConv2d).wg)?;
            Ok(Some(Launch { binds, params: bytemuck::bytes_of(&p).to_vec(), grid }))
        };
        let all = |blocks: Vec<Block>| -> Result<Option<Vec<Launch<'a>>>> {
            let mut launches = Vec::with_capacity(blocks.len());
            for b in &blocks {
                match block(b)? {
                    Some(l) => launches.push(l),
                    None => return Ok(None),
                }
            }
            Ok(Some(launches))
        };
        let full = |n0: usize, nb: usize| Block { n0, nb, c0: 0, nc: c, one_oc: None, oy0: 0, nr: oh };
        // Batches.
        let mut nb = desc.batch;
        loop {
            let blocks = (0..desc.batch).step_by(nb).map(|n0| full(n0, nb.min(desc.batch - n0))).collect();
            if let Some(l) = all(blocks)? {
                return Ok(l);
            }
            if nb == 1 {
                break;
            }
            nb = nb.div_ceil(2);
        }
        // NCHW: input channels with all their output channels.
        if !nhwc {
            let mut nc = c.div_ceil(2);
            while nc >= 1 {
                let blocks = (0..desc.batch)
                    .flat_map(|n0| (0..c).step_by(nc).map(move |c0| (n0, c0)))
                    .map(|(n0, c0)| Block { nc: nc.min(c - c0), c0, ..full(n0, 1) })
                    .collect();
                if let Some(l) = all(blocks)? {
                    return Ok(l);
                }
                if nc == 1 {
                    break;
                }
                nc = nc.div_ceil(2);
            }
        }
        // Output rows (of one output channel in NCHW).
        let mut nr = oh.div_ceil(2).max(1);
        loop {
            let units: Vec<(usize, Option<usize>)> = if nhwc {
                (0..desc.batch).map(|n| (n, None)).collect()
            } else {
                (0..desc.batch).flat_map(|n| (0..oc).map(move |o| (n, Some(o)))).collect()
            };
            let blocks = units
                .into_iter()
                .flat_map(|(n0, one_oc)| (0..oh).step_by(nr).map(move |oy0| (n0, one_oc, oy0)))
                .map(|(n0, one_oc, oy0)| Block { one_oc, oy0, nr: nr.min(oh - oy0), ..full(n0, 1) })
                .collect();
            if let Some(l) = all(blocks)? {
                return Ok(l);
            }
            if nr == 1 {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "one output row of the convolution needs bindings over the storage-binding limit ({limit} bytes)"
                    ),
                });
            }
            nr = nr.div_ceil(2);
        }
    }
}
