//! The native CPU backend: the fallback every machine has.
//!
//! It is not the reference (that is `tilekit_kernels::reference`, naive and in f64): this is
//! meant to be reasonably fast.
//! - Matmul goes through the `gemm` crate in f32. f32 operands are read where they are stored
//!   (no copy); f16 and bf16 operands are widened to f32 first (in parallel, with `half`'s
//!   vectorised slice conversions), because `gemm`'s own f16 path accumulates in f32 but rounds
//!   its result to f16, and the fused epilogue must see the f32 sum (one rounding per result).
//!   Each batch is computed into a dense f32 scratch block, the epilogue is applied there, and
//!   the rows are stored (rounded once) into the output view. Small batched products run one
//!   batch per core; large ones let `gemm` parallelise inside the product.
//! - Depthwise conv accumulates whole output rows tap by tap (each tap's valid output range is
//!   computed once, so the inner loop has no bounds tests and vectorises), one output plane
//!   (NCHW) or row (NHWC, channels innermost, weights transposed to `[kh][kw][C·m]`) per task.
//! - Activations stream through the buffer in chunks of 4096 elements, widened into a stack
//!   buffer, computed, and narrowed back, in place when input and output are one buffer.
//!
//! Numerics: every kernel computes in f32 and rounds once (nearest even) when it stores; the
//! activations are [`Activation::apply_f32`], the formula every backend implements; NaN and
//! ±Inf propagate (no fast-math anywhere).
//!
//! NaN and Inf, the promise (tested in `tests/tests/nan_inf.rs`): an output that depends on a
//! NaN is NaN; an infinity goes through the matmul and conv as IEEE arithmetic says and
//! through an activation as [`Activation::apply_f32`] says (NaN stays NaN in every
//! activation); outputs that do not depend on a non-finite input are exactly what they are
//! without it. Subnormals are kept (no flush to zero).
//!
//! Out of memory: every allocation (tensors, scratch blocks) is a `try_reserve`, and a failure
//! is [`Error::OutOfMemory`], never an abort.
//!
//! Locking: each buffer sits behind its own `RwLock`. An op takes all its locks at once, in one
//! global order (the buffers' addresses), read locks for inputs and the write lock for the
//! output, each buffer once. Two ops can then never wait on each other in a cycle (the classic
//! lock-ordering argument, which holds whatever the lock modes), an input named twice (A and B
//! in one buffer) is locked once, and in-place activation takes only the write lock. Ops reach
//! the backend validated, so the output never aliases another input of the op.

use super::BackendOps;
use crate::{BackendKind, Error, Result};
use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;
use std::borrow::Cow;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use tilekit_kernels::{Activation, ActivationDesc, Conv2dDesc, DType, Layout, MatmulDesc, Precision};

/// Elements per task of the streaming loops: enough to amortise rayon's per-task cost (~1 µs)
/// over work of a few ns per element, small enough (16 KiB of f32) to stay in L1.
const CHUNK: usize = 4096;

/// Below this many multiply-adds per batch, a batched matmul runs one batch per core instead of
/// letting `gemm` split each small product (whose own threading starts around this size).
const SMALL_GEMM: usize = 1 << 18;

/// Typed host storage.
#[derive(Debug)]
enum CpuData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl CpuData {
    fn dtype(&self) -> DType {
        match self {
            CpuData::F32(_) => DType::F32,
            CpuData::F16(_) => DType::F16,
            CpuData::Bf16(_) => DType::Bf16,
        }
    }

    /// The buffer as f32: borrowed when it is stored in f32, widened in parallel otherwise.
    fn as_f32(&self) -> Result<Cow<'_, [f32]>> {
        match self {
            CpuData::F32(v) => Ok(Cow::Borrowed(v)),
            CpuData::F16(v) => widen(v).map(Cow::Owned),
            CpuData::Bf16(v) => widen(v).map(Cow::Owned),
        }
    }
}

/// A storage element type: f32, f16 or bf16, with slice conversions to and from f32.
trait Elem: Copy + Send + Sync + 'static {
    /// The element's slice inside `data`, if `data` holds this type.
    fn of(data: &CpuData) -> Option<&[Self]>;
    /// Writes `src` widened to f32 into `dst` (same length).
    fn widen_into(src: &[Self], dst: &mut [f32]);
    /// Writes `src` rounded (nearest even) to this type into `dst` (same length).
    fn narrow_into(src: &[f32], dst: &mut [Self]);
}

