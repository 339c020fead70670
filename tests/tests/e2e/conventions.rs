//! The Prometheus ecosystem's conventions, on the real binaries: `--version` in node_exporter's
//! shape and log records in promslog's (logfmt by default, JSON on request).

use amd_hsmp_e2e::harness;
use std::process::Command;

/// The keys every promslog record starts with, in order.
const HEAD: [&str; 4] = ["time", "level", "source", "msg"];

#[test]
fn every_binary_prints_version_in_node_exporter_shape() {
    let bins = harness::binaries().unwrap();
    for (name, exe) in [
        ("amd-hsmp-broker", &bins.broker),
        ("amd-hsmp-sim-broker", &bins.sim_broker),
        ("amd-hsmp-exporter", &bins.exporter),
    ] {
        let out = Command::new(exe).arg("--version").output().unwrap();
        assert!(out.status.success(), "{name} --version: {}", out.status);
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let first = format!("{name}, version {} (branch: ", env!("CARGO_PKG_VERSION"));
        assert!(lines[0].starts_with(&first) && lines[0].contains(", revision: "), "{text}");
        for (line, key) in
            lines[1..].iter().zip(["build user:", "build date:", "rustc version:", "platform:"])
        {
            assert!(line.starts_with(&format!("  {key}")), "{name}: {line:?} is not {key}");
        }
        let short = Command::new(exe).arg("-V").output().unwrap();
        assert_eq!(String::from_utf8(short.stdout).unwrap(), text, "{name} -V");
    }
}

#[test]
fn the_broker_logs_logfmt_records_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let path = dir.path().join("broker.log");
    let mut broker =
        harness::start_simulated_broker("milan-1p", &socket, &[], path.clone()).unwrap();
    // The socket exists once bound; the line follows its chmod, so it is waited for.
    let logged = || std::fs::read_to_string(&path).is_ok_and(|l| l.contains("msg=listening"));
    harness::wait_until(&mut broker, "the listening line", logged).unwrap();
    let log = broker.log();
    let line = log.lines().find(|l| l.contains("msg=listening")).unwrap_or_else(|| panic!("{log}"));
    let keys: Vec<&str> =
        line.split(' ').filter_map(|pair| pair.split_once('=').map(|(k, _)| k)).collect();
    assert_eq!(keys[..4], HEAD, "{line}");
    assert!(line.contains(" level=INFO source=daemon.rs:"), "{line}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log}");
}

#[test]
fn the_exporter_logs_json_records_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let flags = ["--log.format".to_string(), "json".to_string()];
    let (exporter, addr) = harness::start_exporter(&socket, &flags, None, dir.path()).unwrap();
    let log = exporter.log();
    let listening = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .find(|record| record["msg"] == "listening")
        .unwrap_or_else(|| panic!("no listening record in {log}"));
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["address"], addr.to_string());
    assert!(listening["source"].as_str().unwrap().starts_with("main.rs:"), "{listening}");
    let line = log.lines().find(|l| l.contains("\"msg\":\"listening\"")).unwrap();
    let at: Vec<usize> = HEAD.iter().map(|k| line.find(&format!("\"{k}\":")).unwrap()).collect();
    assert!(at.is_sorted(), "keys out of order: {line}");
}

/// A start-up failure is one record like every other error: the message says what happened
/// (`exiting`), the `error` field holds the whole chain, outermost cause first.
#[test]
fn a_fatal_error_is_a_record_with_its_chain_in_the_error_field() {
    let bins = harness::binaries().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broker = Command::new(&bins.sim_broker)
        .args(["--simulate", "milan-1p", "--log.format", "json"])
        .args(["--allow-group", "no-such-group-here", "--listen"])
        .arg(dir.path().join("s.sock"))
        .output()
        .unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, "tls_server_config: [").unwrap();
    let exporter = Command::new(&bins.exporter)
        .args(["--log.format", "json", "--web.listen-address", "127.0.0.1:0"])
        .arg("--web.config.file")
        .arg(&web)
        .output()
        .unwrap();
    for (name, out, cause) in
        [("broker", broker, "no such group"), ("exporter", exporter, "web.yml")]
    {
        assert_eq!(out.status.code(), Some(1), "{name}");
        let text = String::from_utf8(out.stderr).unwrap();
        let records: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let fatal = records.last().unwrap_or_else(|| panic!("{name} logged nothing"));
        assert_eq!(fatal["level"], "ERROR", "{name}: {text}");
        assert_eq!(fatal["msg"], "exiting", "{name}: {text}");
        let error =
            fatal["error"].as_str().unwrap_or_else(|| panic!("{name}: no error field: {text}"));
        assert!(error.contains(cause) && error.contains(": "), "{name}: {error}");
    }
}
