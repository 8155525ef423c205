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
        for (what, s) in [
            ("a", Some(a)),
            ("the weight's scale plane", Some(w.scales)),
            ("the weight's body plane", Some(w.body)),
            ("bias", bias),
            ("c", c),
            ("the output", Some(out)),
        ] {
            if let Some(s) = s
                && s.buffer.size() > limit
            {
                return Err(Error::Overflow {
                    op,
                    what: format!(
                        "{what}: a binding of {} bytes (the quantized kernels bind whole buffers; the limit is {limit})",
                        s.buffer.size()
                    ),
                });
            }
        }
        let mut params = self.matmul_params(op, desc)?;
        params.b_off = to_u32(op, "the weight's body offset", desc.b.offset)?;
        params.b_ld = 0;
        // Half-words: the f16 scales of Q8_0, Q4_0 and Q6_K are two to a word.
        params.b_bs = to_u32(op, "the weight's scale offset", w.scales.base.saturating_mul(2))?;
        params.flags &= !matmul_flags::B_VEC;
        if params.b_off.is_multiple_of(4) {
            params.flags |= matmul_flags::B_VEC;
        }
        let (kernel, spec) = qmatmul::choose(format, desc.m, self.subgroups);
        let spec = spec.with_switches(desc);
        let (gx, gy) = match kernel {
            Kernel::QuantMatmul(_) => {
                (div_ceil_u32(params.n, qmatmul::QMATMUL_BLOCK), div_ceil_u32(params.m, qmatmul::QMATMUL_BLOCK))
            }
            _ => (div_ceil_u32(params.n, qmatmul::QGEMV_COLS), 1),
        };
        let pipeline = self.pipeline(op, kernel, self.storage_variant(dtype), spec)?;
        let binds = vec![
            whole(0, &a.buffer),
            whole(1, &w.scales.buffer),
            whole(2, bias.map_or(&self.dummy, |s| &s.buffer)),
            whole(3, c.map_or(&self.dummy, |s| &s.buffer)),
            whole(4, &out.buffer),
            whole(cat::qmatmul::BODY_BINDING, &w.body.buffer),
        ];
        let launches: Vec<Launch<'_>> = self
            .batched_launches(op, params, desc.batch, gx, gy)?
            .into_iter()
            .map(|(params, grid)| Launch { binds: binds.clone(), params, grid })
            .collect();
        self.record(op, &pipeline, 5, &launches)
    }
}
