//! The standard `process_*` metrics of this process, with the same meaning as in the Go client,
//! read with as little procfs work as gives them: one read of `self/stat` (CPU time, resident
//! and virtual memory, start time), one listing of `self/fd` (open descriptors), `getrlimit`
//! for the descriptor limit (what `self/limits` shows, without a file), and `btime` of `stat`
//! once for the life of the process (the boot time does not change).
//!
//! `self/stat` and `self/fd` are opened at the first scrape and kept open: each scrape then
//! reads the one from offset 0 and lists the other from its start, without a path walk or an
//! open and a close of each (procfs makes both afresh at offset 0: `seq_read_iter` restarts a
//! file read at another position than the last, and `proc_readfd` lists the table as it is).
//! The process holds these two descriptors for its life, and `process_open_fds` counts them.
//!
//! The procfs root is a parameter so that tests read a fixture tree. Each value that cannot be
//! read is `None`, and its series is left out of the scrape.

use std::fs;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Clock ticks per second of the times in `/proc/<pid>/stat` (`USER_HZ`). The kernel exports
/// them in `USER_HZ`, which is 100 on every architecture Linux supports for this exporter.
const USER_HZ: f64 = 100.0;

/// Room for `<pid>/stat`: 52 numbers of at most 20 digits and a command name of at most 64
/// bytes (`TASK_COMM_LEN` is 16 today) fit in about 1.2 KiB.
const STAT_CAP: usize = 2048;

/// The buffer `self/fd` is listed through: about 170 entries a `getdents64`.
const DIRENT_BUFFER: usize = 4096;

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

/// The calling process as a procfs mount (normally `/proc`) shows it, with the paths it reads
/// made once and the boot time kept once read.
#[derive(Debug)]
pub(crate) struct ProcFs {
    /// `<root>/self/stat`.
    stat: PathBuf,
    /// It, once opened.
    stat_file: OnceLock<fs::File>,
    /// `<root>/self/fd`.
    fd: PathBuf,
    /// It, once opened.
    fd_dir: OnceLock<OwnedFd>,
    /// `<root>/stat`, read for `btime` until it has been read once.
    system_stat: PathBuf,
    boot_time: OnceLock<u64>,
    /// Bytes of a page, which the resident set is counted in.
    page_size: u64,
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
    /// The calling process as the procfs mounted at `root` shows it; `page_size` converts the
    /// resident set from pages to bytes.
    pub(crate) fn new(root: impl Into<PathBuf>, page_size: u64) -> Self {
        let root = root.into();
        ProcFs {
            stat: root.join("self/stat"),
            stat_file: OnceLock::new(),
            fd: root.join("self/fd"),
            fd_dir: OnceLock::new(),
            system_stat: root.join("stat"),
            boot_time: OnceLock::new(),
            page_size,
        }
    }

    /// The calling process through the procfs at `root`, with the machine's page size.
    pub(crate) fn own(root: impl Into<PathBuf>) -> Self {
        let page_size = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
        ProcFs::new(root, page_size)
    }

    /// Reads the metrics of the calling process: `self/stat` and the listing of `self/fd`
    /// each time, `stat` until its `btime` has been read once.
    pub(crate) fn read(&self) -> ProcessStats {
        let stat = self.stat().inspect_err(log_failure).ok();
        let boot_time = match stat {
            Some(_) => self.boot_time().inspect_err(log_failure).ok(),
            None => None,
        };
        ProcessStats {
            cpu_seconds: stat
                .map(|s| (s.utime_ticks.saturating_add(s.stime_ticks)) as f64 / USER_HZ),
            resident_memory_bytes: stat.map(|s| s.rss_pages.saturating_mul(self.page_size)),
            virtual_memory_bytes: stat.map(|s| s.vsize_bytes),
            open_fds: self.open_fds().inspect_err(log_failure).ok(),
            max_fds: max_fds(),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, btime)| btime as f64 + s.starttime_ticks as f64 / USER_HZ),
        }
    }

    fn stat(&self) -> Result<Stat, ProcError> {
        let mut buf = [0u8; STAT_CAP];
        let failed = |source| ProcError::Read { path: self.stat.clone(), source };
        let file = held(&self.stat_file, || fs::File::open(&self.stat)).map_err(failed)?;
        let len = read_line_at_start(file, &mut buf).map_err(failed)?;
        buf.get(..len)
            .and_then(parse_stat)
            .ok_or_else(|| ProcError::Parse { path: self.stat.clone() })
    }

    fn boot_time(&self) -> Result<u64, ProcError> {
        if let Some(&btime) = self.boot_time.get() {
            return Ok(btime);
        }
        let path = &self.system_stat;
        let text = fs::read_to_string(path)
            .map_err(|source| ProcError::Read { path: path.clone(), source })?;
        let btime = text
            .lines()
            .find_map(|line| line.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| ProcError::Parse { path: path.clone() })?;
        Ok(*self.boot_time.get_or_init(|| btime))
    }

    /// Entries of `self/fd`, listed from its start through a buffer on the stack (`.` and `..`
    /// left out).
    fn open_fds(&self) -> Result<u64, ProcError> {
        use rustix::fs::{Mode, OFlags, RawDir, SeekFrom};
        let failed = |errno: rustix::io::Errno| ProcError::Read {
            path: self.fd.clone(),
            source: errno.into(),
        };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let open = || rustix::fs::open(&self.fd, flags, Mode::empty()).map_err(io::Error::from);
        let dir = held(&self.fd_dir, open)
            .map_err(|source| ProcError::Read { path: self.fd.clone(), source })?;
        rustix::fs::seek(dir, SeekFrom::Start(0)).map_err(failed)?;
        let mut buf = [MaybeUninit::<u8>::uninit(); DIRENT_BUFFER];
        let mut entries = RawDir::new(dir, &mut buf);
        let mut count = 0u64;
        while let Some(entry) = entries.next() {
            let entry = entry.map_err(failed)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                count += 1;
            }
        }
        Ok(count)
    }
}

