//! Import: every blob the image needs copied into temp files and verified
//! first; then, under the store lock, all renamed into blobs/ and the name
//! recorded. A failure before the commit leaves nothing behind (the temp
//! files go when dropped); blobs already in the store are not copied.

use std::io::{Read, Seek, SeekFrom};

use super::names::{normalize, Names};
use super::tmp::{sync_dir, TempFile};
use super::Store;
use crate::error::short;
use crate::manifest::{parse_config, parse_manifest, MAX_JSON};
use crate::source::{docker, oci, Blobs, ImageSource};
use crate::{Error, Image, ImportStats, Progress};

impl Store {
    /// Copies an image into the store from an OCI image layout or a
    /// docker/podman save archive, verifying every blob by its digest, and
    /// names it (`name`, else the source's tag; see the crate docs for the
    /// name rules). The returned image's `imported` says what was copied.
    pub fn import(
        &self,
        source: &ImageSource,
        name: Option<&str>,
        progress: &mut dyn Progress,
    ) -> Result<Image, Error> {
        let name = name.map(normalize).transpose()?;
        let blobs: Box<dyn Blobs> = match source {
            ImageSource::OciLayout { dir, tag } => Box::new(oci::open(dir, tag.as_deref())?),
            ImageSource::DockerArchive { file } => Box::new(docker::open(file)?),
        };
        let result = self.import_from(&*blobs, name, progress);
        progress.finish();
        result
    }

    pub(super) fn import_from(
        &self,
        src: &dyn Blobs,
        name: Option<String>,
        progress: &mut dyn Progress,
    ) -> Result<Image, Error> {
        let (manifest, digest, suggested) = src.manifest()?;
        // A source's own name that is not a valid store name is dropped:
        // the image stays reachable by digest.
        let name = name.or_else(|| suggested.and_then(|s| normalize(&s).ok()));
        let m = parse_manifest(&manifest, &digest)?;
        let mut pending: Vec<(String, TempFile)> = Vec::new();
        let mut stats = ImportStats::default();
        let mut present: Vec<String> = Vec::new();
        if self.has_blob(&digest)? {
            present.push(digest.clone());
        } else {
            let tmp = self.copy_in(
                &mut &manifest[..],
                &digest,
                manifest.len() as u64,
                "manifest",
                progress,
            )?;
            pending.push((digest.clone(), tmp));
        }
        // The config first: it says the platform, and a wrong one is
        // refused before any layer is copied.
        if m.config.size > MAX_JSON {
            return Err(Error::BadImage {
                digest: short(&digest),
                why: "its config is over 4 MiB".into(),
            });
        }
        let config_bytes = if self.has_blob(&m.config.digest)? {
            present.push(m.config.digest.clone());
            self.read_small(&m.config.digest)?
        } else {
            let mut r = self.source_blob(src, &m.config.digest, "config")?;
            let mut tmp =
                self.copy_in(&mut r, &m.config.digest, m.config.size, "config", progress)?;
            let mut bytes = Vec::new();
            let io = |e| Error::io("reading the copied config", Some(&self.root), e);
            tmp.file.seek(SeekFrom::Start(0)).map_err(io)?;
            (&tmp.file).read_to_end(&mut bytes).map_err(io)?;
            pending.push((m.config.digest.clone(), tmp));
            bytes
        };
        let config = parse_config(&config_bytes, &m.config.digest)?;
        if config.diff_ids.len() != m.layers.len() {
            return Err(Error::BadImage {
                digest: short(&digest),
                why: format!(
                    "the config lists {} layers, the manifest {}",
                    config.diff_ids.len(),
                    m.layers.len()
                ),
            });
        }
        for (i, l) in m.layers.iter().enumerate() {
            if self.has_blob(&l.digest)? || pending.iter().any(|(d, _)| *d == l.digest) {
                present.push(l.digest.clone());
                continue;
            }
            let what = format!("layer {} of {}", i + 1, m.layers.len());
            let mut r = self.source_blob(src, &l.digest, &what)?;
            let tmp = self.copy_in(&mut r, &l.digest, l.size, &what, progress)?;
            pending.push((l.digest.clone(), tmp));
        }
        stats.blobs_copied = pending.len();
        stats.bytes_copied = pending
            .iter()
            .map(|(_, t)| t.file.metadata().map_or(0, |m| m.len()))
            .sum();
        self.commit(pending, &present, name.clone(), &digest)?;
        let mut image = self.image(name, &digest)?;
        image.imported = stats;
        Ok(image)
    }

    fn source_blob<'a>(
        &self,
        src: &'a dyn Blobs,
        digest: &str,
        what: &str,
    ) -> Result<Box<dyn Read + 'a>, Error> {
        src.open(digest)?.ok_or_else(|| Error::MissingBlob {
            what: what.to_string(),
            digest: short(digest),
            source_desc: src.describe(),
        })
    }

    pub(super) fn commit(
        &self,
        pending: Vec<(String, TempFile)>,
        present: &[String],
        name: Option<String>,
        manifest: &str,
    ) -> Result<(), Error> {
        let _lock = self.lock()?;
        // A concurrent `remove` may have deleted a blob this import found
        // present; under the lock that can no longer change.
        for d in present {
            if !pending.iter().any(|(p, _)| p == d) && !self.has_blob(d)? {
                return Err(Error::Store {
                    dir: self.root.clone(),
                    why: format!(
                        "blob {} was removed while importing: import again",
                        short(d)
                    ),
                });
            }
        }
        let io = |e| Error::io("storing blobs", Some(&self.root), e);
        for (digest, tmp) in pending {
            tmp.persist(&self.blob_path(&digest)?).map_err(io)?;
        }
        sync_dir(&self.root.join("blobs/sha256")).map_err(io)?;
        let mut names = Names::load(&self.root)?;
        names.set(name, manifest);
        names.save(&self.root)
    }
}
