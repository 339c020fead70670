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
//! while it is read is skipped (normal churn). A cgroup below the root that this process may
//! not read (a user's `chmod 0700` inside their own delegated subtree) is skipped with its
//! subtree and counted, and stands in the rule for whatever it hides: a cgroup touching every
//! CPU of its parent's set that owns none, so that it can only make cores unassigned. A
//! subtree whose `cgroup.subtree_control` does not enable cpuset cannot restrict and is not
//! read. Any other failure, and a walk past its [`Limits`], is an [`OwnerError`], and the
//! scrape then has no owner series at all, never a partial answer.
//!
//! Walks are run by a [`Walker`]: one thread, at most one walk in flight, its result shared by
//! every scrape it is fresh for (`--collector.core-owner.max-age`, [`WALK_MAX_AGE`] by
//! default). A walk reads each file to at most [`MAX_FILE_BYTES`], and at most [`MAX_CGROUPS`]
//! cgroups and [`MAX_WALK_BYTES`] in all; a scrape starts none before the broker's first answer
//! has told the topology ([`Walker::knows_topology`]), by which the walk bounds its CPU lists.

use crate::translate::CoreLabel;
use crate::work::{Permit, QueuedPermit};
use amd_hsmp_proto::{Core, Topology};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The highest CPU number a cpuset list may name; a larger one is a malformed list (Linux's
/// `NR_CPUS` is at most 8192 on x86-64), and the bound keeps a hostile list from costing memory.
const MAX_CPUS: u32 = 1 << 16;

mod identity;
mod stepd;

pub(crate) use identity::Identity;

/// A core's owner: its cgroup path, as the `owner` label shows it, and what the path says of
/// the workload, derived once, from the path's raw bytes, when the walk reads the cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    /// The path from the hierarchy root, `/`-separated; a byte that is not UTF-8 is U+FFFD.
    pub(crate) path: String,
    /// The workload's identity labels ([`Identity`]).
    pub(crate) identity: Identity,
}

impl Owner {
    /// The owner at `raw`, a path from the hierarchy root.
    pub(crate) fn from_raw(raw: &[u8]) -> Owner {
        Owner { path: String::from_utf8_lossy(raw).into_owned(), identity: Identity::of(raw) }
    }

    /// The owner at `raw`, a SLUID-keyed job's `hpc_job` taken from `jobs` (SLUID to job id,
    /// read from the job's stepd: [`stepd`]).
    fn with_jobs(raw: &[u8], jobs: &std::collections::HashMap<Box<[u8]>, u32>) -> Owner {
        let mut owner = Owner::from_raw(raw);
        let id = &mut owner.identity;
        if let Some(job) = id.slurm_sluid.as_ref().and_then(|s| jobs.get(s.as_bytes())) {
            id.hpc_job = Some(job.to_string());
        }
        owner
    }
}

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
    /// The walk thread could not be started.
    #[error("cannot start the cgroup walk thread: {message}")]
    Thread {
        /// The cause.
        message: String,
    },
    /// The hierarchy holds more than one walk reads.
    #[error(
        "the cgroup hierarchy holds more {what} than one read takes ({limit}); no owner is guessed from part of it"
    )]
    TooLarge {
        /// `cgroups` or `bytes`.
        what: &'static str,
        /// The bound.
        limit: u64,
    },
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
            OwnerError::TooLarge { what, .. } => format!("too-large: {what}"),
            OwnerError::Thread { .. } => "thread".to_owned(),
        }
    }
}

/// A set of Linux CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct CpuSet(Vec<u64>);

