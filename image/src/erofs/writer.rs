//! Writes an EROFS image from a planned tree: file data as the second pass
//! streams it in (`file_data`), then metadata, directories and the
//! superblock (`finish`). All writes are positional, so regions never
//! written (the padding between records) stay holes in the output file.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use super::dir::{self, Entry};
use super::format::*;
use super::plan::{dir_names, Placed, Plan, META_BLKADDR};
use super::xattr;
use crate::flatten::tree::{Id, Kind, Tree, ROOT};

pub(crate) struct Writer<'a> {
    file: &'a File,
    tree: &'a Tree,
    plan: Plan,
    /// The next free data block.
    next: u64,
    chunked: bool,
    buf: Vec<u8>,
    zeros: Vec<u8>,
}

/// What the finished image holds.
pub(crate) struct Written {
    pub entries: u64,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(file: &'a File, tree: &'a Tree, plan: Plan) -> Writer<'a> {
        let next = plan.data_start;
        Writer {
            file,
            tree,
            plan,
            next,
            chunked: false,
            buf: Vec::new(),
            zeros: Vec::new(),
        }
    }

    /// Copies a regular file's data from `r` (exactly its size): inline
    /// tails go after their inode, larger files chunk by chunk into the
    /// data area, where an all-zero chunk becomes a hole (NULL_ADDR) and
    /// takes no block.
    pub(crate) fn file_data(&mut self, id: Id, r: &mut dyn Read) -> io::Result<()> {
        let Some(p) = self.plan.of(id) else {
            return Ok(());
        };
        let pos = self.plan.inode_pos(p) + INODE_SIZE + p.xattr_size as u64;
        let (size, layout, chunkbits) = (p.size, p.layout, p.chunkbits);
        let nchunks = Plan::chunk_count(p);
        match layout {
            DataLayout::FlatInline => {
                self.buf.resize(size as usize, 0);
                r.read_exact(&mut self.buf)?;
                self.file.write_all_at(&self.buf, pos)
            }
            DataLayout::ChunkBased => {
                self.chunked = true;
                let chunk = BLOCK << chunkbits;
                self.buf.resize(chunk as usize, 0);
                if self.zeros.len() < chunk as usize {
                    self.zeros.resize(chunk as usize, 0);
                }
                let mut map = Vec::with_capacity(4 * nchunks as usize);
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk) as usize;
                    r.read_exact(&mut self.buf[..n])?;
                    left -= n as u64;
                    // Slice equality on bytes is a memcmp: fast even
                    // in unoptimized builds.
                    let addr = if self.buf[..n] == self.zeros[..n] {
                        NULL_ADDR
                    } else {
                        let addr = u32::try_from(self.next)
                            .ok()
                            .filter(|a| *a != NULL_ADDR)
                            .ok_or_else(|| io::Error::other("image over 16 TiB"))?;
                        self.file.write_all_at(&self.buf[..n], self.next * BLOCK)?;
                        self.next += (n as u64).div_ceil(BLOCK);
                        addr
                    };
                    map.extend_from_slice(&addr.to_le_bytes());
                }
                self.file.write_all_at(&map, pos)
            }
            DataLayout::FlatPlain => Ok(()),
        }
    }

    /// Writes inodes, xattrs, directories, symlinks and the superblock;
    /// sizes the file to whole blocks.
    pub(crate) fn finish(self, uuid: [u8; 16]) -> io::Result<Written> {
        let mut out = Coalesced::new(self.file);
        let mut head = Vec::with_capacity(BLOCK as usize);
        for (i, &id) in self.plan.order.iter().enumerate() {
            let p = &self.plan.placed[i];
            let inode = &self.tree.inodes[id as usize];
            head.clear();
            let (mode, i_u) = match &inode.kind {
                Kind::Dir(_) => (S_IFDIR, p.blkaddr),
                Kind::Symlink(_) => (S_IFLNK, p.blkaddr),
                Kind::File { .. } if p.layout == DataLayout::ChunkBased => {
                    (S_IFREG, p.chunkbits as u32)
                }
                Kind::File { .. } => (S_IFREG, NULL_ADDR),
                Kind::Char { major, minor } => (S_IFCHR, encode_dev(*major, *minor)),
                Kind::Block { major, minor } => (S_IFBLK, encode_dev(*major, *minor)),
                Kind::Fifo => (S_IFIFO, 0),
            };
            let h = InodeHead {
                layout: p.layout,
                xattr_icount: xattr::icount(p.xattr_size as u64),
                mode: mode | (inode.meta.perm & 0o7777),
                size: p.size,
                i_u,
                ino: (i + 1) as u32,
                uid: inode.meta.uid,
                gid: inode.meta.gid,
                mtime: inode.meta.mtime,
                mtime_nsec: inode.meta.mtime_nsec,
                nlink: p.nlink,
            };
            head.extend_from_slice(&h.encode());
            xattr::encode(&mut head, &inode.meta.xattrs);
            let data: Option<Vec<u8>> = match &inode.kind {
                Kind::Dir(_) => Some(self.dir_bytes(id, p)),
                Kind::Symlink(target) => Some(target.to_vec()),
                _ => None,
            };
            if let Some(data) = data {
                let whole = data.len() - p.tail as usize;
                if whole > 0 {
                    out.write(&data[..whole], p.blkaddr as u64 * BLOCK)?;
                }
                head.extend_from_slice(&data[whole..]);
            }
            out.write(&head, self.plan.inode_pos(p))?;
        }
        let sb = SuperBlock {
            root_nid: self.plan.placed[0].nid as u16,
            inos: self.plan.order.len() as u64,
            build_time: 0,
            blocks: u32::try_from(self.next).map_err(|_| io::Error::other("image over 16 TiB"))?,
            meta_blkaddr: META_BLKADDR as u32,
            feature_incompat: if self.chunked {
                INCOMPAT_CHUNKED_FILE
            } else {
                0
            },
            uuid,
        };
        out.write(&sb.encode(), SUPER_OFFSET)?;
        out.flush()?;
        self.file.set_len(self.next * BLOCK)?;
        Ok(Written {
            entries: self.plan.order.len() as u64,
        })
    }

    fn dir_bytes(&self, id: Id, p: &Placed) -> Vec<u8> {
        let names = dir_names(self.tree, id);
        let entries: Vec<Entry> = names
            .iter()
            .map(|&(name, child)| {
                let target = match name {
                    b"." => id,
                    b".." if id == ROOT => ROOT,
                    b".." => p.parent,
                    _ => child,
                };
                let tp = self.plan.of(target).expect("children are reachable");
                Entry {
                    name,
                    nid: tp.nid,
                    file_type: file_type(&self.tree.inodes[target as usize].kind),
                }
            })
            .collect();
        dir::encode(&entries)
    }
}

fn file_type(kind: &Kind) -> u8 {
    match kind {
        Kind::Dir(_) => FT_DIR,
        Kind::File { .. } => FT_REG,
        Kind::Symlink(_) => FT_SYMLINK,
        Kind::Char { .. } => FT_CHR,
        Kind::Block { .. } => FT_BLK,
        Kind::Fifo => FT_FIFO,
    }
}

/// Joins adjacent positional writes into one (a million small inodes
/// would otherwise be a million system calls).
struct Coalesced<'a> {
    file: &'a File,
    start: u64,
    buf: Vec<u8>,
}

impl<'a> Coalesced<'a> {
    fn new(file: &'a File) -> Self {
        Coalesced {
            file,
            start: 0,
            buf: Vec::new(),
        }
    }

    fn write(&mut self, bytes: &[u8], pos: u64) -> io::Result<()> {
        if pos != self.start + self.buf.len() as u64 || self.buf.len() > (1 << 20) {
            self.flush()?;
            self.start = pos;
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.start)?;
            self.buf.clear();
        }
        Ok(())
    }
}