impl Elem for f32 {
    fn of(data: &CpuData) -> Option<&[f32]> {
        match data {
            CpuData::F32(v) => Some(v),
            _ => None,
        }
    }
    fn widen_into(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow_into(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Elem for f16 {
    fn of(data: &CpuData) -> Option<&[f16]> {
        match data {
            CpuData::F16(v) => Some(v),
            _ => None,
        }
    }
    fn widen_into(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow_into(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
}

impl Elem for bf16 {
    fn of(data: &CpuData) -> Option<&[bf16]> {
        match data {
            CpuData::Bf16(v) => Some(v),
            _ => None,
        }
    }
    fn widen_into(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow_into(src: &[f32], dst: &mut [bf16]) {
        dst.convert_from_f32_slice(src);
    }
}

/// The error for a contract the validated ops guarantee but this backend found broken (a bug
/// in tilekit, reported instead of panicking).
fn internal(message: String) -> Error {
    Error::Backend { backend: BackendKind::Cpu, message }
}

/// `data` as a slice of `E`, or an error if the op's buffers do not share one dtype.
fn typed<'a, E: Elem>(data: &'a CpuData, what: &str) -> Result<&'a [E]> {
    E::of(data).ok_or_else(|| internal(format!("{what} is {}, unlike the op's output", data.dtype())))
}

/// A vector of `len` copies of `zero`, or `None` when the allocation fails.
fn zeroed_vec<T: Copy>(len: usize, zero: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, zero);
    Some(v)
}

/// A zeroed f32 scratch buffer; an allocation failure is an error, not an abort.
fn scratch(len: usize) -> Result<Vec<f32>> {
    zeroed_vec(len, 0.0f32).ok_or(Error::OutOfMemory { backend: BackendKind::Cpu, bytes: (len as u64) * 4 })
}

/// `src` widened to f32, in parallel.
fn widen<E: Elem>(src: &[E]) -> Result<Vec<f32>> {
    let mut out = scratch(src.len())?;
    out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| E::widen_into(s, d));
    Ok(out)
}

/// Applies `act` to every element, with the match hoisted out of the loop.
fn apply_activation(act: Activation, v: &mut [f32]) {
    match act {
        Activation::None => {}
        Activation::Relu => v.iter_mut().for_each(|x| *x = Activation::Relu.apply_f32(*x)),
        Activation::Relu6 => v.iter_mut().for_each(|x| *x = Activation::Relu6.apply_f32(*x)),
        Activation::Gelu => v.iter_mut().for_each(|x| *x = Activation::Gelu.apply_f32(*x)),
        Activation::GeluTanh => v.iter_mut().for_each(|x| *x = Activation::GeluTanh.apply_f32(*x)),
    }
}

/// A CPU buffer.
#[derive(Debug, Clone)]
pub(crate) struct CpuStorage {
    data: Arc<RwLock<CpuData>>,
}

impl CpuStorage {
    fn new(data: CpuData) -> CpuStorage {
        CpuStorage { data: Arc::new(RwLock::new(data)) }
    }

    /// The buffer's identity, which is also its place in the lock order.
    fn key(&self) -> usize {
        Arc::as_ptr(&self.data) as usize
    }

    fn read(&self) -> RwLockReadGuard<'_, CpuData> {
        // A poisoned lock means a panic elsewhere mid-write; the data is plain numbers, so the
        // buffer is still memory-safe to use and we carry on.
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, CpuData> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The locks of one op: read guards on its inputs and the write guard on its output, taken in
/// address order (see the module documentation).
struct Locks<'a> {
    reads: Vec<(usize, RwLockReadGuard<'a, CpuData>)>,
    write: RwLockWriteGuard<'a, CpuData>,
}

/// The inputs of a locked op, looked up by storage.
struct Inputs<'g> {
    reads: Vec<(usize, &'g CpuData)>,
}

impl<'g> Inputs<'g> {
    fn get(&self, s: &CpuStorage) -> Result<&'g CpuData> {
        let key = s.key();
        self.reads
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, d)| *d)
            .ok_or_else(|| internal("an input was not locked".into()))
    }
}

