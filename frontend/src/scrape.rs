//! One scrape: the time budget from Prometheus' timeout header, the single-flight broker
//! request shared by concurrent scrapes, and the translation of a broker sample into the
//! series to export (absent, never a sentinel) plus the cumulative error counters.

use crate::broker::{BrokerClient, BrokerInfo, chain};
use crate::process::{self, ProcessStats};
use amd_hsmp_proto::{
    Core, DeviceStatus, EnergySource, Families, ItemError, Readings, Sample, Topology,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Largest margin kept between Prometheus' timeout and the deadline given to the broker.
const MAX_MARGIN: Duration = Duration::from_millis(250);

/// The `collector` label values of `amd_hsmp_scrape_errors_total`, all present from the first
/// scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// `/dev/hsmp` exists but cannot be used: opening it was refused
    /// (`DeviceStatus::PermissionDenied`, a misconfiguration) or it did not answer
    /// (`DeviceStatus::Failed`). A device that is absent is no error: the machine may simply
    /// not have one.
    Hsmp,
    /// One core's energy read failed.
    CoreEnergy,
    /// One core's boost-limit read failed.
    BoostLimit,
    /// One socket's PROCHOT read failed.
    Prochot,
    /// The scrape ran out of time (frontend timeout, or items the broker left unread).
    Scrape,
    /// The broker could not be reached or answered something unusable.
    Broker,
}

impl ErrorSource {
    /// Every value, in exposition order.
    pub const ALL: [ErrorSource; 6] = [
        ErrorSource::Hsmp,
        ErrorSource::CoreEnergy,
        ErrorSource::BoostLimit,
        ErrorSource::Prochot,
        ErrorSource::Scrape,
        ErrorSource::Broker,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorSource::Hsmp => "hsmp",
            ErrorSource::CoreEnergy => "core-energy",
            ErrorSource::BoostLimit => "boost-limit",
            ErrorSource::Prochot => "prochot",
            ErrorSource::Scrape => "scrape",
            ErrorSource::Broker => "broker",
        }
    }
}

/// Error counts since the process started.
#[derive(Debug, Default)]
pub struct ErrorCounters([AtomicU64; 6]);

