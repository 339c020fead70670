//! The live half of the mixin check (`cargo xtask mixin --live`, and `cargo xtask test`): a real
//! Prometheus loads the mixin's rules and scrapes the real exporter and broker on the simulated
//! Turin 2P (with the core-owner collector on a small cgroup tree: a service and a Slurm job);
//! every dashboard query must return data, the recording rules must produce the per-socket and
//! per-node series, and AmdHsmpSimulated must fire. Then the set-up is broken step by step
//! (broker stopped, a machine without HSMP, a broker restart with the MSR energy source, a
//! thermal event of the simulator, exporter stopped) and each alert that must fire is waited for.

use super::{Query, Values, dashboard_queries, load_dashboards};
use crate::http::free_port;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The simulated machine.
const PROFILE: &str = "turin-2p";
/// Scrape and rule evaluation interval: short, so that rates exist after a few seconds.
const INTERVAL: &str = "2s";
/// How long the rules and the first alert may take to appear.
const READY_WITHIN: Duration = Duration::from_secs(90);
/// How long each later alert may take to fire.
const ALERT_WITHIN: Duration = Duration::from_secs(60);
/// Dashboard panels whose queries may be empty on a healthy simulated machine, with why.
const MAY_BE_EMPTY: &[(&str, &str)] = &[
    ("Sockets with the most PROCHOT", "lists only sockets that had PROCHOT in the last hour"),
    ("Nodes limited, by reason", "counts only nodes held by a limiter in the last 5 minutes"),
    ("Nodes most limited, by reason", "lists only nodes held by a limiter in the last hour"),
    ("Power by node name", "joins node_exporter's series, which the live check does not scrape"),
];

/// A cgroup v2 hierarchy in `work` for the core-owner collector: one service holding core 0 of
/// socket 0 of the simulated Turin 2P (CPUs 0 and 384, its two threads) and a Slurm job with
/// one step holding core 1 (CPUs 1 and 385), so that the per-workload power rules and the
/// panels per job and per workload have data.
fn cgroup_tree(work: &Path) -> Result<PathBuf> {
    let root = work.join("cgroup");
    let _ = fs::remove_dir_all(&root);
    let cpus = [
        ("", "0-767"),
        ("system.slice", "0-767"),
        ("system.slice/build.service", "0,384"),
        ("system.slice/slurmstepd.scope", "0-767"),
        ("system.slice/slurmstepd.scope/job_4242", "1,385"),
        ("system.slice/slurmstepd.scope/job_4242/step_0", "1,385"),
    ];
    for (dir, cpus) in cpus {
        fs::create_dir_all(root.join(dir))?;
        if !dir.is_empty() {
            fs::write(root.join(dir).join("cgroup.type"), "domain\n")?;
        }
        fs::write(root.join(dir).join("cpuset.cpus.effective"), format!("{cpus}\n"))?;
    }
    fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n")?;
    Ok(root)
}

/// A child process killed when dropped, so that an early error leaves nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Alert settings for the live run: the shipped expressions, every alert's `for:` cut to 0 s
/// (whatever alerts the config has) and a short reset window, so that each alert fires within a
/// few evaluations.
const FAST_ALERTS: &str = "alerts: std.mapWithKey(function(name, alert) alert { 'for': '0s' }, \
     super.alerts), energyResetWindow: '2m'";

/// The broker, restartable with another profile on the same socket path.
struct Broker<'a> {
    bin: &'a Path,
    socket: PathBuf,
    work: &'a Path,
    uid: String,
}

impl Broker<'_> {
    /// Starts a broker on `profile` (plus `flags`) and waits for its socket.
    fn start(&self, profile: &str, flags: &[&str], log: &str) -> Result<Running> {
        let _ = fs::remove_file(&self.socket);
        let running = spawn(
            Command::new(self.bin.join("amd-hsmp-sim-broker"))
                .args(["--simulate", profile, "--allow-uid", &self.uid])
                .args(flags)
                .arg("--listen")
                .arg(&self.socket),
            &self.work.join(log),
        )?;
        wait_for(Duration::from_secs(20), "the broker's socket", || Ok(self.socket.exists()))
            .with_context(|| format!("see {}", self.work.join(log).display()))?;
        Ok(running)
    }
}

