//! Energy per workload (`--collector.core-owner` with core energy): one counter per workload,
//! `amd_hsmp_workload_core_energy_joules_total`, and the energy given to nobody,
//! `amd_hsmp_workload_unattributed_joules_total{reason}`.
//!
//! The rule, as `docs/metrics.md` states it: at each sample (a broker answer with core energy,
//! and the owners of the walk served with it; a scrape's, or one taken every
//! `--collector.core-owner.sample-interval`), each core's energy since its previous sample is
//! added to the workload that held the core at both samples. Otherwise it is added to nobody
//! and counted by [`Reason`]: the core changed hands, nobody held it, its owner was not known
//! at one of the two samples, or its counter restarted in between (the counter went back, or
//! the broker that keeps it is another instance or counted a reset). A sample is ordered by
//! when the broker read each core (`Sample::read_at_us`), so that a scrape served an
//! older answer than one already taken adds nothing, and two scrapes served the same answer
//! add it once.
//!
//! A workload's series lives while it holds a core at a sample, and for the linger
//! (`--collector.core-owner.linger`, [`DEFAULT_LINGER`] by default) after the last sample at
//! which it held one, so that its last value is scraped after it ends. New workloads per sample
//! are at most the cores, and the ledger ([`Ledger`]) holds at most [`MAX_WORKLOADS`]: past it,
//! the workloads that ended longest ago go first, and are counted. The state is the process's
//! own: a restart is a counter reset.

use crate::owner::Owner;
use crate::translate::{CoreLabel, Telemetry};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default of `--collector.core-owner.linger`: how long a workload's counter is exported after
/// the last sample at which it held a core.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "the flag's default is its text; a test ties the two")
)]
pub(crate) const DEFAULT_LINGER: Duration = Duration::from_secs(5 * 60);

/// Workloads the ledger holds at most, live and lingering: far above a node's live workloads
/// (at most one a core), so that only a churn of thousands of short workloads within the linger
/// reaches it, and then the ones that ended longest ago go first.
pub(crate) const MAX_WORKLOADS: usize = 16_384;

/// Why an interval's energy was given to no workload: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The core's owner at the interval's end differs from its owner at its start.
    ChangedHands,
    /// No workload held the core at either end.
    Unowned,
    /// The cgroup hierarchy was not read at one of the two ends.
    OwnerUnknown,
    /// The core's counter restarted within the interval: the energy counted since.
    Reset,
}

impl Reason {
    /// Every reason, in exposition order.
    pub(crate) const ALL: [Reason; 4] =
        [Reason::ChangedHands, Reason::OwnerUnknown, Reason::Reset, Reason::Unowned];

    /// The label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reason::ChangedHands => "changed-hands",
            Reason::Unowned => "unowned",
            Reason::OwnerUnknown => "owner-unknown",
            Reason::Reset => "reset",
        }
    }

    fn index(self) -> usize {
        match self {
            Reason::ChangedHands => 0,
            Reason::OwnerUnknown => 1,
            Reason::Reset => 2,
            Reason::Unowned => 3,
        }
    }
}

/// Who held a core at a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    /// No workload: the core is unassigned.
    Nobody,
    /// The hierarchy was not read for this sample.
    Unknown,
    /// This workload.
    Workload(Arc<Owner>),
}

/// One core's last sample.
#[derive(Debug, Clone)]
struct Last {
    joules: f64,
    read_at_us: u64,
    epoch: Option<(u64, u64)>,
    holder: Holder,
}

/// One workload's counter.
#[derive(Debug, Clone)]
struct Account {
    joules: f64,
    /// The last sample at which it held a core.
    held_at: Instant,
    /// The cores it held then.
    cores: u32,
    /// Its cores' power over the intervals that ended at sample `watts_at`, in watts.
    watts: f64,
    watts_at: Option<Instant>,
}

impl Account {
    fn new(held_at: Instant) -> Account {
        Account { joules: 0.0, held_at, cores: 0, watts: 0.0, watts_at: None }
    }
}

