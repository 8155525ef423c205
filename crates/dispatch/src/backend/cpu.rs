//! The native CPU backend: the fallback every machine has.
//!
//! It is not the reference (that is `tilekit_kernels::reference`, naive and in f64): this is
//! meant to be reasonably fast.
//! The kernels live in `cpu/`, one file per family, compiled per instruction set and picked at
//! run time (`cpu/simd.rs`):
//! - Matmul (`cpu/matmul.rs`, `cpu/gemv.rs`): plain f32 products go straight to the `gemm`
//!   crate, writing into the output view; `M ≤ 16` streams `B` once in either layout with `N`
//!   split across threads; the rest runs as row panels, each a single-threaded `gemm` call
//!   followed at once by the fused epilogue while the panel is in L2. f16 and bf16 operands are
//!   widened to f32 first (in parallel, with `half`'s vectorised slice conversions), because
//!   `gemm`'s own f16 path rounds its result to f16 before the epilogue could see the f32 sum.
//! - Depthwise conv (`cpu/depthwise.rs`): NCHW output rows as vectors with the taps as
//!   broadcast multiply-adds over shifted input rows; NHWC channels as vectors; padding handled
//!   at the borders only; the kernel works in stack buffers (f16/bf16 inputs are widened to
//!   f32 before it, as for matmul).
//! - Activations (`cpu/activation.rs`): vectorised GELU (both forms), ReLU and ReLU6 with the
//!   bias fused, in place on f32 storage and through a stack buffer for half precision.
//!
//! Numerics: every kernel computes in f32 and rounds once (nearest even) when it stores; the
//! activations are `Activation::apply_f32`'s formulas, vectorised within `gelu_error_bound`
//! (see `cpu/activation.rs`); NaN and ±Inf propagate (no fast-math anywhere; fused
//! multiply-adds where the instruction set has them only remove roundings).
//!
//! NaN and Inf, the promise (tested in `tests/tests/nan_inf.rs`): an output that depends on a
//! NaN is NaN; an infinity goes through the matmul and conv as IEEE arithmetic says and
//! through an activation as `Activation::apply_f32` says (NaN stays NaN in every
//! activation); outputs that do not depend on a non-finite input are exactly what they are
//! without it. Subnormals are kept (no flush to zero).
//!
//! Out of memory: every allocation of a tensor or a scratch block is fallible (a `try_reserve`,
//! or [`AlignedBuf::try_zeroed`] for tensors), and a failure is [`Error::OutOfMemory`], never an
//! abort. (The kernels' small fixed per-thread panels, 32–192 KiB, abort as a `Vec` would.)
//!
//! Alignment: the tensors this backend allocates start on a 64-byte boundary (`cpu/aligned.rs`),
//! so the kernels' vectors, stepping from a tensor's first element, do not straddle cache lines.
//!
//! Locking: each buffer sits behind its own `RwLock`. An op takes all its locks at once, in one
//! global order (the buffers' addresses), read locks for inputs and the write lock for the
//! output, each buffer once. Two ops can then never wait on each other in a cycle (the classic
//! lock-ordering argument, which holds whatever the lock modes), an input named twice (A and B
//! in one buffer) is locked once, and in-place activation takes only the write lock. Ops reach
//! the backend validated, so the output never aliases another input of the op.

use super::{BackendOps, BlockArgs, DenseConvDesc, PointwiseArgs, PointwiseDesc};
use crate::{BackendKind, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, GluDesc, InvertedResidualDesc, MatmulDesc, Precision};

mod activation;
mod aligned;
mod block;
pub(crate) mod convert;
mod dense_conv;
mod depthwise;
mod gemv;
mod glu;
mod im2col;
mod matmul;
mod pointwise;
mod pool;
mod qgroup;
mod quant;
mod recycle;
mod simd;
mod small_k;
#[cfg(test)]
mod tests;
mod transpose;

use activation::Act;
use aligned::AlignedBuf;
use depthwise::Conv;
use matmul::MatmulOperands;
use pool::for_each_chunk_mut;

/// Elements per task of the streaming loops: enough to amortise rayon's per-task cost (~1 µs)
/// over work of a few ns per element, small enough (16 KiB of f32) to stay in L1.
const CHUNK: usize = 4096;

