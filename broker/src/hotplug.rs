//! CPU hotplug while the broker serves, and the fresh start that follows it.
//!
//! What the kernel does, pinned on a real kernel by `device/tests/hotplug.rs`:
//! - a per-CPU perf event (the perf source's `power_core` events) is detached from its CPU when
//!   the CPU goes offline (`perf_event_exit_cpu_context()`, `kernel/events/core.c`; a core-scope
//!   PMU first moves it to a sibling thread that stays online, `rapl.c`'s offline callback) and
//!   nothing adds it back when the CPU comes online: it stands still for good;
//! - an MSR read of an offline CPU fails `ENXIO`, and the descriptor opened before reads again
//!   once the CPU is back (the MSR source follows by itself: `crate::msr`);
//! - a CPU offline when the broker starts is in no core of its topology.
//!
//! The serving broker can open nothing: it holds no capability and its seccomp filter kills
//! `perf_event_open`. A core whose event was lost, or a CPU that was offline at start-up, is
//! therefore brought back by a fresh start: the broker answers the sample in which it sees the
//! CPU back and exits with [`EXIT_FRESH_START`]. Under systemd that status is a clean stop
//! (`SuccessExitStatus=75`), and the socket unit starts the broker again on the exporter's next
//! connection, which waits in the socket's queue meanwhile; in a container the runtime restarts
//! it. The new broker opens every core again and its counts start from 0.
//!
//! Cost: the online list (`/sys/devices/system/cpu/online`, one `pread(2)` of a few bytes
//! through a descriptor opened at start-up) is read at most once per [`CHECK_INTERVAL`], during
//! a sample; nothing is read between samples and no per-CPU file is read at all. A fresh start
//! restarts every core's count from 0 (a counter reset for Prometheus); the core whose event was
//! lost has that reset counted when the loss is seen. The broker starts afresh no sooner than
//! [`MIN_UPTIME`] after its own start, so CPUs toggled in a loop cannot exceed systemd's start
//! limit (5 starts in 10 s). The bound: a returning core's energy is back at the first sample
//! that begins at least [`CHECK_INTERVAL`] after the CPU came online and [`MIN_UPTIME`] after
//! the broker started, plus one start-up of the broker.

use amd_hsmp_device::{Errno, OnlineCpus};
use amd_hsmp_proto::Topology;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The exit status of a broker that stops for a fresh start (`EX_TEMPFAIL`).
pub(crate) const EXIT_FRESH_START: u8 = 75;

/// The least time the broker serves before it starts afresh for a CPU's return.
pub(crate) const MIN_UPTIME: Duration = Duration::from_secs(3);

/// The most often the online list is read.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Why the broker wants a fresh start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Return {
    /// A CPU that was offline when the broker started is online: no core of the topology has
    /// it.
    Offline { cpu: u32 },
    /// The event of core `core` (an index into [`Topology::cores`]) was lost when its CPUs
    /// went offline, and `cpu`, one of its threads, is online again.
    Lost { core: usize, cpu: u32 },
}

/// What the watch has seen, under one lock.
#[derive(Debug, Default)]
struct Seen {
    /// When the online list was last read.
    checked: Option<Instant>,
    /// The online list could not be read (logged once).
    failed: bool,
}

/// Watches the online CPUs against those the broker started with.
#[derive(Debug)]
pub(crate) struct Hotplug {
    online: Box<dyn OnlineCpus>,
    /// The CPUs online just before the topology was read, ascending.
    at_start: Vec<u32>,
    /// Each core's threads, aligned with [`Topology::cores`].
    threads: Vec<Vec<u32>>,
    started: Instant,
    seen: Mutex<Seen>,
    wanted: OnceLock<Return>,
}

impl Hotplug {
    /// Reads the online list through `online` now: call it before the topology is read, so a
    /// CPU that comes online in between counts as a return (one fresh start too many at worst,
    /// never a core missed).
    pub(crate) fn start(online: Box<dyn OnlineCpus>) -> Result<Started, Errno> {
        let at_start = online.online()?;
        Ok(Started { online, at_start })
    }

