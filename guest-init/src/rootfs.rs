//! The image root (docs/images.md): the read-only EROFS filesystem on the
//! VMM's block device (or a host directory the VMM serves over virtio-fs,
//! `mvm run --rootfs DIR`), under an overlayfs whose upper layer is a tmpfs of
//! the scratch size (or, for a named sandbox, the ext2 filesystem on its
//! own disk, made on first use: docs/sandboxes.md), becomes `/` for init
//! and everything it starts.
//!
//! guest-init stays PID 1 and keeps running from the initramfs's copy of
//! itself; only its root moves. The initramfs root (rootfs) cannot be
//! pivot_root'ed away, so this is what switch_root does: move the new root
//! onto `/` and chroot into it. /dev (with /dev/pts), /proc, /sys, /tmp
//! and /run, already mounted, move along. The layers' own mounts stay
//! behind in the initramfs, out of every process's reach.
//! Guest-only, no unit tests: the e2e suite boots image roots.

use std::ffi::{CStr, CString};
use std::io;
use std::ptr;

use crate::cmdline::{RootLower, RootParam};
use crate::error::Error;
use crate::mounts::ensure_dir;

const LAYERS: &CStr = c"/.mvm";
const LOWER: &CStr = c"/.mvm/lower";
const SCRATCH: &CStr = c"/.mvm/scratch";
const UPPER: &CStr = c"/.mvm/scratch/upper";
const WORK: &CStr = c"/.mvm/scratch/work";
const MERGED: &CStr = c"/.mvm/root";
const DISK: &CStr = c"/dev/vda";

/// What moves from the initramfs into the new root, outermost first, with
/// the mode a mount point gets if the image lacks it.
const MOVED: [(&CStr, &CStr, libc::mode_t); 5] = [
    (c"/dev", c"/.mvm/root/dev", 0o755),
    (c"/proc", c"/.mvm/root/proc", 0o555),
    (c"/sys", c"/.mvm/root/sys", 0o555),
    (c"/tmp", c"/.mvm/root/tmp", 0o1777),
    (c"/run", c"/.mvm/root/run", 0o755),
];

/// Mounts the layers and makes the overlay the root; with `on_disk`, the
/// writable layer is the sandbox's disk.
pub fn enter(root: &RootParam, on_disk: bool) -> Result<(), Error> {
    ensure_dir(LAYERS, 0o700)?;
    for dir in [LOWER, SCRATCH, MERGED] {
        ensure_dir(dir, 0o755)?;
    }
    // nosuid: a setuid binary in the image does not raise the command's
    // privileges (no_new_privs already stops it; this is the second lock).
    // nodev: device nodes in the image open nothing.
    let locked = libc::MS_NOSUID | libc::MS_NODEV;
    match &root.lower {
        RootLower::Disk => mount(DISK, LOWER, c"erofs", locked | libc::MS_RDONLY, None)?,
        RootLower::Share(tag) => {
            let tag = CString::new(tag.as_str()).expect("a checked tag has no NUL");
            mount(&tag, LOWER, c"virtiofs", locked | libc::MS_RDONLY, None)?
        }
    }
    if on_disk {
        let disk = crate::sandbox_disk::prepare()?;
        mount(&disk, SCRATCH, c"ext2", locked, None)?;
    } else {
        let size = CString::new(format!("size={},mode=0755", root.scratch_bytes))
            .expect("digits and letters have no NUL");
        mount(c"scratch", SCRATCH, c"tmpfs", locked, Some(&size))?;
    }
    ensure_dir(UPPER, 0o755)?;
    ensure_dir(WORK, 0o700)?;
    mount(
        c"overlay",
        MERGED,
        c"overlay",
        locked,
        Some(c"lowerdir=/.mvm/lower,upperdir=/.mvm/scratch/upper,workdir=/.mvm/scratch/work"),
    )?;
    for (from, to, mode) in MOVED {
        ensure_dir(to, mode)?;
        move_mount(from, to)?;
    }
    switch_root()?;
    ensure_hosts();
    Ok(())
}

/// Images leave /etc/hosts to the runtime (Docker writes one per
/// container); without it glibc cannot resolve `localhost`, which test
/// servers and their clients use, nor give the hostname a domain, which
/// git needs for a default committer address. An image's own is kept.
fn ensure_hosts() {
    let path = std::path::Path::new("/etc/hosts");
    if path.exists() || !path.parent().is_some_and(|p| p.is_dir()) {
        return;
    }
    let hosts = "127.0.0.1\tlocalhost\n127.0.1.1\tmvm.localdomain mvm\n::1\tlocalhost ip6-localhost ip6-loopback\n";
    if let Err(e) = std::fs::write(path, hosts) {
        crate::say!("warning: cannot write /etc/hosts: {e}");
    }
}

/// chdir into the merged root, move it onto `/`, chroot there.
fn switch_root() -> Result<(), Error> {
    let fail = |what: &'static str| {
        let source = io::Error::last_os_error();
        move || Error::SwitchRoot { what, source }
    };
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::chdir(MERGED.as_ptr()) } != 0 {
        return Err(fail("chdir")());
    }
    move_mount(c".", c"/")?;
    // SAFETY: valid NUL-terminated paths.
    if unsafe { libc::chroot(c".".as_ptr()) } != 0 {
        return Err(fail("chroot")());
    }
    // SAFETY: as above.
    if unsafe { libc::chdir(c"/".as_ptr()) } != 0 {
        return Err(fail("chdir /")());
    }
    Ok(())
}

fn move_mount(from: &'static CStr, to: &'static CStr) -> Result<(), Error> {
    // SAFETY: valid NUL-terminated paths; MS_MOVE takes no type or data.
    let rc = unsafe {
        libc::mount(
            from.as_ptr(),
            to.as_ptr(),
            ptr::null(),
            libc::MS_MOVE,
            ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Mount {
            fstype: c"(move)",
            target: to,
            source: io::Error::last_os_error(),
        })
    }
}

fn mount(
    source: &CStr,
    target: &'static CStr,
    fstype: &'static CStr,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), Error> {
    // SAFETY: all strings are valid NUL-terminated C strings that outlive
    // the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.map_or(ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Mount {
            fstype,
            target,
            source: io::Error::last_os_error(),
        })
    }
}
