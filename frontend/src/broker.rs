//! Client side of the broker protocol: a small pool of Unix-socket connections (at most
//! [`MAX_CONNECTIONS`] at once), reused across scrapes, each dropped only when it fails and
//! re-established (Hello, then Topology) on the next request. A connection the broker turns
//! away is tried once more; a refusal that persists is a failed request of the scrape, not an
//! outage of the broker.

use amd_hsmp_proto::{
    FrameError, Message, PROTOCOL_VERSION, Refusal, Reply, Request, RequestError, Sample, Topology,
};
use amd_hsmp_web::ratelimit::RateLimit;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};

/// Most broker connections open at once. Two let a scrape with a long deadline proceed while
/// one with a short deadline is in flight; the broker shares one mailbox reading among
/// concurrent samples, so this does not multiply mailbox traffic. The broker reserves two
/// slots for the exporter's identity.
pub(crate) const MAX_CONNECTIONS: usize = 2;

/// How long past a sample's deadline its reply is awaited. The broker answers at the deadline
/// with what it has read, so a reply later than this means the connection is stuck: only then
/// is it given up.
pub(crate) const REPLY_GRACE: Duration = Duration::from_secs(2);

/// How long a connection the broker turned away ([`Reply::Refused`]) waits before its one
/// retry: longer than the broker takes to notice that a peer's earlier connection hung up and
/// free its slot (50 ms), so an exporter restarted with requests in flight gets in.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);

/// How long a request whose reused connection the broker closed waits for the broker to listen
/// again, within its deadline: a broker that stops for a fresh start (CPU hotplug, exit status
/// 75) is started again by its container runtime without a socket held meanwhile (under
/// systemd the socket unit holds it and the connection waits in its queue). Only after a lost
/// connection: a broker that is simply not running is reported at once.
pub(crate) const RESTART_PATIENCE: Duration = Duration::from_secs(5);

/// How often the socket is tried again while waiting for a restarted broker.
const RESTART_POLL: Duration = Duration::from_millis(50);

/// At most one "turned away" warning per this interval; the others are counted in the next.
const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a request to the broker failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerError {
    /// The socket could not be connected (broker not running, wrong path, no permission).
    #[error("cannot connect to the broker socket {}{}", path.display(), connect_hint(source))]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing the request failed.
    #[error("cannot send {request} to the broker")]
    Send {
        /// The request's name.
        request: &'static str,
        /// The cause.
        #[source]
        source: FrameError,
    },
    /// Reading or decoding the reply failed.
    #[error("cannot read the broker's reply to {request}")]
    Receive {
        /// The request's name.
        request: &'static str,
        /// The cause.
        #[source]
        source: FrameError,
    },
    /// The broker answered with an error.
    #[error("the broker refused {request}")]
    Refused {
        /// The request's name.
        request: &'static str,
        /// The broker's reason.
        #[source]
        source: RequestError,
    },
    /// Every connection was busy until the sample's deadline; nothing was sent.
    #[error("no broker connection became free before the deadline")]
    Busy,
    /// The broker turned the connection away before the handshake ([`Reply::Refused`]), and
    /// again on the one retry: it is up, but this uid holds its share of connections or no slot
    /// is free.
    #[error("the broker turned the connection away: {reason}")]
    TurnedAway {
        /// The broker's reason.
        reason: Refusal,
    },
    /// No reply arrived by the deadline plus [`REPLY_GRACE`]; the connection was dropped.
    #[error("no reply to {request} within {grace:?} after its deadline")]
    NoReply {
        /// The request's name.
        request: &'static str,
        /// The grace waited past the deadline.
        grace: Duration,
    },
    /// The broker answered with a reply of the wrong kind.
    #[error("the broker answered {request} with an unexpected {reply} reply")]
    Unexpected {
        /// The request's name.
        request: &'static str,
        /// The reply's kind.
        reply: &'static str,
    },
}

impl BrokerError {
    /// The broker's protocol version and this exporter's, when the broker refused the handshake
    /// because they differ: the two packages are of different releases.
    pub(crate) fn version_skew(&self) -> Option<(u32, u32)> {
        match self {
            BrokerError::Refused {
                source: RequestError::VersionMismatch { broker, peer }, ..
            } => Some((*broker, *peer)),
            _ => None,
        }
    }

    /// True when the request failed before any reply byte because the peer had gone away, as
    /// happens to a reused connection that the broker closed while idle or when it restarted;
    /// the same request on a fresh connection may then succeed.
    fn is_connection_lost(&self) -> bool {
        let lost = |e: &io::Error| {
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            )
        };
        match self {
            BrokerError::Send { source: FrameError::Io(e), .. } => lost(e),
            BrokerError::Receive { source: FrameError::Closed, .. } => true,
            BrokerError::Receive { source: FrameError::Io(e), .. } => lost(e),
            _ => false,
        }
    }
}

/// What the broker said about itself in its Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerInfo {
    /// The broker's package version.
    pub broker_version: String,
    /// Changes on every broker start.
    pub instance: u64,
    /// `Some(profile)` when the broker serves its simulator.
    pub simulated: Option<String>,
}

