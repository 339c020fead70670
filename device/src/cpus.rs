//! Which CPUs are online now: the kernel's `/sys/devices/system/cpu/online`, opened once at
//! start-up and read again (one `pread(2)` of a few bytes) whenever asked, so that a process that
//! can open nothing more after start-up still sees CPUs go offline and come back.
//!
//! Kernel: `drivers/base/cpu.c` shows `cpu_online_mask` as a cpulist (`0-3,8`); the file is
//! regenerated on every read from offset 0 (`kernfs` seq_file).

use crate::Errno;
use crate::perf::parse_cpulist;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The online list under a sysfs root.
pub const ONLINE: &str = "devices/system/cpu/online";

/// The longest online list read: 4,096 CPUs listed one by one, as no real list is.
const CAP: usize = 32 * 1024;

/// The CPUs online now, read afresh on each call.
pub trait OnlineCpus: Send + Sync + std::fmt::Debug {
    /// The online CPUs, ascending; an errno when the list cannot be read or parsed (`EINVAL`).
    fn online(&self) -> Result<Vec<u32>, Errno>;
}

/// `<sysfs>/devices/system/cpu/online`, held open.
#[derive(Debug)]
pub struct SysfsOnline {
    path: PathBuf,
    file: File,
}

impl SysfsOnline {
    /// Opens the online list under `sysfs` (normally `/sys`), refusing anything but a regular
    /// file (sysfs attributes are), so a FIFO put in its place cannot block a read.
    pub fn open(sysfs: &Path) -> std::io::Result<SysfsOnline> {
        let path = sysfs.join(ONLINE);
        let file = crate::files::open_regular(&path)?;
        Ok(SysfsOnline { path, file })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl OnlineCpus for SysfsOnline {
    fn online(&self) -> Result<Vec<u32>, Errno> {
        // Read in small steps: a real list is a few bytes ("0-383").
        let mut text = Vec::new();
        let mut chunk = [0u8; 256];
        loop {
            match self.file.read_at(&mut chunk, text.len() as u64) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(crate::errno_of(&e)),
            }
            if text.len() > CAP {
                return Err(libc::EFBIG);
            }
        }
        let text = std::str::from_utf8(&text).map_err(|_| libc::EINVAL)?;
        parse_cpulist(text.trim()).map_err(|_| libc::EINVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn the_list_is_read_again_on_every_call_through_the_descriptor_opened_once() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("devices/system/cpu");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("online"), "0-3,8\n").unwrap();
        let online = SysfsOnline::open(root.path()).unwrap();
        assert_eq!(online.online(), Ok(vec![0, 1, 2, 3, 8]));
        // Rewritten in place (the same inode), as the kernel regenerates the attribute.
        fs::OpenOptions::new().write(true).truncate(true).open(dir.join("online")).unwrap();
        fs::write(dir.join("online"), "0,2\n").unwrap();
        assert_eq!(online.online(), Ok(vec![0, 2]));
        fs::write(dir.join("online"), "0-x\n").unwrap();
        assert_eq!(online.online(), Err(libc::EINVAL));
        fs::write(dir.join("online"), "0,".repeat(CAP)).unwrap();
        assert_eq!(online.online(), Err(libc::EFBIG), "refused past the cap, never parsed");
    }

    #[test]
    fn a_fifo_in_place_of_the_list_is_refused_at_the_open() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("devices/system/cpu");
        fs::create_dir_all(&dir).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, dir.join("online"), rustix::fs::Mode::RWXU).unwrap();
        assert!(SysfsOnline::open(root.path()).is_err());
    }

    #[test]
    fn this_machine_s_list_parses() {
        let online = SysfsOnline::open(Path::new("/sys")).unwrap();
        assert!(!online.online().unwrap().is_empty());
    }
}
