//! The translation of a broker sample into the series to export (absent, never a sentinel)
//! and the cumulative error counters, counted once per broker request.

use crate::broker::BrokerInfo;
use crate::collectors::Collector;
use amd_hsmp_proto::{
    Core, DeviceStatus, Energy, EnergySource, Family, FrequencyLimit, ItemError, PerFamily,
    Readings, Sample, Topology, Unavailable, Value,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// The `collector` label values of `amd_hsmp_scrape_errors_total`: those of
/// [`ErrorSource::all`] present from the first scrape, [`ErrorSource::CoreOwner`] only while its
/// collector is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorSource {
    /// `/dev/hsmp` exists but cannot be used: opening it was refused
    /// (`DeviceStatus::PermissionDenied`, a misconfiguration) or it did not answer
    /// (`DeviceStatus::Failed`). A device that is absent is no error: the machine may simply
    /// not have one.
    Hsmp,
    /// One item (core or socket) of the family failed to read; for core energy also each
    /// counter reset the broker reports.
    Family(Family),
    /// The cgroup hierarchy could not be read for the core owners (`--collector.core-owner`,
    /// off by default): one per scrape.
    CoreOwner,
    /// The scrape ran out of time (frontend timeout, or items the broker left unread).
    Scrape,
    /// The broker could not be reached or answered something unusable.
    Broker,
}

impl ErrorSource {
    /// Every value but [`ErrorSource::CoreOwner`], in exposition order.
    pub(crate) fn all() -> impl Iterator<Item = ErrorSource> {
        std::iter::once(ErrorSource::Hsmp)
            .chain(Family::ALL.map(ErrorSource::Family))
            .chain([ErrorSource::Scrape, ErrorSource::Broker])
    }

    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ErrorSource::Hsmp => "hsmp",
            ErrorSource::Family(family) => family.name(),
            ErrorSource::CoreOwner => Collector::CoreOwner.name(),
            ErrorSource::Scrape => "scrape",
            ErrorSource::Broker => "broker",
        }
    }
}

/// Error counts since the process started, one per [`ErrorSource`].
#[derive(Debug, Default)]
pub(crate) struct ErrorCounters {
    hsmp: AtomicU64,
    families: PerFamily<AtomicU64>,
    core_owner: AtomicU64,
    scrape: AtomicU64,
    broker: AtomicU64,
    /// The broker instance last answered and its cumulative `Sample::energy_resets` then.
    energy_resets_seen: std::sync::Mutex<Option<(u64, u64)>>,
}

impl ErrorCounters {
    fn counter(&self, source: ErrorSource) -> &AtomicU64 {
        match source {
            ErrorSource::Hsmp => &self.hsmp,
            ErrorSource::Family(family) => &self.families[family],
            ErrorSource::CoreOwner => &self.core_owner,
            ErrorSource::Scrape => &self.scrape,
            ErrorSource::Broker => &self.broker,
        }
    }

    pub(crate) fn add(&self, source: ErrorSource, n: u64) {
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
        self.add(ErrorSource::Family(Family::CoreEnergy), new);
        // An older reply that arrives late never lowers the mark.
        let last = seen.filter(|&(i, _)| i == instance).map_or(0, |(_, last)| last);
        *seen = Some((instance, total.max(last)));
    }

    /// The count of one source.
    pub(crate) fn get(&self, source: ErrorSource) -> u64 {
        self.counter(source).load(Ordering::Relaxed)
    }

    /// The current counts, in the order of [`ErrorSource::all`], with
    /// [`ErrorSource::CoreOwner`]'s after the last family's when `core_owner` (its collector is
    /// on).
    pub(crate) fn snapshot(&self, core_owner: bool) -> Vec<(ErrorSource, u64)> {
        let mut out = Vec::with_capacity(Family::COUNT + 5);
        for source in ErrorSource::all() {
            if core_owner && source == ErrorSource::Scrape {
                out.push((ErrorSource::CoreOwner, self.get(ErrorSource::CoreOwner)));
            }
            out.push((source, self.get(source)));
        }
        out
    }
}

