//! Profiling: while a profile is open, every compute pass writes `TIMESTAMP_QUERY`
//! timestamps into query sets of [`QUERIES_PER_SET`]; they are resolved and read back when
//! the profile ends.

use super::*;

/// Profiling state: the flag the hot path reads, and the queries and launches so far.
#[derive(Debug, Default)]
pub(super) struct ProfState {
    pub(super) active: AtomicBool,
    pub(super) inner: Mutex<ProfInner>,
}

#[derive(Debug, Default)]
pub(super) struct ProfInner {
    pub(super) sets: Vec<wgpu::QuerySet>,
    /// Queries used in the last set.
    pub(super) used: u32,
    /// Launches not yet taken by the op that recorded them.
    pub(super) launches: Vec<LaunchInfo>,
}

impl WgpuBackend {
    pub(super) fn lock_prof(&self) -> Result<std::sync::MutexGuard<'_, ProfInner>> {
        self.prof
            .inner
            .lock()
            .map_err(|_| Error::Backend { backend: KIND, message: "the profile lock was poisoned".into() })
    }

    /// Opens a profile: from now on every pass writes timestamps (where the device has them)
    /// and every launch is listed.
    pub(super) fn start_profile(&self) -> Result<()> {
        *self.lock_prof()? = ProfInner::default();
        self.prof.active.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The launches recorded since the last call.
    pub(super) fn take_launches(&self) -> Vec<LaunchInfo> {
        self.lock_prof().map(|mut p| std::mem::take(&mut p.launches)).unwrap_or_default()
    }

    pub(super) fn profile_mark(&self) -> usize {
        self.lock_prof().map(|p| p.launches.len()).unwrap_or(0)
    }

    pub(super) fn profile_truncate(&self, mark: usize) {
        if let Ok(mut p) = self.lock_prof() {
            p.launches.truncate(mark);
        }
    }

    /// A query pair per launch (where the device has timestamps), and the launches listed.
    pub(super) fn profile_queries(
        &self,
        pipeline: &Pipeline,
        launches: &[Launch<'_>],
    ) -> Result<Vec<Option<(wgpu::QuerySet, u32)>>> {
        let mut inner = self.lock_prof()?;
        let mut out = Vec::with_capacity(launches.len());
        for launch in launches {
            let query = if self.timestamps {
                if inner.sets.is_empty() || inner.used + 2 > QUERIES_PER_SET {
                    let set = self.scoped(0, || {
                        self.device.create_query_set(&wgpu::QuerySetDescriptor {
                            label: Some("tilekit profile"),
                            ty: wgpu::QueryType::Timestamp,
                            count: QUERIES_PER_SET,
                        })
                    })?;
                    inner.sets.push(set);
                    inner.used = 0;
                }
                let slot = inner.used;
                inner.used += 2;
                Some((inner.sets.len() - 1, slot))
            } else {
                None
            };
            inner.launches.push(LaunchInfo {
                kernel: pipeline.name.clone(),
                grid: launch.grid,
                workgroup: pipeline.workgroup,
                query,
            });
            out.push(query.map(|(i, slot)| (inner.sets[i].clone(), slot)));
        }
        Ok(out)
    }

    /// Closes the profile: waits for the device, resolves every timestamp and returns them in
    /// nanoseconds, by query set and slot.
    pub(super) fn finish_profile(&self) -> Result<Vec<Vec<f64>>> {
        self.prof.active.store(false, Ordering::Relaxed);
        let (sets, used) = {
            let mut p = self.lock_prof()?;
            (std::mem::take(&mut p.sets), p.used)
        };
        self.synchronize()?;
        let period = f64::from(self.queue.get_timestamp_period());
        let last = sets.len().saturating_sub(1);
        let mut all = Vec::with_capacity(sets.len());
        for (i, set) in sets.iter().enumerate() {
            let n = if i == last { used } else { QUERIES_PER_SET };
            if n == 0 {
                all.push(Vec::new());
                continue;
            }
            let bytes = u64::from(n) * 8;
            let make = |usage, label| {
                self.scoped(bytes, || {
                    self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size: bytes,
                        usage,
                        mapped_at_creation: false,
                    })
                })
            };
            let resolve = make(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, "tilekit resolve")?;
            let staging = make(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "tilekit timestamps")?;
            let index = {
                let mut pending = self.lock_pending()?;
                let cmd = self.scoped(0, || {
                    let mut enc = self
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tilekit resolve") });
                    enc.resolve_query_set(set, 0..n, &resolve, 0);
                    enc.copy_buffer_to_buffer(&resolve, 0, &staging, 0, bytes);
                    enc.finish()
                })?;
                self.submit(&mut pending, Some(cmd))?
            };
            let raw = self.read_staging(&staging, index)?;
            all.push(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64 * period)
                    .collect(),
            );
        }
        Ok(all)
    }
}
