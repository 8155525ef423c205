//! Criterion benches.
