//! The flattened root filesystem as an in-memory tree of inodes. File
//! contents are not here: a regular file records where its data is (layer,
//! entry ordinal) and the second pass copies it from the layer stream.

use std::collections::BTreeMap;

pub(crate) type Id = u32;

/// An xattr: full name ("security.capability") and raw value.
pub(crate) type Xattr = (Box<[u8]>, Box<[u8]>);

/// The root directory's inode id.
pub(crate) const ROOT: Id = 0;

pub(crate) enum Kind {
    Dir(BTreeMap<Box<[u8]>, Id>),
    File { size: u64, layer: u16, ordinal: u64 },
    Symlink(Box<[u8]>),
    Char { major: u32, minor: u32 },
    Block { major: u32, minor: u32 },
    Fifo,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Permission bits with setuid, setgid and sticky (0o7777).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
    pub mtime_nsec: u32,
    /// Full names ("security.capability") to raw values, sorted by name.
    pub xattrs: Vec<Xattr>,
}

impl Meta {
    /// What an implicit parent directory (one a layer's entries need but the
    /// layer does not list) gets: 0755 root:root, time 0.
    pub(crate) fn implicit_dir() -> Meta {
        Meta {
            perm: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            mtime_nsec: 0,
            xattrs: Vec::new(),
        }
    }
}

pub(crate) struct Inode {
    pub kind: Kind,
    pub meta: Meta,
    /// The layer that last put this inode at its path: an opaque directory
    /// keeps only what its own layer put there.
    pub layer: u16,
}

impl Inode {
    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir(_))
    }
}

pub(crate) struct Tree {
    pub inodes: Vec<Inode>,
}

impl Tree {
    pub(crate) fn new() -> Tree {
        Tree {
            inodes: vec![Inode {
                kind: Kind::Dir(BTreeMap::new()),
                meta: Meta::implicit_dir(),
                layer: 0,
            }],
        }
    }

    pub(crate) fn children(&self, dir: Id) -> Option<&BTreeMap<Box<[u8]>, Id>> {
        match &self.inodes[dir as usize].kind {
            Kind::Dir(map) => Some(map),
            _ => None,
        }
    }

    fn children_mut(&mut self, dir: Id) -> &mut BTreeMap<Box<[u8]>, Id> {
        match &mut self.inodes[dir as usize].kind {
            Kind::Dir(map) => map,
            _ => unreachable!("children_mut on a non-directory"),
        }
    }

    pub(crate) fn push(&mut self, inode: Inode) -> Id {
        self.inodes.push(inode);
        (self.inodes.len() - 1) as Id
    }

    /// The directory at `components`, creating missing ones as implicit
    /// directories of `layer`. A non-directory on the way (a symlink, a
    /// file) is replaced by a directory, as Docker does: placing an entry
    /// never follows a symlink, so a layer cannot write outside its root.
    pub(crate) fn make_dirs(&mut self, components: &[&[u8]], layer: u16) -> Id {
        let mut dir = ROOT;
        for name in components {
            let existing = self.children(dir).and_then(|c| c.get(*name)).copied();
            dir = match existing {
                Some(id) if self.inodes[id as usize].is_dir() => id,
                _ => {
                    let id = self.push(Inode {
                        kind: Kind::Dir(BTreeMap::new()),
                        meta: Meta::implicit_dir(),
                        layer,
                    });
                    self.set_child(dir, name, id);
                    id
                }
            };
        }
        dir
    }

    /// The inode at `components`, without creating anything or following
    /// symlinks.
    pub(crate) fn lookup(&self, components: &[&[u8]]) -> Option<Id> {
        let mut id = ROOT;
        for name in components {
            id = *self.children(id)?.get(*name)?;
        }
        Some(id)
    }

    /// Puts `id` at `dir/name`. A directory put over a directory keeps the
    /// old one's children (OCI: later metadata, same contents); anything
    /// else replaces what was there.
    pub(crate) fn place(&mut self, dir: Id, name: &[u8], id: Id) {
        if let Some(old) = self.children(dir).and_then(|c| c.get(name)).copied() {
            if old == id {
                return;
            }
            if self.inodes[old as usize].is_dir() && self.inodes[id as usize].is_dir() {
                let children = std::mem::take(self.children_mut(old));
                *self.children_mut(id) = children;
            }
            self.forget(old);
        }
        self.set_child(dir, name, id);
    }

    fn set_child(&mut self, dir: Id, name: &[u8], id: Id) {
        self.children_mut(dir).insert(name.into(), id);
    }

    /// Deletes `dir/name` (a whiteout). Absent names are fine.
    pub(crate) fn remove(&mut self, dir: Id, name: &[u8]) {
        if let Some(old) = self.children_mut(dir).remove(name) {
            self.forget(old);
        }
    }

    /// Frees the children maps of a subtree that left the tree. Directories
    /// are never hard linked, so nothing else refers to their maps; files
    /// inside may live on through other links, and keep their inodes.
    fn forget(&mut self, id: Id) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if let Kind::Dir(map) = &mut self.inodes[id as usize].kind {
                let map = std::mem::take(map);
                stack.extend(map.into_values());
            }
        }
    }

    /// `.wh..wh..opq`: the directory keeps only what `layer` put in it, at
    /// every depth (an upper directory over a lower one kept the lower
    /// children when it was placed; an opaque parent hides them again).
    pub(crate) fn make_opaque(&mut self, dir: Id, layer: u16) {
        let mut stack = vec![dir];
        while let Some(dir) = stack.pop() {
            let lower: Vec<Box<[u8]>> = self.children(dir).map_or(Vec::new(), |c| {
                c.iter()
                    .filter(|(_, id)| self.inodes[**id as usize].layer < layer)
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            for name in lower {
                self.remove(dir, &name);
            }
            if let Some(c) = self.children(dir) {
                stack.extend(c.values().filter(|id| self.inodes[**id as usize].is_dir()));
            }
        }
    }

    /// Reachable inodes in a fixed order (depth first, names sorted, root
    /// first) and each one's link count. A hard-linked inode appears once,
    /// where it is first reached.
    pub(crate) fn walk(&self) -> (Vec<Id>, Vec<u32>) {
        let mut nlink = vec![0u32; self.inodes.len()];
        let mut order = Vec::new();
        let mut stack = vec![ROOT];
        nlink[ROOT as usize] = 1;
        while let Some(id) = stack.pop() {
            order.push(id);
            if let Some(children) = self.children(id) {
                // Reversed so that the stack pops them in name order.
                for &child in children.values().rev() {
                    let first = nlink[child as usize] == 0;
                    nlink[child as usize] += 1;
                    if first {
                        stack.push(child);
                    }
                }
            }
        }
        // A directory's links: its entry in the parent, its own ".", and
        // each subdirectory's "..".
        for &id in &order {
            if let Some(children) = self.children(id) {
                let subdirs = children
                    .values()
                    .filter(|c| self.inodes[**c as usize].is_dir())
                    .count() as u32;
                nlink[id as usize] = 2 + subdirs;
            }
        }
        (order, nlink)
    }
}
