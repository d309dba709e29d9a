//! What a VM is made of, independent of how the user said it.

use std::path::PathBuf;

use crate::arch::x86_64::mptable::MAX_CPUS;

pub const MIB: u64 = 1 << 20;
/// Below this the guest kernel and initramfs do not fit with room to run.
pub const MIN_MEMORY: u64 = 64 * MIB;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("memory size '{0}' is not a size: use a number with an optional K, M or G suffix, e.g. 512M")]
    BadSize(String),
    #[error("memory {got} MiB is too small: the guest needs at least {min} MiB (--memory {min}M)", got = .0 / MIB, min = MIN_MEMORY / MIB)]
    MemoryTooSmall(u64),
    #[error("--cpus must be between 1 and {MAX_CPUS}, not {0}")]
    BadCpuCount(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// The full kernel command line, device entries excluded (devices add
    /// their own).
    pub cmdline: String,
    pub vcpus: u8,
    pub mem_size: u64,
    /// A virtio-vsock device whose host side is a Unix socket; None for
    /// none.
    pub vsock: Option<VsockConfig>,
    /// Host directories the guest mounts through virtio-fs, in mount order.
    pub shares: Vec<FsShare>,
    /// The image root: a read-only virtio-blk disk; None keeps the
    /// initramfs as the root.
    pub root_disk: Option<RootDisk>,
    /// The root from a host directory instead (`--rootfs DIR`): the share
    /// at [`ROOT_GUEST_PATH`] in `shares` is its lower layer.
    pub root_dir: Option<RootDir>,
    /// A named sandbox's disk (a file of its whole capacity): a writable
    /// virtio-blk disk that holds the image root's upper layer.
    pub sandbox_disk: Option<PathBuf>,
    /// A virtio-balloon device whose free page reporting gives memory the
    /// guest frees back to the host (a long-lived machine: a named
    /// sandbox).
    pub free_page_reporting: bool,
    /// Whether the guest bounces every virtio-fs buffer through one DMA
    /// pool (`mvm_protocol::boot::BOUNCE_PARAM`): what a machine saved as
    /// a template needs, since a restore shares only that pool and the
    /// rings with virtiofsd (docs/snapshots.md). A machine that is never
    /// saved is booted with no pool (`mvm_protocol::boot::NO_BOUNCE_PARAM`)
    /// and spared its cost: 8 MiB of guest RAM that the kernel zeroes at
    /// boot, and a copy of every buffer.
    pub fs_bounce_pool: bool,
}

/// A read-only EROFS image the guest mounts as the lower layer of its
/// root (docs/images.md), with `scratch_bytes` of tmpfs above it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDisk {
    pub path: PathBuf,
    pub scratch_bytes: u64,
}

/// A host directory, served read-only over virtio-fs, that the guest
/// mounts as the lower layer of its root, with `scratch_bytes` of tmpfs
/// above it: the same overlay as [`RootDisk`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDir {
    pub scratch_bytes: u64,
}

/// The guest path of the share that is the root's lower layer
/// ([`RootDir`]): no share the user names can have it (`/` is refused as
/// a guest path), and guest-init mounts it under the overlay, not here.
pub const ROOT_GUEST_PATH: &str = "/";

impl VmConfig {
    /// Whether the guest's root is an image (a disk or a directory)
    /// rather than the initramfs.
    pub fn has_image_root(&self) -> bool {
        self.root_disk.is_some() || self.root_dir.is_some()
    }
}

/// One virtio-fs device: its backend (virtiofsd, started by the caller)
/// already listens on `socket`; guest-init mounts `tag` at `guest_path`
/// (read-only in the guest too when `read_only`; the backend enforces it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsShare {
    pub tag: String,
    pub socket: PathBuf,
    pub guest_path: String,
    pub read_only: bool,
}

/// Firecracker-style "hybrid" vsock: the VMM listens on `uds_path`; a host
/// client connects there and writes `CONNECT <guest port>\n` (see
/// devices/src/virtio/vsock/mod.rs). The path must not exist yet, and
/// whoever chose it removes it after the VM ends (`mvm run`: the session
/// directory). The CID is `mvm_protocol::GUEST_CID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockConfig {
    pub cid: u64,
    pub uds_path: PathBuf,
    /// Host ports the guest may connect to, each served by a Unix socket
    /// whose listener takes one stream per guest connection (e.g. the
    /// egress proxy's); empty: the guest can open nothing.
    pub guest_ports: Vec<mvm_devices::virtio::vsock::GuestPort>,
}

/// Parses "512M", "1G", "1024K", "2g", "268435456" (bytes), "512MiB".
pub fn parse_size(text: &str) -> Result<u64, Error> {
    let bad = || Error::BadSize(text.to_string());
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

pub fn check_memory(bytes: u64) -> Result<u64, Error> {
    if bytes < MIN_MEMORY {
        return Err(Error::MemoryTooSmall(bytes));
    }
    Ok(bytes)
}

pub fn check_cpus(n: u32) -> Result<u8, Error> {
    match u8::try_from(n) {
        Ok(n) if (1..=MAX_CPUS).contains(&n) => Ok(n),
        _ => Err(Error::BadCpuCount(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 * MIB));
        assert_eq!(parse_size("1G"), Ok(1024 * MIB));
        assert_eq!(parse_size("2g"), Ok(2048 * MIB));
        assert_eq!(parse_size("256MiB"), Ok(256 * MIB));
        assert_eq!(parse_size("4096K"), Ok(4 * MIB));
        assert_eq!(parse_size("1048576"), Ok(MIB));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12T").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(check_memory(16 * MIB), Err(Error::MemoryTooSmall(16 * MIB)));
        assert_eq!(check_memory(64 * MIB), Ok(64 * MIB));
        assert_eq!(check_cpus(0), Err(Error::BadCpuCount(0)));
        assert_eq!(check_cpus(1), Ok(1));
        assert_eq!(check_cpus(32), Ok(32));
        assert_eq!(check_cpus(300), Err(Error::BadCpuCount(300)));
        assert!(Error::MemoryTooSmall(16 * MIB)
            .to_string()
            .contains("16 MiB is too small"));
    }
}
