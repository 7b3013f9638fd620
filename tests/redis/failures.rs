//! Failures are named and classified: a server that refuses this client (a password required
//! or wrong, a user without permission) or an endpoint that does not speak Redis is a
//! permanent error naming the command and the key, met at once, never retried or waited for;
//! the CLI says so in one `error:` line and exits 3.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::process::Command;
use std::time::Duration;

use runvisor::redis::{ConnectError, RedisConfig, RedisStores};
use runvisor::{Message, StoreError};

use super::support::{RedisServer, cmd, config, raw, thread, within};

const BIN: &str = env!("CARGO_BIN_EXE_runvisor");

/// A config for a test server with a user and password in its URL.
fn config_as(server: &RedisServer, userinfo: &str) -> RedisConfig {
    RedisConfig {
        url: format!("redis://{userinfo}@127.0.0.1:{}/", server.port()),
        ..config(server)
    }
}

/// A server that requires the password `s3cret` (set once it runs: the harness checks that it
/// answers before any password is needed).
async fn server_with_password() -> RedisServer {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    let _: String = cmd(&mut con, &["CONFIG", "SET", "requirepass", "s3cret"]).await;
    server
}

/// A loopback listener that answers every connection with `reply` and closes it, as a web
/// server or another service would; it lives as long as the test (its thread ends with the
/// process).
fn foreign_endpoint(reply: &'static [u8]) -> u16 {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .expect("bind a foreign endpoint");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let mut request = [0u8; 256];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(reply);
        }
    });
    port
}