/// Starts broker, exporter and Prometheus in `work`, waits for the rules, runs every dashboard
/// query, then breaks the set-up step by step and waits for each alert that should fire. `bin`
/// holds the two binaries.
pub fn check(dir: &Path, work: &Path, bin: &Path) -> Result<String> {
    let work = work.join("live");
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let broker = Broker {
        bin,
        socket: work.join("broker.sock"),
        work: &work,
        uid: rustix::process::getuid().as_raw().to_string(),
    };
    let running_broker = broker.start(PROFILE, &[], "broker-turin-2p.log")?;
    let exporter_port = free_port()?;
    let target = format!("127.0.0.1:{exporter_port}");
    let exporter = start_exporter(bin, &work, &broker.socket, &target)?;
    let (prometheus_process, prometheus) = start_prometheus(dir, &work, &target)?;
    let logs = || format!("logs in {}", work.display());

    let warm = wait_until_ready(&prometheus, &logs)?;
    let queries = dashboards_have_data(dir, &prometheus, &target, &logs)?;
    only_the_simulation_fires(&prometheus, &logs)?;
    let seen =
        alerts_fire(&broker, running_broker, exporter, prometheus_process, &prometheus, &logs)?;

    Ok(format!(
        "rules ready after {:.0} s; {} dashboard queries return data; seen firing: {}",
        warm.as_secs_f64(),
        queries,
        seen.join(", ")
    ))
}

/// Starts the exporter in `work` on `target` (`127.0.0.1:port`), asking the broker at `socket`,
/// with the core-owner collector over a cgroup tree of its own.
fn start_exporter(bin: &Path, work: &Path, socket: &Path, target: &str) -> Result<Running> {
    let cgroupfs = cgroup_tree(work)?;
    spawn(
        Command::new(bin.join("amd-hsmp-exporter"))
            .args(["--web.listen-address", target, "--broker.socket"])
            .arg(socket)
            .arg("--collector.core-owner")
            .arg("--path.cgroupfs")
            .arg(&cgroupfs),
        &work.join("exporter.log"),
    )
}

/// Starts Prometheus in `work` scraping `target`, with the mixin's recording rules and its
/// alerts at [`FAST_ALERTS`]: the process and its HTTP API.
fn start_prometheus(dir: &Path, work: &Path, target: &str) -> Result<(Running, Prometheus)> {
    let alerts = super::eval_json(
        dir,
        &format!(
            "((import 'mixin.libsonnet') + {{ _config+:: {{ {FAST_ALERTS} }} }}).prometheusAlerts"
        ),
    )?;
    let alerts_file = work.join("alerts.yaml");
    fs::write(&alerts_file, alerts.to_string())?;
    let prometheus_port = free_port()?;
    let config = json!({
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [dir.join("prometheus_rules.yaml"), alerts_file],
        "scrape_configs": [{"job_name": "amd_hsmp", "static_configs": [{"targets": [target]}]}],
    });
    let config_file = work.join("prometheus.yml");
    fs::write(&config_file, serde_json::to_string_pretty(&config)?)?;
    let process = spawn(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", work.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}")),
        &work.join("prometheus.log"),
    )?;
    Ok((process, Prometheus(prometheus_port)))
}

/// Waits for the recording rules and `AmdHsmpSimulated`; an error with what `up` and
/// `amd_hsmp_broker_up` say when they do not come. The time they took.
fn wait_until_ready(prometheus: &Prometheus, logs: &impl Fn() -> String) -> Result<Duration> {
    let started = Instant::now();
    let ready = wait_for(READY_WITHIN, "the recording rules and AmdHsmpSimulated", || {
        // The per-workload rules are a group of their own, evaluated at their own offset.
        Ok(prometheus.has("instance:amd_hsmp_power_watts:sum_rate5m")
            && prometheus.has("instance_owner:amd_hsmp_owner_power_watts:sum_rate5m")
            && prometheus.firing("AmdHsmpSimulated", ""))
    });
    if let Err(e) = ready {
        let up = prometheus.query("up").map(|r| Value::Array(r).to_string()).unwrap_or_default();
        let broker_up = prometheus
            .query("amd_hsmp_broker_up")
            .map(|r| Value::Array(r).to_string())
            .unwrap_or_default();
        bail!(
            "{e:#}; up: {up}; amd_hsmp_broker_up: {broker_up} (a broker that refuses this uid \
             gives 0); {}",
            logs()
        );
    }
    let warm = started.elapsed();
    Ok(warm)
}

