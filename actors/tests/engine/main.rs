//! Engine integration tests: whole runs through the supervised actor tree, in memory.

mod support;

mod dag;
mod failures;
mod references;
mod switch;
mod validation;
