//! `matmul_quant` on CUDA: the kernels of `qmatmul.cu` (`catalogue::cuda::quant`) over a
//! `QTensor`'s scale and body planes.

use super::launch::{to_i32, to_i64};
use super::{CudaBackend, CudaStorage, KIND};
use crate::backend::{BackendOps, QuantView};
use crate::{Error, Result};
use tilekit_kernels::catalogue::cuda::gemv::{GEMV_THREADS, GemvParams, gemv_finalize_kernel};
use tilekit_kernels::catalogue::cuda::quant::{QMATMUL_TILE, QuantKernel, QuantParams, qgemv_plan, quant_kernel};
use tilekit_kernels::catalogue::cuda::{self as cat, Kernel};
use tilekit_kernels::quant::GgmlType;
use tilekit_kernels::{DType, MatmulDesc};

const OP: &str = "matmul_quant";

/// One launch of a quantized matmul over `count` batches: the kernel, its grid, and the split
/// of K (`splits` blocks along K of `kb_chunk` quantization blocks; 1 and all of K without a
/// split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QuantLaunch {
    pub(super) kernel: Kernel,
    pub(super) grid: (u32, u32, u32),
    pub(super) splits: usize,
    pub(super) kb_chunk: usize,
}

/// The launch for `count` batches of an `m × n × k` product with weights of type `ty` and
/// activations in `dtype`: a decode kernel for M ≤ 16 (columns across blocks, K split as
/// `qgemv_plan` says for the `slots` blocks of the kernel the GPU holds at once), else the
/// 64 × 64 tiled kernel.
pub(super) fn quant_launch(
    ty: GgmlType,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    count: usize,
    slots: impl FnOnce(Kernel) -> Result<usize>,
) -> Result<QuantLaunch> {
    let unsupported =
        || Error::UnsupportedQuantType { op: OP, ty, backend: KIND, reason: "not a quantized block format".into() };
    let choice = quant_kernel(ty, dtype, m.max(1)).ok_or_else(unsupported)?;
    let dim = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| Error::Overflow { op: OP, what: format!("{what} = {v} (a CUDA grid dimension)") })
    };
    let z = dim(count, "batches per launch")?;
    Ok(match choice {
        QuantKernel::Gemv(kernel) => {
            let plan = qgemv_plan(ty, n, k, count, slots(kernel)?);
            QuantLaunch {
                kernel,
                grid: (dim(plan.blocks_n, "decode blocks")?, dim(plan.splits, "K splits")?, z),
                splits: plan.splits,
                kb_chunk: plan.kb_chunk,
            }
        }
        QuantKernel::Tiled(kernel) => {
            let gy = m.div_ceil(QMATMUL_TILE);
            if gy > cat::MAX_GRID_Y {
                return Err(Error::Overflow {
                    op: OP,
                    what: format!("M = {m} (the CUDA grid covers at most {} rows)", cat::MAX_GRID_Y * QMATMUL_TILE),
                });
            }
            let blocks_k = k / ty.block_size();
            QuantLaunch {
                kernel,
                grid: (dim(n.div_ceil(QMATMUL_TILE), "column tiles")?, dim(gy, "row tiles")?, z),
                splits: 1,
                kb_chunk: blocks_k.max(1),
            }
        }
    })
}

impl CudaBackend {
    /// See [`BackendOps::matmul_quant`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quant_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        w: &QuantView<'_, CudaStorage>,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        // The ops layer checked the shapes against the weight; the kernels also rely on K being
        // whole blocks and on B being W (never transposed back).
        if !desc.trans_b || desc.k != w.k || desc.n != w.n || !w.k.is_multiple_of(w.ty.block_size().max(1)) {
            return Err(Error::InvalidParameter {
                op: OP,
                param: "w",
                reason: format!(
                    "the weight [{}, {}] does not fit the product (N = {}, K = {}, trans_b = {})",
                    w.n, w.k, desc.n, desc.k, desc.trans_b
                ),
            });
        }
        // `b` is the body plane (unused by the kernels through `mm`); `b_bs` is 0: the weight
        // is shared by every batch.
        let base = self.matmul_params(desc, dtype, a, w.body, bias, c, out)?;
        let (scales, body) = (self.ptr(w.scales), self.ptr(w.body));
        let block = (GEMV_THREADS, 1, 1);
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            let s = to_i64(OP, "batch index", start)?;
            let shift = |off: i64, bs: i64| -> Result<i64> {
                bs.checked_mul(s)
                    .and_then(|d| off.checked_add(d))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "a batch offset".into() })
            };
            let mut mm = base;
            mm.a_off = shift(base.a_off, base.a_bs)?;
            mm.c_off = shift(base.c_off, base.c_bs)?;
            mm.o_off = shift(base.o_off, base.o_bs)?;
            mm.batch = to_i32(OP, "batch", count)?;
            let l = quant_launch(w.ty, dtype, desc.m, desc.n, desc.k, count, |kernel| self.slots(kernel))?;
            let mut q = QuantParams {
                gemv: GemvParams {
                    mm,
                    ws: 0,
                    splits: to_i32(OP, "splits", l.splits)?,
                    k_chunk: to_i32(OP, "K blocks per split", l.kb_chunk)?,
                },
                scales,
                body,
            };
            if l.splits == 1 {
                self.launch(l.kernel, l.grid, block, q)?;
            } else {
                let outputs = count
                    .checked_mul(desc.m)
                    .and_then(|v| v.checked_mul(desc.n))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "the split-K workspace".into() })?;
                let planes = outputs
                    .checked_mul(l.splits)
                    .ok_or_else(|| Error::Overflow { op: OP, what: "the split-K workspace".into() })?;
                // One plane per split, each written in full by its blocks (so not zeroed); freed
                // on this stream after the two launches that use it.
                let ws = self.alloc_output(DType::F32, planes)?;
                q.gemv.ws = self.ptr(&ws);
                self.launch(l.kernel, l.grid, block, q)?;
                let blocks = u32::try_from(outputs.div_ceil(GEMV_THREADS as usize))
                    .map_err(|_| Error::Overflow { op: OP, what: format!("{outputs} outputs in one launch") })?;
                self.launch(gemv_finalize_kernel(dtype), (blocks, 1, 1), block, q.gemv)?;
            }
            start += count;
        }
        Ok(())
    }
}