impl<'a> Locks<'a> {
    /// Locks `inputs` for reading and `out` for writing, in address order, each buffer once.
    fn take(inputs: &[&'a CpuStorage], out: &'a CpuStorage) -> Result<Locks<'a>> {
        let out_key = out.key();
        if inputs.iter().any(|s| s.key() == out_key) {
            return Err(internal("an input shares the output's buffer".into()));
        }
        let mut order: Vec<&'a CpuStorage> = inputs.iter().copied().chain([out]).collect();
        order.sort_by_key(|s| s.key());
        order.dedup_by_key(|s| s.key());
        let mut reads = Vec::with_capacity(order.len());
        let mut write = None;
        for s in order {
            if s.key() == out_key {
                write = Some(s.write());
            } else {
                reads.push((s.key(), s.read()));
            }
        }
        let write = write.ok_or_else(|| internal("the output was not locked".into()))?;
        Ok(Locks { reads, write })
    }

    /// The inputs and the output, borrowed together.
    fn split(&mut self) -> (Inputs<'_>, &mut CpuData) {
        let reads = self.reads.iter().map(|(k, g)| (*k, &**g)).collect();
        (Inputs { reads }, &mut *self.write)
    }
}

/// The CPU backend.
#[derive(Debug, Default)]
pub(crate) struct CpuBackend;

impl BackendOps for CpuBackend {
    type Storage = CpuStorage;
    const KIND: BackendKind = BackendKind::Cpu;

    fn wrap(storage: CpuStorage) -> super::Storage {
        super::Storage::Cpu(storage)
    }

    fn description(&self) -> String {
        format!("native CPU, {} threads (gemm crate + rayon)", rayon::current_num_threads())
    }

    /// Zeroed memory from the allocator's zeroing path (`calloc`): large buffers come as fresh
    /// pages the OS maps zeroed on first touch, so no pass writes zeros the op then overwrites.
    fn alloc_output(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let oom = |_| Error::OutOfMemory { backend: BackendKind::Cpu, bytes: bytes as u64 };
        Ok(CpuStorage::new(match dtype {
            DType::F32 => CpuData::F32(bytemuck::allocation::try_zeroed_vec(len).map_err(oom)?),
            DType::F16 => CpuData::F16(bytemuck::allocation::try_zeroed_vec(len).map_err(oom)?),
            DType::Bf16 => CpuData::Bf16(bytemuck::allocation::try_zeroed_vec(len).map_err(oom)?),
        }))
    }

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Cpu(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        Ok(())
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let oom = || Error::OutOfMemory { backend: BackendKind::Cpu, bytes: bytes as u64 };
        // `try_reserve_exact` turns an impossible allocation into an error instead of an abort.
        Ok(CpuStorage::new(match dtype {
            DType::F32 => CpuData::F32(zeroed_vec(len, 0.0f32).ok_or_else(oom)?),
            DType::F16 => CpuData::F16(zeroed_vec(len, f16::ZERO).ok_or_else(oom)?),
            DType::Bf16 => CpuData::Bf16(zeroed_vec(len, bf16::ZERO).ok_or_else(oom)?),
        }))
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<CpuStorage> {
        let len = bytes.len() / dtype.size_bytes();
        let storage = self.alloc_zeroed(dtype, len)?;
        let n = len * dtype.size_bytes();
        match &mut *storage.write() {
            CpuData::F32(v) => bytemuck::cast_slice_mut::<f32, u8>(v).copy_from_slice(&bytes[..n]),
            CpuData::F16(v) => bytemuck::cast_slice_mut::<f16, u8>(v).copy_from_slice(&bytes[..n]),
            CpuData::Bf16(v) => bytemuck::cast_slice_mut::<bf16, u8>(v).copy_from_slice(&bytes[..n]),
        }
        Ok(storage)
    }

    fn download(&self, storage: &CpuStorage, _dtype: DType) -> Result<Vec<u8>> {
        Ok(match &*storage.read() {
            CpuData::F32(v) => bytemuck::cast_slice(v).to_vec(),
            CpuData::F16(v) => bytemuck::cast_slice(v).to_vec(),
            CpuData::Bf16(v) => bytemuck::cast_slice(v).to_vec(),
        })
    }

    fn matmul(
        &self,
        desc: &MatmulDesc,
        _dtype: DType,
        a: &CpuStorage,
        b: &CpuStorage,
        bias: Option<&CpuStorage>,
        c: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let inputs: Vec<&CpuStorage> = [Some(a), Some(b), bias, c].into_iter().flatten().collect();
        let mut locks = Locks::take(&inputs, out)?;
        let (ins, out_data) = locks.split();
        let ops = MatmulOperands {
            a: operand(ins.get(a)?, desc.precision)?,
            b: operand(ins.get(b)?, desc.precision)?,
            bias: match (bias, desc.bias_offset) {
                (Some(s), Some(off)) => {
                    let all = ins.get(s)?.as_f32()?;
                    let v = all.get(off..off + desc.n).ok_or_else(|| internal("bias view out of bounds".into()))?;
                    Some(v.to_vec())
                }
                _ => None,
            },
            c: c.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?,
        };
        match out_data {
            CpuData::F32(o) => ops.run(desc, o),
            CpuData::F16(o) => ops.run(desc, o),
            CpuData::Bf16(o) => ops.run(desc, o),
        }
    }

    fn depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        _dtype: DType,
        input: &CpuStorage,
        weight: &CpuStorage,
        bias: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let inputs: Vec<&CpuStorage> = [Some(input), Some(weight), bias].into_iter().flatten().collect();
        let mut locks = Locks::take(&inputs, out)?;
        let (ins, out_data) = locks.split();
        let x = ins.get(input)?.as_f32()?;
        let w = ins.get(weight)?.as_f32()?;
        let bias = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let conv = Conv { d: *desc, x: &x, w: &w, bias: bias.as_deref() };
        match out_data {
            CpuData::F32(o) => conv.run(o),
            CpuData::F16(o) => conv.run(o),
            CpuData::Bf16(o) => conv.run(o),
        }
    }

