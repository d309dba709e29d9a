//! The image root's disk: a read-only virtio-blk device over the EROFS
//! file, advertised at the fixed capacity `ROOT_DISK_SECTORS` whatever the
//! image's size (the guest sees zeros past the image), so that one
//! template fits every image. That the guest mounts it is told in the
//! exec channel's setup (docs/protocol.md), after a restore if there was
//! one: nothing about the run is on the kernel command line.

use std::fs::File;

use mvm_devices::virtio::block;
use mvm_protocol::boot::{ROOT_DISK_ID, ROOT_DISK_SECTORS};

use super::attach::{attach_virtio, DeviceEnv, Error, Signaller, VirtioSpec};
use crate::config::RootDisk;

/// Registry id of the root disk.
pub const ROOT_DISK_REGISTRY_ID: &str = "block-root";

pub fn attach_root_disk(env: &mut DeviceEnv, disk: &RootDisk) -> Result<(), Error> {
    let shown = disk.path.display().to_string();
    // Read-only at the host too: nothing the guest does can reach the
    // image in the store.
    let file = File::open(&disk.path).map_err(|e| Error::RootDisk(shown.clone(), e.to_string()))?;
    let spec = VirtioSpec {
        id: ROOT_DISK_REGISTRY_ID,
        what: "virtio-blk",
        queues: block::defs::QUEUE_COUNT,
        signaller: Signaller::Device,
    };
    attach_virtio(env, spec, |wiring| {
        // An image larger than the fixed capacity is refused here
        // (block::Error::LargerThanCapacity names both sizes).
        let (device, handler) =
            block::new_with_capacity(file, ROOT_DISK_ID, wiring.queue_evts, ROOT_DISK_SECTORS)
                .map_err(|e| Error::RootDisk(shown.clone(), e.to_string()))?;
        Ok((device, Box::new(handler)))
    })?;
    Ok(())
}
