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
    /// Bench only: on wgpu, `false` makes every launch create its own parameter buffer and
    /// bind group (what tilekit did before the uniform ring and the bind-group cache), so
    /// `cargo xtask bench --suite launch` times both in one run. No effect elsewhere.
    #[doc(hidden)]
    pub fn bench_set_launch_reuse(&self, on: bool) {
        if let Some(be) = self.wgpu_backend() {
            be.set_reuse(on);
        }
    }
}
