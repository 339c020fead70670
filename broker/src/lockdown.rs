//! Lock-down after start-up: drop every capability, set no-new-privs, install the seccomp
//! allow-list.
//!
//! **Invariant:** [`drop_privileges`] runs while the broker is single-threaded, after every device
//! it will ever need has been opened (the MSR driver checks `CAP_SYS_RAWIO` only at `open()`,
//! `perf_event_open` checks `CAP_PERFMON` only then), and [`install_seccomp`] runs before any
//! request is served. The filter admits `restart_syscall`, so that a stop, a cgroup freeze or a
//! ptrace attach does no harm.

use rustix::thread::{CapabilitySet, CapabilitySets};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

use amd_hsmp_device::HSMP_IOCTL_CMD;

/// Why the broker could not lock itself down. Every variant is fatal: the broker does not serve
/// with more privilege than it needs.
#[derive(Debug, thiserror::Error)]
pub enum LockdownError {
    /// Capabilities are per thread; dropping them with other threads alive would leave those
    /// threads privileged.
    #[error("{0} threads are running; capabilities must be dropped while single-threaded")]
    NotSingleThreaded(usize),
    /// Counting threads failed.
    #[error("cannot count threads in /proc/self/task")]
    Threads(#[source] std::io::Error),
    /// A capability set could not be changed.
    #[error("cannot drop capability set {set}")]
    Caps {
        /// The set that failed.
        set: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Some capability survived the drop.
    #[error("capabilities still held after the drop: {0}")]
    StillHeld(String),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("cannot set no-new-privs")]
    NoNewPrivs(#[source] std::io::Error),
    /// Building the seccomp program failed.
    #[error("cannot build the seccomp filter")]
    SeccompBuild(#[source] seccompiler::BackendError),
    /// Loading the seccomp program failed.
    #[error("cannot install the seccomp filter")]
    SeccompInstall(#[source] seccompiler::Error),
    /// seccomp is only built for x86_64, the architecture of every EPYC.
    #[error("seccomp filter is only defined for x86_64")]
    UnsupportedArch,
}

/// Drops every capability (bounding, ambient, inheritable, effective, permitted) and sets
/// no-new-privs. The bounding set can only be emptied with `CAP_SETPCAP`; without it (an
/// unprivileged start) it is left as the service manager gave it, which no-new-privs makes inert.
pub(crate) fn drop_privileges() -> Result<(), LockdownError> {
    let threads = std::fs::read_dir("/proc/self/task").map_err(LockdownError::Threads)?.count();
    if threads != 1 {
        return Err(LockdownError::NotSingleThreaded(threads));
    }
    let caps_err = |set| move |e: rustix::io::Errno| LockdownError::Caps { set, source: e.into() };
    let own = rustix::thread::capabilities(None).map_err(caps_err("effective"))?;
    // A capability newer than the running kernel is in no set: the kernel answers EINVAL.
    let known = |held: rustix::io::Result<bool>| match held {
        Err(rustix::io::Errno::INVAL) => Ok(false),
        other => other,
    };
    if own.effective.contains(CapabilitySet::SETPCAP) {
        for cap in CapabilitySet::all().iter() {
            if known(rustix::thread::capability_is_in_bounding_set(cap))
                .map_err(caps_err("bounding"))?
            {
                rustix::thread::remove_capability_from_bounding_set(cap)
                    .map_err(caps_err("bounding"))?;
            }
        }
    }
    rustix::thread::clear_ambient_capability_set().map_err(caps_err("ambient"))?;
    let none = CapabilitySet::empty();
    let sets = CapabilitySets { effective: none, permitted: none, inheritable: none };
    rustix::thread::set_capabilities(None, sets).map_err(caps_err("permitted"))?;
    let mut held = Vec::new();
    let left = rustix::thread::capabilities(None).map_err(caps_err("effective"))?;
    for (name, set) in [
        ("effective", left.effective),
        ("permitted", left.permitted),
        ("inheritable", left.inheritable),
    ] {
        if !set.is_empty() {
            held.push(format!("{name} {set:?}"));
        }
    }
    let mut ambient = CapabilitySet::empty();
    for cap in CapabilitySet::all().iter() {
        if known(rustix::thread::capability_is_in_ambient_set(cap)).map_err(caps_err("ambient"))? {
            ambient |= cap;
        }
    }
    if !ambient.is_empty() {
        held.push(format!("ambient {ambient:?}"));
    }
    if !held.is_empty() {
        return Err(LockdownError::StillHeld(held.join(", ")));
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| LockdownError::NoNewPrivs(e.into()))
}

/// The one file the broker may remove once locked down: the socket it created with `--listen`,
/// named by a descriptor of its directory and a name that lives as long as the process.
///
/// The seccomp filter admits `unlinkat` only with exactly this descriptor, this name pointer and
/// no flags, so no other file can be removed through it.
#[derive(Debug)]
pub struct SocketFile {
    dir: std::os::fd::OwnedFd,
    name: &'static std::ffi::CStr,
}

impl SocketFile {
    /// Opens the directory of `path` (before the lock-down, which forbids opening for anything
    /// but reading) and keeps its file name.
    pub fn new(path: &std::path::Path) -> std::io::Result<SocketFile> {
        use std::os::unix::ffi::OsStrExt;
        let invalid = |what| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        let name = path.file_name().ok_or_else(|| invalid("the socket path has no file name"))?;
        let name = std::ffi::CString::new(name.as_bytes())
            .map_err(|_| invalid("the socket path contains a NUL byte"))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        let flags = rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY;
        let dir =
            rustix::fs::open(dir, flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
        // Leaked on purpose: the filter names this address, so it must never move or be freed.
        Ok(SocketFile { dir, name: Box::leak(name.into_boxed_c_str()) })
    }

    /// Removes the socket file (`unlinkat(dir, name, 0)`).
    pub fn remove(&self) -> std::io::Result<()> {
        rustix::fs::unlinkat(&self.dir, self.name, rustix::fs::AtFlags::empty()).map_err(Into::into)
    }
}

/// Installs the allow-list on every thread of the process. Anything not listed fails with
/// `EPERM`; `execve`, `socket`, `connect`, `bind` and friends kill the process outright.
/// With `socket`, that one file may also be removed (on `SIGTERM`).
pub fn install_seccomp(socket: Option<&SocketFile>) -> Result<(), LockdownError> {
    for program in programs(socket)? {
        seccompiler::apply_filter_all_threads(&program).map_err(LockdownError::SeccompInstall)?;
    }
    Ok(())
}

/// System calls that are never legitimate in the broker after start-up: running programs,
/// making network sockets, changing identity or privileges, tracing, loading modules, opening
/// perf events (the `power_core` events are all opened before the filter is installed).
#[cfg(target_arch = "x86_64")]
const FORBIDDEN: &[i64] = &[
    libc::SYS_perf_event_open,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_ptrace,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_capset,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_mount,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// System calls the broker makes while serving, each with the code path that needs it.
#[cfg(target_arch = "x86_64")]
const ALLOWED: &[i64] = &[
    // server: accept, peer credentials, timeouts, framing; poll/ppoll: a connection whose
    // request waits in the sampler asks its socket whether the peer hung up (server::hung_up)
    libc::SYS_accept4,
    libc::SYS_accept,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_read,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_close,
    libc::SYS_poll,
    libc::SYS_ppoll,
    // MSR reads (pread at the register number)
    libc::SYS_pread64,
    // File metadata (std's File and a late re-open of /dev/hsmp: files::open_device checks the
    // node's type with fstat/statx and clears O_NONBLOCK with fcntl F_GETFL/F_SETFL)
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_fcntl,
    // threads: a connection thread each, a worker per socket, the MSR poller
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // memory
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    // signals, stack guards, sleeping, time, randomness (std internals)
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    // the signal thread waits for SIGTERM, SIGHUP, ... (main.rs)
    libc::SYS_rt_sigtimedwait,
    // a sleep, futex wait or poll interrupted by SIGSTOP/SIGCONT, a cgroup freeze or a ptrace
    // attach is resumed through this; refused, std's sleep panics and the MSR poller dies
    libc::SYS_restart_syscall,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_getrandom,
];

#[cfg(target_arch = "x86_64")]
fn programs(socket: Option<&SocketFile>) -> Result<Vec<BpfProgram>, LockdownError> {
    let cond = |arg, len, op, value| {
        SeccompCondition::new(arg, len, op, value).map_err(LockdownError::SeccompBuild)
    };
    let rule = |conds| SeccompRule::new(conds).map_err(LockdownError::SeccompBuild);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    // ioctl: only HSMP_IOCTL_CMD; the kernel reads the command as a 32-bit value.
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(vec![cond(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::from(HSMP_IOCTL_CMD),
        )?])?],
    );
    // openat: read-only, never creating, truncating or appending (a late /dev/hsmp open).
    let write_flags = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
    rules.insert(
        libc::SYS_openat,
        vec![rule(vec![cond(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(write_flags),
            0,
        )?])?],
    );
    // prctl: only PR_SET_NAME (std names its threads).
    rules.insert(
        libc::SYS_prctl,
        vec![rule(vec![cond(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::PR_SET_NAME as u64,
        )?])?],
    );
    // unlinkat: only the --listen socket, on SIGTERM (SocketFile).
    if let Some(socket) = socket {
        use std::os::fd::AsRawFd;
        // An owned descriptor is never negative; if it were, the rule would match nothing.
        let dir = u64::try_from(socket.dir.as_raw_fd()).unwrap_or(u64::MAX);
        rules.insert(
            libc::SYS_unlinkat,
            vec![rule(vec![
                cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, dir)?,
                cond(1, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, socket.name.as_ptr() as u64)?,
                cond(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, 0)?,
            ])?],
        );
    }
    let arch = seccompiler::TargetArch::x86_64;
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(LockdownError::SeccompBuild)?;
    let forbid = SeccompFilter::new(
        FORBIDDEN.iter().map(|&nr| (nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::KillProcess,
        arch,
    )
    .map_err(LockdownError::SeccompBuild)?;
    let compile = |f: SeccompFilter| BpfProgram::try_from(f).map_err(LockdownError::SeccompBuild);
    Ok(vec![compile(forbid)?, compile(allow)?])
}

#[cfg(not(target_arch = "x86_64"))]
fn programs(_socket: Option<&SocketFile>) -> Result<Vec<BpfProgram>, LockdownError> {
    Err(LockdownError::UnsupportedArch)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let programs = programs(None).unwrap();
        assert_eq!(programs.len(), 2);
        let dir = tempfile::tempdir().unwrap();
        let socket = SocketFile::new(&dir.path().join("s.sock")).unwrap();
        let programs = super::programs(Some(&socket)).unwrap();
        assert_eq!(programs.len(), 2);
        assert!(programs.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn nothing_is_both_allowed_and_forbidden() {
        for nr in FORBIDDEN {
            assert!(!ALLOWED.contains(nr), "syscall {nr} is in both lists");
        }
    }

    #[test]
    fn refuses_to_drop_capabilities_with_threads_running() {
        // The test harness runs this on a worker thread, so the process is multi-threaded.
        assert!(matches!(drop_privileges(), Err(LockdownError::NotSingleThreaded(n)) if n > 1));
    }
}
