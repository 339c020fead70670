//! What the per-core energy counters the broker keeps itself (the perf and MSR sources, the
//! fallbacks to HSMP RAPL) have in common: how the sampler reads them, and their counted resets.

use amd_hsmp_device::Errno;
use amd_hsmp_proto::{Core, Energy, EnergySource, ItemError, Topology};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

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