/// One workload as a scrape sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Workload {
    /// Who it is.
    pub(crate) owner: Arc<Owner>,
    /// Its counter, in joules.
    pub(crate) joules: f64,
    /// The cores it held at the latest sample; 0 once it holds none (it lingers).
    pub(crate) cores: u32,
    /// Its cores' power over the intervals that ended at the latest sample, in watts, where it
    /// held them at both ends.
    pub(crate) watts: Option<f64>,
}

/// The counters one scrape exports.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkloadReport {
    /// Each workload, ordered by owner path.
    pub(crate) workloads: Vec<Workload>,
    /// The energy given to nobody, by reason in [`Reason::ALL`]'s order; empty before the
    /// first sample.
    pub(crate) unattributed: Vec<(Reason, f64)>,
    /// Workloads dropped before their linger ended because the ledger was full, since the
    /// start.
    pub(crate) evicted: u64,
    /// How long before the report the latest sample with owners was taken.
    pub(crate) latest_sample_age: Option<Duration>,
}

/// The owners a sample was read with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owners<'a> {
    /// The walk served with the sample: each assigned core's owner.
    Known(&'a [(CoreLabel, Arc<Owner>)]),
    /// No walk was served with it (the hierarchy could not be read in time).
    Unknown,
}

/// The per-workload counters and the state they are kept from.
#[derive(Debug)]
pub(crate) struct Ledger {
    linger: Duration,
    capacity: usize,
    cores: HashMap<CoreLabel, Last>,
    accounts: HashMap<Arc<Owner>, Account>,
    unattributed: [f64; 4],
    /// Whether a sample with energy was taken.
    sampled: bool,
    /// The latest sample taken with its owners known: a workload that held a core then is live.
    latest: Option<Instant>,
    evicted: u64,
}

impl Ledger {
    /// An empty ledger whose workloads linger for `linger` after they last held a core, at most
    /// [`MAX_WORKLOADS`].
    pub(crate) fn new(linger: Duration) -> Ledger {
        Ledger::with_capacity(linger, MAX_WORKLOADS)
    }

    fn with_capacity(linger: Duration, capacity: usize) -> Ledger {
        Ledger {
            linger,
            capacity,
            cores: HashMap::new(),
            accounts: HashMap::new(),
            unattributed: [0.0; 4],
            sampled: false,
            latest: None,
            evicted: 0,
        }
    }

    /// Takes one sample at `now`: the core energy of `telemetry` with the owners it was read
    /// with. A core read no later than its last sample adds nothing.
    pub(crate) fn sample(&mut self, now: Instant, telemetry: &Telemetry, owners: Owners<'_>) {
        if telemetry.energy_joules.is_empty() {
            return;
        }
        self.sampled = true;
        // Each core's owner, `None` where the hierarchy was not read for this sample.
        let by_core: Option<HashMap<CoreLabel, &Arc<Owner>>> = match owners {
            Owners::Known(owners) => Some(owners.iter().map(|(c, o)| (*c, o)).collect()),
            Owners::Unknown => None,
        };
        let holder_of = |core: &CoreLabel| match &by_core {
            None => Holder::Unknown,
            Some(by_core) => by_core
                .get(core)
                .map_or(Holder::Nobody, |owner| Holder::Workload(Arc::clone(owner))),
        };
        let epoch = telemetry.energy_epoch;
        for (i, (core, joules)) in telemetry.energy_joules.iter().enumerate() {
            let Some(read_at_us) = telemetry.energy_read_at_us.get(i).copied().flatten() else {
                continue;
            };
            if !joules.is_finite() || *joules < 0.0 {
                continue;
            }
            let holder = holder_of(core);
            let now_last = Last { joules: *joules, read_at_us, epoch, holder };
            match self.cores.get_mut(core) {
                Some(last) if last.read_at_us >= read_at_us => {}
                Some(last) => {
                    let previous = std::mem::replace(last, now_last);
                    let current = last.clone();
                    self.attribute(now, &previous, &current);
                }
                None => {
                    self.cores.insert(*core, now_last);
                }
            }
        }
        if let Owners::Known(owners) = owners {
            self.latest = Some(self.latest.map_or(now, |l| l.max(now)));
            for (_, owner) in owners {
                let account =
                    self.accounts.entry(Arc::clone(owner)).or_insert_with(|| Account::new(now));
                // A scrape that began before the one that last counted this workload's cores
                // says nothing newer of them.
                if now < account.held_at {
                    continue;
                }
                if account.held_at != now {
                    account.cores = 0;
                    account.held_at = now;
                }
                account.cores += 1;
            }
        }
        self.expire(now);
    }

