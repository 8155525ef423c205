//! Loading modules and functions, launching kernels, and the geometry and parameter blocks of
//! the matmul-shaped launches.

use super::driver::map_err;
use super::{CudaBackend, CudaStorage, lock};
use crate::backend::BackendOps;
use crate::{Error, Result};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use tilekit_kernels::catalogue::cuda::{self as cat, Kernel, Module};
use tilekit_kernels::{DType, MatmulDesc, MatrixView};

/// A kernel parameter block passed by value. The blocks are plain `#[repr(C)]` data mirrored
/// in `shaders/cuda/common.cuh`; this wrapper lets cudarc push them as one argument.
#[repr(transparent)]
struct KernelArg<T>(T);

// SAFETY: `T` is `Pod` (no pointers the host owns, no padding), `#[repr(transparent)]` keeps
// its layout, and the catalogue's tests check each block's size against the PTX's declared
// parameter size.
unsafe impl<T: bytemuck::Pod> DeviceRepr for KernelArg<T> {}

pub(super) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v} (the CUDA kernels take i32)") })
}

pub(super) fn to_i64(op: &'static str, what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Overflow { op, what: format!("{what} = {v}") })
}

/// Blocks for a grid-stride loop over `items` thread work items: enough for every item, capped
/// at 32 blocks per SM (a few full waves; more only adds scheduling overhead).
pub(super) fn stride_blocks(items: u64, sms: u32) -> u32 {
    let needed = items.div_ceil(u64::from(cat::THREADS)).max(1);
    needed.min(u64::from(sms.max(1)) * 32).min(u64::from(u32::MAX)) as u32
}

/// The parameter block of batches `start .. start + count`: the operand offsets moved to batch
/// `start`, `batch` = `count` (one launch covers at most the grid's z limit of batches).
fn batches(base: &cat::MatmulParams, start: usize, count: usize) -> Result<cat::MatmulParams> {
    const OP: &str = "matmul";
    let s = to_i64(OP, "batch index", start)?;
    let shift = |off: i64, bs: i64| -> Result<i64> {
        bs.checked_mul(s)
            .and_then(|d| off.checked_add(d))
            .ok_or_else(|| Error::Overflow { op: OP, what: "a batch offset".into() })
    };
    let mut p = *base;
    p.a_off = shift(base.a_off, base.a_bs)?;
    p.b_off = shift(base.b_off, base.b_bs)?;
    p.c_off = shift(base.c_off, base.c_bs)?;
    p.o_off = shift(base.o_off, base.o_bs)?;
    p.batch = to_i32(OP, "batch", count)?;
    Ok(p)
}

impl CudaBackend {
    /// The function handle of `kernel`, loading its module on first use.
    pub(super) fn function(&self, kernel: Kernel) -> Result<CudaFunction> {
        if let Some((f, _)) = lock(&self.functions).get(kernel.entry) {
            return Ok(f.clone());
        }
        let module = self.module(kernel.module)?;
        let f =
            module.load_function(kernel.entry).map_err(|e| map_err(&format!("loading kernel {}", kernel.entry), e))?;
        // A kernel whose dynamic shared memory passes the default 48 KiB (the 3-stage rings of
        // matmul_f32 and matmul_f32_bf16_*: 49.5 and 72 KiB) must raise its function's limit
        // before its first launch; every supported GPU (sm_80+) allows at least 99 KiB per
        // block.
        let smem = kernel.dynamic_smem_bytes();
        if smem > cat::simt::DEFAULT_SMEM_LIMIT {
            f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(|e| {
                    map_err(&format!("raising the shared memory limit of {} to {smem} bytes", kernel.entry), e)
                })?;
        }
        lock(&self.functions).entry(kernel.entry).or_insert_with(|| (f.clone(), None));
        Ok(f)
    }

