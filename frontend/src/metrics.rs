//! The metric families: a prometheus-client [`Collector`] that emits one scrape's report as
//! const metrics, encoded as OpenMetrics 1.0 or the classic text format 0.0.4.
//!
//! Names, types, labels and HELP texts are a public contract, listed in `docs/metrics.md`.

use crate::owner::Owner;
use crate::scrape::ScrapeReport;
use crate::translate::CoreLabel;
use amd_hsmp_proto::{Family, LimitReason};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabel as _, EncodeLabelSet,
    EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Package version, exported in `amd_hsmp_build_info`.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Git revision at build time, or `unknown`.
pub(crate) const REVISION: &str = amd_hsmp_cli::version::REVISION;
/// Version of the compiler that built this binary, e.g. `1.88.0`.
pub(crate) const RUSTVERSION: &str = amd_hsmp_cli::version::RUSTVERSION;

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4.
    Text,
}

impl Format {
    /// The `Content-Type` of the format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The length of the last exposition written, so that the next is written into a buffer of
/// about its size from the start (a Turin 2P's is about 54 KB): no growing, no copying.
static LAST_LENGTH: AtomicUsize = AtomicUsize::new(0);

/// Room for what a scrape may add to the last one's length (another format, longer values).
const LENGTH_SLACK: usize = 4 * 1024;

/// Encodes a scrape report in `format`.
pub(crate) fn render(report: Arc<ScrapeReport>, format: Format) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ReportCollector(report)));
    let last = LAST_LENGTH.load(Ordering::Relaxed);
    let mut out = String::with_capacity(last + last / 16 + LENGTH_SLACK);
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?,
    }
    LAST_LENGTH.store(out.len(), Ordering::Relaxed);
    Ok(out)
}

#[derive(Debug)]
struct ReportCollector(Arc<ScrapeReport>);

/// A series without labels.
type NoLabels = [(&'static str, &'static str); 0];

/// The labels of a per-core series, written as the integers they are: a series' labels are
/// written straight into the exposition, never built as strings first.
fn core_labels(c: &CoreLabel) -> [(&'static str, u32); 2] {
    [("core", c.core), ("socket", c.socket)]
}

/// The labels of `amd_hsmp_core_owner_info`, in the order they are written: the core, the owner's
/// path, the socket, then the owner's identity labels (`Identity`) by name.
struct OwnerLabels<'a> {
    core: &'a CoreLabel,
    owner: &'a Owner,
}

impl EncodeLabelSet for OwnerLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("core", self.core.core).encode(encoder.encode_label())?;
        ("owner", self.owner.path.as_str()).encode(encoder.encode_label())?;
        ("socket", self.core.socket).encode(encoder.encode_label())?;
        for label in self.owner.identity.labels() {
            label.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// The labels of `amd_hsmp_workload_core_energy_joules_total`: the owner's path, then its
/// identity labels by name.
struct WorkloadLabels<'a> {
    owner: &'a Owner,
}