impl CpuSet {
    /// Parses a kernel CPU list (`0-3,5,7-9`; empty is the empty set), keeping the CPUs below
    /// `limit` (at most [`MAX_CPUS`]); a number of [`MAX_CPUS`] or more is malformed.
    fn parse(text: &str, limit: u32) -> Option<CpuSet> {
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
            if start >= limit {
                continue;
            }
            let end = end.min(limit - 1);
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

/// A restricting domain cgroup, or one that could not be read.
#[derive(Debug, Clone)]
struct Restriction {
    /// The path from the hierarchy root, raw bytes.
    path: Box<[u8]>,
    /// The cgroup as an owner (its label path and identity), made the first time it owns a
    /// core: most restricting cgroups own none (a pod's containers in the shared pool), and a
    /// walk of 60,000 cgroups would otherwise hold an identity for each.
    owner: OnceLock<Arc<Owner>>,
    /// Its effective set: an index into [`Hierarchy::sets`].
    set: usize,
    depth: usize,
    /// Its place in the depth-first order of every cgroup read, and the end of its subtree
    /// there: `b` is in `a`'s subtree when `a.pre <= b.pre < a.end`.
    pre: usize,
    end: usize,
    /// It could not be read: its set is its parent's, standing for whatever it hides; a core
    /// it would own is unassigned.
    unread: bool,
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
    /// The root's set and each restriction's, each once.
    sets: Vec<CpuSet>,
    restrictions: Vec<Restriction>,
    /// The numeric id of each SLUID-keyed Slurm job that could be read ([`stepd`]).
    slurm_jobs: std::collections::HashMap<Box<[u8]>, u32>,
}

impl Hierarchy {
    /// The owner of each core of `cores` that has one, in the order of `cores`.
    pub(crate) fn owners(&self, cores: &[Core]) -> Vec<(CoreLabel, Arc<Owner>)> {
        let mut out = Vec::new();
        let mut touching: Vec<&Restriction> = Vec::new();
        let empty = CpuSet::default();
        for core in cores {
            if core.threads.is_empty() {
                continue;
            }
            touching.clear();
            let mut owner: Option<&Restriction> = None;
            for r in &self.restrictions {
                let cpus = self.sets.get(r.set).unwrap_or(&empty);
                let inside = core.threads.iter().filter(|&&t| cpus.contains(t)).count();
                if inside == 0 {
                    continue;
                }
                touching.push(r);
                if inside == core.threads.len() && owner.is_none_or(|o| r.depth > o.depth) {
                    owner = Some(r);
                }
            }
            let Some(owner) = owner.filter(|o| !o.unread) else { continue };
            if touching.iter().all(|r| r.related(owner)) {
                let named = owner
                    .owner
                    .get_or_init(|| Arc::new(Owner::with_jobs(&owner.path, &self.slurm_jobs)));
                out.push((CoreLabel::from(core), Arc::clone(named)));
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

/// Whether an error reading a cgroup's file means that this process may not read it: a
/// cgroup below the root that answers so is skipped with its subtree, never the whole family.
fn denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        || e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error())
}

/// What one walk of the hierarchy may cost: past a bound it is a counted error, never a
/// partial guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CPUs at and above this number are left out of every set read: they are no thread of a
    /// core the broker reported, so they cannot change an owner, and a hostile list such as
    /// `0-65535` costs no more than the topology's CPUs.
    pub(crate) cpus: u32,
    /// Cgroups read at most.
    pub(crate) cgroups: usize,
    /// Bytes read at most, all files together.
    pub(crate) bytes: u64,
}

impl Limits {
    /// The bounds for a machine whose highest CPU number is `highest`; unknown, any CPU a
    /// list may name, which costs 8 KiB a set: the scrape path never walks before the
    /// broker's first answer has told the topology ([`Walker::knows_topology`]).
    pub(crate) fn for_highest_cpu(highest: Option<u32>) -> Limits {
        let cpus = highest.map_or(MAX_CPUS, |h| h.saturating_add(1).clamp(1, MAX_CPUS));
        Limits { cpus, cgroups: MAX_CGROUPS, bytes: MAX_WALK_BYTES }
    }
}

/// The largest cgroup file read (64 KiB): the longest CPU list of 8,192 CPUs written one by
/// one is under 40 KiB.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Cgroups one walk reads at most: far above a node's (a few thousand on a busy Kubernetes
/// node), and at about 3 µs a cgroup a walk of them stays near 0.2 s of CPU.
pub(crate) const MAX_CGROUPS: usize = 65_536;

/// Bytes one walk reads at most, all files together (16 MiB).
pub(crate) const MAX_WALK_BYTES: u64 = 16 << 20;

/// Reads the files of one walk within its [`Limits`], into one buffer.
struct Reader {
    buf: Vec<u8>,
    limits: Limits,
    bytes: u64,
}

impl Reader {
    /// Reads a small file: opened without blocking, refused unless it is a regular file, at
    /// most [`MAX_FILE_BYTES`]; `None` if it does not exist (or its cgroup is gone).
    fn file(&mut self, path: &Path) -> Result<Option<&str>, OwnerError> {
        let error = |source| OwnerError::Read { path: path.to_path_buf(), source };
        match amd_hsmp_web::files::read_regular_into(path, MAX_FILE_BYTES, &mut self.buf) {
            Ok(()) => {}
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) => return Err(error(e)),
        }
        self.bytes += self.buf.len() as u64;
        if self.bytes > self.limits.bytes {
            return Err(OwnerError::TooLarge { what: "bytes", limit: self.limits.bytes });
        }
        std::str::from_utf8(&self.buf)
            .map(Some)
            .map_err(|_| error(io::Error::new(io::ErrorKind::InvalidData, "not UTF-8")))
    }

    fn cpus(&mut self, path: &Path) -> Result<Option<CpuSet>, OwnerError> {
        let limit = self.limits.cpus;
        let Some(text) = self.file(path)? else { return Ok(None) };
        CpuSet::parse(text, limit).map(Some).ok_or_else(|| OwnerError::CpuList {
            path: path.to_path_buf(),
            content: text.trim().chars().take(80).collect(),
        })
    }

    /// Whether cgroup `dir`'s children may have cpuset files: not when its
    /// `cgroup.subtree_control` does not enable the controller (no descendant can restrict
    /// then, so its subtree need not be read); yes when it does, or when the file is missing.
    fn enables_cpuset(&mut self, dir: &Path) -> Result<bool, OwnerError> {
        Ok(self
            .file(&dir.join("cgroup.subtree_control"))?
            .is_none_or(|text| text.split_whitespace().any(|c| c == "cpuset")))
    }
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
/// `stat` is cheaper than listing its files. Most cgroups are leaves. A cgroup whose
/// `cgroup.subtree_control` does not enable cpuset has none worth reading.
fn children_of(
    dir: &Path,
    reader: &mut Reader,
) -> Result<Option<Vec<std::ffi::OsString>>, OwnerError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.nlink() == 2 => Ok(Some(Vec::new())),
        Ok(m) if m.is_dir() && !reader.enables_cpuset(dir)? => Ok(Some(Vec::new())),
        Ok(_) => subdirectories(dir),
        Err(e) if vanished(&e) => Ok(None),
        Err(source) => Err(OwnerError::Read { path: dir.to_path_buf(), source }),
    }
}

/// One walk of the hierarchy: the restricting cgroups and what was skipped.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    /// The restricting cgroups, and the skipped ones in their place.
    pub(crate) hierarchy: Hierarchy,
    /// Cgroups below the root this process may not read (`EACCES`, `EPERM`), each skipped with
    /// its subtree.
    pub(crate) skipped: u64,
    /// The first of them, with its cause: what the log names.
    pub(crate) first_skipped: Option<(PathBuf, io::ErrorKind)>,
}