/// One core's series labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CoreLabel {
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
pub(crate) struct Telemetry {
    /// `Some(profile)` when the broker serves its simulator.
    pub simulated: Option<String>,
    /// HSMP protocol version when the device is ready; `None` means `amd_hsmp_up 0`.
    pub hsmp_protocol_version: Option<u32>,
    /// Energy source, set when at least one energy series exists.
    pub energy_source: Option<EnergySource>,
    /// Per-core energy in joules.
    pub energy_joules: Vec<(CoreLabel, f64)>,
    /// When each of [`Telemetry::energy_joules`] was read, µs of `CLOCK_MONOTONIC` (aligned
    /// with it; `None` where the broker did not say): what power is taken over.
    pub energy_read_at_us: Vec<Option<u64>>,
    /// What the energy counters count from, where a broker keeps them (the perf and MSR
    /// sources: `Some((instance, resets))`, the broker instance and its cumulative counted
    /// resets); `None` for HSMP's firmware counters, which a broker restart does not touch. Two
    /// samples of different epochs are a counter reset between them.
    pub energy_epoch: Option<(u64, u64)>,
    /// Per-core boost limit in hertz.
    pub boost_limit_hertz: Vec<(CoreLabel, f64)>,
    /// Per-socket PROCHOT.
    pub prochot: Vec<(u32, bool)>,
    /// Per-socket frequency limit and its limiters.
    pub frequency_limit: Vec<(u32, FrequencyLimit)>,
    /// Per-core frequency limit in hertz.
    pub core_frequency_limit_hertz: Vec<(CoreLabel, f64)>,
    /// Per-socket package energy in joules.
    pub package_energy_joules: Vec<(u32, f64)>,
    /// When each of [`Telemetry::package_energy_joules`] was read, as
    /// [`Telemetry::energy_read_at_us`].
    pub package_energy_read_at_us: Vec<Option<u64>>,
    /// Some items were not read because the broker's deadline passed.
    pub deadline_exceeded: bool,
    /// How many values of the broker's families were kept, over every family: what two
    /// partial answers are compared by.
    pub values: usize,
    /// The families the broker read none of, and why, in the order of [`Family::ALL`].
    pub unread: Vec<(Family, Unread)>,
}

/// Why the broker read none of a family's items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unread {
    /// The exporter did not ask for it (`--no-collector.NAME`).
    NotRequested,
    /// No usable HSMP device and, for core energy, no MSR fallback.
    NoDevice,
    /// The firmware does not implement its message.
    Unsupported,
}

impl Telemetry {
    /// Why `family` was not read at all; `None` when it was (even if every item failed).
    pub(crate) fn unread(&self, family: Family) -> Option<Unread> {
        self.unread.iter().find(|(f, _)| *f == family).map(|&(_, why)| why)
    }
}

/// Turns one sample into the series to export, counting each failed item once.
pub(crate) fn translate(
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
    let sockets = &topology.sockets;
    let mut read = Reader { errors, deadline_exceeded: false, unread: Vec::new(), kept: 0 };
    let of = |family| &sample.readings[family];
    out.energy_joules =
        read.collect(Family::CoreEnergy, of(Family::CoreEnergy), &cores, |e: Energy| e.joules());
    out.energy_source = if out.energy_joules.is_empty() { None } else { sample.energy_source };
    out.energy_epoch = match out.energy_source {
        Some(EnergySource::Perf | EnergySource::Msr) => Some((info.instance, sample.energy_resets)),
        Some(EnergySource::Hsmp) | None => None,
    };
    out.boost_limit_hertz = read.collect(Family::BoostLimit, of(Family::BoostLimit), &cores, hertz);
    out.prochot = read.collect(Family::Prochot, of(Family::Prochot), sockets, |a: bool| a);
    out.frequency_limit = read.collect(
        Family::FrequencyLimit,
        of(Family::FrequencyLimit),
        sockets,
        |l: FrequencyLimit| l,
    );
    out.core_frequency_limit_hertz =
        read.collect(Family::CoreFrequencyLimit, of(Family::CoreFrequencyLimit), &cores, hertz);
    out.package_energy_joules =
        read.collect(Family::PackageEnergy, of(Family::PackageEnergy), sockets, |e: Energy| {
            e.joules()
        });
    let at = |family| &sample.read_at_us[family];
    out.energy_read_at_us =
        read_at(of(Family::CoreEnergy), at(Family::CoreEnergy), out.energy_joules.len());
    out.package_energy_read_at_us = read_at(
        of(Family::PackageEnergy),
        at(Family::PackageEnergy),
        out.package_energy_joules.len(),
    );
    out.deadline_exceeded = read.deadline_exceeded;
    out.values = read.kept;
    out.unread = read.unread;
    out
}

