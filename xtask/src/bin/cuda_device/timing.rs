//! Timing on the device.

use anyhow::Result;
use std::time::Instant;
use tilekit::Device;

/// Seconds per call of `f`, from `reps` back-to-back calls after `warm` warm-up calls (one
/// synchronisation per batch, so launch latency overlaps as it does in a real graph). The
/// median of 3 batches.
pub fn time(dev: &Device, warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    dev.synchronize()?;
    let mut v = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        dev.synchronize()?;
        v.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[1])
}
