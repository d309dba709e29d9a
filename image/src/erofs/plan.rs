//! Where everything goes, decided before any file data is read: each
//! reachable inode's nid and data layout, and the data blocks of
//! directories and long symlinks. Only regular files' block addresses are
//! left open: they are handed out as the data streams in, so that all-zero
//! chunks take no blocks.
//!
//! Image layout: block 0 holds the superblock (at byte 1024); the metadata
//! area starts at block 1 (meta_blkaddr) with the root inode at nid 0 (the
//! superblock's root_nid is 16 bits, so the root goes first); directory and
//! symlink blocks follow the metadata, then file data in stream order.

use super::dir;
use super::format::*;
use super::xattr;
use crate::flatten::tree::{Id, Kind, Tree, ROOT};
use crate::Error;

pub(crate) const META_BLKADDR: u64 = 1;

pub(crate) struct Placed {
    pub nid: u64,
    pub layout: DataLayout,
    pub size: u64,
    pub xattr_size: u32,
    /// Bytes of data inline after the xattrs (FLAT_INLINE).
    pub tail: u32,
    /// First data block of a directory or symlink; NULL_ADDR when it has
    /// none (everything inline, or a regular file, whose map is separate).
    pub blkaddr: u32,
    /// Chunk size of a chunk-based file: BLOCK << chunkbits.
    pub chunkbits: u8,
    pub nlink: u32,
    pub parent: Id,
}

pub(crate) struct Plan {
    pub order: Vec<Id>,
    pub placed: Vec<Placed>,
    /// Inode id to index in `order`; u32::MAX for unreachable inodes.
    pub index: Vec<u32>,
    /// The first block after metadata, directories and symlinks: file data
    /// starts here.
    pub data_start: u64,
}

impl Plan {
    pub(crate) fn of(&self, id: Id) -> Option<&Placed> {
        let i = *self.index.get(id as usize)?;
        self.placed.get(i as usize)
    }

    /// Byte offset of an inode in the image.
    pub(crate) fn inode_pos(&self, p: &Placed) -> u64 {
        META_BLKADDR * BLOCK + p.nid * SLOT
    }

    pub(crate) fn chunk_count(p: &Placed) -> u64 {
        p.size.div_ceil(BLOCK << p.chunkbits)
    }
}

/// Chunks of 4 KiB for files under 1 MiB, 64 KiB above, larger still when
/// a file would need more than 2^18 chunks (1 MiB of chunk table).
fn chunkbits(size: u64) -> u8 {
    let mut bits = if size < (1 << 20) { 0 } else { 4 };
    while size.div_ceil(BLOCK << bits) > (1 << 18) {
        bits += 1;
    }
    bits
}

pub(crate) fn dir_names(tree: &Tree, id: Id) -> Vec<(&[u8], Id)> {
    let mut names: Vec<(&[u8], Id)> = vec![(b".", id), (b"..", id)];
    if let Some(children) = tree.children(id) {
        names.extend(children.iter().map(|(n, c)| (&n[..], *c)));
    }
    names.sort_unstable_by(|a, b| a.0.cmp(b.0));
    names
}

pub(crate) fn plan(tree: &Tree) -> Result<Plan, Error> {
    let (order, nlink) = tree.walk();
    let mut index = vec![u32::MAX; tree.inodes.len()];
    for (i, &id) in order.iter().enumerate() {
        index[id as usize] = i as u32;
    }
    let mut parent = vec![ROOT; tree.inodes.len()];
    let mut placed = Vec::with_capacity(order.len());
    let mut meta: u64 = 0;
    let mut dir_blocks: Vec<(usize, u64)> = Vec::new();
    for &id in &order {
        let inode = &tree.inodes[id as usize];
        if let Some(children) = tree.children(id) {
            for &c in children.values() {
                parent[c as usize] = id;
            }
        }
        let xattr_size = xattr::ibody_size(&inode.meta.xattrs);
        let head = INODE_SIZE + xattr_size;
        let fits = |tail: u64| head + tail <= BLOCK;
        let (size, layout, tail, chunkbits) = match &inode.kind {
            Kind::Dir(_) | Kind::Symlink(_) => {
                let size = match &inode.kind {
                    Kind::Symlink(target) => target.len() as u64,
                    _ => dir::size(dir_names(tree, id).into_iter().map(|n| n.0)),
                };
                let tail = size % BLOCK;
                if tail > 0 && fits(tail) {
                    (size, DataLayout::FlatInline, tail, 0)
                } else {
                    (size, DataLayout::FlatPlain, 0, 0)
                }
            }
            Kind::File { size, .. } if *size > 0 && *size < BLOCK && fits(*size) => {
                (*size, DataLayout::FlatInline, *size, 0)
            }
            Kind::File { size, .. } if *size > 0 => {
                (*size, DataLayout::ChunkBased, 0, chunkbits(*size))
            }
            _ => (0, DataLayout::FlatPlain, 0, 0),
        };
        if !fits(tail) {
            return Err(Error::BadImage {
                digest: String::new(),
                why: format!("an inode's xattrs take {xattr_size} bytes: more than fit in a block"),
            });
        }
        // A record (inode, xattrs, inline tail) never crosses a block: the
        // kernel requires it of inline data, and it keeps inodes whole.
        meta = meta.next_multiple_of(SLOT);
        if meta % BLOCK + head + tail > BLOCK {
            meta = meta.next_multiple_of(BLOCK);
        }
        let nid = meta / SLOT;
        if id == ROOT && nid > u16::MAX as u64 {
            unreachable!("the root is placed first");
        }
        meta += head + tail;
        let mut p = Placed {
            nid,
            layout,
            size,
            xattr_size: xattr_size as u32,
            tail: tail as u32,
            blkaddr: NULL_ADDR,
            chunkbits,
            nlink: nlink[id as usize],
            parent: ROOT,
        };
        if layout == DataLayout::ChunkBased {
            meta += 4 * Plan::chunk_count(&p);
        }
        let whole = (size - tail).div_ceil(BLOCK);
        if matches!(inode.kind, Kind::Dir(_) | Kind::Symlink(_)) && whole > 0 {
            dir_blocks.push((placed.len(), whole));
        }
        p.parent = parent[id as usize];
        placed.push(p);
    }
    let meta_blocks = meta.div_ceil(BLOCK);
    let mut next = META_BLKADDR + meta_blocks;
    for (i, n) in dir_blocks {
        placed[i].blkaddr = u32::try_from(next).map_err(|_| too_big())?;
        next += n;
    }
    Ok(Plan {
        order,
        placed,
        index,
        data_start: next,
    })
}

pub(crate) fn too_big() -> Error {
    Error::Limit {
        what: "the EROFS image would exceed 2^32 blocks (16 TiB)".into(),
        limit: u32::MAX as u64,
        field: "max_total_bytes",
    }
}
