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
    use rustix::fs::{Mode, OFlags};
    use std::io::{Error, ErrorKind, Read as _};
    buf.clear();
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let file = std::fs::File::from(rustix::fs::open(path, flags, Mode::empty())?);
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
    let too_big =
        || Error::new(ErrorKind::FileTooLarge, format!("larger than the {cap}-byte limit"));
    if meta.len() > cap {
        return Err(too_big());
    }
    file.take(cap.saturating_add(1)).read_to_end(buf)?;
    if buf.len() as u64 > cap {
        buf.clear();
        return Err(too_big());
    }
    Ok(())
}