/// Runs every dashboard query against the exporter at `target`: each returns data, but those
/// [`MAY_BE_EMPTY`] lets be. How many queries ran.
fn dashboards_have_data(
    dir: &Path,
    prometheus: &Prometheus,
    target: &str,
    logs: &impl Fn() -> String,
) -> Result<usize> {
    let values: Values<'_> = &[
        ("__rate_interval", "1m"),
        ("__interval", INTERVAL),
        ("__range", "1h"),
        ("job", "amd_hsmp"),
        ("instance", target),
        ("socket", "0"),
    ];
    let mut queries: Vec<Query> = Vec::new();
    for (file, dashboard) in load_dashboards(dir)? {
        queries.extend(dashboard_queries(&file, &dashboard, values)?);
    }
    let mut empty = Vec::new();
    for q in &queries {
        let result =
            prometheus.query(&q.expr).with_context(|| format!("{}: {}", q.place, q.expr))?;
        if result.is_empty()
            && !MAY_BE_EMPTY.iter().any(|(title, _)| q.place.contains(&format!("{title:?}")))
        {
            empty.push(format!("{}: {}", q.place, q.expr));
        }
    }
    ensure!(
        empty.is_empty(),
        "dashboard queries without data against the simulated {PROFILE}:\n{}\n{}",
        empty.join("\n"),
        logs()
    );
    Ok(queries.len())
}

