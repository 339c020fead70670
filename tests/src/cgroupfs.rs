//! A cgroup filesystem whose reads can block: a read-only FUSE passthrough of a directory tree
//! (one written by `cgroups.rs`) that holds the reads, and optionally the opens, of the files
//! a test names, without tying up a FUSE thread, until the test releases them. It stands in
//! for a cgroupfs whose kernel side is stuck, so that tests of the core-owner collector
//! (`--path.cgroupfs`) can hold its walk at a chosen file and count what it read.
//!
//! Every lookup, `getattr`, `readdir` and `read` serves what is on disk in the source at that
//! moment, so a test may change the tree while it is mounted. Inode numbers are stable per
//! path. File modes and owners pass through and the kernel checks them (`default_permissions`),
//! so a source directory of mode 0700 is closed to other uids through the mount too. A
//! directory's link count is 2 plus its subdirectories, as cgroupfs and tmpfs report it (the
//! collector takes `nlink == 2` for a leaf), whatever the source's filesystem says.
//!
//! Any uid may use the mount (`allow_other`, [`SessionACL::All`]): the exporter under test may
//! run as another user than the test. fusermount3 grants that to root; others need
//! `user_allow_other` in `/etc/fuse.conf`, as for the fake device (whose `RootAndOwner` mounts
//! with `allow_other` too).

