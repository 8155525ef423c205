//! Wall-clock timing: warm-up, then repeated runs, median/min/max.
//!
//! Every timed closure ends with a device synchronisation (the caller's job), so a run's
//! time is the op's time as a caller waiting for the result sees it, launch overhead included.

use anyhow::Result;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Summary of the timed runs, in seconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Stats {
    pub runs: usize,
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
}

/// How many runs to make.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Runs at least this many times...
    pub min_runs: usize,
    /// ...and at most this many...
    pub max_runs: usize,
    /// ...aiming to spend about this long.
    pub budget: Duration,
    /// Warm-up runs before timing (pipeline compilation, caches, page faults, rayon start-up).
    pub warmup: usize,
}

impl Plan {
    /// The plan for tilekit's own op: at least 20 runs, except in `--quick` on a slow (software)
    /// device, where 5 keep the suite within a few minutes.
    pub fn op(quick: bool, slow_device: bool) -> Plan {
        match (quick, slow_device) {
            (true, true) => Plan { min_runs: 5, max_runs: 20, budget: Duration::from_millis(400), warmup: 1 },
            (true, false) => Plan { min_runs: 20, max_runs: 50, budget: Duration::from_millis(300), warmup: 2 },
            (false, _) => Plan { min_runs: 20, max_runs: 200, budget: Duration::from_secs(2), warmup: 3 },
        }
    }

    /// The plan for references, which are only there for a ratio: fewer runs.
    pub fn reference(quick: bool) -> Plan {
        Plan { min_runs: 3, max_runs: 20, budget: Duration::from_millis(if quick { 200 } else { 1000 }), warmup: 1 }
    }
}

/// Times `f` according to `plan`.
pub fn time(plan: Plan, mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
    let mut first = Duration::ZERO;
    for i in 0..plan.warmup.max(1) {
        let t = Instant::now();
        f()?;
        if i + 1 == plan.warmup.max(1) {
            first = t.elapsed();
        }
    }
    let per_run = first.as_secs_f64().max(1e-7);
    let runs = ((plan.budget.as_secs_f64() / per_run) as usize).clamp(plan.min_runs, plan.max_runs.max(plan.min_runs));
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(summarise(&mut samples))
}

/// Median (mean of the middle two for an even count), min and max.
pub fn summarise(samples: &mut [f64]) -> Stats {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return Stats { runs: 0, median_s: f64::NAN, min_s: f64::NAN, max_s: f64::NAN };
    }
    let median = if n % 2 == 1 { samples[n / 2] } else { 0.5 * (samples[n / 2 - 1] + samples[n / 2]) };
    Stats { runs: n, median_s: median, min_s: samples[0], max_s: samples[n - 1] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = summarise(&mut [3.0, 1.0, 2.0]);
        assert_eq!((s.median_s, s.min_s, s.max_s, s.runs), (2.0, 1.0, 3.0, 3));
        assert_eq!(summarise(&mut [4.0, 1.0, 3.0, 2.0]).median_s, 2.5);
        assert!(summarise(&mut []).median_s.is_nan());
    }

    #[test]
    fn runs_stay_within_the_plan() {
        let plan = Plan { min_runs: 4, max_runs: 6, budget: Duration::from_secs(10), warmup: 1 };
        let mut calls = 0;
        let s = time(plan, || {
            calls += 1;
            Ok(())
        });
        assert!(matches!(s, Ok(Stats { runs: 6, .. })));
        assert_eq!(calls, 7);
    }
}
