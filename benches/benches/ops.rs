//! Criterion benches (being written).
fn main() {}
