//! Engine integration tests: whole runs through the supervised actor tree, in memory.

mod support;

mod bodykit;
mod concurrency;
mod dag;
mod durability;
mod failures;
mod history;
mod interactive;
mod layers;
mod loops;
mod ops;
mod parallel;
mod references;
mod resume;
mod signals;
mod snapshot_format;
mod stop;
mod stopkit;
mod switch;
mod validation;
