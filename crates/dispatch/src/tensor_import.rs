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
        _ => return Err(wrong()),
    })
}

impl Device {
    /// A tensor of `shape` over `data`, which it takes over. On the CPU backend the vector
    /// becomes the tensor's buffer (no copy: the first element stays where it is); ops write
    /// outputs into it in place, and [`Tensor::with_host_slice`] reads them there. On GPU
    /// backends it is uploaded.
    ///
    /// ```
    /// use tilekit::{Device, MatmulDesc};
    ///
    /// let dev = Device::cpu();
    /// let a = dev.tensor_from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?;
    /// let out_mem = vec![0.0f32; 4];
    /// let out_ptr = out_mem.as_ptr();
    /// let out = dev.tensor_from_vec(&[2, 2], out_mem)?;
    /// dev.matmul_into(&MatmulDesc::new(2, 2, 2), &a, &a, None, None, &out)?;
    /// assert_eq!(out.with_host_slice(|s: &[f32]| (s.as_ptr(), s.to_vec()))?, (out_ptr, vec![7.0, 10.0, 15.0, 22.0]));
    /// # Ok::<(), tilekit::Error>(())
    /// ```
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

fn host_slice_of<B: BackendOps, T: Element, R>(be: &B, t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<Option<R>> {
    let s =
        B::storage_of(&t.buffer.storage).ok_or(Error::DeviceMismatch { op: "with_host_slice", tensor: "tensor" })?;
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
        if !ptr.is_multiple_of(IMPORT_ALIGN) {
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
            let bytes = len
                .checked_mul(dtype.size_bytes())
                .ok_or_else(|| Error::Overflow { op: OP, what: format!("{len} elements of {dtype}") })?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::{DType, Device, Error, MatmulDesc};
    use half::{bf16, f16};
    use std::sync::Arc;

    /// The vector becomes the buffer: same address, and an output written into it is read
    /// back in place.
    #[test]
    fn a_vec_is_adopted_without_a_copy_and_outputs_land_in_it() {
        let dev = Device::cpu();
        let a_data: Vec<f32> = (1..=6).map(|v| v as f32).collect();
        let a_ptr = a_data.as_ptr();
        let a = dev.tensor_from_vec(&[2, 3], a_data).unwrap();
        assert_eq!(a.with_host_slice(|s: &[f32]| s.as_ptr()).unwrap(), a_ptr);
        let b = dev.tensor_from_vec(&[3, 2], vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
        let out_data = vec![-7.0f32; 4];
        let out_ptr = out_data.as_ptr();
        let out = dev.tensor_from_vec(&[2, 2], out_data).unwrap();
        dev.matmul_into(&MatmulDesc::new(2, 2, 3), &a, &b, None, None, &out).unwrap();
        let (ptr, values) = out.with_host_slice(|s: &[f32]| (s.as_ptr(), s.to_vec())).unwrap();
        assert_eq!(ptr, out_ptr);
        assert_eq!(values, vec![4.0, 5.0, 10.0, 11.0]);
        assert_eq!(dev.live_buffer_bytes(), (6 + 6 + 4) * 4);
    }

    #[test]
    fn half_precision_vecs_are_adopted_too() {
        let dev = Device::cpu();
        let h: Vec<f16> = [1.0f32, -2.0, 3.0].iter().map(|&v| f16::from_f32(v)).collect();
        let p = h.as_ptr();
        let t = dev.tensor_from_vec(&[3], h).unwrap();
        assert_eq!(t.dtype(), DType::F16);
        assert_eq!(t.with_host_slice(|s: &[f16]| s.as_ptr()).unwrap(), p);
        let y = dev.activation(&t, None, crate::Activation::Relu).unwrap();
        assert_eq!(y.to_f32_vec().unwrap(), vec![1.0, 0.0, 3.0]);
        let b: Vec<bf16> = vec![bf16::from_f32(0.5); 4];
        let p = b.as_ptr();
        let t = dev.tensor_from_vec(&[2, 2], b).unwrap();
        assert_eq!(t.with_host_slice(|s: &[bf16]| s.as_ptr()).unwrap(), p);
    }

    /// Shared memory is read in place and written only once tilekit holds the last reference.
    #[test]
    fn an_arc_is_read_in_place_and_written_only_when_unshared() {
        let dev = Device::cpu();
        let engine: Arc<[f32]> = Arc::from(vec![-1.0f32, 2.0, -3.0, 4.0]);
        let x = dev.tensor_from_arc(&[4], engine.clone()).unwrap();
        assert_eq!(x.with_host_slice(|s: &[f32]| s.as_ptr()).unwrap(), engine.as_ptr());
        let y = dev.activation(&x, None, crate::Activation::Relu).unwrap();
        assert_eq!(y.to_f32_vec().unwrap(), vec![0.0, 2.0, 0.0, 4.0]);
        // In place while the engine still holds its clone: refused, and the engine's data is
        // untouched.
        match dev.activation_into(&x, None, crate::Activation::Relu, &x) {
            Err(Error::InvalidParameter { param: "out", .. }) => {}
            other => panic!("expected InvalidParameter, got {other:?}"),
        }
        assert_eq!(&engine[..], &[-1.0, 2.0, -3.0, 4.0]);
        let ptr = engine.as_ptr();
        drop(engine);
        dev.activation_into(&x, None, crate::Activation::Relu, &x).unwrap();
        assert_eq!(x.with_host_slice(|s: &[f32]| (s.as_ptr(), s.to_vec())).unwrap(), (ptr, vec![0.0, 2.0, 0.0, 4.0]));
    }

    #[test]
    fn host_imports_check_their_arguments() {
        let dev = Device::cpu();
        assert!(matches!(dev.tensor_from_vec(&[2, 3], vec![0.0f32; 5]), Err(Error::DataLength { .. })));
        assert!(matches!(dev.tensor_from_arc::<f32>(&[2], Arc::from(vec![0.0f32; 3])), Err(Error::DataLength { .. })));
        let t = dev.tensor_from_vec(&[2], vec![1.0f32, 2.0]).unwrap();
        assert!(matches!(t.with_host_slice(|_: &[f16]| ()), Err(Error::DTypeMismatch { .. })));
        // Tensors made the usual way are host memory too.
        let z = dev.zeros(&[3], DType::Bf16).unwrap();
        assert_eq!(z.with_host_slice(|s: &[bf16]| s.len()).unwrap(), 3);
    }

    /// Without a GPU: the CUDA imports refuse a device of another backend with a typed error,
    /// and the accessors answer `None`. (The imports themselves run in the device-check bundle.)
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_imports_refuse_other_devices() {
        use crate::Tensor;
        use cudarc::driver::{CudaContext, CudaStream};
        // The constructor's signature is the one engines code against.
        let _: fn(Arc<CudaContext>, Arc<CudaStream>) -> crate::Result<Device> = Device::from_cuda;
        let dev = Device::cpu();
        assert!(dev.cuda_context_and_stream().is_none());
        // SAFETY: the call fails before the address is used (a CPU device).
        let r = unsafe { Tensor::from_cuda_device_ptr(&dev, 256, 4, DType::F32, &[4]) };
        match r {
            Err(Error::InvalidParameter { op: "from_cuda_device_ptr", param: "device", .. }) => {}
            other => panic!("expected InvalidParameter, got {other:?}"),
        }
        let t = dev.zeros(&[4], DType::F32).unwrap();
        assert_eq!(t.cuda_device_ptr(), None);
        let (e, back) = t.into_cuda_slice::<f32>().unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { op: "into_cuda_slice", .. }), "{e:?}");
        assert_eq!(back.shape(), &[4]);
    }

    /// A machine without the driver library: every CUDA entry point says so instead of
    /// panicking (cudarc's dynamic loading panics on the first driver call without it).
    #[cfg(feature = "cuda")]
    #[test]
    fn a_missing_cuda_driver_is_an_error_not_a_panic() {
        // SAFETY: only tries to open the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            println!("cuda driver present: the missing-driver path is not exercised here");
            return;
        }
        for r in [Device::cuda(0), Device::with_backend(crate::BackendKind::Cuda)] {
            match r {
                Err(Error::BackendUnavailable { backend: crate::BackendKind::Cuda, reason }) => {
                    assert!(reason.contains("driver"), "{reason}")
                }
                other => panic!("expected BackendUnavailable, got {other:?}"),
            }
        }
    }

    /// Built without a backend: asking for it is a typed "not compiled in" error, and the
    /// probe lists it as absent with that reason.
    #[cfg(not(all(feature = "cuda", feature = "wgpu")))]
    #[test]
    fn a_backend_not_compiled_in_is_reported_not_hidden() {
        use crate::BackendKind;
        let mut off = Vec::new();
        if cfg!(not(feature = "cuda")) {
            off.push((BackendKind::Cuda, Device::cuda(0)));
        }
        if cfg!(not(feature = "wgpu")) {
            off.push((BackendKind::Wgpu, Device::wgpu(&crate::WgpuOptions::allow_software())));
        }
        let report = Device::auto().unwrap().probe_report().clone();
        for (kind, r) in off {
            match r {
                Err(Error::BackendUnavailable { backend, reason }) => {
                    assert_eq!(backend, kind);
                    assert!(reason.contains("not compiled in"), "{reason}");
                }
                other => panic!("expected BackendUnavailable, got {other:?}"),
            }
            let e = report.entries.iter().find(|e| e.backend == kind).unwrap();
            assert!(!e.available && e.detail.contains("not compiled in"), "{report}");
        }
    }
}
