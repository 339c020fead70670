//! The bounded HTTP server in process: connection caps per client and overall, the
//! header-read and idle timeouts, keep-alive, and the concurrent-scrape cap.

use crate::support::*;
use amd_hsmp_web::server::{self, Admission, Limits};
use axum::http::StatusCode;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// A running server on 127.0.0.1; stops when dropped.
struct Server {
    addr: SocketAddr,
    admission: Arc<Admission>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(limits: Limits, router: axum::Router) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admission = Admission::new(limits);
        let (stop, stop_rx) = watch::channel(false);
        let web = amd_hsmp_web::config::WebState::open();
        let task = tokio::spawn(server::serve(listener, router, admission.clone(), web, stop_rx));
        Server { addr, admission, stop, task }
    }
}

fn limits() -> Limits {
    Limits {
        max_connections: 8,
        max_per_client: 2,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
    }
}

/// A connection from loopback address `127.0.0.<client>`.
async fn connect_from(client: u8, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, client], 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads until the peer closes; the bytes read. Fails the test after 20 s.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out))
        .await
        .expect("the server never closed the connection")
        .unwrap_or_default();
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends one keep-alive request and reads one response with a Content-Length body.
async fn request(stream: &mut TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed mid-response: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len {
                return text.into_owned();
            }
        }
    }
}

#[tokio::test]
async fn one_client_gets_its_share_and_others_are_still_served() {
    let dir = socket_dir();
    let server = Server::start(limits(), router(config(&dir.path))).await;
    let _a = connect_from(2, server.addr).await;
    let _b = connect_from(2, server.addr).await;
    let mut refused = connect_from(2, server.addr).await;
    let answer = read_to_close(&mut refused).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    let mut other = connect_from(3, server.addr).await;
    assert!(request(&mut other, "/").await.starts_with("HTTP/1.1 200"));
    assert_eq!(server.admission.open(), 3);
}

#[tokio::test]
async fn a_full_table_closes_the_oldest_silent_connection_for_a_newcomer() {
    let dir = socket_dir();
    let limits = Limits { max_connections: 3, max_per_client: 3, ..limits() };
    let server = Server::start(limits, router(config(&dir.path))).await;
    let mut held = Vec::new();
    for client in 2..5 {
        held.push(connect_from(client, server.addr).await);
        until("admitted", || server.admission.open() == held.len()).await;
    }
    // The newcomer is served; the oldest silent connection is closed for it.
    let mut newcomer = connect_from(5, server.addr).await;
    assert!(request(&mut newcomer, "/").await.starts_with("HTTP/1.1 200"));
    assert_eq!(read_to_close(&mut held[0]).await, "");
    assert_eq!(server.admission.evicted(), 1);
    // A connection that completed a request keeps its place: the next silent one goes.
    let mut second = connect_from(6, server.addr).await;
    assert!(request(&mut second, "/").await.starts_with("HTTP/1.1 200"));
    assert_eq!(read_to_close(&mut held[1]).await, "");
    assert!(request(&mut newcomer, "/").await.starts_with("HTTP/1.1 200"));
    held.drain(..2);
    assert!(request(&mut held[0], "/").await.starts_with("HTTP/1.1 200"));
    // Every open connection has completed a request now: a newcomer is refused, not queued.
    let mut refused = connect_from(7, server.addr).await;
    assert!(read_to_close(&mut refused).await.starts_with("HTTP/1.1 503"));
    drop((held, newcomer, second));
    // Slots come back as the connections close.
    until("slots freed", || server.admission.open() == 0).await;
    let mut again = connect_from(7, server.addr).await;
    assert!(request(&mut again, "/").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn an_http11_request_without_exactly_one_host_gets_400() {
    let dir = socket_dir();
    let server = Server::start(limits(), router(config(&dir.path))).await;
    for (request, status) in [
        ("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", "HTTP/1.1 400"),
        ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n", "HTTP/1.1 400"),
        ("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", "HTTP/1.1 200"),
        ("GET / HTTP/1.0\r\n\r\n", "HTTP/1.0 200"),
    ] {
        let mut stream = connect_from(2, server.addr).await;
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_to_close(&mut stream).await;
        assert!(answer.starts_with(status), "{request:?}: {answer}");
    }
}

#[tokio::test]
async fn a_request_head_longer_than_the_buffer_gets_431_and_a_close() {
    let dir = socket_dir();
    let server = Server::start(limits(), router(config(&dir.path))).await;
    let mut stream = connect_from(2, server.addr).await;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ").await.unwrap();
    // Never ended: the server stops reading at its buffer's bound, not at the client's will.
    let filler = vec![b'a'; server::MAX_HEAD_BYTES];
    let _ = stream.write_all(&filler).await;
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

#[tokio::test]
async fn a_request_head_sent_too_slowly_is_cut_off() {
    let dir = socket_dir();
    let header_read_timeout = Duration::from_millis(300);
    let limits = Limits { header_read_timeout, ..limits() };
    let server = Server::start(limits, router(config(&dir.path))).await;
    let mut slow = connect_from(2, server.addr).await;
    let started = Instant::now();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    read_to_close(&mut slow).await;
    assert!(started.elapsed() >= header_read_timeout);
    until("slot freed", || server.admission.open() == 0).await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout_and_keep_alive_works() {
    let dir = socket_dir();
    let idle_timeout = Duration::from_millis(300);
    let limits = Limits { idle_timeout, ..limits() };
    let server = Server::start(limits, router(config(&dir.path))).await;
    let mut client = connect_from(2, server.addr).await;
    // Two requests on one connection.
    assert!(request(&mut client, "/").await.starts_with("HTTP/1.1 200"));
    assert!(request(&mut client, "/nothing").await.starts_with("HTTP/1.1 404"));
    let idle_since = Instant::now();
    assert_eq!(read_to_close(&mut client).await, "");
    assert!(idle_since.elapsed() >= idle_timeout);
    // A connection that never sends a byte goes the same way.
    let mut silent = connect_from(3, server.addr).await;
    assert_eq!(read_to_close(&mut silent).await, "");
}

#[tokio::test]
async fn shutdown_stops_accepting_and_returns() {
    let dir = socket_dir();
    let server = Server::start(limits(), router(config(&dir.path))).await;
    let _idle = connect_from(2, server.addr).await;
    server.stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(20), server.task).await.unwrap().unwrap();
    assert!(TcpStream::connect(server.addr).await.is_err());
}

#[tokio::test]
async fn scrapes_beyond_max_requests_get_503_at_once() {
    let dir = socket_dir();
    let gate = Arc::new(Semaphore::new(0));
    let broker = MockBroker::start(
        &dir.path,
        Behaviour { hold: Some(gate.clone()), ..Behaviour::healthy() },
    );
    let mut config = config(&dir.path);
    config.max_requests = 1;
    let router = router(config);
    let first = spawn_scrape(&router, "10");
    until("the first scrape reached the broker", || broker.samples() == 1).await;
    let refused = get(&router, "/metrics", None, Some("10")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.body.contains("Limit of concurrent requests reached (1)"), "{}", refused.body);
    gate.add_permits(2);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    // The place is free again.
    assert_eq!(get(&router, "/metrics", None, Some("10")).await.status, StatusCode::OK);
}
