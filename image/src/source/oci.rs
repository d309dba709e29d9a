//! An OCI image layout directory: oci-layout, index.json, blobs/ALG/HEX.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::image::Descriptor;

use super::Blobs;
use crate::digest::{hex_of, sha256_hex};
use crate::error::short;
use crate::manifest::{is_index, parse_index, pick_amd64, MAX_JSON};
use crate::Error;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The full name containerd (and docker save since 25) record.
const CONTAINERD_NAME: &str = "io.containerd.image.name";

pub(crate) struct OciLayout {
    dir: PathBuf,
    tag: Option<String>,
}

pub(crate) fn open(dir: &Path, tag: Option<&str>) -> Result<OciLayout, Error> {
    let layout = OciLayout {
        dir: dir.to_path_buf(),
        tag: tag.map(String::from),
    };
    if !dir.join("oci-layout").is_file() || !dir.join("index.json").is_file() {
        return Err(layout.bad("not an OCI image layout (no oci-layout or index.json file)".into()));
    }
    Ok(layout)
}

impl OciLayout {
    fn bad(&self, why: String) -> Error {
        Error::BadSource {
            source_desc: self.describe(),
            why,
        }
    }

    fn read_json(
        &self,
        path: &Path,
        digest: Option<&str>,
        size: Option<u64>,
    ) -> Result<Vec<u8>, Error> {
        let io = |e| Error::io(format!("reading {}", path.display()), None, e);
        let mut bytes = Vec::new();
        File::open(path)
            .map_err(io)?
            .take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(self.bad(format!(
                "{} is over 4 MiB: not an index or manifest",
                path.display()
            )));
        }
        if let Some(d) = digest {
            if let Some(s) = size.filter(|s| *s != bytes.len() as u64) {
                return Err(Error::SizeMismatch {
                    what: "manifest".into(),
                    digest: short(d),
                    expected: s,
                    actual: bytes.len() as u64,
                });
            }
            if sha256_hex(&bytes) != hex_of(d)? {
                return Err(Error::DigestMismatch {
                    what: format!("manifest {}", short(d)),
                    digest: short(d),
                });
            }
        }
        Ok(bytes)
    }

    fn blob(&self, d: &Descriptor) -> Result<Vec<u8>, Error> {
        let digest = d.digest().to_string();
        let path = self.dir.join("blobs/sha256").join(hex_of(&digest)?);
        if !path.is_file() {
            return Err(Error::MissingBlob {
                what: "manifest".into(),
                digest: short(&digest),
                source_desc: self.describe(),
            });
        }
        self.read_json(&path, Some(&digest), Some(d.size()))
    }

    /// The descriptor `tag` names in index.json (any entry if no tag and
    /// all entries are one image or one platform set).
    fn pick<'a>(&self, manifests: &'a [Descriptor]) -> Result<Vec<&'a Descriptor>, Error> {
        let tag_of = |d: &Descriptor| {
            d.annotations()
                .as_ref()
                .and_then(|a| a.get(REF_NAME))
                .cloned()
        };
        let chosen: Vec<&Descriptor> = match &self.tag {
            Some(t) => manifests
                .iter()
                .filter(|d| {
                    tag_of(d)
                        .is_some_and(|r| r == *t || r.rsplit_once(':').is_some_and(|x| x.1 == t))
                })
                .collect(),
            None => manifests.iter().collect(),
        };
        if chosen.is_empty() {
            let tags: Vec<String> = manifests.iter().filter_map(tag_of).collect();
            let which = self.tag.as_deref().unwrap_or("");
            return Err(self.bad(format!(
                "no image tagged '{which}' (tags: {})",
                tags.join(", ")
            )));
        }
        let digests: std::collections::BTreeSet<String> =
            chosen.iter().map(|d| d.digest().to_string()).collect();
        if digests.len() > 1 && chosen.iter().any(|d| d.platform().is_none()) {
            let tags: Vec<String> = chosen.iter().filter_map(|d| tag_of(d)).collect();
            return Err(self.bad(format!(
                "holds several images: pick one with oci:DIR:TAG (tags: {})",
                tags.join(", ")
            )));
        }
        Ok(chosen)
    }
}

impl Blobs for OciLayout {
    fn manifest(&self) -> Result<(Vec<u8>, String, Option<String>), Error> {
        let index_bytes = self.read_json(&self.dir.join("index.json"), None, None)?;
        let index = parse_index(&index_bytes, "index.json")?;
        let chosen = self.pick(index.manifests())?;
        let mut d = if chosen.len() == 1 {
            chosen[0].clone()
        } else {
            let list: Vec<Descriptor> = chosen.into_iter().cloned().collect();
            pick_amd64(&list, &self.describe())?.clone()
        };
        let annotations = d.annotations().clone().unwrap_or_default();
        let name = annotations.get(CONTAINERD_NAME).cloned().or_else(|| {
            let r = annotations.get(REF_NAME)?;
            // A bare tag names an image of the directory's name.
            if r.contains(':') || r.contains('/') {
                Some(r.clone())
            } else {
                let base = self
                    .dir
                    .canonicalize()
                    .ok()?
                    .file_name()?
                    .to_str()?
                    .to_ascii_lowercase();
                Some(format!("{base}:{r}"))
            }
        });
        // Nested indexes (a multi-platform image): follow to linux/amd64.
        for _ in 0..4 {
            let bytes = self.blob(&d)?;
            let digest = d.digest().to_string();
            if !is_index(d.media_type().as_ref(), &bytes) {
                return Ok((bytes, digest, name));
            }
            let nested = parse_index(&bytes, &digest)?;
            d = pick_amd64(nested.manifests(), &self.describe())?.clone();
        }
        Err(self.bad("indexes nested more than 4 deep".into()))
    }

    fn open(&self, digest: &str) -> Result<Option<Box<dyn Read + '_>>, Error> {
        let path = self.dir.join("blobs/sha256").join(hex_of(digest)?);
        match File::open(&path) {
            Ok(f) => Ok(Some(Box::new(f))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), None, e)),
        }
    }

    fn describe(&self) -> String {
        format!("oci:{}", self.dir.display())
    }
}
