//! An uncompressed EROFS writer (the on-disk format of the Linux kernel's
//! fs/erofs/erofs_fs.h): 4 KiB blocks, extended inodes, inline xattrs,
//! inline tails, chunk-based regular files with holes.

pub(crate) mod dir;
pub(crate) mod format;
pub(crate) mod plan;
pub(crate) mod writer;
pub(crate) mod xattr;
