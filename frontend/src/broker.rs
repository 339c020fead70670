//! Client side of the broker protocol: one Unix-socket connection, reused across scrapes,
//! dropped when it breaks and re-established (Hello, then Topology) on the next request.

use amd_hsmp_proto::{
    FrameError, Message, PROTOCOL_VERSION, Reply, Request, RequestError, Sample, Topology,
};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixStream;
use tokio::sync::Mutex;

/// Why a request to the broker failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The socket could not be connected (broker not running, wrong path, no permission).
    #[error("cannot connect to the broker socket {}", path.display())]
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
    /// True when the error says the peer went away, as happens to a reused connection that the
    /// broker closed while idle or when it restarted; a fresh connection may then succeed.
    fn is_connection_lost(&self) -> bool {
        let frame = match self {
            BrokerError::Send { source, .. } | BrokerError::Receive { source, .. } => source,
            _ => return false,
        };
        match frame {
            FrameError::Closed | FrameError::Truncated => true,
            FrameError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// What the broker said about itself in its Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    /// The broker's package version.
    pub broker_version: String,
    /// Changes on every broker start.
    pub instance: u64,
    /// `Some(profile)` when the broker serves its simulator.
    pub simulated: Option<String>,
}

/// One answered sample with the context needed to label it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The broker that answered.
    pub info: Arc<BrokerInfo>,
    /// Its topology; the sample's readings are aligned with it.
    pub topology: Arc<Topology>,
    /// The readings.
    pub sample: Sample,
}

/// An established, handshaken connection.
#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    info: Arc<BrokerInfo>,
    topology: Arc<Topology>,
}

/// The client: a socket path and at most one live connection.
#[derive(Debug)]
pub struct BrokerClient {
    path: PathBuf,
    connection: Mutex<Option<Connection>>,
    last_instance: std::sync::Mutex<Option<u64>>,
}

impl BrokerClient {
    /// A client for the broker listening on `path`; nothing is connected until the first
    /// request.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        BrokerClient {
            path: path.into(),
            connection: Mutex::new(None),
            last_instance: std::sync::Mutex::new(None),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the requested families once. Reuses the open connection, or connects first. A
    /// reused connection found closed by the broker is replaced once, within the same call.
    ///
    /// Cancel-safe in the sense that matters here: a call dropped mid-request (a timeout)
    /// drops its connection, so no later call reads a stale reply.
    pub async fn sample(
        &self,
        what: amd_hsmp_proto::Families,
        deadline_ms: u32,
    ) -> Result<Snapshot, BrokerError> {
        let mut slot = self.connection.lock().await;
        // Taken out of the slot for the duration of the request: if this future is dropped
        // mid-exchange, the connection goes with it.
        let (mut conn, reused) = match slot.take() {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        let request = Request::Sample { what, deadline_ms };
        let result = match conn.exchange(&request, "Sample").await {
            Err(e) if reused && e.is_connection_lost() => {
                tracing::debug!(error = %chain(&e), "broker connection lost, reconnecting");
                conn = self.connect().await?;
                conn.exchange(&request, "Sample").await
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
            Snapshot { info: conn.info.clone(), topology: conn.topology.clone(), sample };
        *slot = Some(conn);
        Ok(snapshot)
    }

    async fn connect(&self) -> Result<Connection, BrokerError> {
        let stream = UnixStream::connect(&self.path)
            .await
            .map_err(|source| BrokerError::Connect { path: self.path.clone(), source })?;
        let mut conn = Connection {
            stream,
            info: Arc::new(BrokerInfo {
                broker_version: String::new(),
                instance: 0,
                simulated: None,
            }),
            topology: Arc::new(Topology::default()),
        };
        let hello = Request::Hello { protocol_version: PROTOCOL_VERSION };
        conn.info = match conn.exchange(&hello, "Hello").await? {
            Reply::Hello { broker_version, instance, simulated, .. } => {
                Arc::new(BrokerInfo { broker_version, instance, simulated })
            }
            Reply::Error(source) => return Err(BrokerError::Refused { request: "Hello", source }),
            other => return Err(BrokerError::Unexpected { request: "Hello", reply: kind(&other) }),
        };
        // Topology is fetched on every new connection, so a restarted broker (new instance)
        // is always described by its own topology.
        conn.topology = match conn.exchange(&Request::Topology, "Topology").await? {
            Reply::Topology(topology) => Arc::new(topology),
            Reply::Error(source) => {
                return Err(BrokerError::Refused { request: "Topology", source });
            }
            other => {
                return Err(BrokerError::Unexpected { request: "Topology", reply: kind(&other) });
            }
        };
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
    async fn exchange(
        &mut self,
        request: &Request,
        name: &'static str,
    ) -> Result<Reply, BrokerError> {
        request
            .write_async(&mut self.stream)
            .await
            .map_err(|source| BrokerError::Send { request: name, source })?;
        Reply::read_async(&mut self.stream)
            .await
            .map_err(|source| BrokerError::Receive { request: name, source })
    }
}

fn kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "Hello",
        Reply::Topology(_) => "Topology",
        Reply::Sample(_) => "Sample",
        Reply::Error(_) => "Error",
    }
}

/// Renders an error with its causes, `outer: inner: innermost`.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