/// On the healthy machine nothing but the simulation is reported: no alert but
/// `AmdHsmpSimulated` firing.
fn only_the_simulation_fires(prometheus: &Prometheus, logs: &impl Fn() -> String) -> Result<()> {
    // On the healthy machine nothing but the simulation is reported.
    let firing: Vec<String> = prometheus
        .query(r#"ALERTS{alertstate="firing"}"#)?
        .iter()
        .filter_map(|a| a["metric"]["alertname"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        firing.iter().all(|a| a == "AmdHsmpSimulated"),
        "alerts firing on the healthy simulated {PROFILE}: {firing:?}; {}",
        logs()
    );
    Ok(())
}

/// Breaks the set-up step by step (broker stopped, without HSMP, restarted on MSR energy, in a
/// thermal event; exporter stopped) and waits for the alerts each step must fire: the alerts
/// seen firing. The processes are ended here: on an error, Prometheus first, then the exporter,
/// then the broker.
fn alerts_fire(
    broker: &Broker<'_>,
    mut running_broker: Running,
    exporter: Running,
    _prometheus: Running,
    prometheus: &Prometheus,
    logs: &impl Fn() -> String,
) -> Result<Vec<&'static str>> {
    // Each step breaks something and waits for the alerts it must fire.
    let mut seen = vec!["AmdHsmpSimulated"];
    let mut expect = |what: &str, alerts: &[(&'static str, &str)]| -> Result<()> {
        for (alert, matchers) in alerts {
            wait_for(ALERT_WITHIN, &format!("{alert} to fire after {what}"), || {
                Ok(prometheus.firing(alert, matchers))
            })
            .with_context(logs)?;
            seen.push(alert);
        }
        Ok(())
    };
    drop(running_broker);
    expect(
        "stopping the broker",
        &[("AmdHsmpBrokerDown", ""), ("AmdHsmpScrapeErrors", r#"collector="broker""#)],
    )?;
    running_broker = broker.start("rome-1p", &[], "broker-rome-1p.log")?;
    expect("a broker on a machine without HSMP", &[("AmdHsmpDeviceDown", "")])?;
    drop(running_broker);
    let msr = ["--collector.core-energy.msr-fallback"];
    running_broker = broker.start("genoa-2p", &msr, "broker-genoa-2p.log")?;
    wait_for(ALERT_WITHIN, "two scrapes of MSR energy", || {
        Ok(prometheus.has("count_over_time(amd_hsmp_core_energy_joules_total[1m]) >= 2"))
    })
    .with_context(logs)?;
    drop(running_broker);
    running_broker = broker.start("genoa-2p", &msr, "broker-genoa-2p-restarted.log")?;
    expect("restarting a broker with the MSR source", &[("AmdHsmpEnergyCounterReset", "")])?;
    drop(running_broker);
    // Socket 1 runs normally for 15 s, then holds PROCHOT with its boost limits and its
    // frequency limit (by PROCHOT and cHTC) at 60 %.
    let thermal = ["--simulate.scenario", "thermal-event"];
    running_broker = broker.start(PROFILE, &thermal, "broker-turin-2p-thermal-event.log")?;
    expect(
        "a thermal event on socket 1 of the simulator",
        &[
            ("AmdHsmpProchotAsserted", r#"socket="1""#),
            ("AmdHsmpBoostLimitLow", r#"socket="1""#),
            ("AmdHsmpProchotFrequent", r#"socket="1""#),
            ("AmdHsmpFrequencyLimited", r#"socket="1",reason="prochot""#),
            ("AmdHsmpFrequencyLimited", r#"socket="1",reason="chtc""#),
        ],
    )?;
    let thermal_alerts = [
        "AmdHsmpProchotAsserted",
        "AmdHsmpBoostLimitLow",
        "AmdHsmpProchotFrequent",
        "AmdHsmpFrequencyLimited",
    ];
    for alert in thermal_alerts {
        ensure!(
            !prometheus.firing(alert, r#"socket="0""#),
            "{alert} fires on socket 0, which the thermal event spares; {}",
            logs()
        );
    }
    drop(exporter);
    expect("stopping the exporter", &[("AmdHsmpExporterDown", "")])?;
    drop(running_broker);
    Ok(seen)
}

/// The HTTP API of the Prometheus on this port of 127.0.0.1.
struct Prometheus(u16);

impl Prometheus {
    /// Whether the instant query returns anything (false while Prometheus is not up yet).
    fn has(&self, expr: &str) -> bool {
        self.query(expr).is_ok_and(|r| !r.is_empty())
    }

    /// Whether the alert fires now, on series matching `matchers` (e.g. `collector="broker"`).
    fn firing(&self, alert: &str, matchers: &str) -> bool {
        let sep = if matchers.is_empty() { "" } else { "," };
        self.has(&format!(r#"ALERTS{{alertname="{alert}",alertstate="firing"{sep}{matchers}}}"#))
    }

    /// The result vector of an instant query now.
    fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let body = http_get(self.0, &format!("/api/v1/query?query={}", percent_encode(expr)))?;
        let reply: Value = serde_json::from_str(&body).context("the query API answered no JSON")?;
        ensure!(reply["status"] == "success", "query failed: {body}");
        match &reply["data"]["result"] {
            Value::Array(series) => Ok(series.clone()),
            // A scalar or string result (e.g. `vector(0)` is a vector; `1` would be a scalar).
            other => Ok(vec![other.clone()]),
        }
    }
}

/// GET over HTTP/1.0 (the server closes the connection after the reply); the body of a 200.
fn http_get(port: u16, path: &str) -> Result<String> {
    let (status, body) = crate::http::get(port, path, Duration::from_secs(10))?;
    ensure!(status == 200, "GET {path}: HTTP {status}: {body}");
    Ok(body)
}

/// Percent-encodes everything but the unreserved characters of RFC 3986.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Starts a command with its output in `log`.
fn spawn(cmd: &mut Command, log: &Path) -> Result<Running> {
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    Ok(Running(child))
}

/// Polls `ready` every 200 ms until it is true; past `within` an error naming `what`.
fn wait_for(within: Duration, what: &str, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
    let started = Instant::now();
    while !ready()? {
        ensure!(
            started.elapsed() < within,
            "timed out after {} s waiting for {what}",
            within.as_secs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(percent_encode(r#"up{job="a b"}[5m]"#), "up%7Bjob%3D%22a%20b%22%7D%5B5m%5D");
    }

    #[test]
    fn the_panels_that_may_be_empty_exist() {
        let dir = crate::workspace::root().join("mixin");
        let titles: Vec<String> = load_dashboards(&dir)
            .unwrap()
            .iter()
            .flat_map(|(_, d)| d["panels"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["title"].as_str().map(str::to_owned))
            .collect();
        for (title, _) in MAY_BE_EMPTY {
            assert!(titles.iter().any(|t| t == title), "{title} is not a panel");
        }
    }
}
