//! The real HSMP transport: `/dev/hsmp` opened read-only, messages sent with
//! [`crate::sys::hsmp_ioctl`].

use super::{Errno, HsmpMessage, HsmpOpener, HsmpTransport};
use crate::sys;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the `amd_hsmp` driver creates its device node.
pub const DEFAULT_HSMP_PATH: &str = "/dev/hsmp";

/// An open HSMP device node (or anything answering its ioctl, such as the test suite's fake
/// device).
#[derive(Debug)]
pub struct DevHsmp {
    file: File,
}

impl DevHsmp {
    /// Opens `path` read-only (`O_RDONLY | O_CLOEXEC`): GET messages need no more, and a
    /// read-only descriptor cannot send a SET message.
    pub fn open(path: &Path) -> Result<DevHsmp, Errno> {
        let file = File::open(path).map_err(|e| errno_of(&e))?;
        Ok(DevHsmp { file })
    }
}

impl HsmpTransport for DevHsmp {
    fn send(&self, msg: &mut HsmpMessage) -> Result<(), Errno> {
        sys::hsmp_ioctl(self.file.as_fd(), msg)
    }
}

/// Opens the HSMP device at `path` each time it is asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HsmpDeviceOpener {
    /// The device node, normally [`DEFAULT_HSMP_PATH`].
    pub path: PathBuf,
}

impl HsmpOpener for HsmpDeviceOpener {
    fn open(&self) -> Result<Arc<dyn HsmpTransport>, Errno> {
        Ok(Arc::new(DevHsmp::open(&self.path)?))
    }
}

/// The errno behind an I/O error; `EIO` for an error that carries none.
pub(crate) fn errno_of(err: &std::io::Error) -> Errno {
    err.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hsmp::messages;
    use amd_hsmp_proto::ItemError;

    #[test]
    fn a_missing_node_is_enoent() {
        let dir = tempfile::tempdir().unwrap();
        let opener = HsmpDeviceOpener { path: dir.path().join("hsmp") };
        assert_eq!(opener.open().unwrap_err(), libc::ENOENT);
    }

    #[test]
    fn messages_reach_the_kernel_through_the_real_ioctl() {
        // A regular file answers every ioctl with ENOTTY, which proves the message went
        // through the open descriptor and the syscall rather than being faked.
        let file = tempfile::NamedTempFile::new().unwrap();
        let opener = HsmpDeviceOpener { path: file.path().to_owned() };
        let dev = opener.open().unwrap();
        assert_eq!(
            messages::proto_version(dev.as_ref(), 0),
            Err(ItemError::Io { errno: libc::ENOTTY })
        );
    }

    #[test]
    fn the_node_is_opened_read_only() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let dev = DevHsmp::open(file.path()).unwrap();
        let flags = rustix::fs::fcntl_getfl(&dev.file).unwrap();
        assert_eq!(flags & rustix::fs::OFlags::ACCMODE, rustix::fs::OFlags::RDONLY);
        let fd_flags = rustix::io::fcntl_getfd(&dev.file).unwrap();
        assert!(fd_flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