impl ErrorCounters {
    fn add(&self, source: ErrorSource, n: u64) {
        if n > 0 {
            self.0[source as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The current counts, in the order of [`ErrorSource::ALL`].
    pub fn snapshot(&self) -> [(ErrorSource, u64); 6] {
        ErrorSource::ALL.map(|s| (s, self.0[s as usize].load(Ordering::Relaxed)))
    }
}

/// How long one scrape may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Given to the broker as `deadline_ms`: past it, it reads nothing more.
    pub broker_deadline: Duration,
    /// How long the frontend waits for the broker's reply before giving up on it.
    pub wait: Duration,
}

impl Budget {
    /// The budget for a scrape whose `X-Prometheus-Scrape-Timeout-Seconds` header says
    /// `header` (absent or unusable: `max`). The timeout is capped at `max`; the broker gets
    /// it minus a margin of 10 % (at most 250 ms), and the frontend waits until half of that
    /// margin is left, keeping the rest for encoding and sending the answer.
    pub fn new(header: Option<&str>, max: Duration) -> Budget {
        let requested = header
            .and_then(|h| h.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(max);
        let total = requested.min(max);
        let margin = (total / 10).min(MAX_MARGIN);
        Budget { broker_deadline: total - margin, wait: total - margin / 2 }
    }

    /// The broker deadline in whole milliseconds, at least 1.
    pub fn deadline_ms(&self) -> u32 {
        u32::try_from(self.broker_deadline.as_millis()).unwrap_or(u32::MAX).max(1)
    }
}

/// Static configuration of the scrape path.
#[derive(Debug, Clone)]
pub struct Config {
    /// The broker's socket.
    pub broker_socket: PathBuf,
    /// Families the enabled collectors ask for.
    pub families: Families,
    /// Cap on the scrape timeout.
    pub max_scrape_timeout: Duration,
    /// Path the metrics are served under.
    pub telemetry_path: String,
    /// procfs root for the `process_*` metrics.
    pub procfs: PathBuf,
}

/// One core's series labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreLabel {
    /// `physical_package_id`.
    pub socket: u32,
    /// sysfs `core_id`.
    pub core: u32,
}

impl From<&Core> for CoreLabel {
    fn from(c: &Core) -> Self {
        CoreLabel { socket: c.socket, core: c.core }
    }
}

/// What a broker answer turns into: only the values that exist.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Telemetry {
    /// `Some(profile)` when the broker serves its simulator.
    pub simulated: Option<String>,
    /// HSMP protocol version when the device is ready; `None` means `amd_hsmp_up 0`.
    pub hsmp_protocol_version: Option<u32>,
    /// Energy source, set when at least one energy series exists.
    pub energy_source: Option<EnergySource>,
    /// Per-core energy in joules.
    pub energy_joules: Vec<(CoreLabel, f64)>,
    /// Per-core boost limit in hertz.
    pub boost_limit_hertz: Vec<(CoreLabel, f64)>,
    /// Per-socket PROCHOT.
    pub prochot: Vec<(u32, bool)>,
    /// Some items were not read because the broker's deadline passed.
    pub deadline_exceeded: bool,
}

/// How one flight (one broker request) ended.
#[derive(Debug, Clone)]
enum Outcome {
    Answered(Arc<Telemetry>),
    BrokerFailed,
    TimedOut,
}

/// Everything one HTTP scrape exports.
#[derive(Debug, Clone)]
pub struct ScrapeReport {
    /// The broker's telemetry; `None` when the broker did not answer in time.
    pub telemetry: Option<Arc<Telemetry>>,
    /// Error counts, including this scrape's.
    pub errors: [(ErrorSource, u64); 6],
    /// Time this scrape spent collecting.
    pub duration: Duration,
    /// This process' own metrics.
    pub process: ProcessStats,
}

type Flight = watch::Receiver<Option<Outcome>>;

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct Exporter {
    config: Config,
    broker: BrokerClient,
    errors: ErrorCounters,
    in_flight: Mutex<Option<Flight>>,
    broker_reachable: AtomicBool,
}

impl Exporter {
    /// An exporter with nothing connected yet.
    pub fn new(config: Config) -> Arc<Self> {
        Arc::new(Exporter {
            broker: BrokerClient::new(config.broker_socket.clone()),
            config,
            errors: ErrorCounters::default(),
            in_flight: Mutex::new(None),
            // Assume reachable so that the first failure is logged as a warning.
            broker_reachable: AtomicBool::new(true),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Collects one scrape. Joins the broker request already in flight, if any, else starts
    /// one; waits for it at most `budget.wait`. Never fails: what could not be read is absent
    /// and counted.
    pub async fn scrape(self: &Arc<Self>, budget: Budget) -> ScrapeReport {
        let started = Instant::now();
        let (mut flight, own) = self.join_or_start(budget);
        let landed = flight.wait_for(Option::is_some);
        // The flight this scrape started is bounded by this scrape's budget already, and
        // waiting for it (rather than racing its timeout) means the slot is free again when
        // this scrape answers. A joined flight may outlast this scrape's budget: bound it.
        let outcome = if own {
            Ok(landed.await.map(|v| v.clone()))
        } else {
            tokio::time::timeout(budget.wait, landed).await.map(|r| r.map(|v| v.clone()))
        };
        let telemetry = match outcome {
            Ok(Ok(Some(Outcome::Answered(t)))) => {
                if t.deadline_exceeded {
                    self.errors.add(ErrorSource::Scrape, 1);
                }
                Some(t)
            }
            Ok(Ok(Some(Outcome::TimedOut))) | Err(_) => {
                tracing::warn!(
                    timeout_ms = budget.wait.as_millis() as u64,
                    "scrape timed out waiting for the broker; telemetry left out"
                );
                self.errors.add(ErrorSource::Scrape, 1);
                None
            }
            // Broker failure (counted by the flight), or the flight task died.
            Ok(Ok(_)) | Ok(Err(_)) => None,
        };
        ScrapeReport {
            telemetry,
            errors: self.errors.snapshot(),
            duration: started.elapsed(),
            process: process::read_own(&self.config.procfs),
        }
    }

    /// The flight to wait for, and whether this call started it.
    fn join_or_start(self: &Arc<Self>, budget: Budget) -> (Flight, bool) {
        let mut slot = self.in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(flight) = slot.as_ref() {
            return (flight.clone(), false);
        }
        let (tx, rx) = watch::channel(None);
        *slot = Some(rx.clone());
        drop(slot);
        // Spawned, so that a scraper that hangs up does not cancel the request the others
        // wait for.
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let guard = FlightGuard(&this);
            let outcome = this.fly(budget).await;
            drop(guard);
            tx.send_replace(Some(outcome));
        });
        (rx, true)
    }

    async fn fly(&self, budget: Budget) -> Outcome {
        let request = self.broker.sample(self.config.families, budget.deadline_ms());
        match tokio::time::timeout(budget.wait, request).await {
            Err(_) => Outcome::TimedOut,
            Ok(Err(e)) => {
                self.errors.add(ErrorSource::Broker, 1);
                if self.broker_reachable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        socket = %self.broker.path().display(),
                        error = %chain(&e),
                        "broker unreachable; exporting amd_hsmp_broker_up 0 and retrying on every scrape"
                    );
                } else {
                    tracing::debug!(error = %chain(&e), "broker still unreachable");
                }
                Outcome::BrokerFailed
            }
            Ok(Ok(snapshot)) => {
                if !self.broker_reachable.swap(true, Ordering::Relaxed) {
                    tracing::info!(socket = %self.broker.path().display(), "broker reachable again");
                }
                let telemetry =
                    translate(&snapshot.info, &snapshot.topology, &snapshot.sample, &self.errors);
                Outcome::Answered(Arc::new(telemetry))
            }
        }
    }
}