/// How one cgroup read ended.
enum Visit {
    /// Read: its effective set (`None`: its parent's) and the children to read.
    Read { own: Option<CpuSet>, children: Vec<std::ffi::OsString> },
    /// Gone meanwhile, or threaded (it belongs to its domain ancestor): nothing of it counts.
    Ignored,
}

/// Reads one cgroup: its effective set, its type when it restricts, and its children.
fn visit(dir: &Path, parent_set: &CpuSet, reader: &mut Reader) -> Result<Visit, OwnerError> {
    let own = reader.cpus(&dir.join("cpuset.cpus.effective"))?;
    let restricts = own.as_ref().is_some_and(|own| own != parent_set);
    // A threaded cgroup (and so its whole subtree, all threaded) belongs to its domain
    // ancestor. Only a restricting cgroup's type matters: one that does not restrict adds
    // nothing whatever its type, and a threaded descendant that restricts is read here in its
    // turn. Reading the type of those alone saves a file a cgroup on most hosts.
    if restricts {
        let Some(kind) = reader.file(&dir.join("cgroup.type"))? else {
            return Ok(Visit::Ignored);
        };
        if kind.trim() == "threaded" {
            return Ok(Visit::Ignored);
        }
    }
    match children_of(dir, reader)? {
        Some(children) => Ok(Visit::Read { own, children }),
        None => Ok(Visit::Ignored),
    }
}

