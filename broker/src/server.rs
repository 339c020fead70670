//! The Unix-socket server: peer checks, bounded connections, strict framing, the handshake.
//!
//! One thread per connection (at most [`ServerConfig::max_connections`]), one request at a time
//! per connection. A peer that is not allowed, a malformed or oversized frame, a frame that does
//! not arrive in time, or an idle connection closes that connection and nothing else.

use amd_hsmp_proto::{
    self as proto, FrameError, Message, PROTOCOL_VERSION, Reply, Request, RequestError,
};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What answers the requests: the sampler in production, a fake in tests.
pub trait Backend: Send + Sync {
    /// The discovered machine.
    fn topology(&self) -> &proto::Topology;
    /// One reading of `what`, with no message sent after `deadline`.
    fn sample(&self, what: proto::Families, deadline: Instant) -> proto::Sample;
}

/// Fixed facts sent in the handshake.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Random per broker start.
    pub instance: u64,
    /// Simulator profile, when simulating.
    pub simulated: Option<String>,
}

/// Who may connect, and the bounds on each connection.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Peer uids served besides root.
    pub allow_uids: Vec<u32>,
    /// Peer gids (the peer's effective gid, as `SO_PEERCRED` reports it) served.
    pub allow_gids: Vec<u32>,
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Once a frame has started, all of it must arrive within this.
    pub frame_timeout: Duration,
    /// Upper bound on a request's deadline.
    pub max_deadline: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            max_connections: 4,
            idle_timeout: Duration::from_secs(300),
            frame_timeout: Duration::from_secs(2),
            max_deadline: Duration::from_secs(60),
        }
    }
}

/// Credentials of a connected peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Process id at connect time.
    pub pid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
}

impl ServerConfig {
    /// Whether `peer` may use the broker: root, or a listed uid or gid.
    pub fn allows(&self, peer: &Peer) -> bool {
        peer.uid == 0 || self.allow_uids.contains(&peer.uid) || self.allow_gids.contains(&peer.gid)
    }
}

fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(stream)?;
    Ok(Peer {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
    })
}

/// Serves `listener` until it fails. Each accepted connection runs on its own thread.
pub fn serve(
    listener: UnixListener,
    backend: Arc<dyn Backend>,
    identity: Identity,
    config: ServerConfig,
) -> io::Result<()> {
    let active = Arc::new(AtomicUsize::new(0));
    let identity = Arc::new(identity);
    let config = Arc::new(config);
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors or memory: back off instead of spinning.
            Err(e) if is_transient_accept_error(&e) => {
                tracing::warn!(error = %e, "accept failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(e),
        };
        let peer = match peer_of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read peer credentials; closing");
                continue;
            }
        };
        if !config.allows(&peer) {
            tracing::warn!(
                uid = peer.uid,
                gid = peer.gid,
                pid = peer.pid,
                "peer not allowed; closing"
            );
            continue;
        }
        if active.fetch_add(1, Ordering::SeqCst) >= config.max_connections {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                uid = peer.uid,
                pid = peer.pid,
                max = config.max_connections,
                "too many connections; closing"
            );
            continue;
        }
        let (backend, identity, config, done) =
            (backend.clone(), identity.clone(), config.clone(), active.clone());
        let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
            tracing::debug!(uid = peer.uid, pid = peer.pid, "connection accepted");
            match handle(stream, backend.as_ref(), &identity, &config) {
                Ok(()) => tracing::debug!(uid = peer.uid, pid = peer.pid, "connection closed"),
                Err(e) => tracing::warn!(
                    uid = peer.uid,
                    pid = peer.pid,
                    error = %ErrorChain(&e),
                    "connection dropped"
                ),
            }
            done.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(error = %e, "cannot start a connection thread; closing");
        }
    }
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Reading or decoding a request failed.
    #[error("bad request frame")]
    Frame(#[source] FrameError),
    /// A frame started but did not complete in time.
    #[error("frame not completed within {0:?}")]
    FrameTimeout(Duration),
    /// Writing the reply failed.
    #[error("cannot send reply")]
    Reply(#[source] FrameError),
    /// The peer speaks another protocol version.
    #[error("peer protocol version {0} is not {PROTOCOL_VERSION}")]
    VersionMismatch(u32),
}

struct ErrorChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

enum Next {
    Request(Request),
    Idle,
    Closed,
}

/// Reads one request: waits up to the idle timeout for its first byte, then gives the rest of
/// the frame `frame_timeout` in total.
fn read_request(stream: &mut UnixStream, config: &ServerConfig) -> Result<Next, ConnectionError> {
    let io_err = |e| ConnectionError::Frame(FrameError::Io(e));
    stream.set_read_timeout(Some(config.idle_timeout)).map_err(io_err)?;
    let mut prefix = [0u8; 4];
    let first = loop {
        match stream.read(&mut prefix[..1]) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Ok(Next::Idle),
            Err(e) => return Err(io_err(e)),
        }
    };
    if first == 0 {
        return Ok(Next::Closed);
    }
    let started = Instant::now();
    read_until(stream, &mut prefix[1..], started, config.frame_timeout)?;
    let len = Request::parse_len(prefix).map_err(ConnectionError::Frame)?;
    let mut payload = vec![0u8; len];
    read_until(stream, &mut payload, started, config.frame_timeout)?;
    Request::decode(&payload).map(Next::Request).map_err(ConnectionError::Frame)
}

