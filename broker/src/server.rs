//! The Unix-socket server: peer checks, bounded connections, strict framing, the handshake.
//!
//! One thread per connection, one request at a time per connection. Connection slots are a
//! shared pool plus a reserve per allowed identity, and no uid holds more than its share (see
//! [`ServerConfig::per_uid`]). A peer that is not allowed, a malformed or oversized frame, a
//! frame that does not arrive in time, or an idle connection closes that connection and nothing
//! else; refusals are logged at a bounded rate. An allowed peer turned away for want of a slot
//! reads [`Reply::Refused`] with the reason first; one that is not allowed reads nothing.
//!
//! A slot is held by a live peer: while a request waits in the sampler, its connection thread
//! asks the socket every 50 ms whether the peer hung up, and if it has, the request stops
//! waiting and the connection ends, slot and all.

use amd_hsmp_proto::{
    self as proto, FrameError, Message, PROTOCOL_VERSION, Reply, Request, RequestError,
};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What answers the requests: the sampler in production, a fake in tests.
pub(crate) trait Backend: Send + Sync {
    /// The discovered machine.
    fn topology(&self) -> &proto::Topology;
    /// One reading of `what`, with no message sent after `deadline`. While it waits it asks
    /// `gone` now and then whether the requester is still there, and once it is not, stops
    /// waiting (and wanting reads) and returns what it has.
    fn sample(
        &self,
        what: proto::Families,
        deadline: Instant,
        gone: &dyn Fn() -> bool,
    ) -> proto::Sample;
    /// Why the broker should stop for a fresh start, once a reply is written
    /// ([`crate::hotplug`]); `None` to serve on.
    fn fresh_start(&self) -> Option<crate::hotplug::Return> {
        None
    }
}

/// Fixed facts sent in the handshake.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// Random per broker start.
    pub instance: u64,
    /// Simulator profile, when simulating.
    pub simulated: Option<String>,
}

/// Who may connect, and the bounds on each connection.
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    /// Peer uids served besides root.
    pub allow_uids: Vec<u32>,
    /// Peer gids (the peer's effective gid, as `SO_PEERCRED` reports it) served.
    pub allow_gids: Vec<u32>,
    /// Connections one peer uid may hold at once; also the slots kept for each allowed uid and
    /// gid, which no other identity can take.
    pub per_uid: usize,
    /// Slots any allowed peer (root included) may take, beyond the reserved ones.
    pub shared: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Once a frame has started, all of it must arrive within this.
    pub frame_timeout: Duration,
    /// Upper bound on a request's deadline.
    pub max_deadline: Duration,
    /// Refusals of one uid are logged once, then summed and logged once per this interval.
    pub log_interval: Duration,
}

/// Default of `--connections.per-uid` and of [`ServerConfig::per_uid`].
pub(crate) const DEFAULT_PER_UID: u16 = 2;

/// Default of `--connections.shared` and of [`ServerConfig::shared`].
pub(crate) const DEFAULT_SHARED: u16 = 4;

/// Default of `--connections.idle-timeout` and of [`ServerConfig::idle_timeout`].
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            per_uid: usize::from(DEFAULT_PER_UID),
            shared: usize::from(DEFAULT_SHARED),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            frame_timeout: Duration::from_secs(2),
            max_deadline: Duration::from_secs(60),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// Credentials of a connected peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Process id at connect time, as seen from the broker's PID namespace: 0 for a peer in a
    /// namespace the broker cannot see (a container, a `PrivatePIDs=yes` unit).
    pub pid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
}

impl ServerConfig {
    /// Whether `peer` may use the broker: root, or a listed uid or gid.
    pub(crate) fn allows(&self, peer: &Peer) -> bool {
        peer.uid == 0 || self.allow_uids.contains(&peer.uid) || self.allow_gids.contains(&peer.gid)
    }
}

