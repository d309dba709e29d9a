//! Layers to an EROFS image in two passes over the layer streams: pass one
//! builds the tree from headers, pass two copies the data of the regular
//! files that survived into the planned image. File contents never sit in
//! memory beyond one chunk.

use std::fs::File;

use crate::erofs::plan::plan;
use crate::erofs::writer::{Writer, Written};
use crate::error::short;
use crate::flatten::apply::{flatten, layer_error, stream_error, Layer};
use crate::flatten::stream;
use crate::flatten::tree::{Id, Kind};
use crate::{Error, Limits, Progress};

pub(crate) fn convert(
    layers: &[Layer],
    out: &File,
    uuid: [u8; 16],
    limits: &Limits,
    progress: &mut dyn Progress,
) -> Result<Written, Error> {
    let tree = flatten(layers, limits, progress)?;
    let plan = plan(&tree)?;
    // Which entry of which layer feeds which surviving file, and the total.
    let mut wanted: Vec<Vec<(u64, Id, u64)>> = vec![Vec::new(); layers.len()];
    let mut total: u64 = 0;
    for &id in &plan.order {
        if let Kind::File {
            size,
            layer,
            ordinal,
        } = tree.inodes[id as usize].kind
        {
            total = total.saturating_add(size);
            if size > 0 {
                wanted[layer as usize].push((ordinal, id, size));
            }
        }
    }
    if total > limits.max_total_bytes {
        return Err(Error::Limit {
            what: format!("the files of the root add up to {total} bytes"),
            limit: limits.max_total_bytes,
            field: "max_total_bytes",
        });
    }
    for w in &mut wanted {
        w.sort_unstable();
    }
    let mut writer = Writer::new(out, &tree, plan);
    let n = layers.len();
    let mut done: u64 = 0;
    for (i, layer) in layers.iter().enumerate() {
        if wanted[i].is_empty() {
            continue;
        }
        let io = |e| Error::io(format!("reading layer {}", short(&layer.digest)), None, e);
        let (s, hit) = stream::open(&layer.path, limits.max_layer_bytes).map_err(io)?;
        let mut archive = tar::Archive::new(s);
        let bad = |e| stream_error(layer, i, n, hit.get(), limits, e);
        let mut next = wanted[i].iter().peekable();
        for (ordinal, e) in archive.entries().map_err(bad)?.enumerate() {
            let Some(&&(want, id, size)) = next.peek() else {
                break;
            };
            let mut e = e.map_err(bad)?;
            if ordinal as u64 != want {
                continue;
            }
            next.next();
            if e.size() != size {
                let why = "the layer changed between the two passes".to_string();
                return Err(layer_error(layer, i, n, why));
            }
            writer.file_data(id, &mut e).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof || hit.get() {
                    stream_error(layer, i, n, hit.get(), limits, e)
                } else {
                    Error::io("writing the root filesystem image", None, e)
                }
            })?;
            done += size;
            progress.update("writing the root filesystem", done, Some(total));
        }
        if next.peek().is_some() {
            let why = "the layer ended early in the second pass".to_string();
            return Err(layer_error(layer, i, n, why));
        }
    }
    writer
        .finish(uuid)
        .map_err(|e| Error::io("writing the root filesystem image", None, e))
}
