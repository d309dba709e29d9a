//! Pull: an image from a registry into the store, through the same
//! verified copy and commit as an import (src/store/import.rs), so an
//! interrupted or refused pull leaves the store as it was.

use super::names::Names;
use super::Store;
use crate::registry::RegistryRef;
#[cfg(feature = "registry")]
use crate::registry::{PullOptions, Remote};
#[cfg(feature = "registry")]
use crate::Progress;
use crate::{Error, Image};

impl Store {
    /// Pulls HOST[:PORT]/NAME[:TAG] (tag `latest` by default) or
    /// HOST[:PORT]/NAME@sha256:HEX, linux/amd64 only, and names it
    /// HOST[:PORT]/NAME:TAG (a digest-only reference stays unnamed,
    /// reachable by digest). The manifest is always asked for (a tag may
    /// have moved); blobs already in the store are not downloaded. A
    /// digest reference whose image is stored makes no request at all.
    #[cfg(feature = "registry")]
    pub fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &mut dyn Progress,
    ) -> Result<Image, Error> {
        if let Some(image) = self.find_by_registry_digest(reference)? {
            return Ok(image);
        }
        let r = RegistryRef::parse(reference)?;
        // The runtime and its connections live in `remote` and go with it.
        let remote = Remote::new(&r, opts)?;
        let result = self.import_from(&remote, r.store_name(), progress);
        progress.finish();
        result
    }

    /// The image HOST[:PORT]/NAME[:TAG]@sha256:HEX names, when it and
    /// every blob it lists are in the store (its tag, if given, recorded
    /// as its name), with no request: what a pull of it would return. None
    /// for a reference by tag alone, which only the registry can resolve,
    /// or an image not wholly stored.
    pub fn find_by_registry_digest(&self, reference: &str) -> Result<Option<Image>, Error> {
        let r = RegistryRef::parse(reference)?;
        match &r.digest {
            Some(digest) => self.stored_whole(&r, digest),
            None => Ok(None),
        }
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
