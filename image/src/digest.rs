//! sha256 digests: parsing "sha256:HEX" and hashing while reading or
//! writing, so that every blob is verified as it is copied.

use sha2::{Digest as _, Sha256};
use std::io::{self, Read};

use crate::Error;

/// The 64 lowercase hex digits of a "sha256:HEX" digest, or an error for
/// anything else (other algorithms, short or odd hex, path characters: the
/// hex becomes a file name in the store, so it is checked strictly).
pub(crate) fn hex_of(digest: &str) -> Result<&str, Error> {
    let bad = |why: &str| Error::BadReference {
        reference: crate::error::show(digest.as_bytes()),
        why: why.to_string(),
    };
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| bad("only sha256 digests are supported"))?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(bad("a sha256 digest has 64 lowercase hex digits"));
    }
    Ok(hex)
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Reads to the end (so the digest covers every byte) and returns
    /// (hex digest, bytes read).
    pub(crate) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((hex(&self.hasher.finalize()), self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}