/// The peer's credentials from `SO_PEERCRED`, read as a plain `ucred`: a pid of 0 (a peer in
/// another PID namespace) is a value like any other, not an error.
fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(io::Error::from)?;
    Ok(Peer { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() })
}

/// An identity whose slots are kept for it: an allowed uid or gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Reserve {
    Uid(u32),
    Gid(u32),
}

/// Where a connection's slot came from, to give it back there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Shared,
    Reserved(Reserve),
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Refusal {
    NotAllowed,
    PerUidLimit,
    NoSlot,
    Credentials,
    Dropped,
}

impl Refusal {
    /// What an allowed peer is told before the close; `None` for the refusals said nothing of
    /// (a peer that is not allowed learns nothing).
    fn reply(self, config: &ServerConfig) -> Option<Reply> {
        let reason = match self {
            Refusal::PerUidLimit => proto::Refusal::PerUidLimit {
                limit: u32::try_from(config.per_uid).unwrap_or(u32::MAX),
            },
            Refusal::NoSlot => proto::Refusal::NoSlot,
            Refusal::NotAllowed | Refusal::Credentials | Refusal::Dropped => return None,
        };
        Some(Reply::Refused { reason })
    }

    fn message(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "peer not allowed; closing",
            Refusal::PerUidLimit => "peer uid holds its share of connections; closing",
            Refusal::NoSlot => "no connection slot free; closing",
            Refusal::Credentials => "cannot read peer credentials; closing",
            Refusal::Dropped => "connection dropped",
        }
    }
}

/// The connection slots: a shared pool, a reserve per allowed identity, and each uid's count.
///
/// A peer takes its own uid's reserve first, then its gid's, then the shared pool, and never
/// holds more than `per_uid` in all. So root or an allowed uid squatting every slot it can still
/// leaves each other allowed identity its `per_uid` reserved slots.
#[derive(Debug)]
struct Slots {
    per_uid: usize,
    shared_free: usize,
    reserved_free: HashMap<Reserve, usize>,
    held: HashMap<u32, usize>,
}

impl Slots {
    fn new(config: &ServerConfig) -> Slots {
        let reserves = config.allow_uids.iter().map(|&u| Reserve::Uid(u));
        let reserves = reserves.chain(config.allow_gids.iter().map(|&g| Reserve::Gid(g)));
        Slots {
            per_uid: config.per_uid,
            shared_free: config.shared,
            reserved_free: reserves.map(|r| (r, config.per_uid)).collect(),
            held: HashMap::new(),
        }
    }

    fn take(&mut self, peer: &Peer) -> Result<Slot, Refusal> {
        let held = self.held.get(&peer.uid).copied().unwrap_or(0);
        if held >= self.per_uid {
            return Err(Refusal::PerUidLimit);
        }
        let slot = [Reserve::Uid(peer.uid), Reserve::Gid(peer.gid)]
            .into_iter()
            .find(|r| self.reserved_free.get(r).is_some_and(|&free| free > 0))
            .map(Slot::Reserved)
            .or((self.shared_free > 0).then_some(Slot::Shared))
            .ok_or(Refusal::NoSlot)?;
        match slot {
            Slot::Shared => self.shared_free -= 1,
            Slot::Reserved(r) => {
                if let Some(free) = self.reserved_free.get_mut(&r) {
                    *free -= 1;
                }
            }
        }
        self.held.insert(peer.uid, held + 1);
        Ok(slot)
    }

    fn give_back(&mut self, uid: u32, slot: Slot) {
        match slot {
            Slot::Shared => self.shared_free += 1,
            Slot::Reserved(r) => *self.reserved_free.entry(r).or_default() += 1,
        }
        if let Some(held) = self.held.get_mut(&uid) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.held.remove(&uid);
            }
        }
    }
}

