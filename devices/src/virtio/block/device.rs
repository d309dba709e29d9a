//! The virtio-blk device as its transport sees it (device ID 2): features
//! (read-only, or FLUSH for a writable disk; SEG_MAX), the capacity in config space, and handing the
//! queue to the event-loop handler at activation.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueState, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::defs::{
    CONFIG_LEN, QUEUE_COUNT, QUEUE_SIZE, SEG_MAX, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_SEG_MAX,
};
use crate::state::{RestoreError, SaveError};
use crate::virtio::device::{
    lock_shared, read_config_bytes, Activation, Error, Running, VirtioDevice,
};
use crate::virtio::state::VirtioDeviceSnapshot;

/// The request queue while the device runs (none before activation or
/// after a reset).
pub(super) type Shared = Option<Running<Queue>>;

pub(super) fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    lock_shared(shared)
}

pub struct Block {
    id: String,
    sectors: u64,
    writable: bool,
    config: [u8; CONFIG_LEN],
    shared: Arc<Mutex<Shared>>,
    /// Wakes the handler after activate (requests may already be queued).
    wake: EventFd,
}

impl Block {
    pub(super) fn new(
        id: String,
        sectors: u64,
        writable: bool,
        shared: Arc<Mutex<Shared>>,
        wake: EventFd,
    ) -> Self {
        let mut config = [0u8; CONFIG_LEN];
        config[..8].copy_from_slice(&sectors.to_le_bytes());
        // size_max (bytes 8..12) stays 0: not offered.
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        Self {
            id,
            sectors,
            writable,
            config,
            shared,
            wake,
        }
    }

    /// The disk's capacity in 512-byte sectors, as the guest sees it
    /// (the file's size, or more: see [`super::new_with_capacity`]).
    pub fn sectors(&self) -> u64 {
        self.sectors
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; QUEUE_COUNT]
    }

    fn features(&self) -> u64 {
        // A writable disk offers FLUSH, so that the guest's fsync reaches
        // the host file (fdatasync); without it Linux would take the
        // disk's writes as durable the moment they are acknowledged.
        let access = match self.writable {
            true => 1 << VIRTIO_BLK_F_FLUSH,
            false => 1 << VIRTIO_BLK_F_RO,
        };
        (1 << VIRTIO_F_VERSION_1) | access | (1 << VIRTIO_BLK_F_SEG_MAX)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    /// Nothing in the offered config space is writable (no WCE).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, activation: Activation) -> Result<(), Error> {
        let Activation {
            mem,
            queues,
            interrupt,
            acked_features: _,
        } = activation;
        let Ok([queue]): Result<[Queue; QUEUE_COUNT], _> = queues.try_into() else {
            return Err(Error::QueueCount {
                expected: QUEUE_COUNT,
                got: 0,
            });
        };
        if !queue.is_valid(&mem) {
            return Err(Error::BadQueue(0));
        }
        *lock(&self.shared) = Some(Running {
            mem,
            queues: queue,
            interrupt,
        });
        self.wake.write(1).map_err(|e| Error::Wake(e.to_string()))
    }

    /// The id and capacity identify the disk (the capacity, not the
    /// file's size: a disk advertised larger than its file restores over
    /// any file that fits); requests are never in flight
    /// between events, so the ring positions (saved by the transport) are
    /// all the rest.
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError> {
        Ok(VirtioDeviceSnapshot::Block {
            id: self.id.clone(),
            sectors: self.sectors,
        })
    }

    fn active_queues(&self) -> Option<Vec<QueueState>> {
        lock(&self.shared).as_ref().map(|a| vec![a.queues.state()])
    }

    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError> {
        match saved {
            VirtioDeviceSnapshot::Block { id, sectors }
                if *id == self.id && *sectors == self.sectors =>
            {
                Ok(())
            }
            VirtioDeviceSnapshot::Block { id, sectors } => Err(RestoreError::Mismatch {
                device: "virtio-blk device",
                why: format!(
                    "disk {id:?} of {sectors} sectors saved, {:?} of {} here",
                    self.id, self.sectors
                ),
            }),
            other => Err(RestoreError::WrongKind {
                device: "virtio-blk device",
                saved: other.kind(),
            }),
        }
    }

    fn reset(&mut self) {
        *lock(&self.shared) = None;
    }
}