/// The read times of the values [`Reader::collect`] kept of `readings` (`kept` of them), from
/// the sample's `at` (aligned with the items): `None` each where the broker gave no time, or
/// gave times not aligned with its items.
fn read_at(readings: &Readings<Value>, at: &[Option<u64>], kept: usize) -> Vec<Option<u64>> {
    let times: Vec<Option<u64>> = match readings {
        Readings::Values(values) if values.len() == at.len() => {
            values.iter().zip(at).filter(|(v, _)| v.is_ok()).map(|(_, at)| *at).collect()
        }
        _ => Vec::new(),
    };
    if times.len() == kept { times } else { vec![None; kept] }
}

/// A frequency in MHz, as the broker reads it, in hertz.
fn hertz(mhz: u32) -> f64 {
    f64::from(mhz) * 1e6
}

/// Collects the families of one sample, counting their failed items.
struct Reader<'a> {
    errors: &'a ErrorCounters,
    /// Some item was left unread by the broker's deadline.
    deadline_exceeded: bool,
    /// The families not read at all, and why.
    unread: Vec<(Family, Unread)>,
    /// Values kept, over every family.
    kept: usize,
}

impl Reader<'_> {
    /// The values of one family that were read, paired with their labels, each as `T`, the type
    /// of the family's kind, turned by `convert`. A failed item is left out and counted under
    /// `family`; an item the deadline left unread is left out and flags the deadline. A reading
    /// not aligned with the topology, or holding a value of another kind, is a broker fault:
    /// the whole family is left out and counted under `broker`.
    fn collect<T: TryFrom<Value>, L: Copy, V>(
        &mut self,
        family: Family,
        readings: &Readings<Value>,
        labels: &[L],
        convert: impl Fn(T) -> V,
    ) -> Vec<(L, V)> {
        let values = match readings {
            Readings::Values(values) => values,
            // The family is absent, and that is not an error.
            Readings::NotRequested => return self.not_read(family, Unread::NotRequested),
            Readings::Unavailable(Unavailable::NoDevice) => {
                return self.not_read(family, Unread::NoDevice);
            }
            Readings::Unavailable(Unavailable::Unsupported) => {
                return self.not_read(family, Unread::Unsupported);
            }
        };
        if values.len() != labels.len() {
            tracing::warn!(
                %family,
                values = values.len(),
                items = labels.len(),
                "broker reply not aligned with its topology; family left out"
            );
            self.errors.add(ErrorSource::Broker, 1);
            return Vec::new();
        }
        if let Some(Ok(other)) = values.iter().find(|v| v.is_ok_and(|v| v.kind() != family.kind()))
        {
            tracing::warn!(%family, value = ?other, "broker reply holds a value of another kind; family left out");
            self.errors.add(ErrorSource::Broker, 1);
            return Vec::new();
        }
        let mut out = Vec::with_capacity(values.len());
        let mut failed = 0;
        for (label, value) in labels.iter().zip(values) {
            match value.map(T::try_from) {
                Ok(Ok(v)) => out.push((*label, convert(v))),
                // A collector that asks for another kind than its family's: a failed item.
                Ok(Err(_)) => failed += 1,
                Err(ItemError::DeadlineExceeded) => self.deadline_exceeded = true,
                Err(e) => {
                    failed += 1;
                    tracing::debug!(%family, error = %e, "read failed");
                }
            }
        }
        self.errors.add(ErrorSource::Family(family), failed);
        self.kept += out.len();
        out
    }

    /// Notes that `family` was not read, and why: no values.
    fn not_read<V>(&mut self, family: Family, why: Unread) -> Vec<V> {
        self.unread.push((family, why));
        Vec::new()
    }
}

#[cfg(test)]
impl Telemetry {
    /// What [`translate`] makes of [`Sample::healthy`] on a 2 × 2-core machine without the
    /// simulator: the example the other modules' tests change only what they test in, so
    /// that a new family is written here once.
    pub(crate) fn example() -> Telemetry {
        Telemetry::example_of(amd_hsmp_proto::Families::ALL)
    }

