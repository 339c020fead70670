//! The core-owner collector (`--collector.core-owner`): which workload each physical core is
//! assigned to, from the effective cpusets of the cgroup v2 hierarchy, so that the per-core
//! energy of a workload's cores is its energy.
//!
//! The rule, as `docs/metrics.md` states it: a cgroup *restricts* when its effective cpuset
//! differs from its parent's. A physical core is assigned to cgroup C when C is the deepest
//! restricting cgroup whose effective cpuset contains every online thread of the core, and no
//! other restricting cgroup that is neither an ancestor nor a descendant of C contains any of
//! those threads. Otherwise the core is unassigned. The root never restricts; a threaded
//! cgroup belongs to its nearest domain ancestor (it is not a cgroup of its own here); a cgroup
//! without cpuset files has its parent's effective set; a partition root restricts like any
//! other cgroup.
//!
//! Reading needs no privilege and no device: cgroupfs is world-readable. A cgroup that vanishes
//! while it is read is skipped (normal churn); any other failure is an [`OwnerError`], and the
//! scrape then has no owner series at all, never a partial answer.

use crate::translate::CoreLabel;
use amd_hsmp_proto::Core;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The highest CPU number a cpuset list may name; a larger one is a malformed list (Linux's
/// `NR_CPUS` is at most 8192 on x86-64), and the bound keeps a hostile list from costing memory.
const MAX_CPUS: u32 = 1 << 16;

/// Why the hierarchy gave no owners.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnerError {
    /// The directory has no `cgroup.controllers`: a cgroup v1 or hybrid host's tmpfs, or no
    /// cgroup filesystem at all.
    #[error("{} is not a cgroup v2 hierarchy (no cgroup.controllers: a cgroup v1 or hybrid host?)", .root.display())]
    NotV2 {
        /// `--path.cgroupfs`.
        root: PathBuf,
    },
    /// The v2 hierarchy has no cpuset controller (bound to a v1 hierarchy, or not built).
    #[error("the cgroup v2 hierarchy at {} has no cpuset controller (bound to cgroup v1?)", .root.display())]
    NoCpuset {
        /// `--path.cgroupfs`.
        root: PathBuf,
    },
    /// A file or directory of the hierarchy could not be read.
    #[error("cannot read {}", .path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A cpuset file does not hold a CPU list.
    #[error("{}: malformed CPU list {content:?}", .path.display())]
    CpuList {
        /// The file.
        path: PathBuf,
        /// Its content, trimmed.
        content: String,
    },
    /// The hierarchy was not read by the time the scrape had to answer.
    #[error("reading the cgroup hierarchy took longer than the scrape's time")]
    TimedOut,
}

impl OwnerError {
    /// What the error is, without the file it happened on: the log says it again only when
    /// this changes.
    fn cause(&self) -> String {
        match self {
            OwnerError::NotV2 { .. } => "not-v2".to_owned(),
            OwnerError::NoCpuset { .. } => "no-cpuset".to_owned(),
            OwnerError::Read { source, .. } => {
                format!("read: {:?} {:?}", source.kind(), source.raw_os_error())
            }
            OwnerError::CpuList { .. } => "cpu-list".to_owned(),
            OwnerError::TimedOut => "timed-out".to_owned(),
        }
    }
}

/// A set of Linux CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct CpuSet(Vec<u64>);

impl CpuSet {
    /// Parses a kernel CPU list (`0-3,5,7-9`; empty is the empty set).
    fn parse(text: &str) -> Option<CpuSet> {
        let mut words: Vec<u64> = Vec::new();
        let number = |s: &str| s.trim().parse::<u32>().ok().filter(|&n| n < MAX_CPUS);
        for element in text.trim().split(',').filter(|e| !e.trim().is_empty()) {
            let (start, end) = match element.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(element)?;
                    (n, n)
                }
            };
            if end < start {
                return None;
            }
            let last = (end / 64) as usize;
            if words.len() <= last {
                words.resize(last + 1, 0);
            }
            for cpu in start..=end {
                words[(cpu / 64) as usize] |= 1 << (cpu % 64);
            }
        }
        while words.last() == Some(&0) {
            words.pop();
        }
        Some(CpuSet(words))
    }

    fn contains(&self, cpu: u32) -> bool {
        self.0.get((cpu / 64) as usize).is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }
}