    fn activation(
        &self,
        desc: &ActivationDesc,
        _dtype: DType,
        x: &CpuStorage,
        bias: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        // In place when x is the output: only the output's write lock, and x is read from it.
        let in_place = x.key() == out.key();
        let inputs: Vec<&CpuStorage> = [(!in_place).then_some(x), bias].into_iter().flatten().collect();
        let mut locks = Locks::take(&inputs, out)?;
        let (ins, out_data) = locks.split();
        let bias = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let x = if in_place { None } else { Some(ins.get(x)?) };
        let act = Act { desc: *desc, bias: bias.as_deref() };
        match out_data {
            CpuData::F32(o) => act.run(x, o),
            CpuData::F16(o) => act.run(x, o),
            CpuData::Bf16(o) => act.run(x, o),
        }
    }

    fn copy(&self, dtype: DType, src: &CpuStorage, dst: &CpuStorage, len: usize) -> Result<()> {
        let mut locks = Locks::take(&[src], dst)?;
        let (ins, out_data) = locks.split();
        let src = ins.get(src)?;
        let n = len * dtype.size_bytes();
        let bytes: &[u8] = match src {
            CpuData::F32(v) => bytemuck::cast_slice(v),
            CpuData::F16(v) => bytemuck::cast_slice(v),
            CpuData::Bf16(v) => bytemuck::cast_slice(v),
        };
        let dst: &mut [u8] = match out_data {
            CpuData::F32(v) => bytemuck::cast_slice_mut(v),
            CpuData::F16(v) => bytemuck::cast_slice_mut(v),
            CpuData::Bf16(v) => bytemuck::cast_slice_mut(v),
        };
        match (dst.get_mut(..n), bytes.get(..n)) {
            (Some(d), Some(s)) => {
                d.par_chunks_mut(1 << 16).zip(s.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
                Ok(())
            }
            _ => Err(internal(format!("copy of {len} elements past a buffer's end"))),
        }
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// A matmul operand as f32: borrowed when stored in f32 and multiplied at full precision;
/// widened, and for the bf16-compute policy rounded to bf16 (nearest even), otherwise.
fn operand(data: &CpuData, precision: Precision) -> Result<Cow<'_, [f32]>> {
    match precision {
        // bf16 storage is already exact in bf16.
        Precision::Bf16 if data.dtype() != DType::Bf16 => {
            let mut v = data.as_f32()?.into_owned();
            v.par_iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32());
            Ok(Cow::Owned(v))
        }
        _ => data.as_f32(),
    }
}

/// A matmul's operands as f32 (borrowed where they are stored in f32).
struct MatmulOperands<'d> {
    a: Cow<'d, [f32]>,
    b: Cow<'d, [f32]>,
    /// The `N` bias values.
    bias: Option<Vec<f32>>,
    /// `C`'s whole buffer.
    c: Option<Cow<'d, [f32]>>,
}

