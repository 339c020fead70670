//! The bounded HTTP server: an accept loop over tokio's `TcpListener` that admits a connection
//! only within a global cap and a per-client-address share (both below the file-descriptor
//! limit), serves each admitted connection with hyper's HTTP/1 server and a timer, and closes a
//! connection that is idle too long or too slow to send its request head. With a
//! `--web.config.file` that configures TLS, an admitted connection's handshake comes first,
//! within the header-read timeout.
//!
//! A full table makes room for a newcomer by closing the oldest connection that has not yet
//! completed a request head (a silent one, a slow head, a TLS handshake in progress) of the
//! address holding the most connections, so connections that send nothing cannot lock a
//! scraper out, however many addresses hold them.
//! Only when every open connection has completed a request, or the newcomer's address holds its
//! share, is the newcomer refused: closed at once, never queued, with a cleartext `503` on plain
//! HTTP and a TLS alert on a TLS listener. Refusals and evictions are logged at a bounded rate.
//! A request head is read into at most [`MAX_HEAD_BYTES`]; an HTTP/1.1 request without exactly
//! one `Host` gets `400`.

use crate::client::{ClientAddr, client_key};
use crate::config::WebState;
use crate::ratelimit::RateLimit;
use crate::refused::Refused;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};
use tower::ServiceExt as _;

/// File descriptors kept free of HTTP connections: standard streams, the listeners, the
/// broker connections, `/proc` reads, the runtime's own (epoll, eventfd) and some slack.
pub const RESERVED_FDS: u64 = 64;

/// At most one "refused" (or "accept failed") warning per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Sent to a refused connection before it is closed, if the socket takes it at once.
const REFUSED_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\
Content-Type: text/plain; charset=utf-8\r\nContent-Length: 25\r\n\r\ntoo many open connections";

/// Sent to a refused connection on a TLS listener: a fatal `internal_error` alert record.
const REFUSED_ALERT: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50];

/// The most a connection buffers of a request head (hyper's `max_buf_size`; its minimum is
/// 8 KiB): a Prometheus request is under 1 KiB, and a longer head gets `431`.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Evicted connections whose sockets may still be open before the accept loop waits for them;
/// well within the descriptors [`RESERVED_FDS`] keeps free of connections.
const MAX_CLOSING: usize = 16;

/// How long the accept loop waits for a connection evicted to make room to close.
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// How long a shutdown waits for open connections to finish their request.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// The connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, over all listeners.
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv6: one /64).
    pub max_per_client: usize,
    /// From the moment a request's first byte arrives until its head is complete.
    pub header_read_timeout: Duration,
    /// A connection that is not handling a request and moves no byte for this long is closed.
    pub idle_timeout: Duration,
}

/// The file-descriptor soft limit of this process (`RLIMIT_NOFILE`), `None` if unlimited.
pub fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Connections the fd limit leaves room for.
pub fn connection_room(fd_limit: Option<u64>) -> usize {
    match fd_limit {
        None => usize::MAX,
        Some(n) => usize::try_from(n.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX),
    }
}

/// Counts connections, overall and per client address, and knows each one's age and whether
/// it has completed a request head.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    open: Mutex<Open>,
    refusals: RateLimit,
    evictions: RateLimit,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Every open connection by admission number: the oldest first.
    table: BTreeMap<u64, (IpAddr, Shared)>,
    next: u64,
    evicted: u64,
    /// Connections evicted whose sockets are not closed yet.
    closing: usize,
}