    /// Looks at the online list, at most once per [`CHECK_INTERVAL`], with `lost` giving the
    /// cores whose counters cannot come back in place (asked only when the list is read);
    /// returns why a fresh start is wanted, once it is (and from then on). The loss itself is
    /// logged where it is seen, with the counted reset.
    pub(crate) fn check(&self, lost: impl FnOnce() -> Vec<usize>, now: Instant) -> Option<Return> {
        if let Some(why) = self.wanted.get() {
            return Some(*why);
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.checked.is_some_and(|at| now.saturating_duration_since(at) < CHECK_INTERVAL) {
            return None;
        }
        seen.checked = Some(now);
        let online = match self.online.online() {
            Ok(online) => online,
            Err(errno) => {
                if !std::mem::replace(&mut seen.failed, true) {
                    tracing::warn!(
                        error = %std::io::Error::from_raw_os_error(errno),
                        "cannot read the online CPU list: CPUs that come back online are not \
                         followed until the broker restarts (later failures are not logged)"
                    );
                }
                return None;
            }
        };
        let is_online = |cpu: &u32| online.binary_search(cpu).is_ok();
        let returned = online.iter().find(|cpu| self.at_start.binary_search(cpu).is_err());
        let why = returned.map(|&cpu| Return::Offline { cpu }).or_else(|| {
            lost().into_iter().find_map(|core| {
                let cpu = self.threads.get(core)?.iter().copied().find(is_online)?;
                Some(Return::Lost { core, cpu })
            })
        })?;
        if now.saturating_duration_since(self.started) < MIN_UPTIME {
            // Seen again at a later sample.
            seen.checked = None;
            return None;
        }
        Some(*self.wanted.get_or_init(|| why))
    }

    /// Why a fresh start is wanted, if it is.
    pub(crate) fn wanted(&self) -> Option<Return> {
        self.wanted.get().copied()
    }
}

/// The online list read at start-up, before the topology.
#[derive(Debug)]
pub(crate) struct Started {
    online: Box<dyn OnlineCpus>,
    at_start: Vec<u32>,
}

impl Started {
    /// The watch over the cores of `topology`, from `now`.
    pub(crate) fn watch(self, topology: &Topology, now: Instant) -> Hotplug {
        Hotplug {
            online: self.online,
            at_start: self.at_start,
            threads: topology.cores.iter().map(|core| core.threads.clone()).collect(),
            started: now,
            seen: Mutex::new(Seen::default()),
            wanted: OnceLock::new(),
        }
    }

    /// The CPUs online at start-up.
    #[cfg(test)]
    pub(crate) fn at_start(&self) -> &[u32] {
        &self.at_start
    }
}

/// Logs why and ends the process with [`EXIT_FRESH_START`]; called by a connection thread once
/// its reply is written.
pub(crate) fn exit(why: Return) -> ! {
    match why {
        Return::Offline { cpu } => tracing::warn!(
            cpu,
            status = EXIT_FRESH_START,
            "a CPU that was offline at start-up is online: exiting for a fresh start that reads \
             its core (systemd's socket unit starts the broker again on the next connection)"
        ),
        Return::Lost { core, cpu } => tracing::warn!(
            core_index = core,
            cpu,
            status = EXIT_FRESH_START,
            "a CPU of a core whose energy event was lost is back online: exiting for a fresh \
             start that opens it again (systemd's socket unit starts the broker again on the \
             next connection)"
        ),
    }
    std::process::exit(i32::from(EXIT_FRESH_START))
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_proto::Core;
    use std::sync::Arc;

    /// An online list set by hand; counts its reads.
    /// The list answered next, and the reads so far.
    type List = (Result<Vec<u32>, Errno>, usize);

    #[derive(Debug, Clone)]
    struct Online(Arc<Mutex<List>>);

    impl Default for Online {
        fn default() -> Online {
            Online(Arc::new(Mutex::new((Ok(Vec::new()), 0))))
        }
    }

    impl Online {
        fn set(&self, cpus: &[u32]) {
            self.0.lock().unwrap().0 = Ok(cpus.to_vec());
        }
        fn fail(&self, errno: Errno) {
            self.0.lock().unwrap().0 = Err(errno);
        }
        fn reads(&self) -> usize {
            self.0.lock().unwrap().1
        }
    }

    impl OnlineCpus for Online {
        fn online(&self) -> Result<Vec<u32>, Errno> {
            let mut state = self.0.lock().unwrap();
            state.1 += 1;
            state.0.clone()
        }
    }

    /// Two cores of two threads: CPUs 0 and 2 are core 0, 1 and 3 core 1; CPU 3 offline.
    fn watch(online: &Online, t0: Instant) -> Hotplug {
        online.set(&[0, 1, 2]);
        let core = |core: u32, threads: Vec<u32>| Core {
            socket: 0,
            core,
            cpu: threads[0],
            apic_id: core * 2,
            threads,
        };
        let topology = Topology {
            sockets: vec![0],
            cores: vec![core(0, vec![0, 2]), core(1, vec![1])],
            ..Topology::default()
        };
        let started = Hotplug::start(Box::new(online.clone())).unwrap();
        assert_eq!(started.at_start(), [0, 1, 2]);
        started.watch(&topology, t0)
    }

    #[test]
    fn a_cpu_offline_at_start_up_that_comes_online_asks_for_a_fresh_start() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        let later = t0 + MIN_UPTIME;
        assert_eq!(hotplug.check(Vec::new, later), None);
        online.set(&[0, 1, 2, 3]);
        let then = later + CHECK_INTERVAL;
        assert_eq!(hotplug.check(Vec::new, then), Some(Return::Offline { cpu: 3 }));
        assert_eq!(hotplug.wanted(), Some(Return::Offline { cpu: 3 }));
    }

