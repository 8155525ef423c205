//! Error scopes and device health. Fallible wgpu calls run inside [`WgpuBackend::scoped`]
//! (three error scopes) or, on the per-op path of a device tilekit made, inside
//! [`WgpuBackend::op_checked`] (no scopes: tilekit's own uncaptured-error handler sees every
//! error); the handler and the device-lost callback fill an [`ErrorLog`] that
//! [`WgpuBackend::check_health`] turns into typed errors.
//!
//! Why not one set of scopes around a whole batch: wgpu's error scopes are a per-thread
//! stack, and an op returns to its caller between one op and the next, so a scope left open
//! across ops would capture the engine's own errors and unbalance the engine's own scopes.
//! Instead, an op records its passes into the batch's shared encoder, whose errors wgpu reports
//! when the batch is finished, inside the batch's error scopes with its `write_buffer` and
//! `submit` (`queue.rs`). What an op creates (its output buffer, a bind group on a cache miss,
//! the batch's encoder) is checked where it is made: on a device tilekit made through the
//! handler's error count (no scopes), on an engine's device, whose uncaptured-error handler is
//! the engine's (wgpu's default one panics), inside scopes. A chain of ops on buffers that
//! exist already (in place, or `*_into`) therefore pays no error scopes per op on either.

use super::*;

/// Errors the uncaptured-error handler and the device-lost callback saw.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    /// Whether the handler filling this log is installed on the device (a device tilekit
    /// made); an engine's device keeps its own handler, and tilekit's calls there run inside
    /// error scopes.
    pub(super) own_handler: bool,
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

    /// Runs `f`, the encoding or allocation of one op, and returns what wgpu reported while it
    /// ran as an [`Error`] (`bytes` is the allocation size reported on OOM). On a device tilekit
    /// made, without error scopes: the uncaptured-error handler counts every error, so a count
    /// that moved while `f` ran means `f` (or, rarely, another thread's call at the same time:
    /// the error is returned to one of them) raised it. Elsewhere, and on the bench's
    /// old-path switch, [`Self::scoped`].
    pub(super) fn op_checked<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> Result<T> {
        if !self.errors.own_handler || !self.reuse.load(Ordering::Relaxed) {
            return self.scoped(bytes, f);
        }
        let before = self.errors.count.load(Ordering::Acquire);
        let value = f();
        if self.errors.count.load(Ordering::Acquire) != before {
            // As in `scoped`: a destroyed device reports its loss only once polled.
            let _ = self.device.poll(wgpu::PollType::Poll);
            if let Some(reason) = self.errors.lost.lock().ok().and_then(|l| l.clone()) {
                return Err(Error::DeviceLost { backend: KIND, reason });
            }
            if let Some(e) = self.errors.unreported.lock().ok().and_then(|mut u| u.take()) {
                return Err(map_wgpu_error(e, bytes));
            }
        }
        self.check_health()?;
        Ok(value)
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
