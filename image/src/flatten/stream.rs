//! A layer blob as an uncompressed tar stream: compression is told by the
//! blob's first bytes (gzip, zstd or plain tar), so a Docker archive's
//! plain layer.tar and a registry's gzip layer read the same way; the
//! media type was checked when the image was imported.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Opens a layer blob as its tar stream, at most `limit` bytes of it: a
/// longer stream (a decompression bomb) fails the read and sets the
/// returned flag, so the caller can tell a limit from damage.
/// The tar stream and the flag set when the limit stopped it.
pub(crate) type Stream = (Box<dyn Read>, Rc<Cell<bool>>);

pub(crate) fn open(path: &Path, limit: u64) -> io::Result<Stream> {
    let mut raw = BufReader::with_capacity(1 << 16, File::open(path)?);
    let head = raw.fill_buf()?;
    let tar: Box<dyn Read> = if head.starts_with(GZIP_MAGIC) {
        Box::new(flate2::bufread::MultiGzDecoder::new(raw))
    } else if head.starts_with(ZSTD_MAGIC) {
        Box::new(Zstd::new(raw)?)
    } else {
        Box::new(raw)
    };
    let hit = Rc::new(Cell::new(false));
    let counted = Limited {
        inner: tar,
        left: limit,
        hit: hit.clone(),
    };
    Ok((Box::new(BufReader::with_capacity(1 << 16, counted)), hit))
}

struct Limited<R> {
    inner: R,
    left: u64,
    hit: Rc<Cell<bool>>,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.hit.set(true);
            return Err(io::Error::other("layer stream over the limit"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// zstd frames one after another (a zstd stream may hold several, as
/// zstd:chunked layers do), decoded in pure Rust.
struct Zstd<R: Read> {
    dec: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> Zstd<R> {
    fn new(r: R) -> io::Result<Self> {
        let dec = ruzstd::decoding::StreamingDecoder::new(r).map_err(io::Error::other)?;
        Ok(Zstd { dec: Some(dec) })
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(dec) = self.dec.as_mut() else {
                return Ok(0);
            };
            let n = dec.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another one follows unless at the end.
            let mut src = self.dec.take().expect("checked above").into_inner();
            if src.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.dec =
                Some(ruzstd::decoding::StreamingDecoder::new(src).map_err(io::Error::other)?);
        }
    }
}
