//! The exporter as the checks scrape it: `/metrics` fetched in the guest and parsed, and the
//! series a healthy scrape must hold with the responder's exact values.

use super::{COMMAND_TIMEOUT, Evidence};
use crate::vm::guest::{Output, Vm};
use crate::vm::responder::Responder;
use amd_hsmp_broker::DEFAULT_MAX_AGE;
use amd_hsmp_proto::{FrequencyLimit, LimitReason};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;

/// Where the packaged exporter listens.
const METRICS_URL: &str = "http://127.0.0.1:10054/metrics";

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_total`).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// The samples of a text or OpenMetrics exposition (comments skipped).
pub fn parse_metrics(text: &str) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) =
            line.rsplit_once(' ').with_context(|| format!("no value in {line:?}"))?;
        let value: f64 = value.parse().with_context(|| format!("bad value in {line:?}"))?;
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body =
                    rest.strip_suffix('}').with_context(|| format!("bad labels {line:?}"))?;
                let mut labels = BTreeMap::new();
                for pair in body.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) =
                        pair.split_once('=').with_context(|| format!("bad label {pair}"))?;
                    labels.insert(k.to_string(), v.trim_matches('"').to_string());
                }
                (name, labels)
            }
        };
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    Ok(samples)
}

/// A parsed scrape with lookups.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// The raw text.
    pub text: String,
    /// The samples.
    pub samples: Vec<Sample>,
    /// Seconds the HTTP request took, as curl measured it in the guest.
    pub seconds: f64,
}

impl Scrape {
    pub(super) fn get(&self, name: &str, labels: &[(&str, String)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.labels.get(*k) == Some(v))
            })
            .map(|s| s.value)
    }

    pub(super) fn count(&self, name: &str) -> usize {
        self.samples.iter().filter(|s| s.name == name).count()
    }

    pub(super) fn errors(&self, collector: &str) -> f64 {
        self.get("amd_hsmp_scrape_errors_total", &[("collector", collector.into())]).unwrap_or(0.0)
    }
}

pub(super) fn core_labels(socket: u32, core: u32) -> [(&'static str, String); 2] {
    [("core", core.to_string()), ("socket", socket.to_string())]
}

/// One series a scrape must hold (or must not, where a fault removes it).
#[derive(Debug, Clone)]
pub(super) struct Expected {
    pub(super) name: &'static str,
    pub(super) labels: Vec<(&'static str, String)>,
    pub(super) value: f64,
}

impl Expected {
    pub(super) fn on_socket(&self, socket: u32) -> bool {
        self.labels.iter().any(|(k, v)| *k == "socket" && *v == socket.to_string())
    }
}

/// The series of every core and socket with the simulator's values now; the core energy
/// family when `energy`, the package energy family where the firmware has the RAPL messages
/// (`GET_RAPL_PACKAGE_COUNTER`, protocol 7).
pub(super) fn expected(responder: &Responder, energy: bool) -> Result<Vec<Expected>> {
    let machine = responder.machine();
    let fw = machine.firmware();
    let topo = responder.topology();
    let esu = f64::from(topo.spec(7).esu);
    let mut out = Vec::new();
    for socket in 0..topo.sockets {
        out.push(Expected {
            name: "amd_hsmp_prochot_active",
            labels: vec![("socket", socket.to_string())],
            value: if fw.prochot(socket)? { 1.0 } else { 0.0 },
        });
        if machine.spec().rapl_messages {
            out.push(Expected {
                name: "amd_hsmp_package_energy_joules_total",
                labels: vec![("socket", socket.to_string())],
                value: fw.package_energy_counter(socket)? as f64 / esu.exp2(),
            });
        }
        if machine.spec().freq_limit_messages() {
            let limit = FrequencyLimit::from(fw.freq_limit(socket)?);
            out.push(Expected {
                name: "amd_hsmp_socket_frequency_limit_hertz",
                labels: vec![("socket", socket.to_string())],
                value: limit.hertz(),
            });
            for reason in LimitReason::ALL {
                out.push(Expected {
                    name: "amd_hsmp_socket_frequency_limit_reason",
                    labels: vec![("reason", reason.to_string()), ("socket", socket.to_string())],
                    value: if limit.is_limited_by(reason) { 1.0 } else { 0.0 },
                });
            }
        }
        for core in 0..topo.cores {
            out.push(Expected {
                name: "amd_hsmp_core_boost_limit_hertz",
                labels: core_labels(socket, core).to_vec(),
                value: f64::from(fw.boost_limit(socket, core)?) * 1e6,
            });
            if energy {
                let counter = fw.energy_counter(socket, core)?;
                out.push(Expected {
                    name: "amd_hsmp_core_energy_joules_total",
                    labels: core_labels(socket, core).to_vec(),
                    value: counter as f64 / esu.exp2(),
                });
            }
        }
    }
    Ok(out)
}

/// Adds to `ev` that a healthy scrape at `protocol` has `amd_hsmp_up 1`, the protocol version,
/// every series with the responder's exact value, the energy family exactly when `energy` and
/// the package energy family exactly where the firmware has the RAPL messages.
pub(super) fn healthy(
    ev: &mut Evidence,
    responder: &Responder,
    s: &Scrape,
    protocol: u32,
    energy: bool,
) -> Result<()> {
    let topo = responder.topology();
    ev.check(
        s.get("amd_hsmp_up", &[]) == Some(1.0),
        format!("amd_hsmp_up {:?}", s.get("amd_hsmp_up", &[])),
    );
    let proto = s.get("amd_hsmp_protocol_version", &[]);
    ev.check(
        proto == Some(f64::from(protocol)),
        format!("amd_hsmp_protocol_version {proto:?}, responder {protocol}"),
    );
    let exp = expected(responder, energy)?;
    let n = exact_values(ev, s, &exp, |_| false);
    let cores = (topo.sockets * topo.cores) as usize;
    let boost = s.count("amd_hsmp_core_boost_limit_hertz");
    ev.check(boost == cores, format!("{boost} boost series for {cores} cores"));
    let hot = s.count("amd_hsmp_prochot_active");
    ev.check(
        hot == topo.sockets as usize,
        format!("{hot} PROCHOT series for {} sockets", topo.sockets),
    );
    let limits = s.count("amd_hsmp_socket_frequency_limit_hertz");
    let want = if responder.machine().spec().freq_limit_messages() { topo.sockets } else { 0 };
    ev.check(
        limits == want as usize,
        format!("{limits} frequency-limit series for {} sockets, {want} expected", topo.sockets),
    );
    let packages = s.count("amd_hsmp_package_energy_joules_total");
    let want = if responder.machine().spec().rapl_messages { topo.sockets } else { 0 };
    ev.check(
        packages == want as usize,
        format!("{packages} package energy series for {} sockets, {want} expected", topo.sockets),
    );
    let energy_lines = s.text.lines().filter(|l| l.contains("amd_hsmp_core_energy_joules")).count();
    if energy {
        ev.check(
            s.count("amd_hsmp_core_energy_joules_total") == cores,
            format!("energy series for {cores} cores"),
        );
    } else {
        ev.check(energy_lines == 0, format!("no energy family ({energy_lines} lines mention it)"));
    }
    ev.check(true, format!("{n} series compared with the responder's values"));
    Ok(())
}

/// Adds to `ev` that every expected series is in `scrape` with its exact value, except those
/// `absent` says a fault removes, which must be missing; returns how many were checked.
pub(super) fn exact_values(
    ev: &mut Evidence,
    scrape: &Scrape,
    expected: &[Expected],
    absent: impl Fn(&Expected) -> bool,
) -> usize {
    for e in expected {
        let got = scrape.get(e.name, &e.labels);
        let label_text: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let series = format!("{}{{{}}}", e.name, label_text.join(","));
        if absent(e) {
            ev.check(got.is_none(), format!("{series} absent (got {got:?})"));
        } else {
            ev.check(got == Some(e.value), format!("{series} = {} (got {got:?})", e.value));
        }
    }
    expected.len()
}

/// Waits until the exporter accepts connections.
pub(super) fn wait_for_exporter(vm: &mut Vm) -> Result<()> {
    let out = vm.run(
        "for i in $(seq 100); do curl -fs -o /dev/null http://127.0.0.1:10054/ && exit 0; \
         sleep 0.1; done; systemctl status --no-pager amd-hsmp-exporter.service; exit 1",
        COMMAND_TIMEOUT,
    )?;
    if !out.ok() {
        bail!("the exporter does not answer on port 10054:\n{}", out.text);
    }
    Ok(())
}

/// Scrapes /metrics in the guest with `X-Prometheus-Scrape-Timeout-Seconds: timeout`.
pub(super) fn scrape(vm: &mut Vm, timeout: f64) -> Result<Scrape> {
    // Past the broker's freshness bound since the last scrape, so that this one reads the
    // mailbox (what a check changed shows, and its messages are counted), as Prometheus' scrapes,
    // seconds apart, do. curl's own time is what is measured.
    let past_the_bound = DEFAULT_MAX_AGE.as_secs_f64() + 0.1;
    let out: Output = vm.run(
        &format!(
            "sleep {past_the_bound}; curl -sS -m 30 -H 'X-Prometheus-Scrape-Timeout-Seconds: {timeout}' \
             -w '\\n#time %{{time_total}}\\n' {METRICS_URL}"
        ),
        COMMAND_TIMEOUT,
    )?;
    if !out.ok() {
        bail!("scrape failed (curl exit {}): {}", out.rc, out.text);
    }
    let seconds = out
        .text
        .lines()
        .find_map(|l| l.strip_prefix("#time "))
        .and_then(|t| t.trim().parse().ok())
        .context("curl printed no time")?;
    let samples = parse_metrics(&out.text)?;
    Ok(Scrape { text: out.text, samples, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_with_their_labels() {
        let text = "# HELP x y\namd_hsmp_up 1\n\
                    amd_hsmp_core_boost_limit_hertz{core=\"0\",socket=\"1\"} 3300000000.0\n# EOF\n";
        let s = parse_metrics(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].labels.get("socket").map(String::as_str), Some("1"));
        assert_eq!(s[1].value, 3.3e9);
    }
}
