//! `matmul_quant` on the wgpu backend: the quantized kernels of `qmatmul.wgsl` (decode GEMV for
//! M ≤ 16 with the device's reduction, the tiled kernel above), one pipeline per format, A's
//! storage variant and the product's switches.
//!
//! Every operand is bound whole: a weight plane, A, bias, C or the output over the
//! storage-binding limit (or a grid over the per-dimension workgroup limit) is refused with
//! [`Error::Overflow`] naming it. (A 4096 × 11008 Q8_0 weight is 48 MB; the WebGPU default
//! binding limit is 128 MiB and desktop adapters allow 2 GiB or more.)

use super::*;
use crate::backend::QuantView;
use tilekit_kernels::catalogue::wgsl::{QuantFormat, qmatmul};

impl WgpuBackend {
    /// `desc` (`trans_b` set, `b` the weight) with the weight `w`; see `ops/quant.rs`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_matmul_quant(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &WgpuStorage,
        w: &QuantView<'_, WgpuStorage>,
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
        out: &WgpuStorage,
    ) -> Result<()> {
        let op = "matmul_quant";
        let Some(format) = QuantFormat::of(w.ty) else {
            return Err(Error::UnsupportedQuantType {
                op,
                ty: w.ty,
                backend: KIND,
                reason: "not a block-quantized type".into(),
            });
        };
        Self::check_engine_alias(
            op,
            out,
            &[("a", Some(a)), ("w", Some(w.scales)), ("w", Some(w.body)), ("bias", bias), ("c", c)],
        )?;
        // Imported views start at their base; the weight planes are tilekit's own (base 0),
        // but their bases are honoured the same way.
        let desc = &Self::rebased(desc, [a, w.body, out], bias, c)?;
        let limit = self.binding_limit();
        for (what, s) in [("a", Some(a)), ("bias", bias), ("c", c), ("the output", Some(out))] {
            if let Some(s) = s
                && s.buffer.size() > limit
            {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "{what}: a binding of {} bytes (the quantized matmul splits only the weight; the limit is {limit})",
                        s.buffer.size()
                    ),
                });
            }
        }
        let mut params = self.matmul_params(op, desc)?;
        params.b_ld = 0;
        params.flags &= !matmul_flags::B_VEC;
        let (kernel, spec) = qmatmul::choose(format, desc.m, self.subgroups);
        // The switches (transposed A, bias, C, activation) travel in the parameter block.
        let (block_m, block_n) = match kernel {
            Kernel::QuantMatmul(_) => (qmatmul::QMATMUL_BLOCK, qmatmul::QMATMUL_BLOCK),
            _ => (desc.m.max(1) as u32, qmatmul::QGEMV_COLS),
        };
        let gy = div_ceil_u32(params.m, block_m);
        let pipeline = self.pipeline(op, kernel, self.storage_variant(dtype), spec)?;
        let bias_buf = bias.map_or(&self.dummy, |s| &s.buffer);
        let c_buf = c.map_or(&self.dummy, |s| &s.buffer);
        let mut launches = Vec::new();
        for cols in self.weight_blocks(op, w, desc.b.offset)? {
            let mut p = params;
            p.n = to_u32(op, "N", cols.count)?;
            p.b_off = cols.body_off;
            p.b_bs = cols.scale_off;
            if p.b_off.is_multiple_of(4) {
                p.flags |= matmul_flags::B_VEC;
            }
            // The block's columns start n0 columns into the output, bias and C rows; the
            // vector stores need the output view still aligned.
            let n0 = to_u32(op, "column", cols.first)?;
            p.o_off =
                p.o_off.checked_add(n0).ok_or_else(|| Error::Overflow { op, what: "the output offset".into() })?;
            p.bias_off += if desc.bias_offset.is_some() { n0 } else { 0 };
            p.c_off += if desc.c.is_some() { n0 } else { 0 };
            if !p.o_off.is_multiple_of(4) {
                p.flags &= !matmul_flags::O_VEC;
            }
            let gx = div_ceil_u32(p.n, block_n);
            let binds = vec![
                whole(0, &a.buffer),
                Bind { slot: 1, buffer: &w.scales.buffer, window: cols.scale_window },
                whole(2, bias_buf),
                whole(3, c_buf),
                whole(4, &out.buffer),
                Bind { slot: cat::qmatmul::BODY_BINDING, buffer: &w.body.buffer, window: cols.body_window },
            ];
            for (params, grid) in self.batched_launches(op, p, desc.batch, gx, gy)? {
                launches.push(Launch { binds: binds.clone(), params, grid });
            }
        }
        self.record(op, &pipeline, 5, &launches)
    }
}

/// A block of weight rows (output columns) bound as windows of the two planes.
struct WeightBlock {
    /// First output column and number of columns.
    first: usize,
    count: usize,
    /// The body plane's window (`None`: the whole buffer) and the block's first word in it.
    body_window: Option<(u64, u64)>,
    body_off: u32,
    /// The scale plane's window and the block's first half-word in it.
    scale_window: Option<(u64, u64)>,
    scale_off: u32,
}

impl WgpuBackend {
    /// The weight as one block bound whole where both planes fit the storage-binding limit,
    /// else as blocks of rows whose windows of each plane fit it (each window starting at a
    /// multiple of the storage offset alignment). `body_base` is the body plane's first word.
    fn weight_blocks(
        &self,
        op: &'static str,
        w: &QuantView<'_, WgpuStorage>,
        body_base: usize,
    ) -> Result<Vec<WeightBlock>> {
        let limit = self.binding_limit();
        let scale_base = w.scales.base * 2;
        if w.body.buffer.size() <= limit && w.scales.buffer.size() <= limit {
            return Ok(vec![WeightBlock {
                first: 0,
                count: w.n,
                body_window: None,
                body_off: to_u32(op, "the weight's body offset", body_base)?,
                scale_window: None,
                scale_off: to_u32(op, "the weight's scale offset", scale_base)?,
            }]);
        }
        let geometry = crate::quant_tensor::PlaneGeometry::of(w.ty)
            .ok_or_else(|| Error::Backend { backend: KIND, message: format!("{} has no plane geometry", w.ty) })?;
        let blocks_per_row = w.k / w.ty.block_size();
        let row_body = blocks_per_row * geometry.body_bytes;
        let row_scale = blocks_per_row * geometry.scale_bytes;
        // A window may start up to one alignment (and a word) before the block's first byte.
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let room = limit.saturating_sub(align + 16) as usize;
        let rows = room / row_body.max(row_scale).max(1);
        if rows == 0 {
            return Err(Error::Overflow {
                op,
                what: format!(
                    "one row of the quantized weight ({row_body} bytes) with the device's storage-binding limit of {limit} bytes"
                ),
            });
        }
        let mut out = Vec::new();
        let mut first = 0;
        while first < w.n {
            let count = rows.min(w.n - first);
            let body_words = row_body / 4;
            let (body_window, body_off) = self.window_of(w.body, first * body_words, count * body_words, 4)?;
            // Scales in half-words: Q8_0, Q4_0 and Q6_K rows may start mid-word.
            let h0 = first * row_scale / 2;
            let words = (count * row_scale).div_ceil(4) + 1;
            let (scale_window, scale_word_off) = self.window_of(w.scales, h0 / 2, words, 4)?;
            out.push(WeightBlock {
                first,
                count,
                body_window: Some(body_window),
                body_off,
                scale_window: Some(scale_window),
                scale_off: 2 * scale_word_off + (h0 % 2) as u32,
            });
            first += count;
        }
        Ok(out)
    }
}
