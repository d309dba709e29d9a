//! Where an import reads an image from.

pub(crate) mod docker;
pub(crate) mod oci;

use std::path::{Path, PathBuf};

use crate::Error;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSource {
    /// An OCI image layout directory (oci-layout, index.json, blobs/), and
    /// which of its tagged images.
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// A `docker save` or `podman save` tar archive.
    DockerArchive { file: PathBuf },
}

impl ImageSource {
    /// Parses "oci:DIR[:TAG]" and "docker-archive:FILE"; Ok(None) for
    /// anything else (a store name or, later, a registry reference). In
    /// "oci:A:B", B is a tag unless A:B is itself a directory.
    pub fn parse(s: &str) -> Result<Option<ImageSource>, Error> {
        let empty = |what: &str| Error::BadReference {
            reference: s.to_string(),
            why: format!("{what} is empty: write {what} after the colon"),
        };
        if let Some(rest) = s.strip_prefix("oci:") {
            if rest.is_empty() {
                return Err(empty("oci:DIR"));
            }
            if Path::new(rest).is_dir() {
                return Ok(Some(ImageSource::OciLayout {
                    dir: rest.into(),
                    tag: None,
                }));
            }
            if let Some((dir, tag)) = rest.rsplit_once(':') {
                if !dir.is_empty() && is_tag(tag) {
                    return Ok(Some(ImageSource::OciLayout {
                        dir: dir.into(),
                        tag: Some(tag.to_string()),
                    }));
                }
            }
            return Ok(Some(ImageSource::OciLayout {
                dir: rest.into(),
                tag: None,
            }));
        }
        if let Some(rest) = s.strip_prefix("docker-archive:") {
            if rest.is_empty() {
                return Err(empty("docker-archive:FILE"));
            }
            return Ok(Some(ImageSource::DockerArchive { file: rest.into() }));
        }
        Ok(None)
    }
}

/// An OCI tag: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
pub(crate) fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// What an import needs from a source: the manifest it picked, and its
/// blobs by digest.
pub(crate) trait Blobs {
    /// The manifest's bytes, its digest and the name the source gives it.
    fn manifest(&self) -> Result<(Vec<u8>, String, Option<String>), Error>;
    /// A blob's bytes, or None if the source does not have it.
    fn open(&self, digest: &str) -> Result<Option<Box<dyn std::io::Read + '_>>, Error>;
    fn describe(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sources() {
        let oci = |d: &str, t: Option<&str>| {
            Some(ImageSource::OciLayout {
                dir: d.into(),
                tag: t.map(String::from),
            })
        };
        assert_eq!(
            ImageSource::parse("oci:/no/such:v1").unwrap(),
            oci("/no/such", Some("v1"))
        );
        assert_eq!(
            ImageSource::parse("oci:/no/such").unwrap(),
            oci("/no/such", None)
        );
        assert_eq!(
            ImageSource::parse("docker-archive:x.tar").unwrap(),
            Some(ImageSource::DockerArchive {
                file: "x.tar".into()
            })
        );
        assert_eq!(ImageSource::parse("alpine:3.20").unwrap(), None);
        assert!(ImageSource::parse("oci:").is_err());
    }
}