impl EncodeLabelSet for WorkloadLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("owner", self.owner.path.as_str()).encode(encoder.encode_label())?;
        for label in self.owner.identity.labels() {
            label.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// Writes one family; a family without series is not written at all.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut series = series.into_iter().peekable();
    let Some((_, first)) = series.peek() else {
        return Ok(());
    };
    let metric_type = first.metric_type();
    let mut metric = encoder.encode_descriptor(name, help, unit, metric_type)?;
    for (labels, value) in series {
        // An empty label set writes no braces.
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge<L, N: EncodeGaugeValue>(labels: L, value: N) -> (L, ConstGauge<N>) {
    (labels, ConstGauge::new(value))
}

fn counter<L, N: EncodeCounterValue>(labels: L, value: N) -> (L, ConstCounter<N>) {
    (labels, ConstCounter::new(value))
}

fn one<N: EncodeGaugeValue>(value: N) -> Option<(NoLabels, ConstGauge<N>)> {
    Some(gauge([], value))
}

impl Collector for ReportCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let report = &*self.0;
        let telemetry = report.telemetry.as_deref();
        let hertz = Unit::Other("hertz".into());

        family(
            &mut e,
            "amd_hsmp_build_info",
            "Build information of amd-hsmp-exporter, constant 1",
            None,
            [gauge(
                [("version", VERSION), ("revision", REVISION), ("rustversion", RUSTVERSION)],
                1i64,
            )],
        )?;
        family(
            &mut e,
            "amd_hsmp_broker_up",
            "1 if amd-hsmp-broker answered this scrape, or was reachable and merely ran out of time",
            None,
            one(i64::from(report.broker_up)),
        )?;
        family(
            &mut e,
            "amd_hsmp_simulated_info",
            "Present, with value 1, only when amd-hsmp-broker serves its built-in simulator instead of the machine's devices",
            None,
            telemetry
                .and_then(|t| t.simulated.as_deref())
                .map(|profile| gauge([("profile", profile)], 1i64)),
        )?;
        let protocol = telemetry.and_then(|t| t.hsmp_protocol_version);
        family(
            &mut e,
            "amd_hsmp_up",
            "1 if /dev/hsmp opened and answered GET_PROTO_VER",
            None,
            one(i64::from(protocol.is_some())),
        )?;
        family(
            &mut e,
            "amd_hsmp_protocol_version",
            "HSMP protocol version reported by the firmware",
            None,
            protocol.and_then(|v| one(i64::from(v))),
        )?;

        if let Some(t) = telemetry {
            // Each broker family's metric families, in Family::ALL order: a new family does not
            // compile until it is exported.
            for which in Family::ALL {
                match which {
                    Family::CoreEnergy => {
                        family(
                            &mut e,
                            "amd_hsmp_core_energy",
                            "Energy consumed by the physical core, in joules",
                            Some(&Unit::Joules),
                            t.energy_joules.iter().map(|(c, j)| counter(core_labels(c), *j)),
                        )?;
                        family(
                            &mut e,
                            "amd_hsmp_core_energy_source_info",
                            "Where core energy is read from (hsmp, perf or msr), constant 1; present only when energy is exported",
                            None,
                            t.energy_source.map(|s| gauge([("source", s.to_string())], 1i64)),
                        )?;
                    }
                    Family::BoostLimit => {
                        family(
                            &mut e,
                            "amd_hsmp_core_boost_limit",
                            "Current boost (maximum frequency) limit of the physical core, in hertz",
                            Some(&hertz),
                            t.boost_limit_hertz.iter().map(|(c, hz)| gauge(core_labels(c), *hz)),
                        )?;
                    }
                    Family::Prochot => {
                        family(
                            &mut e,
                            "amd_hsmp_prochot_active",
                            "1 while PROCHOT is asserted on the socket",
                            None,
                            t.prochot.iter().map(|(s, on)| gauge([("socket", *s)], i64::from(*on))),
                        )?;
                    }
                    Family::FrequencyLimit => {
                        family(
                            &mut e,
                            "amd_hsmp_socket_frequency_limit",
                            "Current frequency limit of the socket, in hertz",
                            Some(&hertz),
                            t.frequency_limit.iter().map(|(s, limit)| {
                                gauge(vec![("socket", s.to_string())], limit.hertz())
                            }),
                        )?;
                        family(
                            &mut e,
                            "amd_hsmp_socket_frequency_limit_reason",
                            "1 while the limiter named by reason imposes the socket's frequency limit, 0 otherwise",
                            None,
                            t.frequency_limit.iter().flat_map(|(s, limit)| {
                                LimitReason::ALL.into_iter().map(move |reason| {
                                    let labels = vec![
                                        ("reason", reason.name().to_owned()),
                                        ("socket", s.to_string()),
                                    ];
                                    gauge(labels, i64::from(limit.is_limited_by(reason)))
                                })
                            }),
                        )?;
                    }
                    Family::CoreFrequencyLimit => {
                        family(
                            &mut e,
                            "amd_hsmp_core_frequency_limit",
                            "Current CCLK frequency limit of the physical core, in hertz",
                            Some(&hertz),
                            t.core_frequency_limit_hertz
                                .iter()
                                .map(|(c, hz)| gauge(core_labels(c), *hz)),
                        )?;
                    }
                    Family::PackageEnergy => {
                        family(
                            &mut e,
                            "amd_hsmp_package_energy",
                            "Energy consumed by the socket's package (its cores, the uncore, memory controllers and I/O die), in joules",
                            Some(&Unit::Joules),
                            t.package_energy_joules
                                .iter()
                                .map(|(s, j)| counter([("socket", *s)], *j)),
                        )?;
                    }
                }
            }
        }

        family(
            &mut e,
            "amd_hsmp_core_owner_info",
            "The workload a physical core is assigned to by cpuset (owner: its cgroup path; hpc_job, slurm_sluid, step, pod_uid, container_id, vm, unit: who it is, where its manager's layout says so), constant 1; absent for a core no single workload holds",
            None,
            report.core_owners.iter().map(|(core, owner)| gauge(OwnerLabels { core, owner }, 1i64)),
        )?;
        family(
            &mut e,
            "amd_hsmp_core_owner_skipped_cgroups",
            "Cgroups the core-owner collector skipped with their subtrees because it may not read them; the cores they may hold are unassigned",
            None,
            report.core_owner_skipped.and_then(|n| one(i64::try_from(n).unwrap_or(i64::MAX))),
        )?;
        family(
            &mut e,
            "amd_hsmp_core_owner_unresolved_slurm_jobs",
            "Slurm jobs owning cores whose cgroup is named by the job's SLUID (Slurm 26.05) and whose numeric id could not be read from their slurmstepd's title: their owner series carry slurm_sluid and no hpc_job",
            None,
            report.core_owner_unresolved.and_then(|n| one(i64::try_from(n).unwrap_or(i64::MAX))),
        )?;
        if let Some(w) = &report.workloads {
            family(
                &mut e,
                "amd_hsmp_workload_core_energy",
                "Energy of the physical cores the workload held at both ends of each sample interval, since the exporter started, in joules (owner and identity labels as amd_hsmp_core_owner_info); kept for --collector.core-owner.linger after the workload last held a core",
                Some(&Unit::Joules),
                w.workloads.iter().map(|w| counter(WorkloadLabels { owner: &w.owner }, w.joules)),
            )?;
            family(
                &mut e,
                "amd_hsmp_workload_unattributed",
                "Core energy given to no workload since the exporter started, in joules, by reason: changed-hands (the core's owner differed at the two ends of a sample interval), unowned (no workload held it at either end), owner-unknown (the cgroup hierarchy was not read at one end), reset (the core's counter restarted: the energy counted since)",
                Some(&Unit::Joules),
                w.unattributed.iter().map(|(reason, j)| counter([("reason", reason.name())], *j)),
            )?;
        }
        family(
            &mut e,
            "amd_hsmp_scrape_errors",
            "Failed reads since the exporter started, by collector",
            None,
            report.errors.iter().map(|(source, n)| counter([("collector", source.label())], *n)),
        )?;
        family(
            &mut e,
            "amd_hsmp_web_refused",
            "TLS handshakes and HTTP requests the web configuration refused since the exporter started, by reason",
            None,
            report.web_refused.iter().map(|(reason, n)| counter([("reason", *reason)], *n)),
        )?;
        family(
            &mut e,
            "amd_hsmp_scrape_duration",
            "Duration of this scrape's collection, in seconds",
            Some(&Unit::Seconds),
            one(report.duration.as_secs_f64()),
        )?;

        let p = &report.process;
        family(
            &mut e,
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Some(&Unit::Seconds),
            p.cpu_seconds.map(|v| counter(NoLabels::default(), v)),
        )?;
        family(
            &mut e,
            "process_resident_memory",
            "Resident memory size in bytes",
            Some(&Unit::Bytes),
            p.resident_memory_bytes.and_then(one),
        )?;
        family(
            &mut e,
            "process_virtual_memory",
            "Virtual memory size in bytes",
            Some(&Unit::Bytes),
            p.virtual_memory_bytes.and_then(one),
        )?;
        family(
            &mut e,
            "process_open_fds",
            "Number of open file descriptors",
            None,
            p.open_fds.and_then(one),
        )?;
        family(
            &mut e,
            "process_max_fds",
            "Maximum number of open file descriptors",
            None,
            p.max_fds.and_then(one),
        )?;
        family(
            &mut e,
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Some(&Unit::Seconds),
            p.start_time_seconds.and_then(one),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcessStats;
    use crate::translate::{ErrorSource, Telemetry};
    use std::time::Duration;

    fn report(telemetry: Option<Telemetry>) -> Arc<ScrapeReport> {
        Arc::new(ScrapeReport {
            broker_up: telemetry.is_some(),
            telemetry: telemetry.map(Arc::new),
            errors: ErrorSource::all().map(|s| (s, 0)).collect(),
            core_owners: Vec::new(),
            core_owner_skipped: None,
            core_owner_unresolved: None,
            workloads: None,
            duration: Duration::from_millis(12),
            process: ProcessStats::default(),
            web_refused: Vec::new(),
        })
    }

    /// [`Telemetry::example`] (PROCHOT asserted on socket 1) with one core and the simulator.
    fn healthy() -> Telemetry {
        Telemetry {
            simulated: Some("turin-2p".into()),
            energy_joules: vec![(CoreLabel { socket: 1, core: 3 }, 12.5)],
            boost_limit_hertz: vec![(CoreLabel { socket: 1, core: 3 }, 3.7e9)],
            ..Telemetry::example()
        }
    }

    #[test]
    fn counters_end_in_total_in_both_formats() {
        for format in [Format::Text, Format::OpenMetrics] {
            let text = render(report(Some(healthy())), format).unwrap();
            assert!(
                text.contains("amd_hsmp_core_energy_joules_total{core=\"3\",socket=\"1\"} 12.5\n"),
                "{format:?}:\n{text}"
            );
            assert!(text.contains("amd_hsmp_scrape_errors_total{collector=\"core-energy\"} 0\n"));
        }
    }

    #[test]
    fn text_format_declares_counter_types_on_the_total_name() {
        let text = render(report(Some(healthy())), Format::Text).unwrap();
        assert!(text.contains("# TYPE amd_hsmp_core_energy_joules_total counter\n"), "{text}");
        assert!(!text.contains("# EOF"));
        let om = render(report(Some(healthy())), Format::OpenMetrics).unwrap();
        assert!(om.contains("# TYPE amd_hsmp_core_energy_joules counter\n"), "{om}");
        assert!(om.ends_with("# EOF\n"));
    }

    #[test]
    fn broker_down_exports_meta_metrics_only() {
        let text = render(report(None), Format::Text).unwrap();
        assert!(text.contains("amd_hsmp_broker_up 0\n"));
        assert!(text.contains("amd_hsmp_up 0\n"));
        for absent in [
            "amd_hsmp_core_energy",
            "amd_hsmp_core_boost_limit",
            "amd_hsmp_prochot",
            "amd_hsmp_protocol_version",
            "amd_hsmp_simulated_info",
        ] {
            assert!(!text.contains(absent), "{absent} present:\n{text}");
        }
    }

    #[test]
    fn every_error_collector_is_present_from_the_first_scrape() {
        let text = render(report(None), Format::Text).unwrap();
        // Every source but the core owners', which is present only with its collector on.
        let labels: Vec<_> = crate::translate::ErrorSource::all().map(|s| s.label()).collect();
        assert!(labels.contains(&"package-energy"), "{labels:?}");
        for label in labels {
            assert!(
                text.contains(&format!(
                    "amd_hsmp_scrape_errors_total{{collector=\"{label}\"}} 0\n"
                )),
                "{label}:\n{text}"
            );
        }
    }

    #[test]
    fn core_owner_errors_and_series_appear_only_with_the_collector_on() {
        let off = render(report(Some(healthy())), Format::Text).unwrap();
        assert!(!off.contains("core-owner") && !off.contains("core_owner"), "{off}");
        let errors = crate::translate::ErrorCounters::default();
        let mut on = (*report(Some(healthy()))).clone();
        on.errors = errors.snapshot(true);
        let owner = |path: &str| Arc::new(Owner::from_raw(path.as_bytes()));
        on.core_owners = vec![
            (CoreLabel { socket: 1, core: 3 }, owner("/system.slice/slurmstepd.scope/job_4242")),
            (CoreLabel { socket: 1, core: 4 }, owner("/machine.slice/machine-qemu\\x2d1.scope")),
            (
                CoreLabel { socket: 1, core: 5 },
                owner("/machine.slice/machine-qemu\\x2d7\\x2dbuild\\x2dvm.scope"),
            ),
        ];
        for format in [Format::Text, Format::OpenMetrics] {
            let text = render(Arc::new(on.clone()), format).unwrap();
            assert!(
                text.contains("amd_hsmp_scrape_errors_total{collector=\"core-owner\"} 0\n"),
                "{text}"
            );
            assert!(
                text.contains(
                    "amd_hsmp_core_owner_info{core=\"3\",owner=\"/system.slice/slurmstepd.scope/job_4242\",socket=\"1\",hpc_job=\"4242\"} 1\n"
                ),
                "{text}"
            );
            // A backslash of a systemd escape is escaped in the exposition.
            assert!(text.contains("owner=\"/machine.slice/machine-qemu\\\\x2d1.scope\""), "{text}");
            // A libvirt guest's scope names its domain, the escapes undone.
            assert!(
                text.contains(
                    "amd_hsmp_core_owner_info{core=\"5\",owner=\"/machine.slice/machine-qemu\\\\x2d7\\\\x2dbuild\\\\x2dvm.scope\",socket=\"1\",vm=\"build-vm\"} 1\n"
                ),
                "{text}"
            );
        }
        let empty = ScrapeReport { core_owners: Vec::new(), ..on };
        let text = render(Arc::new(empty), Format::Text).unwrap();
        assert!(!text.contains("amd_hsmp_core_owner_info"), "no family without series:\n{text}");
    }

    #[test]
    fn simulated_broker_is_marked_in_the_scrape() {
        let text = render(report(Some(healthy())), Format::Text).unwrap();
        assert!(text.contains("amd_hsmp_simulated_info{profile=\"turin-2p\"} 1\n"), "{text}");
        let real = Telemetry { simulated: None, ..healthy() };
        let text = render(report(Some(real)), Format::Text).unwrap();
        assert!(!text.contains("simulated"), "{text}");
    }

    #[test]
    fn boost_limit_is_exported_in_hertz_and_prochot_per_socket() {
        let text = render(report(Some(healthy())), Format::Text).unwrap();
        assert!(
            text.contains(
                "amd_hsmp_core_boost_limit_hertz{core=\"3\",socket=\"1\"} 3700000000.0\n"
            ),
            "{text}"
        );
        assert!(text.contains("amd_hsmp_prochot_active{socket=\"0\"} 0\n"));
        assert!(text.contains("amd_hsmp_prochot_active{socket=\"1\"} 1\n"));
        assert!(text.contains("amd_hsmp_core_energy_source_info{source=\"hsmp\"} 1\n"));
    }

    fn reason_series(text: &str, socket: u32) -> Vec<(String, i64)> {
        LimitReason::ALL
            .iter()
            .map(|reason| {
                let name = format!(
                    "amd_hsmp_socket_frequency_limit_reason{{reason=\"{reason}\",socket=\"{socket}\"}} "
                );
                let line = text.lines().find(|l| l.starts_with(&name)).unwrap_or_else(|| panic!("{name}"));
                (reason.to_string(), line[name.len()..].parse().unwrap())
            })
            .collect()
    }

    fn with_limit(reasons: u16) -> String {
        let limit = amd_hsmp_proto::FrequencyLimit { mhz: 2900, reasons };
        let t = Telemetry { frequency_limit: vec![(0, limit)], ..healthy() };
        render(report(Some(t)), Format::Text).unwrap()
    }

    #[test]
    fn each_reason_bit_sets_exactly_its_series_and_the_others_are_0() {
        let names = ["chtc", "prochot", "tdc", "ppt", "opn_max", "reliability", "apml", "hsmp"];
        for (bit, name) in names.iter().enumerate() {
            let series = reason_series(&with_limit(1 << bit), 0);
            let set: Vec<&str> =
                series.iter().filter(|(_, v)| *v == 1).map(|(r, _)| r.as_str()).collect();
            assert_eq!(set, [*name], "bit {bit}");
            assert!(series.iter().all(|(_, v)| *v == 0 || *v == 1), "bit {bit}");
        }
    }

    #[test]
    fn a_reserved_reason_bit_sets_other() {
        for bit in 8..16 {
            let series = reason_series(&with_limit(1 << bit), 0);
            let set: Vec<&str> =
                series.iter().filter(|(_, v)| *v == 1).map(|(r, _)| r.as_str()).collect();
            assert_eq!(set, ["other"], "bit {bit}");
        }
    }

    #[test]
    fn the_socket_frequency_limit_is_exported_in_hertz() {
        let text = with_limit(0x10);
        assert!(
            text.contains("amd_hsmp_socket_frequency_limit_hertz{socket=\"0\"} 2900000000.0\n"),
            "{text}"
        );
        assert_eq!(reason_series(&text, 0).len(), 9, "one series per reason");
    }
}
