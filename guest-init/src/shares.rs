//! Mounts the virtio-fs shares the VMM announces with `mvm.mount` (parsed
//! in `cmdline`). Guest-only (needs the virtio-fs devices), so no unit
//! tests; the e2e suite boots VMs with shares.

use std::ffi::OsStr;
use std::fs::DirBuilder;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::ptr;

use crate::cmdline::Share;
use crate::error::Error;

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
    if rc == 0 {
        Ok(())
    } else {
        Err(fail(io::Error::last_os_error()))
    }
}