/// Clears the in-flight slot when the flight task ends, even by panic, so the next scrape
/// starts a new request instead of joining a dead one.
struct FlightGuard<'a>(&'a Exporter);

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        let mut slot = self.0.in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = None;
    }
}

/// Turns one sample into the series to export, counting each failed item once.
pub fn translate(
    info: &BrokerInfo,
    topology: &Topology,
    sample: &Sample,
    errors: &ErrorCounters,
) -> Telemetry {
    let mut out = Telemetry { simulated: info.simulated.clone(), ..Telemetry::default() };
    match sample.hsmp {
        DeviceStatus::Ready { protocol_version } => {
            out.hsmp_protocol_version = Some(protocol_version);
        }
        DeviceStatus::Failed(e) => {
            tracing::debug!(error = %e, "HSMP device failed");
            errors.add(ErrorSource::Hsmp, 1);
        }
        DeviceStatus::PermissionDenied => {
            tracing::debug!("HSMP device permission denied");
            errors.add(ErrorSource::Hsmp, 1);
        }
        DeviceStatus::Absent => {}
    }

    let cores: Vec<CoreLabel> = topology.cores.iter().map(CoreLabel::from).collect();
    let mut read = Collector { errors, deadline_exceeded: false };
    out.energy_joules =
        read.collect(ErrorSource::CoreEnergy, &sample.energy, &cores, |e| e.joules());
    out.energy_source = if out.energy_joules.is_empty() { None } else { sample.energy_source };
    out.boost_limit_hertz =
        read.collect(ErrorSource::BoostLimit, &sample.boost_limit, &cores, |mhz| {
            f64::from(mhz) * 1e6
        });
    out.prochot = read.collect(ErrorSource::Prochot, &sample.prochot, &topology.sockets, |a| a);
    out.deadline_exceeded = read.deadline_exceeded;
    out
}

/// Collects the families of one sample, counting their failed items.
struct Collector<'a> {
    errors: &'a ErrorCounters,
    /// Some item was left unread by the broker's deadline.
    deadline_exceeded: bool,
}

