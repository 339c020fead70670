//! What the web configuration's files and keys share: an error naming the key at fault, and
//! reading a file the way every file of the configuration is read (a regular file only, opened
//! without blocking, at most [`MAX_FILE_BYTES`]).

use std::path::Path;
use std::time::Duration;

/// A key and what is wrong with it, before the file's path is known.
#[derive(Debug)]
pub(crate) struct KeyError {
    pub(crate) key: String,
    pub(crate) message: String,
}

pub(crate) fn key_error(key: impl Into<String>, message: impl Into<String>) -> KeyError {
    KeyError { key: key.into(), message: message.into() }
}

/// The largest web configuration, certificate, key or CA file read (1 MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// How long reading the web configuration file and the files it names may take; past it the
/// read is given up (its thread left to finish alone) and the old configuration stays.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads `path` if it is a regular file of at most `cap` bytes. It is opened with
/// `O_NONBLOCK`, so a FIFO cannot hold the open, and checked before any read: a FIFO, a
/// directory, a device or a socket is refused.
pub(crate) fn read_regular(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    read_regular_into(path, cap, &mut data)?;
    Ok(data)
}

/// [`read_regular`] into `buf` (cleared first), for a reader of many small files that keeps
/// one buffer: a file that is not regular is an `InvalidInput` error naming its kind, one
/// larger than `cap` a `FileTooLarge` error.
/// What a file system that ignores `O_NONBLOCK` does with a read is its own: a caller that
/// cannot trust it reads on a thread whose wait it bounds.
pub fn read_regular_into(path: &Path, cap: u64, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind, Read as _};
    buf.clear();
    let (file, len) = open_regular(rustix::fs::CWD, path, rustix::fs::OFlags::empty())?;
    let too_big =
        || Error::new(ErrorKind::FileTooLarge, format!("larger than the {cap}-byte limit"));
    if len > cap {
        return Err(too_big());
    }
    file.take(cap.saturating_add(1)).read_to_end(buf)?;
    if buf.len() as u64 > cap {
        buf.clear();
        return Err(too_big());
    }
    Ok(())
}

/// Reads at most the first `cap` bytes of `path`, relative to the directory `dir` (or absolute),
/// into `buf` (cleared first), opened and checked as [`read_regular_into`] does, a symbolic link
/// at its last component refused. A file longer than `cap` is not an error: the caller that
/// reads a prefix (a process's command line, the first PIDs of a `cgroup.procs`) wants only
/// its beginning, and pays no more than `cap` for a huge one. With `dir` a `/proc/<pid>`
/// directory held open, every read is of that process, never of one that reused its PID
/// (`ESRCH` once it has exited).
pub fn read_regular_prefix_at(
    dir: impl std::os::fd::AsFd,
    path: &Path,
    cap: u64,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    use std::io::Read as _;
    buf.clear();
    let (file, _) = open_regular(dir, path, rustix::fs::OFlags::NOFOLLOW)?;
    file.take(cap).read_to_end(buf)?;
    Ok(())
}

/// Opens `path` (relative to `dir`) read-only without blocking, with `extra` flags, and refuses
/// it unless it is a regular file; with its size.
fn open_regular(
    dir: impl std::os::fd::AsFd,
    path: &Path,
    extra: rustix::fs::OFlags,
) -> std::io::Result<(std::fs::File, u64)> {
    use rustix::fs::{Mode, OFlags};
    use std::io::{Error, ErrorKind};
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY | extra;
    let file = std::fs::File::from(rustix::fs::openat(dir, path, flags, Mode::empty())?);
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt as _;
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_block_device() || kind.is_char_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(Error::new(ErrorKind::InvalidInput, format!("not a regular file ({what})")));
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_read_takes_the_beginning_of_a_long_file_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("long"), vec![b'7'; 100_000]).unwrap();
        let at = std::fs::File::open(dir.path()).unwrap();
        let mut buf = Vec::new();
        read_regular_prefix_at(&at, Path::new("long"), 4096, &mut buf).unwrap();
        assert_eq!(buf, vec![b'7'; 4096]);
        std::fs::write(dir.path().join("short"), b"1234\n").unwrap();
        read_regular_prefix_at(&at, Path::new("short"), 4096, &mut buf).unwrap();
        assert_eq!(buf, b"1234\n", "the buffer is cleared first");
    }

    #[test]
    fn a_prefix_read_refuses_a_fifo_without_blocking_and_a_link() {
        let dir = tempfile::tempdir().unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, dir.path().join("fifo"), rustix::fs::Mode::RUSR)
            .unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("file", dir.path().join("link")).unwrap();
        let at = std::fs::File::open(dir.path()).unwrap();
        let mut buf = vec![1];
        let fifo = read_regular_prefix_at(&at, Path::new("fifo"), 16, &mut buf).unwrap_err();
        assert!(fifo.to_string().contains("a FIFO"), "{fifo}");
        assert!(buf.is_empty(), "nothing is left of an earlier read");
        let link = read_regular_prefix_at(&at, Path::new("link"), 16, &mut buf).unwrap_err();
        assert_eq!(link.raw_os_error(), Some(rustix::io::Errno::LOOP.raw_os_error()), "{link}");
    }
}
