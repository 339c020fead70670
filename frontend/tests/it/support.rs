//! Test helpers: an in-process mock broker speaking the real protocol on a Unix socket, an
//! exporter wired to it, scrapes through the router without a socket, and exposition parsing.

use amd_hsmp_exporter::http::app;
use amd_hsmp_exporter::scrape::{Config, Exporter};
use amd_hsmp_proto::{
    Families, ItemError, Message, PROTOCOL_VERSION, Readings, Reply, Request, Sample, Topology,
};
use axum::Router;
use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode, header};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::ServiceExt as _;

/// `Accept` header Prometheus 2.x sends by default.
pub use amd_hsmp_exporter::http::PROMETHEUS_2_ACCEPT as PROMETHEUS_ACCEPT;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Produces the broker's answer to one Sample request.
pub type Responder = Arc<dyn Fn(&Topology, Families, u32) -> Sample + Send + Sync>;

/// What the mock answers.
#[derive(Clone)]
pub struct Behaviour {
    pub topology: Topology,
    pub instance: u64,
    pub simulated: Option<String>,
    pub respond: Responder,
    /// Answer Hello with this error instead.
    pub refuse_hello: Option<amd_hsmp_proto::RequestError>,
    /// When set, each Sample reply waits for one permit of this gate so a
    /// test decides when a request in flight lands.
    pub hold: Option<Arc<Semaphore>>,
    /// Connections still to turn away as the broker does a peer over its limits: the reason
    /// written at once, nothing read, then the close.
    pub turn_away: Arc<AtomicUsize>,
}

/// What the mock saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub connections: AtomicUsize,
    pub hellos: AtomicUsize,
    pub samples: AtomicUsize,
    /// Sample replies written.
    pub replies: AtomicUsize,
    pub families: Mutex<Vec<Families>>,
    pub deadlines_ms: Mutex<Vec<u32>>,
}

/// A mock broker on a Unix socket; stops (closing every connection) when dropped.
pub struct MockBroker {
    pub seen: Arc<Seen>,
    task: JoinHandle<()>,
}

impl MockBroker {
    /// Serves `behaviour` on `path` (which must not exist).
    pub fn start(path: &Path, behaviour: Behaviour) -> MockBroker {
        let listener = UnixListener::bind(path).unwrap();
        let seen = Arc::new(Seen::default());
        let behaviour = Arc::new(behaviour);
        let task_seen = seen.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                task_seen.connections.fetch_add(1, Ordering::SeqCst);
                let left = &behaviour.turn_away;
                if left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let mut stream = stream;
                    let limit = amd_hsmp_proto::Refusal::PerUidLimit { limit: 2 };
                    let _ = Reply::Refused { reason: limit }.write_async(&mut stream).await;
                    continue;
                }
                connections.spawn(serve(stream, behaviour.clone(), task_seen.clone()));
            }
        });
        MockBroker { seen, task }
    }

    pub fn samples(&self) -> usize {
        self.seen.samples.load(Ordering::SeqCst)
    }

    pub fn hellos(&self) -> usize {
        self.seen.hellos.load(Ordering::SeqCst)
    }

    pub fn replies(&self) -> usize {
        self.seen.replies.load(Ordering::SeqCst)
    }

    /// Asserts that `n` Samples were asked, each with a deadline of `ms` less at most the few
    /// milliseconds the exporter spent before sending it (the deadline is absolute: time spent
    /// connecting counts against it).
    pub fn assert_deadlines(&self, ms: u32, n: usize) {
        let seen = self.seen.deadlines_ms.lock().unwrap().clone();
        assert_eq!(seen.len(), n, "{seen:?}");
        assert!(seen.iter().all(|d| (ms.saturating_sub(50)..=ms).contains(d)), "{seen:?} vs {ms}");
    }

    pub fn connections(&self) -> usize {
        self.seen.connections.load(Ordering::SeqCst)
    }
}

