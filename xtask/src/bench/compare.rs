//! `--compare BASELINE.json`: this run against an earlier one, row by row.
//!
//! A row counts as a regression only when it is slower by more than the noise: its fastest
//! run is slower than the baseline's slowest, and its median is at least 10% slower. Both
//! conditions together keep one noisy sample (or a busy machine's jitter) from raising alarms.

use super::measure::Stats;
use super::report::Row;
use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize)]
struct BaselineRow {
    suite: String,
    op: String,
    shape: String,
    dtype: String,
    backend: String,
    stats: Option<Stats>,
}

#[derive(Debug, Deserialize)]
struct BaselineFile {
    rows: Vec<BaselineRow>,
}

/// Median slowdown (current / baseline) beyond which a row can be a regression.
const REGRESSION_RATIO: f64 = 1.10;

/// Prints the comparison; returns how many rows regressed.
pub fn compare(path: &Path, rows: &[Row]) -> Result<usize> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let base: BaselineFile =
        serde_json::from_str(&text).with_context(|| format!("{} is not a bench results file", path.display()))?;
    println!("\n== Compared with {} (speedup = baseline median / this median)", path.display());
    let mut regressions = 0;
    let mut matched = 0;
    for row in rows {
        let Some(now) = row.stats else { continue };
        let Some(then) = base
            .rows
            .iter()
            .find(|b| {
                b.suite == row.suite
                    && b.op == row.op
                    && b.shape == row.shape
                    && b.dtype == row.dtype
                    && b.backend == row.backend
            })
            .and_then(|b| b.stats)
        else {
            continue;
        };
        matched += 1;
        let slowdown = now.median_s / then.median_s;
        let regressed = now.min_s > then.max_s && slowdown >= REGRESSION_RATIO;
        let improved = now.max_s < then.min_s && slowdown <= 1.0 / REGRESSION_RATIO;
        let flag = match (regressed, improved) {
            (true, _) => "  REGRESSION",
            (_, true) => "  faster",
            _ => "",
        };
        regressions += usize::from(regressed);
        println!(
            "  {:<11} {:<11} {:<27} {:<5} {:<5} {:>9.3} ms -> {:>9.3} ms  {:>6.2}x{flag}",
            row.suite,
            row.op,
            row.shape,
            row.dtype,
            row.backend,
            then.median_s * 1e3,
            now.median_s * 1e3,
            1.0 / slowdown
        );
    }
    println!("  {matched} rows matched the baseline, {regressions} regressed beyond noise");
    Ok(regressions)
}
