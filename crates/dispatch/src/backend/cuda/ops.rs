//! [`BackendOps`] for the CUDA backend: allocation, copies between host and device, and each
//! op's choice of kernel.

use super::buffers::CudaMem;
use super::driver::{map_err, version_string};
use super::launch::{stride_blocks, to_i64};
use super::{CudaBackend, CudaStorage, KIND};
use crate::backend::{BackendOps, BlockArgs, QuantView};
use crate::{BackendKind, Error, Result};
use cudarc::driver::result;
use tilekit_kernels::catalogue::cuda as cat;
use tilekit_kernels::{ActivationDesc, Conv2dDesc, DType, GluDesc, InvertedResidualDesc, MatmulDesc};

impl BackendOps for CudaBackend {
    type Storage = CudaStorage;
    const KIND: BackendKind = KIND;

    fn wrap(storage: CudaStorage) -> crate::backend::Storage {
        crate::backend::Storage::Cuda(storage)
    }

    fn description(&self) -> String {
        format!(
            "{} (CUDA device {}, sm_{}{}, {} SMs, driver API {})",
            self.name,
            self.ctx.ordinal(),
            self.cc.0,
            self.cc.1,
            self.sms,
            version_string(self.driver_api)
        )
    }

    /// Device memory without the memset: the op writes every element before anything reads
    /// the buffer, and device memory is never host memory the process could read unset.
    fn alloc_output(&self, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        let alloc = bytes.max(16).div_ceil(16) * 16;
        // SAFETY: the memory is unset; `alloc_output` is called only for outputs an op writes
        // in full before they are read (`Device::output_tensor`), and device memory is only
        // ever read back by copies, never dereferenced on the host.
        let buf = unsafe { self.stream.alloc::<u8>(alloc) }.map_err(|e| match map_err("alloc", e) {
            Error::OutOfMemory { backend, .. } => Error::OutOfMemory { backend, bytes: alloc as u64 },
            other => other,
        })?;
        Ok(CudaStorage { mem: CudaMem::Own(buf), bytes })
    }

    fn storage_of(storage: &crate::backend::Storage) -> Option<&Self::Storage> {
        match storage {
            crate::backend::Storage::Cuda(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn check_dtype(&self, _op: &'static str, _dtype: DType) -> Result<()> {
        // Every dtype runs on every GPU this backend accepts (sm_80+ has f16 and bf16 tensor
        // cores and conversions).
        Ok(())
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: "alloc", what: format!("{len} elements of {dtype}") })?;
        // Never an empty allocation (the driver rejects size 0), and whole 16-byte vectors.
        let alloc = bytes.max(16).div_ceil(16) * 16;
        let buf = self.stream.alloc_zeros::<u8>(alloc).map_err(|e| match map_err("alloc", e) {
            Error::OutOfMemory { backend, .. } => Error::OutOfMemory { backend, bytes: alloc as u64 },
            other => other,
        })?;
        Ok(CudaStorage { mem: CudaMem::Own(buf), bytes })
    }

    fn upload(&self, dtype: DType, bytes: &[u8]) -> Result<CudaStorage> {
        let mut s = self.alloc_zeroed(dtype, bytes.len() / dtype.size_bytes())?;
        if !bytes.is_empty()
            && let CudaMem::Own(buf) = &mut s.mem
        {
            let mut view = buf.slice_mut(0..bytes.len());
            // From pageable host memory CUDA waits for the stream's earlier work, then copies
            // through a staging buffer and returns once `bytes` has been read: the one host wait
            // outside `download` and `synchronize` (an upload, never an op; see the module
            // documentation).
            self.stream.memcpy_htod(bytes, &mut view).map_err(|e| map_err("upload", e))?;
        }
        s.bytes = bytes.len();
        Ok(s)
    }

    fn download(&self, s: &CudaStorage, _dtype: DType) -> Result<Vec<u8>> {
        if s.bytes == 0 {
            return Ok(Vec::new());
        }
        let v = match &s.mem {
            CudaMem::Own(buf) => {
                let view = buf.slice(0..s.bytes);
                self.stream.clone_dtoh(&view).map_err(|e| map_err("download", e))?
            }
            CudaMem::Engine { ptr, .. } => {
                let mut v = vec![0u8; s.bytes];
                self.ctx.bind_to_thread().map_err(|e| map_err("download", e))?;
                // SAFETY: `ptr` addresses at least `s.bytes` bytes of live device memory of this
                // context (checked at import, or the importer's `unsafe` contract); `v` is a
                // host buffer of that size that stays in place until the synchronisation below.
                unsafe { result::memcpy_dtoh_async(&mut v, *ptr, self.stream.cu_stream()) }
                    .map_err(|e| map_err("download", e))?;
                v
            }
        };
        // `clone_dtoh` copies on the stream; waiting here makes the bytes final.
        self.stream.synchronize().map_err(|e| map_err("download", e))?;
        Ok(v)
    }

    fn matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        let p = self.matmul_params(desc, dtype, a, b, bias, c, out)?;
        // M <= 32 with B [K, N], M <= 16 with B [N, K]: the GEMV kernels; the rest: the tiled
        // kernels (K split across blocks on the tensor cores where the tiles give under one wave).
        if let Some(kernel) = cat::gemv::gemv_kernel(dtype, desc.precision, desc.m, desc.trans_b) {
            return self.launch_gemv(kernel, desc, dtype, p);
        }
        let kernel = cat::matmul_kernel(dtype, desc.precision, desc.trans_a, desc.trans_b);
        if kernel.module == cat::Module::MatmulMma {
            // The tensor-core kernels, with K split across blocks under one wave.
            self.launch_matmul_mma(kernel, desc, dtype, p)
        } else {
            self.launch_matmul(kernel, desc, p, cat::MATMUL_TILE_M, cat::MATMUL_TILE_N, (cat::THREADS, 1, 1))
        }
    }

