//! Framing: a little-endian `u32` length, then a postcard payload; bounded and strict. The
//! bound is a property of the message type ([`Message::MAX_FRAME`]), so no caller chooses it.

use serde::{Serialize, de::DeserializeOwned};
use std::io::{self, Read, Write};

/// A type that crosses the socket as one frame: [`crate::Request`] or [`crate::Reply`].
///
/// The framing helpers hang off the type, so the maximum that applies to a direction cannot be
/// confused with the other's.
pub trait Message: Serialize + DeserializeOwned + Send + Sized {
    /// Largest payload of this type that is sent or accepted, in bytes.
    const MAX_FRAME: u32;

    /// Parses a length prefix, refusing lengths above [`Self::MAX_FRAME`] before anything is
    /// allocated. For readers that time each read themselves (the broker's server).
    fn parse_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
        parse_len(prefix, Self::MAX_FRAME)
    }

    /// Decodes one payload strictly: trailing bytes are an error, and so is any encoding
    /// other than the one value's canonical encoding (postcard itself accepts overlong
    /// varints, e.g. `[0x96, 0x00]` for 22), so one value has exactly one accepted payload.
    fn decode(payload: &[u8]) -> Result<Self, FrameError> {
        let (value, rest) = postcard::take_from_bytes(payload).map_err(FrameError::Malformed)?;
        if !rest.is_empty() {
            return Err(FrameError::TrailingBytes(rest.len()));
        }
        let canonical: Vec<u8> = postcard::to_allocvec(&value).map_err(FrameError::Malformed)?;
        if canonical != payload {
            return Err(FrameError::NotCanonical);
        }
        Ok(value)
    }

    /// Encodes `self` as one frame, length prefix included.
    fn to_frame(&self) -> Result<Vec<u8>, FrameError> {
        encode_frame(self, Self::MAX_FRAME)
    }

    /// Reads and decodes one frame from a blocking reader.
    fn read<R: Read>(reader: &mut R) -> Result<Self, FrameError> {
        let mut prefix = [0u8; 4];
        read_prefix(&mut prefix, |buf| reader.read(buf))?;
        let mut payload = vec![0u8; Self::parse_len(prefix)?];
        reader.read_exact(&mut payload).map_err(payload_error)?;
        Self::decode(&payload)
    }

    /// Encodes and writes one frame to a blocking writer, then flushes it.
    fn write<W: Write>(&self, writer: &mut W) -> Result<(), FrameError> {
        let frame = self.to_frame()?;
        writer.write_all(&frame).map_err(FrameError::Io)?;
        writer.flush().map_err(FrameError::Io)
    }

    /// Reads and decodes one frame from an async reader.
    #[cfg(feature = "tokio")]
    fn read_async<R: tokio::io::AsyncRead + Unpin + Send>(
        reader: &mut R,
    ) -> impl Future<Output = Result<Self, FrameError>> + Send {
        use tokio::io::AsyncReadExt;
        async move {
            let mut prefix = [0u8; 4];
            let mut got = 0;
            while let Some(rest) = prefix.get_mut(got..).filter(|rest| !rest.is_empty()) {
                match reader.read(rest).await {
                    Ok(0) => return Err(eof_in_prefix(got)),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(FrameError::Io(e)),
                }
            }
            let mut payload = vec![0u8; Self::parse_len(prefix)?];
            reader.read_exact(&mut payload).await.map_err(payload_error)?;
            Self::decode(&payload)
        }
    }

    /// Encodes and writes one frame to an async writer, then flushes it.
    #[cfg(feature = "tokio")]
    fn write_async<W: tokio::io::AsyncWrite + Unpin + Send>(
        &self,
        writer: &mut W,
    ) -> impl Future<Output = Result<(), FrameError>> + Send {
        use tokio::io::AsyncWriteExt;
        let frame = self.to_frame();
        async move {
            let frame = frame?;
            writer.write_all(&frame).await.map_err(FrameError::Io)?;
            writer.flush().await.map_err(FrameError::Io)
        }
    }
}

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
    /// The payload decoded, but is not the canonical encoding of its value (an overlong
    /// varint).
    #[error("payload is not in canonical encoding")]
    NotCanonical,
    /// The transport failed.
    #[error("transport error")]
    Io(#[source] io::Error),
}

fn parse_len(prefix: [u8; 4], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len as usize)
}

/// Encodes `value` as one frame, refusing payloads above `max`.
pub(crate) fn encode_frame<T: Serialize + ?Sized>(
    value: &T,
    max: u32,
) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    buf = postcard::to_extend(value, buf).map_err(FrameError::Malformed)?;
    let len = buf.len() - 4;
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    if len32 > max {
        return Err(FrameError::TooLarge { len: len32, max });
    }
    // The first four bytes are the zeros written above; postcard only appended after them.
    if let Some(prefix) = buf.get_mut(..4) {
        prefix.copy_from_slice(&len32.to_le_bytes());
    }
    Ok(buf)
}

/// End of stream after `got` bytes of a length prefix: clean between frames, else truncated.
fn eof_in_prefix(got: usize) -> FrameError {
    if got == 0 { FrameError::Closed } else { FrameError::Truncated }
}

/// The payload's read failed; end of stream there is always mid-frame.
fn payload_error(e: io::Error) -> FrameError {
    if e.kind() == io::ErrorKind::UnexpectedEof { FrameError::Truncated } else { FrameError::Io(e) }
}

fn read_prefix(
    prefix: &mut [u8; 4],
    mut read: impl FnMut(&mut [u8]) -> io::Result<usize>,
) -> Result<(), FrameError> {
    let mut got = 0;
    while let Some(rest) = prefix.get_mut(got..).filter(|rest| !rest.is_empty()) {
        match read(rest) {
            Ok(0) => return Err(eof_in_prefix(got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}
