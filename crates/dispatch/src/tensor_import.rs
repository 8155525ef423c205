//! Tensors over memory an engine already owns: host vectors and `Arc<[T]>` on the CPU backend,
//! CUDA slices and raw device pointers on the CUDA backend. None of them copies.
//!
//! Ownership, in one place:
//! - **`Vec<T>`** ([`Device::tensor_from_vec`]): moved in; the tensor owns it and ops read and
//!   write it in place. [`Tensor::with_host_slice`] reads it back without a copy.
//! - **`Arc<[T]>`** ([`Device::tensor_from_arc`]): shared. Ops read it in place; they write it
//!   only while the tensor holds the last reference (else a typed error), since the engine may
//!   be reading its own clone.
//! - **`CudaSlice<T>`** ([`Tensor::from_cuda_slice`]): moved in, kept alive by the tensor (freed
//!   on its own stream when the last clone drops) or handed back by
//!   [`Tensor::into_cuda_slice`].
//! - **A device pointer or a `CudaView`** ([`Tensor::from_cuda_device_ptr`],
//!   [`Tensor::from_cuda_view`]): borrowed, `unsafe`: the caller keeps the memory alive and
//!   unaliased by conflicting work for as long as the tensor and the work queued on it live.

use crate::backend::{BackendOps, cpu::CpuData, cpu::HostBuf, with_backend};
use crate::{Device, Element, Error, Result, Tensor};
use half::{bf16, f16};
use std::any::Any;
use std::sync::Arc;
use tilekit_kernels::DType;

/// `data` typed as the `CpuData` of its dtype. `T` is sealed to f32, f16 and bf16, so the
/// downcasts below always succeed for exactly one arm.
fn host_data<T: Element>(data: Box<dyn Any>) -> Result<CpuData> {
    let wrong = || Error::Backend { backend: crate::BackendKind::Cpu, message: "unexpected host element type".into() };
    Ok(match T::DTYPE {
        DType::F32 => CpuData::F32(*data.downcast::<HostBuf<f32>>().map_err(|_| wrong())?),
        DType::F16 => CpuData::F16(*data.downcast::<HostBuf<f16>>().map_err(|_| wrong())?),
        DType::Bf16 => CpuData::Bf16(*data.downcast::<HostBuf<bf16>>().map_err(|_| wrong())?),
    })
}

impl Device {
    /// A tensor of `shape` over `data`, which it takes over. On the CPU backend the vector
    /// becomes the tensor's buffer (no copy: the first element stays where it is); ops write
    /// outputs into it in place, and [`Tensor::with_host_slice`] reads them there. On GPU
    /// backends it is uploaded.
    pub fn tensor_from_vec<T: Element + 'static>(&self, shape: &[usize], data: Vec<T>) -> Result<Tensor> {
        self.adopt(shape, data.len(), Box::new(HostBuf::Owned(data)), T::DTYPE, host_data::<T>)
    }

    /// A tensor of `shape` over shared host memory, without a copy on the CPU backend (uploaded
    /// on GPU backends). Ops read it in place. An op writes into it only while the tensor holds
    /// the last reference to the `Arc` (the engine dropped its clones); otherwise writing into it
    /// is an [`Error::InvalidParameter`], since the engine may be reading its clone.
    pub fn tensor_from_arc<T: Element + 'static>(&self, shape: &[usize], data: Arc<[T]>) -> Result<Tensor> {
        self.adopt(shape, data.len(), Box::new(HostBuf::Shared(data)), T::DTYPE, host_data::<T>)
    }

    fn adopt(
        &self,
        shape: &[usize],
        len: usize,
        data: Box<dyn Any>,
        dtype: DType,
        typed: fn(Box<dyn Any>) -> Result<CpuData>,
    ) -> Result<Tensor> {
        let len = Device::check_len(shape, len)?;
        self.check_dtype(dtype)?;
        let data = typed(data)?;
        let storage = with_backend!(self, be => be.adopt_host(data).map(wrap_of(be)))?;
        Ok(self.wrap(dtype, len, storage, shape))
    }
}

fn wrap_of<B: BackendOps>(_: &B) -> fn(B::Storage) -> crate::backend::Storage {
    B::wrap
}