/// A restricting domain cgroup.
#[derive(Debug, Clone)]
struct Restriction {
    /// Path from the hierarchy root, `/`-separated, starting with `/`.
    path: String,
    cpus: CpuSet,
    depth: usize,
    /// Its place in the depth-first order of every cgroup read, and the end of its subtree
    /// there: `b` is in `a`'s subtree when `a.pre <= b.pre < a.end`.
    pre: usize,
    end: usize,
}

impl Restriction {
    fn related(&self, other: &Restriction) -> bool {
        let within = |a: &Restriction, b: &Restriction| a.pre <= b.pre && b.pre < a.end;
        within(self, other) || within(other, self)
    }
}

/// The restricting cgroups of one read of the hierarchy.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hierarchy {
    restrictions: Vec<Restriction>,
}

impl Hierarchy {
    /// The owner of each core of `cores` that has one, in the order of `cores`.
    pub(crate) fn owners(&self, cores: &[Core]) -> Vec<(CoreLabel, String)> {
        let mut out = Vec::new();
        let mut touching: Vec<&Restriction> = Vec::new();
        for core in cores {
            if core.threads.is_empty() {
                continue;
            }
            touching.clear();
            let mut owner: Option<&Restriction> = None;
            for r in &self.restrictions {
                let inside = core.threads.iter().filter(|&&t| r.cpus.contains(t)).count();
                if inside == 0 {
                    continue;
                }
                touching.push(r);
                if inside == core.threads.len() && owner.is_none_or(|o| r.depth > o.depth) {
                    owner = Some(r);
                }
            }
            let Some(owner) = owner else { continue };
            if touching.iter().all(|r| r.related(owner)) {
                out.push((CoreLabel::from(core), owner.path.clone()));
            }
        }
        out
    }
}

/// Whether an error reading a cgroup's file means that the cgroup was removed meanwhile.
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error())
}

/// Reads a small file into `buf` with plain reads (no `stat` for a size hint: a scrape reads
/// thousands of these); `None` if it does not exist (or its cgroup is gone).
fn read_file<'a>(path: &Path, buf: &'a mut Vec<u8>) -> Result<Option<&'a str>, OwnerError> {
    use std::io::Read as _;
    let error = |source| OwnerError::Read { path: path.to_path_buf(), source };
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if vanished(&e) => return Ok(None),
        Err(e) => return Err(error(e)),
    };
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) => return Err(error(e)),
        }
    }
    std::str::from_utf8(buf)
        .map(Some)
        .map_err(|_| error(io::Error::new(io::ErrorKind::InvalidData, "not UTF-8")))
}

fn read_cpus(path: &Path, buf: &mut Vec<u8>) -> Result<Option<CpuSet>, OwnerError> {
    let Some(text) = read_file(path, buf)? else { return Ok(None) };
    CpuSet::parse(text).map(Some).ok_or_else(|| OwnerError::CpuList {
        path: path.to_path_buf(),
        content: text.trim().to_owned(),
    })
}

/// The names of the subdirectories of `dir`, sorted; `None` if `dir` is gone.
fn subdirectories(dir: &Path) -> Result<Option<Vec<std::ffi::OsString>>, OwnerError> {
    let error = |source| OwnerError::Read { path: dir.to_path_buf(), source };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if vanished(&e) => return Ok(None),
        Err(e) => return Err(error(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) => return Err(error(e)),
        };
        match entry.file_type() {
            Ok(t) if t.is_dir() => names.push(entry.file_name()),
            Ok(_) => {}
            Err(e) if vanished(&e) => {}
            Err(e) => return Err(error(e)),
        }
    }
    names.sort();
    Ok(Some(names))
}

/// The subdirectories of cgroup `dir`, as [`subdirectories`]; a directory whose link count is 2
/// has none (cgroupfs, like tmpfs, counts a directory's subdirectories in its links), and one
/// `stat` is cheaper than listing its files. Most cgroups are leaves.
fn children_of(dir: &Path) -> Result<Option<Vec<std::ffi::OsString>>, OwnerError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.nlink() == 2 => Ok(Some(Vec::new())),
        Ok(_) => subdirectories(dir),
        Err(e) if vanished(&e) => Ok(None),
        Err(source) => Err(OwnerError::Read { path: dir.to_path_buf(), source }),
    }
}

