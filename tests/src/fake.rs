//! The fake device: a FUSE filesystem serving an `hsmp` node that answers
//! `ioctl(fd, HSMP_IOCTL_CMD, &hsmp_message)` and a `cpu/<N>/msr` tree that answers `pread` at
//! the MSR offset, so the broker's real `ioctl` and `pread` code runs unchanged against it.
//!
//! The kernel copies the 44 bytes of an `_IOWR` ioctl in and out for a regular FUSE file, so the
//! node only has to forward the message to the [`HsmpTransport`] opened for that descriptor (the
//! simulator's model of the driver: its checks, per-socket lock, latency and timeouts) and hand
//! the answer or errno back. What belongs to the file rather than the driver lives here:
//! presence and permission of each node (switchable while mounted, for a device that appears
//! late), replacing the node under open descriptors, how each descriptor was opened, and a
//! record of every open, message and MSR read for the wire-level assertions.

use amd_hsmp_device::{Errno, HSMP_IOCTL_CMD, HsmpMessage, HsmpTransport, MsrOpener, MsrTransport};
use amd_hsmp_sim::{AccessMode, FirmwareConfig, Machine, MachineSpec, Mode};
use fuser::{
    BackgroundSession, Config, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, IoctlFlags, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEntry, ReplyIoctl, ReplyOpen, Request, SessionACL,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

/// Whether a device node exists and may be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// The node exists and opens.
    #[default]
    Present,
    /// The node does not exist (`ENOENT`): module not loaded, HSMP disabled, not an EPYC.
    Absent,
    /// The node exists but opening it is refused: `EACCES` for `hsmp` (file mode),
    /// `EPERM` for an MSR node (the MSR driver's `CAP_SYS_RAWIO` check).
    Denied,
}

/// Which node an open or read touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// The `hsmp` node.
    Hsmp,
    /// `cpu/<N>/msr`.
    Msr(u32),
}

/// One `open()` of a device node, as the fake saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRecord {
    /// The node.
    pub node: Node,
    /// The `open()` flags (`O_RDONLY`, `O_RDWR`, ...), as the kernel passed them on.
    pub flags: i32,
    /// The process that opened it (thread group id, not the thread's id).
    pub pid: u32,
    /// What the open returned.
    pub result: Result<(), Errno>,
}

impl OpenRecord {
    /// Whether the node was opened for reading only.
    pub fn read_only(&self) -> bool {
        self.flags & libc::O_ACCMODE == libc::O_RDONLY
    }
}

/// One `ioctl(HSMP_IOCTL_CMD)` as it crossed the fake node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireMessage {
    /// `msg_id`.
    pub msg_id: u32,
    /// `sock_ind`.
    pub sock_ind: u16,
    /// `args[0]` as sent (the APIC id for the per-core messages).
    pub arg0: u32,
    /// `num_args` as sent.
    pub num_args: u16,
    /// `response_sz` as sent.
    pub response_sz: u16,
    /// What the ioctl returned.
    pub result: Result<(), Errno>,
}

/// One HSMP message with when it reached the fake device and what it answered: the value of
/// a per-core reading was read no earlier than `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedMessage {
    pub message: WireMessage,
    /// When the ioctl reached the fake device.
    pub at: std::time::Instant,
    /// `args[0]` and `args[1]` after the call: the reply words of an answered message.
    pub reply: [u32; 2],
}

/// One `pread` of an MSR node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsrRead {
    /// The CPU whose node was read.
    pub cpu: u32,
    /// The register (the file offset).
    pub msr: u32,
    /// What the read returned.
    pub result: Result<(), Errno>,
}

/// What answers the `hsmp` node: a new transport per `open()`, told how the descriptor was
/// opened, since the driver's checks depend on it (a SET on a read-only descriptor is `EPERM`).
pub trait HsmpNode: Send + Sync + std::fmt::Debug {
    /// Opens one descriptor; the errno is returned by `open()`.
    fn open(&self, access: AccessMode) -> Result<Arc<dyn HsmpTransport>, Errno>;
}