fn host_slice_of<B: BackendOps, T: Element, R>(
    be: &B,
    t: &Tensor,
    f: impl FnOnce(&[T]) -> R,
) -> Result<Option<R>> {
    let s = B::storage_of(&t.buffer.storage).ok_or(Error::DeviceMismatch { op: "with_host_slice", tensor: "tensor" })?;
    let mut f = Some(f);
    let mut out = None;
    let found = be.with_host_data(s, &mut |data: &CpuData| {
        if let (Some(f), Ok(slice)) = (f.take(), bytemuck::try_cast_slice::<u8, T>(data.bytes())) {
            out = Some(f(slice));
        }
    });
    Ok(if found { out } else { None })
}

impl Tensor {
    /// Calls `f` with the tensor's whole buffer in host memory, in place (no copy), on the CPU
    /// backend: how an engine reads an output written into memory it handed over. `T` must be
    /// the storage dtype. On GPU backends this is [`Error::BackendUnavailable`]: read with
    /// [`Tensor::to_vec`] there. Inside `f`, do not run a tilekit op that writes this tensor (the
    /// buffer is read-locked for the call).
    pub fn with_host_slice<T: Element, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "with_host_slice",
                tensor: "tensor",
                expected: T::DTYPE,
                actual: self.dtype(),
            });
        }
        let dev = self.device();
        match with_backend!(dev, be => host_slice_of(be, self, f))? {
            Some(r) => Ok(r),
            None => Err(Error::BackendUnavailable {
                backend: dev.kind(),
                reason: "tensors on this backend are not in host memory; read them with to_vec".into(),
            }),
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda_import {
    use super::*;
    use crate::backend::Storage;
    use crate::backend::cuda::{CudaStorage, IMPORT_ALIGN};
    use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceSlice};

    /// The device's CUDA context and stream, or the error for a device on another backend.
    fn cuda_parts(
        device: &Device,
        op: &'static str,
    ) -> Result<(Arc<cudarc::driver::CudaContext>, Arc<cudarc::driver::CudaStream>)> {
        device.cuda_context_and_stream().ok_or_else(|| Error::InvalidParameter {
            op,
            param: "device",
            reason: format!("a CUDA import needs a CUDA device, not a {} device", device.kind()),
        })
    }

    fn check_align(op: &'static str, ptr: u64) -> Result<()> {
        if ptr % IMPORT_ALIGN != 0 {
            return Err(Error::InvalidParameter {
                op,
                param: "ptr",
                reason: format!(
                    "device address {ptr:#x} is not {IMPORT_ALIGN}-byte aligned (tilekit's kernels load 16-byte vectors)"
                ),
            });
        }
        Ok(())
    }

    impl Device {
        /// The CUDA context and stream this device runs on (`None` on other backends), for
        /// engines that order their own work against tilekit's.
        pub fn cuda_context_and_stream(
            &self,
        ) -> Option<(Arc<cudarc::driver::CudaContext>, Arc<cudarc::driver::CudaStream>)> {
            crate::backend::cuda::parts(&self.inner.backend)
        }
    }

    impl Tensor {
        /// A tensor of `shape` over an engine's `CudaSlice<T>`, without a copy. The tensor
        /// keeps the slice alive (it is freed, on its own stream, when the last clone of the
        /// tensor drops) unless [`Tensor::into_cuda_slice`] hands it back. The slice must be
        /// of `device`'s context, hold exactly `shape`'s element count, and start 16-byte
        /// aligned (every `cuMemAlloc` allocation does).
        ///
        /// Ordering: tilekit's work goes on the device's stream. If the engine writes the
        /// slice on another stream, it must order that work against tilekit's itself (or keep
        /// cudarc's event tracking on, in which case cudarc makes tilekit's stream wait for
        /// the slice's last write when the tensor is made).
        pub fn from_cuda_slice<T: Element + 'static>(
            device: &Device,
            slice: CudaSlice<T>,
            shape: &[usize],
        ) -> Result<Tensor> {
            const OP: &str = "from_cuda_slice";
            let (ctx, stream) = cuda_parts(device, OP)?;
            if !Arc::ptr_eq(slice.context(), &ctx) {
                return Err(Error::DeviceMismatch { op: OP, tensor: "slice" });
            }
            let len = Device::check_len(shape, slice.len())?;
            device.check_dtype(T::DTYPE)?;
            let ptr = slice.device_ptr(&stream).0;
            check_align(OP, ptr)?;
            let bytes = len * T::DTYPE.size_bytes();
            let storage = CudaStorage::engine(ptr, bytes, Some(Box::new(slice)));
            Ok(device.wrap(T::DTYPE, len, Storage::Cuda(storage), shape))
        }

        /// A tensor of `shape` over the memory of an engine's `CudaView<T>`, without a copy.
        ///
        /// # Safety
        /// As [`Tensor::from_cuda_device_ptr`]: the memory the view points at must stay
        /// allocated until the tensor and all its clones are dropped and the work tilekit queued
        /// on them has finished (the view's lifetime does not enforce that).
        pub unsafe fn from_cuda_view<T: Element>(
            device: &Device,
            view: &CudaView<'_, T>,
            shape: &[usize],
        ) -> Result<Tensor> {
            const OP: &str = "from_cuda_view";
            let (ctx, stream) = cuda_parts(device, OP)?;
            if !Arc::ptr_eq(view.stream().context(), &ctx) {
                return Err(Error::DeviceMismatch { op: OP, tensor: "view" });
            }
            let len = Device::check_len(shape, view.len())?;
            let ptr = view.device_ptr(&stream).0;
            // SAFETY: the caller's contract is this function's.
            unsafe { Tensor::from_cuda_device_ptr(device, ptr, len, T::DTYPE, shape) }
        }

        /// A tensor of `shape` over `len` elements of `dtype` at device address `ptr`, without
        /// a copy.
        ///
        /// # Safety
        /// - `ptr` is a device address in `device`'s CUDA context with at least
        ///   `len · dtype.size_bytes()` bytes behind it;
        /// - that memory stays allocated until the tensor and every clone of it are dropped and
        ///   all work tilekit queued on the device's stream that uses it has finished (free it
        ///   on that stream, or after [`Device::synchronize`]);
        /// - no other work reads the memory while tilekit's work writing it may run, or writes
        ///   it while tilekit's work reading it may run, unless ordered by the stream or events.
        ///
        /// Checked (typed errors): a non-CUDA device, `len` against `shape`, a null or
        /// misaligned (not 16-byte) address.
        pub unsafe fn from_cuda_device_ptr(
            device: &Device,
            ptr: u64,
            len: usize,
            dtype: DType,
            shape: &[usize],
        ) -> Result<Tensor> {
            const OP: &str = "from_cuda_device_ptr";
            cuda_parts(device, OP)?;
            let len = Device::check_len(shape, len)?;
            device.check_dtype(dtype)?;
            if ptr == 0 {
                return Err(Error::InvalidParameter { op: OP, param: "ptr", reason: "a null device address".into() });
            }
            check_align(OP, ptr)?;
            let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| Error::Overflow {
                op: OP,
                what: format!("{len} elements of {dtype}"),
            })?;
            let storage = CudaStorage::engine(ptr, bytes, None);
            Ok(device.wrap(dtype, len, Storage::Cuda(storage), shape))
        }

        /// The device address of the tensor's first element (`None` off CUDA), for engines that
        /// read tilekit's outputs in their own kernels or copies on the device's stream.
        pub fn cuda_device_ptr(&self) -> Option<u64> {
            crate::backend::cuda::address_of(self.device(), &self.buffer.storage)
        }

        /// Hands back the `CudaSlice<T>` this tensor was made from by
        /// [`Tensor::from_cuda_slice`], with whatever tilekit wrote into it (its work is queued
        /// on the device's stream: the engine reads it on that stream or after
        /// [`Device::synchronize`]). Errors when the tensor was made otherwise, when `T` is not
        /// its dtype, or when other clones of the tensor are alive (`self` comes back then).
        #[allow(clippy::result_large_err)]
        pub fn into_cuda_slice<T: Element + 'static>(mut self) -> std::result::Result<CudaSlice<T>, (Error, Tensor)> {
            let Some(buffer) = Arc::get_mut(&mut self.buffer) else {
                let e = Error::InvalidParameter {
                    op: "into_cuda_slice",
                    param: "tensor",
                    reason: "other clones of this tensor are alive".into(),
                };
                return Err((e, self));
            };
            match crate::backend::cuda::take_slice::<T>(&mut buffer.storage) {
                Some(slice) => Ok(slice),
                None => {
                    let e = Error::InvalidParameter {
                        op: "into_cuda_slice",
                        param: "tensor",
                        reason: format!(
                            "this tensor was not made from a CudaSlice of {} (or was already handed back)",
                            T::DTYPE
                        ),
                    };
                    Err((e, self))
                }
            }
        }
    }
}