impl MatmulOperands<'_> {
    /// Runs the matmul into `out` (the output buffer, in its storage type).
    fn run<E: Elem>(&self, desc: &MatmulDesc, out: &mut [E]) -> Result<()> {
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let ov = desc.out;
        if desc.batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if m > 1 && ov.ld < n {
            return Err(internal("output leading dimension below N".into()));
        }
        // Each batch's output region: rows at multiples of ld, the last row n long. Validation
        // guarantees the regions are in bounds and, when batch > 1, that consecutive regions
        // (batch_stride apart) do not overlap, so each task can own one.
        let region = (m - 1) * ov.ld.max(n) + n;
        let step = if desc.batch > 1 { ov.batch_stride } else { region };
        if step < region {
            return Err(internal("output batches overlap".into()));
        }
        let end = ov.offset + (desc.batch - 1) * step + region;
        let out = out.get_mut(ov.offset..end).ok_or_else(|| internal("output view out of bounds".into()))?;
        for (name, need, len) in [
            ("a", desc.a.required_len(desc.batch, desc.a_stored().0, desc.a_stored().1), self.a.len()),
            ("b", desc.b.required_len(desc.batch, desc.b_stored().0, desc.b_stored().1), self.b.len()),
        ] {
            if need.is_none_or(|need| need > len) {
                return Err(internal(format!("{name}'s view is out of bounds")));
            }
        }
        if let (Some(cv), Some(c)) = (desc.c, &self.c)
            && cv.required_len(desc.batch, m, n).is_none_or(|need| need > c.len())
        {
            return Err(internal("c's view is out of bounds".into()));
        }
        let small = desc.batch > 1 && m * n * k < SMALL_GEMM;
        let parallelism = if small { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(0) };
        let batch_task = |bt: usize, dst: &mut [E]| -> Result<()> {
            let mut acc = scratch(m * n)?;
            if k > 0 {
                // Row/column strides of op(A) (M × K) and op(B) (K × N) inside the buffers.
                let (a_rs, a_cs) = if desc.trans_a { (1, desc.a.ld) } else { (desc.a.ld, 1) };
                let (b_rs, b_cs) = if desc.trans_b { (1, desc.b.ld) } else { (desc.b.ld, 1) };
                let a0 = desc.a.offset + bt * desc.a.batch_stride;
                let b0 = desc.b.offset + bt * desc.b.batch_stride;
                // SAFETY: the views of A and B were checked above to fit their buffers, so every
                // element (i, p) of op(A) at a0 + i·a_rs + p·a_cs and (p, j) of op(B) lies inside
                // them; the buffers are only read. `acc` is a dense M × N buffer (row stride N,
                // column stride 1) owned by this task. `read_dst` is false, so gemm computes
                // acc = 1·A·B without reading acc.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        acc.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        self.a.as_ptr().add(a0),
                        a_cs as isize,
                        a_rs as isize,
                        self.b.as_ptr().add(b0),
                        b_cs as isize,
                        b_rs as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        parallelism,
                    );
                }
            }
            // The fused epilogue, in f32 as the GPU kernels do it, then one rounding per store.
            let epilogue = |(i, (row, dst)): (usize, (&mut [f32], &mut [E]))| {
                for (j, v) in row.iter_mut().enumerate() {
                    let mut x = desc.alpha * *v;
                    if let Some(bias) = &self.bias {
                        x += bias[j];
                    }
                    if let (Some(cv), Some(c)) = (desc.c, &self.c) {
                        x += desc.beta * c[cv.index(bt, i, j)];
                    }
                    *v = x;
                }
                apply_activation(desc.activation, row);
                E::narrow_into(row, &mut dst[..n]);
            };
            let row_step = if m > 1 { ov.ld } else { n };
            if small {
                acc.chunks_mut(n).zip(dst.chunks_mut(row_step)).enumerate().for_each(epilogue);
            } else {
                acc.par_chunks_mut(n).zip(dst.par_chunks_mut(row_step)).enumerate().for_each(epilogue);
            }
            Ok(())
        };
        if desc.batch == 1 {
            return batch_task(0, out);
        }
        out.par_chunks_mut(step)
            .take(desc.batch)
            .enumerate()
            .try_for_each(|(bt, chunk)| batch_task(bt, &mut chunk[..region]))
    }
}

