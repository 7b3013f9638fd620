//! Engine overhead benchmarks.
fn main() {}