fn read_until(
    stream: &mut UnixStream,
    mut buf: &mut [u8],
    started: Instant,
    limit: Duration,
) -> Result<(), ConnectionError> {
    while !buf.is_empty() {
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(ConnectionError::FrameTimeout(limit));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| ConnectionError::Frame(FrameError::Io(e)))?;
        match stream.read(buf) {
            Ok(0) => return Err(ConnectionError::Frame(FrameError::Truncated)),
            Ok(n) => buf = std::mem::take(&mut buf).get_mut(n..).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(ConnectionError::FrameTimeout(limit)),
            Err(e) => return Err(ConnectionError::Frame(FrameError::Io(e))),
        }
    }
    Ok(())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn send(stream: &mut UnixStream, reply: &Reply) -> Result<(), ConnectionError> {
    let frame = reply.to_frame().map_err(ConnectionError::Reply)?;
    stream.write_all(&frame).map_err(|e| ConnectionError::Reply(FrameError::Io(e)))
}

/// Serves one connection until the peer closes it, it idles out, or it misbehaves.
pub fn handle(
    mut stream: UnixStream,
    backend: &dyn Backend,
    identity: &Identity,
    config: &ServerConfig,
) -> Result<(), ConnectionError> {
    // A peer that stops reading must not pin this thread forever.
    stream
        .set_write_timeout(Some(config.frame_timeout))
        .map_err(|e| ConnectionError::Reply(FrameError::Io(e)))?;
    let mut greeted = false;
    loop {
        let request = match read_request(&mut stream, config)? {
            Next::Request(request) => request,
            Next::Idle => {
                tracing::debug!("idle connection closed");
                return Ok(());
            }
            Next::Closed => return Ok(()),
        };
        let reply = match request {
            Request::Hello { protocol_version } if protocol_version != PROTOCOL_VERSION => {
                send(
                    &mut stream,
                    &Reply::Error(RequestError::VersionMismatch {
                        broker: PROTOCOL_VERSION,
                        peer: protocol_version,
                    }),
                )?;
                return Err(ConnectionError::VersionMismatch(protocol_version));
            }
            Request::Hello { .. } => {
                greeted = true;
                Reply::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    broker_version: env!("CARGO_PKG_VERSION").to_string(),
                    instance: identity.instance,
                    simulated: identity.simulated.clone(),
                }
            }
            _ if !greeted => Reply::Error(RequestError::HelloRequired),
            Request::Topology => Reply::Topology(backend.topology().clone()),
            Request::Sample { what, deadline_ms } => {
                let budget = Duration::from_millis(u64::from(deadline_ms)).min(config.max_deadline);
                Reply::Sample(backend.sample(what, Instant::now() + budget))
            }
        };
        send(&mut stream, &reply)?;
    }
}

