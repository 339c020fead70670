//! Thin safe wrappers around the raw system calls the kernel interface needs: the only
//! `unsafe` code in the project.
//!
//! Each wrapper takes borrowed, typed arguments and returns the errno on failure, so the code
//! above it never sees a raw pointer or a return code.

use crate::{Errno, HSMP_IOCTL_CMD, HsmpMessage};
use std::os::fd::{AsRawFd, BorrowedFd};

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
    fn ioctl_on_a_character_device_of_another_driver_is_enotty() {
        let null = File::open("/dev/null").unwrap();
        let mut msg = sample_message();
        assert_eq!(hsmp_ioctl(null.as_fd(), &mut msg), Err(libc::ENOTTY));
    }
}
