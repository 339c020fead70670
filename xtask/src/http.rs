//! xtask's HTTP client for the services it starts on this machine (the live mixin check's
//! Prometheus, the pod's exporter): a GET over HTTP/1.0, so the server closes the connection
//! after the reply and the body is whatever follows the head.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// `GET path` on 127.0.0.1:`port`, reading for at most `timeout` at a time: the status and the
/// body.
pub fn get(port: u16, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(timeout))?;
    // One write: `write!` would send the request in pieces, and a server may answer the first.
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no end of the HTTP head")?;
    let status =
        head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no HTTP status")?;
    Ok((status, body.to_owned()))
}

/// A port of 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status and the body of a reply, from a server that closes the connection after it.
    #[test]
    fn a_reply_is_read_to_the_close() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // The whole head, as a server reads it, then the reply and the close.
            let mut request = Vec::new();
            let mut buf = [0u8; 256];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed before the end of its head");
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.0 404 Not Found\r\nX: y\r\n\r\nno such\r\n\r\npage").unwrap();
            String::from_utf8_lossy(&request).into_owned()
        });
        let (status, body) = get(port, "/a?b=c", Duration::from_secs(10)).unwrap();
        assert_eq!((status, body.as_str()), (404, "no such\r\n\r\npage"));
        assert!(server.join().unwrap().starts_with("GET /a?b=c HTTP/1.0\r\n"));
    }
}
