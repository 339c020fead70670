//! Thin safe wrappers around the raw system calls the kernel interface needs: the only
//! `unsafe` code in the project.
//!
//! Each wrapper takes borrowed, typed arguments and returns the errno on failure, so the code
//! above it never sees a raw pointer or a return code.

use crate::abi::{PERF_FLAG_FD_CLOEXEC, PerfEventAttr};
use crate::{Errno, HSMP_IOCTL_CMD, HsmpMessage};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Sends one HSMP message: `ioctl(fd, HSMP_IOCTL_CMD, msg)`.
///
/// The kernel copies the 44 bytes of `msg` in, runs the message and copies them back, the
/// reply in `msg.args`. On failure `msg` is left as it was and the errno is returned.
pub(crate) fn hsmp_ioctl(fd: BorrowedFd<'_>, msg: &mut HsmpMessage) -> Result<(), Errno> {
    let arg: *mut HsmpMessage = msg;
    // SAFETY: `HSMP_IOCTL_CMD` is `_IOWR` with a size of 44 bytes and `HsmpMessage` is
    // `repr(C)`, 44 bytes, align 4 (asserted at compile time in `abi`), so the kernel
    // reads and writes only bytes of `*msg`. `msg` is exclusively borrowed for the whole call,
    // so nothing else aliases it while the kernel writes, and `fd` is borrowed, so it stays
    // open until the call returns.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), HSMP_IOCTL_CMD as _, arg) };
    if rc == -1 { Err(last_errno()) } else { Ok(()) }
}

/// Opens a system-wide counting event on `cpu`: `perf_event_open(attr, -1, cpu, -1,
/// PERF_FLAG_FD_CLOEXEC)`. The caller reads it with `read(2)`.
///
/// The kernel checks the caller's privilege (`CAP_PERFMON` or `perf_event_paranoid`) and its
/// LSM here, once; the descriptor keeps counting after the capability is dropped.
pub(crate) fn perf_event_open(attr: &mut PerfEventAttr, cpu: u32) -> Result<OwnedFd, Errno> {
    let cpu = libc::c_int::try_from(cpu).map_err(|_| libc::EINVAL)?;
    let arg: *mut PerfEventAttr = attr;
    let (pid, group): (libc::pid_t, libc::c_int) = (-1, -1);
    // SAFETY: `attr` is a `repr(C)` `perf_event_attr` of `attr.size` = 64 bytes (asserted at
    // compile time in `abi`), exclusively borrowed for the call: the kernel reads those bytes
    // and, only if it refuses the size, writes its own size into `attr.size`. The other
    // arguments are plain integers.
    let rc = unsafe {
        libc::syscall(libc::SYS_perf_event_open, arg, pid, cpu, group, PERF_FLAG_FD_CLOEXEC)
    };
    if rc < 0 {
        return Err(last_errno());
    }
    let fd = RawFd::try_from(rc).map_err(|_| libc::EBADF)?;
    // SAFETY: a successful perf_event_open returns a new descriptor that nothing else in the
    // process owns, so the `OwnedFd` is its one owner and closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The calling thread's errno after a failed call.
fn last_errno() -> Errno {
    // A failed call always sets errno; EIO only guards against a platform that would not.
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsFd;

    fn sample_message() -> HsmpMessage {
        HsmpMessage {
            msg_id: 0x03,
            num_args: 0,
            response_sz: 1,
            args: [0xdead_beef; 8],
            sock_ind: 1,
        }
    }

    #[test]
    fn ioctl_on_a_regular_file_is_enotty_and_leaves_the_message_alone() {
        let file = tempfile::tempfile().unwrap();
        let mut msg = sample_message();
        assert_eq!(hsmp_ioctl(file.as_fd(), &mut msg), Err(libc::ENOTTY));
        assert_eq!(msg, sample_message());
    }

    #[test]
    fn perf_event_open_of_a_pmu_type_the_kernel_does_not_have_is_enoent() {
        // Dynamic PMU types are small numbers; this one names no PMU on any kernel. Excluding
        // the kernel and hypervisor (flag bits 5 and 6) skips `perf_event_paranoid`'s check,
        // which comes first, so the answer is the same for any user.
        let mut attr =
            PerfEventAttr { flags: 0b110_0000, ..PerfEventAttr::counting(0x7fff_fff0, 1) };
        assert_eq!(perf_event_open(&mut attr, 0).unwrap_err(), libc::ENOENT);
    }

    #[test]
    fn perf_event_open_refuses_a_cpu_beyond_an_int() {
        let mut attr = PerfEventAttr::counting(1, 0);
        assert_eq!(perf_event_open(&mut attr, u32::MAX).unwrap_err(), libc::EINVAL);
    }

    #[test]
    fn ioctl_on_a_character_device_of_another_driver_is_enotty() {
        let null = File::open("/dev/null").unwrap();
        let mut msg = sample_message();
        assert_eq!(hsmp_ioctl(null.as_fd(), &mut msg), Err(libc::ENOTTY));
    }
}
