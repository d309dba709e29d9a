//! Pass one: every layer's entries applied in order to the in-memory tree
//! with OCI layer semantics (whiteouts, opaque directories, replacement),
//! reading headers only; file data is skipped and copied in pass two.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tar::EntryType;

use super::entry;
use super::paths::components;
use super::stream;
use super::tree::{Inode, Kind, Tree, ROOT};
use crate::error::{short, show};
use crate::{Error, Limits, Progress};

pub(crate) struct Layer {
    pub path: PathBuf,
    pub digest: String,
}

/// Longest path and symlink target accepted (Linux's PATH_MAX less the
/// terminating NUL) and longest name (NAME_MAX, EROFS_NAME_LEN).
const PATH_MAX: usize = 4095;
const NAME_MAX: usize = 255;

pub(crate) fn layer_error(layer: &Layer, i: usize, n: usize, why: String) -> Error {
    Error::BadLayer {
        layer: format!("{} ({} of {n})", short(&layer.digest), i + 1),
        why,
    }
}

/// A tar or decompression error, or the layer-size limit if that is what
/// stopped the stream.
pub(crate) fn stream_error(
    layer: &Layer,
    i: usize,
    n: usize,
    hit: bool,
    limits: &Limits,
    e: std::io::Error,
) -> Error {
    if hit {
        Error::Limit {
            what: format!(
                "layer {} unpacks to more bytes than allowed",
                short(&layer.digest)
            ),
            limit: limits.max_layer_bytes,
            field: "max_layer_bytes",
        }
    } else {
        let why = format!("not a valid tar stream (truncated or damaged?): {e}");
        layer_error(layer, i, n, why.replace('\n', " "))
    }
}

pub(crate) fn flatten(
    layers: &[Layer],
    limits: &Limits,
    progress: &mut dyn Progress,
) -> Result<Tree, Error> {
    if layers.len() > limits.max_layers || layers.len() > u16::MAX as usize {
        return Err(Error::Limit {
            what: format!("{} layers", layers.len()),
            limit: limits.max_layers as u64,
            field: "max_layers",
        });
    }
    let mut tree = Tree::new();
    let mut entries: u64 = 0;
    let n = layers.len();
    for (i, layer) in layers.iter().enumerate() {
        let io = |e| Error::io(format!("reading layer {}", short(&layer.digest)), None, e);
        let (stream, hit) = stream::open(&layer.path, limits.max_layer_bytes).map_err(io)?;
        let mut archive = tar::Archive::new(stream);
        let bad = |e| stream_error(layer, i, n, hit.get(), limits, e);
        for (ordinal, e) in archive.entries().map_err(bad)?.enumerate() {
            let mut e = e.map_err(bad)?;
            entries += 1;
            if entries > limits.max_entries {
                return Err(Error::Limit {
                    what: format!("more than {} entries in the layers", limits.max_entries),
                    limit: limits.max_entries,
                    field: "max_entries",
                });
            }
            if entries.is_multiple_of(4096) {
                progress.update(&format!("reading layer {} of {n}", i + 1), entries, None);
            }
            let path = e.path_bytes().into_owned();
            let link = e.link_name_bytes().map(|l| l.into_owned());
            let h = entry::read(&mut e).map_err(|why| {
                layer_error(layer, i, n, format!("entry '{}': {why}", show(&path)))
            })?;
            let place = Place {
                tree: &mut tree,
                layer: i as u16,
                ordinal: ordinal as u64,
            };
            place
                .apply(&path, link.as_deref(), h, limits)
                .map_err(|why| {
                    layer_error(layer, i, n, format!("entry '{}': {why}", show(&path)))
                })?;
        }
        // Read to the end: a truncated or damaged stream fails here
        // rather than passing as a shorter layer.
        std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(bad)?;
    }
    Ok(tree)
}

struct Place<'a> {
    tree: &'a mut Tree,
    layer: u16,
    ordinal: u64,
}

impl Place<'_> {
    fn apply(
        self,
        path: &[u8],
        link: Option<&[u8]>,
        h: entry::Header,
        limits: &Limits,
    ) -> Result<(), String> {
        if path.len() > PATH_MAX {
            return Err(format!(
                "a path of {} bytes (the most is {PATH_MAX})",
                path.len()
            ));
        }
        let comps = components(path)
            .ok_or("the path climbs out of the image with '..' (a hostile layer)")?;
        if let Some(long) = comps.iter().find(|c| c.len() > NAME_MAX) {
            return Err(format!(
                "a name of {} bytes (the most is {NAME_MAX})",
                long.len()
            ));
        }
        let Some((name, parents)) = comps.split_last() else {
            // The root itself: only its metadata can change.
            if h.entry_type == EntryType::Directory {
                self.tree.inodes[ROOT as usize].meta = h.meta;
                return Ok(());
            }
            return Err("a non-directory at the image root".into());
        };
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            let dir = self
                .tree
                .lookup(parents)
                .filter(|d| self.tree.inodes[*d as usize].is_dir());
            if let Some(dir) = dir {
                if hidden == b".wh..opq" {
                    self.tree.make_opaque(dir, self.layer);
                } else if !hidden.starts_with(b".wh.") {
                    self.tree.remove(dir, hidden);
                }
            }
            // Other .wh..wh.* names are aufs bookkeeping: never content.
            return Ok(());
        }
        let kind = match h.entry_type {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                if h.size > limits.max_file_bytes {
                    return Err(format!(
                        "a file of {} bytes is over Limits::max_file_bytes ({})",
                        h.size, limits.max_file_bytes
                    ));
                }
                Kind::File {
                    size: h.size,
                    layer: self.layer,
                    ordinal: self.ordinal,
                }
            }
            EntryType::Directory => Kind::Dir(BTreeMap::new()),
            EntryType::Symlink => {
                let target = link
                    .filter(|l| !l.is_empty())
                    .ok_or("a symlink without a target")?;
                if target.len() > PATH_MAX {
                    return Err("a symlink target longer than PATH_MAX".into());
                }
                Kind::Symlink(target.into())
            }
            EntryType::Link => {
                let target = link.ok_or("a hard link without a target")?;
                let tcomps = components(target).ok_or(
                    "a hard link that points out of the image with '..' (a hostile layer)",
                )?;
                let id = self
                    .tree
                    .lookup(&tcomps)
                    .filter(|id| !self.tree.inodes[*id as usize].is_dir())
                    .ok_or_else(|| {
                        format!(
                            "a hard link to '{}', which is not a file in the image",
                            show(target)
                        )
                    })?;
                let dir = self.tree.make_dirs(parents, self.layer);
                self.tree.place(dir, name, id);
                return Ok(());
            }
            EntryType::Char => Kind::Char {
                major: h.major,
                minor: h.minor,
            },
            EntryType::Block => Kind::Block {
                major: h.major,
                minor: h.minor,
            },
            EntryType::Fifo => Kind::Fifo,
            // A global PAX header sets defaults no image relies on.
            EntryType::XGlobalHeader => return Ok(()),
            t => {
                return Err(format!(
                    "unsupported tar entry type {:?}",
                    t.as_byte() as char
                ))
            }
        };
        let dir = self.tree.make_dirs(parents, self.layer);
        let id = self.tree.push(Inode {
            kind,
            meta: h.meta,
            layer: self.layer,
        });
        self.tree.place(dir, name, id);
        Ok(())
    }
}