use crate::fake;
use fuser::{
    BackgroundSession, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEntry, ReplyOpen, Request, SessionACL,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Held requests take no thread, so a few serve a walk and the test's own reads.
const FUSE_THREADS: usize = 4;
const ROOT: u64 = 1;
/// Nothing is cached by the kernel: every access reaches the source as it is now.
const TTL: Duration = Duration::ZERO;

/// Which files a [`BlockingCgroupfs::block`] matches: a bare file name matches that name in
/// every directory; a path with a `/` matches that one path from the root.
#[derive(Debug, Clone)]
struct Pattern(PathBuf);

impl Pattern {
    fn matches(&self, path: &Path) -> bool {
        if self.0.components().count() == 1 {
            path.file_name() == Some(self.0.as_os_str())
        } else {
            path == self.0
        }
    }

    /// The sum of `counts` over the paths this matches.
    fn count(&self, counts: &HashMap<PathBuf, usize>) -> usize {
        counts.iter().filter(|(p, _)| self.matches(p)).map(|(_, n)| n).sum()
    }
}

/// A request held unanswered, with what answers it.
#[derive(Debug)]
enum Held {
    Read { path: PathBuf, offset: u64, size: u32, reply: ReplyData },
    Open { reply: ReplyOpen },
}

/// What the test controls and observes.
#[derive(Debug, Default)]
struct State {
    /// Directories whose entries and listing are refused with `EACCES`, as a `chmod 0700`
    /// directory is to another uid.
    denied: Vec<Pattern>,
    block_reads: Vec<Pattern>,
    block_opens: Vec<Pattern>,
    held: Vec<Held>,
    /// Read requests received, by path from the root.
    reads: HashMap<PathBuf, usize>,
    /// Open requests of files received, by path from the root.
    opens: HashMap<PathBuf, usize>,
}

/// Paths from the root by inode number (`ROOT` is the empty path), and back.
#[derive(Debug)]
struct Inodes {
    paths: Vec<PathBuf>,
    numbers: HashMap<PathBuf, u64>,
}

impl Inodes {
    fn number(&mut self, path: &Path) -> u64 {
        if let Some(&ino) = self.numbers.get(path) {
            return ino;
        }
        self.paths.push(path.to_owned());
        let ino = self.paths.len() as u64;
        self.numbers.insert(path.to_owned(), ino);
        ino
    }

    fn path(&self, ino: u64) -> Option<PathBuf> {
        let index = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.paths.get(index).cloned()
    }
}

#[derive(Debug)]
struct Shared {
    source: PathBuf,
    inodes: Mutex<Inodes>,
    state: Mutex<State>,
    /// Signalled whenever a read or open arrives.
    arrived: Condvar,
}

/// Locks `m`; a test thread that panicked while holding it leaves plain data behind.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn errno(e: &io::Error) -> fuser::Errno {
    fuser::Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind(t: std::fs::FileType) -> FileType {
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_fifo() {
        FileType::NamedPipe
    } else if t.is_char_device() {
        FileType::CharDevice
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else if t.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

/// The content of `path` from `offset`, at most `size` bytes.
fn read_at(path: &Path, offset: u64, size: u32) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut out = vec![0; size as usize];
    let mut filled = 0;
    while filled < out.len() {
        match file.read_at(&mut out[filled..], offset + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    out.truncate(filled);
    Ok(out)
}

/// Answers a held request as it would have been answered at once, from the source as it is now.
fn answer(source: &Path, held: Held) {
    match held {
        Held::Read { path, offset, size, reply } => match read_at(&source.join(path), offset, size)
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        },
        Held::Open { reply } => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
    }
}

impl Shared {
    fn denied(&self, dir: &Path) -> bool {
        lock(&self.state).denied.iter().any(|p| p.matches(dir))
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, fuser::Errno> {
        lock(&self.inodes).path(ino.0).ok_or(fuser::Errno::ENOENT)
    }

    /// The attributes of `path` (from the root) as the source has them now.
    fn attr(&self, path: &Path) -> io::Result<FileAttr> {
        let full = self.source.join(path);
        let md = std::fs::symlink_metadata(&full)?;
        let kind = kind(md.file_type());
        let nlink = if kind == FileType::Directory {
            subdirectories(&full)? + 2
        } else {
            md.nlink() as u32
        };
        let time = |t: io::Result<SystemTime>| t.unwrap_or(UNIX_EPOCH);
        Ok(FileAttr {
            ino: INodeNo(lock(&self.inodes).number(path)),
            size: md.size(),
            blocks: md.blocks(),
            atime: time(md.accessed()),
            mtime: time(md.modified()),
            ctime: UNIX_EPOCH + Duration::new(md.ctime().max(0) as u64, md.ctime_nsec() as u32),
            crtime: time(md.created()),
            kind,
            perm: (md.mode() & 0o7777) as u16,
            nlink,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: md.blksize() as u32,
            flags: 0,
        })
    }
}

fn subdirectories(dir: &Path) -> io::Result<u32> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        if entry?.file_type()?.is_dir() {
            n += 1;
        }
    }
    Ok(n)
}

/// The FUSE side of [`Shared`].
#[derive(Debug)]
struct Passthrough(Arc<Shared>);

impl Filesystem for Passthrough {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.0.path(parent) {
            Ok(parent) if self.0.denied(&parent) => return reply.error(fuser::Errno::EACCES),
            Ok(parent) => parent.join(name),
            Err(e) => return reply.error(e),
        };
        match self.0.attr(&path) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.path(ino).map(|p| self.0.attr(&p).map_err(|e| errno(&e))) {
            Ok(Ok(attr)) => reply.attr(&TTL, &attr),
            Ok(Err(e)) | Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let path = match self.0.path(ino) {
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        match std::fs::read_link(self.0.source.join(path)) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let path = match self.0.path(ino) {
            Ok(path) if self.0.denied(&path) => return reply.error(fuser::Errno::EACCES),
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        let listing = std::fs::read_dir(self.0.source.join(&path)).and_then(|dir| {
            let mut names = Vec::new();
            for entry in dir {
                let entry = entry?;
                names.push((entry.file_name(), kind(entry.file_type()?)));
            }
            Ok(names)
        });
        let mut names = match listing {
            Ok(names) => names,
            Err(e) => return reply.error(errno(&e)),
        };
        // Sorted, so that a listing read in several requests stays in one order.
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let parent = path.parent().map_or(ROOT, |p| lock(&self.0.inodes).number(p));
        let mut entries = vec![
            (ino.0, FileType::Directory, OsStr::new(".").to_owned()),
            (parent, FileType::Directory, OsStr::new("..").to_owned()),
        ];
        {
            let mut inodes = lock(&self.0.inodes);
            entries.extend(names.into_iter().map(|(n, k)| (inodes.number(&path.join(&n)), k, n)));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(fuser::Errno::EROFS);
        }
        let path = match self.0.path(ino) {
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = std::fs::symlink_metadata(self.0.source.join(&path)) {
            return reply.error(errno(&e));
        }
        let mut state = lock(&self.0.state);
        *state.opens.entry(path.clone()).or_default() += 1;
        self.0.arrived.notify_all();
        if state.block_opens.iter().any(|p| p.matches(&path)) {
            state.held.push(Held::Open { reply });
        } else {
            drop(state);
            // Direct I/O: every read reaches the filesystem, uncached, so it can be held.
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let path = match self.0.path(ino) {
            Ok(path) => path,
            Err(e) => return reply.error(e),
        };
        let mut state = lock(&self.0.state);
        *state.reads.entry(path.clone()).or_default() += 1;
        self.0.arrived.notify_all();
        let blocked = state.block_reads.iter().any(|p| p.matches(&path));
        let held = Held::Read { path, offset, size, reply };
        if blocked {
            state.held.push(held);
        } else {
            drop(state);
            answer(&self.0.source, held);
        }
    }
}

/// The blocking cgroup filesystem, mounted: see the module's documentation. Dropping it answers the
/// held requests, then unmounts it (lazily, so a process still inside the mount cannot keep it
/// alive) and removes the mount point.
#[derive(Debug)]
pub struct BlockingCgroupfs {
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    _dir: tempfile::TempDir,
}

impl BlockingCgroupfs {
    /// Mounts a read-only passthrough of the directory `source` on a new temporary directory
    /// that any uid may enter.
    ///
    /// The mount goes through `fusermount3` with `auto_unmount`, so even a test process killed
    /// outright leaves no mount behind.
    pub fn mount(source: &Path) -> io::Result<BlockingCgroupfs> {
        let source = source.canonicalize()?;
        if !source.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let dir = tempfile::Builder::new().prefix("amd-hsmp-cgroupfs-").tempdir()?;
        // Open to the exporter's uid, which need not be the test's.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let mountpoint = dir.path().join("cgroup");
        std::fs::create_dir(&mountpoint)?;
        let mut inodes = Inodes { paths: Vec::new(), numbers: HashMap::new() };
        inodes.number(Path::new(""));
        let shared = Arc::new(Shared {
            source,
            inodes: Mutex::new(inodes),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        });
        let fs = Passthrough(Arc::clone(&shared));
        let extra = [MountOption::RO, MountOption::NoDev, MountOption::DefaultPermissions];
        let session = fake::spawn(
            fs,
            &mountpoint,
            "amd-hsmp-cgroupfs",
            SessionACL::All,
            FUSE_THREADS,
            &extra,
        )?;
        Ok(BlockingCgroupfs { shared, session: Some(session), mountpoint, _dir: dir })
    }

    /// The mount point: the path to pass as `--path.cgroupfs`.
    pub fn root(&self) -> &Path {
        &self.mountpoint
    }

    /// From now on, a read of a file matching `file` is held unanswered until
    /// [`release`](Self::release): `file` is a bare name (`cpuset.cpus.effective`, in every
    /// cgroup) or a path from the root (`system.slice/cgroup.controllers`).
    pub fn block(&self, file: impl AsRef<Path>) {
        lock(&self.shared.state).block_reads.push(Pattern(file.as_ref().to_owned()));
    }

    /// From now on, the directory `dir` (a bare name matches in every directory, a path with
    /// `/` from the root) refuses its listing and every lookup in it with `EACCES`, for every
    /// caller, root included: what a user's `chmod 0700` of a cgroup they own is to the
    /// exporter's user. `release` lifts it.
    pub fn deny(&self, dir: impl AsRef<Path>) {
        lock(&self.shared.state).denied.push(Pattern(dir.as_ref().to_owned()));
    }

    /// As [`block`](Self::block), for the `open` of a matching file.
    pub fn block_open(&self, file: impl AsRef<Path>) {
        lock(&self.shared.state).block_opens.push(Pattern(file.as_ref().to_owned()));
    }

    /// Answers every held request as it would have been answered (a read with the file's
    /// content now) and stops blocking.
    pub fn release(&self) {
        let held = {
            let mut state = lock(&self.shared.state);
            state.block_reads.clear();
            state.block_opens.clear();
            state.denied.clear();
            std::mem::take(&mut state.held)
        };
        for h in held {
            answer(&self.shared.source, h);
        }
    }

    /// How many reads and opens are held now.
    pub fn held(&self) -> usize {
        lock(&self.shared.state).held.len()
    }

    /// Read requests received so far for the files matching `file` (as in
    /// [`block`](Self::block)), held or answered. A read of a whole small file is two requests:
    /// the content, then the empty read at its end.
    pub fn reads(&self, file: impl AsRef<Path>) -> usize {
        let pattern = Pattern(file.as_ref().to_owned());
        pattern.count(&lock(&self.shared.state).reads)
    }

    /// Read requests received so far for any file.
    pub fn total_reads(&self) -> usize {
        lock(&self.shared.state).reads.values().sum()
    }

    /// Opens of files received so far for the files matching `file`, held or answered.
    pub fn opens(&self, file: impl AsRef<Path>) -> usize {
        let pattern = Pattern(file.as_ref().to_owned());
        pattern.count(&lock(&self.shared.state).opens)
    }

    /// Waits until at least `n` requests are held; false if `timeout` passed first.
    pub fn wait_held(&self, n: usize, timeout: Duration) -> bool {
        self.wait(timeout, |s| s.held.len() >= n)
    }

    /// Waits until at least `n` reads of files matching `file` have arrived; false if
    /// `timeout` passed first.
    pub fn wait_reads(&self, file: impl AsRef<Path>, n: usize, timeout: Duration) -> bool {
        let pattern = Pattern(file.as_ref().to_owned());
        self.wait(timeout, |s| pattern.count(&s.reads) >= n)
    }

    fn wait(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        while !done(&state) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            state = self
                .shared
                .arrived
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Answers the held requests and unmounts now; also done on drop.
    pub fn unmount(&mut self) {
        self.release();
        if let Some(session) = self.session.take() {
            fake::detach(&self.mountpoint, session);
        }
    }
}

impl Drop for BlockingCgroupfs {
    fn drop(&mut self) {
        self.unmount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{self, Layout};
    use crate::fake::is_mount_point;
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::sync::mpsc;

    const JOB: &str = "system.slice/slurmstepd.scope/job_4243";
    const WAIT: Duration = Duration::from_secs(10);

    /// The Slurm layout of a Turin 2P under `dir/cgroup`, and the filesystem serving it.
    fn slurm(dir: &Path) -> (PathBuf, BlockingCgroupfs) {
        let topology = crate::fixtures::machine("turin-2p").unwrap().topology();
        let source = dir.join("cgroup");
        cgroups::write_layout(Layout::Slurm, &topology, &source).unwrap();
        let fs = BlockingCgroupfs::mount(&source)
            .expect("mount the cgroupfs (needs /dev/fuse and fusermount3 from fuse3)");
        (source, fs)
    }

    /// Every directory under `root` (itself included), as paths from it.
    fn directories(root: &Path) -> Vec<PathBuf> {
        let mut out = vec![PathBuf::new()];
        let mut i = 0;
        while let Some(dir) = out.get(i).cloned() {
            for entry in std::fs::read_dir(root.join(&dir)).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    out.push(dir.join(entry.file_name()));
                }
            }
            i += 1;
        }
        out.sort();
        out
    }

    fn listing(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut names: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    }

    /// Reads `path` on a new thread; the content (or error) arrives on the channel.
    fn read_in_background(path: PathBuf) -> mpsc::Receiver<io::Result<String>> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::read_to_string(path));
        });
        rx
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn the_mount_mirrors_a_written_layout_and_its_link_counts() {
        let dir = tempfile::tempdir().unwrap();
        let (source, fs) = slurm(dir.path());
        let dirs = directories(&source);
        assert_eq!(directories(fs.root()), dirs);
        let (mut leaves, mut inner) = (0, 0);
        for d in &dirs {
            let (src, mnt) = (source.join(d), fs.root().join(d));
            assert_eq!(listing(&mnt), listing(&src), "{}", d.display());
            let (src_md, mnt_md) =
                (std::fs::metadata(&src).unwrap(), std::fs::metadata(&mnt).unwrap());
            let subdirs = std::fs::read_dir(&src)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
                .count() as u64;
            assert_eq!(mnt_md.nlink(), 2 + subdirs, "{}", d.display());
            assert_eq!(mnt_md.nlink(), src_md.nlink(), "{}", d.display());
            assert_eq!((mnt_md.mode(), mnt_md.uid()), (src_md.mode(), src_md.uid()));
            if subdirs == 0 {
                leaves += 1
            } else {
                inner += 1
            }
            for name in listing(&src) {
                let file = src.join(&name);
                if file.is_file() {
                    assert_eq!(
                        std::fs::read(mnt.join(&name)).unwrap(),
                        std::fs::read(&file).unwrap(),
                        "{}",
                        file.display()
                    );
                }
            }
        }
        assert!(leaves > 5 && inner > 5, "{leaves} leaves, {inner} inner cgroups");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let job = fs.root().join(JOB);
        let before = ino(&job.join("cpuset.cpus.effective"));

        // Changes to the source show at once; inode numbers stay with their paths.
        std::fs::write(source.join(JOB).join("cpuset.cpus.effective"), "7\n").unwrap();
        std::fs::create_dir(source.join(JOB).join("new")).unwrap();
        assert_eq!(std::fs::read_to_string(job.join("cpuset.cpus.effective")).unwrap(), "7\n");
        assert_eq!(ino(&job.join("cpuset.cpus.effective")), before);
        assert_eq!(std::fs::metadata(job.join("new")).unwrap().nlink(), 2);
        assert_eq!(std::fs::metadata(&job).unwrap().nlink(), 2 + 3);
        assert_eq!(fs.reads(JOB.to_owned() + "/cpuset.cpus.effective"), 4, "two whole reads");
        assert!(fs.total_reads() > dirs.len());
        assert_eq!(fs.held(), 0);
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_blocked_read_holds_while_other_files_read_and_release_answers_it() {
        let dir = tempfile::tempdir().unwrap();
        let (source, fs) = slurm(dir.path());
        let job = fs.root().join(JOB);
        fs.block("cpuset.cpus.effective");
        let held = read_in_background(job.join("cpuset.cpus.effective"));
        assert!(fs.wait_held(1, WAIT), "the read never arrived");
        assert_eq!(fs.reads("cpuset.cpus.effective"), 1);

        // The held read takes no FUSE thread: more of them than threads, and other files read.
        let others: Vec<_> = (0..FUSE_THREADS)
            .map(|_| read_in_background(fs.root().join("cpuset.cpus.effective")))
            .collect();
        assert!(fs.wait_held(1 + FUSE_THREADS, WAIT));
        assert_eq!(
            std::fs::read_to_string(job.join("cgroup.controllers")).unwrap(),
            std::fs::read_to_string(source.join(JOB).join("cgroup.controllers")).unwrap()
        );
        assert_eq!(listing(&job), listing(&source.join(JOB)));
        assert_eq!(std::fs::metadata(&job).unwrap().nlink(), 4);
        assert!(matches!(held.try_recv(), Err(mpsc::TryRecvError::Empty)));
        assert_eq!(fs.held(), 1 + FUSE_THREADS);

        // Released with what is on disk at release.
        std::fs::write(source.join(JOB).join("cpuset.cpus.effective"), "3-4\n").unwrap();
        fs.release();
        assert_eq!(held.recv_timeout(WAIT).unwrap().unwrap(), "3-4\n");
        let all = std::fs::read_to_string(source.join("cpuset.cpus.effective")).unwrap();
        for other in others {
            assert_eq!(other.recv_timeout(WAIT).unwrap().unwrap(), all);
        }
        assert_eq!(fs.held(), 0);
        assert_eq!(std::fs::read_to_string(job.join("cpuset.cpus.effective")).unwrap(), "3-4\n");
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_blocked_open_holds_until_release() {
        let dir = tempfile::tempdir().unwrap();
        let (_source, fs) = slurm(dir.path());
        let path = format!("{JOB}/cgroup.controllers");
        fs.block_open(&path);
        let held = read_in_background(fs.root().join(&path));
        assert!(fs.wait_held(1, WAIT), "the open never arrived");
        assert_eq!((fs.opens(&path), fs.reads(&path)), (1, 0));
        assert!(std::fs::read_to_string(fs.root().join(JOB).join("cgroup.type")).is_ok());
        assert!(matches!(held.try_recv(), Err(mpsc::TryRecvError::Empty)));
        fs.release();
        assert_eq!(held.recv_timeout(WAIT).unwrap().unwrap(), "cpuset cpu io memory pids\n");
        assert_eq!(fs.reads(&path), 2);
    }

    /// Runs `program args` as uid and gid 65534; whether it succeeded, with its stderr.
    fn as_nobody(program: &str, args: &[&Path]) -> (bool, String) {
        let out = Command::new(program).args(args).uid(65534).gid(65534).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_closed_cgroup_is_refused_to_another_uid_through_the_mount() {
        assert!(rustix::process::geteuid().is_root(), "this test switches uid");
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (source, fs) = slurm(dir.path());
        let job = fs.root().join(JOB);
        let file = job.join("cpuset.cpus.effective");
        // Open to everyone first: what refuses below is the mode, not the mount's ACL.
        assert_eq!(as_nobody("cat", &[&file]), (true, String::new()));
        assert!(as_nobody("ls", &[&job]).0);

        cgroups::make_unreadable(&source, JOB).unwrap();
        let (ok, err) = as_nobody("cat", &[&file]);
        assert!(!ok && err.contains("Permission denied"), "{err}");
        let (ok, err) = as_nobody("ls", &[&job]);
        assert!(!ok && err.contains("Permission denied"), "{err}");
        assert!(as_nobody("ls", &[job.parent().unwrap()]).0, "the parent stays open");
        assert!(std::fs::read_to_string(&file).is_ok(), "root still reads it");
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn dropping_it_answers_a_held_read_and_unmounts() {
        let dir = tempfile::tempdir().unwrap();
        let (source, fs) = slurm(dir.path());
        let root = fs.root().to_owned();
        assert!(is_mount_point(&root));
        fs.block("cgroup.controllers");
        let held = read_in_background(root.join(JOB).join("cgroup.controllers"));
        assert!(fs.wait_held(1, WAIT));
        drop(fs);
        assert!(!is_mount_point(&root));
        assert!(!root.exists());
        let content = std::fs::read_to_string(source.join(JOB).join("cgroup.controllers")).unwrap();
        assert_eq!(held.recv_timeout(WAIT).unwrap().unwrap(), content);
    }
}