/// Host memory of one element type: a buffer tilekit allocated, an engine's `Vec` moved in, or
/// an engine's `Arc<[T]>` adopted without a copy (`Device::tensor_from_arc`).
#[derive(Debug)]
pub(crate) enum HostBuf<T> {
    /// Allocated here, from a 64-byte boundary ([`aligned`]).
    Aligned(AlignedBuf<T>),
    /// An engine's vector, moved in (`Device::tensor_from_vec`), where the engine allocated it.
    Owned(Vec<T>),
    /// Memory shared with the engine. Ops read it in place; they write it only while this is
    /// the last reference (`Arc::get_mut`), since the engine may be reading its own clone.
    Shared(Arc<[T]>),
}

impl<T> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostBuf::Aligned(v) => v,
            HostBuf::Owned(v) => v,
            HostBuf::Shared(a) => a,
        }
    }
}

impl<T> From<Vec<T>> for HostBuf<T> {
    fn from(v: Vec<T>) -> HostBuf<T> {
        HostBuf::Owned(v)
    }
}

impl<T> From<AlignedBuf<T>> for HostBuf<T> {
    fn from(v: AlignedBuf<T>) -> HostBuf<T> {
        HostBuf::Aligned(v)
    }
}

impl<T> HostBuf<T> {
    /// The elements, writable: always for owned memory; for shared memory only while no other
    /// `Arc` points at it, else an error naming the op.
    fn slice_mut(&mut self, op: &'static str) -> Result<&mut [T]> {
        match self {
            HostBuf::Aligned(v) => Ok(v),
            HostBuf::Owned(v) => Ok(v),
            HostBuf::Shared(a) => Arc::get_mut(a).ok_or(Error::InvalidParameter {
                op,
                param: "out",
                reason: "the output is host memory shared with its owner (an Arc<[T]> with other clones); \
                         tilekit writes such memory only while it holds the last reference"
                    .into(),
            }),
        }
    }
}

/// Typed host storage.
#[derive(Debug)]
pub(crate) enum CpuData {
    F32(HostBuf<f32>),
    F16(HostBuf<f16>),
    Bf16(HostBuf<bf16>),
}

impl Drop for CpuData {
    /// A buffer tilekit allocated goes onto its type's shelf for a later op's output
    /// ([`recycle`]).
    fn drop(&mut self) {
        match self {
            CpuData::F32(HostBuf::Aligned(v)) => recycle::give(std::mem::take(v)),
            CpuData::F16(HostBuf::Aligned(v)) => recycle::give(std::mem::take(v)),
            CpuData::Bf16(HostBuf::Aligned(v)) => recycle::give(std::mem::take(v)),
            _ => {}
        }
    }
}

impl CpuData {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            CpuData::F32(_) => DType::F32,
            CpuData::F16(_) => DType::F16,
            CpuData::Bf16(_) => DType::Bf16,
        }
    }

    /// The elements as little-endian bytes, in place.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            CpuData::F32(v) => bytemuck::cast_slice(&v[..]),
            CpuData::F16(v) => bytemuck::cast_slice(&v[..]),
            CpuData::Bf16(v) => bytemuck::cast_slice(&v[..]),
        }
    }

    /// The buffer as f32: borrowed when it is stored in f32, widened in parallel otherwise.
    fn as_f32(&self) -> Result<F32s<'_>> {
        match self {
            CpuData::F32(v) => Ok(F32s::Borrowed(&v[..])),
            CpuData::F16(v) => widen(v),
            CpuData::Bf16(v) => widen(v),
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
    /// The slice itself when this type is f32 (kernels then work in place, without a copy).
    fn as_f32(_s: &[Self]) -> Option<&[f32]> {
        None
    }
    /// The slice itself, mutably, when this type is f32.
    fn as_f32_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    /// The slice itself when this type is f16 (kernels that convert as they load).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_f16(_s: &[Self]) -> Option<&[f16]> {
        None
    }
    /// The slice itself, mutably, when this type is f16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_f16_mut(_s: &mut [Self]) -> Option<&mut [f16]> {
        None
    }
    /// The slice itself when this type is bf16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_bf16(_s: &[Self]) -> Option<&[bf16]> {
        None
    }
    /// The slice itself, mutably, when this type is bf16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_bf16_mut(_s: &mut [Self]) -> Option<&mut [bf16]> {
        None
    }
}

