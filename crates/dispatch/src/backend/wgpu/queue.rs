//! The submission queue: the ops of a batch are recorded into one command encoder (one
//! compute pass per launch), which is finished and submitted every [`MAX_PENDING_OPS`] ops and
//! whenever the host waits; waits poll with a timeout. Also the launch shapes every op shares: bindings,
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

/// Work recorded but not yet submitted.
///
/// The ops of a batch share one command encoder (`encoder`), as an engine's own loop would:
/// a command buffer per op costs the driver a command buffer each (on lavapipe about as much as
/// the dispatch itself). Everything an op can get wrong is checked before its first pass is
/// recorded (arguments, limits, ring slots, bind groups), so a failed op leaves the batch's
/// encoder untouched. What wgpu could only find while encoding the passes would surface when
/// the batch is finished and would fail the batch (the op that submits it returns the error);
/// no such error is known, and the device's loss fails everything anyway.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Finished command buffers, in order (the shared encoder's work, sealed before any op
    /// that brings a command buffer of its own).
    pub(super) buffers: Vec<wgpu::CommandBuffer>,
    /// The batch's open encoder, if an op has recorded into it since the last seal.
    pub(super) encoder: Option<wgpu::CommandEncoder>,
    /// Ops recorded since the last submission.
    pub(super) ops: usize,
    /// The parameter blocks of the pending launches, one per ring slot (`State::ring_stride`
    /// apart): written to the uniform ring in one `write_buffer` just before the submit, which
    /// orders it after every earlier submission and before these command buffers.
    pub(super) ring_image: Vec<u8>,
    /// Ring slots the pending launches use.
    pub(super) ring_used: usize,
}

/// Bind groups by (pipeline, bindings): a chain of ops on the same buffers reuses one.
#[derive(Debug, Default)]
pub(super) struct BindGroupCache {
    map: HashMap<BindKey, wgpu::BindGroup>,
}

/// A bind group's identity: the pipeline (its address in the pipeline cache, which never
/// drops one), and each binding's slot, buffer and window.
type BindKey = (usize, Vec<(u32, wgpu::Buffer, Option<(u64, u64)>)>);

