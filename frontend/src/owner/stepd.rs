//! The numeric id of a Slurm job whose cgroup is keyed by its SLUID (Slurm 26.05 without
//! `CgroupJobIdPaths=yes`), read where the node states it: the process title of the job's
//! `slurmstepd`.
//!
//! Where each fact comes from (Slurm's source, slurm-26-05-3-1; the same in 22.05 to 26.05):
//! - each step's stepd moves itself into `<job>/step_<step>/slurm`, its users' tasks into
//!   `<job>/step_<step>/user/...` (`cgroup_p_step_create` in `src/plugins/cgroup/v2/cgroup_v2.c`:
//!   "step_x/slurm (for slurm processes, slurmstepd)"); the leaf is Slurm's, written by root
//!   alone, so a user's process cannot stand in it;
//! - the stepd's title is `slurmstepd: [<job id>.<step>]` (`_set_job_log_prefix` in
//!   `src/slurmd/slurmstepd/slurmstepd.c`, `" stepmgr"` before the `]` for a step manager;
//!   `src/common/setproctitle.c` writes the `"%s: "` prefix), and `log_build_step_id_str` prints
//!   the numeric job id even where the directory is keyed by the SLUID;
//! - a SLUID names one job record for good: a requeued job gets a new one
//!   (`job_record_set_sluid` in `src/common/job_record.c`), so a SLUID's job id is read once and
//!   kept while walks see the SLUID.
//!
//! How it is read, bounded and without trusting what is read: the first PIDs of the leaf's
//! `cgroup.procs`; each PID's `/proc/<pid>` directory held open, so that its `cgroup` and
//! `cmdline` are of that process and never of one that reused its PID; the process's cgroup
//! must be the leaf and its title that step's, or the job stays unresolved. Every file is
//! opened without blocking, refused unless regular, and read to [`MAX_READ`] bytes at most.
//! A job whose stepd cannot be seen (`hidepid`, systemd's `ProtectProc=invisible`, another PID
//! namespace, a stepd gone) keeps its `slurm_sluid` and gets no `hpc_job`; the scrape counts
//! it and the log says why, once per cause.

use super::{Hierarchy, subdirectories, vanished};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// Steps of one job tried at most.
const MAX_STEPS: usize = 8;
/// PIDs of one step's `slurm` leaf tried at most.
const MAX_PIDS: usize = 4;
/// Bytes read at most of a `cgroup.procs`, a `/proc/<pid>/cgroup` or a `/proc/<pid>/cmdline`:
/// each is read for its beginning only.
pub(crate) const MAX_READ: u64 = 4096;

/// Why a SLUID job's numeric id could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// No step directory, or no PID in any step's `slurm` leaf: no stepd (yet, or any more).
    NoStepd,
    /// The stepd's `/proc/<pid>` cannot be seen: `hidepid`, `ProtectProc=invisible`, another
    /// PID namespace, or the process has ended.
    Hidden,
    /// The process listed is not in the leaf by its own `/proc/<pid>/cgroup` (moved, or this
    /// process sees the hierarchy through a cgroup namespace).
    Elsewhere,
    /// Its title is not `slurmstepd: [<job id>.<step>]` of the step whose leaf it is in.
    NotAStepd,
    /// Another read error.
    Read(io::ErrorKind),
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolved::NoStepd => f.write_str("no slurmstepd in the job's step_*/slurm cgroups"),
            Unresolved::Hidden => f.write_str(
                "the slurmstepd's /proc/<pid> cannot be seen (hidepid, ProtectProc=invisible, another PID namespace, or it ended)",
            ),
            Unresolved::Elsewhere => f.write_str(
                "the process listed is not in that cgroup by its /proc/<pid>/cgroup (a cgroup namespace?)",
            ),
            Unresolved::NotAStepd => {
                f.write_str("the process's title is not \"slurmstepd: [<job id>.<step>]\" of that step")
            }
            Unresolved::Read(kind) => write!(f, "read error: {}", io::Error::from(*kind)),
        }
    }
}

/// Reads and keeps the numeric ids of SLUID-keyed jobs, for the walk thread.
#[derive(Debug)]
pub(crate) struct Stepds {
    /// The procfs the stepds are read in (`--path.procfs`).
    procfs: PathBuf,
    /// SLUIDs read, kept while walks see them.
    known: HashMap<Box<[u8]>, u32>,
    buf: Vec<u8>,
    /// The cause last logged, while some job is unresolved.
    last: Option<Unresolved>,
}

impl Stepds {
    /// Reads stepds in the procfs at `procfs`.
    pub(crate) fn new(procfs: PathBuf) -> Stepds {
        Stepds { procfs, known: HashMap::new(), buf: Vec::new(), last: None }
    }

