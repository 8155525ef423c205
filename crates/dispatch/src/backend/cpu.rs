//! The native CPU backend: the fallback every machine has.
//!
//! It is not the reference (that is `tilekit_kernels::reference`, naive and in f64): this is
//! meant to be reasonably fast. Matmul goes through the `gemm` crate with f32 accumulation;
//! depthwise conv and activations are loops parallelised over all cores with rayon. Half
//! precision is widened to f32 with `half`'s vectorised slice conversions, computed in f32 and
//! rounded once (nearest even) when stored.
//!
//! Locking: each buffer sits behind its own `RwLock`, and an op never holds two locks at once.
//! Inputs are read (and widened) under a short read lock, results are computed into a dense
//! scratch buffer, then scattered into the output under one write lock. That makes aliasing
//! between inputs harmless and in-place activation simple.

use super::BackendOps;
use crate::{BackendKind, Error, Result};
use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;
use std::sync::{Arc, RwLock};
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, Layout, MatmulDesc, Precision};

/// Typed host storage.
#[derive(Debug)]
enum CpuData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, CpuData> {
        // A poisoned lock means a panic elsewhere mid-write; the data is plain numbers, so the
        // buffer is still memory-safe to use and we carry on.
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, CpuData> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The whole buffer widened to f32.
    fn to_f32(&self) -> Vec<f32> {
        match &*self.read() {
            CpuData::F32(v) => v.clone(),
            CpuData::F16(v) => v.to_f32_vec(),
            CpuData::Bf16(v) => v.to_f32_vec(),
        }
    }

    /// Writes `values[i]` to element `index(i)` for every `i`, rounding once to the storage
    /// dtype.
    fn scatter(&self, values: &[f32], index: impl Fn(usize) -> usize) {
        match &mut *self.write() {
            CpuData::F32(v) => values.iter().enumerate().for_each(|(i, &x)| v[index(i)] = x),
            CpuData::F16(v) => values.iter().enumerate().for_each(|(i, &x)| v[index(i)] = f16::from_f32(x)),
            CpuData::Bf16(v) => values.iter().enumerate().for_each(|(i, &x)| v[index(i)] = bf16::from_f32(x)),
        }
    }

    /// Replaces the first `values.len()` elements, rounding once to the storage dtype.
    fn store_dense(&self, values: &[f32]) {
        match &mut *self.write() {
            CpuData::F32(v) => v[..values.len()].copy_from_slice(values),
            CpuData::F16(v) => v[..values.len()].convert_from_f32_slice(values),
            CpuData::Bf16(v) => v[..values.len()].convert_from_f32_slice(values),
        }
    }
}

/// The CPU backend.
#[derive(Debug, Default)]
pub(crate) struct CpuBackend;

impl CpuBackend {
    pub(crate) fn description(&self) -> String {
        format!("native CPU, {} threads (gemm crate + rayon)", rayon::current_num_threads())
    }
}