/// A random instance id, from the standard library's OS-seeded hasher keys.
pub fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::UNIX_EPOCH.elapsed().map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::{Core, DeviceStatus, Families, Readings, Sample, Topology};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Fake {
        topology: Topology,
        deadlines: Mutex<Vec<Duration>>,
    }

    impl Backend for Fake {
        fn topology(&self) -> &Topology {
            &self.topology
        }
        fn sample(&self, what: Families, deadline: Instant) -> Sample {
            self.deadlines.lock().unwrap().push(deadline.saturating_duration_since(Instant::now()));
            let r = |on: bool| {
                if on { Readings::Values(vec![Ok(true)]) } else { Readings::NotRequested }
            };
            Sample {
                hsmp: DeviceStatus::Ready { protocol_version: 7 },
                energy_source: None,
                energy: Readings::NotRequested,
                boost_limit: Readings::NotRequested,
                prochot: r(what.prochot),
            }
        }
    }

    fn fake() -> Fake {
        Fake {
            topology: Topology {
                cpu_family: 0x1A,
                cpu_model: 0x11,
                sockets: vec![0],
                cores: vec![Core { socket: 0, core: 0, cpu: 0, apic_id: 0 }],
            },
            deadlines: Mutex::default(),
        }
    }

    fn config() -> ServerConfig {
        ServerConfig {
            idle_timeout: Duration::from_millis(300),
            frame_timeout: Duration::from_millis(200),
            ..ServerConfig::default()
        }
    }

    /// Runs `handle` on one end of a socket pair and gives the other end to the test.
    fn connect(
        backend: Arc<Fake>,
        config: ServerConfig,
    ) -> (UnixStream, std::thread::JoinHandle<Result<(), ConnectionError>>) {
        let (client, server) = UnixStream::pair().unwrap();
        let identity = Identity { instance: 42, simulated: Some("turin-2p".into()) };
        let t = std::thread::spawn(move || handle(server, backend.as_ref(), &identity, &config));
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (client, t)
    }

    fn call(client: &mut UnixStream, req: &Request) -> Reply {
        req.write(client).unwrap();
        Reply::read(client).unwrap()
    }

    fn hello() -> Request {
        Request::Hello { protocol_version: PROTOCOL_VERSION }
    }

    #[test]
    fn handshake_then_topology_then_sample() {
        let backend = Arc::new(fake());
        let (mut c, t) = connect(backend.clone(), config());
        match call(&mut c, &hello()) {
            Reply::Hello { protocol_version, instance, simulated, .. } => {
                assert_eq!(protocol_version, PROTOCOL_VERSION);
                assert_eq!(instance, 42);
                assert_eq!(simulated.as_deref(), Some("turin-2p"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(call(&mut c, &Request::Topology), Reply::Topology(backend.topology.clone()));
        let what = Families { prochot: true, ..Families::default() };
        match call(&mut c, &Request::Sample { what, deadline_ms: 5000 }) {
            Reply::Sample(s) => {
                assert_eq!(s.prochot, Readings::Values(vec![Ok(true)]))
            }
            other => panic!("{other:?}"),
        }
        drop(c);
        assert!(t.join().unwrap().is_ok());
    }

    #[test]
    fn requests_before_hello_are_refused_but_the_connection_stays() {
        let (mut c, _t) = connect(Arc::new(fake()), config());
        assert_eq!(call(&mut c, &Request::Topology), Reply::Error(RequestError::HelloRequired));
        assert!(matches!(call(&mut c, &hello()), Reply::Hello { .. }));
    }

    #[test]
    fn version_mismatch_gets_a_typed_error_then_close() {
        let (mut c, t) = connect(Arc::new(fake()), config());
        let reply = call(&mut c, &Request::Hello { protocol_version: PROTOCOL_VERSION + 1 });
        assert_eq!(
            reply,
            Reply::Error(RequestError::VersionMismatch {
                broker: PROTOCOL_VERSION,
                peer: PROTOCOL_VERSION + 1
            })
        );
        assert!(matches!(t.join().unwrap(), Err(ConnectionError::VersionMismatch(_))));
    }

    #[test]
    fn garbage_closes_the_connection() {
        let (mut c, t) = connect(Arc::new(fake()), config());
        c.write_all(&[3, 0, 0, 0, 0xFF, 0xFF, 0xFF]).unwrap();
        assert!(matches!(t.join().unwrap(), Err(ConnectionError::Frame(FrameError::Malformed(_)))));
        assert!(matches!(Reply::read(&mut c), Err(FrameError::Closed)));
    }

    #[test]
    fn oversized_length_closes_the_connection() {
        let (mut c, t) = connect(Arc::new(fake()), config());
        c.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            t.join().unwrap(),
            Err(ConnectionError::Frame(FrameError::TooLarge { .. }))
        ));
    }

    #[test]
    fn a_frame_that_stalls_is_cut_off() {
        let (mut c, t) = connect(Arc::new(fake()), config());
        c.write_all(&[2, 0]).unwrap();
        let started = Instant::now();
        assert!(matches!(t.join().unwrap(), Err(ConnectionError::FrameTimeout(_))));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn idle_connections_are_closed() {
        let (mut c, t) = connect(Arc::new(fake()), config());
        assert!(matches!(call(&mut c, &hello()), Reply::Hello { .. }));
        assert!(t.join().unwrap().is_ok());
        assert!(matches!(Reply::read(&mut c), Err(FrameError::Closed)));
    }

    #[test]
    fn deadlines_are_capped() {
        let backend = Arc::new(fake());
        let cfg = ServerConfig { max_deadline: Duration::from_secs(1), ..config() };
        let (mut c, _t) = connect(backend.clone(), cfg);
        call(&mut c, &hello());
        call(&mut c, &Request::Sample { what: Families::ALL, deadline_ms: u32::MAX });
        let d = backend.deadlines.lock().unwrap()[0];
        assert!(d <= Duration::from_secs(1), "{d:?}");
    }

    #[test]
    fn allow_list() {
        let cfg = ServerConfig { allow_uids: vec![1000], allow_gids: vec![990], ..config() };
        assert!(cfg.allows(&Peer { pid: 1, uid: 0, gid: 0 }));
        assert!(cfg.allows(&Peer { pid: 1, uid: 1000, gid: 5 }));
        assert!(cfg.allows(&Peer { pid: 1, uid: 1001, gid: 990 }));
        assert!(!cfg.allows(&Peer { pid: 1, uid: 1001, gid: 5 }));
    }

    #[test]
    fn peer_credentials_are_read_from_the_socket() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = peer_of(&a).unwrap();
        assert_eq!(peer.pid as u32, std::process::id());
        assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn instances_differ() {
        assert_ne!(random_instance(), random_instance());
    }
}