    /// [`Telemetry::example`] of the families in `what` only.
    pub(crate) fn example_of(what: amd_hsmp_proto::Families) -> Telemetry {
        let topology = amd_hsmp_proto::testing::topology(2, 2);
        let sample = Sample::healthy(&topology, what);
        let info = BrokerInfo { broker_version: "0.1.0".into(), instance: 1, simulated: None };
        translate(&info, &topology, &sample, &ErrorCounters::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::{Energy, Families, Unavailable};

    fn topology() -> Topology {
        Topology {
            cpu_family: 0x1A,
            cpu_model: 0x11,
            sockets: vec![0, 1],
            cores: vec![
                Core { socket: 0, core: 0, cpu: 0, apic_id: 0, threads: vec![0, 3] },
                Core { socket: 0, core: 8, cpu: 1, apic_id: 16, threads: vec![1, 4] },
                Core { socket: 1, core: 0, cpu: 2, apic_id: 256, threads: vec![2, 5] },
            ],
        }
    }

    fn info() -> BrokerInfo {
        BrokerInfo { broker_version: "0.1.0".into(), instance: 7, simulated: None }
    }

    /// `items` as a family's readings.
    fn values<T: Into<Value>>(items: Vec<Result<T, ItemError>>) -> Readings<Value> {
        Readings::Values(items.into_iter().map(|v| v.map(Into::into)).collect())
    }

    fn sample() -> Sample {
        let mut s = Sample::healthy(&topology(), Families::ALL);
        s.readings[Family::CoreEnergy] = values(vec![
            Ok(Energy { counter: 3 << 16, esu: 16 }),
            Err(ItemError::Io { errno: 5 }),
            Ok(Energy { counter: 1 << 15, esu: 16 }),
        ]);
        s.readings[Family::BoostLimit] =
            values(vec![Ok(3700u32), Ok(3600), Err(ItemError::DeadlineExceeded)]);
        s.readings[Family::Prochot] = Readings::Unavailable(Unavailable::Unsupported);
        s
    }

    /// [`sample`] with `family`'s readings replaced by `readings`.
    fn sample_with(family: Family, readings: Readings<Value>) -> Sample {
        let mut s = sample();
        s.readings[family] = readings;
        s
    }

    #[test]
    fn the_example_has_every_family_of_a_healthy_sample() {
        let t = Telemetry::example();
        assert_eq!(t.hsmp_protocol_version, Some(7));
        assert_eq!(t.energy_source, Some(EnergySource::Hsmp));
        let label = |socket, core| CoreLabel { socket, core };
        let cores = [label(0, 0), label(0, 2), label(1, 0), label(1, 2)];
        assert_eq!(
            t.energy_joules,
            cores
                .iter()
                .zip([1000.0, 1001.0, 1002.0, 1003.0])
                .map(|(c, j)| (*c, j))
                .collect::<Vec<_>>()
        );
        assert_eq!(t.boost_limit_hertz, cores.map(|c| (c, 3.7e9)).to_vec());
        assert_eq!(t.prochot, vec![(0, false), (1, true)]);
        let opn = FrequencyLimit { mhz: 3700, reasons: 0x10 };
        let prochot = FrequencyLimit { mhz: 1500, reasons: 0x02 };
        assert_eq!(t.frequency_limit, vec![(0, opn), (1, prochot)]);
        assert_eq!(t.core_frequency_limit_hertz, cores.map(|c| (c, 3.7e9)).to_vec());
        assert!(t.simulated.is_none() && !t.deadline_exceeded);
    }

    fn count(errors: &ErrorCounters, source: ErrorSource) -> u64 {
        errors.get(source)
    }

    #[test]
    fn the_example_counts_the_values_of_every_family() {
        let t = Telemetry::example();
        // One value a message: every item of every family of the 2 × 2-core example.
        assert_eq!(t.values, amd_hsmp_proto::Families::ALL.messages(4, 2));
    }

    #[test]
    fn failed_core_is_absent_and_counted_under_its_collector() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        assert_eq!(
            t.energy_joules,
            vec![(CoreLabel { socket: 0, core: 0 }, 3.0), (CoreLabel { socket: 1, core: 0 }, 0.5)]
        );
        assert_eq!(count(&errors, ErrorSource::Family(Family::CoreEnergy)), 1);
        assert_eq!(t.energy_source, Some(EnergySource::Hsmp));
        assert_eq!(t.hsmp_protocol_version, Some(7));
    }

    #[test]
    fn energy_counter_resets_count_as_core_energy_errors_once_per_broker_instance() {
        let errors = ErrorCounters::default();
        let at = |instance, energy_resets| {
            let info = BrokerInfo { instance, ..info() };
            let s =
                Sample { energy_resets, ..sample_with(Family::CoreEnergy, Readings::NotRequested) };
            translate(&info, &topology(), &s, &errors);
            count(&errors, ErrorSource::Family(Family::CoreEnergy))
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
        assert_eq!(count(&errors, ErrorSource::Family(Family::BoostLimit)), 0);
    }

    #[test]
    fn a_socket_whose_frequency_limit_fails_is_absent_and_counted_under_frequency_limit() {
        let errors = ErrorCounters::default();
        let limit = FrequencyLimit { mhz: 3100, reasons: 0x08 };
        let s = sample_with(Family::FrequencyLimit, values(vec![Err(ItemError::Busy), Ok(limit)]));
        let t = translate(&info(), &topology(), &s, &errors);
        assert_eq!(t.frequency_limit, vec![(1, limit)]);
        assert_eq!(count(&errors, ErrorSource::Family(Family::FrequencyLimit)), 1);
        assert_eq!(count(&errors, ErrorSource::Family(Family::CoreFrequencyLimit)), 0);
    }

    /// Issue 28: the package counter in joules per socket; where the firmware does not answer
    /// it the family is absent, without an error.
    #[test]
    fn package_energy_is_in_joules_per_socket_and_absent_where_unsupported() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        let joules = |s: u32| (amd_hsmp_proto::testing::PACKAGE_JOULES + u64::from(s)) as f64;
        assert_eq!(t.package_energy_joules, vec![(0, joules(0)), (1, joules(1))]);
        let s = sample_with(Family::PackageEnergy, Readings::Unavailable(Unavailable::Unsupported));
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.package_energy_joules.is_empty());
        assert_eq!(t.unread(Family::PackageEnergy), Some(Unread::Unsupported));
        assert_eq!(count(&errors, ErrorSource::Family(Family::PackageEnergy)), 0);
    }

