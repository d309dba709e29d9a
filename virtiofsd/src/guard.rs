//! The guard: virtiofsd's passthrough file system, with every request that
//! would change a file the host runs later refused with EROFS
//! (names.rs says which). It stands between the guest's FUSE requests and
//! the host's files, so it holds whatever the guest kernel does.
//!
//! Every inode the guest can name came to it from an entry this file
//! system returned (a lookup, readdirplus's lookups, or what create, mkdir,
//! mknod, symlink and link made), always as a name in a parent directory
//! the guest already had; the share's root is Free. So each inode's class
//! is known from the moment the guest has it, and is kept for the inodes
//! whose class matters (names.rs, `worth_keeping`: guarded and read-only
//! entries, and the directories beneath a `.git`), by the inode number,
//! which virtiofsd never gives to a second file. A request on an inode it
//! has not kept is a request on a Free one.
//!
//! What it refuses: making, removing or renaming a guarded name (or
//! anything in a read-only directory), a hard link to or from one, opening
//! a read-only file for writing or truncation, and changing a read-only or
//! guarded entry's attributes or extended attributes. Reads are untouched.
//! A file the host had already hard-linked to a guarded name under another
//! name is guarded only once the guest has looked up the guarded name
//! (docs/security.md).

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use virtiofsd::filesystem::{
    Context, Entry, Extensions, FileSystem, FsOptions, GetxattrReply, ListxattrReply, OpenOptions,
    SerializableFileSystem, SetattrValid, SetxattrFlags, ZeroCopyReader, ZeroCopyWriter,
};
use virtiofsd::fuse;
use virtiofsd::passthrough::PassthroughFs;

use crate::names::Class;

type Inode = <PassthroughFs as FileSystem>::Inode;
type Handle = <PassthroughFs as FileSystem>::Handle;

fn refused() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}

fn is_dir(entry: &Entry) -> bool {
    entry.attr.mode & libc::S_IFMT == libc::S_IFDIR
}

/// virtiofsd's passthrough file system behind the guard.
pub struct Guard {
    inner: PassthroughFs,
    /// The class of every inode whose class is worth keeping.
    classes: RwLock<HashMap<Inode, Class>>,
}

impl Guard {
    pub fn new(inner: PassthroughFs) -> Guard {
        Guard {
            inner,
            classes: RwLock::new(HashMap::new()),
        }
    }

    fn class(&self, inode: Inode) -> Class {
        let classes = self.classes.read().unwrap_or_else(|e| e.into_inner());
        classes.get(&inode).copied().unwrap_or(Class::Free)
    }

    /// Records what an entry named `name` in `parent` is, and passes it
    /// on. "." and ".." name inodes the guest already has.
    fn note(&self, parent: Inode, name: &CStr, entry: Entry) -> Entry {
        let name = name.to_bytes();
        if entry.inode == 0 || name == b"." || name == b".." {
            return entry;
        }
        let dir = is_dir(&entry);
        let class = self.class(parent).child(name, dir);
        if class.worth_keeping(dir) {
            let mut classes = self.classes.write().unwrap_or_else(|e| e.into_inner());
            let kept = classes.entry(entry.inode).or_insert(class);
            *kept = (*kept).max(class);
        }
        entry
    }

    /// Refuses to make, remove or rename from or to `name` in `parent`.
    fn check_name(&self, parent: Inode, name: &CStr) -> io::Result<()> {
        if self.class(parent).may_change_name(name.to_bytes()) {
            Ok(())
        } else {
            Err(refused())
        }
    }