    /// Adds the interval from `previous` to `current` of one core to its workload or to a
    /// reason.
    fn attribute(&mut self, now: Instant, previous: &Last, current: &Last) {
        let delta = current.joules - previous.joules;
        if current.epoch != previous.epoch || delta < 0.0 {
            // The counter restarted: what it holds now was counted since, or the increase where
            // it did not go back (another core's reset, which the broker does not place).
            let since = if delta < 0.0 { current.joules } else { delta };
            self.unattributed[Reason::Reset.index()] += since;
            return;
        }
        let reason = match (&previous.holder, &current.holder) {
            (Holder::Workload(a), Holder::Workload(b)) if a == b => {
                // An account is kept while its workload held a core at the latest sample, so
                // it is there unless the samples came more than the linger apart.
                let held_at = self.latest.unwrap_or(now);
                let account =
                    self.accounts.entry(Arc::clone(a)).or_insert_with(|| Account::new(held_at));
                account.joules += delta;
                if account.watts_at != Some(now) {
                    account.watts = 0.0;
                    account.watts_at = Some(now);
                }
                let seconds = (current.read_at_us - previous.read_at_us) as f64 / 1e6;
                account.watts += delta / seconds;
                return;
            }
            (Holder::Unknown, _) | (_, Holder::Unknown) => Reason::OwnerUnknown,
            (Holder::Nobody, Holder::Nobody) => Reason::Unowned,
            _ => Reason::ChangedHands,
        };
        self.unattributed[reason.index()] += delta;
    }

    /// Drops the workloads that did not hold a core at the latest sample and whose linger ended
    /// by `now`, then, past the capacity, those that held a core longest ago.
    fn expire(&mut self, now: Instant) {
        let (linger, latest) = (self.linger, self.latest);
        self.accounts.retain(|_, a| {
            Some(a.held_at) == latest || now.saturating_duration_since(a.held_at) <= linger
        });
        if self.accounts.len() > self.capacity {
            let mut by_age: Vec<(Instant, Arc<Owner>)> =
                self.accounts.iter().map(|(o, a)| (a.held_at, Arc::clone(o))).collect();
            by_age.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.path.cmp(&b.1.path)));
            let excess = self.accounts.len() - self.capacity;
            for (_, owner) in by_age.into_iter().take(excess) {
                self.accounts.remove(&owner);
            }
            self.evicted += excess as u64;
            tracing::warn!(
                dropped = excess,
                dropped_since_start = self.evicted,
                capacity = self.capacity,
                "core-owner: more workloads held cores within --collector.core-owner.linger than \
                 the exporter keeps; the counters of those that ended longest ago are dropped \
                 before their linger ends"
            );
        }
    }

    /// The counters to export at `now`.
    pub(crate) fn report(&mut self, now: Instant) -> WorkloadReport {
        self.expire(now);
        let latest = self.latest;
        let mut workloads: Vec<Workload> = self
            .accounts
            .iter()
            .map(|(owner, a)| {
                let holding = Some(a.held_at) == latest;
                Workload {
                    owner: Arc::clone(owner),
                    joules: a.joules,
                    cores: if holding { a.cores } else { 0 },
                    watts: (holding && a.watts_at == latest).then_some(a.watts),
                }
            })
            .collect();
        workloads.sort_by(|a, b| {
            a.owner.path.cmp(&b.owner.path).then_with(|| a.joules.total_cmp(&b.joules))
        });
        let unattributed = if self.sampled {
            Reason::ALL.iter().map(|&r| (r, self.unattributed[r.index()])).collect()
        } else {
            Vec::new()
        };
        let latest_sample_age = latest.map(|l| now.saturating_duration_since(l));
        WorkloadReport { workloads, unattributed, evicted: self.evicted, latest_sample_age }
    }
}

#[cfg(test)]
mod tests;