/// A slot held by one connection; given back when dropped, whatever ends the connection.
#[derive(Debug)]
struct SlotGuard {
    slots: Arc<Mutex<Slots>>,
    uid: u32,
    slot: Slot,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        lock(&self.slots).give_back(self.uid, self.slot);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Distinct (uid, reason) pairs tracked per interval; refusals beyond go into one bucket.
const PEER_LOG_KEYS: usize = 64;

/// Logs refusals at a bounded rate: the first of each uid and reason in an interval at once,
/// the rest as one count per uid and reason when the interval is over. A peer looping on
/// `connect()` costs at most two lines per interval.
#[derive(Debug)]
struct PeerLog {
    interval: Duration,
    window: Instant,
    /// Refusals not yet logged, by uid (`None`: the overflow bucket) and reason.
    suppressed: BTreeMap<(Option<u32>, Refusal), u64>,
}

impl PeerLog {
    fn new(interval: Duration) -> PeerLog {
        PeerLog { interval, window: Instant::now(), suppressed: BTreeMap::new() }
    }

    /// Logs the counts of the interval that ended, if it has.
    fn tick(&mut self, now: Instant) {
        if now.saturating_duration_since(self.window) < self.interval {
            return;
        }
        for (&(uid, reason), &count) in &self.suppressed {
            if count > 0 {
                tracing::warn!(
                    uid = uid.map_or_else(|| "other".to_string(), |u| u.to_string()),
                    count,
                    seconds = self.interval.as_secs(),
                    "{} (repeated)",
                    reason.message()
                );
            }
        }
        self.suppressed.clear();
        self.window = now;
    }

