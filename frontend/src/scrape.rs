//! One scrape: its own deadline from the time budget, the broker request it flies on (shared
//! with concurrent scrapes only when that costs none of them data, see [`crate::flight`]), and
//! its report; the sample becomes series in [`crate::translate`].
//!
//! A flight departs when one of the broker client's `broker::MAX_CONNECTIONS` connections is
//! free, and a scrape joins one only if what it reads can be fresh for the scrape. A joined
//! answer is served only if its oldest value is within the broker's freshness bound of the
//! scrape's own arrival (`Answer::fresh_for`), since the broker may also return values it read
//! for an earlier request; otherwise the scrape asks again with the time it has left.

use crate::broker::{BrokerClient, BrokerError};
use crate::budget::Budget;
use crate::flight::{Flights, Landing, Needs};
use crate::owner::{CauseLog, Done, OwnerError, SkipLog, Walker};
use crate::process::{ProcFs, ProcessStats};
use crate::translate::{CoreLabel, ErrorCounters, ErrorSource, Telemetry, translate};
use crate::work::{Permit, Permits};
use crate::workload::{Ledger, Owners as WorkloadOwners, WorkloadReport};
use amd_hsmp_cli::chain;
use amd_hsmp_proto::{Families, Family, Topology};
use amd_hsmp_web::ratelimit::RateLimit;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// A scrape joins a flight whose deadline is at most this fraction of its own budget earlier
/// than its own (and never later), and only one whose request was not sent yet or was sent no
/// more than the broker's freshness bound before the scrape arrived (see [`crate::flight`]).
const JOIN_TOLERANCE_DIVISOR: u32 = 10;

/// A scrape whose joined flight came back partial or too old for it asks again only with at
/// least this much of its own broker deadline left.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// Flights one scrape takes at most: its first, and retries after joined answers that were
/// partial or too old for it.
const MAX_FLIGHTS_PER_SCRAPE: usize = 3;

