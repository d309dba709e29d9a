//! A named sandbox's disk (docs/sandboxes.md): the virtio-blk device whose
//! id is `SANDBOX_DISK_ID`, found by its serial, and made an ext2
//! filesystem (busybox `mke2fs` from the initramfs) the first time, when
//! it carries no ext2 superblock. The kernel's ext4 driver mounts it.
//!
//! The superblock check is unit-tested; finding and formatting act on the
//! guest's devices, which the e2e sandbox test covers.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::Command;

use mvm_protocol::boot::SANDBOX_DISK_ID;

use crate::error::Error;
use crate::say;

/// Where the superblock's magic lies: the superblock starts 1024 bytes
/// into the device, the magic 56 bytes into it.
const MAGIC_OFFSET: u64 = 1024 + 56;
const EXT2_MAGIC: [u8; 2] = 0xEF53u16.to_le_bytes();
/// The initramfs's busybox: present before the switch to the image root,
/// which is when the disk is prepared.
const BUSYBOX: &str = "/bin/busybox";

/// The disk's device node, formatted if it was blank.
pub fn prepare() -> Result<CString, Error> {
    let device = find()?;
    if !has_filesystem(&device)? {
        format(&device)?;
        drop_cache(&device);
    }
    CString::new(device).map_err(|_| Error::SandboxDisk("a device name with a NUL".into()))
}

/// `/dev/vdX` whose serial is the sandbox disk's id.
fn find() -> Result<String, Error> {
    let entries = fs::read_dir("/sys/block")
        .map_err(|e| Error::SandboxDisk(format!("cannot list /sys/block: {e}")))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let serial = fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
        if name.starts_with("vd") && serial.trim_end_matches(['\0', '\n']) == SANDBOX_DISK_ID {
            return Ok(format!("/dev/{name}"));
        }
    }
    Err(Error::SandboxDisk(format!(
        "no block device with serial {SANDBOX_DISK_ID}"
    )))
}

fn has_filesystem(device: &str) -> Result<bool, Error> {
    let file =
        File::open(device).map_err(|e| Error::SandboxDisk(format!("cannot open {device}: {e}")))?;
    let mut magic = [0u8; 2];
    file.read_exact_at(&mut magic, MAGIC_OFFSET)
        .map_err(|e| Error::SandboxDisk(format!("cannot read {device}: {e}")))?;
    Ok(is_ext2_magic(magic))
}

fn is_ext2_magic(bytes: [u8; 2]) -> bool {
    bytes == EXT2_MAGIC
}

fn format(device: &str) -> Result<(), Error> {
    say!("sandbox disk {device}: blank, making an ext2 filesystem");
    let status = Command::new(BUSYBOX)
        .args(["mke2fs", "-q", "-F", "-L", SANDBOX_DISK_ID, device])
        .status()
        .map_err(|e| Error::SandboxDisk(format!("cannot run {BUSYBOX} mke2fs: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::SandboxDisk(format!(
            "mke2fs {device} failed ({status})"
        )))
    }
}

/// BLKFLSBUF: `_IO(0x12, 97)`.
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// mke2fs wrote through the device's page cache (some 60 MiB on a 4 GiB
/// disk, its inode tables). It is on the disk now; keeping the pages would
/// hold that much of a long-lived guest's memory for nothing. BLKFLSBUF
/// writes them back and drops them, and free page reporting (the balloon)
/// then gives them to the host. Failing only costs memory, so it is said
/// and the start goes on.
fn drop_cache(device: &str) {
    let dropped = File::open(device).and_then(|f| {
        // SAFETY: BLKFLSBUF takes no argument and touches no user memory.
        match unsafe { libc::ioctl(f.as_raw_fd(), BLKFLSBUF as _, 0) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    });
    if let Err(e) = dropped {
        say!("sandbox disk {device}: cannot drop mke2fs's page cache: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_ext2_magic_counts_as_a_filesystem() {
        assert!(is_ext2_magic([0x53, 0xEF]));
        assert!(!is_ext2_magic([0, 0]), "a blank (sparse) disk");
        assert!(!is_ext2_magic([0xEF, 0x53]), "byte order");
    }
}