    #[test]
    fn unsupported_family_is_absent_without_error() {
        let errors = ErrorCounters::default();
        let t = translate(&info(), &topology(), &sample(), &errors);
        assert!(t.prochot.is_empty());
        assert_eq!(count(&errors, ErrorSource::Family(Family::Prochot)), 0);
    }

    #[test]
    fn a_family_not_read_at_all_says_why() {
        let mut s = sample();
        s.readings[Family::CoreEnergy] = Readings::Unavailable(Unavailable::NoDevice);
        s.readings[Family::BoostLimit] = Readings::NotRequested;
        let t = translate(&info(), &topology(), &s, &ErrorCounters::default());
        assert_eq!(t.unread(Family::CoreEnergy), Some(Unread::NoDevice));
        assert_eq!(t.unread(Family::BoostLimit), Some(Unread::NotRequested));
        assert_eq!(t.unread(Family::Prochot), Some(Unread::Unsupported));
        // Read, though every item failed: not "unread".
        let failed =
            sample_with(Family::CoreEnergy, values::<Energy>(vec![Err(ItemError::Busy); 3]));
        let t = translate(&info(), &topology(), &failed, &ErrorCounters::default());
        assert_eq!(t.unread(Family::CoreEnergy), None);
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
        s.readings[Family::Prochot] = values(vec![Ok(true)]);
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.prochot.is_empty());
        assert_eq!(count(&errors, ErrorSource::Broker), 1);
    }

    #[test]
    fn a_value_of_another_kind_drops_the_family_and_counts_broker() {
        let errors = ErrorCounters::default();
        // A boost limit of the kind of PROCHOT: a broker that put one family's values in
        // another's place.
        let s = sample_with(Family::BoostLimit, values(vec![Ok(true), Ok(false), Ok(true)]));
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.boost_limit_hertz.is_empty());
        assert_eq!(count(&errors, ErrorSource::Broker), 1);
        assert_eq!(count(&errors, ErrorSource::Family(Family::BoostLimit)), 0);
        assert_eq!(t.energy_joules.len(), 2, "the other families stay");
    }

    #[test]
    fn energy_source_is_absent_when_no_energy_series_is() {
        let errors = ErrorCounters::default();
        let mut s = sample();
        s.energy_source = Some(EnergySource::Msr);
        s.readings[Family::CoreEnergy] = values::<Energy>(vec![Err(ItemError::Busy); 3]);
        let t = translate(&info(), &topology(), &s, &errors);
        assert!(t.energy_joules.is_empty());
        assert_eq!(t.energy_source, None);
    }
}