/// Reads the effective cpusets of every domain cgroup under `root` (`--path.cgroupfs`) within
/// `limits`. A cgroup below the root that may not be read is skipped with its subtree and
/// counted; it stands in the rule as a cgroup that touches every CPU of its parent's set and
/// can own none, so that what it hides can make cores unassigned, never misassigned.
pub(crate) fn read(root: &Path, limits: Limits) -> Result<Walk, OwnerError> {
    let mut reader = Reader { buf: Vec::with_capacity(4096), limits, bytes: 0 };
    let controllers = match reader.file(&root.join("cgroup.controllers")) {
        Ok(Some(text)) => text,
        Ok(None) => return Err(OwnerError::NotV2 { root: root.to_path_buf() }),
        Err(e) => return Err(e),
    };
    if !controllers.split_whitespace().any(|c| c == "cpuset") {
        return Err(OwnerError::NoCpuset { root: root.to_path_buf() });
    }
    let Some(root_cpus) = reader.cpus(&root.join("cpuset.cpus.effective"))? else {
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
        /// The path from the hierarchy root, raw: the owner's identity is read from its bytes.
        path: Vec<u8>,
        parent: usize,
        depth: usize,
    }
    // Per cgroup read: its parent's number and its effective set, as an index into `sets`,
    // which holds the root's set and one per restriction: a cgroup that does not restrict
    // shares its parent's.
    let mut parents: Vec<usize> = vec![0];
    let mut set_of: Vec<usize> = vec![0];
    let mut sets: Vec<CpuSet> = vec![root_cpus];
    let mut restricting: Vec<Restriction> = Vec::new();
    let mut walk = Walk::default();
    let mut stack: Vec<Pending> = children
        .into_iter()
        .rev()
        .map(|name| Pending {
            dir: root.join(&name),
            path: [b"/", name.as_bytes()].concat(),
            parent: 0,
            depth: 1,
        })
        .collect();
    while let Some(cgroup) = stack.pop() {
        if parents.len() > limits.cgroups {
            return Err(OwnerError::TooLarge { what: "cgroups", limit: limits.cgroups as u64 });
        }
        let parent_set = set_of[cgroup.parent];
        let number = parents.len();
        let (set, restricts, children) = match visit(&cgroup.dir, &sets[parent_set], &mut reader) {
            Ok(Visit::Read { own, children }) => match own {
                Some(own) if own != sets[parent_set] => {
                    sets.push(own);
                    (sets.len() - 1, Restricts::Owner, children)
                }
                _ => (parent_set, Restricts::No, children),
            },
            Ok(Visit::Ignored) => continue,
            Err(OwnerError::Read { path, source }) if denied(&source) => {
                walk.skipped += 1;
                walk.first_skipped.get_or_insert((path, source.kind()));
                (parent_set, Restricts::Unread, Vec::new())
            }
            Err(e) => return Err(e),
        };
        if restricts != Restricts::No {
            restricting.push(Restriction {
                path: cgroup.path.clone().into_boxed_slice(),
                owner: OnceLock::new(),
                set,
                depth: cgroup.depth,
                pre: number,
                end: number + 1,
                unread: restricts == Restricts::Unread,
            });
        }
        parents.push(cgroup.parent);
        set_of.push(set);
        for name in children.into_iter().rev() {
            stack.push(Pending {
                dir: cgroup.dir.join(&name),
                path: [&cgroup.path[..], b"/", name.as_bytes()].concat(),
                parent: number,
                depth: cgroup.depth + 1,
            });
        }
    }
    // The end of each subtree: a cgroup's subtree ends where its last descendant's does.
    let mut ends: Vec<usize> = (1..=parents.len()).collect();
    for n in (1..parents.len()).rev() {
        let parent = parents[n];
        ends[parent] = ends[parent].max(ends[n]);
    }
    for r in &mut restricting {
        r.end = ends[r.pre];
    }
    walk.hierarchy = Hierarchy { sets, restrictions: restricting, ..Hierarchy::default() };
    Ok(walk)
}

/// Whether a cgroup read stands in the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restricts {
    /// Its set is its parent's.
    No,
    /// Its set differs from its parent's: it may own cores.
    Owner,
    /// It could not be read: it touches every CPU of its parent's set and owns none.
    Unread,
}