/// Runs the binary against a Redis URL; returns the exit code and stderr.
fn runvisor(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(["--redis", url])
        .args(args)
        .output()
        .expect("run the cli");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exactly one line on stderr, an `error:` one containing every needle.
#[track_caller]
fn assert_one_error_line(stderr: &str, needles: &[&str]) {
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
}

#[tokio::test]
async fn a_missing_or_wrong_password_is_refused_when_connecting() {
    let server = server_with_password().await;
    let missing = within("connect", RedisStores::connect(config(&server))).await;
    match &missing {
        Err(e @ ConnectError::Refused { error, .. }) => {
            assert!(error.contains("NOAUTH"), "{error}");
            assert!(!e.is_transient());
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let wrong = within("connect", RedisStores::connect(config_as(&server, ":nope"))).await;
    match &wrong {
        Err(ConnectError::Refused { url, error }) => {
            assert!(error.contains("authentication failed"), "{error}");
            assert!(!url.contains("nope"), "the password never shows: {url}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let stores = within(
        "connect",
        RedisStores::connect(config_as(&server, ":s3cret")),
    )
    .await
    .expect("the right password connects");
    let t = thread("authed");
    stores
        .history
        .append(&t, &[Message::user("hi")], None)
        .await
        .expect("append");
}

#[tokio::test]
async fn an_endpoint_that_does_not_speak_redis_is_refused_when_connecting() {
    for reply in [
        &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"[..],
        &b"220 smtp.example ESMTP ready\r\n"[..],
    ] {
        let port = foreign_endpoint(reply);
        let config = RedisConfig {
            url: format!("redis://127.0.0.1:{port}/"),
            connect_timeout: Duration::from_millis(300),
            response_timeout: Duration::from_millis(300),
            call_timeout: Duration::from_secs(1),
            ..RedisConfig::default()
        };
        match within("connect", RedisStores::connect(config)).await {
            Err(ConnectError::Refused { error, .. }) => {
                assert!(
                    error.contains("does not speak the Redis protocol"),
                    "{error}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_command_refused_for_good_names_itself_and_its_key_and_is_not_transient() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    // A user who may do everything but run scripts.
    let _: String = cmd(
        &mut con,
        &[
            "ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval",
            "-script",
        ],
    )
    .await;
    let stores = within(
        "connect",
        RedisStores::connect(config_as(&server, "noscript:pw")),
    )
    .await
    .expect("PING is allowed");
    let t = thread("refused");
    let refused = within(
        "append",
        stores.history.append(&t, &[Message::user("x")], None),
    )
    .await;
    match refused {
        Err(e @ StoreError::Rejected { .. }) => {
            assert!(!e.is_transient());
            let StoreError::Rejected {
                command,
                key,
                reason,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(command, "the history append script");
            assert_eq!(key, "runvisor:hist:{refused}");
            assert!(reason.starts_with("NOPERM"), "{reason}");
        }
        other => panic!("expected a permanent refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn stop_and_cancel_against_a_server_that_refuses_exit_3_in_one_line() {
    let server = server_with_password().await;
    let without = server.url();
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    for (url, needle) in [(&without, "NOAUTH"), (&wrong, "authentication failed")] {
        for args in [
            &["stop", "--app", "A", "--chat", "C"][..],
            &["cancel", "--task", "T"][..],
        ] {
            let (code, stdout, stderr) = runvisor(url, args);
            assert_eq!(code, Some(3), "{args:?}: {stderr}");
            assert_one_error_line(&stderr, &[needle]);
            assert!(
                !stderr.contains("wrong"),
                "the password never shows: {stderr}"
            );
            assert!(stdout.is_empty(), "no success printed: {stdout}");
        }
    }
}

#[test]
fn every_command_against_a_foreign_endpoint_exits_3_in_one_line() {
    let port = foreign_endpoint(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
    let url = format!("redis://127.0.0.1:{port}/");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("w.json");
    std::fs::write(
        &file,
        r#"{"id": "w", "nodes": [{"id": "start", "kind": "begin"}]}"#,
    )
    .expect("write workflow");
    let file = file.to_str().expect("utf-8 path");
    for args in [
        &["run", file][..],
        &["resume", "--thread", "t"][..],
        &["stop", "--app", "A", "--chat", "C"][..],
        &["ps"][..],
    ] {
        let (code, _, stderr) = runvisor(&url, args);
        assert_eq!(code, Some(3), "{args:?}: {stderr}");
        assert_one_error_line(&stderr, &["does not speak the Redis protocol"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_cancel_that_cannot_set_their_flag_exit_3_and_never_say_success() {
    let server = RedisServer::start();
    let mut con = raw(&server).await;
    // A user who may read everything but not SET: the flag cannot be written.
    let _: String = cmd(
        &mut con,
        &[
            "ACL", "SETUSER", "noset", "on", ">pw", "~*", "&*", "+@all", "-set",
        ],
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("slow.json");
    std::fs::write(
        &file,
        r#"{"id": "slow", "nodes": [
            {"id": "start", "kind": "begin"},
            {"id": "think", "kind": "sleep", "params": {"duration": "60s"}}
        ], "edges": [{"from": "start", "to": "think"}]}"#,
    )
    .expect("write workflow");
    // A live run of A/C and of task T, so that the requests are for a run that exists.
    let mut run = Command::new(BIN)
        .args(["--redis", &server.url(), "run"])
        .arg(&file)
        .args([
            "--thread", "live", "--app", "A", "--chat", "C", "--task", "T",
        ])
        .arg("--spill-dir")
        .arg(dir.path().join("spill"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the run");
    within("the run to start", async {
        loop {
            let n: i64 = cmd(&mut con, &["ZCARD", "runvisor:runs:{live}"]).await;
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let url = format!("redis://noset:pw@127.0.0.1:{}/", server.port());
    for (args, key) in [
        (
            &["stop", "--app", "A", "--chat", "C"][..],
            "agent_runtime_stopping:A:C",
        ),
        (&["cancel", "--task", "T"][..], "T-cancel"),
    ] {
        let (code, stdout, stderr) = runvisor(&url, args);
        assert_eq!(code, Some(3), "{args:?}: {stderr}");
        assert_one_error_line(&stderr, &["could not set the flag", key, "NOPERM"]);
        assert!(stdout.is_empty(), "no success printed: {stdout}");
    }
    let flags: i64 = cmd(
        &mut con,
        &["EXISTS", "agent_runtime_stopping:A:C", "T-cancel"],
    )
    .await;
    assert_eq!(flags, 0);
    let _ = run.kill();
    let _ = run.wait();
}
