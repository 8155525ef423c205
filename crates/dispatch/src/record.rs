//! Recording tilekit ops into an engine's own `wgpu::CommandEncoder` ([`Device::record`]).

use crate::backend::Backend;
use crate::{BackendKind, Device, Error, Result};

impl Device {
    /// The wgpu backend, for the engine interop (`None` on other backends).
    pub(crate) fn wgpu_backend(&self) -> Option<&crate::backend::wgpu::WgpuBackend> {
        match &self.inner.backend {
            Backend::Wgpu(b) => Some(b),
            _ => None,
        }
    }

    /// Records the tilekit ops that `f` issues into the engine's `encoder`, without submitting
    /// or waiting: they run when the engine submits the encoder, in order with the passes and
    /// copies it encodes before and after. Returns what `f` returns.
    ///
    /// - Every op this thread issues on this device inside `f` goes into `encoder` (one compute
    ///   pass per launch); ops other threads issue meanwhile take the usual queue. Ops issued
    ///   before the call are submitted first, so they run before the engine's submission.
    /// - Tensors made inside `f` (op outputs) are ready once the engine's submission has run;
    ///   reading them back ([`crate::Tensor::to_vec`]) or [`Device::synchronize`] inside `f` is
    ///   refused with [`Error::InvalidParameter`] (the host would wait for work not yet
    ///   submitted). Outside `f`, after the engine's `Queue::submit`, they read as usual.
    /// - Arguments are checked as always, and an op that returns an error records nothing
    ///   of its own kernels where the error was found before encoding (every shape, dtype,
    ///   view and limit check); a failure wgpu reports while encoding surfaces when the
    ///   engine calls `encoder.finish()`.
    /// - Tuning (`TILEKIT_TUNE=on`) does not time candidates inside `f` (timing needs host
    ///   waits): ops use a cached or the default configuration.
    /// - One recording at a time per device; a nested call is [`Error::InvalidParameter`].
    /// - Only on wgpu devices ([`Error::BackendUnavailable`] elsewhere); the encoder must come
    ///   from the same `wgpu::Device` (see [`Device::from_wgpu`]).
    ///
    /// While `f` runs, `encoder` holds a placeholder; it is restored when `f` returns (or
    /// unwinds).
    ///
    /// ```
    /// use tilekit::{wgpu, Activation, DType, Device, MatmulOptions, Tensor, WgpuOptions};
    ///
    /// let Ok(dev) = Device::wgpu(&WgpuOptions::allow_software()) else {
    ///     eprintln!("SKIP: no wgpu adapter");
    ///     return Ok(());
    /// };
    /// let (device, queue) = dev.wgpu_device().unwrap();
    /// // The engine's own buffer: A (2 x 3, f32) at byte 16, as tilekit's tensor, no copy.
    /// let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
    /// let engine_buf = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 64, usage, mapped_at_creation: false });
    /// queue.write_buffer(&engine_buf, 16, bytemuck::cast_slice(&[1f32, 2., 3., 4., 5., 6.]));
    /// let a = Tensor::from_wgpu_buffer(&dev, engine_buf.clone(), 16, &[2, 3], DType::F32)?;
    /// let b = dev.tensor_from_f32(&[3, 1], DType::F32, &[1., 0., -1.])?;
    ///
    /// let readback = device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: None,
    ///     size: 8,
    ///     usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    ///     mapped_at_creation: false,
    /// });
    /// let mut encoder = device.create_command_encoder(&Default::default());
    /// // ... the engine's passes ...
    /// let y = dev.record(&mut encoder, |dev| {
    ///     let y = dev.matmul(&a, &b, &MatmulOptions::default().alpha(-1.0))?;
    ///     dev.activation_in_place(&y, None, Activation::Relu)?;
    ///     Ok(y)
    /// })?;
    /// encoder.copy_buffer_to_buffer(y.wgpu_buffer().unwrap(), 0, &readback, 0, 8);
    /// queue.submit([encoder.finish()]); // one submit: the engine's work and tilekit's
    ///
    /// readback.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    /// device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    /// let got: Vec<f32> = bytemuck::pod_collect_to_vec(&readback.slice(..).get_mapped_range().unwrap());
    /// assert_eq!(got, [2.0, 2.0]); // relu(-(1 - 3)), relu(-(4 - 6))
    /// # Ok::<(), tilekit::Error>(())
    /// ```
    pub fn record<R>(&self, encoder: &mut wgpu::CommandEncoder, f: impl FnOnce(&Device) -> Result<R>) -> Result<R> {
        let Some(be) = self.wgpu_backend() else {
            return Err(Error::BackendUnavailable {
                backend: BackendKind::Wgpu,
                reason: format!("Device::record needs a wgpu device, this one is {}", self.kind().name()),
            });
        };
        let placeholder =
            be.raw().0.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tilekit placeholder") });
        let theirs = std::mem::replace(encoder, placeholder);
        if let Err((e, theirs)) = be.begin_capture(theirs) {
            *encoder = theirs;
            return Err(e);
        }
        /// Hands the engine's encoder back however `f` ends.
        struct Restore<'a> {
            be: &'a crate::backend::wgpu::WgpuBackend,
            encoder: &'a mut wgpu::CommandEncoder,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                if let Some(theirs) = self.be.end_capture() {
                    *self.encoder = theirs;
                }
            }
        }
        let _restore = Restore { be, encoder };
        f(self)
    }
}

#[cfg(feature = "bench-refs")]
impl Device {
    /// Bench only: on wgpu, `false` makes every launch create its own parameter buffer, bind
    /// group and command buffer inside error scopes (what tilekit did before the uniform ring,
    /// the bind-group cache and the batch's shared encoder), so
    /// `cargo xtask bench --suite launch` times both in one run. No effect elsewhere.
    #[doc(hidden)]
    pub fn bench_set_launch_reuse(&self, on: bool) {
        if let Some(be) = self.wgpu_backend() {
            be.set_reuse(on);
        }
    }
}
