//! Wall-clock timing: warm-up, then repeated runs, median/min/max.
//!
//! Every timed closure ends with a device synchronisation (the caller's job), so a run's
//! time is the op's time as a caller waiting for the result sees it, launch overhead included.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Summary of the timed runs, in seconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
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
pub fn time(plan: Plan, f: impl FnMut() -> Result<()>) -> Result<Stats> {
    time_between(plan, || {}, f)
}

/// Times `f` according to `plan`, calling `between` (untimed) before every run, e.g. to
/// flush the caches so each run starts cold.
pub fn time_between(plan: Plan, mut between: impl FnMut(), mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
    let mut first = Duration::ZERO;
    for i in 0..plan.warmup.max(1) {
        between();
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
        between();
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(summarise(&mut samples))
}

/// Times `a` and `b` alternately according to `plan` (each warmed up, then one run of each
/// per round), so drifting load on a shared machine weighs on both alike: a ratio of the two
/// medians is fairer than one of two series timed minutes apart.
pub fn time_interleaved(
    plan: Plan,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(Stats, Stats)> {
    let mut first = Duration::ZERO;
    for i in 0..plan.warmup.max(1) {
        let t = Instant::now();
        a()?;
        b()?;
        if i + 1 == plan.warmup.max(1) {
            first = t.elapsed();
        }
    }
    let per_round = first.as_secs_f64().max(1e-7);
    let runs =
        ((plan.budget.as_secs_f64() / per_round) as usize).clamp(plan.min_runs, plan.max_runs.max(plan.min_runs));
    let (mut sa, mut sb) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        let t = Instant::now();
        a()?;
        sa.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b()?;
        sb.push(t.elapsed().as_secs_f64());
    }
    Ok((summarise(&mut sa), summarise(&mut sb)))
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

/// Evicts the host's caches by writing a buffer larger than the last-level cache: a
/// memory-bound CPU op timed right after its previous run would otherwise read its inputs
/// from cache and report a bandwidth no cold call sees.
pub struct Flusher {
    buf: Vec<u64>,
    round: u64,
}

impl Flusher {
    /// A buffer of twice the last-level cache (as Linux reports it), at least 32 MiB and at
    /// most 512 MiB.
    pub fn new() -> Flusher {
        let llc = llc_bytes().unwrap_or(32 << 20);
        let bytes = (2 * llc).clamp(32 << 20, 512 << 20);
        Flusher { buf: vec![0; bytes / 8], round: 0 }
    }

    pub fn bytes(&self) -> usize {
        self.buf.len() * 8
    }

    /// Writes one word in every cache line of the buffer.
    pub fn flush(&mut self) {
        self.round = self.round.wrapping_add(1);
        for w in self.buf.iter_mut().step_by(8) {
            *w = w.wrapping_add(self.round);
        }
        std::hint::black_box(&self.buf);
    }
}

/// The largest cache Linux lists for CPU 0, in bytes.
fn llc_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_cache_size(&s))
        .max()
}

/// Parses sysfs cache sizes such as `32K`, `1024K` or `8M`.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
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

    #[test]
    fn between_runs_before_every_run() {
        let plan = Plan { min_runs: 3, max_runs: 3, budget: Duration::from_secs(1), warmup: 2 };
        let mut flushes = 0;
        let s = time_between(plan, || flushes += 1, || Ok(()));
        assert!(s.is_ok());
        assert_eq!(flushes, 5);
    }

    #[test]
    fn interleaved_runs_alternate() {
        let plan = Plan { min_runs: 3, max_runs: 3, budget: Duration::from_secs(1), warmup: 1 };
        let log = std::cell::RefCell::new(String::new());
        let s = time_interleaved(
            plan,
            || {
                log.borrow_mut().push('a');
                Ok(())
            },
            || {
                log.borrow_mut().push('b');
                Ok(())
            },
        );
        assert!(matches!(s, Ok((Stats { runs: 3, .. }, Stats { runs: 3, .. }))));
        assert_eq!(log.borrow().as_str(), "abababab");
    }

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32K\n"), Some(32 << 10));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("x"), None);
    }
}