/// One answered sample with the context needed to label it.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The broker that answered.
    pub info: Arc<BrokerInfo>,
    /// Its topology; the sample's readings are aligned with it.
    pub topology: Arc<Topology>,
    /// The readings.
    pub sample: Sample,
    /// When the request was sent: the broker received it no earlier, so no value in the
    /// sample was read before this minus [`Sample::oldest_read_us`].
    pub sent: Instant,
}

/// An established, handshaken connection.
#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    info: Arc<BrokerInfo>,
    topology: Arc<Topology>,
}

/// The client: a socket path and a pool of at most [`MAX_CONNECTIONS`] connections.
#[derive(Debug)]
pub(crate) struct BrokerClient {
    path: PathBuf,
    /// One permit per connection that may be open and in use.
    permits: Semaphore,
    /// Connections not in use, ready for the next request.
    idle: Mutex<Vec<Connection>>,
    last_instance: Mutex<Option<u64>>,
    /// Connections turned away even on their retry, logged at a bounded rate.
    refused_log: RateLimit,
}

/// The next step when connecting to the broker's socket fails with `source`.
fn connect_hint(source: &io::Error) -> &'static str {
    match source.kind() {
        io::ErrorKind::PermissionDenied => {
            " (permission denied: the exporter's user needs write access to the socket through \
             group amd-hsmp-exporter; under SELinux: ausearch -m avc -c amd-hsmp-exporter; \
             amd-hsmp-check names the fix)"
        }
        _ => "",
    }
}

impl BrokerClient {
    /// A client for the broker listening on `path`; nothing is connected until the first
    /// request.
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        BrokerClient {
            path: path.into(),
            permits: Semaphore::new(MAX_CONNECTIONS),
            idle: Mutex::new(Vec::new()),
            last_instance: Mutex::new(None),
            refused_log: RateLimit::new(REFUSED_LOG_INTERVAL),
        }
    }

    /// The socket path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the requested families once, asking the broker to answer by `deadline`.
    ///
    /// Waits for a free connection until `deadline` ([`BrokerError::Busy`] after it), then
    /// reuses an idle connection or connects. A reused connection found closed by the broker
    /// before any reply byte is replaced once, within the same call. The reply is awaited
    /// until `deadline` + [`REPLY_GRACE`]; only a connection that fails or misses that is
    /// dropped, so a sample that runs out of time keeps its connection.
    ///
    /// Cancel-safe in the sense that matters here: a call dropped mid-request drops its
    /// connection, so no later call reads a stale reply.
    pub(crate) async fn sample(
        &self,
        what: amd_hsmp_proto::Families,
        deadline: Instant,
    ) -> Result<Snapshot, BrokerError> {
        let _permit = match timeout_at(deadline, self.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            // Timed out, or closed (never: the semaphore is not closed).
            _ => return Err(BrokerError::Busy),
        };
        let reply_by = deadline + REPLY_GRACE;
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let (mut conn, reused) = match pooled {
            Some(conn) => (conn, true),
            None => (self.connect_by(deadline, reply_by).await?, false),
        };
        let mut sent = Instant::now();
        let result = match conn.sample(what, deadline, reply_by).await {
            Err(e) if reused && e.is_connection_lost() => {
                tracing::debug!(error = %amd_hsmp_cli::chain(&e), "broker connection lost, reconnecting");
                conn = self.reconnect_by(deadline, reply_by).await?;
                sent = Instant::now();
                conn.sample(what, deadline, reply_by).await
            }
            other => other,
        };
        let sample = match result? {
            Reply::Sample(sample) => sample,
            Reply::Error(source) => return Err(BrokerError::Refused { request: "Sample", source }),
            other => {
                return Err(BrokerError::Unexpected { request: "Sample", reply: kind(&other) });
            }
        };
        let snapshot =
            Snapshot { info: conn.info.clone(), topology: conn.topology.clone(), sample, sent };
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        Ok(snapshot)
    }

    /// Connects and handshakes, giving up at `by`. A connection the broker turns away is
    /// tried once more after [`REFUSED_PAUSE`] if that still leaves time before `deadline`
    /// (the sample's): the slot it lacked is usually one of this exporter's own connections
    /// that has just ended. A refusal that persists is logged at a bounded rate.
    async fn connect_by(&self, deadline: Instant, by: Instant) -> Result<Connection, BrokerError> {
        let attempt = || async {
            timeout_at(by, self.connect())
                .await
                .unwrap_or(Err(BrokerError::NoReply { request: "Hello", grace: REPLY_GRACE }))
        };
        let result = match attempt().await {
            Err(BrokerError::TurnedAway { reason })
                if Instant::now() + REFUSED_PAUSE < deadline =>
            {
                tracing::debug!(%reason, "the broker turned the connection away; retrying once");
                tokio::time::sleep(REFUSED_PAUSE).await;
                attempt().await
            }
            other => other,
        };
        if let Err(BrokerError::TurnedAway { reason }) = &result
            && let Some(suppressed) = self.refused_log.check()
        {
            tracing::warn!(
                %reason,
                suppressed,
                "the broker is up but turned this exporter's connection away; telemetry left out"
            );
        }
        result
    }

    /// [`BrokerClient::connect_by`] after a lost connection: while nothing listens on the
    /// socket (refused, or its file not there yet), tries again every [`RESTART_POLL`] for up
    /// to [`RESTART_PATIENCE`], never past `deadline`.
    async fn reconnect_by(
        &self,
        deadline: Instant,
        by: Instant,
    ) -> Result<Connection, BrokerError> {
        let patience = deadline.min(Instant::now() + RESTART_PATIENCE);
        loop {
            match self.connect_by(deadline, by).await {
                Err(BrokerError::Connect { source, .. })
                    if matches!(
                        source.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) && Instant::now() + RESTART_POLL < patience =>
                {
                    tokio::time::sleep(RESTART_POLL).await;
                }
                other => return other,
            }
        }
    }

    async fn connect(&self) -> Result<Connection, BrokerError> {
        let mut stream = UnixStream::connect(&self.path)
            .await
            .map_err(|source| BrokerError::Connect { path: self.path.clone(), source })?;
        let hello = Request::Hello { protocol_version: PROTOCOL_VERSION };
        let reply = match exchange(&mut stream, &hello, "Hello").await {
            // A broker that turns the connection away writes why and closes without reading,
            // so the Hello may meet a closed socket: the reason is still there to read.
            Err(e @ BrokerError::Send { .. }) if e.is_connection_lost() => {
                match Reply::read_async(&mut stream).await {
                    Ok(refused @ Reply::Refused { .. }) => refused,
                    _ => return Err(e),
                }
            }
            other => other?,
        };
        let info = match reply {
            Reply::Hello { broker_version, instance, simulated, .. } => {
                Arc::new(BrokerInfo { broker_version, instance, simulated })
            }
            Reply::Refused { reason } => return Err(BrokerError::TurnedAway { reason }),
            Reply::Error(source) => return Err(BrokerError::Refused { request: "Hello", source }),
            other => return Err(BrokerError::Unexpected { request: "Hello", reply: kind(&other) }),
        };
        // Topology is fetched on every new connection, so a restarted broker (new instance)
        // is always described by its own topology.
        let topology = match exchange(&mut stream, &Request::Topology, "Topology").await? {
            Reply::Topology(topology) => Arc::new(topology),
            Reply::Error(source) => {
                return Err(BrokerError::Refused { request: "Topology", source });
            }
            other => {
                return Err(BrokerError::Unexpected { request: "Topology", reply: kind(&other) });
            }
        };
        let conn = Connection { stream, info, topology };
        let previous = self
            .last_instance
            .lock()
            .map(|mut last| last.replace(conn.info.instance))
            .unwrap_or(None);
        match previous {
            Some(old) if old != conn.info.instance => tracing::info!(
                broker_version = %conn.info.broker_version,
                cores = conn.topology.cores.len(),
                "broker restarted since the last connection; counters restart and the topology was re-read"
            ),
            _ => tracing::debug!(
                broker_version = %conn.info.broker_version,
                cores = conn.topology.cores.len(),
                sockets = conn.topology.sockets.len(),
                simulated = conn.info.simulated.as_deref().unwrap_or("no"),
                "connected to the broker"
            ),
        }
        Ok(conn)
    }
}