    /// Records one refusal; returns whether the caller should log it in full now.
    fn record(&mut self, uid: u32, reason: Refusal, now: Instant) -> bool {
        self.tick(now);
        if let Some(count) = self.suppressed.get_mut(&(Some(uid), reason)) {
            *count += 1;
            return false;
        }
        if self.suppressed.len() >= PEER_LOG_KEYS {
            *self.suppressed.entry((None, reason)).or_default() += 1;
            return false;
        }
        self.suppressed.insert((Some(uid), reason), 0);
        true
    }
}

/// Serves `listener` until it fails. Each accepted connection runs on its own thread.
pub(crate) fn serve(
    listener: UnixListener,
    backend: Arc<dyn Backend>,
    identity: Identity,
    config: ServerConfig,
) -> io::Result<()> {
    let slots = Arc::new(Mutex::new(Slots::new(&config)));
    let peer_log = Arc::new(Mutex::new(PeerLog::new(config.log_interval)));
    let identity = Arc::new(identity);
    let config = Arc::new(config);
    let refuse = |peer: &Peer, reason: Refusal| {
        if lock(&peer_log).record(peer.uid, reason, Instant::now()) {
            tracing::warn!(
                uid = peer.uid,
                gid = peer.gid,
                pid = peer.pid,
                "{}; further refusals of this uid are counted",
                reason.message()
            );
        }
    };
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors or memory: back off instead of spinning.
            Err(e) if is_transient_accept_error(&e) => {
                tracing::warn!(error = %e, "accept failed; retrying");
                if let Err(e) = crate::sleep::sleep(Duration::from_millis(100)) {
                    tracing::warn!(error = %e, "cannot sleep before retrying accept");
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        lock(&peer_log).tick(Instant::now());
        let peer = match peer_of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                let unknown = Peer { pid: 0, uid: u32::MAX, gid: u32::MAX };
                if lock(&peer_log).record(unknown.uid, Refusal::Credentials, Instant::now()) {
                    tracing::warn!(error = %e, "{}", Refusal::Credentials.message());
                }
                continue;
            }
        };
        if !config.allows(&peer) {
            refuse(&peer, Refusal::NotAllowed);
            continue;
        }
        let taken = lock(&slots).take(&peer);
        let guard = match taken {
            Ok(slot) => SlotGuard { slots: Arc::clone(&slots), uid: peer.uid, slot },
            Err(reason) => {
                refuse(&peer, reason);
                if let Some(reply) = reason.reply(&config) {
                    tell(stream, &reply);
                }
                continue;
            }
        };
        let (backend, identity, config, peer_log) =
            (backend.clone(), identity.clone(), config.clone(), peer_log.clone());
        let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
            let mut stream = stream;
            tracing::debug!(uid = peer.uid, pid = peer.pid, "connection accepted");
            let served = handle(&mut stream, backend.as_ref(), &identity, &config);
            // The slot is free before the peer sees the connection end, so a peer that
            // reconnects at once finds it.
            drop(guard);
            drop(stream);
            match served {
                Ok(()) => tracing::debug!(uid = peer.uid, pid = peer.pid, "connection closed"),
                Err(e) => {
                    if lock(&peer_log).record(peer.uid, Refusal::Dropped, Instant::now()) {
                        tracing::warn!(
                            uid = peer.uid,
                            pid = peer.pid,
                            error = %amd_hsmp_cli::ErrorChain(&e),
                            "connection dropped; further drops of this uid are counted"
                        );
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a connection thread; closing");
        }
    }
}

/// Writes `reply` to a connection about to be closed, without ever blocking the accept loop:
/// a few bytes into a fresh socket's empty buffer, with a short write timeout besides. A peer
/// that has gone already is not an error.
fn tell(mut stream: UnixStream, reply: &Reply) {
    let Ok(frame) = reply.to_frame() else { return };
    if stream.set_write_timeout(Some(Duration::from_millis(100))).is_ok() {
        let _ = stream.write_all(&frame);
    }
}

/// Whether the peer of `stream` has hung up: `poll` without waiting reports `POLLHUP` (the peer
/// closed its end or died) or an error. A peer that only shut down its writing half, or that
/// sent more bytes, is still there.
fn hung_up(stream: &UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(stream, PollFlags::IN)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    let gone = PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
    poll(&mut fds, Some(&now)).is_ok() && fds.iter().any(|fd| fd.revents().intersects(gone))
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
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
    #[error(
        "the peer speaks protocol {0} and this broker protocol {PROTOCOL_VERSION}: they are of \
         different releases; install amd-hsmp-broker and amd-hsmp-exporter of the same release \
         (upgrade both together)"
    )]
    VersionMismatch(u32),
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
pub(crate) fn handle(
    stream: &mut UnixStream,
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
        let request = match read_request(stream, config)? {
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
                    stream,
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
            Request::Sample { what, .. } => {
                let asked = request.deadline().unwrap_or(config.max_deadline);
                let budget = asked.min(config.max_deadline);
                let peer = &*stream;
                let sample = backend.sample(what, Instant::now() + budget, &|| hung_up(peer));
                if hung_up(stream) {
                    // Nobody reads the answer: end now, so the slot is free for the peer's
                    // next connection (an exporter restarted with requests in flight).
                    tracing::debug!("peer hung up while its request waited; closing");
                    return Ok(());
                }
                Reply::Sample(sample)
            }
        };
        send(stream, &reply)?;
        if let Some(why) = backend.fresh_start() {
            crate::hotplug::exit(why);
        }
    }
}