impl BackendOps for CpuBackend {
    type Storage = CpuStorage;

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
        match &mut *storage.write() {
            CpuData::F32(v) => bytemuck::cast_slice_mut::<f32, u8>(v).copy_from_slice(bytes),
            CpuData::F16(v) => bytemuck::cast_slice_mut::<f16, u8>(v).copy_from_slice(bytes),
            CpuData::Bf16(v) => bytemuck::cast_slice_mut::<bf16, u8>(v).copy_from_slice(bytes),
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
        let (m, n, k) = (desc.m, desc.n, desc.k);
        let mut a = a.to_f32();
        let mut b = b.to_f32();
        if desc.precision == Precision::Bf16 {
            // Products of bf16-rounded inputs, f32 sums: the tensor-core policy.
            for v in [&mut a, &mut b] {
                v.par_iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32());
            }
        }
        let bias = bias.map(CpuStorage::to_f32);
        let c = c.map(CpuStorage::to_f32);
        let mut result = vec![0.0f32; desc.batch * m * n];
        for bt in 0..desc.batch {
            let acc = &mut result[bt * m * n..(bt + 1) * m * n];
            if k > 0 {
                // Row/column strides of op(A) (M × K) and op(B) (K × N) inside the buffers.
                let (a_rs, a_cs) = if desc.trans_a { (1, desc.a.ld) } else { (desc.a.ld, 1) };
                let (b_rs, b_cs) = if desc.trans_b { (1, desc.b.ld) } else { (desc.b.ld, 1) };
                let a0 = desc.a.offset + bt * desc.a.batch_stride;
                let b0 = desc.b.offset + bt * desc.b.batch_stride;
                // SAFETY: the op was validated, so every element (i, p) of op(A) at
                // a0 + i·a_rs + p·a_cs and (p, j) of op(B) lies inside `a` and `b`, and `acc`
                // is a dense M × N buffer (row stride N, column stride 1). `read_dst` is false,
                // so gemm computes acc = 1·A·B without reading acc.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        acc.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr().add(a0),
                        a_cs as isize,
                        a_rs as isize,
                        b.as_ptr().add(b0),
                        b_cs as isize,
                        b_rs as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(0),
                    );
                }
            }
            // The fused epilogue, in f32 as the GPU kernels do it.
            acc.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, row)| {
                for (j, v) in row.iter_mut().enumerate() {
                    let mut x = desc.alpha * *v;
                    if let (Some(off), Some(bias)) = (desc.bias_offset, &bias) {
                        x += bias[off + j];
                    }
                    if let (Some(cv), Some(c)) = (desc.c, &c) {
                        x += desc.beta * c[cv.index(bt, i, j)];
                    }
                    *v = desc.activation.apply_f32(x);
                }
            });
        }
        out.scatter(&result, |idx| {
            let (bt, rem) = (idx / (m * n), idx % (m * n));
            desc.out.index(bt, rem / n, rem % n)
        });
        Ok(())
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
        let x = input.to_f32();
        let w = weight.to_f32();
        let bias = bias.map(CpuStorage::to_f32);
        let (oh, ow) = match (desc.out_h(), desc.out_w()) {
            (Some(h), Some(w)) => (h, w),
            _ => return Ok(()), // validated: cannot happen for a non-empty output
        };
        let occ = desc.out_channels();
        let mut result = vec![0.0f32; desc.batch * occ * oh * ow];
        let d = *desc;
        // Output value at (n, oc, oy, ox); taps outside the input read zero.
        let point = |n: usize, oc: usize, oy: usize, ox: usize| -> f32 {
            let ic = oc / d.multiplier;
            let mut acc = 0.0f32;
            for ky in 0..d.kernel_h {
                let py = oy * d.stride_h + ky * d.dilation_h;
                if py < d.pad_top || py - d.pad_top >= d.height {
                    continue;
                }
                let iy = py - d.pad_top;
                for kx in 0..d.kernel_w {
                    let px = ox * d.stride_w + kx * d.dilation_w;
                    if px < d.pad_left || px - d.pad_left >= d.width {
                        continue;
                    }
                    let ix = px - d.pad_left;
                    acc += x[d.input_index(n, ic, iy, ix)] * w[(oc * d.kernel_h + ky) * d.kernel_w + kx];
                }
            }
            if let Some(bias) = &bias {
                acc += bias[oc];
            }
            d.activation.apply_f32(acc)
        };
        match desc.layout {
            // One output plane per task: each reads one input plane.
            Layout::Nchw => result.par_chunks_mut(oh * ow).enumerate().for_each(|(plane, dst)| {
                let (n, oc) = (plane / occ, plane % occ);
                for oy in 0..oh {
                    for ox in 0..ow {
                        dst[oy * ow + ox] = point(n, oc, oy, ox);
                    }
                }
            }),
            // One output row per task; channels innermost so reads and writes are contiguous.
            Layout::Nhwc => result.par_chunks_mut(ow * occ).enumerate().for_each(|(row, dst)| {
                let (n, oy) = (row / oh, row % oh);
                for ox in 0..ow {
                    for oc in 0..occ {
                        dst[ox * occ + oc] = point(n, oc, oy, ox);
                    }
                }
            }),
        }
        out.store_dense(&result);
        Ok(())
    }

    fn activation(
        &self,
        desc: &ActivationDesc,
        _dtype: DType,
        x: &CpuStorage,
        bias: Option<&CpuStorage>,
        out: &CpuStorage,
    ) -> Result<()> {
        let mut v = x.to_f32();
        v.truncate(desc.len);
        let bias = bias.map(CpuStorage::to_f32);
        let act = desc.activation;
        // Chunks of 4096 elements amortise rayon's task cost over work that is a few ns each.
        const CHUNK: usize = 4096;
        v.par_chunks_mut(CHUNK).enumerate().for_each(|(ci, chunk)| {
            let base = ci * CHUNK;
            match (desc.bias_len, &bias) {
                (Some(len), Some(bias)) => {
                    for (i, e) in chunk.iter_mut().enumerate() {
                        *e = act.apply_f32(*e + bias[(base + i) % len]);
                    }
                }
                _ => chunk.iter_mut().for_each(|e| *e = act.apply_f32(*e)),
            }
        });
        out.store_dense(&v);
        Ok(())
    }

    fn copy(&self, _dtype: DType, src: &CpuStorage, dst: &CpuStorage, len: usize) -> Result<()> {
        // Read under one lock, write under another: never two locks at once.
        let bytes = self.download(src, _dtype)?;
        let n = len * _dtype.size_bytes();
        match &mut *dst.write() {
            CpuData::F32(v) => bytemuck::cast_slice_mut::<f32, u8>(v)[..n].copy_from_slice(&bytes[..n]),
            CpuData::F16(v) => bytemuck::cast_slice_mut::<f16, u8>(v)[..n].copy_from_slice(&bytes[..n]),
            CpuData::Bf16(v) => bytemuck::cast_slice_mut::<bf16, u8>(v)[..n].copy_from_slice(&bytes[..n]),
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// A vector of `len` copies of `zero`, or `None` when the allocation fails.
fn zeroed_vec<T: Copy>(len: usize, zero: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, zero);
    Some(v)
}