    fn matmul_quant(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        w: &QuantView<'_, CudaStorage>,
        bias: Option<&CudaStorage>,
        c: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        self.quant_matmul(desc, dtype, a, w, bias, c, out)
    }

    fn inverted_residual(
        &self,
        desc: &InvertedResidualDesc,
        dtype: DType,
        args: &BlockArgs<'_, CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        self.run_block(desc, dtype, args, out)
    }

    fn depthwise_conv2d(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &CudaStorage,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        self.depthwise(desc, dtype, input, weight, bias, out, false)
    }

    /// Every kernel (tiled and general) reads the packed `[kh, kw, C·m]` weight in place.
    fn depthwise_conv2d_packed(
        &self,
        desc: &Conv2dDesc,
        dtype: DType,
        input: &CudaStorage,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        self.depthwise(desc, dtype, input, weight, bias, out, true)
    }

    fn activation(
        &self,
        desc: &ActivationDesc,
        dtype: DType,
        x: &CudaStorage,
        bias: Option<&CudaStorage>,
        out: &CudaStorage,
    ) -> Result<()> {
        const OP: &str = "activation";
        if desc.len == 0 {
            return Ok(());
        }
        let bias_len = match (desc.bias_len, bias) {
            (Some(l), Some(_)) => l,
            _ => 0,
        };
        // The kernels step bias indices in 32 bits.
        if bias_len >= cat::ACTIVATION_MAX_BIAS {
            return Err(Error::Overflow {
                op: OP,
                what: format!("bias_len = {bias_len} (the CUDA activation kernels index the bias in 32 bits)"),
            });
        }
        let p = cat::ActParams {
            x: self.ptr(x),
            bias: bias.map_or(0, |s| self.ptr(s)),
            out: self.ptr(out),
            len: to_i64(OP, "len", desc.len)?,
            bias_len: to_i64(OP, "bias_len", bias_len)?,
            act: desc.activation.code(),
            pad0: 0,
        };
        let per_thread = (16 / dtype.size_bytes()) as u64;
        let blocks = stride_blocks((desc.len as u64).div_ceil(per_thread), self.sms);
        self.launch(cat::activation_kernel(dtype, desc.activation), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    fn glu(&self, desc: &GluDesc, dtype: DType, h: &CudaStorage, out: &CudaStorage) -> Result<()> {
        const OP: &str = "glu";
        let len = desc.out_len().ok_or_else(|| Error::Overflow { op: OP, what: "the output element count".into() })?;
        if len == 0 {
            return Ok(());
        }
        let per_thread = 16 / dtype.size_bytes();
        let p = cat::GluParams {
            h: self.ptr(h),
            out: self.ptr(out),
            rows: to_i64(OP, "rows", desc.rows)?,
            f: to_i64(OP, "f", desc.f)?,
            act: desc.activation.code(),
            vec: desc.f.is_multiple_of(per_thread) as u32,
        };
        let blocks = stride_blocks((len as u64).div_ceil(per_thread as u64), self.sms);
        self.launch(cat::glu_kernel(dtype), (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    fn copy(&self, dtype: DType, src: &CudaStorage, dst: &CudaStorage, len: usize) -> Result<()> {
        const OP: &str = "copy";
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| Error::Overflow { op: OP, what: format!("{len} elements") })?;
        if bytes == 0 {
            return Ok(());
        }
        let p = cat::CopyParams { src: self.ptr(src), dst: self.ptr(dst), bytes: to_i64(OP, "bytes", bytes)? };
        let blocks = stride_blocks((bytes as u64).div_ceil(16), self.sms);
        self.launch(cat::COPY, (blocks, 1, 1), (cat::THREADS, 1, 1), p)
    }

    #[cfg(feature = "bench-refs")]
    fn naive_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        out: &CudaStorage,
    ) -> Result<bool> {
        let p = self.plain_matmul_params(desc, dtype, a, b, out)?;
        let t = cat::NAIVE_TILE as u32;
        self.launch_matmul(cat::naive_matmul_kernel(dtype), desc, p, cat::NAIVE_TILE, cat::NAIVE_TILE, (t, t, 1))?;
        Ok(true)
    }

    /// The kernels `[K, N]` products of 5 to 32 rows took before the shared-memory GEMV ring:
    /// the register-tile GEMV `_kn_m16` (M <= 16) and the SIMT skinny matmul (M <= 32).
    #[cfg(feature = "bench-refs")]
    fn previous_skinny_matmul(
        &self,
        desc: &MatmulDesc,
        dtype: DType,
        a: &CudaStorage,
        b: &CudaStorage,
        out: &CudaStorage,
    ) -> Result<bool> {
        let p = self.plain_matmul_params(desc, dtype, a, b, out)?;
        if let Some(kernel) = cat::gemv::previous_gemv_kernel(dtype, desc.precision, desc.m, desc.trans_b) {
            self.launch_gemv(kernel, desc, dtype, p)?;
        } else if desc.m > 16
            && let Some(kernel) = cat::skinny_matmul_kernel(dtype, desc.precision, desc.m, desc.trans_b)
        {
            self.launch_matmul(kernel, desc, p, cat::SKINNY_MAX_M, cat::SKINNY_COLS, (cat::THREADS, 1, 1))?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| map_err("synchronize", e))
    }
}
