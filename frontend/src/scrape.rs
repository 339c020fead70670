//! One scrape: its own deadline from the time budget, the broker request it flies on (shared
//! with concurrent scrapes only when that costs none of them data, see [`crate::flight`]), and
//! its report; the sample becomes series in [`crate::translate`].

use crate::broker::{BrokerClient, BrokerError};
use crate::budget::Budget;
use crate::flight::{Flights, Landing};
use crate::owner::{self, CauseLog, Hierarchy, OwnerError};
use crate::process::{self, ProcessStats};
use crate::translate::{CoreLabel, ErrorCounters, ErrorSource, Telemetry, translate};
use amd_hsmp_cli::chain;
use amd_hsmp_proto::{Families, Topology};
use amd_hsmp_web::ratelimit::RateLimit;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// The cgroup v2 hierarchy the core-owner collector reads (`--path.cgroupfs`); `None`
    /// while the collector is off.
    pub core_owner: Option<PathBuf>,
}

/// The broker's answer to one flight, and how fresh it is.
#[derive(Debug, Clone)]
struct Answer {
    telemetry: Arc<Telemetry>,
    /// The topology the telemetry is aligned with.
    topology: Arc<Topology>,
    /// When the flight's request was sent (the broker received it no earlier).
    sent: Instant,
    /// How long before the broker received the request its oldest value was read.
    oldest: Duration,
    /// The broker's freshness bound.
    max_age: Duration,
}

impl Answer {
    /// Whether every value was read no earlier than the broker's freshness bound before
    /// `arrived`, when a scrape reached the exporter: always for the scrape that sent the
    /// request, and for a scrape that joined it only if it came soon enough after.
    fn fresh_for(&self, arrived: Instant) -> bool {
        self.sent + self.max_age >= arrived + self.oldest
    }
}

/// How one flight (one broker request) ended.
#[derive(Debug, Clone)]
enum Outcome {
    /// The broker answered (possibly with items its deadline left unread).
    Answered(Answer),
    /// The broker could not be reached or answered something unusable (counted by the flight).
    BrokerFailed,
    /// No answer in time: no connection was free before the deadline, or the reply had not
    /// come when the scrape had to answer. Not a sign that the broker is down.
    TimedOut,
}

/// Everything one HTTP scrape exports.
#[derive(Debug, Clone)]
pub(crate) struct ScrapeReport {
    /// The broker's telemetry; `None` when the broker did not answer in time.
    pub(crate) telemetry: Option<Arc<Telemetry>>,
    /// `amd_hsmp_broker_up`: the broker answered, or the scrape merely ran out of time while
    /// the broker was reachable.
    pub(crate) broker_up: bool,
    /// Error counts, including this scrape's.
    pub(crate) errors: Vec<(ErrorSource, u64)>,
    /// The owner of each assigned core (`--collector.core-owner`), in topology order; empty
    /// when the collector is off, the hierarchy could not be read or the broker did not answer.
    pub(crate) core_owners: Vec<(CoreLabel, String)>,
    /// Time this scrape spent collecting.
    pub(crate) duration: Duration,
    /// This process' own metrics.
    pub(crate) process: ProcessStats,
}

/// A running scrape's place within `--web.max-requests`.
#[derive(Debug)]
pub(crate) struct ScrapePermit {
    _held: Option<OwnedSemaphorePermit>,
}

