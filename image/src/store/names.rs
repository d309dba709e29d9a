//! names.json: which names point at which manifests. Small, read whole and
//! rewritten whole (temp file, fsync, rename, fsync of the directory)
//! under the store lock, so a reader sees the old file or the new one.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::tmp::{sync_dir, TempFile};
use crate::Error;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Names {
    pub images: Vec<Named>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Named {
    pub name: Option<String>,
    pub manifest: String,
}

impl Names {
    pub(crate) fn load(root: &Path) -> Result<Names, Error> {
        let path = root.join("names.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Store {
                dir: root.to_path_buf(),
                why: format!("names.json is damaged ({e}): fix or delete it"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Names::default()),
            Err(e) => Err(Error::io(
                format!("reading {}", path.display()),
                Some(root),
                e,
            )),
        }
    }

    pub(crate) fn save(&self, root: &Path) -> Result<(), Error> {
        let io = |e| Error::io("writing names.json", Some(root), e);
        let mut tmp = TempFile::new(&root.join("tmp"), "names").map_err(io)?;
        let mut bytes = serde_json::to_vec_pretty(self).expect("names serialize");
        bytes.push(b'\n');
        tmp.file.write_all(&bytes).map_err(io)?;
        tmp.persist(&root.join("names.json")).map_err(io)?;
        sync_dir(root).map_err(io)
    }

    /// Points `name` at `manifest` (replacing what it named before); an
    /// unnamed import only adds an entry if the manifest has none.
    pub(crate) fn set(&mut self, name: Option<String>, manifest: &str) {
        match &name {
            Some(_) => self.images.retain(|n| n.name != name),
            None => {
                if self.images.iter().any(|n| n.manifest == manifest) {
                    return;
                }
            }
        }
        self.images.push(Named {
            name,
            manifest: manifest.to_string(),
        });
        self.images
            .sort_by(|a, b| (&a.name, &a.manifest).cmp(&(&b.name, &b.manifest)));
    }
}

/// NAME[:TAG] in the store's form: `latest` when no tag is given. Names
/// are kept as given: no registry's implicit prefixes are added or
/// dropped, so a name means the same whoever reads it.
pub(crate) fn normalize(reference: &str) -> Result<String, Error> {
    let bad = |why: &str| Error::BadReference {
        reference: reference.to_string(),
        why: why.into(),
    };
    let r = reference;
    if r.is_empty() || r.len() > 255 {
        return Err(bad("a name is 1 to 255 characters"));
    }
    if r.contains('@') {
        return Err(bad("give NAME[:TAG] or sha256:HEX, not NAME@DIGEST"));
    }
    let last = r.rsplit('/').next().unwrap_or(r);
    let (repo, tag) = match last.rsplit_once(':') {
        Some((_, tag)) => (&r[..r.len() - tag.len() - 1], tag),
        None => (r, "latest"),
    };
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c);
    if repo.is_empty() || !repo.chars().all(ok) || repo.starts_with(['/', '.', '-']) {
        return Err(bad(
            "a name is lowercase letters, digits and . _ - / (then :TAG)",
        ));
    }
    if !crate::source::is_tag(tag) {
        return Err(bad("a tag is letters, digits and . _ - (at most 128)"));
    }
    Ok(format!("{repo}:{tag}"))
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn names_normalize() {
        assert_eq!(normalize("foo").unwrap(), "foo:latest");
        assert_eq!(
            normalize("library/alpine:3.20").unwrap(),
            "library/alpine:3.20"
        );
        assert_eq!(
            normalize("localhost:5000/a/b").unwrap(),
            "localhost:5000/a/b:latest"
        );
        assert_eq!(
            normalize("registry.example/x/y:v1").unwrap(),
            "registry.example/x/y:v1"
        );
        assert!(normalize("Foo").is_err());
        assert!(normalize("a b").is_err());
        assert!(normalize("../x").is_err());
    }
}