/// A depthwise convolution over f32 inputs (widened if stored in half precision).
struct Conv<'d> {
    d: Conv2dDesc,
    x: &'d [f32],
    w: &'d [f32],
    bias: Option<&'d [f32]>,
}

/// The output positions `o < out_len` whose tap at offset `off` (`k·dilation`) lands inside an
/// input of `len`: `0 ≤ o·stride + off − pad < len`. Returns `lo..hi` (empty if none).
fn tap_range(out_len: usize, len: usize, stride: usize, pad: usize, off: usize) -> (usize, usize) {
    let lo = pad.saturating_sub(off).div_ceil(stride);
    let hi = len.saturating_add(pad).saturating_sub(off).div_ceil(stride);
    let hi = hi.min(out_len);
    (lo.min(hi), hi)
}

impl Conv<'_> {
    fn run<E: Elem>(&self, out: &mut [E]) -> Result<()> {
        let d = &self.d;
        let (oh, ow) = match (d.out_h(), d.out_w()) {
            (Some(h), Some(w)) => (h, w),
            _ => return Err(internal("an empty conv output reached the backend".into())),
        };
        let occ = d.out_channels();
        let (h, w, c) = (d.height, d.width, d.channels);
        let total = d.batch * occ * oh * ow;
        if self.x.len() < d.batch * c * h * w
            || self.w.len() < occ * d.kernel_h * d.kernel_w
            || self.bias.is_some_and(|b| b.len() < occ)
            || out.len() < total
        {
            return Err(internal("conv buffers are shorter than the descriptor".into()));
        }
        let out = &mut out[..total];
        match d.layout {
            // One output plane per task: it reads one input plane.
            Layout::Nchw => out.par_chunks_mut(oh * ow).enumerate().for_each(|(plane, dst)| {
                let (n, oc) = (plane / occ, plane % occ);
                let xp = &self.x[(n * c + oc / d.multiplier) * h * w..][..h * w];
                let wk = &self.w[oc * d.kernel_h * d.kernel_w..][..d.kernel_h * d.kernel_w];
                let mut acc = vec![0.0f32; ow];
                for (oy, dst_row) in dst.chunks_mut(ow).enumerate() {
                    acc.fill(0.0);
                    for ky in 0..d.kernel_h {
                        let py = oy * d.stride_h + ky * d.dilation_h;
                        if py < d.pad_top || py - d.pad_top >= h {
                            continue;
                        }
                        let xrow = &xp[(py - d.pad_top) * w..][..w];
                        for kx in 0..d.kernel_w {
                            let wv = wk[ky * d.kernel_w + kx];
                            let off = kx * d.dilation_w;
                            let (lo, hi) = tap_range(ow, w, d.stride_w, d.pad_left, off);
                            if lo == hi {
                                continue;
                            }
                            let first = lo * d.stride_w + off - d.pad_left;
                            if d.stride_w == 1 {
                                let xs = &xrow[first..first + (hi - lo)];
                                acc[lo..hi].iter_mut().zip(xs).for_each(|(a, &xv)| *a += xv * wv);
                            } else {
                                let xs = xrow[first..].iter().step_by(d.stride_w);
                                acc[lo..hi].iter_mut().zip(xs).for_each(|(a, &xv)| *a += xv * wv);
                            }
                        }
                    }
                    if let Some(bias) = self.bias {
                        let b = bias[oc];
                        acc.iter_mut().for_each(|a| *a += b);
                    }
                    apply_activation(d.activation, &mut acc);
                    E::narrow_into(&acc, dst_row);
                }
            }),
            // One output row per task, channels innermost so reads and writes are contiguous;
            // the weights transposed to [kh][kw][C·m] so each tap's weights are one run.
            Layout::Nhwc => {
                let taps = d.kernel_h * d.kernel_w;
                let mut wt = vec![0.0f32; taps * occ];
                for oc in 0..occ {
                    for t in 0..taps {
                        wt[t * occ + oc] = self.w[oc * taps + t];
                    }
                }
                out.par_chunks_mut(ow * occ).enumerate().for_each(|(row, dst)| {
                    let (n, oy) = (row / oh, row % oh);
                    let mut acc = vec![0.0f32; ow * occ];
                    for ky in 0..d.kernel_h {
                        let py = oy * d.stride_h + ky * d.dilation_h;
                        if py < d.pad_top || py - d.pad_top >= h {
                            continue;
                        }
                        let xrow = &self.x[(n * h + py - d.pad_top) * w * c..][..w * c];
                        for kx in 0..d.kernel_w {
                            let wk = &wt[(ky * d.kernel_w + kx) * occ..][..occ];
                            let off = kx * d.dilation_w;
                            let (lo, hi) = tap_range(ow, w, d.stride_w, d.pad_left, off);
                            for ox in lo..hi {
                                let ix = ox * d.stride_w + off - d.pad_left;
                                let xs = &xrow[ix * c..][..c];
                                let a = &mut acc[ox * occ..][..occ];
                                if d.multiplier == 1 {
                                    a.iter_mut().zip(xs).zip(wk).for_each(|((a, &xv), &wv)| *a += xv * wv);
                                } else {
                                    for (oc, a) in a.iter_mut().enumerate() {
                                        *a += xs[oc / d.multiplier] * wk[oc];
                                    }
                                }
                            }
                        }
                    }
                    if let Some(bias) = self.bias {
                        acc.chunks_mut(occ).for_each(|px| px.iter_mut().zip(bias).for_each(|(a, &b)| *a += b));
                    }
                    apply_activation(d.activation, &mut acc);
                    E::narrow_into(&acc, dst);
                })
            }
        }
        Ok(())
    }
}