    /// Blocks of `kernel` (at [`cat::THREADS`] threads) the GPU holds at once: its SMs times
    /// the driver's occupancy for the kernel's registers and shared memory, at least one.
    pub(super) fn slots(&self, kernel: Kernel) -> Result<usize> {
        if let Some((_, Some(n))) = lock(&self.functions).get(kernel.entry) {
            return Ok(*n);
        }
        let f = self.function(kernel)?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(cat::THREADS, kernel.dynamic_smem_bytes() as usize, None)
            .map_err(|e| map_err(&format!("the occupancy of {}", kernel.entry), e))?;
        let n = (self.sms as usize * per_sm as usize).max(1);
        if let Some(entry) = lock(&self.functions).get_mut(kernel.entry) {
            entry.1 = Some(n);
        }
        Ok(n)
    }

    pub(super) fn module(&self, m: Module) -> Result<Arc<CudaModule>> {
        // The lock is held across the load so that two threads never JIT the same module twice.
        let mut modules = lock(&self.modules);
        if let Some(module) = &modules[m.index()] {
            return Ok(module.clone());
        }
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(m.ptx()))
            .map_err(|e| map_err(&format!("loading PTX module {}", m.name()), e))?;
        modules[m.index()] = Some(module.clone());
        Ok(module)
    }

    /// The device address of a buffer.
    pub(super) fn ptr(&self, s: &CudaStorage) -> u64 {
        // On tilekit's own contexts event tracking is off, so the guard records nothing. On an
        // engine's context with tracking on, taking the address makes the stream wait (on the
        // GPU, not the host) for the buffer's last write, and dropping the guard records a read
        // event: cudarc's own cross-stream ordering, which costs no host wait.
        s.device_address(&self.stream)
    }

    /// Launches `kernel` on the backend's stream with one parameter block.
    pub(super) fn launch<P: bytemuck::Pod>(
        &self,
        kernel: Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: P,
    ) -> Result<()> {
        let f = self.function(kernel)?;
        let arg = KernelArg(params);
        let cfg = LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: kernel.dynamic_smem_bytes() };
        let mut builder = self.stream.launch_builder(&f);
        builder.arg(&arg);
        // SAFETY: the kernel takes exactly one parameter block of this type by value (checked
        // against the PTX by the catalogue's tests). Its device addresses belong to live
        // buffers of this context whose extents the ops layer has checked against the
        // descriptor, and they stay alive until the launch has run: buffers are freed on this
        // same stream, after the work queued before them.
        unsafe { builder.launch(cfg) }.map_err(|e| map_err(&format!("launching {}", kernel.entry), e))?;
        Ok(())
    }

    /// Launches a matmul-shaped kernel (`tile_m × tile_n` outputs per block) for every batch,
    /// splitting batches past the grid's z limit into several launches by moving the offsets.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matmul(
        &self,
        kernel: Kernel,
        desc: &MatmulDesc,
        p: cat::MatmulParams,
        tile_m: usize,
        tile_n: usize,
        block: (u32, u32, u32),
    ) -> Result<()> {
        let (gx, gy) = self.tile_grid(desc, tile_m, tile_n)?;
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            self.launch(kernel, (gx, gy, count as u32), block, batches(&p, start, count)?)?;
            start += count;
        }
        Ok(())
    }

    /// Launches a tensor-core matmul (128 × 128 tiles) for every batch, with K split across
    /// blocks as `cat::splitk::splitk_plan` says: the grid's z is batches × splits, a split
    /// launch writes each split's f32 sums into its plane of a workspace, and
    /// `matmul_splitk_reduce_<dtype>` adds the planes in order and applies the epilogue.
    pub(super) fn launch_matmul_mma(
        &self,
        kernel: Kernel,
        desc: &MatmulDesc,
        dtype: DType,
        p: cat::MatmulParams,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (gx, gy) = self.tile_grid(desc, cat::MATMUL_TILE_M, cat::MATMUL_TILE_N)?;
        let block = (cat::THREADS, 1, 1);
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            let mm = batches(&p, start, count)?;
            let plan = cat::splitk::splitk_plan(desc.m, desc.n, desc.k, count);
            let mut sp = cat::splitk::SplitKParams {
                mm,
                ws: 0,
                splits: to_i32(OP, "splits", plan.splits)?,
                k_chunk: to_i32(OP, "K per split", plan.k_chunk)?,
            };
            match plan.workspace_len(count, desc.m, desc.n) {
                None => self.launch(kernel, (gx, gy, count as u32), block, sp)?,
                Some(len) => {
                    // A split plan has under one wave of blocks, so count · splits is far
                    // below the grid's z limit. The splits write every element the reduction
                    // reads (each plane's rows < M, columns < N rounded up to 4), so the
                    // workspace needs no clearing. Freed on this stream after the two launches.
                    let ws = self.alloc_output(DType::F32, len)?;
                    sp.ws = self.ptr(&ws);
                    let z = u32::try_from(count * plan.splits)
                        .map_err(|_| Error::Overflow { op: OP, what: "the split-K grid".into() })?;
                    self.launch(kernel, (gx, gy, z), block, sp)?;
                    let quads = count * desc.m * cat::splitk::workspace_ld(desc.n) / 4;
                    let blocks = stride_blocks(quads as u64, self.sms);
                    self.launch(cat::splitk::splitk_reduce_kernel(dtype), (blocks, 1, 1), block, sp)?;
                }
            }
            start += count;
        }
        Ok(())
    }

    /// The grid of a matmul over `tile_m × tile_n` tiles: (column tiles, row tiles).
    fn tile_grid(&self, desc: &MatmulDesc, tile_m: usize, tile_n: usize) -> Result<(u32, u32)> {
        const OP: &str = "matmul";
        let gy = desc.m.div_ceil(tile_m);
        if gy > cat::MAX_GRID_Y {
            return Err(Error::Overflow {
                op: OP,
                what: format!("M = {} (the CUDA grid covers at most {} rows)", desc.m, cat::MAX_GRID_Y * tile_m),
            });
        }
        let gx = u32::try_from(desc.n.div_ceil(tile_n))
            .map_err(|_| Error::Overflow { op: OP, what: format!("N = {}", desc.n) })?;
        Ok((gx, gy as u32))
    }

    /// Launches a GEMV kernel for every batch (at most the grid's z limit per launch), with K
    /// split across blocks as `cat::gemv::gemv_plan` says for the kernel's residency; a split launch stores each split's
    /// sums in its own plane of an f32 workspace and `gemv_finalize_<dtype>` adds the planes in
    /// split order and applies the epilogue (no atomics: the same bits on every run).
    pub(super) fn launch_gemv(
        &self,
        kernel: Kernel,
        desc: &MatmulDesc,
        dtype: DType,
        base: cat::MatmulParams,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let block = (cat::gemv::GEMV_THREADS, 1, 1);
        let mut start = 0usize;
        while start < desc.batch {
            let count = (desc.batch - start).min(cat::MAX_GRID_Z);
            let mm = batches(&base, start, count)?;
            let plan = cat::gemv::gemv_plan(dtype, desc.trans_b, desc.n, desc.k, count, self.slots(kernel)?);
            let grid = |v: usize, what: &str| {
                u32::try_from(v).map_err(|_| Error::Overflow { op: OP, what: format!("{what} = {v}") })
            };
            let (gx, gy) = (grid(plan.blocks_n, "GEMV blocks")?, grid(plan.splits, "GEMV splits")?);
            let mut g = cat::gemv::GemvParams {
                mm,
                ws: 0,
                splits: to_i32(OP, "splits", plan.splits)?,
                k_chunk: to_i32(OP, "K per split", plan.k_chunk)?,
            };
            if plan.splits == 1 {
                self.launch(kernel, (gx, gy, count as u32), block, g)?;
            } else {
                let outputs = count
                    .checked_mul(desc.m)
                    .and_then(|v| v.checked_mul(desc.n))
                    .ok_or_else(|| Error::Overflow { op: OP, what: "the split-K workspace".into() })?;
                let planes = outputs
                    .checked_mul(plan.splits)
                    .ok_or_else(|| Error::Overflow { op: OP, what: "the split-K workspace".into() })?;
                // One plane per split, each written in full by its blocks (so not zeroed); freed
                // on this stream after the two launches that use it.
                let ws = self.alloc_output(DType::F32, planes)?;
                g.ws = self.ptr(&ws);
                self.launch(kernel, (gx, gy, count as u32), block, g)?;
                let blocks = grid(outputs.div_ceil(cat::gemv::GEMV_THREADS as usize), "GEMV epilogue blocks")?;
                self.launch(cat::gemv::gemv_finalize_kernel(dtype), (blocks, 1, 1), block, g)?;
            }
            start += count;
        }
        Ok(())
    }

    /// The parameter block of `desc`'s plain product `a · b` (no bias, no C): the bench's
    /// reference kernels.
    #[cfg(feature = "bench-refs")]
    pub(super) fn plain_matmul_params(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        out: &CudaStorage,
    ) -> Result<cat::MatmulParams> {
        self.matmul_params(&desc.c(None).bias_offset(None), dtype, a, b, None, None, out)
    }

    /// The parameter block of a matmul (pointers, views, sizes, epilogue and flags).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_params(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<cat::MatmulParams> {
        const OP: &str = "matmul";
        let view = |v: &MatrixView| -> Result<(i64, i64, i64)> {
            Ok((to_i64(OP, "offset", v.offset)?, to_i64(OP, "ld", v.ld)?, to_i64(OP, "batch stride", v.batch_stride)?))
        };
        // Elements per 16 bytes, and whether a view keeps every row start on such a boundary.
        let per16 = 16 / dtype.size_bytes();
        let aligned = |v: &MatrixView, unit: usize| {
            v.offset.is_multiple_of(unit) && v.ld.is_multiple_of(unit) && v.batch_stride.is_multiple_of(unit)
        };
        let (a_off, a_ld, a_bs) = view(&desc.a)?;
        let (b_off, b_ld, b_bs) = view(&desc.b)?;
        let (o_off, o_ld, o_bs) = view(&desc.out)?;
        let (c_off, c_ld, c_bs) = match (&desc.c, c) {
            (Some(v), Some(_)) => view(v)?,
            _ => (0, 0, 0),
        };
        let mut flags = 0;
        if desc.trans_a {
            flags |= cat::MM_TRANS_A;
        }
        if desc.trans_b {
            flags |= cat::MM_TRANS_B;
        }
        if bias.is_some() {
            flags |= cat::MM_HAS_BIAS;
        }
        if c.is_some() && desc.c.is_some() {
            flags |= cat::MM_HAS_C;
        }
        // Every buffer start is 16-byte aligned: tilekit's allocations are 256-byte aligned and
        // imports are checked (`IMPORT_ALIGN`).
        if aligned(&desc.a, per16) {
            flags |= cat::MM_A_VEC;
        }
        if aligned(&desc.b, per16) {
            flags |= cat::MM_B_VEC;
        }
        if aligned(&desc.out, 4) {
            flags |= cat::MM_OUT_VEC;
        }
        Ok(cat::MatmulParams {
            a: self.ptr(a),
            b: self.ptr(b),
            bias: bias.map_or(0, |s| self.ptr(s)),
            c: c.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            a_off,
            a_ld,
            a_bs,
            b_off,
            b_ld,
            b_bs,
            c_off,
            c_ld,
            c_bs,
            o_off,
            o_ld,
            o_bs,
            bias_off: to_i64(OP, "bias offset", desc.bias_offset.unwrap_or(0))?,
            m: to_i32(OP, "M", desc.m)?,
            n: to_i32(OP, "N", desc.n)?,
            k: to_i32(OP, "K", desc.k)?,
            batch: to_i32(OP, "batch", desc.batch.min(cat::MAX_GRID_Z))?,
            alpha: desc.alpha,
            beta: desc.beta,
            act: desc.activation.code(),
            flags,
        })
    }
}