/// A random instance id, from the standard library's OS-seeded hasher keys.
pub(crate) fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::UNIX_EPOCH.elapsed().map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::{Core, Families, Family, Sample, Topology};
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
        fn sample(&self, what: Families, deadline: Instant, _gone: &dyn Fn() -> bool) -> Sample {
            self.deadlines.lock().unwrap().push(deadline.saturating_duration_since(Instant::now()));
            Sample::healthy(&self.topology, what)
        }
    }

    fn fake() -> Fake {
        Fake {
            topology: Topology {
                cpu_family: 0x1A,
                cpu_model: 0x11,
                sockets: vec![0],
                cores: vec![Core { socket: 0, core: 0, cpu: 0, apic_id: 0, threads: vec![0] }],
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
        let (client, mut server) = UnixStream::pair().unwrap();
        let identity = Identity { instance: 42, simulated: Some("turin-2p".into()) };
        let t =
            std::thread::spawn(move || handle(&mut server, backend.as_ref(), &identity, &config));
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
        let what = Families::of(&[Family::Prochot]);
        match call(&mut c, &Request::Sample { what, deadline_ms: 5000 }) {
            Reply::Sample(s) => assert_eq!(s, Sample::healthy(&backend.topology, what)),
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

    fn peer(uid: u32, gid: u32) -> Peer {
        Peer { pid: 0, uid, gid }
    }

    #[test]
    fn root_squatting_every_slot_it_can_leaves_the_allowed_uid_its_two() {
        let cfg = ServerConfig { allow_uids: vec![990], ..config() };
        let mut slots = Slots::new(&cfg);
        let root = peer(0, 0);
        let taken: Vec<_> = (0..10).map(|_| slots.take(&root)).collect();
        assert_eq!(taken.iter().filter(|t| t.is_ok()).count(), 2, "{taken:?}");
        assert_eq!(taken[2], Err(Refusal::PerUidLimit));
        let exporter = peer(990, 990);
        assert_eq!(slots.take(&exporter), Ok(Slot::Reserved(Reserve::Uid(990))));
        assert_eq!(slots.take(&exporter), Ok(Slot::Reserved(Reserve::Uid(990))));
        assert_eq!(slots.take(&exporter), Err(Refusal::PerUidLimit));
    }

    #[test]
    fn many_uids_fill_the_shared_pool_but_not_the_reserves() {
        let cfg = ServerConfig { allow_gids: vec![990], shared: 3, ..config() };
        let mut slots = Slots::new(&cfg);
        for uid in 1..=3 {
            assert_eq!(slots.take(&peer(uid, 990)).map(|_| ()), Ok(()));
        }
        // uids 1 and 2 took the group's reserve, uid 3 a shared slot; two shared slots are left.
        assert_eq!(slots.take(&peer(0, 0)), Ok(Slot::Shared));
        assert_eq!(slots.take(&peer(0, 0)), Ok(Slot::Shared));
        assert_eq!(slots.take(&peer(7, 7)), Err(Refusal::NoSlot));
        slots.give_back(0, Slot::Shared);
        assert_eq!(slots.take(&peer(7, 7)), Ok(Slot::Shared));
        slots.give_back(1, Slot::Reserved(Reserve::Gid(990)));
        assert_eq!(slots.take(&peer(4, 990)), Ok(Slot::Reserved(Reserve::Gid(990))));
    }

    #[test]
    fn a_refusing_loop_logs_one_line_then_one_count_per_interval() {
        let mut log = PeerLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(log.record(5, Refusal::NotAllowed, t0));
        for i in 0..1000 {
            assert!(!log.record(5, Refusal::NotAllowed, t0 + Duration::from_millis(i)));
        }
        assert!(log.record(6, Refusal::NotAllowed, t0), "another uid is logged on its own");
        assert_eq!(log.suppressed[&(Some(5), Refusal::NotAllowed)], 1000);
        assert!(log.record(5, Refusal::NotAllowed, t0 + Duration::from_secs(11)));
        assert_eq!(log.suppressed.len(), 1, "the counts were logged and cleared");
        for uid in 100..100 + PEER_LOG_KEYS as u32 * 2 {
            log.record(uid, Refusal::NotAllowed, t0 + Duration::from_secs(11));
        }
        assert_eq!(log.suppressed.len(), PEER_LOG_KEYS + 1, "bounded, with one overflow bucket");
    }

    /// A backend whose samples wait for their requester to hang up (or their deadline), and
    /// say when they start and end.
    struct Waits {
        topology: Topology,
        started: std::sync::mpsc::Sender<()>,
        ended: std::sync::mpsc::Sender<bool>,
    }

    impl Backend for Waits {
        fn topology(&self) -> &Topology {
            &self.topology
        }
        fn sample(&self, what: Families, deadline: Instant, gone: &dyn Fn() -> bool) -> Sample {
            self.started.send(()).unwrap();
            while Instant::now() < deadline && !gone() {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.ended.send(gone()).unwrap();
            Sample::healthy(&self.topology, what)
        }
    }

    /// The broker on a socket in a temporary directory, with a backend whose samples wait.
    fn serving(
        config: ServerConfig,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Receiver<bool>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (started, started_rx) = std::sync::mpsc::channel();
        let (ended, ended_rx) = std::sync::mpsc::channel();
        let backend = Arc::new(Waits { topology: fake().topology, started, ended });
        let identity = Identity { instance: 1, simulated: None };
        std::thread::spawn(move || serve(listener, backend, identity, config));
        (dir, path, started_rx, ended_rx)
    }

    /// The connection once greeted, or the reply that turned it away (boxed: a `Reply` holds
    /// a whole sample).
    fn greeted(path: &std::path::Path) -> Result<UnixStream, Box<Reply>> {
        let mut c = UnixStream::connect(path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A refused connection may be closed before the Hello is written: the reason is read
        // all the same.
        let _ = hello().write(&mut c);
        match Reply::read(&mut c).unwrap() {
            Reply::Hello { .. } => Ok(c),
            other => Err(Box::new(other)),
        }
    }

    /// Regression (P4): a slot was freed only when its request's deadline passed, so an
    /// exporter restarted with two requests in flight was refused by its own per-uid limit.
    #[test]
    fn a_peer_whose_connections_hang_up_while_waiting_connects_again_at_once() {
        let uid = rustix::process::geteuid().as_raw();
        let (_dir, path, started, ended) =
            serving(ServerConfig { allow_uids: vec![uid], ..config() });
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let mut c = greeted(&path).unwrap();
            Request::Sample { what: Families::ALL, deadline_ms: 60_000 }.write(&mut c).unwrap();
            started.recv_timeout(Duration::from_secs(5)).unwrap();
            waiting.push(c);
        }
        // This test's uid (every test peer is one uid) is at its limit of 2.
        let limit = u32::try_from(config().per_uid).unwrap();
        let refused = greeted(&path).unwrap_err();
        assert_eq!(*refused, Reply::Refused { reason: proto::Refusal::PerUidLimit { limit } });
        drop(waiting);
        for _ in 0..2 {
            let hung_up = ended.recv_timeout(Duration::from_secs(5)).expect("a sample still waits");
            assert!(hung_up, "the sample ended without seeing the hang-up");
        }
        // Its deadline is a minute away; the slot is free within the time the connection thread
        // takes to return.
        let started = Instant::now();
        let again = loop {
            match greeted(&path) {
                Ok(c) => break c,
                Err(reply) if started.elapsed() < Duration::from_secs(5) => {
                    assert!(matches!(*reply, Reply::Refused { .. }), "{reply:?}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(reply) => panic!("still refused after 5 s: {reply:?}"),
            }
        };
        drop(again);
    }

    #[test]
    fn a_refused_allowed_peer_is_told_why_and_a_peer_not_allowed_nothing() {
        // No shared slot and no reserve: root is allowed but finds no slot; anyone else is not
        // allowed. The test runs as one or the other.
        let (_dir, path, _started, _ended) = serving(ServerConfig { shared: 0, ..config() });
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = hello().write(&mut c);
        let reply = Reply::read(&mut c);
        if rustix::process::geteuid().is_root() {
            assert_eq!(reply.unwrap(), Reply::Refused { reason: proto::Refusal::NoSlot });
        } else {
            assert!(matches!(reply, Err(FrameError::Closed | FrameError::Io(_))), "{reply:?}");
        }
    }

    #[test]
    fn instances_differ() {
        assert_ne!(random_instance(), random_instance());
    }
}
