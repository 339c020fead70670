//! The exporter binary end to end, on the e2e harness (so the broker it talks to is always
//! built from the current tree): `amd-hsmp-sim-broker --simulate turin-2p` on a temporary socket
//! and `amd-hsmp-exporter` on a free loopback port, scraped over HTTP; flags, exit codes,
//! signals and the file-descriptor limit check.

use amd_hsmp_e2e::harness::{self, Exposition, Proc, Response};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use amd_hsmp_e2e::scenario::PROMETHEUS_ACCEPT;
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
const TIMEOUT: Duration = Duration::from_secs(20);

fn broker(dir: &Path, socket: &Path, run: u32) -> Proc {
    harness::start_simulated_broker("turin-2p", socket, &[], dir.join(format!("broker-{run}.log")))
        .unwrap()
}

fn exporter(dir: &Path, socket: &Path, flags: &[&str]) -> (Proc, SocketAddr) {
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    harness::start_exporter(socket, &flags, None, dir).unwrap()
}

fn scrape(addr: SocketAddr, accept: Option<&str>) -> (Response, Exposition) {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    let response = harness::http_get(addr, "/metrics", &headers, TIMEOUT).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let parsed = Exposition::parse(&response.body).unwrap();
    (response, parsed)
}

#[test]
fn real_broker_and_exporter_serve_turin_2p_and_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let mut broker1 = broker(dir.path(), &socket, 1);
    let (mut exporter, addr) = exporter(dir.path(), &socket, &[]);

    // Healthy, text format.
    let (response, m) = scrape(addr, None);
    assert_eq!(response.header("content-type"), Some(TEXT_004));
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
    assert_eq!(response.header("content-type"), Some(OPENMETRICS));
    assert!(response.body.ends_with("# EOF\n"));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 384);

    // Broker killed: still 200, meta metrics only.
    broker1.kill();
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0), "{}", m.text);
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 0);
    assert_eq!(m.count("amd_hsmp_prochot_active"), 0);
    assert!(m.errors("broker") >= 1.0);
    exporter.check_running().unwrap();

    // Broker back: the same exporter reconnects on the next scrape.
    let _broker2 = broker(dir.path(), &socket, 2);
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", exporter.log());
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
    exporter.check_running().unwrap();

    assert_eq!(harness::http_get(addr, "/nothing-here", &[], TIMEOUT).unwrap().status, 404);
    exporter.signal(libc::SIGTERM).unwrap();
    let status = exporter.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "exit after SIGTERM: {status:?}\n{}", exporter.log());
}

#[test]
fn exporter_without_broker_serves_and_unknown_flags_exit_2() {
    let exe = &harness::binaries().unwrap().exporter;
    let bad = Command::new(exe).arg("--collector.nonexistent").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--collector.nonexistent"));

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-broker.sock");
    let (mut exporter, addr) = exporter(dir.path(), &missing, &["--no-collector.prochot"]);
    let (_, m) = scrape(addr, None);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0));
    assert_eq!(m.errors("broker"), 1.0);
    exporter.check_running().unwrap();
    assert!(exporter.log().contains("broker unreachable"), "{}", exporter.log());
}

#[test]
fn sighup_sigusr1_and_sigusr2_do_not_end_the_exporter() {
    // Regression: their default action ended the process, which systemd counts as clean.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let _broker = broker(dir.path(), &socket, 1);
    let (mut exporter, addr) = exporter(dir.path(), &socket, &[]);
    for signal in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP] {
        exporter.signal(signal).unwrap();
        // The scrape after each signal is the gate: it is answered only once the signal has
        // been delivered to a process that is still running.
        let (_, m) = scrape(addr, None);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 384);
        exporter.check_running().unwrap();
    }
    // The log lines are written by the signal task: wait for them.
    let until = std::time::Instant::now() + TIMEOUT;
    while exporter.log().matches("signal ignored").count() < 3 {
        assert!(std::time::Instant::now() < until, "not logged:\n{}", exporter.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    exporter.check_running().unwrap();
    let log = exporter.log();
    for name in ["SIGHUP", "SIGUSR1", "SIGUSR2"] {
        assert!(log.contains(name), "{name} not logged:\n{log}");
    }
}

#[test]
fn max_connections_beyond_the_fd_limit_refuses_to_start_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let exe = &harness::binaries().unwrap().exporter;
    let args: Vec<String> = ["--web.listen-address", "127.0.0.1:0", "--web.max-connections", "500"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let mut exporter = Proc::spawn_with_fd_limit(
        "amd-hsmp-exporter",
        exe,
        &args,
        dir.path().join("exporter.log"),
        Some(256),
    )
    .unwrap();
    let status = exporter.wait_exit(TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(1), "{}", exporter.log());
    let log = exporter.log();
    assert!(log.contains("--web.max-connections 500 does not fit RLIMIT_NOFILE (256)"), "{log}");
    assert!(log.contains("at most 192"), "{log}");
}

#[test]
fn default_max_connections_is_lowered_to_fit_the_fd_limit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let flags: Vec<String> = Vec::new();
    let (exporter, _) = harness::start_exporter(&socket, &flags, Some(256), dir.path()).unwrap();
    let log = exporter.log();
    assert!(log.contains("lowered from 512 to 192 to fit RLIMIT_NOFILE (256)"), "{log}");
    assert!(log.contains("max_connections=192"), "{log}");
}

