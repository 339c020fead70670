//! The real binaries end to end: `amd-hsmp-broker --simulate turin-2p` on a temporary socket
//! and `amd-hsmp-exporter` on a free loopback port, scraped over HTTP with a raw client.
//! Child processes are killed when their guard drops, so a failing test leaves nothing behind.

use crate::support::{Exposition, OPENMETRICS, PROMETHEUS_ACCEPT, TEXT_004};
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process, killed and reaped on drop.
struct Guard {
    child: Child,
    log: PathBuf,
}

impl Guard {
    fn spawn(program: &Path, args: &[&str], log: PathBuf) -> Guard {
        let out = File::create(&log).unwrap();
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        Guard { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        let status = self.child.try_wait().unwrap();
        assert!(status.is_none(), "exited with {status:?}; log:\n{}", self.log());
    }

    /// Sends SIGTERM and waits up to `limit` for the exit.
    fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(kill.success());
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < until, "no exit {limit:?} after SIGTERM:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/<profile>/`, the directory of the binaries (the test runs from its `deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_owned()
}

/// The broker binary next to this test's target directory, built if it is missing.
fn broker_binary() -> PathBuf {
    let path = target_dir().join("amd-hsmp-broker");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(&cargo)
            .args(["build", "-p", "amd-hsmp-broker", "--bin", "amd-hsmp-broker"])
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cargo} to build the broker: {e}"));
        assert!(status.success(), "building amd-hsmp-broker failed");
    }
    assert!(path.exists(), "no broker binary at {}", path.display());
    path
}

fn exporter_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_amd-hsmp-exporter"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < until, "{what} not ready within {limit:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// One HTTP response.
#[derive(Debug)]
struct Response {
    status: u16,
    content_type: String,
    body: String,
}

/// `GET path` over a fresh connection, HTTP/1.1 with `Connection: close`.
fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).map_err(std::io::Error::other)?;
    let (head, body) =
        text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other(text.clone()))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(head.to_owned()))?;
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(Response { status, content_type: header("content-type").unwrap_or_default(), body })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

fn start_broker(dir: &Path, socket: &Path, run: u32) -> Guard {
    // A broker killed by SIGKILL leaves its socket file behind.
    let _ = std::fs::remove_file(socket);
    let broker = Guard::spawn(
        &broker_binary(),
        &["--simulate", "turin-2p", "--listen", socket.to_str().unwrap()],
        dir.join(format!("broker-{run}.log")),
    );
    wait_for("broker socket", Duration::from_secs(10), || socket.exists());
    broker
}

fn scrape(addr: SocketAddr, accept: Option<&str>) -> (Response, Exposition) {
    let response = http_get(addr, "/metrics", accept).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let parsed = Exposition::parse(&response.body);
    (response, parsed)
}

#[test]
fn real_broker_and_exporter_serve_turin_2p_and_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let mut broker = start_broker(dir.path(), &socket, 1);

    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut exporter = Guard::spawn(
        &exporter_binary(),
        &[
            "--web.listen-address",
            &addr.to_string(),
            "--broker.socket",
            socket.to_str().unwrap(),
            "--log.level",
            "debug",
        ],
        dir.path().join("exporter.log"),
    );
    wait_for("exporter HTTP", Duration::from_secs(10), || {
        http_get(addr, "/", None).is_ok_and(|r| r.status == 200)
    });

    // Healthy, text format.
    let (response, m) = scrape(addr, None);
    assert_eq!(response.content_type, TEXT_004);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384, "{}", exporter.log());
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 384);
    assert_eq!(m.count("amd_hsmp_prochot_active"), 2);
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
    assert_eq!(m.value(r#"amd_hsmp_simulated_info{profile="turin-2p"}"#), Some(1.0));
    for collector in ["hsmp", "core-energy", "boost-limit", "prochot", "scrape", "broker"] {
        assert_eq!(m.errors(collector), 0.0, "{collector}\n{}", exporter.log());
    }

    // Healthy, OpenMetrics.
    let (response, m) = scrape(addr, Some(PROMETHEUS_ACCEPT));
    assert_eq!(response.content_type, OPENMETRICS);
    assert!(response.body.ends_with("# EOF\n"));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 384);

    // Broker killed: still 200, meta metrics only.
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0), "{}", m.text);
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 0);
    assert_eq!(m.count("amd_hsmp_prochot_active"), 0);
    assert!(m.errors("broker") >= 1.0);
    exporter.assert_running();

    // Broker back: the same exporter reconnects on the next scrape.
    let _broker = start_broker(dir.path(), &socket, 2);
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", exporter.log());
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
    exporter.assert_running();

    assert_eq!(http_get(addr, "/nothing-here", None).unwrap().status, 404);
    let status = exporter.terminate(Duration::from_secs(5));
    assert!(status.success(), "exit after SIGTERM: {status:?}\n{}", exporter.log());
}

#[test]
fn exporter_without_broker_serves_and_unknown_flags_exit_2() {
    let bad = Command::new(exporter_binary()).arg("--collector.nonexistent").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--collector.nonexistent"));

    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let missing = dir.path().join("no-broker.sock");
    let mut exporter = Guard::spawn(
        &exporter_binary(),
        &[
            "--web.listen-address",
            &addr.to_string(),
            "--broker.socket",
            missing.to_str().unwrap(),
            "--no-collector.prochot",
        ],
        dir.path().join("exporter.log"),
    );
    wait_for("exporter HTTP", Duration::from_secs(10), || {
        http_get(addr, "/", None).is_ok_and(|r| r.status == 200)
    });
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0));
    assert_eq!(m.errors("broker"), 1.0);
    exporter.assert_running();
    assert!(exporter.log().contains("broker unreachable"), "{}", exporter.log());
}