/// The simulated machine's driver and firmware: the same model `--simulate` serves in process.
impl HsmpNode for Arc<Machine> {
    fn open(&self, access: AccessMode) -> Result<Arc<dyn HsmpTransport>, Errno> {
        Ok(Arc::new(self.open_hsmp(access)?))
    }
}

/// What the fake device serves.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// Answers the `hsmp` node: the driver and firmware model.
    pub hsmp: Arc<dyn HsmpNode>,
    /// Opens the MSRs of one CPU for each `cpu/<N>/msr` node.
    pub msr: Arc<dyn MsrOpener>,
    /// The CPUs that have an MSR node (the online ones).
    pub cpus: Vec<u32>,
    /// Initial state of the `hsmp` node.
    pub hsmp_state: NodeState,
    /// Initial state of every `cpu/<N>/msr` node (and of `cpu/` itself when absent).
    pub msr_state: NodeState,
}

const ROOT: u64 = 1;
const HSMP: u64 = 2;
const CPU_DIR: u64 = 3;
const CPU_BASE: u64 = 1 << 32;
const MSR_BASE: u64 = 2 << 32;
/// The fake serves few enough requests at once that this covers a busy socket per thread.
const FUSE_THREADS: usize = 8;
/// Large enough for every MSR offset: a read is never cut short by the file size.
const MSR_FILE_SIZE: u64 = 1 << 40;

/// An open descriptor of a node.
#[derive(Debug, Clone)]
enum Handle {
    /// Opened when the `hsmp` node was in its `generation`; see [`FakeDevice::replace_hsmp`].
    Hsmp {
        generation: u64,
        device: Arc<dyn HsmpTransport>,
    },
    Msr {
        cpu: u32,
        device: Arc<dyn MsrTransport>,
    },
}

/// State shared between the FUSE threads and the test.
#[derive(Debug)]
struct Shared {
    config: FakeConfig,
    hsmp_state: Mutex<NodeState>,
    /// The `hsmp` node's group and permission bits (its owner is root).
    hsmp_owner: Mutex<(u32, u16)>,
    msr_state: Mutex<NodeState>,
    /// Bumped each time the `hsmp` node is replaced.
    hsmp_generation: AtomicU64,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    opens: Mutex<Vec<OpenRecord>>,
    messages: Mutex<Vec<TimedMessage>>,
    msr_reads: Mutex<Vec<MsrRead>>,
    created: SystemTime,
}