impl Elem for f32 {
    fn of(data: &CpuData) -> Option<&[f32]> {
        match data {
            CpuData::F32(v) => Some(&v[..]),
            _ => None,
        }
    }
    fn widen_into(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow_into(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [f32]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Elem for f16 {
    fn of(data: &CpuData) -> Option<&[f16]> {
        match data {
            CpuData::F16(v) => Some(&v[..]),
            _ => None,
        }
    }
    fn widen_into(src: &[f16], dst: &mut [f32]) {
        convert::f16_to_f32(src, dst);
    }
    fn narrow_into(src: &[f32], dst: &mut [f16]) {
        convert::f32_to_f16(src, dst);
    }
    fn as_f16(s: &[f16]) -> Option<&[f16]> {
        Some(s)
    }
    fn as_f16_mut(s: &mut [f16]) -> Option<&mut [f16]> {
        Some(s)
    }
}

impl Elem for bf16 {
    fn of(data: &CpuData) -> Option<&[bf16]> {
        match data {
            CpuData::Bf16(v) => Some(&v[..]),
            _ => None,
        }
    }
    fn widen_into(src: &[bf16], dst: &mut [f32]) {
        convert::bf16_to_f32(src, dst);
    }
    fn narrow_into(src: &[f32], dst: &mut [bf16]) {
        convert::f32_to_bf16(src, dst);
    }
    fn as_bf16(s: &[bf16]) -> Option<&[bf16]> {
        Some(s)
    }
    fn as_bf16_mut(s: &mut [bf16]) -> Option<&mut [bf16]> {
        Some(s)
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

/// A half-precision buffer widened as [`widen`] does.
fn widen_halves(h: Halves<'_>) -> Result<F32s<'static>> {
    match h {
        Halves::F16(v) => widen(v),
        Halves::Bf16(v) => widen(v),
    }
}

/// `src` widened to f32, in parallel, into a [`scratch_f32`] buffer.
fn widen<E: Elem>(src: &[E]) -> Result<F32s<'static>> {
    let mut out = scratch_f32(src.len())?;
    for_each_chunk_mut(&mut out, CHUNK, |i, d| E::widen_into(&src[i * CHUNK..][..d.len()], d));
    Ok(F32s::Scratch(out))
}

/// An f32 buffer of `len` for an op's widened operand: a freed buffer of that length from the
/// [`recycle`] shelf when there is one, else a new zeroed one. Every element is written before
/// it is read ([`widen`], [`operand`]). A weight of 4096 × 4096 in f16 widened into a new
/// buffer on every call took 40 ms at M = 1 (the 2-core AVX-512 Xeon), most of it the first
/// touch of 64 MB of fresh pages; from the shelf the call repeated takes none of that.
fn scratch_f32(len: usize) -> Result<AlignedBuf<f32>> {
    recycle::take(len)
        .or_else(|| AlignedBuf::try_zeroed(len))
        .ok_or(Error::OutOfMemory { backend: BackendKind::Cpu, bytes: (len as u64) * 4 })
}

/// A matmul's `B` left in half precision, for the product to widen a chunk at a time as it
/// reaches it (`gemv.rs`: the skinny product, `B` stored `N × K` or `K × N`, and the product
/// with a weight packed in strips).
#[derive(Clone, Copy)]
pub(super) enum Halves<'a> {
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl Halves<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Halves::F16(v) => v.len(),
            Halves::Bf16(v) => v.len(),
        }
    }

    /// `dst = self[start ..][..dst.len()]` widened.
    pub(super) fn widen_range(&self, start: usize, dst: &mut [f32]) {
        match self {
            Halves::F16(v) => f16::widen_into(&v[start..start + dst.len()], dst),
            Halves::Bf16(v) => bf16::widen_into(&v[start..start + dst.len()], dst),
        }
    }

    /// `dst`'s rows of `width` = the rows `self[start + r · ld ..][..width]` widened.
    pub(super) fn widen_rows(&self, start: usize, ld: usize, width: usize, dst: &mut [f32]) {
        match self {
            Halves::F16(v) => convert::f16_rows_to_f32(&v[start..], ld, width, dst),
            Halves::Bf16(v) => convert::bf16_rows_to_f32(&v[start..], ld, width, dst),
        }
    }
}

/// A buffer's elements as f32: borrowed where stored in f32, else widened into a scratch
/// buffer that goes back onto the [`recycle`] shelf when this is dropped.
pub(super) enum F32s<'a> {
    Borrowed(&'a [f32]),
    Scratch(AlignedBuf<f32>),
}

impl std::ops::Deref for F32s<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            F32s::Borrowed(v) => v,
            F32s::Scratch(v) => v,
        }
    }
}