/// Told of every broker answer as it lands, scrapes' and page views' alike (the landing page
/// keeps the last ones for its power): an observer the router registers, so that the pipeline
/// knows nothing of its views.
pub(crate) trait AnswerObserver: Send + Sync + fmt::Debug {
    /// `telemetry` landed now; its oldest value was read `oldest` before the broker received
    /// the request.
    fn answered(&self, telemetry: &Arc<Telemetry>, oldest: Duration);
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
    /// Told of every broker answer.
    observers: Mutex<Vec<Arc<dyn AnswerObserver>>>,
    /// The core-owner collector's failures, logged once per cause.
    owner_log: CauseLog,
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
            observers: Mutex::default(),
            owner_log: CauseLog::default(),
            config,
        })
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// A place for one more scrape within `--web.max-requests`, held until dropped; `None` when
    /// that many scrapes are running (logged at a bounded rate).
    pub(crate) fn admit_scrape(&self) -> Option<ScrapePermit> {
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

    /// Tells `observer` of every broker answer from now on.
    pub(crate) fn observe(&self, observer: Arc<dyn AnswerObserver>) {
        // Plain data, valid even if a holder panicked.
        self.observers.lock().unwrap_or_else(PoisonError::into_inner).push(observer);
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
    pub(crate) async fn scrape(self: &Arc<Self>, budget: Budget) -> ScrapeReport {
        let started = Instant::now();
        let deadline = started + budget.broker_deadline;
        let answer_by = started + budget.wait;
        let tolerance = budget.broker_deadline / JOIN_TOLERANCE_DIVISOR;
        // The hierarchy is read on a blocking thread while the broker samples, so that it adds
        // nothing to the scrape's time unless it takes longer than the broker.
        let hierarchy = self
            .config
            .core_owner
            .clone()
            .map(|root| tokio::task::spawn_blocking(move || owner::read(&root)));
        let outcome = self.collect(started, deadline, answer_by, tolerance).await;
        let hierarchy = match hierarchy {
            None => None,
            Some(reading) => Some(match tokio::time::timeout_at(answer_by, reading).await {
                Ok(Ok(result)) => result,
                // The reading thread panicked: a bug, reported as no answer in time.
                Ok(Err(_)) | Err(_) => Err(OwnerError::TimedOut),
            }),
        };
        let mut topology = None;
        let (telemetry, broker_up) = match outcome {
            Outcome::Answered(Answer { telemetry, topology: t, .. }) => {
                if telemetry.deadline_exceeded {
                    self.errors.add(ErrorSource::Scrape, 1);
                }
                topology = Some(t);
                (Some(telemetry), true)
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
        let core_owners = self.core_owners(hierarchy, topology.as_deref());
        ScrapeReport {
            telemetry,
            broker_up,
            errors: self.errors.snapshot(self.config.core_owner.is_some()),
            core_owners,
            duration: started.elapsed(),
            process: process::read_own(&self.config.procfs),
        }
    }

    /// The owner series of one scrape from its read of the hierarchy (`None`: the collector is
    /// off) and its broker answer's topology; a failed read is counted once and the family left
    /// out whole.
    fn core_owners(
        &self,
        hierarchy: Option<Result<Hierarchy, OwnerError>>,
        topology: Option<&Topology>,
    ) -> Vec<(CoreLabel, String)> {
        match hierarchy {
            None => Vec::new(),
            Some(Ok(hierarchy)) => {
                self.owner_log.succeeded();
                topology.map(|t| hierarchy.owners(&t.cores)).unwrap_or_default()
            }
            Some(Err(e)) => {
                self.errors.add(ErrorSource::CoreOwner, 1);
                self.owner_log.failed(&e);
                Vec::new()
            }
        }
    }

    /// The answer for a scrape that arrived at `arrived`, with broker deadline `deadline`,
    /// that must answer by `answer_by`. A joined flight that comes back partial (its shorter
    /// deadline left items unread) is followed by another flight with the time left, if there
    /// is enough; so is one whose values are older than the broker's freshness bound allows
    /// for this scrape, which is never served to it.
    async fn collect(
        self: &Arc<Self>,
        arrived: Instant,
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
            let time_left = deadline.saturating_duration_since(Instant::now()) >= MIN_RETRY;
            match outcome {
                Outcome::Answered(a) if !a.fresh_for(arrived) => {
                    tracing::debug!(
                        oldest_ms = a.oldest.as_millis() as u64,
                        "a joined broker answer is too old for this scrape; asking again"
                    );
                    if !time_left {
                        break;
                    }
                }
                Outcome::Answered(a) if a.telemetry.deadline_exceeded && joined && time_left => {
                    partial = Some(a);
                }
                Outcome::Answered(a) => return Outcome::Answered(a),
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
                let sample = &snapshot.sample;
                let oldest = Duration::from_micros(sample.oldest_read_us.into());
                for observer in self.observers.lock().unwrap_or_else(PoisonError::into_inner).iter()
                {
                    observer.answered(&telemetry, oldest);
                }
                Outcome::Answered(Answer {
                    telemetry,
                    topology: Arc::clone(&snapshot.topology),
                    sent: snapshot.sent,
                    oldest,
                    max_age: Duration::from_millis(sample.max_age_ms.into()),
                })
            }
            // Every connection was busy with other flights until the deadline.
            Err(BrokerError::Busy) => Outcome::TimedOut,
            // The broker is up and said why it turned the connection away (logged by the
            // client at a bounded rate): a failed request, not an outage, so broker_up keeps
            // its last value.
            Err(BrokerError::TurnedAway { .. }) => {
                self.errors.add(ErrorSource::Broker, 1);
                Outcome::TimedOut
            }
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
