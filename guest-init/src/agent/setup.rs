//! The machine's setup from the first `Exec` (docs/protocol.md, "Machine
//! setup"): the wall clock, fresh entropy with a reseed, the image root,
//! the run's CA, the hostname, and the shares, in that order. Applied
//! once, before anything of the request itself (its user, its working
//! directory, its command) is looked up, since those live in the root it
//! mounts.
//!
//! Guest-only (PID 1: clock, random pool, mounts); the decoding is
//! mvm-protocol's and unit-tested there, and the e2e suite runs every
//! command through this path.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use mvm_protocol::{Setup, SETUP_ENTROPY_BYTES};

use super::phases;
use crate::cmdline::{self, Share};
use crate::error::Error;
use crate::{hostname, mounts, rootfs, say, shares};

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// `BLKFLSBUF`: `_IO(0x12, 97)`.
const BLKFLSBUF: libc::c_ulong = 0x1261;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0}")]
    Request(#[from] mvm_protocol::SetupError),
    #[error("cannot set the clock: {0}")]
    Clock(io::Error),
    #[error("cannot add the host's entropy: {0}")]
    Entropy(io::Error),
    #[error("cannot drop the root disk's cached blocks: {0}")]
    FlushDisk(io::Error),
    #[error("{0}")]
    Mount(#[from] Error),
    #[error("cannot add the run's CA to {0}: {1}")]
    Trust(&'static str, io::Error),
}

/// Applies `setup`; afterwards the root and the shares are where the
/// command will look for them.
pub fn apply(setup: &Setup) -> Result<(), SetupError> {
    // Decoded in full before anything changes.
    let root = setup.root_param()?;
    let shares = setup
        .mount_params()?
        .into_iter()
        .map(|m| {
            let value = m.to_param();
            cmdline::share_from(m)
                .map_err(|problem| mvm_protocol::SetupError::Mount { value, problem })
        })
        .collect::<Result<Vec<Share>, _>>()?;
    let entropy = setup.entropy_bytes()?;
    let name = setup.hostname()?;
    set_clock(setup.wall_clock_ns).map_err(SetupError::Clock)?;
    reseed(&entropy).map_err(SetupError::Entropy)?;
    phases::mark("clock set, entropy added and reseeded");
    if let Some(root) = root {
        // A machine restored from a template may have read another
        // image's first blocks (the kernel's partition scan at probe):
        // whatever is cached of the disk goes before it is mounted.
        if root.lower == cmdline::RootLower::Disk {
            flush_disk().map_err(SetupError::FlushDisk)?;
        }
        rootfs::enter(&root, setup.upper_on_disk)?;
        // Before the shares, which may lie inside it: /root keeps its mode.
        mounts::ensure_dir(c"/root", 0o700)?;
        phases::mark("image root mounted (overlay entered)");
    }
    if let Some(pem) = &setup.trust {
        trust(pem)?;
    }
    if setup.hostname.is_some() {
        // After the root: its /etc/hosts is the one to name it in.
        hostname::set(name);
        hostname::resolve_locally(name);
    }
    if let Err(err) = shares::mount_all(&shares) {
        // The documented line of its own (docs/protocol.md).
        say!("{err}");
        return Err(err.into());
    }
    if !shares.is_empty() {
        phases::mark("shares mounted");
    }
    Ok(())
}

/// The run's CA: appended to the root's bundle (a copy on the overlay;
/// the image's own file is untouched) and alone in `RUN_CA_PATH`, both
/// world-readable (they are certificates; the key is the host proxy's).
fn trust(pem: &str) -> Result<(), SetupError> {
    use mvm_protocol::{CA_BUNDLE_PATH, RUN_CA_PATH};
    use std::os::unix::fs::PermissionsExt;
    let write = |path: &'static str, text: &[u8]| {
        std::fs::create_dir_all("/etc/ssl/certs")
            .and_then(|()| std::fs::write(path, text))
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)))
            .map_err(|e| SetupError::Trust(path, e))
    };
    let mut bundle = std::fs::read(CA_BUNDLE_PATH).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pem.as_bytes());
    // A bundle that is a link (to the image's file) is replaced, not
    // written through.
    let _ = std::fs::remove_file(CA_BUNDLE_PATH);
    write(CA_BUNDLE_PATH, &bundle)?;
    write(RUN_CA_PATH, pem.as_bytes())
}

fn set_clock(ns: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: ts is a valid timespec for the duration of the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `struct rand_pool_info` with room for the setup's bytes.
#[repr(C)]
struct PoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; SETUP_ENTROPY_BYTES],
}

/// Credits the host's bytes to the kernel's pool, then makes the CRNG
/// reseed from it at once (not at its next scheduled reseed), so that the
/// very next random number differs between two restored machines.
fn reseed(entropy: &[u8; SETUP_ENTROPY_BYTES]) -> io::Result<()> {
    let urandom = File::options().write(true).open("/dev/urandom")?;
    let info = PoolInfo {
        entropy_count: (SETUP_ENTROPY_BYTES * 8) as libc::c_int,
        buf_size: SETUP_ENTROPY_BYTES as libc::c_int,
        buf: *entropy,
    };
    // SAFETY: RNDADDENTROPY reads a rand_pool_info of buf_size bytes of
    // buffer from a pointer that is valid for the call.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY as _, &info) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG as _) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn flush_disk() -> io::Result<()> {
    let path = CString::new(format!("/dev/{}", mvm_protocol::boot::ROOT_DEVICE))
        .expect("no NUL in a device name");
    // SAFETY: path is a valid NUL-terminated string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened; BLKFLSBUF takes no argument.
    let rc = unsafe { libc::ioctl(fd, BLKFLSBUF as _, 0) };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(())
}
