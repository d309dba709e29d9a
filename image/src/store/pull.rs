//! Pull: an image from a registry into the store, through the same
//! verified copy and commit as an import (src/store/import.rs), so an
//! interrupted or refused pull leaves the store as it was.

use super::names::Names;
use super::Store;
use crate::registry::{PullOptions, RegistryRef, Remote};
use crate::{Error, Image, Progress};

impl Store {
    /// Pulls HOST[:PORT]/NAME[:TAG] (tag `latest` by default) or
    /// HOST[:PORT]/NAME@sha256:HEX, linux/amd64 only, and names it
    /// HOST[:PORT]/NAME:TAG (a digest-only reference stays unnamed,
    /// reachable by digest). The manifest is always asked for (a tag may
    /// have moved); blobs already in the store are not downloaded. A
    /// digest reference whose image is stored makes no request at all.
    pub fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Image, Error> {
        let r = RegistryRef::parse(reference)?;
        if let Some(digest) = &r.digest {
            if let Some(image) = self.stored_whole(&r, digest)? {
                return Ok(image);
            }
        }
        // The runtime and its connections live in `remote` and go with it.
        let remote = Remote::new(&r, opts)?;
        let result = self.import_from(&remote, r.store_name(), progress);
        progress.finish();
        result
    }

    /// The image a digest names, if it and every blob it lists are in the
    /// store; the reference's tag, if it has one, is recorded as its name.
    fn stored_whole(&self, r: &RegistryRef, digest: &str) -> Result<Option<Image>, Error> {
        let names = Names::load(self.root())?;
        if !names.images.iter().any(|n| n.manifest == digest) {
            return Ok(None);
        }
        let blobs = self.blobs_of(digest)?;
        for b in &blobs {
            if !self.has_blob(b)? {
                return Ok(None);
            }
        }
        let name = r.store_name();
        if name.is_some() {
            self.commit(Vec::new(), &blobs, name.clone(), digest)?;
        }
        let name = name.or_else(|| {
            names
                .images
                .iter()
                .find(|n| n.manifest == digest && n.name.is_some())
                .and_then(|n| n.name.clone())
        });
        self.image(name, digest).map(Some)
    }
}