    /// Gives `hierarchy` (one walk of the cgroup hierarchy at `root`) the numeric id of each
    /// SLUID-keyed job that restricts in it, read now or kept from an earlier walk; logs why
    /// one cannot be read when the cause changes, and once when all are read again.
    pub(crate) fn resolve(&mut self, root: &Path, hierarchy: &mut Hierarchy) {
        let mut seen: HashMap<Box<[u8]>, u32> = HashMap::new();
        let mut first_failure: Option<(Vec<u8>, Unresolved)> = None;
        let mut tried: Vec<&[u8]> = Vec::new();
        for r in hierarchy.restrictions.iter().filter(|r| !r.unread) {
            let Some((job_dir, sluid)) = super::identity::sluid_job(&r.path) else { continue };
            if seen.contains_key(sluid) || tried.contains(&sluid) {
                continue;
            }
            let id = match self.known.get(sluid) {
                Some(&id) => Ok(id),
                None => self.job_id(root, job_dir),
            };
            match id {
                Ok(id) => {
                    seen.insert(sluid.into(), id);
                }
                Err(cause) => {
                    tried.push(sluid);
                    first_failure.get_or_insert_with(|| (job_dir.to_vec(), cause));
                }
            }
        }
        self.log(first_failure.as_ref().map(|(dir, cause)| (dir.as_slice(), *cause)));
        self.known.clone_from(&seen);
        hierarchy.slurm_jobs = seen;
    }

    fn log(&mut self, failure: Option<(&[u8], Unresolved)>) {
        let cause = failure.map(|(_, cause)| cause);
        if self.last == cause {
            return;
        }
        self.last = cause;
        match failure {
            Some((job, cause)) => tracing::warn!(
                job = %String::from_utf8_lossy(job),
                %cause,
                "core-owner: the numeric id of a Slurm job whose cgroup is named by its SLUID cannot be read from its slurmstepd's title; \
                 its owner series carry slurm_sluid and no hpc_job, counted in amd_hsmp_core_owner_unresolved_slurm_jobs; \
                 set CgroupJobIdPaths=yes in cgroup.conf (Slurm 26.05.2 and later) or let this process see the stepds (docs/metrics.md); \
                 logged again only when the cause changes"
            ),
            None => tracing::info!("core-owner: every SLUID-named Slurm job's id is read again"),
        }
    }

    /// The job id of the job directory at `job_dir` (from the hierarchy root), from the first
    /// stepd of its steps whose title can be read.
    fn job_id(&mut self, root: &Path, job_dir: &[u8]) -> Result<u32, Unresolved> {
        let dir = root.join(OsStr::from_bytes(job_dir.strip_prefix(b"/").unwrap_or(job_dir)));
        let steps = match subdirectories(&dir) {
            Ok(Some(names)) => names,
            Ok(None) => return Err(Unresolved::NoStepd),
            Err(super::OwnerError::Read { source, .. }) => {
                return Err(Unresolved::Read(source.kind()));
            }
            Err(_) => return Err(Unresolved::Read(io::ErrorKind::Other)),
        };
        let mut cause = Unresolved::NoStepd;
        let steps = steps.iter().filter_map(|n| n.as_bytes().strip_prefix(b"step_"));
        for step in steps.take(MAX_STEPS) {
            let leaf = [job_dir, b"/step_", step, b"/slurm"].concat();
            let procs = dir.join(OsStr::from_bytes(&leaf[job_dir.len() + 1..]));
            let pids = match self.read(rustix::fs::CWD, &procs.join("cgroup.procs")) {
                Ok(()) => pids(&self.buf),
                Err(e) if vanished(&e) => continue,
                Err(e) => {
                    cause = Unresolved::Read(e.kind());
                    continue;
                }
            };
            for pid in pids {
                match self.title(pid, &leaf, step) {
                    Ok(id) => return Ok(id),
                    Err(c) => cause = c,
                }
            }
        }
        Err(cause)
    }

    /// The job id in the title of process `pid`, if it is in the cgroup `leaf` (from the
    /// hierarchy root) and its title is step `step`'s stepd's.
    fn title(&mut self, pid: u32, leaf: &[u8], step: &[u8]) -> Result<u32, Unresolved> {
        use rustix::fs::{Mode, OFlags};
        let hidden = |e: &io::Error| {
            vanished(e)
                || super::denied(e)
                || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
        };
        let fail = |e: io::Error| {
            if hidden(&e) { Unresolved::Hidden } else { Unresolved::Read(e.kind()) }
        };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let process = rustix::fs::open(self.procfs.join(pid.to_string()), flags, Mode::empty())
            .map_err(|e| fail(e.into()))?;
        self.read(&process, Path::new("cgroup")).map_err(fail)?;
        let in_leaf = self
            .buf
            .split(|&b| b == b'\n')
            .filter_map(|line| line.strip_prefix(b"0::"))
            .any(|path| path == leaf);
        if !in_leaf {
            return Err(Unresolved::Elsewhere);
        }
        self.read(&process, Path::new("cmdline")).map_err(fail)?;
        let title = self.buf.split(|&b| b == 0).next().unwrap_or_default();
        job_of_title(title, step).ok_or(Unresolved::NotAStepd)
    }

    fn read(&mut self, dir: impl std::os::fd::AsFd, path: &Path) -> io::Result<()> {
        amd_hsmp_web::files::read_regular_prefix_at(dir, path, MAX_READ, &mut self.buf)
    }
}

