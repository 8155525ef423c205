//! Tuning: which [`Spec`] an op runs with (the default, a validated cached winner, or the
//! winner of timing every candidate), and the timing itself. The cache is `cache.rs`.

use super::*;

/// What an op asks of the tuner. It travels with the op's call, never through device-wide
/// state, so an explicit tune on one thread does not tune another thread's ops, and each
/// tune's report returns to the call that asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TuneRequest {
    /// As the device's [`TuneMode`] says.
    AsConfigured,
    /// Time every candidate now, whatever the mode and cache hold, and report.
    Now,
}

impl WgpuBackend {
    /// What identifies this device and driver in the tune cache: adapter name, API, vendor
    /// and device ids, driver and driver version.
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether `spec` of `kernel` fits this device's limits.
    pub(super) fn spec_fits(&self, kernel: Kernel, spec: Spec) -> bool {
        let s = spec.normalised(kernel);
        let (wg, bytes) = match kernel {
            Kernel::Matmul => ([s.tile.wg_x, s.tile.wg_y, 1], s.tile.workgroup_bytes()),
            Kernel::MatmulF16x2 => ([s.tile.wg_x, s.tile.wg_y, 1], cat::f16x2::workgroup_bytes(s.tile)),
            Kernel::Gemv | Kernel::GemvSubgroup => ([s.wg, 1, 1], cat::gemv::workgroup_bytes(s.wg)),
            _ => ([s.wg, 1, 1], 0),
        };
        let l = &self.limits;
        bytes <= l.max_compute_workgroup_storage_size
            && wg[0] * wg[1] * wg[2] <= l.max_compute_invocations_per_workgroup
            && wg[0] <= l.max_compute_workgroup_size_x
            && wg[1] <= l.max_compute_workgroup_size_y
    }

    /// The untuned choice: the first candidate; for the tiled matmul on a device allowing
    /// fewer than 256 invocations (GL, some mobile GPUs), the 128-invocation short tile.
    pub(super) fn default_spec(&self, kernel: Kernel, candidates: &[Spec]) -> Spec {
        let first = candidates.first().copied().unwrap_or(Spec::DEFAULT);
        if matches!(kernel, Kernel::Matmul | Kernel::MatmulF16x2) && !self.spec_fits(kernel, first) {
            return Spec { tile: MatmulTile::SHORT, ..first };
        }
        first
    }

    /// The spec an op runs with (see the module documentation and `crate::tune`). `run`
    /// records the op with a given spec; tuning calls it for each candidate.
    pub(super) fn choose(
        &self,
        kernel: Kernel,
        storage: ElementStorage,
        candidates: &[Spec],
        key_tail: impl FnOnce() -> String,
        run: &dyn Fn(Spec) -> Result<()>,
        request: TuneRequest,
    ) -> Result<(Spec, Option<Result<TuneReport>>)> {
        #[cfg(test)]
        if let Some(spec) = self.force_spec.lock().ok().and_then(|f| *f) {
            return Ok((Spec { rows: candidates.first().map_or(spec.rows, |c| c.rows), ..spec }, None));
        }
        let default = self.default_spec(kernel, candidates);
        let forced = request == TuneRequest::Now;
        let mode = self.tuner.mode();
        if mode == TuneMode::Off && !forced {
            return Ok((default, None));
        }
        let key = format!("{}|{}|{}", self.fingerprint(), storage.name(), key_tail());
        let hash = || cache::hash_hex(cat::source_hash(kernel, storage));
        let rows = default.rows;
        if !forced && let Some(cfg) = self.tuner.lookup(&key, hash, kernel, candidates, |s| self.spec_fits(kernel, s)) {
            return Ok((cfg.spec(kernel, rows), None));
        }
        // Timing needs host waits, which recording into an engine's encoder rules out.
        if (forced || mode == TuneMode::On) && !self.capturing() {
            let mark = self.profile_mark();
            let tuned = self.tune_candidates(kernel, candidates, &key, &hash(), run);
            // Tuning launches are not part of the caller's profile.
            self.profile_truncate(mark);
            let spec = tuned.as_ref().ok().map(|(_, spec)| *spec);
            let report = forced.then(|| tuned.map(|(report, _)| report));
            // A tuning that failed outright leaves the default.
            return Ok((spec.unwrap_or(default), report));
        }
        self.tuner.remember(&key, TunedConfig::of(kernel, default));
        Ok((default, None))
    }

