//! Framing: a little-endian `u32` length, then a postcard payload; bounded and strict.

use serde::{Serialize, de::DeserializeOwned};
use std::io::{self, Read, Write};

/// Largest request payload the broker accepts. Requests are a few bytes.
pub const MAX_REQUEST_FRAME: u32 = 1024;

/// Largest reply payload the frontend accepts. A sample of 4096 cores is about 64 KiB.
pub const MAX_REPLY_FRAME: u32 = 1024 * 1024;

/// Why a frame could not be read, written or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix announced more than the maximum; nothing was allocated.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The maximum for this direction.
        max: u32,
    },
    /// The peer closed the connection cleanly between two frames.
    #[error("connection closed")]
    Closed,
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The payload is not a valid encoding of the expected type.
    #[error("malformed payload")]
    Malformed(#[source] postcard::Error),
    /// The payload decoded but bytes were left over.
    #[error("{0} trailing bytes after the payload")]
    TrailingBytes(usize),
    /// The transport failed.
    #[error("transport error")]
    Io(#[source] io::Error),
}

/// Parses a length prefix, refusing lengths above `max`.
pub fn parse_len(prefix: [u8; 4], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len as usize)
}

/// Encodes `value` as one frame (length prefix included), refusing payloads above `max`.
pub fn encode_frame<T: Serialize>(value: &T, max: u32) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    buf = postcard::to_extend(value, buf).map_err(FrameError::Malformed)?;
    let len = buf.len() - 4;
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    if len32 > max {
        return Err(FrameError::TooLarge { len: len32, max });
    }
    buf[..4].copy_from_slice(&len32.to_le_bytes());
    Ok(buf)
}

/// Decodes one payload strictly: trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes(payload).map_err(FrameError::Malformed)?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes(rest.len()));
    }
    Ok(value)
}

fn map_eof(e: io::Error, started: bool) -> FrameError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        if started { FrameError::Truncated } else { FrameError::Closed }
    } else {
        FrameError::Io(e)
    }
}

/// Reads one frame's payload from a blocking reader.
pub fn read_frame<R: Read>(reader: &mut R, max: u32) -> Result<Vec<u8>, FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match reader.read(&mut prefix[got..]) {
            Ok(0) => return Err(if got == 0 { FrameError::Closed } else { FrameError::Truncated }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = parse_len(prefix, max)?;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload).map_err(|e| map_eof(e, true))?;
    Ok(payload)
}

/// Writes one value as a frame to a blocking writer.
pub fn write_frame<W: Write, T: Serialize>(
    writer: &mut W,
    value: &T,
    max: u32,
) -> Result<(), FrameError> {
    let buf = encode_frame(value, max)?;
    writer.write_all(&buf).map_err(FrameError::Io)?;
    writer.flush().map_err(FrameError::Io)
}

/// Reads one frame's payload from an async reader.
#[cfg(feature = "tokio")]
pub async fn read_frame_async<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    max: u32,
) -> Result<Vec<u8>, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match reader.read(&mut prefix[got..]).await {
            Ok(0) => return Err(if got == 0 { FrameError::Closed } else { FrameError::Truncated }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = parse_len(prefix, max)?;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload).await.map_err(|e| map_eof(e, true))?;
    Ok(payload)
}

/// Writes one value as a frame to an async writer.
#[cfg(feature = "tokio")]
pub async fn write_frame_async<W: tokio::io::AsyncWrite + Unpin, T: Serialize>(
    writer: &mut W,
    value: &T,
    max: u32,
) -> Result<(), FrameError> {
    use tokio::io::AsyncWriteExt;
    let buf = encode_frame(value, max)?;
    writer.write_all(&buf).await.map_err(FrameError::Io)?;
    writer.flush().await.map_err(FrameError::Io)
}
