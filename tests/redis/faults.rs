//! Faults: a frozen server (SIGSTOP) makes calls time out instead of hanging, a killed one
//! makes them fail, and once it is back (thawed, or restarted on the same port) calls succeed
//! again on the same stores, with no duplicate from a retried append. Only "returns an error
//! and does not hang" is asserted about timing.

use std::time::Duration;

use runvisor::redis::{ConnectError, RedisStores};
use runvisor::store::StoredCheckpoint;
use runvisor::{CheckpointId, Message, RunId, StoreError};

use super::support::{RedisServer, config, run_record, stores, thread, within};

fn checkpoint(run: RunId, sequence: u64) -> StoredCheckpoint {
    StoredCheckpoint {
        id: CheckpointId::new(),
        run,
        sequence,
        bytes: vec![sequence as u8; 16],
        link: None,
    }
}

#[tokio::test]
async fn a_frozen_server_times_out_and_serves_again_once_thawed() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("frozen");
    let run = RunId::new();
    let first = checkpoint(run, 1);
    stores
        .checkpoints
        .put(&t, first.clone(), None)
        .await
        .expect("put");
    let before = Message::user("before");
    stores
        .history
        .append(&t, std::slice::from_ref(&before), None)
        .await
        .expect("append");

    server.freeze();
    let during = Message::user("during");
    let timed_out = |r: Result<(), StoreError>, what: &str| {
        assert!(
            matches!(r, Err(StoreError::Timeout(_))),
            "{what} on a frozen server: {r:?}"
        );
    };
    timed_out(
        within(
            "append",
            stores
                .history
                .append(&t, std::slice::from_ref(&during), None),
        )
        .await,
        "append",
    );
    timed_out(
        within("put", stores.checkpoints.put(&t, checkpoint(run, 2), None)).await,
        "checkpoint put",
    );
    timed_out(
        within(
            "run put",
            stores.runs.put(&run_record(RunId::new(), &t), None),
        )
        .await,
        "run put",
    );
    let read = within("latest", stores.checkpoints.latest(&t)).await;
    assert!(matches!(read, Err(StoreError::Timeout(_))), "{read:?}");
    server.thaw();

    // The same stores serve again; replies are not mixed up with the late ones.
    let latest = within("latest after thaw", stores.checkpoints.latest(&t))
        .await
        .expect("latest after thaw")
        .expect("a checkpoint");
    assert_eq!(latest.run, run);
    assert!(latest.sequence >= 1);
    assert_eq!(
        stores.checkpoints.get(&t, first.id).await,
        Ok(Some(first.clone()))
    );
    // The timed-out append may have landed once the server woke up: retrying it (as a
    // resumed run does) never duplicates it.
    stores
        .history
        .append(&t, std::slice::from_ref(&during), None)
        .await
        .expect("retried append");
    assert_eq!(stores.history.load(&t).await, Ok(vec![before, during]));
}

#[tokio::test]
async fn a_killed_server_fails_calls_and_a_restarted_one_serves_them_again() {
    let mut server = RedisServer::start();
    let stores = stores(&server).await;
    let t = thread("killed");
    let run = RunId::new();
    stores
        .checkpoints
        .put(&t, checkpoint(run, 1), None)
        .await
        .expect("put");

    server.kill9();
    for _ in 0..3 {
        let put = within("put", stores.checkpoints.put(&t, checkpoint(run, 2), None)).await;
        assert!(put.is_err(), "put to a dead server: {put:?}");
        let load = within("load", stores.history.load(&t)).await;
        assert!(load.is_err(), "load from a dead server: {load:?}");
        let get = within("get", stores.runs.get(run)).await;
        assert!(get.is_err(), "get from a dead server: {get:?}");
    }

    server.restart();
    // The connection manager reconnects in the background; the first call may still see the
    // outage. Nothing was persisted by the old server, so the thread starts empty.
    let cp = checkpoint(run, 3);
    within("a write after the restart", async {
        loop {
            match stores.checkpoints.put(&t, cp.clone(), None).await {
                Ok(()) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    assert_eq!(stores.checkpoints.latest(&t).await, Ok(Some(cp.clone())));
    assert_eq!(stores.checkpoints.list(&t).await, Ok(vec![cp.id]));
    let message = Message::user("after");
    stores
        .history
        .append(&t, std::slice::from_ref(&message), None)
        .await
        .expect("append");
    assert_eq!(stores.history.load(&t).await, Ok(vec![message]));
}

#[tokio::test]
async fn connecting_fails_cleanly_when_redis_is_dead_or_frozen() {
    let mut server = RedisServer::start();
    server.freeze();
    let frozen = within(
        "connect to a frozen server",
        RedisStores::connect(config(&server)),
    )
    .await;
    assert!(
        matches!(frozen, Err(ConnectError::Timeout { .. })),
        "{frozen:?}"
    );
    server.thaw();
    server.kill9();
    let dead = within(
        "connect to a dead server",
        RedisStores::connect(config(&server)),
    )
    .await;
    assert!(
        matches!(dead, Err(ConnectError::Connect { .. })),
        "{dead:?}"
    );
    let message = dead.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains(&server.url()), "{message}");
}
