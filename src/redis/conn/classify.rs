//! What a Redis error means for the caller: worth retrying later (transient) or not
//! (permanent), as a [`StoreError`] naming the command and the key.
//!
//! redis-rs says how a request may be retried ([`RedisError::retry_method`]); runvisor follows
//! it, with these exceptions, because runvisor retries whole store calls up to a deadline
//! rather than a connection's requests:
//!
//! - transient although redis-rs would not retry them: `BUSY` (a script is running),
//!   `NOREPLICAS`, `OOM`, `MISCONF` (the server refuses writes until memory or disk is freed)
//!   and `ERR max number of clients reached`;
//! - permanent although redis-rs would reconnect: a failed authentication (`WRONGPASS`,
//!   `NOAUTH`), and a reply that does not parse (the endpoint does not speak the Redis
//!   protocol: an HTTP server, another service on the port). Reconnecting gives the same
//!   answer.
//!
//! Transient: I/O errors (refused, reset, dropped connections), time-outs, `LOADING`,
//! `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY` (a failover in progress), `MOVED` and
//! `ASK` that the connection did not resolve. Permanent: `WRONGTYPE` (reported as
//! [`StoreError::Corrupt`]: the key holds something else), `NOAUTH`, `WRONGPASS`, `NOPERM`,
//! `CROSSSLOT`, `EXECABORT`, `NOSCRIPT` (after the script was loaded again), script errors and
//! every other `ERR`.

use ::redis::{ErrorKind, RedisError, RetryMethod, ServerError, ServerErrorKind};
use runvisor_actors::StoreError;

/// Server error codes runvisor retries although redis-rs does not.
const TRANSIENT_CODES: [&str; 4] = ["BUSY", "NOREPLICAS", "OOM", "MISCONF"];

/// Whether a Redis error may go away if the same call is tried again later.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    if e.is_timeout() {
        return true;
    }
    match e.kind() {
        // Credentials and protocols do not fix themselves.
        ErrorKind::AuthenticationFailed | ErrorKind::Parse => false,
        ErrorKind::Extension => e.code().is_some_and(|code| TRANSIENT_CODES.contains(&code)),
        ErrorKind::Server(ServerErrorKind::ResponseError) => e
            .detail()
            .is_some_and(|d| d.starts_with("max number of clients")),
        _ => !matches!(e.retry_method(), RetryMethod::NoRetry),
    }
}

/// A Redis error as a store error: `command` and `key` say what was refused.
pub(crate) fn store_error(
    command: &str,
    key: &str,
    e: &RedisError,
    response_timeout: std::time::Duration,
) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(response_timeout);
    }
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt {
            key: key.to_owned(),
            reason: format!("{command}: the key holds a value of another type"),
        };
    }
    if is_transient(e) {
        return StoreError::Unavailable(format!("redis: {command} on {key}: {}", describe(e)));
    }
    StoreError::Rejected {
        command: command.to_owned(),
        key: key.to_owned(),
        reason: describe(e),
    }
}

/// A per-command error reply (a pipeline's, with `ignore_errors`) as a store error.
pub(crate) fn server_error(command: &str, key: &str, e: &ServerError) -> StoreError {
    store_error(
        command,
        key,
        &RedisError::from(e.clone()),
        std::time::Duration::ZERO,
    )
}