/// An admitted connection's place; given back on drop.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    id: u64,
    watch: Shared,
    /// The connection evicted to make room for this one, if any.
    made_room: Option<Shared>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` are open and every one has completed a request head.
    Full,
    /// This client address holds `max_per_client` connections.
    ClientShare,
}

impl Admission {
    /// Admission within `limits`.
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            open: Mutex::new(Open::default()),
            refusals: RateLimit::new(REFUSAL_LOG_INTERVAL),
            evictions: RateLimit::new(REFUSAL_LOG_INTERVAL),
        })
    }

    /// A slot for a connection from `peer`, or why there is none. When the table is full, a
    /// connection that has not completed a request head is told to close and its place given
    /// to `peer`: the oldest such connection of the address holding the most connections. A
    /// crowd of silent connections from many addresses, reconnecting as fast as it is closed,
    /// thus evicts itself and never a scraper holding one connection, however slow its
    /// handshake.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refusal> {
        let client = client_key(peer);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.per_client.get(&client).is_some_and(|held| *held >= self.limits.max_per_client) {
            return Err(Refusal::ClientShare);
        }
        let mut made_room = None;
        if open.total >= self.limits.max_connections {
            let victim = open.victim();
            let Some((victim_client, watch)) = victim.and_then(|id| open.table.remove(&id)) else {
                return Err(Refusal::Full);
            };
            open.release(victim_client);
            open.evicted += 1;
            open.closing += 1;
            watch.evicted.store(true, Ordering::SeqCst);
            watch.close.notify_one();
            made_room = Some(watch);
            if let Some(suppressed) = self.evictions.check() {
                tracing::info!(
                    client = %victim_client,
                    max_connections = self.limits.max_connections,
                    suppressed,
                    "HTTP connection closed to make room: --web.max-connections reached and it \
                     had not completed a request head"
                );
            }
        }
        *open.per_client.entry(client).or_insert(0) += 1;
        open.total += 1;
        let id = open.next;
        open.next += 1;
        let watch: Shared = Arc::new(Watch {
            phase: Mutex::new(Phase::Idle { since: Instant::now() }),
            head_started: Notify::new(),
            served: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            close: Notify::new(),
            gone: Notify::new(),
        });
        open.table.insert(id, (client, Arc::clone(&watch)));
        Ok(Slot { admission: Arc::clone(self), id, watch, made_room })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Connections evicted whose sockets are not closed yet.
    fn closing(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).closing
    }

    /// Connections closed so far to make room for others.
    pub fn evicted(&self) -> u64 {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).evicted
    }
}

impl Open {
    /// The connection to close to make room: among those without a complete request head,
    /// the oldest of the address holding the most connections.
    fn victim(&self) -> Option<u64> {
        let mut victim: Option<(u64, usize)> = None;
        for (id, (client, watch)) in &self.table {
            if watch.served.load(Ordering::SeqCst) {
                continue;
            }
            let held = self.per_client.get(client).copied().unwrap_or(0);
            // Oldest first: a later connection wins only by an address holding strictly more.
            if victim.is_none_or(|(_, most)| held > most) {
                victim = Some((*id, held));
            }
        }
        victim.map(|(id, _)| id)
    }

    fn release(&mut self, client: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(held) = self.per_client.get_mut(&client) {
            *held -= 1;
            if *held == 0 {
                self.per_client.remove(&client);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock().unwrap_or_else(|p| p.into_inner());
        // Not in the table any more when it was evicted: its place was given away then.
        if let Some((client, _)) = open.table.remove(&self.id) {
            open.release(client);
        }
        if self.watch.evicted.load(Ordering::SeqCst) {
            open.closing -= 1;
        }
        drop(open);
        self.watch.gone.notify_one();
    }
}

/// Serves `router` on `listener` within `admission`'s limits until `stop` turns true, then
/// stops accepting, lets open requests finish (at most [`SHUTDOWN_GRACE`]) and returns. Each
/// new connection takes the TLS configuration of `web` in force when it is accepted.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    admission: Arc<Admission>,
    web: Arc<WebState>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(suppressed) = admission.refusals.check() {
                    tracing::warn!(error = %e, suppressed, "cannot accept an HTTP connection");
                }
                // Out of descriptors (or another transient failure): let connections close
                // rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match admission.admit(peer.ip()) {
            Ok(mut slot) => {
                let made_room = slot.made_room.take();
                let router = router.clone();
                let stop = stop.clone();
                let limits = admission.limits;
                let web = Arc::clone(&web);
                connections.spawn(async move {
                    let watch = Arc::clone(&slot.watch);
                    tokio::select! {
                        () = connection(stream, peer, router, limits, &web, Arc::clone(&watch), stop) => {}
                        () = watch.close.notified() => {
                            tracing::debug!(client = %peer, "HTTP connection closed to make room");
                        }
                    }
                    drop(slot);
                });
                // Evictions never outrun the descriptors: past a few sockets still to close,
                // the next accept waits for this one's victim (a stuck task not for long).
                if let Some(victim) = made_room
                    && admission.closing() > MAX_CLOSING
                {
                    let _ = tokio::time::timeout(EVICTION_WAIT, victim.gone.notified()).await;
                }
            }
            Err(refusal) => refuse(stream, peer, refusal, &admission, web.current().tls.is_some()),
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        tracing::warn!(open = connections.len(), "connections still open after the shutdown grace");
    }
}

/// One admitted connection: its TLS handshake if the configuration in force has TLS (within
/// the header-read timeout), then HTTP.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    web: &WebState,
    watch: Shared,
    stop: watch::Receiver<bool>,
) {
    let config = web.for_connection().await;
    let Some(tls) = &config.tls else {
        drop(config);
        return serve_connection(stream, peer, router, limits, watch, stop).await;
    };
    let acceptor = tls.acceptor();
    drop(config);
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => serve_connection(stream, peer, router, limits, watch, stop).await,
        Ok(Err(e)) => web.refusals().refuse(Refused::of_handshake(&e), peer.ip(), &e),
        Err(_) => web.refusals().refuse(
            Refused::TlsTimeout,
            peer.ip(),
            &format_args!("{:?}", limits.header_read_timeout),
        ),
    }
}

fn refuse(stream: TcpStream, peer: SocketAddr, refusal: Refusal, admission: &Admission, tls: bool) {
    // Best effort, never waiting: a client that does not read simply gets the close. A TLS
    // client gets a TLS alert, which it can report, not cleartext it cannot parse.
    let _ = stream.try_write(if tls { REFUSED_ALERT } else { REFUSED_RESPONSE });
    drop(stream);
    if let Some(suppressed) = admission.refusals.check() {
        let limits = admission.limits;
        match refusal {
            Refusal::Full => tracing::warn!(
                client = %peer.ip(),
                max_connections = limits.max_connections,
                suppressed,
                "HTTP connection refused: --web.max-connections reached"
            ),
            Refusal::ClientShare => tracing::warn!(
                client = %peer.ip(),
                max_per_client = limits.max_per_client,
                suppressed,
                "HTTP connection refused: this client holds --web.max-connections-per-client"
            ),
        }
    }
}

/// What a connection is doing, for its watchdog.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request; the last byte moved at `since`.
    Idle { since: Instant },
    /// A request's first byte arrived at `since`; its head is not complete yet.
    Head { since: Instant },
    /// A request is being handled (bounded by the scrape budget).
    Busy,
}

/// A connection's phase, shared by its stream, its service, its watchdog, which is woken
/// when a request's first byte arrives (its deadline moves closer), and the admission table.
#[derive(Debug)]
struct Watch {
    phase: Mutex<Phase>,
    head_started: Notify,
    /// A request head was completed on this connection: it is no longer evicted for room.
    served: AtomicBool,
    /// The connection was evicted (and told to close) to make room for another.
    evicted: AtomicBool,
    /// Notified when the connection is evicted to make room for another.
    close: Notify,
    /// Notified when its slot is given back (its socket closed).
    gone: Notify,
}

type Shared = Arc<Watch>;

fn set(watch: &Shared, to: Phase) {
    *watch.phase.lock().unwrap_or_else(|p| p.into_inner()) = to;
}

fn get(watch: &Shared) -> Phase {
    *watch.phase.lock().unwrap_or_else(|p| p.into_inner())
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    phase: Shared,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    set(&phase, Phase::Idle { since: Instant::now() });
    let io = TokioIo::new(Watched { io: stream, phase: Arc::clone(&phase) });
    let service_phase = Arc::clone(&phase);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        service_phase.served.store(true, Ordering::SeqCst);
        let busy = BusyGuard::new(Arc::clone(&service_phase));
        let router = router.clone();
        async move {
            let response = if host_is_valid(&request) {
                request.extensions_mut().insert(ClientAddr(peer.ip()));
                router.oneshot(request).await
            } else {
                Ok(bad_request())
            };
            drop(busy);
            response
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .max_buf_size(MAX_HEAD_BYTES)
        // Hyper's own head timer runs from when the connection waits for a request, so it
        // also bounds idle keep-alive time; it backs up the watchdog below.
        .header_read_timeout(limits.idle_timeout + limits.header_read_timeout);
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        let check = match get(&phase) {
            Phase::Idle { since } => since + limits.idle_timeout,
            Phase::Head { since } => since + limits.header_read_timeout,
            Phase::Busy => Instant::now() + limits.idle_timeout,
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(client = %peer, error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = sleep_until(check) => {
                let now = Instant::now();
                let expired = match get(&phase) {
                    Phase::Idle { since } => now >= since + limits.idle_timeout,
                    Phase::Head { since } => now >= since + limits.header_read_timeout,
                    Phase::Busy => false,
                };
                if expired {
                    tracing::debug!(client = %peer, "HTTP connection closed: idle or request head too slow");
                    return;
                }
            }
            _ = phase.head_started.notified() => {}
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request carries exactly one `Host` (HTTP/1.0 may omit it).
fn host_is_valid<B>(request: &hyper::Request<B>) -> bool {
    let hosts = request.headers().get_all(axum::http::header::HOST).iter().count();
    match request.version() {
        axum::http::Version::HTTP_10 | axum::http::Version::HTTP_09 => hosts <= 1,
        _ => hosts == 1,
    }
}

fn bad_request() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let body = "Bad Request: an HTTP/1.1 request needs exactly one Host header\n";
    (axum::http::StatusCode::BAD_REQUEST, body).into_response()
}

/// Marks the connection busy while a request is handled, idle again when it is done (also
/// when the handler is cancelled).
struct BusyGuard(Shared);

impl BusyGuard {
    fn new(phase: Shared) -> BusyGuard {
        set(&phase, Phase::Busy);
        BusyGuard(phase)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        set(&self.0, Phase::Idle { since: Instant::now() });
    }
}

/// A stream that tells its connection's watchdog when bytes move.
struct Watched<S> {
    io: S,
    phase: Shared,
}

impl<S> Watched<S> {
    fn moved(&self, read: bool) {
        let mut phase = self.phase.phase.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match *phase {
            Phase::Idle { .. } if read => {
                *phase = Phase::Head { since: now };
                self.phase.head_started.notify_one();
            }
            Phase::Idle { .. } => *phase = Phase::Idle { since: now },
            Phase::Head { .. } | Phase::Busy => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved(true);
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.moved(false);
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.moved(false);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn limits(max: usize, per_client: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_client: per_client,
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn one_client_cannot_take_more_than_its_share() {
        let admission = Admission::new(limits(10, 3));
        let held: Vec<Slot> = (0..3).map(|_| admission.admit(ip(2)).unwrap()).collect();
        assert_eq!(admission.admit(ip(2)).unwrap_err(), Refusal::ClientShare);
        let other = admission.admit(ip(3)).unwrap();
        drop(held);
        assert_eq!(admission.open(), 1);
        assert!(admission.admit(ip(2)).is_ok());
        drop(other);
    }

    #[test]
    fn the_global_cap_holds_over_all_clients_and_frees_on_drop() {
        let admission = Admission::new(limits(4, 4));
        let held: Vec<Slot> = (1..=4).map(|i| admission.admit(ip(i)).unwrap()).collect();
        for slot in &held {
            slot.watch.served.store(true, Ordering::SeqCst);
        }
        assert_eq!(admission.admit(ip(9)).unwrap_err(), Refusal::Full);
        drop(held);
        assert_eq!(admission.open(), 0);
        assert!(admission.open.lock().unwrap().per_client.is_empty());
    }

    #[test]
    fn a_full_table_evicts_the_oldest_connection_without_a_request_head() {
        let admission = Admission::new(limits(3, 3));
        let held: Vec<Slot> = (1..=3).map(|i| admission.admit(ip(i)).unwrap()).collect();
        // The oldest has completed a request: the next oldest, silent, makes room.
        held[0].watch.served.store(true, Ordering::SeqCst);
        let newcomer = admission.admit(ip(9)).unwrap();
        assert_eq!((admission.open(), admission.evicted()), (3, 1));
        let open = admission.open.lock().unwrap();
        assert!(!open.per_client.contains_key(&ip(2)), "{:?}", open.per_client);
        assert_eq!(open.table.keys().copied().collect::<Vec<_>>(), [0, 2, 3]);
        drop(open);
        // The evicted connection was told to close; its slot's drop gives back nothing twice.
        assert!(futures_now(held[1].watch.close.notified()));
        drop(held);
        assert_eq!(admission.open(), 1);
        drop(newcomer);
        assert_eq!(admission.open(), 0);
    }

    #[test]
    fn a_crowd_reconnecting_from_many_addresses_evicts_itself_not_a_lone_scraper() {
        let admission = Admission::new(limits(4, 8));
        // Two addresses of a crowd hold the oldest connections; a scraper comes last.
        let mut crowd: Vec<Slot> =
            [2, 3, 2].iter().map(|i| admission.admit(ip(*i)).unwrap()).collect();
        let scraper = admission.admit(ip(200)).unwrap();
        // The crowd reconnects, again and again, long before the scraper's request head.
        for round in 0..12u8 {
            crowd.push(admission.admit(ip(2 + round % 2)).unwrap());
            assert!(
                !scraper.watch.evicted.load(Ordering::SeqCst),
                "the scraper was evicted at round {round}"
            );
        }
        assert_eq!((admission.open(), admission.evicted()), (4, 12));
        // Among the crowd, the address holding more loses its oldest connection first.
        let open = admission.open.lock().unwrap();
        assert_eq!(open.per_client.get(&ip(200)), Some(&1));
        assert_eq!(open.per_client.values().sum::<usize>(), 4);
        drop(open);
        drop((crowd, scraper));
        assert_eq!(admission.open(), 0);
    }

    #[test]
    fn eviction_takes_the_oldest_silent_connection_of_the_busiest_address() {
        let admission = Admission::new(limits(4, 4));
        let held: Vec<Slot> =
            [1, 2, 2, 3].iter().map(|i| admission.admit(ip(*i)).unwrap()).collect();
        let newcomer = admission.admit(ip(9)).unwrap();
        // 127.0.0.2 holds two: its older connection (admission 1) goes, not the oldest (0).
        assert!(held[1].watch.evicted.load(Ordering::SeqCst));
        assert!(!held[0].watch.evicted.load(Ordering::SeqCst));
        assert!(!held[2].watch.evicted.load(Ordering::SeqCst));
        drop((held, newcomer));
        assert_eq!(admission.open(), 0);
    }

    /// Whether `future` is ready at its first poll.
    fn futures_now<F: std::future::Future>(future: F) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        std::pin::pin!(future).poll(&mut cx).is_ready()
    }

    #[test]
    fn ipv6_clients_share_by_slash_64_and_mapped_ipv4_is_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        assert_eq!(client_key(mapped), ip(2));
    }

    #[test]
    fn connection_room_keeps_reserved_descriptors() {
        assert_eq!(connection_room(Some(1024)), 960);
        assert_eq!(connection_room(Some(10)), 0);
        assert_eq!(connection_room(None), usize::MAX);
    }

    /// A refused TLS handshake is counted by its reason (and logged, at a bounded rate).
    #[tokio::test]
    async fn refused_handshakes_are_counted_by_reason() {
        use crate::refused::Refused;
        use crate::tls::tests::{Pki, self_signed};
        let pki = Pki::new();
        let path = pki.dir.path().join("web.yml");
        let yaml = "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  \
                    client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n";
        std::fs::write(&path, yaml).unwrap();
        let web = WebState::load(&path).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve(
            listener,
            Router::new().route("/", axum::routing::get(|| async { "served" })),
            Admission::new(limits(8, 8)),
            Arc::clone(&web),
            stopped,
        ));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        for (client, reason) in [
            (None, Refused::ClientCertificateMissing),
            (Some(self_signed(&["intruder"])), Refused::ClientCertificate),
        ] {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let mut stream = pki.connector(client).connect(name.clone(), tcp).await.unwrap();
            // With TLS 1.3 the server's verdict comes after the client's last flight.
            let mut buf = [0u8; 1];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while web.refusals().count(reason) == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(web.refusals().count(reason), 1, "{reason:?}");
        }
        assert_eq!(web.refusals().count(Refused::TlsHandshake), 0);
        stop.send_replace(true);
        server.await.unwrap();
    }
}