/// The first PIDs of a `cgroup.procs` prefix: whole lines only (the last may be cut), zero
/// (a process of another PID namespace) and what does not parse left out.
fn pids(procs: &[u8]) -> Vec<u32> {
    let whole = match procs.iter().rposition(|&b| b == b'\n') {
        Some(end) => &procs[..end],
        None => &[][..],
    };
    whole
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok()?.parse::<u32>().ok())
        .filter(|&pid| pid != 0)
        .take(MAX_PIDS)
        .collect()
}

/// The job id of a stepd's title `slurmstepd: [<job id>.<step>]` (or `... stepmgr]`), if its
/// step is `step`.
fn job_of_title(title: &[u8], step: &[u8]) -> Option<u32> {
    let inner = title.strip_prefix(b"slurmstepd: [")?;
    let dot = inner.iter().position(|&b| b == b'.')?;
    let (job, rest) = (&inner[..dot], &inner[dot + 1..]);
    let rest = rest.strip_prefix(step)?;
    if !(rest == b"]" || rest == b" stepmgr]") {
        return None;
    }
    // Decimal as `"%u"` writes it: no sign, no leading zero; 0 is no job.
    let digits = job.first().is_some_and(|&b| b != b'0') && job.iter().all(u8::is_ascii_digit);
    digits.then(|| std::str::from_utf8(job).ok()?.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepd_title_gives_its_job_id_for_its_own_step_only() {
        for (title, step, want) in [
            ("slurmstepd: [3385.0]", "0", Some(3385)),
            ("slurmstepd: [3385.batch]", "batch", Some(3385)),
            ("slurmstepd: [3385.extern]", "extern", Some(3385)),
            ("slurmstepd: [3385.interactive]", "interactive", Some(3385)),
            ("slurmstepd: [3385.extern stepmgr]", "extern", Some(3385)),
            ("slurmstepd: [3385.0+1]", "0+1", Some(3385)),
            ("slurmstepd: [3385.0]", "1", None),
            ("slurmstepd: [3385.0]", "batch", None),
            ("slurmstepd: [3385.10]", "1", None),
            ("slurmstepd: [3385:namespace]", "0", None),
            ("slurmstepd: [03385.0]", "0", None),
            ("slurmstepd: [0.0]", "0", None),
            ("slurmstepd: [4294967296.0]", "0", None),
            ("slurmstepd: [3385.0] trailing", "0", None),
            ("sleep: [3385.0]", "0", None),
            ("/usr/sbin/slurmstepd infinity", "0", None),
            ("", "0", None),
        ] {
            assert_eq!(job_of_title(title.as_bytes(), step.as_bytes()), want, "{title} {step}");
        }
    }

    #[test]
    fn the_pids_of_a_cgroup_procs_prefix_are_its_whole_lines() {
        assert_eq!(pids(b"4242\n4243\n"), vec![4242, 4243]);
        assert_eq!(pids(b"4242\n42"), vec![4242], "a line cut by the read's bound is left out");
        assert_eq!(pids(b"0\nx\n-1\n7\n"), vec![7]);
        assert_eq!(pids(b"1\n2\n3\n4\n5\n6\n"), vec![1, 2, 3, 4]);
        assert_eq!(pids(b""), Vec::<u32>::new());
    }

    /// This machine's kernel: a process's title is the first string of its `cmdline`, its
    /// `cgroup` has the `0::<path>` line the leaf is compared with, and a `/proc/<pid>` held
    /// open answers `ESRCH` once its process has ended, never another process's files.
    #[test]
    fn a_real_process_is_read_through_its_proc_directory_and_not_after_it_ends() {
        use std::os::unix::process::CommandExt as _;
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let cgroup = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 line");
        let mut child = std::process::Command::new("sleep")
            .arg0("slurmstepd: [77.0]")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until it has called exec, the child shows this process's command line.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !std::fs::read(format!("/proc/{pid}/cmdline")).unwrap().starts_with(b"slurmstepd") {
            assert!(std::time::Instant::now() < deadline, "the child never ran sleep");
            std::thread::yield_now();
        }
        let mut stepds = Stepds::new("/proc".into());
        // The child is in the cgroup its parent was in when it started.
        assert_eq!(stepds.title(pid, cgroup.as_bytes(), b"0"), Ok(77));
        assert_eq!(stepds.title(pid, cgroup.as_bytes(), b"1"), Err(Unresolved::NotAStepd));
        assert_eq!(stepds.title(pid, b"/elsewhere", b"0"), Err(Unresolved::Elsewhere));

        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::open(format!("/proc/{pid}"), flags, Mode::empty()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let mut buf = Vec::new();
        let gone = amd_hsmp_web::files::read_regular_prefix_at(
            &dir,
            Path::new("cmdline"),
            MAX_READ,
            &mut buf,
        )
        .unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(rustix::io::Errno::SRCH.raw_os_error()), "{gone}");
        assert_eq!(stepds.title(pid, cgroup.as_bytes(), b"0"), Err(Unresolved::Hidden));
    }
}