/// An elementwise activation with an optional bias broadcast along the last dimension.
struct Act<'d> {
    desc: ActivationDesc,
    bias: Option<&'d [f32]>,
}

impl Act<'_> {
    /// `out = act(x + bias)`; `x` is `None` in place (read from `out`).
    fn run<E: Elem>(&self, x: Option<&CpuData>, out: &mut [E]) -> Result<()> {
        let len = self.desc.len;
        let x = x.map(|x| typed::<E>(x, "x")).transpose()?;
        let bias = match (self.desc.bias_len, self.bias) {
            (Some(bl), Some(b)) if bl > 0 && b.len() >= bl => Some(&b[..bl]),
            (None, _) => None,
            _ => return Err(internal("activation bias shorter than its length".into())),
        };
        if out.len() < len || x.is_some_and(|x| x.len() < len) {
            return Err(internal("activation buffers shorter than the descriptor".into()));
        }
        let act = self.desc.activation;
        out[..len].par_chunks_mut(CHUNK).enumerate().for_each(|(ci, o)| {
            let base = ci * CHUNK;
            let mut buf = [0.0f32; CHUNK];
            let buf = &mut buf[..o.len()];
            match x {
                Some(x) => E::widen_into(&x[base..base + o.len()], buf),
                None => E::widen_into(o, buf),
            }
            if let Some(b) = bias {
                // Walk the bias cyclically from this chunk's phase instead of a division per element.
                let mut j = base % b.len();
                for v in buf.iter_mut() {
                    *v += b[j];
                    j += 1;
                    if j == b.len() {
                        j = 0;
                    }
                }
            }
            apply_activation(act, buf);
            E::narrow_into(buf, o);
        });
        Ok(())
    }
}
