//! What the per-core energy counters the broker keeps itself (the perf and MSR sources, the
//! fallbacks to HSMP RAPL) have in common: how the sampler reads them, their counted resets,
//! the bound on a core's power their restart rules share, and the clocks they measure the time
//! between two readings on.

use amd_hsmp_device::Errno;
use amd_hsmp_proto::{Core, Energy, EnergySource, ItemError, Topology};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The most power one core can draw, in watts: the broker's one bound on a core's power. It
/// bounds how fast a core's counter can wrap (the MSR source's `wrap_window`), what a reading
/// may add before it is taken for a restarted counter (both sources), and, in `--check`, which
/// energy rates are implausible. No EPYC core comes near it: the largest parts' package power
/// (500 W) spread over their fewest cores (16) is 31 W a core, and a single core at full boost
/// draws well under 20 W.
pub(crate) const MAX_CORE_WATTS: f64 = 100.0;

/// The most time a core's counter may seem to run ahead of the clock at [`MAX_CORE_WATTS`]
/// before it is taken for a restart: 1 s (100 J); the MSR source takes at most an eighth of its
/// wrap window (coarse units, where a wrap takes about a second). A counter that advances in
/// steps, readings a few microseconds apart, and a simulated machine that adds a few joules at
/// once are not restarts.
pub(crate) const RESTART_TOLERANCE: Duration = Duration::from_secs(1);

/// The clock a source measures the time between two readings of a core on: the time since
/// some fixed start. The MSR source's is [`BootTime`], which counts a suspend, so a suspend
/// longer than a wrap cannot hide one; the perf source's is [`Running`], which does not, since
/// a suspended core draws nothing. A test injects its own to emulate a suspend.
pub(crate) trait Clock: Debug + Send + Sync {
    /// Now; an errno if the clock cannot be read.
    fn now(&self) -> Result<Duration, Errno>;
}

/// `CLOCK_BOOTTIME`: monotonic and, unlike `CLOCK_MONOTONIC` (`std::time::Instant`), advancing
/// while the machine is suspended (S3 or s2idle). Served by the vDSO; the seccomp filter admits
/// `clock_gettime` for any clock all the same.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BootTime;

impl Clock for BootTime {
    fn now(&self) -> Result<Duration, Errno> {
        let now = rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Boottime)
            .map_err(|e| e.raw_os_error())?;
        Duration::try_from(now).map_err(|_| libc::EOVERFLOW)
    }
}

/// `CLOCK_MONOTONIC`: stops while the machine is suspended, when a core draws nothing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Running;

impl Clock for Running {
    fn now(&self) -> Result<Duration, Errno> {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        Duration::try_from(now).map_err(|_| libc::EOVERFLOW)
    }
}

/// A clock that moves only when told: a suspend, a stop or hours of running in a statement.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeClock(std::sync::Arc<Mutex<Duration>>);

#[cfg(test)]
impl FakeClock {
    pub(crate) fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Result<Duration, Errno> {
        Ok(*self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Per-core energy counters the broker keeps itself (a fallback to HSMP RAPL).
pub(crate) trait CoreCounters: Debug + Send + Sync {
    /// Reads core `index` (an index into [`Topology::cores`]).
    fn read(&self, index: usize) -> Result<Energy, ItemError>;
    /// Counter resets since the broker started.
    fn resets(&self) -> u64;
    /// Logs the resets not logged yet.
    fn log_resets(&self);
    /// What the readings are reported as.
    fn source(&self) -> EnergySource;
    /// The cores (indices into [`Topology::cores`]) whose counters cannot count again while
    /// the broker serves: only a fresh start opens them again ([`crate::hotplug`]).
    fn lost(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// Counter resets of a broker-kept source: the total, and the cores not yet logged with why.
#[derive(Debug)]
pub(crate) struct Resets<R> {
    total: AtomicU64,
    pub(crate) unlogged: Mutex<Vec<(usize, R)>>,
}

impl<R> Default for Resets<R> {
    fn default() -> Self {
        Resets { total: AtomicU64::new(0), unlogged: Mutex::new(Vec::new()) }
    }
}

impl<R> Resets<R> {
    /// Counts a reset of core `index`.
    pub(crate) fn count(&self, index: usize, why: R) {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.unlogged.lock().unwrap_or_else(PoisonError::into_inner).push((index, why));
    }

    /// Resets since the broker started.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Hands the resets not yet logged, and the total, to `log`, if there are any.
    pub(crate) fn log(&self, log: impl FnOnce(&[(usize, R)], u64)) {
        let cores =
            std::mem::take(&mut *self.unlogged.lock().unwrap_or_else(PoisonError::into_inner));
        if !cores.is_empty() {
            log(&cores, self.total());
        }
    }
}

/// Opens one counter per core of `topology` with `open`, a core that fails kept as its error.
/// `Err` with the first core's errno (`EIO` for an error that carries none) when no core
/// opened; when only some failed, one warning names how many and the first, `what` saying what
/// could not be opened.
pub(crate) fn open_cores<T>(
    topology: &Topology,
    what: &str,
    mut open: impl FnMut(&Core) -> Result<T, ItemError>,
) -> Result<Vec<Result<T, ItemError>>, Errno> {
    let cores: Vec<_> = topology.cores.iter().map(&mut open).collect();
    let mut failed =
        topology.cores.iter().zip(&cores).filter_map(|(c, r)| Some((c.cpu, *r.as_ref().err()?)));
    if let Some((cpu, error)) = failed.next() {
        let failed = 1 + failed.count();
        if failed == cores.len() {
            return Err(match error {
                ItemError::Io { errno } => errno,
                _ => libc::EIO,
            });
        }
        tracing::warn!(
            failed,
            cores = cores.len(),
            first_cpu = cpu,
            %error,
            "some cores' {what}; their energy will be missing",
        );
    }
    Ok(cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_counts_from_boot_like_the_uptime() {
        let uptime = || -> f64 {
            let text = std::fs::read_to_string("/proc/uptime").unwrap();
            text.split_whitespace().next().unwrap().parse().unwrap()
        };
        let before = uptime();
        let now = BootTime.now().unwrap().as_secs_f64();
        let after = uptime();
        // /proc/uptime is CLOCK_BOOTTIME in hundredths of a second.
        assert!(before - 0.01 <= now && now <= after + 0.01, "{before} <= {now} <= {after}");
    }
}
