//! Reading manifests, indexes and configs (OCI and Docker v2 schema2),
//! and the checks on them: media types, platform, digests.

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};

use crate::error::short;
use crate::{Error, ImageConfig, LayerInfo};

pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub(crate) const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// Layer media types mvm reads (compression is told by content, so the
/// non-distributable and Docker spellings read like the OCI ones).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// Manifests and configs are small; anything bigger is not one.
pub(crate) const MAX_JSON: u64 = 4 << 20;

pub(crate) fn is_index(media_type: &str, bytes: &[u8]) -> bool {
    if media_type == OCI_INDEX || media_type == DOCKER_LIST {
        return true;
    }
    // An index need not say its media type: it has "manifests".
    media_type.is_empty()
        && serde_json::from_slice::<serde_json::Value>(bytes)
            .is_ok_and(|v| v.get("manifests").is_some())
}

fn bad(digest: &str, why: impl Into<String>) -> Error {
    Error::BadImage {
        digest: short(digest),
        why: why.into().replace('\n', " "),
    }
}

pub(crate) fn parse_index(bytes: &[u8], digest: &str) -> Result<ImageIndex, Error> {
    serde_json::from_slice(bytes).map_err(|e| bad(digest, format!("not an image index: {e}")))
}

pub(crate) struct Manifest {
    pub config: LayerInfo,
    pub layers: Vec<LayerInfo>,
}

fn info(d: &Descriptor) -> LayerInfo {
    LayerInfo {
        digest: d.digest().to_string(),
        media_type: d.media_type().to_string(),
        size: d.size(),
    }
}

/// A manifest's config and layers, with their media types checked.
pub(crate) fn parse_manifest(bytes: &[u8], digest: &str) -> Result<Manifest, Error> {
    let m: ImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| bad(digest, format!("not an image manifest: {e}")))?;
    if let Some(mt) = m.media_type() {
        let mt = mt.to_string();
        if mt != OCI_MANIFEST && mt != DOCKER_MANIFEST {
            return Err(Error::MediaType {
                what: "manifest".into(),
                media_type: mt,
            });
        }
    }
    let config = info(m.config());
    if config.media_type != OCI_CONFIG && config.media_type != DOCKER_CONFIG {
        return Err(Error::MediaType {
            what: "config".into(),
            media_type: config.media_type,
        });
    }
    crate::digest::hex_of(&config.digest)?;
    let layers: Vec<LayerInfo> = m.layers().iter().map(info).collect();
    for l in &layers {
        crate::digest::hex_of(&l.digest)?;
        if !LAYER_TYPES.contains(&l.media_type.as_str()) {
            return Err(Error::MediaType {
                what: "layer".into(),
                media_type: l.media_type.clone(),
            });
        }
    }
    Ok(Manifest { config, layers })
}

pub(crate) struct Config {
    pub config: ImageConfig,
    pub created: Option<String>,
    pub diff_ids: Vec<String>,
}

/// A config, refused unless it is linux/amd64.
pub(crate) fn parse_config(bytes: &[u8], digest: &str) -> Result<Config, Error> {
    let c: ImageConfiguration = serde_json::from_slice(bytes)
        .map_err(|e| bad(digest, format!("not an image config: {e}")))?;
    let platform = format!("{}/{}", c.os(), c.architecture());
    if platform != "linux/amd64" {
        return Err(Error::Platform { platform });
    }
    let run = c.config().as_ref();
    let list = |v: Option<&Vec<String>>| v.cloned().unwrap_or_default();
    let config = ImageConfig {
        env: list(run.and_then(|r| r.env().as_ref())),
        working_dir: run
            .and_then(|r| r.working_dir().clone())
            .filter(|w| !w.is_empty()),
        entrypoint: list(run.and_then(|r| r.entrypoint().as_ref())),
        cmd: list(run.and_then(|r| r.cmd().as_ref())),
        user: run.and_then(|r| r.user().clone()).filter(|u| !u.is_empty()),
    };
    Ok(Config {
        config,
        created: c.created().clone(),
        diff_ids: c.rootfs().diff_ids().clone(),
    })
}

/// The linux/amd64 entry of an index, or the one error line that says
/// which platforms it has instead.
pub(crate) fn pick_amd64<'a>(
    manifests: &'a [Descriptor],
    what: &str,
) -> Result<&'a Descriptor, Error> {
    let mut seen = Vec::new();
    for d in manifests {
        match d.platform() {
            Some(p) => {
                let name = format!("{}/{}", p.os(), p.architecture());
                if name == "linux/amd64" {
                    return Ok(d);
                }
                seen.push(name);
            }
            // Attestations and other unlabelled entries are not images.
            None => continue,
        }
    }
    match seen.len() {
        0 => Err(Error::BadSource {
            source_desc: what.to_string(),
            why: "the index lists no linux/amd64 image".into(),
        }),
        1 => Err(Error::Platform {
            platform: seen.remove(0),
        }),
        _ => Err(Error::Platform {
            platform: format!("for {} only", seen.join(", ")),
        }),
    }
}