/// Locks `m`; a test thread that panicked while holding it leaves plain data behind, so the
/// poison is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn attr(&self, ino: u64, kind: FileType, perm: u16, size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            crtime: self.created,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    fn has_cpu(&self, cpu: u32) -> bool {
        self.config.cpus.contains(&cpu)
    }

    fn msr_present(&self) -> bool {
        *lock(&self.msr_state) != NodeState::Absent
    }

    /// The attributes of `ino`, or `None` if it does not exist right now.
    fn lookup_ino(&self, ino: u64) -> Option<FileAttr> {
        match ino {
            ROOT => Some(self.attr(ROOT, FileType::Directory, 0o755, 0)),
            HSMP if *lock(&self.hsmp_state) != NodeState::Absent => {
                let (gid, mode) = *lock(&self.hsmp_owner);
                Some(FileAttr { gid, ..self.attr(HSMP, FileType::RegularFile, mode, 0) })
            }
            CPU_DIR if self.msr_present() => {
                Some(self.attr(CPU_DIR, FileType::Directory, 0o755, 0))
            }
            ino if (CPU_BASE..MSR_BASE).contains(&ino) => {
                let cpu = (ino - CPU_BASE) as u32;
                (self.msr_present() && self.has_cpu(cpu))
                    .then(|| self.attr(ino, FileType::Directory, 0o755, 0))
            }
            ino if ino >= MSR_BASE => {
                let cpu = (ino - MSR_BASE) as u32;
                (self.msr_present() && self.has_cpu(cpu))
                    .then(|| self.attr(ino, FileType::RegularFile, 0o600, MSR_FILE_SIZE))
            }
            _ => None,
        }
    }

    fn child(&self, parent: u64, name: &str) -> Option<u64> {
        match (parent, name) {
            (ROOT, "hsmp") => Some(HSMP),
            (ROOT, "cpu") => Some(CPU_DIR),
            (CPU_DIR, n) => n.parse::<u32>().ok().map(|cpu| CPU_BASE + u64::from(cpu)),
            (p, "msr") if (CPU_BASE..MSR_BASE).contains(&p) => Some(p - CPU_BASE + MSR_BASE),
            _ => None,
        }
        .filter(|&ino| self.lookup_ino(ino).is_some())
    }

    fn open_node(&self, node: Node, flags: OpenFlags) -> Result<Handle, Errno> {
        match node {
            Node::Hsmp => match *lock(&self.hsmp_state) {
                NodeState::Present => {
                    let access = match flags.acc_mode() {
                        OpenAccMode::O_RDONLY => AccessMode::ReadOnly,
                        OpenAccMode::O_WRONLY => AccessMode::WriteOnly,
                        OpenAccMode::O_RDWR => AccessMode::ReadWrite,
                    };
                    let generation = self.hsmp_generation.load(Ordering::SeqCst);
                    Ok(Handle::Hsmp { generation, device: self.config.hsmp.open(access)? })
                }
                NodeState::Absent => Err(libc::ENOENT),
                NodeState::Denied => Err(libc::EACCES),
            },
            Node::Msr(cpu) => {
                match *lock(&self.msr_state) {
                    NodeState::Present => {}
                    NodeState::Absent => return Err(libc::ENOENT),
                    NodeState::Denied => return Err(libc::EPERM),
                }
                // The MSR driver refuses writers without CAP_SYS_RAWIO like readers; the
                // broker never writes, so a writable open here is a bug worth failing on.
                if flags.acc_mode() != OpenAccMode::O_RDONLY {
                    return Err(libc::EPERM);
                }
                let device = self.config.msr.open(cpu)?;
                Ok(Handle::Msr { cpu, device: Arc::from(device) })
            }
        }
    }

    /// Sends one message on a descriptor of generation `generation`: a descriptor of a node
    /// that has since been replaced answers `ENODEV`, as the driver does once its device is
    /// gone.
    fn send(
        &self,
        generation: u64,
        device: &dyn HsmpTransport,
        msg: &mut HsmpMessage,
    ) -> Result<(), Errno> {
        if generation != self.hsmp_generation.load(Ordering::SeqCst) {
            return Err(libc::ENODEV);
        }
        device.send(msg)
    }

    fn read_msr(
        &self,
        cpu: u32,
        device: &dyn MsrTransport,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        // msr.c: reads come in whole registers; the offset is the register number.
        if !size.is_multiple_of(8) {
            return Err(libc::EINVAL);
        }
        let msr = offset as u32;
        let mut out = Vec::with_capacity(size as usize);
        for _ in 0..size / 8 {
            let result = device.read(msr);
            lock(&self.msr_reads).push(MsrRead { cpu, msr, result: result.map(|_| ()) });
            out.extend_from_slice(&result?.to_le_bytes());
        }
        Ok(out)
    }
}

/// The FUSE side of [`Shared`].
#[derive(Debug)]
struct FakeFs(Arc<Shared>);

const TTL: Duration = Duration::ZERO;

fn errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e)
}

