//! A `docker save` / `podman save` archive: a tar holding manifest.json,
//! the config and the layers (plain layer.tar files in the classic format,
//! blobs/sha256/HEX in Docker 25's). The archive has no manifest blob of
//! its own, so one is written here (an OCI manifest, serialized with sorted
//! keys, so the same archive always gives the same manifest digest).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Blobs;
use crate::digest::sha256_hex;
use crate::error::{short, show};
use crate::manifest::{MAX_JSON, OCI_CONFIG, OCI_LAYER_TAR, OCI_MANIFEST};
use crate::Error;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

enum Member {
    File { offset: u64, size: u64 },
    Link(String),
}

pub(crate) struct DockerArchive {
    file: PathBuf,
    manifest: Vec<u8>,
    name: Option<String>,
    /// Blob digest to (offset, size) in the archive.
    blobs: HashMap<String, (u64, u64)>,
}

fn bad(file: &Path, why: impl Into<String>) -> Error {
    Error::BadSource {
        source_desc: format!("docker-archive:{}", file.display()),
        why: why.into(),
    }
}

/// The 64-hex digest a member's path carries (blobs/sha256/HEX or
/// HEX.json), if any.
fn hex_in(path: &str) -> Option<&str> {
    let last = path.rsplit('/').next()?;
    let stem = last.strip_suffix(".json").unwrap_or(last);
    (stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit())).then_some(stem)
}

pub(crate) fn open(file: &Path) -> Result<DockerArchive, Error> {
    let io = |e| Error::io(format!("reading {}", file.display()), None, e);
    let mut f = File::open(file).map_err(io)?;
    let mut magic = [0u8; 2];
    if f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b] {
        return Err(bad(file, "is compressed: decompress it first (gunzip)"));
    }
    f.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut members = HashMap::new();
    let mut archive = tar::Archive::new(&f);
    let not_tar = |e: std::io::Error| bad(file, format!("not a tar archive: {e}"));
    for e in archive.entries_with_seek().map_err(not_tar)? {
        let e = e.map_err(not_tar)?;
        let name = String::from_utf8_lossy(&e.path_bytes())
            .trim_start_matches("./")
            .to_string();
        let m = match e.header().entry_type() {
            tar::EntryType::Symlink => {
                let target = e
                    .link_name_bytes()
                    .map(|l| String::from_utf8_lossy(&l).into_owned());
                Member::Link(target.unwrap_or_default())
            }
            _ => Member::File {
                offset: e.raw_file_position(),
                size: e.size(),
            },
        };
        members.insert(name, m);
    }
    let member = |path: &str| -> Result<(u64, u64), Error> {
        let mut path = path.trim_start_matches("./").to_string();
        for _ in 0..8 {
            match members.get(&path) {
                Some(Member::File { offset, size }) => return Ok((*offset, *size)),
                // Docker 25 links <id>/layer.tar to ../blobs/sha256/HEX.
                Some(Member::Link(t)) => {
                    let base = path.rsplit_once('/').map_or("", |x| x.0);
                    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
                    for p in t.split('/') {
                        match p {
                            ".." => {
                                parts.pop();
                            }
                            "." | "" => {}
                            p => parts.push(p),
                        }
                    }
                    path = parts.join("/");
                }
                None => break,
            }
        }
        Err(bad(
            file,
            format!(
                "has no member '{}' that manifest.json lists",
                show(path.as_bytes())
            ),
        ))
    };
    let read = |path: &str| -> Result<Vec<u8>, Error> {
        let (offset, size) = member(path)?;
        if size > MAX_JSON {
            return Err(bad(
                file,
                format!("'{}' is over 4 MiB", show(path.as_bytes())),
            ));
        }
        let mut buf = vec![0u8; size as usize];
        (&f).seek(SeekFrom::Start(offset)).map_err(io)?;
        (&f).read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    };
    let list: Vec<Entry> = serde_json::from_slice(&read("manifest.json")?).map_err(|e| {
        bad(
            file,
            format!("manifest.json is not a docker save manifest: {e}"),
        )
    })?;
    let entry = match list.as_slice() {
        [one] => one,
        [] => return Err(bad(file, "holds no image")),
        more => {
            return Err(bad(
                file,
                format!("holds {} images: save one image per archive", more.len()),
            ))
        }
    };
    let config = read(&entry.config)?;
    let config_hex = sha256_hex(&config);
    if let Some(h) = hex_in(&entry.config).filter(|h| *h != config_hex) {
        let d = format!("sha256:{h}");
        return Err(Error::DigestMismatch {
            what: format!("config {}", short(&d)),
            digest: short(&d),
        });
    }
    let diff_ids: Vec<String> = serde_json::from_slice::<serde_json::Value>(&config)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("rootfs")?.get("diff_ids")?.clone()).ok())
        .unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(bad(
            file,
            "the config's diff_ids do not match the layers listed",
        ));
    }
    let mut blobs = HashMap::new();
    let config_digest = format!("sha256:{config_hex}");
    blobs.insert(config_digest.clone(), member(&entry.config)?);
    let mut layers = Vec::new();
    for (path, diff_id) in entry.layers.iter().zip(&diff_ids) {
        let (offset, size) = member(path)?;
        let mut head = [0u8; 4];
        (&f).seek(SeekFrom::Start(offset)).map_err(io)?;
        let got = (&f).take(4).read(&mut head).map_err(io)?;
        let (media_type, digest) = match &head[..got] {
            [0x1f, 0x8b, ..] | [0x28, 0xb5, 0x2f, 0xfd] => {
                // A compressed layer's digest is not its diff_id: only a
                // blobs/sha256/HEX path says what it must hash to.
                let h = hex_in(path).ok_or_else(|| {
                    bad(
                        file,
                        format!(
                            "compressed layer '{}' has no digest in its name",
                            show(path.as_bytes())
                        ),
                    )
                })?;
                let mt = if head[0] == 0x1f { "+gzip" } else { "+zstd" };
                (format!("{OCI_LAYER_TAR}{mt}"), format!("sha256:{h}"))
            }
            _ => (OCI_LAYER_TAR.to_string(), diff_id.clone()),
        };
        crate::digest::hex_of(&digest)?;
        blobs.insert(digest.clone(), (offset, size));
        layers.push(serde_json::json!({"mediaType": media_type, "digest": digest, "size": size}));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": layers,
    });
    let manifest = serde_json::to_vec(&manifest).expect("manifest serializes");
    let name = entry.repo_tags.as_ref().and_then(|t| t.first().cloned());
    Ok(DockerArchive {
        file: file.to_path_buf(),
        manifest,
        name,
        blobs,
    })
}

impl Blobs for DockerArchive {
    fn manifest(&self) -> Result<(Vec<u8>, String, Option<String>), Error> {
        let digest = format!("sha256:{}", sha256_hex(&self.manifest));
        Ok((self.manifest.clone(), digest, self.name.clone()))
    }

    fn open(&self, digest: &str) -> Result<Option<Box<dyn Read + '_>>, Error> {
        let Some(&(offset, size)) = self.blobs.get(digest) else {
            return Ok(None);
        };
        let io = |e| Error::io(format!("reading {}", self.file.display()), None, e);
        let mut f = File::open(&self.file).map_err(io)?;
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        Ok(Some(Box::new(f.take(size))))
    }

    fn describe(&self) -> String {
        format!("docker-archive:{}", self.file.display())
    }
}
