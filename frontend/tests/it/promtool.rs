//! The exposition in both formats is accepted by Prometheus' own parsers, run through
//! `promtool` (Debian package `prometheus`): `promtool check metrics` parses and lints the text
//! format 0.0.4; OpenMetrics goes through Prometheus' OpenMetrics parser by
//! `promtool tsdb create-blocks-from openmetrics`, which needs a timestamp on every sample.

use crate::support::*;
use std::io::Write as _;
use std::process::{Command, Stdio};

fn promtool(args: &[&str]) -> Command {
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    if Command::new(&promtool).arg("--version").output().is_err() {
        panic!(
            "cannot run {promtool:?}: install it with `apt-get install -y prometheus` (it \
             provides /usr/bin/promtool) or point the PROMTOOL variable at it"
        );
    }
    let mut command = Command::new(promtool);
    command.args(args);
    command
}

fn complaints(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs `promtool check metrics` on text-format `text`; returns its complaints.
fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = promtool(&["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() { Ok(()) } else { Err(complaints(&out)) }
}

/// Parses OpenMetrics `text` with Prometheus' OpenMetrics parser; returns its complaints, or
/// the number of series it read.
fn promtool_openmetrics(text: &str) -> Result<usize, String> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("scrape.om");
    let stamped: String = text
        .lines()
        .map(|line| {
            if line.starts_with('#') { format!("{line}\n") } else { format!("{line} 1700000000\n") }
        })
        .collect();
    std::fs::write(&input, stamped).unwrap();
    let out = promtool(&["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&input)
        .arg(dir.path().join("blocks"))
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(complaints(&out));
    }
    // The last line of the block table: ULID, min, max, duration, samples, chunks, series, size.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().last().unwrap_or_default();
    row.split_whitespace()
        .nth(6)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected promtool output:\n{stdout}"))
}

fn healthy_simulated() -> Behaviour {
    Behaviour {
        simulated: Some("turin-2p".into()),
        topology: topology(2, 16),
        ..Behaviour::healthy()
    }
}

#[tokio::test]
#[ignore = "needs promtool (cargo xtask deps installs it): cargo xtask test runs it"]
async fn text_format_passes_promtool() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, healthy_simulated());
    let answer = get(&router(config(&dir.path)), "/metrics", None, None).await;
    assert_eq!(answer.content_type, TEXT_004);
    promtool_check(&answer.body).unwrap_or_else(|e| panic!("{e}\n{}", answer.body));
}

#[tokio::test]
#[ignore = "needs promtool (cargo xtask deps installs it): cargo xtask test runs it"]
async fn openmetrics_format_passes_promtool() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, healthy_simulated());
    let answer = get(&router(config(&dir.path)), "/metrics", Some(PROMETHEUS_ACCEPT), None).await;
    assert_eq!(answer.content_type, OPENMETRICS);
    let series =
        promtool_openmetrics(&answer.body).unwrap_or_else(|e| panic!("{e}\n{}", answer.body));
    assert_eq!(series, Exposition::parse(&answer.body).samples.len(), "series lost in parsing");
}

#[test]
#[ignore = "needs promtool (cargo xtask deps installs it): cargo xtask test runs it"]
fn openmetrics_check_rejects_a_truncated_exposition() {
    // Guards the check above: without `# EOF` an OpenMetrics exposition is invalid.
    let text = "# TYPE x gauge\nx 1\n";
    assert!(promtool_openmetrics(text).is_err());
    assert_eq!(promtool_openmetrics(&format!("{text}# EOF\n")), Ok(1));
}

#[tokio::test]
#[ignore = "needs promtool (cargo xtask deps installs it): cargo xtask test runs it"]
async fn broker_down_output_passes_promtool() {
    let dir = socket_dir();
    let answer = get(&router(config(&dir.path)), "/metrics", None, None).await;
    promtool_check(&answer.body).unwrap_or_else(|e| panic!("{e}\n{}", answer.body));
}
