//! Mounts the virtio-fs shares the VMM announces with `mvm.mount` (parsed
//! in `cmdline`). Guest-only (needs the virtio-fs devices), so no unit
//! tests; the e2e suite boots VMs with shares.

use std::ffi::OsStr;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::ptr;

use crate::cmdline::Share;
use crate::error::Error;

/// Readahead on a share, in KiB: one FUSE request's most (virtiofsd's
/// 1 MiB buffer, 256 pages). The kernel's default for a FUSE mount is
/// 128 KiB, and the server can only lower it (FUSE_INIT's
/// max_readahead), so guest-init raises it. Measured in the test host
/// (one VM, caches dropped between runs, a 200 MB file): 2.6-3.2 s to
/// read at 128 KiB, 1.0-1.3 s at 1 MiB, 0.8-1.1 s at 4 MiB.
pub const SHARE_READAHEAD_KB: u32 = 1024;

/// Mounts every share in the given order, so that a later one can lie
/// inside an earlier one.
pub fn mount_all(shares: &[Share]) -> Result<(), Error> {
    shares.iter().try_for_each(mount)
}

fn mount(share: &Share) -> Result<(), Error> {
    let fail = |source: io::Error| Error::Share {
        tag: share.tag.to_string_lossy().into_owned(),
        path: share.path.to_string_lossy().into_owned(),
        source,
    };
    // The mount point and any missing parents.
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(OsStr::from_bytes(share.path.as_bytes()))
        .map_err(fail)?;
    // nodev: device nodes on a share must not open the guest's devices.
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if share.read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: tag, path and fstype are valid NUL-terminated strings that
    // outlive the call; virtiofs takes no data, so NULL is allowed.
    let rc = unsafe {
        libc::mount(
            share.tag.as_ptr(),
            share.path.as_ptr(),
            c"virtiofs".as_ptr(),
            flags,
            ptr::null(),
        )
    };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    set_readahead(OsStr::from_bytes(share.path.as_bytes())).map_err(fail)
}

/// The mount's backing device info is named after its device number.
fn set_readahead(mount_point: &OsStr) -> io::Result<()> {
    let dev = fs::metadata(mount_point)?.dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    fs::write(&knob, SHARE_READAHEAD_KB.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot set {knob}: {e}")))
}
