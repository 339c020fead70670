//! One scrape: its own deadline from the time budget, the broker request it flies on (shared
//! with concurrent scrapes only when that costs none of them data, see [`crate::flight`]), and
//! the translation of a broker sample into the series to export (absent, never a sentinel)
//! plus the cumulative error counters.

use crate::broker::{BrokerClient, BrokerError, BrokerInfo, chain};
pub use crate::budget::Budget;
use crate::flight::{Flights, Landing};
use crate::process::{self, ProcessStats};
use crate::ratelimit::RateLimit;
use amd_hsmp_proto::{
    Core, DeviceStatus, EnergySource, Families, ItemError, Readings, Sample, Topology,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A scrape joins a flight whose deadline is at most this fraction of its own budget earlier
/// than its own (and never later).
const JOIN_TOLERANCE_DIVISOR: u32 = 10;

/// A scrape whose joined flight came back partial asks again only with at least this much of
/// its own broker deadline left.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// Flights one scrape takes at most: its first, and retries after partial joined answers.
const MAX_FLIGHTS_PER_SCRAPE: usize = 3;

/// At most one "timed out" warning per this interval; the others are counted in the next.
const TIMEOUT_LOG_INTERVAL: Duration = Duration::from_secs(10);

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

/// Error counts since the process started, one field per [`ErrorSource`].
#[derive(Debug, Default)]
pub struct ErrorCounters {
    hsmp: AtomicU64,
    core_energy: AtomicU64,
    boost_limit: AtomicU64,
    prochot: AtomicU64,
    scrape: AtomicU64,
    broker: AtomicU64,
    /// The broker instance last answered and its cumulative `Sample::energy_resets` then.
    energy_resets_seen: std::sync::Mutex<Option<(u64, u64)>>,
}

impl ErrorCounters {
    fn counter(&self, source: ErrorSource) -> &AtomicU64 {
        match source {
            ErrorSource::Hsmp => &self.hsmp,
            ErrorSource::CoreEnergy => &self.core_energy,
            ErrorSource::BoostLimit => &self.boost_limit,
            ErrorSource::Prochot => &self.prochot,
            ErrorSource::Scrape => &self.scrape,
            ErrorSource::Broker => &self.broker,
        }
    }

    fn add(&self, source: ErrorSource, n: u64) {
        if n > 0 {
            self.counter(source).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds the energy counter resets broker `instance` reports (`total` since it started) that
    /// were not counted yet: the increase over its last report, or all of them for an instance
    /// not seen before (a restarted broker counts from 0 again).
    fn add_energy_resets(&self, instance: u64, total: u64) {
        let mut seen = self.energy_resets_seen.lock().unwrap_or_else(|p| p.into_inner());
        let new = match *seen {
            Some((last_instance, last)) if last_instance == instance => total.saturating_sub(last),
            _ => total,
        };
        self.add(ErrorSource::CoreEnergy, new);
        // An older reply that arrives late never lowers the mark.
        let last = seen.filter(|&(i, _)| i == instance).map_or(0, |(_, last)| last);
        *seen = Some((instance, total.max(last)));
    }

    /// The count of one source.
    pub fn get(&self, source: ErrorSource) -> u64 {
        self.counter(source).load(Ordering::Relaxed)
    }

    /// The current counts, in the order of [`ErrorSource::ALL`].
    pub fn snapshot(&self) -> [(ErrorSource, u64); 6] {
        ErrorSource::ALL.map(|s| (s, self.get(s)))
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
    /// Most scrapes handled at once (`--web.max-requests`); 0 means no limit.
    pub max_requests: usize,
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
    /// The broker answered (possibly with items its deadline left unread).
    Answered(Arc<Telemetry>),
    /// The broker could not be reached or answered something unusable (counted by the flight).
    BrokerFailed,
    /// No answer in time: no connection was free before the deadline, or the reply had not
    /// come when the scrape had to answer. Not a sign that the broker is down.
    TimedOut,
}

/// Everything one HTTP scrape exports.
#[derive(Debug, Clone)]
pub struct ScrapeReport {
    /// The broker's telemetry; `None` when the broker did not answer in time.
    pub telemetry: Option<Arc<Telemetry>>,
    /// `amd_hsmp_broker_up`: the broker answered, or the scrape merely ran out of time while
    /// the broker was reachable.
    pub broker_up: bool,
    /// Error counts, including this scrape's.
    pub errors: [(ErrorSource, u64); 6],
    /// Time this scrape spent collecting.
    pub duration: Duration,
    /// This process' own metrics.
    pub process: ProcessStats,
}

/// A running scrape's place within `--web.max-requests`.
#[derive(Debug)]
pub struct ScrapePermit {
    _held: Option<OwnedSemaphorePermit>,
}

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct Exporter {
    config: Config,
    broker: BrokerClient,
    errors: ErrorCounters,
    flights: Arc<Flights<Outcome>>,
    broker_reachable: AtomicBool,
    timeout_log: RateLimit,
    /// One permit per scrape that may run at once; `None` without a limit.
    scrape_permits: Option<Arc<Semaphore>>,
    refusal_log: RateLimit,
    /// The last broker answers, for the landing page's power.
    recent: crate::landing::RecentSamples,
}

impl Exporter {
    /// An exporter with nothing connected yet.
    pub fn new(config: Config) -> Arc<Self> {
        Arc::new(Exporter {
            broker: BrokerClient::new(config.broker_socket.clone()),
            errors: ErrorCounters::default(),
            flights: Arc::default(),
            // Assume reachable so that the first failure is logged as a warning.
            broker_reachable: AtomicBool::new(true),
            timeout_log: RateLimit::new(TIMEOUT_LOG_INTERVAL),
            scrape_permits: (config.max_requests > 0)
                .then(|| Arc::new(Semaphore::new(config.max_requests))),
            refusal_log: RateLimit::new(TIMEOUT_LOG_INTERVAL),
            recent: crate::landing::RecentSamples::default(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A place for one more scrape within `--web.max-requests`, held until dropped; `None` when
    /// that many scrapes are running (logged at a bounded rate).
    pub fn admit_scrape(&self) -> Option<ScrapePermit> {
        let Some(permits) = &self.scrape_permits else { return Some(ScrapePermit { _held: None }) };
        match Arc::clone(permits).try_acquire_owned() {
            Ok(permit) => Some(ScrapePermit { _held: Some(permit) }),
            Err(_) => {
                if let Some(suppressed) = self.refusal_log.check() {
                    tracing::warn!(
                        max_requests = self.config.max_requests,
                        suppressed,
                        "scrape refused with 503: --web.max-requests scrapes are running"
                    );
                }
                None
            }
        }
    }

    /// The last broker answers (of scrapes and page views alike).
    pub fn recent_samples(&self) -> &crate::landing::RecentSamples {
        &self.recent
    }

    /// Broker requests in flight now (including those waiting for a connection).
    pub fn flying(&self) -> usize {
        self.flights.flying()
    }

    /// How many scrapes joined a broker request another scrape had started, since the start.
    pub fn joins(&self) -> u64 {
        self.flights.joins()
    }

    /// Collects one scrape within `budget`, never failing: what could not be read is absent
    /// and counted. The scrape keeps its own deadline: it joins a broker request in flight
    /// only if that request's deadline is within a tenth of its budget before its own and not
    /// after it, and else sends its own.
    pub async fn scrape(self: &Arc<Self>, budget: Budget) -> ScrapeReport {
        let started = Instant::now();
        let deadline = started + budget.broker_deadline;
        let answer_by = started + budget.wait;
        let tolerance = budget.broker_deadline / JOIN_TOLERANCE_DIVISOR;
        let (telemetry, broker_up) = match self.collect(deadline, answer_by, tolerance).await {
            Outcome::Answered(t) => {
                if t.deadline_exceeded {
                    self.errors.add(ErrorSource::Scrape, 1);
                }
                (Some(t), true)
            }
            Outcome::TimedOut => {
                if let Some(suppressed) = self.timeout_log.check() {
                    tracing::warn!(
                        timeout_ms = budget.wait.as_millis() as u64,
                        suppressed,
                        "scrape timed out waiting for the broker; telemetry left out"
                    );
                }
                self.errors.add(ErrorSource::Scrape, 1);
                (None, self.broker_reachable.load(Ordering::Relaxed))
            }
            Outcome::BrokerFailed => (None, false),
        };
        ScrapeReport {
            telemetry,
            broker_up,
            errors: self.errors.snapshot(),
            duration: started.elapsed(),
            process: process::read_own(&self.config.procfs),
        }
    }

    /// The answer for a scrape with broker deadline `deadline` that must answer by
    /// `answer_by`. A joined flight that comes back partial (its shorter deadline left items
    /// unread) is followed by another flight with the time left, if there is enough.
    async fn collect(
        self: &Arc<Self>,
        deadline: Instant,
        answer_by: Instant,
        tolerance: Duration,
    ) -> Outcome {
        let mut partial = None;
        for _ in 0..MAX_FLIGHTS_PER_SCRAPE {
            let this = Arc::clone(self);
            let ticket = self.flights.join_or_start(deadline, tolerance, move || async move {
                this.fly(deadline).await
            });
            let joined = ticket.joined;
            let outcome = match ticket.land_by(answer_by).await {
                Landing::Landed(outcome) => outcome,
                Landing::Late => Outcome::TimedOut,
                // The flight task died; nothing was counted for it.
                Landing::Lost => Outcome::BrokerFailed,
            };
            match outcome {
                Outcome::Answered(t)
                    if t.deadline_exceeded
                        && joined
                        && deadline.saturating_duration_since(Instant::now()) >= MIN_RETRY =>
                {
                    partial = Some(t);
                }
                Outcome::Answered(t) => return Outcome::Answered(t),
                other => return partial.map_or(other, Outcome::Answered),
            }
        }
        partial.map_or(Outcome::TimedOut, Outcome::Answered)
    }

    /// One broker request with `deadline`; runs in its own task, to the end, whether or not
    /// the scrapes on it still wait.
    async fn fly(&self, deadline: Instant) -> Outcome {
        match self.broker.sample(self.config.families, deadline).await {
            Ok(snapshot) => {
                if !self.broker_reachable.swap(true, Ordering::Relaxed) {
                    tracing::info!(socket = %self.broker.path().display(), "broker reachable again");
                }
                let telemetry =
                    translate(&snapshot.info, &snapshot.topology, &snapshot.sample, &self.errors);
                let telemetry = Arc::new(telemetry);
                self.recent.record(&telemetry);
                Outcome::Answered(telemetry)
            }
            // Every connection was busy with other flights until the deadline.
            Err(BrokerError::Busy) => Outcome::TimedOut,
            Err(e) => {
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
        }
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
    errors.add_energy_resets(info.instance, sample.energy_resets);

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
        errors.get(source)
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
    fn energy_counter_resets_count_as_core_energy_errors_once_per_broker_instance() {
        let errors = ErrorCounters::default();
        let at = |instance, energy_resets| {
            let info = BrokerInfo { instance, ..info() };
            let s = Sample { energy_resets, energy: Readings::NotRequested, ..sample() };
            translate(&info, &topology(), &s, &errors);
            count(&errors, ErrorSource::CoreEnergy)
        };
        assert_eq!(at(7, 0), 0);
        assert_eq!(at(7, 3), 3, "three resets since the broker started");
        assert_eq!(at(7, 3), 3, "the same three, not counted again");
        assert_eq!(at(7, 5), 5);
        assert_eq!(at(7, 4), 5, "a late older reply adds nothing");
        assert_eq!(at(7, 6), 6);
        assert_eq!(at(8, 2), 8, "a restarted broker's resets all count");
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
}
