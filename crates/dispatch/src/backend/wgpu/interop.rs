//! Engine interop: tensors over an engine's own `wgpu::Buffer` at a byte offset
//! (`Tensor::from_wgpu_buffer`), and the base offsets every op adds for them.
//!
//! An imported storage keeps the engine's buffer handle (no copy) and the element index of the
//! view's first element (`WgpuStorage::base`). The kernels take element offsets in their
//! parameter blocks (matmul `*_off`, convolution `*_off`, activation `x_off`/`o_off`/`b_off`),
//! so any offset that is a multiple of the element size works, including odd element offsets
//! of f16/bf16 packed two per `u32` (their single-element stores touch only their own half).

use super::*;

impl WgpuBackend {
    /// A storage over `len` elements of `dtype` of an engine's `buffer` starting at
    /// `byte_offset`, with the checks `Tensor::from_wgpu_buffer` documents.
    pub(crate) fn import(
        &self,
        buffer: wgpu::Buffer,
        byte_offset: u64,
        len: usize,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        let op = "from_wgpu_buffer";
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::BufferUsage { op, usage: "STORAGE" });
        }
        let size = dtype.size_bytes() as u64;
        if !byte_offset.is_multiple_of(size) {
            return Err(Error::MisalignedOffset { op, offset: byte_offset, align: size });
        }
        let bytes = buffer.size();
        if !bytes.is_multiple_of(4) {
            return Err(Error::InvalidParameter {
                op,
                param: "buffer",
                reason: format!("its size ({bytes} bytes) is not a multiple of 4 (storage bindings are whole words)"),
            });
        }
        let base = usize::try_from(byte_offset / size)
            .map_err(|_| Error::Overflow { op, what: format!("byte offset {byte_offset}") })?;
        let end = (len as u64).checked_mul(size).and_then(|b| b.checked_add(byte_offset));
        let Some(end) = end.filter(|&e| e <= bytes) else {
            return Err(Error::ViewOutOfBounds {
                op,
                tensor: "buffer",
                needed: base.saturating_add(len),
                len: usize::try_from(bytes / size).unwrap_or(usize::MAX),
            });
        };
        // The kernels read f32 and native f16 through whole 16-byte (8-byte) vectors: the one
        // holding the view's last element must lie inside the buffer.
        if len > 0 && end.div_ceil(16) * 16 > bytes {
            return Err(Error::InvalidParameter {
                op,
                param: "buffer",
                reason: format!(
                    "the view ends at byte {end}, the buffer at {bytes}: tilekit's kernels read whole 16-byte \
                     vectors, so the buffer must extend to the next multiple of 16 bytes past the view"
                ),
            });
        }
        // A buffer of another device fails wgpu's same-device check when it is bound here.
        if bytes >= 4 {
            let layout = self.scoped(0, || {
                self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("tilekit import check"),
                    entries: &[wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: true },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    }],
                })
            })?;
            // A buffer of another `wgpu::Instance` is an id wgpu-core does not know: it panics
            // instead of reporting an error, so the check catches the unwind (inside the error
            // scopes, which stay balanced).
            let check = self.scoped(0, || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("tilekit import check"),
                        layout: &layout,
                        entries: &[wgpu::BindGroupEntry {
                            binding: 0,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &buffer,
                                offset: 0,
                                size: wgpu::BufferSize::new(4),
                            }),
                        }],
                    })
                }))
            });
            match check {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return Err(Error::DeviceMismatch { op, tensor: "buffer" }),
                Err(Error::Backend { message, .. }) if message.to_lowercase().contains("device") => {
                    return Err(Error::DeviceMismatch { op, tensor: "buffer" });
                }
                Err(other) => return Err(other),
            }
        }
        Ok(WgpuStorage { buffer, len, dtype, base, graveyard: self.graveyard.clone() })
    }

    /// `desc` with each operand's base offset added to its view.
    pub(super) fn rebased(
        desc: &MatmulDesc,
        [a, b, out]: [&WgpuStorage; 3],
        bias: Option<&WgpuStorage>,
        c: Option<&WgpuStorage>,
    ) -> Result<MatmulDesc> {
        let op = "matmul";
        let add = |off: usize, s: &WgpuStorage| {
            off.checked_add(s.base).ok_or_else(|| Error::Overflow { op, what: "an imported view's offset".into() })
        };
        let mut d = *desc;
        d.a.offset = add(d.a.offset, a)?;
        d.b.offset = add(d.b.offset, b)?;
        d.out.offset = add(d.out.offset, out)?;
        if let (Some(off), Some(s)) = (d.bias_offset, bias) {
            d.bias_offset = Some(add(off, s)?);
        }
        if let (Some(view), Some(s)) = (d.c.as_mut(), c) {
            view.offset = add(view.offset, s)?;
        }
        Ok(d)
    }

    /// Two storages over one `wgpu::Buffer` (imported twice, or an import of a tilekit
    /// tensor's buffer) where the op writes one and reads the other: wgpu refuses such a
    /// binding, so it is refused here with a typed error first.
    pub(super) fn check_engine_alias(
        op: &'static str,
        out: &WgpuStorage,
        inputs: &[(&'static str, Option<&WgpuStorage>)],
    ) -> Result<()> {
        for (name, s) in inputs {
            if let Some(s) = s
                && !std::ptr::eq(*s, out)
                && s.buffer == out.buffer
            {
                return Err(Error::Aliasing { op, tensor: name });
            }
        }
        Ok(())
    }

    /// A storage-binding window over elements `[first, first + count)` of `s` (base included):
    /// its start aligned down to the device's offset alignment, its size rounded up to 16
    /// bytes and kept inside the buffer; and the element offset of `first` inside it.
    pub(super) fn window_of(
        &self,
        s: &WgpuStorage,
        first: usize,
        count: usize,
        size: usize,
    ) -> Result<((u64, u64), u32)> {
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        let first = (s.base + first) as u64 * size as u64;
        let start = first / align * align;
        let end = (first + (count.max(1) * size) as u64).div_ceil(16) * 16;
        let end = end.min(s.buffer.size() / 4 * 4);
        let off = to_u32("activation", "element offset", ((first - start) / size as u64) as usize)?;
        Ok(((start, end - start), off))
    }

    pub(super) fn lock_capture(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Option<(std::thread::ThreadId, wgpu::CommandEncoder)>>> {
        self.capture
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the recording lock was poisoned".into() })
    }

    /// Whether this thread is recording into an engine's encoder.
    pub(super) fn capturing(&self) -> bool {
        self.capture.lock().is_ok_and(|c| c.as_ref().is_some_and(|(t, _)| *t == std::thread::current().id()))
    }

    /// Refuses a host wait while this thread records into an engine's encoder: what it
    /// recorded runs only when the engine submits, so the wait could not see it.
    pub(super) fn check_not_capturing(&self, op: &'static str) -> Result<()> {
        if self.capturing() {
            return Err(Error::InvalidParameter {
                op,
                param: "call",
                reason: "the host cannot wait for or read back results inside Device::record: the ops recorded \
                         there run when the engine submits its encoder"
                    .into(),
            });
        }
        Ok(())
    }

    /// Starts recording this thread's ops into `encoder`: submits what is pending first (so
    /// it runs before the engine's submission), then holds the encoder until
    /// [`Self::end_capture`]. A second recording at once is refused; the encoder comes back.
    pub(crate) fn begin_capture(
        &self,
        encoder: wgpu::CommandEncoder,
    ) -> std::result::Result<(), (Error, wgpu::CommandEncoder)> {
        let flushed = self.lock_pending().and_then(|mut pending| self.submit(&mut pending, None));
        if let Err(e) = flushed {
            return Err((e, encoder));
        }
        let mut capture = match self.lock_capture() {
            Ok(c) => c,
            Err(e) => return Err((e, encoder)),
        };
        if capture.is_some() {
            let e = Error::InvalidParameter {
                op: "record",
                param: "encoder",
                reason: "another Device::record is in progress on this device".into(),
            };
            return Err((e, encoder));
        }
        *capture = Some((std::thread::current().id(), encoder));
        Ok(())
    }

    /// Ends the recording [`Self::begin_capture`] started and hands the encoder back.
    pub(crate) fn end_capture(&self) -> Option<wgpu::CommandEncoder> {
        let mut capture = match self.capture.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        capture.take().map(|(_, encoder)| encoder)
    }

    /// Turns the uniform ring and the bind-group cache on or off (bench comparisons).
    #[cfg(feature = "bench-refs")]
    pub(crate) fn set_reuse(&self, on: bool) {
        self.reuse.store(on, Ordering::Relaxed);
    }
}