impl Connection {
    /// One Sample exchange; the reply is awaited until `reply_by`.
    async fn sample(
        &mut self,
        what: amd_hsmp_proto::Families,
        deadline: Instant,
        reply_by: Instant,
    ) -> Result<Reply, BrokerError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let request = Request::sample(what, left);
        timeout_at(reply_by, exchange(&mut self.stream, &request, "Sample"))
            .await
            .unwrap_or(Err(BrokerError::NoReply { request: "Sample", grace: REPLY_GRACE }))
    }
}

/// Sends `request` (called `name` in errors) on `stream` and reads the reply.
async fn exchange(
    stream: &mut UnixStream,
    request: &Request,
    name: &'static str,
) -> Result<Reply, BrokerError> {
    request
        .write_async(stream)
        .await
        .map_err(|source| BrokerError::Send { request: name, source })?;
    Reply::read_async(stream).await.map_err(|source| BrokerError::Receive { request: name, source })
}

fn kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "Hello",
        Reply::Topology(_) => "Topology",
        Reply::Sample(_) => "Sample",
        Reply::Error(_) => "Error",
        Reply::Refused { .. } => "Refused",
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connect_names_the_group_and_the_audit_log() {
        let path = PathBuf::from("/run/amd-hsmp/broker.sock");
        let refused = BrokerError::Connect {
            path: path.clone(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        let text = refused.to_string();
        assert!(text.contains("through group amd-hsmp-exporter"), "{text}");
        assert!(text.contains("ausearch -m avc -c amd-hsmp-exporter"), "{text}");
        let absent =
            BrokerError::Connect { path, source: io::Error::from(io::ErrorKind::NotFound) };
        assert_eq!(
            absent.to_string(),
            "cannot connect to the broker socket /run/amd-hsmp/broker.sock"
        );
    }
}
