//! Integration tests of the Redis adapters against real `redis-server` processes (see
//! [`support`]): the store contracts checked against the in-memory stores, connecting, the
//! key layout and TTLs, corrupt data, faults (a frozen, killed and restarted server), a
//! whole workflow stopped in one runtime and resumed in another, stop and cancel flags
//! set from anywhere, thread leases with fenced writes, bounded storage and checkpoint ops;
//! and runs, stops, resumes, flags and checkpoint ops on a real 3-master Redis Cluster
//! ([`cluster_support`]).

mod chaos;
mod checkpoint_api;
mod checkpoints;
mod cluster;
mod cluster_support;
mod connect;
mod corrupt;
mod crash;
mod cross_process;
mod deltas;
mod durability;
mod failures;
mod faults;
mod fork;
mod history;
mod layout;
mod leases;
mod ops;
mod resume;
mod retention;
mod retention_cluster;
mod runs;
mod serve;
mod signals;
mod spill;
mod support;
