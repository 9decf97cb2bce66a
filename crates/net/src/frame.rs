//! Length-prefixed frames: the unit every transport carries.
//!
//! A frame on the wire is `length: u32 LE` (of what follows), `kind: u8`, then `length - 1`
//! payload bytes. The reader enforces a maximum frame size before allocating anything, and
//! distinguishes a clean close between frames from a peer that disconnects mid-frame.
//! Encoding and decoding are plain functions over `Read`/`Write`, so they run the same on
//! TCP streams and on in-memory buffers.

use std::io::{self, Read, Write};

/// Default largest frame accepted: 256 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 256 << 20;

/// What went wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection cleanly, between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// The peer closed the connection in the middle of a frame.
    #[error("the peer disconnected mid-frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes of the frame received.
        got: usize,
        /// Bytes the frame should have had.
        expected: usize,
    },
    /// The announced frame exceeds the limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// A frame must hold at least its kind byte.
    #[error("empty frame (no kind byte)")]
    Empty,
    /// The frame's payload is not the length the reader expected.
    #[error("a payload of {got} bytes where {expected} were expected")]
    Length {
        /// Payload bytes announced.
        got: usize,
        /// Payload bytes expected.
        expected: usize,
    },
    /// The read or write timed out.
    #[error("timed out")]
    Timeout,
    /// Another I/O error.
    #[error("i/o error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FrameError::Timeout,
            _ => FrameError::Io(e),
        }
    }
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Application-defined message kind.
    pub kind: u8,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// Bytes of a frame's header: its length (4 bytes) and kind (1).
pub const HEADER_BYTES: usize = 5;

/// Writes one frame. Fails if the payload is longer than a frame can say.
///
/// The header and the payload go out in one vectored write where the writer takes one
/// (a socket does): one system call, and on a socket without Nagle's delay no packet
/// of five bytes ahead of the payload.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(payload.len() + 1).map_err(|_| FrameError::TooLarge { len: u32::MAX, max: u32::MAX })?;
    let mut header = [0u8; 5];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4] = kind;
    let mut slices = [io::IoSlice::new(&header), io::IoSlice::new(payload)];
    let mut left = &mut slices[..];
    while !left.is_empty() {
        match w.write_vectored(left) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Ok(n) => io::IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    w.flush()?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes; returns how many arrived before EOF.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// Reads one frame of at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: u32) -> Result<Frame, FrameError> {
    let mut payload = Vec::new();
    let kind = read_frame_into(r, max, &mut payload)?;
    Ok(Frame { kind, payload })
}

/// Reads one frame of at most `max` bytes into `payload` (reusing its allocation), and
/// returns its kind.
pub fn read_frame_into(r: &mut impl Read, max: u32, payload: &mut Vec<u8>) -> Result<u8, FrameError> {
    let (len, kind) = read_header(r, max)?;
    payload.resize(len - 1, 0);
    read_payload(r, payload)?;
    Ok(kind)
}

/// Reads one frame of at most `max` bytes whose payload must be exactly `payload.len()`
/// bytes, straight into `payload` (no buffer in between), and returns its kind. A frame
/// of any other length is refused after its header, before any of its payload is read,
/// which leaves the stream inside that frame: as after [`FrameError::TooLarge`], the
/// connection is of no further use.
pub fn read_frame_exact(r: &mut impl Read, max: u32, payload: &mut [u8]) -> Result<u8, FrameError> {
    let (len, kind) = read_header(r, max)?;
    if len - 1 != payload.len() {
        return Err(FrameError::Length { got: len - 1, expected: payload.len() });
    }
    read_payload(r, payload)?;
    Ok(kind)
}

/// Reads a frame's header: returns its length (kind byte included, at least 1 and at
/// most `max`) and its kind.
fn read_header(r: &mut impl Read, max: u32) -> Result<(usize, u8), FrameError> {
    let mut header = [0u8; 5];
    match read_full(r, &mut header)? {
        0 => return Err(FrameError::Closed),
        5 => {}
        got => return Err(FrameError::Truncated { got, expected: 5 }),
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok((len as usize, header[4]))
}

/// Reads the payload whose header has been read; a peer that stops short is a truncation.
fn read_payload(r: &mut impl Read, payload: &mut [u8]) -> Result<(), FrameError> {
    let got = read_full(r, payload)?;
    if got < payload.len() {
        return Err(FrameError::Truncated { got: got + 5, expected: payload.len() + 5 });
    }
    Ok(())
}

/// Bytes per frame within a step of a collective ([`crate::collective`]): small enough
/// that the receiver's work on one segment overlaps the transfer of the next, large
/// enough to keep system calls few.
pub const SEGMENT_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 7, b"hello").unwrap();
        write_frame(&mut buf, 1, b"").unwrap();
        let mut r = buf.as_slice();
        assert_eq!(read_frame(&mut r, 100).unwrap(), Frame { kind: 7, payload: b"hello".to_vec() });
        assert_eq!(read_frame(&mut r, 100).unwrap(), Frame { kind: 1, payload: vec![] });
        assert!(matches!(read_frame(&mut r, 100), Err(FrameError::Closed)));
    }

    #[test]
    fn malformed_input_is_an_error_never_a_panic() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 7, &[9u8; 100]).unwrap();
        // Cut at every position: a clean close only at 0, truncation elsewhere.
        for cut in 1..buf.len() {
            let err = read_frame(&mut &buf[..cut], 1000).unwrap_err();
            assert!(matches!(err, FrameError::Truncated { .. }), "cut {cut}: {err}");
        }
        assert!(matches!(read_frame(&mut &buf[..], 50), Err(FrameError::TooLarge { len: 101, max: 50 })));
        assert!(matches!(read_frame(&mut &[0u8, 0, 0, 0, 1][..], 50), Err(FrameError::Empty)));
        // An absurd length is refused before any allocation.
        assert!(matches!(read_frame(&mut &[255u8, 255, 255, 255, 1][..], 1 << 20), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn exact_reads_fill_the_slice_and_refuse_other_lengths() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 3, &[1, 2, 3, 4]).unwrap();
        write_frame(&mut buf, 4, &[5, 6]).unwrap();
        let mut r = buf.as_slice();
        let mut dst = [0u8; 4];
        assert_eq!(read_frame_exact(&mut r, 100, &mut dst).unwrap(), 3);
        assert_eq!(dst, [1, 2, 3, 4]);
        // A frame of the wrong length leaves the destination as it was.
        let err = read_frame_exact(&mut r, 100, &mut dst).unwrap_err();
        assert!(matches!(err, FrameError::Length { got: 2, expected: 4 }), "{err}");
        assert_eq!(dst, [1, 2, 3, 4]);
        // Truncation mid-payload and a clean close are told apart, as for the other reads.
        let mut one = Vec::new();
        write_frame(&mut one, 1, &[9; 8]).unwrap();
        let mut dst = [0u8; 8];
        assert!(matches!(
            read_frame_exact(&mut &one[..9], 100, &mut dst),
            Err(FrameError::Truncated { got: 9, expected: 13 })
        ));
        assert!(matches!(read_frame_exact(&mut &one[..0], 100, &mut dst), Err(FrameError::Closed)));
        assert!(matches!(read_frame_exact(&mut &one[..], 8, &mut dst), Err(FrameError::TooLarge { len: 9, max: 8 })));
        // An empty payload into an empty slice (a ring step's empty chunk).
        let mut empty = Vec::new();
        write_frame(&mut empty, 1, &[]).unwrap();
        assert_eq!(read_frame_exact(&mut &empty[..], 8, &mut []).unwrap(), 1);
    }
}
