//! Engine integration tests: whole runs through the supervised actor tree, in memory.

mod support;

mod dag;
mod references;
mod switch;
mod validation;