/// At most one "timed out" warning per this interval; the others are counted in the next.
const TIMEOUT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Default of `--web.max-scrape-timeout`, [`Config::max_scrape_timeout`].
pub const DEFAULT_MAX_SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--web.max-requests`, [`Config::max_requests`].
pub const DEFAULT_MAX_REQUESTS: usize = 40;

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
    /// How long one walk of the hierarchy serves the scrapes that arrive after it began
    /// (`--collector.core-owner.max-age`).
    pub core_owner_max_age: Duration,
    /// How long a workload's energy counter is exported after it last held a core
    /// (`--collector.core-owner.linger`).
    pub core_owner_linger: Duration,
    /// The exporter's own metrics: `process_*` and `amd_hsmp_web_refused_total`; off with
    /// `--web.disable-exporter-metrics`.
    pub exporter_metrics: bool,
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
    /// request, and for a scrape that joined it only if it came soon enough after. The join rule
    /// admits only scrapes for which what the flight's request read is fresh; this is still
    /// false when the broker took values read for an earlier request, up to the bound before
    /// this one.
    fn fresh_for(&self, arrived: Instant) -> bool {
        self.sent + self.max_age >= arrived + self.oldest
    }

    /// How many values the answer holds (series of the broker's families).
    fn values(&self) -> usize {
        self.telemetry.values
    }

    /// Of a partial answer `kept` and a later `other`, the one with more values; `other` when
    /// they hold as many.
    fn fuller(kept: Option<Answer>, other: Answer) -> Answer {
        match kept {
            Some(kept) if kept.values() > other.values() => kept,
            _ => other,
        }
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
    pub(crate) core_owners: Vec<(CoreLabel, Arc<crate::owner::Owner>)>,
    /// Cgroups the walk behind `core_owners` skipped because this process may not read them;
    /// `None` when no walk was served to this scrape.
    pub(crate) core_owner_skipped: Option<u64>,
    /// Slurm jobs among `core_owners` named by their SLUID whose numeric id could not be read
    /// from their stepd; `None` when no walk was served to this scrape.
    pub(crate) core_owner_unresolved: Option<u64>,
    /// The per-workload energy counters (`--collector.core-owner` with core energy); `None`
    /// while either is off.
    pub(crate) workloads: Option<WorkloadReport>,
    /// Time this scrape spent collecting.
    pub(crate) duration: Duration,
    /// This process' own metrics (all `None` without `exporter_metrics`).
    pub(crate) process: ProcessStats,
    /// The TLS handshakes and requests the web configuration refused, by reason; empty without
    /// a `--web.config.file` or without `exporter_metrics`.
    pub(crate) web_refused: Vec<(&'static str, u64)>,
}

/// What one scrape read ([`Exporter::sample`]): the parts of its [`ScrapeReport`] that come
/// from the broker and the cgroup hierarchy.
#[derive(Debug)]
struct Sampled {
    telemetry: Option<Arc<Telemetry>>,
    broker_up: bool,
    core_owners: Vec<(CoreLabel, Arc<crate::owner::Owner>)>,
    core_owner_skipped: Option<u64>,
    core_owner_unresolved: Option<u64>,
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
    /// The places of `--web.max-requests`, held by the scrapes and by the work they start.
    permits: Permits,
    refusal_log: RateLimit,
    /// Told of every broker answer.
    observers: Mutex<Vec<Arc<dyn AnswerObserver>>>,
    /// The core-owner collector's walks; `None` while it is off.
    walker: Option<Walker>,
    /// The per-workload energy counters; `None` unless both the core-owner collector and core
    /// energy are on.
    ledger: Option<Mutex<Ledger>>,
    /// The core-owner collector's failures, logged once per cause.
    owner_log: CauseLog,
    /// The cgroups the core-owner collector skips, logged once per cause.
    skip_log: SkipLog,
    /// This process in `procfs`, for the `process_*` metrics.
    process: ProcFs,
    /// The web layer it is served behind ([`crate::http::service`]), whose refusals a scrape
    /// reports; unset when it is served bare ([`crate::http::app`], the tests).
    web: std::sync::OnceLock<Arc<amd_hsmp_web::config::WebState>>,
}

/// Whether a request wants the core owners (a scrape) or not (a page view, which shows none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owners {
    /// Walk the hierarchy if the collector is on.
    Wanted,
    /// Read nothing of it.
    Skipped,
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
            permits: Permits::new(config.max_requests),
            refusal_log: RateLimit::new(TIMEOUT_LOG_INTERVAL),
            observers: Mutex::default(),
            walker: config.core_owner.clone().map(|root| {
                Walker::with_max_age(root, config.procfs.clone(), config.core_owner_max_age)
            }),
            ledger: (config.core_owner.is_some() && config.families.contains(Family::CoreEnergy))
                .then(|| Mutex::new(Ledger::new(config.core_owner_linger))),
            owner_log: CauseLog::default(),
            skip_log: SkipLog::default(),
            process: ProcFs::own(&config.procfs),
            web: std::sync::OnceLock::new(),
            config,
        })
    }

    /// Serves behind `web`: its refusals join the scrapes' reports. The first call wins.
    pub(crate) fn serve_behind(&self, web: Arc<amd_hsmp_web::config::WebState>) {
        let _ = self.web.set(web);
    }

    /// The web layer it is served behind, if any.
    pub(crate) fn web(&self) -> Option<&amd_hsmp_web::config::WebState> {
        self.web.get().map(|web| &**web)
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// A place for one more scrape within `--web.max-requests`, held until the scrape and all
    /// the work it starts have ended (see [`crate::work`]); `None` when every place is held
    /// (logged at a bounded rate).
    pub(crate) fn admit_scrape(&self) -> Option<Permit> {
        match self.permits.try_take() {
            Some(permit) => Some(permit),
            None => {
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

    /// How many walks of the cgroup hierarchy the core-owner collector began, since the start.
    pub fn owner_walks(&self) -> u64 {
        self.walker.as_ref().map_or(0, Walker::walks)
    }

    /// Takes a sample for the workload energy counters every `interval` until `stop` turns
    /// true (`--collector.core-owner.sample-interval`), as a scrape would: one broker answer
    /// (shared with scrapes in flight by the same rules) and the walk served with it. Each
    /// holds a place of `--web.max-requests` while it runs; when every place is held, that
    /// sample is skipped, which only lengthens the next interval. Returns at once while the
    /// workload counters are off.
    pub async fn sample_workloads_every(
        self: Arc<Self>,
        interval: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        if self.ledger.is_none() || interval.is_zero() {
            return;
        }
        let budget = Budget::of(
            interval.min(self.config.max_scrape_timeout).max(crate::budget::MIN_SCRAPE_TIMEOUT),
        );
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let Some(permit) = self.permits.try_take() else { continue };
            self.sample(Instant::now(), budget, &permit, Owners::Wanted).await;
        }
    }

    /// Collects one scrape within `budget`, never failing: what could not be read is absent
    /// and counted. The scrape keeps its own deadline: it joins a broker request in flight
    /// only if that request was not sent yet or was sent no more than the broker's freshness
    /// bound before the scrape arrived, and its deadline is within a tenth of the budget before
    /// its own and not after it; else it sends its own. The work it starts holds `permit` while
    /// it runs.
    pub(crate) async fn scrape(
        self: &Arc<Self>,
        budget: Budget,
        permit: &Permit,
        owners: Owners,
    ) -> ScrapeReport {
        let started = Instant::now();
        let sampled = self.sample(started, budget, permit, owners).await;
        let workloads = self.ledger.as_ref().map(|ledger| {
            ledger.lock().unwrap_or_else(PoisonError::into_inner).report(started.into_std())
        });
        ScrapeReport {
            telemetry: sampled.telemetry,
            broker_up: sampled.broker_up,
            errors: self.errors.snapshot(self.config.core_owner.is_some()),
            core_owners: sampled.core_owners,
            core_owner_skipped: sampled.core_owner_skipped,
            core_owner_unresolved: sampled.core_owner_unresolved,
            workloads,
            duration: started.elapsed(),
            process: if self.config.exporter_metrics {
                self.process.read()
            } else {
                ProcessStats::default()
            },
            web_refused: Vec::new(),
        }
    }

    /// What a scrape that began at `started` reads, as [`Exporter::scrape`] says, and the
    /// sample it gives the workload energy counters: the broker's answer and the owners, without
    /// the report built from them (the samples between scrapes take this alone).
    async fn sample(
        self: &Arc<Self>,
        started: Instant,
        budget: Budget,
        permit: &Permit,
        owners: Owners,
    ) -> Sampled {
        let deadline = started + budget.broker_deadline;
        let answer_by = started + budget.wait;
        let tolerance = budget.broker_deadline / JOIN_TOLERANCE_DIVISOR;
        // The hierarchy is walked on the walker's thread while the broker samples, so that it
        // adds nothing to the scrape's time unless it takes longer than the broker. A walk
        // bounds the CPU sets it reads by the broker's topology; until the broker has told it
        // (the first answer), the walk waits for the answer and is not taken without one:
        // owners need the topology's cores, and sets bounded by no topology cost 8 KiB a
        // cgroup on a hostile hierarchy.
        let walker = self.walker.as_ref().filter(|_| owners == Owners::Wanted);
        let walk = async {
            match walker {
                Some(walker) => Some(walker.walk(started, answer_by, permit).await),
                None => None,
            }
        };
        let collect = self.collect(started, deadline, answer_by, tolerance, permit);
        let (outcome, hierarchy) = match walker {
            Some(walker) if !walker.knows_topology() => {
                let outcome = collect.await;
                let answered = matches!(outcome, Outcome::Answered(_));
                (outcome, if answered { walk.await } else { None })
            }
            _ => tokio::join!(collect, walk),
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
        let walked = hierarchy.is_some();
        let (core_owners, core_owner_skipped) = self.core_owners(hierarchy, topology.as_deref());
        let core_owner_unresolved = core_owner_skipped.map(|_| unresolved_jobs(&core_owners));
        // A sample is one broker answer with the owners of the walk served with it; a request
        // that wanted no owners (a page view) takes none.
        if let (Some(ledger), Some(telemetry), true) = (&self.ledger, &telemetry, walked) {
            let owners = match core_owner_skipped {
                Some(_) => WorkloadOwners::Known(&core_owners),
                None => WorkloadOwners::Unknown,
            };
            let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
            ledger.sample(started.into_std(), telemetry, owners);
        }
        Sampled { telemetry, broker_up, core_owners, core_owner_skipped, core_owner_unresolved }
    }

    /// The owner series of one scrape from the walk it was served (`None`: the collector is
    /// off, or the request wants no owners) and its broker answer's topology, with the count
    /// of cgroups that walk skipped; a failed walk is counted once and the family left out
    /// whole.
    fn core_owners(
        &self,
        walk: Option<Result<Arc<Done>, OwnerError>>,
        topology: Option<&Topology>,
    ) -> (Vec<(CoreLabel, Arc<crate::owner::Owner>)>, Option<u64>) {
        let failed = |e: &OwnerError| {
            self.errors.add(ErrorSource::CoreOwner, 1);
            self.owner_log.failed(e);
            (Vec::new(), None)
        };
        match walk {
            None => (Vec::new(), None),
            Some(Ok(done)) => match &done.result {
                Ok(walk) => {
                    self.owner_log.succeeded();
                    self.skip_log.record(walk);
                    let owners = topology.map(|t| walk.hierarchy.owners(&t.cores));
                    (owners.unwrap_or_default(), Some(walk.skipped))
                }
                Err(e) => failed(e),
            },
            Some(Err(e)) => failed(&e),
        }
    }

    /// The answer for a scrape that arrived at `arrived`, with broker deadline `deadline`,
    /// that must answer by `answer_by`. The join rule ([`crate::flight`]) keeps the values a
    /// joined flight reads fresh for this scrape, but the broker may also return values it
    /// read for an earlier request: a joined answer whose oldest value is older than the
    /// broker's freshness bound allows for this scrape is never served to it, and another
    /// flight follows with the time left, if there is enough (the broker measures that
    /// flight's freshness from its own arrival, so on a slow socket it may bring back less
    /// than the full sample). A joined flight that comes back partial (its shorter deadline
    /// left items unread) is followed by another flight too; the scrape is served whichever
    /// of the two holds more values.
    async fn collect(
        self: &Arc<Self>,
        arrived: Instant,
        deadline: Instant,
        answer_by: Instant,
        tolerance: Duration,
        permit: &Permit,
    ) -> Outcome {
        let needs = Needs { arrived, deadline, tolerance };
        let mut partial = None;
        for _ in 0..MAX_FLIGHTS_PER_SCRAPE {
            let this = Arc::clone(self);
            // The flight's task holds the permit until it lands, whoever still waits for it.
            let held = permit.clone();
            let ticket = self.flights.join_or_start(needs, move || async move {
                let outcome = this.fly(deadline).await;
                drop(held);
                outcome
            });
            let joined = ticket.joined;
            let outcome = match ticket.land_by(answer_by).await {
                Landing::Landed(outcome) => outcome,
                // Not landed in time, or never sent: no broker connection was free in time.
                Landing::Late | Landing::Grounded => Outcome::TimedOut,
                // The flight task died; nothing was counted for it.
                Landing::Lost => Outcome::BrokerFailed,
            };
            if let Outcome::Answered(a) = &outcome {
                self.flights.learn_bound(a.max_age);
            }
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
                    partial = Some(Answer::fuller(partial, a));
                }
                Outcome::Answered(a) => return Outcome::Answered(Answer::fuller(partial, a)),
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
                if let Some(walker) = &self.walker {
                    walker.note_topology(&snapshot.topology);
                }
                let sample = &snapshot.sample;
                let oldest = sample.oldest_read();
                for observer in self.observers.lock().unwrap_or_else(PoisonError::into_inner).iter()
                {
                    observer.answered(&telemetry, oldest);
                }
                Outcome::Answered(Answer {
                    telemetry,
                    topology: Arc::clone(&snapshot.topology),
                    sent: snapshot.sent,
                    oldest,
                    max_age: sample.max_age(),
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
                if !self.broker_reachable.swap(false, Ordering::Relaxed) {
                    tracing::debug!(error = %chain(&e), "broker still unavailable");
                } else if let Some((broker, exporter)) = e.version_skew() {
                    tracing::error!(
                        socket = %self.broker.path().display(),
                        exporter_version = env!("CARGO_PKG_VERSION"),
                        "the broker speaks protocol {broker} and this exporter protocol \
                         {exporter}: they are of different releases; install amd-hsmp-broker \
                         and amd-hsmp-exporter of the same release (upgrade both together). \
                         Exporting amd_hsmp_broker_up 0 until they match"
                    );
                } else {
                    tracing::warn!(
                        socket = %self.broker.path().display(),
                        error = %chain(&e),
                        "broker unreachable; exporting amd_hsmp_broker_up 0 and retrying on every scrape"
                    );
                }
                Outcome::BrokerFailed
            }
        }
    }
}

/// The Slurm jobs among `owners` named by their SLUID and not by their numeric id, each once.
fn unresolved_jobs(owners: &[(CoreLabel, Arc<crate::owner::Owner>)]) -> u64 {
    let mut sluids: Vec<&str> = owners
        .iter()
        .map(|(_, owner)| &owner.identity)
        .filter(|id| id.hpc_job.is_none())
        .filter_map(|id| id.slurm_sluid.as_deref())
        .collect();
    sluids.sort_unstable();
    sluids.dedup();
    sluids.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::Families;

    fn answer(telemetry: Telemetry) -> Answer {
        Answer {
            telemetry: Arc::new(telemetry),
            topology: Arc::new(Topology::default()),
            sent: Instant::now(),
            oldest: Duration::ZERO,
            max_age: Duration::ZERO,
        }
    }

    /// Regression: two partial answers were compared by the values of three families only, so
    /// one that had read a socket's frequency limit or package energy lost to a later one that
    /// had not.
    #[test]
    fn of_two_partial_answers_the_one_with_more_values_of_any_family_is_kept() {
        for family in Family::ALL {
            let fuller = answer(Telemetry::example());
            let other = answer(Telemetry::example_of(Families::ALL.without(family)));
            let kept = Answer::fuller(Some(fuller), other);
            assert_eq!(kept.telemetry.values, Telemetry::example().values, "{family}");
        }
    }
}