/// The value in `cell`, opened by `open` the first time it is asked for; a failure leaves the
/// cell empty, to be tried again at the next scrape.
fn held<T>(cell: &OnceLock<T>, open: impl FnOnce() -> io::Result<T>) -> io::Result<&T> {
    if let Some(value) = cell.get() {
        return Ok(value);
    }
    let value = open()?;
    Ok(cell.get_or_init(|| value))
}

/// The soft limit on open file descriptors (`RLIMIT_NOFILE`, the "Max open files" line of
/// `self/limits`), `None` when unlimited.
fn max_fds() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Reads a one-line procfs file such as `<pid>/stat` from its start into `buf`: one `pread` at
/// offset 0 when the line fits, more only if the kernel hands it out in pieces. Returns its
/// length.
fn read_line_at_start(file: &fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = 0;
    loop {
        let rest = buf.get_mut(len..).unwrap_or_default();
        if rest.is_empty() {
            return Err(io::Error::other("longer than expected"));
        }
        match file.read_at(rest, len as u64) {
            Ok(0) => return Ok(len),
            Ok(n) => {
                len += n;
                if buf.get(..len).is_some_and(|b| b.ends_with(b"\n")) {
                    return Ok(len);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn log_failure(error: &ProcError) {
    tracing::debug!(error = %error, "process metric unavailable");
}

/// Parses `<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
fn parse_stat(text: &[u8]) -> Option<Stat> {
    let after_comm = text.get(text.iter().rposition(|&b| b == b')')? + 1..)?;
    // Field 3 (state) is the first here, so field N is the (N - 3)th.
    let mut fields = std::str::from_utf8(after_comm).ok()?.split_ascii_whitespace();
    let mut number = |skip: usize| -> Option<u64> { fields.nth(skip)?.parse().ok() };
    let utime_ticks = number(14 - 3)?;
    let stime_ticks = number(0)?;
    let starttime_ticks = number(22 - 15 - 1)?;
    let vsize_bytes = number(0)?;
    let rss_pages = number(0)?;
    Some(Stat { utime_ticks, stime_ticks, starttime_ticks, vsize_bytes, rss_pages })
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
        let stats = ProcFs::new(dir.path(), 4096).read();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: Some(3.75),
                resident_memory_bytes: Some(2048 * 4096),
                virtual_memory_bytes: Some(52_428_800),
                open_fds: Some(7),
                max_fds: max_fds(),
                start_time_seconds: Some(1_700_000_000.0 + 1234.56),
            }
        );
    }

    #[test]
    fn command_name_with_parentheses_does_not_shift_fields() {
        let stat = parse_stat(STAT.as_bytes()).unwrap();
        assert_eq!(stat.utime_ticks, 250);
        assert_eq!(stat.rss_pages, 2048);
    }

    #[test]
    fn max_fds_is_the_soft_descriptor_limit_without_reading_limits() {
        // No `self/limits` in the tree: the limit comes from getrlimit, not a file.
        let dir = fixture(STAT, LIMITS, 3);
        fs::remove_file(dir.path().join("self/limits")).unwrap();
        let stats = ProcFs::new(dir.path(), 4096).read();
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        assert_eq!(stats.max_fds, soft);
        assert_eq!(stats.open_fds, Some(3));
        let limits = fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let shown = line.split_whitespace().nth(3).unwrap();
        assert_eq!(soft.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()), shown);
    }

    #[test]
    fn boot_time_is_read_once_for_the_life_of_the_process() {
        let dir = fixture(STAT, LIMITS, 2);
        let procfs = ProcFs::new(dir.path(), 4096);
        let first = procfs.read();
        fs::remove_file(dir.path().join("stat")).unwrap();
        let second = procfs.read();
        assert_eq!(second.start_time_seconds, Some(1_700_000_000.0 + 1234.56));
        assert_eq!(first.start_time_seconds, second.start_time_seconds);
    }

    #[test]
    fn truncated_stat_omits_its_metrics_but_keeps_the_others() {
        let dir = fixture("4242 (x) S 1 2 3", LIMITS, 2);
        let stats = ProcFs::new(dir.path(), 4096).read();
        assert_eq!(stats.cpu_seconds, None);
        assert_eq!(stats.resident_memory_bytes, None);
        assert_eq!(stats.start_time_seconds, None);
        assert_eq!(stats.open_fds, Some(2));
    }

    #[test]
    fn missing_procfs_gives_no_values() {
        let stats = ProcFs::new("/nonexistent-procfs", 4096).read();
        assert_eq!(stats, ProcessStats { max_fds: max_fds(), ..ProcessStats::default() });
    }

    #[test]
    fn each_read_sees_the_files_as_they_are_now_through_the_descriptors_it_keeps() {
        let dir = fixture(STAT, LIMITS, 2);
        let procfs = ProcFs::new(dir.path(), 4096);
        assert_eq!(procfs.read().resident_memory_bytes, Some(2048 * 4096));
        fs::write(dir.path().join("self/stat"), STAT.replace(" 2048 ", " 1024 ")).unwrap();
        fs::write(dir.path().join("self/fd/9"), "").unwrap();
        let later = procfs.read();
        assert_eq!(later.resident_memory_bytes, Some(1024 * 4096));
        assert_eq!(later.open_fds, Some(3));
    }

    #[test]
    fn own_process_is_readable_from_the_real_procfs() {
        let stats = ProcFs::own("/proc").read();
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