    /// Times each candidate (wall time over whole submissions, best of three batches after a
    /// warm-up that also builds the pipeline), stores the winner and reports.
    pub(super) fn tune_candidates(
        &self,
        kernel: Kernel,
        candidates: &[Spec],
        key: &str,
        hash: &str,
        run: &dyn Fn(Spec) -> Result<()>,
    ) -> Result<(TuneReport, Spec)> {
        // Each candidate is warmed up (which also builds its pipeline) and sized to a batch of
        // about 50 ms; then TUNING_ROUNDS rounds time one batch of every candidate in turn and
        // each keeps its best round, so a change in the machine's load hits all candidates
        // alike instead of whichever ran during it.
        let mut state: Vec<std::result::Result<(usize, f64), String>> = candidates
            .iter()
            .map(|&spec| {
                if !self.spec_fits(kernel, spec) {
                    return Err("exceeds the device's limits".to_string());
                }
                self.warm_up(run, spec).map(|reps| (reps, f64::MAX)).map_err(|e| e.to_string())
            })
            .collect();
        for _ in 0..TUNING_ROUNDS {
            for (slot, &spec) in state.iter_mut().zip(candidates) {
                if let Ok((reps, best)) = slot {
                    match self.time_batch(run, spec, *reps) {
                        Ok(us) => *best = best.min(us),
                        Err(e) => *slot = Err(e.to_string()),
                    }
                }
            }
        }
        let mut results = Vec::new();
        let mut best: Option<(f64, Spec)> = None;
        for (slot, &spec) in state.into_iter().zip(candidates) {
            let timed = slot.map(|(_, us)| us);
            if let Ok(us) = timed
                && best.is_none_or(|(b, _)| us < b)
            {
                best = Some((us, spec));
            }
            results.push((spec.label(kernel), timed));
        }
        let Some((mut micros, mut spec)) = best else {
            return Err(Error::Backend { backend: KIND, message: format!("no candidate ran for {key}") });
        };
        let default_micros = results.first().and_then(|(_, r)| r.as_ref().ok().copied()).unwrap_or(micros);
        // The default keeps its place unless another candidate beats it clearly: a win inside
        // the timing noise would only make the choice depend on the machine's load.
        if let (Some(&first), Some((_, Ok(_)))) = (candidates.first(), results.first())
            && micros > default_micros * (1.0 - MIN_TUNING_GAIN)
        {
            (micros, spec) = (default_micros, first);
        }
        let entry = CacheEntry {
            config: TunedConfig::of(kernel, spec),
            kernel_hash: hash.to_string(),
            micros,
            default_micros,
            tuned_at: cache::now_secs(),
        };
        let stored = self.tuner.store(key, entry);
        let report = TuneReport {
            key: key.to_string(),
            candidates: results,
            winner: spec.label(kernel),
            winner_micros: micros,
            default_micros,
        };
        stored.map(|()| (report, spec))
    }

    /// Runs `spec` twice (the first builds the pipeline) and returns how many runs make a
    /// batch of about 50 ms (1 to 20).
    pub(super) fn warm_up(&self, run: &dyn Fn(Spec) -> Result<()>, spec: Spec) -> Result<usize> {
        run(spec)?;
        self.synchronize()?;
        let t = Instant::now();
        run(spec)?;
        self.synchronize()?;
        let once = t.elapsed().as_secs_f64().max(1e-6);
        Ok((0.05 / once).clamp(1.0, 20.0) as usize)
    }

    /// µs per run of a batch of `reps` runs of `spec` (wall time over one wait).
    pub(super) fn time_batch(&self, run: &dyn Fn(Spec) -> Result<()>, spec: Spec, reps: usize) -> Result<f64> {
        let t = Instant::now();
        for _ in 0..reps {
            run(spec)?;
        }
        self.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
    }

    /// Runs `op`, an op called with [`TuneRequest::Now`], one explicit tune at a time, and
    /// returns its report.
    pub(super) fn tune_now(&self, op: impl FnOnce() -> Result<Option<Result<TuneReport>>>) -> Result<TuneReport> {
        let _one =
            self.forcing.lock().map_err(|_| Error::Backend { backend: KIND, message: "tune lock poisoned".into() })?;
        op()?.unwrap_or_else(|| Err(Error::Backend { backend: KIND, message: "the op did not reach the tuner".into() }))
    }
}
