//! Engine integration tests: whole runs through the supervised actor tree, in memory.

mod support;

mod bodykit;
mod concurrency;
mod crafted;
mod dag;
mod depth;
mod durability;
mod failed_items;
mod failures;
mod fork;
mod history;
mod interactive;
mod interrupt_paths;
mod layers;
mod loops;
mod nested_sync;
mod ops;
mod orphans;
mod parallel;
mod races;
mod references;
mod restore_checks;
mod resume;
mod signals;
mod snapshot_format;
mod spill;
mod stop;
mod stopkit;
mod store_failures;
mod switch;
mod validation;
mod validation_scale;
mod validation_scope;
mod whole_end;
