//! Which process a Redis on a loopback port is, for the test and bench harnesses that start
//! their own `redis-server`: a server that could not bind its port (another listens there)
//! must not be taken for the one answering, or the harness would use, and flush, a Redis it
//! did not start.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

/// The process id of the Redis answering on `port` (`INFO server`'s `process_id`), if one
/// answers: a server that failed to bind leaves the port to whoever holds it.
pub(crate) fn server_pid(port: u16) -> Option<u32> {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let mut stream = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    // A bulk string: `$<length>\r\n<text>\r\n`.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    let text = loop {
        let read = stream.read(&mut chunk).ok()?;
        if read == 0 {
            return None;
        }
        reply.extend_from_slice(&chunk[..read]);
        if reply.first() != Some(&b'$') {
            return None;
        }
        let Some(header_end) = reply.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let length: usize = std::str::from_utf8(reply.get(1..header_end)?)
            .ok()?
            .parse()
            .ok()?;
        if let Some(text) = reply.get(header_end + 2..header_end + 2 + length) {
            break String::from_utf8_lossy(text).into_owned();
        }
    };
    text.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}
