//! What the errno values of the `amd_hsmp` and `msr` drivers mean.

use amd_hsmp_proto::ItemError;

/// A positive errno value as returned by the kernel (or reproduced by a simulator).
pub type Errno = i32;

/// Maps a driver errno to the per-item error reported to the frontend.
///
/// The driver's rules (`drivers/platform/x86/amd/hsmp/hsmp.c`): `ENOMSG` for a message id it or
/// the firmware does not know; `EINVAL` for wrong word counts or input the firmware calls
/// invalid, `EPERM` for a SET on a read-only descriptor; `ETIMEDOUT` when the firmware does
/// not answer within 100 ms, and before 6.16 `ETIME` when the per-socket lock was not free in
/// time; `EBUSY` when the firmware is busy; `ENODEV` for a `sock_ind` beyond the sockets it
/// probed. Anything else (`EIO`, `EREMOTEIO`, ...) is kept as its raw errno.
pub fn classify(errno: Errno) -> ItemError {
    match errno {
        libc::ENOMSG => ItemError::Unsupported,
        libc::EINVAL | libc::EPERM => ItemError::Rejected,
        libc::ETIMEDOUT | libc::ETIME => ItemError::TimedOut,
        libc::EBUSY => ItemError::Busy,
        libc::ENODEV => ItemError::NoSuchSocket,
        errno => ItemError::Io { errno },
    }
}

/// Whether a failed read says the descriptor itself is no longer usable (the device was
/// removed, unbound or replaced) rather than that one message failed: `ENODEV` and `ENXIO` (no
/// device behind the node; for HSMP `ENODEV` is also "no such socket", so only the same answer
/// from every socket means the device is gone), `EBADF` and `ENOTCONN` (the file or the
/// filesystem it lived on is gone).
pub fn means_device_gone(error: ItemError) -> bool {
    match error {
        ItemError::NoSuchSocket => true,
        ItemError::Io { errno } => {
            matches!(errno, libc::ENODEV | libc::ENXIO | libc::EBADF | libc::ENOTCONN)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_driver_errno_is_classified() {
        let cases = [
            (libc::ENOMSG, ItemError::Unsupported),
            (libc::EINVAL, ItemError::Rejected),
            (libc::EPERM, ItemError::Rejected),
            (libc::ETIMEDOUT, ItemError::TimedOut),
            (libc::ETIME, ItemError::TimedOut),
            (libc::EBUSY, ItemError::Busy),
            (libc::ENODEV, ItemError::NoSuchSocket),
            (libc::EIO, ItemError::Io { errno: libc::EIO }),
            (libc::EREMOTEIO, ItemError::Io { errno: libc::EREMOTEIO }),
            (libc::ENOTTY, ItemError::Io { errno: libc::ENOTTY }),
        ];
        for (errno, want) in cases {
            assert_eq!(classify(errno), want, "errno {errno}");
        }
    }

    #[test]
    fn only_a_gone_device_makes_a_descriptor_stale() {
        for errno in [libc::ENODEV, libc::ENXIO, libc::EBADF, libc::ENOTCONN] {
            assert!(means_device_gone(classify(errno)), "errno {errno}");
        }
        for errno in [libc::ENOMSG, libc::EINVAL, libc::ETIMEDOUT, libc::EIO, libc::EBUSY] {
            assert!(!means_device_gone(classify(errno)), "errno {errno}");
        }
        assert!(!means_device_gone(ItemError::DeadlineExceeded));
    }
}