impl Filesystem for FakeFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let attr = name
            .to_str()
            .and_then(|n| self.0.child(parent.0, n))
            .and_then(|i| self.0.lookup_ino(i));
        match attr {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.lookup_ino(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(fuser::Errno::ENOENT),
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
        let mut entries: Vec<(u64, FileType, String)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ROOT, FileType::Directory, "..".into()),
        ];
        match ino.0 {
            ROOT => {
                if self.0.lookup_ino(HSMP).is_some() {
                    entries.push((HSMP, FileType::RegularFile, "hsmp".into()));
                }
                if self.0.msr_present() {
                    entries.push((CPU_DIR, FileType::Directory, "cpu".into()));
                }
            }
            CPU_DIR => entries.extend(
                self.0
                    .config
                    .cpus
                    .iter()
                    .map(|&c| (CPU_BASE + u64::from(c), FileType::Directory, c.to_string())),
            ),
            i if (CPU_BASE..MSR_BASE).contains(&i) => {
                entries.push((i - CPU_BASE + MSR_BASE, FileType::RegularFile, "msr".into()));
            }
            _ => return reply.error(fuser::Errno::ENOTDIR),
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let node = match ino.0 {
            HSMP => Node::Hsmp,
            i if i >= MSR_BASE => Node::Msr((i - MSR_BASE) as u32),
            _ => return reply.error(fuser::Errno::EISDIR),
        };
        let result = self.0.open_node(node, flags);
        lock(&self.0.opens).push(OpenRecord {
            node,
            flags: flags.0,
            pid: tgid(req.pid()),
            result: result.as_ref().map(|_| ()).map_err(|e| *e),
        });
        match result {
            Ok(handle) => {
                let fh = self.0.next_fh.fetch_add(1, Ordering::Relaxed);
                lock(&self.0.handles).insert(fh, handle);
                // Direct I/O: every pread reaches the fake, at its offset, uncached.
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        lock(&self.0.handles).remove(&fh.0);
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handle = lock(&self.0.handles).get(&fh.0).cloned();
        match handle {
            Some(Handle::Msr { cpu, device }) => {
                match self.0.read_msr(cpu, device.as_ref(), offset, size) {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(errno(e)),
                }
            }
            // The HSMP driver has no read operation.
            Some(Handle::Hsmp { .. }) => reply.error(fuser::Errno::EINVAL),
            None => reply.error(fuser::Errno::EBADF),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let handle = lock(&self.0.handles).get(&fh.0).cloned();
        let (Some(Handle::Hsmp { generation, device }), HSMP_IOCTL_CMD) = (handle, cmd) else {
            return reply.error(fuser::Errno::ENOTTY);
        };
        let Ok(bytes) = <&[u8; HsmpMessage::SIZE]>::try_from(in_data) else {
            return reply.error(fuser::Errno::EFAULT);
        };
        let mut msg = HsmpMessage::from_bytes(bytes);
        let sent = msg;
        let at = std::time::Instant::now();
        let result = self.0.send(generation, device.as_ref(), &mut msg);
        let message = WireMessage {
            msg_id: sent.msg_id,
            sock_ind: sent.sock_ind,
            arg0: sent.args[0],
            num_args: sent.num_args,
            response_sz: sent.response_sz,
            result,
        };
        let words = [msg.args[0], msg.args[1]];
        lock(&self.0.messages).push(TimedMessage { message, at, reply: words });
        match result {
            Ok(()) => reply.ioctl(0, &msg.to_bytes()),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// The fake device for machine `spec` with static firmware values and no faults: the `hsmp` node
/// present when the firmware has HSMP, an MSR node for every online CPU. Returns the machine too,
/// for the caller's own reads of the same firmware.
pub fn mount_static(spec: MachineSpec) -> std::io::Result<(Arc<Machine>, FakeDevice)> {
    let cpus: Vec<u32> = spec.cpus().iter().filter(|c| c.online).map(|c| c.cpu).collect();
    let machine = Machine::new(spec, FirmwareConfig::new(Mode::Static));
    let hsmp_state =
        if machine.firmware().has_hsmp() { NodeState::Present } else { NodeState::Absent };
    let device = FakeDevice::mount(FakeConfig {
        hsmp: Arc::new(Arc::clone(&machine)),
        msr: Arc::new(machine.msr_opener()),
        cpus,
        hsmp_state,
        msr_state: NodeState::Present,
    })?;
    Ok((machine, device))
}

/// A mounted fake device. Dropping it unmounts it (lazily, so a process still holding a
/// descriptor cannot keep the mount alive) and removes the mount point.
#[derive(Debug)]
pub struct FakeDevice {
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeDevice {
    /// Mounts a fake device serving `config` on a new temporary directory.
    ///
    /// The mount goes through `fusermount3` with `auto_unmount`, so even a test process killed
    /// outright leaves no mount behind.
    pub fn mount(config: FakeConfig) -> std::io::Result<FakeDevice> {
        let dir = tempfile::Builder::new().prefix("amd-hsmp-fake-").tempdir()?;
        let mountpoint = dir.path().join("dev");
        std::fs::create_dir(&mountpoint)?;
        let shared = Arc::new(Shared {
            hsmp_state: Mutex::new(config.hsmp_state),
            hsmp_owner: Mutex::new((0, 0o600)),
            msr_state: Mutex::new(config.msr_state),
            hsmp_generation: AtomicU64::new(0),
            config,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            opens: Mutex::new(Vec::new()),
            messages: Mutex::new(Vec::new()),
            msr_reads: Mutex::new(Vec::new()),
            created: SystemTime::now(),
        });
        let fs = FakeFs(Arc::clone(&shared));
        let session =
            spawn(fs, &mountpoint, "amd-hsmp-fake", SessionACL::RootAndOwner, FUSE_THREADS, &[])?;
        Ok(FakeDevice { shared, session: Some(session), mountpoint, _dir: dir })
    }

    /// The mount point: `hsmp` and `cpu/` are in it.
    pub fn root(&self) -> &Path {
        &self.mountpoint
    }

    /// The path to pass as `--hsmp.device`.
    pub fn hsmp_path(&self) -> PathBuf {
        self.mountpoint.join("hsmp")
    }

    /// The path to pass as `--msr.device-root`.
    pub fn msr_root(&self) -> PathBuf {
        self.mountpoint.join("cpu")
    }

    /// The broker flags that point it at this device and at the fixture tree `tree` (with its
    /// `proc/` and `sys/`).
    pub fn broker_args(&self, tree: &Path) -> Vec<String> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--hsmp.device".into(),
            path(self.hsmp_path()),
            "--msr.device-root".into(),
            path(self.msr_root()),
            "--path.procfs".into(),
            path(tree.join("proc")),
            "--path.sysfs".into(),
            path(tree.join("sys")),
        ]
    }

    /// Makes the `hsmp` node appear, vanish or refuse opens, from now on.
    pub fn set_hsmp_state(&self, state: NodeState) {
        *lock(&self.shared.hsmp_state) = state;
    }

    /// Gives the `hsmp` node group `gid` and permission bits `mode` (root owns it), as the
    /// packaged udev rule does to the driver's node (`root:amd-hsmp-broker 0640`).
    pub fn set_hsmp_owner(&self, gid: u32, mode: u16) {
        *lock(&self.shared.hsmp_owner) = (gid, mode);
    }

    /// Makes the MSR nodes appear, vanish or refuse opens, from now on.
    pub fn set_msr_state(&self, state: NodeState) {
        *lock(&self.shared.msr_state) = state;
    }

    /// Replaces the `hsmp` node, as a driver unbind and rebind does: descriptors opened so far
    /// answer every message with `ENODEV` from now on; a new `open()` works as before.
    pub fn replace_hsmp(&self) {
        self.shared.hsmp_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Every open so far, in order.
    pub fn opens(&self) -> Vec<OpenRecord> {
        lock(&self.shared.opens).clone()
    }

    /// Every HSMP message so far, in the order they were answered.
    pub fn messages(&self) -> Vec<WireMessage> {
        lock(&self.shared.messages).iter().map(|m| m.message).collect()
    }

    /// Every HSMP message so far with when it reached the device and its reply words.
    pub fn timed_messages(&self) -> Vec<TimedMessage> {
        lock(&self.shared.messages).clone()
    }

    /// Number of messages so far.
    pub fn message_count(&self) -> usize {
        lock(&self.shared.messages).len()
    }

    /// The messages from the `start`-th on (none if there are fewer), without copying the
    /// earlier ones: for long runs such as the benchmark's.
    pub fn messages_from(&self, start: usize) -> Vec<WireMessage> {
        let messages = lock(&self.shared.messages);
        messages.get(start..).map(|m| m.iter().map(|m| m.message).collect()).unwrap_or_default()
    }

    /// Number of messages so far, by message id.
    pub fn message_counts(&self) -> BTreeMap<u32, usize> {
        let mut counts = BTreeMap::new();
        for m in lock(&self.shared.messages).iter() {
            *counts.entry(m.message.msg_id).or_default() += 1;
        }
        counts
    }

    /// Every MSR read so far.
    pub fn msr_reads(&self) -> Vec<MsrRead> {
        lock(&self.shared.msr_reads).clone()
    }

    /// Unmounts now; also done on drop.
    pub fn unmount(&mut self) {
        if let Some(session) = self.session.take() {
            detach(&self.mountpoint, session);
        }
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Mounts `fs` on `mountpoint` as file system `name`, served by `threads` FUSE threads, with
/// what every test mount has besides `extra`: `auto_unmount` (even a test process killed
/// outright leaves no mount behind), `noexec` and `nosuid`.
pub(crate) fn spawn(
    fs: impl Filesystem + 'static,
    mountpoint: &Path,
    name: &str,
    acl: SessionACL,
    threads: usize,
    extra: &[MountOption],
) -> std::io::Result<BackgroundSession> {
    let mut fuse = Config::default();
    fuse.mount_options = vec![
        MountOption::FSName(name.into()),
        MountOption::AutoUnmount,
        MountOption::NoExec,
        MountOption::NoSuid,
    ];
    fuse.mount_options.extend_from_slice(extra);
    fuse.acl = acl;
    fuse.n_threads = Some(threads);
    fuser::spawn_mount(fs, mountpoint, &fuse)
}

/// Unmounts the FUSE mount at `mountpoint` served by `session`: a lazy unmount first, which
/// cannot fail with EBUSY and returns only once the mount is gone from the namespace; then the
/// session ends its threads.
pub(crate) fn detach(mountpoint: &Path, session: BackgroundSession) {
    let _ = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH);
    drop(session);
}

/// The process (thread group) of thread `tid`; FUSE reports the calling thread. The thread
/// is inside a system call on the fake, so it cannot have exited yet.
fn tgid(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Tgid:").and_then(|v| v.trim().parse().ok()))
        })
        .unwrap_or(tid)
}

/// Whether `path` is a mount point in this process's mount namespace.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let path = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use amd_hsmp_device::messages::{self, Message};
    use amd_hsmp_device::{DevHsmp, MsrDeviceOpener};
    use amd_hsmp_proto::ItemError;
    use amd_hsmp_sim::{FaultGroup, Faults, FirmwareConfig, Mode, Profile, Target};

    /// Answers every message with its own id and socket in the first two words, or `errno`
    /// when set; counts nothing itself, so the fake's records are the only witness.
    #[derive(Debug)]
    struct Echo {
        errno: Option<Errno>,
    }

    impl HsmpNode for Echo {
        fn open(&self, _access: AccessMode) -> Result<Arc<dyn HsmpTransport>, Errno> {
            Ok(Arc::new(Echo { errno: self.errno }))
        }
    }

    impl HsmpTransport for Echo {
        fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
            if let Some(e) = self.errno {
                return Err(e);
            }
            msg.args[0] += msg.msg_id * 1000;
            msg.args[1] = u32::from(msg.sock_ind);
            Ok(())
        }
    }

    /// CPU `n` reads `n << 32 | msr` from every register except 0xDEAD (`EIO`).
    #[derive(Debug)]
    struct Regs(u32);

    impl MsrTransport for Regs {
        fn read(&self, msr: u32) -> Result<u64, Errno> {
            if msr == 0xDEAD {
                Err(libc::EIO)
            } else {
                Ok(u64::from(self.0) << 32 | u64::from(msr))
            }
        }
    }

    #[derive(Debug)]
    struct RegsOpener;

    impl MsrOpener for RegsOpener {
        fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
            Ok(Box::new(Regs(cpu)))
        }
    }

    fn fake(errno: Option<Errno>) -> FakeDevice {
        FakeDevice::mount(FakeConfig {
            hsmp: Arc::new(Echo { errno }),
            msr: Arc::new(RegsOpener),
            cpus: vec![0, 3, 64],
            hsmp_state: NodeState::Present,
            msr_state: NodeState::Present,
        })
        .expect("mount the fake device (needs /dev/fuse and fusermount3 from fuse3)")
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn the_brokers_real_ioctl_round_trips_through_the_fake_node() {
        let dev = fake(None);
        let hsmp = DevHsmp::open(&dev.hsmp_path()).unwrap();
        assert_eq!(messages::boost_limit_mhz(&hsmp, 1, 0x45), Ok(0x0A * 1000 + 0x45));
        let counter = messages::rapl_core_counter(&hsmp, 1, 7).unwrap();
        assert_eq!(counter, (1u64 << 32) | u64::from(0x31 * 1000 + 7u32));
        assert_eq!(
            dev.messages(),
            [
                WireMessage {
                    msg_id: 0x0A,
                    sock_ind: 1,
                    arg0: 0x45,
                    num_args: 1,
                    response_sz: 1,
                    result: Ok(())
                },
                WireMessage {
                    msg_id: 0x31,
                    sock_ind: 1,
                    arg0: 7,
                    num_args: 1,
                    response_sz: 2,
                    result: Ok(())
                },
            ]
        );
        let opens = dev.opens();
        assert_eq!(opens.len(), 1);
        assert!(opens[0].read_only() && opens[0].node == Node::Hsmp);
        assert_eq!(opens[0].pid, std::process::id());
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn the_models_errno_reaches_the_caller() {
        let dev = fake(Some(libc::ETIMEDOUT));
        let hsmp = DevHsmp::open(&dev.hsmp_path()).unwrap();
        assert_eq!(messages::prochot(&hsmp, 0), Err(ItemError::TimedOut));
        assert_eq!(dev.messages()[0].result, Err(libc::ETIMEDOUT));
        assert_eq!(dev.message_counts(), BTreeMap::from([(Message::GetProcHot.id(), 1)]));
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn msr_nodes_answer_pread_at_the_register_offset() {
        let dev = fake(None);
        let opener = MsrDeviceOpener { root: dev.msr_root() };
        let cpu64 = opener.open(64).unwrap();
        assert_eq!(cpu64.read(0xC001_029A), Ok(64 << 32 | 0xC001_029A));
        assert_eq!(cpu64.read(0xDEAD), Err(libc::EIO));
        assert_eq!(opener.open(1).unwrap_err(), libc::ENOENT, "CPU 1 has no node");
        assert_eq!(dev.msr_reads().len(), 2);
        let mut names: Vec<String> = std::fs::read_dir(dev.msr_root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["0", "3", "64"]);
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn node_states_give_the_kernels_errno_and_switch_while_mounted() {
        let dev = fake(None);
        dev.set_hsmp_state(NodeState::Absent);
        assert_eq!(DevHsmp::open(&dev.hsmp_path()).unwrap_err(), libc::ENOENT);
        dev.set_hsmp_state(NodeState::Denied);
        assert_eq!(DevHsmp::open(&dev.hsmp_path()).unwrap_err(), libc::EACCES);
        dev.set_hsmp_state(NodeState::Present);
        assert!(DevHsmp::open(&dev.hsmp_path()).is_ok());

        let opener = MsrDeviceOpener { root: dev.msr_root() };
        dev.set_msr_state(NodeState::Denied);
        assert_eq!(opener.open(0).unwrap_err(), libc::EPERM);
        dev.set_msr_state(NodeState::Absent);
        assert_eq!(opener.open(0).unwrap_err(), libc::ENOENT);
        assert!(!dev.msr_root().exists());
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_writable_open_is_recorded_as_such() {
        let dev = fake(None);
        let _rw = std::fs::OpenOptions::new().read(true).write(true).open(dev.hsmp_path()).unwrap();
        let open = dev.opens()[0];
        assert!(!open.read_only());
        assert_eq!(open.flags & libc::O_ACCMODE, libc::O_RDWR);
    }

    /// The fake device in front of a simulated Genoa 2P.
    fn simulated() -> (Arc<Machine>, FakeDevice) {
        let machine = Machine::new(Profile::Genoa2p.spec(), FirmwareConfig::new(Mode::Static));
        let dev = FakeDevice::mount(FakeConfig {
            hsmp: Arc::new(Arc::clone(&machine)),
            msr: Arc::new(machine.msr_opener()),
            cpus: vec![0],
            hsmp_state: NodeState::Present,
            msr_state: NodeState::Present,
        })
        .unwrap();
        (machine, dev)
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_held_socket_blocks_only_its_own_messages_through_the_fake() {
        let (machine, dev) = simulated();
        let hsmp = DevHsmp::open(&dev.hsmp_path()).unwrap();
        machine.hold_socket(1);
        std::thread::scope(|s| {
            let held = s.spawn(|| messages::prochot(&hsmp, 1));
            machine.wait_mailbox(1, Duration::from_secs(10), |b| b.entered == 1).unwrap();
            // The FUSE server does not serialize across sockets: socket 0 answers meanwhile.
            assert_eq!(messages::prochot(&hsmp, 0), Ok(false));
            assert_eq!(dev.messages().len(), 1, "the held message has not returned");
            machine.release_socket(1);
            assert_eq!(held.join().unwrap(), Ok(false));
        });
        assert_eq!(dev.messages().len(), 2);
        assert_eq!(machine.mailbox(1).max_pending, 1);
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn a_replaced_node_fails_old_descriptors_with_enodev_and_opens_anew() {
        let (_machine, dev) = simulated();
        let old = DevHsmp::open(&dev.hsmp_path()).unwrap();
        assert_eq!(messages::proto_version(&old, 0), Ok(5));
        dev.replace_hsmp();
        assert_eq!(messages::proto_version(&old, 0), Err(ItemError::NoSuchSocket));
        assert_eq!(messages::proto_version(&old, 1), Err(ItemError::NoSuchSocket));
        let new = DevHsmp::open(&dev.hsmp_path()).unwrap();
        assert_eq!(messages::proto_version(&new, 1), Ok(5));
    }

    /// A message with arbitrary counts, as a buggy or hostile caller could send.
    fn raw(msg_id: u32, num_args: u16, response_sz: u16, sock_ind: u16) -> HsmpMessage {
        HsmpMessage { msg_id, num_args, response_sz, args: [0; 8], sock_ind }
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn the_simulated_driver_checks_arrive_with_the_kernels_errno() {
        let (machine, dev) = simulated();
        let apic = machine.topology().cores[3].apic_id;
        let mut faults = Faults::default();
        faults.errno.insert((FaultGroup::BoostLimit, Target::Apic(apic)), libc::EIO);
        faults.wedged_sockets.insert(1);
        faults.driver_timeout = Duration::from_millis(20);
        machine.set_faults(faults);
        let ro = DevHsmp::open(&dev.hsmp_path()).unwrap();
        let send = |msg: HsmpMessage| ro.send(&mut { msg });
        assert_eq!(send(raw(0x40, 0, 1, 0)), Err(libc::ENOMSG), "unknown id");
        assert_eq!(send(raw(0x08, 1, 0, 0)), Err(libc::EPERM), "SET on a read-only descriptor");
        assert_eq!(send(raw(0x31, 1, 1, 0)), Err(libc::EINVAL), "response_sz 1 for 0x31");
        assert_eq!(send(raw(0x0A, 0, 1, 0)), Err(libc::EINVAL), "num_args 0 for 0x0A");
        assert_eq!(send(raw(0x03, 0, 1, 2)), Err(libc::ENODEV), "socket 2 of 2");
        assert_eq!(send(raw(0x30, 0, 1, 0)), Err(libc::ENOMSG), "RAPL below protocol 7");
        assert_eq!(send(raw(0x03, 0, 1, 1)), Err(libc::ETIMEDOUT), "wedged socket");
        assert_eq!(
            messages::boost_limit_mhz(&ro, 0, apic),
            Err(ItemError::Io { errno: libc::EIO })
        );
        assert_eq!(messages::proto_version(&ro, 0), Ok(5));

        let msr = MsrDeviceOpener { root: dev.msr_root() }.open(0).unwrap();
        assert_eq!(msr.read(0x10), Err(libc::EIO), "unknown MSR");
        assert_eq!(msr.read(0xC001_0299).map(|v| v >> 8 & 0x1f), Ok(16));
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
    fn dropping_the_device_unmounts_it_even_with_a_descriptor_open() {
        let dev = fake(None);
        let root = dev.root().to_owned();
        assert!(is_mount_point(&root));
        let held = DevHsmp::open(&dev.hsmp_path()).unwrap();
        drop(dev);
        assert!(!is_mount_point(&root));
        assert!(!root.exists());
        drop(held);
    }
}