/// A walk's result serves every scrape that arrives at most this long after the walk began:
/// the core-owner collector's freshness bound (the default of `--collector.core-owner.max-age`). Owners change when workloads start and stop,
/// far less often; the bound makes a flood of scrapes cost at most about one walk a second.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "the flag's default is its text; a test ties the two")
)]
pub(crate) const WALK_MAX_AGE: Duration = Duration::from_secs(1);

/// One finished walk.
#[derive(Debug)]
pub(crate) struct Done {
    /// When it began.
    began: Instant,
    /// What it read.
    pub(crate) result: Result<Walk, OwnerError>,
}

/// The walks of the hierarchy at `--path.cgroupfs`, on one thread of their own: at most one in
/// flight and one wanted after it, each result shared by the scrapes it is fresh for. The walk
/// in flight holds the [`Permit`] of a scrape that asked for it; the one wanted holds no place
/// while it waits ([`QueuedPermit`]), and starts only if a scrape that asked for it still holds
/// its place. A read that blocks holds that one thread and one place, never one per scrape:
/// the scrapes meanwhile answer at their own time without owners (a counted error), and the
/// process exits without waiting for it.
#[derive(Debug)]
pub(crate) struct Walker {
    shared: Arc<WalkerShared>,
    done: watch::Receiver<Option<Arc<Done>>>,
    /// How long a walk's result serves the scrapes that arrive after it began.
    max_age: Duration,
    /// The thread, started with the first walk; or why it could not be.
    thread: OnceLock<Result<(), String>>,
    sender: Mutex<Option<watch::Sender<Option<Arc<Done>>>>>,
}

#[derive(Debug)]
struct WalkerShared {
    root: PathBuf,
    /// The procfs a SLUID-keyed Slurm job's stepd is read in (`--path.procfs`).
    procfs: PathBuf,
    state: Mutex<WalkState>,
    wake: Condvar,
    /// The highest CPU number of the broker's topology, `u32::MAX` while unknown.
    highest_cpu: AtomicU32,
    /// Walks begun, since the start.
    walks: AtomicU64,
}

