//! The real transports: `/dev/hsmp` opened read-only, messages sent with `sys::hsmp_ioctl`;
//! `/dev/cpu/<N>/msr` opened read-only, registers read with `pread`.

use crate::{Errno, HsmpMessage, HsmpOpener, HsmpTransport, MsrOpener, MsrTransport, files, sys};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the `amd_hsmp` driver creates its device node.
pub const DEFAULT_HSMP_PATH: &str = "/dev/hsmp";

/// Where the MSR driver creates its per-CPU nodes.
pub const DEFAULT_MSR_ROOT: &str = "/dev/cpu";

/// An open HSMP device node (or anything answering its ioctl, such as the test suite's fake
/// device).
#[derive(Debug)]
pub struct DevHsmp {
    file: File,
}

impl DevHsmp {
    /// Opens `path` read-only (`O_RDONLY | O_CLOEXEC`): GET messages need no more, and a
    /// read-only descriptor cannot send a SET message. The open cannot block, and a node that
    /// is not a device (a FIFO, a directory, a socket) is `ENODEV`: see [`open_node`].
    pub fn open(path: &Path) -> Result<DevHsmp, Errno> {
        Ok(DevHsmp { file: open_node(path)? })
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

/// Opens `<root>/<cpu>/msr` read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsrDeviceOpener {
    /// The directory of the per-CPU nodes, normally [`DEFAULT_MSR_ROOT`].
    pub root: PathBuf,
}

impl MsrOpener for MsrDeviceOpener {
    fn open(&self, cpu: u32) -> Result<Box<dyn MsrTransport>, Errno> {
        let path = self.root.join(cpu.to_string()).join("msr");
        Ok(Box::new(DevMsr { file: open_node(&path)? }))
    }
}

/// An open `/dev/cpu/<N>/msr`: each read is a `pread` of 8 bytes at offset = MSR number.
#[derive(Debug)]
pub struct DevMsr {
    file: File,
}

impl MsrTransport for DevMsr {
    fn read(&self, msr: u32) -> Result<u64, Errno> {
        let mut buf = [0u8; 8];
        match self.file.read_at(&mut buf, u64::from(msr)) {
            Ok(8) => Ok(u64::from_le_bytes(buf)),
            Ok(_) => Err(libc::EIO),
            Err(e) => Err(errno_of(&e)),
        }
    }
}

/// Opens a device node with [`files::open_device`]: without blocking, and only if it is a
/// character device (or a regular file, as the test suite's fake device is). Anything else is
/// no device: `ENODEV`.
fn open_node(path: &Path) -> Result<File, Errno> {
    files::open_device(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => libc::ENODEV,
        _ => errno_of(&e),
    })
}

/// The errno behind an I/O error; `EIO` for an error that carries none.
pub fn errno_of(err: &std::io::Error) -> Errno {
    err.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages;
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

    /// Regression (P6): `/dev/hsmp` was opened with a blocking `open`, which a FIFO holds until
    /// a writer comes: `--check` and the broker's start-up hung for ever.
    #[test]
    fn a_fifo_in_place_of_the_node_is_no_device_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hsmp");
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        rustix::fs::mknodat(rustix::fs::CWD, &path, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let opener = HsmpDeviceOpener { path };
        std::thread::spawn(move || tx.send(opener.open().map(drop)).unwrap());
        let opened = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("open blocked");
        assert_eq!(opened.unwrap_err(), libc::ENODEV);
        let msr = MsrDeviceOpener { root: dir.path().to_owned() };
        std::fs::create_dir_all(dir.path().join("0/msr")).unwrap();
        assert_eq!(msr.open(0).map(drop).unwrap_err(), libc::ENODEV);
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