/// What went wrong, in one line: the server's code and message, or what the client saw.
pub(crate) fn describe(e: &RedisError) -> String {
    let text = match e.kind() {
        ErrorKind::Parse => {
            "the server does not speak the Redis protocol (its reply does not parse)".to_owned()
        }
        ErrorKind::AuthenticationFailed => format!("authentication failed ({e})"),
        _ => match e.code() {
            // As the server wrote it: `NOPERM User u has no permissions ...`.
            Some(code) => format!("{code} {}", e.detail().unwrap_or_default()),
            None => e.to_string(),
        },
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The name of a command (its first argument), for errors.
pub(crate) fn command_name(cmd: &::redis::Cmd) -> String {
    match cmd.args_iter().next() {
        Some(::redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_uppercase(),
        _ => "a command".to_owned(),
    }
}

/// The names of a pipeline's commands (`HSET+PEXPIRE`), for errors.
pub(crate) fn pipeline_name(pipe: &::redis::Pipeline) -> String {
    let mut names: Vec<String> = Vec::new();
    for cmd in pipe.cmd_iter() {
        let name = command_name(cmd);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        "an empty pipeline".to_owned()
    } else {
        names.join("+")
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use super::*;

    /// The error a server reply line (`-CODE detail`) gives.
    fn reply(line: &str) -> RedisError {
        match ::redis::parse_redis_value(format!("{line}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(e)) => RedisError::from(e),
            other => panic!("{line}: not a server error: {other:?}"),
        }
    }

    fn io(kind: io::ErrorKind) -> RedisError {
        RedisError::from(io::Error::new(kind, "test"))
    }

    fn classify(e: &RedisError) -> StoreError {
        store_error("EVALSHA", "k", e, Duration::from_millis(5))
    }

    #[test]
    fn outages_and_try_again_replies_are_transient() {
        for e in [
            io(io::ErrorKind::ConnectionRefused),
            io(io::ErrorKind::ConnectionReset),
            io(io::ErrorKind::BrokenPipe),
            io(io::ErrorKind::UnexpectedEof),
            reply("-LOADING Redis is loading the dataset in memory"),
            reply("-BUSY Redis is busy running a script"),
            reply("-TRYAGAIN Multiple keys request during rehashing of slot"),
            reply("-MASTERDOWN Link with MASTER is down"),
            reply("-CLUSTERDOWN The cluster is down"),
            reply("-READONLY You can't write against a read only replica."),
            reply("-MOVED 3999 127.0.0.1:6381"),
            reply("-ASK 3999 127.0.0.1:6381"),
            reply("-OOM command not allowed when used memory > 'maxmemory'."),
            reply("-NOREPLICAS Not enough good replicas to write."),
            reply("-ERR max number of clients reached"),
        ] {
            assert!(is_transient(&e), "{e}");
            assert!(classify(&e).is_transient(), "{e}");
        }
        assert_eq!(
            classify(&io(io::ErrorKind::TimedOut)),
            StoreError::Timeout(Duration::from_millis(5))
        );
    }

    #[test]
    fn refusals_are_permanent_and_name_the_command_and_key() {
        for (line, code) in [
            ("-NOAUTH Authentication required.", "NOAUTH"),
            (
                "-WRONGPASS invalid username-password pair or user is disabled.",
                "WRONGPASS",
            ),
            (
                "-NOPERM User u has no permissions to run the 'evalsha' command",
                "NOPERM",
            ),
            (
                "-CROSSSLOT Keys in request don't hash to the same slot",
                "CROSSSLOT",
            ),
            ("-NOSCRIPT No matching script.", "NOSCRIPT"),
            (
                "-ERR Error running script (call to f_0123): @user_script:1: boom",
                "Error running script",
            ),
            ("-EXECABORT Transaction discarded", "EXECABORT"),
        ] {
            let e = reply(line);
            assert!(!is_transient(&e), "{line}");
            match classify(&e) {
                StoreError::Rejected {
                    command,
                    key,
                    reason,
                } => {
                    assert_eq!((command.as_str(), key.as_str()), ("EVALSHA", "k"));
                    assert!(reason.contains(code), "{line}: {reason}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        match classify(&reply(
            "-WRONGTYPE Operation against a key holding the wrong kind",
        )) {
            StoreError::Corrupt { key, reason } => {
                assert_eq!(key, "k");
                assert!(reason.starts_with("EVALSHA: "), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(!classify(&auth).is_transient());
        let denied = io(io::ErrorKind::PermissionDenied);
        assert!(!classify(&denied).is_transient());
    }

    #[test]
    fn a_reply_that_does_not_parse_is_a_foreign_endpoint() {
        let e = ::redis::parse_redis_value(b"HTTP/1.0 400 Bad Request\r\n").expect_err("not RESP");
        match classify(&e) {
            StoreError::Rejected { reason, .. } => {
                assert!(
                    reason.contains("does not speak the Redis protocol"),
                    "{reason}"
                );
                assert!(!reason.contains('\n'));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commands_are_named_by_their_first_argument() {
        let mut cmd = ::redis::cmd("mget");
        cmd.arg("a").arg("b");
        assert_eq!(command_name(&cmd), "MGET");
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET")
            .arg("k")
            .arg("f")
            .arg("v")
            .cmd("PEXPIRE")
            .arg("k")
            .arg(1);
        pipe.cmd("HSET").arg("j").arg("f").arg("v");
        assert_eq!(pipeline_name(&pipe), "HSET+PEXPIRE");
        assert_eq!(pipeline_name(&::redis::pipe()), "an empty pipeline");
    }
}
