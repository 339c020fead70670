//! The standard `process_*` metrics of this process, read from procfs (`self/stat`,
//! `self/limits`, `self/fd`, and `btime` from `stat`), with the same meaning as in the Go client.
//!
//! The procfs root is a parameter so that tests read a fixture tree. Each value that cannot be
//! read is `None`, and its series is left out of the scrape.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Clock ticks per second of the times in `/proc/<pid>/stat` (`USER_HZ`). The kernel exports
/// them in `USER_HZ`, which is 100 on every architecture Linux supports for this exporter.
const USER_HZ: f64 = 100.0;

/// One reading of the process metrics; `None` where procfs did not give a value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_memory_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_memory_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// Soft limit on open file descriptors; `None` when unlimited or unreadable.
    pub max_fds: Option<u64>,
    /// Start time since the Unix epoch, seconds.
    pub start_time_seconds: Option<f64>,
}

/// Why one procfs file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file did not have the expected layout.
    #[error("unexpected content in {path}")]
    Parse {
        /// The file.
        path: PathBuf,
    },
}

/// A procfs mount, normally `/proc`.
#[derive(Debug, Clone)]
pub(crate) struct ProcFs {
    root: PathBuf,
}

/// The fields of `<pid>/stat` the metrics use.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    utime_ticks: u64,
    stime_ticks: u64,
    starttime_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

impl ProcFs {
    /// A procfs mounted at `root`.
    pub(crate) fn new(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    /// Reads the metrics of the calling process (`<root>/self`); `page_size` converts the
    /// resident set from pages to bytes.
    pub(crate) fn read_self(&self, page_size: u64) -> ProcessStats {
        let stat = self.stat().inspect_err(log_failure).ok();
        let boot_time = self.boot_time().inspect_err(log_failure).ok();
        ProcessStats {
            cpu_seconds: stat
                .map(|s| (s.utime_ticks.saturating_add(s.stime_ticks)) as f64 / USER_HZ),
            resident_memory_bytes: stat.map(|s| s.rss_pages.saturating_mul(page_size)),
            virtual_memory_bytes: stat.map(|s| s.vsize_bytes),
            open_fds: self.open_fds().inspect_err(log_failure).ok(),
            max_fds: self.max_fds().inspect_err(log_failure).ok().flatten(),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, btime)| btime as f64 + s.starttime_ticks as f64 / USER_HZ),
        }
    }

    fn read(&self, relative: &str) -> Result<(PathBuf, String), ProcError> {
        let path = self.root.join(relative);
        match fs::read_to_string(&path) {
            Ok(text) => Ok((path, text)),
            Err(source) => Err(ProcError::Read { path, source }),
        }
    }

    fn stat(&self) -> Result<Stat, ProcError> {
        let (path, text) = self.read("self/stat")?;
        parse_stat(&text).ok_or(ProcError::Parse { path })
    }

    fn boot_time(&self) -> Result<u64, ProcError> {
        let (path, text) = self.read("stat")?;
        text.lines()
            .find_map(|line| line.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or(ProcError::Parse { path })
    }

    fn max_fds(&self) -> Result<Option<u64>, ProcError> {
        let (path, text) = self.read("self/limits")?;
        let soft = text
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or(ProcError::Parse { path: path.clone() })?;
        if soft == "unlimited" {
            return Ok(None);
        }
        soft.parse().map(Some).map_err(|_| ProcError::Parse { path })
    }

    fn open_fds(&self) -> Result<u64, ProcError> {
        let path = self.root.join("self/fd");
        let entries =
            fs::read_dir(&path).map_err(|source| ProcError::Read { path: path.clone(), source })?;
        let mut count = 0u64;
        for entry in entries {
            entry.map_err(|source| ProcError::Read { path: path.clone(), source })?;
            count += 1;
        }
        Ok(count)
    }
}

fn log_failure(error: &ProcError) {
    tracing::debug!(error = %error, "process metric unavailable");
}

/// Parses `<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_comm = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here, so field N is index N - 3.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        starttime_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// Reads the process metrics of this process from `/proc`.
pub(crate) fn read_own(proc_root: &Path) -> ProcessStats {
    let page_size = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
    ProcFs::new(proc_root).read_self(page_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (amd-hsmp (exp) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 \
                        250 125 0 0 20 0 4 0 123456 52428800 2048 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 17610 0 0 0 17 1 0 0 0 0 0\n";

    fn fixture(stat: &str, limits: &str, fds: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("self/fd")).unwrap();
        fs::write(dir.path().join("self/stat"), stat).unwrap();
        fs::write(dir.path().join("self/limits"), limits).unwrap();
        for fd in 0..fds {
            fs::write(dir.path().join(format!("self/fd/{fd}")), "").unwrap();
        }
        fs::write(dir.path().join("stat"), "cpu  1 2 3 4\nbtime 1700000000\nprocesses 9\n")
            .unwrap();
        dir
    }

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 524288               files     \n";

    #[test]
    fn reads_every_process_metric_from_a_procfs_tree() {
        let dir = fixture(STAT, LIMITS, 7);
        let stats = ProcFs::new(dir.path()).read_self(4096);
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: Some(3.75),
                resident_memory_bytes: Some(2048 * 4096),
                virtual_memory_bytes: Some(52_428_800),
                open_fds: Some(7),
                max_fds: Some(1024),
                start_time_seconds: Some(1_700_000_000.0 + 1234.56),
            }
        );
    }

    #[test]
    fn command_name_with_parentheses_does_not_shift_fields() {
        let stat = parse_stat(STAT).unwrap();
        assert_eq!(stat.utime_ticks, 250);
        assert_eq!(stat.rss_pages, 2048);
    }

    #[test]
    fn unlimited_open_files_omits_max_fds_only() {
        let limits =
            LIMITS.replace("1024                 524288", "unlimited            unlimited");
        let dir = fixture(STAT, &limits, 3);
        let stats = ProcFs::new(dir.path()).read_self(4096);
        assert_eq!(stats.max_fds, None);
        assert_eq!(stats.open_fds, Some(3));
    }

    #[test]
    fn truncated_stat_omits_its_metrics_but_keeps_the_others() {
        let dir = fixture("4242 (x) S 1 2 3", LIMITS, 2);
        let stats = ProcFs::new(dir.path()).read_self(4096);
        assert_eq!(stats.cpu_seconds, None);
        assert_eq!(stats.resident_memory_bytes, None);
        assert_eq!(stats.start_time_seconds, None);
        assert_eq!(stats.max_fds, Some(1024));
        assert_eq!(stats.open_fds, Some(2));
    }

    #[test]
    fn missing_procfs_gives_no_values() {
        let stats = ProcFs::new("/nonexistent-procfs").read_self(4096);
        assert_eq!(stats, ProcessStats::default());
    }

    #[test]
    fn own_process_is_readable_from_the_real_procfs() {
        let stats = read_own(Path::new("/proc"));
        assert!(stats.resident_memory_bytes.unwrap() > 0);
        assert!(stats.virtual_memory_bytes.unwrap() >= stats.resident_memory_bytes.unwrap());
        assert!(stats.open_fds.unwrap() >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = stats.start_time_seconds.unwrap();
        assert!(start <= now + 1.0 && start > now - 86_400.0 * 365.0, "start {start} now {now}");
    }
}