impl Drop for MockBroker {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

async fn serve(mut stream: UnixStream, behaviour: Arc<Behaviour>, seen: Arc<Seen>) {
    loop {
        let Ok(request) = Request::read_async(&mut stream).await else { return };
        let reply = match request {
            Request::Hello { .. } => {
                seen.hellos.fetch_add(1, Ordering::SeqCst);
                match &behaviour.refuse_hello {
                    Some(e) => Reply::Error(e.clone()),
                    None => Reply::Hello {
                        protocol_version: PROTOCOL_VERSION,
                        broker_version: "0.0.0-mock".into(),
                        instance: behaviour.instance,
                        simulated: behaviour.simulated.clone(),
                    },
                }
            }
            Request::Topology => Reply::Topology(behaviour.topology.clone()),
            Request::Sample { what, deadline_ms } => {
                seen.samples.fetch_add(1, Ordering::SeqCst);
                seen.families.lock().unwrap().push(what);
                seen.deadlines_ms.lock().unwrap().push(deadline_ms);
                if let Some(hold) = &behaviour.hold {
                    let Ok(permit) = hold.acquire().await else { return };
                    permit.forget();
                }
                Reply::Sample((behaviour.respond)(&behaviour.topology, what, deadline_ms))
            }
        };
        let is_sample = matches!(reply, Reply::Sample(_));
        if reply.write_async(&mut stream).await.is_err() {
            return;
        }
        if is_sample {
            seen.replies.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The mock's machines: `sockets` × `cores_per_socket` cores, core ids stepping by 2.
pub use amd_hsmp_proto::testing::topology;

/// A healthy machine's answer, as a [`Responder`]: every requested family read
/// ([`Sample::healthy`]: energy from HSMP RAPL, PROCHOT asserted on socket 1).
pub fn healthy(topology: &Topology, what: Families, _deadline_ms: u32) -> Sample {
    Sample::healthy(topology, what)
}

impl Behaviour {
    /// A healthy 2 × 4-core machine answering at once.
    pub fn healthy() -> Behaviour {
        Behaviour {
            topology: topology(2, 4),
            instance: 1,
            simulated: None,
            respond: Arc::new(healthy),
            refuse_hello: None,
            hold: None,
            turn_away: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The healthy answer, changed by `edit`.
    pub fn edited(edit: impl Fn(&mut Sample) + Send + Sync + 'static) -> Behaviour {
        Behaviour {
            respond: Arc::new(move |t, what, d| {
                let mut s = healthy(t, what, d);
                edit(&mut s);
                s
            }),
            ..Behaviour::healthy()
        }
    }
}

/// Sets item `index` of a family's values to `error`.
pub fn fail_item<T>(readings: &mut Readings<T>, index: usize, error: ItemError) {
    if let Readings::Values(values) = readings {
        values[index] = Err(error);
    }
}

/// A temporary directory holding the broker socket path.
pub struct SocketDir {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn socket_dir() -> SocketDir {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.sock");
    SocketDir { _dir: dir, path }
}

pub fn config(socket: &Path) -> Config {
    Config {
        broker_socket: socket.to_owned(),
        families: Families::ALL,
        max_scrape_timeout: Duration::from_secs(10),
        max_requests: 40,
        telemetry_path: "/metrics".into(),
        procfs: "/proc".into(),
        core_owner: None,
        core_owner_max_age: Duration::ZERO,
        core_owner_linger: Duration::from_secs(300),
        exporter_metrics: true,
    }
}

/// A cgroup v2 root with the cpuset controller over the mock's CPUs 0-7.
pub fn cgroup_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
    std::fs::write(dir.path().join("cpuset.cpus.effective"), "0-7\n").unwrap();
    dir
}

/// A domain cgroup with its effective cpuset, and its missing ancestors without cpuset files.
pub fn cgroup(root: &Path, path: &str, cpus: &str) {
    let mut dir = root.to_path_buf();
    for part in path.split('/') {
        dir.push(part);
        if !dir.exists() {
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("cgroup.type"), "domain\n").unwrap();
        }
    }
    std::fs::write(dir.join("cpuset.cpus.effective"), format!("{cpus}\n")).unwrap();
}

/// [`config`] with the core-owner collector on, reading `cgroupfs`.
pub fn owner_config(socket: &Path, cgroupfs: &Path) -> Config {
    Config { core_owner: Some(cgroupfs.to_owned()), ..config(socket) }
}

pub fn router(config: Config) -> Router {
    app(Exporter::new(config))
}

/// The exporter and its router, for tests that watch the exporter's flights.
pub fn exporter_and_router(config: Config) -> (Arc<Exporter>, Router) {
    let exporter = Exporter::new(config);
    (exporter.clone(), app(exporter))
}

/// Waits (yielding to the runtime) until `ready` holds; panics after 20 s, which only a
/// deadlocked test reaches.
pub async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(tokio::time::Instant::now() < give_up, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: String,
}

/// GETs `path` through the router, with optional `Accept` and scrape-timeout headers.
pub async fn get(
    router: &Router,
    path: &str,
    accept: Option<&str>,
    timeout: Option<&str>,
) -> Answer {
    let mut request = HttpRequest::get(path);
    if let Some(accept) = accept {
        request = request.header(header::ACCEPT, accept);
    }
    if let Some(timeout) = timeout {
        request = request.header(amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER, timeout);
    }
    let response = router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    Answer { status, content_type, body: String::from_utf8(bytes.to_vec()).unwrap() }
}

/// Starts a text-format scrape with a timeout header in its own task.
pub fn spawn_scrape(router: &Router, timeout: &'static str) -> JoinHandle<Answer> {
    let router = router.clone();
    tokio::spawn(async move { get(&router, "/metrics", None, Some(timeout)).await })
}

/// Scrapes `/metrics` in the text format.
pub async fn scrape(router: &Router) -> Exposition {
    let answer = get(router, "/metrics", None, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    Exposition::parse(&answer.body)
}

/// Parsed samples of one exposition: `name{labels}` exactly as printed → value.
#[derive(Debug)]
pub struct Exposition {
    pub text: String,
    pub samples: BTreeMap<String, f64>,
}

impl Exposition {
    pub fn parse(text: &str) -> Exposition {
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
            assert!(samples.insert(series.to_owned(), value).is_none(), "duplicate {series}");
        }
        Exposition { text: text.to_owned(), samples }
    }

    /// The value of one series, e.g. `amd_hsmp_up` or `amd_hsmp_prochot_active{socket="1"}`.
    pub fn value(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// Number of series of metric `name`.
    pub fn count(&self, name: &str) -> usize {
        self.samples.keys().filter(|k| k.split('{').next() == Some(name)).count()
    }

    /// True when the exposition mentions the family at all (samples, HELP or TYPE).
    pub fn mentions(&self, name: &str) -> bool {
        self.text.contains(name)
    }

    pub fn errors(&self, collector: &str) -> f64 {
        self.value(&format!("amd_hsmp_scrape_errors_total{{collector=\"{collector}\"}}"))
            .unwrap_or_else(|| panic!("no error counter for {collector}:\n{}", self.text))
    }
}
