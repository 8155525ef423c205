//! [`Tensor`]: a typed buffer on a device, with a shape.

use crate::backend::Storage;
use crate::backend::cpu::convert;
use crate::{Device, Error, Result};
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tilekit_kernels::DType;

/// A host element type tilekit stores natively: `f32`, `half::f16` or `half::bf16`.
pub trait Element: bytemuck::Pod + Send + Sync + private::Sealed {
    /// The matching storage dtype.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A device buffer. Tensors (views with a shape) share it through an `Arc`.
pub(crate) struct Buffer {
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) storage: Storage,
}

impl Buffer {
    /// Bytes of the elements it holds (what [`Device::live_buffer_bytes`] counts).
    fn counted_bytes(&self) -> u64 {
        (self.len as u64).saturating_mul(self.dtype.size_bytes() as u64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.device.inner.live_bytes.fetch_sub(self.counted_bytes(), Ordering::Relaxed);
    }
}

/// A dense, row-major tensor on a [`Device`]: a shape over a flat buffer of one dtype.
///
/// `Clone` shares the buffer (it is a handle, like an `Arc`): ops that write a tensor write
/// every clone of it. The strided entry points ([`Device::matmul_into`]) read and write
/// views anywhere inside a tensor's buffer.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) buffer: Arc<Buffer>,
    pub(crate) shape: Vec<usize>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.buffer.dtype)
            .field("backend", &self.buffer.storage.kind())
            .finish()
    }
}

pub(crate) fn element_count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Overflow { op: "tensor", what: format!("the element count of shape {shape:?}") })
}

impl Tensor {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The storage dtype.
    pub fn dtype(&self) -> DType {
        self.buffer.dtype
    }

    /// Elements in the shape.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the shape has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements in the underlying buffer (at least [`Tensor::len`]).
    pub fn buffer_len(&self) -> usize {
        self.buffer.len
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> &Device {
        &self.buffer.device
    }

    /// Whether two tensors share one buffer.
    pub fn shares_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buffer, &other.buffer)
    }

    /// The `wgpu::Buffer` behind this tensor, for an engine that binds it in its own passes
    /// (`None` on other backends). It holds the buffer's elements densely, little-endian in the
    /// storage dtype — also f16 where the device packs it in `u32` words, whose bytes are the
    /// same — padded with zeros to a multiple of 16 bytes. Call [`Device::flush`] before
    /// submitting work that reads what tilekit wrote.
    #[cfg(feature = "wgpu")]
    pub fn wgpu_buffer(&self) -> Option<&wgpu::Buffer> {
        match &self.buffer.storage {
            Storage::Wgpu(s) => Some(s.buffer()),
            _ => None,
        }
    }

    /// The byte offset of the tensor's first element in [`Tensor::wgpu_buffer`] (0 for
    /// tilekit's own buffers, the import offset for [`Tensor::from_wgpu_buffer`]; `None` on
    /// other backends).
    #[cfg(feature = "wgpu")]
    pub fn wgpu_byte_offset(&self) -> Option<u64> {
        match &self.buffer.storage {
            Storage::Wgpu(s) => Some(s.byte_offset()),
            _ => None,
        }
    }

    /// A tensor over an engine's own `wgpu::Buffer`, without a copy: `shape` in `dtype`, its
    /// first element at `byte_offset`, dense and row-major from there. Every op reads and
    /// writes it in place (the [`MatrixView`](crate::MatrixView) offsets of a
    /// [`Device::matmul_into`] count from its first element), and nothing outside the view is
    /// written. The tensor keeps a handle to the buffer; the engine keeps its own.
    ///
    /// Errors, all before anything is recorded:
    /// - [`Error::BackendUnavailable`]: `device` is not a wgpu device;
    /// - [`Error::BufferUsage`]: the buffer lacks `STORAGE` (reading it back with
    ///   [`Tensor::to_vec`] also needs `COPY_SRC`, checked when it is read);
    /// - [`Error::MisalignedOffset`]: `byte_offset` is not a multiple of the element size (any
    ///   multiple works, odd f16/bf16 element offsets included);
    /// - [`Error::ViewOutOfBounds`]: the view reaches past the end of the buffer;
    /// - [`Error::InvalidParameter`]: the buffer's size is not a multiple of 4, or it does not
    ///   extend to the 16-byte boundary after the view's last element (the kernels read whole
    ///   16-byte vectors);
    /// - [`Error::DeviceMismatch`]: the buffer belongs to another `wgpu::Device`.
    ///
    /// The buffer must come from the same `wgpu::Device` as `device` (see
    /// [`Device::from_wgpu`]). Two tensors over one buffer are separate tensors to tilekit: an
    /// op that writes one while reading the other is refused with [`Error::Aliasing`].
    #[cfg(feature = "wgpu")]
    pub fn from_wgpu_buffer(
        device: &Device,
        buffer: wgpu::Buffer,
        byte_offset: u64,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let len = element_count(shape)?;
        let Some(be) = device.wgpu_backend() else {
            return Err(Error::BackendUnavailable {
                backend: crate::BackendKind::Wgpu,
                reason: format!("from_wgpu_buffer needs a wgpu device, this one is {}", device.kind().name()),
            });
        };
        let storage = be.import(buffer, byte_offset, len, dtype)?;
        Ok(device.wrap(dtype, len, Storage::Wgpu(storage), shape))
    }

    /// The same buffer under another shape with as many elements.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = element_count(shape)?;
        if n != self.len() {
            return Err(Error::InvalidParameter {
                op: "reshape",
                param: "shape",
                reason: format!("{shape:?} has {n} elements, the tensor {:?} has {}", self.shape, self.len()),
            });
        }
        Ok(Tensor { buffer: self.buffer.clone(), shape: shape.to_vec() })
    }

    /// The whole buffer as raw little-endian bytes of the storage dtype. Waits for queued work.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.buffer.device.download_storage(self)
    }

    /// The whole buffer as `T`, which must be the storage dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                tensor: "tensor",
                expected: T::DTYPE,
                actual: self.dtype(),
            });
        }
        let bytes = self.to_bytes()?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// The whole buffer widened to `f32` (exact for every storage dtype).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let bytes = self.to_bytes()?;
        Ok(match self.dtype() {
            DType::F32 => bytemuck::pod_collect_to_vec(&bytes),
            DType::F16 => widened(&bytemuck::pod_collect_to_vec::<u8, f16>(&bytes), convert::f16_to_f32),
            DType::Bf16 => widened(&bytemuck::pod_collect_to_vec::<u8, bf16>(&bytes), convert::bf16_to_f32),
            other => return Err(no_f32_conversion("to_f32_vec", other)),
        })
    }
}