    #[test]
    fn a_lost_core_asks_for_a_fresh_start_only_once_one_of_its_cpus_is_back() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        online.set(&[0, 2]);
        let mut now = t0 + MIN_UPTIME;
        assert_eq!(hotplug.check(|| vec![1], now), None, "CPU 1 is still offline");
        online.set(&[0, 1, 2]);
        now += CHECK_INTERVAL;
        assert_eq!(hotplug.check(|| vec![1], now), Some(Return::Lost { core: 1, cpu: 1 }));
    }

    #[test]
    fn a_cpu_that_went_offline_and_came_back_without_loss_changes_nothing() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        let mut now = t0 + MIN_UPTIME;
        for list in [&[0, 2][..], &[0, 1, 2][..], &[0][..], &[0, 1, 2][..]] {
            online.set(list);
            now += CHECK_INTERVAL;
            assert_eq!(hotplug.check(Vec::new, now), None);
        }
        assert_eq!(hotplug.wanted(), None);
    }

    #[test]
    fn the_list_is_read_at_most_once_per_interval_and_never_before_a_sample_asks() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        assert_eq!(online.reads(), 1, "the read at start-up");
        let now = t0 + MIN_UPTIME;
        for ms in 0..100 {
            hotplug.check(Vec::new, now + Duration::from_millis(ms));
        }
        assert_eq!(online.reads(), 2);
        hotplug.check(Vec::new, now + CHECK_INTERVAL);
        assert_eq!(online.reads(), 3);
    }

    #[test]
    fn no_fresh_start_before_the_least_uptime_and_one_as_soon_as_it_is_reached() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        online.set(&[0, 1, 2, 3]);
        assert_eq!(hotplug.check(Vec::new, t0 + Duration::from_millis(10)), None);
        // Not held back by the interval: the return was seen, only the uptime was short.
        assert_eq!(hotplug.check(Vec::new, t0 + MIN_UPTIME), Some(Return::Offline { cpu: 3 }));
    }

    #[test]
    fn an_unreadable_list_asks_for_nothing_and_the_broker_serves_on() {
        let online = Online::default();
        let t0 = Instant::now();
        let hotplug = watch(&online, t0);
        online.fail(libc::EIO);
        assert_eq!(hotplug.check(|| vec![1], t0 + MIN_UPTIME), None);
        online.set(&[0, 1, 2]);
        let back = t0 + MIN_UPTIME + CHECK_INTERVAL;
        assert_eq!(hotplug.check(|| vec![1], back), Some(Return::Lost { core: 1, cpu: 1 }));
    }
}
