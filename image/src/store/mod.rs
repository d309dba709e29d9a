//! The image store: content-addressed blobs, names, converted roots (the
//! layout is in the crate documentation).

mod blobs;
mod import;
mod names;
mod pull;
mod rootfs;
mod tmp;

use std::collections::BTreeSet;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use names::{normalize, Names};

use crate::digest::hex_of;
use crate::manifest::{parse_config, parse_manifest};
use crate::{Error, Image, ImportStats};

pub struct Store {
    root: PathBuf,
}

/// Holds the store lock (flock on `lock`) until dropped.
pub(crate) struct Locked(#[allow(dead_code)] File);

impl Store {
    /// $MVM_IMAGES if set, else $XDG_DATA_HOME/mvm/images, else
    /// $HOME/.local/share/mvm/images.
    pub fn default_root() -> Result<PathBuf, Error> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(p) = var("MVM_IMAGES") {
            return Ok(p);
        }
        if let Some(p) = var("XDG_DATA_HOME") {
            return Ok(p.join("mvm/images"));
        }
        var("HOME")
            .map(|h| h.join(".local/share/mvm/images"))
            .ok_or(Error::NoStoreRoot)
    }

    /// Creates the layout (mode 0700) if missing and deletes temp files
    /// left by writers that died.
    pub fn open(root: &Path) -> Result<Store, Error> {
        let io = |what: &str, e| Error::io(format!("{what} {}", root.display()), None, e);
        let mut b = DirBuilder::new();
        b.recursive(true).mode(0o700);
        for sub in ["blobs/sha256", "rootfs", "tmp"] {
            b.create(root.join(sub))
                .map_err(|e| io("creating the image store", e))?;
        }
        let store = Store {
            root: root.to_path_buf(),
        };
        tmp::sweep(&store.tmp_dir()).map_err(|e| io("cleaning the temp files of", e))?;
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub(crate) fn blob_path(&self, digest: &str) -> Result<PathBuf, Error> {
        Ok(self.root.join("blobs/sha256").join(hex_of(digest)?))
    }

    pub(crate) fn rootfs_path(&self, manifest_digest: &str) -> Result<PathBuf, Error> {
        Ok(self
            .root
            .join("rootfs")
            .join(format!("{}.erofs", hex_of(manifest_digest)?)))
    }

    pub(crate) fn lock(&self) -> Result<Locked, Error> {
        let io = |e| Error::io("locking the image store", Some(&self.root), e);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join("lock"))
            .map_err(io)?;
        tmp::lock_exclusive(&f).map_err(io)?;
        Ok(Locked(f))
    }

    /// Looks up NAME[:TAG] (tag `latest` by default) or `sha256:HEX` (the
    /// full digest or a unique prefix of at least 12 hex digits).
    pub fn find(&self, reference: &str) -> Result<Image, Error> {
        let names = Names::load(&self.root)?;
        let manifest = resolve(&names, reference)?;
        let name = names
            .images
            .iter()
            .find(|n| n.manifest == manifest && n.name.is_some())
            .and_then(|n| n.name.clone());
        let name = match normalize(reference) {
            Ok(n) if !reference.starts_with("sha256:") => Some(n),
            _ => name,
        };
        self.image(name, &manifest)
    }

    pub fn list(&self) -> Result<Vec<Image>, Error> {
        let names = Names::load(&self.root)?;
        names
            .images
            .iter()
            .map(|n| self.image(n.name.clone(), &n.manifest))
            .collect()
    }

    /// Removes the name (or, given a digest, every name of that image);
    /// blobs and converted roots no remaining name uses are deleted.
    pub fn remove(&self, reference: &str) -> Result<(), Error> {
        let _lock = self.lock()?;
        let mut names = Names::load(&self.root)?;
        let manifest = resolve(&names, reference)?;
        if reference.starts_with("sha256:") {
            names.images.retain(|n| n.manifest != manifest);
        } else {
            let name = Some(normalize(reference)?);
            names.images.retain(|n| n.name != name);
        }
        let mut kept = BTreeSet::new();
        for n in &names.images {
            kept.extend(self.blobs_of(&n.manifest)?);
        }
        names.save(&self.root)?;
        if !names.images.iter().any(|n| n.manifest == manifest) {
            let path = self.rootfs_path(&manifest)?;
            remove_if_there(&path, &self.root)?;
        }
        for digest in self.blobs_of(&manifest)? {
            if !kept.contains(&digest) {
                remove_if_there(&self.blob_path(&digest)?, &self.root)?;
            }
        }
        Ok(())
    }

    /// The manifest, config and layer digests of a stored image.
    pub(super) fn blobs_of(&self, manifest: &str) -> Result<Vec<String>, Error> {
        let m = parse_manifest(&self.read_small(manifest)?, manifest)?;
        let mut all = vec![manifest.to_string(), m.config.digest];
        all.extend(m.layers.into_iter().map(|l| l.digest));
        Ok(all)
    }

    pub(crate) fn image(&self, name: Option<String>, manifest: &str) -> Result<Image, Error> {
        let m = parse_manifest(&self.read_small(manifest)?, manifest)?;
        let c = parse_config(&self.read_small(&m.config.digest)?, &m.config.digest)?;
        Ok(Image {
            name,
            manifest_digest: manifest.to_string(),
            config_digest: m.config.digest,
            config: c.config,
            layers: m.layers,
            created: c.created,
            imported: ImportStats::default(),
        })
    }
}

fn remove_if_there(path: &Path, root: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(
            format!("removing {}", path.display()),
            Some(root),
            e,
        )),
    }
}

/// The manifest digest a reference names.
fn resolve(names: &Names, reference: &str) -> Result<String, Error> {
    let missing = || Error::NotInStore {
        reference: reference.to_string(),
    };
    if let Some(hex) = reference.strip_prefix("sha256:") {
        if hex.len() < 12 || hex.len() > 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::BadReference {
                reference: reference.to_string(),
                why: "give sha256: and at least 12 hex digits of the digest".into(),
            });
        }
        let prefix = format!("sha256:{}", hex.to_ascii_lowercase());
        let found: BTreeSet<&str> = names
            .images
            .iter()
            .map(|n| n.manifest.as_str())
            .filter(|m| m.starts_with(&prefix))
            .collect();
        return match found.len() {
            0 => Err(missing()),
            1 => Ok(found.into_iter().next().expect("one").to_string()),
            count => Err(Error::Ambiguous {
                prefix: reference.to_string(),
                count,
            }),
        };
    }
    let name = Some(normalize(reference)?);
    names
        .images
        .iter()
        .find(|n| n.name == name)
        .map(|n| n.manifest.clone())
        .ok_or_else(missing)
}