#[derive(Debug, Default)]
struct WalkState {
    /// A walk is wanted by these scrapes (those whose place is still held; at most one per
    /// scrape that waits, so bounded by `--web.max-requests`).
    wanted: Vec<QueuedPermit>,
    /// When the walk in progress began.
    running: Option<Instant>,
    /// The walker was dropped: the thread ends after its walk.
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Walker {
    /// A walker of the hierarchy at `root` whose walks serve scrapes that arrive at most
    /// `max_age` after they began, reading SLUID-keyed Slurm jobs' stepds in `procfs`.
    pub(crate) fn with_max_age(root: PathBuf, procfs: PathBuf, max_age: Duration) -> Walker {
        let (sender, done) = watch::channel(None);
        Walker {
            shared: Arc::new(WalkerShared {
                root,
                procfs,
                state: Mutex::default(),
                wake: Condvar::new(),
                highest_cpu: AtomicU32::new(u32::MAX),
                walks: AtomicU64::new(0),
            }),
            done,
            max_age,
            thread: OnceLock::new(),
            sender: Mutex::new(Some(sender)),
        }
    }

    /// Bounds the CPU lists of later walks by the topology's highest CPU.
    pub(crate) fn note_topology(&self, topology: &Topology) {
        let highest = topology.cores.iter().flat_map(|c| c.threads.iter().copied()).max();
        if let Some(highest) = highest {
            self.shared.highest_cpu.store(highest, Ordering::Relaxed);
        }
    }

    /// Whether a topology was noted ([`Walker::note_topology`]): walks bound CPU sets by it.
    pub(crate) fn knows_topology(&self) -> bool {
        self.shared.highest_cpu().is_some()
    }

    /// Walks begun since the start.
    pub(crate) fn walks(&self) -> u64 {
        self.shared.walks.load(Ordering::Relaxed)
    }

    /// The walk for a scrape that arrived at `arrived`: the last one if it began no more than
    /// the walker's freshness bound ([`WALK_MAX_AGE`]) before, else the one in progress if that is as fresh, else a new one
    /// (after the one in progress), which holds `permit` while it runs. `None` if no fresh walk
    /// has ended by `answer_by`.
    pub(crate) async fn walk(
        &self,
        arrived: tokio::time::Instant,
        answer_by: tokio::time::Instant,
        permit: &Permit,
    ) -> Result<Arc<Done>, OwnerError> {
        let arrived = arrived.into_std();
        let not_before = arrived.checked_sub(self.max_age).unwrap_or(arrived);
        let fresh =
            move |done: &Option<Arc<Done>>| done.as_ref().is_some_and(|d| d.began >= not_before);
        {
            let latest = self.done.borrow();
            if let Some(done) = latest.as_ref().filter(|_| fresh(&latest)) {
                return Ok(Arc::clone(done));
            }
        }
        self.start_thread()?;
        {
            let mut state = lock(&self.shared.state);
            let running_fresh = state.running.is_some_and(|began| began >= not_before);
            if !running_fresh {
                state.wanted.retain(QueuedPermit::is_held);
                state.wanted.push(permit.downgrade());
                self.shared.wake.notify_one();
            }
        }
        let mut done = self.done.clone();
        match tokio::time::timeout_at(answer_by, done.wait_for(fresh)).await {
            Ok(Ok(done)) => done.as_ref().map(Arc::clone).ok_or(OwnerError::TimedOut),
            Ok(Err(_)) | Err(_) => Err(OwnerError::TimedOut),
        }
    }

    /// Starts the thread once.
    fn start_thread(&self) -> Result<(), OwnerError> {
        let started = self.thread.get_or_init(|| {
            let Some(sender) = lock(&self.sender).take() else {
                return Err("the walk thread was already started".to_owned());
            };
            let shared = Arc::clone(&self.shared);
            std::thread::Builder::new()
                .name("cgroup-walk".into())
                .spawn(move || shared.run(&sender))
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        started.clone().map_err(|message| OwnerError::Thread { message })
    }
}

impl Drop for Walker {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.wake.notify_all();
    }
}

impl WalkerShared {
    /// The highest CPU number of the broker's topology, once noted.
    fn highest_cpu(&self) -> Option<u32> {
        let highest = self.highest_cpu.load(Ordering::Relaxed);
        (highest != u32::MAX).then_some(highest)
    }

    /// The walk thread: one wanted walk at a time, until the walker is dropped.
    fn run(&self, sender: &watch::Sender<Option<Arc<Done>>>) {
        let mut stepds = stepd::Stepds::new(self.procfs.clone());
        loop {
            let permit = {
                let mut state = lock(&self.state);
                loop {
                    if state.closed {
                        return;
                    }
                    // Nobody waits for a walk whose scrapes all ended meanwhile.
                    let wanted = std::mem::take(&mut state.wanted);
                    if let Some(permit) = wanted.iter().find_map(QueuedPermit::upgrade) {
                        state.running = Some(Instant::now());
                        break permit;
                    }
                    state =
                        self.wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            self.walks.fetch_add(1, Ordering::Relaxed);
            let began = Instant::now();
            let limits = Limits::for_highest_cpu(self.highest_cpu());
            let result = read(&self.root, limits).map(|mut walk| {
                stepds.resolve(&self.root, &mut walk.hierarchy);
                walk
            });
            sender.send_replace(Some(Arc::new(Done { began, result })));
            lock(&self.state).running = None;
            // The walk has ended: the place in --web.max-requests it held is free.
            drop(permit);
        }
    }
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

/// Logs the cgroups a walk skipped when their cause changes, and when none are skipped again.
#[derive(Debug, Default)]
pub(crate) struct SkipLog {
    last: Mutex<Option<io::ErrorKind>>,
}

impl SkipLog {
    /// Records what `walk` skipped; logs it (and says so) if the cause differs from the last.
    pub(crate) fn record(&self, walk: &Walk) -> bool {
        let cause = walk.first_skipped.as_ref().map(|(_, kind)| *kind);
        let mut last = lock(&self.last);
        if *last == cause {
            return false;
        }
        *last = cause;
        match &walk.first_skipped {
            Some((path, kind)) => tracing::warn!(
                skipped = walk.skipped,
                first = %path.display(),
                cause = %io::Error::from(*kind),
                "core-owner: cgroups this process may not read are skipped with their subtrees; \
                 the cores they may hold are unassigned, counted in \
                 amd_hsmp_core_owner_skipped_cgroups, logged again only when the cause changes"
            ),
            None => tracing::info!("core-owner: no cgroup is skipped any more"),
        }
        true
    }
}

#[cfg(test)]
mod tests;