/// `src` widened to f32 by `f` (the CPU backend's vector conversions, `half`'s bits).
fn widened<H: Copy>(src: &[H], f: fn(&[H], &mut [f32])) -> Vec<f32> {
    let mut out = vec![0.0f32; src.len()];
    f(src, &mut out);
    out
}

impl Device {
    pub(crate) fn wrap(&self, dtype: DType, len: usize, storage: Storage, shape: &[usize]) -> Tensor {
        let buffer = Buffer { device: self.clone(), dtype, len, storage };
        self.inner.live_bytes.fetch_add(buffer.counted_bytes(), Ordering::Relaxed);
        Tensor { buffer: Arc::new(buffer), shape: shape.to_vec() }
    }

    pub(crate) fn check_len(shape: &[usize], actual: usize) -> Result<usize> {
        let expected = element_count(shape)?;
        if expected != actual {
            return Err(Error::DataLength { shape: shape.to_vec(), expected, actual });
        }
        Ok(expected)
    }

    /// A tensor of `shape` holding `data` in its own dtype.
    pub fn tensor<T: Element>(&self, shape: &[usize], data: &[T]) -> Result<Tensor> {
        let len = Device::check_len(shape, data.len())?;
        self.check_dtype(T::DTYPE)?;
        let storage = self.upload_storage(T::DTYPE, bytemuck::cast_slice(data))?;
        Ok(self.wrap(T::DTYPE, len, storage, shape))
    }

    /// A tensor of `shape` in `dtype` holding `data` rounded (to nearest even) to `dtype`.
    pub fn tensor_from_f32(&self, shape: &[usize], dtype: DType, data: &[f32]) -> Result<Tensor> {
        match dtype {
            DType::F32 => self.tensor(shape, data),
            DType::F16 => {
                let mut v = vec![f16::ZERO; data.len()];
                convert::f32_to_f16(data, &mut v);
                self.tensor(shape, &v)
            }
            DType::Bf16 => {
                let mut v = vec![bf16::ZERO; data.len()];
                convert::f32_to_bf16(data, &mut v);
                self.tensor(shape, &v)
            }
            other => Err(no_f32_conversion("tensor_from_f32", other)),
        }
    }

    /// A zero-filled tensor.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let len = element_count(shape)?;
        self.check_dtype(dtype)?;
        let storage = self.alloc_storage(dtype, len)?;
        Ok(self.wrap(dtype, len, storage, shape))
    }

    /// A tensor for an op's output that the op writes in full before anything reads it: its
    /// contents until then are unspecified (see `BackendOps::alloc_output`).
    pub(crate) fn output_tensor(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let len = element_count(shape)?;
        self.check_dtype(dtype)?;
        let storage = self.alloc_output_storage(dtype, len)?;
        Ok(self.wrap(dtype, len, storage, shape))
    }
}

/// A dtype without an f32 conversion here (`DType` is `#[non_exhaustive]`: every dtype there
/// is today converts).
fn no_f32_conversion(op: &'static str, dtype: DType) -> Error {
    Error::InvalidParameter { op, param: "dtype", reason: format!("{dtype} has no conversion to or from f32") }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::{Activation, DType, Device, MatmulOptions};

    #[test]
    fn live_buffer_bytes_count_each_buffer_once_until_it_is_dropped() {
        let dev = Device::cpu();
        assert_eq!(dev.live_buffer_bytes(), 0);
        let a = dev.tensor_from_f32(&[2, 3], DType::F32, &[1.0; 6]).unwrap();
        let b = dev.zeros(&[3, 5], DType::Bf16).unwrap();
        assert_eq!(dev.live_buffer_bytes(), 6 * 4 + 15 * 2);
        // Clones and reshapes share the buffer.
        let a2 = a.clone().reshape(&[3, 2]).unwrap();
        assert_eq!(dev.live_buffer_bytes(), 6 * 4 + 15 * 2);
        drop(b);
        let y = dev.matmul(&a, &a2, &MatmulOptions::default()).unwrap();
        let z = dev.activation(&y, None, Activation::Relu).unwrap();
        assert_eq!(dev.live_buffer_bytes(), (6 + 4 + 4) * 4);
        drop((a, a2, y, z));
        assert_eq!(dev.live_buffer_bytes(), 0);
        // Another device keeps its own count.
        assert_eq!(Device::cpu().live_buffer_bytes(), 0);
    }
}
