//! Opening the broker's inputs so that no open and no read can hang: every file is opened with
//! `O_NONBLOCK` (a FIFO cannot hold the open waiting for a writer), checked to be the kind of file
//! it must be before anything is read, and text is read up to a size cap.
//!
//! - procfs and sysfs text files (`/proc/cpuinfo`, the sysfs topology files,
//!   `kernel/security/lockdown`, `fs/selinux/enforce`, ...) must be regular files, as procfs and
//!   sysfs present them; [`open_regular`], [`read_text`].
//! - device nodes (`/dev/hsmp`, `/dev/cpu/<N>/msr`) must be character devices, or regular files
//!   (the test suite's FUSE fake device, whose open cannot hang either); `O_NONBLOCK` is cleared
//!   again after the check, so an ioctl or a `pread` waits for the device as it always did;
//!   [`open_device`].
//!
//! A FIFO, a socket, a directory or a block device is refused with an error saying what it is.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most read of a small procfs or sysfs text file (a sysfs attribute is at most a page).
pub const TEXT_CAP: u64 = 64 << 10;

/// The most read of `/proc/cpuinfo`: about 1.6 KiB per hardware thread, so 16 MiB leaves room
/// for ten thousand threads.
pub const CPUINFO_CAP: u64 = 16 << 20;

/// What a file must be to be read as an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Regular,
    Device,
}

/// Opens `path` read-only without blocking and returns it if it is a regular file.
///
/// `O_NONBLOCK` stays set: it changes nothing for a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    open(path, Wanted::Regular)
}

/// Reads `path`, a regular file, as UTF-8 text of at most `cap` bytes; a longer file is refused
/// (procfs and sysfs report a size of 0, so the cap is kept while reading).
pub fn read_text(path: &Path, cap: u64) -> io::Result<String> {
    let mut text = String::new();
    capped(open_regular(path)?, cap).read_to_string(&mut text)?;
    Ok(text)
}

/// `file`, read through a limit: past `cap` bytes a read fails with an error naming the cap,
/// so a caller that streams (cpuinfo, parsed line by line) is bounded too.
pub fn capped(file: File, cap: u64) -> Capped {
    Capped { file, cap, left: cap }
}

/// A file read through a size cap; see [`capped`].
#[derive(Debug)]
pub struct Capped {
    file: File,
    cap: u64,
    left: u64,
}

impl Read for Capped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte beyond the cap is asked for, to tell a file of exactly `cap` bytes from a
        // longer one.
        let room = usize::try_from(self.left.saturating_add(1)).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let Some(buf) = buf.get_mut(..want) else { return Ok(0) };
        let n = self.file.read(buf)? as u64;
        if n > self.left {
            let limit = bytes(self.cap);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than the {limit} limit"),
            ));
        }
        self.left -= n;
        Ok(n as usize)
    }
}

/// A byte count the way a limit is written: KiB or MiB when it is a whole number of them.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n}-byte"),
    }
}

/// Opens the device node `path` read-only without blocking, checks that it is a character
/// device (or a regular file: the test suite's fake device), and clears `O_NONBLOCK`, so the
/// descriptor's ioctls and reads wait for the device as usual.
pub fn open_device(path: &Path) -> io::Result<File> {
    let file = open(path, Wanted::Device)?;
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)?;
    Ok(file)
}

fn open(path: &Path, wanted: Wanted) -> io::Result<File> {
    let file =
        OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    let kind = file.metadata()?.file_type();
    let fits = match wanted {
        Wanted::Regular => kind.is_file(),
        Wanted::Device => kind.is_char_device() || kind.is_file(),
    };
    if fits {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "of an unknown kind"
    };
    let must = match wanted {
        Wanted::Regular => "a regular file",
        Wanted::Device => "a character device",
    };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not {must} but {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        path
    }

    /// Opens in a thread, so that a regression that blocks fails the test instead of hanging it.
    fn within_a_second<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx.recv_timeout(Duration::from_secs(1)).expect("the open blocked")
    }

    #[test]
    fn a_fifo_is_refused_at_once_as_text_and_as_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = fifo(dir.path());
        let p = path.clone();
        let err = within_a_second(move || read_text(&p, TEXT_CAP).unwrap_err());
        assert_eq!(err.to_string(), "not a regular file but a FIFO");
        let err = within_a_second(move || open_device(&path).unwrap_err());
        assert_eq!(err.to_string(), "not a character device but a FIFO");
    }

    #[test]
    fn a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_text(dir.path(), TEXT_CAP).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file but a directory");
        let err = open_device(dir.path()).unwrap_err();
        assert_eq!(err.to_string(), "not a character device but a directory");
    }

    #[test]
    fn a_character_device_opens_blocking_and_is_no_text() {
        let dev = open_device(Path::new("/dev/null")).unwrap();
        let flags = rustix::fs::fcntl_getfl(&dev).unwrap();
        assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
        assert_eq!(flags & rustix::fs::OFlags::ACCMODE, rustix::fs::OFlags::RDONLY);
        let err = read_text(Path::new("/dev/null"), TEXT_CAP).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file but a character device");
    }

    #[test]
    fn text_up_to_the_cap_is_read_and_beyond_it_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "0123456789").unwrap();
        assert_eq!(read_text(&path, 10).unwrap(), "0123456789");
        let err = read_text(&path, 9).unwrap_err();
        assert_eq!(err.to_string(), "larger than the 9-byte limit");
        std::fs::write(&path, vec![b'x'; (TEXT_CAP + 1) as usize]).unwrap();
        let err = read_text(&path, TEXT_CAP).unwrap_err();
        assert_eq!(err.to_string(), "larger than the 64 KiB limit");
    }

    #[test]
    fn procfs_files_are_regular_files() {
        assert!(read_text(Path::new("/proc/self/stat"), TEXT_CAP).is_ok());
    }
}
