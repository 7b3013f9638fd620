//! What a run's start pays for a long thread, with and without a history window: a one-node
//! run (start -> wait, `exit` durability, every store on a private `redis-server`) on a thread
//! whose history holds 1,000 or 10,000 messages of about 200 bytes, reading the whole history
//! (the default) and reading its newest 20 (`history_window`). The runs add no message, so
//! the thread keeps its length over the samples.
//!
//! Groups `history_start/<messages>/{whole,window_20}`; compare the two within a group, and
//! one variant across the two lengths (whole: about 10x; window: flat).
//!
//! Run with `cargo bench --bench history`.

mod common;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use runvisor::redis::{RedisConfig, RedisStores};
use runvisor::{Durability, Map, Message, Runtime, RuntimeConfig, ThreadId};

use common::redis_server::PrivateRedis;
use common::{ECHO, Echo, chain, tokio};

fn bench(c: &mut Criterion) {
    let server = PrivateRedis::start();
    let rt = tokio();
    let stores = rt
        .block_on(RedisStores::connect(RedisConfig::new(server.url())))
        .expect("connect to the private redis-server");
    let runtime = |window: Option<usize>| {
        stores
            .install(Runtime::builder().config(RuntimeConfig {
                durability: Durability::Exit,
                history_window: window,
                ..RuntimeConfig::default()
            }))
            .handler(ECHO, Echo)
            .build()
    };
    let variants = [("whole", runtime(None)), ("window_20", runtime(Some(20)))];
    let workflow = chain(&variants[0].1, 1);
    for messages in [1_000usize, 10_000] {
        let thread = ThreadId::new(format!("long-{messages}")).expect("id");
        rt.block_on(async {
            let text = "x".repeat(200);
            let history: Vec<Message> = (0..messages)
                .map(|i| Message::user(format!("{i} {text}")))
                .collect();
            for batch in history.chunks(500) {
                variants[0]
                    .1
                    .history_store()
                    .append(&thread, batch, None)
                    .await
                    .expect("append");
            }
        });
        let mut group = c.benchmark_group(format!("history_start/{messages}"));
        group.sample_size(20);
        for (name, runtime) in &variants {
            group.bench_function(*name, |b| {
                b.to_async(&rt).iter(|| async {
                    let run = runtime
                        .start(&workflow, Map::new(), thread.clone())
                        .await
                        .expect("start");
                    black_box(run.wait().await);
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
