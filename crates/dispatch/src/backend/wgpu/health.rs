//! Error scopes and device health: every fallible wgpu call runs inside [`WgpuBackend::scoped`];
//! the uncaptured-error handler and the device-lost callback fill an [`ErrorLog`] that
//! [`WgpuBackend::check_health`] turns into typed errors.

use super::*;

/// Errors the uncaptured-error handler and the device-lost callback saw.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    /// Uncaptured errors so far (all of them, reported or not).
    pub(super) count: AtomicU64,
    /// The oldest uncaptured error not yet returned to a caller.
    pub(super) unreported: Mutex<Option<wgpu::Error>>,
    /// Why the device was lost, once it was.
    pub(super) lost: Mutex<Option<String>>,
}

pub(super) fn map_wgpu_error(e: wgpu::Error, bytes: u64) -> Error {
    match e {
        wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory { backend: KIND, bytes },
        other => Error::Backend { backend: KIND, message: other.to_string() },
    }
}

impl WgpuBackend {
    /// Fails if the device was lost or an uncaptured error is waiting to be reported.
    pub(super) fn check_health(&self) -> Result<()> {
        if let Some(reason) = self.errors.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::DeviceLost { backend: KIND, reason });
        }
        if let Some(e) = self.errors.unreported.lock().ok().and_then(|mut u| u.take()) {
            return Err(map_wgpu_error(e, 0));
        }
        Ok(())
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns what they
    /// caught into an [`Error`] (`bytes` is the allocation size reported on OOM).
    pub(super) fn scoped<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = f();
        let caught =
            [pollster::block_on(internal.pop()), pollster::block_on(validation.pop()), pollster::block_on(oom.pop())];
        if caught.iter().any(Option::is_some) {
            // A destroyed device makes every object invalid, but its lost callback runs only
            // when the device is polled: poll once so the error is reported as the loss.
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        self.check_health()?;
        match caught.into_iter().flatten().next() {
            Some(e) => Err(map_wgpu_error(e, bytes)),
            None => Ok(value),
        }
    }
}