/// Reads the effective cpusets of every domain cgroup under `root` (`--path.cgroupfs`).
pub(crate) fn read(root: &Path) -> Result<Hierarchy, OwnerError> {
    let controllers = root.join("cgroup.controllers");
    let controllers = match std::fs::read_to_string(&controllers) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(OwnerError::NotV2 { root: root.to_path_buf() });
        }
        Err(source) => return Err(OwnerError::Read { path: controllers, source }),
    };
    if !controllers.split_whitespace().any(|c| c == "cpuset") {
        return Err(OwnerError::NoCpuset { root: root.to_path_buf() });
    }
    let mut buf = Vec::with_capacity(4096);
    let Some(root_cpus) = read_cpus(&root.join("cpuset.cpus.effective"), &mut buf)? else {
        return Err(OwnerError::NoCpuset { root: root.to_path_buf() });
    };
    let Some(children) = subdirectories(root)? else {
        return Err(OwnerError::Read {
            path: root.to_path_buf(),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
    };

    // Depth-first, each cgroup numbered when it is taken off the stack (preorder), so that a
    // subtree is a contiguous range of numbers.
    struct Pending {
        dir: PathBuf,
        path: String,
        parent: usize,
        depth: usize,
    }
    // Per cgroup read: its parent's number and its effective set.
    let mut parents: Vec<usize> = vec![0];
    let mut sets: Vec<CpuSet> = vec![root_cpus];
    let mut restricting: Vec<Restriction> = Vec::new();
    let mut stack: Vec<Pending> = children
        .into_iter()
        .rev()
        .map(|name| Pending {
            dir: root.join(&name),
            path: format!("/{}", name.to_string_lossy()),
            parent: 0,
            depth: 1,
        })
        .collect();
    while let Some(cgroup) = stack.pop() {
        let own = read_cpus(&cgroup.dir.join("cpuset.cpus.effective"), &mut buf)?;
        let parent_set = &sets[cgroup.parent];
        let restricts = own.as_ref().is_some_and(|own| own != parent_set);
        // A threaded cgroup (and so its whole subtree, all threaded) belongs to its domain
        // ancestor. Only a restricting cgroup's type matters: one that does not restrict adds
        // nothing whatever its type, and a threaded descendant that restricts is read here in
        // its turn. Reading the type of those alone saves a file a cgroup on most hosts.
        if restricts {
            let Some(kind) = read_file(&cgroup.dir.join("cgroup.type"), &mut buf)? else {
                continue;
            };
            if kind.trim() == "threaded" {
                continue;
            }
        }
        let Some(children) = children_of(&cgroup.dir)? else { continue };
        let parent_set = &sets[cgroup.parent];
        let set = own.unwrap_or_else(|| parent_set.clone());
        let number = sets.len();
        if restricts {
            restricting.push(Restriction {
                path: cgroup.path.clone(),
                cpus: set.clone(),
                depth: cgroup.depth,
                pre: number,
                end: number + 1,
            });
        }
        parents.push(cgroup.parent);
        sets.push(set);
        for name in children.into_iter().rev() {
            stack.push(Pending {
                dir: cgroup.dir.join(&name),
                path: format!("{}/{}", cgroup.path, name.to_string_lossy()),
                parent: number,
                depth: cgroup.depth + 1,
            });
        }
    }
    // The end of each subtree: a cgroup's subtree ends where its last descendant's does.
    let mut ends: Vec<usize> = (1..=sets.len()).collect();
    for n in (1..sets.len()).rev() {
        let parent = parents[n];
        ends[parent] = ends[parent].max(ends[n]);
    }
    for r in &mut restricting {
        r.end = ends[r.pre];
    }
    Ok(Hierarchy { restrictions: restricting })
}

/// Logs a failure of the collector once per cause, and its recovery once.
#[derive(Debug, Default)]
pub(crate) struct CauseLog {
    last: Mutex<Option<String>>,
}

impl CauseLog {
    /// Records a failed read; logs it (and says so) if its cause differs from the last one's.
    pub(crate) fn failed(&self, error: &OwnerError) -> bool {
        let cause = error.cause();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(cause.as_str()) {
            tracing::warn!(
                error = %amd_hsmp_cli::chain(error),
                "core-owner: no owner series while the cgroup hierarchy cannot be read; counted in amd_hsmp_scrape_errors_total{{collector=\"core-owner\"}}, logged again only when the cause changes"
            );
            *last = Some(cause);
            return true;
        }
        false
    }

    /// Records a successful read; logs the recovery after a failure.
    pub(crate) fn succeeded(&self) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.take().is_some() {
            tracing::info!("core-owner: the cgroup hierarchy is readable again");
        }
    }

    /// The cause last logged, if the collector is failing.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests;
