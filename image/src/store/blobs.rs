//! Copying blobs into the store, verified on the way, and reading them.

use std::io::{self, Read, Write};

use super::tmp::TempFile;
use super::Store;
use crate::digest::{hex_of, HashingReader};
use crate::error::short;
use crate::manifest::MAX_JSON;
use crate::{Error, Progress};

impl Store {
    pub(crate) fn has_blob(&self, digest: &str) -> Result<bool, Error> {
        Ok(self.blob_path(digest)?.is_file())
    }

    /// A small blob (manifest, config) from the store.
    pub(crate) fn read_small(&self, digest: &str) -> Result<Vec<u8>, Error> {
        let path = self.blob_path(digest)?;
        let file = std::fs::File::open(&path).map_err(|e| Error::Store {
            dir: self.root.clone(),
            why: format!(
                "blob {} is missing ({e}): import the image again",
                short(digest)
            ),
        })?;
        let mut bytes = Vec::new();
        file.take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(format!("reading {}", path.display()), Some(&self.root), e))?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(Error::BadImage {
                digest: short(digest),
                why: "a manifest or config over 4 MiB".into(),
            });
        }
        Ok(bytes)
    }

    /// Copies `size` bytes from `r` into a temp file, checking the size and
    /// the sha256 against `digest` on the way; the file is renamed into
    /// blobs/ at commit. A source longer than its descriptor says is
    /// caught after one byte too many, not after reading all of it.
    pub(crate) fn copy_in(
        &self,
        r: &mut dyn Read,
        digest: &str,
        size: u64,
        what: &str,
        progress: &mut dyn Progress,
    ) -> Result<TempFile, Error> {
        let hex = hex_of(digest)?.to_string();
        let io = |e| {
            Error::io(
                format!("copying {what} {}", short(digest)),
                Some(&self.root),
                e,
            )
        };
        let mut tmp = TempFile::new(&self.tmp_dir(), "blob").map_err(io)?;
        let mut src = HashingReader::new(r.take(size + 1));
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            tmp.file.write_all(&buf[..n]).map_err(io)?;
            progress.update(&format!("copying {what}"), src.count(), Some(size));
        }
        let (got, len) = src.finish().map_err(io)?;
        if len != size {
            return Err(Error::SizeMismatch {
                what: what.to_string(),
                digest: short(digest),
                expected: size,
                actual: len,
            });
        }
        if got != hex {
            return Err(Error::DigestMismatch {
                what: format!("{what} {}", short(digest)),
                digest: short(digest),
            });
        }
        Ok(tmp)
    }
}
