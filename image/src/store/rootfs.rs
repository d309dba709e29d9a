//! Converted roots: rootfs/HEX.erofs, made on first use from the stored
//! layers and kept until the image's last name is removed.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

use sha2::{Digest, Sha256};

use super::names::Names;
use super::tmp::{sync_dir, TempFile};
use super::Store;
use crate::convert::convert;
use crate::flatten::apply::Layer;
use crate::{Error, Image, Limits, Progress, Rootfs};

impl Store {
    /// The image's root filesystem as an EROFS file: converted on first
    /// use, taken from the cache (rootfs/HEX.erofs, by manifest digest)
    /// after that (`converted` says which).
    pub fn rootfs(
        &self,
        image: &Image,
        limits: &Limits,
        progress: &mut dyn Progress,
    ) -> Result<Rootfs, Error> {
        let path = self.rootfs_path(&image.manifest_digest)?;
        if let Some(r) = self.cached(&path)? {
            return Ok(r);
        }
        let layers = image
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    path: self.blob_path(&l.digest)?,
                    digest: l.digest.clone(),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        for l in &layers {
            if !l.path.is_file() {
                return Err(Error::Store {
                    dir: self.root.clone(),
                    why: format!(
                        "layer {} is missing: import the image again",
                        crate::error::short(&l.digest)
                    ),
                });
            }
        }
        let io = |e| Error::io("writing the root filesystem image", Some(&self.root), e);
        let tmp = TempFile::new(&self.tmp_dir(), "rootfs").map_err(io)?;
        // The volume uuid comes from the manifest digest: same image,
        // same bytes.
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&Sha256::digest(image.manifest_digest.as_bytes())[..16]);
        let result = convert(&layers, &tmp.file, uuid, limits, progress);
        progress.finish();
        let written = result.map_err(|e| self.in_store(e))?;
        let _lock = self.lock()?;
        let names = Names::load(&self.root)?;
        if !names
            .images
            .iter()
            .any(|n| n.manifest == image.manifest_digest)
        {
            return Err(Error::NotInStore {
                reference: image.manifest_digest.clone(),
            });
        }
        tmp.persist(&path).map_err(io)?;
        sync_dir(&self.root.join("rootfs")).map_err(io)?;
        let bytes = std::fs::metadata(&path).map_err(io)?.blocks() * 512;
        Ok(Rootfs {
            path,
            converted: true,
            bytes,
            entries: written.entries,
        })
    }

    fn cached(&self, path: &std::path::Path) -> Result<Option<Rootfs>, Error> {
        let Ok(mut f) = File::open(path) else {
            return Ok(None);
        };
        let io = |e| Error::io(format!("reading {}", path.display()), Some(&self.root), e);
        // The superblock says how many inodes the image has.
        let mut sb = [0u8; 1024 + 128];
        f.read_exact(&mut sb).map_err(io)?;
        let entries = u64::from_le_bytes(sb[1024 + 16..1024 + 24].try_into().expect("8 bytes"));
        let bytes = f.metadata().map_err(io)?.blocks() * 512;
        Ok(Some(Rootfs {
            path: path.to_path_buf(),
            converted: false,
            bytes,
            entries,
        }))
    }

    /// A full disk while writing into the store is said as such.
    fn in_store(&self, e: Error) -> Error {
        match e {
            Error::Io { source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                ) =>
            {
                Error::NoSpace {
                    dir: self.root.clone(),
                }
            }
            e => e,
        }
    }
}
