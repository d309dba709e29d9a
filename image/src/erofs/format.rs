//! EROFS on-disk structures, as the Linux kernel's fs/erofs/erofs_fs.h
//! defines them: little-endian, packed, encoded by hand into byte arrays
//! so that the layout is explicit and nothing depends on struct padding.

pub(crate) const BLOCK: u64 = 4096;
pub(crate) const BLOCK_BITS: u8 = 12;
pub(crate) const SUPER_OFFSET: u64 = 1024;
pub(crate) const MAGIC: u32 = 0xE0F5_E1E2;
pub(crate) const INCOMPAT_CHUNKED_FILE: u32 = 0x4;

/// Extended (64-byte) inodes only: 32-bit uids and gids, 64-bit sizes
/// and a time of their own, so no field has to be squeezed.
pub(crate) const INODE_SIZE: u64 = 64;
const LAYOUT_EXTENDED: u16 = 1;

/// Inodes sit on 32-byte slots; a nid counts slots from the metadata start.
pub(crate) const SLOT: u64 = 32;

pub(crate) const DIRENT_SIZE: u64 = 12;
pub(crate) const XATTR_HEADER: u64 = 12;
pub(crate) const NULL_ADDR: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DataLayout {
    /// Contiguous blocks at raw_blkaddr.
    FlatPlain = 0,
    /// Whole blocks at raw_blkaddr, the last partial block right after the
    /// inode and its xattrs.
    FlatInline = 2,
    /// A table of chunk addresses after the inode; NULL_ADDR is a hole.
    ChunkBased = 4,
}

pub(crate) const S_IFREG: u16 = 0o100000;
pub(crate) const S_IFDIR: u16 = 0o040000;
pub(crate) const S_IFLNK: u16 = 0o120000;
pub(crate) const S_IFCHR: u16 = 0o020000;
pub(crate) const S_IFBLK: u16 = 0o060000;
pub(crate) const S_IFIFO: u16 = 0o010000;

/// Directory entry file types (the kernel's FT_*).
pub(crate) const FT_REG: u8 = 1;
pub(crate) const FT_DIR: u8 = 2;
pub(crate) const FT_CHR: u8 = 3;
pub(crate) const FT_BLK: u8 = 4;
pub(crate) const FT_FIFO: u8 = 5;
pub(crate) const FT_SYMLINK: u8 = 7;

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) struct SuperBlock {
    pub root_nid: u16,
    pub inos: u64,
    pub build_time: u64,
    pub blocks: u32,
    pub meta_blkaddr: u32,
    pub feature_incompat: u32,
    pub uuid: [u8; 16],
}

impl SuperBlock {
    /// The 128-byte superblock (no checksum feature: feature_compat 0).
    pub(crate) fn encode(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        put32(&mut b, 0, MAGIC);
        // 4: checksum, 8: feature_compat: both 0.
        b[12] = BLOCK_BITS;
        // 13: sb_extslots 0.
        put16(&mut b, 14, self.root_nid);
        put64(&mut b, 16, self.inos);
        put64(&mut b, 24, self.build_time);
        // 32: build_time_nsec 0.
        put32(&mut b, 36, self.blocks);
        put32(&mut b, 40, self.meta_blkaddr);
        // 44: xattr_blkaddr 0: no shared xattrs.
        b[48..64].copy_from_slice(&self.uuid);
        // 64..80: volume_name empty.
        put32(&mut b, 80, self.feature_incompat);
        // 84..: no compression, devices, long xattr prefixes or packed
        // inode; dirblkbits 0 (directory blocks are fs blocks).
        b
    }
}

pub(crate) struct InodeHead {
    pub layout: DataLayout,
    pub xattr_icount: u16,
    pub mode: u16,
    pub size: u64,
    /// raw_blkaddr, rdev or the chunk format, by layout and type.
    pub i_u: u32,
    pub ino: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
    pub mtime_nsec: u32,
    pub nlink: u32,
}

impl InodeHead {
    pub(crate) fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        put16(&mut b, 0, LAYOUT_EXTENDED | ((self.layout as u16) << 1));
        put16(&mut b, 2, self.xattr_icount);
        put16(&mut b, 4, self.mode);
        put64(&mut b, 8, self.size);
        put32(&mut b, 16, self.i_u);
        put32(&mut b, 20, self.ino);
        put32(&mut b, 24, self.uid);
        put32(&mut b, 28, self.gid);
        put64(&mut b, 32, self.mtime);
        put32(&mut b, 40, self.mtime_nsec);
        put32(&mut b, 44, self.nlink);
        b
    }
}

/// The kernel's new_encode_dev: 12 bits of major, 20 of minor, in the
/// order old 16-bit numbers keep their meaning.
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

pub(crate) fn dirent(out: &mut Vec<u8>, nid: u64, nameoff: u16, file_type: u8) {
    out.extend_from_slice(&nid.to_le_bytes());
    out.extend_from_slice(&nameoff.to_le_bytes());
    out.push(file_type);
    out.push(0);
}
