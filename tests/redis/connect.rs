//! Connecting: a loud warning when Redis may evict keys (`maxmemory-policy` other than
//! `noeviction`), none when it may not, and a server that refuses `CONFIG` is accepted as it is.

use std::io::Write;
use std::sync::{Arc, Mutex};

use runvisor::redis::{ConnectError, RedisStores};
use runvisor::{Message, ThreadId};

use super::support::{RedisServer, config, within};

/// A log sink the test can read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Connects with a subscriber capturing what `connect` logs.
async fn connect_logged(server: &RedisServer) -> (Result<RedisStores, ConnectError>, String) {
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let result = within("connect", RedisStores::connect(config(server))).await;
    drop(guard);
    let text = String::from_utf8_lossy(&log.0.lock().expect("log buffer")).into_owned();
    (result, text)
}

#[tokio::test]
async fn noeviction_connects_quietly() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let (result, log) = connect_logged(&server).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(!log.contains("WARN"), "{log}");
}

#[tokio::test]
async fn an_evicting_policy_is_warned_about() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (result, log) = connect_logged(&server).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(
        log.contains("WARN") && log.contains("allkeys-lru") && log.contains("noeviction"),
        "{log}"
    );
}

#[tokio::test]
async fn a_server_without_config_is_accepted() {
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let (result, log) = connect_logged(&server).await;
    let stores = result.expect("connects without CONFIG");
    assert!(log.contains("maxmemory-policy"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
    let t = ThreadId::new("no-config").expect("valid");
    let message = Message::user("still works");
    stores
        .history
        .append(&t, std::slice::from_ref(&message), None)
        .await
        .expect("append");
    assert_eq!(stores.history.load(&t).await, Ok(vec![message]));
}