/// Regression (I3): a broker of another release, which refuses the handshake with a protocol
/// version mismatch, was logged as "broker unreachable", which sends an operator looking for a
/// stopped service. The log names the skew and the fix, once, and the scrape says
/// `amd_hsmp_broker_up 0` as before.
#[test]
fn a_broker_of_another_release_is_named_as_such_with_the_fix() {
    use amd_hsmp_proto::{Message as _, Reply, Request, RequestError};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            // What a protocol-2 broker answers to a newer Hello: the mismatch, then it closes.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let Ok(Request::Hello { protocol_version }) = Request::read(&mut stream) else {
                    continue;
                };
                let refusal = RequestError::VersionMismatch { broker: 2, peer: protocol_version };
                let _ = Reply::Error(refusal).write(&mut stream);
            }
        })
    };
    let (mut exporter, addr) = exporter(dir.path(), &socket, &[]);
    for _ in 0..2 {
        let (_, m) = scrape(addr, None);
        assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0), "{}", m.text);
    }
    let log = exporter.log();
    let named: Vec<&str> = log.lines().filter(|l| l.contains("speaks protocol 2")).collect();
    assert_eq!(named.len(), 1, "{log}");
    assert!(named[0].contains("upgrade both together"), "{log}");
    assert!(!log.contains("broker unreachable"), "{log}");
    exporter.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    served.join().unwrap();
}

/// Regression (Q5): until the landing page had two answers a second apart, every view held its
/// place in `--web.max-requests` for a second and took a second sample, so a burst of views
/// at start-up turned scrapes away (169 of 512 scrapes answered 503). One view waits now; the
/// others give their place back after their sample and show its answer's power.
#[test]
fn a_burst_of_first_views_holds_one_place_and_every_view_shows_power() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let _broker = broker(dir.path(), &socket, 1);
    let (_exporter, addr) = exporter(dir.path(), &socket, &["--web.max-requests", "2"]);
    let start = std::sync::Arc::new(std::sync::Barrier::new(3));
    let views: Vec<_> = (0..2)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                harness::http_get(addr, "/", &[], TIMEOUT).unwrap()
            })
        })
        .collect();
    start.wait();
    // Both views are admitted well within this, and wait a second for their power.
    std::thread::sleep(Duration::from_millis(300));
    let mut statuses = Vec::new();
    while !views.iter().all(|v| v.is_finished()) {
        let headers = [(amd_hsmp_exporter::http::SCRAPE_TIMEOUT_HEADER, "1")];
        statuses.push(harness::http_get(addr, "/metrics", &headers, TIMEOUT).unwrap().status);
        if statuses.last() == Some(&200) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pages: Vec<Response> = views.into_iter().map(|v| v.join().unwrap()).collect();
    eprintln!("scrapes while two first views waited, with 2 places: {statuses:?}");
    for page in &pages {
        assert_eq!(page.status, 200, "{}", page.body);
        assert!(page.body.contains("<rect class=\"cell power\""), "no power: {}", page.body);
    }
    let waited = pages.iter().filter(|p| p.body.contains("took two samples")).count();
    assert_eq!(waited, 1, "one view takes the second sample, the other shares it");
    assert_eq!(statuses.last(), Some(&200), "no scrape served while the views waited");
}