/// Bind groups cached at most (all are dropped when it fills; a chain reuses few).
const BIND_GROUP_CACHE: usize = 1024;
/// Slots of the uniform ring: launches one submission may hold; an op needing more slots
/// than are left submits what is pending first.
pub(super) const RING_SLOTS: usize = 512;

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
        // Inside `Device::record` on this thread: into the engine's encoder, not the queue,
        // with parameter blocks of their own (the ring is for what tilekit submits).
        {
            let mut capture = self.lock_capture()?;
            if let Some((thread, encoder)) = capture.as_mut()
                && *thread == std::thread::current().id()
            {
                return self
                    .scoped(0, || self.encode_fresh(encoder, op, pipeline, uniform_slot, launches, &queries))?;
            }
        }
        let mut pending = self.lock_pending()?;
        if launches.len() > RING_SLOTS || !self.reuse.load(Ordering::Relaxed) {
            // More launches than the ring holds (a matmul split into many blocks), or the
            // bench's old path: a command buffer of its own, after the batch's encoder.
            let commands = self.scoped(0, || {
                let mut encoder =
                    self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
                self.encode_fresh(&mut encoder, op, pipeline, uniform_slot, launches, &queries)?;
                Ok(encoder.finish())
            })??;
            self.seal(&mut pending)?;
            pending.buffers.push(commands);
        } else {
            if pending.ring_used + launches.len() > RING_SLOTS {
                self.submit(&mut pending, None)?;
            }
            let first = pending.ring_used;
            // Everything that can fail comes before the first pass is recorded: ring offsets
            // and bind groups (made or taken from the cache).
            let stride = self.ring_stride as usize;
            let mut bound = Vec::with_capacity(launches.len());
            for (i, launch) in launches.iter().enumerate() {
                let offset = u32::try_from((first + i) * stride)
                    .map_err(|_| Error::Overflow { op, what: "a uniform ring offset".into() })?;
                bound.push((self.cached_bind_group(op, pipeline, uniform_slot, launch)?, offset));
            }
            let mut encoder = match pending.encoder.take() {
                Some(e) => e,
                None => self.op_checked(0, || {
                    self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tilekit batch") })
                })?,
            };
            for (i, (bind_group, offset)) in bound.iter().enumerate() {
                let grid = launches[i].grid;
                self.encode_pass(&mut encoder, op, pipeline, bind_group, *offset, grid, queries.get(i));
            }
            pending.encoder = Some(encoder);
            let end = (first + launches.len()) * stride;
            if pending.ring_image.len() < end {
                pending.ring_image.resize(end, 0);
            }
            for (i, launch) in launches.iter().enumerate() {
                let at = (first + i) * stride;
                pending.ring_image[at..at + launch.params.len()].copy_from_slice(&launch.params);
            }
            pending.ring_used = first + launches.len();
        }
        pending.ops += 1;
        if pending.ops >= MAX_PENDING_OPS {
            self.submit(&mut pending, None)?;
        }
        Ok(())
    }

    /// One compute pass: `pipeline`, `bind_group` at `offset` into the ring, the grid.
    #[allow(clippy::too_many_arguments)]
    fn encode_pass(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        op: &'static str,
        pipeline: &Pipeline,
        bind_group: &wgpu::BindGroup,
        offset: u32,
        [x, y, z]: [u32; 3],
        query: Option<&Option<(wgpu::QuerySet, u32)>>,
    ) {
        let timestamp_writes = query.and_then(|q| q.as_ref()).map(|(set, slot)| wgpu::ComputePassTimestampWrites {
            query_set: set,
            beginning_of_pass_write_index: Some(*slot),
            end_of_pass_write_index: Some(*slot + 1),
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(op), timestamp_writes });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, bind_group, &[offset]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// The bind group of `launch` on `pipeline` with the ring at `uniform_slot`: from the
    /// cache, or made and cached. Buffers dropped since the last call leave the cache first.
    fn cached_bind_group(
        &self,
        op: &'static str,
        pipeline: &Pipeline,
        uniform_slot: u32,
        launch: &Launch<'_>,
    ) -> Result<wgpu::BindGroup> {
        let mut cache = self
            .bind_groups
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the bind-group cache lock was poisoned".into() })?;
        let dead: Vec<wgpu::Buffer> = self.graveyard.lock().map(|mut g| std::mem::take(&mut *g)).unwrap_or_default();
        if !dead.is_empty() {
            cache.map.retain(|(_, binds), _| !binds.iter().any(|(_, b, _)| dead.contains(b)));
        }
        let key: BindKey = (
            pipeline as *const Pipeline as usize,
            launch.binds.iter().map(|b| (b.slot, b.buffer.clone(), b.window)).collect(),
        );
        if let Some(bg) = cache.map.get(&key) {
            return Ok(bg.clone());
        }
        let size = wgpu::BufferSize::new((launch.params.len() as u64).div_ceil(16) * 16);
        let mut entries = bind_entries(&launch.binds);
        entries.push(wgpu::BindGroupEntry {
            binding: uniform_slot,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &self.ring, offset: 0, size }),
        });
        // Checked only when made: a chain of ops on the same buffers takes cached bind groups
        // and pays no error scopes (on any device).
        let bg = self.op_checked(0, || {
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(op),
                layout: &pipeline.layout,
                entries: &entries,
            })
        })?;
        if cache.map.len() >= BIND_GROUP_CACHE {
            cache.map.clear();
        }
        cache.map.insert(key, bg.clone());
        Ok(bg)
    }

    /// Encodes `launches` of `pipeline` into `encoder`, one compute pass each, each with a
    /// parameter block and a bind group of its own (inside `Device::record`, where the ring
    /// cannot be used, and for ops with more launches than the ring holds).
    fn encode_fresh(
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
            let mut entries = bind_entries(&launch.binds);
            entries.push(wgpu::BindGroupEntry { binding: uniform_slot, resource: uniform.as_entire_binding() });
            let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(op),
                layout: &pipeline.layout,
                entries: &entries,
            });
            self.encode_pass(encoder, op, pipeline, &bind_group, 0, launch.grid, queries.get(i));
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
    /// returns its index; their parameter blocks go to the uniform ring first.
    pub(super) fn submit(
        &self,
        pending: &mut Pending,
        extra: Option<wgpu::CommandBuffer>,
    ) -> Result<Option<wgpu::SubmissionIndex>> {
        pending.ops = 0;
        let sealed = self.seal(pending);
        let mut buffers = std::mem::take(&mut pending.buffers);
        if let Err(e) = sealed {
            // The batch is lost (its encoder failed); its ring slots are free again.
            pending.ring_used = 0;
            return Err(e);
        }
        buffers.extend(extra);
        let used = std::mem::take(&mut pending.ring_used) * self.ring_stride as usize;
        if used > 0 {
            self.scoped(0, || self.queue.write_buffer(&self.ring, 0, &pending.ring_image[..used]))?;
        }
        if buffers.is_empty() {
            return Ok(None);
        }
        let index = self.scoped(0, || self.queue.submit(buffers))?;
        self.submissions.fetch_add(1, Ordering::Relaxed);
        Ok(Some(index))
    }

    /// Finishes the batch's shared encoder, if one is open, into `pending.buffers`.
    fn seal(&self, pending: &mut Pending) -> Result<()> {
        match pending.encoder.take() {
            Some(encoder) => {
                let commands = self.scoped(0, || encoder.finish())?;
                pending.buffers.push(commands);
                Ok(())
            }
            None => Ok(()),
        }
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
            Err(e) => {
                // A submission the queue refused (as on a destroyed device, whose loss is
                // reported once the device is polled) leaves an index the wait rejects.
                let _ = self.device.poll(wgpu::PollType::Poll);
                self.check_health()?;
                Err(Error::Backend { backend: KIND, message: e.to_string() })
            }
        }
    }

    pub(super) fn lock_pending(&self) -> Result<std::sync::MutexGuard<'_, Pending>> {
        self.pending
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the pending-work lock was poisoned".into() })
    }
}

/// The storage entries of a bind group.
fn bind_entries<'a>(binds: &[Bind<'a>]) -> Vec<wgpu::BindGroupEntry<'a>> {
    binds
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
        .collect()
}