    /// Refuses to change the entry `inode` itself.
    fn check_inode(&self, inode: Inode) -> io::Result<()> {
        if self.class(inode).is_free() {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

/// Whether open flags ask for more than reading.
fn writes(flags: u32) -> bool {
    let flags = flags as i32;
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

impl FileSystem for Guard {
    type Inode = Inode;
    type Handle = Handle;
    type DirIter = <PassthroughFs as FileSystem>::DirIter;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        self.inner.init(capable)
    }

    fn destroy(&self) {
        self.inner.destroy()
    }

    fn lookup(&self, ctx: Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        let entry = self.inner.lookup(ctx, parent, name)?;
        Ok(self.note(parent, name, entry))
    }

    fn forget(&self, ctx: Context, inode: Inode, count: u64) {
        self.inner.forget(ctx, inode, count)
    }

    fn batch_forget(&self, ctx: Context, requests: Vec<(Inode, u64)>) {
        self.inner.batch_forget(ctx, requests)
    }

    fn getattr(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Option<Handle>,
    ) -> io::Result<(fuse::Attr, Duration)> {
        self.inner.getattr(ctx, inode, handle)
    }

    fn setattr(
        &self,
        ctx: Context,
        inode: Inode,
        attr: fuse::SetattrIn,
        handle: Option<Handle>,
        valid: SetattrValid,
    ) -> io::Result<(fuse::Attr, Duration)> {
        self.check_inode(inode)?;
        self.inner.setattr(ctx, inode, attr, handle, valid)
    }

    fn readlink(&self, ctx: Context, inode: Inode) -> io::Result<Vec<u8>> {
        self.inner.readlink(ctx, inode)
    }

    fn symlink(
        &self,
        ctx: Context,
        linkname: &CStr,
        parent: Inode,
        name: &CStr,
        extensions: Extensions,
    ) -> io::Result<Entry> {
        self.check_name(parent, name)?;
        let entry = self
            .inner
            .symlink(ctx, linkname, parent, name, extensions)?;
        Ok(self.note(parent, name, entry))
    }

    fn mknod(
        &self,
        ctx: Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        extensions: Extensions,
    ) -> io::Result<Entry> {
        self.check_name(parent, name)?;
        let entry = self
            .inner
            .mknod(ctx, parent, name, mode, rdev, umask, extensions)?;
        Ok(self.note(parent, name, entry))
    }

    fn mkdir(
        &self,
        ctx: Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
        extensions: Extensions,
    ) -> io::Result<Entry> {
        self.check_name(parent, name)?;
        let entry = self
            .inner
            .mkdir(ctx, parent, name, mode, umask, extensions)?;
        Ok(self.note(parent, name, entry))
    }

    fn unlink(&self, ctx: Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.check_name(parent, name)?;
        self.inner.unlink(ctx, parent, name)
    }

    fn rmdir(&self, ctx: Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.check_name(parent, name)?;
        self.inner.rmdir(ctx, parent, name)
    }

    fn rename(
        &self,
        ctx: Context,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.check_name(olddir, oldname)?;
        self.check_name(newdir, newname)?;
        self.inner
            .rename(ctx, olddir, oldname, newdir, newname, flags)
    }

    fn link(
        &self,
        ctx: Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.check_inode(inode)?;
        self.check_name(newparent, newname)?;
        let entry = self.inner.link(ctx, inode, newparent, newname)?;
        Ok(self.note(newparent, newname, entry))
    }

    fn open(
        &self,
        ctx: Context,
        inode: Inode,
        kill_priv: bool,
        flags: u32,
    ) -> io::Result<(Option<Handle>, OpenOptions)> {
        if writes(flags) {
            self.check_inode(inode)?;
        }
        self.inner.open(ctx, inode, kill_priv, flags)
    }

    fn create(
        &self,
        ctx: Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        kill_priv: bool,
        flags: u32,
        umask: u32,
        extensions: Extensions,
    ) -> io::Result<(Entry, Option<Handle>, OpenOptions)> {
        // CREATE also opens an existing file (O_CREAT without O_EXCL), so
        // a guarded name is refused whether or not it exists.
        self.check_name(parent, name)?;
        let (entry, handle, options) = self
            .inner
            .create(ctx, parent, name, mode, kill_priv, flags, umask, extensions)?;
        Ok((self.note(parent, name, entry), handle, options))
    }

    fn read<W: ZeroCopyWriter>(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Handle,
        w: W,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        self.inner
            .read(ctx, inode, handle, w, size, offset, lock_owner, flags)
    }

    // A handle open for writing exists only where open or create allowed
    // it, so write, fallocate and copyfilerange need no check of their own.
    fn write<R: ZeroCopyReader>(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Handle,
        r: R,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        delayed_write: bool,
        kill_priv: bool,
        flags: u32,
    ) -> io::Result<usize> {
        self.inner.write(
            ctx,
            inode,
            handle,
            r,
            size,
            offset,
            lock_owner,
            delayed_write,
            kill_priv,
            flags,
        )
    }

    fn flush(&self, ctx: Context, inode: Inode, handle: Handle, lock_owner: u64) -> io::Result<()> {
        self.inner.flush(ctx, inode, handle, lock_owner)
    }

    fn fsync(&self, ctx: Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        self.inner.fsync(ctx, inode, datasync, handle)
    }

    fn fallocate(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.inner
            .fallocate(ctx, inode, handle, mode, offset, length)
    }

    fn release(
        &self,
        ctx: Context,
        inode: Inode,
        flags: u32,
        handle: Handle,
        flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.inner
            .release(ctx, inode, flags, handle, flush, flock_release, lock_owner)
    }

    fn statfs(&self, ctx: Context, inode: Inode) -> io::Result<libc::statvfs64> {
        self.inner.statfs(ctx, inode)
    }

    fn setxattr(
        &self,
        ctx: Context,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
        extra_flags: SetxattrFlags,
    ) -> io::Result<()> {
        self.check_inode(inode)?;
        self.inner
            .setxattr(ctx, inode, name, value, flags, extra_flags)
    }

    fn getxattr(
        &self,
        ctx: Context,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.inner.getxattr(ctx, inode, name, size)
    }

    fn listxattr(&self, ctx: Context, inode: Inode, size: u32) -> io::Result<ListxattrReply> {
        self.inner.listxattr(ctx, inode, size)
    }

    fn removexattr(&self, ctx: Context, inode: Inode, name: &CStr) -> io::Result<()> {
        self.check_inode(inode)?;
        self.inner.removexattr(ctx, inode, name)
    }

    fn opendir(
        &self,
        ctx: Context,
        inode: Inode,
        flags: u32,
    ) -> io::Result<(Option<Handle>, OpenOptions)> {
        self.inner.opendir(ctx, inode, flags)
    }

    fn readdir(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Handle,
        size: u32,
        offset: u64,
    ) -> io::Result<Self::DirIter> {
        self.inner.readdir(ctx, inode, handle, size, offset)
    }

    fn fsyncdir(
        &self,
        ctx: Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        self.inner.fsyncdir(ctx, inode, datasync, handle)
    }

    fn releasedir(&self, ctx: Context, inode: Inode, flags: u32, handle: Handle) -> io::Result<()> {
        self.inner.releasedir(ctx, inode, flags, handle)
    }

    fn access(&self, ctx: Context, inode: Inode, mask: u32) -> io::Result<()> {
        // A guarded directory (.git) is still written into, so only a
        // read-only entry answers "not writable".
        if mask & libc::W_OK as u32 != 0 && self.class(inode) == Class::ReadOnly {
            return Err(refused());
        }
        self.inner.access(ctx, inode, mask)
    }

    fn lseek(
        &self,
        ctx: Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.inner.lseek(ctx, inode, handle, offset, whence)
    }

    fn copyfilerange(
        &self,
        ctx: Context,
        inode_in: Inode,
        handle_in: Handle,
        offset_in: u64,
        inode_out: Inode,
        handle_out: Handle,
        offset_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.inner.copyfilerange(
            ctx, inode_in, handle_in, offset_in, inode_out, handle_out, offset_out, len, flags,
        )
    }

    fn syncfs(&self, ctx: Context, inode: Inode) -> io::Result<()> {
        self.inner.syncfs(ctx, inode)
    }
}

/// Migration is the passthrough file system's own (mvm does not migrate).
impl SerializableFileSystem for Guard {
    fn prepare_serialization(&self, cancel: Arc<AtomicBool>) {
        self.inner.prepare_serialization(cancel)
    }

    fn serialize(&self, state_pipe: std::fs::File) -> io::Result<()> {
        self.inner.serialize(state_pipe)
    }

    fn deserialize_and_apply(&self, state_pipe: std::fs::File) -> io::Result<()> {
        self.inner.deserialize_and_apply(state_pipe)
    }
}

#[cfg(test)]
mod tests;
