//! The image root's disk: a read-only virtio-blk device over the EROFS
//! file, advertised at the fixed capacity `ROOT_DISK_SECTORS` whatever the
//! image's size (the guest sees zeros past the image), so that one
//! template fits every image. That the guest mounts it is told in the
//! exec channel's setup (docs/protocol.md), after a restore if there was
//! one: nothing about the run is on the kernel command line.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use mvm_devices::virtio::block;
use mvm_protocol::boot::{ROOT_DISK_ID, ROOT_DISK_SECTORS, SANDBOX_DISK_ID};

use super::attach::{attach_virtio, DeviceEnv, Error, Signaller, VirtioSpec};
use crate::config::RootDisk;

/// Registry id of the root disk.
pub const ROOT_DISK_REGISTRY_ID: &str = "block-root";
/// Registry id of a named sandbox's disk.
pub const SANDBOX_DISK_REGISTRY_ID: &str = "block-disk";

pub fn attach_root_disk(env: &mut DeviceEnv, disk: &RootDisk) -> Result<(), Error> {
    let shown = disk.path.display().to_string();
    // Read-only at the host too: nothing the guest does can reach the
    // image in the store.
    let file = File::open(&disk.path).map_err(|e| Error::RootDisk(shown.clone(), e.to_string()))?;
    attach_virtio(env, block_spec(ROOT_DISK_REGISTRY_ID), |wiring| {
        // An image larger than the fixed capacity is refused here
        // (block::Error::LargerThanCapacity names both sizes).
        let (device, handler) =
            block::new_with_capacity(file, ROOT_DISK_ID, wiring.queue_evts, ROOT_DISK_SECTORS)
                .map_err(|e| Error::RootDisk(shown.clone(), e.to_string()))?;
        Ok((device, Box::new(handler)))
    })?;
    Ok(())
}

/// A named sandbox's disk (docs/sandboxes.md): writable, its capacity the
/// file's size, held with an exclusive lock for the machine's life so
/// that no second machine can write it at the same time.
pub fn attach_sandbox_disk(env: &mut DeviceEnv, path: &Path) -> Result<(), Error> {
    let shown = path.display().to_string();
    let fail = |why: String| Error::SandboxDisk(shown.clone(), why);
    let file = File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| fail(e.to_string()))?;
    lock_exclusive(&file).map_err(fail)?;
    attach_virtio(env, block_spec(SANDBOX_DISK_REGISTRY_ID), |wiring| {
        let (device, handler) = block::new_writable(file, SANDBOX_DISK_ID, wiring.queue_evts)
            .map_err(|e| fail(e.to_string()))?;
        Ok((device, Box::new(handler)))
    })?;
    Ok(())
}

/// The disk's exclusive lock (held as long as `file` is open), or why
/// not.
fn lock_exclusive(file: &File) -> Result<(), String> {
    // SAFETY: flock on an fd this File owns; the lock goes with the file.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    Err(match std::io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            "in use by another machine (is the sandbox running already?)".into()
        }
        e => format!("cannot lock it: {e}"),
    })
}

fn block_spec(id: &'static str) -> VirtioSpec<'static> {
    VirtioSpec {
        id,
        what: "virtio-blk",
        queues: block::defs::QUEUE_COUNT,
        signaller: Signaller::Device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_in_use_is_refused_until_its_holder_closes_it() {
        let path = std::env::temp_dir().join(format!("mvm-disk-lock-{}", std::process::id()));
        std::fs::write(&path, [0u8; 512]).unwrap();
        let first = File::options().read(true).write(true).open(&path).unwrap();
        let second = File::options().read(true).write(true).open(&path).unwrap();
        assert_eq!(lock_exclusive(&first), Ok(()));
        let refused = lock_exclusive(&second).unwrap_err();
        assert!(refused.contains("in use"), "{refused}");
        drop(first);
        assert_eq!(lock_exclusive(&second), Ok(()));
        std::fs::remove_file(&path).unwrap();
    }
}