impl Drop for F32s<'_> {
    fn drop(&mut self) {
        if let F32s::Scratch(v) = self {
            recycle::give(std::mem::take(v));
        }
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

/// The most inputs an op locks (the inverted-residual block's x, six weights and biases and
/// its two transposed 1 × 1 weights).
const MAX_INPUTS: usize = 9;

/// The locks of one op: read guards on its inputs and the write guard on its output, taken in
/// address order (see the module documentation). Fixed-size arrays, not vectors: a small op
/// allocates nothing to lock its buffers.
struct Locks<'a> {
    reads: [Option<(usize, RwLockReadGuard<'a, CpuData>)>; MAX_INPUTS],
    write: RwLockWriteGuard<'a, CpuData>,
}

/// The inputs of a locked op, looked up by storage.
struct Inputs<'g> {
    reads: [Option<(usize, &'g CpuData)>; MAX_INPUTS],
}

impl<'g> Inputs<'g> {
    fn get(&self, s: &CpuStorage) -> Result<&'g CpuData> {
        let key = s.key();
        self.reads
            .iter()
            .flatten()
            .find(|(k, _)| *k == key)
            .map(|(_, d)| *d)
            .ok_or_else(|| internal("an input was not locked".into()))
    }
}

impl<'a> Locks<'a> {
    /// Locks the present `inputs` for reading and `out` for writing, in address order, each
    /// buffer once.
    fn take(inputs: &[Option<&'a CpuStorage>], out: &'a CpuStorage) -> Result<Locks<'a>> {
        let out_key = out.key();
        let mut order: [&'a CpuStorage; MAX_INPUTS + 1] = [out; MAX_INPUTS + 1];
        let mut len = 1;
        for s in inputs.iter().flatten() {
            if s.key() == out_key {
                return Err(internal("an input shares the output's buffer".into()));
            }
            if len > MAX_INPUTS {
                return Err(internal(format!("an op locked more than {MAX_INPUTS} inputs")));
            }
            order[len] = s;
            len += 1;
        }
        let order = &mut order[..len];
        order.sort_unstable_by_key(|s| s.key());
        let mut reads: [Option<(usize, RwLockReadGuard<'a, CpuData>)>; MAX_INPUTS] = Default::default();
        let mut write = None;
        let (mut n, mut last) = (0, None);
        for s in order.iter() {
            let key = s.key();
            if last == Some(key) {
                continue;
            }
            last = Some(key);
            if key == out_key {
                write = Some(s.write());
            } else {
                reads[n] = Some((key, s.read()));
                n += 1;
            }
        }
        let write = write.ok_or_else(|| internal("the output was not locked".into()))?;
        Ok(Locks { reads, write })
    }

    /// The inputs and the output, borrowed together.
    fn split(&mut self) -> (Inputs<'_>, &mut CpuData) {
        let mut reads: [Option<(usize, &CpuData)>; MAX_INPUTS] = [None; MAX_INPUTS];
        for (r, g) in reads.iter_mut().zip(&self.reads) {
            *r = g.as_ref().map(|(k, g)| (*k, &**g));
        }
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

    /// A freed buffer of exactly this length from [`recycle`]'s shelves (its old numbers, NaN
    /// in debug builds), else zeroed memory from the allocator's zeroing path (`calloc`).
    fn alloc_output(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let oom = || Error::OutOfMemory { backend: BackendKind::Cpu, bytes: bytes as u64 };
        fn reuse_or_zeroed<T: recycle::Recycle + bytemuck::Zeroable>(len: usize) -> Option<AlignedBuf<T>> {
            recycle::take(len).or_else(|| AlignedBuf::try_zeroed(len))
        }
        Ok(CpuStorage::new(match dtype {
            DType::F32 => CpuData::F32(reuse_or_zeroed(len).ok_or_else(oom)?.into()),
            DType::F16 => CpuData::F16(reuse_or_zeroed(len).ok_or_else(oom)?.into()),
            DType::Bf16 => CpuData::Bf16(reuse_or_zeroed(len).ok_or_else(oom)?.into()),
            other => return Err(unsupported_dtype("alloc", other)),
        }))
    }

    fn storage_of(storage: &super::Storage) -> Option<&Self::Storage> {
        match storage {
            super::Storage::Cpu(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 | DType::F16 | DType::Bf16 => Ok(()),
            other => Err(unsupported_dtype(op, other)),
        }
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<CpuStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let oom = || Error::OutOfMemory { backend: BackendKind::Cpu, bytes: bytes as u64 };
        // A failed allocation is an error instead of an abort.
        Ok(CpuStorage::new(match dtype {
            DType::F32 => CpuData::F32(AlignedBuf::<f32>::try_zeroed(len).ok_or_else(oom)?.into()),
            DType::F16 => CpuData::F16(AlignedBuf::<f16>::try_zeroed(len).ok_or_else(oom)?.into()),
            DType::Bf16 => CpuData::Bf16(AlignedBuf::<bf16>::try_zeroed(len).ok_or_else(oom)?.into()),
            other => return Err(unsupported_dtype("alloc", other)),
        }))
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<CpuStorage> {
        let len = bytes.len() / dtype.size_bytes();
        let storage = self.alloc_zeroed(dtype, len)?;
        let n = len * dtype.size_bytes();
        match &mut *storage.write() {
            CpuData::F32(v) => bytemuck::cast_slice_mut::<f32, u8>(v.slice_mut("upload")?).copy_from_slice(&bytes[..n]),
            CpuData::F16(v) => bytemuck::cast_slice_mut::<f16, u8>(v.slice_mut("upload")?).copy_from_slice(&bytes[..n]),
            CpuData::Bf16(v) => {
                bytemuck::cast_slice_mut::<bf16, u8>(v.slice_mut("upload")?).copy_from_slice(&bytes[..n])
            }
        }
        Ok(storage)
    }

    /// The engine's vector or `Arc<[T]>` becomes the buffer itself: no copy.
    fn adopt_host(&self, data: CpuData) -> Result<CpuStorage> {
        Ok(CpuStorage::new(data))
    }

    fn with_host_data(&self, storage: &CpuStorage, f: &mut dyn FnMut(&CpuData)) -> bool {
        f(&storage.read());
        true
    }

    fn download(&self, storage: &CpuStorage, _dtype: DType) -> Result<Vec<u8>> {
        Ok(match &*storage.read() {
            CpuData::F32(v) => bytemuck::cast_slice(&v[..]).to_vec(),
            CpuData::F16(v) => bytemuck::cast_slice(&v[..]).to_vec(),
            CpuData::Bf16(v) => bytemuck::cast_slice(&v[..]).to_vec(),
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
        matmul(desc, a, b, false, bias, c, out)
    }

    fn matmul_strips(
        &self,
        desc: &MatmulDesc,
        _dtype: DType,
        a: &CpuStorage,
        strips: &CpuStorage,
        bias: Option<&CpuStorage>,
        c: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        matmul(desc, a, strips, true, bias, c, out)
    }

    fn matmul_quant(
        &self,
        desc: &MatmulDesc,
        _dtype: DType,
        a: &CpuStorage,
        w: &super::QuantView<'_, CpuStorage>,
        bias: Option<&CpuStorage>,
        c: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let mut locks = Locks::take(&[Some(a), Some(w.scales), Some(w.body), bias, c], out)?;
        let (ins, out_data) = locks.split();
        let plane = |s: &CpuStorage| -> Result<&[u8]> {
            match ins.get(s)? {
                CpuData::F32(v) => Ok(bytemuck::cast_slice(v)),
                _ => Err(internal("a quantized plane is not a word buffer".into())),
            }
        };
        let a_f32 = ins.get(a)?.as_f32()?;
        let bias_f32 = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let c_f32 = c.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let ops = quant::QuantOperands {
            a: &a_f32,
            w: quant::QWeights { ty: w.ty, n: w.n, k: w.k, scales: plane(w.scales)?, body: plane(w.body)? },
            bias: bias_f32.as_deref(),
            c: c_f32.as_deref(),
        };
        match out_data {
            CpuData::F32(o) => ops.run(desc, o.slice_mut("matmul_quant")?),
            CpuData::F16(o) => ops.run(desc, o.slice_mut("matmul_quant")?),
            CpuData::Bf16(o) => ops.run(desc, o.slice_mut("matmul_quant")?),
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
        depthwise(desc, input, weight, false, bias, out)
    }

    /// The kernels read the packed `[kh, kw, C·m]` weights themselves: NHWC and the NCHW tile
    /// as they are, the NCHW band and row kernels after one transposition per call into a
    /// per-thread buffer.
    fn depthwise_conv2d_packed(
        &self,
        desc: &Conv2dDesc,
        _dtype: DType,
        input: &CpuStorage,
        weight: &CpuStorage,
        bias: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        depthwise(desc, input, weight, true, bias, out)
    }

    /// NCHW always; NHWC from [`pointwise::NHWC_MIN_PIXELS`] pixels (below, the matmul path
    /// was faster on MobileNetV2's 7² and 14² layers).
    fn has_pointwise(&self, desc: &PointwiseDesc) -> bool {
        desc.layout == tilekit_kernels::Layout::Nchw
            || desc.batch * desc.pixels >= pointwise::NHWC_MIN_PIXELS
            || pointwise::channel_ranges(desc, rayon::current_num_threads()) > 1
    }

    /// Blocks of pixels, each a gemm call into outputs preset to bias + residual
    /// (`cpu/pointwise.rs`).
    fn pointwise(
        &self,
        desc: &PointwiseDesc,
        _dtype: DType,
        args: &PointwiseArgs<'_, CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let mut locks = Locks::take(&[Some(args.x), Some(args.weight), args.bias, args.residual], out)?;
        let (ins, out_data) = locks.split();
        let f32_of = |s: &CpuStorage| ins.get(s).and_then(CpuData::as_f32);
        let x = f32_of(args.x)?;
        let w = f32_of(args.weight)?;
        let bias = args.bias.map(f32_of).transpose()?;
        let residual = args.residual.map(f32_of).transpose()?;
        let pw = pointwise::Pointwise { d: *desc, x: &x, w: &w, bias: bias.as_deref(), residual: residual.as_deref() };
        match out_data {
            CpuData::F32(o) => pw.run(o.slice_mut("pointwise_conv2d")?),
            CpuData::F16(o) => pw.run(o.slice_mut("pointwise_conv2d")?),
            CpuData::Bf16(o) => pw.run(o.slice_mut("pointwise_conv2d")?),
        }
    }

    fn has_im2col(&self) -> bool {
        true
    }

    /// A gather in the storage type (`cpu/im2col.rs`), not the one-hot convolution.
    fn im2col(&self, desc: &Conv2dDesc, _dtype: DType, input: &CpuStorage, out: &CpuStorage) -> Result<()> {
        let mut locks = Locks::take(&[Some(input)], out)?;
        let (ins, out_data) = locks.split();
        match (ins.get(input)?, out_data) {
            (CpuData::F32(x), CpuData::F32(o)) => im2col::gather_f32(desc, x, o.slice_mut("im2col")?)?,
            (CpuData::F16(x), CpuData::F16(o)) => im2col::gather(desc, x, f16::ZERO, o.slice_mut("im2col")?)?,
            (CpuData::Bf16(x), CpuData::Bf16(o)) => im2col::gather(desc, x, bf16::ZERO, o.slice_mut("im2col")?)?,
            _ => return Err(internal("im2col input and output dtypes differ".into())),
        }
        Ok(())
    }

    /// Reductions (`Cin·kh·kw`) up to `small_k::SMALL_K` (32) with AVX2 or AVX-512: the direct kernel
    /// (`cpu/dense_conv.rs`).
    fn has_conv2d(&self, desc: &DenseConvDesc) -> bool {
        dense_conv::takes(desc)
    }

    fn conv2d(
        &self,
        desc: &DenseConvDesc,
        _dtype: DType,
        input: &CpuStorage,
        weight: &CpuStorage,
        bias: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let mut locks = Locks::take(&[Some(input), Some(weight), bias], out)?;
        let (ins, out_data) = locks.split();
        let x = ins.get(input)?.as_f32()?;
        let w = ins.get(weight)?.as_f32()?;
        let bias = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let conv = dense_conv::DenseConv { d: *desc, x: &x, w: &w, bias: bias.as_deref() };
        match out_data {
            CpuData::F32(o) => conv.run(o.slice_mut("conv2d")?),
            CpuData::F16(o) => conv.run(o.slice_mut("conv2d")?),
            CpuData::Bf16(o) => conv.run(o.slice_mut("conv2d")?),
        }
    }

    fn inverted_residual(
        &self,
        desc: &InvertedResidualDesc,
        _dtype: DType,
        args: &BlockArgs<'_, CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let a = args;
        let [x, e, eb, d, db, p, pb] = a.given();
        let all = [x, e, eb, d, db, p, pb, a.expand_t, a.project_t];
        let mut locks = Locks::take(&all, out)?;
        let (ins, out_data) = locks.split();
        let f32_of = |s: &CpuStorage| ins.get(s).and_then(CpuData::as_f32);
        let opt = |s: Option<&CpuStorage>| s.map(f32_of).transpose();
        let x = f32_of(a.x)?;
        let (we, be) = (opt(a.expand)?, opt(a.expand_bias)?);
        let (wd, bd) = (f32_of(a.depthwise)?, opt(a.depthwise_bias)?);
        let (wp, bp) = (f32_of(a.project)?, opt(a.project_bias)?);
        let (wet, wpt) = (opt(a.expand_t)?, opt(a.project_t)?);
        let block = block::Block {
            d: *desc,
            x: &x,
            expand: we.as_deref().map(|w| (w, be.as_deref())),
            dw: (&wd, bd.as_deref()),
            project: (&wp, bp.as_deref()),
            transposed: wpt.as_deref().map(|project| block::Transposed { expand: wet.as_deref(), project }),
        };
        match out_data {
            CpuData::F32(o) => block.run(o.slice_mut("inverted_residual")?),
            CpuData::F16(o) => block.run(o.slice_mut("inverted_residual")?),
            CpuData::Bf16(o) => block.run(o.slice_mut("inverted_residual")?),
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
        let mut locks = Locks::take(&[(!in_place).then_some(x), bias], out)?;
        let (ins, out_data) = locks.split();
        let bias = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
        let x = if in_place { None } else { Some(ins.get(x)?) };
        let act = Act { desc: *desc, bias: bias.as_deref() };
        match out_data {
            CpuData::F32(o) => act.run(x, o.slice_mut("activation")?),
            CpuData::F16(o) => act.run(x, o.slice_mut("activation")?),
            CpuData::Bf16(o) => act.run(x, o.slice_mut("activation")?),
        }
    }

    fn glu(&self, desc: &GluDesc, _dtype: DType, h: &CpuStorage, out: &CpuStorage) -> Result<()> {
        let mut locks = Locks::take(&[Some(h)], out)?;
        let (ins, out_data) = locks.split();
        let h = ins.get(h)?;
        match out_data {
            CpuData::F32(o) => glu::run(desc, typed(h, "h")?, o.slice_mut("glu")?),
            CpuData::F16(o) => glu::run(desc, typed(h, "h")?, o.slice_mut("glu")?),
            CpuData::Bf16(o) => glu::run(desc, typed(h, "h")?, o.slice_mut("glu")?),
        }
    }

    fn copy(&self, dtype: DType, src: &CpuStorage, dst: &CpuStorage, len: usize) -> Result<()> {
        let mut locks = Locks::take(&[Some(src)], dst)?;
        let (ins, out_data) = locks.split();
        let src = ins.get(src)?;
        let n = len * dtype.size_bytes();
        let bytes: &[u8] = match src {
            CpuData::F32(v) => bytemuck::cast_slice(&v[..]),
            CpuData::F16(v) => bytemuck::cast_slice(&v[..]),
            CpuData::Bf16(v) => bytemuck::cast_slice(&v[..]),
        };
        let dst: &mut [u8] = match out_data {
            CpuData::F32(v) => bytemuck::cast_slice_mut(v.slice_mut("copy")?),
            CpuData::F16(v) => bytemuck::cast_slice_mut(v.slice_mut("copy")?),
            CpuData::Bf16(v) => bytemuck::cast_slice_mut(v.slice_mut("copy")?),
        };
        match (dst.get_mut(..n), bytes.get(..n)) {
            (Some(d), Some(s)) => {
                for_each_chunk_mut(d, 1 << 16, |i, d| d.copy_from_slice(&s[(i << 16)..][..d.len()]));
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
fn operand(data: &CpuData, precision: Precision) -> Result<F32s<'_>> {
    match precision {
        // bf16 storage is already exact in bf16.
        Precision::Bf16 if data.dtype() != DType::Bf16 => {
            let src = data.as_f32()?;
            let mut v = scratch_f32(src.len())?;
            v.par_iter_mut().zip(src.par_iter()).for_each(|(v, x)| *v = bf16::from_f32(*x).to_f32());
            Ok(F32s::Scratch(v))
        }
        _ => data.as_f32(),
    }
}

/// A storage dtype the CPU backend has no kernels for (`DType` is `#[non_exhaustive]`: every
/// dtype there is today is supported).
fn unsupported_dtype(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType { op, dtype, backend: BackendKind::Cpu, reason: "no CPU storage for it".into() }
}

/// [`BackendOps::matmul`] on the CPU; `strips`: `b` is a weight packed in strips
/// (`crate::PackedMatmul`).
fn matmul(
    desc: &MatmulDesc,
    a: &CpuStorage,
    b: &CpuStorage,
    strips: bool,
    bias: Option<&CpuStorage>,
    c: Option<&CpuStorage>,
    out: &CpuStorage,
) -> Result<()> {
    let mut locks = Locks::take(&[Some(a), Some(b), bias, c], out)?;
    let (ins, out_data) = locks.split();
    let bias_f32 = match (bias, desc.bias_offset) {
        (Some(s), Some(off)) => {
            let all = ins.get(s)?.as_f32()?;
            if off.checked_add(desc.n).is_none_or(|end| end > all.len()) {
                return Err(internal("bias view out of bounds".into()));
            }
            Some((all, off))
        }
        _ => None,
    };
    // A half-precision `B` in a skinny product (either layout), or packed in strips, stays as
    // it is: the product widens each chunk of it as it reaches it (`MatmulOperands::skinny`,
    // `strips_product`), so `B` is read once, at 2 bytes an element, rather than widened whole
    // and read again.
    let b_data = ins.get(b)?;
    let rounds = desc.precision == Precision::Bf16 && b_data.dtype() != DType::Bf16;
    let skinny = desc.m <= matmul::SKINNY_M;
    let stream = !rounds && desc.k > 0 && (strips || skinny);
    let (b_f32, b_half) = match (stream, b_data) {
        (true, CpuData::F16(v)) => (F32s::Borrowed(&[]), Some(Halves::F16(&v[..]))),
        (true, CpuData::Bf16(v)) => (F32s::Borrowed(&[]), Some(Halves::Bf16(&v[..]))),
        _ => (operand(b_data, desc.precision)?, None),
    };
    let ops = MatmulOperands {
        a: operand(ins.get(a)?, desc.precision)?,
        b: b_f32,
        b_half,
        bias: bias_f32.as_ref().map(|(all, off)| &all[*off..*off + desc.n]),
        c: c.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?,
        strips,
    };
    match out_data {
        CpuData::F32(o) => ops.run(desc, o.slice_mut("matmul")?),
        CpuData::F16(o) => ops.run(desc, o.slice_mut("matmul")?),
        CpuData::Bf16(o) => ops.run(desc, o.slice_mut("matmul")?),
    }
}

/// [`BackendOps::depthwise_conv2d`] on the CPU; `packed`: `weight` is `[kh, kw, C·m]`.
fn depthwise(
    desc: &Conv2dDesc,
    input: &CpuStorage,
    weight: &CpuStorage,
    packed: bool,
    bias: Option<&CpuStorage>,
    out: &CpuStorage,
) -> Result<()> {
    let mut locks = Locks::take(&[Some(input), Some(weight), bias], out)?;
    let (ins, out_data) = locks.split();
    // A half-precision input stays as it is stored: the NHWC 3 × 3 rows and every NCHW kernel
    // widen what each task reads, and `Conv::run_kernel` widens it whole for the other kernels.
    let (x, xh) = match ins.get(input)? {
        CpuData::F16(v) => (F32s::Borrowed(&[]), Some(Halves::F16(&v[..]))),
        CpuData::Bf16(v) => (F32s::Borrowed(&[]), Some(Halves::Bf16(&v[..]))),
        data => (data.as_f32()?, None),
    };
    let w = ins.get(weight)?.as_f32()?;
    let bias = bias.map(|s| ins.get(s).and_then(CpuData::as_f32)).transpose()?;
    let conv = Conv { d: *desc, x: &x, xh, w: &w, packed, bias: bias.as_deref() };
    match out_data {
        CpuData::F32(o) => conv.run(o.slice_mut("depthwise_conv2d")?),
        CpuData::F16(o) => conv.run(o.slice_mut("depthwise_conv2d")?),
        CpuData::Bf16(o) => conv.run(o.slice_mut("depthwise_conv2d")?),
    }
}
