//! The submission queue: each op is recorded as one command buffer (one compute pass per
//! launch) and queued; the queue is submitted every [`MAX_PENDING_OPS`] ops and whenever the
//! host waits; waits poll with a timeout. Also the launch shapes every op shares: bindings,
//! 1-D grids folded into 2-D, chunks within the storage-binding limit.

use super::*;

/// A storage binding: a whole buffer, or a byte window `(offset, size)` of it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bind<'a> {
    pub(super) slot: u32,
    pub(super) buffer: &'a wgpu::Buffer,
    pub(super) window: Option<(u64, u64)>,
}

/// `buffer` bound whole at `slot`.
pub(super) fn whole(slot: u32, buffer: &wgpu::Buffer) -> Bind<'_> {
    Bind { slot, buffer, window: None }
}

/// One dispatch: bindings, parameter block, grid.
#[derive(Debug)]
pub(super) struct Launch<'a> {
    pub(super) binds: Vec<Bind<'a>>,
    pub(super) params: Vec<u8>,
    pub(super) grid: [u32; 3],
}

/// Work recorded but not yet submitted: one finished command buffer per op. One encoder per
/// op (rather than one shared encoder) keeps a failed op from invalidating the ops recorded
/// before it: its command buffer is never queued, the others are.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) buffers: Vec<wgpu::CommandBuffer>,
}

