//! The filesystems every guest gets. Guest-only (mounting needs PID 1 in a
//! fresh kernel), so no unit tests.

use std::ffi::CStr;
use std::io;
use std::ptr;

use crate::error::Error;

struct Mount {
    fstype: &'static CStr,
    target: &'static CStr,
    flags: libc::c_ulong,
    data: &'static CStr,
    /// Mode of the mount point if init has to create it.
    dir_mode: libc::mode_t,
}

const DEV: Mount = Mount {
    fstype: c"devtmpfs",
    target: c"/dev",
    flags: libc::MS_NOSUID,
    data: c"mode=0755",
    dir_mode: 0o755,
};

// Order matters: /dev/pts lives inside /dev, which DEV mounted first.
const OTHERS: [Mount; 5] = [
    Mount {
        fstype: c"proc",
        target: c"/proc",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: c"",
        dir_mode: 0o555,
    },
    Mount {
        fstype: c"sysfs",
        target: c"/sys",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: c"",
        dir_mode: 0o555,
    },
    Mount {
        fstype: c"devpts",
        target: c"/dev/pts",
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        data: c"newinstance,ptmxmode=0666",
        dir_mode: 0o755,
    },
    Mount {
        fstype: c"tmpfs",
        target: c"/tmp",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: c"mode=1777",
        dir_mode: 0o1777,
    },
    Mount {
        fstype: c"tmpfs",
        target: c"/run",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: c"mode=0755",
        dir_mode: 0o755,
    },
];

/// Mounts devtmpfs on /dev; needed before the console can be opened.
pub fn mount_dev() -> Result<(), Error> {
    mount(&DEV)
}

/// Mounts /proc, /sys, /dev/pts, /tmp and /run.
pub fn mount_others() -> Result<(), Error> {
    OTHERS.iter().try_for_each(mount)
}

/// Creates a directory unless it already exists.
pub fn ensure_dir(path: &'static CStr, mode: libc::mode_t) -> Result<(), Error> {
    // SAFETY: the path is a valid NUL-terminated string.
    if unsafe { libc::mkdir(path.as_ptr(), mode) } == 0 {
        return Ok(());
    }
    let source = io::Error::last_os_error();
    if source.raw_os_error() == Some(libc::EEXIST) {
        Ok(())
    } else {
        Err(Error::Mkdir { path, source })
    }
}

fn mount(m: &Mount) -> Result<(), Error> {
    ensure_dir(m.target, m.dir_mode)?;
    // The source name is shown in /proc/mounts only; use the fs type.
    // SAFETY: all strings are valid NUL-terminated C strings that outlive
    // the call.
    let rc = unsafe {
        libc::mount(
            m.fstype.as_ptr(),
            m.target.as_ptr(),
            m.fstype.as_ptr(),
            m.flags,
            if m.data.is_empty() {
                ptr::null()
            } else {
                m.data.as_ptr().cast()
            },
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Mount {
            fstype: m.fstype,
            target: m.target,
            source: io::Error::last_os_error(),
        })
    }
}
