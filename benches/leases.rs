//! What leases cost, on a real `redis-server` the bench starts itself (the integration tests'
//! harness, on a free loopback port, never 6379):
//!
//! - `leases/ping`: one PING round trip, the unit the others are compared with;
//! - `leases/acquire_release`: taking a free thread's lease (one Lua script: token, lease hash)
//!   and releasing it, straight on the lease store;
//! - `leases/start_wait/{redis,memory}_leases`: a whole one-node run (start -> wait, `exit`
//!   durability, every other store on Redis) with its thread's lease on Redis, and with leases
//!   in memory: the difference is what leasing adds to a run (acquire at the start, release
//!   at the end), printed as a multiple of the PING round trip;
//! - takeover (printed, not a criterion group): a `runvisor run` process holding a thread is
//!   killed with SIGKILL, and the time until a worker adopting orphans (1 s leases renewed
//!   every 100 ms, looking for orphans every 100 ms) has resumed the thread is measured over
//!   ten kills. The aim is the lease TTL plus one tick.
//!
//! Run with `cargo bench --bench leases`.

#[allow(dead_code)]
#[path = "../tests/redis/support.rs"]
mod support;

mod common;

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use runvisor::store::MemoryLeaseStore;
use runvisor::{
    Durability, LeaseConfig, LeaseHolder, Map, RunId, Runtime, RuntimeConfig, ThreadId, WorkerId,
    WorkerInfo, register_standard_kinds,
};
use tokio::runtime::Runtime as Tokio;

use common::{ECHO, Echo, chain};
use support::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// Kills measured for the takeover time.
const KILLS: usize = 10;

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn bench(c: &mut Criterion) {
    let tokio = Tokio::new().expect("tokio runtime");
    let server = RedisServer::start();
    let stores = tokio.block_on(support::stores(&server));
    let raw = tokio.block_on(support::raw(&server));
    let exit = RuntimeConfig {
        durability: Durability::Exit,
        ..RuntimeConfig::default()
    };
    let with_redis_leases = stores
        .install(Runtime::builder().config(exit.clone()))
        .handler(ECHO, Echo)
        .build();
    let with_memory_leases = stores
        .install(Runtime::builder().config(exit))
        .lease_store(std::sync::Arc::new(MemoryLeaseStore::default()))
        .handler(ECHO, Echo)
        .build();
    let workflow = chain(&with_redis_leases, 1);

    let mut group = c.benchmark_group("leases");
    group.bench_function("ping", |b| {
        b.to_async(&tokio).iter(|| {
            // A multiplexed connection is a cheap handle to one shared connection.
            let mut raw = raw.clone();
            async move {
                let _: String = ::redis::cmd("PING")
                    .query_async(&mut raw)
                    .await
                    .expect("PING");
            }
        });
    });
    let holder = LeaseHolder {
        worker: WorkerId::new("bench").expect("id"),
        run: RunId::new(),
    };
    tokio.block_on(async {
        stores
            .leases
            .heartbeat(
                &WorkerInfo::this_process(holder.worker.clone()),
                Duration::from_secs(600),
            )
            .await
            .expect("heartbeat");
    });
    let mut n = 0u64;
    group.bench_function("acquire_release", |b| {
        b.to_async(&tokio).iter(|| {
            n += 1;
            let thread = ThreadId::new(format!("lease-{n}")).expect("id");
            let stores = &stores;
            let holder = &holder;
            async move {
                let acquired = stores
                    .leases
                    .acquire(&thread, holder, Duration::from_secs(15))
                    .await
                    .expect("free thread");
                stores
                    .leases
                    .release(&thread, &acquired.lease)
                    .await
                    .expect("release");
            }
        });
    });
    for (name, runtime) in [
        ("redis_leases", &with_redis_leases),
        ("memory_leases", &with_memory_leases),
    ] {
        let mut n = 0u64;
        group.bench_function(format!("start_wait/{name}"), |b| {
            b.to_async(&tokio).iter(|| {
                n += 1;
                let thread = ThreadId::new(format!("{name}-{n}")).expect("id");
                let workflow = &workflow;
                async move {
                    let run = runtime
                        .start(workflow, Map::new(), thread)
                        .await
                        .expect("start");
                    black_box(run.wait().await);
                }
            });
        });
    }
    group.finish();
    drop(with_redis_leases);
    drop(with_memory_leases);

    takeover(&tokio, &server);
}

/// Kills a process holding a thread and times until an adopting worker resumed it.
fn takeover(tokio: &Tokio, server: &RedisServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"runtime": {"lease": {"ttl": "1s", "renew": "100ms"}, "durability": "sync"}}"#,
    )
    .expect("config");
    let file = dir.path().join("nap.json");
    std::fs::write(
        &file,
        r#"{"id": "nap", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "first", "kind": "message", "params": {"template": "first"}},
            {"id": "nap", "kind": "sleep", "params": {"duration": "60s"}}
        ], "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "nap"}]}"#,
    )
    .expect("workflow");
    let stores = tokio.block_on(support::stores(server));
    let adopter =
        register_standard_kinds(stores.install(Runtime::builder().config(RuntimeConfig {
            worker_id: Some("adopter".to_owned()),
            lease: LeaseConfig {
                ttl: Duration::from_secs(1),
                renew: Duration::from_millis(100),
            },
            adopt_orphans: true,
            adopt_every: Duration::from_millis(100),
            durability: Durability::Sync,
            ..RuntimeConfig::default()
        })));
    let adopter = tokio.block_on(async { adopter.try_build().expect("adopter") });
    let adopter_id = adopter.worker().id.clone();
    let mut samples = Vec::with_capacity(KILLS);
    for i in 0..KILLS {
        let thread = format!("takeover-{i}");
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .args(["--redis", &server.url(), "run"])
            .arg(&file)
            .args(["--thread", &thread])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn runvisor run");
        let t = ThreadId::new(&thread).expect("id");
        tokio.block_on(async {
            // Held once its first checkpoint is written (after `first`).
            while stores
                .checkpoints
                .list(&t)
                .await
                .map_or(true, |c| c.is_empty())
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        child.kill().expect("SIGKILL");
        let killed = Instant::now();
        child.wait().expect("reap");
        let took = tokio.block_on(async {
            loop {
                let records = stores.runs.list_thread(&t).await.expect("runs");
                if records
                    .iter()
                    .any(|r| r.worker.as_ref() == Some(&adopter_id))
                {
                    return killed.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        samples.push(took);
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    let min = samples.iter().min().copied().unwrap_or_default();
    eprintln!(
        "takeover after SIGKILL (lease TTL 1 s, renew 100 ms, adopt every 100 ms), {KILLS} kills: \
         median {:?}, min {min:?}, max {max:?}",
        median(&mut samples)
    );
    tokio.block_on(adopter.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