impl WgpuBackend {
    /// Submissions so far.
    #[cfg(test)]
    pub(super) fn submission_count(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// Checks that a binding of `bytes` fits the device's storage-binding limit.
    pub(super) fn check_binding(&self, op: &'static str, bytes: u64) -> Result<()> {
        let limit = self.limits.max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::Overflow {
                op,
                what: format!("a binding of {bytes} bytes (the device's storage-binding limit is {limit})"),
            });
        }
        Ok(())
    }

    /// A 1-D launch of `items` invocations folded into a 2-D grid.
    pub(super) fn grid_1d(&self, op: &'static str, items: u32, per_group: u32) -> Result<[u32; 3]> {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        let groups = div_ceil_u32(items, per_group).max(1);
        let x = groups.min(max);
        let y = div_ceil_u32(groups, x);
        if y > max {
            return Err(Error::Overflow { op, what: format!("a grid of {groups} workgroups") });
        }
        Ok([x, y, 1])
    }

    /// Records `launches` of `pipeline` (one compute pass each) as one pending command buffer;
    /// each launch brings its bindings, its parameter block (bound at `uniform_slot`) and its
    /// grid. Nothing waits: the buffer is submitted with the next [`MAX_PENDING_OPS`] or when
    /// the host waits.
    pub(super) fn record(
        &self,
        op: &'static str,
        pipeline: &Pipeline,
        uniform_slot: u32,
        launches: &[Launch<'_>],
    ) -> Result<()> {
        for launch in launches {
            for bind in &launch.binds {
                self.check_binding(op, bind.window.map_or(bind.buffer.size(), |w| w.1))?;
            }
        }
        self.check_health()?;
        // Only while a profile is open: one query pair per pass.
        let queries = if self.prof.active.load(Ordering::Relaxed) {
            self.profile_queries(pipeline, launches)?
        } else {
            Vec::new()
        };
        // Inside `Device::record` on this thread: into the engine's encoder, not the queue.
        {
            let mut capture = self.lock_capture()?;
            if let Some((thread, encoder)) = capture.as_mut()
                && *thread == std::thread::current().id()
            {
                return self.scoped(0, || self.encode(encoder, op, pipeline, uniform_slot, launches, &queries))?;
            }
        }
        let commands = self.scoped(0, || {
            let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
            self.encode(&mut encoder, op, pipeline, uniform_slot, launches, &queries)?;
            Ok(encoder.finish())
        })??;
        let mut pending = self.lock_pending()?;
        pending.buffers.push(commands);
        if pending.buffers.len() >= MAX_PENDING_OPS {
            self.submit(&mut pending, None)?;
        }
        Ok(())
    }

    /// Encodes `launches` of `pipeline` into `encoder`, one compute pass each.
    fn encode(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        op: &'static str,
        pipeline: &Pipeline,
        uniform_slot: u32,
        launches: &[Launch<'_>],
        queries: &[Option<(wgpu::QuerySet, u32)>],
    ) -> Result<()> {
        for (i, launch) in launches.iter().enumerate() {
            let uniform = buffer_with(&self.device, op, &launch.params, wgpu::BufferUsages::UNIFORM)?;
            let mut entries: Vec<wgpu::BindGroupEntry<'_>> = launch
                .binds
                .iter()
                .map(|b| wgpu::BindGroupEntry {
                    binding: b.slot,
                    resource: match b.window {
                        None => b.buffer.as_entire_binding(),
                        Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: b.buffer,
                            offset,
                            size: wgpu::BufferSize::new(size),
                        }),
                    },
                })
                .collect();
            entries.push(wgpu::BindGroupEntry { binding: uniform_slot, resource: uniform.as_entire_binding() });
            let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(op),
                layout: &pipeline.layout,
                entries: &entries,
            });
            let timestamp_writes =
                queries.get(i).and_then(|q| q.as_ref()).map(|(set, slot)| wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(*slot),
                    end_of_pass_write_index: Some(*slot + 1),
                });
            let mut pass =
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(op), timestamp_writes });
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            let [x, y, z] = launch.grid;
            pass.dispatch_workgroups(x, y, z);
        }
        Ok(())
    }

    /// Splits `len` elements of `size` bytes into chunks `(first, count)` whose bindings fit
    /// the device's storage-binding limit. Chunks start at multiples of the storage offset
    /// alignment (256 bytes on most devices), so each starts on a whole vec4 and, for packed
    /// 16-bit types, on a whole word.
    pub(super) fn chunks(&self, op: &'static str, len: usize, size: usize) -> Result<Vec<(usize, usize)>> {
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(16);
        // Element indices inside a chunk are u32; 2^30 elements keep `4 * items` in range too.
        let limit = self.limits.max_storage_buffer_binding_size.min((1 << 30) * size as u64);
        let per = usize::try_from(limit / align * align / size as u64).unwrap_or(usize::MAX);
        if per == 0 {
            return Err(Error::Overflow { op, what: format!("a chunk of the storage-binding limit ({limit} bytes)") });
        }
        Ok((0..len).step_by(per).map(|first| (first, per.min(len - first))).collect())
    }

    /// Submits the pending command buffers (plus `extra`, after them) in one submission and
    /// returns its index.
    pub(super) fn submit(
        &self,
        pending: &mut Pending,
        extra: Option<wgpu::CommandBuffer>,
    ) -> Result<Option<wgpu::SubmissionIndex>> {
        let mut buffers = std::mem::take(&mut pending.buffers);
        buffers.extend(extra);
        if buffers.is_empty() {
            return Ok(None);
        }
        let index = self.scoped(0, || self.queue.submit(buffers))?;
        self.submissions.fetch_add(1, Ordering::Relaxed);
        Ok(Some(index))
    }

    /// Blocks until `index` (or everything submitted) has finished, with a timeout.
    pub(super) fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let poll = self.device.poll(wgpu::PollType::Wait { submission_index: index, timeout: Some(WAIT_TIMEOUT) });
        self.check_health()?;
        match poll {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(Error::Backend {
                backend: KIND,
                message: format!("the device did not finish within {} s", WAIT_TIMEOUT.as_secs()),
            }),
            Err(e) => Err(Error::Backend { backend: KIND, message: e.to_string() }),
        }
    }

    pub(super) fn lock_pending(&self) -> Result<std::sync::MutexGuard<'_, Pending>> {
        self.pending
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the pending-work lock was poisoned".into() })
    }
}