impl Collector<'_> {
    /// The values of one family that were read, paired with their labels. A failed item is left
    /// out and counted under `source`; an item the deadline left unread is left out and flags
    /// the deadline. A reading not aligned with the topology is a broker fault: the whole
    /// family is left out and counted under `broker`.
    fn collect<T: Copy, L: Copy, V>(
        &mut self,
        source: ErrorSource,
        readings: &Readings<T>,
        labels: &[L],
        convert: impl Fn(T) -> V,
    ) -> Vec<(L, V)> {
        let Readings::Values(values) = readings else {
            // NotRequested or Unavailable: the family is absent, and that is not an error.
            return Vec::new();
        };
        if values.len() != labels.len() {
            tracing::warn!(
                family = source.label(),
                values = values.len(),
                items = labels.len(),
                "broker reply not aligned with its topology; family left out"
            );
            self.errors.add(ErrorSource::Broker, 1);
            return Vec::new();
        }
        let mut out = Vec::with_capacity(values.len());
        let mut failed = 0;
        for (label, value) in labels.iter().zip(values) {
            match value {
                Ok(v) => out.push((*label, convert(*v))),
                Err(ItemError::DeadlineExceeded) => self.deadline_exceeded = true,
                Err(e) => {
                    failed += 1;
                    tracing::debug!(family = source.label(), error = %e, "read failed");
                }
            }
        }
        self.errors.add(source, failed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::{Energy, Unavailable};

    fn topology() -> Topology {
        Topology {
            cpu_family: 0x1A,
            cpu_model: 0x11,
            sockets: vec![0, 1],
            cores: vec![
                Core { socket: 0, core: 0, cpu: 0, apic_id: 0 },
                Core { socket: 0, core: 8, cpu: 1, apic_id: 16 },
                Core { socket: 1, core: 0, cpu: 2, apic_id: 256 },
            ],
        }
    }

    fn info() -> BrokerInfo {
        BrokerInfo { broker_version: "0.1.0".into(), instance: 7, simulated: None }
    }

    fn sample() -> Sample {
        Sample {
            hsmp: DeviceStatus::Ready { protocol_version: 7 },
            energy_source: Some(EnergySource::Hsmp),
            energy: Readings::Values(vec![
                Ok(Energy { counter: 3 << 16, esu: 16 }),
                Err(ItemError::Io { errno: 5 }),
                Ok(Energy { counter: 1 << 15, esu: 16 }),
            ]),
            boost_limit: Readings::Values(vec![
                Ok(3700),
                Ok(3600),
                Err(ItemError::DeadlineExceeded),
            ]),
            prochot: Readings::Unavailable(Unavailable::Unsupported),
            energy_resets: 0,
        }
    }

    fn count(errors: &ErrorCounters, source: ErrorSource) -> u64 {
        errors.snapshot()[source as usize].1
    }

    #[test]
    fn failed_core_is_absent_and_counted_under_its_collector() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        assert_eq!(
            t.energy_joules,
            vec![(CoreLabel { socket: 0, core: 0 }, 3.0), (CoreLabel { socket: 1, core: 0 }, 0.5)]
        );
        assert_eq!(count(&errors, ErrorSource::CoreEnergy), 1);
        assert_eq!(t.energy_source, Some(EnergySource::Hsmp));
        assert_eq!(t.hsmp_protocol_version, Some(7));
    }

    #[test]
    fn deadline_exceeded_item_is_absent_and_flags_the_scrape_not_the_collector() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        assert_eq!(
            t.boost_limit_hertz,
            vec![
                (CoreLabel { socket: 0, core: 0 }, 3.7e9),
                (CoreLabel { socket: 0, core: 8 }, 3.6e9)
            ]
        );
        assert!(t.deadline_exceeded);
        assert_eq!(count(&errors, ErrorSource::BoostLimit), 0);
    }

    #[test]
    fn unsupported_family_is_absent_without_error() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        assert!(t.prochot.is_empty());
        assert_eq!(count(&errors, ErrorSource::Prochot), 0);
    }

    #[test]
    fn failed_device_counts_hsmp_and_reports_down() {
        let errors = ErrorCounters::default();
        let mut s = sample();
        s.hsmp = DeviceStatus::Failed(ItemError::TimedOut);
        let t = translate(&info(), &topology(), &s, &errors);
        assert_eq!(t.hsmp_protocol_version, None);
        assert_eq!(count(&errors, ErrorSource::Hsmp), 1);
        let absent = Sample { hsmp: DeviceStatus::Absent, ..sample() };
        translate(&info(), &topology(), &absent, &errors);
        assert_eq!(count(&errors, ErrorSource::Hsmp), 1);
        let denied = Sample { hsmp: DeviceStatus::PermissionDenied, ..sample() };
        translate(&info(), &topology(), &denied, &errors);
        assert_eq!(count(&errors, ErrorSource::Hsmp), 2);
    }

    #[test]
    fn misaligned_reply_drops_the_family_and_counts_broker() {
        let errors = ErrorCounters::default();
        let mut s = sample();
        s.prochot = Readings::Values(vec![Ok(true)]);
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.prochot.is_empty());
        assert_eq!(count(&errors, ErrorSource::Broker), 1);
    }

    #[test]
    fn energy_source_is_absent_when_no_energy_series_is() {
        let errors = ErrorCounters::default();
        let mut s = sample();
        s.energy_source = Some(EnergySource::Msr);
        s.energy = Readings::Values(vec![Err(ItemError::Busy); 3]);
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.energy_joules.is_empty());
        assert_eq!(t.energy_source, None);
    }

    #[test]
    fn budget_follows_the_prometheus_header_with_a_margin() {
        let max = Duration::from_secs(10);
        let b = Budget::new(Some("1"), max);
        assert_eq!(b.broker_deadline, Duration::from_millis(900));
        assert_eq!(b.wait, Duration::from_millis(950));
        let b = Budget::new(Some("5.5"), max);
        assert_eq!(b.broker_deadline, Duration::from_millis(5250));
        assert_eq!(b.wait, Duration::from_millis(5375));
        assert_eq!(b.deadline_ms(), 5250);
    }

    #[test]
    fn budget_is_capped_by_the_flag_and_ignores_bad_headers() {
        let max = Duration::from_secs(2);
        assert_eq!(Budget::new(Some("120"), max), Budget::new(None, max));
        assert_eq!(Budget::new(Some("-3"), max), Budget::new(None, max));
        assert_eq!(Budget::new(Some("soon"), max), Budget::new(None, max));
        assert_eq!(Budget::new(None, max).broker_deadline, Duration::from_millis(1800));
        assert_eq!(Budget::new(Some("0.0001"), max).deadline_ms(), 1);
    }
}
