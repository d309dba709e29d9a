//! Framing of messages on a byte stream (vsock, or the VMM's Unix socket):
//! `u32` little-endian length N, then N bytes: the kind byte and N-1 bytes of
//! payload. `FrameReader` reads frames from a blocking `Read`; `Decoder`
//! takes bytes as a non-blocking socket hands them out.

use std::io::{self, Read, Write};

use crate::message::{Message, MessageError};

/// Largest accepted N (kind byte + payload). Checked before anything is
/// allocated, so a corrupt or hostile length cannot exhaust memory.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes is larger than the {MAX_FRAME}-byte limit")]
    FrameTooLarge { len: usize },
    #[error("empty frame: a frame needs at least its kind byte")]
    EmptyFrame,
    #[error("stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated { expected: usize, got: usize },
    #[error(transparent)]
    Message(#[from] MessageError),
    #[error("I/O on the exec channel: {0}")]
    Io(#[from] io::Error),
}

impl Message {
    /// The whole frame as bytes, for callers that queue output themselves
    /// (a non-blocking writer).
    pub fn to_frame(&self) -> Result<Vec<u8>, FrameError> {
        let payload = self.payload()?;
        let len = payload.len() + 1;
        check_len(len)?;
        let mut frame = Vec::with_capacity(LEN_BYTES + len);
        // check_len bounds len far below u32::MAX.
        frame.extend_from_slice(&(len as u32).to_le_bytes());
        frame.push(self.kind().byte());
        frame.extend_from_slice(&payload);
        Ok(frame)
    }

    /// Writes the frame with one `write_all`, so that frames written by one
    /// writer never interleave at the byte level.
    pub fn encode(&self, out: &mut impl Write) -> Result<(), FrameError> {
        out.write_all(&self.to_frame()?)?;
        Ok(())
    }
}

fn check_len(len: usize) -> Result<(), FrameError> {
    match len {
        0 => Err(FrameError::EmptyFrame),
        len if len > MAX_FRAME => Err(FrameError::FrameTooLarge { len }),
        _ => Ok(()),
    }
}

/// Reads whole frames from a blocking reader. It never reads past the end of
/// the frame it returns, so the stream can be handed on (to a `Decoder`, or
/// made non-blocking) between messages.
pub struct FrameReader<R> {
    inner: R,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner }
    }

    /// The next message; `Ok(None)` when the stream ends cleanly between
    /// frames. After an error the stream position is unknown: stop reading.
    pub fn read_message(&mut self) -> Result<Option<Message>, FrameError> {
        let mut prefix = [0u8; LEN_BYTES];
        let got = read_full(&mut self.inner, &mut prefix)?;
        if got == 0 {
            return Ok(None);
        }
        if got < LEN_BYTES {
            return Err(FrameError::Truncated {
                expected: LEN_BYTES,
                got,
            });
        }
        let len = u32::from_le_bytes(prefix) as usize;
        check_len(len)?;
        // take() + read_to_end grows the buffer with the bytes that actually
        // arrive, instead of trusting the length up front.
        let mut body = Vec::new();
        (&mut self.inner).take(len as u64).read_to_end(&mut body)?;
        if body.len() < len {
            return Err(FrameError::Truncated {
                expected: LEN_BYTES + len,
                got: LEN_BYTES + body.len(),
            });
        }
        Ok(Some(Message::decode(body[0], &body[1..])?))
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Reads until `buf` is full or EOF; returns how many bytes it got.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Incremental decoder for a non-blocking stream: `push` what the socket
/// gave, then take messages with `next` (it is an `Iterator`) until `None`.
///
/// A bad message (unknown kind, bad JSON, oversized data) is returned as an
/// error and decoding goes on with the next frame. A bad length (too large,
/// or zero) leaves no way to find the next frame: it is returned once, then
/// the decoder is `failed`, yields nothing and drops what is pushed.
///
/// Memory: the decoder holds what was pushed and not yet decoded, at most
/// one incomplete frame (up to `LEN_BYTES + MAX_FRAME`) plus the last push.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the undecoded bytes in `buf`.
    start: usize,
    failed: bool,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        // Drop decoded bytes first so the buffer does not grow forever.
        self.buf.drain(..self.start);
        self.start = 0;
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes pushed and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// True after a bad frame length: the stream cannot be decoded further.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Call at end of stream: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        let got = self.buffered();
        if self.failed || got == 0 {
            return Ok(());
        }
        let expected = match self.pending() {
            Some(prefix) => LEN_BYTES + u32::from_le_bytes(prefix) as usize,
            None => LEN_BYTES,
        };
        Err(FrameError::Truncated { expected, got })
    }

    /// The length prefix of the next frame, once all four bytes are in.
    fn pending(&self) -> Option<[u8; LEN_BYTES]> {
        self.buf
            .get(self.start..self.start + LEN_BYTES)?
            .try_into()
            .ok()
    }
}

impl Iterator for Decoder {
    type Item = Result<Message, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let len = u32::from_le_bytes(self.pending()?) as usize;
        // Checked as soon as the prefix is in, before waiting for (and
        // buffering) the body.
        if let Err(err) = check_len(len) {
            self.failed = true;
            self.buf = Vec::new();
            self.start = 0;
            return Some(Err(err));
        }
        let body_start = self.start + LEN_BYTES;
        let body = self.buf.get(body_start..body_start + len)?;
        let message = Message::decode(body[0], &body[1..]);
        self.start = body_start + len;
        Some(message.map_err(FrameError::from))
    }
}
