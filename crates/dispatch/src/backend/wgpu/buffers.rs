//! Buffers and staging: tensor buffers (padded to 16 bytes, zero-filled by wgpu), buffers
//! created with contents without wgpu's panicking helper, and read-back through a mapped
//! staging buffer.

use super::*;

/// Bytes of a buffer of `len` elements: rounded up to 16 (vec4 views), at least 16.
pub(super) fn padded_bytes(dtype: DType, len: usize) -> Option<u64> {
    let bytes = len.checked_mul(dtype.size_bytes())?;
    let padded = bytes.checked_add(15)? / 16 * 16;
    u64::try_from(padded.max(16)).ok()
}

/// A buffer holding `contents` (zero-padded to a multiple of 4 bytes). wgpu's own
/// `create_buffer_init` panics when the mapping fails, as it does on a lost device; this
/// returns [`Error::DeviceLost`] (or the mapping error) instead.
pub(super) fn buffer_with(
    device: &wgpu::Device,
    label: &str,
    contents: &[u8],
    usage: wgpu::BufferUsages,
) -> Result<wgpu::Buffer> {
    let size = (contents.len().div_ceil(4) * 4).max(4) as u64;
    let buffer =
        device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: true });
    {
        let mut view = buffer.slice(..).get_mapped_range_mut().map_err(|e| Error::DeviceLost {
            backend: KIND,
            reason: format!("a new buffer could not be mapped for writing ({e})"),
        })?;
        view.slice(..contents.len()).copy_from_slice(contents);
    }
    buffer.unmap();
    Ok(buffer)
}

impl WgpuBackend {
    pub(super) fn create_buffer(&self, bytes: u64, contents: Option<&[u8]>) -> Result<wgpu::Buffer> {
        // A size the device cannot hold is the same verdict as an allocation the driver
        // refuses: out of memory (as on the CPU and CUDA backends). `Overflow` is kept for
        // counts that do not fit the integer types (elements times bytes past `usize`).
        if bytes > self.limits.max_buffer_size {
            return Err(Error::OutOfMemory { backend: KIND, bytes });
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        self.op_checked(bytes, || match contents {
            Some(data) => buffer_with(&self.device, "tilekit tensor", data, usage),
            // wgpu zero-fills new buffers.
            None => Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tilekit tensor"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })),
        })?
    }

    /// Maps `staging` once submission `index` is done and copies it out.
    pub(super) fn read_staging(&self, staging: &wgpu::Buffer, index: Option<wgpu::SubmissionIndex>) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.scoped(0, || {
            staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            })
        })?;
        self.wait(index)?;
        match rx.recv_timeout(WAIT_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Backend { backend: KIND, message: format!("mapping failed: {e}") }),
            Err(_) => return Err(Error::Backend { backend: KIND, message: "the read-back never completed".into() }),
        }
        let out = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Backend { backend: KIND, message: format!("mapping failed: {e}") })?
            .to_vec();
        staging.unmap();
        Ok(out)
    }
}
